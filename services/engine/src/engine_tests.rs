//! Steps that meet faults: a failed forward and a forward that gives too few picks fail the
//! step's requests loudly (no sequence is left waiting for a token that never comes), and their
//! clients are told it was the server's fault; a request whose logits hold no distribution
//! fails alone; a panic under a step ends the engine thread, and the handle says so.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::constraint::Constraint;
use crate::handle::EngineHandle;

/// Faults the next step meets, set by a test.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// The next forward fails with this.
    pub fail_next: Option<EngineError>,
    /// The next forward gives one pick too few.
    pub drop_pick: bool,
    /// The next forward panics (a bug under it).
    pub panic_next: bool,
}

impl Faults {
    pub fn apply(&mut self, picks: Picks, vocab: usize) -> Result<Picks> {
        assert!(
            !std::mem::take(&mut self.panic_next),
            "a fault the test asked for"
        );
        if let Some(e) = self.fail_next.take() {
            return Err(e);
        }
        if !std::mem::take(&mut self.drop_pick) {
            return Ok(picks);
        }
        Ok(match picks {
            Picks::Logits(mut l) => {
                l.truncate(l.len().saturating_sub(vocab));
                Picks::Logits(l)
            }
            Picks::Ids(mut d) => {
                d.ids.pop();
                Picks::Ids(d)
            }
            Picks::Mixed(mut d, mut rows) => {
                d.ids.pop();
                rows.retain(|(r, _)| (*r as usize) < d.ids.len());
                Picks::Mixed(d, rows)
            }
        })
    }
}

fn engine() -> Engine {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2");
    let loaded = crate::model::load(&dir).expect("tiny model");
    let cfg = EngineConfig {
        max_model_len: Some(256),
        kv_cache_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    Engine::new(loaded.model, vec![], cfg).expect("engine")
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(n)
    }
}

#[test]
fn too_few_picks_fail_the_step_instead_of_stranding_sequences() {
    let mut e = engine();
    for id in [1, 2, 3] {
        e.add_request(id, vec![5, 6, 7, 8], greedy(4)).expect("add");
    }
    e.faults.drop_pick = true;
    let err = e.step().expect_err("a short step must fail");
    assert!(matches!(err, EngineError::Internal(_)), "{err:?}");
    // Every request of the failed step is gone: none waits forever for its token.
    assert!(!e.has_unfinished(), "{:?}", e.stats());
    assert_eq!(e.stats().kv_blocks_used, 0);
    // The engine goes on serving.
    let after = e
        .run_to_completion(vec![(4, vec![5, 6, 7, 8], greedy(3))], |_| true)
        .expect("steps after the fault");
    assert_eq!(after[&4].tokens.len(), 3);
}

#[test]
fn a_failed_step_reaches_its_clients_as_a_server_fault() {
    for (fault, want_kind) in [
        (EngineError::Device("launch failed".into()), "device"),
        (EngineError::Internal("broken".into()), "internal"),
    ] {
        let mut e = engine();
        e.faults.fail_next = Some(fault);
        let (handle, _thread) = EngineHandle::spawn(e, 8).expect("spawn");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let got = rt.block_on(async {
            let mut s = handle
                .submit(vec![5, 6, 7], greedy(4))
                .await
                .expect("admit");
            tokio::time::timeout(Duration::from_secs(10), s.next())
                .await
                .expect("an answer, not a hang")
        });
        let err = got.expect("an event").expect_err("the step failed");
        assert_eq!(err.kind(), want_kind, "{err}");
        assert!(err.to_string().contains("the step failed"), "{err}");
    }
}

/// The tiny model with token `poisoned`'s embedding row all NaN (a checkpoint broken where only
/// that token reads it), copied to a directory of its own.
fn poisoned_engine(poisoned: usize) -> Engine {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2");
    // One directory per call: tests in one process poison a model each, at once.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ferrite-poisoned-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).expect("config");
    let mut bytes = std::fs::read(src.join("model.safetensors")).expect("weights");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(&bytes[8..8 + header_len]).expect("header");
    let embed = &header["model.embed_tokens.weight"];
    assert_eq!(embed["dtype"], "F32");
    let hidden = embed["shape"][1].as_u64().expect("shape") as usize;
    let start = embed["data_offsets"][0].as_u64().expect("offset") as usize;
    let row = 8 + header_len + start + poisoned * hidden * 4;
    for x in bytes[row..row + hidden * 4].chunks_exact_mut(4) {
        x.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(dir.join("model.safetensors"), &bytes).expect("write");
    let loaded = crate::model::load(&dir).expect("poisoned model");
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = EngineConfig {
        max_model_len: Some(256),
        kv_cache_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    Engine::new(loaded.model, vec![], cfg).expect("engine")
}

#[test]
fn a_request_whose_logits_are_nan_fails_alone_and_the_engine_serves_on() {
    nan_logits_fail_alone(false, false);
}

/// Requests 1 and 3 read token 9, whose embedding is NaN: each fails alone (under async
/// scheduling, when its pick is collected, after the next step, which holds it, was planned);
/// request 2 finishes. `all_greedy`: requests 1 and 2 are greedy too (else seeded draws).
pub(crate) fn nan_logits_fail_alone(async_scheduling: bool, all_greedy: bool) {
    let mut e = poisoned_engine(9);
    e.async_scheduling = async_scheduling;
    // Seeded: unseeded, request 2 can draw the poisoned token itself and then fail too (it did
    // once in a full test run).
    let sampled = match all_greedy {
        true => greedy(4),
        false => SamplingParams {
            temperature: 0.8,
            seed: Some(3),
            ..greedy(4)
        },
    };
    e.add_request(1, vec![5, 9, 7], sampled.clone())
        .expect("add");
    // Greedy from [5, 6, 7], request 2 comes to the poisoned token itself.
    let prompt = if all_greedy {
        vec![12, 13, 14]
    } else {
        vec![5, 6, 7]
    };
    e.add_request(2, prompt, sampled).expect("add");
    e.add_request(3, vec![9], greedy(4)).expect("add");
    let (mut failed, mut finished) = (Vec::new(), Vec::new());
    while e.has_unfinished() {
        let out = e.step().expect("the step goes on");
        failed.extend(out.failed.into_iter().map(|(id, err)| (id, err.kind())));
        finished.extend(
            out.events
                .iter()
                .filter(|ev| ev.finish.is_some())
                .map(|ev| ev.id),
        );
    }
    failed.sort_unstable();
    assert_eq!(failed, [(1, "bad_logits"), (3, "bad_logits")]);
    assert_eq!(finished, [2]);
    assert_eq!(
        e.stats().kv_blocks_used,
        0,
        "the failed requests' blocks are free"
    );
}

#[test]
fn a_panic_under_a_step_ends_the_engine_and_the_handle_says_why() {
    let mut e = engine();
    e.faults.panic_next = true;
    let (handle, thread) = EngineHandle::spawn(e, 8).expect("spawn");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let (event, why) = rt.block_on(async {
        let mut s = handle
            .submit(vec![5, 6, 7], greedy(4))
            .await
            .expect("admit");
        let event = tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("an answer, not a hang");
        let why = tokio::time::timeout(Duration::from_secs(10), handle.lost())
            .await
            .expect("lost resolves");
        (event, why)
    });
    let err = event.expect("an event").expect_err("the engine is gone");
    assert_eq!(err.kind(), "stopped", "{err}");
    assert!(
        why.contains("panicked") && why.contains("a fault the test asked for"),
        "{why}"
    );
    thread
        .join()
        .expect("the thread ended without unwinding further");
    let refused = rt.block_on(handle.submit(vec![5], greedy(1)));
    assert!(matches!(refused, Err(EngineError::Stopped)));
}

/// A grammar over token ids: the next token must be `seq[k]` or `seq[k] + 1`, and the output
/// is complete after `seq.len()` tokens. Its `allowed` counts the steps it was asked.
#[derive(Debug)]
struct Steps {
    seq: Vec<u32>,
    at: usize,
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Constraint for Steps {
    fn allowed(&mut self, mask: &mut [u32], _: usize) -> std::result::Result<(), String> {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        mask.fill(0);
        let t = *self.seq.get(self.at).ok_or("past the end")?;
        for id in [t, t + 1] {
            mask[id as usize / 32] |= 1 << (id % 32);
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> std::result::Result<bool, String> {
        let t = self.seq[self.at];
        if token != t && token != t + 1 {
            return Err(format!("token {token} was not allowed"));
        }
        self.at += 1;
        Ok(self.at == self.seq.len())
    }
}

#[test]
fn a_constrained_request_samples_allowed_tokens_alone_and_stops_with_its_grammar() {
    let mut e = engine();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seq = vec![40, 90, 3, 200];
    let steps = Steps {
        seq: seq.clone(),
        at: 0,
        asked: asked.clone(),
    };
    let sampled = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        logprobs: Some(2),
        ..greedy(50)
    };
    e.add_constrained(1, vec![5, 6, 7, 8], sampled, Some(Box::new(steps)))
        .expect("add");
    // An unconstrained neighbour in the same steps runs to its length.
    e.add_request(2, vec![9, 10, 11], greedy(6)).expect("add");
    let mut out: HashMap<SeqId, Vec<TokenEvent>> = HashMap::new();
    while e.has_unfinished() {
        for ev in e.step().expect("step").events {
            out.entry(ev.id).or_default().push(ev);
        }
    }
    let constrained = &out[&1];
    assert_eq!(constrained.len(), seq.len(), "ends when its grammar does");
    for (ev, t) in constrained.iter().zip(&seq) {
        assert!(ev.token.id == *t || ev.token.id == t + 1, "{ev:?}");
        // Logprobs come from the allowed tokens' distribution: the two allowed ones only.
        assert!(ev.token.top.iter().all(|(id, _)| *id == *t || *id == t + 1));
        assert!(ev.token.logprob.is_finite());
    }
    assert_eq!(
        constrained.last().and_then(|e| e.finish),
        Some(FinishReason::Stop)
    );
    assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), seq.len());
    assert_eq!(out[&2].len(), 6);
    assert_eq!(
        out[&2].last().and_then(|e| e.finish),
        Some(FinishReason::Length)
    );
}

/// A grammar that allows token 40 until one token of budget is left, then finishes with 41
/// alone (as a guide closing its JSON does). Records the budgets it was given.
#[derive(Debug)]
pub(crate) struct Closes {
    pub budgets: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    pub closed: bool,
}

impl Constraint for Closes {
    fn allowed(&mut self, mask: &mut [u32], budget: usize) -> std::result::Result<(), String> {
        self.budgets.lock().expect("budgets").push(budget);
        mask.fill(0);
        let id = if budget == 1 { 41 } else { 40 };
        mask[id / 32] |= 1 << (id % 32);
        Ok(())
    }

    fn accept(&mut self, token: u32) -> std::result::Result<bool, String> {
        self.closed = token == 41;
        Ok(self.closed)
    }

    fn cut_short(&self) -> bool {
        self.closed
    }
}

#[test]
fn a_grammar_learns_its_budget_and_one_it_closed_ends_as_cut() {
    let mut e = engine();
    let budgets = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let closes = Closes {
        budgets: budgets.clone(),
        closed: false,
    };
    e.add_constrained(1, vec![5, 6, 7, 8], greedy(5), Some(Box::new(closes)))
        .expect("add");
    let mut events = Vec::new();
    while e.has_unfinished() {
        events.extend(e.step().expect("step").events);
    }
    let ids: Vec<u32> = events.iter().map(|ev| ev.token.id).collect();
    assert_eq!(ids, [40, 40, 40, 40, 41]);
    assert_eq!(*budgets.lock().expect("budgets"), [5, 4, 3, 2, 1]);
    // Complete under its grammar, but only because the budget ran out: `length`, not `stop`.
    assert_eq!(
        events.last().and_then(|e| e.finish),
        Some(FinishReason::Length)
    );
}

#[test]
fn a_grammar_that_fails_ends_its_request_alone() {
    let mut e = engine();
    // A grammar of no tokens has no mask to give.
    let broken = Steps {
        seq: vec![],
        at: 0,
        asked: Default::default(),
    };
    e.add_constrained(1, vec![5, 6, 7, 8], greedy(5), Some(Box::new(broken)))
        .expect("add");
    e.add_request(2, vec![9, 10, 11], greedy(3)).expect("add");
    let out = e.step().expect("the step goes on");
    assert!(
        matches!(out.failed.as_slice(), [(1, EngineError::Grammar(m))] if m.contains("past the end")),
        "{:?}",
        out.failed
    );
    assert_eq!(out.events.len(), 1);
    assert!(!e.contains(1) && e.contains(2));
}

#[test]
fn a_preempted_constrained_request_goes_on_where_its_grammar_was() {
    // Room for two sequences of the four: the others are preempted and recomputed, and their
    // grammars (which saw every token) must not be asked to go back.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2");
    let probe = engine();
    let block_bytes = (8 << 20) / probe.stats().kv_blocks_total;
    let loaded = crate::model::load(&dir).expect("tiny model");
    let cfg = EngineConfig {
        max_model_len: Some(64),
        block_size: 16,
        kv_cache_bytes: 9 * block_bytes,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(loaded.model, vec![], cfg).expect("engine");
    let seq: Vec<u32> = (0..40).map(|i| 10 + 3 * i).collect();
    for id in 1..=4 {
        let steps = Steps {
            seq: seq.clone(),
            at: 0,
            asked: Default::default(),
        };
        let prompt = vec![5 + id as u32, 6, 7, 8, 9, 10, 11, 12];
        e.add_constrained(id, prompt, greedy(60), Some(Box::new(steps)))
            .expect("add");
    }
    let mut out: HashMap<SeqId, Vec<u32>> = HashMap::new();
    while e.has_unfinished() {
        let step = e.step().expect("step");
        assert!(step.failed.is_empty(), "{:?}", step.failed);
        for ev in step.events {
            out.entry(ev.id).or_default().push(ev.token.id);
        }
    }
    assert!(e.stats().preemptions > 0, "no preemption: {:?}", e.stats());
    for id in 1..=4 {
        let tokens = &out[&id];
        assert_eq!(tokens.len(), seq.len(), "request {id}");
        for (t, want) in tokens.iter().zip(&seq) {
            assert!(*t == *want || *t == want + 1, "request {id}: {tokens:?}");
        }
    }
}
