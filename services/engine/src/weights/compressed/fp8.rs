//! `float-quantized` FP8 layers: `<stem>.weight` F8_E4M3 `[out, in]`, `<stem>.weight_scale`
//! float `[out, 1]` (strategy `channel`) or `[1]` (strategy `tensor`), and for static
//! activations `<stem>.input_scale` float `[1]`. Values are `e4m3(code) · scale`.

use ferrite_kernels::fp8::{Fp8Activations, Fp8Matrix};

use super::{Fp8Act, fp8_activations};
use crate::error::{EngineError, Result};
use crate::weights::{IntType, TensorMap};

/// The one value of a per-tensor scale tensor `name` (shape `[]` or `[1]`).
fn scalar(t: &TensorMap, name: &str) -> Result<f32> {
    match t.vector(name)?[..] {
        [s] => Ok(s),
        ref other => Err(EngineError::BadTensor {
            name: name.to_owned(),
            reason: format!("{} values, expected one (per tensor)", other.len()),
        }),
    }
}

/// Converts layer `<stem>` to an [`Fp8Matrix`].
pub(super) fn load_linear(
    t: &TensorMap,
    stem: &str,
    per_channel: bool,
    act: Fp8Act,
) -> Result<Fp8Matrix> {
    let wname = format!("{stem}.weight");
    let bad = |reason: String| EngineError::BadTensor {
        name: wname.clone(),
        reason,
    };
    let (shape, codes) = t.int_bytes(&wname, IntType::F8E4M3)?;
    let [rows, cols] = shape[..] else {
        return Err(bad(format!("shape {shape:?} is not 2-D")));
    };
    let sname = format!("{stem}.weight_scale");
    let scales = if per_channel {
        let s = t.vector(&sname)?;
        if s.len() != rows {
            return Err(bad(format!(
                "weight_scale has {} values, expected {rows} (one per channel)",
                s.len()
            )));
        }
        s
    } else {
        vec![scalar(t, &sname)?]
    };
    let input_scale = match act {
        Fp8Act::StaticPerTensor => Some(scalar(t, &format!("{stem}.input_scale"))?),
        _ => None,
    };
    let acts = fp8_activations(act, input_scale);
    Fp8Matrix::from_codes(rows, cols, codes.to_vec(), &scales, acts).map_err(|e| bad(e.to_string()))
}

/// The tensors of FP8 layer `w` as written (`weight` codes, f32 `weight_scale` `[out, 1]` or
/// `[1]`, and `input_scale` for a static activation scale): (suffix, shape, dtype is F8, bytes).
pub fn fp8_tensors(w: &Fp8Matrix) -> Vec<(&'static str, Vec<usize>, bool, Vec<u8>)> {
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (scale_shape, scales) = if w.per_tensor() {
        (vec![1], f32_bytes(&w.scales()[..1]))
    } else {
        (vec![w.rows(), 1], f32_bytes(w.scales()))
    };
    let mut out = vec![
        ("weight", vec![w.rows(), w.cols()], true, w.codes().to_vec()),
        ("weight_scale", scale_shape, false, scales),
    ];
    if let Fp8Activations::Static(s) = w.activations() {
        out.push(("input_scale", vec![1], false, f32_bytes(&[s])));
    }
    out
}
