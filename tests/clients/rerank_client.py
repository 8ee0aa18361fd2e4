#!/usr/bin/env python3
"""Rerank through Cohere's official `cohere` client, as RAG frameworks call a reranker: its v2
client (`POST /v2/rerank`) and its v1 client (`POST /v1/rerank`), pointed at the gateway.

Run by tests/tests/classify.rs, or by hand against a running gateway serving a reranker:

    python3 tests/clients/rerank_client.py --base-url http://127.0.0.1:8000 --model reranker \
        --query "what is the capital of France?" --documents '["Paris is.", "Bananas."]'

Asks each client to rank the documents (v2 with `top_n` 2, v1 with every document returned),
and a model the gateway does not serve. Prints one JSON object with what came back (the Rust
test judges it).
"""

import argparse
import json

import cohere
from cohere.core.api_error import ApiError


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--query", required=True)
    p.add_argument("--documents", required=True, help="a JSON list of texts")
    a = p.parse_args()
    documents = json.loads(a.documents)

    v2 = cohere.ClientV2(api_key="unused", base_url=a.base_url, timeout=60)
    ranked = v2.rerank(model=a.model, query=a.query, documents=documents, top_n=2)
    v1 = cohere.Client(api_key="unused", base_url=a.base_url, timeout=60)
    every = v1.rerank(model=a.model, query=a.query, documents=documents,
                      return_documents=True)
    try:
        v2.rerank(model="no-such-model", query=a.query, documents=documents)
        unknown = None
    except ApiError as e:
        unknown = e.status_code

    def text(document):
        # v1's results type the document; v2's keep it as the extra field it is there.
        if isinstance(document, dict):
            return document.get("text")
        return getattr(document, "text", None)

    def results(r):
        return [{"index": x.index, "relevance_score": x.relevance_score,
                 "text": text(getattr(x, "document", None))} for x in r.results]

    print(json.dumps({"v2": results(ranked), "v1": results(every), "unknown_model": unknown}))


if __name__ == "__main__":
    main()
