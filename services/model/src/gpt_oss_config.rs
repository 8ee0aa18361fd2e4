//! gpt-oss's options as its `config.json` or a GGUF file gives them (the layer's options are
//! [`crate::config`]'s, which applies these; the experts' layout is [`crate::gpt_oss`]'s).

use ferrite_formats::gguf::GgufFile;
use serde_json::Value;

use crate::error::{ModelError, Result};

/// The experts' clamped SwiGLU: `(alpha, limit)`.
pub(crate) type Swiglu = (f32, f32);

/// What llama.cpp hard-codes for gpt-oss (its GGUF files carry neither), and transformers'
/// defaults: the released configs' values.
const DEFAULT_SWIGLU: Swiglu = (1.702, 7.0);

/// `swiglu_alpha` and `swiglu_limit`, the defaults where missing.
pub(crate) fn swiglu(cfg: &Value) -> Result<Swiglu> {
    let num = |k: &str, default: f32| match cfg.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .map(|v| v as f32)
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| ModelError::BadConfig(format!("config.json: `{k}` {v} is not > 0"))),
    };
    Ok((
        num("swiglu_alpha", DEFAULT_SWIGLU.0)?,
        num("swiglu_limit", DEFAULT_SWIGLU.1)?,
    ))
}

/// A gpt-oss GGUF file's options (llama.cpp's `gpt-oss` architecture, as its converter writes
/// it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GgufOptions {
    /// Whether the file has the attention sinks (`blk.N.attn_sinks.weight`).
    pub sinks: bool,
    /// `{arch}.attention.sliding_window` on every other layer from the first (llama.cpp's
    /// pattern for gpt-oss).
    pub windows: Vec<Option<usize>>,
    pub swiglu: Swiglu,
}

/// The options of a gpt-oss GGUF file of `num_layers` layers.
pub(crate) fn from_gguf(
    gguf: &GgufFile,
    key: &dyn Fn(&str) -> String,
    num_layers: usize,
) -> GgufOptions {
    let window = (gguf.get_u64(&key("attention.sliding_window"))).map(|w| w as usize);
    GgufOptions {
        sinks: gguf.tensors.contains("blk.0.attn_sinks.weight"),
        windows: (0..num_layers)
            .map(|i| window.filter(|_| i.is_multiple_of(2)))
            .collect(),
        swiglu: DEFAULT_SWIGLU,
    }
}
