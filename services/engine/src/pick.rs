//! A step's tokens from its picks: rows of logits sampled on the host, or ids the ranks drew;
//! and their recording, in order, for their requests.
//!
//! Rows are sampled in parallel: each with its own request's sampler and random stream, so
//! the order they run in changes nothing. Every row of a step on the CPU without async
//! scheduling is sampled here, where a 128K-token row at a temperature takes about a
//! millisecond.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use rayon::prelude::*;

use super::{Engine, Request, StepOutput, tokens_left_at};
use crate::constraint::{apply_mask, check_allowed};
use crate::error::{EngineError, Result};
use crate::executor::Pick;
use crate::sampler::SampledToken;
use crate::scheduler::{ScheduledChunk, SeqId, SeqState};

impl Engine {
    /// Each chunk's tokens from its pick (`None` where it has none): the token after the
    /// chunk, sampled from its row of logits, or the id the ranks drew for it; for a chunk
    /// with drafts, the drafts its rows agree with, then the token after them
    /// ([`pick_drafted`]).
    pub(crate) fn pick_all(
        &mut self,
        chunks: &[ScheduledChunk],
        picks: Vec<Option<Pick>>,
    ) -> Vec<Option<Result<Vec<SampledToken>>>> {
        let wanted: HashSet<SeqId> = (chunks.iter().zip(&picks))
            .filter(|(_, p)| p.is_some())
            .map(|(c, _)| c.id)
            .collect();
        let mut requests: HashMap<SeqId, &mut Request> = (self.requests.iter_mut())
            .filter(|(id, _)| wanted.contains(id))
            .map(|(id, r)| (*id, r))
            .collect();
        let sched = &self.sched;
        let max_model_len = sched.config().max_model_len;
        let jobs: Vec<Option<Job<'_>>> = (chunks.iter().zip(picks))
            .map(|(c, pick)| {
                pick.map(|pick| Job {
                    id: c.id,
                    pick,
                    index: c.first_sampled(),
                    drafts: c.drafts,
                    max_model_len,
                    req: requests.remove(&c.id),
                    seq: sched.get(c.id),
                })
            })
            .collect();
        let rows = (jobs.iter().flatten())
            .filter(|j| matches!(j.pick, Pick::Row(_)))
            .count();
        let run = |job: Option<Job<'_>>| job.map(Job::run);
        // One row alone stays on this thread: handing it to the pool costs two wake-ups.
        match rows > 1 {
            true => jobs.into_par_iter().map(run).collect(),
            false => jobs.into_iter().map(run).collect(),
        }
    }

    /// Records the tokens `picked` for chunk `c` (its accepted drafts, already in its
    /// sequence, then a new one) until one ends its request. A request whose tokens fail
    /// alone is failed in `out`; any other error is the step's.
    pub(crate) fn record_tokens(
        &mut self,
        c: &ScheduledChunk,
        picked: Result<Vec<SampledToken>>,
        now: Instant,
        out: &mut StepOutput,
    ) -> Result<()> {
        let tokens: Vec<Result<SampledToken>> = match picked {
            Ok(tokens) => tokens.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e)],
        };
        let n = tokens.len();
        for (i, t) in tokens.into_iter().enumerate() {
            let recorded = t.and_then(|t| {
                let grammar = self.accept_token(c.id, t.id)?;
                if i + 1 == n {
                    self.sched.push_token(c.id, t.id);
                }
                self.record_token(c.id, t, c.first_sampled() + i, now, grammar)
            });
            match recorded {
                Ok(ev) if ev.finish.is_some() => {
                    out.events.push(ev);
                    break;
                }
                Ok(ev) => out.events.push(ev),
                Err(e) if e.fails_alone() => {
                    self.abort(c.id);
                    out.failed.push((c.id, e));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// One sequence's pick, with what taking it needs: the token at `index` of its sequence
/// (and the `drafts` after it).
struct Job<'a> {
    id: SeqId,
    pick: Pick,
    index: usize,
    drafts: usize,
    max_model_len: usize,
    req: Option<&'a mut Request>,
    seq: Option<&'a SeqState>,
}

impl Job<'_> {
    fn run(self) -> Result<Vec<SampledToken>> {
        match (self.req, self.seq, self.pick) {
            (Some(req), Some(seq), Pick::Row(rows)) if self.drafts > 0 => {
                let at = Drafted {
                    index: self.index,
                    drafts: self.drafts,
                    max_model_len: self.max_model_len,
                };
                pick_drafted(req, seq, rows, at)
            }
            (Some(req), Some(seq), pick) => Ok(vec![pick_one(req, seq, pick, self.index)?]),
            // The caller checked that `id` is in both tables; nothing removes it since.
            _ => Err(EngineError::Internal(format!(
                "sequence {} vanished mid-step",
                self.id
            ))),
        }
    }
}

/// Where a chunk's drafts stand: the first row predicts the token at `index` of its
/// sequence, and `drafts` tokens from there are guesses.
struct Drafted {
    index: usize,
    drafts: usize,
    max_model_len: usize,
}

/// `req`'s tokens from `rows`, the rows of its chunk with drafts (`at`): each row is sampled
/// as the row of a step of its own would be (the same random draw, under the mask its
/// grammar gives after the tokens before it), and the next row is taken only while the token
/// sampled is the draft in its place. So the tokens are those decoding one at a time would
/// give, and the last is the first that is not a draft (or the one after the last draft).
///
/// Under a grammar, each agreeing draft is followed at once (the next row's mask needs it),
/// and what the grammar said is kept for [`Engine::accept_token`]; a draft that completes
/// the grammar is the last token.
fn pick_drafted(
    req: &mut Request,
    seq: &SeqState,
    mut rows: Vec<f32>,
    at: Drafted,
) -> Result<Vec<SampledToken>> {
    let vocab = (rows.len() / (at.drafts + 1)).max(1);
    let max_tokens = req.sampler.params().max_tokens;
    let mut tokens = Vec::new();
    for (i, row) in rows.chunks_exact_mut(vocab).enumerate() {
        let index = at.index + i;
        if i > 0
            && let Some(c) = req.constraint.as_mut()
        {
            let budget = tokens_left_at(seq.prompt_len, index, max_tokens, at.max_model_len);
            let mut mask = vec![0; vocab.div_ceil(32)];
            req.mask = Some(c.allowed(&mut mask, budget.max(1)).map(|()| mask));
        }
        let token = sample_masked(req, seq, row, index)?;
        let agrees = i < at.drafts && seq.tokens.get(index) == Some(&token.id);
        let mut completed = false;
        if agrees && let Some(c) = req.constraint.as_mut() {
            completed = c.accept(token.id).map_err(EngineError::Grammar)?;
            req.ahead.push_back((completed, c.cut_short()));
        }
        tokens.push(token);
        if !agrees || completed {
            break;
        }
    }
    Ok(tokens)
}

/// `req`'s token at `index` of `seq` sampled from `row`, under this step's mask where it has
/// a grammar.
fn sample_masked(
    req: &mut Request,
    seq: &SeqState,
    row: &mut [f32],
    index: usize,
) -> Result<SampledToken> {
    if req.constraint.is_some() {
        take_mask(req)
            .and_then(|m| apply_mask(row, &m))
            .map_err(EngineError::Grammar)?;
    }
    sample_row(req, seq, row, index)
}

/// The mask computed for `req`'s row (taken: each row has its own).
fn take_mask(req: &mut Request) -> std::result::Result<Vec<u32>, String> {
    req.mask
        .take()
        .unwrap_or_else(|| Err("no mask was computed for this step (an engine bug)".into()))
}

/// `req`'s token at `index` of `seq` sampled from `row`, with its penalties over the tokens
/// before it.
fn sample_row(
    req: &mut Request,
    seq: &SeqState,
    row: &mut [f32],
    index: usize,
) -> Result<SampledToken> {
    // The tokens before this one, kept from step to step (as the ranks' extras are).
    let seen = match req.sampler.params().penalties().any() {
        true => req.seen.through(seq, index),
        false => &[],
    };
    req.sampler.sample(row, seen)
}

/// `req`'s token at `index` of its sequence `seq`, from `pick`: sampled from its row (under
/// its grammar's mask), or the id the ranks drew, checked against the mask.
fn pick_one(req: &mut Request, seq: &SeqState, pick: Pick, index: usize) -> Result<SampledToken> {
    Ok(match pick {
        Pick::Row(mut row) => sample_masked(req, seq, &mut row, index)?,
        Pick::Undrawn(id) => {
            return Err(EngineError::BadLogits(format!(
                "the device drew no token (it gave id {id}, outside the vocabulary): the \
                 model's logits are not a distribution, its weights or its arithmetic are \
                 broken"
            )));
        }
        // Drawn by the ranks: the logprobs are theirs, where the request asked for them.
        Pick::Id(id, logprobs) => {
            if req.constraint.is_some() {
                // The device drew under the mask; it can only draw outside it where the mask
                // allowed nothing, or where computing the mask failed.
                take_mask(req)
                    .and_then(|m| check_allowed(&m, id))
                    .map_err(EngineError::Grammar)?;
            }
            let (logprob, top) = logprobs.map_or((f32::NAN, Vec::new()), |l| (l.logprob, l.top));
            SampledToken { id, logprob, top }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::engine::EngineConfig;
    use crate::sampler::{Rng, Sampler, SamplingParams, seen_tokens};
    use crate::scheduler::ScheduledChunk;

    /// Six requests with seeds and cuts of their own sample their rows of one step together
    /// (on the pool), twice: each gets the tokens its own sampler gives its own row, one row
    /// after another, and its random stream goes on from where it was.
    #[test]
    fn rows_sampled_together_each_take_their_own_requests_sampler() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2");
        let loaded = crate::model::load(&dir).expect("tiny model");
        let vocab = loaded.model.config().vocab_size;
        let cfg = EngineConfig {
            max_model_len: Some(64),
            kv_cache_bytes: 8 << 20,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(loaded.model, vec![], cfg).expect("engine");
        let params = |i: u64| SamplingParams {
            temperature: 0.5 + i as f32 / 4.0,
            top_k: [0, 50, 0, 7, 0, 120][i as usize],
            top_p: [1.0, 1.0, 0.8, 1.0, 0.95, 0.9][i as usize],
            seed: Some(100 + i),
            ..SamplingParams::greedy(8)
        };
        let prompt = |i: u64| vec![3 + i as u32, 9, 4];
        let chunks: Vec<ScheduledChunk> = (0..6u64)
            .map(|i| {
                e.add_request(i, prompt(i), params(i)).expect("add");
                ScheduledChunk {
                    id: i,
                    start: 0,
                    len: 3,
                    samples: true,
                    all_logits: false,
                    drafts: 0,
                }
            })
            .collect();
        let mut noise = Rng::seeded(5);
        let mut rows = || -> Vec<Vec<f32>> {
            (0..6)
                .map(|_| (0..vocab).map(|_| noise.next_f64() as f32 * 6.0).collect())
                .collect()
        };
        let mut alone: Vec<Sampler> = (0..6).map(|i| Sampler::new(params(i))).collect();
        for _ in 0..2 {
            let rows = rows();
            let picks = rows.iter().map(|r| Some(Pick::Row(r.clone()))).collect();
            let got: Vec<u32> = (e.pick_all(&chunks, picks).into_iter())
                .map(|t| t.expect("a pick").expect("sampled")[0].id)
                .collect();
            let want: Vec<u32> = (alone.iter_mut().zip(rows).enumerate())
                .map(|(i, (s, mut row))| {
                    s.sample(&mut row, &seen_tokens(&prompt(i as u64), &[]))
                        .expect("sampled")
                        .id
                })
                .collect();
            assert_eq!(got, want);
        }
    }
}
