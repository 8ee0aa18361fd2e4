//! Reading LoRA adapters ([`LoraAdapter::load`]): a directory PEFT saved, or a GGUF adapter
//! file as llama.cpp's `convert_lora_to_gguf.py` writes one (`general.type` `adapter`,
//! `adapter.type` `lora`, `adapter.lora.alpha`; each factor as `blk.{i}.{projection}.weight.
//! lora_a` / `lora_b`, in PEFT's shapes).
//!
//! Q and K rows: llama.cpp's converter permutes the rows of each Q and K head of `llama`
//! checkpoints (and so B's rows of their adapters) for its interleaved rotary embedding, and
//! ferrite computes a GGUF `llama` model in that order ([`RopeStyle::Interleaved`]). B's rows
//! of Q and K are put in the order of the model served: a PEFT adapter's permuted for such a
//! model, a GGUF `llama` adapter's put back for a model in Hugging Face's order.

use std::ops::Range;
use std::path::Path;

use ferrite_formats::gguf::GgufFile;
use ferrite_formats::{Matrix, TensorMap};
use serde_json::Value;

use super::{Factors, LoraAdapter, Proj};
use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::tp::TpRank;

/// What of `adapter_config.json` the forward depends on, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scaling {
    r: usize,
    scale: f32,
}

fn bad(dir: &Path, why: String) -> ModelError {
    ModelError::BadConfig(format!("LoRA adapter {}: {why}", dir.display()))
}

/// The scale of the adapter whose config is `cfg`, refusing what ferrite does not apply.
fn scaling(dir: &Path, cfg: &Value) -> Result<Scaling> {
    let refuse = |why: &str| Err(bad(dir, format!("{why}, which ferrite does not apply")));
    let set = |key: &str| match cfg.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => s != "none",
        Some(_) => true,
    };
    if cfg
        .get("peft_type")
        .and_then(Value::as_str)
        .unwrap_or("LORA")
        != "LORA"
    {
        return refuse("it is not a LoRA adapter (peft_type)");
    }
    for (key, what) in [
        ("use_dora", "it is a DoRA adapter (use_dora)"),
        ("bias", "it trains biases (bias)"),
        ("lora_bias", "it trains biases (lora_bias)"),
        (
            "modules_to_save",
            "it replaces whole modules (modules_to_save)",
        ),
        ("rank_pattern", "it sets ranks per module (rank_pattern)"),
        ("alpha_pattern", "it sets alphas per module (alpha_pattern)"),
        (
            "fan_in_fan_out",
            "its factors are stored transposed (fan_in_fan_out)",
        ),
        (
            "target_parameters",
            "it adapts parameters, not modules (target_parameters)",
        ),
    ] {
        if set(key) {
            return refuse(what);
        }
    }
    let number = |key: &str| {
        cfg.get(key)
            .and_then(Value::as_f64)
            .filter(|v| *v > 0.0)
            .ok_or_else(|| bad(dir, format!("adapter_config.json has no positive `{key}`")))
    };
    let (r, alpha) = (number("r")?, number("lora_alpha")?);
    let rs = cfg.get("use_rslora").and_then(Value::as_bool) == Some(true);
    let scale = if rs { alpha / r.sqrt() } else { alpha / r };
    Ok(Scaling {
        r: r as usize,
        scale: scale as f32,
    })
}

/// `(layer, projection, is A)` of a PEFT tensor name, if it is a projection's factor.
fn peft_name(name: &str) -> Option<(usize, Proj, bool)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, factor) = rest.rsplit_once(".lora_")?;
    let is_a = match factor {
        "A.weight" => true,
        "B.weight" => false,
        _ => return None,
    };
    let proj = Proj::ALL.into_iter().find(|p| p.module() == module)?;
    Some((layer.parse().ok()?, proj, is_a))
}

/// `(layer, projection, is A)` of a GGUF adapter's tensor name, if it is a projection's factor.
fn gguf_name(name: &str) -> Option<(usize, Proj, bool)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, factor) = rest.rsplit_once(".weight.lora_")?;
    let is_a = match factor {
        "a" => true,
        "b" => false,
        _ => return None,
    };
    let proj = Proj::ALL.into_iter().find(|p| p.gguf() == module)?;
    Some((layer.parse().ok()?, proj, is_a))
}

/// The order of each head's rows of Q and K (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QkRows {
    HuggingFace,
    /// As llama.cpp's converter permutes `llama` checkpoints.
    Permuted,
}

/// An adapter's file: its tensors, how they are named and scaled, and the order of B's Q
/// and K rows.
struct Source {
    t: TensorMap,
    kind: Kind,
    qk: QkRows,
}

enum Kind {
    /// PEFT's: the rank and scale of every projection from `adapter_config.json`.
    Peft(Scaling),
    /// llama.cpp's: each projection's rank from its A, scaled by `alpha / r` (by 1 where
    /// alpha is 0, as llama.cpp does).
    Gguf { alpha: f32 },
}

impl Source {
    /// The adapter at `path`: a GGUF file, or a directory PEFT saved.
    fn open(path: &Path) -> Result<Self> {
        if path.is_file() {
            return Self::gguf(path);
        }
        let raw = std::fs::read(path.join("adapter_config.json"))
            .map_err(|e| bad(path, format!("cannot read adapter_config.json: {e}")))?;
        let cfg: Value = serde_json::from_slice(&raw)
            .map_err(|e| bad(path, format!("adapter_config.json: {e}")))?;
        let scaling = scaling(path, &cfg)?;
        let file = path.join("adapter_model.safetensors");
        Ok(Self {
            t: ferrite_formats::safetensors::open_file(&file)?,
            kind: Kind::Peft(scaling),
            qk: QkRows::HuggingFace,
        })
    }

    fn gguf(path: &Path) -> Result<Self> {
        let g = GgufFile::open(path)?;
        let (ty, adapter) = (g.get_str("general.type"), g.get_str("adapter.type"));
        if ty != Some("adapter") || adapter != Some("lora") {
            return Err(bad(
                path,
                format!(
                    "a GGUF LoRA adapter has general.type `adapter` and adapter.type `lora`, this one {ty:?} and {adapter:?}"
                ),
            ));
        }
        let alpha = g.get_f64("adapter.lora.alpha").unwrap_or(0.0) as f32;
        let qk = match g.get_str("general.architecture") {
            Some("llama") => QkRows::Permuted,
            _ => QkRows::HuggingFace,
        };
        Ok(Self {
            t: g.tensors,
            kind: Kind::Gguf { alpha },
            qk,
        })
    }

    fn parse(&self, name: &str) -> Option<(usize, Proj, bool)> {
        match self.kind {
            Kind::Peft(_) => peft_name(name),
            Kind::Gguf { .. } => gguf_name(name),
        }
    }

    /// The name of the B beside A `a_name`.
    fn b_name(&self, a_name: &str) -> String {
        match self.kind {
            Kind::Peft(_) => a_name.replace(".lora_A.", ".lora_B."),
            Kind::Gguf { .. } => format!("{}b", a_name.trim_end_matches('a')),
        }
    }

    /// The scale of factors of rank `r`; a PEFT adapter's must be its config's.
    fn scale(&self, r: usize) -> std::result::Result<f32, String> {
        match self.kind {
            Kind::Peft(s) if s.r == r => Ok(s.scale),
            Kind::Peft(s) => Err(format!("rank {r}, the config says {}", s.r)),
            Kind::Gguf { alpha: 0.0 } => Ok(1.0),
            Kind::Gguf { alpha } => Ok(alpha / r as f32),
        }
    }
}

impl LoraAdapter {
    /// The adapter at `path` (a PEFT directory or a GGUF file), called `name`, for `tp`'s
    /// shard of a model of shape `c` (the whole model's).
    pub fn load(name: &str, path: &Path, c: &ModelConfig, tp: TpRank) -> Result<Self> {
        let src = Source::open(path)?;
        let mut layers = vec![<[Option<Factors>; 7]>::default(); c.num_layers];
        let mut names: Vec<&str> = src.t.names().collect();
        names.sort();
        for n in names {
            let Some((layer, proj, is_a)) = src.parse(n) else {
                return Err(bad(
                    path,
                    format!(
                        "tensor `{n}`: ferrite applies adapters to the q, k, v, o, gate, up \
                         and down projections of the decoder layers only"
                    ),
                ));
            };
            if !is_a {
                continue;
            }
            let problem = if layer >= c.num_layers {
                Some(format!("the model has {} layers", c.num_layers))
            } else if proj.in_mlp() && c.moe.as_ref().is_some_and(|m| m.sparse_layers[layer]) {
                Some(format!("layer {layer}'s MLP is a mixture of experts"))
            } else {
                None
            };
            if let Some(why) = problem {
                return Err(bad(path, format!("tensor `{n}`: {why}")));
            }
            let f = Factors::load(&src, n, proj, c, tp).map_err(|e| bad(path, e))?;
            layers[layer][proj as usize] = Some(f);
        }
        if layers.iter().flatten().all(Option::is_none) {
            return Err(bad(path, "it holds no factors".into()));
        }
        Ok(Self {
            name: name.to_owned(),
            layers,
        })
    }
}

impl Factors {
    /// The factors of `proj` whose A is tensor `a_name` of `src`, B's Q and K rows in the
    /// order of the model of shape `c`, cut to `tp`'s shard.
    fn load(
        src: &Source,
        a_name: &str,
        proj: Proj,
        c: &ModelConfig,
        tp: TpRank,
    ) -> std::result::Result<Self, String> {
        let b_name = src.b_name(a_name);
        let (out, inp) = proj.shape(c);
        let a = src.t.matrix(a_name).map_err(|e| e.to_string())?;
        if a.cols != inp {
            return Err(format!(
                "tensor `{a_name}` has {} columns, the model's projection {inp} (an adapter of another model?)",
                a.cols
            ));
        }
        let r = a.rows;
        let scale = src
            .scale(r)
            .map_err(|e| format!("tensor `{a_name}`: {e}"))?;
        let b = (src.t.matrix(&b_name))
            .and_then(|m| m.expect_shape(&b_name, out, r))
            .map_err(|e| e.to_string())?;
        let mut b = f32_rows(&b, scale);
        let model_qk = match c.rope_style {
            RopeStyle::Interleaved => QkRows::Permuted,
            RopeStyle::Neox => QkRows::HuggingFace,
        };
        let heads = match proj {
            Proj::Q => Some(c.num_heads),
            Proj::K => Some(c.num_kv_heads),
            _ => None,
        };
        if let Some(heads) = heads.filter(|_| src.qk != model_qk) {
            b = reorder_heads(&b, r, heads, model_qk);
        }
        let rows = tp.rows(c);
        let a_cols = |part: Range<usize>| a.slice_cols(a_name, part).map_err(|e| e.to_string());
        let b_rows = |part: Range<usize>| b[part.start * r..part.end * r].to_vec();
        let (a, b) = match proj {
            Proj::Q => (f32_rows(&a, 1.0), b_rows(rows.q)),
            Proj::K | Proj::V => (f32_rows(&a, 1.0), b_rows(rows.kv)),
            Proj::Gate | Proj::Up => (f32_rows(&a, 1.0), b_rows(rows.ffn)),
            Proj::O => (f32_rows(&a_cols(rows.q)?, 1.0), b),
            Proj::Down => (f32_rows(&a_cols(rows.ffn)?, 1.0), b),
        };
        Ok(Self { r, a, b })
    }
}

/// `b`'s rows (each `r` wide), `heads` heads of them, put in the order `to` from the other.
fn reorder_heads(b: &[f32], r: usize, heads: usize, to: QkRows) -> Vec<f32> {
    let head = b.len() / r / heads.max(1);
    let half = head / 2;
    let mut out = vec![0f32; b.len()];
    for h in 0..heads {
        for i in 0..half {
            for p in 0..2 {
                // Hugging Face's row `p * half + i` of a head is the permuted one's `2i + p`.
                let (hf, permuted) = (h * head + p * half + i, h * head + 2 * i + p);
                let (from, into) = match to {
                    QkRows::Permuted => (hf, permuted),
                    QkRows::HuggingFace => (permuted, hf),
                };
                out[into * r..(into + 1) * r].copy_from_slice(&b[from * r..(from + 1) * r]);
            }
        }
    }
    out
}

/// Every row of `m` as f32, each times `scale`.
fn f32_rows(m: &Matrix, scale: f32) -> Vec<f32> {
    let mut out = vec![0f32; m.rows * m.cols];
    for (i, row) in out.chunks_exact_mut(m.cols.max(1)).enumerate() {
        m.dequantize_row(i, row);
        row.iter_mut().for_each(|v| *v *= scale);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reordering_heads_is_llama_cpps_permutation_and_back() {
        // 2 heads of 4 rows, r = 1: llama.cpp's permute takes rows 0 2 1 3 of each head.
        let hf: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let permuted = reorder_heads(&hf, 1, 2, QkRows::Permuted);
        assert_eq!(permuted, [0., 2., 1., 3., 4., 6., 5., 7.]);
        assert_eq!(reorder_heads(&permuted, 1, 2, QkRows::HuggingFace), hf);
    }

    #[test]
    fn names_of_gguf_factors_parse_and_others_do_not() {
        assert_eq!(
            gguf_name("blk.3.attn_output.weight.lora_b"),
            Some((3, Proj::O, false))
        );
        assert_eq!(
            gguf_name("blk.0.ffn_gate.weight.lora_a"),
            Some((0, Proj::Gate, true))
        );
        for other in [
            "token_embd.weight.lora_a",
            "blk.0.attn_norm.weight",
            "output.weight.lora_a",
        ] {
            assert_eq!(gguf_name(other), None, "{other}");
        }
    }

    #[test]
    fn names_of_peft_factors_parse_and_others_do_not() {
        let n = "base_model.model.model.layers.12.mlp.down_proj.lora_B.weight";
        assert_eq!(peft_name(n), Some((12, Proj::Down, false)));
        let n = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
        assert_eq!(peft_name(n), Some((0, Proj::Q, true)));
        for other in [
            "base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight",
            "base_model.model.model.layers.0.mlp.experts.0.w1.lora_A.weight",
        ] {
            assert_eq!(peft_name(other), None, "{other}");
        }
    }

    #[test]
    fn the_scale_is_alpha_over_r_or_its_root_and_the_unsupported_is_named() {
        let dir = Path::new("a");
        let s = scaling(dir, &json!({"r": 8, "lora_alpha": 16, "bias": "none"})).expect("accepted");
        assert_eq!(s, Scaling { r: 8, scale: 2.0 });
        let s =
            scaling(dir, &json!({"r": 4, "lora_alpha": 6, "use_rslora": true})).expect("accepted");
        assert_eq!(s, Scaling { r: 4, scale: 3.0 });
        let base = json!({"r": 4, "lora_alpha": 8, "modules_to_save": null, "rank_pattern": {}});
        assert!(scaling(dir, &base).is_ok());
        for (key, value, named) in [
            ("use_dora", json!(true), "DoRA"),
            ("bias", json!("lora_only"), "biases"),
            ("modules_to_save", json!(["lm_head"]), "modules_to_save"),
            ("rank_pattern", json!({"q_proj": 16}), "rank_pattern"),
            ("fan_in_fan_out", json!(true), "fan_in_fan_out"),
            ("peft_type", json!("IA3"), "not a LoRA"),
        ] {
            let mut cfg = base.clone();
            cfg[key] = value;
            let err = scaling(dir, &cfg).expect_err("refused").to_string();
            assert!(err.contains(named), "{key}: {err}");
        }
        let no_r = json!({"lora_alpha": 8});
        let err = scaling(dir, &no_r).expect_err("no r").to_string();
        assert!(err.contains("`r`"), "{err}");
    }
}
