//! `int-quantized` (and `naive-quantized`) integer layers: `<stem>.weight` int8 `[out, in]`, one
//! signed code per byte, `<stem>.weight_scale` float `[out, groups]` (`[out, 1]` per channel),
//! and with zero points `<stem>.weight_zero_point` int8 `[out, groups]`.
//!
//! - W8A8 (8-bit codes per channel, activations int8 per token) goes to ferrite's int8
//!   kernels ([`I8Matrix`]);
//! - any other width or grouping (W4A8, W8A16 in groups) to the weight-only layout
//!   ([`WqMatrix`]), the codes offset by `2^(bits-1)` as there.

use ferrite_kernels::w8a8::I8Matrix;
use ferrite_kernels::wq::WqMatrix;

use super::IntCodes;
use super::packed::{group_params, offset};
use crate::TensorMap;
use crate::error::{FormatError, Result};
use crate::packing::Unpacked;

/// Converts layer `<stem>` (int8 `weight`, `weight_scale`) to an [`I8Matrix`].
pub(super) fn load_linear(t: &TensorMap, stem: &str) -> Result<I8Matrix> {
    let wname = format!("{stem}.weight");
    let bad = |reason: String| FormatError::BadTensor {
        name: wname.clone(),
        reason,
    };
    let (shape, codes) = t.i8_tensor(&wname)?;
    let [rows, cols] = shape[..] else {
        return Err(bad(format!("shape {shape:?} is not 2-D")));
    };
    let sname = format!("{stem}.weight_scale");
    let scale_shape = t
        .entry(&sname)
        .ok_or_else(|| FormatError::MissingTensor(sname.clone()))?
        .shape
        .clone();
    if scale_shape != [rows, 1] && scale_shape != [rows] {
        return Err(bad(format!(
            "weight_scale has shape {scale_shape:?}, expected [{rows}, 1] (one per channel)"
        )));
    }
    let scales = t.vector(&sname)?;
    I8Matrix::from_codes(rows, cols, &codes, &scales).map_err(|e| bad(e.to_string()))
}

/// Converts layer `<stem>` (one signed code per int8 of `weight`) to a [`WqMatrix`].
pub(super) fn load_codes(t: &TensorMap, stem: &str, c: IntCodes) -> Result<WqMatrix> {
    let name = |part: &str| format!("{stem}.{part}");
    let bad = |reason: String| FormatError::BadTensor {
        name: name("weight"),
        reason,
    };
    let (shape, signed) = t.i8_tensor(&name("weight"))?;
    let [rows, cols] = shape[..] else {
        return Err(bad(format!("shape {shape:?} is not 2-D")));
    };
    let (scales, scale_type, zeros) =
        group_params(t, stem, [rows, cols], c.bits, c.group_size, c.sym)?;
    let zero = offset(c.bits);
    let codes = signed
        .iter()
        .map(|&q| {
            u8::try_from(i16::from(q) + i16::from(zero))
                .ok()
                .filter(|&u| u <= c.bits.max_code())
                .ok_or_else(|| bad(format!("code {q} does not fit {} bits", c.bits.get())))
        })
        .collect::<Result<Vec<u8>>>()?;
    let u = Unpacked {
        rows,
        cols,
        codes,
        scales,
        zeros,
    };
    u.into_wq(c.bits, c.group_size, scale_type, c.sym)
        .map_err(|e| bad(e.to_string()))
}
