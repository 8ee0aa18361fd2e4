//! compressed-tensors checkpoints (what llm-compressor writes and vLLM reads), the
//! `int-quantized` W8A8 form: a linear layer `<stem>` is
//!
//! - `<stem>.weight`: int8 `[out, in]`, symmetric codes;
//! - `<stem>.weight_scale`: float `[out, 1]` (strategy `channel`: one scale per output row);
//!
//! with `input_activations` int8, symmetric, strategy `token`, `dynamic: true`: activations
//! are quantized per token at run time, which is what ferrite's W8A8 kernels do. Other
//! compressed-tensors forms (pack-quantized W4A16, FP8, static activation scales, groups) are
//! refused with the reason.

use ferrite_kernels::w8a8::I8Matrix;
use serde_json::{Value, json};

use super::TensorMap;
use crate::error::{EngineError, Result};

/// The one compressed-tensors configuration ferrite reads and writes: int8 weights per
/// channel, int8 activations per token, dynamic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedW8A8;

impl CompressedW8A8 {
    /// Reads `quantization_config`; `Ok(None)` when there is none or it is not
    /// compressed-tensors.
    pub fn from_hf_config(cfg: &Value) -> Result<Option<Self>> {
        let Some(q) = cfg.get("quantization_config") else {
            return Ok(None);
        };
        if q.get("quant_method").and_then(Value::as_str) != Some("compressed-tensors") {
            return Ok(None);
        }
        let bad = |m: String| {
            EngineError::BadConfig(format!(
                "quantization_config (compressed-tensors): {m}; ferrite reads int-quantized W8A8 \
                 (int8 weights per channel, dynamic int8 activations per token)"
            ))
        };
        let format = q.get("format").and_then(Value::as_str).unwrap_or("");
        if format != "int-quantized" {
            return Err(bad(format!("format `{format}` is not supported")));
        }
        let groups = q
            .get("config_groups")
            .and_then(Value::as_object)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| bad("no config_groups".into()))?;
        for (name, g) in groups {
            let w = &g["weights"];
            let a = &g["input_activations"];
            let int8 = |s: &Value| s["num_bits"].as_u64() == Some(8) && s["type"] == "int";
            let ok_w = int8(w)
                && w["symmetric"].as_bool() == Some(true)
                && w["strategy"] == "channel"
                && w["dynamic"].as_bool() != Some(true);
            let ok_a = int8(a)
                && a["symmetric"].as_bool() == Some(true)
                && a["strategy"] == "token"
                && a["dynamic"].as_bool() == Some(true);
            if !ok_w || !ok_a {
                return Err(bad(format!("group `{name}` is {g}")));
            }
        }
        Ok(Some(Self))
    }

    /// The `quantization_config` ferrite writes (llm-compressor's W8A8 preset's).
    pub fn to_json() -> Value {
        json!({
            "quant_method": "compressed-tensors",
            "format": "int-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel",
                        "dynamic": false, "group_size": null, "block_structure": null,
                        "actorder": null, "observer": "minmax", "observer_kwargs": {}
                    },
                    "input_activations": {
                        "num_bits": 8, "type": "int", "symmetric": true, "strategy": "token",
                        "dynamic": true, "group_size": null, "block_structure": null,
                        "actorder": null, "observer": null, "observer_kwargs": {}
                    },
                    "output_activations": null
                }
            },
            "ignore": ["lm_head"],
            "kv_cache_scheme": null,
            "sparsity_config": {},
            "global_compression_ratio": null
        })
    }
}

/// Converts layer `<stem>` (int8 `weight`, `weight_scale`) to an [`I8Matrix`].
pub fn load_linear(t: &TensorMap, stem: &str) -> Result<I8Matrix> {
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
