//! Shared by the engine's integration tests: fixture paths and a one-sequence forward.

#![allow(dead_code)] // each test binary uses part of this module

pub mod reference;

use std::path::PathBuf;

use ferrite_engine::eval::BatchForward;
use ferrite_engine::model::{LlamaModel, LogitsWanted};

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
