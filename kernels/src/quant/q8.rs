//! Activations quantized to int8 per block of 32, for integer dot products with Q4_0, Q4_1 and
//! Q8_0 weight blocks: llama.cpp's arithmetic for these types (its `Q8_0`/`Q8_1` activation
//! blocks), opted into with [`GgmlActivations::Int8`].
//!
//! A block of 32 activations becomes `d = max|x| / 127` and `q = round(x / d)` in −127..=127;
//! a weight block `w = dw·qw + m` then gives `Σ w·x ≈ dw·d·Σ qw·q + m·d·Σ q`, whose inner sum is
//! exact in integers. The only error is the activations' rounding (relative ~0.4% per element,
//! mostly cancelling in the sum), which is why it is opt-in: the default f32 path keeps the
//! golden tests' agreement with transformers.

use super::{GgmlType, Isa, scalar};

/// How block-quantized GGUF weights multiply the activations of a one-token step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum GgmlActivations {
    /// f32 activations times exactly dequantized weights (the default).
    #[default]
    F32,
    /// For Q4_0, Q4_1 and Q8_0 weights: activations rounded to int8 per block of 32, integer
    /// dot products per block (other types keep f32).
    Int8,
}

impl GgmlActivations {
    /// Whether weights of `ty` take int8 activations under this setting.
    pub fn applies_to(self, ty: GgmlType) -> bool {
        self == Self::Int8 && matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
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

/// `out[j] = row_j · x` for the `out.len()` contiguous rows of `ty` (Q4_0, Q4_1 or Q8_0) in
/// `rows`, on `isa` if this CPU has it.
///
/// # Panics
/// If `ty` is another type or `rows` is not `out.len()` rows of `x.blocks()` blocks.
pub(crate) fn rows(isa: Isa, ty: GgmlType, rows: &[u8], x: &Q8Row, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx2, Some(avx2)) = (isa, super::Avx2::detect()) {
        return avx2.q8_rows(ty, rows, x, out);
    }
    let rb = x.blocks() * ty.block_bytes();
    assert_eq!(rows.len(), rb * out.len(), "weight bytes");
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
        *o = dot(ty, row, x);
    }
}

/// `Σ row · x` for one stored row of `ty` (Q4_0, Q4_1 or Q8_0) and quantized activations, in
/// portable Rust: the reference the SIMD kernel is tested against.
///
/// # Panics
/// If `ty` is another type or `row` does not hold `x.blocks()` blocks.
pub(crate) fn dot(ty: GgmlType, row: &[u8], x: &Q8Row) -> f32 {
    let bb = ty.block_bytes();
    assert_eq!(row.len(), x.blocks() * bb, "weight bytes");
    let mut acc = 0f32;
    for (g, blk) in row.chunks_exact(bb).enumerate() {
        let q = &x.qs[32 * g..32 * g + 32];
        let dw = scalar::f16_at(blk, 0);
        let (isum, offset) = match ty {
            GgmlType::Q8_0 => {
                let w = blk[2..34].iter().map(|&b| i32::from(b as i8));
                (w.zip(q).map(|(w, &q)| w * i32::from(q)).sum::<i32>(), 0.0)
            }
            GgmlType::Q4_0 => (nibble_dot(&blk[2..18], q, 8), 0.0),
            GgmlType::Q4_1 => (
                nibble_dot(&blk[4..20], q, 0),
                scalar::f16_at(blk, 2) * x.s[g],
            ),
            other => panic!("no int8-activation dot for {other}"),
        };
        acc += dw * x.d[g] * isum as f32 + offset;
    }
    acc
}

/// `Σ (nibble − zero) · q` over a block whose byte `j` holds element `j` (low nibble) and
/// element `j + 16` (high nibble).
fn nibble_dot(qs: &[u8], q: &[i8], zero: i32) -> i32 {
    let lo = qs
        .iter()
        .zip(&q[..16])
        .map(|(&b, &x)| (i32::from(b & 15) - zero) * i32::from(x));
    let hi = qs
        .iter()
        .zip(&q[16..])
        .map(|(&b, &x)| (i32::from(b >> 4) - zero) * i32::from(x));
    lo.sum::<i32>() + hi.sum::<i32>()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// A row of `k / 32` blocks of `ty` with random codes and small f16 scales (and minimums).
    pub(crate) fn random_row(ty: GgmlType, k: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(747796405).wrapping_add(1);
        let mut byte = move || {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            (state >> 24) as u8
        };
        let mut row = Vec::new();
        for _ in 0..k / 32 {
            let scale = half::f16::from_f32(0.002 + f32::from(byte()) / 4000.0);
            row.extend(scale.to_le_bytes());
            if ty == GgmlType::Q4_1 {
                let min = half::f16::from_f32(-f32::from(byte()) / 2000.0);
                row.extend(min.to_le_bytes());
            }
            let codes = if ty == GgmlType::Q8_0 { 32 } else { 16 };
            row.extend((0..codes).map(|_| byte()));
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

    /// The integer dot equals the f32 dot of the dequantized weights with the dequantized
    /// activations (so only the activations' rounding separates it from the exact path).
    #[test]
    fn int8_dot_equals_the_dot_of_both_dequantized() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let k = 128;
            let row = random_row(ty, k, 3);
            let mut wd = vec![0f32; k];
            dequantize(ty, &row, &mut wd).expect("whole blocks");
            let x = sample(k, 11);
            let r = Q8Row::new(&x);
            let xd: Vec<f32> = (0..k).map(|i| r.d[i / 32] * f32::from(r.qs[i])).collect();
            let want: f64 = wd.iter().zip(&xd).map(|(a, b)| f64::from(a * b)).sum();
            let got = dot(ty, &row, &r);
            assert!(
                (f64::from(got) - want).abs() < 1e-4,
                "{ty}: {got} vs {want}"
            );
            // And it is close to the exact f32 product: the activations' rounding only.
            let exact: f32 = wd.iter().zip(&x).map(|(a, b)| a * b).sum();
            assert!((got - exact).abs() < 0.05, "{ty}: {got} vs exact {exact}");
        }
    }
}
