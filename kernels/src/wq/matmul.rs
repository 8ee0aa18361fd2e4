//! The CPU kernels: stored rows of a [`WqMatrix`] times f32 activation rows. The portable one
//! is here (the reference); the AVX2 one, same arithmetic, in `avx2.rs`.
//!
//! Per group, `s Σ (q - z) x`: the codes, less their zero (exact in integers), are widened to
//! f32 once per group and shared by every activation row. (Not `s (Σ q x - z Σ x)`: that
//! cancels two large f32 sums; see `avx2::group_dots`.) Here the dot products run in tiles of
//! 4 weight rows × 2 activation rows, so each load feeds two or four multiply-adds.

use super::{Bits, WqMatrix};
use crate::quant::Isa;

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
        if isa.has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above); sizes checked above.
            unsafe { super::avx2::rows(self, r0, n, x, outs) };
            return;
        }
        let _ = isa;
        rows(self, r0, n, x, outs);
    }
}

/// The portable kernel (the reference for the AVX2 one).
pub(super) fn rows(w: &WqMatrix, r0: usize, n: usize, x: &[f32], outs: &mut [&mut [f32]]) {
    let k = w.cols;
    let g = w.format.group_len(k);
    let groups = w.groups_per_row();
    let per_byte = w.format.bits.per_byte();
    // One group of ROWS weight rows, widened to f32.
    let mut wbuf = vec![0f32; ROWS * g];
    let mut totals = [[0f32; ROWS]; M_TILE];
    for (t, outs) in outs.chunks_mut(M_TILE).enumerate() {
        let i0 = t * M_TILE;
        let xs: Vec<&[f32]> = (i0..i0 + outs.len())
            .map(|i| &x[i * k..(i + 1) * k])
            .collect();
        for j0 in (0..n).step_by(ROWS) {
            let rn = ROWS.min(n - j0);
            for tot in &mut totals {
                tot.fill(0.0);
            }
            for gi in 0..groups {
                let (lo, hi) = (gi * g, ((gi + 1) * g).min(k));
                let len = hi - lo;
                for rr in 0..rn {
                    let packed = w.packed_row(r0 + j0 + rr);
                    widen(
                        &packed[lo / per_byte..hi / per_byte],
                        w.format.bits,
                        w.zero_code((r0 + j0 + rr) * groups + gi),
                        &mut wbuf[rr * g..rr * g + len],
                    );
                }
                let wrow = |rr: usize| &wbuf[rr * g..rr * g + len];
                // Activation rows two at a time against the weight rows of the tile.
                for (pair, xs) in xs.chunks(2).enumerate() {
                    let xg = |m: usize| &xs[m][lo..hi];
                    let mut add = |rr: usize, m: usize, dot: f32| {
                        let gidx = (r0 + j0 + rr) * groups + gi;
                        totals[pair * 2 + m][rr] += w.scales[gidx] * dot;
                    };
                    match (rn, xs.len()) {
                        (ROWS, 2) => {
                            let d = tile::<ROWS, 2>([0, 1, 2, 3].map(wrow), [xg(0), xg(1)]);
                            for (rr, d) in d.iter().enumerate() {
                                add(rr, 0, d[0]);
                                add(rr, 1, d[1]);
                            }
                        }
                        (ROWS, _) => {
                            let d = tile::<ROWS, 1>([0, 1, 2, 3].map(wrow), [xg(0)]);
                            for (rr, d) in d.iter().enumerate() {
                                add(rr, 0, d[0]);
                            }
                        }
                        (_, m) => {
                            for rr in 0..rn {
                                for mm in 0..m {
                                    add(rr, mm, tile::<1, 1>([wrow(rr)], [xg(mm)])[0][0]);
                                }
                            }
                        }
                    }
                }
            }
            for (o, tot) in outs.iter_mut().zip(&totals) {
                o[j0..j0 + rn].copy_from_slice(&tot[..rn]);
            }
        }
    }
}

/// Weight rows per tile: with 2 activation rows, 8 vector accumulators stay in registers.
const ROWS: usize = 4;

/// `out[r][m] = w[r] · x[m]` (all slices the same length), with `R × M` independent 8-lane
/// accumulators so each loaded vector feeds several multiply-adds.
#[inline(always)]
fn tile<const R: usize, const M: usize>(w: [&[f32]; R], x: [&[f32]; M]) -> [[f32; M]; R] {
    const L: usize = 8;
    let len = x[0].len();
    let mut acc = [[[0f32; L]; M]; R];
    let body = len - len % L;
    for o in (0..body).step_by(L) {
        let xv: [[f32; L]; M] = std::array::from_fn(|m| {
            let mut v = [0f32; L];
            v.copy_from_slice(&x[m][o..o + L]);
            v
        });
        for r in 0..R {
            let mut wv = [0f32; L];
            wv.copy_from_slice(&w[r][o..o + L]);
            for m in 0..M {
                for l in 0..L {
                    acc[r][m][l] += wv[l] * xv[m][l];
                }
            }
        }
    }
    let mut out = [[0f32; M]; R];
    for r in 0..R {
        for m in 0..M {
            let a = &acc[r][m];
            let tail: f32 = (body..len).map(|t| w[r][t] * x[m][t]).sum();
            out[r][m] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])) + tail;
        }
    }
    out
}

/// Packed codes less their zero `z`, to f32 (written so LLVM vectorizes each case).
#[inline(always)]
fn widen(packed: &[u8], bits: Bits, z: u8, out: &mut [f32]) {
    let z = i16::from(z);
    let f = |q: u8| f32::from(i16::from(q) - z);
    match bits {
        Bits::B8 => {
            for (o, &b) in out.iter_mut().zip(packed) {
                *o = f(b);
            }
        }
        Bits::B4 | Bits::B3 => {
            for (o, &b) in out.chunks_exact_mut(2).zip(packed) {
                o[0] = f(b & 0xf);
                o[1] = f(b >> 4);
            }
        }
        Bits::B2 => {
            for (o, &b) in out.chunks_exact_mut(4).zip(packed) {
                o[0] = f(b & 3);
                o[1] = f((b >> 2) & 3);
                o[2] = f((b >> 4) & 3);
                o[3] = f(b >> 6);
            }
        }
    }
}
