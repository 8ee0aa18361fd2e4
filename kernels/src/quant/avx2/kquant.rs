//! K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 weights, eight groups of 32) on AVX2: each
//! super-block's header (its f16 scales and the 6- or 8-bit scales and minima of its groups)
//! decoded once, in vector registers, for all eight groups ([`SuperBlock::header`]); the
//! groups' codes; and the int8 one-token dot over them ([`dot`]). `groups.rs` decodes the same
//! parts to f32 weights.
//!
//! Decoding the header per group of 32 in scalar registers, as the one-group types do with
//! their one f16, took most of a 3B Q4_K model's one-token step: it decoded at a third of
//! Q4_0's speed on the development machine (2026-11-30).

use std::arch::x86_64::*;

use super::super::q8::Q8Row;
use super::{dot_i8_i8, dot_u8_i8, hsum, load32};
use crate::quant::GgmlType;

/// A K-quant super-block: eight groups of 32 codes under one header.
pub(super) trait SuperBlock {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Whether the codes are signed (Q6_K's −32..31), else unsigned (at most 31).
    const SIGNED: bool;

    /// The scales of its 16 runs of 16 weights (lane `i` of vector `h` is run `8h + i`: group
    /// `s` is runs `2s` and `2s + 1`) and the minima of its 8 groups (lane `s`): the weights
    /// are `scale · code − min`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C; `b` readable for the super-block.
    unsafe fn header(b: *const u8) -> ([__m256; 2], __m256);

    /// Group `s`'s 32 codes as bytes, in element order.
    ///
    /// # Safety
    /// AVX2; `b` readable for the super-block; `s < 8`.
    unsafe fn codes(b: *const u8, s: usize) -> __m256i;
}

/// Lanes `0, 0, 1, 1, 2, 2, 3, 3` of a vector (with `+ 4`: `4, 4, …, 7, 7`): a value per group
/// made one per run of 16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn per_run(v: __m256, high: bool) -> __m256 {
    let at = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    let at = _mm256_add_epi32(at, _mm256_set1_epi32(if high { 4 } else { 0 }));
    _mm256_permutevar8x32_ps(v, at)
}

/// `Σ row · x` over `ng` groups of 32 (`ng / 8` super-blocks). Per group `maddubs`, `madd` to
/// 8 i32 lanes and one FMA with the group's two run scales times the activations' scale; two
/// accumulators alternate between groups so the FMA is not one loop-carried chain.
///
/// # Safety
/// AVX2/FMA/F16C; `row` holds `ng / 8` super-blocks of `K`; `x` has `ng` blocks; `ng` is a
/// multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<K: SuperBlock>(row: *const u8, x: &Q8Row, ng: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut offsets = _mm256_setzero_ps();
    let mut scales = [0f32; 16];
    for blk in 0..ng / 8 {
        // SAFETY: super-block blk of the row; groups 8blk..8blk + 8 of x (one f32 each in d and
        // s, 32 codes each in qs): the caller's lengths.
        unsafe {
            let b = row.add(K::BYTES * blk);
            let ([lo, hi], min) = K::header(b);
            let dx = _mm256_loadu_ps(x.d.as_ptr().add(8 * blk));
            offsets = _mm256_fnmadd_ps(min, _mm256_loadu_ps(x.s.as_ptr().add(8 * blk)), offsets);
            _mm256_storeu_ps(scales.as_mut_ptr(), _mm256_mul_ps(lo, per_run(dx, false)));
            _mm256_storeu_ps(
                scales.as_mut_ptr().add(8),
                _mm256_mul_ps(hi, per_run(dx, true)),
            );
            for s in 0..8 {
                let q = load32(x.qs.as_ptr().add(32 * (8 * blk + s)).cast());
                let c = K::codes(b, s);
                let p = _mm256_cvtepi32_ps(if K::SIGNED {
                    dot_i8_i8(c, q)
                } else {
                    dot_u8_i8(c, q)
                });
                // madd's lanes 0-3 are elements 0..16 (the first run), lanes 4-7 16..32.
                let two = _mm_castpd_ps(_mm_load_sd(scales.as_ptr().add(2 * s).cast()));
                let at = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
                let scale = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), at);
                acc[s % 2] = _mm256_fmadd_ps(p, scale, acc[s % 2]);
            }
        }
    }
    hsum(_mm256_add_ps(acc[0], acc[1])) + hsum(offsets)
}

/// Bits `shift..shift + width` of each byte of `v`, as bytes (`shift + width <= 8`). The 16-bit
/// shift moves no bit of one byte into the kept bits of the other.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn byte_bits(v: __m256i, shift: u32, mask: u8) -> __m256i {
    let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32));
    _mm256_and_si256(shifted, _mm256_set1_epi8(mask as i8))
}

/// Eight bytes (the four of `lo`, then of `hi`) as eight f32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bytes_f32(lo: u32, hi: u32) -> __m256 {
    let v = _mm_cvtsi64_si128((u64::from(hi) << 32 | u64::from(lo)) as i64);
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
}

/// The header of Q4_K and Q5_K: f16 `d` and `dmin`, then eight 6-bit scales `sc` and minima `m`
/// in 12 bytes (ggml's `get_scale_min_k4`, unpacked four at a time in 32-bit words). Group
/// `s`'s weights are `d·sc_s·u − dmin·m_s`.
///
/// # Safety
/// AVX2/FMA/F16C; `b` readable for 16 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_header(b: *const u8) -> ([__m256; 2], __m256) {
    // SAFETY: the header's 16 bytes (the caller's contract).
    let (h, [q0, q1, q2]) = unsafe {
        let word = |at: usize| b.add(at).cast::<u32>().read_unaligned();
        (
            _mm_cvtph_ps(_mm_loadu_si32(b)),
            [word(4), word(8), word(12)],
        )
    };
    // Groups 0-3 take the low six bits of bytes 0-3 (scales) and 4-7 (minima); groups 4-7 the
    // nibbles of bytes 8-11 with the top two bits of bytes 0-3 (scales) and 4-7 (minima) above.
    let high = |q: u32| (q >> 2) & 0x3030_3030;
    let sc = bytes_f32(q0 & 0x3f3f_3f3f, (q2 & 0x0f0f_0f0f) | high(q0));
    let m = bytes_f32(q1 & 0x3f3f_3f3f, ((q2 >> 4) & 0x0f0f_0f0f) | high(q1));
    let scale = _mm256_mul_ps(sc, _mm256_broadcastss_ps(h));
    let min = _mm256_mul_ps(m, _mm256_broadcastss_ps(_mm_movehdup_ps(h)));
    ([per_run(scale, false), per_run(scale, true)], min)
}

pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

impl SuperBlock for Q4K {
    const BYTES: usize = GgmlType::Q4_K.block_bytes();
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn header(b: *const u8) -> ([__m256; 2], __m256) {
        // SAFETY: forwarded.
        unsafe { k4_header(b) }
    }

    #[inline(always)]
    unsafe fn codes(b: *const u8, s: usize) -> __m256i {
        // SAFETY: after the 16-byte header, 4 runs of 32 bytes: groups 2j (low nibbles) and
        // 2j + 1 (high) of run j (the caller's contract); AVX2 likewise.
        unsafe { byte_bits(load32(b.add(16 + 32 * (s / 2))), 4 * (s as u32 % 2), 0x0f) }
    }
}

impl SuperBlock for Q5K {
    const BYTES: usize = GgmlType::Q5_K.block_bytes();
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn header(b: *const u8) -> ([__m256; 2], __m256) {
        // SAFETY: forwarded.
        unsafe { k4_header(b) }
    }

    #[inline(always)]
    unsafe fn codes(b: *const u8, s: usize) -> __m256i {
        // SAFETY: header 16, qh 32 (bit s of byte l is element l's fifth bit in group s), qs
        // 128 as Q4_K's (the caller's contract); AVX2 likewise.
        unsafe {
            let low = byte_bits(load32(b.add(48 + 32 * (s / 2))), 4 * (s as u32 % 2), 0x0f);
            let high = byte_bits(load32(b.add(16)), s as u32, 1);
            _mm256_or_si256(low, _mm256_slli_epi16(high, 4))
        }
    }
}

impl SuperBlock for Q6K {
    const BYTES: usize = GgmlType::Q6_K.block_bytes();
    const SIGNED: bool = true;

    /// ql 128, qh 64, 16 i8 scales (one per run of 16), f16 `d`; no minima.
    #[inline(always)]
    unsafe fn header(b: *const u8) -> ([__m256; 2], __m256) {
        // SAFETY: the scales at 192 and d at 208 (the caller's contract); AVX2 likewise.
        unsafe {
            let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_loadu_si16(b.add(208))));
            let run = |h: usize| {
                let sc = _mm_loadl_epi64(b.add(192 + 8 * h).cast());
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d)
            };
            ([run(0), run(1)], _mm256_setzero_ps())
        }
    }

    #[inline(always)]
    unsafe fn codes(b: *const u8, s: usize) -> __m256i {
        let (half, quarter) = (s / 4, s % 4);
        // SAFETY: in half n, quarter t takes the low (t < 2) or high nibbles of
        // ql[64n + 32(t % 2)..][..32] and bits 2t, 2t + 1 of qh[32n..][..32] (the caller's
        // contract); AVX2 likewise.
        unsafe {
            let ql = load32(b.add(64 * half + 32 * (quarter % 2)));
            let low = byte_bits(ql, 4 * (quarter as u32 / 2), 0x0f);
            let high = byte_bits(load32(b.add(128 + 32 * half)), 2 * quarter as u32, 3);
            _mm256_sub_epi8(
                _mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                _mm256_set1_epi8(32),
            )
        }
    }
}
