use std::collections::HashMap;
use std::path::Path;

use crate::engine::{Engine, EngineConfig, TokenEvent};
use crate::model::{BatchForward, LogitsWanted};
use crate::sampler::{SampledToken, SamplingParams, argmax, token_nll, top_logprobs};

fn tiny() -> crate::model::LoadedModel {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2");
    crate::model::load(&dir).expect("tiny model")
}

/// A prompt of `n` ids spread over the tiny model's vocabulary.
fn prompt(n: usize, vocab: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 101 + 11) % vocab as u32)
        .collect()
}

/// Runs `requests` to the end; each request's events, in order.
fn run(
    e: &mut Engine,
    requests: &[(u64, &[u32], SamplingParams)],
) -> HashMap<u64, Vec<TokenEvent>> {
    for (id, p, params) in requests {
        e.add_request(*id, p.to_vec(), params.clone()).expect("add");
    }
    let mut events: HashMap<u64, Vec<TokenEvent>> = HashMap::new();
    while e.has_unfinished() {
        let out = e.step().expect("step");
        assert!(out.failed.is_empty(), "{:?}", out.failed);
        for ev in out.events {
            events.entry(ev.id).or_default().push(ev);
        }
    }
    events
}

fn scored(max_tokens: usize, top: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        prompt_logprobs: Some(top),
        ..SamplingParams::greedy(max_tokens)
    }
}

/// What one forward of the whole prompt gives each of its tokens from the second: its logprob
/// (f64) and the `top` most likely ids there; and the greedy token after the prompt.
fn reference(
    model: &crate::model::LlamaModel,
    p: &[u32],
    top: usize,
) -> (Vec<(f64, Vec<u32>)>, u32) {
    let vocab = model.config().vocab_size;
    let logits = BatchForward::new(model, 1, p.len())
        .expect("KV cache")
        .run(&[p], LogitsWanted::All)
        .expect("forward");
    let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
    let scores = (rows.iter().zip(&p[1..]))
        .map(|(row, &t)| {
            let ids = top_logprobs(row, top).into_iter().map(|(i, _)| i).collect();
            (-token_nll(row, t), ids)
        })
        .collect();
    (scores, argmax(rows[p.len() - 1]))
}

fn assert_scores(got: &[SampledToken], p: &[u32], want: &[(f64, Vec<u32>)], top: usize) {
    assert_eq!(
        got.len(),
        p.len() - 1,
        "one score per prompt token from the second"
    );
    for (i, (g, (logprob, ids))) in got.iter().zip(want).enumerate() {
        assert_eq!(g.id, p[i + 1], "position {}", i + 1);
        assert!(
            (f64::from(g.logprob) - logprob).abs() < 2e-3,
            "position {}: {} against {logprob}",
            i + 1,
            g.logprob
        );
        assert_eq!(g.top.len(), top);
        let got_ids: Vec<u32> = g.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(&got_ids, ids, "position {}'s most likely tokens", i + 1);
    }
}

/// A scored prompt of 40 tokens, run in chunks of at most 16 beside a decoding request and a
/// second scored request whose prompt is in the prefix cache already: each prompt token's
/// score is what one forward of the whole prompt gives it, once, on the request's first
/// token; the cached prompt is computed again all the same; the tokens drawn after are the
/// greedy ones. With and without async scheduling.
#[test]
fn a_scored_prompt_gets_each_tokens_logprob_once_as_one_forward_gives_it() {
    for async_scheduling in [false, true] {
        let loaded = tiny();
        let vocab = loaded.model.config().vocab_size;
        let (long, short) = (prompt(40, vocab, 1), prompt(37, vocab, 2));
        let (want_long, next_long) = reference(&loaded.model, &long, 3);
        let (want_short, _) = reference(&loaded.model, &short, 0);
        let cfg = EngineConfig {
            max_model_len: Some(128),
            kv_cache_bytes: 8 << 20,
            max_num_batched_tokens: 16,
            async_scheduling,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(loaded.model, vec![], cfg).expect("engine");
        // The short prompt is cached first, by a request that does not score it.
        let plain = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(2)
        };
        run(&mut e, &[(9, &short, plain.clone())]);
        let events = run(
            &mut e,
            &[
                (1, &long, scored(3, 3)),
                (2, &short, scored(2, 0)),
                (3, &short, plain),
            ],
        );
        let (first, rest) = events[&1].split_first().expect("tokens");
        assert_scores(&first.prompt_logprobs, &long, &want_long, 3);
        assert!(rest.iter().all(|ev| ev.prompt_logprobs.is_empty()));
        assert_eq!(
            first.token.id, next_long,
            "the greedy token after the prompt"
        );
        assert_eq!(events[&1].len(), 3);
        let short_first = &events[&2][0];
        assert_scores(&short_first.prompt_logprobs, &short, &want_short, 0);
        assert_eq!(
            short_first.cached_tokens,
            Some(0),
            "a scored prompt is computed whole"
        );
        // The plain request beside it found the cached blocks, and scores nothing.
        assert_eq!(events[&3][0].cached_tokens, Some(32));
        assert!(events[&3][0].prompt_logprobs.is_empty());
    }
}

/// A scored request preempted in its prompt (a KV cache of 5 blocks of 16, shared with a
/// decoding request) computes it again, and scores each token once.
#[test]
fn a_scored_prompt_preempted_midway_is_scored_once() {
    let loaded = tiny();
    let vocab = loaded.model.config().vocab_size;
    let c = loaded.model.config();
    let per_token = c.num_layers * 2 * c.num_kv_heads * c.head_dim * 4;
    let (long, other) = (prompt(60, vocab, 3), prompt(20, vocab, 4));
    let (want, _) = reference(&loaded.model, &long, 1);
    let cfg = EngineConfig {
        max_model_len: Some(64),
        kv_cache_bytes: 5 * 16 * per_token,
        max_num_batched_tokens: 8,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(loaded.model, vec![], cfg).expect("engine");
    let decoding = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(24)
    };
    let events = run(&mut e, &[(2, &other, decoding), (1, &long, scored(2, 1))]);
    assert!(
        e.stats().preemptions > 0,
        "the scored request was to be preempted"
    );
    assert_scores(&events[&1][0].prompt_logprobs, &long, &want, 1);
}
