//! Shared by the engine's integration tests, and by ferrite-quantize's (which include this file
//! by its path): fixture paths and a one-sequence forward.

#![allow(dead_code)] // each test binary uses part of this module

pub mod reference;

use std::collections::HashMap;
use std::path::PathBuf;

use ferrite_engine::engine::Engine;
use ferrite_engine::model::{BatchForward, LlamaModel, LogitsWanted};
use ferrite_engine::sampler::SamplingParams;

/// The default model's file: `FERRITE_TEST_GGUF`, else pulled into the cache as `ferrite` does.
pub fn default_model_path() -> PathBuf {
    std::env::var_os("FERRITE_TEST_GGUF").map_or_else(
        || {
            ferrite_engine::registry::resolve(ferrite_engine::registry::DEFAULT_MODEL, |_| {})
                .expect("the default model")
        },
        PathBuf::from,
    )
}

/// A fresh handle on `cuda:0` (its own stream), or `None` where there is no CUDA device, which
/// `test` says, unless `FERRITE_REQUIRE_CUDA` is set (the GPU host), where it fails instead.
pub fn gpu(test: &str) -> Option<std::sync::Arc<ferrite_kernels::cuda::Gpu>> {
    use ferrite_kernels::cuda::{self, Gpu};
    match ferrite_kernels::device::cuda_devices() {
        Ok(d) if !d.is_empty() => {
            let (gpu, _) = Gpu::open(0, &cuda::default_cache_dir()).expect("open cuda:0");
            Some(std::sync::Arc::new(gpu))
        }
        other => {
            assert!(
                std::env::var_os("FERRITE_REQUIRE_CUDA").is_none(),
                "FERRITE_REQUIRE_CUDA is set but there is no CUDA device: {other:?}"
            );
            eprintln!("{test}: no CUDA device here, nothing to compare");
            None
        }
    }
}

/// Largest difference of the first token's top-5 log-probabilities between two generations of
/// one prompt, by `want`'s ranking (a token `got` does not rank: infinite).
pub fn first_logprob_gap(
    want: &ferrite_engine::engine::Generation,
    got: &ferrite_engine::engine::Generation,
) -> f32 {
    let got: std::collections::HashMap<u32, f32> = got.tokens[0].top.iter().copied().collect();
    want.tokens[0]
        .top
        .iter()
        .map(|(id, lp)| got.get(id).map_or(f32::INFINITY, |g| (g - lp).abs()))
        .fold(0.0, f32::max)
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// Runs `tokens` as one prefill through `model` and returns the logits `wanted`.
pub fn prefill_logits(model: &LlamaModel, tokens: &[u32], wanted: LogitsWanted) -> Vec<f32> {
    BatchForward::new(model, 1, tokens.len())
        .expect("KV cache")
        .run(&[tokens], wanted)
        .expect("forward")
}

/// Prefills `prompt`, then feeds `fed` one token per forward (decode steps over the cache), and
/// returns the next-token logits of each of those steps.
pub fn decode_logits(model: &LlamaModel, prompt: &[u32], fed: &[u32]) -> Vec<Vec<f32>> {
    // Small blocks, so the steps cross block boundaries.
    let mut run =
        BatchForward::with_block_size(model, 1, prompt.len() + fed.len(), 4).expect("KV cache");
    run.run(&[prompt], LogitsWanted::None).expect("prefill");
    fed.iter()
        .enumerate()
        .map(|(i, tok)| {
            run.run_at(
                &[std::slice::from_ref(tok)],
                prompt.len() + i,
                LogitsWanted::Last,
            )
            .expect("decode step")
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `requests` (id, prompt, params) on `engine` to completion: the embedding (or a
/// classifier's logits) each embeddings request answered with, by its id.
pub fn embeddings_of(
    engine: &mut Engine,
    requests: Vec<(u64, Vec<u32>, SamplingParams)>,
) -> HashMap<u64, Vec<f32>> {
    let mut got = HashMap::new();
    engine
        .run_to_completion(requests, |ev| {
            if let Some(e) = &ev.embedding {
                got.insert(ev.id, e.clone());
            }
            true
        })
        .expect("run");
    got
}
