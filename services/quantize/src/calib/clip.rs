//! AWQ's weight clipping (AutoAWQ's `auto_clip`, after the scale search): each group of each
//! row is clamped to `±r · max|w|` for the shrink ratio `r` (1, 0.95, …, 0.55) whose quantized
//! group gives the smallest error on the projection's output. Clamping a few outliers narrows
//! the group's grid, so every other weight of the group rounds more finely.
//!
//! The output error of a group's weight error `e` over the calibration rows `x` is
//! `Σ_t (x_t[g] · e)² = eᵀ H[g,g] e` with `H = Σ x xᵀ`: the Hessian block GPTQ already
//! collects, so every calibration token counts (AutoAWQ samples 512 of them) and each trial costs
//! `g²` rather than `tokens · g`.
//!
//! Like AutoAWQ, q and k are not clipped: their errors reach the attention scores through a
//! softmax, which the output error of the projection alone does not measure.

use ferrite_kernels::wq::{GroupGrid, WqFormat};
use rayon::prelude::*;

/// Ratios tried: `1 - i / GRID` for `i < GRID · MAX_SHRINK` (AutoAWQ's defaults).
const GRID: usize = 20;
const MAX_SHRINK: f64 = 0.5;

/// Clamps the row-major `[rows, cols]` `w` in place, group by group, to the clipping that
/// minimizes `eᵀ H e` once quantized to `format`; `h` is the site's `[cols, cols]` Hessian.
pub(super) fn clip(w: &mut [f32], cols: usize, h: &[f64], format: WqFormat) {
    let g = format.group_len(cols);
    w.par_chunks_mut(cols).for_each(|row| {
        for (gi, group) in row.chunks_mut(g).enumerate() {
            let lo = gi * g;
            let ratio = best_ratio(group, |e| quadratic(h, cols, lo, e), format);
            if ratio < 1.0 {
                let m = max_abs(group) * ratio;
                group.iter_mut().for_each(|v| *v = v.clamp(-m, m));
            }
        }
    });
}

/// The ratio whose clamped, quantized group has the least `error(e)`, `e` the difference from
/// the unclamped group (ties keep the larger ratio).
fn best_ratio(group: &[f32], error: impl Fn(&[f64]) -> f64, format: WqFormat) -> f32 {
    let m = max_abs(group);
    if m == 0.0 {
        return 1.0;
    }
    let mut clamped = vec![0f32; group.len()];
    let mut e = vec![0f64; group.len()];
    let mut best = (f64::INFINITY, 1.0f32);
    for i in 0..(GRID as f64 * MAX_SHRINK) as usize {
        let ratio = 1.0 - i as f32 / GRID as f32;
        let limit = m * ratio;
        for (c, &v) in clamped.iter_mut().zip(group) {
            *c = v.clamp(-limit, limit);
        }
        let grid = GroupGrid::for_group(&clamped, format);
        for ((e, &c), &v) in e.iter_mut().zip(&clamped).zip(group) {
            *e = grid.value(grid.code(f64::from(c))) - f64::from(v);
        }
        let err = error(&e);
        if err < best.0 {
            best = (err, ratio);
        }
    }
    best.1
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// `eᵀ H[lo.., lo..] e` for the `e.len()` columns starting at `lo` of the `[cols, cols]` `h`.
fn quadratic(h: &[f64], cols: usize, lo: usize, e: &[f64]) -> f64 {
    e.iter()
        .enumerate()
        .map(|(i, &ei)| {
            let row = &h[(lo + i) * cols + lo..(lo + i) * cols + lo + e.len()];
            ei * row.iter().zip(e).map(|(a, b)| a * b).sum::<f64>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_kernels::wq::{Bits, ScaleType};

    fn w4(group: usize) -> WqFormat {
        WqFormat {
            bits: Bits::B4,
            group_size: Some(group),
            zero_point: true,
            scale_type: ScaleType::F16,
        }
    }

    /// One large weight in a group of small ones: clamping it pays when its input channel
    /// carries little energy (the other 31 weights then round on a grid ~8x finer), and never
    /// when that channel dominates the output.
    #[test]
    fn an_outlier_is_clipped_only_when_that_lowers_the_output_error() {
        let mut group: Vec<f32> = (0..32)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.01)
            .collect();
        group[5] = 0.5;
        let weighted = |w5: f64| {
            move |e: &[f64]| e.iter().map(|v| v * v).sum::<f64>() + (w5 - 1.0) * e[5] * e[5]
        };
        let r = best_ratio(&group, weighted(1e-4), w4(32));
        assert!(r < 1.0, "ratio {r}");
        assert_eq!(best_ratio(&group, weighted(1e6), w4(32)), 1.0);
    }

    #[test]
    fn the_quadratic_form_reads_the_group_block() {
        let cols = 4;
        let h: Vec<f64> = (0..16).map(f64::from).collect();
        // Block rows/cols 2..4: [[10, 11], [14, 15]]; e = [1, 2]: 10 + 2*11 + 2*14 + 4*15.
        assert_eq!(quadratic(&h, cols, 2, &[1.0, 2.0]), 120.0);
    }

    #[test]
    fn clip_keeps_a_group_whose_clipping_does_not_pay() {
        let cols = 8;
        let mut w = vec![0.1f32, -0.2, 0.3, -0.4, 0.05, 0.15, -0.25, 0.35];
        let before = w.clone();
        // Channel 3 (the largest weight) carries all of the input energy.
        let mut h = vec![0f64; cols * cols];
        h[3 * cols + 3] = 1e6;
        clip(&mut w, cols, &h, w4(8));
        assert_eq!(w, before);
    }
}
