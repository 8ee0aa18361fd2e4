//! Sliding-window attention as a Hugging Face `config.json` sets it, per family, with
//! transformers 5's defaults: which layers slide (`layer_types`, Qwen's `max_window_layers`,
//! Gemma 2's alternation) and how far (`sliding_window`: the most recent positions a token
//! sees, its own included).

use serde_json::Value;

use crate::error::{ModelError, Result};

/// Which family's rule a config's window follows (Gemma 2's options are its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowRule {
    Mistral,
    Mixtral,
    /// Qwen2/3 and their mixtures.
    Qwen,
    /// gpt-oss: `layer_types`, else every other layer from the first, by `sliding_window`
    /// (128 where the key is missing).
    GptOss,
    /// Llama: no window.
    None,
}

fn bad(m: String) -> ModelError {
    ModelError::BadConfig(format!("config.json: {m}"))
}

/// Each layer's window under `rule`:
/// - Mistral: every layer slides by `sliding_window` (4096 where the key is missing, as
///   transformers' `MistralConfig`; null: none). Mistral-7B-v0.1 says 4096, later ones null.
/// - Mixtral: the same, with no window where the key is missing.
/// - gpt-oss: the layers `layer_types` names slide (every other one from the first where it
///   is missing), by `sliding_window` (128 where the key is missing).
/// - Qwen2/3 and their mixtures: with `use_sliding_window`, the layers from
///   `max_window_layers` on (or those `layer_types` names) slide by `sliding_window`; without
///   it, none do.
/// - Llama: none.
pub(crate) fn windows(
    cfg: &Value,
    rule: WindowRule,
    num_layers: usize,
) -> Result<Vec<Option<usize>>> {
    let (window, default_slides): (Option<usize>, Box<dyn Fn(usize) -> bool>) = match rule {
        WindowRule::Mistral => (window_size(cfg, Some(4096))?, Box::new(|_| true)),
        WindowRule::Mixtral => (window_size(cfg, None)?, Box::new(|_| true)),
        WindowRule::GptOss => (
            window_size(cfg, Some(128))?,
            Box::new(|i: usize| i.is_multiple_of(2)),
        ),
        WindowRule::Qwen => {
            if cfg.get("use_sliding_window").and_then(Value::as_bool) != Some(true) {
                return Ok(vec![None; num_layers]);
            }
            let from = match cfg.get("max_window_layers") {
                None | Some(Value::Null) => 28,
                Some(v) => v
                    .as_u64()
                    .ok_or_else(|| bad(format!("`max_window_layers` {v} is not a count")))?
                    as usize,
            };
            (window_size(cfg, Some(4096))?, Box::new(move |i| i >= from))
        }
        WindowRule::None => return Ok(vec![None; num_layers]),
    };
    let sliding = layer_types(cfg, num_layers, default_slides)?;
    Ok(sliding.iter().map(|&s| window.filter(|_| s)).collect())
}

/// Which layers slide: `layer_types` where the config has it, else `default(layer)`.
pub(crate) fn layer_types(
    cfg: &Value,
    num_layers: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>> {
    let sliding: Vec<bool> = match cfg.get("layer_types") {
        None | Some(Value::Null) => (0..num_layers).map(default).collect(),
        Some(Value::Array(types)) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(bad(format!(
                    "layer type {t} is not supported (supported: sliding_attention, full_attention)"
                ))),
            })
            .collect::<Result<_>>()?,
        Some(other) => return Err(bad(format!("`layer_types` is not a list: {other}"))),
    };
    if sliding.len() != num_layers {
        return Err(bad(format!(
            "{} layer types for {num_layers} layers",
            sliding.len()
        )));
    }
    Ok(sliding)
}

/// `sliding_window`: `missing` where the key is absent, none where it is null, else a
/// positive count.
pub(crate) fn window_size(cfg: &Value, missing: Option<usize>) -> Result<Option<usize>> {
    Ok(match cfg.get("sliding_window") {
        None => missing,
        Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&w| w > 0)
                .ok_or_else(|| bad(format!("`sliding_window` {v} is not a positive integer")))?
                as usize,
        ),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_family_slides_as_transformers_reads_its_config() {
        let w = |cfg: Value, arch| windows(&cfg, arch, 4).expect("windows");
        let all = |x| vec![x; 4];
        // Mistral: 4096 where missing (v0.1's value), none where null.
        assert_eq!(w(json!({}), WindowRule::Mistral), all(Some(4096)));
        let null = json!({"sliding_window": null});
        assert_eq!(w(null.clone(), WindowRule::Mistral), all(None));
        assert_eq!(
            w(json!({"sliding_window": 8}), WindowRule::Mistral),
            all(Some(8))
        );
        assert_eq!(w(json!({}), WindowRule::Mixtral), all(None));
        // Qwen: only with use_sliding_window, from max_window_layers on.
        let qwen = json!({"sliding_window": 0, "use_sliding_window": false});
        assert_eq!(w(qwen, WindowRule::Qwen), all(None));
        let qwen =
            json!({"sliding_window": 16, "use_sliding_window": true, "max_window_layers": 2});
        assert_eq!(w(qwen, WindowRule::Qwen), [None, None, Some(16), Some(16)]);
        let typed = json!({"sliding_window": 16, "use_sliding_window": true,
            "layer_types": ["sliding_attention", "full_attention", "full_attention",
                            "sliding_attention"]});
        assert_eq!(w(typed, WindowRule::Qwen), [Some(16), None, None, Some(16)]);
        assert_eq!(w(json!({"sliding_window": 8}), WindowRule::None), all(None));
        // gpt-oss: sliding, full, sliding, full where layer_types is missing.
        let oss = [Some(128), None, Some(128), None];
        assert_eq!(w(json!({}), WindowRule::GptOss), oss);
        let e = windows(&json!({"sliding_window": 0}), WindowRule::Mistral, 4);
        assert!(e.is_err(), "a window of 0");
    }
}
