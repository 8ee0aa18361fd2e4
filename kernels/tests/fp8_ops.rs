//! FP8 (e4m3) W8A8 projections (`cuda::fp8`: activations rounded through e4m3 on the device,
//! then e4m3 tensor-core products, sm_89+) on every backend (see `common`): both activation
//! types, weights per channel with per-token activations, per tensor with a static activation
//! scale, and in 128 × 128 blocks with activation groups of 128 (DeepSeek-V3's layout), at m on
//! and off the kernels' 8- and 64-token tiles, with an all-zero activation row.
//!
//! The reference is an f64 dot product of the dequantized weights and the activations rounded
//! as the CPU rounds them (`fp8::quantize_activations`). The CPU backend runs ferrite's CPU
//! FP8 matmul; the GPU must match it up to f32 summation order (a few roundings of the output
//! type). Without a GPU (or below sm_89, where the kernels are not chosen) this still checks
//! the CPU at these shapes.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{
    Backend, Buffers, DTYPES, activation_rows, assert_close, backends, product_f64, random, round,
};
use ferrite_kernels::cpu::matmul::{Weight, matmul};
use ferrite_kernels::cuda::Gpu;
use ferrite_kernels::cuda::fp8::{Fp8Device, Fp8Rows, check_layout, device_scales};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::fp8::{
    Fp8Activations, Fp8Matrix, Fp8Scales, quantize_activations, quantize_fp8_rtn,
};

const MS: [usize; 7] = [1, 5, 8, 9, 64, 65, 200];

/// (rows, cols, weight scales, activations) of each case.
fn cases() -> Vec<(usize, usize, Fp8Scales, Fp8Activations)> {
    vec![
        (
            333,
            512,
            Fp8Scales::Channel,
            Fp8Activations::DynamicPerToken,
        ),
        (
            96,
            4096,
            Fp8Scales::Channel,
            Fp8Activations::DynamicPerToken,
        ),
        (208, 576, Fp8Scales::Tensor, Fp8Activations::Static(0.02)),
        (200, 576, Fp8Scales::Channel, Fp8Activations::Static(0.02)),
        (
            256,
            1024,
            Fp8Scales::Block {
                rows: 128,
                cols: 128,
            },
            Fp8Activations::DynamicPerGroup(128),
        ),
        // 5 blocks a row: the library's padded grid is not this one, so the tiles run.
        (
            128,
            640,
            Fp8Scales::Block {
                rows: 128,
                cols: 128,
            },
            Fp8Activations::DynamicPerGroup(128),
        ),
    ]
}

fn matrix(
    rows: usize,
    cols: usize,
    layout: Fp8Scales,
    act: Fp8Activations,
    seed: u64,
) -> Fp8Matrix {
    // Rows of different magnitudes, so per-channel and per-block scales differ.
    let w: Vec<f32> = random(rows * cols, seed, 1.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 + (i / cols % 7) as f32) * 0.01)
        .collect();
    quantize_fp8_rtn(&w, rows, cols, layout, act).expect("fp8")
}

fn reference(w: &Fp8Matrix, x: &[f32], m: usize) -> Vec<f32> {
    let (rows, cols) = (w.rows(), w.cols());
    let xq = quantize_activations(&x[..m * cols], cols, w.activations());
    let mut dense = vec![0f32; rows * cols];
    for (r, row) in dense.chunks_mut(cols).enumerate() {
        w.dequantize_row(r, row);
    }
    product_f64(&dense, &xq, rows, cols)
}

fn device_of(mem: &mut Buffers<'_>, w: &Fp8Matrix) -> Fp8Device {
    let (layout, scales) = device_scales(w);
    Fp8Device {
        codes: mem.bytes(w.codes()),
        scales: mem.f32s(&scales),
        layout,
        act: w.activations(),
        rows: w.rows(),
        cols: w.cols(),
    }
}

/// The GPU's product: with `library`, `fp8_matmul` (cuBLASLt's scaled GEMM for more than 8
/// rows where it takes the layout, which on sm_90 it must); else the hand-written tiles at
/// every m.
fn on_gpu(
    gpu: &Gpu,
    dtype: Dtype,
    w: &Fp8Matrix,
    x: &[f32],
    m: usize,
    library: bool,
) -> Option<Vec<f32>> {
    let mut mem = Buffers::new(gpu);
    let dev = device_of(&mut mem, w);
    if let Err(e) = check_layout(&gpu.arch, dev.layout, dev.act, dev.cols) {
        eprintln!("skipped on {}: {e}", gpu.arch);
        return None;
    }
    let cols = w.cols();
    let xp = mem.half(dtype, x);
    let scratch = Fp8Rows {
        codes: mem.zeroed(m * cols),
        scales: mem.f32s(&vec![0.0; m * cols / 64]),
    };
    let out = mem.zeroed(2 * m * w.rows());
    let takes = gpu.fp8_library_takes(dtype, &dev, m);
    eprintln!(
        "{}x{} {:?} m={m}: cuBLASLt {}",
        w.rows(),
        cols,
        w.layout(),
        if takes { "takes it" } else { "does not" }
    );
    if library && gpu.arch == "sm_90" && m > 8 && expect_library(w) {
        assert!(takes, "cuBLASLt refused {:?} at m={m} on sm_90", w.layout());
    }
    unsafe {
        if library {
            gpu.fp8_matmul(dtype, out, xp, &dev, m, scratch)
        } else {
            gpu.fp8_tiles(dtype, out, xp, &dev, m, scratch)
        }
        .expect("fp8 product");
    }
    Some(mem.read_half(dtype, out, m * w.rows()))
}

/// Whether cuBLASLt 12.9+ scales `w`'s products itself on sm_90: weights per channel (rows a
/// multiple of 16), or 128 × 128 blocks with activation runs of 128 and a multiple of 4 blocks
/// per row.
fn expect_library(w: &Fp8Matrix) -> bool {
    match w.layout() {
        Fp8Scales::Channel | Fp8Scales::Tensor => w.rows().is_multiple_of(16),
        Fp8Scales::Block {
            rows: 128,
            cols: 128,
        } => w.rows().is_multiple_of(16) && (w.cols() / 128).is_multiple_of(4),
        _ => false,
    }
}

#[test]
fn fp8_projections_match_the_reference_and_the_cpu() {
    let backends = backends();
    for (ci, (rows, cols, layout, act)) in cases().into_iter().enumerate() {
        let w = matrix(rows, cols, layout, act, 60 + ci as u64);
        for dtype in DTYPES {
            for m in MS {
                let x = activation_rows(dtype, m, cols, 9 + m as u64);
                let what = format!("{rows}x{cols} {layout:?} {act:?} m={m}");
                let mut cpu = vec![0f32; m * rows];
                matmul(&x, m, Weight::F8(&w), &mut cpu);
                let cpu = round(dtype, &cpu);
                assert_close(
                    &what,
                    dtype,
                    &cpu,
                    &round(dtype, &reference(&w, &x, m)),
                    1.0,
                );
                for b in &backends {
                    for library in [false, true] {
                        if let Backend::Cuda(gpu) = b
                            && let Some(got) = on_gpu(gpu, dtype, &w, &x, m, library)
                        {
                            let what = format!("{what} library={library} on {}", b.name());
                            assert_close(&what, dtype, &got, &cpu, 3.0);
                        }
                    }
                }
            }
        }
    }
}

/// What the GPU kernels refuse, so the runner keeps those layers dense.
#[test]
fn layouts_the_kernels_do_not_take_are_refused() {
    let per_token = Fp8Activations::DynamicPerToken;
    assert!(check_layout("sm_90", Fp8Scales::Channel, per_token, 512).is_ok());
    let e = check_layout("sm_80", Fp8Scales::Channel, per_token, 512).expect_err("A100");
    assert!(e.to_string().contains("no FP8 tensor cores"), "{e}");
    let e = check_layout("sm_90", Fp8Scales::Channel, Fp8Activations::None, 512)
        .expect_err("weight-only");
    assert!(e.to_string().contains("16-bit"), "{e}");
    let blocks = Fp8Scales::Block {
        rows: 128,
        cols: 128,
    };
    let groups = Fp8Activations::DynamicPerGroup(128);
    assert!(check_layout("sm_89", blocks, groups, 1024).is_ok());
    let e = check_layout("sm_90", blocks, groups, 576).expect_err("partial block");
    assert!(e.to_string().contains("whole runs"), "{e}");
    let e = check_layout("sm_90", Fp8Scales::Channel, per_token, 544).expect_err("544");
    assert!(e.to_string().contains("whole runs"), "{e}");
}
