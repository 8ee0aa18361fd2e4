//! Llama-shaped families with one twist each, as options of the one forward, read from
//! `config.json` (transformers 5's defaults for a missing key) or from GGUF metadata
//! (llama.cpp's):
//!
//! - SmolLM3: some layers rotate nothing (NoPE): `no_rope_layers` (1: the layer rotates),
//!   else every `no_rope_layer_interval`-th (4) layer does not. llama.cpp's `smollm3` has no key
//!   for it: every fourth layer, always. With `use_sliding_window`, the layers `layer_types`
//!   names slide (by default the NoPE ones), as transformers reads its config.
//! - Granite (3.x): four multipliers: the embeddings (`embedding_multiplier`), each residual
//!   branch before its add (`residual_multiplier`), the attention scores in place of
//!   `1/sqrt(head_dim)` (`attention_multiplier`), and a divisor of the logits
//!   (`logits_scaling`); GGUF's `embedding_scale`, `residual_scale`, `attention.scale` and
//!   `logit_scale`.

use ferrite_formats::gguf::GgufFile;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::window;

/// SmolLM3's default: every fourth layer has no rotary embedding.
const NOPE_INTERVAL: usize = 4;

/// Granite's four multipliers, each 1 (the attention scale `1/sqrt(head_dim)`) where a family
/// has none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scales {
    pub embedding: f32,
    pub residual: f32,
    pub attention: f32,
    pub logits_divisor: f32,
}

fn bad(m: String) -> ModelError {
    ModelError::BadConfig(format!("config.json: {m}"))
}

/// Whether each layer rotates q and k where no config says: all but every `interval`-th.
fn every_but(interval: usize, num_layers: usize) -> Vec<bool> {
    (0..num_layers)
        .map(|i| !(i + 1).is_multiple_of(interval))
        .collect()
}

/// SmolLM3's rotating layers from its `config.json`.
pub(crate) fn smollm3_rotates(cfg: &Value, num_layers: usize) -> Result<Vec<bool>> {
    let rotates = match cfg.get("no_rope_layers") {
        None | Some(Value::Null) => {
            let interval = match cfg.get("no_rope_layer_interval") {
                None | Some(Value::Null) => NOPE_INTERVAL,
                Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    bad(format!(
                        "`no_rope_layer_interval` {v} is not a positive count"
                    ))
                })? as usize,
            };
            every_but(interval, num_layers)
        }
        Some(Value::Array(flags)) => flags
            .iter()
            .map(|f| match f.as_u64() {
                Some(0) => Ok(false),
                Some(1) => Ok(true),
                _ => Err(bad(format!("`no_rope_layers` holds {f}, not 0 or 1"))),
            })
            .collect::<Result<_>>()?,
        Some(other) => return Err(bad(format!("`no_rope_layers` is not a list: {other}"))),
    };
    if rotates.len() != num_layers {
        return Err(bad(format!(
            "{} `no_rope_layers` for {num_layers} layers",
            rotates.len()
        )));
    }
    Ok(rotates)
}

/// SmolLM3's windows: none without `use_sliding_window`; with it, the layers `layer_types`
/// names (by default those that do not rotate) slide by `sliding_window`.
pub(crate) fn smollm3_windows(cfg: &Value, rotates: &[bool]) -> Result<Vec<Option<usize>>> {
    if cfg.get("use_sliding_window").and_then(Value::as_bool) != Some(true) {
        return Ok(vec![None; rotates.len()]);
    }
    let size = window::window_size(cfg, None)?;
    let sliding = window::layer_types(cfg, rotates.len(), |i| size.is_some() && !rotates[i])?;
    Ok(sliding.iter().map(|&s| size.filter(|_| s)).collect())
}

/// SmolLM3's rotating layers in a GGUF file: llama.cpp's rule, every fourth layer is NoPE.
pub(crate) fn smollm3_rotates_gguf(num_layers: usize) -> Vec<bool> {
    every_but(NOPE_INTERVAL, num_layers)
}

/// Granite's multipliers from its `config.json` (transformers' defaults: 1, and for the
/// attention `1/sqrt(head_dim)`).
pub(crate) fn granite_from_hf(cfg: &Value, head_dim: usize) -> Result<Scales> {
    let read = |key: &str, default: f32| -> Result<f32> {
        match cfg.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| bad(format!("`{key}` {v} is not a number"))),
        }
    };
    Ok(Scales {
        embedding: read("embedding_multiplier", 1.0)?,
        residual: read("residual_multiplier", 1.0)?,
        attention: read("attention_multiplier", 1.0 / (head_dim as f32).sqrt())?,
        logits_divisor: read("logits_scaling", 1.0)?,
    })
}

/// Granite's multipliers from GGUF metadata, as llama.cpp's converter writes them.
pub(crate) fn granite_from_gguf(
    gguf: &GgufFile,
    key: &dyn Fn(&str) -> String,
    head_dim: usize,
) -> Scales {
    let read = |k: &str, default: f32| gguf.get_f64(&key(k)).map_or(default, |v| v as f32);
    Scales {
        embedding: read("embedding_scale", 1.0),
        residual: read("residual_scale", 1.0),
        attention: read("attention.scale", 1.0 / (head_dim as f32).sqrt()),
        logits_divisor: read("logit_scale", 1.0),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn smollm3_rotates_as_transformers_reads_its_config() {
        let r = |cfg: Value| smollm3_rotates(&cfg, 8).expect("rotates");
        let fourth = [true, true, true, false, true, true, true, false];
        assert_eq!(r(json!({})), fourth);
        assert_eq!(r(json!({"no_rope_layers": null})), fourth);
        let third = [true, true, false, true, true, false, true, true];
        assert_eq!(r(json!({"no_rope_layer_interval": 3})), third);
        let listed = json!({"no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 0]});
        assert_eq!(
            r(listed),
            [false, true, true, true, true, true, true, false]
        );
        assert_eq!(smollm3_rotates_gguf(8), fourth);
        for bad in [
            json!({"no_rope_layers": [1, 1]}),
            json!({"no_rope_layers": [2, 1, 1, 1, 1, 1, 1, 1]}),
            json!({"no_rope_layers": "all"}),
            json!({"no_rope_layer_interval": 0}),
        ] {
            assert!(smollm3_rotates(&bad, 8).is_err(), "{bad}");
        }
        // Windows: only with use_sliding_window, on the NoPE layers unless layer_types says.
        let w = |cfg: Value| smollm3_windows(&cfg, &fourth).expect("windows");
        assert_eq!(w(json!({"sliding_window": 16})), [None; 8]);
        let on = json!({"use_sliding_window": true, "sliding_window": 16});
        let nope = [None, None, None, Some(16), None, None, None, Some(16)];
        assert_eq!(w(on), nope);
        assert_eq!(w(json!({"use_sliding_window": true})), [None; 8]);
    }

    #[test]
    fn granite_scales_default_to_llamas() {
        let s = granite_from_hf(&json!({}), 64).expect("scales");
        assert_eq!(
            s,
            Scales {
                embedding: 1.0,
                residual: 1.0,
                attention: 0.125,
                logits_divisor: 1.0
            }
        );
        let cfg = json!({"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
            "attention_multiplier": 0.015625, "logits_scaling": 8.0});
        let s = granite_from_hf(&cfg, 64).expect("scales");
        assert_eq!((s.embedding, s.residual), (12.0, 0.22));
        assert_eq!((s.attention, s.logits_divisor), (0.015625, 8.0));
        assert!(granite_from_hf(&json!({"logits_scaling": "8"}), 64).is_err());
    }
}
