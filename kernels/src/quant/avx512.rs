//! AVX-512 (F, BW, VL, DQ, VNNI) versions of the hottest CPU kernels, on the CPUs that
//! have them (Zen 4/5, Ice Lake and later), used by [`super::Isa::Avx512`]; every other kernel
//! stays on AVX2.
//!
//! - [`tile`]: the f32 microkernel of multi-row products (prefill, batched decode), over rows
//!   the AVX2 code decoded to f32: 16 lanes, and 4 weight rows × 4 activation rows of
//!   accumulators (32 registers allow it; AVX2's 16 allow 4 × 2), so each loaded vector feeds
//!   4 FMAs.
//! - [`decode`]: rows of Q4_0, Q4_1 or Q8_0 decoded to f32 for those tiles, 16 lanes at a time.
//! - [`q8_dot`]: a stored row of Q4_0, Q4_1 or Q8_0 times int8 activations (one-token steps,
//!   `--cpu-activations int8`), two groups of 32 per instruction with VNNI's `vpdpbusd`
//!   (unsigned × signed bytes, summed by fours into i32), which replaces AVX2's
//!   `maddubs` + `madd`. Signed weight codes go in as `|w|` against `x·sign(w)`.
//! - [`q8_0_dot_f32`] and [`dot_f32`]: a stored row of Q8_0, or of Q4_0, Q4_1 or MXFP4, times
//!   f32 activations, exactly (the one-token LM head, which stays exact under
//!   `GgmlActivations::Fine`): AVX2's exact path reads a 4-bit head at about 17 GB/s where
//!   these two cores stream 40.
//!
//! The unsafe code is of two kinds, as in the AVX2 module: calling `#[target_feature]`
//! functions, justified by the [`Avx512`] token (constructible only after runtime detection),
//! and unaligned loads through raw pointers, justified by the callers' length checks.

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use super::GgmlType;
use super::f16::heads;
use super::q8::Q8Row;

/// Proof that the running CPU has AVX-512 F/BW/VL/DQ/VNNI (and AVX2, FMA, F16C).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512(());

/// Weight rows decoded together for the multi-row microkernels (AVX-512's, and AVX2's, which
/// hand it their tiles).
pub(super) const TILE_W: usize = 4;

static DETECTED: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 absent, 2 present

impl Avx512 {
    /// The token, if the CPU has the features (detected once, then cached).
    #[inline]
    pub(crate) fn detect() -> Option<Self> {
        let mut s = DETECTED.load(Ordering::Relaxed);
        if s == 0 {
            let ok = super::Isa::cap() >= super::Isa::Avx512
                && super::Avx2::detect().is_some()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vnni");
            s = if ok { 2 } else { 1 };
            DETECTED.store(s, Ordering::Relaxed);
        }
        (s == 2).then_some(Self(()))
    }

    /// `r[t][i] = Σ_e w[t][e] · x[i*k + e]` for the 4 weight rows `w` and `X` activation rows.
    ///
    /// # Safety
    /// Each `w[t]` readable for `k` f32s (any alignment); `x` readable for `X * k` f32s.
    #[inline]
    pub(crate) unsafe fn tile<const X: usize>(
        self,
        w: [*const f32; TILE_W],
        x: *const f32,
        k: usize,
    ) -> [[f32; X]; TILE_W] {
        // SAFETY: `self` proves AVX-512F; the pointers are the caller's.
        unsafe { tile::<X>(w, x, k) }
    }

    /// `Σ row · x` for a stored row of `ty` (Q4_0, Q4_1 or Q8_0: see [`Self::has`]) of
    /// `x.blocks()` groups.
    ///
    /// # Safety
    /// `row` readable for `x.blocks()` blocks of `ty`.
    #[inline]
    pub(crate) unsafe fn q8_dot(self, ty: GgmlType, row: *const u8, x: &Q8Row) -> f32 {
        // SAFETY: `self` proves the features; the row is the caller's.
        unsafe {
            match ty {
                GgmlType::Q4_0 => q8_dot::<Q4_0>(row, x),
                GgmlType::Q4_1 => q8_dot::<Q4_1>(row, x),
                GgmlType::MXFP4 => q8_dot::<Mxfp4>(row, x),
                _ => q8_dot::<Q8_0>(row, x),
            }
        }
    }

    /// `Σ row · x` for a stored row of `ng` groups of `ty` (see [`Self::has`]) and f32
    /// activations, exactly (the weights dequantized without rounding; f32 sums): the
    /// one-token LM head, which `GgmlActivations::Fine` keeps exact. Q8_0's codes times `x`,
    /// then each block's scale ([`q8_0_dot_f32`]); the others' groups decoded as
    /// [`Self::decode_row`] decodes them, times `x`.
    ///
    /// # Safety
    /// `row` readable for `ng` blocks of `ty`, `x` for `32 * ng` f32s.
    #[inline]
    pub(crate) unsafe fn dot_f32(
        self,
        ty: GgmlType,
        row: *const u8,
        x: *const f32,
        ng: usize,
    ) -> f32 {
        // SAFETY: `self` proves the features; the pointers are the caller's.
        unsafe {
            match ty {
                GgmlType::Q4_0 => dot_f32::<Q4_0>(row, x, ng),
                GgmlType::Q4_1 => dot_f32::<Q4_1>(row, x, ng),
                GgmlType::MXFP4 => dot_f32::<Mxfp4>(row, x, ng),
                _ => q8_0_dot_f32(row, x, ng),
            }
        }
    }

    /// [`Q8Row::new`]'s quantization of `x` into `d`, `s` and `qs`, 32 activations at a time
    /// (the same bits: the amax is exact in any order, and the conversion rounds half to even).
    ///
    /// # Panics
    /// If the lengths are not `x.len() / 32` blocks.
    pub(crate) fn quantize_q8(self, x: &[f32], d: &mut [f32], s: &mut [f32], qs: &mut [i8]) {
        let nb = x.len() / 32;
        assert!(x.len().is_multiple_of(32), "whole blocks");
        assert!(
            d.len() == nb && s.len() == nb && qs.len() == x.len(),
            "block counts"
        );
        // SAFETY: `self` proves AVX-512F/BW; the lengths are asserted above.
        unsafe { quantize_q8(x, d, s, qs) }
    }

    /// Whether [`Self::q8_dot`] and [`Self::decode_row`] take weights of `ty`.
    pub(crate) fn has(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::MXFP4
        )
    }

    /// Decodes a stored row of `ty` (see [`Self::has`]) into the f32s of `dst`, exactly.
    ///
    /// # Panics
    /// If `row` does not hold `dst.len()` elements of `ty` in whole blocks of 32.
    pub(crate) fn decode_row(self, ty: GgmlType, row: &[u8], dst: &mut [f32]) {
        let ng = dst.len() / 32;
        assert!(dst.len().is_multiple_of(32), "whole blocks");
        assert_eq!(row.len(), ng * ty.block_bytes(), "row bytes");
        // SAFETY: `self` proves AVX-512F/BW; `row` holds ng blocks and `dst` 32·ng f32s.
        unsafe {
            match ty {
                GgmlType::Q4_0 => decode::<Q4_0>(row.as_ptr(), dst.as_mut_ptr(), ng),
                GgmlType::Q4_1 => decode::<Q4_1>(row.as_ptr(), dst.as_mut_ptr(), ng),
                GgmlType::MXFP4 => decode::<Mxfp4>(row.as_ptr(), dst.as_mut_ptr(), ng),
                _ => decode::<Q8_0>(row.as_ptr(), dst.as_mut_ptr(), ng),
            }
        }
    }
}

/// See [`Avx512::quantize_q8`].
///
/// # Safety
/// AVX-512 as [`Avx512`]; `d` and `s` hold `x.len() / 32` blocks, `qs` `x.len()` codes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn quantize_q8(x: &[f32], d: &mut [f32], s: &mut [f32], qs: &mut [i8]) {
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (b, blk) in x.chunks_exact(32).enumerate() {
        // SAFETY: 32 f32s in `blk`, 32 codes at 32b in `qs` (the caller's lengths).
        unsafe {
            let lo = _mm512_loadu_ps(blk.as_ptr());
            let hi = _mm512_loadu_ps(blk.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            let db = amax / 127.0;
            let id = _mm512_set1_ps(if db > 0.0 { 1.0 / db } else { 0.0 });
            let ql = _mm512_cvt_roundps_epi32::<NEAREST>(_mm512_mul_ps(lo, id));
            let qh = _mm512_cvt_roundps_epi32::<NEAREST>(_mm512_mul_ps(hi, id));
            let out = qs.as_mut_ptr().add(32 * b);
            _mm_storeu_si128(out.cast(), _mm512_cvtepi32_epi8(ql));
            _mm_storeu_si128(out.add(16).cast(), _mm512_cvtepi32_epi8(qh));
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(ql, qh));
            d[b] = db;
            s[b] = db * sum as f32;
        }
    }
}

/// A storage type's group of 32 as two vectors of 16 exact f32 weights.
trait Decode {
    /// # Safety
    /// AVX-512 as [`Avx512`]; `row` readable for group `g`'s block.
    unsafe fn group(row: *const u8, g: usize) -> [__m512; 2];
}

/// Decodes `ng` groups of `G` at `row` into `dst`.
///
/// # Safety
/// AVX-512 as [`Avx512`]; `row` holds `ng` blocks; `dst` writable for `32·ng` f32s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn decode<G: Decode>(row: *const u8, dst: *mut f32, ng: usize) {
    for g in 0..ng {
        // SAFETY: g < ng: the block is in `row`, 32 f32s at 32g in `dst`.
        unsafe {
            let [a, b] = G::group(row, g);
            _mm512_storeu_ps(dst.add(32 * g), a);
            _mm512_storeu_ps(dst.add(32 * g + 16), b);
        }
    }
}

/// 16 bytes as 16 f32s, unsigned or signed.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn bytes_to_f32(v: __m128i, signed: bool) -> __m512 {
    _mm512_cvtepi32_ps(if signed {
        _mm512_cvtepi8_epi32(v)
    } else {
        _mm512_cvtepu8_epi32(v)
    })
}

/// The low and high nibbles of 16 bytes (elements 0..16 and 16..32 of a 4-bit block).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn nibble_halves(q: __m128i) -> (__m128i, __m128i) {
    let m4 = _mm_set1_epi8(0x0f);
    (
        _mm_and_si128(q, m4),
        _mm_and_si128(_mm_srli_epi16(q, 4), m4),
    )
}

impl Decode for Q4_0 {
    #[inline(always)]
    unsafe fn group(row: *const u8, g: usize) -> [__m512; 2] {
        // SAFETY: an 18-byte block at 18g (the caller's contract).
        unsafe {
            let b = row.add(18 * g);
            let d = _mm512_set1_ps(super::f16::f16_at(b));
            let (lo, hi) = nibble_halves(_mm_loadu_si128(b.add(2).cast()));
            let eight = _mm512_set1_ps(8.0);
            [lo, hi].map(|h| _mm512_mul_ps(_mm512_sub_ps(bytes_to_f32(h, false), eight), d))
        }
    }
}

/// MXFP4's doubled e2m1 values looked up for `nibbles` (each 0..16), within each 128-bit lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) fn mxfp4_lookup(nibbles: __m512i) -> __m512i {
    // SAFETY: the table is 16 bytes.
    let lut = unsafe { _mm_loadu_si128(super::scalar::MXFP4_DOUBLED.as_ptr().cast()) };
    _mm512_shuffle_epi8(_mm512_broadcast_i32x4(lut), nibbles)
}

impl Decode for Mxfp4 {
    #[inline(always)]
    unsafe fn group(row: *const u8, g: usize) -> [__m512; 2] {
        // SAFETY: a 17-byte block at 17g (the caller's contract): the exponent, 16 code bytes.
        unsafe {
            let b = row.add(17 * g);
            let d = _mm512_set1_ps(super::scalar::mxfp4_half_scale(*b));
            let (lo, hi) = nibble_halves(_mm_loadu_si128(b.add(1).cast()));
            let look = |h: __m128i| _mm512_castsi512_si128(mxfp4_lookup(_mm512_castsi128_si512(h)));
            [lo, hi].map(|h| _mm512_mul_ps(bytes_to_f32(look(h), true), d))
        }
    }
}

impl Decode for Q4_1 {
    #[inline(always)]
    unsafe fn group(row: *const u8, g: usize) -> [__m512; 2] {
        // SAFETY: a 20-byte block at 20g (the caller's contract).
        unsafe {
            let b = row.add(20 * g);
            let (d, m) = super::f16::f16x2_at(b);
            let (d, m) = (_mm512_set1_ps(d), _mm512_set1_ps(m));
            let (lo, hi) = nibble_halves(_mm_loadu_si128(b.add(4).cast()));
            [lo, hi].map(|h| _mm512_fmadd_ps(bytes_to_f32(h, false), d, m))
        }
    }
}

impl Decode for Q8_0 {
    #[inline(always)]
    unsafe fn group(row: *const u8, g: usize) -> [__m512; 2] {
        // SAFETY: a 34-byte block at 34g (the caller's contract).
        unsafe {
            let b = row.add(34 * g);
            let d = _mm512_set1_ps(super::f16::f16_at(b));
            let lo = _mm_loadu_si128(b.add(2).cast());
            let hi = _mm_loadu_si128(b.add(18).cast());
            [lo, hi].map(|h| _mm512_mul_ps(bytes_to_f32(h, true), d))
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)] // index loops read clearest in a register-blocked kernel
unsafe fn tile<const X: usize>(
    w: [*const f32; TILE_W],
    x: *const f32,
    k: usize,
) -> [[f32; X]; TILE_W] {
    let mut acc = [[_mm512_setzero_ps(); X]; TILE_W];
    let k16 = k - k % 16;
    let mut e = 0;
    while e < k16 {
        // SAFETY: e + 16 <= k, within every row (the caller's bounds).
        unsafe {
            let w0 = _mm512_loadu_ps(w[0].add(e));
            let w1 = _mm512_loadu_ps(w[1].add(e));
            let w2 = _mm512_loadu_ps(w[2].add(e));
            let w3 = _mm512_loadu_ps(w[3].add(e));
            for i in 0..X {
                let xv = _mm512_loadu_ps(x.add(i * k + e));
                acc[0][i] = _mm512_fmadd_ps(w0, xv, acc[0][i]);
                acc[1][i] = _mm512_fmadd_ps(w1, xv, acc[1][i]);
                acc[2][i] = _mm512_fmadd_ps(w2, xv, acc[2][i]);
                acc[3][i] = _mm512_fmadd_ps(w3, xv, acc[3][i]);
            }
        }
        e += 16;
    }
    if k16 < k {
        let mask: __mmask16 = (1u16 << (k - k16)) - 1;
        // SAFETY: the masked lanes are below k in every row.
        unsafe {
            for t in 0..TILE_W {
                let wv = _mm512_maskz_loadu_ps(mask, w[t].add(k16));
                for i in 0..X {
                    let xv = _mm512_maskz_loadu_ps(mask, x.add(i * k + k16));
                    acc[t][i] = _mm512_fmadd_ps(wv, xv, acc[t][i]);
                }
            }
        }
    }
    let mut r = [[0f32; X]; TILE_W];
    for t in 0..TILE_W {
        for i in 0..X {
            r[t][i] = _mm512_reduce_add_ps(acc[t][i]);
        }
    }
    r
}

/// See [`Avx512::dot_f32`]: per Q8_0 block `d · Σ q·x`, 16 lanes, two blocks per iteration
/// into two accumulators, their scales decoded together ([`heads`]).
///
/// # Safety
/// As [`Avx512::dot_f32`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_dot_f32(row: *const u8, x: *const f32, ng: usize) -> f32 {
    // Σ q·x over block `g`'s 32 codes (at +2 of its 34 bytes), in 16 lanes.
    let block = |g: usize| {
        // SAFETY: g < ng: the block and its 32 activations are readable (caller contract).
        unsafe {
            let (b, p) = (row.add(34 * g + 2), x.add(32 * g));
            let w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b.cast())));
            let w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(16).cast())));
            _mm512_fmadd_ps(
                w1,
                _mm512_loadu_ps(p.add(16)),
                _mm512_mul_ps(w0, _mm512_loadu_ps(p)),
            )
        }
    };
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut g = 0;
    while g < ng {
        let last = g + 1 == ng;
        // SAFETY: blocks g and, unless `last`, g + 1 are in the row.
        let d = unsafe { heads(row.add(34 * g), row.add(34 * (g + 1)), last, true) };
        a0 = _mm512_fmadd_ps(block(g), _mm512_broadcastss_ps(d), a0);
        if !last {
            let d1 = _mm512_permutexvar_ps(_mm512_set1_epi32(2), _mm512_castps128_ps512(d));
            a1 = _mm512_fmadd_ps(block(g + 1), d1, a1);
        }
        g += 2;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
}

/// See [`Avx512::dot_f32`]: each group's 32 weights decoded exactly into two vectors, times
/// the activations into two accumulators.
///
/// # Safety
/// As [`Avx512::dot_f32`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f32<G: Decode>(row: *const u8, x: *const f32, ng: usize) -> f32 {
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for g in 0..ng {
        // SAFETY: g < ng: the block and its 32 activations are readable (caller contract).
        unsafe {
            let [w0, w1] = G::group(row, g);
            a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x.add(32 * g)), a0);
            a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x.add(32 * g + 16)), a1);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
}

/// Two consecutive groups of 32 weights as VNNI reads them: 64 codes (the low 32 bytes group
/// `g`'s, in element order), and their headers.
struct Pair {
    q: __m512i,
    /// `[d(g), m(g), d(g + 1), m(g + 1)]`: the groups' scales and minimums (Q4_1; zero for the
    /// types without one), decoded from f16 in one instruction.
    head: __m128,
}

/// A storage type whose groups of 32 VNNI reads two at a time.
trait PairGroup {
    /// Whether the codes are signed (else unsigned, below 128).
    const SIGNED: bool;

    /// Groups `g` and `g + 1` (the latter all zero codes if `g + 1` is past the row: `last`).
    ///
    /// # Safety
    /// AVX-512 as [`Avx512`]; `row` readable for group `g`'s block and, unless `last`, `g + 1`'s.
    unsafe fn pair(row: *const u8, g: usize, last: bool) -> Pair;
}

/// The 32 nibbles of each of two 16-byte runs, in element order: `[lo(a), hi(a), lo(b),
/// hi(b)]`, 16 bytes each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn nibbles2(a: __m128i, b: __m128i) -> __m512i {
    let m4 = _mm_set1_epi8(0x0f);
    let lo = |v: __m128i| _mm_and_si128(v, m4);
    let hi = |v: __m128i| _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    let first = _mm256_set_m128i(hi(a), lo(a));
    let second = _mm256_set_m128i(hi(b), lo(b));
    _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1)
}

/// 16 bytes at `p`, or zeros when `absent`.
///
/// # Safety
/// `p` readable for 16 bytes unless `absent`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load16_or_zero(p: *const u8, absent: bool) -> __m128i {
    if absent {
        _mm_setzero_si128()
    } else {
        // SAFETY: forwarded.
        unsafe { _mm_loadu_si128(p.cast()) }
    }
}

struct Q4_0;
struct Q4_1;
struct Q8_0;
struct Mxfp4;

impl PairGroup for Q4_0 {
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn pair(row: *const u8, g: usize, last: bool) -> Pair {
        // SAFETY: blocks are 18 bytes (f16 d, 16 nibble bytes); the caller's contract.
        unsafe {
            let (a, b) = (row.add(18 * g), row.add(18 * (g + 1)));
            let q = nibbles2(
                load16_or_zero(a.add(2), false),
                load16_or_zero(b.add(2), last),
            );
            Pair {
                // Codes 0..16 stand for −8..8; a missing group's zeros stay zero.
                q: _mm512_sub_epi8(
                    q,
                    _mm512_maskz_set1_epi8(if last { u32::MAX as u64 } else { u64::MAX }, 8),
                ),
                head: heads(a, b, last, true),
            }
        }
    }
}

impl PairGroup for Mxfp4 {
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn pair(row: *const u8, g: usize, last: bool) -> Pair {
        // SAFETY: blocks are 17 bytes (the exponent, 16 nibble bytes); the caller's contract.
        unsafe {
            let (a, b) = (row.add(17 * g), row.add(17 * (g + 1)));
            let q = nibbles2(
                load16_or_zero(a.add(1), false),
                load16_or_zero(b.add(1), last),
            );
            let d = |p: *const u8| super::scalar::mxfp4_half_scale(*p);
            Pair {
                // A missing group's zero nibbles look up 0.
                q: mxfp4_lookup(q),
                head: _mm_set_ps(0.0, if last { 0.0 } else { d(b) }, 0.0, d(a)),
            }
        }
    }
}

impl PairGroup for Q4_1 {
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn pair(row: *const u8, g: usize, last: bool) -> Pair {
        // SAFETY: blocks are 20 bytes (f16 d, f16 m, 16 nibble bytes); the caller's contract.
        unsafe {
            let (a, b) = (row.add(20 * g), row.add(20 * (g + 1)));
            Pair {
                q: nibbles2(
                    load16_or_zero(a.add(4), false),
                    load16_or_zero(b.add(4), last),
                ),
                head: heads(a, b, last, false),
            }
        }
    }
}

impl PairGroup for Q8_0 {
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn pair(row: *const u8, g: usize, last: bool) -> Pair {
        // SAFETY: blocks are 34 bytes (f16 d, 32 codes); the caller's contract.
        unsafe {
            let (a, b) = (row.add(34 * g), row.add(34 * (g + 1)));
            let lo = _mm256_loadu_si256(a.add(2).cast());
            let hi = if last {
                _mm256_setzero_si256()
            } else {
                _mm256_loadu_si256(b.add(2).cast())
            };
            Pair {
                q: _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                head: heads(a, b, last, true),
            }
        }
    }
}

/// `Σ row · x`: per pair of groups one `vpdpbusd` (64 products summed by fours), converted to
/// f32 and scaled per lane by the weight scale times the activations' block scale. Two pairs
/// per iteration into two accumulators, so the loop-carried FMA's latency overlaps.
///
/// # Safety
/// AVX-512 as [`Avx512`]; `row` holds `x.blocks()` groups of `G`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_dot<G: PairGroup>(row: *const u8, x: &Q8Row) -> f32 {
    let ng = x.blocks();
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut offsets = _mm_setzero_ps();
    let mut g = 0;
    while g + 4 <= ng {
        // SAFETY: groups g..g + 4 are in the row and in x.
        let ((p0, f0), (p1, f1)) =
            unsafe { (pair_dot::<G>(row, x, g), pair_dot::<G>(row, x, g + 2)) };
        acc0 = _mm512_fmadd_ps(p0, spread(f0), acc0);
        acc1 = _mm512_fmadd_ps(p1, spread(f1), acc1);
        offsets = _mm_add_ps(offsets, _mm_add_ps(f0, f1));
        g += 4;
    }
    while g < ng {
        // SAFETY: g < ng (a last odd group reads only itself).
        let (p, f) = unsafe { pair_dot::<G>(row, x, g) };
        acc0 = _mm512_fmadd_ps(p, spread(f), acc0);
        offsets = _mm_add_ps(offsets, f);
        g += 2;
    }
    // Lanes 1 and 3 of `offsets` hold Σ m·s; lanes 0 and 2 the scales, not wanted here.
    let odd = _mm_movehdup_ps(offsets);
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
        + _mm_cvtss_f32(_mm_add_ss(odd, _mm_movehl_ps(odd, odd)))
}

/// Groups `g` and `g + 1` (only `g` when it is the row's last) times the activations: the
/// integer dot per 4 codes as f32, and `[d(g)·xd(g), m(g)·xs(g), d(g+1)·xd(g+1),
/// m(g+1)·xs(g+1)]`: the scales (lanes 0, 2) and the minimums' terms (lanes 1, 3).
///
/// # Safety
/// AVX-512 as [`Avx512`]; `row` holds group `g` of `G` and `x` block `g`, and both `g + 1` unless
/// `g + 1 == x.blocks()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair_dot<G: PairGroup>(row: *const u8, x: &Q8Row, g: usize) -> (__m512, __m128) {
    let last = g + 1 == x.blocks();
    // SAFETY: g < ng (and g + 1 < ng unless `last`) groups of the row; x.qs holds 32 codes
    // per block: 64 at 32g, or 32 when `last` (the mask loads no more); x.d and x.s one value
    // per block (two at g unless `last`).
    let (p, xq, ds) = unsafe {
        let mask = if last { u32::MAX as u64 } else { u64::MAX };
        (
            G::pair(row, g, last),
            _mm512_maskz_loadu_epi8(mask, x.qs.as_ptr().add(32 * g).cast()),
            x.scales_sums(g, last),
        )
    };
    let (u, sx) = if G::SIGNED {
        // |w| (at most 128: fits u8) against x with w's sign (x is never −128).
        let neg = _mm512_movepi8_mask(p.q);
        (
            _mm512_abs_epi8(p.q),
            _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq),
        )
    } else {
        (p.q, xq)
    };
    let dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, sx);
    (_mm512_cvtepi32_ps(dots), _mm_mul_ps(p.head, ds))
}

/// Lane 0 of `f` in lanes 0..8, lane 2 in lanes 8..16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn spread(f: __m128) -> __m512 {
    let idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f))
}
