//! GPTQ (Frantar et al., 2022): weights quantized one input column at a time, each column's
//! rounding error fed back into the columns not yet quantized through the inverse Hessian of
//! the layer's calibration inputs, so the layer's *output* error `‖(W − Q) X‖²` is what is
//! minimized rather than each weight's own error.
//!
//! The arithmetic is the reference implementation's (`gptq.py`'s `fasterquant`), in f64:
//!
//! 1. `H = Σ x xᵀ` over calibration tokens (its scale does not matter). Inputs that were always
//!    zero ("dead") get `H[i][i] = 1` and weight 0.
//! 2. Damping: `H += λ · mean(diag H) · I` (`λ` = [`GptqOptions::damp`], 0.01 by default), raised
//!    tenfold while `H` is not positive definite.
//! 3. `U` = the upper Cholesky factor of `H⁻¹`.
//! 4. Columns in blocks of [`GptqOptions::block_size`]: within a block each column is quantized,
//!    its error `e = (w − q) / U[i][i]` subtracted from the block's later columns (`e · U[i][j]`);
//!    after the block, the block's errors update every later column at once (the "lazy batch").
//!
//! Each group's grid (scale, zero) is [`GroupGrid::for_group`], the RTN rule, taken from the
//! weights as they stand when the group's first column is reached (as the reference does,
//! including its use of the not-yet-updated values for a group starting inside a block).
//!
//! **Act-order** ([`GptqOptions::act_order`]) visits columns by decreasing `H[i][i]` (the
//! inputs with the most energy first, while the most columns are left to absorb their error).
//! Its groups are then taken from the original weights before any update ("static groups"),
//! so every group still covers contiguous columns: `g_idx[k] = k / group_size`, a layout every
//! GPTQ loader reads without a column permutation at run time.
//!
//! **Int8** ([`quantize_int8_gptq`], for W8A8) runs the same loop with one grid per row, fixed
//! up front: `scale = max|w| / 127`, the grid of [`ferrite_kernels::w8a8::quantize_int8_rtn`].
//!
//! Rows are independent given `U`, so they run in parallel.
//!
//! An offline algorithm: `calib` runs it on each projection, and no serving process does. The
//! kernels crate holds the matrices it fills ([`WqMatrix`], [`I8Matrix`]) and the RTN grid
//! rule ([`GroupGrid`]).

use rayon::prelude::*;

use ferrite_kernels::w8a8::{I8Error, I8Matrix};
use ferrite_kernels::wq::{GroupGrid, WqError, WqFormat, WqMatrix};

/// How GPTQ runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptqOptions {
    /// Damping as a fraction of the mean diagonal of `H` (the reference's `percdamp`).
    pub damp: f64,
    /// Columns per lazy-update block.
    pub block_size: usize,
    /// Visit columns by decreasing `H[i][i]`, with static groups (see the module doc).
    pub act_order: bool,
}

impl Default for GptqOptions {
    fn default() -> Self {
        Self {
            damp: 0.01,
            block_size: 128,
            act_order: false,
        }
    }
}

/// What [`quantize_gptq`] returns besides the matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptqStats {
    /// The damping fraction that made `H` positive definite.
    pub damp: f64,
    /// `Σ_rows (w − q)ᵀ H (w − q)` with the undamped `H`: the output error GPTQ minimizes.
    pub output_error: f64,
}

/// Quantizes the row-major `[rows, cols]` matrix `w` to `format` by GPTQ with the
/// `[cols, cols]` row-major Hessian `h` (`Σ x xᵀ` of the layer's inputs).
pub fn quantize_gptq(
    w: &[f32],
    rows: usize,
    cols: usize,
    h: &[f64],
    format: WqFormat,
    opts: GptqOptions,
) -> Result<(WqMatrix, GptqStats), WqError> {
    format.check_cols(cols)?;
    let grids = GridRule {
        group_len: format.group_len(cols),
        // Per-channel grids are taken up front, as the reference does.
        fixed: format.group_size.is_none(),
        grid: &|part: &[f32]| GroupGrid::for_group(part, format),
    };
    let (codes, grids, damp) = gptq_codes(w, rows, cols, h, &grids, opts)?;
    let scales: Vec<f32> = grids.iter().map(|g| g.scale).collect();
    let zeros: Vec<u8> = grids.iter().map(|g| g.zero).collect();
    let zeros_opt = format.zero_point.then_some(zeros.as_slice());
    let m = WqMatrix::from_codes(format, rows, cols, &codes, &scales, zeros_opt)?;
    let output_error = output_error_of(w, &m.dequantize(), rows, cols, h);
    Ok((m, GptqStats { damp, output_error }))
}

/// One row's int8 grid as a [`GroupGrid`]: `scale = max|w| / 127`, unsigned codes `0..=254`
/// standing for `code - 127`.
fn int8_grid(row: &[f32]) -> GroupGrid {
    GroupGrid {
        scale: row.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0,
        zero: 127,
        max_code: 254,
    }
}

/// Symmetric int8 per row by GPTQ with the `[cols, cols]` Hessian `h` (see the module doc);
/// each row's grid is taken from the original row.
pub fn quantize_int8_gptq(
    w: &[f32],
    rows: usize,
    cols: usize,
    h: &[f64],
    opts: GptqOptions,
) -> Result<(I8Matrix, GptqStats), I8Error> {
    let rule = GridRule {
        group_len: cols,
        fixed: true,
        grid: &int8_grid,
    };
    let (codes, grids, damp) =
        gptq_codes(w, rows, cols, h, &rule, opts).map_err(|e| I8Error::Value(e.to_string()))?;
    let codes: Vec<i8> = codes.iter().map(|&q| (i16::from(q) - 127) as i8).collect();
    let scales: Vec<f32> = grids.iter().map(|g| g.scale).collect();
    let m = I8Matrix::from_codes(rows, cols, &codes, &scales)?;
    let output_error = output_error_of(w, &m.dequantize(), rows, cols, h);
    Ok((m, GptqStats { damp, output_error }))
}

/// How [`gptq_codes`] makes each group's grid.
struct GridRule<'a> {
    /// Columns per group (the row's length for one grid per row).
    group_len: usize,
    /// Take every grid from the original weights up front (per-channel grids); act-order
    /// always does.
    fixed: bool,
    grid: &'a (dyn Fn(&[f32]) -> GroupGrid + Sync),
}

impl std::fmt::Debug for GridRule<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GridRule")
            .field("group_len", &self.group_len)
            .field("fixed", &self.fixed)
            .finish_non_exhaustive()
    }
}

/// GPTQ's codes (`rows * cols`, original column order), each row-group's grid (`rows *
/// groups`) and the damping used, for any grid rule: the weight-only formats and W8A8's int8.
fn gptq_codes(
    w: &[f32],
    rows: usize,
    cols: usize,
    h: &[f64],
    rule: &GridRule<'_>,
    opts: GptqOptions,
) -> Result<(Vec<u8>, Vec<GroupGrid>, f64), WqError> {
    if w.len() != rows * cols || h.len() != cols * cols {
        return Err(WqError::Shape(format!(
            "{} weights and a {}-entry Hessian for a {rows}x{cols} matrix",
            w.len(),
            h.len()
        )));
    }
    if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
        return Err(WqError::Value(format!("weight {bad} is not finite")));
    }
    if let Some(bad) = h.iter().find(|v| !v.is_finite()) {
        return Err(WqError::Value(format!("Hessian entry {bad} is not finite")));
    }
    let mut hm = h.to_vec();
    let mut wm: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
    for i in 0..cols {
        if hm[i * cols + i] == 0.0 {
            hm[i * cols + i] = 1.0;
            for r in 0..rows {
                wm[r * cols + i] = 0.0;
            }
        }
    }
    let g = rule.group_len.clamp(1, cols.max(1));
    let groups = cols.div_ceil(g);
    // Static grids (act-order, and fixed rules) from the weights before any update.
    let static_grids = opts.act_order || rule.fixed;
    let grids0: Vec<GroupGrid> = if static_grids {
        (0..rows * groups)
            .map(|rg| {
                let (r, gi) = (rg / groups, rg % groups);
                let lo = r * cols + gi * g;
                let hi = r * cols + ((gi + 1) * g).min(cols);
                let part: Vec<f32> = wm[lo..hi].iter().map(|&v| v as f32).collect();
                (rule.grid)(&part)
            })
            .collect()
    } else {
        Vec::new()
    };
    // Column order: the permutation `perm[position] = column`.
    let mut perm: Vec<usize> = (0..cols).collect();
    if opts.act_order {
        // Stable, so equal diagonals keep their order (the numpy reference sorts the same way).
        perm.sort_by(|&a, &b| hm[b * cols + b].total_cmp(&hm[a * cols + a]));
    }
    let hp: Vec<f64> = (0..cols * cols)
        .map(|ij| hm[perm[ij / cols] * cols + perm[ij % cols]])
        .collect();
    let (u, damp) = damped_inverse_factor(&hp, cols, opts.damp)?;

    let bs = opts.block_size.max(1);
    let mut codes = vec![0u8; rows * cols];
    let mut out_grids = vec![(rule.grid)(&[]); rows * groups];
    codes
        .par_chunks_mut(cols)
        .zip(out_grids.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(r, (codes, row_grids))| {
            let mut row: Vec<f64> = perm.iter().map(|&c| wm[r * cols + c]).collect();
            let mut grid = None;
            let mut block = vec![0f64; bs];
            let mut errs = vec![0f64; bs];
            for i1 in (0..cols).step_by(bs) {
                let i2 = (i1 + bs).min(cols);
                let n = i2 - i1;
                block[..n].copy_from_slice(&row[i1..i2]);
                for i in 0..n {
                    let pos = i1 + i;
                    let col = perm[pos];
                    let gi = col / g;
                    let gr = if static_grids {
                        grids0[r * groups + gi]
                    } else {
                        if pos % g == 0 {
                            // The reference's rule: the row as updated at the last block end.
                            let part: Vec<f32> = row[pos..(pos + g).min(cols)]
                                .iter()
                                .map(|&v| v as f32)
                                .collect();
                            grid = Some((rule.grid)(&part));
                        }
                        grid.unwrap_or_else(|| (rule.grid)(&[]))
                    };
                    let x = block[i];
                    let q = gr.code(x);
                    codes[col] = q;
                    row_grids[gi] = gr;
                    let urow = &u[pos * cols..(pos + 1) * cols];
                    let e = (x - gr.value(q)) / urow[pos];
                    for (b, &uij) in block[i..n].iter_mut().zip(&urow[pos..i2]) {
                        *b -= e * uij;
                    }
                    errs[i] = e;
                }
                // The lazy batch: the block's errors into every later column.
                for (i, &e) in errs[..n].iter().enumerate() {
                    let urow = &u[(i1 + i) * cols..(i1 + i + 1) * cols];
                    for (w, &uij) in row[i2..].iter_mut().zip(&urow[i2..]) {
                        *w -= e * uij;
                    }
                }
            }
        });
    Ok((codes, out_grids, damp))
}

/// `Σ_rows (w − q)ᵀ H (w − q)`: a quantized matrix's output error on the calibration inputs
/// whose `Σ x xᵀ` is `h` (for comparing methods on the same inputs).
pub fn output_error(w: &[f32], q: &WqMatrix, h: &[f64]) -> f64 {
    output_error_of(w, &q.dequantize(), q.rows(), q.cols(), h)
}

/// [`output_error`] for any dequantized `[rows, cols]` matrix `deq`.
pub fn output_error_of(w: &[f32], deq: &[f32], rows: usize, cols: usize, h: &[f64]) -> f64 {
    (0..rows)
        .into_par_iter()
        .map(|r| {
            let d: Vec<f64> = (0..cols)
                .map(|c| f64::from(w[r * cols + c]) - f64::from(deq[r * cols + c]))
                .collect();
            (0..cols)
                .map(|i| d[i] * dot(&h[i * cols..(i + 1) * cols], &d))
                .sum::<f64>()
        })
        .sum()
}

/// The upper Cholesky factor `U` of `(H + λ·mean(diag H)·I)⁻¹` (`H⁻¹ = Uᵀ U`), with `λ` raised
/// tenfold until the damped `H` is positive definite. Returns `U` and the `λ` used.
fn damped_inverse_factor(h: &[f64], n: usize, damp: f64) -> Result<(Vec<f64>, f64), WqError> {
    let mean_diag = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n.max(1) as f64;
    let mut lambda = damp;
    for _ in 0..6 {
        let mut hd = h.to_vec();
        for i in 0..n {
            hd[i * n + i] += lambda * mean_diag;
        }
        if let Some(l) = cholesky_lower(&hd, n) {
            let inv = inverse_from_cholesky(&l, n);
            if let Some(lt) = cholesky_lower(&inv, n) {
                return Ok((transpose(&lt, n), lambda));
            }
        }
        lambda *= 10.0;
    }
    Err(WqError::Value(format!(
        "the Hessian is not positive definite even with damping {lambda}"
    )))
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `L` with `A = L Lᵀ` (row-major, lower), or `None` if `A` is not positive definite.
fn cholesky_lower(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let s = a[i * n + j] - dot(&l[i * n..i * n + j], &l[j * n..j * n + j]);
            if i == j {
                if s <= 0.0 || !s.is_finite() {
                    return None;
                }
                l[i * n + i] = s.sqrt();
            } else {
                l[i * n + j] = s / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// `(L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹` from the lower factor `L`.
fn inverse_from_cholesky(l: &[f64], n: usize) -> Vec<f64> {
    // Columns of L⁻¹ by forward substitution, stored as rows of (L⁻¹)ᵀ (upper triangular):
    // then (L⁻ᵀ L⁻¹)[i][j] = Σ_k (L⁻¹)[k][i] (L⁻¹)[k][j] is a dot of two of those rows.
    let mut inv_t = vec![0f64; n * n];
    inv_t.par_chunks_mut(n).enumerate().for_each(|(c, col)| {
        // Solve L y = e_c; y[k] = 0 for k < c.
        col[c] = 1.0 / l[c * n + c];
        for k in c + 1..n {
            let s = dot(&l[k * n + c..k * n + k], &col[c..k]);
            col[k] = -s / l[k * n + k];
        }
    });
    let mut out = vec![0f64; n * n];
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        for j in 0..n {
            let k0 = i.max(j);
            row[j] = dot(
                &inv_t[i * n + k0..(i + 1) * n],
                &inv_t[j * n + k0..(j + 1) * n],
            );
        }
    });
    out
}

fn transpose(a: &[f64], n: usize) -> Vec<f64> {
    (0..n * n).map(|ij| a[(ij % n) * n + ij / n]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_kernels::w8a8::quantize_int8_rtn;
    use ferrite_kernels::wq::quantize_rtn;

    /// A deterministic xorshift32 stream of values in `-0.5..0.5`.
    fn stream(seed: u32) -> impl FnMut() -> f32 {
        let mut s = seed.max(1);
        move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as f32 / u32::MAX as f32 - 0.5
        }
    }

    /// `Σ x xᵀ` over the rows of the row-major `x`, `cols` wide.
    fn hessian(x: &[f32], cols: usize) -> Vec<f64> {
        let mut h = vec![0f64; cols * cols];
        for xt in x.chunks_exact(cols) {
            for i in 0..cols {
                for j in 0..cols {
                    h[i * cols + j] += f64::from(xt[i]) * f64::from(xt[j]);
                }
            }
        }
        h
    }

    /// Deterministic inputs with a few loud channels and correlated columns.
    fn data(rows: usize, cols: usize, n: usize) -> (Vec<f32>, Vec<f64>) {
        let mut next = stream(0x9e37_79b9);
        let w: Vec<f32> = (0..rows * cols).map(|_| next() * 0.2).collect();
        let mut x = vec![0f32; n * cols];
        for t in 0..n {
            let common = next();
            for c in 0..cols {
                let loud = if c % 17 == 3 { 8.0 } else { 1.0 };
                x[t * cols + c] = (next() + 0.5 * common) * loud;
            }
        }
        (w, hessian(&x, cols))
    }

    /// Values of the stream with an outlier 20 times as large every 61st.
    fn with_outliers(n: usize, seed: u32) -> Vec<f32> {
        let mut next = stream(seed);
        (0..n)
            .map(|i| {
                let u = next();
                if i % 61 == 0 { u * 20.0 } else { u }
            })
            .collect()
    }

    #[test]
    fn cholesky_inverse_factor_inverts() {
        let n = 5;
        let a: Vec<f64> = (0..n * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                if i == j {
                    4.0 + i as f64
                } else {
                    1.0 / (1 + i + j) as f64
                }
            })
            .collect();
        let (u, damp) = damped_inverse_factor(&a, n, 0.0).expect("pd");
        assert_eq!(damp, 0.0);
        // Uᵀ U · A = I.
        let inv: Vec<f64> = (0..n * n)
            .map(|ij| (0..n).map(|k| u[k * n + ij / n] * u[k * n + ij % n]).sum())
            .collect();
        for i in 0..n {
            for j in 0..n {
                let p: f64 = (0..n).map(|k| inv[i * n + k] * a[k * n + j]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((p - want).abs() < 1e-12, "({i},{j}) = {p}");
            }
        }
    }

    /// GPTQ's whole point: a lower output error than round-to-nearest on the same inputs,
    /// for grouped, per-channel, symmetric and act-order variants.
    #[test]
    fn beats_rtn_on_output_error() {
        let (rows, cols) = (16, 128);
        let (w, h) = data(rows, cols, 512);
        for (name, act_order) in [
            ("w4g32", false),
            ("w4g32", true),
            ("w2g32", false),
            ("w4pc-sym", false),
            ("w8g64-sym", true),
        ] {
            let f: WqFormat = name.parse().expect("format");
            let opts = GptqOptions {
                act_order,
                block_size: 48,
                ..GptqOptions::default()
            };
            let (q, stats) = quantize_gptq(&w, rows, cols, &h, f, opts).expect("gptq");
            let rtn = quantize_rtn(&w, rows, cols, f).expect("rtn");
            let e_rtn = output_error(&w, &rtn, &h);
            assert!(
                stats.output_error < e_rtn * 0.9,
                "{name} act_order={act_order}: gptq {} vs rtn {e_rtn}",
                stats.output_error
            );
            assert!(q.zeros().iter().all(|&z| z >= 1), "{name}: GPTQ v1 zeros");
        }
    }

    #[test]
    fn dead_inputs_and_bad_shapes() {
        let (rows, cols) = (4, 64);
        let (w, mut h) = data(rows, cols, 256);
        for j in 0..cols {
            h[5 * cols + j] = 0.0;
            h[j * cols + 5] = 0.0;
        }
        let f: WqFormat = "w4g32".parse().expect("format");
        let (q, _) = quantize_gptq(&w, rows, cols, &h, f, GptqOptions::default()).expect("gptq");
        let d = q.dequantize();
        for r in 0..rows {
            assert!(d[r * cols + 5].abs() < 1e-6, "a dead input's weight is 0");
        }
        assert!(quantize_gptq(&w, rows, cols, &h[1..], f, GptqOptions::default()).is_err());
    }

    #[test]
    fn int8_gptq_beats_rtn_on_output_error() {
        let (rows, cols, n) = (8, 64, 256);
        let w = with_outliers(rows * cols, 5);
        let h = hessian(&with_outliers(n * cols, 9), cols);
        let (q, st) = quantize_int8_gptq(&w, rows, cols, &h, GptqOptions::default()).expect("gptq");
        let rtn = quantize_int8_rtn(&w, rows, cols).expect("rtn");
        let e_rtn = output_error_of(&w, &rtn.dequantize(), rows, cols, &h);
        assert!(st.output_error < e_rtn, "{} vs {e_rtn}", st.output_error);
        assert!(q.row_codes(0).iter().all(|&c| c >= -127));
    }
}
