//! What calibration keeps of one projection input ([`Site`](ferrite_engine::model::llama::Site)) over
//! the calibration tokens: `H = Σ x xᵀ` for GPTQ, per-channel `max |x|` for SmoothQuant, per-
//! channel `mean |x|` and a sample of whole rows for AWQ's search.

use ferrite_kernels::cpu::matmul::{WeightView, matmul};
use ferrite_kernels::quant::GgmlType;

/// Statistics of a `[tokens, cols]` stream of activation rows.
#[derive(Debug, Clone)]
pub(crate) struct SiteStats {
    pub(crate) cols: usize,
    pub(crate) tokens: usize,
    /// `Σ x xᵀ`, `[cols, cols]` row-major; `None` when not asked for (it costs `cols²` per
    /// token).
    pub(crate) hessian: Option<Vec<f64>>,
    pub(crate) abs_max: Vec<f32>,
    abs_sum: Vec<f64>,
    /// The first `sample_cap` rows seen, `[rows, cols]`.
    pub(crate) samples: Vec<f32>,
    sample_cap: usize,
}

impl SiteStats {
    pub(crate) fn new(cols: usize, hessian: bool, sample_cap: usize) -> Self {
        Self {
            cols,
            tokens: 0,
            hessian: hessian.then(|| vec![0f64; cols * cols]),
            abs_max: vec![0f32; cols],
            abs_sum: vec![0f64; cols],
            samples: Vec::new(),
            sample_cap,
        }
    }

    /// Adds the rows of `x` (`[n, cols]`).
    pub(crate) fn add(&mut self, x: &[f32]) {
        let k = self.cols;
        let n = x.len() / k;
        self.tokens += n;
        for row in x.chunks_exact(k) {
            for ((m, s), &v) in self.abs_max.iter_mut().zip(&mut self.abs_sum).zip(row) {
                *m = m.max(v.abs());
                *s += f64::from(v.abs());
            }
        }
        let room = (self.sample_cap - self.samples.len() / k).min(n);
        self.samples.extend_from_slice(&x[..room * k]);
        if let Some(h) = &mut self.hessian {
            // Xᵀ X as one f32 matmul of Xᵀ with itself (the SIMD kernels, every core), summed
            // into f64 per call so long calibration runs do not lose precision.
            let mut xt = vec![0f32; k * n];
            for (t, row) in x.chunks_exact(k).enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    xt[c * n + t] = v;
                }
            }
            let bytes: Vec<u8> = xt.iter().flat_map(|v| v.to_le_bytes()).collect();
            // The byte length is exactly k rows of n f32s, so the view is valid.
            if let Ok(view) = WeightView::new(GgmlType::F32, k, n, &bytes) {
                let mut out = vec![0f32; k * k];
                matmul(&xt, k, view, &mut out);
                for (a, &b) in h.iter_mut().zip(&out) {
                    *a += f64::from(b);
                }
            }
        }
    }

    /// Per-channel `mean |x|`.
    pub(crate) fn abs_mean(&self) -> Vec<f32> {
        let n = self.tokens.max(1) as f64;
        self.abs_sum.iter().map(|&s| (s / n) as f32).collect()
    }

    /// The statistics of `x / s` (per channel): what the projection sees once `s` is folded
    /// into the layer before it. Exact for every field.
    pub(crate) fn divide(&mut self, s: &[f32]) {
        let k = self.cols;
        for ((m, a), &sj) in self.abs_max.iter_mut().zip(&mut self.abs_sum).zip(s) {
            *m /= sj;
            *a /= f64::from(sj);
        }
        for row in self.samples.chunks_exact_mut(k) {
            for (v, &sj) in row.iter_mut().zip(s) {
                *v /= sj;
            }
        }
        if let Some(h) = &mut self.hessian {
            for (i, row) in h.chunks_exact_mut(k).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v /= f64::from(s[i]) * f64::from(s[j]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hessian_max_mean_and_division_are_exact_sums() {
        let (k, n) = (5, 7);
        let x: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut s = SiteStats::new(k, true, 3);
        s.add(&x[..3 * k]);
        s.add(&x[3 * k..]);
        let h = s.hessian.clone().expect("hessian");
        for i in 0..k {
            for j in 0..k {
                let want: f64 = (0..n)
                    .map(|t| f64::from(x[t * k + i]) * f64::from(x[t * k + j]))
                    .sum();
                assert!((h[i * k + j] - want).abs() < 1e-5, "({i},{j})");
            }
        }
        assert_eq!(s.samples, x[..3 * k]);
        let scale = [2.0, 1.0, 0.5, 4.0, 1.0];
        let max0 = s.abs_max.clone();
        s.divide(&scale);
        let h2 = s.hessian.expect("hessian");
        assert!((h2[k + 3] - h[k + 3] / 4.0).abs() < 1e-9);
        assert_eq!(s.abs_max[2], max0[2] * 2.0);
    }
}
