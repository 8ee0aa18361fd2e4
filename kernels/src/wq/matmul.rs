//! The CPU kernel: stored rows of a [`WqMatrix`] times f32 activation rows.
//!
//! Per group, `Σ s (q - z) x = s (Σ q x - z Σ x)`: the codes are widened to f32 once per group
//! and shared by every activation row, and `Σ x` per group is computed once per call, so the
//! zero point costs one multiply-add per group rather than one per element.

use super::{Bits, WqMatrix};
use crate::quant::Isa;
use crate::quant::scalar::dot_f32;

/// Activation rows that share one widening of a weight group: 8 rows of `x` stay in cache
/// while the task's weight rows stream past them.
const M_TILE: usize = 8;

impl WqMatrix {
    /// `outs[i][j] = row(r0 + j) · x[i*cols..(i+1)*cols]` for `j < outs[i].len()`, on the
    /// fastest implementation `isa` allows.
    ///
    /// # Panics
    /// If `x` is not `outs.len()` rows of `cols`, or the rows run past the matrix.
    pub(crate) fn matmul_rows(&self, isa: Isa, r0: usize, x: &[f32], outs: &mut [&mut [f32]]) {
        let k = self.cols;
        assert_eq!(x.len(), outs.len() * k, "activation length");
        let n = outs.first().map_or(0, |o| o.len());
        assert!(
            r0 + n <= self.rows,
            "rows {r0}..{} of {}",
            r0 + n,
            self.rows
        );
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2 && isa.is_available() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { avx2::rows(self, r0, n, x, outs) };
            return;
        }
        let _ = isa;
        rows(self, r0, n, x, outs);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::WqMatrix;

    /// [`super::rows`] compiled for AVX2 + FMA: the same code, auto-vectorized 8 wide.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rows(
        w: &WqMatrix,
        r0: usize,
        n: usize,
        x: &[f32],
        outs: &mut [&mut [f32]],
    ) {
        super::rows(w, r0, n, x, outs);
    }
}

#[inline(always)]
fn rows(w: &WqMatrix, r0: usize, n: usize, x: &[f32], outs: &mut [&mut [f32]]) {
    let k = w.cols;
    let g = w.format.group_len(k);
    let groups = w.groups_per_row();
    let per_byte = w.format.bits.per_byte();
    // Σ x per (activation row, group).
    let xsum: Vec<f32> = x
        .chunks_exact(k)
        .flat_map(|xi| xi.chunks(g).map(|c| c.iter().sum::<f32>()))
        .collect();
    let mut codes = vec![0f32; g];
    let mut acc = [0f32; M_TILE];
    for (t, outs) in outs.chunks_mut(M_TILE).enumerate() {
        let i0 = t * M_TILE;
        for j in 0..n {
            let r = r0 + j;
            let packed = w.packed_row(r);
            acc.fill(0.0);
            for gi in 0..groups {
                let (lo, hi) = (gi * g, ((gi + 1) * g).min(k));
                let codes = &mut codes[..hi - lo];
                widen(&packed[lo / per_byte..hi / per_byte], w.format.bits, codes);
                let s = w.scales[r * groups + gi];
                let z = w.zero(r * groups + gi);
                for (di, a) in acc[..outs.len()].iter_mut().enumerate() {
                    let i = i0 + di;
                    let xg = &x[i * k + lo..i * k + hi];
                    *a += s * (dot_f32(codes, xg) - z * xsum[i * groups + gi]);
                }
            }
            for (o, a) in outs.iter_mut().zip(&acc) {
                o[j] = *a;
            }
        }
    }
}

/// Packed codes to f32 (written so LLVM vectorizes each case).
#[inline(always)]
fn widen(packed: &[u8], bits: Bits, out: &mut [f32]) {
    match bits {
        Bits::B8 => {
            for (o, &b) in out.iter_mut().zip(packed) {
                *o = f32::from(b);
            }
        }
        Bits::B4 => {
            for (o, &b) in out.chunks_exact_mut(2).zip(packed) {
                o[0] = f32::from(b & 0xf);
                o[1] = f32::from(b >> 4);
            }
        }
        Bits::B2 => {
            for (o, &b) in out.chunks_exact_mut(4).zip(packed) {
                o[0] = f32::from(b & 3);
                o[1] = f32::from((b >> 2) & 3);
                o[2] = f32::from((b >> 4) & 3);
                o[3] = f32::from(b >> 6);
            }
        }
    }
}
