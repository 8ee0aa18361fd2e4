//! FP8 (e4m3, the `float8_e4m3fn` of PyTorch and compressed-tensors) weights and activations on
//! the CPU: correct, not fast.
//!
//! An [`Fp8Matrix`] keeps the e4m3 codes and scales it was made from (so it can be written back)
//! and, for the matmul, the weights dequantized to f32 at construction (`code · scale`, exact in
//! f32). Activations are rounded through e4m3 per call, the way compressed-tensors' forward and
//! vLLM's FP8 kernels quantize them: per token with `scale = max|x| / 448` (dynamic), or with
//! the checkpoint's static per-tensor scale; `x' = e4m3(clamp(x / scale, ±448)) · scale`. The
//! product is then an f32 matmul over the dequantized weights, so the result is what an FP8 GEMM
//! with f32 accumulation gives, at f32 speed and 4 bytes per weight in memory.
//!
//! e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, one NaN
//! pattern per sign (`S.1111.111`), largest finite ±448, smallest subnormal 2⁻⁹.

use std::ops::Range;

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
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    let min_normal = (2f32).powi(-6);
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
    /// One static scale for the whole tensor, from calibration.
    Static(f32),
}

/// `x` (`m` rows of `k`) rounded through e4m3 as `act` says.
pub fn quantize_activations(x: &[f32], k: usize, act: Fp8Activations) -> Vec<f32> {
    match act {
        Fp8Activations::None => x.to_vec(),
        Fp8Activations::Static(s) => x.iter().map(|&v| fake_quantize(v, s)).collect(),
        Fp8Activations::DynamicPerToken => x
            .chunks_exact(k.max(1))
            .flat_map(|row| {
                let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                // compressed-tensors replaces a zero scale by f32's epsilon: zeros stay zeros.
                let s = match amax / E4M3_MAX {
                    0.0 => f32::EPSILON,
                    s => s,
                };
                row.iter().map(move |&v| fake_quantize(v, s))
            })
            .collect(),
    }
}

/// A `[rows, cols]` matrix of e4m3 codes with one scale per row (a per-tensor scale is
/// repeated), its input activations quantized as [`Fp8Activations`] says.
#[derive(Clone)]
pub struct Fp8Matrix {
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    scales: Vec<f32>,
    per_tensor: bool,
    act: Fp8Activations,
    /// `codes · scales` as little-endian f32 bytes, row-major (what the matmul reads).
    dequantized: Vec<u8>,
}

impl std::fmt::Debug for Fp8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fp8Matrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("act", &self.act)
            .finish_non_exhaustive()
    }
}

impl Fp8Matrix {
    /// From row-major codes and either one scale per row or one for the whole matrix
    /// (`scales.len() == 1`). NaN codes and non-finite or negative scales are refused.
    pub fn from_codes(
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: &[f32],
        act: Fp8Activations,
    ) -> Result<Self, Fp8Error> {
        let per_tensor = scales.len() == 1 && rows != 1;
        if codes.len() != rows * cols || cols == 0 || !(per_tensor || scales.len() == rows) {
            return Err(Fp8Error::Shape(format!(
                "{} codes and {} scales for a {rows}x{cols} FP8 matrix (one scale per row, or \
                 one in all)",
                codes.len(),
                scales.len()
            )));
        }
        if let Some(s) = scales.iter().find(|s| !s.is_finite() || **s < 0.0) {
            return Err(Fp8Error::Value(format!(
                "weight scale {s} is not finite and ≥ 0"
            )));
        }
        if let Fp8Activations::Static(s) = act
            && !(s.is_finite() && s > 0.0)
        {
            return Err(Fp8Error::Value(format!(
                "input scale {s} is not finite and > 0"
            )));
        }
        if codes.iter().any(|&c| c & 0x7f == 0x7f) {
            return Err(Fp8Error::Value("an e4m3 weight is NaN".into()));
        }
        let scales = if per_tensor {
            vec![scales[0]; rows]
        } else {
            scales.to_vec()
        };
        let mut dequantized = Vec::with_capacity(rows * cols * 4);
        for (row, &s) in codes.chunks_exact(cols).zip(&scales) {
            for &c in row {
                dequantized.extend_from_slice(&(e4m3_to_f32(c) * s).to_le_bytes());
            }
        }
        Ok(Self {
            rows,
            cols,
            codes,
            scales,
            per_tensor,
            act,
            dequantized,
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

    /// One scale per row.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Whether every row shares one scale (a per-tensor scale).
    pub fn per_tensor(&self) -> bool {
        self.per_tensor
    }

    pub fn activations(&self) -> Fp8Activations {
        self.act
    }

    /// The dequantized weights as little-endian f32 bytes, row-major.
    pub fn f32_bytes(&self) -> &[u8] {
        &self.dequantized
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
        let row = &self.dequantized[r * self.cols * 4..(r + 1) * self.cols * 4];
        for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    /// Rows `rows` and columns `cols` as a matrix of its own (one rank's shard).
    pub fn slice(&self, rows: Range<usize>, cols: Range<usize>) -> Result<Self, Fp8Error> {
        if rows.is_empty() || cols.is_empty() || rows.end > self.rows || cols.end > self.cols {
            return Err(Fp8Error::Shape(format!(
                "rows {rows:?} and columns {cols:?} of a {}x{} matrix",
                self.rows, self.cols
            )));
        }
        let codes: Vec<u8> = rows
            .clone()
            .flat_map(|r| self.codes[r * self.cols..(r + 1) * self.cols][cols.clone()].to_vec())
            .collect();
        let mut m = Self::from_codes(rows.len(), cols.len(), codes, &self.scales[rows], self.act)?;
        m.per_tensor = self.per_tensor;
        Ok(m)
    }
}

/// Per-channel FP8 by round-to-nearest (llm-compressor's FP8 weights): `scale = max|w| / 448`
/// per row (f32), codes `e4m3(w / scale)`.
pub fn quantize_fp8_rtn(
    w: &[f32],
    rows: usize,
    cols: usize,
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
    let mut scales = Vec::with_capacity(rows);
    let mut codes = Vec::with_capacity(rows * cols);
    for row in w.chunks_exact(cols.max(1)) {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = if amax == 0.0 { 1.0 } else { amax / E4M3_MAX };
        codes.extend(row.iter().map(|&v| e4m3_from_f32(v / s)));
        scales.push(s);
    }
    Fp8Matrix::from_codes(rows, cols, codes, &scales, act)
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
        let m = quantize_fp8_rtn(&w, 4, 16, Fp8Activations::DynamicPerToken).expect("fp8");
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
}
