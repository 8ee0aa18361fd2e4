//! AVX-512 (F, BW, VL, DQ, VNNI) versions of the hottest CPU kernels, on the CPUs that
//! have them (Zen 4/5, Ice Lake and later), used by [`super::Isa::Avx512`]; every other kernel
//! stays on AVX2.
//!
//! - [`tile`]: the f32 microkernel of multi-row products (prefill, batched decode), over rows
//!   the AVX2 code decoded to f32: 16 lanes, and 4 weight rows × 4 activation rows of
//!   accumulators (32 registers allow it; AVX2's 16 allow 4 × 2), so each loaded vector feeds
//!   4 FMAs.
//! - [`decode`]: rows of Q4_0, Q4_1 or Q8_0 decoded to f32 for those tiles, 16 lanes at a time.
//! - [`q8_rows`]: stored rows of Q4_0, Q4_1, Q8_0 or MXFP4 times int8 activations (one-token steps,
//!   `--cpu-activations int8`), two groups of 32 per instruction with VNNI's `vpdpbusd`
//!   (unsigned × signed bytes, summed by fours into i32), which replaces AVX2's
//!   `maddubs` + `madd`. Q4_0's and Q8_0's codes go in unsigned with an offset per group
//!   (`d·(u − 8)`, `d·(u − 128)`: the panels' reading, [`super::vnni_panel`]), which the
//!   activations' block sums pay for; MXFP4's signed values as `|w|` against `x·sign(w)`.
//! - [`scaled_dot_f32`] and [`dot_f32`]: a stored row of Q8_0, Q4_0, MXFP4, or Q4_1, times
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
use super::f16::{heads, offset_heads};
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

    /// `out[j] = row_j · x` for the `out.len()` consecutive rows of `rb` bytes at `rows`, each
    /// a stored row of `ty` (Q4_0, Q4_1, Q8_0 or MXFP4: see [`Self::has`]) of `x.blocks()`
    /// groups.
    ///
    /// # Safety
    /// `rows` readable for `out.len()` rows of `rb` bytes, each `x.blocks()` blocks of `ty`.
    #[inline]
    pub(crate) unsafe fn q8_rows(
        self,
        ty: GgmlType,
        rows: *const u8,
        rb: usize,
        x: &Q8Row,
        out: &mut [f32],
    ) {
        // SAFETY: `self` proves the features; the rows are the caller's.
        unsafe {
            match ty {
                GgmlType::Q4_0 => q8_rows::<Q4_0>(rows, rb, x, out),
                GgmlType::Q4_1 => q8_rows::<Q4_1>(rows, rb, x, out),
                GgmlType::MXFP4 => q8_rows::<Mxfp4>(rows, rb, x, out),
                _ => q8_rows::<Q8_0>(rows, rb, x, out),
            }
        }
    }

    /// `Σ row · x` for a stored row of `ng` groups of `ty` (see [`Self::has`]) and f32
    /// activations, exactly (the weights dequantized without rounding; f32 sums): the
    /// one-token LM head, which `GgmlActivations::Fine` keeps exact. Q8_0's, Q4_0's and
    /// MXFP4's integer codes times `x`, then each block's scale ([`scaled_dot_f32`]); Q4_1's
    /// groups decoded as [`Self::decode_row`] decodes them, times `x`.
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
                GgmlType::Q4_0 => scaled_dot_f32::<Q4_0>(row, x, ng),
                GgmlType::Q4_1 => dot_f32::<Q4_1>(row, x, ng),
                GgmlType::MXFP4 => scaled_dot_f32::<Mxfp4>(row, x, ng),
                _ => scaled_dot_f32::<Q8_0>(row, x, ng),
            }
        }
    }

    /// [`Q8Row::new`]'s quantization of `x` into `d`, `s` and `qs`, 32 activations at a time
    /// (the same bits: the amax is exact in any order, and the conversion rounds half to even).
    ///
    /// # Panics
    /// If `r` is not sized for `x` ([`Q8Row::zeroed`]).
    pub(crate) fn quantize_q8(self, x: &[f32], r: &mut Q8Row) {
        r.check_len(x.len());
        // SAFETY: `self` proves AVX-512F/BW; the lengths are checked above.
        unsafe { quantize_q8(x, &mut r.d, &mut r.s, &mut r.qs) }
    }

    /// Whether [`Self::q8_rows`] and [`Self::decode_row`] take weights of `ty`.
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

/// MXFP4's doubled e2m1 values looked up for `nibbles` (each 0..16), within each 128-bit lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) fn mxfp4_lookup(nibbles: __m512i) -> __m512i {
    // SAFETY: the table is 16 bytes.
    let lut = unsafe { _mm_loadu_si128(super::scalar::MXFP4_DOUBLED.as_ptr().cast()) };
    _mm512_shuffle_epi8(_mm512_broadcast_i32x4(lut), nibbles)
}

/// The types of integer codes times one scale per block decode as exactly that.
impl<S: Scaled> Decode for S {
    #[inline(always)]
    unsafe fn group(row: *const u8, g: usize) -> [__m512; 2] {
        // SAFETY: a block at `S::BYTES · g` (the caller's contract).
        unsafe {
            let b = row.add(S::BYTES * g);
            let d = _mm512_broadcastss_ps(S::scales(b, b, true));
            S::codes(b).map(|c| _mm512_mul_ps(bytes_to_f32(c, true), d))
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

/// A type whose groups of 32 are integer codes (signed bytes) times one scale per group:
/// Q8_0, Q4_0 (nibbles − 8) and MXFP4 (doubled e2m1 values, times half the scale).
trait Scaled {
    /// Bytes per block.
    const BYTES: usize;

    /// The 32 codes of the block at `b`, 16 per vector, in element order.
    ///
    /// # Safety
    /// AVX-512 as [`Avx512`]; `b` readable for one block.
    unsafe fn codes(b: *const u8) -> [__m128i; 2];

    /// `[s(a), _, s(b), _]`: the scales of the blocks at `a` and `b` (zero if `absent`); by
    /// default an f16 first in each block.
    ///
    /// # Safety
    /// AVX-512 as [`Avx512`]; `a` readable for one block, and `b` unless `absent`.
    #[inline(always)]
    unsafe fn scales(a: *const u8, b: *const u8, absent: bool) -> __m128 {
        // SAFETY: forwarded.
        unsafe { heads(a, b, absent, true) }
    }
}

impl Scaled for Q8_0 {
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [__m128i; 2] {
        // SAFETY: the codes are bytes 2..34 of the block (the caller's contract).
        unsafe { [2, 18].map(|o| _mm_loadu_si128(b.add(o).cast())) }
    }
}

impl Scaled for Q4_0 {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [__m128i; 2] {
        // SAFETY: the nibbles are bytes 2..18 of the block (the caller's contract); the
        // features are the caller's.
        unsafe {
            let (lo, hi) = nibble_halves(_mm_loadu_si128(b.add(2).cast()));
            [lo, hi].map(|h| _mm_sub_epi8(h, _mm_set1_epi8(8)))
        }
    }
}

impl Scaled for Mxfp4 {
    const BYTES: usize = 17;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [__m128i; 2] {
        // SAFETY: the nibbles are bytes 1..17 of the block (the caller's contract); the
        // features are the caller's.
        unsafe {
            let (lo, hi) = nibble_halves(_mm_loadu_si128(b.add(1).cast()));
            [lo, hi].map(|h| _mm512_castsi512_si128(mxfp4_lookup(_mm512_castsi128_si512(h))))
        }
    }
    #[inline(always)]
    unsafe fn scales(a: *const u8, b: *const u8, absent: bool) -> __m128 {
        let d = super::scalar::mxfp4_half_scale;
        // SAFETY: the exponent is the block's first byte (the caller's contract).
        unsafe { _mm_set_ps(0.0, if absent { 0.0 } else { d(*b) }, 0.0, d(*a)) }
    }
}

/// See [`Avx512::dot_f32`]: per block `s · Σ c·x` over its integer codes `c`, 16 lanes, two
/// blocks per iteration into two accumulators, their scales decoded together. (Decoding each
/// weight to `s·c` first, then multiplying, took twice the vector instructions: Q4_0's head
/// read at about 24 GB/s.)
///
/// # Safety
/// As [`Avx512::dot_f32`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn scaled_dot_f32<S: Scaled>(row: *const u8, x: *const f32, ng: usize) -> f32 {
    // Σ c·x over block `g`'s 32 codes, in 16 lanes.
    let block = |g: usize| {
        // SAFETY: g < ng: the block and its 32 activations are readable (caller contract).
        unsafe {
            let [c0, c1] = S::codes(row.add(S::BYTES * g));
            let p = x.add(32 * g);
            let w = |c| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
            _mm512_fmadd_ps(
                w(c1),
                _mm512_loadu_ps(p.add(16)),
                _mm512_mul_ps(w(c0), _mm512_loadu_ps(p)),
            )
        }
    };
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut g = 0;
    while g < ng {
        let last = g + 1 == ng;
        // SAFETY: blocks g and, unless `last`, g + 1 are in the row.
        let d = unsafe { S::scales(row.add(S::BYTES * g), row.add(S::BYTES * (g + 1)), last) };
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
    /// `[d(g), m(g), d(g + 1), m(g + 1)]`: the groups' scales and offsets (Q4_1's minimums,
    /// Q4_0's −8d and Q8_0's −128d for their codes read unsigned; zero for MXFP4), decoded from
    /// f16 in one instruction.
    head: __m128,
}

/// A storage type whose groups of 32 VNNI reads two at a time.
trait PairGroup {
    /// Whether the codes are signed (else unsigned bytes).
    const SIGNED: bool;

    /// Groups `g` and `g + 1` (if `g + 1` is past the row, `last`, its header is zero, and its
    /// codes meet zero activations).
    ///
    /// # Safety
    /// AVX-512 as [`Avx512`]; `row` readable for group `g`'s block and, unless `last`, `g + 1`'s.
    unsafe fn pair(row: *const u8, g: usize, last: bool) -> Pair;
}

/// The 32 nibbles of each of two 16-byte runs, in element order: `[lo(a), hi(a), lo(b),
/// hi(b)]`, 16 bytes each: `[a, a, b, b]`, the odd 128-bit lanes shifted down by a nibble.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn nibbles2(a: __m128i, b: __m128i) -> __m512i {
    let v = _mm512_inserti32x4::<1>(_mm512_castsi128_si512(a), a);
    let v = _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(v, b), b);
    // 16-bit elements 8..16 and 24..32 are lanes 1 and 3.
    let v = _mm512_mask_srli_epi16::<4>(v, 0xff00_ff00, v);
    _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
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
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn pair(row: *const u8, g: usize, last: bool) -> Pair {
        // SAFETY: blocks are 18 bytes (f16 d, 16 nibble bytes); the caller's contract.
        unsafe {
            let (a, b) = (row.add(18 * g), row.add(18 * (g + 1)));
            Pair {
                // The codes u stand for d·(u − 8): unsigned, with the offset −8d.
                q: nibbles2(
                    load16_or_zero(a.add(2), false),
                    load16_or_zero(b.add(2), last),
                ),
                head: offset_heads(a, b, last, -8.0),
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
    const SIGNED: bool = false;
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
            let q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            Pair {
                // The signed codes q as u = q + 128 (flipping the top bit), with the offset
                // −128d; a missing group's codes become 128, against zero activations.
                q: _mm512_xor_si512(q, _mm512_set1_epi8(-128)),
                head: offset_heads(a, b, last, -128.0),
            }
        }
    }
}

/// See [`Avx512::q8_rows`]: 4 rows at a time, one after the other (so that they stream from
/// memory as one run), their sums across lanes taken together (for rows of 2048 weights, each
/// row's own reduction was a tenth of its dot); then the rest one by one.
///
/// # Safety
/// AVX-512 as [`Avx512`]; as [`Avx512::q8_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_rows<G: PairGroup>(rows: *const u8, rb: usize, x: &Q8Row, out: &mut [f32]) {
    let whole = out.len() / 4 * 4;
    let (fours, rest) = out.split_at_mut(whole);
    for (j, o) in fours.chunks_exact_mut(4).enumerate() {
        // SAFETY: rows 4j..4j + 4 are in `rows` (the caller's contract).
        let lanes = unsafe {
            let at = |r: usize| rows.add((4 * j + r) * rb);
            [
                q8_dot::<G>(at(0), x),
                q8_dot::<G>(at(1), x),
                q8_dot::<G>(at(2), x),
                q8_dot::<G>(at(3), x),
            ]
        };
        o.copy_from_slice(&sum4(lanes));
    }
    for (j, o) in rest.iter_mut().enumerate() {
        // SAFETY: as above.
        *o = _mm512_reduce_add_ps(unsafe { q8_dot::<G>(rows.add((whole + j) * rb), x) });
    }
}

/// `Σ row · x` as lanes to be summed: per pair of groups one `vpdpbusd` (64 products summed by
/// fours), converted to f32 and scaled per lane by the weight scale times the activations'
/// block scale. Two pairs per iteration into two accumulators, so the loop-carried FMA's
/// latency overlaps; only the last pair asks whether it is whole.
///
/// One row at a time, so that a thread's rows stream from memory as one run: interleaving two
/// or four rows (to share the activations' loads) made the hardware prefetcher follow short
/// runs and ran 2-4 times slower on a 3B model (2026-11-30).
///
/// # Safety
/// AVX-512 as [`Avx512`]; `row` holds `x.blocks()` groups of `G`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline(never)] // inlined four times into `q8_rows`, the rows' loops were run as one, slowly
unsafe fn q8_dot<G: PairGroup>(row: *const u8, x: &Q8Row) -> __m512 {
    let ng = x.blocks();
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut offsets = _mm_setzero_ps();
    let mut g = 0;
    while g + 4 <= ng {
        // SAFETY: groups g..g + 4 are in the row and in x.
        let ((p0, f0), (p1, f1)) = unsafe {
            (
                pair_dot::<G>(row, x, g, false),
                pair_dot::<G>(row, x, g + 2, false),
            )
        };
        acc0 = _mm512_fmadd_ps(p0, spread(f0), acc0);
        acc1 = _mm512_fmadd_ps(p1, spread(f1), acc1);
        offsets = _mm_add_ps(offsets, _mm_add_ps(f0, f1));
        g += 4;
    }
    while g < ng {
        // SAFETY: g < ng (a last odd group reads only itself).
        let (p, f) = unsafe { pair_dot::<G>(row, x, g, g + 1 == ng) };
        acc0 = _mm512_fmadd_ps(p, spread(f), acc0);
        offsets = _mm_add_ps(offsets, f);
        g += 2;
    }
    // Lanes 1 and 3 of `offsets` hold Σ m·s; lanes 0 and 2 the scales, not wanted here.
    let minimums = _mm_blend_ps::<0b1010>(_mm_setzero_ps(), offsets);
    _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_zextps128_ps512(minimums))
}

/// The sums of the lanes of each of 4 vectors: halves, then quarters, of two vectors added in
/// one instruction, then within each 128-bit lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn sum4([v0, v1, v2, v3]: [__m512; 4]) -> [f32; 4] {
    // 128-bit lanes: [v0.0 + v0.2, v0.1 + v0.3, v1.0 + v1.2, v1.1 + v1.3], and for v2, v3.
    let h = |a, b| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    let (a, b) = (h(v0, v1), h(v2, v3));
    // Lane r: the four partial sums of v_r.
    let q = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
    );
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0b10_11_00_01>(q));
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0b01_00_11_10>(q));
    let idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    let mut out = [0f32; 4];
    // SAFETY: 4 f32s written to `out`.
    unsafe {
        _mm_storeu_ps(
            out.as_mut_ptr(),
            _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, q)),
        )
    };
    out
}

/// Groups `g` and `g + 1` (only `g` if `last`, the row's last) times the activations: the
/// integer dot per 4 codes as f32, and `[d(g)·xd(g), m(g)·xs(g), d(g+1)·xd(g+1),
/// m(g+1)·xs(g+1)]`: the scales (lanes 0, 2) and the minimums' terms (lanes 1, 3).
///
/// # Safety
/// AVX-512 as [`Avx512`]; `row` holds group `g` of `G` and `x` block `g`, and both `g + 1`
/// unless `last`, which is `g + 1 == x.blocks()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair_dot<G: PairGroup>(
    row: *const u8,
    x: &Q8Row,
    g: usize,
    last: bool,
) -> (__m512, __m128) {
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
