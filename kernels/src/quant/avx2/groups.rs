//! Per-type AVX2 decoders: every storage type viewed as groups of 32 elements, decoded to
//! four `__m256` of exact f32 weights, plus specialized single-row dot products for the
//! default model's types (Q4_1, Q8_0).

use std::arch::x86_64::*;

use super::super::f16::{f16_at, f16x2_at};
use super::kquant::SuperBlock;
use super::{dot_rows, hsum, load16};

/// A storage type, viewed as consecutive groups of 32 elements.
pub(super) trait Group {
    /// Whether [`Group::dot1`] needs the per-group sums of `x`.
    const NEEDS_XSUM: bool = false;

    /// Decodes group `g` of a row to 32 f32s.
    ///
    /// # Safety
    /// AVX2/FMA/F16C must be available and `row` readable for every byte of group `g`'s block.
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4];

    /// Groups of 32 under one block header: 8 for the K-quants' super-blocks, whose header
    /// [`Group::block`] decodes once for the eight.
    const GROUPS: usize = 1;

    /// Decodes block `blk`'s [`Group::GROUPS`] groups (`blk · GROUPS + s` of the row), handing
    /// each to `f(s, weights)`.
    ///
    /// # Safety
    /// As [`Group::decode`] for the block's groups.
    #[inline(always)]
    unsafe fn block(row: *const u8, blk: usize, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: forwarded (one group a block).
        f(0, unsafe { Self::decode(row, blk) })
    }

    /// `Σ row · x` over `ng` groups.
    ///
    /// # Safety
    /// As [`Group::decode`] for all `g < ng`; `x` readable for `32 * ng` f32s; if
    /// `NEEDS_XSUM`, `xsum` readable for `ng` f32s, `xsum[g] = Σ x[32g..32g + 32]`.
    #[inline(always)]
    unsafe fn dot1(row: *const u8, x: *const f32, xsum: *const f32, ng: usize) -> f32 {
        let _ = xsum;
        // SAFETY: forwarded from the caller.
        unsafe { dot_rows::<Self>(row, x, ng) }
    }
}

/// Sign-extends 16 i8 to two vectors of 8 f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn i8x16_to_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))),
    )
}

/// Zero-extends 16 u8 to two vectors of 8 f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn u8x16_to_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))),
    )
}

pub(super) struct F32;
pub(super) struct F16;
pub(super) struct BF16;
pub(super) struct Q8_0;
pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Mxfp4;

impl Group for F32 {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: group g is the 128 bytes at 128g (caller contract); loadu is unaligned.
        unsafe {
            let p = row.add(128 * g).cast::<f32>();
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
    }
}

impl Group for F16 {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: group g is the 64 bytes at 64g (caller contract).
        let (a, b, c, d) = unsafe {
            let p = row.add(64 * g);
            (
                load16(p),
                load16(p.add(16)),
                load16(p.add(32)),
                load16(p.add(48)),
            )
        };
        [
            _mm256_cvtph_ps(a),
            _mm256_cvtph_ps(b),
            _mm256_cvtph_ps(c),
            _mm256_cvtph_ps(d),
        ]
    }
}

impl Group for BF16 {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: group g is the 64 bytes at 64g (caller contract).
        let v = unsafe {
            let p = row.add(64 * g);
            [
                load16(p),
                load16(p.add(16)),
                load16(p.add(32)),
                load16(p.add(48)),
            ]
        };
        // bf16 → f32 is "append 16 zero bits": interleave zero words below each value.
        let z = _mm_setzero_si128();
        v.map(|h| {
            let lo = _mm_unpacklo_epi16(z, h);
            let hi = _mm_unpackhi_epi16(z, h);
            _mm256_castsi256_ps(_mm256_set_m128i(hi, lo))
        })
    }
}

impl Group for Q8_0 {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: block g is the 34 bytes at 34g: d at +0, qs at +2..+34 (caller contract).
        let (d, q0, q1) = unsafe {
            let b = row.add(34 * g);
            (f16_at(b), load16(b.add(2)), load16(b.add(18)))
        };
        let d = _mm256_set1_ps(d);
        let (a, b) = i8x16_to_f32(q0);
        let (c, e) = i8x16_to_f32(q1);
        [
            _mm256_mul_ps(a, d),
            _mm256_mul_ps(b, d),
            _mm256_mul_ps(c, d),
            _mm256_mul_ps(e, d),
        ]
    }

    #[inline(always)]
    unsafe fn dot1(row: *const u8, x: *const f32, _xsum: *const f32, ng: usize) -> f32 {
        // SAFETY: forwarded from the caller.
        unsafe { q8_0_dot1(row, x, ng) }
    }
}

impl Group for Q4_0 {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: block g is the 18 bytes at 18g: d at +0, qs at +2..+18 (caller contract).
        let (d, q) = unsafe {
            let b = row.add(18 * g);
            (f16_at(b), load16(b.add(2)))
        };
        let [f0, f1, f2, f3] = nibbles_magic(q);
        // d·q − 8d in one rounding equals the reference's d·(q − 8) exactly.
        let (dl, dh, off) = (
            _mm256_set1_ps(d),
            _mm256_set1_ps(d * (1.0 / 16.0)),
            _mm256_set1_ps(-8.0 * d),
        );
        [
            _mm256_fmadd_ps(f0, dl, off),
            _mm256_fmadd_ps(f1, dl, off),
            _mm256_fmadd_ps(f2, dh, off),
            _mm256_fmadd_ps(f3, dh, off),
        ]
    }
}

/// An MXFP4 block's 32 codes (16 bytes at `qs`) as signed bytes, in element order: each
/// nibble's doubled e2m1 value, looked up by one byte shuffle per half.
///
/// # Safety
/// AVX2 available; `qs` readable for 16 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn mxfp4_codes(qs: *const u8) -> (__m128i, __m128i) {
    let d = super::super::scalar::MXFP4_DOUBLED;
    // SAFETY: 16 bytes at `qs` (caller contract); the table is 16 bytes.
    let (q, lut) = unsafe { (load16(qs), load16(d.as_ptr().cast())) };
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m4);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    (_mm_shuffle_epi8(lut, lo), _mm_shuffle_epi8(lut, hi))
}

impl Group for Mxfp4 {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: block g is the 17 bytes at 17g: e at +0, qs at +1..+17 (caller contract).
        let (d, (lo, hi)) = unsafe {
            let b = row.add(17 * g);
            (
                super::super::scalar::mxfp4_half_scale(*b),
                mxfp4_codes(b.add(1)),
            )
        };
        let d = _mm256_set1_ps(d);
        let ((f0, f1), (f2, f3)) = (i8x16_to_f32(lo), i8x16_to_f32(hi));
        [
            _mm256_mul_ps(f0, d),
            _mm256_mul_ps(f1, d),
            _mm256_mul_ps(f2, d),
            _mm256_mul_ps(f3, d),
        ]
    }
}

impl Group for Q4_1 {
    const NEEDS_XSUM: bool = true;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: block g is the 20 bytes at 20g: d, m at +0, +2, qs at +4..+20.
        let ((d, m), q) = unsafe {
            let b = row.add(20 * g);
            (f16x2_at(b), load16(b.add(4)))
        };
        let [f0, f1, f2, f3] = nibbles_magic(q);
        let (dl, dh, m) = (
            _mm256_set1_ps(d),
            _mm256_set1_ps(d * (1.0 / 16.0)),
            _mm256_set1_ps(m),
        );
        [
            _mm256_fmadd_ps(f0, dl, m),
            _mm256_fmadd_ps(f1, dl, m),
            _mm256_fmadd_ps(f2, dh, m),
            _mm256_fmadd_ps(f3, dh, m),
        ]
    }

    #[inline(always)]
    unsafe fn dot1(row: *const u8, x: *const f32, xsum: *const f32, ng: usize) -> f32 {
        // SAFETY: forwarded from the caller.
        unsafe { q4_1_dot1(row, x, xsum, ng) }
    }
}

/// The 32 nibbles of a Q4_0/Q4_1 block's 16 `qs` bytes as exact floats: `[q0..8, q8..16,
/// 16·q16..24, 16·q24..32]` (the high nibbles come out scaled by 16).
///
/// No int→float conversion instruction (slow on some AMD cores): each byte is shuffled into
/// the low bits of a dword, OR-ed with the bits of 2²³, masked to one nibble, and 2²³ is
/// subtracted back, exactly.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn nibbles_magic(q: __m128i) -> [__m256; 4] {
    const Z: i8 = -1; // shuffle index with the high bit set: a zero byte
    let q = _mm256_broadcastsi128_si256(q);
    let s0 = _mm256_setr_epi8(
        0, Z, Z, Z, 1, Z, Z, Z, 2, Z, Z, Z, 3, Z, Z, Z, 4, Z, Z, Z, 5, Z, Z, Z, 6, Z, Z, Z, 7, Z,
        Z, Z,
    );
    let s1 = _mm256_setr_epi8(
        8, Z, Z, Z, 9, Z, Z, Z, 10, Z, Z, Z, 11, Z, Z, Z, 12, Z, Z, Z, 13, Z, Z, Z, 14, Z, Z, Z,
        15, Z, Z, Z,
    );
    let magic = _mm256_set1_epi32(0x4B00_0000); // 2^23 as f32 bits
    let mlo = _mm256_set1_epi32(0x4B00_000F);
    let mhi = _mm256_set1_epi32(0x4B00_00F0);
    let c = _mm256_set1_ps(8_388_608.0);
    let t0 = _mm256_or_si256(_mm256_shuffle_epi8(q, s0), magic);
    let t1 = _mm256_or_si256(_mm256_shuffle_epi8(q, s1), magic);
    let f = |t, mask| _mm256_sub_ps(_mm256_castsi256_ps(_mm256_and_si256(t, mask)), c);
    [f(t0, mlo), f(t1, mlo), f(t0, mhi), f(t1, mhi)]
}

/// 32 unsigned bytes as 4 × 8 f32, in order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn nibbles32_to_f32(q: __m256i) -> [__m256; 4] {
    let lo = _mm256_castsi256_si128(q);
    let hi = _mm256_extracti128_si256(q, 1);
    let (a, b) = u8x16_to_f32(lo);
    let (c, e) = u8x16_to_f32(hi);
    [a, b, c, e]
}

/// The K-quants (`kquant.rs`): `scale · code − min` per run of 16, from the super-block's
/// header, decoded once a block by [`Group::block`].
impl<K: SuperBlock> Group for K {
    const GROUPS: usize = 8;

    #[inline(always)]
    unsafe fn decode(row: *const u8, g: usize) -> [__m256; 4] {
        // SAFETY: super-block g / 8 of the row holds group g (the caller's contract).
        unsafe {
            let b = row.add(K::BYTES * (g / 8));
            k_group::<K>(b, g % 8, &k_header::<K>(b))
        }
    }

    #[inline(always)]
    unsafe fn block(row: *const u8, blk: usize, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: super-block blk of the row (the caller's contract).
        unsafe {
            let b = row.add(K::BYTES * blk);
            let header = k_header::<K>(b);
            for s in 0..8 {
                f(s, k_group::<K>(b, s, &header));
            }
        }
    }
}

/// A K-quant super-block's header as [`k_group`] reads it: the scale of each run of 16 and the
/// minimum of each group.
type KHeader = ([f32; 16], [f32; 8]);

/// [`SuperBlock::header`], stored.
///
/// # Safety
/// As [`SuperBlock::header`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_header<K: SuperBlock>(b: *const u8) -> KHeader {
    let (mut scale, mut min) = ([0f32; 16], [0f32; 8]);
    // SAFETY: forwarded; 16 and 8 f32s stored.
    unsafe {
        let ([lo, hi], m) = K::header(b);
        _mm256_storeu_ps(scale.as_mut_ptr(), lo);
        _mm256_storeu_ps(scale.as_mut_ptr().add(8), hi);
        _mm256_storeu_ps(min.as_mut_ptr(), m);
    }
    (scale, min)
}

/// Group `s` of the K-quant super-block at `b`, under its `header`, as 32 f32 weights.
///
/// # Safety
/// As [`SuperBlock::codes`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_group<K: SuperBlock>(b: *const u8, s: usize, (scale, min): &KHeader) -> [__m256; 4] {
    // SAFETY: forwarded.
    let q = unsafe { K::codes(b, s) };
    let [w0, w1, w2, w3] = if K::SIGNED {
        let (a, b) = i8x16_to_f32(_mm256_castsi256_si128(q));
        let (c, e) = i8x16_to_f32(_mm256_extracti128_si256(q, 1));
        [a, b, c, e]
    } else {
        nibbles32_to_f32(q)
    };
    let m = _mm256_set1_ps(min[s]);
    let (first, second) = (
        _mm256_set1_ps(scale[2 * s]),
        _mm256_set1_ps(scale[2 * s + 1]),
    );
    [
        _mm256_fmsub_ps(w0, first, m),
        _mm256_fmsub_ps(w1, first, m),
        _mm256_fmsub_ps(w2, second, m),
        _mm256_fmsub_ps(w3, second, m),
    ]
}

/// Block `gg` of a Q8_0 row: `(d, Σ q·x)` (as 8 partial sums).
///
/// # Safety
/// AVX2/FMA/F16C; block `gg` (34 bytes at 34gg) and `x[32gg..32gg + 32]` readable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q8_0_block(row: *const u8, x: *const f32, gg: usize) -> (__m256, __m256) {
    // SAFETY: caller contract.
    let (d, q0, q1, x0, x1, x2, x3) = unsafe {
        let b = row.add(34 * gg);
        let p = x.add(32 * gg);
        (
            f16_at(b),
            load16(b.add(2)),
            load16(b.add(18)),
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        )
    };
    let (w0, w1) = i8x16_to_f32(q0);
    let (w2, w3) = i8x16_to_f32(q1);
    let t = _mm256_fmadd_ps(w1, x1, _mm256_mul_ps(w0, x0));
    let u = _mm256_fmadd_ps(w3, x3, _mm256_mul_ps(w2, x2));
    (_mm256_set1_ps(d), _mm256_add_ps(t, u))
}

/// Single-row Q8_0: `Σ_blocks d · (Σ q·x)`, two blocks per iteration into separate
/// accumulators (the scale FMA is the loop-carried dependency).
///
/// # Safety
/// As [`Group::dot1`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q8_0_dot1(row: *const u8, x: *const f32, ng: usize) -> f32 {
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut g = 0;
    while g + 2 <= ng {
        // SAFETY: g + 1 < ng.
        let ((d0, s0), (d1, s1)) = unsafe { (q8_0_block(row, x, g), q8_0_block(row, x, g + 1)) };
        a0 = _mm256_fmadd_ps(s0, d0, a0);
        a1 = _mm256_fmadd_ps(s1, d1, a1);
        g += 2;
    }
    if g < ng {
        // SAFETY: g < ng.
        let (d0, s0) = unsafe { q8_0_block(row, x, g) };
        a0 = _mm256_fmadd_ps(s0, d0, a0);
    }
    hsum(_mm256_add_ps(a0, a1))
}

/// Single-row Q4_1: `Σ_blocks d·(Σ q·x) + m·(Σ x)`, alternating between two accumulators
/// (the scale FMA is the loop-carried dependency), with `Σ x` per block precomputed once per
/// call.
///
/// # Safety
/// As [`Group::dot1`] (with `xsum`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4_1_dot1(row: *const u8, x: *const f32, xsum: *const f32, ng: usize) -> f32 {
    let z = _mm256_setzero_ps();
    let (mut a0, mut a1) = (z, z);
    let mut mx = 0f32;
    let sixteenth = _mm256_set1_ps(1.0 / 16.0);
    let mut g = 0;
    while g < ng {
        // SAFETY: g < ng: block g is the 20 bytes at 20g, x has 32 f32s at 32g, xsum[g].
        let ((d, m), q, xs, x0, x1, x2, x3) = unsafe {
            let b = row.add(20 * g);
            let p = x.add(32 * g);
            (
                f16x2_at(b),
                load16(b.add(4)),
                *xsum.add(g),
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            )
        };
        let [w0, w1, w2, w3] = nibbles_magic(q);
        let lo = _mm256_fmadd_ps(w1, x1, _mm256_mul_ps(w0, x0));
        let hi = _mm256_fmadd_ps(w3, x3, _mm256_mul_ps(w2, x2));
        let s = _mm256_fmadd_ps(hi, sixteenth, lo);
        if g % 2 == 0 {
            a0 = _mm256_fmadd_ps(s, _mm256_set1_ps(d), a0);
        } else {
            a1 = _mm256_fmadd_ps(s, _mm256_set1_ps(d), a1);
        }
        mx += m * xs;
        g += 1;
    }
    hsum(_mm256_add_ps(a0, a1)) + mx
}
