//! The tensor-core quantized GEMM (`wq_mma`, 9–256 activation rows) and the kernel choice
//! (`wq_matmul`) on every backend (see `common`): every bit width × {f16, bf16} × {symmetric,
//! zero point} × groups {32, 128, per-channel}, at m on and off the kernel's 16/32/64-row tiles,
//! for shapes with odd row counts and a short last group (333 × 576: 576 = 4.5 groups of 128)
//! and real-model-like ones (512 × 1024, 1024 × 2048).
//!
//! The reference is an f64 dot product of the dequantized matrix and the rounded activations.
//! The CPU backend runs ferrite's CPU matmul over the same codes (`cpu::matmul`, the reference
//! the GPU kernels are otherwise compared with), so without a GPU this still checks that
//! reference at these shapes and m.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{Backend, Buffers, DTYPES, assert_close, backends, product_f64, random, round};
use ferrite_kernels::cpu::matmul::{Weight, matmul};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::wq::{WqDevice, check_layout, gemv_rows};
use ferrite_kernels::cuda::wq_mma::{MMA_MAX_M, MmaTile, WqKernel};
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_kernels::wq::{Bits, ScaleType, WqFormat, WqMatrix, quantize_rtn};

/// Activation rows: each tile's edges (16, 32, 64) and one past them, several 64-row tiles
/// with a ragged last one (200), and the largest m the kernel is chosen for.
const MS: [usize; 7] = [9, 16, 17, 32, 64, 200, 256];

/// Every bits × zero point × group choice: `w4g32`, `w4g32-sym`, `w4g128`, …, `w2pc-sym`.
fn format_names() -> Vec<String> {
    let mut names = Vec::new();
    for bits in [8, 4, 2] {
        for group in ["g32", "g128", "pc"] {
            for sym in ["", "-sym"] {
                names.push(format!("w{bits}{group}{sym}"));
            }
        }
    }
    names
}

fn format(name: &str, dtype: Dtype) -> WqFormat {
    let mut f: WqFormat = name.parse().expect("format");
    // Scales are kept in the activation type on the GPU; quantize with that type so every
    // backend uses the same scale values.
    f.scale_type = match dtype {
        Dtype::F16 => ScaleType::F16,
        Dtype::Bf16 => ScaleType::Bf16,
    };
    f
}

fn upload(mem: &mut Buffers<'_>, dtype: Dtype, w: &WqMatrix) -> WqDevice {
    let f = w.format();
    WqDevice {
        codes: mem.bytes(w.packed_codes()),
        scales: mem.half(dtype, w.scales()),
        zeros: f.zero_point.then(|| mem.bytes(&w.zeros())),
        bits: f.bits,
        rows: w.rows(),
        cols: w.cols(),
        group_size: f.group_len(w.cols()),
    }
}

/// `x[m, cols] · Wᵀ` in f64 from the dequantized matrix (whose values `scale * (q - zero)` are
/// exact in f32), rounded to f32 once.
fn reference(w: &WqMatrix, x: &[f32], m: usize) -> Vec<f32> {
    product_f64(&w.dequantize(), &x[..m * w.cols()], w.rows(), w.cols())
}

/// `x · Wᵀ` for the first `m` rows of `x` (already rounded to `dtype`), as `dtype` values: the
/// CPU's f32 result rounded once, as the GPU stores it. On the GPU through [`Gpu::wq_matmul`]
/// (with a dense scratch matrix) when `through_choice`, else [`Gpu::wq_mma`] directly.
fn matmul_on(
    b: &Backend,
    dtype: Dtype,
    w: &WqMatrix,
    x: &[f32],
    m: usize,
    through_choice: bool,
) -> Vec<f32> {
    let (rows, cols) = (w.rows(), w.cols());
    let x = &x[..m * cols];
    match b {
        Backend::Cpu => {
            let mut out = vec![0f32; m * rows];
            matmul(x, m, Weight::Wq(w), &mut out);
            round(dtype, &out)
        }
        Backend::Cuda(gpu) => on_gpu(gpu, dtype, w, x, m, through_choice),
    }
}

fn on_gpu(
    gpu: &Gpu,
    dtype: Dtype,
    w: &WqMatrix,
    x: &[f32],
    m: usize,
    through_choice: bool,
) -> Vec<f32> {
    let (rows, cols) = (w.rows(), w.cols());
    let mut mem = Buffers::new(gpu);
    let dev = upload(&mut mem, dtype, w);
    let xp = mem.half(dtype, x);
    let out = mem.zeroed(2 * m * rows);
    unsafe {
        if through_choice {
            let scratch = mem.zeroed(2 * rows * cols);
            gpu.wq_matmul(dtype, out, xp, &dev, m, scratch, None)
                .expect("wq_matmul");
        } else {
            gpu.wq_mma(dtype, out, xp, &dev, m).expect("wq_mma");
        }
    }
    mem.read_half(dtype, out, m * rows)
}

#[test]
fn mma_matches_the_reference_for_every_format() {
    // The full format grid at the odd and the mid-sized shape; the large one at one format
    // per bit width (the f64 reference of all 36 there would dominate the test's time).
    let shapes = [(333, 576), (512, 1024), (1024, 2048)];
    let names = format_names();
    let backends = backends();
    for dtype in DTYPES {
        for (rows, cols) in shapes {
            let w_f32 = random(rows * cols, (rows * 7 + cols) as u64, 0.08);
            let x = round(dtype, &random(MMA_MAX_M * cols, cols as u64 + 3, 1.0));
            for name in &names {
                if cols == 2048 && !["w8pc", "w4g128", "w2g32-sym"].contains(&name.as_str()) {
                    continue;
                }
                let f = format(name, dtype);
                check_layout(&f, cols).expect("the GPU kernels take every format here");
                let w = quantize_rtn(&w_f32, rows, cols, f).expect("quantize");
                let want_all = reference(&w, &x, MMA_MAX_M);
                for b in &backends {
                    for m in MS {
                        let got = matmul_on(b, dtype, &w, &x, m, false);
                        let what = format!("{name} {rows}x{cols} m={m} on {}", b.name());
                        // f32 sums of up to 2048 terms in another order, then one rounding
                        // to the stored type: within 2 of its ulps of the typical output.
                        assert_close(&what, dtype, &got, &want_all[..m * rows], 2.0);
                    }
                }
            }
        }
    }
}

#[test]
fn wq_matmul_takes_each_kernel_at_its_m() {
    let (rows, cols) = (256, 1024);
    let m_max = 300;
    let backends = backends();
    for dtype in DTYPES {
        let w_f32 = random(rows * cols, 11, 0.08);
        let x = round(dtype, &random(m_max * cols, 12, 1.0));
        let w = quantize_rtn(&w_f32, rows, cols, format("w4g128", dtype)).expect("quantize");
        let want_all = reference(&w, &x, m_max);
        for b in &backends {
            // 8 is the GEMV's one-tile last m, 16 its two-tile last, 17 the mma kernel's first
            // and 256 its last; 257 and 300 dequantize, then cuBLAS.
            for m in [1, 8, 9, 16, 17, 256, 257, 300] {
                let got = matmul_on(b, dtype, &w, &x, m, true);
                let what = format!("w4g128 {rows}x{cols} m={m} on {}", b.name());
                // cuBLAS (m > 256) multiplies the dense matrix rounded to the stored type: one
                // more rounding per weight, so a looser bound there.
                let ulps = if m > MMA_MAX_M { 4.0 } else { 2.0 };
                assert_close(&what, dtype, &got, &want_all[..m * rows], ulps);
            }
        }
    }
}

#[test]
fn the_choice_and_the_tiles_follow_the_launch_contract() {
    let w = WqDevice {
        codes: DevPtr::NULL,
        scales: DevPtr::NULL,
        zeros: None,
        bits: Bits::B4,
        rows: 4096,
        cols: 4096,
        group_size: 128,
    };
    let kernels: Vec<_> = [1, 8, 9, 16, 17, 256, 257, 4096]
        .map(|m| WqKernel::choose(m, &w))
        .into();
    use WqKernel::{Dequant, Gemv, Mma};
    let want = match gemv_rows() {
        16 => [Gemv, Gemv, Gemv, Gemv, Mma, Mma, Dequant, Dequant],
        8 => [Gemv, Gemv, Mma, Mma, Mma, Mma, Dequant, Dequant],
        _ => [Mma, Mma, Mma, Mma, Mma, Mma, Dequant, Dequant],
    };
    assert_eq!(kernels, want);

    let tiles = [9, 16, 17, 32, 33, 256].map(MmaTile::for_m);
    use MmaTile::{N16, N32, N64};
    assert_eq!(tiles, [N16, N16, N32, N32, N64, N64]);
    assert_eq!(N16.weight_rows(), 32);
    assert_eq!(N64.activation_rows(), 64);

    // The table in the launch contract of wq_mma.cu (checked against the kernel's own
    // constants by the host emulation of the kernel); all fit an H100 block's 227 KiB.
    let want = [
        (N16, [55_296, 82_944, 127_488]),
        (N32, [51_200, 76_800, 110_080]),
        (N64, [61_440, 102_400, 155_648]),
    ];
    for (tile, sizes) in want {
        for (bits, bytes) in [Bits::B8, Bits::B4, Bits::B2].into_iter().zip(sizes) {
            assert_eq!(tile.shared_bytes(bits), bytes, "{tile:?} {bits:?}");
            assert!(bytes <= 227 * 1024);
        }
    }
}
