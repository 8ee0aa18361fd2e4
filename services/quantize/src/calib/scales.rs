//! Per-input-channel scales that move difficulty between a projection's activations and its
//! weights, folded into the layer so the model computes the same function:
//! `y = (x / s) · (W diag(s))ᵀ`. The `1/s` goes into whatever produces `x`:
//!
//! | site | `x` comes from | `1/s` folds into |
//! |---|---|---|
//! | q, k, v | the attention RMSNorm | its weight (none in OLMo 2, which has no such norm) |
//! | gate, up | the MLP RMSNorm | its weight (likewise) |
//! | down | `act(gate) ⊙ up` | up's rows |
//! | o | attention over v | v's rows (only without grouped-query heads: with them a v row feeds several heads' o columns, which would need equal scales) |
//!
//! Producers whose rows take the `1/s` (up, v) lose nothing: their quantization grids are per
//! row (or per group within a row), so a row's scale moves into its grid.
//!
//! - **SmoothQuant** (Xiao et al., 2023): `s_j = max|x_j|^α / max_i |W_ij|^(1-α)`.
//! - **AWQ** (Lin et al., 2024; AutoAWQ's `_search_best_scale` with `duo_scaling`):
//!   `s_j = mean|x_j|^r / mean_i(|W_ij| / max_group |W|)^(1-r)`, normalized by
//!   `sqrt(max s · min s)`, for `r` on a grid; the `s` kept is the one whose RTN-quantized
//!   weights give the smallest squared error on the site's projection outputs for a sample of
//!   calibration rows. (AutoAWQ measures the error after the whole attention or MLP block;
//!   here it is measured at the projections.) Unscaled weights (plain RTN) are a candidate
//!   too (`r = 0` is not: it gives `s = 1 / mean|W|`), so the search never does worse than
//!   RTN on that sample. AutoAWQ's clipping search follows ([`super::clip`]).

use ferrite_kernels::cpu::matmul::matmul;
use ferrite_kernels::wq::{WqFormat, quantize_rtn};

use ferrite_engine::config::ModelConfig;
use ferrite_engine::model::llama::{Layer, Site};
use ferrite_engine::{EngineError, Result};
use ferrite_formats::Matrix;

use super::stats::SiteStats;
use super::{CalibOptions, F32Weights, SITES, site_members};

/// Whether `site`'s scales can be folded in this model (see the module table).
fn foldable(c: &ModelConfig, site: Site) -> bool {
    match site {
        Site::Qkv | Site::GateUp => c.pre_norms,
        Site::O => c.num_heads == c.num_kv_heads,
        Site::Down => true,
    }
}

/// Folds `s` into the layer at `site`: the producer divided, the projections' columns
/// multiplied; the site's statistics become those of `x / s`.
fn fold(layer: &mut Layer, wf: &mut F32Weights, stats: &mut SiteStats, site: Site, s: &[f32]) {
    let divide_rows = |w: &mut [f32], cols: usize| {
        for (row, &sj) in w.chunks_exact_mut(cols).zip(s) {
            row.iter_mut().for_each(|v| *v /= sj);
        }
    };
    match site {
        Site::Qkv => layer
            .attn_norm
            .iter_mut()
            .flatten()
            .zip(s)
            .for_each(|(w, sj)| *w /= sj),
        Site::GateUp => layer
            .ffn_norm
            .iter_mut()
            .flatten()
            .zip(s)
            .for_each(|(w, sj)| *w /= sj),
        Site::O => {
            divide_rows(&mut wf.w[2], wf.shape[2].1);
            if let Some([_, _, bv]) = &mut layer.qkv_bias {
                bv.iter_mut().zip(s).for_each(|(b, sj)| *b /= sj);
            }
        }
        Site::Down => divide_rows(&mut wf.w[5], wf.shape[5].1),
    }
    for &p in site_members(site) {
        let cols = wf.shape[p].1;
        for row in wf.w[p].chunks_exact_mut(cols) {
            row.iter_mut().zip(s).for_each(|(v, sj)| *v *= sj);
        }
    }
    stats.divide(s);
}

/// SmoothQuant with migration strength `alpha` at every foldable site.
pub(super) fn smooth(
    c: &ModelConfig,
    layer: &mut Layer,
    wf: &mut F32Weights,
    stats: &mut [SiteStats],
    alpha: f32,
) -> Result<()> {
    for (si, &site) in SITES.iter().enumerate() {
        if !foldable(c, site) {
            continue;
        }
        let cols = stats[si].cols;
        let mut wmax = vec![0f32; cols];
        for &p in site_members(site) {
            for row in wf.w[p].chunks_exact(cols) {
                for (m, v) in wmax.iter_mut().zip(row) {
                    *m = m.max(v.abs());
                }
            }
        }
        let s: Vec<f32> = stats[si]
            .abs_max
            .iter()
            .zip(&wmax)
            .map(|(&x, &w)| {
                if x > 0.0 && w > 0.0 {
                    (x.powf(alpha) / w.powf(1.0 - alpha)).clamp(1e-5, 1e5)
                } else {
                    1.0
                }
            })
            .collect();
        fold(layer, wf, &mut stats[si], site, &s);
    }
    Ok(())
}

/// AWQ at every site: the scale search where the scales fold, then weight clipping
/// ([`super::clip`]) of every projection but q and k.
pub(super) fn awq(
    c: &ModelConfig,
    layer: &mut Layer,
    wf: &mut F32Weights,
    stats: &mut [SiteStats],
    opts: &CalibOptions,
) -> Result<()> {
    let super::Scheme::WeightOnly(format) = opts.scheme else {
        return Ok(());
    };
    for (si, &site) in SITES.iter().enumerate() {
        if foldable(c, site)
            && let Some(s) = search_scales(wf, &stats[si], site, format, opts.awq_grid)?
        {
            fold(layer, wf, &mut stats[si], site, &s);
        }
        if let Some(h) = stats[si].hessian.as_deref() {
            for &p in site_members(site).iter().filter(|&&p| p > 1) {
                super::clip::clip(&mut wf.w[p], wf.shape[p].1, h, format);
            }
        }
    }
    Ok(())
}

/// The scales of AWQ's grid whose quantized projections give the site's sampled rows the
/// smallest output error; `None` when no scaling beats the weights as they are (RTN).
fn search_scales(
    wf: &F32Weights,
    stats: &SiteStats,
    site: Site,
    format: WqFormat,
    grid: usize,
) -> Result<Option<Vec<f32>>> {
    let cols = stats.cols;
    let x = &stats.samples;
    let n = x.len() / cols;
    if n == 0 {
        return Ok(None);
    }
    let members = site_members(site);
    let x_mean = stats.abs_mean();
    let w_mean = group_relative_mean(wf, members, cols, format.group_len(cols));
    let reference: Vec<Vec<f32>> = members
        .iter()
        .map(|&p| project(x, n, &wf.w[p], wf.shape[p]))
        .collect();
    let ones = vec![1f32; cols];
    let mut best = (
        scaled_error(wf, members, &ones, x, n, &reference, format)?,
        None,
    );
    for step in 0..grid.max(1) {
        let r = step as f32 / grid.max(1) as f32;
        let mut s: Vec<f32> = x_mean
            .iter()
            .zip(&w_mean)
            .map(|(&xm, &wm)| (xm.powf(r) / (wm.powf(1.0 - r) + 1e-4)).max(1e-4))
            .collect();
        let (lo, hi) = s
            .iter()
            .fold((f32::MAX, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let norm = (lo * hi).sqrt();
        s.iter_mut().for_each(|v| *v /= norm);
        let loss = scaled_error(wf, members, &s, x, n, &reference, format)?;
        if loss < best.0 {
            best = (loss, Some(s));
        }
    }
    Ok(best.1)
}

/// Per column, the mean over the members' rows of `|W|` relative to its group's max.
fn group_relative_mean(wf: &F32Weights, members: &[usize], cols: usize, g: usize) -> Vec<f32> {
    let mut w_mean = vec![0f64; cols];
    let mut rows_total = 0usize;
    for &p in members {
        for row in wf.w[p].chunks_exact(cols) {
            for (grp, wm) in row.chunks(g).zip(w_mean.chunks_mut(g)) {
                let m = grp.iter().fold(0f32, |m, v| m.max(v.abs())) + 1e-6;
                for (a, v) in wm.iter_mut().zip(grp) {
                    *a += f64::from(v.abs() / m);
                }
            }
            rows_total += 1;
        }
    }
    w_mean
        .iter()
        .map(|&v| (v / rows_total.max(1) as f64) as f32)
        .collect()
}

/// Σ over the members of the squared output error on `x` when their columns are scaled by
/// `s`, quantized to nearest, and unscaled.
fn scaled_error(
    wf: &F32Weights,
    members: &[usize],
    s: &[f32],
    x: &[f32],
    n: usize,
    reference: &[Vec<f32>],
    format: WqFormat,
) -> Result<f64> {
    let mut loss = 0f64;
    for (k, &p) in members.iter().enumerate() {
        let (rows, cols) = wf.shape[p];
        let scaled: Vec<f32> = wf.w[p]
            .chunks_exact(cols)
            .flat_map(|row| row.iter().zip(s).map(|(v, sj)| v * sj))
            .collect();
        let q = quantize_rtn(&scaled, rows, cols, format).map_err(|e| EngineError::BadTensor {
            name: format!("AWQ search, projection {p}"),
            reason: e.to_string(),
        })?;
        let deq: Vec<f32> = q
            .dequantize()
            .chunks_exact(cols)
            .flat_map(|row| row.iter().zip(s).map(|(v, sj)| v / sj).collect::<Vec<_>>())
            .collect();
        let y = project(x, n, &deq, (rows, cols));
        loss += y
            .iter()
            .zip(&reference[k])
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>();
    }
    Ok(loss)
}

/// `x · Wᵀ` for `n` rows of `x` and a row-major f32 `W` of `shape`.
fn project(x: &[f32], n: usize, w: &[f32], shape: (usize, usize)) -> Vec<f32> {
    let m = Matrix::from_f32(shape.0, shape.1, w);
    let mut y = vec![0f32; n * shape.0];
    matmul(x, n, m.view(), &mut y);
    y
}
