//! Activations quantized to int8 per block of 32, for integer dot products with GGUF's block
//! types: llama.cpp's arithmetic for them (its `Q8_0`/`Q8_1`/`Q8_K` activation blocks), opted
//! into with [`GgmlActivations::Int8`].
//!
//! A block of 32 activations becomes `d = max|x| / 127` and `q = round(x / d)` in −127..=127;
//! a group of 32 weights `w = dw·qw + m` then gives `Σ w·x ≈ dw·d·Σ qw·q + m·d·Σ q`, whose inner
//! sum is exact in integers. The only error is the activations' rounding (relative ~0.4% per
//! element, mostly cancelling in the sum): the library's default is the f32 path, which keeps
//! the golden tests' agreement with transformers; `ferrite`'s CPU default is int8.

use super::{GgmlType, Isa, scalar};

/// How block-quantized GGUF weights multiply the activations of a one-token step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum GgmlActivations {
    /// f32 activations times exactly dequantized weights (the default).
    #[default]
    F32,
    /// For block-quantized weights (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K): activations rounded
    /// to int8 per block of 32, integer dot products per group of 32 (float weights keep f32).
    Int8,
}

impl GgmlActivations {
    /// Whether weights of `ty` take int8 activations under this setting.
    pub fn applies_to(self, ty: GgmlType) -> bool {
        self == Self::Int8 && ty.is_quantized()
    }
}

/// One row of activations quantized per block of 32.
#[derive(Debug, Clone)]
pub(crate) struct Q8Row {
    /// Per block: the scale `d`.
    pub(crate) d: Vec<f32>,
    /// Per block: `d · Σ q` (the block's sum, for the weights' offsets).
    pub(crate) s: Vec<f32>,
    /// The codes, 32 per block.
    pub(crate) qs: Vec<i8>,
}

impl Q8Row {
    /// Quantizes `x`, whose length is a multiple of 32.
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of 32.
    pub(crate) fn new(x: &[f32]) -> Self {
        assert!(
            x.len().is_multiple_of(32),
            "int8 activations need whole blocks of 32"
        );
        let nb = x.len() / 32;
        let mut r = Self {
            d: Vec::with_capacity(nb),
            s: Vec::with_capacity(nb),
            qs: Vec::with_capacity(x.len()),
        };
        for b in x.chunks_exact(32) {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for &v in b {
                // |v·id| <= 127 up to rounding, so the cast never saturates meaningfully.
                let q = (v * id).round() as i8;
                sum += i32::from(q);
                r.qs.push(q);
            }
            r.d.push(d);
            r.s.push(d * sum as f32);
        }
        r
    }

    /// Blocks of 32.
    pub(crate) fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// `out[j] = row_j · x` for the `out.len()` contiguous rows of block type `ty` in `rows`, on
/// `isa` if this CPU has it.
///
/// # Panics
/// If `ty` is a float type or `rows` is not `out.len()` rows of `x.blocks()` groups of 32.
pub(crate) fn rows(isa: Isa, ty: GgmlType, rows: &[u8], x: &Q8Row, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = isa.simd() {
        return simd.q8_rows(ty, rows, x, out);
    }
    let rb = ty.row_bytes(32 * x.blocks()).expect("whole blocks");
    assert_eq!(rows.len(), rb * out.len(), "weight bytes");
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
        *o = dot(ty, row, x);
    }
}

/// `Σ row · x` for one stored row of block type `ty` and quantized activations, in portable
/// Rust: the exactly dequantized weights times the activations' codes times their scales. The
/// integer kernels compute the same sum up to float rounding, and are tested against it.
///
/// # Panics
/// If `ty` is a float type or `row` does not hold `x.blocks()` groups of 32.
pub(crate) fn dot(ty: GgmlType, row: &[u8], x: &Q8Row) -> f32 {
    assert!(ty.is_quantized(), "no int8-activation dot for {ty}");
    let k = 32 * x.blocks();
    assert_eq!(Some(row.len()), ty.row_bytes(k).ok(), "weight bytes");
    let mut w = vec![0f32; k];
    scalar::dequantize(ty, row, &mut w);
    let mut acc = 0f64;
    for (g, (wg, qg)) in w.chunks_exact(32).zip(x.qs.chunks_exact(32)).enumerate() {
        let sum: f64 = wg
            .iter()
            .zip(qg)
            .map(|(&w, &q)| f64::from(w) * f64::from(q))
            .sum();
        acc += sum * f64::from(x.d[g]);
    }
    acc as f32
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// A row of `k` elements of block type `ty`: random bytes, with every f16 scale (and
    /// minimum) of each block set to a small normal value.
    pub(crate) fn random_row(ty: GgmlType, k: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(747796405).wrapping_add(1);
        let mut byte = move || {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            (state >> 24) as u8
        };
        let bb = ty.block_bytes();
        let mut row: Vec<u8> = (0..k / ty.block_elems() * bb).map(|_| byte()).collect();
        let f16_fields: &[usize] = match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => &[],
        };
        for block in row.chunks_exact_mut(bb) {
            for &at in f16_fields {
                let v = half::f16::from_f32(0.002 + f32::from(block[at]) / 4000.0);
                block[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        row
    }

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32 * 2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// Codes and scales reproduce the activations within half a step per element.
    #[test]
    fn quantized_activations_are_within_half_a_step() {
        let mut x = sample(96, 7);
        x[40] = 9.0; // an outlier sets its block's scale
        x[64..96].fill(0.0); // an all-zero block
        let r = Q8Row::new(&x);
        for (i, &v) in x.iter().enumerate() {
            let back = r.d[i / 32] * f32::from(r.qs[i]);
            assert!(
                (back - v).abs() <= r.d[i / 32] * 0.5 + 1e-6,
                "{i}: {v} vs {back}"
            );
        }
        assert_eq!(r.qs[40], 127);
        assert_eq!(r.d[2], 0.0);
        let sum: i32 = r.qs[..32].iter().map(|&q| i32::from(q)).sum();
        assert!((r.s[0] - r.d[0] * sum as f32).abs() < 1e-6);
    }

    /// The int8 dot is within the activations' rounding of the exact product of the
    /// dequantized weights and the f32 activations.
    #[test]
    fn int8_dot_is_close_to_the_exact_product() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let k = 256;
            let row = random_row(ty, k, 3);
            let mut wd = vec![0f32; k];
            dequantize(ty, &row, &mut wd).expect("whole blocks");
            let x = sample(k, 11);
            let got = dot(ty, &row, &Q8Row::new(&x));
            let exact: f64 = wd.iter().zip(&x).map(|(a, b)| f64::from(a * b)).sum();
            // Each activation moves by at most half a step, d/2 = max|x|/254 in its block: a
            // bound on the error, relative to Σ|w|·max|x|, of 1/254; the errors mostly cancel.
            let scale: f64 = wd.iter().map(|w| f64::from(w.abs())).sum();
            let err = (f64::from(got) - exact).abs();
            assert!(err < scale / 254.0, "{ty}: {got} vs exact {exact}");
            assert!(
                err < scale / 2000.0,
                "{ty}: {got} vs exact {exact}: no cancellation"
            );
        }
    }
}
