//! W8A8: int8 weights with one f32 scale per output row (symmetric, per channel), times
//! activations quantized to int8 per token on the fly, products summed in i32 and scaled in the
//! epilogue: `y[i][j] = sx[i] · sw[j] · Σ_k xq[i][k] · wq[j][k]`. The layout compressed-tensors'
//! `int-quantized` W8A8 checkpoints (llm-compressor, vLLM) use: `weight` int8 `[out, in]`,
//! `weight_scale` `[out, 1]`, activations dynamic per token.
//!
//! # Layout
//!
//! Rows of int8 codes padded with zeros to a multiple of [`K_ALIGN`] (one 32-byte vector), so
//! the SIMD loops need no tails; each row's scale and `Σ codes` (for the VNNI kernel's
//! unsigned activations, below). Codes are kept in `-127..=127` (the AVX2 kernel's sign trick
//! needs a symmetric range); the few `-128`s a checkpoint may hold (llm-compressor's symmetric
//! int8 grid reaches `-128`, and vLLM uses it) are stored as `-127` and listed per row, and each
//! kernel subtracts their activations from the i32 sum, so the product is exact.
//!
//! # Kernels (chosen at run time)
//!
//! - **AVX-VNNI** (`vpdpbusd`): activations as `u8 = q + 128`, four `u8 × i8` products summed
//!   into each i32 lane per instruction without saturation; the `+128` is taken back out in the
//!   epilogue as `128 · Σ_k wq[j][k]`.
//! - **AVX2** (`vpmaddubsw` + `vpmaddwd`): `|x| × sign(w, x)` so the `u8 × i8` pairs summed into
//!   i16 cannot saturate (`2 · 127 · 127 < 2¹⁵`); codes are kept in `-127..=127` for this.
//! - **portable**: the reference, plain i32 sums.
//!
//! All three give the same i32 sums, so the same results bit for bit.

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;
#[allow(unsafe_code)]
mod matmul;

use std::ops::Range;

/// Row padding of codes and activations, in elements.
pub const K_ALIGN: usize = 32;

/// What can go wrong building an [`I8Matrix`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum I8Error {
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    Value(String),
}

/// A `[rows, cols]` int8 matrix with per-row scales (see the module docs).
#[derive(Clone)]
pub struct I8Matrix {
    rows: usize,
    cols: usize,
    /// `rows * padded_cols` codes in `-127..=127`, zero-padded.
    codes: Vec<i8>,
    scales: Vec<f32>,
    /// `Σ codes` per row.
    row_sums: Vec<i32>,
    /// The columns whose code is `-128` (stored as `-127`): row `r`'s are
    /// `minus128_cols[minus128_start[r]..minus128_start[r + 1]]`.
    minus128_start: Vec<u32>,
    minus128_cols: Vec<u32>,
}

impl std::fmt::Debug for I8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("I8Matrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl I8Matrix {
    /// From row-major codes (`rows * cols`) and one finite scale per row (a `-128` is kept
    /// exactly: see the module docs).
    pub fn from_codes(
        rows: usize,
        cols: usize,
        codes: &[i8],
        scales: &[f32],
    ) -> Result<Self, I8Error> {
        if codes.len() != rows * cols || scales.len() != rows || cols == 0 {
            return Err(I8Error::Shape(format!(
                "{} codes and {} scales for a {rows}x{cols} int8 matrix",
                codes.len(),
                scales.len()
            )));
        }
        if let Some(s) = scales.iter().find(|s| !s.is_finite()) {
            return Err(I8Error::Value(format!("scale {s} is not finite")));
        }
        let kp = cols.next_multiple_of(K_ALIGN);
        let mut padded = vec![0i8; rows * kp];
        let mut row_sums = Vec::with_capacity(rows);
        let mut minus128_start = vec![0u32];
        let mut minus128_cols = Vec::new();
        for (dst, src) in padded.chunks_exact_mut(kp).zip(codes.chunks_exact(cols)) {
            for (c, (d, &s)) in dst.iter_mut().zip(src).enumerate() {
                *d = s.max(-127);
                if s == -128 {
                    minus128_cols.push(c as u32);
                }
            }
            row_sums.push(dst.iter().map(|&v| i32::from(v)).sum());
            minus128_start.push(minus128_cols.len() as u32);
        }
        Ok(Self {
            rows,
            cols,
            codes: padded,
            scales: scales.to_vec(),
            row_sums,
            minus128_start,
            minus128_cols,
        })
    }

    /// Row `r`'s columns whose code is `-128`.
    fn minus128(&self, r: usize) -> &[u32] {
        &self.minus128_cols[self.minus128_start[r] as usize..self.minus128_start[r + 1] as usize]
    }

    /// What the `-128`s of row `r` add to its product with activation row `xq` beyond the
    /// stored `-127`s: `-Σ xq[c]` (subtracted from the i32 sum as a fix-up).
    pub(crate) fn minus128_fix(&self, r: usize, xq: &[i8]) -> i32 {
        self.minus128(r)
            .iter()
            .map(|&c| i32::from(xq[c as usize]))
            .sum()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn padded_cols(&self) -> usize {
        self.cols.next_multiple_of(K_ALIGN)
    }

    /// Row `r`'s codes (without padding, `-128`s included).
    pub fn row_codes(&self, r: usize) -> Vec<i8> {
        let kp = self.padded_cols();
        let mut row = self.codes[r * kp..r * kp + self.cols].to_vec();
        for &c in self.minus128(r) {
            row[c as usize] = -128;
        }
        row
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The stored size: a byte per code, 4 per scale.
    pub fn bytes_len(&self) -> usize {
        self.rows * self.cols + self.rows * 4
    }

    /// Row `r` as f32.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "output row length");
        let s = self.scales[r];
        for (o, q) in out.iter_mut().zip(self.row_codes(r)) {
            *o = s * f32::from(q);
        }
    }

    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }

    /// `parts` (same width) one after another: a fused projection. `None` when widths differ.
    pub fn stack(parts: &[&I8Matrix]) -> Option<I8Matrix> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.cols != first.cols) {
            return None;
        }
        let mut minus128_start = vec![0u32];
        let mut minus128_cols = Vec::new();
        for p in parts {
            for r in 0..p.rows {
                minus128_cols.extend_from_slice(p.minus128(r));
                minus128_start.push(minus128_cols.len() as u32);
            }
        }
        Some(I8Matrix {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            codes: parts.iter().flat_map(|p| p.codes.iter().copied()).collect(),
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
            row_sums: parts
                .iter()
                .flat_map(|p| p.row_sums.iter().copied())
                .collect(),
            minus128_start,
            minus128_cols,
        })
    }

    /// Rows `rows` and columns `cols` as a matrix of its own (one rank's shard): per-channel
    /// scales, so a column range may start and end anywhere.
    pub fn slice(&self, rows: Range<usize>, cols: Range<usize>) -> Result<I8Matrix, I8Error> {
        if rows.is_empty() || cols.is_empty() || rows.end > self.rows || cols.end > self.cols {
            return Err(I8Error::Shape(format!(
                "rows {rows:?} and columns {cols:?} of a {}x{} matrix",
                self.rows, self.cols
            )));
        }
        let codes: Vec<i8> = rows
            .clone()
            .flat_map(|r| self.row_codes(r)[cols.clone()].to_vec())
            .collect();
        I8Matrix::from_codes(rows.len(), cols.len(), &codes, &self.scales[rows])
    }
}

/// Symmetric int8 per row by round-to-nearest: `scale = max|w| / 127` (f32), codes
/// `round(w / scale)`; every element within half a step.
pub fn quantize_int8_rtn(w: &[f32], rows: usize, cols: usize) -> Result<I8Matrix, I8Error> {
    if w.len() != rows * cols {
        return Err(I8Error::Shape(format!(
            "{} values are not {rows}x{cols}",
            w.len()
        )));
    }
    if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
        return Err(I8Error::Value(format!("weight {bad} is not finite")));
    }
    let mut codes = vec![0i8; rows * cols];
    let mut scales = vec![0f32; rows];
    for ((q, s), row) in codes
        .chunks_exact_mut(cols)
        .zip(&mut scales)
        .zip(w.chunks_exact(cols))
    {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        *s = amax / 127.0;
        if amax > 0.0 {
            for (q, &v) in q.iter_mut().zip(row) {
                *q = (v / *s).round().clamp(-127.0, 127.0) as i8;
            }
        }
    }
    I8Matrix::from_codes(rows, cols, &codes, &scales)
}

/// Activation rows quantized per token: `q = round(x / s)`, `s = max|x| / 127`, rows padded
/// like the weights. Made once per matmul call and shared by every weight it multiplies.
#[derive(Debug, Clone)]
pub struct I8Activations {
    pub(crate) m: usize,
    pub(crate) padded_cols: usize,
    pub(crate) q: Vec<i8>,
    /// `q + 128` (the VNNI kernel's unsigned operand); padding is 128, i.e. 0.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) u: Vec<u8>,
    pub(crate) scales: Vec<f32>,
}

impl I8Activations {
    /// Quantizes `m` rows of `k` from `x`.
    pub fn new(x: &[f32], m: usize, k: usize) -> Self {
        let kp = k.next_multiple_of(K_ALIGN);
        let mut q = vec![0i8; m * kp];
        let mut scales = vec![0f32; m];
        for ((qr, s), xr) in q
            .chunks_exact_mut(kp)
            .zip(&mut scales)
            .zip(x.chunks_exact(k))
        {
            let amax = xr.iter().fold(0f32, |a, v| a.max(v.abs()));
            if amax > 0.0 {
                *s = amax / 127.0;
                let inv = 127.0 / amax;
                for (q, &v) in qr.iter_mut().zip(xr) {
                    *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                }
            }
        }
        let u = q.iter().map(|&v| (i16::from(v) + 128) as u8).collect();
        Self {
            m,
            padded_cols: kp,
            q,
            u,
            scales,
        }
    }

    /// The rounded rows as f32 (`q · s`, `k` wide): what the integer products compute with,
    /// for kernels that take f32 inputs (W4A8 weights on the weight-only kernels).
    pub fn dequantized(&self, k: usize) -> Vec<f32> {
        self.q
            .chunks_exact(self.padded_cols)
            .zip(&self.scales)
            .flat_map(|(q, &s)| q[..k].iter().map(move |&v| f32::from(v) * s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Isa;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.max(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = s as f32 / u32::MAX as f32 - 0.5;
                if i % 61 == 0 { u * 20.0 } else { u }
            })
            .collect()
    }

    /// Every kernel gives the portable kernel's results exactly (same i32 sums), for widths
    /// that need padding and row counts that leave partial tiles.
    #[test]
    fn kernels_agree_exactly_and_match_the_dequantized_product() {
        for (rows, cols, m) in [(7, 40, 1), (13, 96, 3), (9, 576, 8), (5, 33, 6)] {
            let w = data(rows * cols, 3);
            let x = data(m * cols, 7);
            let q = quantize_int8_rtn(&w, rows, cols).expect("quantize");
            let acts = I8Activations::new(&x, m, cols);
            let run = |isa: Isa| {
                let mut out = vec![0f32; m * rows];
                let mut outs: Vec<&mut [f32]> = out.chunks_mut(rows).collect();
                q.matmul_rows(isa, 0, &acts, &mut outs);
                out
            };
            let scalar = run(Isa::Scalar);
            assert_eq!(run(Isa::Avx2), scalar, "{rows}x{cols} m={m}");
            // Against f32 on the dequantized weights: within the activation rounding.
            let wd = q.dequantize();
            for i in 0..m {
                let xr = &x[i * cols..(i + 1) * cols];
                let amax = xr.iter().fold(0f32, |a, v| a.max(v.abs()));
                for j in 0..rows {
                    let wr = &wd[j * cols..(j + 1) * cols];
                    let exact: f32 = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
                    let bound: f32 = wr.iter().map(|a| a.abs()).sum::<f32>() * amax / 254.0;
                    let got = scalar[i * rows + j];
                    assert!(
                        (got - exact).abs() <= bound * 1.001 + 1e-5,
                        "{got} vs {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn slices_and_minus_128() {
        let q = I8Matrix::from_codes(2, 3, &[-128, 5, 7, 1, 2, -128], &[0.5, 2.0]).expect("m");
        assert_eq!(q.row_codes(0), vec![-128, 5, 7]);
        assert_eq!(q.dequantize(), vec![-64.0, 2.5, 3.5, 2.0, 4.0, -256.0]);
        let s = q.slice(1..2, 1..3).expect("slice");
        assert_eq!(s.dequantize(), vec![4.0, -256.0]);
        let both = I8Matrix::stack(&[&s, &q.slice(0..1, 0..2).expect("slice")]).expect("stack");
        assert_eq!(both.row_codes(1), vec![-128, 5]);
        // Every kernel multiplies the -128s exactly.
        let x = [0.25f32, -1.0, 0.5];
        let acts = I8Activations::new(&x, 1, 3);
        let xq: Vec<f32> = acts.q[..3]
            .iter()
            .map(|&v| f32::from(v) * acts.scales[0])
            .collect();
        let want: Vec<f32> = q
            .dequantize()
            .chunks(3)
            .map(|w| w.iter().zip(&xq).map(|(a, b)| a * b).sum())
            .collect();
        for isa in [Isa::Scalar, Isa::Avx2] {
            let mut out = vec![0f32; 2];
            q.matmul_rows(isa, 0, &acts, &mut [&mut out]);
            assert_eq!(out, want, "{isa:?}");
        }
        assert!(q.slice(0..3, 0..1).is_err());
        assert!(I8Matrix::from_codes(1, 2, &[1, 2], &[f32::NAN]).is_err());
    }
}
