//! Scored prompts ([`crate::sampler::SamplingParams::prompt_logprobs`]): the logprob of each
//! prompt token given the tokens before it, as `echo` with `logprobs` asks for (an
//! evaluation harness's loglikelihoods).
//!
//! The scheduler keeps every row of a scored prompt's chunks
//! ([`crate::scheduler::ScheduledChunk::all_logits`]), and such a step's logits all come back
//! to the host. Here the rows that score a prompt token are taken out of the step's picks,
//! which are left with one row per sampling chunk, as any step's; each request keeps its
//! scores until its first token carries them. A prompt computed again after a preemption
//! is not scored twice: a request takes each position's score once, in order.

use rayon::prelude::*;

use super::Engine;
use crate::error::{EngineError, Result};
use crate::executor::Picks;
use crate::sampler::score_token;
use crate::scheduler::{Schedule, ScheduledChunk};

impl Engine {
    /// Takes the rows of `schedule`'s scored prompts out of `picks` and scores them.
    pub(crate) fn score_prompts(&mut self, picks: &mut Picks, schedule: &Schedule) -> Result<()> {
        if !schedule
            .chunks
            .iter()
            .any(|c| c.all_logits && c.len > c.sampling_rows())
        {
            return Ok(());
        }
        let Picks::Logits(logits) = picks else {
            return Err(EngineError::Internal(
                "a step with a scored prompt came back with draws, not logits".into(),
            ));
        };
        let vocab = self.cfg.vocab_size.max(1);
        let rows: usize = schedule.chunks.iter().map(ScheduledChunk::rows).sum();
        if logits.len() != rows * vocab {
            return Err(EngineError::Internal(format!(
                "{} logits for {rows} rows of {vocab} in a step with a scored prompt",
                logits.len()
            )));
        }
        let mut sampling = Vec::with_capacity(schedule.chunks.len() * vocab);
        let mut at = 0;
        for c in &schedule.chunks {
            let chunk = &logits[at * vocab..(at + c.rows()) * vocab];
            at += c.rows();
            // A scored chunk's last rows are its sampling rows (one, or one per draft more).
            let scored = match c.all_logits {
                true => c.len - c.sampling_rows(),
                false => 0,
            };
            self.score_rows(c, &chunk[..scored * vocab]);
            sampling.extend_from_slice(&chunk[scored * vocab..]);
        }
        *logits = sampling;
        Ok(())
    }

    /// Scores the prompt tokens `rows` (of chunk `c`, from its first position) predict that
    /// `c`'s request has no score for yet.
    fn score_rows(&mut self, c: &ScheduledChunk, rows: &[f32]) {
        let vocab = self.cfg.vocab_size.max(1);
        let (Some(req), Some(seq)) = (self.requests.get_mut(&c.id), self.sched.get(c.id)) else {
            // Retired while its step was in flight: nobody reads its scores.
            return;
        };
        let top = req.sampler.params().prompt_logprobs.unwrap_or(0);
        // Row `i` predicts the token at `c.start + i + 1`; position `p` is scored `p - 1`th.
        // Chunks run in order from position 0 (nothing comes from the cache): no gap.
        let Some(first) = req.prompt_logprobs.len().checked_sub(c.start) else {
            return;
        };
        let last = (seq.prompt_len - 1)
            .saturating_sub(c.start)
            .min(rows.len() / vocab);
        if first >= last {
            return;
        }
        let targets = &seq.tokens[c.start + first + 1..c.start + last + 1];
        let scores: Vec<_> = (rows[first * vocab..last * vocab].par_chunks_exact(vocab))
            .zip(targets)
            .map(|(row, &t)| score_token(row, t, top))
            .collect();
        req.prompt_logprobs.extend(scores);
    }
}

#[cfg(test)]
#[path = "scoring_tests.rs"]
mod tests;
