use super::*;

#[test]
fn drafts_copy_what_followed_the_longest_suffix_found_latest() {
    let spec = Speculation::ngram(3);
    // "5 6 7" occurs earlier twice; the latest is followed by 1 2 3.
    let t = [5, 6, 7, 9, 9, 5, 6, 7, 1, 2, 3, 4, 8, 6, 7];
    // Suffix 4 "4 8 6 7" and 3 "8 6 7" are not found; "6 7" is, latest at 6.
    assert_eq!(spec.propose(&t, 3), vec![1, 2, 3]);
    assert_eq!(spec.propose(&t, 1), vec![1]);
    // A longer match wins over a later shorter one.
    let t = [1, 2, 3, 4, 10, 11, 0, 3, 4, 20, 1, 2, 3, 4];
    assert_eq!(spec.propose(&t, 2), vec![10, 11]);
    // Nothing of at least 2 tokens recurs: no drafts.
    assert!(spec.propose(&[1, 2, 3, 4, 1], 3).is_empty());
    assert!(spec.propose(&[7], 3).is_empty());
}

#[test]
fn a_repeating_run_is_guessed_on_past_its_end() {
    let spec = Speculation::ngram(5);
    // Period 3: the latest match of "b c a b" (k = 4) starts 3 back; the copy runs on.
    let t = [9, 1, 2, 3, 1, 2, 3, 1];
    assert_eq!(spec.propose(&t, 5), vec![2, 3, 1, 2, 3]);
    // The same token over and over.
    assert_eq!(spec.propose(&[4, 4, 4], 4), vec![4, 4, 4, 4]);
}

#[test]
fn configurations_without_drafts_or_with_crossed_bounds_are_refused() {
    assert!(Speculation::ngram(4).check().is_ok());
    assert!(Speculation::ngram(0).check().is_err());
    let crossed = Speculation {
        lookup_min: 5,
        ..Speculation::ngram(4)
    };
    assert!(crossed.check().is_err());
}

/// The engine runs of `overlap`'s tests (lengths, chunked prefill in steps of 16 tokens, 4
/// sequences at once, a shared prefix, seeded draws, penalties with logprobs, stop tokens
/// midway), now with drafts.
mod engine {
    use super::*;
    use crate::engine::Engine;
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
}
