//! Named model shapes for `--load-format dummy`: the models of the benchmark seeds, with random
//! weights made in memory, so speed can be measured without downloading checkpoints.
//!
//! Each preset is the model's Hugging Face `config.json` (the fields that shape the forward),
//! parsed by the same code as a real checkpoint's.

use serde_json::{Value, json};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// A named shape.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    pub name: &'static str,
    /// The model it copies (no spaces: it fills a whitespace-separated table column).
    pub model: &'static str,
    config: fn() -> Value,
}

impl Preset {
    pub fn config(&self) -> Result<ModelConfig> {
        ModelConfig::from_hf_config(&(self.config)())
    }
}

fn llama(h: u64, layers: u64, heads: u64, kv: u64, ffn: u64, vocab: u64, theta: f64) -> Value {
    json!({"architectures": ["LlamaForCausalLM"], "hidden_size": h, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": ffn,
        "vocab_size": vocab, "rope_theta": theta, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192, "tie_word_embeddings": false})
}

fn qwen2(h: u64, layers: u64, heads: u64, kv: u64, ffn: u64, vocab: u64, theta: f64) -> Value {
    json!({"architectures": ["Qwen2ForCausalLM"], "hidden_size": h, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": ffn,
        "vocab_size": vocab, "rope_theta": theta, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768, "tie_word_embeddings": false})
}

/// Qwen3-30B-A3B's config.json with `layers` of its 48 layers: 128 experts of 768, 8 a token.
/// Its `intermediate_size` (6144) is what a dense layer would have: 8 experts' width.
fn qwen3_30b_a3b(layers: u64) -> Value {
    json!({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
        "num_hidden_layers": layers, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151_936,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "attention_bias": false,
        "max_position_embeddings": 40960, "tie_word_embeddings": false})
}

/// gpt-oss-20b's config.json with `layers` of its 24 layers: 32 experts of 2880, 4 a token,
/// alternate windows of 128.
fn gpt_oss_20b(layers: usize) -> Value {
    let types: Vec<&str> = (0..layers)
        .map(|i| ["sliding_attention", "full_attention"][i % 2])
        .collect();
    json!({"architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
        "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
        "num_experts_per_tok": 4, "vocab_size": 201_088, "attention_bias": true,
        "layer_types": types, "sliding_window": 128, "swiglu_limit": 7.0,
        "rope_theta": 150_000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
        "max_position_embeddings": 131_072,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096}})
}

/// The Transformer LMs of seed 002 in Llama-style blocks, vocab 10000. Their feed-forward is
/// SwiGLU at d_ff = 8/3 d_model (rounded up to 64), the width with the parameters of a plain
/// 4 d_model MLP, which is what the sizes' names count (2.7B: 2.57B here).
fn seed_lm(d: u64, layers: u64, heads: u64) -> Value {
    let d_ff = (8 * d).div_ceil(3).next_multiple_of(64);
    let mut v = llama(d, layers, heads, heads, d_ff, 10_000, 10_000.0);
    v["max_position_embeddings"] = json!(1024);
    v
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "llama-3-8b",
        model: "meta-llama/Meta-Llama-3-8B",
        config: || llama(4096, 32, 32, 8, 14336, 128_256, 500_000.0),
    },
    Preset {
        name: "llama-3-70b",
        model: "meta-llama/Meta-Llama-3-70B",
        config: || llama(8192, 80, 64, 8, 28672, 128_256, 500_000.0),
    },
    Preset {
        name: "llama-2-13b",
        model: "meta-llama/Llama-2-13b-hf",
        config: || {
            let mut v = llama(5120, 40, 40, 40, 13824, 32_000, 10_000.0);
            v["max_position_embeddings"] = json!(4096);
            v
        },
    },
    Preset {
        name: "qwen1.5-4b",
        model: "Qwen/Qwen1.5-4B",
        config: || qwen2(2560, 40, 20, 20, 6912, 151_936, 5_000_000.0),
    },
    Preset {
        name: "qwen1.5-1.8b",
        model: "Qwen/Qwen1.5-1.8B",
        config: || qwen2(2048, 24, 16, 16, 5504, 151_936, 1_000_000.0),
    },
    Preset {
        name: "qwen2.5-32b",
        model: "Qwen/Qwen2.5-Coder-32B-Instruct",
        config: || qwen2(5120, 64, 40, 8, 27648, 152_064, 1_000_000.0),
    },
    Preset {
        name: "qwen3-4b",
        model: "Qwen/Qwen3-4B",
        config: || {
            json!({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 2560,
                "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151_936,
                "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "attention_bias": false,
                "max_position_embeddings": 40960, "tie_word_embeddings": true})
        },
    },
    Preset {
        name: "qwen1.5-moe-a2.7b",
        model: "Qwen/Qwen1.5-MoE-A2.7B",
        config: || {
            json!({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048,
                "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
                "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632,
                "norm_topk_prob": false, "vocab_size": 151_936, "rope_theta": 1_000_000.0,
                "rms_norm_eps": 1e-6, "max_position_embeddings": 8192,
                "tie_word_embeddings": false})
        },
    },
    Preset {
        name: "qwen3-30b-a3b",
        model: "Qwen/Qwen3-30B-A3B",
        config: || qwen3_30b_a3b(48),
    },
    // Its first 4 layers (6 GB in f16, where the whole is 61 GB): the experts' cost per layer
    // on a machine that cannot hold the model.
    Preset {
        name: "qwen3-30b-a3b-4l",
        model: "Qwen/Qwen3-30B-A3B(4-layers)",
        config: || qwen3_30b_a3b(4),
    },
    // The same 4 layers with a dense MLP as wide as the 8 experts a token goes through (8 x
    // 768): the bytes a token reads per layer are the same, so at batch 1 a mixture of
    // experts should decode at its speed.
    Preset {
        name: "qwen3-a3b-dense-4l",
        model: "dense-as-Qwen3-30B-A3B-active(4-layers)",
        config: || {
            let mut v = qwen3_30b_a3b(4);
            v["architectures"] = json!(["Qwen3ForCausalLM"]);
            v
        },
    },
    // Its experts in MXFP4, as published: 13.7 GB in all (random weights take twice that
    // while they load: the MXFP4 blocks are copied into ggml's order).
    Preset {
        name: "gpt-oss-20b",
        model: "openai/gpt-oss-20b",
        config: || gpt_oss_20b(24),
    },
    // Its first 4 layers (2.9 GB, the LM head's 1.2 GB among them).
    Preset {
        name: "gpt-oss-20b-4l",
        model: "openai/gpt-oss-20b(4-layers)",
        config: || gpt_oss_20b(4),
    },
    Preset {
        name: "gemma-2-9b",
        model: "google/gemma-2-9b",
        config: || {
            json!({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 3584,
                "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
                "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256_000,
                "rope_theta": 10_000.0, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
                "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
                "max_position_embeddings": 8192, "tie_word_embeddings": true})
        },
    },
    Preset {
        name: "phi-4",
        model: "microsoft/phi-4",
        config: || {
            json!({"architectures": ["Phi3ForCausalLM"], "hidden_size": 5120,
                "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 10,
                "intermediate_size": 17_920, "vocab_size": 100_352, "rope_theta": 250_000.0,
                "rms_norm_eps": 1e-5, "max_position_embeddings": 16_384,
                "tie_word_embeddings": false, "sliding_window": null})
        },
    },
    Preset {
        name: "gemma-3-1b",
        model: "google/gemma-3-1b-it",
        config: || {
            json!({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 1152,
                "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
                "head_dim": 256, "intermediate_size": 6912, "vocab_size": 262_144,
                "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
                "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256, "sliding_window": 512,
                "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
                "max_position_embeddings": 32_768, "tie_word_embeddings": true})
        },
    },
    Preset {
        name: "smollm3-3b",
        model: "HuggingFaceTB/SmolLM3-3B",
        config: || {
            let mut v = llama(2048, 36, 16, 4, 11008, 128_256, 5_000_000.0);
            v["architectures"] = json!(["SmolLM3ForCausalLM"]);
            v["no_rope_layer_interval"] = json!(4);
            v["tie_word_embeddings"] = json!(true);
            v["max_position_embeddings"] = json!(65_536);
            v
        },
    },
    Preset {
        name: "granite-3.3-2b",
        model: "ibm-granite/granite-3.3-2b-instruct",
        config: || {
            let mut v = llama(2048, 40, 32, 8, 8192, 49_159, 10_000_000.0);
            v["architectures"] = json!(["GraniteForCausalLM"]);
            for (k, x) in [
                ("embedding_multiplier", 12.0),
                ("residual_multiplier", 0.22),
                ("attention_multiplier", 0.015625),
                ("logits_scaling", 8.0),
            ] {
                v[k] = json!(x);
            }
            v["tie_word_embeddings"] = json!(true);
            v["max_position_embeddings"] = json!(131_072);
            v
        },
    },
    Preset {
        name: "olmo-2-1b",
        model: "allenai/OLMo-2-0425-1B",
        config: || {
            let mut v = llama(2048, 16, 16, 16, 8192, 100_352, 500_000.0);
            v["architectures"] = json!(["Olmo2ForCausalLM"]);
            v["max_position_embeddings"] = json!(4096);
            v
        },
    },
    Preset {
        name: "small",
        model: "seed002/small-d768",
        config: || seed_lm(768, 12, 12),
    },
    Preset {
        name: "medium",
        model: "seed002/medium-d1024",
        config: || seed_lm(1024, 24, 16),
    },
    Preset {
        name: "large",
        model: "seed002/large-d1280",
        config: || seed_lm(1280, 36, 20),
    },
    Preset {
        name: "xl",
        model: "seed002/xl-d1600",
        config: || seed_lm(1600, 48, 25),
    },
    Preset {
        name: "2.7b",
        model: "seed002/2.7B-d2560",
        config: || seed_lm(2560, 32, 32),
    },
];

/// The preset named `name`, or an error listing them.
pub fn preset(name: &str) -> Result<&'static Preset> {
    PRESETS
        .iter()
        .find(|p| p.name.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            ModelError::ModelNotFound(name.to_owned(), names.join(", "))
        })
}

/// Parameters of a model of this shape (embeddings, LM head unless tied, layers, norms).
pub fn parameter_count(c: &ModelConfig) -> u64 {
    count_parameters(c, false)
}

/// The parameters a token goes through: [`parameter_count`] with each mixture's experts counted
/// `experts_per_token` times instead of `num_experts` (the same for a dense model).
pub fn active_parameter_count(c: &ModelConfig) -> u64 {
    count_parameters(c, true)
}

fn count_parameters(c: &ModelConfig, active: bool) -> u64 {
    let (h, f, v) = (
        c.hidden_size as u64,
        c.intermediate_size as u64,
        c.vocab_size as u64,
    );
    let (q, kv) = (c.q_dim() as u64, c.kv_dim() as u64);
    let attn = h * q
        + 2 * h * kv
        + q * h
        + if c.qkv_bias { q + 2 * kv } else { 0 }
        + if c.o_bias { h } else { 0 }
        + if c.attention_sinks {
            c.num_heads as u64
        } else {
            0
        };
    // gpt-oss's router and experts have biases.
    let oss = c.architecture == crate::config::Architecture::GptOss;
    let (qn, kn) = c.qk_norm_lens();
    let norms = h * (2 * c.pre_norms as u64 + 2 * c.post_norms as u64)
        + if c.qk_norm { (qn + kn) as u64 } else { 0 };
    let dense = 3 * h * f;
    let mlps: u64 = (0..c.num_layers)
        .map(|i| match c.moe.as_ref().filter(|m| m.sparse_layers[i]) {
            Some(m) => {
                let e = m.num_experts as u64;
                let used = if active {
                    m.experts_per_token as u64
                } else {
                    e
                };
                let shared = m
                    .shared_expert_intermediate_size
                    .map_or(0, |s| 3 * h * s as u64 + h);
                let ef = m.expert_intermediate_size as u64;
                let biases = if oss { used * (2 * ef + h) + e } else { 0 };
                used * 3 * h * ef + e * h + shared + biases
            }
            None => dense,
        })
        .sum();
    let head = if c.tie_word_embeddings { 0 } else { v * h };
    v * h + head + c.num_layers as u64 * (attn + norms) + mlps + h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every preset parses, and has the parameter count its model card states (within 1%).
    #[test]
    fn presets_have_their_models_parameter_counts() {
        let published: &[(&str, f64)] = &[
            ("llama-3-8b", 8.03e9),
            ("llama-3-70b", 70.55e9),
            ("llama-2-13b", 13.02e9),
            ("qwen1.5-4b", 3.95e9),
            ("qwen1.5-1.8b", 1.84e9),
            ("qwen2.5-32b", 32.76e9),
            ("qwen3-4b", 4.02e9),
            ("gemma-2-9b", 9.24e9),
            ("gemma-3-1b", 0.9999e9),
            ("phi-4", 14.7e9),
            ("qwen3-30b-a3b", 30.53e9),
            ("qwen1.5-moe-a2.7b", 14.32e9),
            ("gpt-oss-20b", 20.91e9),
            ("smollm3-3b", 3.08e9),
            ("granite-3.3-2b", 2.53e9),
            ("olmo-2-1b", 1.48e9),
        ];
        for &(name, want) in published {
            let cfg = preset(name).expect(name).config().expect(name);
            let got = parameter_count(&cfg) as f64;
            assert!(
                (got / want - 1.0).abs() < 0.01,
                "{name}: {got:.3e} parameters, published {want:.3e}"
            );
        }
        for p in PRESETS {
            p.config().unwrap_or_else(|e| panic!("{}: {e}", p.name));
        }
        // The "A3B" and "A2.7B" of their names: 3.3B and 2.7B parameters a token goes through
        // (the model cards' counts, within 2%).
        for (name, want) in [("qwen3-30b-a3b", 3.3e9), ("qwen1.5-moe-a2.7b", 2.7e9)] {
            let cfg = preset(name).expect(name).config().expect(name);
            let got = active_parameter_count(&cfg) as f64;
            assert!((got / want - 1.0).abs() < 0.02, "{name}: {got:.3e} active");
        }
        let dense = preset("llama-3-8b")
            .expect("preset")
            .config()
            .expect("config");
        assert_eq!(active_parameter_count(&dense), parameter_count(&dense));
        assert!(preset("no-such-model").is_err());
    }
}
