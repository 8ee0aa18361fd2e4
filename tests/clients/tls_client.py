#!/usr/bin/env python3
"""The official `openai` client and a `grpcio` client against a gateway serving TLS.

Run by tests/tests/tls.rs (`cargo test`), or by hand:

    python3 tests/clients/tls_client.py --host 127.0.0.1 --http-port 8443 --grpc-port 50443 --ca ca.pem

Each client connects three ways: trusting --ca (must work), trusting only the system's roots
(must be refused: the certificate is not theirs), and in plaintext to the TLS port (must get a
clear error). Prints one JSON object: for each way, what came back or the error's class and text.
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


# The HTTP client class this openai release takes (its own subclass, with its defaults).
HttpClient = getattr(openai, "DefaultHttpx2Client", None) or openai.DefaultHttpxClient


def error_text(e):
    """The exception and its causes, as one line."""
    parts = []
    while e is not None:
        parts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)


def openai_models(base_url, verify, timeout):
    client = openai.OpenAI(
        base_url=base_url,
        api_key="unused",
        max_retries=0,
        timeout=timeout,
        http_client=HttpClient(verify=verify, timeout=timeout),
    )
    try:
        return {"models": [m.id for m in client.models.list().data]}
    except openai.APIStatusError as e:
        return {"error": type(e).__name__, "status_code": e.status_code, "text": e.response.text}
    except openai.APIConnectionError as e:
        return {"error": type(e).__name__, "text": error_text(e)}


def grpc_models(pb, pb_grpc, channel, timeout):
    with channel:
        try:
            reply = pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest(), timeout=timeout)
            return {"models": [m.name for m in reply.models]}
        except grpc.RpcError as e:
            return {"error": e.code().name, "text": e.details()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--ca", required=True, help="PEM of the CA the gateway's certificate chains to")
    parser.add_argument("--timeout-s", type=float, default=20.0)
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "localhost"):
        sys.exit(f"refusing a non-loopback host {args.host}")
    t = args.timeout_s
    https = f"https://{args.host}:{args.http_port}/v1"
    out = {
        "openai_trusted": openai_models(https, args.ca, t),
        "openai_untrusted": openai_models(https, True, t),
        "openai_plaintext": openai_models(f"http://{args.host}:{args.http_port}/v1", True, t),
    }
    with open(args.ca, "rb") as f:
        ca = f.read()
    target = f"{args.host}:{args.grpc_port}"
    with tempfile.TemporaryDirectory(prefix="ferrite-stubs-") as out_dir:
        pb, pb_grpc = generate_stubs(out_dir)
        secure = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))
        out["grpc_trusted"] = grpc_models(pb, pb_grpc, secure, t)
        # grpcio's default roots (its bundled ones): not our CA.
        out["grpc_untrusted"] = grpc_models(pb, pb_grpc, grpc.secure_channel(target, grpc.ssl_channel_credentials()), t)
        out["grpc_plaintext"] = grpc_models(pb, pb_grpc, grpc.insecure_channel(target), t)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
