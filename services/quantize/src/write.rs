//! Writing a quantized model as a Hugging Face directory: `config.json` with its
//! `quantization_config`, `model.safetensors` with Hugging Face tensor names (each projection
//! in its format's tensors, see [`super::layout`]), and the tokenizer.
//!
//! Everything is written from the loaded model, so a GGUF input becomes an ordinary Hugging
//! Face checkpoint: its Llama Q and K rows, which llama.cpp's converter interleaves for its
//! RoPE, are put back in Hugging Face's order (the model then runs with the rotate-half RoPE
//! that `config.json` implies), and its tokenizer is written as `tokenizer.json`. Tensors kept
//! in float are written in their stored float type (other GGUF types as f32, exactly their
//! dequantized values); norms and biases, which calibration may have rescaled, as f32.

use std::collections::HashMap;
use std::path::Path;

use ferrite_text::Tokenizer;
use safetensors::tensor::TensorView;

use ferrite_engine::config::{Architecture, ModelConfig, RopeScaling, RopeStyle};
use ferrite_engine::model::LlamaModel;
use ferrite_engine::model::llama::Layer;
use ferrite_engine::model::moe::{Ffn, Mlp};
use ferrite_engine::{EngineError, Result};

use super::OutputFormat;
use super::layout::{Out, f32_tensor, float_matrix, projection};

/// Files copied unchanged from a Hugging Face input, when present.
const COPIED_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
];

/// Where the model came from.
pub(super) struct Source<'a> {
    pub(super) model: &'a LlamaModel,
    pub(super) tokenizer: Option<&'a Tokenizer>,
    /// The input directory and its config.json, for a Hugging Face input.
    pub(super) hf: Option<(&'a Path, serde_json::Value)>,
}

/// `w - offset` (Gemma's norms are stored without the 1 ferrite folds in at load).
fn norm_tensor(name: String, w: &[f32], c: &ModelConfig) -> Out {
    let v: Vec<f32> = w.iter().map(|x| x - c.norm_weight_offset).collect();
    f32_tensor(name, vec![v.len()], &v)
}

/// The row order that undoes llama.cpp's Q/K interleaving: row `hf` of the result is row
/// `order[hf]` of the GGUF matrix (within each head, HF's `t·d/2 + i` is GGUF's `2i + t`).
fn unpermute_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads * head_dim)
        .map(|r| {
            let (h, j) = (r / head_dim, r % head_dim);
            let (t, i) = (j / half, j % half);
            h * head_dim + 2 * i + t
        })
        .collect()
}

/// The tensors of one decoder layer.
fn layer_tensors(
    i: usize,
    l: &Layer,
    c: &ModelConfig,
    (gguf_rope, format): (bool, OutputFormat),
    out: &mut Vec<Out>,
) -> Result<()> {
    let p = |n: &str| format!("model.layers.{i}.{n}");
    // Gemma's names where there are norms after attention and the MLP (OLMo 2's too, which
    // has none before them); Llama's otherwise.
    let (attn, ffn) = (l.attn_norm.as_deref(), l.ffn_norm.as_deref());
    let mut norms = vec![("input_layernorm", attn)];
    match &l.post_norms {
        Some([post_attn, post_ffn]) => norms.extend([
            ("post_attention_layernorm", Some(post_attn.as_slice())),
            ("pre_feedforward_layernorm", ffn),
            ("post_feedforward_layernorm", Some(post_ffn.as_slice())),
        ]),
        None => norms.push(("post_attention_layernorm", ffn)),
    }
    for (name, w) in norms {
        if let Some(w) = w {
            out.push(norm_tensor(p(&format!("{name}.weight")), w, c));
        }
    }
    if let Some(biases) = &l.qkv_bias {
        for (b, n) in biases.iter().zip(["q", "k", "v"]) {
            out.push(f32_tensor(
                p(&format!("self_attn.{n}_proj.bias")),
                vec![b.len()],
                b,
            ));
        }
    }
    if let Some([nq, nk]) = &l.qk_norm {
        out.push(norm_tensor(p("self_attn.q_norm.weight"), nq, c));
        out.push(norm_tensor(p("self_attn.k_norm.weight"), nk, c));
    }
    let qk_order = |heads: usize| gguf_rope.then(|| unpermute_order(heads, c.head_dim));
    let q_order = qk_order(c.num_heads);
    let k_order = qk_order(c.num_kv_heads);
    for (name, m, order) in [
        ("self_attn.q_proj", &l.q, q_order.as_deref()),
        ("self_attn.k_proj", &l.k, k_order.as_deref()),
        ("self_attn.v_proj", &l.v, None),
        ("self_attn.o_proj", &l.o, None),
    ] {
        projection(&p(name), m, order, format, out)?;
    }
    mlp_tensors(&p, &l.mlp, c.architecture, format, out)
}

/// The names of a gated MLP's gate, up and down projections.
const QWEN_FFN: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// The MLP's tensors under the checkpoint's own names (`p` makes a layer's): a dense one's
/// projections, or a mixture's router (as stored), each expert's projections and a shared
/// expert's (with its gate, a `[1, hidden]` row).
fn mlp_tensors(
    p: &dyn Fn(&str) -> String,
    mlp: &Mlp,
    arch: Architecture,
    format: OutputFormat,
    out: &mut Vec<Out>,
) -> Result<()> {
    let ffn = |stem: &str, f: &Ffn, names: [&str; 3], out: &mut Vec<Out>| {
        (names.iter().zip(f.matrices()))
            .try_for_each(|(n, m)| projection(&p(&format!("{stem}.{n}")), m, None, format, out))
    };
    let moe = match mlp {
        Mlp::Dense(f) => return ffn("mlp", f, QWEN_FFN, out),
        Mlp::Sparse(moe) => moe,
    };
    let (block, names) = match arch {
        Architecture::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
        _ => ("mlp", QWEN_FFN),
    };
    out.push(float_matrix(
        p(&format!("{block}.gate.weight")),
        &moe.router,
    ));
    for (e, f) in moe.experts.iter().enumerate() {
        ffn(&format!("{block}.experts.{e}"), f, names, out)?;
    }
    if let Some(shared) = &moe.shared {
        ffn("mlp.shared_expert", &shared.ffn, QWEN_FFN, out)?;
        let gate = p("mlp.shared_expert_gate.weight");
        out.push(f32_tensor(gate, vec![1, shared.gate.len()], &shared.gate));
    }
    Ok(())
}

/// Refuses, before any calibration, a model whose checkpoint the writers here cannot make:
/// Phi-3's (fused projections) and a multimodal one's (its vision tower would be dropped).
pub(super) fn check_writable(c: &ModelConfig, hf: Option<&serde_json::Value>) -> Result<()> {
    match c.architecture {
        Architecture::Phi3 => return Err(phi3_unsupported()),
        Architecture::GptOss => return Err(gpt_oss_unsupported()),
        _ => {}
    }
    if c.labels.is_some() {
        return Err(EngineError::BadConfig(
            "writing a quantized sequence classifier is not supported (its head, score.weight, \
             would be lost); quantize it at load instead (--quantize)"
                .into(),
        ));
    }
    let arch = hf.and_then(|cfg| cfg["architectures"][0].as_str());
    if arch == Some("Gemma3ForConditionalGeneration") {
        return Err(EngineError::BadConfig(
            "writing a quantized multimodal checkpoint is not supported (its vision tower \
             would be lost); quantize it at load instead (--quantize)"
                .into(),
        ));
    }
    Ok(())
}

/// gpt-oss's stacked experts, their biases and the attention sinks have no writer here.
fn gpt_oss_unsupported() -> EngineError {
    EngineError::BadConfig(
        "writing a quantized gpt-oss checkpoint is not supported (its stacked experts, biases \
         and attention sinks have no writer here); quantize it at load instead (--quantize)"
            .into(),
    )
}

/// Phi-3 checkpoints keep Q|K|V and gate|up fused, which the writers here do not pack yet.
fn phi3_unsupported() -> EngineError {
    EngineError::BadConfig(
        "writing a quantized Phi-3 checkpoint is not supported yet (its projections are \
         fused); quantize it at load instead (--quantize)"
            .into(),
    )
}

/// `config.json` for a model loaded from GGUF (the fields ferrite and transformers read).
fn config_from_gguf(m: &LlamaModel, tok: Option<&Tokenizer>) -> Result<serde_json::Value> {
    let c = m.config();
    let (arch, model_type) = match c.architecture {
        Architecture::Llama => ("LlamaForCausalLM", "llama"),
        Architecture::Mistral => ("MistralForCausalLM", "mistral"),
        Architecture::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Architecture::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Architecture::Mixtral | Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
            return Err(EngineError::BadConfig(
                "quantizing a mixture of experts from a GGUF file is not supported: quantize \
                 its Hugging Face directory"
                    .into(),
            ));
        }
        Architecture::Phi3 => return Err(phi3_unsupported()),
        Architecture::GptOss => return Err(gpt_oss_unsupported()),
        // An encoder never loads as a `LlamaModel`, which this reads.
        Architecture::Encoder => {
            return Err(EngineError::BadConfig(
                "an encoder is not quantized (it runs as stored)".into(),
            ));
        }
        // Their options (Gemma's and OLMo 2's norms, Gemma's caps, SmolLM3's layers without
        // rotation, Granite's multipliers) have no writer of their config.json here.
        Architecture::Gemma2
        | Architecture::Gemma3
        | Architecture::SmolLm3
        | Architecture::Granite
        | Architecture::Olmo2 => {
            return Err(EngineError::BadConfig(format!(
                "quantizing a {:?} GGUF file is not supported: quantize its Hugging Face \
                 directory",
                c.architecture
            )));
        }
    };
    let rope_scaling = hf_rope_scaling(&c.rope_scaling);
    // The config written must give the same rotary frequencies (a GGUF file may carry
    // per-pair factors that no config.json field expresses).
    let neox = ModelConfig {
        rope_style: RopeStyle::Neox,
        ..c.clone()
    };
    let written = neox.rope(None, c.default_context());
    if written.inv_freq != m.rope().inv_freq || written.scale != m.rope().scale {
        return Err(EngineError::BadConfig(
            "this GGUF file's RoPE frequencies have no config.json equivalent; quantize its \
             Hugging Face directory"
                .into(),
        ));
    }
    let tied = m.lm_head().same_storage(m.embed());
    Ok(serde_json::json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": tied,
        "vocab_size": c.vocab_size,
        "hidden_act": "silu",
        "attention_bias": c.qkv_bias,
        "torch_dtype": "float32",
        "bos_token_id": tok.and_then(Tokenizer::bos_id),
        "eos_token_id": tok.and_then(|t| t.eos_ids().first().copied()),
    }))
}

/// `scaling` as `config.json`'s `rope_scaling` says it, for transformers and ferrite alike.
fn hf_rope_scaling(scaling: &RopeScaling) -> serde_json::Value {
    use serde_json::json;
    match scaling {
        RopeScaling::None => serde_json::Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position,
        }),
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            truncate,
            attention_factor,
        } => json!({
            "rope_type": "yarn", "factor": factor, "beta_fast": beta_fast,
            "beta_slow": beta_slow, "truncate": truncate, "attention_factor": attention_factor,
            "original_max_position_embeddings": original_max_position,
        }),
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position,
            attention_factor,
        } => json!({
            "rope_type": "longrope", "short_factor": short_factor, "long_factor": long_factor,
            "attention_factor": attention_factor,
            "original_max_position_embeddings": original_max_position,
        }),
    }
}

/// What [`write_dir`] wrote.
pub(super) struct Written {
    pub(super) bytes_out: u64,
    pub(super) float_tensors: usize,
}

/// Writes `layers` (and the rest of `src`'s model) to `output` in `format`, with
/// `quantization` as the config's `quantization_config`.
pub(super) fn write_dir(
    src: &Source<'_>,
    layers: &[Layer],
    format: OutputFormat,
    quantization: serde_json::Value,
    quantizer: &str,
    output: &Path,
) -> Result<Written> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| EngineError::Io { path, source }
    };
    let m = src.model;
    let c = m.config();
    let mut cfg = match &src.hf {
        Some((_, cfg)) => cfg.clone(),
        None => config_from_gguf(m, src.tokenizer)?,
    };
    let gguf_rope = c.rope_style == RopeStyle::Interleaved;
    let mut out = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        layer_tensors(i, l, c, (gguf_rope, format), &mut out)?;
    }
    out.push(float_matrix("model.embed_tokens.weight".into(), m.embed()));
    out.push(norm_tensor("model.norm.weight".into(), m.norm(), c));
    if !m.lm_head().same_storage(m.embed()) {
        out.push(float_matrix("lm_head.weight".into(), m.lm_head()));
    }
    let float_tensors = out.iter().filter(|t| !t.quantized).count();

    std::fs::create_dir_all(output).map_err(io(output))?;
    let views = out
        .iter()
        .map(|t| {
            TensorView::new(t.dtype, t.shape.clone(), &t.bytes)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| EngineError::BadTensor {
                    name: t.name.clone(),
                    reason: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([
        ("format".to_owned(), "pt".to_owned()),
        ("quantizer".to_owned(), quantizer.to_owned()),
    ]);
    let weights = output.join("model.safetensors");
    safetensors::tensor::serialize_to_file(views, Some(metadata), &weights).map_err(|e| {
        EngineError::Io {
            path: weights.clone(),
            source: std::io::Error::other(e.to_string()),
        }
    })?;

    if quantization.is_null() {
        if let Some(o) = cfg.as_object_mut() {
            o.remove("quantization_config");
        }
    } else {
        cfg["quantization_config"] = quantization;
    }
    let out_cfg = output.join("config.json");
    let text = serde_json::to_string_pretty(&cfg)
        .map_err(|e| EngineError::BadConfig(format!("config.json: {e}")))?;
    std::fs::write(&out_cfg, text).map_err(io(&out_cfg))?;
    match (&src.hf, src.tokenizer) {
        (Some((dir, _)), _) => {
            for f in COPIED_FILES {
                let from = dir.join(f);
                if from.exists() {
                    std::fs::copy(&from, output.join(f)).map_err(io(&from))?;
                }
            }
        }
        (None, Some(t)) => {
            let json = t
                .to_tokenizer_json()
                .map_err(|e| EngineError::BadConfig(format!("tokenizer: {e}")))?;
            let p = output.join("tokenizer.json");
            std::fs::write(&p, json).map_err(io(&p))?;
            let p = output.join("tokenizer_config.json");
            let text = serde_json::to_string_pretty(&t.to_tokenizer_config())
                .map_err(|e| EngineError::BadConfig(format!("tokenizer_config.json: {e}")))?;
            std::fs::write(&p, text).map_err(io(&p))?;
        }
        (None, None) => {}
    }
    Ok(Written {
        bytes_out: std::fs::metadata(&weights).map_err(io(&weights))?.len(),
        float_tensors,
    })
}
