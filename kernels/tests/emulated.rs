//! The CUDA kernels that have not yet run on a GPU, run on the CPU instead: `tests/gpu/emu`
//! emulates the CUDA execution model (a host thread per CUDA thread, warp instructions by the
//! PTX ISA's fragment layouts) and checks the GEMVs and the one-launch decode attention against
//! f64 references, W8A8's rounding, tiles and scale kernel against the CPU's bits, and FP8's
//! rounding and tiles against an f64 product of the decoded codes, and rope with the KV cache
//! write and a norm rounding to int8, each in one launch, against the two launches each
//! replaces, the GEMVs computing the gated activation against the activation kernel then the
//! plain GEMV, and the grammar mask applied before argmax. It needs
//! `g++` (C++20), which `tests/run.sh` installs.

use std::process::Command;

#[test]
fn the_unrun_kernels_match_their_references_under_the_cpu_emulation() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let dir = std::env::temp_dir().join(format!("ferrite-emu-{}", std::process::id()));
    let out = Command::new("bash")
        .arg(format!("{root}/tests/gpu/emu/run.sh"))
        .arg(&dir)
        .output()
        .expect("bash runs tests/gpu/emu/run.sh");
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the emulated kernels failed:\n{text}");
    assert!(text.contains("0 failed"), "{text}");
}
