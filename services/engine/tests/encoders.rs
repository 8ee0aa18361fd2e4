//! Encoders ([`ferrite_engine::model::encoder`]) against sentence-transformers: tiny random
//! BERT (mean pooling) and XLM-RoBERTa (CLS pooling, its tensors under `roberta.`) laid out as
//! sentence-transformers publishes them, and each text's embedding as
//! `SentenceTransformer(dir).encode(text)` gives it (`tests/fixtures/models/generate_bert.py`).

mod common;

use common::*;
use ferrite_engine::engine::{EmbedParams, Engine, EngineConfig};
use ferrite_engine::error::EngineError;
use ferrite_engine::model::{self, LoadOptions, pooling::PoolingMode};
use ferrite_engine::sampler::SamplingParams;

/// fp32 against fp32, normalized: only summation order differs.
const TOLERANCE: f32 = 1e-4;

fn embed(dimensions: Option<usize>) -> SamplingParams {
    SamplingParams::embed(EmbedParams {
        normalize: true,
        dimensions,
        classify: false,
    })
}

/// Each fixture's texts tokenize to sentence-transformers' ids (special tokens added, nothing
/// padded), and their embeddings, whole and cut to 16 values, are sentence-transformers' when
/// they run together in steps too small for all of them: a prompt that does not fit what is
/// left of a step waits whole for the next (a step of 24 tokens, prompts of 4 to 47).
#[test]
fn encoders_embed_as_sentence_transformers_does() {
    for (name, mode) in [
        ("bert_embed", PoolingMode::Mean),
        ("xlmr_embed", PoolingMode::Cls),
    ] {
        let dir = fixtures().join("models").join(name);
        assert!(model::is_encoder_dir(&dir), "{name}");
        let loaded = model::load_encoder(&dir, &LoadOptions::default()).expect(name);
        assert_eq!(loaded.model.pooling(), mode, "{name}");
        assert!(loaded.pooling.normalize && loaded.pooling.refused.is_none());
        let tokenizer = loaded.tokenizer.expect("tokenizer");
        let expected = read_json(&dir.join("expected.json"));
        let cases = expected["cases"].as_array().expect("cases");
        let cfg = EngineConfig {
            max_num_batched_tokens: 24,
            kv_cache_bytes: 1 << 20,
            ..EngineConfig::default()
        };
        let mut engine = Engine::new(loaded.model, vec![], cfg).expect("engine");
        let mut requests = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let text = c["text"].as_str().expect("text");
            let prompt = tokenizer.encode(text, true).expect("encode");
            assert_eq!(prompt, ids(&c["token_ids"]), "{name}: {text:?}");
            // Cut to 6 tokens: the text's first ones, its special tokens kept.
            let at_most = tokenizer.encode_at_most(text, 6).expect("encode");
            match prompt.len() {
                ..=6 => assert_eq!(at_most, prompt, "{text:?}"),
                n => assert_eq!(
                    at_most,
                    [&prompt[..5], &prompt[n - 1..]].concat(),
                    "{text:?}"
                ),
            }
            requests.push((2 * i as u64, prompt.clone(), embed(None)));
            requests.push((2 * i as u64 + 1, prompt, embed(Some(16))));
        }
        let got = embeddings_of(&mut engine, requests);
        assert_eq!(got.len(), 2 * cases.len());
        for (i, c) in cases.iter().enumerate() {
            for (id, key) in [
                (2 * i as u64, "embedding"),
                (2 * i as u64 + 1, "embedding_16"),
            ] {
                let d = max_abs_diff(&got[&id], &floats(&c[key]));
                assert!(d < TOLERANCE, "{name} case {i} {key}: differs by {d}");
            }
        }
    }
}

/// An encoder generates nothing, serves no prompt longer than its positions, and is run as
/// stored: each is refused, saying why.
#[test]
fn what_an_encoder_cannot_do_is_refused() {
    let dir = fixtures().join("models/bert_embed");
    let loaded = model::load_encoder(&dir, &LoadOptions::default()).expect("bert");
    let mut engine = Engine::new(loaded.model, vec![], EngineConfig::default()).expect("engine");
    // 64 positions: the context is 65 (the token an embeddings request samples).
    assert_eq!(engine.max_model_len(), 65);
    match engine.add_request(1, vec![5, 6, 7], SamplingParams::greedy(4)) {
        Err(EngineError::InvalidRequest(m)) => assert!(m.contains("is an encoder"), "{m}"),
        other => panic!("a generation on an encoder: {other:?}"),
    }
    match engine.add_request(2, vec![5; 65], embed(None)) {
        Err(EngineError::DoesNotFit(m)) => assert!(m.contains("takes 64 at most"), "{m}"),
        other => panic!("65 tokens for 64 positions: {other:?}"),
    }
    let loaded = model::load_encoder(&dir, &LoadOptions::default()).expect("bert");
    let cfg = EngineConfig {
        max_model_len: Some(128),
        ..EngineConfig::default()
    };
    let e = Engine::new(loaded.model, vec![], cfg).expect_err("128 positions");
    assert!(e.to_string().contains("takes 64 tokens"), "{e}");
    let quantized = LoadOptions {
        quantize: Some(model::parse_quantize("rtn-w8a8").expect("format")),
        ..LoadOptions::default()
    };
    let e = model::load_encoder(&dir, &quantized).expect_err("quantized");
    assert!(e.to_string().contains("--quantize"), "{e}");
    // A decoder's loader names what it is.
    let e = model::load(&dir).expect_err("an encoder through the decoder's loader");
    assert!(e.to_string().contains("is an encoder"), "{e}");
}

/// Cross-encoders and classifiers: a BERT reranker (one label, its pooler and a biased head;
/// a pair's second segment of token type 1, as BERT's tokenizer gives it, which moves each
/// logit by 0.17 to 0.29) and an XLM-RoBERTa classifier of three named labels (RoBERTa's
/// dense-tanh-projection head), each pair and text scored as transformers'
/// `AutoModelForSequenceClassification` scores it.
#[test]
fn encoder_classifiers_score_as_transformers_does() {
    for (name, key) in [
        ("bert_rerank", "pairs"),
        ("xlmr_classify", "pairs"),
        ("xlmr_classify", "texts"),
    ] {
        let dir = fixtures().join("models").join(name);
        let loaded = model::load_encoder(&dir, &LoadOptions::default()).expect(name);
        let tokenizer = loaded.tokenizer.expect("tokenizer");
        let expected = read_json(&dir.join("expected.json"));
        let cases = expected[key].as_array().expect("cases");
        let mut engine =
            Engine::new(loaded.model, vec![], EngineConfig::default()).expect("engine");
        let labels = engine.labels().expect("a classifier").to_vec();
        let mut prompts = Vec::new();
        for c in cases {
            let ids = ids(&c["input_ids"]);
            let encoded = match (c["text"].as_str(), c["document"].as_str()) {
                (Some(text), _) => tokenizer.encode(text, true),
                (None, Some(doc)) => {
                    tokenizer.encode_pair(expected["query"].as_str().expect("query"), doc)
                }
                _ => panic!("{c}"),
            };
            assert_eq!(encoded.expect("encode"), ids, "{name}: {c}");
            prompts.push(ids);
        }
        let requests = (prompts.into_iter().enumerate())
            .map(|(i, p)| (i as u64, p, SamplingParams::classify()))
            .collect();
        let got = embeddings_of(&mut engine, requests);
        for (i, c) in cases.iter().enumerate() {
            let want = match c.get("logits") {
                Some(l) => floats(l),
                None => vec![c["logit"].as_f64().expect("logit") as f32],
            };
            let d = max_abs_diff(&got[&(i as u64)], &want);
            assert!(d < TOLERANCE, "{name} {key} {i}: differs by {d}");
            if let Some(label) = c["label"].as_str() {
                let best = (0..want.len())
                    .max_by(|&a, &b| got[&(i as u64)][a].total_cmp(&got[&(i as u64)][b]));
                assert_eq!(labels[best.expect("a label")], label);
            }
        }
    }
}
