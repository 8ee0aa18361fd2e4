#!/usr/bin/env python3
"""The embeddings endpoint (`POST /v1/embeddings`) through the official `openai` client.

Run by tests/tests/api.rs, or by hand against a running gateway:

    python3 tests/clients/embeddings_client.py --base-url http://127.0.0.1:8000/v1 --model smollm2-135m

Asks `embeddings.create` for a batch of texts (the client's default base64 encoding, decoded
by it) and the same as floats; the token ids `/tokenize` gives for one text; a Matryoshka cut
(`dimensions`); and what is refused. Prints one JSON object with what came back (the Rust test
judges it).
"""

import argparse
import json
import math
import urllib.request

import openai

TEXTS = ["The capital of France is Paris.", "Paris is the capital of France.",
         "Bananas are yellow."]


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


def tokenize(base_url, model, text):
    """The prompt's token ids as `/tokenize` gives them (special tokens as a prompt gets)."""
    root = base_url.rsplit("/v1", 1)[0]
    body = json.dumps({"model": model, "prompt": text}).encode()
    req = urllib.request.Request(f"{root}/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["tokens"]


def refusal(call):
    try:
        call()
        return {"raised": None}
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"status_code": e.status_code, "param": body.get("param"),
                "message": body.get("message")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0,
                           timeout=120.0)
    model = args.model

    batch = client.embeddings.create(model=model, input=TEXTS)
    vectors = [d.embedding for d in batch.data]
    floats = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    ids = tokenize(args.base_url, model, TEXTS[0])
    by_ids = client.embeddings.create(model=model, input=[ids]).data[0].embedding
    cut = client.embeddings.create(model=model, input=TEXTS[0], dimensions=32).data[0].embedding
    head = vectors[0][:32]
    renormed = [x / norm(head) for x in head]
    out = {
        "object": batch.object,
        "model": batch.model,
        "indices": [d.index for d in batch.data],
        "dims": [len(v) for v in vectors],
        "norms": [norm(v) for v in vectors],
        "usage": batch.usage.model_dump(),
        "token_counts": [len(tokenize(args.base_url, model, t)) for t in TEXTS],
        "float_vs_base64": max(max_diff(a.embedding, b) for a, b in zip(floats.data, vectors)),
        "ids_vs_text": max_diff(by_ids, vectors[0]),
        "cut": {"dims": len(cut), "norm": norm(cut), "vs_renormed_head": max_diff(cut, renormed)},
        "distinct": max_diff(vectors[0], vectors[2]),
        "cosine": {"paraphrase": cosine(vectors[0], vectors[1]),
                   "unrelated": cosine(vectors[0], vectors[2])},
        "refused": {
            "empty_text": refusal(lambda: client.embeddings.create(model=model, input="")),
            "empty_list": refusal(lambda: client.embeddings.create(model=model, input=[])),
            "dimensions_0": refusal(
                lambda: client.embeddings.create(model=model, input="x", dimensions=0)),
            "dimensions_too_many": refusal(
                lambda: client.embeddings.create(model=model, input="x", dimensions=100000)),
            "encoding": refusal(lambda: client.embeddings.create(
                model=model, input="x", extra_body={"encoding_format": "int8"})),
            "unknown_model": refusal(
                lambda: client.embeddings.create(model="no-such-model", input="x")),
        },
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
