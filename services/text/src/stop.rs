//! Stop strings over a stream of text deltas.
//!
//! A stop string may straddle deltas ("<|e" + "nd|>"), so text that could be
//! the beginning of a stop string is held back until the next delta decides
//! it. Everything else is released immediately, so streaming latency only
//! grows while a possible match is pending.

/// Result of feeding one delta to a [`StopMatcher`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that is safe to send to the client now.
    pub text: String,
    /// The stop string that matched, if any. `text` then ends right before
    /// it, and the matcher ignores all further input.
    pub stopped: Option<String>,
}

/// Finds the first occurrence of any stop string in a streamed text.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Longest stop string in bytes, bounding how much must be held back.
    max_len: usize,
    /// Text received but not yet released.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// `stops` may be empty (then every delta passes straight through);
    /// empty strings are ignored because they would match everywhere.
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops: Vec<String> = stops
            .into_iter()
            .map(Into::into)
            .filter(|s| !s.is_empty())
            .collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Self {
            stops,
            max_len,
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds the next delta.
    pub fn push(&mut self, delta: &str) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        self.held.push_str(delta);

        // Earliest match wins; among matches at the same position, the
        // longest (so "</s>" beats "<" when both are stop strings).
        let mut best: Option<(usize, &str)> = None;
        for stop in &self.stops {
            if let Some(pos) = self.held.find(stop.as_str()) {
                let better = match best {
                    None => true,
                    Some((p, s)) => pos < p || (pos == p && stop.len() > s.len()),
                };
                if better {
                    best = Some((pos, stop));
                }
            }
        }
        if let Some((pos, stop)) = best {
            let stop = stop.to_string();
            let text = self.held[..pos].to_string();
            self.held.clear();
            self.stopped = true;
            return StopOutput {
                text,
                stopped: Some(stop),
            };
        }

        let keep = self.pending_suffix_start();
        let text = self.held[..keep].to_string();
        self.held.drain(..keep);
        StopOutput {
            text,
            stopped: None,
        }
    }

    /// End of stream: releases held-back text (it cannot become a stop
    /// string any more).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Start of the longest suffix of `held` that is a proper prefix of some
    /// stop string (`held.len()` if none). No full match exists here, so a
    /// match can only start inside that suffix, and the earliest possible
    /// start is the longest such suffix.
    fn pending_suffix_start(&self) -> usize {
        let len = self.held.len();
        let earliest = len.saturating_sub(self.max_len.saturating_sub(1));
        (earliest..len)
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for d in deltas {
            let o = m.push(d);
            out.push_str(&o.text);
            if o.stopped.is_some() {
                return (out, o.stopped);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn no_stops_passes_through() {
        let mut m = StopMatcher::new(Vec::<String>::new());
        assert_eq!(m.push("abc").text, "abc");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn match_inside_one_delta() {
        assert_eq!(
            run(&["STOP"], &["hello STOP world"]),
            ("hello ".into(), Some("STOP".into()))
        );
    }

    #[test]
    fn match_across_deltas_holds_back() {
        let mut m = StopMatcher::new(["<|end|>"]);
        let a = m.push("abc<|e");
        assert_eq!(a.text, "abc");
        assert_eq!(a.stopped, None);
        let b = m.push("n");
        assert_eq!(b.text, "");
        let c = m.push("d|>tail");
        assert_eq!(c.text, "");
        assert_eq!(c.stopped.as_deref(), Some("<|end|>"));
        assert!(m.is_stopped());
        assert_eq!(m.push("more"), StopOutput::default());
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn false_start_is_released() {
        let mut m = StopMatcher::new(["<|end|>"]);
        assert_eq!(m.push("a<|e").text, "a");
        assert_eq!(m.push("x").text, "<|ex");
        assert_eq!(m.push("<").text, "");
        assert_eq!(m.finish(), "<");
    }

    #[test]
    fn earliest_then_longest_match_wins() {
        assert_eq!(
            run(&["b", "abc"], &["xa", "bc"]),
            ("x".into(), Some("abc".into()))
        );
        assert_eq!(
            run(&["</s", "</s>"], &["1</", "s>"]),
            ("1".into(), Some("</s>".into()))
        );
    }

    #[test]
    fn multibyte_text_never_split() {
        assert_eq!(
            run(&["é!"], &["caf", "é", "é", "!x"]),
            ("café".into(), Some("é!".into()))
        );
        assert_eq!(
            run(&["日本"], &["今日は日", "曜"]),
            ("今日は日曜".into(), None)
        );
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        assert_eq!(run(&[""], &["abc"]), ("abc".into(), None));
    }
}
