//! Async scheduling: the leader plans step n+1 while the device runs step n, as vLLM v1 does.
//!
//! Without it, the device waits for the host between two steps: for the ids of step n to come
//! back, then for their requests to be updated, step n+1 to be scheduled and planned, and its
//! metadata to be copied up. With it, one step is always in flight ([`InFlight`]), and a call
//! of [`Engine::step`]:
//!
//! 1. schedules step n+1 as if every sequence sampling in step n already had its token: each
//!    holds a placeholder at that position since step n was launched, and its computed tokens
//!    were counted then (stream order: whatever step n+1 reads, step n has written first);
//! 2. plans it (block tables, the device's sampling parameters);
//! 3. waits for step n's picks and puts each token in its placeholder's place, in the
//!    scheduler's copy and in the plan;
//! 4. launches step n+1, whose placeholders are now pushed in turn;
//! 5. and only then records step n's tokens (stop tokens, lengths, events), which the caller
//!    delivers while the device runs step n+1.
//!
//! So the device is idle only between step n's end and step n+1's launch (3 and 4). What it
//! costs: a sequence that a stop token ends in step n has already been planned into step n+1;
//! that step's pick for it is dropped ([`InFlight::retired`]). A sequence whose step-n token
//! is its last by length is not planned again (it has no tokens left).
//!
//! **Chained launch.** Where every rank drew step n's tokens itself and they agree (one rank,
//! or ranks that all have the whole logits), 3 and 4 swap: step n+1 is launched first, its
//! placeholders named in the plan ([`StepPlan::carried`]) and filled on each rank from its own
//! draws (on a GPU by a kernel, without the ids leaving the device), and step n's picks are
//! read while step n+1 runs. The device then waits for the host only to plan, not for a round
//! trip of the ids. The host's bookkeeping keeps its order: step n's tokens go into the
//! scheduler before step n+1 counts as computed (block hashes read them).
//!
//! A request under a grammar needs its token of step n before the mask of step n+1 can be
//! computed: its grammar follows the token in 3, and the masks of step n+1 are computed while
//! its forward runs, as in a step run alone (a device that samples takes them once the forward
//! is queued). So a step with a grammar, or after one, is not chained. Sampling on the host
//! (a draw the ranks do not make: on the CPU, at a temperature) reads the tokens before its
//! own, all known by then; a step that samples there is chained only after a step that did
//! not. Penalties need the tokens so far too: the plan carries all but the newest, which the
//! ranks count from the step's own input ([`crate::model::DrawExtras`]), so a penalized draw
//! chains like any other.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Instant;

use crate::engine::{Engine, StepOutput};
use crate::error::Result;
use crate::inflight::InFlight;
use crate::model::Carried;
use crate::plan::StepPlan;
use crate::sampler::SampledToken;
use crate::scheduler::{Schedule, SeqId};

/// What stands in a sequence's next position while the step computing it is in flight. Any
/// id would do: it is replaced before anything reads it.
const PLACEHOLDER: u32 = 0;

/// A token of the step collected, in its placeholder's place, to record.
struct Resolved {
    id: SeqId,
    index: usize,
    token: SampledToken,
    /// Whether the token completed the request's grammar, and by narrowing to the budget.
    grammar: (bool, bool),
}

impl Engine {
    /// One step under async scheduling: plans and launches the next step, and returns the
    /// tokens of the step that was in flight. A failed step fails the requests of
    /// both steps.
    pub(crate) fn step_overlapped(&mut self) -> Result<StepOutput> {
        let mut schedule = self.sched.schedule();
        self.drop_ending(&mut schedule);
        let now = Instant::now();
        let mut out = self.begin_step(&schedule, now);
        let mut plan = match (!schedule.chunks.is_empty())
            .then(|| self.plan_step(&schedule))
            .transpose()
        {
            Ok(plan) => plan,
            Err(e) => return Err(self.fail_both(e, &schedule)),
        };
        let inflight = self.inflight.take();
        out.chained = match (&inflight, &mut plan) {
            (Some(f), Some(plan)) => match self.chain(f, &schedule, plan) {
                Ok(chained) => chained,
                Err(e) => {
                    self.exec.abandon();
                    self.fail(f.schedule.chunks.iter().map(|c| c.id));
                    return Err(self.fail_both(e, &schedule));
                }
            },
            _ => false,
        };
        let (resolved, launched) = match inflight {
            Some(f) => match self.collect(&f, &mut out) {
                Ok(r) => (r, f.launched),
                Err(e) => {
                    match plan {
                        // The ranks have the next plan: its step is forgotten, not collected.
                        Some(_) if out.chained => self.exec.abandon(),
                        // No rank saw the next plan: the ranks' tables are as before it.
                        Some(plan) => self.plans.unbuild(plan),
                        None => {}
                    }
                    self.fail(f.schedule.chunks.iter().map(|c| c.id));
                    return Err(self.fail_both(e, &schedule));
                }
            },
            None => (Vec::new(), now),
        };
        if let Some(mut plan) = plan {
            if !out.chained {
                self.launch_after(&schedule, &mut plan, &resolved)?;
            }
            self.launched(schedule, now);
        }
        for r in resolved {
            match self.record_token(r.id, r.token, r.index, launched, r.grammar) {
                Ok(ev) => out.events.push(ev),
                Err(e) if e.fails_alone() => {
                    self.abort(r.id);
                    out.failed.push((r.id, e));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Launches `plan` (of `schedule`, the next step) before the draws of `f`, the step in
    /// flight, are back, where the ranks can put them in its placeholders themselves: `f`
    /// drew on every rank alike without a grammar, and `schedule` has no grammar to mask.
    /// Returns whether it did.
    fn chain(&mut self, f: &InFlight, schedule: &Schedule, plan: &mut StepPlan) -> Result<bool> {
        let can = self.exec.can_carry_into(plan) && !self.any_constrained(schedule);
        if !can || !chaining() {
            return Ok(false);
        }
        plan.carried = carried(&f.schedule, plan);
        self.exec.launch(plan, None)?;
        Ok(true)
    }

    /// Launches `plan` (of `schedule`) once the step before it is collected: its placeholders
    /// take the tokens `resolved`, and its requests under a grammar sample under the masks
    /// those tokens lead to. A failure fails the requests of both steps.
    fn launch_after(
        &mut self,
        schedule: &Schedule,
        plan: &mut StepPlan,
        resolved: &[Resolved],
    ) -> Result<()> {
        put_tokens(plan, resolved);
        // A request whose grammar its last token completed samples nothing more.
        let ended = (resolved.iter())
            .filter(|r| r.grammar.0)
            .map(|r| r.id)
            .collect();
        let led = self.run_masked(schedule, plan, &ended, |exec, plan, masks| {
            exec.launch(plan, masks)
        });
        led.map_err(|e| {
            // The tokens collected are not delivered: their requests fail with the step's.
            self.fail(resolved.iter().map(|r| r.id));
            self.fail_both(e, schedule)
        })
    }

    /// Whether a request sampling in `schedule` has a grammar.
    fn any_constrained(&self, schedule: &Schedule) -> bool {
        (schedule.chunks.iter()).any(|c| c.samples && self.has_grammar(c.id))
    }

    /// Takes out of `schedule` the sequences with no token left to take: the step in flight
    /// samples their last one.
    fn drop_ending(&self, schedule: &mut Schedule) {
        schedule
            .chunks
            .retain(|c| self.tokens_left_of(c.id).is_none_or(|n| n > 0));
    }

    /// The step in flight's picks, each in its placeholder's place; a request whose pick fails
    /// alone is failed in `out`.
    fn collect(&mut self, f: &InFlight, out: &mut StepOutput) -> Result<Vec<Resolved>> {
        let picks = self.exec.collect()?;
        let picks = (self.split_picks(picks, &f.schedule)?.into_iter())
            .zip(&f.schedule.chunks)
            .map(|(pick, c)| pick.filter(|_| !f.retired.contains(&c.id)))
            .collect();
        let tokens = self.pick_all(&f.schedule.chunks, picks);
        let mut resolved = Vec::new();
        for (c, token) in f.schedule.chunks.iter().zip(tokens) {
            let Some(token) = token else {
                continue;
            };
            let index = c.start + c.len;
            // Its grammar follows the token now: the mask of its next step needs it. (No
            // step has drafts under async scheduling: one token each.)
            let token = token.and_then(|mut tokens| {
                let token = tokens.pop().ok_or_else(|| {
                    crate::EngineError::Internal(format!("no token picked for {}", c.id))
                })?;
                let grammar = self.accept_token(c.id, token.id)?;
                Ok((token, grammar))
            });
            match token {
                Ok((token, grammar)) => {
                    self.sched.set_token(c.id, index, token.id);
                    resolved.push(Resolved {
                        id: c.id,
                        index,
                        token,
                        grammar,
                    });
                }
                Err(e) if e.fails_alone() => {
                    self.abort(c.id);
                    out.failed.push((c.id, e));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(resolved)
    }

    /// `schedule` was launched: its tokens count as computed, and each sampling sequence
    /// holds a placeholder for its token.
    fn launched(&mut self, schedule: Schedule, launched: Instant) {
        for c in &schedule.chunks {
            self.sched.mark_computed(c, 0);
            if c.samples {
                self.sched.push_token(c.id, PLACEHOLDER);
            }
        }
        // A request that failed alone while this step was planned is in it all the same.
        let retired = (schedule.chunks.iter())
            .map(|c| c.id)
            .filter(|id| !self.contains(*id))
            .collect();
        self.inflight = Some(InFlight {
            schedule,
            retired,
            launched,
        });
    }

    /// Fails `schedule`'s requests after `e`, and forgets the prefix cache's unheld blocks: a
    /// step that failed may have been counted as computed before it ran. Returns `e`.
    fn fail_both(&mut self, e: crate::EngineError, schedule: &Schedule) -> crate::EngineError {
        self.fail(schedule.chunks.iter().map(|c| c.id));
        self.sched.reset_prefix_cache();
        e
    }
}

/// Whether steps may chain (on unless `FERRITE_CHAIN_STEPS=0`, read once): the off switch is
/// for A/B runs on one machine (tests/gpu/host.sh's `ab` stage).
fn chaining() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::engine::switched_off("FERRITE_CHAIN_STEPS"))
}

/// Where `plan`'s chunks hold the placeholders of the tokens `prev` (the step before it)
/// samples: each sampling chunk of `prev`, in order, is a row of its draws.
fn carried(prev: &Schedule, plan: &StepPlan) -> Vec<Carried> {
    let rows: HashMap<SeqId, (usize, u32)> = (prev.chunks.iter())
        .filter(|c| c.samples)
        .enumerate()
        .map(|(row, c)| (c.id, (c.start + c.len, row as u32)))
        .collect();
    (plan.chunks.iter().enumerate())
        .filter_map(|(chunk, c)| {
            let &(at, row) = rows.get(&c.id)?;
            let index = at.checked_sub(c.start).filter(|&i| i < c.tokens.len())?;
            Some(Carried {
                chunk: chunk as u32,
                index: index as u32,
                row,
            })
        })
        .collect()
}

/// Puts each of `resolved`'s tokens in `plan`, where its chunk holds the placeholder.
fn put_tokens(plan: &mut StepPlan, resolved: &[Resolved]) {
    let at: HashMap<SeqId, usize> = (plan.chunks.iter().enumerate())
        .map(|(i, c)| (c.id, i))
        .collect();
    for r in resolved {
        let Some(c) = at.get(&r.id).map(|&i| &mut plan.chunks[i]) else {
            continue;
        };
        if let Some(t) = r
            .index
            .checked_sub(c.start)
            .and_then(|i| c.tokens.get_mut(i))
        {
            *t = r.token.id;
        }
    }
}

#[cfg(test)]
#[path = "overlap_tests.rs"]
pub(crate) mod tests;
