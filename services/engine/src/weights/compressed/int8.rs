//! `int-quantized` W8A8 layers: `<stem>.weight` int8 `[out, in]` (symmetric codes) and
//! `<stem>.weight_scale` float `[out, 1]` (strategy `channel`), activations quantized per token
//! at run time, which is what ferrite's W8A8 kernels do.

use ferrite_kernels::w8a8::I8Matrix;

use crate::error::{EngineError, Result};
use crate::weights::TensorMap;

/// Converts layer `<stem>` (int8 `weight`, `weight_scale`) to an [`I8Matrix`].
pub(super) fn load_linear(t: &TensorMap, stem: &str) -> Result<I8Matrix> {
    let wname = format!("{stem}.weight");
    let bad = |reason: String| EngineError::BadTensor {
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
        .ok_or_else(|| EngineError::MissingTensor(sname.clone()))?
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
