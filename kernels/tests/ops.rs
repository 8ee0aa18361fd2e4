//! Element-wise and row-wise ops, one body per op on every backend (see `common`): embedding,
//! the three RMSNorm kinds, RoPE in both pairings, SiLU/GELU-and-mul, the KV-cache write, the
//! conversions and the soft cap (the linear layer and Qwen's QKV fix-ups are in
//! `ops_linear.rs`), against numpy's values in
//! `tests/fixtures/ops/ops.json` or a naive f64 reference. Tolerances are in units of the stored
//! type's precision (f16 2^-10, bf16 2^-7): results are rounded once to that type, so a correct
//! kernel is within one or two.

// The GPU wrappers take raw device pointers, so calling them is `unsafe`; every pointer here comes
// from a `Buffers` set that outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{
    Backend, Buffers, DTYPES, assert_close, backends, drawn, fixture, floats, items, num, random,
    round, uint, uints,
};
use ferrite_kernels::cpu::attention::PagedKv;
use ferrite_kernels::cpu::rope::{Rope, RopePairing};
use ferrite_kernels::cpu::{
    add_in_place, gelu_tanh_mul_in_place, rms_norm, silu_mul_in_place, soft_cap_in_place,
};
use ferrite_kernels::cuda::DevPtr;
use ferrite_kernels::cuda::ops::{CacheWrite, Dtype, NormKind, NormShape, RopeShape};
use ferrite_kernels::cuda::w8a8::I8Rows;
use serde_json::Value;

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
                // From the definition, element by element in f64: the CPU leg above is test
                // code too, so this is written apart from it.
                let t = round(dtype, &table);
                let want: Vec<f32> = (0..ids.len() * hidden)
                    .map(|i| ids[i / hidden] as usize * hidden + i % hidden)
                    .map(|at| (f64::from(t[at]) * f64::from(scale)) as f32)
                    .collect();
                let what = format!("embedding on {}", b.name());
                assert_close(&what, dtype, &got, &want, 1.0);
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
            // The engine folds Gemma's `1 + w` into the f32 weights at load.
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
                let mut sum = a.to_vec();
                add_in_place(&mut sum, c);
                round(dtype, &sum)
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
            let (xp, rp) = (m.half(dtype, x), m.half(dtype, residual));
            let wp = m.half(dtype, weight);
            let out = m.zeroed(2 * n);
            unsafe { gpu.rms_norm(dtype, kind, out, rp, xp, shape.hidden, wp, shape) }
                .expect("launch");
            (m.read_half(dtype, out, n), m.read_half(dtype, rp, n))
        }
    }
}

/// A norm that also rounds its output to int8 for a W8A8 projection (`rms_norm_int8`, one
/// launch) against the two launches it replaces (`rms_norm`, then `w8a8_quantize` of its
/// output), on the GPU: the same output, residual, codes and scales, bit for bit. (The CPU
/// rounds in the projection; `tests/gpu/emu/check_norm.cpp` runs the comparison under the
/// emulation.)
#[test]
fn a_norm_rounding_to_int8_gives_what_the_w8a8_rounding_gives() {
    let (rows, hidden) = (5, 576);
    let x = random(rows * hidden, 21, 2.0);
    let residual = random(rows * hidden, 22, 1.0);
    let weight = random(hidden, 23, 1.0);
    let shape = NormShape {
        rows,
        hidden,
        eps: 1e-5,
        weight_offset: 0.0,
    };
    for b in backends().iter().filter(|b| b.is_gpu()) {
        let Backend::Cuda(gpu) = b else { continue };
        for dtype in DTYPES {
            for kind in [NormKind::Plain, NormKind::AddThenNorm] {
                let mut m = Buffers::new(gpu);
                let wp = m.half(dtype, &weight);
                let mut run = |fused: bool| {
                    let (xp, rp) = (m.half(dtype, &x), m.half(dtype, &residual));
                    let out = m.zeroed(2 * rows * hidden);
                    let q = I8Rows {
                        codes: m.zeroed(rows * hidden),
                        scales: m.f32s(&vec![0.0; rows]),
                        sums: DevPtr::NULL,
                        sums_len: 0,
                    };
                    unsafe {
                        if fused {
                            gpu.rms_norm_int8(
                                dtype,
                                kind,
                                out,
                                rp,
                                xp,
                                hidden,
                                wp,
                                shape,
                                Some((q.codes, q.scales)),
                            )
                        } else {
                            gpu.rms_norm(dtype, kind, out, rp, xp, hidden, wp, shape)
                                .and_then(|()| gpu.w8a8_quantize(dtype, q, out, rows, hidden))
                        }
                    }
                    .expect("launch");
                    let n = rows * hidden;
                    let codes = m.read_i8(q.codes, n);
                    let scales: Vec<u32> = m
                        .read_f32(q.scales, rows)
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    (m.read_u16(out, n), m.read_u16(rp, n), codes, scales)
                };
                let (two, one) = (run(false), run(true));
                assert_eq!(
                    one, two,
                    "{dtype:?} {kind:?}: rms_norm_int8 against rms_norm + w8a8_quantize"
                );
            }
        }
    }
}

const NORM_KINDS: [NormKind; 3] = [
    NormKind::Plain,
    NormKind::AddThenNorm,
    NormKind::NormThenAdd,
];

#[test]
fn rms_norm_plain_fused_add_and_post_add_match_numpy() {
    let fx = fixture("ops.json");
    let (inputs, cases) = (&fx["rms_norm"]["inputs"], items(&fx["rms_norm"]["cases"]));
    for b in backends() {
        for case in cases {
            let kind = NORM_KINDS
                .into_iter()
                .find(|k| case["kind"] == format!("{k:?}"))
                .expect("a norm kind");
            let shape = NormShape {
                rows: uint(&case["rows"]),
                hidden: uint(&case["hidden"]),
                eps: num(&case["eps"]),
                weight_offset: num(&case["weight_offset"]),
            };
            let n = shape.rows * shape.hidden;
            let (x, residual) = (drawn(&inputs["x"], n), drawn(&inputs["residual"], n));
            let weight = drawn(&inputs["weight"], shape.hidden);
            for dtype in DTYPES {
                let (out, res) = rms_norm_on(&b, dtype, kind, &x, &residual, &weight, shape);
                let want = &case["want"][dtype.name()];
                let what = format!("{kind:?} {shape:?} on {}", b.name());
                // Plain leaves the residual as it was; NormThenAdd writes no `out`.
                let want_res = want
                    .get("residual")
                    .map_or_else(|| round(dtype, &residual), floats);
                assert_close(&what, dtype, &res, &want_res, 2.0);
                if let Some(want_out) = want.get("out") {
                    assert_close(&what, dtype, &out, &floats(want_out), 2.0);
                }
            }
        }
        if b.is_gpu() {
            rms_norm_at_model_widths_matches_the_cpu(&b);
        }
    }
}

/// The CUDA norms at model widths, against the CPU op the fixture checks. 4096: Llama's width;
/// 2304 and 576 are not multiples of 8 vectors of a 256-thread block.
fn rms_norm_at_model_widths_matches_the_cpu(b: &Backend) {
    for (rows, hidden) in [(3, 4096), (5, 2304), (1, 576)] {
        let x = random(rows * hidden, 2, 3.0);
        let residual = random(rows * hidden, 3, 3.0);
        let weight = random(hidden, 4, 1.0);
        for (dtype, kind, weight_offset) in DTYPES
            .into_iter()
            .flat_map(|d| NORM_KINDS.map(|k| (d, k)))
            .flat_map(|(d, k)| [(d, k, 0.0), (d, k, 1.0)])
        {
            let shape = NormShape {
                rows,
                hidden,
                eps: 1e-6,
                weight_offset,
            };
            let (out, res) = rms_norm_on(b, dtype, kind, &x, &residual, &weight, shape);
            let (want_out, want_res) =
                rms_norm_on(&Backend::Cpu, dtype, kind, &x, &residual, &weight, shape);
            let what = format!("{kind:?} {shape:?} on {}", b.name());
            assert_close(&what, dtype, &out, &want_out, 2.0);
            assert_close(&what, dtype, &res, &want_res, 2.0);
        }
    }
}

/// A fused QKV buffer (rows of `(n_heads + 2 kv_heads) * head_dim`) after RoPE of q and k.
fn rope_on(
    b: &Backend,
    dtype: Dtype,
    qkv: &[f32],
    positions: &[i32],
    rope: &Rope,
    (n_heads, kv_heads): (usize, usize),
) -> Vec<f32> {
    let (qw, kw) = (n_heads * rope.head_dim, kv_heads * rope.head_dim);
    let row = qw + 2 * kw;
    match b {
        Backend::Cpu => {
            let mut out = round(dtype, qkv);
            let pos: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
            let mut q: Vec<f32> = out.chunks(row).flat_map(|r| r[..qw].to_vec()).collect();
            let mut k: Vec<f32> = out
                .chunks(row)
                .flat_map(|r| r[qw..qw + kw].to_vec())
                .collect();
            rope.apply(&mut q, &pos, n_heads);
            rope.apply(&mut k, &pos, kv_heads);
            for (t, r) in out.chunks_mut(row).enumerate() {
                r[..qw].copy_from_slice(&q[t * qw..(t + 1) * qw]);
                r[qw..qw + kw].copy_from_slice(&k[t * kw..(t + 1) * kw]);
            }
            round(dtype, &out)
        }
        Backend::Cuda(gpu) => {
            let shape = RopeShape {
                tokens: positions.len(),
                q_stride: row,
                k_stride: row,
                n_heads,
                kv_heads,
                head_dim: rope.head_dim,
                rope_dim: 2 * rope.inv_freq.len(),
                position_scale: rope.position_scale,
                scale: rope.scale,
                adjacent: rope.pairing == RopePairing::Adjacent,
            };
            let mut m = Buffers::new(gpu);
            let buf = m.half(dtype, qkv);
            let (pp, fp) = (m.i32s(positions), m.f32s(&rope.inv_freq));
            let k = buf.offset::<u16>(qw);
            unsafe { gpu.rope(dtype, buf, k, pp, fp, shape) }.expect("launch");
            m.read_half(dtype, buf, qkv.len())
        }
    }
}

/// A fixture case's RoPE, with the frequencies numpy computed (Llama 3.1's scaled ones
/// included), so both sides rotate by the same f32 values; unscaled ones must also be what
/// `Rope::base_inv_freq` computes (up to the last bit of `powf`).
fn fixture_rope(case: &Value, head_dim: usize) -> Rope {
    let inv_freq = floats(&case["inv_freq"]);
    if case["llama3"].is_null() {
        let ours = Rope::base_inv_freq(num(&case["theta"]), 2 * inv_freq.len());
        for (i, (o, w)) in ours.iter().zip(&inv_freq).enumerate() {
            assert!((o - w).abs() <= 1e-6 * w, "inv_freq[{i}]: {o}, numpy {w}");
        }
    }
    let pairing = match case["pairing"].as_str() {
        Some("Half") => RopePairing::Half,
        Some("Adjacent") => RopePairing::Adjacent,
        other => panic!("pairing {other:?}"),
    };
    Rope {
        inv_freq,
        position_scale: num(&case["position_scale"]),
        scale: 1.0,
        pairing,
        head_dim,
    }
}

#[test]
fn rope_rotates_q_and_k_in_a_fused_qkv_buffer() {
    let fx = fixture("ops.json");
    let r = &fx["rope"];
    let heads = (uint(&r["n_heads"]), uint(&r["kv_heads"]));
    let head_dim = uint(&r["head_dim"]);
    let qk = (heads.0 + heads.1) * head_dim;
    let row = qk + heads.1 * head_dim;
    let positions: Vec<i32> = uints(&r["positions"]).iter().map(|&p| p as i32).collect();
    let qkv = drawn(&r["qkv"], positions.len() * row);
    for b in backends() {
        for case in items(&r["cases"]) {
            let rope = fixture_rope(case, head_dim);
            let scaled = !case["llama3"].is_null();
            for dtype in DTYPES {
                let got = rope_on(&b, dtype, &qkv, &positions, &rope, heads);
                let (pairing, dim) = (rope.pairing, 2 * rope.inv_freq.len());
                let what = format!(
                    "rope {pairing:?} dim {dim} llama3.1 {scaled} on {}",
                    b.name()
                );
                let got_qk: Vec<f32> = got.chunks(row).flat_map(|r| r[..qk].to_vec()).collect();
                assert_close(
                    &what,
                    dtype,
                    &got_qk,
                    &floats(&case["want"][dtype.name()]),
                    2.0,
                );
                // V (after q and k in each row) is untouched.
                for (g, w) in got.chunks(row).zip(round(dtype, &qkv).chunks(row)) {
                    assert_eq!(g[qk..], w[qk..], "{what}: V");
                }
            }
        }
        if b.is_gpu() {
            rope_at_model_sizes_matches_the_cpu(&b);
        }
    }
}

/// The CUDA RoPE at Llama 3's head sizes, against the CPU op the fixture checks.
fn rope_at_model_sizes_matches_the_cpu(b: &Backend) {
    let (heads, head_dim) = ((8, 2), 128);
    let positions = [0, 1, 17, 4095, 131_071];
    let qkv = random(positions.len() * (heads.0 + 2 * heads.1) * head_dim, 5, 2.0);
    for dtype in DTYPES {
        // 1.1547: LongRoPE's attention factor at 32 times a 4096-token original (YaRN's are
        // alike), which multiplies cos and sin.
        for (pairing, rope_dim, scale) in [
            (RopePairing::Half, 128, 1.0),
            (RopePairing::Adjacent, 128, 1.0),
            (RopePairing::Half, 64, 1.0),
            (RopePairing::Half, 96, 1.1547),
        ] {
            let rope = Rope {
                inv_freq: Rope::base_inv_freq(500_000.0, rope_dim),
                position_scale: 0.5,
                scale,
                pairing,
                head_dim,
            };
            let got = rope_on(b, dtype, &qkv, &positions, &rope, heads);
            let want = rope_on(&Backend::Cpu, dtype, &qkv, &positions, &rope, heads);
            let what = format!("rope {pairing:?} dim {rope_dim} × {scale} on {}", b.name());
            assert_close(&what, dtype, &got, &want, 2.0);
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
fn silu_and_gelu_gates_match_numpy() {
    let fx = fixture("ops.json");
    let g = &fx["gated"];
    let tokens = uint(&g["tokens"]);
    for b in backends() {
        for case in items(&g["cases"]) {
            let (d_ff, gelu) = (uint(&case["d_ff"]), case["gelu"] == true);
            let gate_up = drawn(&g["gate_up"], tokens * 2 * d_ff);
            for dtype in DTYPES {
                let got = gated_on(&b, dtype, gelu, &gate_up, tokens, d_ff);
                let want = floats(&case["want"][dtype.name()]);
                let what = format!("gelu={gelu} d_ff {d_ff} on {}", b.name());
                assert_close(&what, dtype, &got, &want, 2.0);
            }
        }
        if b.is_gpu() {
            gates_at_model_width_match_the_cpu(&b);
        }
    }
}

/// The CUDA gates at a quarter of Llama 3's FFN width, against the CPU ops the fixture checks.
fn gates_at_model_width_match_the_cpu(b: &Backend) {
    let (tokens, d_ff) = (3, 14336 / 4 + 8);
    let gate_up = random(tokens * 2 * d_ff, 6, 6.0);
    for dtype in DTYPES {
        for gelu in [false, true] {
            let got = gated_on(b, dtype, gelu, &gate_up, tokens, d_ff);
            let want = gated_on(&Backend::Cpu, dtype, gelu, &gate_up, tokens, d_ff);
            let what = format!("gelu={gelu} on {}", b.name());
            assert_close(&what, dtype, &got, &want, 2.0);
        }
    }
}

/// Token `t`'s K and V (at `width` and `2 width` of its fused QKV row of `3 width`) written to
/// cache slot `slots[t]`, skipped when negative: the (K, V) caches of `slots_total` slots.
fn kv_write_on(
    b: &Backend,
    dtype: Dtype,
    qkv: &[f32],
    slots: &[i32],
    (kv_heads, head_dim, slots_total): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let (width, n) = (kv_heads * head_dim, slots_total * kv_heads * head_dim);
    match b {
        Backend::Cpu => {
            // Through the CPU's cache layout (what its attention reads): slot s is position
            // s % 8 of physical block s / 8.
            let layout = PagedKv::<f32> {
                k: &[],
                v: &[],
                block_size: 8,
                kv_heads,
                head_dim,
            };
            let mut caches = [vec![0.0; n], vec![0.0; n]];
            let rows = round(dtype, qkv);
            for (row, &slot) in rows.chunks(3 * width).zip(slots).filter(|r| *r.1 >= 0) {
                let slot = slot as usize;
                for h in 0..kv_heads {
                    let off = layout.offset(&[(slot / 8) as u32], slot % 8, h);
                    // K is part 1 of the row, V part 2.
                    for (part, cache) in (1..).zip(&mut caches) {
                        let from = part * width + h * head_dim;
                        cache[off..off + head_dim].copy_from_slice(&row[from..from + head_dim]);
                    }
                }
            }
            caches.into()
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let src = m.half(dtype, qkv);
            let (kc, vc, sp) = (m.zeroed(2 * n), m.zeroed(2 * n), m.i32s(slots));
            let (k, v) = (src.offset::<u16>(width), src.offset::<u16>(2 * width));
            let (stride, tokens) = (3 * width, slots.len());
            unsafe {
                gpu.kv_write(
                    dtype, kc, vc, k, stride, v, stride, sp, tokens, kv_heads, head_dim,
                )
            }
            .expect("launch");
            (m.read_half(dtype, kc, n), m.read_half(dtype, vc, n))
        }
    }
}

/// The runner's one launch per layer (`rope_then_cache`) against the two it replaces (`rope`,
/// then `kv_write`), on the GPU: the same q and the same caches, bit for bit. (The CPU has no
/// fused op; `rope` and `kv_write` are each held to it above. On the CPU,
/// `tests/gpu/emu/check_rope.cpp` runs the same comparison under the emulation.)
#[test]
fn rope_then_cache_writes_what_rope_and_kv_write_write() {
    let (heads, kv_heads, head_dim, slots_total) = (4, 2, 64, 40);
    let (q_w, kv_w) = (heads * head_dim, kv_heads * head_dim);
    let stride = q_w + 2 * kv_w;
    let slots = [5, 39, -1, 16, 0];
    let positions = [3, 700, 0, 12, 4095];
    let qkv = random(slots.len() * stride, 9, 1.0);
    let rope = Rope {
        inv_freq: Rope::base_inv_freq(500_000.0, 48),
        position_scale: 1.0,
        scale: 1.0,
        pairing: RopePairing::Half,
        head_dim,
    };
    for b in backends().iter().filter(|b| b.is_gpu()) {
        let Backend::Cuda(gpu) = b else { continue };
        for dtype in DTYPES {
            let mut m = Buffers::new(gpu);
            let n = slots_total * kv_w;
            let shape = RopeShape {
                tokens: slots.len(),
                q_stride: stride,
                k_stride: stride,
                n_heads: heads,
                kv_heads,
                head_dim,
                rope_dim: 48,
                position_scale: 1.0,
                scale: 1.0,
                adjacent: false,
            };
            let (pp, fp, sp) = (m.i32s(&positions), m.f32s(&rope.inv_freq), m.i32s(&slots));
            let mut run = |fused: bool| {
                let src = m.half(dtype, &qkv);
                let (k, v) = (src.offset::<u16>(q_w), src.offset::<u16>(q_w + kv_w));
                let (kc, vc) = (m.zeroed(2 * n), m.zeroed(2 * n));
                let cache = CacheWrite {
                    k_cache: kc,
                    v_cache: vc,
                    v,
                    v_stride: stride,
                    slots: sp,
                };
                unsafe {
                    if fused {
                        gpu.rope_then_cache(dtype, src, k, pp, fp, shape, Some(cache))
                    } else {
                        gpu.rope(dtype, src, k, pp, fp, shape).and_then(|()| {
                            let t = slots.len();
                            gpu.kv_write(
                                dtype, kc, vc, k, stride, v, stride, sp, t, kv_heads, head_dim,
                            )
                        })
                    }
                }
                .expect("launch");
                let q_len = slots.len() * stride;
                (m.read_u16(src, q_len), m.read_u16(kc, n), m.read_u16(vc, n))
            };
            let (two, one) = (run(false), run(true));
            assert_eq!(
                one, two,
                "{dtype:?}: rope_then_cache against rope + kv_write"
            );
        }
    }
}

#[test]
fn kv_write_puts_rows_in_their_slots_and_skips_padding() {
    let (kv_heads, head_dim, slots_total) = (2, 64, 40);
    let width = kv_heads * head_dim;
    let stride = 3 * width; // K and V inside a fused QKV row
    let slots = [5, 39, -1, 16];
    let qkv = random(slots.len() * stride, 7, 1.0);
    for b in backends() {
        for dtype in DTYPES {
            let (kg, vg) = kv_write_on(&b, dtype, &qkv, &slots, (kv_heads, head_dim, slots_total));
            // From the definition: slot s is row s of a [slots, kv_heads * head_dim] cache.
            let q = round(dtype, &qkv);
            let (mut kw, mut vw) = (
                vec![0.0; slots_total * width],
                vec![0.0; slots_total * width],
            );
            for (t, s) in slots.iter().enumerate().filter(|s| *s.1 >= 0) {
                let (s, src) = (*s as usize, &q[t * stride..(t + 1) * stride]);
                kw[s * width..(s + 1) * width].copy_from_slice(&src[width..2 * width]);
                vw[s * width..(s + 1) * width].copy_from_slice(&src[2 * width..]);
            }
            assert_eq!(kg, kw, "K cache ({}) on {}", dtype.name(), b.name());
            assert_eq!(vg, vw, "V cache ({}) on {}", dtype.name(), b.name());
        }
    }
}

/// `xs` converted to `dtype` and back: (the 16-bit patterns, the bits of the f32 they widen to).
fn convert_on(b: &Backend, dtype: Dtype, xs: &[f32]) -> (Vec<u16>, Vec<u32>) {
    match b {
        Backend::Cpu => {
            let bits: Vec<u16> = xs.iter().map(|&x| dtype.bits_of(x)).collect();
            let back = bits.iter().map(|&h| dtype.value_of(h).to_bits()).collect();
            (bits, back)
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let src = m.f32s(xs);
            let (half, back) = (m.zeroed(2 * xs.len()), m.zeroed(4 * xs.len()));
            unsafe {
                gpu.from_f32(dtype, half, src, xs.len()).expect("launch");
                gpu.to_f32(dtype, back, half, xs.len()).expect("launch");
            }
            let values = m.read_f32(back, xs.len());
            let bits = values.iter().map(|v| v.to_bits()).collect();
            (m.read_u16(half, xs.len()), bits)
        }
    }
}

/// Bit-exact against numpy's f16 and an independent bf16 rounding, on random values and on
/// ties, the overflow edge, subnormals, signed zeros and infinities.
#[test]
fn conversions_round_to_nearest_even() {
    let fx = fixture("ops.json");
    let c = &fx["conversions"];
    let mut xs = drawn(&c["random"], uint(&c["n"]));
    xs.extend(
        uints(&c["special_bits"])
            .iter()
            .map(|&b| f32::from_bits(b as u32)),
    );
    for b in backends() {
        for dtype in DTYPES {
            let want = &c["want"][dtype.name()];
            let (want_bits, want_values) = (uints(&want["bits"]), uints(&want["values"]));
            assert_eq!((want_bits.len(), want_values.len()), (xs.len(), xs.len()));
            let (bits, values) = convert_on(&b, dtype, &xs);
            for (i, x) in xs.iter().enumerate() {
                assert_eq!(
                    (usize::from(bits[i]), values[i] as usize),
                    (want_bits[i], want_values[i]),
                    "{x:e} to {} and back on {}",
                    dtype.name(),
                    b.name()
                );
            }
        }
    }
}

/// `tanh(x / cap) * cap` over f32 logits, in place.
fn soft_cap_on(b: &Backend, logits: &[f32], cap: f32) -> Vec<f32> {
    match b {
        Backend::Cpu => {
            let mut x = logits.to_vec();
            soft_cap_in_place(&mut x, cap);
            x
        }
        Backend::Cuda(gpu) => {
            let mut m = Buffers::new(gpu);
            let p = m.f32s(logits);
            unsafe { gpu.soft_cap(p, logits.len(), cap) }.expect("launch");
            m.read_f32(p, logits.len())
        }
    }
}

#[test]
fn soft_cap_squashes_logits() {
    let fx = fixture("ops.json");
    let s = &fx["soft_cap"];
    let logits = drawn(&s["logits"], uint(&s["n"]));
    for b in backends() {
        let got = soft_cap_on(&b, &logits, num(&s["cap"]));
        // f32 results: a hundredth of an f16 step is a few f32 roundings.
        let what = format!("soft cap on {}", b.name());
        assert_close(&what, Dtype::F16, &got, &floats(&s["want"]), 0.01);
    }
}
