#!/usr/bin/env python3
"""One long streamed completion with the official `openai` client, reporting how it ended.

Run by tests/tests/tensor_parallel.rs: it prints `ready` once the first chunk arrived (so the
test knows the stream runs, and can then kill a rank of the pool serving it), keeps reading,
and prints one JSON object: the chunks received, and either the finish reason or the error the
client raised (its class, HTTP status, code, type, message) with the wall-clock time it came
(seconds since the epoch, so the test can tell how long after its kill).

    python3 tests/clients/openai_stream.py --base-url http://127.0.0.1:8000/v1 --prompt "..."
"""

import argparse
import json
import sys
import time

import openai


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=1500)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="none", max_retries=0, timeout=60.0)
    out = {"chunks": 0, "finish_reason": None, "error": None}
    try:
        stream = client.completions.create(
            model=args.model, prompt=args.prompt, max_tokens=args.max_tokens, temperature=0,
            stream=True, extra_body={"ignore_eos": True})
        for chunk in stream:
            out["chunks"] += 1
            if out["chunks"] == 1:
                print("ready", flush=True)
            for choice in chunk.choices:
                if choice.finish_reason:
                    out["finish_reason"] = choice.finish_reason
    except openai.APIError as e:
        body = e.body if isinstance(e.body, dict) else {}
        out["error"] = {
            "class": type(e).__name__,
            "status_code": getattr(e, "status_code", None),
            "code": body.get("code") or getattr(e, "code", None),
            "type": body.get("type") or getattr(e, "type", None),
            "message": body.get("message") or str(e),
            "at_unix_s": time.time(),
        }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
