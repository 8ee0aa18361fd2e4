#!/usr/bin/env bash
# ferrite's CUDA kernels run on the CPU under emu.h (no GPU and no CUDA toolkit: g++ alone):
# the GEMVs, the one-launch decode attention and FP8 against f64 references, W8A8 against the
# CPU's bits, the fused launches (rope + cache, norm + int8, the GEMVs reading gate|up) against
# the launches they replace, bit for bit, a chained step's input ids taken from the draws of
# the step before (carry_ids), and the draws with bias, penalties and logprobs (sample_extras_f32)
# against a reference of the CPU sampler's steps. Usage: run.sh [DIR]
# (the prepared sources and binaries go there; a temporary directory otherwise). Exits non-zero
# when a check fails. kernels/tests/emulated.rs runs it with the workspace's tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$(mktemp -d)}"
python3 "$here/prepare.py" "$out"
cp "$here"/check*.cpp "$here/check.h" "$out/"
checks=(check_gemv check_gated check_attention check_w8a8 check_fp8 check_rope check_norm check_mask check_carry check_extras)
for c in "${checks[@]}"; do
    g++ -std=c++20 -O2 -pthread -w -I"$out" "$out/$c.cpp" -o "$out/$c" &
done
wait
for c in "${checks[@]}"; do
    "$out/$c"
done
