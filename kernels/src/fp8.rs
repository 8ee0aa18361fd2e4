//! FP8 (e4m3, the `float8_e4m3fn` of PyTorch and compressed-tensors) weights and activations on
//! the CPU: correct, not fast.
//!
//! An [`Fp8Matrix`] keeps the e4m3 codes and scales it was made from (so it can be written back,
//! or handed to the GPU's FP8 kernels) and, for the CPU's matmul, the weights dequantized to f32
//! on first use (`code · scale`, exact in f32). Its scales are one per tensor, per row, or per block of weights ([`Fp8Scales`]).
//! Activations are rounded through e4m3 per call, the way compressed-tensors' forward and
//! vLLM's FP8 kernels quantize them: per token, or per token and group of inputs, with
//! `scale = max|x| / 448` (dynamic), or with the checkpoint's static per-tensor scale;
//! `x' = e4m3(clamp(x / scale, ±448)) · scale`. The
//! product is then an f32 matmul over the dequantized weights, so the result is what an FP8 GEMM
//! with f32 accumulation gives, at f32 speed and 4 bytes per weight in memory.
//!
//! e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, one NaN
//! pattern per sign (`S.1111.111`), largest finite ±448, smallest subnormal 2⁻⁹.

use std::ops::Range;
use std::sync::OnceLock;

/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// What can go wrong building an [`Fp8Matrix`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fp8Error {
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    Value(String),
}

/// The f32 value of an e4m3 code (NaN for the NaN codes).
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0x0f);
    let man = f32::from(code & 0x07);
    if exp == 15 && code & 0x07 == 7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man * (2f32).powi(-9)
    } else {
        (1.0 + man / 8.0) * (2f32).powi(exp - 7)
    };
    sign * mag
}

/// The e4m3 code nearest `x` (ties to even), `x` first clamped to ±448 (the cast PyTorch does
/// after compressed-tensors' clamp). NaN stays NaN.
#[inline]
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // 2⁻⁶ (a constant: `powi` is a call per value, and a KV cache rounds every value written).
    let min_normal = 1.0 / 64.0;
    if a < min_normal {
        // Subnormals are multiples of 2⁻⁹; scaling by a power of two is exact, so this rounds
        // once. A result of 8 is the smallest normal, which has the same bits (exp 1, man 0).
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    // Normals: keep 3 of f32's 23 mantissa bits, rounding the 20 dropped ones to even (a carry
    // moves into the exponent, as it should).
    let bits = a.to_bits();
    let rounded = (bits + 0x7ffff + ((bits >> 20) & 1)) & !0xfffff;
    let exp = ((rounded >> 23) as i32) - 127 + 7;
    let man = ((rounded >> 20) & 7) as u8;
    sign | ((exp as u8) << 3) | man
}

/// `x` rounded through e4m3 with `scale`: `e4m3(clamp(x / scale, ±448)) · scale`.
pub fn fake_quantize(x: f32, scale: f32) -> f32 {
    e4m3_to_f32(e4m3_from_f32((x / scale).clamp(-E4M3_MAX, E4M3_MAX))) * scale
}

/// How activations entering an [`Fp8Matrix`] are quantized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fp8Activations {
    /// Not at all (FP8 weights, 16-bit activations).
    None,
    /// Per token, `scale = max|x| / 448`, computed at run time.
    DynamicPerToken,
    /// Per token and run of this many consecutive inputs (a row's last run may be shorter),
    /// `scale = max|x| / 448` over the run: what block-scaled checkpoints (DeepSeek-V3,
    /// Qwen3-FP8, llm-compressor's FP8_BLOCK) do, with runs as wide as a weight block.
    DynamicPerGroup(usize),
    /// One static scale for the whole tensor, from calibration.
    Static(f32),
}

/// The dynamic scale of `xs`: `max|x| / 448`, a zero replaced by f32's epsilon as
/// compressed-tensors does (zeros stay zeros).
fn dynamic_scale(xs: &[f32]) -> f32 {
    match xs.iter().fold(0f32, |m, v| m.max(v.abs())) / E4M3_MAX {
        0.0 => f32::EPSILON,
        s => s,
    }
}

/// `x` (`m` rows of `k`) rounded through e4m3 as `act` says.
pub fn quantize_activations(x: &[f32], k: usize, act: Fp8Activations) -> Vec<f32> {
    // Runs restart at every row: a short last run never spans two tokens.
    let dynamic = |run: usize| -> Vec<f32> {
        x.chunks(k.max(1))
            .flat_map(|row| row.chunks(run.max(1)))
            .flat_map(|xs| {
                let s = dynamic_scale(xs);
                xs.iter().map(move |&v| fake_quantize(v, s))
            })
            .collect()
    };
    match act {
        Fp8Activations::None => x.to_vec(),
        Fp8Activations::Static(s) => x.iter().map(|&v| fake_quantize(v, s)).collect(),
        Fp8Activations::DynamicPerToken => dynamic(k),
        Fp8Activations::DynamicPerGroup(g) => dynamic(g),
    }
}

/// Which weights share a scale in an [`Fp8Matrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Scales {
    /// One scale for the whole matrix.
    Tensor,
    /// One per row (output channel).
    Channel,
    /// One per block of `rows × cols` weights, in a row-major grid of `⌈rows / block rows⌉ ×
    /// ⌈cols / block cols⌉` (the last blocks of a row or column of blocks may be partial).
    Block { rows: usize, cols: usize },
}

impl Fp8Scales {
    /// The block of a `rows × cols` matrix that one scale covers.
    pub fn block(self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Self::Tensor => (rows.max(1), cols.max(1)),
            Self::Channel => (1, cols.max(1)),
            Self::Block { rows, cols } => (rows, cols),
        }
    }

    /// How activations entering such weights are quantized at run time: per token, or per
    /// token and group as wide as a block (the pairing of DeepSeek-V3's and llm-compressor's
    /// FP8_BLOCK, which lets an FP8 GEMM apply one activation scale per block of the sum).
    pub fn dynamic_activations(self) -> Fp8Activations {
        match self {
            Self::Block { cols, .. } => Fp8Activations::DynamicPerGroup(cols),
            _ => Fp8Activations::DynamicPerToken,
        }
    }

    /// The scale grid of a `rows × cols` matrix: `(grid rows, grid columns)`.
    pub fn grid(self, rows: usize, cols: usize) -> (usize, usize) {
        let (br, bc) = self.block(rows, cols);
        (rows.div_ceil(br.max(1)), cols.div_ceil(bc.max(1)))
    }
}

/// A `[rows, cols]` matrix of e4m3 codes with scales as [`Fp8Scales`] lays them out, its input
/// activations quantized as [`Fp8Activations`] says.
#[derive(Clone)]
pub struct Fp8Matrix {
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    /// The scale grid, row-major (one value per tensor, per row, or per block).
    scales: Vec<f32>,
    layout: Fp8Scales,
    act: Fp8Activations,
    /// `codes · scales` as little-endian f32 bytes, row-major (what the CPU's matmul reads),
    /// made when first asked for.
    dequantized: OnceLock<Vec<u8>>,
}

impl std::fmt::Debug for Fp8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fp8Matrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("layout", &self.layout)
            .field("act", &self.act)
            .finish_non_exhaustive()
    }
}

impl Fp8Matrix {
    /// From row-major codes and the scale grid `layout` names. NaN codes, non-finite or
    /// negative scales and empty blocks or activation groups are refused.
    pub fn from_codes(
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: &[f32],
        layout: Fp8Scales,
        act: Fp8Activations,
    ) -> Result<Self, Fp8Error> {
        let (br, bc) = layout.block(rows, cols);
        let (gr, gc) = layout.grid(rows, cols);
        if codes.len() != rows * cols || cols == 0 || br == 0 || bc == 0 || scales.len() != gr * gc
        {
            return Err(Fp8Error::Shape(format!(
                "{} codes and {} scales for a {rows}x{cols} FP8 matrix with scales per \
                 {layout:?} (a {gr}x{gc} grid)",
                codes.len(),
                scales.len()
            )));
        }
        check_values(&codes, scales, act)?;
        Ok(Self {
            rows,
            cols,
            codes,
            scales: scales.to_vec(),
            layout,
            act,
            dequantized: OnceLock::new(),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The e4m3 codes, row-major.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// The scale grid, row-major: `layout().grid(rows, cols)` values.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    pub fn layout(&self) -> Fp8Scales {
        self.layout
    }

    pub fn activations(&self) -> Fp8Activations {
        self.act
    }

    /// The dequantized weights as little-endian f32 bytes, row-major: made on the first call
    /// (the CPU's matmul), never where the GPU's kernels take the codes.
    pub fn f32_bytes(&self) -> &[u8] {
        self.dequantized.get_or_init(|| {
            let mut out = Vec::with_capacity(self.rows * self.cols * 4);
            let mut row = vec![0f32; self.cols];
            for r in 0..self.rows {
                self.dequantize_row(r, &mut row);
                out.extend(row.iter().flat_map(|v| v.to_le_bytes()));
            }
            out
        })
    }

    /// The stored size (codes and scales), not the f32 copy the CPU computes with.
    pub fn bytes_len(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    /// Row `r` as f32.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "output row length");
        let (br, bc) = self.layout.block(self.rows, self.cols);
        let (_, gc) = self.layout.grid(self.rows, self.cols);
        let grid_row = &self.scales[r / br * gc..(r / br + 1) * gc];
        let codes = &self.codes[r * self.cols..(r + 1) * self.cols];
        for (c, (o, &code)) in out.iter_mut().zip(codes).enumerate() {
            *o = e4m3_to_f32(code) * grid_row[c / bc];
        }
    }

    /// Rows `rows` and columns `cols` as a matrix of its own (one rank's shard). With block
    /// scales the cut must fall on whole blocks, and with activation groups on whole groups,
    /// so the shard computes exactly what its part of the whole did.
    pub fn slice(&self, rows: Range<usize>, cols: Range<usize>) -> Result<Self, Fp8Error> {
        if rows.is_empty() || cols.is_empty() || rows.end > self.rows || cols.end > self.cols {
            return Err(Fp8Error::Shape(format!(
                "rows {rows:?} and columns {cols:?} of a {}x{} matrix",
                self.rows, self.cols
            )));
        }
        let (br, bc) = match self.layout {
            Fp8Scales::Block { rows, cols } => (rows, cols),
            _ => (1, 1),
        };
        let group = match self.act {
            Fp8Activations::DynamicPerGroup(g) => g,
            _ => 1,
        };
        whole("rows", &rows, self.rows, br, "FP8 scale blocks")?;
        whole("columns", &cols, self.cols, bc, "FP8 scale blocks")?;
        whole("columns", &cols, self.cols, group, "activation groups")?;
        let codes: Vec<u8> = rows
            .clone()
            .flat_map(|r| self.codes[r * self.cols..(r + 1) * self.cols][cols.clone()].to_vec())
            .collect();
        let (_, gc) = self.layout.grid(self.rows, self.cols);
        let scales: Vec<f32> = match self.layout {
            Fp8Scales::Tensor => self.scales.clone(),
            Fp8Scales::Channel => self.scales[rows.clone()].to_vec(),
            Fp8Scales::Block { .. } => (rows.start / br..rows.end.div_ceil(br))
                .flat_map(|g| {
                    self.scales[g * gc..(g + 1) * gc][cols.start / bc..cols.end.div_ceil(bc)]
                        .to_vec()
                })
                .collect(),
        };
        Self::from_codes(
            rows.len(),
            cols.len(),
            codes,
            &scales,
            self.layout,
            self.act,
        )
    }
}

impl Fp8Matrix {
    /// `parts` (same width and activations) one after another as one matrix: a fused
    /// projection (q, k and v; gate and up). Per-tensor and per-channel parts become one scale
    /// per row; block-scaled parts (same blocks, every part but the last whole blocks of rows)
    /// keep their grids. `None` when they do not combine.
    pub fn stack(parts: &[&Fp8Matrix]) -> Option<Fp8Matrix> {
        let first = parts.first()?;
        let (cols, act) = (first.cols, first.act);
        if parts.iter().any(|p| p.cols != cols || p.act != act) {
            return None;
        }
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let codes: Vec<u8> = parts.iter().flat_map(|p| p.codes.iter().copied()).collect();
        let (layout, scales): (Fp8Scales, Vec<f32>) = match first.layout {
            Fp8Scales::Block { rows: br, .. } => {
                let last = parts.len() - 1;
                let whole = parts[..last].iter().all(|p| p.rows.is_multiple_of(br));
                if !whole || parts.iter().any(|p| p.layout != first.layout) {
                    return None;
                }
                let grid = parts.iter().flat_map(|p| p.scales.iter().copied());
                (first.layout, grid.collect())
            }
            _ if parts
                .iter()
                .any(|p| matches!(p.layout, Fp8Scales::Block { .. })) =>
            {
                return None;
            }
            _ => {
                let per_row = parts.iter().flat_map(|p| match p.layout {
                    Fp8Scales::Tensor => vec![p.scales[0]; p.rows],
                    _ => p.scales.clone(),
                });
                (Fp8Scales::Channel, per_row.collect())
            }
        };
        Fp8Matrix::from_codes(rows, cols, codes, &scales, layout, act).ok()
    }
}

/// Refuses NaN codes, scales that are not finite and ≥ 0, and bad activation parameters.
fn check_values(codes: &[u8], scales: &[f32], act: Fp8Activations) -> Result<(), Fp8Error> {
    if let Some(s) = scales.iter().find(|s| !s.is_finite() || **s < 0.0) {
        return Err(Fp8Error::Value(format!(
            "weight scale {s} is not finite and ≥ 0"
        )));
    }
    match act {
        Fp8Activations::Static(s) if !(s.is_finite() && s > 0.0) => {
            return Err(Fp8Error::Value(format!(
                "input scale {s} is not finite and > 0"
            )));
        }
        Fp8Activations::DynamicPerGroup(0) => {
            return Err(Fp8Error::Shape("activation groups of 0 inputs".into()));
        }
        _ => {}
    }
    if codes.iter().any(|&c| c & 0x7f == 0x7f) {
        return Err(Fp8Error::Value("an e4m3 weight is NaN".into()));
    }
    Ok(())
}

/// Refuses a cut `r` of `n` that starts, or ends before `n`, inside a run of `unit`.
fn whole(what: &str, r: &Range<usize>, n: usize, unit: usize, of: &str) -> Result<(), Fp8Error> {
    let inside = |i: usize| !i.is_multiple_of(unit) && i != n;
    if inside(r.start) || inside(r.end) {
        return Err(Fp8Error::Shape(format!(
            "{what} {r:?} of {n} would cut {of} of {unit}"
        )));
    }
    Ok(())
}

/// FP8 by round-to-nearest (llm-compressor's FP8 weights): per scale of `layout`,
/// `scale = max|w| / 448` over the weights it covers (f32), codes `e4m3(w / scale)`.
pub fn quantize_fp8_rtn(
    w: &[f32],
    rows: usize,
    cols: usize,
    layout: Fp8Scales,
    act: Fp8Activations,
) -> Result<Fp8Matrix, Fp8Error> {
    if w.len() != rows * cols {
        return Err(Fp8Error::Shape(format!(
            "{} values are not {rows}x{cols}",
            w.len()
        )));
    }
    if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
        return Err(Fp8Error::Value(format!("weight {bad} is not finite")));
    }
    let (br, bc) = layout.block(rows, cols);
    let (gr, gc) = layout.grid(rows, cols);
    let mut amax = vec![0f32; gr * gc];
    for (r, row) in w.chunks_exact(cols.max(1)).enumerate() {
        for (c, v) in row.iter().enumerate() {
            let a = &mut amax[r / br * gc + c / bc];
            *a = a.max(v.abs());
        }
    }
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| if a == 0.0 { 1.0 } else { a / E4M3_MAX })
        .collect();
    let codes = w
        .iter()
        .enumerate()
        .map(|(i, &v)| e4m3_from_f32(v / scales[i / cols / br * gc + i % cols / bc]))
        .collect();
    Fp8Matrix::from_codes(rows, cols, codes, &scales, layout, act)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_values_match_the_format() {
        for c in 0..=255u8 {
            let v = e4m3_to_f32(c);
            if c & 0x7f == 0x7f {
                assert!(v.is_nan(), "{c:#x}");
                continue;
            }
            // -0 encodes as 0x80 and decodes to -0.0: same bits back.
            assert_eq!(e4m3_from_f32(v), c, "{c:#x} = {v}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), (2f32).powi(-9));
        assert_eq!(e4m3_to_f32(0x08), (2f32).powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
    }

    #[test]
    fn rounding_is_to_nearest_with_ties_to_even_and_saturates() {
        // 1.0625 lies halfway between 1.0 (mantissa 0, even) and 1.125.
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.0625)), 1.0);
        // 1.1875 lies halfway between 1.125 (odd) and 1.25 (even).
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.1875)), 1.25);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.07)), 1.125);
        // A carry into the exponent: 15.5 is halfway between 15 and 16 (even mantissa 0).
        assert_eq!(e4m3_to_f32(e4m3_from_f32(15.5)), 16.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1e9)), 448.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(-460.0)), -448.0);
        // Subnormals: 2⁻⁹ · 2.5 rounds to 2 (even), 2⁻⁹ · 7.6 to the smallest normal.
        assert_eq!(e4m3_to_f32(e4m3_from_f32(2.5 / 512.0)), 2.0 / 512.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(7.6 / 512.0)), 8.0 / 512.0);
    }

    #[test]
    fn dynamic_activations_use_max_over_448_per_token() {
        let x = [0.0, 1.0, -3.5, 7.0, 0.0, 0.0, 0.0, 0.0];
        let q = quantize_activations(&x, 4, Fp8Activations::DynamicPerToken);
        // Row 0: scale 7/448 = 1/64; 1.0 → 64 (exact), -3.5 → -224, 7 → 448.
        assert_eq!(&q[..4], &[0.0, 1.0, -3.5, 7.0]);
        assert_eq!(&q[4..], &[0.0; 4], "an all-zero row stays zero");
        let s = quantize_activations(&[0.3], 1, Fp8Activations::Static(0.01));
        // 0.3 / 0.01 = 30 → 30 is representable? 30 = 1.875·16: yes.
        assert!((s[0] - 0.3).abs() < 1e-6, "{s:?}");
    }

    #[test]
    fn rtn_rows_are_within_half_an_e4m3_step() {
        let w: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.013)
            .collect();
        let m = quantize_fp8_rtn(
            &w,
            4,
            16,
            Fp8Scales::Channel,
            Fp8Activations::DynamicPerToken,
        )
        .expect("fp8");
        let mut row = vec![0f32; 16];
        for r in 0..4 {
            m.dequantize_row(r, &mut row);
            for (a, b) in row.iter().zip(&w[r * 16..(r + 1) * 16]) {
                // 3 mantissa bits: relative error ≤ 2⁻⁴ (normals).
                assert!((a - b).abs() <= b.abs() / 16.0 + 1e-6, "{a} vs {b}");
            }
        }
        let s = m.slice(1..3, 4..12).expect("slice");
        s.dequantize_row(0, &mut row[..8]);
        let mut full = vec![0f32; 16];
        m.dequantize_row(1, &mut full);
        assert_eq!(&row[..8], &full[4..12]);
    }
    /// A 5×7 matrix in blocks of 2×3: a 3×3 grid whose last row and column of blocks are
    /// partial; each weight is its code times its own block's scale.
    #[test]
    fn block_scales_cover_partial_blocks_and_slice_on_whole_blocks() {
        let (rows, cols) = (5, 7);
        let layout = Fp8Scales::Block { rows: 2, cols: 3 };
        assert_eq!(layout.grid(rows, cols), (3, 3));
        let codes: Vec<u8> = (0..35)
            .map(|i| e4m3_from_f32(1.0 + i as f32 / 8.0))
            .collect();
        let scales: Vec<f32> = (0..9).map(|g| 0.5 + g as f32).collect();
        let act = Fp8Activations::DynamicPerGroup(3);
        let m = Fp8Matrix::from_codes(rows, cols, codes.clone(), &scales, layout, act).expect("m");
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.dequantize_row(r, &mut row);
            for (c, v) in row.iter().enumerate() {
                let want = e4m3_to_f32(codes[r * cols + c]) * scales[r / 2 * 3 + c / 3];
                assert_eq!(*v, want, "({r}, {c})");
            }
        }
        let e = Fp8Matrix::from_codes(rows, cols, codes, &scales[..8], layout, act);
        assert!(matches!(e, Err(Fp8Error::Shape(_))), "{e:?}");

        // Rows 2..5 and columns 3..7: the grid's last two rows and columns.
        let s = m.slice(2..5, 3..7).expect("whole blocks");
        assert_eq!(s.scales(), &[4.5, 5.5, 7.5, 8.5]);
        let mut part = vec![0f32; 4];
        for r in 0..3 {
            s.dequantize_row(r, &mut part);
            m.dequantize_row(r + 2, &mut row);
            assert_eq!(part, row[3..]);
        }
        for (rs, cs) in [(1..5, 0..7), (0..3, 0..7), (0..5, 2..7), (0..5, 0..4)] {
            let e = m.slice(rs.clone(), cs.clone()).expect_err("inside a block");
            assert!(e.to_string().contains("would cut FP8 scale blocks"), "{e}");
        }
        let grouped = m.slice(0..4, 0..6).expect("m");
        assert_eq!(grouped.activations(), act);
    }

    #[test]
    fn group_activations_take_a_scale_per_run_of_each_token() {
        // k = 5 in groups of 2: runs [0, 1], [2, 3], [4] per token.
        let x = [1.0, 3.0, 0.0, 0.0, 0.3, 2.0, -8.0, 1.0, 0.5, 7.0];
        let q = quantize_activations(&x, 5, Fp8Activations::DynamicPerGroup(2));
        let mut want = Vec::new();
        for run in [&x[0..2], &x[2..4], &x[4..5], &x[5..7], &x[7..9], &x[9..10]] {
            let s = run.iter().fold(0f32, |m, v| m.max(v.abs())) / E4M3_MAX;
            let s = if s == 0.0 { f32::EPSILON } else { s };
            want.extend(run.iter().map(|&v| fake_quantize(v, s)));
        }
        assert_eq!(q, want);
        // A run's largest value maps to 448 exactly, so it comes back unchanged.
        assert_eq!([q[1], q[4], q[6], q[9]], [3.0, 0.3, -8.0, 7.0]);
        let token = quantize_activations(&x, 5, Fp8Activations::DynamicPerToken);
        assert_ne!(q, token, "groups differ from one scale per token");
    }

    #[test]
    fn rtn_block_scales_are_each_blocks_max_over_448() {
        let (rows, cols) = (4, 6);
        let w: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) * 0.37).collect();
        let layout = Fp8Scales::Block { rows: 2, cols: 4 };
        let m = quantize_fp8_rtn(&w, rows, cols, layout, Fp8Activations::None).expect("fp8");
        let (gr, gc) = layout.grid(rows, cols);
        for (g, &s) in m.scales().iter().enumerate() {
            let (bi, bj) = (g / gc, g % gc);
            let w = &w;
            let amax = (bi * 2..(bi * 2 + 2).min(rows))
                .flat_map(|r| (bj * 4..(bj * 4 + 4).min(cols)).map(move |c| w[r * cols + c]))
                .fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(s, amax / E4M3_MAX, "block {g} of {gr}x{gc}");
        }
        let t = quantize_fp8_rtn(&w, rows, cols, Fp8Scales::Tensor, Fp8Activations::None);
        assert_eq!(t.expect("fp8").scales(), &[11.5 * 0.37 / E4M3_MAX]);
    }
    /// q, k and v fuse: per-tensor parts become per-row scales, blocks stay blocks when each
    /// part but the last is whole blocks of rows; each row keeps its values.
    #[test]
    fn fused_parts_keep_every_row() {
        let act = Fp8Activations::DynamicPerToken;
        let w: Vec<f32> = (0..6 * 8).map(|i| (i as f32 - 20.0) * 0.1).collect();
        let a = quantize_fp8_rtn(&w[..16], 2, 8, Fp8Scales::Tensor, act).expect("a");
        let b = quantize_fp8_rtn(&w[16..], 4, 8, Fp8Scales::Channel, act).expect("b");
        let s = Fp8Matrix::stack(&[&a, &b]).expect("stack");
        assert_eq!((s.rows(), s.layout()), (6, Fp8Scales::Channel));
        let (mut got, mut want) = (vec![0f32; 8], vec![0f32; 8]);
        for r in 0..6 {
            s.dequantize_row(r, &mut got);
            match r {
                0 | 1 => a.dequantize_row(r, &mut want),
                _ => b.dequantize_row(r - 2, &mut want),
            }
            assert_eq!(got, want, "row {r}");
        }
        let blocks = Fp8Scales::Block { rows: 2, cols: 4 };
        let c = quantize_fp8_rtn(&w[..16], 2, 8, blocks, act).expect("c");
        let d = quantize_fp8_rtn(&w[16..40], 3, 8, blocks, act).expect("d");
        let s = Fp8Matrix::stack(&[&c, &d]).expect("blocks");
        assert_eq!(s.scales().len(), 2 + 4);
        s.dequantize_row(4, &mut got);
        d.dequantize_row(2, &mut want);
        assert_eq!(got, want);
        assert!(
            Fp8Matrix::stack(&[&d, &c]).is_none(),
            "3 rows are not whole blocks of 2"
        );
        assert!(
            Fp8Matrix::stack(&[&a, &c]).is_none(),
            "per tensor and blocks"
        );
        let other = quantize_fp8_rtn(&w[..16], 2, 8, Fp8Scales::Tensor, Fp8Activations::None);
        assert!(
            Fp8Matrix::stack(&[&a, &other.expect("o")]).is_none(),
            "activations differ"
        );
    }
}
