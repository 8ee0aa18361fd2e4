#!/usr/bin/env python3
"""An encoder's embeddings (`POST /v1/embeddings`) through the official `openai` client.

Run by tests/tests/encoders.rs, or by hand against a running gateway:

    python3 tests/clients/encoder_client.py --base-url http://127.0.0.1:8000/v1 \
        --model bert_embed --texts-from tests/fixtures/models/bert_embed/expected.json

Embeds the fixture's texts in one request (the client's default base64 encoding) and again
cut to 16 values (`dimensions`), then asks what an encoder refuses: a completion, and a
text longer than its positions. Prints one JSON object with what came back (the Rust test
judges it against sentence-transformers' embeddings in the fixture).
"""

import argparse
import json

import openai

from embeddings_client import refusal


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--texts-from", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0,
                           timeout=120.0)
    with open(args.texts_from) as f:
        texts = [c["text"] for c in json.load(f)["cases"]]
    whole = client.embeddings.create(model=args.model, input=texts)
    cut = client.embeddings.create(model=args.model, input=texts, dimensions=16)
    completion = refusal(lambda: client.completions.create(
        model=args.model, prompt="hello", max_tokens=4))
    long = refusal(lambda: client.embeddings.create(model=args.model, input="word " * 200))
    print(json.dumps({
        "model": whole.model,
        "embeddings": [d.embedding for d in whole.data],
        "indices": [d.index for d in whole.data],
        "cut": [d.embedding for d in cut.data],
        "usage": whole.usage.model_dump(),
        "refused": {"completion": completion, "long": long},
    }))


if __name__ == "__main__":
    main()
