//! Block-quantized weight rows times int8 activations ([`Q8Row`]). Every type is viewed as
//! groups of 32 codes, each with a scale per 8-lane quarter of the `madd` result and an offset
//! (the group's minimum) that multiplies the activations' block sum. Per group: the codes as
//! bytes, `maddubs` against the activation codes, `madd` to 8 i32 lanes, one FMA with the
//! scales. Two accumulators alternate between groups so the FMA is not one loop-carried chain.

use std::arch::x86_64::*;

use super::super::f16::{f16_at, f16x2_at, heads, offset_heads};
use super::super::q8::Q8Row;
use super::kquant;
use super::{Avx2, dot_i8_i8, dot_u8_i8, hsum, load16, load32};
use crate::quant::GgmlType;
use crate::quant::avx512::Avx512;

impl Avx2 {
    /// `out[j] = row_j · x` for the `out.len()` contiguous rows of `ty` in `rows`.
    ///
    /// # Panics
    /// If `ty` is a float type, or `rows` is not `out.len()` rows of `x.blocks()` groups of 32.
    pub(crate) fn q8_rows(self, ty: GgmlType, rows: &[u8], x: &Q8Row, out: &mut [f32]) {
        let ng = x.blocks();
        assert!(ty.is_quantized(), "no int8-activation kernel for {ty}");
        assert!(
            ng.is_multiple_of(ty.block_elems() / 32),
            "whole blocks of {ty}"
        );
        let rb = ng * 32 / ty.block_elems() * ty.block_bytes();
        assert_eq!(rows.len(), rb * out.len(), "weight bytes");
        assert_eq!(x.qs.len(), 32 * ng, "activation codes");
        if let Some(w) = self.wide.filter(|_| Avx512::has(ty)) {
            // SAFETY: `rows` holds out.len() rows of ng groups of `ty` (asserted above); `w`
            // proves AVX-512.
            unsafe { w.q8_rows(ty, rows.as_ptr(), rb, x, out) };
            return;
        }
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
            let row = row.as_ptr();
            // SAFETY: `self` proves AVX2/FMA/F16C; `row` holds ng groups of `ty` and `x` holds
            // ng blocks (asserted above).
            *o = unsafe {
                match ty {
                    GgmlType::Q4_0 => dot_headed::<Q4_0>(row, x, ng),
                    GgmlType::Q4_1 => dot_headed::<Q4_1>(row, x, ng),
                    GgmlType::Q8_0 => dot_headed::<Q8_0>(row, x, ng),
                    GgmlType::Q4_K => kquant::dot::<kquant::Q4K>(row, x, ng),
                    GgmlType::Q5_K => kquant::dot::<kquant::Q5K>(row, x, ng),
                    GgmlType::Q6_K => kquant::dot::<kquant::Q6K>(row, x, ng),
                    GgmlType::MXFP4 => dot::<Mxfp4>(row, x, ng),
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!(),
                }
            };
        }
    }
}

impl Avx2 {
    /// [`Q8Row::new`]'s quantization of `x` into `d`, `s` and `qs`, 8 activations at a time
    /// (the same bits: the amax is exact in any order, and the rounding is half to even), for
    /// CPUs without AVX-512, where the portable loop called libm's `rintf` per activation (3%
    /// of a 3B model's one-token step).
    ///
    /// # Panics
    /// If `r` is not sized for `x` ([`Q8Row::zeroed`]).
    pub(crate) fn quantize_q8(self, x: &[f32], r: &mut Q8Row) {
        r.check_len(x.len());
        // SAFETY: `self` proves AVX2/FMA/F16C; the lengths are checked above.
        unsafe { quantize_q8(x, &mut r.d, &mut r.s, &mut r.qs) }
    }
}

/// See [`Avx2::quantize_q8`].
///
/// # Safety
/// AVX2; `d` and `s` hold `x.len() / 32` blocks, `qs` `x.len()` codes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8(x: &[f32], d: &mut [f32], s: &mut [f32], qs: &mut [i8]) {
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    for (b, blk) in x.chunks_exact(32).enumerate() {
        // SAFETY: 32 f32s in `blk` (4 vectors of 8).
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(blk[8 * i..].as_ptr()) });
        let m = v.map(|v| _mm256_and_ps(v, abs));
        let m = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let db = amax / 127.0;
        let id = _mm256_set1_ps(if db > 0.0 { 1.0 / db } else { 0.0 });
        let q = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(v, id))));
        // i32 → i16 → i8 packs within 128-bit lanes; the permutation puts the words in order.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let ordered =
            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: 32 codes at 32b in `qs` (the caller's lengths).
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().add(32 * b).cast(), ordered) };
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let sum = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b01_00_11_10));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b10_11_00_01)));
        d[b] = db;
        s[b] = db * sum as f32;
    }
}

/// One group of 32 weights, as the integer kernel reads it.
struct Codes {
    /// The 32 codes as bytes, in element order: unsigned, or signed if [`Int8Group::SIGNED`].
    q: __m256i,
    /// Per lane of `madd`'s result, the weight scale times the activations' scale `dx` (lane
    /// i sums elements 4i..4i + 4: lanes 0-3 are elements 0..16, lanes 4-7 elements 16..32).
    scale: __m256,
    /// Added per unit of the activations' block sum: the weights' minimum.
    offset: f32,
}

/// A storage type, viewed as consecutive groups of 32 integer codes.
trait Int8Group {
    /// Whether the codes are signed (else unsigned, at most 128).
    const SIGNED: bool;

    /// Group `g` of a row, against activations of scale `dx`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C; `row` readable for every byte of group `g`'s block.
    unsafe fn codes(row: *const u8, g: usize, dx: f32) -> Codes;
}

/// `Σ row · x` over `ng` groups.
///
/// # Safety
/// AVX2/FMA/F16C; `row` holds `ng` groups of `G`; `x` has `ng` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<G: Int8Group>(row: *const u8, x: &Q8Row, ng: usize) -> f32 {
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut offsets = 0f32;
    for g in 0..ng {
        // SAFETY: g < ng groups of the row; x.qs has 32 codes at 32g.
        let (c, q) = unsafe {
            (
                G::codes(row, g, x.d[g]),
                load32(x.qs.as_ptr().add(32 * g).cast()),
            )
        };
        let p = _mm256_cvtepi32_ps(if G::SIGNED {
            dot_i8_i8(c.q, q)
        } else {
            dot_u8_i8(c.q, q)
        });
        if g % 2 == 0 {
            a0 = _mm256_fmadd_ps(p, c.scale, a0);
        } else {
            a1 = _mm256_fmadd_ps(p, c.scale, a1);
        }
        offsets += c.offset * x.s[g];
    }
    hsum(_mm256_add_ps(a0, a1)) + offsets
}

/// A type whose blocks are one group of 32 with an f16 header first: its scale, and for
/// Q4_1 its minimum after it.
trait Headed: Int8Group {
    /// Bytes per block.
    const BYTES: usize;
    /// Whether the header is the scale alone (else scale and minimum).
    const SCALE_ONLY: bool;
    /// For a header of a scale `d` alone, the offset of the codes: `d·(u + OFFSET)`.
    const OFFSET: f32 = 0.0;
}

impl Headed for Q4_0 {
    const BYTES: usize = GgmlType::Q4_0.block_bytes();
    const SCALE_ONLY: bool = true;
    const OFFSET: f32 = -8.0;
}

impl Headed for Q4_1 {
    const BYTES: usize = GgmlType::Q4_1.block_bytes();
    const SCALE_ONLY: bool = false;
}

impl Headed for Q8_0 {
    const BYTES: usize = GgmlType::Q8_0.block_bytes();
    const SCALE_ONLY: bool = true;
}

/// [`dot`] for the types with a header per group, two groups per iteration: both headers
/// decoded by one `vcvtph2ps` and multiplied by the activations' scales and sums in one
/// vector (`[d·xd, m·xs]` per group), instead of in scalar registers, where they took as
/// many instructions as the integer dot.
///
/// # Safety
/// As [`dot`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_headed<G: Headed>(row: *const u8, x: &Q8Row, ng: usize) -> f32 {
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut offsets = _mm_setzero_ps();
    let product = |c: Codes, g: usize| {
        // SAFETY: g < ng: x.qs has 32 codes at 32g.
        let q = unsafe { load32(x.qs.as_ptr().add(32 * g).cast()) };
        _mm256_cvtepi32_ps(if G::SIGNED {
            dot_i8_i8(c.q, q)
        } else {
            dot_u8_i8(c.q, q)
        })
    };
    let mut g = 0;
    while g < ng {
        let last = g + 1 == ng;
        // SAFETY: groups g and, unless `last`, g + 1 are in the row and in x (one f32 each in
        // x.d and x.s). The codes' own scalar scale is unused (and so never computed).
        let (f, c0, c1) = unsafe {
            let (a, b) = (row.add(G::BYTES * g), row.add(G::BYTES * (g + 1)));
            let h = if G::OFFSET == 0.0 {
                heads(a, b, last, G::SCALE_ONLY)
            } else {
                offset_heads(a, b, last, G::OFFSET)
            };
            let f = _mm_mul_ps(h, x.scales_sums(g, last));
            (
                f,
                G::codes(row, g, 1.0),
                (!last).then(|| G::codes(row, g + 1, 1.0)),
            )
        };
        offsets = _mm_add_ps(offsets, f);
        a0 = _mm256_fmadd_ps(product(c0, g), _mm256_broadcastss_ps(f), a0);
        if let Some(c1) = c1 {
            let d1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_set1_epi32(2));
            a1 = _mm256_fmadd_ps(product(c1, g + 1), d1, a1);
        }
        g += 2;
    }
    // Lanes 1 and 3 of `offsets` hold Σ m·s; lanes 0 and 2 the scales, not wanted here.
    let odd = _mm_movehdup_ps(offsets);
    hsum(_mm256_add_ps(a0, a1)) + _mm_cvtss_f32(_mm_add_ss(odd, _mm_movehl_ps(odd, odd)))
}

/// The 32 nibbles of a 32-element block's 16 bytes, in element order (low nibbles are
/// elements 0..16, high nibbles 16..32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn nibbles(q: __m128i) -> __m256i {
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m4);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    _mm256_set_m128i(hi, lo)
}

struct Q4_0;
struct Q4_1;
struct Q8_0;

impl Int8Group for Q4_0 {
    // The nibbles u stand for d·(u − 8): unsigned codes with the offset −8d, two instructions
    // fewer per group than signed ones (`maddubs` takes unsigned weights).
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes(row: *const u8, g: usize, dx: f32) -> Codes {
        // SAFETY: block g is the 18 bytes at 18g (caller contract); AVX2 likewise.
        unsafe {
            let b = row.add(18 * g);
            let d = f16_at(b);
            Codes {
                q: nibbles(load16(b.add(2))),
                scale: _mm256_set1_ps(d * dx),
                offset: -8.0 * d,
            }
        }
    }
}

/// Signed codes (the doubled e2m1 values) under the block's power-of-two scale.
struct Mxfp4;

impl Int8Group for Mxfp4 {
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn codes(row: *const u8, g: usize, dx: f32) -> Codes {
        // SAFETY: block g is the 17 bytes at 17g (caller contract); AVX2 likewise.
        unsafe {
            let b = row.add(17 * g);
            let (lo, hi) = super::groups::mxfp4_codes(b.add(1));
            Codes {
                q: _mm256_set_m128i(hi, lo),
                scale: _mm256_set1_ps(super::super::scalar::mxfp4_half_scale(*b) * dx),
                offset: 0.0,
            }
        }
    }
}

impl Int8Group for Q4_1 {
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes(row: *const u8, g: usize, dx: f32) -> Codes {
        // SAFETY: block g is the 20 bytes at 20g (caller contract); AVX2 likewise.
        unsafe {
            let b = row.add(20 * g);
            let (d, m) = f16x2_at(b);
            Codes {
                q: nibbles(load16(b.add(4))),
                scale: _mm256_set1_ps(d * dx),
                offset: m,
            }
        }
    }
}

impl Int8Group for Q8_0 {
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn codes(row: *const u8, g: usize, dx: f32) -> Codes {
        // SAFETY: block g is the 34 bytes at 34g (caller contract); AVX2 likewise.
        unsafe {
            let b = row.add(34 * g);
            Codes {
                q: load32(b.add(2)),
                scale: _mm256_set1_ps(f16_at(b) * dx),
                offset: 0.0,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::{self, tests::random_row};

    /// The kernel equals the portable reference for every type, on rows with a partial pair of
    /// groups, extreme codes (Q8_0's −128), a zero activation block and an outlier.
    #[test]
    fn matches_the_portable_reference() {
        let tokens: Vec<Avx2> = [Avx2::detect(), Avx2::with_avx512()]
            .into_iter()
            .flatten()
            .collect();
        if tokens.is_empty() {
            eprintln!("skipped: no AVX2 on this CPU");
        }
        for avx2 in tokens {
            check_against_reference(avx2);
        }
    }

    /// [`matches_the_portable_reference`] on one token (AVX2 alone, or with AVX-512).
    fn check_against_reference(avx2: Avx2) {
        for ty in GgmlType::ALL.into_iter().filter(|t| t.is_quantized()) {
            let be = ty.block_elems();
            // 1, 2, 5, 6, 9 groups of 32 cover AVX-512's pairs, its two-pair iterations, and a
            // last odd group after either.
            for blocks in [1, 2, 5, 6, 9] {
                let k = be * blocks;
                let nrows = 7; // AVX-512's rows by fours, then three alone
                let mut rows: Vec<u8> = (0..nrows)
                    .flat_map(|r| random_row(ty, k, 17 + r as u32))
                    .collect();
                if ty == GgmlType::Q8_0 {
                    rows[2..34].fill(0x80); // every code −128 in the first block
                }
                let mut x: Vec<f32> = (0..k)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                    .collect();
                x[..32].fill(0.0);
                x[k - 5] = 300.0; // an outlier: the rest of its block keeps 2-3 bits
                let acts = Q8Row::new(&x);
                let mut out = vec![0f32; nrows];
                avx2.q8_rows(ty, &rows, &acts, &mut out);
                let rb = rows.len() / nrows;
                for (j, got) in out.iter().enumerate() {
                    let want = q8::dot(ty, &rows[j * rb..(j + 1) * rb], &acts);
                    let tol = 1e-4 * want.abs().max(1.0);
                    assert!(
                        (got - want).abs() <= tol,
                        "{ty} k{k} row{j}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
