//! The default model (SmolLM2-135M-Instruct Q4_1 GGUF) against Hugging Face transformers in
//! fp32 on the same file: `tests/fixtures/golden/generate_smollm2.py` made the fixture.
//!
//! The model is pulled into the cache on first use (as `ferrite` does), or taken from
//! `FERRITE_TEST_GGUF`.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::model::{self, LoadedModel, LogitsWanted};
use ferrite_engine::registry;
use ferrite_engine::sampler::{SamplingParams, top_logprobs};
use ferrite_text::ChatMessage;

const TOP5_TOLERANCE: f32 = 1e-2;

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRITE_TEST_GGUF") {
        return PathBuf::from(p);
    }
    registry::resolve(registry::DEFAULT_MODEL, |m| {
        eprintln!("pulling {} for the golden tests", m.name)
    })
    .expect("the default model (set FERRITE_TEST_GGUF or let the test pull it)")
}

fn fixture() -> &'static serde_json::Value {
    static F: OnceLock<serde_json::Value> = OnceLock::new();
    F.get_or_init(|| read_json(&fixtures().join("golden/smollm2_q4_1.json")))
}

fn cases() -> &'static [serde_json::Value] {
    fixture()["cases"].as_array().expect("cases")
}

fn load() -> LoadedModel {
    model::load(&model_path()).expect("load the default model")
}

#[test]
fn fixture_covers_what_the_issue_asks() {
    let prompts = cases().iter().filter(|c| c.get("prompt").is_some()).count();
    let chats = cases()
        .iter()
        .filter(|c| c.get("messages").is_some())
        .count();
    assert!(
        prompts >= 8 && chats >= 1,
        "{prompts} prompts, {chats} chats"
    );
}

#[test]
fn prompt_token_ids_and_chat_rendering_match() {
    let loaded = load();
    let tok = loaded.tokenizer.expect("GGUF tokenizer");
    for case in cases() {
        let name = case["name"].as_str().unwrap_or("?");
        let want = ids(&case["prompt_token_ids"]);
        if let Some(prompt) = case["prompt"].as_str() {
            assert_eq!(
                tok.encode(prompt, true).expect("encode"),
                want,
                "{name}: prompt ids"
            );
        } else {
            let messages: Vec<ChatMessage> = case["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| {
                    ChatMessage::new(
                        m["role"].as_str().expect("role"),
                        m["content"].as_str().expect("content"),
                    )
                })
                .collect();
            let rendered = tok
                .chat_template()
                .expect("chat template")
                .render(&messages, true)
                .expect("render");
            assert_eq!(
                rendered,
                case["rendered"].as_str().expect("rendered"),
                "{name}: rendered chat"
            );
            assert_eq!(
                tok.encode(&rendered, false).expect("encode"),
                want,
                "{name}: chat prompt ids"
            );
        }
    }
}

#[test]
fn first_step_top5_logits_match() {
    let loaded = load();
    for case in cases() {
        let name = case["name"].as_str().unwrap_or("?");
        let logits = prefill_logits(
            &loaded.model,
            &ids(&case["prompt_token_ids"]),
            LogitsWanted::Last,
        );
        let top = top_logprobs(&logits, 5);
        for (i, want) in case["top5"].as_array().expect("top5").iter().enumerate() {
            let id = want["id"].as_u64().expect("id") as u32;
            let want_logit = want["logit"].as_f64().expect("logit") as f32;
            let got = logits[id as usize];
            assert!(
                (got - want_logit).abs() < TOP5_TOLERANCE,
                "{name}: logit of top-{i} token {id} is {got}, reference {want_logit}"
            );
            assert_eq!(top[i].0, id, "{name}: top-{i} token");
        }
    }
}

/// All prompts at once through the engine (different lengths, chunked prefill mixed with
/// decode): the first 16 greedy tokens of each equal the reference.
#[test]
fn greedy_continuations_match_in_one_batch() {
    let loaded = load();
    let cfg = EngineConfig {
        max_model_len: Some(1024),
        max_num_batched_tokens: 96,
        kv_cache_bytes: 256 << 20,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(loaded.model, vec![], cfg).expect("engine");
    let requests = cases()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as u64,
                ids(&c["prompt_token_ids"]),
                SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(32)
                },
            )
        })
        .collect();
    let out = engine
        .run_to_completion(requests, |_| true)
        .expect("generate");
    let mut full_matches = 0;
    for (i, case) in cases().iter().enumerate() {
        let want = ids(&case["greedy_token_ids"]);
        let got = out[&(i as u64)].token_ids();
        assert_eq!(
            got[..16],
            want[..16],
            "{}: first 16 greedy tokens",
            case["name"]
        );
        full_matches += usize::from(got == want);
    }
    eprintln!(
        "{full_matches}/{} prompts match all 32 greedy tokens",
        cases().len()
    );
}
