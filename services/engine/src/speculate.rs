//! Speculative decoding by n-gram lookup (vLLM's `ngram` method, "prompt lookup decoding"):
//! before a step, each decoding sequence guesses its next tokens by finding its last few
//! tokens earlier in its own context and taking what followed them there. The guesses (the
//! drafts) run in the sequence's chunk with its last token, one row of logits each
//! ([`crate::scheduler::Scheduler::set_drafts`]), and its tokens are sampled from those rows
//! in order while each agrees with the draft in its place (`pick`'s `pick_drafted`).
//!
//! Each row is sampled exactly as a step of its own would sample it, with the same random
//! draw, so the output is the one decoding a token at a time gives, greedy or seeded alike: a
//! step makes one token, plus one per draft accepted. (Its rows take the arithmetic of a
//! decode step of several rows: exact with f32 activations; under the CPU's int8 ones, that
//! of a batch, so near-ties may go the other way, as they may beside other requests.) For a draft that is a single guess, taking it when the
//! sampled token equals it accepts it with its probability, as rejection sampling would.
//!
//! Drafts cost rows of the step: they pay where outputs repeat their context (code edits,
//! extraction, quoting, summaries that copy), and the guess is free. So each request guesses
//! as many as its drafts have been earning, as transformers' assisted generation schedules
//! them: two more after a step whose drafts were all accepted, one fewer (at least one) after
//! one where some were not. Under a grammar, each draft's row is masked as its own step's would
//! be: the grammar follows each agreeing draft before the next row is sampled. No sequence
//! takes drafts under async scheduling (the next step is planned before this one's tokens
//! are known).

use super::Engine;
use crate::ngram::Speculation;
use crate::scheduler::ScheduledChunk;

impl Engine {
    /// Guesses the drafts of every running sequence that decodes next (see the module doc),
    /// in place of those of the step before.
    pub(crate) fn propose_drafts(&mut self) {
        let Some(spec) = self.speculation else {
            return;
        };
        for id in self.sched.running().to_vec() {
            self.sched.set_drafts(id, &[]);
            let Some(req) = self.requests.get(&id) else {
                continue;
            };
            // The step samples a token after the drafts too: they leave it room.
            let room = self.tokens_left_of(id).unwrap_or(0).saturating_sub(1);
            let n = spec.tokens.min(room).min(req.draft_len);
            let Some(seq) = self.sched.get(id) else {
                continue;
            };
            if n == 0 || !seq.decodes() {
                continue;
            }
            let drafts = spec.propose(&seq.tokens, n);
            self.sched.set_drafts(id, &drafts);
        }
    }

    /// Counts chunk `c`'s drafts, of which its rows agreed with `accepted`, and sets how many
    /// its request guesses next (see the module doc).
    pub(crate) fn count_drafts(&mut self, c: &ScheduledChunk, accepted: usize) {
        let (Some(spec), Some(req)) = (self.speculation, self.requests.get_mut(&c.id)) else {
            return;
        };
        if c.drafts == 0 {
            return;
        }
        self.draft_tokens += c.drafts as u64;
        self.accepted_tokens += accepted.min(c.drafts) as u64;
        let now = req.draft_len.min(spec.tokens);
        req.draft_len = match accepted >= c.drafts {
            true => (now + 2).min(spec.tokens),
            false => now.saturating_sub(1).max(1),
        };
    }

    /// Turns speculative decoding on (or off) for the steps from now on; returns whether it
    /// is on (not under async scheduling: there it stays off).
    pub fn set_speculation(&mut self, spec: Option<Speculation>) -> bool {
        self.speculation = spec.filter(|_| !self.async_scheduling);
        self.speculation.is_some()
    }
}

#[cfg(test)]
#[path = "speculate_tests.rs"]
mod tests;
