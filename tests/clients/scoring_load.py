"""Sends K concurrent /v1/completions requests of N fresh random token ids each, and waits for
them: `score` scores each prompt as lm-eval does (echo, logprobs 1, max_tokens 0), `plain`
prefills it and draws one token. Timed from outside, the two in turn, to compare them:

    for i in 1 2 3 4 5 6 7; do
        /usr/bin/time -f %e python3 scoring_load.py ADDR score 1000 1
        /usr/bin/time -f %e python3 scoring_load.py ADDR plain 1000 1
    done
"""
import json
import random
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

addr, mode, n, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


def one(_):
    ids = [random.randrange(1000, 40000) for _ in range(n)]
    body = {"model": "smollm2-135m", "prompt": ids, "temperature": 0}
    if mode == "score":
        body.update(echo=True, logprobs=1, max_tokens=0)
    else:
        body.update(max_tokens=1)
    req = urllib.request.Request(f"http://{addr}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(req, timeout=300))
    assert reply["usage"]["prompt_tokens"] == n, reply["usage"]
    if mode == "score":
        assert len(reply["choices"][0]["logprobs"]["token_logprobs"]) == n


with ThreadPoolExecutor(k) as pool:
    list(pool.map(one, range(k)))
