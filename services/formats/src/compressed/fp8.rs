//! FP8 layers: `<stem>.weight` F8_E4M3 `[out, in]` and its scales, float `[out, 1]` (strategy
//! `channel`), `[1]` (strategy `tensor`) or `[⌈out / block rows⌉, ⌈in / block cols⌉]`
//! (strategy `block`), named `weight_scale` in compressed-tensors' `float-quantized` and
//! `weight_scale_inv` in transformers' `fp8` format; for static activations
//! `<stem>.input_scale` float `[1]`. Values are `e4m3(code) · scale`.

use ferrite_kernels::fp8::{Fp8Activations, Fp8Matrix, Fp8Scales};

use super::Fp8Act;
use crate::error::{FormatError, Result};
use crate::{IntType, TensorMap};

/// The one value of a per-tensor scale tensor `name` (shape `[]` or `[1]`).
fn scalar(t: &TensorMap, name: &str) -> Result<f32> {
    match t.vector(name)?[..] {
        [s] => Ok(s),
        ref other => Err(FormatError::BadTensor {
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
        (Fp8Act::DynamicPerGroup(g), _) => Fp8Activations::DynamicPerGroup(g),
        _ => Fp8Activations::None,
    }
}

/// Converts layer `<stem>` (its scales in `<stem>.<scale_name>`, laid out as `layout` says)
/// to an [`Fp8Matrix`].
pub(crate) fn load_linear(
    t: &TensorMap,
    stem: &str,
    scale_name: &str,
    layout: Fp8Scales,
    act: Fp8Act,
) -> Result<Fp8Matrix> {
    let wname = format!("{stem}.weight");
    let bad = |reason: String| FormatError::BadTensor {
        name: wname.clone(),
        reason,
    };
    let (shape, codes) = t.int_bytes(&wname, IntType::F8E4M3)?;
    let [rows, cols] = shape[..] else {
        return Err(bad(format!("shape {shape:?} is not 2-D")));
    };
    let sname = format!("{stem}.{scale_name}");
    let scales = match layout {
        Fp8Scales::Tensor => vec![scalar(t, &sname)?],
        Fp8Scales::Channel | Fp8Scales::Block { .. } => t.vector(&sname)?,
    };
    let (gr, gc) = layout.grid(rows, cols);
    let stored = t.entry(&sname).map(|e| e.shape.clone()).unwrap_or_default();
    // A grid stored transposed has the right count: its shape is checked too.
    let shape_ok = match layout {
        Fp8Scales::Block { .. } => stored == [gr, gc],
        _ => true,
    };
    if scales.len() != gr * gc || !shape_ok {
        return Err(bad(format!(
            "{scale_name} has shape {stored:?}, expected {gr}x{gc} (weights {}, shape \
             {rows}x{cols})",
            super::describe_fp8_scales(layout)
        )));
    }
    let input_scale = match act {
        Fp8Act::StaticPerTensor => Some(scalar(t, &format!("{stem}.input_scale"))?),
        _ => None,
    };
    let acts = fp8_activations(act, input_scale);
    Fp8Matrix::from_codes(rows, cols, codes.to_vec(), &scales, layout, acts)
        .map_err(|e| bad(e.to_string()))
}

/// One FP8 layer in `float-quantized` tensors, ready to write.
#[derive(Debug)]
pub struct Fp8Tensors {
    /// e4m3 codes `[rows, cols]`.
    pub weight: Vec<u8>,
    /// f32, `[rows, 1]` per channel, `[1]` per tensor or the block grid (`scale_shape`).
    pub weight_scale: Vec<f32>,
    pub scale_shape: Vec<usize>,
    /// The static per-tensor activation scale, if the layer has one.
    pub input_scale: Option<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl Fp8Tensors {
    pub fn from_fp8(w: &Fp8Matrix) -> Self {
        let scale_shape = match w.layout() {
            Fp8Scales::Tensor => vec![1],
            Fp8Scales::Channel => vec![w.rows(), 1],
            l @ Fp8Scales::Block { .. } => {
                let (gr, gc) = l.grid(w.rows(), w.cols());
                vec![gr, gc]
            }
        };
        let weight_scale = w.scales().to_vec();
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
