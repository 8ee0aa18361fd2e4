//! The shape of a Llama-family model, read from GGUF metadata or a Hugging Face `config.json`.

use std::str::FromStr;

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::weights::gguf::GgufFile;

/// The model families ferrite runs. They share one forward ([`crate::model::llama`]) and differ
/// in the options of [`ModelConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3/3.1, SmolLM2.
    Llama,
    Mistral,
    /// Qwen2 / Qwen2.5: bias on the Q, K and V projections.
    Qwen2,
    /// Qwen3: RMSNorm on each head of Q and K.
    Qwen3,
}

impl FromStr for Architecture {
    type Err = EngineError;

    /// Accepts GGUF `general.architecture` names and HF `architectures` / `model_type` names.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "llama" | "LlamaForCausalLM" => Architecture::Llama,
            "mistral" | "MistralForCausalLM" => Architecture::Mistral,
            "qwen2" | "Qwen2ForCausalLM" => Architecture::Qwen2,
            "qwen3" | "Qwen3ForCausalLM" => Architecture::Qwen3,
            other => return Err(EngineError::UnsupportedArchitecture(other.to_owned())),
        })
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimension `i` rotates with `i + d/2` (HF `rotate_half`, llama.cpp NEOX).
    Neox,
    /// Dimension `2i` rotates with `2i + 1` (llama.cpp NORM). GGUF `llama` checkpoints have their
    /// Q/K rows permuted by the converter for this pairing.
    Interleaved,
}

/// Rope frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.1: long wavelengths divided by `factor`, short kept, smooth in between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: usize,
    },
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    /// Number of dimensions of each head that RoPE rotates (all of them for these families).
    pub rope_dim: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub qk_norm: bool,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    fn validate(self) -> Result<Self> {
        let bad = |m: String| Err(EngineError::BadConfig(m));
        if self.hidden_size == 0 || self.num_layers == 0 || self.vocab_size == 0 {
            return bad("hidden size, layer count and vocabulary size must be non-zero".into());
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return bad(format!(
                "{} attention heads is not a multiple of {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0
            || !self.head_dim.is_multiple_of(2)
            || self.rope_dim > self.head_dim
            || !self.rope_dim.is_multiple_of(2)
        {
            return bad(format!(
                "bad head dim {} / rope dim {}",
                self.head_dim, self.rope_dim
            ));
        }
        // Written to also refuse NaN.
        if self.rms_norm_eps.is_nan()
            || self.rms_norm_eps <= 0.0
            || self.rope_theta.is_nan()
            || self.rope_theta <= 0.0
        {
            return bad("rms_norm_eps and rope_theta must be positive".into());
        }
        Ok(self)
    }

    /// From GGUF metadata (`{arch}.block_count`, …).
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch_name = gguf
            .get_str("general.architecture")
            .ok_or_else(|| EngineError::BadConfig("GGUF has no general.architecture".into()))?
            .to_owned();
        let architecture: Architecture = arch_name.parse()?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            gguf.get_u64(&key(k)).map(|v| v as usize).ok_or_else(|| {
                EngineError::BadConfig(format!("GGUF metadata `{}` missing", key(k)))
            })
        };
        let hidden_size = req("embedding_length")?;
        let num_heads = req("attention.head_count")?;
        let num_kv_heads = gguf
            .get_u64(&key("attention.head_count_kv"))
            .map_or(num_heads, |v| v as usize);
        let head_dim = match gguf.get_u64(&key("attention.key_length")) {
            Some(v) => v as usize,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        let vocab_size = match gguf.get_u64(&key("vocab_size")) {
            Some(v) => v as usize,
            None => gguf
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map_or(0, <[_]>::len),
        };
        let rope_scaling = match gguf.get_str(&key("rope.scaling.type")) {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: gguf.get_f64(&key("rope.scaling.factor")).unwrap_or(1.0) as f32,
            },
            Some(other) => {
                return Err(EngineError::BadConfig(format!(
                    "rope scaling `{other}` is not supported (supported: none, linear, and Llama 3.1 rope_freqs)"
                )));
            }
        };
        // llama.cpp's converter permutes Q/K of `llama` checkpoints for interleaved RoPE; Qwen
        // checkpoints keep the HF layout and use NEOX.
        let rope_style = match architecture {
            Architecture::Llama | Architecture::Mistral => RopeStyle::Interleaved,
            Architecture::Qwen2 | Architecture::Qwen3 => RopeStyle::Neox,
        };
        let tie_word_embeddings = !gguf.tensors.contains("output.weight");
        ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: req("feed_forward_length")?,
            num_layers: req("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: gguf
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            rope_theta: gguf.get_f64(&key("rope.freq_base")).unwrap_or(10_000.0) as f32,
            rope_style,
            rope_scaling,
            rope_dim: gguf
                .get_u64(&key("rope.dimension_count"))
                .map_or(head_dim, |v| v as usize),
            max_position_embeddings: gguf
                .get_u64(&key("context_length"))
                .map_or(4096, |v| v as usize),
            tie_word_embeddings,
            qkv_bias: gguf.tensors.contains("blk.0.attn_q.bias"),
            qk_norm: gguf.tensors.contains("blk.0.attn_q_norm.weight"),
        }
        .validate()
    }

    /// From a Hugging Face `config.json` (transformers 4.x `rope_theta`/`rope_scaling` or 5.x
    /// `rope_parameters`).
    pub fn from_hf_config(cfg: &Value) -> Result<Self> {
        let arch_name = cfg
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| cfg.get("model_type").and_then(Value::as_str))
            .ok_or_else(|| {
                EngineError::BadConfig("config.json has no `architectures` or `model_type`".into())
            })?;
        let architecture: Architecture = arch_name.parse()?;
        let uint = |k: &str| cfg.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let req = |k: &str| {
            uint(k).ok_or_else(|| EngineError::BadConfig(format!("config.json: `{k}` missing")))
        };
        let hidden_size = req("hidden_size")?;
        let num_heads = req("num_attention_heads")?;
        let num_kv_heads = uint("num_key_value_heads").unwrap_or(num_heads);
        let head_dim = match uint("head_dim") {
            Some(d) => d,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        let rope = cfg
            .get("rope_parameters")
            .or_else(|| cfg.get("rope_scaling"))
            .filter(|v| !v.is_null());
        let float = |v: Option<&Value>, k: &str| v.and_then(|v| v.get(k)).and_then(Value::as_f64);
        let rope_theta = cfg
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| float(rope, "rope_theta"))
            .unwrap_or(10_000.0) as f32;
        let rope_type = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let rope_scaling = match rope_type {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: float(rope, "factor").unwrap_or(1.0) as f32,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: float(rope, "factor").unwrap_or(8.0) as f32,
                low_freq_factor: float(rope, "low_freq_factor").unwrap_or(1.0) as f32,
                high_freq_factor: float(rope, "high_freq_factor").unwrap_or(4.0) as f32,
                original_max_position: float(rope, "original_max_position_embeddings")
                    .unwrap_or(8192.0) as usize,
            },
            other => {
                return Err(EngineError::BadConfig(format!(
                    "rope scaling `{other}` is not supported (supported: default, linear, llama3)"
                )));
            }
        };
        let attention_bias = cfg.get("attention_bias").and_then(Value::as_bool);
        ModelConfig {
            architecture,
            vocab_size: req("vocab_size")?,
            hidden_size,
            intermediate_size: req("intermediate_size")?,
            num_layers: req("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: cfg
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            rope_theta,
            rope_style: RopeStyle::Neox,
            rope_scaling,
            rope_dim: head_dim,
            max_position_embeddings: uint("max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: cfg
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            qkv_bias: attention_bias.unwrap_or(architecture == Architecture::Qwen2),
            qk_norm: architecture == Architecture::Qwen3,
        }
        .validate()
    }
}
