//! The [`WqMatrix`] kernel with AVX2 + FMA intrinsics: codes are decoded straight into vector
//! registers (shift, mask, convert) and multiplied into up to four activation rows at once,
//! with no widened copy in memory. Same arithmetic as the portable kernel: per group
//! `s * Σ (q - z) x`, the zero subtracted in integers before the codes become f32.

use std::arch::x86_64::*;

use super::{Bits, WqMatrix};

/// Activation rows decoded codes are shared by.
const M: usize = 4;

/// `outs[i][j] = row(r0 + j) · x_i`, as [`super::matmul::rows`].
///
/// # Safety
/// The CPU must support AVX2 and FMA. Sizes are checked by the caller: `x` holds `outs.len()`
/// rows of `w.cols`, and rows `r0..r0 + n` exist.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows(w: &WqMatrix, r0: usize, n: usize, x: &[f32], outs: &mut [&mut [f32]]) {
    let k = w.cols;
    let g = w.format.group_len(k);
    let groups = w.groups_per_row();
    let bits = w.format.bits;
    let per_byte = bits.per_byte();
    for (t, outs) in outs.chunks_mut(M).enumerate() {
        let i0 = t * M;
        let m = outs.len();
        let xs: [&[f32]; M] = std::array::from_fn(|mm| {
            if mm < m {
                &x[(i0 + mm) * k..(i0 + mm + 1) * k]
            } else {
                &[]
            }
        });
        for j in 0..n {
            let r = r0 + j;
            let packed = w.packed_row(r);
            let mut total = [0f32; M];
            for gi in 0..groups {
                let (lo, hi) = (gi * g, ((gi + 1) * g).min(k));
                let bytes = &packed[lo / per_byte..hi / per_byte];
                let xg = |mm: usize| &xs[mm][lo..hi];
                let gidx = r * groups + gi;
                let z = w.zero_code(gidx);
                let mut dots = [0f32; M];
                // SAFETY (all four): AVX2/FMA are enabled for this function; `group_dots`
                // slices its inputs with bounds checks.
                match m {
                    1 => dots[..1].copy_from_slice(&unsafe { group_dots(bits, bytes, z, [xg(0)]) }),
                    2 => dots[..2]
                        .copy_from_slice(&unsafe { group_dots(bits, bytes, z, [xg(0), xg(1)]) }),
                    3 => dots[..3].copy_from_slice(&unsafe {
                        group_dots(bits, bytes, z, [xg(0), xg(1), xg(2)])
                    }),
                    _ => dots = unsafe { group_dots(bits, bytes, z, [xg(0), xg(1), xg(2), xg(3)]) },
                }
                for mm in 0..m {
                    total[mm] += w.scales[gidx] * dots[mm];
                }
            }
            for (o, tot) in outs.iter_mut().zip(total) {
                o[j] = tot;
            }
        }
    }
}

/// `Σ (q - z) x` for each of the `MM` activation-row slices in `xs` (one group's), codes in
/// `bytes`. The zero is subtracted (exactly, in integers) before the products: `Σ q x - z Σ x`
/// would cancel two large f32 sums, as an 8-bit zero is ~128 and an outlier activation channel
/// makes both sums large. It also saves the pass that computed `Σ x`.
/// `MM` is a constant so the accumulators live in registers; two sets of them alternate so
/// consecutive FMAs do not wait on each other.
#[target_feature(enable = "avx2,fma")]
unsafe fn group_dots<const MM: usize>(
    bits: Bits,
    bytes: &[u8],
    z: u8,
    xs: [&[f32]; MM],
) -> [f32; MM] {
    let len = xs.first().map_or(0, |x| x.len());
    let mut a0 = [_mm256_setzero_ps(); MM];
    let mut a1 = [_mm256_setzero_ps(); MM];
    // Codes in whole pairs of 8-code vectors (whole 32-bit words for 2-bit codes).
    let body = len - len % 16;
    let load = |x: &[f32], off: usize| {
        let xv = &x[off..off + 8];
        // SAFETY: `xv` has 8 floats; AVX2 is enabled.
        unsafe { _mm256_loadu_ps(xv.as_ptr()) }
    };
    let zv = _mm256_set1_epi32(i32::from(z));
    let to_f32 = |q: __m256i| _mm256_cvtepi32_ps(_mm256_sub_epi32(q, zv));
    let word_at = |i: usize| {
        let b: [u8; 4] = bytes[i..i + 4].try_into().unwrap_or([0; 4]);
        _mm256_set1_epi32(i32::from_le_bytes(b))
    };
    for off in (0..body).step_by(16) {
        let (v0, v1) = match bits {
            Bits::B8 => {
                let b: [u8; 16] = bytes[off..off + 16].try_into().unwrap_or([0; 16]);
                let q = u128::from_le_bytes(b);
                let q0 = _mm256_cvtepu8_epi32(_mm_set1_epi64x(q as u64 as i64));
                let q1 = _mm256_cvtepu8_epi32(_mm_set1_epi64x((q >> 64) as u64 as i64));
                (to_f32(q0), to_f32(q1))
            }
            Bits::B4 | Bits::B3 => {
                let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
                let mask = _mm256_set1_epi32(0xf);
                let q0 = _mm256_and_si256(_mm256_srlv_epi32(word_at(off / 2), shifts), mask);
                let q1 = _mm256_and_si256(_mm256_srlv_epi32(word_at(off / 2 + 4), shifts), mask);
                (to_f32(q0), to_f32(q1))
            }
            Bits::B2 => {
                let low = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
                let high = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
                let mask = _mm256_set1_epi32(3);
                let w = word_at(off / 4);
                let q0 = _mm256_and_si256(_mm256_srlv_epi32(w, low), mask);
                let q1 = _mm256_and_si256(_mm256_srlv_epi32(w, high), mask);
                (to_f32(q0), to_f32(q1))
            }
        };
        for mm in 0..MM {
            a0[mm] = _mm256_fmadd_ps(v0, load(xs[mm], off), a0[mm]);
            a1[mm] = _mm256_fmadd_ps(v1, load(xs[mm], off + 8), a1[mm]);
        }
    }
    let mut dots = [0f32; MM];
    for mm in 0..MM {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` has 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(a0[mm], a1[mm])) };
        dots[mm] = lanes.iter().sum();
    }
    if body < len {
        let tail = super::unpack(&bytes[body / bits.per_byte()..], bits, len - body);
        for mm in 0..MM {
            let xt = &xs[mm][body..len];
            dots[mm] += tail
                .iter()
                .zip(xt)
                .map(|(&q, &x)| (f32::from(q) - f32::from(z)) * x)
                .sum::<f32>();
        }
    }
    dots
}
