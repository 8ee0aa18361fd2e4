//! Async scheduling gives every request the tokens and the ending that steps run one at a time
//! give it (greedy, seeded, penalties and logprobs sampled on the host or drawn by the ranks,
//! stop tokens, lengths,
//! chunked prefill, a waiting queue, prefix caching, preemption), leaks no block, drops the
//! pick of a request that ended (or failed alone) while its next step was in flight, and fails
//! both steps' requests when the step in flight fails.

use std::collections::HashMap;
use std::path::Path;

use crate::constraint::Constraint;
use crate::engine::tests::Closes;
use crate::engine::{Engine, EngineConfig, FinishReason, Generation};
use crate::error::EngineError;
use crate::sampler::{MAX_LOGPROBS, SamplingParams};
use crate::scheduler::SeqId;

fn tiny_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2")
}

/// The tiny model with `blocks` KV blocks of 16 tokens (None: 8 MiB), 16 tokens a step (so
/// prompts prefill in chunks) and 4 sequences at once (so requests wait).
pub(crate) fn engine(async_scheduling: bool, blocks: Option<usize>) -> Engine {
    let kv_cache_bytes = match blocks {
        // Bytes per block: what one layer's K and V of 16 tokens take, in f32.
        Some(n) => n * 16 * 2 * 2 * 2 * 16 * 4,
        None => 8 << 20,
    };
    let cfg = EngineConfig {
        max_model_len: Some(64),
        block_size: 16,
        max_num_batched_tokens: 16,
        max_num_seqs: 4,
        kv_cache_bytes,
        async_scheduling,
        ..EngineConfig::default()
    };
    let loaded = crate::model::load(&tiny_dir()).expect("tiny model");
    Engine::new(loaded.model, vec![2], cfg).expect("engine")
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(n)
    }
}

/// Eight requests of every kind the overlap must keep: lengths 1 to 40 tokens, prompts of
/// 3 to 30 tokens (two sharing a 20-token prefix), seeded draws, penalties with logprobs,
/// and stop tokens (`stops`, per request).
pub(crate) fn requests(stops: &HashMap<SeqId, u32>) -> Vec<(SeqId, Vec<u32>, SamplingParams)> {
    let shared: Vec<u32> = (0..20).map(|i| 30 + i).collect();
    let prompt = |id: u64, len: usize| -> Vec<u32> {
        (0..len as u64)
            .map(|i| (5 + id * 11 + i * 7) as u32 % 200 + 3)
            .collect()
    };
    let mut out = vec![
        (1, prompt(1, 3), greedy(1)),
        (2, prompt(2, 30), greedy(17)),
        (3, [shared.clone(), prompt(3, 5)].concat(), greedy(40)),
        (4, [shared, prompt(4, 2)].concat(), greedy(9)),
        (
            5,
            prompt(5, 12),
            SamplingParams {
                temperature: 0.9,
                top_k: 20,
                seed: Some(7),
                ..greedy(25)
            },
        ),
        (
            6,
            prompt(6, 7),
            SamplingParams {
                temperature: 0.7,
                frequency_penalty: 0.8,
                logprobs: Some(2),
                seed: Some(11),
                ..greedy(20)
            },
        ),
        (7, prompt(7, 9), greedy(30)),
        (8, prompt(8, 4), SamplingParams::greedy(33)),
    ];
    for (id, _, params) in &mut out {
        if let Some(&stop) = stops.get(id) {
            params.stop_token_ids = vec![stop];
        }
    }
    out
}

pub(crate) fn run(
    e: &mut Engine,
    reqs: Vec<(SeqId, Vec<u32>, SamplingParams)>,
) -> HashMap<SeqId, Generation> {
    let got = e.run_to_completion(reqs, |_| true).expect("run");
    assert!(!e.has_unfinished());
    assert_eq!(
        e.stats().kv_blocks_used,
        0,
        "blocks left held: {:?}",
        e.stats()
    );
    got
}

pub(crate) fn assert_same(a: &HashMap<SeqId, Generation>, b: &HashMap<SeqId, Generation>) {
    assert_eq!(a.len(), b.len());
    for (id, g) in a {
        let h = &b[id];
        assert_eq!(g.token_ids(), h.token_ids(), "request {id}");
        assert_eq!(g.finish, h.finish, "request {id}");
        // The batches differ (a request a stop token ended still runs in the step after), and
        // the CPU's sums with them in the last bits. A greedy pick the ranks drew (async
        // scheduling's chained launch) has no distribution on the host, so no logprob: the
        // request asked for none.
        for (t, u) in g.tokens.iter().zip(&h.tokens) {
            let close = (t.logprob - u.logprob).abs() <= 1e-4;
            let drawn = u.logprob.is_nan() && u.top.is_empty() && t.top.is_empty();
            assert!(
                close || (t.logprob.is_nan() && u.logprob.is_nan()) || drawn,
                "request {id}: {t:?} {u:?}"
            );
        }
    }
}

/// Stop tokens that end requests 2, 5 and 7 midway: their 4th, 6th and 3rd tokens when they
/// run to their length (a token that comes earlier too ends them earlier, as it should).
pub(crate) fn midway_stops() -> HashMap<SeqId, u32> {
    let free = run(&mut engine(false, None), requests(&HashMap::new()));
    [(2, 3), (5, 5), (7, 2)]
        .into_iter()
        .map(|(id, at)| (id, free[&id].tokens[at].id))
        .collect()
}

#[test]
fn async_scheduling_gives_the_tokens_and_endings_of_one_step_at_a_time() {
    let stops = midway_stops();
    let one_at_a_time = run(&mut engine(false, None), requests(&stops));
    let mut overlapped = engine(true, None);
    let got = run(&mut overlapped, requests(&stops));
    assert_same(&one_at_a_time, &got);
    for id in [2, 5, 7] {
        assert_eq!(got[&id].finish, Some(FinishReason::Stop), "request {id}");
    }
    // Again, now from the prefix cache's blocks of the first run: the same.
    assert_same(&one_at_a_time, &run(&mut overlapped, requests(&stops)));
    assert!(
        overlapped.stats().prefix_cache_hits > 0,
        "{:?}",
        overlapped.stats()
    );
}

#[test]
fn async_scheduling_under_preemption_gives_the_same_tokens() {
    // Room for 6 blocks of 16 tokens: four sequences of up to 64 tokens do not fit at once.
    let stops = midway_stops();
    let mut sync = engine(false, Some(6));
    let want = run(&mut sync, requests(&stops));
    let mut overlapped = engine(true, Some(6));
    let got = run(&mut overlapped, requests(&stops));
    assert!(
        overlapped.stats().preemptions > 0,
        "{:?}",
        overlapped.stats()
    );
    assert_same(&want, &got);
}

/// Runs `reqs` to completion one step at a time; returns what each request got and how many
/// steps were chained (launched before the draws of the one before were back).
fn run_chained(
    e: &mut Engine,
    reqs: Vec<(SeqId, Vec<u32>, SamplingParams)>,
) -> (HashMap<SeqId, Generation>, usize) {
    let mut got: HashMap<SeqId, Generation> = HashMap::new();
    for (id, prompt, params) in reqs {
        e.add_request(id, prompt, params).expect("add");
        got.insert(id, Generation::default());
    }
    let mut chained = 0;
    while e.has_unfinished() {
        let out = e.step().expect("step");
        chained += usize::from(out.chained);
        for ev in out.events {
            let g = got.get_mut(&ev.id).expect("a request of the run");
            g.tokens.push(ev.token);
            g.finish = ev.finish;
        }
    }
    assert_eq!(e.stats().kv_blocks_used, 0, "{:?}", e.stats());
    (got, chained)
}

/// The greedy requests of [`requests`] (stop tokens, lengths, chunked prefill, a shared
/// prefix, a waiting queue; then preemption): the CPU draws their picks itself, so each step
/// is launched before the tokens of the one before are back and takes them there. Every
/// request gets the tokens and the ending it gets one step at a time.
#[test]
fn chained_steps_give_the_tokens_and_endings_of_one_step_at_a_time() {
    let stops = midway_stops();
    let greedy_only = || {
        let mut reqs = requests(&stops);
        reqs.retain(|(_, _, p)| p.temperature == 0.0 && p.logprobs.is_none());
        reqs
    };
    for blocks in [None, Some(6)] {
        let want = run(&mut engine(false, blocks), greedy_only());
        let mut e = engine(true, blocks);
        let (got, chained) = run_chained(&mut e, greedy_only());
        assert_same(&want, &got);
        assert!(chained >= 20, "{chained} steps chained ({blocks:?} blocks)");
        if blocks.is_some() {
            assert!(e.stats().preemptions > 0, "{:?}", e.stats());
        }
        for id in [2, 7] {
            assert_eq!(got[&id].finish, Some(FinishReason::Stop), "request {id}");
        }
    }
}

/// A step that samples on the host (a request with penalties and logprobs joins) is chained
/// after a step that drew on the ranks, and the step after it is not; every request gets the
/// tokens it gets one step at a time.
#[test]
fn steps_chain_around_a_request_sampled_on_the_host() {
    let stops = HashMap::new();
    let mut reqs = requests(&stops);
    reqs.retain(|(id, _, _)| [3, 6, 8].contains(id));
    let want = run(&mut engine(false, None), reqs.clone());
    let (got, chained) = run_chained(&mut engine(true, None), reqs);
    assert_same(&want, &got);
    assert!(chained > 0, "no step chained");
}

#[test]
fn a_request_aborted_while_its_step_is_in_flight_leaves_the_others_as_they_were() {
    let want = run(&mut engine(false, None), requests(&HashMap::new()));
    let mut e = engine(true, None);
    for (id, prompt, params) in requests(&HashMap::new()) {
        e.add_request(id, prompt, params).expect("add");
    }
    let mut got: HashMap<SeqId, Vec<u32>> = HashMap::new();
    while e.has_unfinished() {
        for ev in e.step().expect("step").events {
            got.entry(ev.id).or_default().push(ev.token.id);
            // Request 3 goes after its second token, while its third is being computed.
            if ev.id == 3 && got[&3].len() == 2 {
                assert!(e.abort(3));
            }
        }
    }
    assert_eq!(got[&3], want[&3].token_ids()[..2]);
    for id in (1..=8).filter(|&id| id != 3) {
        assert_eq!(got[&id], want[&id].token_ids(), "request {id}");
    }
    assert_eq!(e.stats().kv_blocks_used, 0);
}

#[test]
fn a_failed_step_in_flight_fails_both_steps_requests_and_the_engine_serves_on() {
    let mut e = engine(true, None);
    for (id, prompt, params) in requests(&HashMap::new()) {
        e.add_request(id, prompt, params).expect("add");
    }
    for _ in 0..3 {
        e.step().expect("step");
    }
    e.faults.fail_next = Some(EngineError::Device("launch failed".into()));
    let err = e.step().expect_err("the step in flight fails");
    assert!(matches!(err, EngineError::Device(_)), "{err:?}");
    // Nothing is left half-run: no step in flight; the requests of both steps are gone, and
    // those in neither (waiting, or prefilling past the step's budget) run on.
    assert!(e.inflight.is_none());
    let gone = (1..=8).filter(|&id| !e.contains(id)).count();
    assert!(gone >= 4, "{gone} requests failed");
    while e.has_unfinished() {
        e.step().expect("the others run");
    }
    assert_eq!(e.stats().kv_blocks_used, 0);
    let again = run(&mut e, vec![(9, vec![5, 6, 7], greedy(5))]);
    assert_eq!(again[&9].tokens.len(), 5);
}

/// A grammar of the tokens `seq`, one a step, complete after the last.
#[derive(Debug)]
struct OneEach {
    seq: Vec<u32>,
    at: usize,
}

impl Constraint for OneEach {
    fn allowed(&mut self, mask: &mut [u32], _budget: usize) -> std::result::Result<(), String> {
        mask.fill(0);
        let t = *self.seq.get(self.at).ok_or("past the end")?;
        mask[t as usize / 32] |= 1 << (t % 32);
        Ok(())
    }

    fn accept(&mut self, token: u32) -> std::result::Result<bool, String> {
        if self.seq.get(self.at) != Some(&token) {
            return Err(format!("token {token} was not allowed"));
        }
        self.at += 1;
        Ok(self.at == self.seq.len())
    }
}

#[test]
fn requests_under_a_grammar_overlap_with_their_masks_and_budgets_in_step() {
    let want = run(&mut engine(false, None), requests(&HashMap::new()));
    let mut e = engine(true, None);
    for (id, prompt, params) in requests(&HashMap::new()) {
        e.add_request(id, prompt, params).expect("add");
    }
    let budgets = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut got: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut last = HashMap::new();
    let mut added = false;
    while e.has_unfinished() {
        for ev in e.step().expect("step").events {
            got.entry(ev.id).or_default().push(ev.token.id);
            last.insert(ev.id, ev.finish);
        }
        // Added mid-run, while a step is in flight: each mask must follow the token before.
        if !added && got.len() >= 2 {
            let closes = Closes {
                budgets: budgets.clone(),
                closed: false,
            };
            e.add_constrained(20, vec![5, 6, 7], greedy(5), Some(Box::new(closes)))
                .expect("add");
            let seq = vec![40, 9, 3, 77, 12];
            let steps = OneEach { seq, at: 0 };
            e.add_constrained(21, vec![8, 9], greedy(50), Some(Box::new(steps)))
                .expect("add");
            added = true;
        }
    }
    assert_eq!(got[&20], [40, 40, 40, 40, 41]);
    assert_eq!(*budgets.lock().expect("budgets"), [5, 4, 3, 2, 1]);
    assert_eq!(last[&20], Some(FinishReason::Length));
    // Ended by its grammar, well before its length.
    assert_eq!(got[&21], [40, 9, 3, 77, 12]);
    assert_eq!(last[&21], Some(FinishReason::Stop));
    for id in 1..=8 {
        assert_eq!(got[&id], want[&id].token_ids(), "request {id}");
    }
    assert_eq!(e.stats().kv_blocks_used, 0);
}

#[test]
fn a_request_whose_pick_fails_alone_is_dropped_from_the_step_it_was_planned_into() {
    crate::engine::tests::nan_logits_fail_alone(true, false);
}

/// The same with every request greedy: the CPU draws, finds no pick in the poisoned rows, and
/// the chained step after takes token 0 in their place; those requests fail alone when their
/// draws are read, the other one finishes.
#[test]
fn a_request_with_no_draw_fails_alone_after_the_step_chained_behind_it() {
    crate::engine::tests::nan_logits_fail_alone(true, true);
}

/// A step of greedy requests and one seeded draw at a temperature with logprobs, which the
/// CPU's ranks do not make: they draw the greedy rows and only the other row's logits come
/// back (a stand-in draw holds its place); such a step's tokens are not carried, so the step
/// after it waits for them; every request gets the tokens (and logprobs) of steps one at a
/// time.
#[test]
fn a_step_draws_the_rows_it_can_and_brings_back_the_others() {
    let logprobs = SamplingParams {
        logprobs: Some(2),
        temperature: 0.8,
        seed: Some(3),
        ..greedy(4)
    };
    let reqs = || -> Vec<(SeqId, Vec<u32>, SamplingParams)> {
        (1..=3u64)
            .map(|id| {
                let params = if id == 2 { logprobs.clone() } else { greedy(4) };
                (id, vec![5, 6, 7 + id as u32], params)
            })
            .collect()
    };
    let mut e = engine(true, None);
    for (id, prompt, params) in reqs() {
        e.add_request(id, prompt, params).expect("add");
    }
    let schedule = e.sched.schedule();
    let plan = e.plan_step(&schedule).expect("plan");
    assert_eq!(plan.device_sampling.as_ref().map(Vec::len), Some(3));
    assert_eq!(plan.host_rows, [1]);
    let want = run(&mut engine(false, None), reqs());
    let (got, chained) = run_chained(&mut engine(true, None), reqs());
    assert_same(&want, &got);
    assert_eq!(
        chained, 0,
        "a step with a row sampled on the host was chained"
    );
    assert!(
        got[&2]
            .tokens
            .iter()
            .all(|t| t.top.len() == 2 && t.logprob.is_finite())
    );
}

/// A repetition penalty counts the prompt and the output alike, so a penalized request drawn on
/// the host, whose list of tokens so far is kept from step to step, must draw what requests of
/// one token draw, each with the tokens so far as its prompt (a list made from scratch): with
/// every step one at a time, and under preemption.
#[test]
fn a_penalized_request_sampled_on_the_host_draws_what_one_token_requests_draw() {
    let penalized = |n: usize| SamplingParams {
        repetition_penalty: 1.6,
        ..greedy(n)
    };
    let prompt: Vec<u32> = (0..9).map(|i| (i * 5) % 7 + 3).collect();
    let mut want = prompt.clone();
    let mut e = engine(false, None);
    for id in 0..20 {
        let one = run(&mut e, vec![(id, want.clone(), penalized(1))]);
        want.extend(one[&id].token_ids());
    }
    let unpenalized = run(&mut e, vec![(99, prompt.clone(), greedy(20))]);
    assert_ne!(
        unpenalized[&99].token_ids(),
        want[prompt.len()..],
        "the penalty changes nothing here"
    );
    for blocks in [None, Some(6)] {
        let mut e = engine(false, blocks);
        let others = (1..4).map(|id| (id, vec![3 + id as u32; 20], greedy(20)));
        let reqs = std::iter::once((0, prompt.clone(), penalized(20)));
        let got = run(&mut e, reqs.chain(others).collect());
        assert_eq!(
            got[&0].token_ids(),
            want[prompt.len()..],
            "{blocks:?} blocks"
        );
        assert_eq!(
            blocks.is_some(),
            e.stats().preemptions > 0,
            "{:?}",
            e.stats()
        );
    }
}

/// Greedy requests with penalties of each kind, logprobs (none, the draw's only, 3, the most)
/// and a logit bias, among plain ones: the ranks draw them all, with their extras (the tokens so far
/// from the plan, the newest from the step's own input, a chained step's carried draw), so
/// steps chain throughout; and each request gets the tokens and logprobs it gets sampled on
/// the host one step at a time, under preemption too (a recomputed chunk ends in a draw).
#[test]
fn penalized_draws_with_logprobs_are_made_by_the_ranks_in_chained_steps() {
    let penalized = |id: u64| SamplingParams {
        repetition_penalty: [1.0, 1.3, 1.0, 1.2][id as usize % 4],
        presence_penalty: [0.0, 0.0, 0.7, 0.4][id as usize % 4],
        frequency_penalty: [0.0, 0.0, 0.9, 0.5][id as usize % 4],
        logprobs: [Some(3), None, Some(0), Some(MAX_LOGPROBS)][id as usize % 4],
        // Request 3 also biases two tokens, one it would draw, one it would not.
        logit_bias: match id {
            3 => vec![(4, -100.0), (17, 2.5)],
            _ => Vec::new(),
        },
        ..greedy(24 + id as usize)
    };
    let reqs = |penalties: bool| -> Vec<(SeqId, Vec<u32>, SamplingParams)> {
        (0..6u64)
            .map(|id| {
                let prompt = (0..5 + 4 * id)
                    .map(|i| (i * 13 + id) as u32 % 50 + 3)
                    .collect();
                let params = match id < 4 && penalties {
                    true => penalized(id),
                    false => greedy(24 + id as usize),
                };
                (id, prompt, params)
            })
            .collect()
    };
    let plain = run(&mut engine(false, None), reqs(false));
    for blocks in [None, Some(6)] {
        let want = run(&mut engine(false, blocks), reqs(true));
        let mut e = engine(true, blocks);
        let (got, chained) = run_chained(&mut e, reqs(true));
        for (id, g) in &got {
            let w = &want[id];
            assert_eq!(
                g.token_ids(),
                w.token_ids(),
                "request {id} ({blocks:?} blocks)"
            );
            let n = penalized(*id).logprobs.filter(|_| *id < 4);
            for (t, u) in g.tokens.iter().zip(&w.tokens) {
                match n {
                    Some(n) => {
                        assert_eq!(t.top.len(), n, "request {id}");
                        assert!((t.logprob - u.logprob).abs() <= 1e-4, "{t:?} {u:?}");
                        for (a, b) in t.top.iter().zip(&u.top) {
                            assert_eq!(a.0, b.0, "request {id}: {t:?} {u:?}");
                            assert!((a.1 - b.1).abs() <= 1e-4, "{t:?} {u:?}");
                        }
                    }
                    None => assert!(t.logprob.is_nan() && t.top.is_empty(), "{t:?}"),
                }
            }
        }
        assert!(chained >= 20, "{chained} steps chained ({blocks:?} blocks)");
        if blocks.is_some() {
            assert!(e.stats().preemptions > 0, "{:?}", e.stats());
        }
    }
    // The penalties (and the bias) act: each request draws otherwise than without them.
    let want = run(&mut engine(false, None), reqs(true));
    for id in 1..4 {
        assert_ne!(
            want[&id].token_ids(),
            plain[&id].token_ids(),
            "request {id}"
        );
    }
}

/// A plan gives the ranks each penalized or logprob-asking row's extras: the tokens so far
/// but the chunk's last where that one is a draw (the ranks count it from their input), and
/// through the prompt's last where the chunk ends the prompt.
#[test]
fn a_plan_gives_the_tokens_so_far_but_the_newest_draw() {
    let params = SamplingParams {
        frequency_penalty: 0.5,
        logprobs: Some(1),
        ..greedy(8)
    };
    let start = || {
        let mut e = engine(true, None);
        e.add_request(1, vec![7, 9, 7], params.clone())
            .expect("add");
        e.add_request(2, vec![4, 5], greedy(8)).expect("add");
        e
    };
    let mut e = start();
    let schedule = e.sched.schedule();
    let plan = e.plan_step(&schedule).expect("plan");
    assert!(plan.host_rows.is_empty());
    assert_eq!(plan.extras.len(), 1);
    let x = &plan.extras[0];
    assert_eq!((x.row, x.logprobs, x.last_is_output), (0, Some(1), false));
    assert_eq!(x.seen, [(7, 0), (9, 0)]);
    // Two steps on, the third is planned with the first draw known and the second in flight,
    // a placeholder here: the ranks count that one from the step's input.
    let mut e = start();
    e.step().expect("step");
    e.step().expect("step");
    let schedule = e.sched.schedule();
    let plan = e.plan_step(&schedule).expect("plan");
    let first = e.sched.get(1).expect("sequence").tokens[3];
    let x = &plan.extras[0];
    assert!(x.last_is_output);
    let mut want = vec![(7, 0), (9, 0)];
    match want.iter_mut().find(|(t, _)| *t == first) {
        Some(seen) => seen.1 = 1,
        None => want.push((first, 1)),
    }
    assert_eq!(x.seen, want);
    assert_eq!(plan.chunks[0].tokens.len(), 1, "a decode chunk");
}
