#!/usr/bin/env python3
"""A Python grpcio client of ferrite.v1.Inference, with stubs generated from proto/ at run time.

Run by tests/tests/api.rs (`cargo test`), or by hand against a running gateway:

    python3 tests/clients/grpc_client.py --addr 127.0.0.1:50051 --prompt "Hello" --max-tokens 16

It runs one greedy Generate (temperature 0, ignore_eos) and one Generate for an unknown model,
lists the services through server reflection as `grpcio-reflection` speaks it by default
(`grpc.reflection.v1alpha`), and prints one JSON object: {"text", "token_ids", "deltas",
"finish_reason", "usage", "unknown_model_code", "unknown_model_details",
"reflection_v1alpha"}. Needs `grpcio`, `grpcio-tools` and `grpcio-reflection`.
"""

import argparse
import json
import os
import sys
import tempfile

import grpc
import grpc_tools
from grpc_tools import protoc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def generate_stubs(out_dir):
    """Compiles proto/ferrite/v1/inference.proto into out_dir and imports the modules."""
    proto_root = os.path.join(REPO, "proto")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            os.path.join(proto_root, "ferrite", "v1", "inference.proto"),
        ]
    )
    if rc != 0:
        sys.exit(f"grpc_tools.protoc failed with {rc}")
    sys.path.insert(0, out_dir)
    from ferrite.v1 import inference_pb2, inference_pb2_grpc  # noqa: PLC0415 (generated just now)

    return inference_pb2, inference_pb2_grpc


def reflection_v1alpha(channel):
    """The services, and the file declaring ferrite.v1.Inference, as grpcio-reflection's
    descriptor database finds them (it speaks grpc.reflection.v1alpha)."""
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: PLC0415
        ProtoReflectionDescriptorDatabase,
    )

    db = ProtoReflectionDescriptorDatabase(channel)
    try:
        services = sorted(db.get_services())
        file = db.FindFileContainingSymbol("ferrite.v1.Inference")
        return {"services": services, "inference_file": file.name}
    except grpc.RpcError as e:
        return {"error": e.code().name, "details": e.details()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True, help="the gateway's gRPC address, host:port (loopback)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    host = args.addr.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        sys.exit(f"refusing a non-loopback address {args.addr}")

    with tempfile.TemporaryDirectory(prefix="ferrite-stubs-") as out_dir:
        pb, pb_grpc = generate_stubs(out_dir)
        with grpc.insecure_channel(args.addr) as channel:
            grpc.channel_ready_future(channel).result(timeout=args.timeout_s)
            stub = pb_grpc.InferenceStub(channel)
            request = pb.GenerateRequest(
                model=args.model,
                text=args.prompt,
                sampling=pb.SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True),
            )
            text, token_ids, deltas, finish = "", [], 0, None
            for message in stub.Generate(request, timeout=args.timeout_s):
                event = message.WhichOneof("event")
                if event == "delta":
                    deltas += 1
                    text += message.delta.text
                    token_ids.extend(message.delta.token_ids)
                elif event == "finish":
                    finish = message.finish

            unknown = pb.GenerateRequest(model="no-such-model", text=args.prompt)
            try:
                list(stub.Generate(unknown, timeout=args.timeout_s))
                unknown_code, unknown_details = "OK", ""
            except grpc.RpcError as e:
                unknown_code, unknown_details = e.code().name, e.details()

            reflection = reflection_v1alpha(channel)

    print(
        json.dumps(
            {
                "text": text,
                "token_ids": token_ids,
                "deltas": deltas,
                "finish_reason": pb.FinishReason.Name(finish.reason) if finish else None,
                "usage": {
                    "prompt_tokens": finish.usage.prompt_tokens,
                    "completion_tokens": finish.usage.completion_tokens,
                }
                if finish
                else None,
                "unknown_model_code": unknown_code,
                "unknown_model_details": unknown_details,
                "reflection_v1alpha": reflection,
            }
        )
    )


if __name__ == "__main__":
    main()
