//! GGUF's Q8_0 and Q4_0 blocks in the weight-only layout, so GGUF models stay quantized on the
//! GPU (repacked at load, exactly: no value changes).
//!
//! Both are symmetric formats with groups of 32 and an f16 scale `d` per block: Q8_0 stores
//! signed bytes `q` with `w = d·q`, which is `w8g32-sym` with code `q + 128` (its fixed zero);
//! Q4_0 stores nibbles `q` with `w = d·(q - 8)`, which is `w4g32-sym` as is. Only the nibble
//! order differs: a Q4_0 block keeps weight `j` in the low nibble of byte `j` and weight
//! `j + 16` in its high nibble.
//!
//! Q4_1, Q4_K, Q5_K and Q6_K have float minimums or 6-bit sub-scales that the integer zero
//! points of these formats cannot express exactly; they are dequantized instead.

use half::f16;

use super::{Bits, ScaleType, WqError, WqFormat, WqMatrix};
use crate::quant::GgmlType;

/// `bytes` (a `[rows, cols]` tensor of `ty`) as a weight-only matrix, or `None` when `ty` has
/// no exact equivalent.
pub fn from_gguf(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Option<Result<WqMatrix, WqError>> {
    let (bits, block_bytes) = match ty {
        GgmlType::Q8_0 => (Bits::B8, 34),
        GgmlType::Q4_0 => (Bits::B4, 18),
        _ => return None,
    };
    Some(repack(ty, bits, block_bytes, rows, cols, bytes))
}

fn repack(
    ty: GgmlType,
    bits: Bits,
    block_bytes: usize,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Result<WqMatrix, WqError> {
    if !cols.is_multiple_of(32) || bytes.len() != rows * cols / 32 * block_bytes {
        return Err(WqError::Shape(format!(
            "{ty} tensor [{rows}, {cols}]: {} bytes, expected {}",
            bytes.len(),
            rows * cols.div_ceil(32) * block_bytes
        )));
    }
    let format = WqFormat {
        bits,
        group_size: Some(32),
        zero_point: false,
        scale_type: ScaleType::F16,
    };
    let blocks = rows * cols / 32;
    let mut codes = Vec::with_capacity(rows * cols);
    let mut scales = Vec::with_capacity(blocks);
    for block in bytes.chunks_exact(block_bytes) {
        scales.push(f16::from_le_bytes([block[0], block[1]]).to_f32());
        let qs = &block[2..];
        match bits {
            // i8 → u8 with the fixed zero 128.
            Bits::B8 => codes.extend(qs.iter().map(|&q| (q as i8 as i16 + 128) as u8)),
            _ => {
                codes.extend(qs.iter().map(|&b| b & 0x0F));
                codes.extend(qs.iter().map(|&b| b >> 4));
            }
        }
    }
    WqMatrix::from_codes(format, rows, cols, &codes, &scales, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// `n` blocks with scales of both signs and varied code patterns.
    fn blocks(n: usize, block_bytes: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|b| {
                let d = f16::from_f32((b as f32 - 3.5) * 0.013).to_le_bytes();
                let qs = (0..block_bytes - 2).map(move |i| (b * 31 + i * 17) as u8);
                d.into_iter().chain(qs).collect::<Vec<u8>>()
            })
            .collect()
    }

    /// Repacking changes no value: the weight-only matrix dequantizes to exactly what GGUF's
    /// own dequantization gives.
    #[test]
    fn q8_0_and_q4_0_repack_exactly() {
        let (rows, cols) = (5, 96);
        for (ty, block_bytes) in [(GgmlType::Q8_0, 34), (GgmlType::Q4_0, 18)] {
            let bytes = blocks(rows * cols / 32, block_bytes);
            let m = from_gguf(ty, rows, cols, &bytes)
                .expect("supported")
                .expect("repack");
            let mut want = vec![0f32; rows * cols];
            dequantize(ty, &bytes, &mut want).expect("dequantize");
            assert_eq!(m.dequantize(), want, "{ty}");
        }
        assert!(from_gguf(GgmlType::Q4_1, rows, cols, &[]).is_none());
        let short = from_gguf(GgmlType::Q8_0, rows, cols, &[0; 10]).expect("supported");
        assert!(short.is_err());
    }
}
