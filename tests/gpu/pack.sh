#!/usr/bin/env bash
# Builds, on the development machine, what the GPU host runs, and packs it under .device/
# (listed in .git/info/exclude) in pieces that fit the device tool's 64 MiB carry:
#   .device/bins.tar.xz     ferrite and the GPU test binaries, stripped
#   .device/model.part.NN   the default model (98 MB), in 36 MB parts
# Then see tests/gpu/host.sh for the calls that carry them over and run everything there.
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo build --release -p ferrite-cli
# The test targets whose CUDA halves must run there (cargo prints each one's executable).
wanted="nvrtc ops ops_linear attention sampling wq_ops wq_mma wq_mins gated_gemv w8a8_ops fp8_ops cuda_engine cuda_draws cuda_tensor_parallel"
cargo test --release --no-run -p ferrite-kernels -p ferrite-engine --message-format=json \
  2>/dev/null | python3 -c '
import json, sys
wanted = set(sys.argv[1].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] in wanted and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' "$wanted" >.device.list.tmp

rm -rf .device/stage && mkdir -p .device/stage
cp target/release/ferrite .device/stage/
while read -r name exe; do cp "$exe" ".device/stage/$name"; done <.device.list.tmp
rm -f .device.list.tmp
strip .device/stage/*
tar -cJf .device/bins.tar.xz -C .device/stage .
rm -rf .device/stage

model="${FERRITE_TEST_GGUF:-$HOME/.cache/ferrite/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf}"
rm -f .device/model.part.*
split -b 36M -d "$model" .device/model.part.
ls -la .device
