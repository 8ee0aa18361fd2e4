//! Quantized projections with per-group minimums on every backend (see `common`): the GEMV
//! with the minimums summed inside it (as the engine runs up to 16 rows), and the other
//! kernels' product (the tensor-core GEMM; the matrix dequantized, then cuBLAS) plus
//! `wq_add_mins`, for m = 1, 8, 16 and 64 rows of activations.
//! The matrices are GGUF Q4_1, Q4_K and Q5_K repacked (`wq::gguf`, at SmolLM2's widths), and
//! RTN matrices with zero points given arbitrary minimums, one with a short last group and one
//! per channel.
//!
//! The reference is the matrix the device holds (scales and minimums rounded to the
//! activation type), dequantized, times the rounded activations, summed in f64. The CPU backend
//! runs the same split step by step (the product rounded, the group means rounded, the
//! correction accumulated onto the product and rounded), so the arithmetic of the split is
//! checked on every machine.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{Backend, Buffers, DTYPES, assert_close, backends, random, round};
use ferrite_kernels::cuda::gemm::{Linear, OutType};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::wq::WqDevice;
use ferrite_kernels::cuda::wq_mins::{WqMins, means_len};
use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::wq::gguf::from_gguf;
use ferrite_kernels::wq::{WqMatrix, quantize_rtn};
use half::f16;

/// A quantized matrix and its minimums.
struct Case {
    name: String,
    w: WqMatrix,
    mins: Vec<f32>,
}

impl Case {
    fn group_size(&self) -> usize {
        self.w.format().group_len(self.w.cols())
    }
}

/// Deterministic bytes.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    random(n, seed, 1.0)
        .into_iter()
        .map(|v| ((v + 1.0) * 127.99) as u8)
        .collect()
}

/// `n` GGUF blocks of `ty` shaped like llama.cpp's output: scales of both signs, each group's
/// minimum near `-8` steps (so the repack's minimums are a few steps at most, as in real
/// checkpoints), codes random.
fn gguf_blocks(ty: GgmlType, n: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut out = noise(n * bb, u64::from(ty.ggml_id()));
    let small = noise(n * 16, 99);
    for (i, b) in out.chunks_exact_mut(bb).enumerate() {
        let sign = if i % 3 == 1 { -1.0 } else { 1.0 };
        let d = sign * (0.001 + 0.0005 * (i % 7) as f32);
        let offset = |j: usize| i32::from(small[16 * i + j] % 5) - 2;
        match ty {
            GgmlType::Q4_1 => {
                let m = -d * (8.0 + 0.5 * offset(0) as f32);
                b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                b[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                // dmin = 8d and m_j = sc_j·zero/8 + offset: the repack's minimum
                // zero·d·sc_j − dmin·m_j is −8·d·offset.
                let zero = if ty == GgmlType::Q4_K { 8 } else { 16 };
                let dmin = 8.0 * d;
                b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                b[2..4].copy_from_slice(&f16::from_f32(dmin).to_le_bytes());
                let sc: Vec<i32> = (0..8)
                    .map(|j| 4 + i32::from(small[16 * i + 8 + j] % 28))
                    .collect();
                let m: Vec<i32> = (0..8)
                    .map(|j| (sc[j] * zero / 8 + offset(j)).clamp(0, 63))
                    .collect();
                let q = &mut b[4..16];
                for j in 0..4 {
                    q[j] = (sc[j] | (sc[j + 4] >> 4) << 6) as u8;
                    q[j + 4] = (m[j] | (m[j + 4] >> 4) << 6) as u8;
                    q[j + 8] = ((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4) as u8;
                }
            }
            _ => unreachable!("a type with minimums"),
        }
    }
    out
}

fn gguf_case(ty: GgmlType, rows: usize, cols: usize) -> Case {
    let bytes = gguf_blocks(ty, rows * cols / ty.block_elems());
    let r = from_gguf(ty, rows, cols, &bytes)
        .expect("a block type")
        .expect("repacks");
    let mins = r.mins.expect("a type with minimums");
    let scales = r.matrix.scales();
    assert!(
        mins.iter()
            .zip(scales)
            .all(|(m, s)| m.abs() <= 4.0 * s.abs()),
        "{ty}: the crafted minimums are within four steps"
    );
    Case {
        name: format!("{ty} {rows}x{cols}"),
        mins,
        w: r.matrix,
    }
}

/// An RTN matrix of `format` with minimums of either sign up to four steps.
fn rtn_case(format: &str, rows: usize, cols: usize) -> Case {
    let f = format.parse().expect("format");
    let w = quantize_rtn(&random(rows * cols, 7, 0.05), rows, cols, f).expect("quantize");
    let mins = random(w.scales().len(), 8, 4.0)
        .iter()
        .zip(w.scales())
        .map(|(r, s)| r * s)
        .collect();
    Case {
        name: format!("{format} {rows}x{cols}"),
        w,
        mins,
    }
}

/// The device's weights (scales and minimums rounded to `dtype`) as f64, row-major, without
/// (`with_mins = false`) or with the minimums.
fn device_weights(dtype: Dtype, c: &Case, with_mins: bool) -> Vec<f64> {
    let (cols, g) = (c.w.cols(), c.group_size());
    let per_row = c.w.groups_per_row();
    let (scales, mins) = (round(dtype, c.w.scales()), round(dtype, &c.mins));
    let (codes, zeros) = (c.w.codes(), c.w.zeros());
    (0..c.w.rows() * cols)
        .map(|i| {
            let grp = i / cols * per_row + i % cols / g;
            let v = f64::from(scales[grp]) * (f64::from(codes[i]) - f64::from(zeros[grp]));
            if with_mins {
                v + f64::from(mins[grp])
            } else {
                v
            }
        })
        .collect()
}

/// `x · Wᵀ` in f64 for `m` rows of `x`.
fn product(w: &[f64], x: &[f32], m: usize, cols: usize) -> Vec<f64> {
    (0..m)
        .flat_map(|i| {
            let xi = &x[i * cols..(i + 1) * cols];
            w.chunks(cols).map(move |r| {
                r.iter()
                    .zip(xi)
                    .map(|(&a, &b)| a * f64::from(b))
                    .sum::<f64>()
            })
        })
        .collect()
}

/// Which quantized product the GPU runs, and how the minimums join it.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// The minimums inside the GEMV (up to 16 rows).
    Gemv,
    /// The tensor-core GEMM, then `wq_add_mins`.
    Mma,
    /// The matrix dequantized, cuBLAS, then `wq_add_mins`.
    DequantThenCublas,
}

/// The projection with minimums of `m` rows of `x`, as `dtype` values.
fn project_on(b: &Backend, dtype: Dtype, c: &Case, x: &[f32], m: usize, path: Path) -> Vec<f32> {
    let (rows, cols, gs) = (c.w.rows(), c.w.cols(), c.group_size());
    let x = &round(dtype, x)[..m * cols];
    match b {
        Backend::Cpu => {
            let main = product(&device_weights(dtype, c, false), x, m, cols);
            let main = round(dtype, &main.iter().map(|&v| v as f32).collect::<Vec<_>>());
            let means: Vec<f32> = x
                .chunks(cols)
                .flat_map(|row| row.chunks(gs).map(|g| g.iter().sum::<f32>() / gs as f32))
                .collect();
            let means = round(dtype, &means);
            let mins = round(dtype, &c.mins);
            let per_row = c.w.groups_per_row();
            let out: Vec<f32> = (0..m * rows)
                .map(|o| {
                    let (i, r) = (o / rows, o % rows);
                    let dot: f32 = means[i * per_row..(i + 1) * per_row]
                        .iter()
                        .zip(&mins[r * per_row..(r + 1) * per_row])
                        .map(|(a, b)| a * b)
                        .sum();
                    main[o] + gs as f32 * dot
                })
                .collect();
            round(dtype, &out)
        }
        Backend::Cuda(gpu) => {
            let mut mem = Buffers::new(gpu);
            let f = c.w.format();
            let dev = WqDevice {
                codes: mem.bytes(c.w.packed_codes()),
                scales: mem.half(dtype, c.w.scales()),
                zeros: f.zero_point.then(|| mem.bytes(&c.w.zeros())),
                bits: f.bits,
                rows,
                cols,
                group_size: gs,
            };
            let mins = WqMins {
                mins: mem.half(dtype, &c.mins),
                means: mem.zeroed(2 * means_len(&dev, m)),
            };
            let xp = mem.half(dtype, x);
            let out = mem.zeroed(2 * m * rows);
            let dense = mem.zeroed(2 * rows * cols);
            let shape = Linear {
                m,
                n: rows,
                k: cols,
                x_stride: cols,
                out_stride: rows,
            };
            unsafe {
                match path {
                    Path::Gemv => gpu
                        .wq_gemv(dtype, out, xp, &dev, m, Some(mins.mins))
                        .expect("gemv"),
                    Path::Mma => gpu.wq_mma(dtype, out, xp, &dev, m).expect("mma"),
                    Path::DequantThenCublas => {
                        gpu.wq_dequant(dtype, dense, &dev).expect("dequant");
                        gpu.linear(dtype, OutType::Same, out, xp, dense, shape)
                            .expect("linear");
                    }
                }
                if !matches!(path, Path::Gemv) {
                    gpu.wq_add_mins(dtype, out, xp, &dev, &mins, m)
                        .expect("add mins");
                }
            }
            mem.read_half(dtype, out, m * rows)
        }
    }
}

#[test]
fn projections_with_minimums_match_the_cpu() {
    let cases = [
        gguf_case(GgmlType::Q4_1, 192, 576),
        gguf_case(GgmlType::Q4_K, 96, 1536),
        gguf_case(GgmlType::Q5_K, 64, 512),
        rtn_case("w4g128", 64, 576),
        rtn_case("w8pc", 48, 576),
    ];
    for b in backends() {
        for dtype in DTYPES {
            for c in &cases {
                let (rows, cols) = (c.w.rows(), c.w.cols());
                // Activations with a nonzero mean, so the minimums matter.
                let x: Vec<f32> = random(64 * cols, 41, 1.0).iter().map(|v| v + 0.3).collect();
                let xr = round(dtype, &x);
                let want_all = product(&device_weights(dtype, c, true), &xr, 64, cols);
                let want_all: Vec<f32> = want_all.iter().map(|&v| v as f32).collect();
                for m in [1, 8, 16, 64] {
                    for path in [Path::Gemv, Path::Mma, Path::DequantThenCublas] {
                        // Each GPU path where the engine takes it: the GEMV up to 16 rows,
                        // the GEMM above 8 (it would take fewer, but never gets them).
                        let gemv = matches!(path, Path::Gemv);
                        if b.is_gpu() && ((gemv && m > 16) || (matches!(path, Path::Mma) && m <= 8))
                        {
                            continue;
                        }
                        if !b.is_gpu() && !gemv {
                            continue; // one CPU split
                        }
                        let got = project_on(&b, dtype, c, &x, m, path);
                        let what = format!("{} m={m} {path:?} on {}", c.name, b.name());
                        // The product and the means each rounded once, the sum once more, and
                        // dot products of hundreds of terms in another order: a few ulps of
                        // the typical output.
                        assert_close(&what, dtype, &got, &want_all[..m * rows], 4.0);
                    }
                }
            }
        }
    }
}
