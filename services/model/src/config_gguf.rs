//! [`ModelConfig`] from GGUF metadata, as llama.cpp reads it: `{arch}.block_count` and the
//! rest, and each family's options from its own keys.

use ferrite_formats::gguf::GgufFile;

use super::*;

impl ModelConfig {
    /// From GGUF metadata (`{arch}.block_count`, …).
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch_name = gguf
            .get_str("general.architecture")
            .ok_or_else(|| ModelError::BadConfig("GGUF has no general.architecture".into()))?
            .to_owned();
        let mut architecture: Architecture = arch_name.parse()?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            gguf.get_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::BadConfig(format!("GGUF metadata `{}` missing", key(k))))
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
        let rope_dim = gguf
            .get_u64(&key("rope.dimension_count"))
            .map_or(head_dim, |v| v as usize);
        let max_position_embeddings = gguf
            .get_u64(&key("context_length"))
            .map_or(4096, |v| v as usize);
        let rope_scaling = gguf_rope_scaling(gguf, &key, rope_dim, max_position_embeddings)?;
        // llama.cpp's converter permutes Q/K of `llama` checkpoints for interleaved RoPE; Qwen
        // and Gemma checkpoints keep the HF layout and use NEOX.
        let rope_style = match architecture {
            // So are SmolLM3's and Granite's (their converters are Llama's).
            Architecture::Llama
            | Architecture::Mistral
            | Architecture::Mixtral
            | Architecture::SmolLm3
            | Architecture::Granite => RopeStyle::Interleaved,
            Architecture::Qwen2
            | Architecture::Qwen2Moe
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            | Architecture::Gemma2
            | Architecture::Gemma3
            | Architecture::Phi3
            | Architecture::Olmo2
            | Architecture::GptOss
            | Architecture::Encoder => RopeStyle::Neox,
        };
        let tie_word_embeddings = !gguf.tensors.contains("output.weight");
        let num_layers = layer_count(req("block_count")?)?;
        let intermediate_size = req("feed_forward_length")?;
        let family = match architecture {
            Architecture::Qwen2Moe => MoeFamily::Qwen2,
            Architecture::Qwen3Moe => MoeFamily::Qwen3,
            Architecture::GptOss => MoeFamily::GptOss,
            _ => MoeFamily::Mixtral,
        };
        let moe = MoeConfig::from_gguf(gguf, &key, family, intermediate_size, num_layers)?;
        // llama.cpp writes Mixtral as `llama` with experts.
        if architecture == Architecture::Llama && moe.is_some() {
            architecture = Architecture::Mixtral;
        }
        let dims = Dims {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
        };
        let mut cfg = ModelConfig {
            rms_norm_eps: gguf
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            rope_theta: gguf.get_f64(&key("rope.freq_base")).unwrap_or(10_000.0) as f32,
            rope_style,
            rope_scaling,
            rope_dim,
            max_position_embeddings,
            tie_word_embeddings,
            qkv_bias: gguf.tensors.contains("blk.0.attn_q.bias"),
            o_bias: gguf.tensors.contains("blk.0.attn_output.bias"),
            qk_norm: gguf.tensors.contains("blk.0.attn_q_norm.weight"),
            moe,
            ..ModelConfig::plain(dims)
        };
        if let Some(g) = gemma_of(architecture) {
            cfg.activation = Activation::GeluTanh;
            cfg.set_gemma(gemma::from_gguf(gguf, &key, g, cfg.gemma_shape()));
        }
        match architecture {
            Architecture::SmolLm3 => cfg.rotates = variants::smollm3_rotates_gguf(num_layers),
            Architecture::Granite => {
                cfg.set_scales(variants::granite_from_gguf(gguf, &key, head_dim))
            }
            Architecture::Olmo2 => cfg.set_olmo2(),
            _ => {}
        }
        if architecture == Architecture::GptOss {
            let o = gpt_oss_config::from_gguf(gguf, &key, num_layers);
            let (alpha, limit) = o.swiglu;
            cfg.activation = Activation::ClampedSwiglu { alpha, limit };
            (cfg.attention_sinks, cfg.attention_window) = (o.sinks, o.windows);
        }
        cfg.validate()
    }
}

/// The scaling of a GGUF file's rotary frequencies: linear or YaRN from its metadata as
/// llama.cpp reads them, LongRoPE from its `rope_factors_short`/`_long` tensors (Phi-3.5,
/// Phi-4-mini). Llama 3.1's per-pair divisors (`rope_freqs`) are applied at load.
fn gguf_rope_scaling(
    gguf: &GgufFile,
    key: &dyn Fn(&str) -> String,
    rope_dim: usize,
    max_position: usize,
) -> Result<RopeScaling> {
    let float = |k: &str| gguf.get_f64(&key(k));
    let original = gguf
        .get_u64(&key("rope.scaling.original_context_length"))
        .map_or(max_position, |v| v as usize);
    let factor = float("rope.scaling.factor");
    if gguf.tensors.contains("rope_factors_long.weight") {
        let factors = |name: &str| {
            gguf.tensors
                .vector_of_len(name, rope_dim / 2)
                .map_err(|e| ModelError::BadConfig(format!("LongRoPE: {e}")))
        };
        let ratio = max_position as f64 / original as f64;
        return Ok(RopeScaling::LongRope {
            short_factor: factors("rope_factors_short.weight")?,
            long_factor: factors("rope_factors_long.weight")?,
            original_max_position: original,
            attention_factor: float("rope.scaling.attn_factor")
                .unwrap_or_else(|| crate::rope::longrope_attention(ratio, original))
                as f32,
        });
    }
    Ok(match gguf.get_str(&key("rope.scaling.type")) {
        None | Some("none") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear {
            factor: factor.unwrap_or(1.0) as f32,
        },
        // llama.cpp multiplies its `attn_factor` (1 unless written) by YaRN's own.
        Some("yarn") => {
            let factor = factor.unwrap_or(1.0);
            let attn = float("rope.scaling.attn_factor").unwrap_or(1.0);
            RopeScaling::Yarn {
                factor: factor as f32,
                original_max_position: original,
                beta_fast: float("rope.scaling.yarn_beta_fast").unwrap_or(32.0) as f32,
                beta_slow: float("rope.scaling.yarn_beta_slow").unwrap_or(1.0) as f32,
                truncate: true,
                attention_factor: (attn * yarn_mscale(factor, 1.0)) as f32,
            }
        }
        Some(other) => {
            return Err(ModelError::BadConfig(format!(
                "rope scaling `{other}` is not supported (supported: none, linear, yarn, \
                 LongRoPE factors, and Llama 3.1 rope_freqs)"
            )));
        }
    })
}
