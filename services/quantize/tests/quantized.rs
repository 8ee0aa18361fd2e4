//! Weight-only quantized models: `quantize_checkpoint` output (checked independently by a numpy
//! script), loading it back, quantizing at load, and perplexity.

// The engine's test helpers (fixture paths, a one-sequence forward), shared rather than copied.
#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use ferrite_engine::model::kv::KvDtype;
use ferrite_engine::model::{self, LoadOptions, LoadQuantize, LogitsWanted};
use ferrite_engine::sampler::token_nll;
use ferrite_kernels::wq::WqFormat;
use ferrite_quantize::eval::perplexity;
use ferrite_quantize::quantize_checkpoint;

fn qwen2() -> std::path::PathBuf {
    fixtures().join("models/qwen2")
}

fn first_logits(path: &Path, options: LoadOptions, prompt: &[u32]) -> Vec<f32> {
    let loaded = model::load_with(path, options).unwrap_or_else(|e| panic!("{e}"));
    prefill_logits(&loaded.model, prompt, LogitsWanted::Last)
}

fn prompt() -> Vec<u32> {
    let expected = read_json(&qwen2().join("expected.json"));
    ids(&expected["cases"][1]["prompt_token_ids"])
}

/// Each format: the written checkpoint passes the numpy check, loads as GPTQ, and gives exactly
/// the logits of quantizing at load; W8 stays close to the original.
#[test]
fn quantized_checkpoints_load_and_match_quantizing_at_load() {
    let prompt = prompt();
    let original = first_logits(&qwen2(), LoadOptions::default(), &prompt);
    let tmp = tempdir();
    for name in ["w8g32", "w4g32", "w4pc-sym", "w2g64", "w4g128-bf16"] {
        let format: WqFormat = name.parse().expect("format");
        let out = tmp.join(name);
        let report = quantize_checkpoint(&qwen2(), &out, format).expect("quantize");
        assert_eq!(report.quantized_layers, 2 * 7, "{name}");
        let check = Command::new("python3")
            .arg(fixtures().join("quant/gptq_check.py"))
            .arg(qwen2())
            .arg(&out)
            .output()
            .expect("python3");
        assert!(
            check.status.success(),
            "{name}: gptq_check.py: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let from_file = first_logits(&out, LoadOptions::default(), &prompt);
        let at_load = first_logits(
            &qwen2(),
            LoadOptions {
                quantize: Some(LoadQuantize::Weights(format)),
                ..Default::default()
            },
            &prompt,
        );
        assert_eq!(
            from_file, at_load,
            "{name}: checkpoint vs --quantize at load"
        );
        let d = max_abs_diff(&from_file, &original);
        if name == "w8g32" {
            assert!(d < 0.05, "{name}: logits moved by {d}");
        }
        assert!(d > 0.0, "{name}: quantizing changed nothing");
        eprintln!("{name}: max |Δ logit| vs fp32 {d:.4}");
    }
}

#[test]
fn bad_quantize_requests_are_refused_with_the_reason() {
    let tmp = tempdir();
    let format: WqFormat = "w4g32".parse().expect("format");
    let gguf = qwen2().join("model.gguf");
    let e = quantize_checkpoint(&gguf, &tmp.join("a"), format).expect_err("gguf input");
    assert!(e.to_string().contains("--quantize"), "{e}");
    let done = tmp.join("done");
    quantize_checkpoint(&qwen2(), &done, format).expect("quantize");
    let e = quantize_checkpoint(&done, &tmp.join("b"), format).expect_err("twice");
    assert!(e.to_string().contains("already quantized"), "{e}");
    let e = quantize_checkpoint(&qwen2(), &done, format).expect_err("non-empty output");
    assert!(e.to_string().contains("not empty"), "{e}");
    // A GPTQ config this loader cannot honour is named.
    let act_order = tmp.join("act_order");
    std::fs::create_dir_all(&act_order).expect("mkdir");
    let weights = "model.safetensors";
    std::fs::copy(done.join(weights), act_order.join(weights)).expect("copy");
    let mut cfg = read_json(&done.join("config.json"));
    cfg["quantization_config"]["desc_act"] = true.into();
    std::fs::write(act_order.join("config.json"), cfg.to_string()).expect("write");
    let e = model::load(&act_order).expect_err("desc_act");
    assert!(e.to_string().contains("desc_act"), "{e}");
}

/// The perplexity loop against transformers' logits for the same 17 tokens (fixture).
#[test]
fn perplexity_matches_the_reference_logits() {
    let expected = read_json(&qwen2().join("expected.json"));
    let case = &expected["cases"][1];
    let tokens = ids(&case["prompt_token_ids"]);
    assert_eq!(tokens.len(), 17);
    let rows: Vec<Vec<f32>> = case["all_position_logits"]
        .as_array()
        .expect("rows")
        .iter()
        .map(floats)
        .collect();
    // ctx 16: one chunk of tokens[..16], positions 8..15 scored against the next token.
    let want: f64 = (8..15)
        .map(|p| token_nll(&rows[p], tokens[p + 1]))
        .sum::<f64>()
        / 7.0;
    let loaded = model::load(&qwen2()).expect("model");
    let got = perplexity(&loaded.model, &tokens, (16, None), KvDtype::F32).expect("perplexity");
    assert_eq!((got.chunks, got.scored_tokens), (1, 7));
    assert!(
        (got.mean_nll - want).abs() < 1e-4,
        "mean NLL {} vs reference {want}",
        got.mean_nll
    );
    assert!(
        perplexity(&loaded.model, &tokens, (32, None), KvDtype::F32).is_err(),
        "short text"
    );
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ferrite-quantized-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
