//! Guessing a sequence's next tokens by n-gram lookup in its own context, for speculative
//! decoding (the engine's `speculate` runs and checks the guesses): vLLM's `ngram` method,
//! "prompt lookup decoding".

/// Speculative decoding by n-gram lookup ([`crate::engine::EngineConfig::speculation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Draft tokens a sequence guesses per step, at most.
    pub tokens: usize,
    /// The longest run of a sequence's last tokens looked up in its context (tried first).
    pub lookup_max: usize,
    /// The shortest.
    pub lookup_min: usize,
}

impl Speculation {
    /// `tokens` drafts per step from the last 4 tokens' match, down to the last 2's.
    pub fn ngram(tokens: usize) -> Self {
        Self {
            tokens,
            lookup_max: 4,
            lookup_min: 2,
        }
    }

    /// Why this configuration cannot run, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.tokens == 0 || self.lookup_min == 0 || self.lookup_min > self.lookup_max {
            return Err(format!(
                "speculative decoding needs at least one draft token and 1 ≤ lookup min ≤ \
                 lookup max (got {} tokens, lookup {}..{})",
                self.tokens, self.lookup_min, self.lookup_max
            ));
        }
        Ok(())
    }

    /// The drafts after `tokens`, at most `n`: what followed the latest earlier occurrence of
    /// their longest suffix of `lookup_max` down to `lookup_min` tokens. A match near the end
    /// goes on copying what it proposes (a repeating run is guessed on), as LZ77 copies.
    pub fn propose(&self, tokens: &[u32], n: usize) -> Vec<u32> {
        let len = tokens.len();
        let longest = self.lookup_max.min(len.saturating_sub(1));
        for k in (self.lookup_min..=longest).rev() {
            let suffix = &tokens[len - k..];
            let Some(at) = (0..len - k).rev().find(|&p| &tokens[p..p + k] == suffix) else {
                continue;
            };
            let mut drafts: Vec<u32> = Vec::with_capacity(n);
            for i in at + k..at + k + n {
                let t = match tokens.get(i) {
                    Some(&t) => t,
                    None => drafts[i - len],
                };
                drafts.push(t);
            }
            return drafts;
        }
        Vec::new()
    }
}

#[cfg(test)]
#[path = "ngram_tests.rs"]
mod tests;
