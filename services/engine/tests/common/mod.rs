//! Shared by the engine's integration tests: fixture paths and a one-sequence forward.

#![allow(dead_code)] // each test binary uses part of this module

use std::path::PathBuf;

use ferrite_engine::kv_cache::{BlockTable, KvBlockPool, KvCache, blocks_for};
use ferrite_engine::model::{LlamaModel, LogitsWanted, SeqChunk};

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
    let c = model.config();
    let block_size = 16;
    let n_blocks = blocks_for(tokens.len(), block_size);
    let mut kv = KvCache::new(
        c.num_layers,
        n_blocks,
        block_size,
        c.num_kv_heads,
        c.head_dim,
    );
    let mut pool = KvBlockPool::new(n_blocks as u32);
    let mut table = BlockTable::default();
    assert!(pool.allocate_into(n_blocks, &mut table));
    let chunk = SeqChunk {
        tokens,
        start_pos: 0,
        block_table: table.blocks(),
        logits: wanted,
    };
    model.forward(&[chunk], &mut kv).expect("forward")
}

/// Prefills `prompt`, then feeds `fed` one token per forward (decode steps over the cache), and
/// returns the next-token logits of each of those steps.
pub fn decode_logits(model: &LlamaModel, prompt: &[u32], fed: &[u32]) -> Vec<Vec<f32>> {
    let c = model.config();
    let block_size = 4; // small, so the steps cross block boundaries
    let n_blocks = blocks_for(prompt.len() + fed.len(), block_size);
    let mut kv = KvCache::new(
        c.num_layers,
        n_blocks,
        block_size,
        c.num_kv_heads,
        c.head_dim,
    );
    let mut pool = KvBlockPool::new(n_blocks as u32);
    let mut table = BlockTable::default();
    assert!(pool.allocate_into(n_blocks, &mut table));
    let prefill = SeqChunk {
        tokens: prompt,
        start_pos: 0,
        block_table: table.blocks(),
        logits: LogitsWanted::None,
    };
    model.forward(&[prefill], &mut kv).expect("prefill");
    fed.iter()
        .enumerate()
        .map(|(i, tok)| {
            let step = SeqChunk {
                tokens: std::slice::from_ref(tok),
                start_pos: prompt.len() + i,
                block_table: table.blocks(),
                logits: LogitsWanted::Last,
            };
            model.forward(&[step], &mut kv).expect("decode step")
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
