//! Portable reference implementations: block dequantization (bit-exact with ggml / gguf-py) and
//! an f32 dot product written so LLVM can vectorize it on any target.
//!
//! Callers validate lengths; here `bytes` always holds exactly `out.len()` elements.

use super::{GgmlType, QK_K};

/// Reads the little-endian f16 at `b[i..i + 2]` as f32 (exact).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// An f16 bit pattern as f32, exactly (subnormals, infinities and NaNs included).
///
/// Done in general-purpose registers on purpose: on x86 building a vector for `vcvtph2ps` from
/// one 16-bit value makes LLVM emit `vpinsrw` into whatever register is free, often a loop
/// accumulator, which chains every iteration to the previous one; on ARM the `half` crate's
/// conversion is a call behind a run-time feature check, per block.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    if em >= 0x7c00 {
        return f32::from_bits(sign | 0x7f80_0000 | ((em & 0x3ff) << 13));
    }
    // The f16 bits shifted into an f32 read 2^112 too small (subnormals included): rescale,
    // exactly.
    f32::from_bits(sign | (em << 13)) * f32::from_bits(0x7780_0000)
}

/// bfloat16 bits to f32 (exact).
#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K
/// super-block, from its 12 packed scale bytes.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes `out.len()` elements. `bytes.len()` must equal `ty.row_bytes(out.len())`.
pub(crate) fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::Q8_0 => blocks(bytes, out, 34, 32, q8_0),
        GgmlType::Q4_0 => blocks(bytes, out, 18, 32, q4_0),
        GgmlType::Q4_1 => blocks(bytes, out, 20, 32, q4_1),
        GgmlType::Q4_K => blocks(bytes, out, 144, QK_K, q4_k),
        GgmlType::Q5_K => blocks(bytes, out, 176, QK_K, q5_k),
        GgmlType::Q6_K => blocks(bytes, out, 210, QK_K, q6_k),
        GgmlType::MXFP4 => blocks(bytes, out, 17, 32, mxfp4),
    }
}

/// Each e2m1 code's value doubled (integers): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
pub(crate) const MXFP4_DOUBLED: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An MXFP4 block's scale for the doubled codes: `2^(e − 128)`, exact for every `e` (down to
/// f32's subnormal 2^-128).
#[inline(always)]
pub(crate) fn mxfp4_half_scale(e: u8) -> f32 {
    match e {
        // 2^-127 and 2^-128 are subnormal: their bits, not the exponent field.
        0 => f32::from_bits(1 << 21),
        1 => f32::from_bits(1 << 22),
        _ => f32::from_bits(u32::from(e - 1) << 23),
    }
}

#[inline(always)]
fn blocks(bytes: &[u8], out: &mut [f32], bb: usize, be: usize, f: fn(&[u8], &mut [f32])) {
    for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        f(b, o);
    }
}

fn q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in o.iter_mut().zip(&b[2..34]) {
        *o = d * f32::from(q as i8);
    }
}

fn mxfp4(b: &[u8], o: &mut [f32]) {
    let d = mxfp4_half_scale(b[0]);
    let (lo, hi) = o.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[1..17]) {
        *l = d * f32::from(MXFP4_DOUBLED[usize::from(q & 0xF)]);
        *h = d * f32::from(MXFP4_DOUBLED[usize::from(q >> 4)]);
    }
}

fn q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let (lo, hi) = o.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[2..18]) {
        *l = d * f32::from((q & 0xF) as i8 - 8);
        *h = d * f32::from((q >> 4) as i8 - 8);
    }
}

fn q4_1(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let (lo, hi) = o.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[4..20]) {
        *l = d * f32::from(q & 0xF) + m;
        *h = d * f32::from(q >> 4) + m;
    }
}

fn q4_k(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
        let q = &qs[32 * j..32 * j + 32];
        let (lo, hi) = o[64 * j..64 * j + 64].split_at_mut(32);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(q) {
            *l = d1 * f32::from(q & 0xF) - m1;
            *h = d2 * f32::from(q >> 4) - m2;
        }
    }
}

fn q5_k(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
        let q = &qs[32 * j..32 * j + 32];
        let (lo, hi) = o[64 * j..64 * j + 64].split_at_mut(32);
        for (((l, h), &q), &qh) in lo.iter_mut().zip(hi.iter_mut()).zip(q).zip(qh) {
            let ql = (q & 0xF) | (((qh >> (2 * j)) & 1) << 4);
            let qhi = (q >> 4) | (((qh >> (2 * j + 1)) & 1) << 4);
            *l = d1 * f32::from(ql) - m1;
            *h = d2 * f32::from(qhi) - m2;
        }
    }
}

fn q6_k(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let o = &mut o[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let h = qh[l];
            let q1 = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            o[l] = d * f32::from(sc[is] as i8) * f32::from(q1);
            o[l + 32] = d * f32::from(sc[is + 2] as i8) * f32::from(q2);
            o[l + 64] = d * f32::from(sc[is + 4] as i8) * f32::from(q3);
            o[l + 96] = d * f32::from(sc[is + 6] as i8) * f32::from(q4);
        }
    }
}

/// `Σ a[i] * b[i]` over `min(a.len(), b.len())` elements, with 16 independent partial sums so
/// LLVM vectorizes it on any target. `mul_add` only on ARM, where FMA is part of every aarch64
/// CPU (`fmla`); on baseline x86-64 it would be a libm call.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; L];
    let ac = a.chunks_exact(L);
    let bc = b.chunks_exact(L);
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..L {
            acc[i] = if cfg!(target_arch = "aarch64") {
                x[i].mul_add(y[i], acc[i])
            } else {
                acc[i] + x[i] * y[i]
            };
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    // Pairwise reduction of the partial sums.
    let mut w = L;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + tail
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_to_f32_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = super::f16_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
        }
    }
}
