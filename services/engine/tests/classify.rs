//! Sequence classifiers ([`SamplingParams::classify`]) against transformers'
//! `AutoModelForSequenceClassification`, on tiny random models laid out as rerankers and
//! classifiers are published (`tests/fixtures/models/generate_classify.py`): a Qwen3 reranker
//! of one label scoring query-document pairs, a Llama classifier of three named labels whose
//! checkpoint has no LM head, and a causal Qwen3 made a reranker by two of its tokens
//! (`--classifier-from-tokens`, as Qwen3-Reranker is served).

mod common;

use std::collections::HashMap;

use common::*;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::error::EngineError;
use ferrite_engine::model::{self, LoadOptions};
use ferrite_engine::sampler::SamplingParams;

/// fp32 against fp32: only summation order differs.
const TOLERANCE: f32 = 1e-4;

/// Each input's logits from one engine, every request sent at once with prefills chunked
/// (several end in one step), by the engine's request id (the input's index).
fn logits_of(dir: &str, inputs: &[Vec<u32>]) -> HashMap<u64, Vec<f32>> {
    logits_by_tokens(dir, &[], inputs)
}

/// [`logits_of`] the model in `dir` made a classifier by its `tokens` (none: as it is).
fn logits_by_tokens(dir: &str, tokens: &[&str], inputs: &[Vec<u32>]) -> HashMap<u64, Vec<f32>> {
    let options = LoadOptions {
        classifier_tokens: tokens.iter().map(|t| t.to_string()).collect(),
        ..LoadOptions::default()
    };
    let loaded = model::load_with(&fixtures().join(dir), options).expect("classifier");
    let cfg = EngineConfig {
        max_model_len: Some(128),
        max_num_batched_tokens: 40,
        kv_cache_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(loaded.model, vec![], cfg).expect("engine");
    let requests = (inputs.iter().enumerate())
        .map(|(i, ids)| (i as u64, ids.clone(), SamplingParams::classify()))
        .collect();
    let got = embeddings_of(&mut engine, requests);
    assert_eq!(got.len(), inputs.len(), "one answer per request");
    got
}

/// Each pair's answer is one logit, its `logit`.
fn assert_logits_of_pairs(got: &HashMap<u64, Vec<f32>>, pairs: &[serde_json::Value]) {
    for (i, p) in pairs.iter().enumerate() {
        let want = p["logit"].as_f64().expect("logit") as f32;
        let [logit] = got[&(i as u64)][..] else {
            panic!("pair {i}: {:?} is not one logit", got[&(i as u64)]);
        };
        assert!(
            (logit - want).abs() < TOLERANCE,
            "pair {i}: {logit} != {want}"
        );
    }
}

/// The reranker's logit of each query-document pair (as the tokenizer joins them) is
/// transformers'; the classifier's three logits of each text too, and its labels are its
/// config's `id2label`, in order.
#[test]
fn classifiers_match_transformers() {
    let expected = read_json(&fixtures().join("models/qwen3_rerank/expected.json"));
    let pairs = expected["pairs"].as_array().expect("pairs");
    let inputs: Vec<Vec<u32>> = pairs.iter().map(|p| ids(&p["input_ids"])).collect();
    let got = logits_of("models/qwen3_rerank", &inputs);
    assert_logits_of_pairs(&got, pairs);

    let dir = fixtures().join("models/llama_classify");
    let labels = model::load(&dir)
        .expect("classifier")
        .model
        .config()
        .labels
        .clone();
    assert_eq!(
        labels,
        Some(vec!["negative".into(), "neutral".into(), "positive".into()])
    );
    let expected = read_json(&dir.join("expected.json"));
    let texts = expected["texts"].as_array().expect("texts");
    let inputs: Vec<Vec<u32>> = texts.iter().map(|t| ids(&t["input_ids"])).collect();
    let got = logits_of("models/llama_classify", &inputs);
    for (i, t) in texts.iter().enumerate() {
        let d = max_abs_diff(&got[&(i as u64)], &floats(&t["logits"]));
        assert!(d < TOLERANCE, "text {i}: logits differ by {d}");
    }
}

/// A causal LM made a reranker by two of its tokens scores each pair by the second's logit
/// minus the first's (Qwen3-Reranker's card: the second's probability over the two is the
/// sigmoid of that), from a GGUF file too; by three tokens it has their three logits.
#[test]
fn causal_lms_classify_by_their_tokens() {
    let dir = "models/qwen3_yes_no";
    let expected = read_json(&fixtures().join(dir).join("expected.json"));
    let pairs = expected["pairs"].as_array().expect("pairs");
    let inputs: Vec<Vec<u32>> = pairs.iter().map(|p| ids(&p["input_ids"])).collect();
    let got = logits_by_tokens(dir, &["n", "y"], &inputs);
    assert_logits_of_pairs(&got, pairs);
    for (i, p) in pairs.iter().enumerate() {
        let logit = got[&(i as u64)][0] as f64;
        let score = 1.0 / (1.0 + (-logit).exp());
        let card = p["score"].as_f64().expect("score");
        assert!((score - card).abs() < 1e-4, "pair {i}: {score} != {card}");
    }
    // A GGUF file's vocabulary and head (the tiny Qwen2's, F32): its last position's logits.
    let qwen2 = read_json(&fixtures().join("models/qwen2/expected.json"));
    let case = &qwen2["cases"][0];
    let prompt = ids(&case["prompt_token_ids"]);
    let got = logits_by_tokens("models/qwen2/model.gguf", &["n", "y"], &[prompt]);
    let last = floats(&case["first_logits"]);
    let want = last[b'y' as usize] - last[b'n' as usize];
    assert!(
        (got[&0][0] - want).abs() < TOLERANCE,
        "GGUF: {:?} != {want}",
        got[&0]
    );

    let got = logits_by_tokens(dir, &["a", "b", "c"], &inputs[..1]);
    let last = floats(&pairs[0]["last_logits"]);
    let want: Vec<f32> = [b'a', b'b', b'c']
        .iter()
        .map(|&b| last[b as usize])
        .collect();
    let d = max_abs_diff(&got[&0], &want);
    assert!(d < TOLERANCE, "three tokens: {:?} != {want:?}", got[&0]);

    let tokens = || LoadOptions {
        classifier_tokens: vec!["n".into(), "y".into()],
        ..LoadOptions::default()
    };
    let e = model::load_dummy("small", 7, tokens()).expect_err("random weights");
    assert!(e.to_string().contains("no tokenizer"), "{e}");
    for (dir, tokens, says) in [
        ("models/qwen3_yes_no", vec!["nope"], "`nope` is not a token"),
        (
            "models/qwen3_rerank",
            vec!["n", "y"],
            "a sequence classifier already",
        ),
    ] {
        let options = LoadOptions {
            classifier_tokens: tokens.into_iter().map(str::to_owned).collect(),
            ..LoadOptions::default()
        };
        let e = model::load_with(&fixtures().join(dir), options).expect_err("refused");
        assert!(e.to_string().contains(says), "{e}");
    }
}

/// A classifier generates nothing, and a generative model classifies nothing: each is
/// refused before it runs, saying why.
#[test]
fn classifiers_and_generators_refuse_each_others_requests() {
    let load = |dir: &str| {
        let loaded = model::load(&fixtures().join(dir)).expect("model");
        Engine::new(loaded.model, vec![], EngineConfig::default()).expect("engine")
    };
    let mut classifier = load("models/llama_classify");
    let mut generator = load("models/qwen3");
    for (engine, params, says) in [
        (
            &mut classifier,
            SamplingParams::greedy(4),
            "generates no text",
        ),
        (
            &mut generator,
            SamplingParams::classify(),
            "not a sequence classifier",
        ),
    ] {
        match engine.add_request(1, vec![5, 6, 7], params) {
            Err(EngineError::InvalidRequest(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("expected a refusal saying {says:?}, got {other:?}"),
        }
    }
}
