//! GGUF's block types in the weight-only layout, so GGUF models stay quantized on the GPU
//! (repacked at load).
//!
//! A repack means `w = scale·(q − zero) + min` per group of 32 along a row: the codes and
//! scales form a symmetric [`WqMatrix`] (fixed zero `2^(bits−1)`, f16 scales) that the
//! quantized kernels read as they are, and the types with float minimums carry one `min` per
//! group beside it ([`GgufRepack::mins`]). On the GPU the minimums are a correction added after
//! the main product, `out[i, r] += Σ_g min[r, g] · Σ_{k∈g} x[i, k]` (`cuda::wq_mins`).
//!
//! The zero is the middle of the code range, not 0: the kernels round their product to the
//! activation type when they store it, and with zero 0 that product is `Σ scale·q·x`, biased
//! by `~7.5·scale·Σx` that the correction then cancels, so its rounding error scales with the
//! bias instead of the result. On SmolLM2's Q4_1 weights, with activations of mean 0 to 1, zero
//! 0 gives 2–20× the error of a dense f16 matrix and the middle zero 1–2.5×. Moving
//! `scale·zero` into the minimum costs nothing, and the symmetric format stores no zeros.
//!
//! | GGUF | format | code | scale | min | values |
//! |---|---|---|---|---|---|
//! | Q8_0 | w8g32-sym | `q + 128` | `d` | none | exact |
//! | Q4_0 | w4g32-sym | `q` | `d` | none | exact |
//! | Q4_1 | w4g32-sym | `q` | `d` | `m + 8d` | exact |
//! | Q4_K | w4g32-sym | `q` | `d·sc_j` → f16 | `8·d·sc_j − dmin·m_j` | scale rounded |
//! | Q5_K | w8g32-sym | `q + 112` | `d·sc_j` → f16 | `16·d·sc_j − dmin·m_j` | scale rounded |
//! | Q6_K | w8g32-sym | requantized | `d·sc_A / 4` → f16 | none | see below |
//!
//! Minimums are f32, computed from the exact scale: sums of two products of an f16 and small
//! integers, exact unless the terms differ in size by more than 2^13 (Q4_1) or 2^7 (K-quants),
//! where the sum rounds once (every block of the default model is exact). The GPU keeps them,
//! like the scales, in the activation type. Where the scale is rounded (the product of the f16
//! super-block scale and a 6-bit sub-scale has up to 17 significant bits), each weight is off
//! by `(scale_f16 − scale)·(q − zero)`, since the minimum absorbs the rounding at `q = zero`: at
//! most `|q − zero| · 2^-11` of the sub-block's step, 1/256 (Q4_K) or 1/128 (Q5_K) of a step.
//!
//! Q6_K has a signed 8-bit sub-scale per 16 weights, and a group here is 32: two sub-blocks,
//! `a = d·sc_A` (the larger `|sc|`) and `b = d·sc_B`. The group gets 8-bit codes with scale
//! `s = a / 4`: the coarser sub-block is exact (`4·(q − 32)`, up to the scale's rounding), the
//! finer one is requantized against the stored scale, `round(b·(q − 32) / s)`, within half a
//! code more. With the scale's rounding (`128·|s_f16 − s| ≤ |s|/16`) that is at most 9/64 of
//! the coarser sub-block's step `|a|` (17/64 at the one code that can fall outside the range,
//! where `sc_B = −sc_A` and `q = 0`); Q6_K's own rounding is up to half a step.
//!
//! Fused projections stack their parts ([`GgufRepack::stack`]); parts of different widths
//! (Q4_K beside Q6_K in a Q4_K_M model) are widened to the widest, exactly.

use rayon::prelude::*;

use super::{Bits, ScaleType, WqError, WqFormat, WqMatrix};
use crate::quant::scalar::{f16_at, scale_min_k4};
use crate::quant::{GgmlType, QK_K};

/// Weights per group of every repack.
const GROUP: usize = 32;

/// A GGUF tensor in the weight-only layout: `w = scale·(q − zero) + min` per group.
#[derive(Debug, Clone)]
pub struct GgufRepack {
    /// Codes and scales (`scale·(q − zero)`); the CPU and the quantized kernels read it as is.
    pub matrix: WqMatrix,
    /// `rows * groups` minimums, row-major like the scales; `None` where every one is 0
    /// (Q8_0, Q4_0, Q6_K).
    pub mins: Option<Vec<f32>>,
}

impl GgufRepack {
    /// Row-major `[rows, cols]` values as f32: the matrix's plus each group's minimum.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = self.matrix.dequantize();
        if let Some(mins) = &self.mins {
            let g = self.matrix.format().group_len(self.matrix.cols());
            for (row, mins) in out
                .chunks_mut(self.matrix.cols().max(1))
                .zip(mins.chunks(self.matrix.groups_per_row()))
            {
                for (group, &min) in row.chunks_mut(g).zip(mins) {
                    group.iter_mut().for_each(|w| *w += min);
                }
            }
        }
        out
    }

    /// `parts` (each a matrix and its minimums, if any) one after another as one matrix: a
    /// fused projection. Parts that differ only in width are widened to the widest, exactly
    /// (codes and zeros shifted so that `q − zero` is unchanged); parts without minimums get
    /// zeros. `None` when the parts differ in anything else (group size, zero points, scale
    /// type, columns).
    pub fn stack(parts: &[(&WqMatrix, Option<&[f32]>)]) -> Option<GgufRepack> {
        let bits = parts
            .iter()
            .map(|(m, _)| m.format().bits)
            .max_by_key(|b| b.get())?;
        let widened: Vec<_> = parts
            .iter()
            .map(|(m, _)| widen(m, bits))
            .collect::<Option<_>>()?;
        let matrix = WqMatrix::stack(&widened.iter().map(|m| m.as_ref()).collect::<Vec<_>>())?;
        let mins = parts.iter().any(|(_, mins)| mins.is_some()).then(|| {
            parts
                .iter()
                .flat_map(|(m, mins)| match mins {
                    Some(v) => v.to_vec(),
                    None => vec![0.0; m.rows() * m.groups_per_row()],
                })
                .collect()
        });
        Some(GgufRepack { matrix, mins })
    }
}

/// `m` with `bits`-bit codes (`q − zero` unchanged), borrowed when it already has them;
/// `None` if `bits` is narrower.
fn widen(m: &WqMatrix, bits: Bits) -> Option<std::borrow::Cow<'_, WqMatrix>> {
    let f = m.format();
    if f.bits == bits {
        return Some(std::borrow::Cow::Borrowed(m));
    }
    let wide = WqFormat { bits, ..f };
    let shift = wide.fixed_zero().checked_sub(f.fixed_zero())?;
    let codes: Vec<u8> = m.codes().iter().map(|&q| q + shift).collect();
    let zeros: Option<Vec<u8>> = f
        .zero_point
        .then(|| m.zeros().iter().map(|&z| z + shift).collect());
    WqMatrix::from_codes(
        wide,
        m.rows(),
        m.cols(),
        &codes,
        m.scales(),
        zeros.as_deref(),
    )
    .ok()
    .map(std::borrow::Cow::Owned)
}

/// `bytes` (a `[rows, cols]` tensor of `ty`) in the weight-only layout, or `None` when `ty` is
/// not one of the types above (the float types).
pub fn from_gguf(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Option<Result<GgufRepack, WqError>> {
    let (bits, has_mins, block): (Bits, bool, BlockFn) = match ty {
        GgmlType::Q8_0 => (Bits::B8, false, q8_0),
        GgmlType::Q4_0 => (Bits::B4, false, q4_0),
        GgmlType::Q4_1 => (Bits::B4, true, q4_1),
        GgmlType::Q4_K => (Bits::B4, true, q4_k),
        GgmlType::Q5_K => (Bits::B8, true, q5_k),
        GgmlType::Q6_K => (Bits::B8, false, q6_k),
        GgmlType::MXFP4 => (Bits::B8, false, mxfp4),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => return None,
    };
    Some(repack(ty, bits, has_mins, block, rows, cols, bytes))
}

/// Decodes one GGUF block into `codes` (one per weight) and, per group of 32, `scales` (exact,
/// f32) and `mins`.
type BlockFn = fn(&[u8], &mut [u8], &mut [f32], &mut [f32]);

fn repack(
    ty: GgmlType,
    bits: Bits,
    has_mins: bool,
    block: BlockFn,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Result<GgufRepack, WqError> {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    if cols == 0 || !cols.is_multiple_of(be) || bytes.len() != rows * cols / be * bb {
        return Err(WqError::Shape(format!(
            "{ty} tensor [{rows}, {cols}]: {} bytes, expected {}",
            bytes.len(),
            rows * cols.div_ceil(be) * bb
        )));
    }
    let format = WqFormat {
        bits,
        group_size: Some(GROUP),
        zero_point: false,
        scale_type: ScaleType::F16,
    };
    let groups = cols / GROUP;
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![0f32; rows * groups];
    let mut mins = vec![0f32; rows * groups];
    let row_bytes = cols / be * bb;
    codes
        .par_chunks_mut(cols)
        .zip(scales.par_chunks_mut(groups))
        .zip(mins.par_chunks_mut(groups))
        .zip(bytes.par_chunks(row_bytes))
        .for_each(|(((q, s), m), b)| {
            let g = be / GROUP;
            for (((q, s), m), b) in q
                .chunks_mut(be)
                .zip(s.chunks_mut(g))
                .zip(m.chunks_mut(g))
                .zip(b.chunks_exact(bb))
            {
                block(b, q, s, m);
            }
        });
    let matrix = WqMatrix::from_codes(format, rows, cols, &codes, &scales, None)?;
    if let Some(s) = matrix.scales().iter().find(|s| !s.is_finite()) {
        return Err(WqError::Value(format!(
            "{ty} sub-block scale {s} overflows f16"
        )));
    }
    Ok(GgufRepack {
        matrix,
        mins: has_mins.then_some(mins),
    })
}

/// `w = d·q`, q signed: `w8g32-sym` with code `q + 128` (its fixed zero).
fn q8_0(b: &[u8], q: &mut [u8], s: &mut [f32], _: &mut [f32]) {
    s[0] = f16_at(b, 0);
    for (q, &x) in q.iter_mut().zip(&b[2..34]) {
        *q = (x as i8 as i16 + 128) as u8;
    }
}

/// `w = 2^(e − 128) · doubled(q)`: `w8g32-sym` with code `doubled(q) + 128` (exact where the
/// scale is an f16, 2^-24 and up: every gpt-oss scale; `repack` refuses one that overflows).
fn mxfp4(b: &[u8], q: &mut [u8], s: &mut [f32], _: &mut [f32]) {
    s[0] = crate::quant::scalar::mxfp4_half_scale(b[0]);
    let mut codes = [0u8; 32];
    nibbles(&b[1..17], &mut codes);
    for (q, c) in q.iter_mut().zip(codes) {
        *q = (i16::from(crate::quant::scalar::MXFP4_DOUBLED[usize::from(c)]) + 128) as u8;
    }
}

/// The 32 nibbles of `qs` (16 bytes) in weight order: weight `j` in the low nibble of byte
/// `j`, weight `j + 16` in its high nibble.
fn nibbles(qs: &[u8], q: &mut [u8]) {
    let (lo, hi) = q.split_at_mut(16);
    for ((l, h), &x) in lo.iter_mut().zip(hi).zip(qs) {
        *l = x & 0x0F;
        *h = x >> 4;
    }
}

/// `w = d·(q − 8)`: `w4g32-sym` as is.
fn q4_0(b: &[u8], q: &mut [u8], s: &mut [f32], _: &mut [f32]) {
    s[0] = f16_at(b, 0);
    nibbles(&b[2..18], q);
}

/// `w = d·q + m = d·(q − 8) + (m + 8d)`.
fn q4_1(b: &[u8], q: &mut [u8], s: &mut [f32], m: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    s[0] = d;
    m[0] = min + 8.0 * d;
    nibbles(&b[4..20], q);
}

/// Sub-block `j`'s (scale, min) of a Q4_K/Q5_K super-block: `w = scale·q − min`.
fn k_scale_min(b: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = scale_min_k4(j, &b[4..16]);
    (f16_at(b, 0) * f32::from(sc), f16_at(b, 2) * f32::from(m))
}

/// Eight sub-blocks of 32: `w = d·sc_j·q − dmin·m_j = d·sc_j·(q − 8) + (8·d·sc_j − dmin·m_j)`.
/// Weights `64j..64j+32` are the low nibbles of `qs[32j..32j+32]`, the next 32 the high ones.
fn q4_k(b: &[u8], q: &mut [u8], s: &mut [f32], m: &mut [f32]) {
    let qs = &b[16..144];
    for j in 0..8 {
        let (scale, min) = k_scale_min(b, j);
        s[j] = scale;
        m[j] = 8.0 * scale - min;
        let shift = 4 * (j % 2);
        for (q, &x) in q[32 * j..32 * j + 32].iter_mut().zip(&qs[32 * (j / 2)..]) {
            *q = (x >> shift) & 0x0F;
        }
    }
}

/// As Q4_K with a fifth bit (bit `j` of `qh[l]` for weight `l` of sub-block `j`), as 8-bit
/// codes `q + 112` (fixed zero 128, so `q − 16`): `w = d·sc_j·(q − 16) + (16·d·sc_j − dmin·m_j)`.
fn q5_k(b: &[u8], q: &mut [u8], s: &mut [f32], m: &mut [f32]) {
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for j in 0..8 {
        let (scale, min) = k_scale_min(b, j);
        s[j] = scale;
        m[j] = 16.0 * scale - min;
        let shift = 4 * (j % 2);
        let sub = q[32 * j..32 * j + 32].iter_mut();
        for ((q, &x), &h) in sub.zip(&qs[32 * (j / 2)..]).zip(qh) {
            *q = ((x >> shift) & 0x0F) + (((h >> j) & 1) << 4) + 112;
        }
    }
}

/// The 256 signed 6-bit values of a Q6_K super-block in weight order: weight
/// `128n + 32k + l` (`n` < 2, `k` < 4, `l` < 32) is nibble `k / 2` of `ql[64n + 32(k % 2) + l]`
/// with bits `2k..2k+2` of `qh[32n + l]` above it, minus 32. Its sub-scale is `sc[i / 16]`.
fn q6_values(b: &[u8]) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for n in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                let lo = (b[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
                let hi = (b[128 + 32 * n + l] >> (2 * k)) & 3;
                v[128 * n + 32 * k + l] = (lo | (hi << 4)) as i8 - 32;
            }
        }
    }
    v
}

/// Per group of 32 (sub-blocks A and B of 16, A the larger `|sc|`): scale `s = d·sc_A / 4`,
/// A's codes `4·(q − 32) + 128` (exact), B's `round(d·sc_B·(q − 32) / s) + 128` against the
/// stored (f16) scale, clamped to the code range.
fn q6_k(b: &[u8], q: &mut [u8], s: &mut [f32], _: &mut [f32]) {
    let d = f16_at(b, 208);
    let sc = |i: usize| i32::from(b[192 + i] as i8);
    let v = q6_values(b);
    for (g, s) in s.iter_mut().enumerate() {
        let (i, j) = (2 * g, 2 * g + 1);
        let (a, other) = if sc(j).abs() > sc(i).abs() {
            (j, i)
        } else {
            (i, j)
        };
        let scale = d * sc(a) as f32 / 4.0;
        let stored = ScaleType::F16.round(scale);
        *s = scale;
        for (sub, exact) in [(a, true), (other, false)] {
            let codes = &mut q[16 * sub..16 * sub + 16];
            for (c, &x) in codes.iter_mut().zip(&v[16 * sub..16 * sub + 16]) {
                let level = if exact {
                    4 * i32::from(x)
                } else if stored == 0.0 {
                    0
                } else {
                    (d * sc(sub) as f32 * f32::from(x) / stored).round() as i32
                };
                *c = (level + 128).clamp(0, 255) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::quant::dequantize;
    use crate::wq::unpack;

    /// Deterministic bytes (xorshift).
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect()
    }

    /// An f16 of either sign and a magnitude between ~0.002 and ~0.06, from block `i`.
    fn scale_bytes(i: usize, salt: usize) -> [u8; 2] {
        let sign = if (i + salt).is_multiple_of(3) {
            -1.0
        } else {
            1.0
        };
        f16::from_f32(sign * (0.002 + 0.0037 * ((i * 7 + salt * 5) % 16) as f32)).to_le_bytes()
    }

    /// `n` blocks of `ty` with scales and minimums of both signs and noise everywhere else.
    /// Q6_K blocks also get sub-scale pairs of opposite sign and equal size (the clamped code).
    fn blocks(ty: GgmlType, n: usize) -> Vec<u8> {
        let bb = ty.block_bytes();
        let mut out = noise(n * bb, ty.ggml_id().into());
        for (i, b) in out.chunks_exact_mut(bb).enumerate() {
            match ty {
                GgmlType::Q8_0 | GgmlType::Q4_0 => b[0..2].copy_from_slice(&scale_bytes(i, 0)),
                GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                    b[0..2].copy_from_slice(&scale_bytes(i, 0));
                    b[2..4].copy_from_slice(&scale_bytes(i, 1));
                }
                GgmlType::Q6_K => {
                    b[208..210].copy_from_slice(&scale_bytes(i, 0));
                    b[192] = 77;
                    b[193] = (-77i8) as u8;
                    b[194] = 0;
                    b[195] = 0;
                    // Q6_K's 6-bit value 0 (the clamped one) in the first weight of
                    // sub-block 1: low nibble of ql[16], bits 0-1 of qh[16].
                    b[16] &= 0xF0;
                    b[128 + 16] &= 0xFC;
                }
                // MXFP4's exponent: scales of 2^-10 to 2^-3.
                GgmlType::MXFP4 => b[0] = 118 + (i % 8) as u8,
                _ => unreachable!("not a block type"),
            }
        }
        out
    }

    fn repack_of(ty: GgmlType, rows: usize, cols: usize) -> (GgufRepack, Vec<f32>) {
        let bytes = blocks(ty, rows * cols / ty.block_elems());
        let r = from_gguf(ty, rows, cols, &bytes)
            .expect("supported")
            .expect("repack");
        let mut want = vec![0f32; rows * cols];
        dequantize(ty, &bytes, &mut want).expect("dequantize");
        (r, want)
    }

    /// Q8_0, Q4_0, Q4_1 and MXFP4 change no value: the repack dequantizes to exactly what
    /// GGUF's own dequantization gives (Q4_1's `d·(q − 8) + (m + 8d)` and `d·q + m` round the
    /// same exact sum once; MXFP4's doubled codes are 8-bit codes under its halved scale).
    #[test]
    fn q8_0_q4_0_and_q4_1_repack_exactly() {
        let (rows, cols) = (5, 96);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::MXFP4,
        ] {
            let (r, want) = repack_of(ty, rows, cols);
            assert_eq!(r.dequantize(), want, "{ty}");
            assert_eq!(r.mins.is_some(), ty == GgmlType::Q4_1, "{ty}");
            let f = r.matrix.format();
            assert_eq!((f.group_size, f.zero_point), (Some(32), false), "{ty}");
        }
        assert!(from_gguf(GgmlType::F16, rows, cols, &[]).is_none());
        let short = from_gguf(GgmlType::Q8_0, rows, cols, &[0; 10]).expect("supported");
        assert!(short.is_err());
        let ragged = from_gguf(GgmlType::Q4_K, 1, 96, &[0; 144]).expect("supported");
        assert!(ragged.is_err(), "K-quant rows are whole super-blocks");
    }

    /// Q4_K and Q5_K: only the sub-block scale `d·sc_j` is rounded (to f16), so each weight is
    /// off by at most `|q − zero|` times that rounding, which the test recomputes from the
    /// block: `|scale_f16 − d·sc_j| · |q − zero|` (and f32 rounding of the sums).
    #[test]
    fn k_quants_repack_within_the_scale_rounding() {
        let (rows, cols) = (3, 512);
        for (ty, zero) in [(GgmlType::Q4_K, 8.0), (GgmlType::Q5_K, 128.0)] {
            let (r, want) = repack_of(ty, rows, cols);
            let got = r.dequantize();
            let bytes = blocks(ty, rows * cols / QK_K);
            let codes = r.matrix.codes();
            let mut worst = 0f32;
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let (block, j) = (i / QK_K, i % QK_K / 32);
                let b = &bytes[block * ty.block_bytes()..];
                let exact = k_scale_min(b, j).0;
                let stored = r.matrix.scales()[i / 32];
                let bound = (stored - exact).abs() * (f32::from(codes[i]) - zero).abs()
                    + 4.0 * f32::EPSILON * (w.abs() + r.mins.as_ref().expect("mins")[i / 32].abs());
                assert!(
                    (g - w).abs() <= bound,
                    "{ty} [{i}]: {g} vs {w} (bound {bound})"
                );
                worst = worst.max((g - w).abs() / exact.abs().max(f32::MIN_POSITIVE));
            }
            // In steps of the sub-block: |q − zero| ≤ 8 (16) halves of an f16 ulp.
            let steps = if ty == GgmlType::Q4_K { 256.0 } else { 128.0 };
            assert!(worst <= 1.0 / steps, "{ty}: {worst} steps");
        }
    }

    /// Q6_K, with `s` the group's scale: the coarser sub-block of each group is exact up to the
    /// scale's rounding (`128·|s_f16 − s|`), the finer one within half a code more (`|s| / 2`),
    /// or a whole code at a clamped one.
    #[test]
    fn q6_k_repack_error_is_bounded() {
        let (rows, cols) = (4, 512);
        let ty = GgmlType::Q6_K;
        let (r, want) = repack_of(ty, rows, cols);
        assert!(r.mins.is_none());
        let got = r.dequantize();
        let bytes = blocks(ty, rows * cols / QK_K);
        let mut clamped = 0;
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let b = &bytes[i / QK_K * ty.block_bytes()..];
            let d = f16_at(b, 208);
            let sc = |k: usize| f32::from(b[192 + k] as i8);
            let sub = i % QK_K / 16;
            let (p, o) = (sub & !1, sub | 1);
            let big = if sc(o).abs() > sc(p).abs() { o } else { p };
            let exact = d * sc(big) / 4.0;
            let stored = r.matrix.scales()[i / 32];
            let scale_err = 128.0 * (stored - exact).abs() + 2.0 * f32::EPSILON * w.abs();
            let err = (g - w).abs();
            let within_half = err <= stored.abs() / 2.0 + scale_err;
            if sub == big {
                assert!(err <= scale_err, "[{i}] coarse: {g} vs {w}");
            } else if !within_half {
                assert!(err <= stored.abs() + scale_err, "[{i}]: {g} vs {w}");
                clamped += 1;
            }
            // Against Q6_K's own step `|d·sc_A| = 4|s|`, with the scale's rounding (≤ |s|/16):
            // 9/64 of a step, 17/64 at a clamped code.
            let step = (d * sc(big)).abs();
            let bound = if within_half { 9.0 } else { 17.0 } / 64.0;
            assert!(err <= step * bound + 1e-9, "[{i}] {g} vs {w}");
        }
        // The crafted sc = 77, -77 sub-blocks put one clamped code in every super-block.
        assert!(clamped >= rows * cols / QK_K, "{clamped} clamped");
    }

    /// Stacking widens 4-bit parts to 8 bits without changing a value, and lays the minimums
    /// out row after row (zeros for a part without them).
    #[test]
    fn stacking_widens_exactly_and_stacks_mins() {
        let cols = 256;
        let (q4k, want_a) = repack_of(GgmlType::Q4_K, 2, cols);
        let (q6k, want_b) = repack_of(GgmlType::Q6_K, 3, cols);
        let (a, b) = (q4k.dequantize(), q6k.dequantize());
        let s = GgufRepack::stack(&[
            (&q4k.matrix, q4k.mins.as_deref()),
            (&q6k.matrix, q6k.mins.as_deref()),
        ])
        .expect("stacks");
        assert_eq!(s.matrix.format().bits, Bits::B8);
        assert_eq!(s.matrix.rows(), 5);
        assert_eq!(s.dequantize(), [a, b].concat());
        let mins = s.mins.expect("mins");
        assert_eq!(mins.len(), 5 * cols / 32);
        assert!(mins[2 * cols / 32..].iter().all(|&m| m == 0.0));
        assert_eq!(want_a.len() + want_b.len(), 5 * cols);
        let (q41, _) = repack_of(GgmlType::Q4_1, 1, 128);
        assert!(
            GgufRepack::stack(&[(&q41.matrix, None), (&q4k.matrix, None)]).is_none(),
            "different widths of rows"
        );
        let unpacked = unpack(s.matrix.packed_row(0), Bits::B8, cols);
        assert!(unpacked.iter().all(|&q| (120..=135).contains(&q)));
    }
}
