//! The linear layer (cuBLAS on the GPU, the CPU matmul reading f16 / bf16 rows in place) at
//! decode and prefill sizes, Qwen's QKV bias and head norms, and the device's random fills, on
//! every backend (see `common`), against a naive f64 reference or numpy's values in
//! `tests/fixtures/ops/ops.json`. Tolerances are in units of the stored type's precision, as in
//! `ops.rs`.

// The GPU wrappers take raw device pointers, so calling them is `unsafe`; every pointer here comes
// from a `Buffers` set that outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{
    Backend, Buffers, DTYPES, assert_close, backends, drawn, fixture, floats, num, random, round,
    uint,
};
use ferrite_kernels::cpu::matmul::{WeightView, matmul};
use ferrite_kernels::cpu::{add_bias, rms_norm_in_place};
use ferrite_kernels::cuda::gemm::{Linear, OutType};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::quant::GgmlType;

/// `x · wᵀ` with rows `x_stride` / `out_stride` apart, rounded to `dtype` unless f32 out.
fn linear_on(
    b: &Backend,
    dtype: Dtype,
    out_type: OutType,
    x: &[f32],
    w: &[f32],
    shape: Linear,
) -> Vec<f32> {
    let Linear {
        m,
        n,
        k,
        x_stride,
        out_stride,
    } = shape;
    match b {
        Backend::Cpu => {
            // The CPU matmul, reading the weight in place as f16 / bf16 rows.
            let ty = match dtype {
                Dtype::F16 => GgmlType::F16,
                Dtype::Bf16 => GgmlType::BF16,
            };
            let bytes: Vec<u8> = w
                .iter()
                .flat_map(|&v| dtype.bits_of(v).to_le_bytes())
                .collect();
            let (rows, cols, bytes) = (n, k, &bytes[..]);
            let x: Vec<f32> = round(dtype, x)
                .chunks(x_stride)
                .flat_map(|r| r[..k].to_vec())
                .collect();
            let mut dense = vec![0.0; m * n];
            matmul(
                &x,
                m,
                WeightView {
                    ty,
                    rows,
                    cols,
                    bytes,
                },
                &mut dense,
            );
            let mut out = vec![0.0; m * out_stride];
            for (o, d) in out.chunks_mut(out_stride).zip(dense.chunks(n)) {
                o[..n].copy_from_slice(d);
            }
            if out_type == OutType::Same {
                round(dtype, &out)
            } else {
                out
            }
        }
        Backend::Cuda(gpu) => {
            let mut mem = Buffers::new(gpu);
            let (xp, wp) = (mem.half(dtype, x), mem.half(dtype, w));
            let width = if out_type == OutType::Same { 2 } else { 4 };
            let out = mem.zeroed(width * m * out_stride);
            unsafe { gpu.linear(dtype, out_type, out, xp, wp, shape) }.expect("gemm");
            if out_type == OutType::Same {
                mem.read_half(dtype, out, m * out_stride)
            } else {
                mem.read_f32(out, m * out_stride)
            }
        }
    }
}

/// `x · wᵀ` from the definition, in f64 over the rounded inputs (rows `out_stride` apart).
fn linear_want(dtype: Dtype, x: &[f32], w: &[f32], shape: Linear) -> Vec<f32> {
    let (x, w) = (round(dtype, x), round(dtype, w));
    let mut out = vec![0.0; shape.m * shape.out_stride];
    for i in 0..shape.m {
        let xi = &x[i * shape.x_stride..][..shape.k];
        for (j, wj) in w.chunks(shape.k).enumerate() {
            let dot: f64 = xi
                .iter()
                .zip(wj)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            out[i * shape.out_stride + j] = dot as f32;
        }
    }
    out
}

#[test]
fn linear_projections_at_decode_and_prefill_sizes() {
    for b in backends() {
        // Up to 16 rows the GPU runs ferrite's dense GEMV (cuBLAS above): rows not a multiple
        // of its 16 per block (1000, 33), one n8 tile of x rows (1, 3, 5, 8) and two (11, 16),
        // and lengths whose last step holds one pair of 16-byte units instead of two (592,
        // 4112 columns).
        for (m, n, k) in [
            (1, 1024, 4096),
            (8, 576, 1536),
            (3, 1000, 592),
            (5, 33, 4112),
            (11, 200, 592),
            (16, 576, 1536),
            (67, 320, 576),
        ] {
            let shape = Linear {
                m,
                n,
                k,
                x_stride: k + 64,
                out_stride: n + 32,
            };
            let x = random(m * shape.x_stride, 10, 1.0);
            let w = random(n * k, 11, 0.05);
            for dtype in DTYPES {
                let want = linear_want(dtype, &x, &w, shape);
                for out_type in [OutType::Same, OutType::F32] {
                    let got = linear_on(&b, dtype, out_type, &x, &w, shape);
                    // f32 accumulation in another order: a few ulps of the result type, and of
                    // f16 for the f32 output (cuBLAS may round the product inputs itself).
                    let what = format!("linear {m}x{n}x{k} {out_type:?} on {}", b.name());
                    assert_close(&what, dtype, &got, &want, 4.0);
                }
            }
        }
    }
}

/// Qwen's QKV bias and Qwen3's per-head q norm, in place on a fused QKV buffer.
fn qkv_fixups_on(
    b: &Backend,
    dtype: Dtype,
    qkv: &[f32],
    bias: &[f32],
    norm_w: &[f32],
    (rows, heads, head_dim): (usize, usize, usize),
    eps: f32,
) -> Vec<f32> {
    let stride = qkv.len() / rows;
    let width = bias.len();
    match b {
        Backend::Cpu => {
            let mut x = round(dtype, qkv);
            let (bias, w) = (round(dtype, bias), round(dtype, norm_w));
            for row in x.chunks_mut(stride) {
                add_bias(&mut row[..width], &bias);
                let biased = round(dtype, &row[..width]);
                row[..width].copy_from_slice(&biased);
                rms_norm_in_place(&mut row[..heads * head_dim], &w, eps);
            }
            round(dtype, &x)
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let (xp, bp) = (m.half(dtype, qkv), m.half(dtype, bias));
            let wp = m.half(dtype, norm_w);
            unsafe {
                gpu.add_bias(dtype, xp, stride, bp, rows, width)
                    .expect("bias");
                gpu.head_rms_norm(dtype, xp, stride, wp, rows, heads, head_dim, eps, 0.0)
                    .expect("norm");
            }
            m.read_half(dtype, xp, qkv.len())
        }
    }
}

#[test]
fn qkv_bias_and_head_norms_match_numpy() {
    let fx = fixture("ops.json");
    let (q, inputs) = (&fx["qkv_fixups"], &fx["qkv_fixups"]["inputs"]);
    let dims = (uint(&q["rows"]), uint(&q["heads"]), uint(&q["head_dim"]));
    let stride = uint(&q["stride"]);
    let qkv = drawn(&inputs["qkv"], dims.0 * stride);
    let bias = drawn(&inputs["bias"], stride);
    let w = drawn(&inputs["weight"], dims.2);
    for b in backends() {
        for dtype in DTYPES {
            let got = qkv_fixups_on(&b, dtype, &qkv, &bias, &w, dims, num(&q["eps"]));
            let what = format!("qkv fixups on {}", b.name());
            assert_close(&what, dtype, &got, &floats(&q["want"][dtype.name()]), 2.0);
        }
        if b.is_gpu() {
            qkv_fixups_at_model_size_match_the_cpu(&b);
        }
    }
}

/// The CUDA fix-ups at a Qwen-like head count, against the CPU ops the fixture checks.
fn qkv_fixups_at_model_size_match_the_cpu(b: &Backend) {
    let (rows, heads, kv_heads, head_dim) = (5, 16, 4, 128);
    let stride = (heads + 2 * kv_heads) * head_dim;
    let qkv = random(rows * stride, 12, 2.0);
    let bias = random(stride, 13, 0.5);
    let w = random(head_dim, 14, 1.0);
    let dims = (rows, heads, head_dim);
    for dtype in DTYPES {
        let got = qkv_fixups_on(b, dtype, &qkv, &bias, &w, dims, 1e-6);
        let want = qkv_fixups_on(&Backend::Cpu, dtype, &qkv, &bias, &w, dims, 1e-6);
        assert_close(
            &format!("qkv fixups on {}", b.name()),
            dtype,
            &got,
            &want,
            2.0,
        );
    }
}

/// Device-side random weights: in range, centred where asked, reproducible from the seed, and
/// different for another seed. (There is no CPU op to compare with: the CPU half has nothing
/// to run.)
#[test]
fn random_fills_are_in_range_and_reproducible() {
    for b in backends() {
        let Backend::Cuda(gpu) = &b else { continue };
        let n = 100_003;
        for dtype in DTYPES {
            let mut m = Buffers::new(gpu);
            let (a, c, d) = (m.zeroed(2 * n), m.zeroed(2 * n), m.zeroed(2 * n));
            unsafe {
                gpu.fill_uniform(dtype, a, n, 7, 0.5, 1.0).expect("fill");
                gpu.fill_uniform(dtype, c, n, 7, 0.5, 1.0).expect("fill");
                gpu.fill_uniform(dtype, d, n, 8, 0.5, 1.0).expect("fill");
            }
            let (va, vc, vd) = (
                m.read_half(dtype, a, n),
                m.read_half(dtype, c, n),
                m.read_half(dtype, d, n),
            );
            assert_eq!(va, vc, "same seed");
            assert_ne!(va, vd, "another seed");
            assert!(va.iter().all(|&v| (0.5..=1.5).contains(&v)), "range");
            let mean = va.iter().sum::<f32>() / n as f32;
            assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        }
        let mut m = Buffers::new(gpu);
        let bytes = m.zeroed(n);
        unsafe { gpu.fill_bytes(bytes, n, 3, 0x0F) }.expect("fill");
        let got = m.read_f32(bytes, n / 4);
        assert!(
            got.iter().all(|v| v.to_bits() & 0xF0F0_F0F0 == 0),
            "masked to 4 bits"
        );
    }
}
