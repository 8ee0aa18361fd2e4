//! The engine runs of `overlap`'s tests (lengths, chunked prefill in steps of 16 tokens, 4
//! sequences at once, a shared prefix, seeded draws, penalties with logprobs, stop tokens
//! midway), now with drafts.

use crate::engine::{Engine, FinishReason};
use crate::ngram::Speculation;
use crate::overlap::tests::{assert_same, engine, midway_stops, requests, run};

fn speculative(blocks: Option<usize>) -> Engine {
    let mut e = engine(false, blocks);
    assert!(e.set_speculation(Some(Speculation::ngram(4))));
    e
}

/// Each request gets the tokens and the ending that decoding one token at a time gives
/// it, and drafts were checked and accepted: fewer steps made the same tokens.
#[test]
fn drafts_give_the_tokens_and_endings_of_one_token_at_a_time() {
    let stops = midway_stops();
    let mut plain = engine(false, None);
    let want = run(&mut plain, requests(&stops));
    let mut e = speculative(None);
    let got = run(&mut e, requests(&stops));
    assert_same(&want, &got);
    let s = e.stats();
    assert!(
        s.spec_accepted_tokens >= 10 && s.spec_draft_tokens > s.spec_accepted_tokens,
        "{s:?}"
    );
    assert_eq!(plain.stats().spec_draft_tokens, 0);
    // Again, from the prefix cache's blocks of the first run (named from accepted
    // tokens only): the same.
    assert_same(&want, &run(&mut e, requests(&stops)));
    assert!(e.stats().prefix_cache_hits > 0, "{:?}", e.stats());
}

#[test]
fn drafts_under_preemption_give_the_same_tokens() {
    // Room for 6 blocks of 16 tokens: four sequences of up to 64 tokens do not fit.
    let stops = midway_stops();
    let want = run(&mut engine(false, Some(6)), requests(&stops));
    let mut e = speculative(Some(6));
    let got = run(&mut e, requests(&stops));
    assert!(e.stats().preemptions > 0, "{:?}", e.stats());
    assert!(e.stats().spec_accepted_tokens > 0, "{:?}", e.stats());
    assert_same(&want, &got);
}

/// Under async scheduling the engine proposes nothing: speculation stays off.
#[test]
fn async_scheduling_takes_no_drafts() {
    let mut e = engine(true, None);
    assert!(!e.set_speculation(Some(Speculation::ngram(4))));
    run(&mut e, requests(&midway_stops()));
    assert_eq!(e.stats().spec_draft_tokens, 0);
}

/// A grammar allowing, at its `at`-th token, `pattern[at % len]` or the token after it;
/// complete after `len` tokens. Records the budget of each mask asked for.
#[derive(Debug)]
struct Pattern {
    pattern: Vec<u32>,
    len: usize,
    at: usize,
    budgets: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
}

impl crate::constraint::Constraint for Pattern {
    fn allowed(&mut self, mask: &mut [u32], budget: usize) -> Result<(), String> {
        self.budgets.lock().map_err(|e| e.to_string())?.push(budget);
        mask.fill(0);
        let t = self.pattern[self.at % self.pattern.len()];
        for id in [t, t + 1] {
            mask[id as usize / 32] |= 1 << (id % 32);
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<bool, String> {
        let t = self.pattern[self.at % self.pattern.len()];
        if token != t && token != t + 1 {
            return Err(format!("token {token} was not allowed at {}", self.at));
        }
        self.at += 1;
        Ok(self.at == self.len)
    }
}

/// Requests under a grammar take drafts too: each draft's row is masked as its own step's
/// would be (with the same budget), so they get the tokens, endings and masks that decoding
/// one token at a time gives; drafts were accepted.
#[test]
fn drafts_under_a_grammar_give_the_tokens_and_masks_of_one_token_at_a_time() {
    let run = |spec: bool| {
        let mut e = engine(false, None);
        e.set_speculation(spec.then(|| Speculation::ngram(4)));
        let mut budgets = Vec::new();
        let mut reqs = Vec::new();
        for (id, len, max) in [(1, 30, 40), (2, 40, 25), (3, 12, 12)] {
            let b = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let pattern = vec![40 + id as u32, 9, 3, 120, 61];
            let g = Pattern {
                pattern,
                len,
                at: 0,
                budgets: b.clone(),
            };
            let params = crate::sampler::SamplingParams {
                ignore_eos: true,
                ..crate::sampler::SamplingParams::greedy(max)
            };
            e.add_constrained(id, vec![5, 6, 7, id as u32], params, Some(Box::new(g)))
                .expect("add");
            budgets.push(b);
            reqs.push(id);
        }
        let mut got: std::collections::HashMap<u64, (Vec<u32>, Option<FinishReason>)> =
            Default::default();
        while e.has_unfinished() {
            for ev in e.step().expect("step").events {
                let g = got.entry(ev.id).or_default();
                g.0.push(ev.token.id);
                g.1 = ev.finish;
            }
        }
        assert_eq!(e.stats().kv_blocks_used, 0);
        let budgets: Vec<Vec<usize>> = (budgets.iter())
            .map(|b| b.lock().expect("budgets").clone())
            .collect();
        (got, budgets, e.stats().spec_accepted_tokens)
    };
    let (want, want_budgets, _) = run(false);
    let (got, budgets, accepted) = run(true);
    assert_eq!(got, want);
    assert_eq!(budgets, want_budgets);
    // Ended by the grammar (1, 3) and by length (2).
    assert_eq!(want[&1].0.len(), 30);
    assert_eq!(want[&1].1, Some(FinishReason::Stop));
    assert_eq!(want[&2].1, Some(FinishReason::Length));
    assert!(accepted >= 10, "{accepted} drafts accepted");
}
