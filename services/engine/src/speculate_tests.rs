//! The engine runs of `overlap`'s tests (lengths, chunked prefill in steps of 16 tokens, 4
//! sequences at once, a shared prefix, seeded draws, penalties with logprobs, stop tokens
//! midway), now with drafts.

use crate::engine::Engine;
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
