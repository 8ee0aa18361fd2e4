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
