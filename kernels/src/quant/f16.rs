//! Little-endian f16 scales read as f32, exactly: what the CPU kernels' block decoders
//! (scalar-register code, shared by the AVX2 and AVX-512 ones) read a GGUF block's scales with.
//! The one-token integer dots of Q4_0, Q4_1 and Q8_0 read two blocks' headers at once with
//! `vcvtph2ps` instead ([`heads`]): in scalar registers they were a third of AVX-512's dot's
//! instructions.

use super::scalar::f16_to_f32;

/// The little-endian f16 at `p`, as f32.
///
/// # Safety
/// `p` readable for 2 bytes.
#[inline(always)]
pub(in crate::quant) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: caller guarantees 2 readable bytes; read_unaligned has no alignment needs.
    f16_to_f32(u16::from_le(unsafe { p.cast::<u16>().read_unaligned() }))
}

/// The two little-endian f16 at `p` and `p + 2`, as f32.
///
/// # Safety
/// `p` readable for 4 bytes.
#[inline(always)]
pub(in crate::quant) unsafe fn f16x2_at(p: *const u8) -> (f32, f32) {
    // SAFETY: forwarded.
    unsafe { (f16_at(p), f16_at(p.add(2))) }
}

/// The f16 headers of two blocks, `[a0, a1, b0, b1]` as f32: the two 16-bit values at `a`
/// and at `b` (`b`'s zero when `absent`; with `one`, only the first of each, the second zero).
/// Loaded whole into vector registers and converted by `vcvtph2ps`: decoding them in scalar
/// registers was a third of AVX-512's one-token dot's instructions.
///
/// # Safety
/// `a` readable for 4 bytes, and `b` unless `absent`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in crate::quant) unsafe fn heads(
    a: *const u8,
    b: *const u8,
    absent: bool,
    one: bool,
) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    // SAFETY: forwarded.
    let (ha, hb) = unsafe {
        (
            _mm_loadu_si32(a),
            if absent {
                _mm_setzero_si128()
            } else {
                _mm_loadu_si32(b)
            },
        )
    };
    let h = _mm_unpacklo_epi32(ha, hb);
    let h = if one {
        _mm_and_si128(h, _mm_set1_epi32(0xffff))
    } else {
        h
    };
    _mm_cvtph_ps(h)
}

/// [`heads`] of two blocks whose header is a scale `d` and whose codes `u` stand for
/// `d·(u + c)`: `[d(a), c·d(a), d(b), c·d(b)]`, the scales and the offsets a block's unsigned
/// codes need (Q4_0's nibbles with `c = −8`, Q8_0's codes read as `q + 128` with `c = −128`).
///
/// # Safety
/// As [`heads`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in crate::quant) unsafe fn offset_heads(
    a: *const u8,
    b: *const u8,
    absent: bool,
    c: f32,
) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    // SAFETY: forwarded.
    let h = unsafe { heads(a, b, absent, true) };
    _mm_mul_ps(_mm_moveldup_ps(h), _mm_set_ps(c, 1.0, c, 1.0))
}
