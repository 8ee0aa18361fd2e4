//! Every supported architecture against Hugging Face transformers, on tiny random-weight
//! checkpoints made by `tests/fixtures/models/generate.py` (fp32 reference; the script also
//! writes three of them as GGUF).

mod common;

use common::*;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::model::{self, LogitsWanted};
use ferrite_engine::sampler::SamplingParams;

/// fp32 against fp32: only summation order differs.
const LOGIT_TOLERANCE: f32 = 1e-3;

fn check(dir: &str, file: Option<&str>, expected_key: Option<&str>) {
    let base = fixtures().join("models").join(dir);
    let path = file.map_or(base.clone(), |f| base.join(f));
    let loaded = model::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
        max_model_len: Some(256),
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
