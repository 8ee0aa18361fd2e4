//! MXFP4 (the OCP microscaling format's FP4), as OpenAI publishes gpt-oss's experts:
//! `<name>_blocks` `[..., rows, cols / 32, 16]` U8, two e2m1 codes a byte (the low nibble the
//! earlier column), and `<name>_scales` `[..., rows, cols / 32]` U8, one power-of-two exponent
//! biased by 127 (E8M0) for each run of 32 codes. A value is `e2m1(code) · 2^(e − 127)`.
//!
//! ferrite computes with the blocks as they are (ggml's `MXFP4` type: the kernels look each
//! code up, 17 bytes per 32 weights as in the checkpoint); at load only the nibbles of each run
//! are put in ggml's order (weight `j` low in byte `j`, `j + 16` high), and the rows a rank or
//! a projection needs picked out.

use std::sync::Arc;

use ferrite_kernels::cpu::matmul::WeightView;
use ferrite_kernels::quant::GgmlType;

use super::{Matrix, Storage};
use crate::error::{FormatError, Result};

/// Codes per shared exponent.
pub const BLOCK: usize = 32;

/// Rows `picks` (in that order) of the MXFP4 matrix of `cols` columns held in `blocks` and
/// `scales` (see the module's doc), as a matrix of ggml's `MXFP4` blocks. `name` names the
/// tensor in errors.
pub fn rows(
    name: &str,
    blocks: &[u8],
    scales: &[u8],
    cols: usize,
    picks: &[usize],
) -> Result<Matrix> {
    let bad = |reason: String| FormatError::BadTensor {
        name: name.to_owned(),
        reason,
    };
    let runs = cols / BLOCK;
    if cols == 0 || !cols.is_multiple_of(BLOCK) || blocks.len() != scales.len() * (BLOCK / 2) {
        return Err(bad(format!(
            "{} code bytes and {} exponents are not MXFP4 rows of {cols} columns",
            blocks.len(),
            scales.len()
        )));
    }
    let total = scales.len() / runs;
    if let Some(r) = picks.iter().find(|&&r| r >= total) {
        return Err(bad(format!("row {r} of {total}")));
    }
    let mut out = Vec::with_capacity(picks.len() * runs * GgmlType::MXFP4.block_bytes());
    for &r in picks {
        let codes = blocks[r * cols / 2..(r + 1) * cols / 2].chunks_exact(BLOCK / 2);
        for (run, &e) in codes.zip(&scales[r * runs..(r + 1) * runs]) {
            if e == 255 {
                return Err(bad(format!("row {r}: exponent 255 (E8M0's NaN)")));
            }
            // Code k is byte k / 2's low nibble for even k, its high one for odd k.
            let code = |k: usize| (run[k / 2] >> (4 * (k % 2))) & 15;
            out.push(e);
            out.extend((0..BLOCK / 2).map(|j| code(j) | (code(j + BLOCK / 2) << 4)));
        }
    }
    let ty = GgmlType::MXFP4;
    WeightView::new(ty, picks.len(), cols, &out).map_err(|e| bad(e.to_string()))?;
    Ok(Matrix {
        rows: picks.len(),
        cols,
        storage: Storage::Owned {
            ty,
            bytes: Arc::from(out),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rows of 32 codes, every code once each way round, under exponents 2^2 and f32's
    /// subnormal 2^-126 (e = 1).
    fn codes() -> (Vec<u8>, Vec<u8>) {
        let row: Vec<u8> = (0..16u8).map(|i| i | ((15 - i) << 4)).collect();
        let blocks = [row.clone(), row].concat();
        (blocks, vec![127 + 2, 1])
    }

    /// Column `col` of a row as the checkpoint holds it: the low nibble the earlier column.
    fn want(blocks: &[u8], e: u8, col: usize) -> f32 {
        let b = blocks[col / 2];
        let c = if col.is_multiple_of(2) {
            b & 15
        } else {
            b >> 4
        };
        let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let sign = if c >= 8 { -1.0 } else { 1.0 };
        sign * e2m1[usize::from(c % 8)] * 2f64.powi(i32::from(e) - 127) as f32
    }

    #[test]
    fn rows_keep_every_value_in_ggml_order() {
        let (blocks, scales) = codes();
        let m = rows("w", &blocks, &scales, 32, &[1, 0]).expect("rows");
        assert_eq!(m.storage_name(), "MXFP4");
        assert_eq!(m.bytes_len(), 2 * 17, "the checkpoint's bytes");
        let mut got = vec![0f32; 32];
        for (i, (r, e)) in [(1, 1), (0, 129)].into_iter().enumerate() {
            m.dequantize_row(i, &mut got);
            for (col, g) in got.iter().enumerate() {
                assert_eq!(*g, want(&blocks[16 * r..], e, col), "row {r} column {col}");
            }
        }
    }

    #[test]
    fn bad_shapes_rows_and_nan_exponents_are_refused() {
        let (blocks, scales) = codes();
        let e = rows("w", &blocks, &scales, 48, &[0]).expect_err("48 columns");
        assert!(e.to_string().contains("not MXFP4 rows"), "{e}");
        let e = rows("w", &blocks, &scales, 32, &[2]).expect_err("row 2");
        assert!(e.to_string().contains("row 2 of 2"), "{e}");
        let e = rows("w", &blocks, &[127, 255], 32, &[1]).expect_err("NaN");
        assert!(e.to_string().contains("NaN"), "{e}");
    }
}
