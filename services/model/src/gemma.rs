//! Gemma 2 and Gemma 3 as options of the one forward, read from `config.json` (transformers
//! 5's defaults for a missing key) or from GGUF metadata (llama.cpp's):
//!
//! - both: GeGLU, `1 + w` RMSNorm weights, norms after attention and MLP too, embeddings
//!   scaled by `sqrt(hidden)`, `query_pre_attn_scalar^-0.5` attention scale, sliding-window
//!   layers;
//! - Gemma 2: soft-capped attention scores and logits (50, 30), every other layer slides;
//! - Gemma 3: no soft caps, an RMSNorm on each head of Q and K, five sliding layers to one
//!   full, and two rotary bases: the full layers' (`rope_theta`, with its scaling) and the
//!   sliding layers' own (`rope_local_base_freq`, 10 000, unscaled).

use ferrite_formats::gguf::GgufFile;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::window;

/// Which Gemma.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gemma {
    Two,
    Three,
}

/// What a Gemma sets beyond the Llama family's shape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GemmaOptions {
    pub embedding_scale: f32,
    pub norm_weight_offset: f32,
    pub attention_scale: f32,
    pub attn_logit_softcap: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    pub attention_window: Vec<Option<usize>>,
    pub qk_norm: bool,
    /// Gemma 3: the sliding layers' rotary base.
    pub local_rope_theta: Option<f32>,
}

/// What a Gemma's shape needs to know of the Llama family's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub head_dim: usize,
}

impl Gemma {
    /// Whether layer `i` slides where the config does not say: Gemma 2's even layers;
    /// Gemma 3's all but every `pattern`-th (transformers' `sliding_window_pattern`, 6).
    fn slides(self, pattern: usize) -> impl Fn(usize) -> bool {
        move |i| match self {
            Gemma::Two => i.is_multiple_of(2),
            Gemma::Three => !(i + 1).is_multiple_of(pattern),
        }
    }

    fn default_caps(self) -> (Option<f64>, Option<f64>) {
        match self {
            Gemma::Two => (Some(50.0), Some(30.0)),
            Gemma::Three => (None, None),
        }
    }
}

/// A multimodal Gemma 3's `text_config` as a text-only `Gemma3ForCausalLM` config: the hub's
/// name only what differs from transformers' `Gemma3TextConfig`, whose defaults fill the rest.
pub(crate) fn text_config(cfg: &Value) -> Result<Value> {
    let Some(Value::Object(text)) = cfg.get("text_config") else {
        return Err(bad(
            "a Gemma3ForConditionalGeneration config without `text_config`".into(),
        ));
    };
    let mut out = serde_json::json!({
        "architectures": ["Gemma3ForCausalLM"], "vocab_size": 262_208, "hidden_size": 2304,
        "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0, "max_position_embeddings": 131_072,
        "hidden_activation": "gelu_pytorch_tanh",
    });
    for (k, v) in text {
        out[k.as_str()] = v.clone();
    }
    out["architectures"] = serde_json::json!(["Gemma3ForCausalLM"]);
    Ok(out)
}

fn bad(m: String) -> ModelError {
    ModelError::BadConfig(format!("config.json: {m}"))
}

/// A Gemma as transformers 5 reads its `config.json`.
pub(crate) fn from_hf(cfg: &Value, g: Gemma, s: Shape) -> Result<GemmaOptions> {
    // A missing key takes `default`; null turns the option off.
    let number = |k: &str, default: Option<f64>| -> Result<Option<f64>> {
        match cfg.get(k) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(format!("`{k}` is not a number: {v}"))),
        }
    };
    let flag = |k: &str| cfg.get(k).and_then(Value::as_bool) == Some(true);
    if flag("attention_bias") {
        // It would also put a bias on the output projection, which this forward lacks.
        return Err(bad("Gemma with `attention_bias` is not supported".into()));
    }
    if flag("use_bidirectional_attention") {
        return Err(bad("bidirectional attention is not supported".into()));
    }
    let scalar = number("query_pre_attn_scalar", Some(256.0))?
        .ok_or_else(|| bad("`query_pre_attn_scalar` is null".into()))?;
    let (attn_cap, final_cap) = g.default_caps();
    let pattern = match cfg.get("sliding_window_pattern").and_then(Value::as_u64) {
        Some(p @ 1..) => p as usize,
        _ => 6,
    };
    let sliding = window::layer_types(cfg, s.num_layers, g.slides(pattern))?;
    let window = window::window_size(cfg, Some(4096))?;
    if window.is_none() && sliding.contains(&true) {
        return Err(bad(
            "sliding-window layers but `sliding_window` is null".into()
        ));
    }
    Ok(GemmaOptions {
        embedding_scale: (s.hidden_size as f64).sqrt() as f32,
        norm_weight_offset: 1.0,
        // transformers computes `scalar ** -0.5` in f64; PyTorch multiplies by it in f32.
        attention_scale: scalar.powf(-0.5) as f32,
        attn_logit_softcap: number("attn_logit_softcapping", attn_cap)?.map(|c| c as f32),
        final_logit_softcap: number("final_logit_softcapping", final_cap)?.map(|c| c as f32),
        attention_window: sliding.iter().map(|&s| window.filter(|_| s)).collect(),
        qk_norm: g == Gemma::Three,
        local_rope_theta: match g {
            Gemma::Two => None,
            Gemma::Three => Some(local_rope_theta(cfg)?),
        },
    })
}

/// Gemma 3's sliding layers' rotary base: transformers 5's `rope_parameters.
/// sliding_attention`, else 4.x's `rope_local_base_freq`, else 10 000. Only unscaled.
fn local_rope_theta(cfg: &Value) -> Result<f32> {
    let local = cfg
        .get("rope_parameters")
        .and_then(|r| r.get("sliding_attention"))
        .filter(|r| !r.is_null());
    if let Some(kind) = local
        .and_then(|r| r.get("rope_type"))
        .and_then(Value::as_str)
        && kind != "default"
    {
        return Err(bad(format!(
            "sliding layers' rope type `{kind}` is not supported (supported: default)"
        )));
    }
    let theta = local
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| cfg.get("rope_local_base_freq"))
        .map_or(Ok(10_000.0), |v| {
            v.as_f64()
                .ok_or_else(|| bad(format!("the sliding layers' rope base {v} is not a number")))
        })?;
    Ok(theta as f32)
}

/// A Gemma as llama.cpp reads it (`llm_arch` `gemma2`, `gemma3`): its converter already added
/// 1 to the norm weights, and its defaults are those of the released models.
pub(crate) fn from_gguf(
    gguf: &GgufFile,
    key: &dyn Fn(&str) -> String,
    g: Gemma,
    s: Shape,
) -> GemmaOptions {
    let float = |k: &str| gguf.get_f64(&key(k)).map(|v| v as f32);
    // GGUF has no query_pre_attn_scalar: llama.cpp uses head_dim, except for the 27B models
    // (Gemma 2's 46 layers, Gemma 3's 62), whose scalar is hidden_size / num_heads.
    let big = match g {
        Gemma::Two => s.num_layers == 46,
        Gemma::Three => s.num_layers == 62,
    };
    let scale_dim = match big && s.num_heads > 0 {
        true => s.hidden_size / s.num_heads,
        false => s.head_dim,
    };
    let window = gguf
        .get_u64(&key("attention.sliding_window"))
        .map_or(4096, |v| v as usize);
    let (attn_cap, final_cap) = match g {
        Gemma::Two => (
            Some(float("attn_logit_softcapping").unwrap_or(50.0)),
            Some(float("final_logit_softcapping").unwrap_or(30.0)),
        ),
        Gemma::Three => (None, None),
    };
    GemmaOptions {
        embedding_scale: (s.hidden_size as f64).sqrt() as f32,
        norm_weight_offset: 0.0,
        attention_scale: 1.0 / (scale_dim as f32).sqrt(),
        attn_logit_softcap: attn_cap,
        final_logit_softcap: final_cap,
        attention_window: (0..s.num_layers)
            .map(|i| g.slides(6)(i).then_some(window))
            .collect(),
        qk_norm: g == Gemma::Three,
        // llama.cpp's `rope_freq_base_train_swa` for Gemma 3.
        local_rope_theta: (g == Gemma::Three).then_some(10_000.0),
    }
}
