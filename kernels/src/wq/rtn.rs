//! Round-to-nearest (RTN) quantization: each group's scale from its own range, no calibration.

use rayon::prelude::*;

use super::{WqError, WqFormat, WqMatrix};

/// Quantizes the row-major `[rows, cols]` matrix `w` to `format`, group by group:
///
/// - asymmetric: the group's range widened to include 0, `scale = (hi - lo) / (2^bits - 1)`,
///   `zero = round(-lo / scale)`. A zero point of 0 is avoided (the range is stretched one step
///   below 0), because the GPTQ v1 on-disk format stores `zero - 1` in `bits` bits.
/// - symmetric: llama.cpp's Q4_0 rule: the element of largest magnitude `m` maps exactly to
///   code 0 (`scale = m / -2^(bits-1)`, so the scale's sign follows `m`); values of the other
///   sign reach `2^(bits-1) - 1` codes and clip within one step.
///
/// Codes are rounded against the scale as stored (rounded to the scale type), so
/// dequantizing reproduces `scale * (q - zero)` exactly; asymmetric scales are rounded up so
/// the group's range stays covered. Error: at most half a step (asymmetric) or one step
/// (symmetric, the clipped side) per element.
pub fn quantize_rtn(
    w: &[f32],
    rows: usize,
    cols: usize,
    format: WqFormat,
) -> Result<WqMatrix, WqError> {
    format.check_cols(cols)?;
    if w.len() != rows * cols {
        return Err(WqError::Shape(format!(
            "{} values are not a {rows}x{cols} matrix",
            w.len()
        )));
    }
    if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
        return Err(WqError::Value(format!("weight {bad} is not finite")));
    }
    let g = format.group_len(cols);
    let per_row = format.groups_per_row(cols);
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![0f32; rows * per_row];
    let mut zeros = vec![0u8; rows * per_row];
    codes
        .par_chunks_mut(cols)
        .zip(scales.par_chunks_mut(per_row))
        .zip(zeros.par_chunks_mut(per_row))
        .zip(w.par_chunks(cols))
        .for_each(|(((q, s), z), w)| {
            for (((q, s), z), w) in q.chunks_mut(g).zip(s).zip(z).zip(w.chunks(g)) {
                (*s, *z) = if format.zero_point {
                    asymmetric_group(w, format, q)
                } else {
                    symmetric_group(w, format, q)
                };
            }
        });
    let zeros = format.zero_point.then_some(&zeros[..]);
    WqMatrix::from_codes(format, rows, cols, &codes, &scales, zeros)
}

/// One group's quantization grid: `w = scale * (q - zero)`, `q` in `0..=2^bits - 1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupGrid {
    /// Already rounded to the format's scale type; 0 for an all-zero group.
    pub scale: f32,
    pub zero: u8,
    pub max_code: u8,
}

impl GroupGrid {
    /// The grid [`quantize_rtn`] gives the group `w` (the rules in its doc comment). GPTQ
    /// (`ferrite-quantize`'s `gptq`) uses the same rule, so both write the same kinds of groups.
    pub fn for_group(w: &[f32], format: WqFormat) -> Self {
        let (scale, zero) = if format.zero_point {
            asymmetric_params(w, format)
        } else {
            symmetric_params(w, format)
        };
        Self {
            scale,
            zero,
            max_code: format.bits.max_code(),
        }
    }

    /// The code of `x` on this grid (f64, so GPTQ's error feedback keeps its precision).
    pub fn code(&self, x: f64) -> u8 {
        if self.scale == 0.0 {
            return self.zero;
        }
        ((x / f64::from(self.scale)).round() + f64::from(self.zero))
            .clamp(0.0, f64::from(self.max_code)) as u8
    }

    /// The value code `q` stands for.
    pub fn value(&self, q: u8) -> f64 {
        f64::from(self.scale) * (f64::from(q) - f64::from(self.zero))
    }
}

fn asymmetric_group(w: &[f32], format: WqFormat, q: &mut [u8]) -> (f32, u8) {
    let grid = GroupGrid::for_group(w, format);
    for (q, &x) in q.iter_mut().zip(w) {
        *q = grid.code(f64::from(x));
    }
    (grid.scale, grid.zero)
}

fn asymmetric_params(w: &[f32], format: WqFormat) -> (f32, u8) {
    let maxq = f32::from(format.bits.max_code());
    let lo = w.iter().copied().fold(0f32, f32::min);
    let hi = w.iter().copied().fold(0f32, f32::max);
    // Rounded up, so `scale * maxq` still covers `hi - lo` and no element clips by more than
    // half a step.
    let round = |s: f32| {
        let limit = format.scale_type.max();
        if s >= limit {
            limit
        } else {
            format.scale_type.round_up(s)
        }
    };
    let mut scale = round((hi - lo) / maxq);
    if scale == 0.0 {
        return (0.0, 1);
    }
    let mut zero = (-lo / scale).round();
    if zero < 1.0 {
        // All of the group sits at or above ~0: spend one code below zero.
        scale = round(hi / (maxq - 1.0));
        zero = 1.0;
    }
    (scale, zero.clamp(1.0, maxq) as u8)
}

fn symmetric_group(w: &[f32], format: WqFormat, q: &mut [u8]) -> (f32, u8) {
    let grid = GroupGrid::for_group(w, format);
    for (q, &x) in q.iter_mut().zip(w) {
        *q = grid.code(f64::from(x));
    }
    (grid.scale, grid.zero)
}

fn symmetric_params(w: &[f32], format: WqFormat) -> (f32, u8) {
    let zero = format.fixed_zero();
    let m = w
        .iter()
        .copied()
        .fold(0f32, |m, x| if x.abs() > m.abs() { x } else { m });
    // The magnitude rounded up, so the clipped side stays within one step.
    let magnitude = (m.abs() / f32::from(zero)).min(format.scale_type.max());
    let scale = -m.signum() * format.scale_type.round_up(magnitude);
    if scale == 0.0 {
        return (0.0, zero);
    }
    (scale, zero)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of weights with a few outliers.
    fn weights(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = (s as f32 / u32::MAX as f32) - 0.5;
                if i % 97 == 0 { u * 0.8 } else { u * 0.1 }
            })
            .collect()
    }

    #[test]
    fn every_element_is_within_its_step() {
        // 576 = 4 * 128 + 64: the g128 formats end each row with a short group.
        let (rows, cols) = (6, 576);
        let w = weights(rows * cols, 7);
        for name in [
            "w8g32",
            "w8pc",
            "w4g128",
            "w4g64-sym",
            "w2g64",
            "w2g32-sym",
            "w4pc-bf16",
        ] {
            let format: WqFormat = name.parse().expect("format");
            let m = quantize_rtn(&w, rows, cols, format).expect("quantize");
            let deq = m.dequantize();
            let g = format.group_len(cols);
            let per_row = format.groups_per_row(cols);
            let steps = if format.zero_point { 0.5 } else { 1.0 };
            for (i, (&a, &b)) in w.iter().zip(&deq).enumerate() {
                let s = m.scales()[(i / cols) * per_row + (i % cols) / g].abs();
                assert!(
                    (a - b).abs() <= s * steps * 1.0001 + 1e-7,
                    "{name}: element {i}: {a} became {b} (step {s})"
                );
            }
            // Zero points fit GPTQ v1 (stored minus one).
            assert!(m.zeros().iter().all(|&z| z >= 1), "{name}");
        }
    }

    #[test]
    fn more_bits_means_less_error() {
        let (rows, cols) = (8, 512);
        let w = weights(rows * cols, 3);
        let err = |name: &str| {
            let m = quantize_rtn(&w, rows, cols, name.parse().expect("format")).expect("quantize");
            let d = m.dequantize();
            w.iter().zip(&d).map(|(a, b)| (a - b).powi(2)).sum::<f32>()
        };
        assert!(err("w8g128") < err("w4g128") / 100.0);
        assert!(err("w4g128") < err("w2g128") / 4.0);
        assert!(err("w4g32") < err("w4pc"));
    }

    #[test]
    fn zero_and_constant_groups_survive() {
        let format: WqFormat = "w4g32".parse().expect("format");
        let mut w = vec![0f32; 64];
        w[32..].fill(0.25);
        let m = quantize_rtn(&w, 1, 64, format).expect("quantize");
        let d = m.dequantize();
        assert_eq!(d[..32], w[..32], "a zero group stays zero");
        assert!(d[32..].iter().all(|v| (v - 0.25).abs() < 1e-3), "{d:?}");
        let bad = quantize_rtn(&[f32::NAN; 32], 1, 32, format);
        assert!(bad.is_err());
    }
}
