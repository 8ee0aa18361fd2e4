//! The [`I8Matrix`] kernels with AVX2 intrinsics: tiles of 4 weight rows × up to 2 activation
//! rows, 8 i32 accumulators in registers, one 32-byte vector of each operand per step. The
//! weight tile stays in L1 while the activation rows pass over it.

use std::arch::x86_64::*;

use super::{I8Activations, I8Matrix};
use crate::quant::dot_i8_i8;

const R: usize = 4;

/// Sum of the eight i32 lanes.
#[target_feature(enable = "avx2")]
fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Loads 32 bytes at `p[off..off + 32]` (bounds-checked).
#[target_feature(enable = "avx2")]
fn load<T: Copy>(p: &[T], off: usize) -> __m256i {
    let s = &p[off..off + 32 / std::mem::size_of::<T>()];
    // SAFETY: `s` holds exactly 32 bytes; unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// The tile loop shared by both kernels: `dot(acc, x_vec, w_vec)` accumulates one step;
/// `fix(r, xq)` is what to take out of row `r`'s i32 sum with activation row `xq`.
macro_rules! tiles {
    ($w:ident, $r0:ident, $n:ident, $x:ident, $outs:ident, $xs:expr, $step:ident, $fix:expr) => {{
        let kp = $x.padded_cols;
        let m = $x.m;
        let mut j0 = 0;
        while j0 < $n {
            let rt = R.min($n - j0);
            let wrow = |t: usize| {
                &$w.codes[($r0 + j0 + t.min(rt - 1)) * kp..($r0 + j0 + t.min(rt - 1) + 1) * kp]
            };
            let ws: [&[i8]; R] = std::array::from_fn(wrow);
            let mut i0 = 0;
            while i0 < m {
                let mt = 2.min(m - i0);
                let xrow =
                    |t: usize| &$xs[(i0 + t.min(mt - 1)) * kp..(i0 + t.min(mt - 1) + 1) * kp];
                let (xa, xb) = (xrow(0), xrow(1));
                let mut acc = [[_mm256_setzero_si256(); 2]; R];
                for off in (0..kp).step_by(32) {
                    let va = load(xa, off);
                    let vb = load(xb, off);
                    for t in 0..R {
                        let wv = load(ws[t], off);
                        acc[t][0] = $step(acc[t][0], va, wv);
                        acc[t][1] = $step(acc[t][1], vb, wv);
                    }
                }
                for t in 0..rt {
                    let r = $r0 + j0 + t;
                    for (u, a) in acc[t].iter().enumerate().take(mt) {
                        let i = i0 + u;
                        let dot = hsum(*a) - $fix(r, &$x.q[i * kp..(i + 1) * kp]);
                        $outs[i][j0 + t] = $x.scales[i] * $w.scales[r] * dot as f32;
                    }
                }
                i0 += mt;
            }
            j0 += rt;
        }
    }};
}

/// AVX-VNNI: `acc += Σ₄ u8(x + 128) × i8(w)`, the `128 · Σ w` removed at the end.
///
/// # Safety
/// The CPU must support AVX2 and AVX-VNNI; the caller checked the sizes.
#[target_feature(enable = "avx2,avxvnni")]
pub(super) unsafe fn rows_vnni(
    w: &I8Matrix,
    r0: usize,
    n: usize,
    x: &I8Activations,
    outs: &mut [&mut [f32]],
) {
    #[target_feature(enable = "avx2,avxvnni")]
    fn step(acc: __m256i, xv: __m256i, wv: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, xv, wv)
    }
    let fix = |r: usize, xq: &[i8]| 128 * w.row_sums[r] + w.minus128_fix(r, xq);
    tiles!(w, r0, n, x, outs, x.u, step, fix);
}

/// AVX2: `|x| × sign(w, x)` in `vpmaddubsw` (pairs into i16, which cannot saturate with codes
/// in `-127..=127`), then `vpmaddwd` by ones into i32.
///
/// # Safety
/// The CPU must support AVX2; the caller checked the sizes.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rows_maddubs(
    w: &I8Matrix,
    r0: usize,
    n: usize,
    x: &I8Activations,
    outs: &mut [&mut [f32]],
) {
    #[target_feature(enable = "avx2")]
    fn step(acc: __m256i, xv: __m256i, wv: __m256i) -> __m256i {
        _mm256_add_epi32(acc, dot_i8_i8(xv, wv))
    }
    let fix = |r: usize, xq: &[i8]| w.minus128_fix(r, xq);
    tiles!(w, r0, n, x, outs, x.q, step, fix);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Isa;
    use crate::w8a8::quantize_int8_rtn;

    /// Both AVX2 kernels against the portable one, whichever the CPU would pick.
    #[test]
    fn vnni_and_maddubs_agree_with_the_portable_kernel() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let (rows, cols, m) = (11, 200, 5);
        let v = |n: usize, k: f32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as f32 * k).sin() * 3.0).powi(3))
                .collect()
        };
        let w = quantize_int8_rtn(&v(rows * cols, 0.7), rows, cols).expect("w");
        let x = I8Activations::new(&v(m * cols, 1.3), m, cols);
        let run = |f: &dyn Fn(&mut [&mut [f32]])| {
            let mut out = vec![0f32; m * rows];
            let mut outs: Vec<&mut [f32]> = out.chunks_mut(rows).collect();
            f(&mut outs);
            out
        };
        let want = run(&|o| w.matmul_rows(Isa::Scalar, 0, &x, o));
        // SAFETY: AVX2 checked above.
        let got = run(&|o| unsafe { rows_maddubs(&w, 0, rows, &x, o) });
        assert_eq!(got, want, "maddubs");
        if std::arch::is_x86_feature_detected!("avxvnni") {
            // SAFETY: AVX-VNNI checked.
            let got = run(&|o| unsafe { rows_vnni(&w, 0, rows, &x, o) });
            assert_eq!(got, want, "vnni");
        }
    }
}
