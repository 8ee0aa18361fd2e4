//! `y = x · Wᵀ` with f32 activations and weights stored in any [`GgmlType`] (read in place) or
//! a weight-only quantized [`WqMatrix`].
//!
//! Activations are quantized only for [`Weight::I8`] (W8A8: per token, once per call, shared by
//! every weight of the call) and rounded through e4m3 for [`Weight::F8`] (per token, or with
//! each weight's static scale). Otherwise every product is accumulated in f32 from the exactly
//! dequantized weight, so results match `dequantize` followed by an f32 dot product up to
//! summation order. Work is split over weight rows on rayon's global pool; within a task,
//! groups of up to 8 activation rows share each decoded weight block.

use rayon::prelude::*;

use crate::fp8::{Fp8Activations, Fp8Matrix, quantize_activations};
use crate::quant::int8;
use crate::quant::q8::Q8Tokens;
use crate::quant::{GgmlActivations, GgmlType, Isa, QuantError, RowKernel};
use crate::w8a8::{I8Activations, I8Matrix};
use crate::wq::WqMatrix;

/// A weight matrix in any storage the matmul runs on.
#[derive(Debug, Clone, Copy)]
pub enum Weight<'a> {
    /// GGUF block types and plain floats, in place.
    Ggml(WeightView<'a>),
    /// Weight-only quantized codes with group scales.
    Wq(&'a WqMatrix),
    /// int8 weights times int8 activations quantized per token (W8A8).
    I8(&'a I8Matrix),
    /// FP8 weights (dequantized to f32) times activations rounded through FP8.
    F8(&'a Fp8Matrix),
}

impl Weight<'_> {
    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            Weight::Ggml(w) => w.rows,
            Weight::Wq(w) => w.rows(),
            Weight::I8(w) => w.rows(),
            Weight::F8(w) => w.rows(),
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            Weight::Ggml(w) => w.cols,
            Weight::Wq(w) => w.cols(),
            Weight::I8(w) => w.cols(),
            Weight::F8(w) => w.cols(),
        }
    }
}

impl<'a> From<WeightView<'a>> for Weight<'a> {
    fn from(w: WeightView<'a>) -> Self {
        Weight::Ggml(w)
    }
}

impl<'a> From<&WeightView<'a>> for Weight<'a> {
    fn from(w: &WeightView<'a>) -> Self {
        Weight::Ggml(*w)
    }
}

impl<'a> From<&Weight<'a>> for Weight<'a> {
    fn from(w: &Weight<'a>) -> Self {
        *w
    }
}

impl<'a> From<&'a WqMatrix> for Weight<'a> {
    fn from(w: &'a WqMatrix) -> Self {
        Weight::Wq(w)
    }
}

/// A weight matrix viewed in place: `rows` rows of `cols` elements of type `ty`, rows
/// contiguous (`ty.row_bytes(cols)` bytes each).
#[derive(Clone, Copy)]
pub struct WeightView<'a> {
    /// Storage type of the elements.
    pub ty: GgmlType,
    /// Number of rows (output features).
    pub rows: usize,
    /// Elements per row (input features).
    pub cols: usize,
    /// The `rows * ty.row_bytes(cols)` bytes, any alignment.
    pub bytes: &'a [u8],
}

/// Shows the byte count, not the (possibly hundreds of MB of) bytes.
impl std::fmt::Debug for WeightView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightView")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("bytes", &format_args!("[{} bytes]", self.bytes.len()))
            .finish()
    }
}

impl<'a> WeightView<'a> {
    /// A view after checking that `cols` is a whole number of blocks and `bytes` has exactly
    /// `rows * ty.row_bytes(cols)` bytes.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    ) -> Result<Self, QuantError> {
        let rb = ty.row_bytes(cols)?;
        let n_elems = rows.saturating_mul(cols);
        let expected = rb
            .checked_mul(rows)
            .ok_or(QuantError::Overflow { ty, n_elems })?;
        if bytes.len() != expected {
            return Err(QuantError::ByteLength {
                ty,
                n_elems,
                expected,
                actual: bytes.len(),
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            bytes,
        })
    }

    /// Bytes per row.
    ///
    /// # Panics
    /// If `cols` is not a whole number of blocks (impossible for a view made by [`Self::new`]).
    pub fn row_bytes(&self) -> usize {
        let be = self.ty.block_elems();
        assert!(
            self.cols.is_multiple_of(be),
            "{} columns of {} are not whole blocks",
            self.cols,
            self.ty
        );
        self.cols / be * self.ty.block_bytes()
    }

    /// The stored bytes of row `i`.
    ///
    /// # Panics
    /// If `i >= rows` or the view's sizes are inconsistent.
    pub fn row(&self, i: usize) -> &'a [u8] {
        assert!(i < self.rows, "row {i} out of {}", self.rows);
        let rb = self.row_bytes();
        &self.bytes[i * rb..(i + 1) * rb]
    }

    /// Panics unless the view's sizes are consistent (views built with struct syntax).
    fn assert_consistent(&self) {
        let rb = self.row_bytes();
        assert_eq!(
            Some(self.bytes.len()),
            rb.checked_mul(self.rows),
            "{}x{} {} weight needs {} bytes per row",
            self.rows,
            self.cols,
            self.ty,
            rb
        );
    }
}

/// `out[m, n] = x[m, k] · Wᵀ` where `W` is `[n, k]` (`n = w.rows`, `k = w.cols`), on the
/// fastest available [`Isa`]. Parallel over weight rows (rayon global pool).
///
/// # Panics
/// If `x.len() != m * w.cols`, `out.len() != m * w.rows`, or `w`'s sizes are inconsistent.
pub fn matmul<'a>(x: &[f32], m: usize, w: impl Into<Weight<'a>>, out: &mut [f32]) {
    matmul_with(Isa::best(), x, m, w, out);
}

/// [`matmul`] on a chosen [`Isa`] (scalar if `isa` is unavailable).
///
/// # Panics
/// As [`matmul`].
pub fn matmul_with<'a>(isa: Isa, x: &[f32], m: usize, w: impl Into<Weight<'a>>, out: &mut [f32]) {
    matmul_many_with(isa, x, m, &[w.into()], &mut [out]);
}

/// Several weights sharing the same input (Q/K/V, gate/up) in one parallel pass, paying the
/// thread dispatch once: `outs[i]` is `[m, ws[i].rows]`.
///
/// # Panics
/// If `ws.len() != outs.len()`, the weights do not all have `x.len() / m` columns, an output
/// has the wrong length, or a weight's sizes are inconsistent.
pub fn matmul_many(x: &[f32], m: usize, ws: &[Weight<'_>], outs: &mut [&mut [f32]]) {
    matmul_many_with(Isa::best(), x, m, ws, outs);
}

/// Rows per task never go below this.
const MIN_TASK_ROWS: usize = 16;
/// Multiply-adds per task never go below this (~10 µs of work: rayon's per-task overhead is a
/// few µs); below it in total, everything runs on the calling thread.
const MIN_TASK_MACS: usize = 1 << 16;
const SERIAL_MACS: usize = MIN_TASK_MACS;

/// One unit of parallel work: rows `r0..r0 + outs[_].len()` of weight `w`.
struct Task<'o> {
    w: usize,
    r0: usize,
    /// One output slice per activation row.
    outs: Vec<&'o mut [f32]>,
}

/// [`matmul_many`] on a chosen [`Isa`] (scalar if `isa` is unavailable).
///
/// # Panics
/// As [`matmul_many`].
pub fn matmul_many_with(isa: Isa, x: &[f32], m: usize, ws: &[Weight<'_>], outs: &mut [&mut [f32]]) {
    let opts = MatmulOptions {
        isa,
        ..MatmulOptions::default()
    };
    opts.many(x, m, ws, outs);
}

/// How matmuls run: the instruction set, and the activations GGUF block weights take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulOptions {
    /// Scalar if this CPU lacks it.
    pub isa: Isa,
    /// See [`GgmlActivations`].
    pub ggml_activations: GgmlActivations,
}

impl Default for MatmulOptions {
    /// The fastest instruction set; f32 activations.
    fn default() -> Self {
        Self {
            isa: Isa::best(),
            ggml_activations: GgmlActivations::F32,
        }
    }
}

impl MatmulOptions {
    /// These options with exact (f32) activations for GGUF block weights, whatever the steps.
    pub fn exact(self) -> Self {
        Self {
            ggml_activations: GgmlActivations::F32,
            ..self
        }
    }

    /// These options with GGUF block weights' activations exact, or nearly so where that is
    /// faster ([`GgmlActivations::Fine`]), unless they are exact already.
    pub fn fine(self) -> Self {
        match self.ggml_activations {
            GgmlActivations::F32 => self,
            _ => Self {
                ggml_activations: GgmlActivations::Fine,
                ..self
            },
        }
    }

    /// [`matmul`] with these options.
    ///
    /// # Panics
    /// As [`matmul`].
    pub fn one<'a>(&self, x: &[f32], m: usize, w: impl Into<Weight<'a>>, out: &mut [f32]) {
        self.many(x, m, &[w.into()], &mut [out]);
    }

    /// [`matmul_many`] with these options.
    ///
    /// # Panics
    /// As [`matmul_many`].
    pub fn many(&self, x: &[f32], m: usize, ws: &[Weight<'_>], outs: &mut [&mut [f32]]) {
        run_many(self, x, m, ws, outs);
    }
}

fn run_many(opts: &MatmulOptions, x: &[f32], m: usize, ws: &[Weight<'_>], outs: &mut [&mut [f32]]) {
    let isa = opts.isa;
    assert_eq!(ws.len(), outs.len(), "one output per weight");
    let Some(k) = ws.first().map(Weight::cols) else {
        return;
    };
    assert_eq!(x.len(), m * k, "x must be [m, k] with k = {k}");
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert_eq!(w.cols(), k, "all weights must have {k} columns");
        if let Weight::Ggml(w) = w {
            w.assert_consistent();
        }
        assert_eq!(o.len(), m * w.rows(), "output must be [m, {}]", w.rows());
    }
    if m == 0 {
        return;
    }

    let total_rows: usize = ws.iter().map(Weight::rows).sum();
    let macs = total_rows.saturating_mul(k).saturating_mul(m);
    let threads = rayon::current_num_threads().max(1);
    let chunk = if macs < SERIAL_MACS || threads == 1 {
        total_rows.max(1)
    } else {
        // Up to ~8 tasks per thread balances load (other work may hold a core), but none
        // smaller than MIN_TASK_MACS; rounded to a multiple of 16 rows so the kernels' 4-row
        // tiles and 16-row panels stay whole.
        let tasks = (macs / MIN_TASK_MACS).clamp(1, threads * 8);
        total_rows
            .div_ceil(tasks)
            .max(MIN_TASK_ROWS)
            .next_multiple_of(16)
    };

    // Split every output row into `chunk`-row pieces; task c of weight t gets piece c of each
    // of its m output rows.
    let mut tasks = Vec::new();
    for (t, (w, o)) in ws.iter().zip(outs.iter_mut()).enumerate() {
        let rows = w.rows();
        if rows == 0 {
            continue;
        }
        let mut pieces: Vec<_> = o.chunks_mut(rows).map(|r| r.chunks_mut(chunk)).collect();
        for c in 0..rows.div_ceil(chunk) {
            tasks.push(Task {
                w: t,
                r0: c * chunk,
                outs: pieces.iter_mut().filter_map(Iterator::next).collect(),
            });
        }
    }

    // W8A8 weights share one per-token quantization of `x`.
    let acts = ws
        .iter()
        .any(|w| matches!(w, Weight::I8(_)))
        .then(|| I8Activations::new(x, m, k));
    let f8_acts = fp8_activations(x, k, ws);
    // W4A8: weight-only codes whose inputs are rounded to int8 first (correct, not fast).
    let wq_i8 = ws
        .iter()
        .any(|w| matches!(w, Weight::Wq(q) if q.int8_activations()))
        .then(|| match &acts {
            Some(a) => a.dequantized(k),
            None => I8Activations::new(x, m, k).dequantized(k),
        });
    // GGUF block weights may take the activations in integers, quantized once per token for
    // all of them (see `GgmlActivations` for when, and in how many int8 terms).
    let terms = |w: &WeightView<'_>| opts.ggml_activations.terms(isa, w.ty, m);
    let int8 = |w: &WeightView<'_>| terms(w) > 0;
    let q8_acts = ws.iter().find_map(|w| match w {
        Weight::Ggml(v) if int8(v) => Some(Q8Tokens::new(isa, x, k, terms(v))),
        _ => None,
    });
    let run = |mut task: Task<'_>| match &ws[task.w] {
        Weight::Ggml(w) if int8(w) => {
            if let Some(a) = &q8_acts {
                let (n, rb) = (task.outs[0].len(), w.row_bytes());
                let rows = &w.bytes[task.r0 * rb..(task.r0 + n) * rb];
                match &mut task.outs[..] {
                    [out] if m == 1 => int8::rows(isa, w.ty, rows, &a.terms_of(0..1)[0], out),
                    outs => int8::panels(isa, w.ty, rows, n, a, outs),
                }
            }
        }
        Weight::Ggml(w) => {
            let kern = RowKernel::new(isa, w.ty, k);
            let mut scratch = vec![0f32; kern.scratch_len()];
            let n = task.outs.first().map_or(0, |o| o.len());
            let rb = w.row_bytes();
            let rows = &w.bytes[task.r0 * rb..(task.r0 + n) * rb];
            kern.run(rows, n, x, &mut task.outs, &mut scratch);
        }
        Weight::Wq(w) => {
            let xs = match &wq_i8 {
                Some(q) if w.int8_activations() => q,
                _ => x,
            };
            w.matmul_rows(isa, task.r0, xs, &mut task.outs);
        }
        Weight::I8(w) => {
            if let Some(a) = &acts {
                w.matmul_rows(isa, task.r0, a, &mut task.outs);
            }
        }
        Weight::F8(w) => {
            let kern = RowKernel::new(isa, GgmlType::F32, k);
            let mut scratch = vec![0f32; kern.scratch_len()];
            let n = task.outs.first().map_or(0, |o| o.len());
            let rows = &w.f32_bytes()[task.r0 * k * 4..(task.r0 + n) * k * 4];
            let xs = f8_acts[task.w].as_deref().unwrap_or(x);
            kern.run(rows, n, xs, &mut task.outs, &mut scratch);
        }
    };
    if tasks.len() == 1 || macs < SERIAL_MACS {
        tasks.into_iter().for_each(run);
    } else {
        tasks.into_par_iter().for_each(run);
    }
}

/// For each FP8 weight of `ws`, its input `x` (`k` wide) rounded through e4m3: computed once per
/// distinct quantization (q, k and v usually share one; static scales may differ).
fn fp8_activations(x: &[f32], k: usize, ws: &[Weight<'_>]) -> Vec<Option<Vec<f32>>> {
    let mut done: Vec<(Fp8Activations, Vec<f32>)> = Vec::new();
    ws.iter()
        .map(|w| match w {
            Weight::F8(f) if f.activations() != Fp8Activations::None => {
                let act = f.activations();
                let i = match done.iter().position(|(a, _)| *a == act) {
                    Some(i) => i,
                    None => {
                        done.push((act, quantize_activations(x, k, act)));
                        done.len() - 1
                    }
                };
                Some(done[i].1.clone())
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::{self, tests::random_row};

    /// With integer activations a matmul is the integer dot of every row and token (over rows
    /// split into parallel tasks), in one int8 term under `Int8` (one-token steps, and batches
    /// where the panel kernel takes the type), in two under `Fine` (batches where the panel
    /// kernel takes the type); everything else (one token under `Fine`, batches of Q4_K, every
    /// batch without AVX-512 VNNI) stays on the exact f32 path.
    #[test]
    fn integer_activations_apply_to_one_token_steps_and_panel_batches() {
        let (k, n, m) = (256, 200, 3);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        for mode in [GgmlActivations::Int8, GgmlActivations::Fine] {
            let opts = MatmulOptions {
                ggml_activations: mode,
                ..MatmulOptions::default()
            };
            for ty in [GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K] {
                let bytes: Vec<u8> = (0..n).flat_map(|r| random_row(ty, k, r as u32)).collect();
                let w = WeightView::new(ty, n, k, &bytes).expect("whole blocks");
                for tokens in [1, m] {
                    let x = &x[..tokens * k];
                    let mut got = vec![0f32; tokens * n];
                    opts.one(x, tokens, w, &mut got);
                    let mut exact = vec![0f32; tokens * n];
                    matmul(x, tokens, w, &mut exact);
                    let panels = int8::has_panels(opts.isa, ty);
                    let terms = match (mode, tokens) {
                        (GgmlActivations::Int8, 1) => 1,
                        (GgmlActivations::Int8, _) if panels => 1,
                        // Q6_K's prompts stay on the tiles (`GgmlActivations::terms`).
                        (GgmlActivations::Fine, 2..) if panels && ty != GgmlType::Q6_K => 2,
                        _ => 0,
                    };
                    assert_eq!(terms, mode.terms(opts.isa, ty, tokens), "{mode:?} {ty}");
                    if terms == 0 {
                        assert_eq!(exact, got, "{mode:?} {ty} ×{tokens}: exact");
                        continue;
                    }
                    let acts = Q8Tokens::new(opts.isa, x, k, terms);
                    for (i, got) in got.chunks_exact(n).enumerate() {
                        for (j, got) in got.iter().enumerate() {
                            let want: f32 = acts
                                .terms_of(i..i + 1)
                                .iter()
                                .map(|t| q8::dot(ty, w.row(j), t))
                                .sum();
                            let tol = 1e-4 * want.abs().max(1.0);
                            assert!((got - want).abs() <= tol, "{ty} [{i}][{j}] {got} vs {want}");
                        }
                    }
                    assert_ne!(exact, got, "{mode:?} {ty}: integers round the activations");
                }
            }
        }
    }

    /// A W4A8 matrix computes the weight-only product of the inputs rounded to int8 per
    /// token (each token its own scale), in the same call as a plain weight-only matrix fed
    /// the raw inputs, and shards keep the setting.
    #[test]
    fn int8_activations_of_weight_only_codes_round_each_token() {
        use crate::wq::{WqFormat, quantize_rtn};
        let (m, k, n) = (3, 64, 24);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 97) as f32 - 48.0) / 50.0)
            .collect();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 31 % 53) as f32 - 26.0) * if i < k { 0.01 } else { 1.3 })
            .collect();
        let format: WqFormat = "w4g32".parse().expect("format");
        let plain = quantize_rtn(&w, n, k, format).expect("rtn");
        let a8 = plain.clone().with_int8_activations(true);
        let (mut got, mut raw) = (vec![0f32; m * n], vec![0f32; m * n]);
        matmul_many(
            &x,
            m,
            &[Weight::Wq(&a8), Weight::Wq(&plain)],
            &mut [&mut got, &mut raw],
        );
        let rounded = I8Activations::new(&x, m, k).dequantized(k);
        for (row, xr) in rounded.chunks(k).zip(x.chunks(k)) {
            let s = xr.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            assert!(
                row.iter()
                    .zip(xr)
                    .all(|(q, v)| (q - v).abs() <= s / 2.0 + 1e-6)
            );
        }
        let mut want = vec![0f32; m * n];
        matmul(&rounded, m, &plain, &mut want);
        assert_eq!(got, want);
        assert_ne!(got, raw, "the inputs were rounded");
        let shard = a8.slice(0..8, 32..64).expect("shard");
        assert!(shard.int8_activations());
    }
}
