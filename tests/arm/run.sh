#!/usr/bin/env bash
# The CPU kernels on ARM (aarch64: Apple's laptops, Graviton), checked on this x86 machine: the
# kernels crate cross-built for aarch64-unknown-linux-gnu, linted there, and its unit tests run
# under qemu's user-mode emulation twice, as a CPU with the dot-product extension (`-cpu max`:
# the `sdot` kernels, Isa::Neon) and as one without (`cortex-a72`: the portable ones). Speed is
# not measured here (emulation); arithmetic is, against the same portable references as on x86.
# Then the whole `ferrite` binary type-checks for macOS on Apple silicon.
#
# Installs what it needs on a fresh Debian machine: the aarch64 cross linker and qemu-user (Debian),
# the two targets' standard libraries (rustup). Called by tests/run.sh; runs alone as well.
set -euo pipefail
cd "$(dirname "$0")/../.."

target=aarch64-unknown-linux-gnu
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if ((${#missing[@]})); then
    echo "tests/arm/run.sh: installing ${missing[*]}"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}"
fi
if ! rustup target list --installed | grep -qx "$target"; then
    echo "tests/arm/run.sh: adding the Rust target $target"
    rustup target add "$target"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# tests/run.sh requires NVRTC for the x86 tests (it installs x86's); an emulated aarch64 test
# cannot load it, and the CUDA kernels are compile-checked there, not here.
unset FERRITE_REQUIRE_NVRTC
cargo clippy --release --quiet --target "$target" -p ferrite-kernels --all-targets -- -D warnings
for cpu in max cortex-a72; do
    echo "-- kernels on aarch64 ($cpu)"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L /usr/aarch64-linux-gnu" \
        cargo test --release --quiet --target "$target" -p ferrite-kernels --lib
done

# macOS on Apple silicon: the whole binary type-checks (no Apple SDK here, so no link; ring's
# C is the one part skipped: its build script's output is given instead, by its `links` key).
mac=aarch64-apple-darwin
if ! rustup target list --installed | grep -qx "$mac"; then
    echo "tests/arm/run.sh: adding the Rust target $mac"
    rustup target add "$mac"
fi
echo "-- ferrite type-checks for $mac"
cargo check --release --quiet --target "$mac" -p ferrite-cli \
    --config "target.$mac.ring_core_0_17_14_.rustc-link-search=[]"
