//! Bad input gets a clear error, never a panic: corrupt and truncated files, unsupported
//! architectures and tensor types, missing files, bad requests.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use ferrite_engine::EngineError;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::model;
use ferrite_engine::sampler::SamplingParams;

fn gguf_bytes() -> Vec<u8> {
    std::fs::read(fixtures().join("models/qwen2/model.gguf")).expect("fixture")
}

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

/// The error loading `path` gives, as the engine reports it (its kind labels metrics).
fn load_err(path: &Path) -> EngineError {
    match model::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.into(),
    }
}

/// Position just after the first occurrence of `needle`.
fn after(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("needle")
        + needle.len()
}

#[test]
fn truncated_gguf_at_every_region_is_refused() {
    let full = gguf_bytes();
    // Inside the magic, the header, the metadata, the tensor directory and the tensor data.
    for cut in [2, 10, 200, full.len() / 3, full.len() - 1] {
        let p = scratch(&format!("truncated-{cut}.gguf"), &full[..cut]);
        let e = load_err(&p);
        assert_eq!(e.kind(), "bad_gguf", "cut at {cut}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains("truncated") || msg.contains("end of the file") || msg.contains("magic"),
            "{msg}"
        );
    }
}

#[test]
fn corrupt_gguf_is_refused() {
    let mut bytes = gguf_bytes();
    bytes[..4].copy_from_slice(b"GGXF");
    let e = load_err(&scratch("magic.gguf", &bytes));
    assert!(e.to_string().contains("bad magic"), "{e}");

    let mut bytes = gguf_bytes();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let e = load_err(&scratch("v1.gguf", &bytes));
    assert!(e.to_string().contains("version 1"), "{e}");

    // A metadata count far beyond what the file could hold must not allocate or loop.
    let mut bytes = gguf_bytes();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = load_err(&scratch("count.gguf", &bytes));
    assert!(e.to_string().contains("larger than the file"), "{e}");
}

#[test]
fn unsupported_architecture_is_named() {
    let mut bytes = gguf_bytes();
    let at = after(&bytes, b"general.architecture");
    // value type (u32) + string length (u64), then the 5 bytes "qwen2".
    let s = at + 4 + 8;
    assert_eq!(&bytes[s..s + 5], b"qwen2");
    bytes[s..s + 5].copy_from_slice(b"gpt-j");
    let e = load_err(&scratch("arch.gguf", &bytes));
    assert_eq!(e.kind(), "unsupported_architecture");
    assert!(e.to_string().contains("gpt-j"), "{e}");
}

#[test]
fn unsupported_tensor_type_is_named() {
    let mut bytes = gguf_bytes();
    // Tensor info: name, n_dims (u32), dims (u64 each), type (u32).
    let at = after(&bytes, b"token_embd.weight");
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
    let ty = at + 4 + 8 * n_dims;
    bytes[ty..ty + 4].copy_from_slice(&6u32.to_le_bytes()); // ggml Q5_0
    let e = load_err(&scratch("type.gguf", &bytes));
    assert_eq!(e.kind(), "unsupported_tensor_type");
    assert!(e.to_string().contains("token_embd.weight"), "{e}");
}

#[test]
fn missing_files_are_named() {
    let e = load_err(Path::new("/nonexistent/model.gguf"));
    assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
    let dir = std::env::temp_dir().join(format!("ferrite-empty-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let e = load_err(&dir);
    assert!(e.to_string().contains("config.json"), "{e}");
    let e = ferrite_engine::registry::resolve("no-such-model", |_| {}).expect_err("unknown name");
    assert!(
        e.to_string().contains("smollm2-135m"),
        "lists the known names: {e}"
    );
}

#[test]
fn bad_requests_are_refused_with_the_limit_named() {
    let loaded = model::load(&fixtures().join("models/qwen2")).expect("tiny model");
    let cfg = EngineConfig {
        max_model_len: Some(32),
        kv_cache_bytes: 4 << 20,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(loaded.model, vec![], cfg).expect("engine");
    let p = || SamplingParams::greedy(4);
    let e = engine.add_request(1, vec![], p()).expect_err("empty");
    assert!(e.to_string().contains("empty"), "{e}");
    let e = engine
        .add_request(2, vec![1; 32], p())
        .expect_err("too long");
    assert_eq!(e.kind(), "does_not_fit");
    assert!(e.to_string().contains("32"), "{e}");
    let e = engine
        .add_request(3, vec![1, 256], p())
        .expect_err("outside vocab");
    assert!(
        e.to_string().contains("256") && e.to_string().contains("vocabulary"),
        "{e}"
    );
    let e = engine
        .add_request(4, vec![1], SamplingParams { top_p: 1.5, ..p() })
        .expect_err("top_p");
    assert!(e.to_string().contains("top_p"), "{e}");
    let bias = |logit_bias| SamplingParams { logit_bias, ..p() };
    let e = engine
        .add_request(4, vec![1], bias(vec![(256, 1.0)]))
        .expect_err("bias outside vocab");
    assert!(
        e.to_string().contains("logit_bias") && e.to_string().contains("256"),
        "{e}"
    );
    let e = engine
        .add_request(4, vec![1], bias(vec![(3, -101.0)]))
        .expect_err("bias out of range");
    assert!(e.to_string().contains("logit_bias"), "{e}");
    engine.add_request(5, vec![1, 2], p()).expect("valid");
    let e = engine
        .add_request(5, vec![1, 2], p())
        .expect_err("duplicate");
    assert_eq!(e.kind(), "duplicate_request");
    // The refusals lost nothing: the valid request still runs to the end.
    let out = engine.run_to_completion(vec![], |_| true).expect("run");
    assert_eq!(out.len(), 1);
    assert_eq!(out[&5].tokens.len(), 4);
    assert_eq!(
        out[&5].finish,
        Some(ferrite_engine::engine::FinishReason::Length)
    );
    assert!(!engine.has_unfinished());
}

#[test]
fn a_kv_cache_too_small_for_one_sequence_is_refused() {
    let loaded = model::load(&fixtures().join("models/qwen2")).expect("tiny model");
    let cfg = EngineConfig {
        max_model_len: Some(4096),
        kv_cache_bytes: 1 << 20,
        ..EngineConfig::default()
    };
    let e = Engine::new(loaded.model, vec![], cfg).expect_err("too small");
    assert!(e.to_string().contains("lower max_model_len"), "{e}");
}

#[test]
fn aborting_frees_blocks_at_once() {
    let loaded = model::load(&fixtures().join("models/qwen2")).expect("tiny model");
    let cfg = EngineConfig {
        max_model_len: Some(64),
        kv_cache_bytes: 4 << 20,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(loaded.model, vec![], cfg).expect("engine");
    for id in 0..4 {
        engine
            .add_request(id, vec![3; 20], SamplingParams::greedy(30))
            .expect("add");
    }
    engine.step().expect("step");
    assert!(engine.stats().kv_blocks_used > 0);
    for id in 0..4 {
        assert!(engine.abort(id));
    }
    assert_eq!(engine.stats().kv_blocks_used, 0);
    assert!(!engine.has_unfinished());
}
