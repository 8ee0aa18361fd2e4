//! W8A8 projections (`cuda::w8a8`: activations rounded to int8 per token on the device, then
//! int8 tensor-core products) on every backend (see `common`): both activation types, at m on
//! and off the kernels' 8- and 64-token tiles, for shapes with odd row counts (333 × 576) and
//! real-model-like ones (512 × 1024, 96 × 4096), with -128 weight codes and an all-zero
//! activation row.
//!
//! The reference is an f64 dot product of the dequantized weights and the activations rounded
//! as the CPU's `I8Activations` rounds them (`q · s`, exact in f32). The CPU backend runs
//! ferrite's CPU W8A8 matmul (integer products, then the scales), which the GPU kernels must
//! match to the last bit before the output is rounded; without a GPU this still checks the
//! CPU kernels at these shapes and m.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{
    Backend, Buffers, DTYPES, activation_rows, assert_close, backends, product_f64, random, round,
};
use ferrite_kernels::cpu::matmul::{Weight, matmul};
use ferrite_kernels::cuda::Gpu;
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::w8a8::{I8Device, I8Rows};
use ferrite_kernels::w8a8::{I8Activations, I8Matrix};

const MS: [usize; 7] = [1, 5, 8, 9, 64, 65, 200];
const SHAPES: [(usize, usize); 3] = [(333, 576), (512, 1024), (96, 4096)];

/// Codes over the whole int8 range (-128 included), and scales of a real layer's size.
fn matrix(rows: usize, cols: usize, seed: u64) -> I8Matrix {
    let codes: Vec<i8> = random(rows * cols, seed, 1.0)
        .iter()
        .map(|v| (v * 128.0).floor().clamp(-128.0, 127.0) as i8)
        .collect();
    let scales: Vec<f32> = random(rows, seed + 1, 1.0)
        .iter()
        .map(|v| (1.5 + v) * 1e-3)
        .collect();
    I8Matrix::from_codes(rows, cols, &codes, &scales).expect("matrix")
}

fn reference(w: &I8Matrix, x: &[f32], m: usize) -> Vec<f32> {
    let xq = I8Activations::new(x, m, w.cols()).dequantized(w.cols());
    product_f64(&w.dequantize(), &xq, w.rows(), w.cols())
}

fn matmul_on(b: &Backend, dtype: Dtype, w: &I8Matrix, x: &[f32], m: usize) -> Vec<f32> {
    match b {
        Backend::Cpu => {
            let mut out = vec![0f32; m * w.rows()];
            matmul(x, m, Weight::I8(w), &mut out);
            round(dtype, &out)
        }
        Backend::Cuda(gpu) => on_gpu(gpu, dtype, w, x, m),
    }
}

fn on_gpu(gpu: &Gpu, dtype: Dtype, w: &I8Matrix, x: &[f32], m: usize) -> Vec<f32> {
    let (rows, cols) = (w.rows(), w.cols());
    let mut mem = Buffers::new(gpu);
    let codes: Vec<u8> = (0..rows)
        .flat_map(|r| w.row_codes(r))
        .map(|q| q as u8)
        .collect();
    let dev = I8Device {
        codes: mem.bytes(&codes),
        scales: mem.f32s(w.scales()),
        rows,
        cols,
    };
    let xp = mem.half(dtype, x);
    // Twice: with no room for i32 products (the hand-written kernels at every m), then with
    // room for 64 rows of them, so above 8 rows cuBLASLt's GEMM runs where it opened, in
    // chunks past 64 rows. Both must give the same bits.
    let hand = I8Rows {
        codes: mem.zeroed(m * cols),
        scales: mem.f32s(&vec![0.0; m]),
        sums: ferrite_kernels::cuda::DevPtr::NULL,
        sums_len: 0,
    };
    let chunk = m.min(64);
    let scratch = I8Rows {
        sums: mem.zeroed(4 * chunk * rows),
        sums_len: chunk * rows,
        ..hand
    };
    let (by_hand, out) = (mem.zeroed(2 * m * rows), mem.zeroed(2 * m * rows));
    unsafe {
        gpu.w8a8_matmul(dtype, by_hand, xp, &dev, m, hand)
            .expect("w8a8_matmul");
        gpu.w8a8_matmul(dtype, out, xp, &dev, m, scratch)
            .expect("w8a8_matmul through the library");
    }
    let (a, b) = (mem.read_u16(by_hand, m * rows), mem.read_u16(out, m * rows));
    assert_eq!(
        a, b,
        "m={m}: the library's GEMM against the hand-written kernels"
    );
    // The device's rounding of the activations is the CPU's, code for code.
    let want = I8Activations::new(x, m, cols).dequantized(cols);
    let q = mem.read_i8(scratch.codes, m * cols);
    let s = mem.read_f32(scratch.scales, m);
    let got: Vec<f32> = q
        .chunks(cols)
        .zip(&s)
        .flat_map(|(q, &s)| q.iter().map(move |&v| f32::from(v) * s))
        .collect();
    assert_eq!(got, want, "activations rounded to int8 on the device");
    mem.read_half(dtype, out, m * rows)
}

#[test]
fn w8a8_projections_match_the_reference_and_the_cpu() {
    let backends = backends();
    for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
        let w = matrix(rows, cols, 40 + si as u64);
        for dtype in DTYPES {
            for m in MS {
                let x = activation_rows(dtype, m, cols, 7 + m as u64);
                let want = reference(&w, &x, m);
                let cpu = matmul_on(&Backend::Cpu, dtype, &w, &x, m);
                let what = format!("{rows}x{cols} m={m}");
                // The f64 reference rounded once to the type: one rounding of f32 and one of T.
                assert_close(&what, dtype, &cpu, &round(dtype, &want), 1.0);
                for b in backends.iter().filter(|b| b.is_gpu()) {
                    let got = matmul_on(b, dtype, &w, &x, m);
                    assert_eq!(got, cpu, "{what} on {}", b.name());
                }
            }
        }
    }
}
