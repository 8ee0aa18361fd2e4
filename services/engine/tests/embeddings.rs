//! Embeddings requests ([`SamplingParams::embed`]) against the model card's recipe, on a tiny
//! random model laid out as Qwen3-Embedding is published (`tests/fixtures/models/
//! generate_embed.py`: transformers' `AutoModel`, the last token's hidden state, normalized).

mod common;

use std::collections::HashMap;

use common::*;
use ferrite_engine::engine::{EmbedParams, Engine, EngineConfig};
use ferrite_engine::error::EngineError;
use ferrite_engine::model::{self, pooling::PoolingMode};
use ferrite_engine::sampler::SamplingParams;

/// fp32 against fp32, normalized: only summation order differs.
const TOLERANCE: f32 = 1e-4;

fn embed(dimensions: Option<usize>) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        embed: Some(EmbedParams {
            normalize: true,
            dimensions,
            classify: false,
        }),
        ..SamplingParams::greedy(1)
    }
}

/// The base model's weights (no `model.` prefix, no LM head) load; its sentence-transformers
/// files say last token, normalized; each prompt's embedding, whole and cut to 16 values, is
/// transformers', while a generation shares the steps (its rows before theirs) and prefills
/// are chunked, several ending in one step.
#[test]
fn embeddings_match_the_model_cards_recipe() {
    let dir = fixtures().join("models/qwen3_embed");
    let loaded = model::load(&dir).expect("embedding model");
    let p = loaded.pooling;
    assert_eq!(
        (p.normalize, p.refused, p.mode),
        (true, None, Some(PoolingMode::LastToken))
    );
    let expected = read_json(&dir.join("expected.json"));
    let cases = expected["cases"].as_array().expect("cases");
    let cfg = EngineConfig {
        max_model_len: Some(128),
        max_num_batched_tokens: 24,
        kv_cache_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(loaded.model, vec![], cfg).expect("engine");
    let generation = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(12)
    };
    let mut requests = vec![(99, ids(&cases[0]["prompt_token_ids"]), generation)];
    for (i, c) in cases.iter().enumerate() {
        let prompt = ids(&c["prompt_token_ids"]);
        requests.push((2 * i as u64, prompt.clone(), embed(None)));
        requests.push((2 * i as u64 + 1, prompt, embed(Some(16))));
    }
    let mut got: HashMap<u64, Vec<f32>> = HashMap::new();
    let out = engine
        .run_to_completion(requests, |ev| {
            if let Some(e) = &ev.embedding {
                got.insert(ev.id, e.clone());
            }
            true
        })
        .expect("run");
    assert_eq!(out[&99].tokens.len(), 12, "the generation beside them");
    assert_eq!(
        got.len(),
        6,
        "one embedding per embeddings request, none for the generation"
    );
    for (i, c) in cases.iter().enumerate() {
        for (id, key) in [
            (2 * i as u64, "embedding"),
            (2 * i as u64 + 1, "embedding_16"),
        ] {
            let want = floats(&c[key]);
            let d = max_abs_diff(&got[&id], &want);
            assert!(d < TOLERANCE, "prompt {i} {key}: differs by {d}");
            assert_eq!(out[&id].tokens.len(), 1);
        }
    }
}

/// What an embeddings request cannot ask is refused before it runs, naming why.
#[test]
fn bad_embeddings_requests_are_refused() {
    let dir = fixtures().join("models/qwen3_embed");
    let loaded = model::load(&dir).expect("embedding model");
    let mut engine = Engine::new(loaded.model, vec![], EngineConfig::default()).expect("engine");
    let two_tokens = SamplingParams {
        max_tokens: 2,
        ..embed(None)
    };
    for (params, says) in [
        (two_tokens, "one token"),
        (embed(Some(0)), "dimensions must be 1 to 64"),
        (embed(Some(65)), "dimensions must be 1 to 64"),
    ] {
        match engine.add_request(1, vec![5, 6, 7], params) {
            Err(EngineError::InvalidRequest(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("expected a refusal saying {says:?}, got {other:?}"),
        }
    }
}
