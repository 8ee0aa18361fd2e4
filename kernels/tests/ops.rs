//! Element-wise and row-wise ops, one body per op on every backend (see `common`): embedding,
//! the three RMSNorm kinds, RoPE in both pairings, SiLU/GELU-and-mul, the KV-cache write and
//! the conversions, each against the reference of `common::reference` (written out from the
//! op's definition in f64), so the CPU leg fails when the CPU op is wrong. Tolerances are in units of the stored type's precision (f16 2^-10, bf16
//! 2^-7): results are rounded once to that type, so a correct kernel is within one or two.

// The GPU wrappers take raw device pointers, so calling them is `unsafe`; every pointer here comes
// from a `Buffers` set that outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{Backend, Buffers, DTYPES, assert_close, backends, random, reference, round};
use ferrite_kernels::cpu::rope::{Rope, RopePairing};
use ferrite_kernels::cpu::{
    gelu_tanh_mul_in_place, rms_norm, silu_mul_in_place, soft_cap_in_place,
};
use ferrite_kernels::cuda::gemm::{Linear, OutType};
use ferrite_kernels::cuda::ops::{Dtype, NormKind, NormShape, RopeShape};

/// `table[ids] * scale` on `b`.
fn embedding_on(
    b: &Backend,
    dtype: Dtype,
    table: &[f32],
    hidden: usize,
    ids: &[i32],
    scale: f32,
) -> Vec<f32> {
    match b {
        Backend::Cpu => {
            let table = round(dtype, table);
            let rows: Vec<f32> = ids
                .iter()
                .flat_map(|&i| table[i as usize * hidden..(i as usize + 1) * hidden].to_vec())
                .map(|v| v * scale)
                .collect();
            round(dtype, &rows)
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let (t, i) = (m.half(dtype, table), m.i32s(ids));
            let out = m.zeroed(2 * ids.len() * hidden);
            unsafe { gpu.embedding(dtype, out, t, i, ids.len(), hidden, scale) }.expect("launch");
            m.read_half(dtype, out, ids.len() * hidden)
        }
    }
}

#[test]
fn embedding_gathers_and_scales_rows() {
    let (vocab, hidden) = (50, 96);
    let table = random(vocab * hidden, 1, 2.0);
    let ids = [3, 0, 49, 3, 17];
    for b in backends() {
        for dtype in DTYPES {
            for scale in [1.0, 9.797_959] {
                let got = embedding_on(&b, dtype, &table, hidden, &ids, scale);
                let t = round(dtype, &table);
                let want: Vec<f32> = ids
                    .iter()
                    .flat_map(|&i| t[i as usize * hidden..(i as usize + 1) * hidden].to_vec())
                    .map(|v| v * scale)
                    .collect();
                assert_close(
                    &format!("embedding on {}", b.name()),
                    dtype,
                    &got,
                    &want,
                    1.0,
                );
            }
        }
    }
}

/// The results of one RMSNorm kind: (out, residual after).
fn rms_norm_on(
    b: &Backend,
    dtype: Dtype,
    kind: NormKind,
    x: &[f32],
    residual: &[f32],
    weight: &[f32],
    shape: NormShape,
) -> (Vec<f32>, Vec<f32>) {
    let n = shape.rows * shape.hidden;
    match b {
        Backend::Cpu => {
            let (x, res) = (round(dtype, x), round(dtype, residual));
            let w: Vec<f32> = round(dtype, weight)
                .iter()
                .map(|w| w + shape.weight_offset)
                .collect();
            let norm = |v: &[f32]| {
                let mut out = vec![0.0; v.len()];
                rms_norm(v, &w, shape.eps, &mut out);
                round(dtype, &out)
            };
            let add = |a: &[f32], c: &[f32]| {
                round(
                    dtype,
                    &a.iter().zip(c).map(|(a, c)| a + c).collect::<Vec<_>>(),
                )
            };
            match kind {
                NormKind::Plain => (norm(&x), res),
                NormKind::AddThenNorm => {
                    let r = add(&res, &x);
                    (norm(&r), r)
                }
                NormKind::NormThenAdd => (vec![0.0; n], add(&res, &norm(&x))),
            }
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let (xp, rp, wp) = (
                m.half(dtype, x),
                m.half(dtype, residual),
                m.half(dtype, weight),
            );
            let out = m.zeroed(2 * n);
            unsafe { gpu.rms_norm(dtype, kind, out, rp, xp, shape.hidden, wp, shape) }
                .expect("launch");
            (m.read_half(dtype, out, n), m.read_half(dtype, rp, n))
        }
    }
}

#[test]
fn rms_norm_plain_fused_add_and_post_add_match_the_reference() {
    // 4096: Llama's width; 2304 and 576 are not multiples of 8 vectors of a 256-thread block.
    for b in backends() {
        for (rows, hidden) in [(3, 4096), (5, 2304), (1, 576)] {
            let x = random(rows * hidden, 2, 3.0);
            let residual = random(rows * hidden, 3, 3.0);
            let weight = random(hidden, 4, 1.0);
            for dtype in DTYPES {
                for kind in [
                    NormKind::Plain,
                    NormKind::AddThenNorm,
                    NormKind::NormThenAdd,
                ] {
                    for weight_offset in [0.0, 1.0] {
                        let shape = NormShape {
                            rows,
                            hidden,
                            eps: 1e-6,
                            weight_offset,
                        };
                        let (out, res) =
                            rms_norm_on(&b, dtype, kind, &x, &residual, &weight, shape);
                        let (want_out, want_res) = reference::norm_kinds(
                            dtype,
                            kind,
                            (&round(dtype, &x), &round(dtype, &residual)),
                            &round(dtype, &weight),
                            1e-6,
                            weight_offset,
                        );
                        let what = format!(
                            "{kind:?} {rows}x{hidden} offset {weight_offset} on {}",
                            b.name()
                        );
                        assert_close(&what, dtype, &out, &want_out, 2.0);
                        assert_close(&what, dtype, &res, &want_res, 2.0);
                    }
                }
            }
        }
    }
}

/// q and k of a fused QKV buffer (rows of `(n_heads + 2 kv_heads) * head_dim`) after RoPE.
fn rope_on(
    b: &Backend,
    dtype: Dtype,
    qkv: &[f32],
    positions: &[i32],
    rope: &Rope,
    shape: RopeShape,
) -> Vec<f32> {
    match b {
        Backend::Cpu => {
            let mut out = round(dtype, qkv);
            let row = shape.q_stride;
            let (qw, kw) = (
                shape.n_heads * shape.head_dim,
                shape.kv_heads * shape.head_dim,
            );
            let pos: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
            let mut q: Vec<f32> = out.chunks(row).flat_map(|r| r[..qw].to_vec()).collect();
            let mut k: Vec<f32> = out
                .chunks(row)
                .flat_map(|r| r[qw..qw + kw].to_vec())
                .collect();
            rope.apply(&mut q, &pos, shape.n_heads);
            rope.apply(&mut k, &pos, shape.kv_heads);
            for (t, r) in out.chunks_mut(row).enumerate() {
                r[..qw].copy_from_slice(&q[t * qw..(t + 1) * qw]);
                r[qw..qw + kw].copy_from_slice(&k[t * kw..(t + 1) * kw]);
            }
            round(dtype, &out)
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let buf = m.half(dtype, qkv);
            let (pp, fp) = (m.i32s(positions), m.f32s(&rope.inv_freq));
            let k = buf.offset::<u16>(shape.n_heads * shape.head_dim);
            unsafe { gpu.rope(dtype, buf, k, pp, fp, shape) }.expect("launch");
            m.read_half(dtype, buf, qkv.len())
        }
    }
}

/// [`rope_on`] by the reference: each q and k head of each row rotated at its position.
fn rope_reference(
    dtype: Dtype,
    qkv: &[f32],
    positions: &[i32],
    inv_freq: &[f32],
    shape: RopeShape,
) -> Vec<f32> {
    let mut out = round(dtype, qkv);
    let hd = shape.head_dim;
    for (row, &pos) in out.chunks_mut(shape.q_stride).zip(positions) {
        let rotated = (shape.n_heads + shape.kv_heads) * hd;
        for head in row[..rotated].chunks_mut(hd) {
            let scale = shape.position_scale;
            reference::rope_head(head, pos as usize, inv_freq, scale, shape.adjacent);
        }
    }
    round(dtype, &out)
}

#[test]
fn rope_rotates_q_and_k_in_a_fused_qkv_buffer() {
    let (n_heads, kv_heads, head_dim) = (8, 2, 128);
    let row = (n_heads + 2 * kv_heads) * head_dim;
    let positions = [0, 1, 17, 4095, 131_071];
    let qkv = random(positions.len() * row, 5, 2.0);
    for b in backends() {
        for dtype in DTYPES {
            for (pairing, rope_dim) in [
                (RopePairing::Half, 128),
                (RopePairing::Adjacent, 128),
                (RopePairing::Half, 64),
            ] {
                // θ^(-2i/d), the table every backend and the reference take.
                let inv_freq: Vec<f32> = (0..rope_dim / 2)
                    .map(|i| 500_000f64.powf(-((2 * i) as f64) / rope_dim as f64) as f32)
                    .collect();
                let rope = Rope {
                    inv_freq,
                    position_scale: 0.5,
                    pairing,
                    head_dim,
                };
                let shape = RopeShape {
                    tokens: positions.len(),
                    q_stride: row,
                    k_stride: row,
                    n_heads,
                    kv_heads,
                    head_dim,
                    rope_dim,
                    position_scale: 0.5,
                    adjacent: pairing == RopePairing::Adjacent,
                };
                let got = rope_on(&b, dtype, &qkv, &positions, &rope, shape);
                let want = rope_reference(dtype, &qkv, &positions, &rope.inv_freq, shape);
                let what = format!("rope {pairing:?} dim {rope_dim} on {}", b.name());
                assert_close(&what, dtype, &got, &want, 2.0);
                // V (after q and k in each row) is untouched.
                for (g, w) in got.chunks(row).zip(round(dtype, &qkv).chunks(row)) {
                    assert_eq!(
                        g[(n_heads + kv_heads) * head_dim..],
                        w[(n_heads + kv_heads) * head_dim..]
                    );
                }
            }
        }
    }
}

fn gated_on(
    b: &Backend,
    dtype: Dtype,
    gelu: bool,
    gate_up: &[f32],
    tokens: usize,
    d_ff: usize,
) -> Vec<f32> {
    match b {
        Backend::Cpu => {
            let gu = round(dtype, gate_up);
            let mut out = Vec::with_capacity(tokens * d_ff);
            for row in gu.chunks(2 * d_ff) {
                let (mut gate, up) = (row[..d_ff].to_vec(), &row[d_ff..]);
                if gelu {
                    gelu_tanh_mul_in_place(&mut gate, up);
                } else {
                    silu_mul_in_place(&mut gate, up);
                }
                out.extend(gate);
            }
            round(dtype, &out)
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let gp = m.half(dtype, gate_up);
            let out = m.zeroed(2 * tokens * d_ff);
            unsafe { gpu.gated_activation(dtype, gelu, out, gp, tokens, d_ff) }.expect("launch");
            m.read_half(dtype, out, tokens * d_ff)
        }
    }
}

#[test]
fn silu_and_gelu_gates_match_the_reference() {
    let (tokens, d_ff) = (3, 14336 / 4 + 8);
    let gate_up = random(tokens * 2 * d_ff, 6, 6.0);
    for b in backends() {
        for dtype in DTYPES {
            for gelu in [false, true] {
                let got = gated_on(&b, dtype, gelu, &gate_up, tokens, d_ff);
                let want = round(
                    dtype,
                    &reference::gated(&round(dtype, &gate_up), d_ff, gelu),
                );
                assert_close(
                    &format!("gelu={gelu} on {}", b.name()),
                    dtype,
                    &got,
                    &want,
                    2.0,
                );
            }
        }
    }
}

#[test]
fn kv_write_puts_rows_in_their_slots_and_skips_padding() {
    let (kv_heads, head_dim, slots_total) = (2, 64, 40);
    let width = kv_heads * head_dim;
    let stride = 3 * width; // K and V inside a fused QKV row
    let tokens = 4;
    let qkv = random(tokens * stride, 7, 1.0);
    let slots = [5, 39, -1, 16];
    for b in backends() {
        let Backend::Cuda(gpu) = &b else { continue };
        for dtype in DTYPES {
            let mut m = Buffers::new(gpu);
            let src = m.half(dtype, &qkv);
            let (kc, vc) = (
                m.zeroed(2 * slots_total * width),
                m.zeroed(2 * slots_total * width),
            );
            let sp = m.i32s(&slots);
            let (k, v) = (src.offset::<u16>(width), src.offset::<u16>(2 * width));
            unsafe {
                gpu.kv_write(
                    dtype, kc, vc, k, stride, v, stride, sp, tokens, kv_heads, head_dim,
                )
            }
            .expect("launch");
            let (kg, vg) = (
                m.read_half(dtype, kc, slots_total * width),
                m.read_half(dtype, vc, slots_total * width),
            );
            let q = round(dtype, &qkv);
            let (mut kw, mut vw) = (
                vec![0.0; slots_total * width],
                vec![0.0; slots_total * width],
            );
            for (t, &s) in slots.iter().enumerate() {
                if s < 0 {
                    continue;
                }
                let s = s as usize;
                kw[s * width..(s + 1) * width]
                    .copy_from_slice(&q[t * stride + width..t * stride + 2 * width]);
                vw[s * width..(s + 1) * width]
                    .copy_from_slice(&q[t * stride + 2 * width..(t + 1) * stride]);
            }
            assert_eq!(kg, kw, "K cache ({})", dtype.name());
            assert_eq!(vg, vw, "V cache ({})", dtype.name());
        }
    }
}

#[test]
fn conversions_round_to_nearest_even_and_soft_cap_squashes() {
    let mut xs = random(10_000, 8, 70_000.0);
    xs.extend([
        0.0,
        -0.0,
        1.0e-8,
        65_520.0,
        -65_504.0,
        f32::INFINITY,
        3.0e38,
    ]);
    for b in backends() {
        let Backend::Cuda(gpu) = &b else { continue };
        for dtype in DTYPES {
            let mut m = Buffers::new(gpu);
            let src = m.f32s(&xs);
            let half = m.zeroed(2 * xs.len());
            let back = m.zeroed(4 * xs.len());
            unsafe {
                gpu.from_f32(dtype, half, src, xs.len()).expect("launch");
                gpu.to_f32(dtype, back, half, xs.len()).expect("launch");
            }
            // Bit-exact: `half` rounds the same way (to nearest, ties to even).
            assert_eq!(
                m.read_f32(back, xs.len()),
                round(dtype, &xs),
                "{}",
                dtype.name()
            );
        }
        let mut m = Buffers::new(gpu);
        let logits = random(1000, 9, 100.0);
        let p = m.f32s(&logits);
        unsafe { gpu.soft_cap(p, logits.len(), 30.0) }.expect("launch");
        let mut want = logits.clone();
        soft_cap_in_place(&mut want, 30.0);
        assert_close(
            "soft cap",
            Dtype::F16,
            &m.read_f32(p, logits.len()),
            &want,
            0.01,
        );
    }
}

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
            let (x, w) = (round(dtype, x), round(dtype, w));
            let mut out = vec![0.0; m * out_stride];
            for i in 0..m {
                for j in 0..n {
                    out[i * out_stride + j] =
                        (0..k).map(|c| x[i * x_stride + c] * w[j * k + c]).sum();
                }
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

#[test]
fn linear_projections_match_the_cpu_at_decode_and_prefill_sizes() {
    for b in backends() {
        for (m, n, k) in [(1, 1024, 4096), (8, 576, 1536), (67, 320, 576)] {
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
                for out_type in [OutType::Same, OutType::F32] {
                    let got = linear_on(&b, dtype, out_type, &x, &w, shape);
                    let want = linear_on(&Backend::Cpu, dtype, OutType::F32, &x, &w, shape);
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
    dims: (usize, usize, usize),
) -> Vec<f32> {
    let (rows, heads, head_dim) = dims;
    let stride = qkv.len() / rows;
    let width = bias.len();
    match b {
        Backend::Cpu => {
            let mut x = round(dtype, qkv);
            let (bias, w) = (round(dtype, bias), round(dtype, norm_w));
            for row in x.chunks_mut(stride) {
                for (v, bj) in row[..width].iter_mut().zip(&bias) {
                    *v += bj;
                }
                let biased = round(dtype, &row[..width]);
                row[..width].copy_from_slice(&biased);
                ferrite_kernels::cpu::rms_norm_in_place(&mut row[..heads * head_dim], &w, 1e-6);
            }
            round(dtype, &x)
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let (xp, bp, wp) = (
                m.half(dtype, qkv),
                m.half(dtype, bias),
                m.half(dtype, norm_w),
            );
            unsafe {
                gpu.add_bias(dtype, xp, stride, bp, rows, width)
                    .expect("bias");
                gpu.head_rms_norm(dtype, xp, stride, wp, rows, heads, head_dim, 1e-6, 0.0)
                    .expect("norm");
            }
            m.read_half(dtype, xp, qkv.len())
        }
    }
}

/// [`qkv_fixups_on`] by the reference: the bias added and rounded, then each q head normed.
fn qkv_fixups_reference(
    dtype: Dtype,
    qkv: &[f32],
    bias: &[f32],
    norm_w: &[f32],
    (rows, heads, head_dim): (usize, usize, usize),
) -> Vec<f32> {
    let mut x = round(dtype, qkv);
    let (bias, w) = (round(dtype, bias), round(dtype, norm_w));
    for row in x.chunks_mut(qkv.len() / rows) {
        let biased: Vec<f32> = row.iter().zip(&bias).map(|(v, b)| v + b).collect();
        let biased = round(dtype, &biased);
        row[..bias.len()].copy_from_slice(&biased);
        let normed = round(
            dtype,
            &reference::rms_norm(&row[..heads * head_dim], &w, 1e-6),
        );
        row[..heads * head_dim].copy_from_slice(&normed);
    }
    x
}

#[test]
fn qkv_bias_and_head_norms_match_the_reference() {
    let (rows, heads, kv_heads, head_dim) = (5, 16, 4, 128);
    let stride = (heads + 2 * kv_heads) * head_dim;
    let qkv = random(rows * stride, 12, 2.0);
    let bias = random(stride, 13, 0.5);
    let w = random(head_dim, 14, 1.0);
    for b in backends() {
        for dtype in DTYPES {
            let got = qkv_fixups_on(&b, dtype, &qkv, &bias, &w, (rows, heads, head_dim));
            let want = qkv_fixups_reference(dtype, &qkv, &bias, &w, (rows, heads, head_dim));
            assert_close(
                &format!("qkv fixups on {}", b.name()),
                dtype,
                &got,
                &want,
                2.0,
            );
        }
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
