//! `float-quantized` FP8 layers: `<stem>.weight` F8_E4M3 `[out, in]`, `<stem>.weight_scale`
//! float `[out, 1]` (strategy `channel`) or `[1]` (strategy `tensor`), and for static
//! activations `<stem>.input_scale` float `[1]`. Values are `e4m3(code) · scale`.

use ferrite_kernels::fp8::{Fp8Activations, Fp8Matrix};

use super::Fp8Act;
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

/// The activations an FP8 layer with `act` quantizes, given its static scale (if any).
fn fp8_activations(act: Fp8Act, static_scale: Option<f32>) -> Fp8Activations {
    match (act, static_scale) {
        (Fp8Act::StaticPerTensor, Some(s)) => Fp8Activations::Static(s),
        (Fp8Act::DynamicPerToken, _) => Fp8Activations::DynamicPerToken,
        _ => Fp8Activations::None,
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

/// One FP8 layer in `float-quantized` tensors, ready to write.
#[derive(Debug)]
pub struct Fp8Tensors {
    /// e4m3 codes `[rows, cols]`.
    pub weight: Vec<u8>,
    /// f32, `[rows, 1]` per channel or `[1]` per tensor (`scale_shape`).
    pub weight_scale: Vec<f32>,
    pub scale_shape: Vec<usize>,
    /// The static per-tensor activation scale, if the layer has one.
    pub input_scale: Option<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl Fp8Tensors {
    pub fn from_fp8(w: &Fp8Matrix) -> Self {
        let (weight_scale, scale_shape) = if w.per_tensor() {
            (w.scales()[..1].to_vec(), vec![1])
        } else {
            (w.scales().to_vec(), vec![w.rows(), 1])
        };
        Self {
            weight: w.codes().to_vec(),
            weight_scale,
            scale_shape,
            input_scale: match w.activations() {
                Fp8Activations::Static(s) => Some(s),
                _ => None,
            },
            rows: w.rows(),
            cols: w.cols(),
        }
    }
}
