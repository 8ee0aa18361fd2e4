#!/usr/bin/env python3
"""One /v1/rerank request of a fresh random query and D fresh random documents (common English
words), waited for: the load of a RAG pipeline's rerank step. A new query each run, so nothing
is left in the prefix cache from the run before; within the request every pair begins with
the query. Timed from outside, against a server with --no-prefix-caching, in turn:

    for i in 1 2 3 4 5 6; do
        /usr/bin/time -f %e python3 rerank_load.py 127.0.0.1:8000 MODEL 32 150 60
        /usr/bin/time -f %e python3 rerank_load.py 127.0.0.1:8001 MODEL 32 150 60
    done

Arguments: the gateway's HTTP address, the model, D, the query's words and each document's.
"""
import json
import os
import random
import sys
import urllib.request

WORDS = ("the of and a to in is was that for on with as by at from his her they which or an be "
         "this are not had have it its one all were but we there their been has more will would "
         "who so if out no up about into than them can only other new some time could these two "
         "may then first any do like").split()


def main():
    addr, model, docs, query_words, doc_words = sys.argv[1:6]
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))

    def text(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    body = {"model": model,
            "query": "Instruct: Given a question, find the passage that answers it.\nQuery: "
                     + text(int(query_words)),
            "documents": [text(int(doc_words)) for _ in range(int(docs))]}
    req = urllib.request.Request(f"http://{addr}/v1/rerank", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    assert len(answer["results"]) == int(docs), answer


if __name__ == "__main__":
    main()
