#!/usr/bin/env python3
"""The official `openai` client and a `grpcio` client against a gateway that requires API keys.

Run by tests/tests/bad_input.rs (`cargo test`), or by hand:

    python3 tests/clients/keys_client.py --http-port 8000 --grpc-port 50051 --key KEY

Each client lists the models with --key (must work) and with a wrong key (must be refused as
unauthenticated); grpcio also with no key at all (the openai client always sends one). Prints one JSON object: what came back, or the error's class,
status and text, for each.
"""

import argparse
import json
import os
import sys
import tempfile

import grpc
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpc_client import generate_stubs  # noqa: E402 (beside this file)


def openai_models(base_url, key):
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=20.0)
    try:
        return {"models": [m.id for m in client.models.list().data]}
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"error": type(e).__name__, "status_code": e.status_code, "code": body.get("code"), "text": body.get("message")}


def grpc_models(pb, pb_grpc, target, key):
    metadata = [("authorization", f"Bearer {key}")] if key else []
    with grpc.insecure_channel(target) as channel:
        try:
            reply = pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=20.0)
            return {"models": [m.name for m in reply.models]}
        except grpc.RpcError as e:
            return {"error": e.code().name, "text": e.details()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.http_port}/v1"
    out = {
        "openai_key": openai_models(base, args.key),
        "openai_wrong_key": openai_models(base, args.key + "-wrong"),
    }
    target = f"127.0.0.1:{args.grpc_port}"
    with tempfile.TemporaryDirectory(prefix="ferrite-stubs-") as out_dir:
        pb, pb_grpc = generate_stubs(out_dir)
        out["grpc_key"] = grpc_models(pb, pb_grpc, target, args.key)
        out["grpc_wrong_key"] = grpc_models(pb, pb_grpc, target, args.key + "-wrong")
        out["grpc_no_key"] = grpc_models(pb, pb_grpc, target, None)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
