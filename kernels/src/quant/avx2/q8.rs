//! Q4_0, Q4_1 and Q8_0 weight rows times int8 activations ([`Q8Row`]): per block of 32, the
//! weight codes as unsigned bytes, `maddubs` against the activation codes, `madd` to 8 i32
//! lanes, then one FMA with the two scales. Two accumulators alternate between blocks so the
//! FMA is not one loop-carried chain.

use std::arch::x86_64::*;

use super::super::q8::Q8Row;
use super::groups::{f16_at, f16x2_at, load16, load32};
use super::{Avx2, hsum};
use crate::quant::GgmlType;

impl Avx2 {
    /// `out[j] = row_j · x` for the `out.len()` contiguous rows of `ty` in `rows`.
    ///
    /// # Panics
    /// If `ty` is not Q4_0, Q4_1 or Q8_0, or `rows` is not `out.len()` rows of `x.blocks()`
    /// blocks.
    pub(crate) fn q8_rows(self, ty: GgmlType, rows: &[u8], x: &Q8Row, out: &mut [f32]) {
        let nb = x.blocks();
        let rb = nb * ty.block_bytes();
        assert_eq!(rows.len(), rb * out.len(), "weight bytes");
        assert_eq!(x.qs.len(), 32 * nb, "activation codes");
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
            // SAFETY: `self` proves AVX2/FMA/F16C; `row` holds nb blocks of `ty` and `x` holds
            // nb blocks (asserted above).
            *o = unsafe {
                match ty {
                    GgmlType::Q4_1 => q4_1_row(row.as_ptr(), x, nb),
                    GgmlType::Q4_0 => q4_0_row(row.as_ptr(), x, nb),
                    GgmlType::Q8_0 => q8_0_row(row.as_ptr(), x, nb),
                    other => panic!("no int8-activation kernel for {other}"),
                }
            };
        }
    }
}

/// The 32 nibbles of a Q4 block's 16 bytes as bytes 0..=15, elements in block order (low
/// nibbles are elements 0..16, high nibbles 16..32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn nibbles(q: __m128i) -> __m256i {
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m4);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    _mm256_set_m128i(hi, lo)
}

/// `Σ w·q` as 8 f32 lanes, for unsigned weight bytes `w` (at most 128 here, so a pair of
/// products stays within i16) and signed activation codes `q`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_u8_i8(w: __m256i, q: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(w, q);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// `Σ w·q` as 8 f32 lanes, for signed weights: `|w|` times `q` with `w`'s sign, so `maddubs`
/// (unsigned × signed) applies. Pairs reach at most 2·128·127 < 2¹⁵.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_i8_i8(w: __m256i, q: __m256i) -> __m256 {
    dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w))
}

/// Sums `f(block)` (an f32 vector and its scale) over `nb` blocks into two accumulators.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn blocks(nb: usize, mut f: impl FnMut(usize) -> (__m256, f32)) -> f32 {
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut g = 0;
    while g + 2 <= nb {
        let (s0, d0) = f(g);
        let (s1, d1) = f(g + 1);
        a0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(d0), a0);
        a1 = _mm256_fmadd_ps(s1, _mm256_set1_ps(d1), a1);
        g += 2;
    }
    if g < nb {
        let (s0, d0) = f(g);
        a0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(d0), a0);
    }
    hsum(_mm256_add_ps(a0, a1))
}

/// # Safety
/// AVX2/FMA/F16C; `row` holds `nb` Q4_1 blocks (20 bytes each); `x` has `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_row(row: *const u8, x: &Q8Row, nb: usize) -> f32 {
    let mut offsets = 0f32;
    let sum = blocks(nb, |g| {
        // SAFETY: g < nb: block g is the 20 bytes at 20g; x.qs has 32 codes at 32g.
        let ((d, m), w, q) = unsafe {
            let b = row.add(20 * g);
            (
                f16x2_at(b),
                load16(b.add(4)),
                load32(x.qs.as_ptr().add(32 * g).cast()),
            )
        };
        offsets += m * x.s[g];
        (dot_u8_i8(nibbles(w), q), d * x.d[g])
    });
    sum + offsets
}

/// # Safety
/// AVX2/FMA/F16C; `row` holds `nb` Q4_0 blocks (18 bytes each); `x` has `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_row(row: *const u8, x: &Q8Row, nb: usize) -> f32 {
    blocks(nb, |g| {
        // SAFETY: g < nb: block g is the 18 bytes at 18g; x.qs has 32 codes at 32g.
        let (d, w, q) = unsafe {
            let b = row.add(18 * g);
            (
                f16_at(b),
                load16(b.add(2)),
                load32(x.qs.as_ptr().add(32 * g).cast()),
            )
        };
        let w = _mm256_sub_epi8(nibbles(w), _mm256_set1_epi8(8));
        (dot_i8_i8(w, q), d * x.d[g])
    })
}

/// # Safety
/// AVX2/FMA/F16C; `row` holds `nb` Q8_0 blocks (34 bytes each); `x` has `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_row(row: *const u8, x: &Q8Row, nb: usize) -> f32 {
    blocks(nb, |g| {
        // SAFETY: g < nb: block g is the 34 bytes at 34g; x.qs has 32 codes at 32g.
        let (d, w, q) = unsafe {
            let b = row.add(34 * g);
            (
                f16_at(b),
                load32(b.add(2)),
                load32(x.qs.as_ptr().add(32 * g).cast()),
            )
        };
        (dot_i8_i8(w, q), d * x.d[g])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::{self, tests::random_row};

    /// The kernel equals the portable reference for every type, on rows with a partial pair of
    /// blocks, extreme codes (Q8_0's −128) and a zero activation block.
    #[test]
    fn matches_the_portable_reference() {
        let Some(avx2) = Avx2::detect() else {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        };
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for nb in [1, 2, 5, 18] {
                let k = 32 * nb;
                let nrows = 3;
                let mut rows: Vec<u8> = (0..nrows)
                    .flat_map(|r| random_row(ty, k, 17 + r as u32))
                    .collect();
                if ty == GgmlType::Q8_0 {
                    rows[2..34].fill(0x80); // every code −128 in the first block
                }
                let mut x: Vec<f32> = (0..k)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                    .collect();
                x[..32.min(k)].fill(0.0);
                let acts = Q8Row::new(&x);
                let mut out = vec![0f32; nrows];
                avx2.q8_rows(ty, &rows, &acts, &mut out);
                let rb = rows.len() / nrows;
                for (j, got) in out.iter().enumerate() {
                    let want = q8::dot(ty, &rows[j * rb..(j + 1) * rb], &acts);
                    let tol = 1e-5 * want.abs().max(1.0);
                    assert!(
                        (got - want).abs() <= tol,
                        "{ty} nb{nb} row{j}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
