//! Every supported architecture against Hugging Face transformers, on tiny random-weight
//! checkpoints made by `tests/fixtures/models/generate.py` (fp32 reference; the script also
//! writes some of them as GGUF).

mod common;

use common::*;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::model::{self, LogitsWanted};
use ferrite_engine::sampler::SamplingParams;

/// fp32 against fp32: only summation order differs.
const LOGIT_TOLERANCE: f32 = 1e-3;

fn check(dir: &str, file: Option<&str>, expected_key: Option<&str>) {
    check_at(dir, file, expected_key, None);
}

/// [`check`] with the model served for contexts of `context` tokens (default: the model's
/// own), which picks LongRoPE's factors.
fn check_at(dir: &str, file: Option<&str>, expected_key: Option<&str>, context: Option<usize>) {
    let base = fixtures().join("models").join(dir);
    let path = file.map_or(base.clone(), |f| base.join(f));
    let mut loaded = model::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if let Some(context) = context {
        loaded.model.fit_context(context);
    }
    let expected = read_json(&base.join("expected.json"));
    let cases = match expected_key {
        Some(k) => expected[k]["cases"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| expected["cases"].as_array().cloned().expect("cases")),
        None => expected["cases"].as_array().cloned().expect("cases"),
    };
    assert_eq!(cases.len(), 3);
    for case in &cases {
        let prompt = ids(&case["prompt_token_ids"]);
        let want = floats(&case["first_logits"]);
        let got = prefill_logits(&loaded.model, &prompt, LogitsWanted::Last);
        let d = max_abs_diff(&got, &want);
        assert!(
            d < LOGIT_TOLERANCE,
            "{dir} {file:?}: first-step logits differ by {d}"
        );
        if let Some(all) = case.get("all_position_logits") {
            let want: Vec<f32> = all
                .as_array()
                .expect("rows")
                .iter()
                .flat_map(floats)
                .collect();
            let got = prefill_logits(&loaded.model, &prompt, LogitsWanted::All);
            let d = max_abs_diff(&got, &want);
            assert!(
                d < LOGIT_TOLERANCE,
                "{dir} {file:?}: per-position logits differ by {d}"
            );
        }
        if let Some(steps) = case.get("decode_logits") {
            let steps = steps.as_array().expect("rows");
            let greedy = ids(&case["greedy_token_ids"]);
            let got = decode_logits(&loaded.model, &prompt, &greedy[..steps.len()]);
            for (i, (got, want)) in got.iter().zip(steps).enumerate() {
                let d = max_abs_diff(got, &floats(want));
                assert!(
                    d < LOGIT_TOLERANCE,
                    "{dir} {file:?}: decode step {} logits differ by {d}",
                    i + 1
                );
            }
        }
    }
    // Greedy continuations, all prompts batched together through the engine with a small
    // step budget so prefills are chunked and mixed with decodes.
    let cfg = EngineConfig {
        max_model_len: Some(context.unwrap_or(256)),
        max_num_batched_tokens: 8,
        kv_cache_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(loaded.model, vec![], cfg).expect("engine");
    let requests = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as u64,
                ids(&c["prompt_token_ids"]),
                SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(16)
                },
            )
        })
        .collect();
    let out = engine
        .run_to_completion(requests, |_| true)
        .expect("generate");
    for (i, case) in cases.iter().enumerate() {
        let want = ids(&case["greedy_token_ids"]);
        let got = out[&(i as u64)].token_ids();
        assert_eq!(
            got,
            want[..16],
            "{dir} {file:?}: greedy tokens of prompt {i}"
        );
    }
}

#[test]
fn llama31_rope_scaling_sharded_safetensors() {
    check("llama31", None, None);
}

#[test]
fn llama2_tied_embeddings_safetensors() {
    check("llama2_tied", None, None);
}

#[test]
fn llama2_tied_gguf_f16_permuted_qk() {
    check("llama2_tied", Some("model.gguf"), Some("gguf"));
}

#[test]
fn mistral_safetensors() {
    check("mistral", None, None);
}

/// Mistral-7B-v0.1's sliding window (8 here): prefill, per-position and decode logits past it.
#[test]
fn mistral_sliding_window_safetensors() {
    check("mistral_swa", None, None);
}

#[test]
fn qwen2_qkv_bias_safetensors() {
    check("qwen2", None, None);
}

#[test]
fn qwen2_gguf() {
    check("qwen2", Some("model.gguf"), None);
}

#[test]
fn qwen3_qk_norm_explicit_head_dim() {
    check("qwen3", None, None);
}

/// GeGLU, `1 + w` norms, post-attention/MLP norms, scaled embeddings, query_pre_attn_scalar,
/// attention and final soft caps, sliding window 8 on layers 0 and 2, tied embeddings.
#[test]
fn gemma2_safetensors() {
    check("gemma2", None, None);
}

/// llama.cpp's Gemma 2 layout: F16 weights, norms stored as `1 + w`, softcaps and window in the
/// metadata, attention scale from head_dim.
#[test]
fn gemma2_gguf() {
    check("gemma2", Some("model.gguf"), Some("gguf"));
}

/// Gemma 3's multimodal checkpoints (4B and up): the text model under
/// `language_model.model.*` beside a vision tower, its `text_config` naming only what differs
/// from transformers' defaults; text prompts get the text model's logits.
#[test]
fn gemma3_multimodal_checkpoint_text_model() {
    check("gemma3_mm", None, None);
}

/// Phi-3 / Phi-4: Q|K|V and gate|up stored fused and cut apart at load; half of each head
/// rotates (`partial_rotary_factor` 0.5).
#[test]
fn phi3_fused_projections_partial_rotary_safetensors() {
    check("phi3", None, None);
}

/// llama.cpp's Phi-3 layout: `attn_qkv`, and `ffn_up` holding gate then up.
#[test]
fn phi3_gguf() {
    check("phi3", Some("model.gguf"), Some("gguf"));
}

/// Qwen3 past its training length as Qwen's model cards set it: YaRN (factor 4 over an
/// original 64 here), which blends each frequency by its turns in the original length and
/// scales cos and sin.
#[test]
fn qwen3_yarn_safetensors() {
    check("qwen3_yarn", None, None);
}

/// llama.cpp's YaRN keys (type, factor, original context length).
#[test]
fn qwen3_yarn_gguf() {
    check("qwen3_yarn", Some("model.gguf"), Some("gguf"));
}

/// Phi-3.5 / Phi-4-mini's LongRoPE: per-pair factors and an attention factor. Served past the
/// original 64 tokens (the default context is the model's 256) it rotates by the long
/// factors, as transformers does for such sequences; served for 64, by the short ones, as
/// transformers does for the sequences here.
#[test]
fn phi3_longrope_long_and_short_factors() {
    check("phi3_longrope", None, None);
    check_at("phi3_longrope", None, Some("short"), Some(64));
}

/// llama.cpp's LongRoPE: `rope_factors_long`/`_short` tensors and the attention factor key.
#[test]
fn phi3_longrope_gguf() {
    check("phi3_longrope", Some("model.gguf"), Some("gguf"));
}

/// Gemma 3: Gemma 2's layers without the soft caps, RMSNorm on each head of Q and K, five
/// sliding layers (window 8) to one full, the full layer rotating with base 100000 scaled
/// linearly by 2 and the sliding ones with their own base 10000; decode steps past the window.
#[test]
fn gemma3_safetensors() {
    check("gemma3", None, None);
}

/// llama.cpp's Gemma 3 layout: F16 weights, every norm stored as `1 + w`, the full layers'
/// rope in the metadata and the sliding layers' base llama.cpp's own.
#[test]
fn gemma3_gguf() {
    check("gemma3", Some("model.gguf"), Some("gguf"));
}

/// SmolLM3 (`tests/fixtures/models/generate_variants.py`): its fourth layer rotates nothing
/// (`no_rope_layers`), tied embeddings.
#[test]
fn smollm3_nope_layer_safetensors() {
    check("smollm3", None, None);
}

/// llama.cpp's `smollm3`: Q/K permuted as Llama's, every fourth layer without rotation by the
/// arch's own rule.
#[test]
fn smollm3_gguf() {
    check("smollm3", Some("model.gguf"), Some("gguf"));
}

/// Granite 3.x: the embedding, residual, attention and logit multipliers.
#[test]
fn granite_multipliers_safetensors() {
    check("granite", None, None);
}

/// llama.cpp's `granite`: the four multipliers as its converter writes them.
#[test]
fn granite_gguf() {
    check("granite", Some("model.gguf"), Some("gguf"));
}

/// OLMo 2: no norm before attention or the MLP, norms after both, q/k norms over all heads.
#[test]
fn olmo2_norms_after_safetensors() {
    check("olmo2", None, None);
}

/// llama.cpp's `olmo2`: the norms after as `post_attention_norm` and `post_ffw_norm`, NEOX rope.
#[test]
fn olmo2_gguf() {
    check("olmo2", Some("model.gguf"), Some("gguf"));
}

/// A mixture of experts: 4 experts, 2 per token, renormalized, each its own tensors.
#[test]
fn mixtral_experts_safetensors() {
    check("mixtral", None, None);
}

/// llama.cpp's Mixtral: arch `llama` with `expert_count`, the experts stacked in 3-D tensors.
#[test]
fn mixtral_gguf_stacked_experts() {
    check("mixtral", Some("model.gguf"), Some("gguf"));
}

/// 4 experts, 2 per token, not renormalized, plus a shared expert behind a sigmoid gate; QKV
/// bias.
#[test]
fn qwen2_moe_shared_expert_safetensors() {
    check("qwen2_moe", None, None);
}

/// llama.cpp's `qwen2moe`: stacked experts, the shared expert's `ffn_*_shexp` tensors.
#[test]
fn qwen2_moe_gguf() {
    check("qwen2_moe", Some("model.gguf"), Some("gguf"));
}

/// 8 experts, 2 per token, not renormalized, a dense layer between sparse ones, q/k norms.
#[test]
fn qwen3_moe_with_a_dense_layer() {
    check("qwen3_moe", None, None);
}

/// gpt-oss: biases on attention's four projections, a sink logit per head, a window of 8
/// on alternate layers, YaRN (truncate false), a router with a bias and experts with biases
/// and a clamped SwiGLU, stored as transformers stores them (stacked, inputs first, gate and
/// up interleaved).
#[test]
fn gpt_oss_sinks_biases_and_clamped_experts() {
    check("gpt_oss", None, None);
}

/// gpt-oss's experts in MXFP4 as OpenAI publishes them, against transformers' own reader;
/// held as the checkpoint's blocks.
#[test]
fn gpt_oss_mxfp4_experts() {
    check("gpt_oss_mxfp4", None, None);
    let path = fixtures().join("models/gpt_oss_mxfp4");
    let loaded = model::load(&path).expect("load");
    let storage = loaded.model.linear_storage();
    assert!(storage.contains("MXFP4"), "experts held as {storage}");
}

/// llama.cpp's `gpt-oss` GGUF: the MXFP4 stacks in ggml's type with `.bias` tensors beside,
/// the sinks, `post_attention_norm`, windows on every other layer; YaRN's range truncated as
/// llama.cpp computes it.
#[test]
fn gpt_oss_gguf() {
    check("gpt_oss_mxfp4", Some("model.gguf"), Some("gguf"));
}

/// Each step's largest logit move between `a` and `b`, relative to the step's largest logit,
/// in increasing order.
fn relative_moves<'a>(steps: impl Iterator<Item = (&'a [f32], &'a [f32])>) -> Vec<f32> {
    let mut moved: Vec<f32> = steps
        .map(|(a, b)| max_abs_diff(a, b) / a.iter().fold(0f32, |m, v| m.max(v.abs())))
        .collect();
    moved.sort_by(f32::total_cmp);
    moved
}

/// `--cpu-activations int8` on K-quant weights (the tiny Q4_K/Q6_K/Q8_0 Llama of
/// `generate_kquant.py`): one-token steps stay within the activations' rounding of the exact
/// path; batched steps likewise where the CPU has the int8 panels, and do not change at all
/// where it has not.
#[test]
fn int8_activations_on_k_quants_stay_near_the_exact_path() {
    use ferrite_engine::model::LoadOptions;
    use ferrite_kernels::quant::{GgmlActivations, Isa, panels_name};
    let path = fixtures().join("models/llama_kquant/model.gguf");
    let exact = model::load(&path).expect("load");
    let int8 = model::load_with(
        &path,
        LoadOptions {
            ggml_activations: GgmlActivations::Int8,
            ..LoadOptions::default()
        },
    )
    .expect("load with int8 activations");
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 256).collect();
    let fed: Vec<u32> = (0..24).map(|i| (i * 11 + 3) % 256).collect();
    let a = decode_logits(&exact.model, &prompt, &fed);
    let b = decode_logits(&int8.model, &prompt, &fed);
    // Relative to the step's largest logit. A random-weight model is far more sensitive than a
    // trained one: most steps move by 1-2%, but a few tokens' hidden states carry an outlier
    // that leaves the rest of its 32-block with 2-3 bits (token 3 moves its logits by half).
    // The default model's steps move by 2.5% at most (golden_smollm2.rs).
    let moved = relative_moves(a.iter().map(Vec::as_slice).zip(b.iter().map(Vec::as_slice)));
    eprintln!("relative moves: {moved:?}");
    assert!(moved[0] > 0.0, "the int8 path was not taken");
    let median = moved[moved.len() / 2];
    assert!(
        median < 0.03,
        "the median step moved by {median} of its largest logit"
    );
    let batched = |m: &model::LoadedModel| prefill_logits(&m.model, &prompt, LogitsWanted::All);
    let (a, b) = (batched(&exact), batched(&int8));
    if panels_name(Isa::best()).is_none() {
        assert_eq!(a, b, "without the int8 panels prefill is exact");
        return;
    }
    // A prompt's tokens take two int8 terms each in the panels (Q4_K's, and Q8_0's with VNNI;
    // Q6_K's stay on the tiles): close to exact, a thousandth of the one-term moves above.
    let vocab = a.len() / prompt.len();
    let moved = relative_moves(a.chunks(vocab).zip(b.chunks(vocab)));
    eprintln!("prefill's relative moves: {moved:?}");
    let (median, most) = (moved[moved.len() / 2], moved[moved.len() - 1]);
    assert!(most > 0.0, "the panels were not taken");
    assert!(
        median < 1e-3 && most < 0.01,
        "prefill moved by {median} (median) and {most} (most) of the largest logit"
    );
}
