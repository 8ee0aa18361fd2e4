//! The step plan: what the leader sends every rank each step, and the block tables each rank
//! keeps from the plans.
//!
//! Like vLLM v1's scheduler output, a plan carries a sequence's block table in full the first
//! time the sequence runs and, after that, only the blocks added since. Tokens travel with the
//! chunk that computes them: a prompt once (in chunks, under chunked prefill), then one token
//! per decode step. A sequence that finished, was aborted or was preempted is named in the next
//! plan's `freed`, and is sent in full again if it comes back.
//!
//! Invariants, checked by every rank on every plan ([`BlockTables::apply`]): plans arrive
//! numbered one after another; a table is created once and only grown until freed; every chunk
//! names a sequence with a table that covers its positions.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::model::{Carried, DeviceSampling, DrawExtras};
use crate::model::{LogitsWanted, SeqChunk};
use crate::scheduler::{Schedule, Scheduler, SeqId};

/// One step for every rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepPlan {
    /// Steps count from 1; each rank checks that plans follow one another.
    pub step: u64,
    /// Sequences whose tables the ranks drop before this step.
    pub freed: Vec<SeqId>,
    /// New tables (in full) and grown ones (the blocks added since the last plan).
    pub tables: Vec<TableUpdate>,
    /// What to compute, in order.
    pub chunks: Vec<PlannedChunk>,
    /// Each sampling chunk's draw where the ranks draw (on a GPU; on the CPU greedy picks
    /// under async scheduling), `None` where every row comes back as logits.
    pub device_sampling: Option<Vec<DeviceSampling>>,
    /// With `device_sampling`: the sampling rows the ranks do not draw for (their entry there
    /// is a stand-in), whose logits come back to be sampled on the host (a draw the CPU does
    /// not make; with `FERRITE_DRAW_EXTRAS=0`, logprobs and penalties).
    pub host_rows: Vec<u32>,
    /// With `device_sampling`: the penalties and logprobs of the rows the ranks draw whose
    /// requests ask for them.
    #[serde(default)]
    pub extras: Vec<DrawExtras>,
    /// On a GPU: the captured decode graph every rank replays for this step, by its batch
    /// size (`None`: eagerly). The leader decides it ([`crate::executor::Executor::lead`]), so
    /// no rank pads a step to another size than its peers.
    pub graph: Option<usize>,
    /// Tokens the step before this one drew that no host has read yet (async scheduling's
    /// chained launch): each rank puts its own draw in their placeholders' place.
    pub carried: Vec<Carried>,
}

/// A block table sent in full (`new`) or grown by `blocks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableUpdate {
    pub id: SeqId,
    pub new: bool,
    pub blocks: Vec<u32>,
}

/// One sequence's share of a step: `tokens` at positions `start..`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedChunk {
    pub id: SeqId,
    pub start: usize,
    pub tokens: Vec<u32>,
    pub logits: LogitsWanted,
    /// The chunk holds a token of the prompt (or several tokens): see [`SeqChunk::prompt`].
    #[serde(default)]
    pub prompt: bool,
    /// The LoRA adapter the sequence runs with: see [`SeqChunk::lora`].
    #[serde(default)]
    pub lora: Option<u32>,
}

impl PlannedChunk {
    pub fn samples(&self) -> bool {
        self.logits != LogitsWanted::None
    }
}

impl StepPlan {
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }
}

/// What the leader tells the other ranks.
#[derive(Debug, Deserialize)]
pub enum Order {
    Step(StepPlan),
    /// Nothing to run: the leader is alive (ranks time out waiting otherwise).
    KeepAlive,
    /// The pool is shutting down.
    Stop,
}

/// [`Order`] as the leader sends it, borrowing the plan (the same bytes on the wire).
#[derive(Debug, Serialize)]
pub enum OrderRef<'a> {
    Step(&'a StepPlan),
    KeepAlive,
    Stop,
}

impl OrderRef<'_> {
    pub fn encode(&self) -> Vec<u8> {
        // Plain data: serializing it into memory cannot fail.
        postcard::to_allocvec(self).unwrap_or_default()
    }
}

impl Order {
    pub fn decode(bytes: &[u8]) -> Result<Order> {
        postcard::from_bytes(bytes)
            .map_err(|e| EngineError::Internal(format!("a step plan that does not decode: {e}")))
    }
}

/// The leader's side: which sequences the ranks hold a table for, and how much of it.
#[derive(Debug, Default)]
pub struct PlanBuilder {
    /// Blocks of each sequence's table the ranks have.
    sent: HashMap<SeqId, usize>,
    freed: Vec<SeqId>,
    step: u64,
}

impl PlanBuilder {
    /// The ranks drop `id`'s table with the next plan (if they have one).
    pub fn forget(&mut self, id: SeqId) {
        if self.sent.remove(&id).is_some() {
            self.freed.push(id);
        }
    }

    /// The plan of `schedule`, with the tables as `sched` holds them now.
    pub fn build(&mut self, schedule: &Schedule, sched: &Scheduler) -> Result<StepPlan> {
        for &id in &schedule.preempted {
            self.forget(id);
        }
        self.step += 1;
        let mut plan = StepPlan {
            step: self.step,
            freed: std::mem::take(&mut self.freed),
            ..StepPlan::default()
        };
        for c in &schedule.chunks {
            let seq = sched.get(c.id).ok_or_else(|| {
                EngineError::Internal(format!("sequence {} was planned but is unknown", c.id))
            })?;
            let blocks = seq.block_table.blocks();
            let sent = self.sent.entry(c.id).or_insert(usize::MAX);
            let new = *sent == usize::MAX;
            let from = if new { 0 } else { *sent };
            if new || blocks.len() > from {
                plan.tables.push(TableUpdate {
                    id: c.id,
                    new,
                    blocks: blocks[from.min(blocks.len())..].to_vec(),
                });
            }
            *sent = blocks.len();
            plan.chunks.push(PlannedChunk {
                id: c.id,
                start: c.start,
                tokens: seq.tokens[c.start..c.start + c.len].to_vec(),
                logits: match (c.all_logits, c.samples) {
                    (true, _) => LogitsWanted::All,
                    (false, true) => LogitsWanted::Last,
                    (false, false) => LogitsWanted::None,
                },
                // A generated token with drafts after it is a decode's, not a prompt's: its
                // rows take a decode step's arithmetic (on the CPU, a batch's).
                prompt: c.start < seq.prompt_len || c.len > 1 + c.drafts,
                lora: seq.adapter.map(|a| a.index),
            });
        }
        Ok(plan)
    }

    /// Takes back `plan`, the last one built, which no rank was given (the step before it
    /// failed): the next plan is numbered as it was, and carries its table updates and frees.
    pub fn unbuild(&mut self, plan: StepPlan) {
        self.step -= 1;
        for u in plan.tables {
            if u.new {
                self.sent.remove(&u.id);
            } else if let Some(sent) = self.sent.get_mut(&u.id) {
                *sent -= u.blocks.len();
            }
        }
        let mut freed = plan.freed;
        freed.append(&mut self.freed);
        self.freed = freed;
    }
}

/// A rank's side: each running sequence's block table, as the plans built it.
#[derive(Debug, Default)]
pub struct BlockTables {
    tables: HashMap<SeqId, Vec<u32>>,
    last_step: u64,
}

impl BlockTables {
    /// The last step whose plan was applied.
    pub fn last_step(&self) -> u64 {
        self.last_step
    }

    /// Applies `plan`'s frees and table updates, checking the invariants of the module doc.
    pub fn apply(&mut self, plan: &StepPlan) -> Result<()> {
        let broken = |m: String| Err(EngineError::Internal(format!("step {}: {m}", plan.step)));
        if plan.step != self.last_step + 1 {
            return broken(format!("the last plan applied was step {}", self.last_step));
        }
        for id in &plan.freed {
            if self.tables.remove(id).is_none() {
                return broken(format!("freed sequence {id}, which has no table"));
            }
        }
        for u in &plan.tables {
            match (u.new, self.tables.get_mut(&u.id)) {
                (true, None) => {
                    self.tables.insert(u.id, u.blocks.clone());
                }
                (false, Some(t)) => t.extend_from_slice(&u.blocks),
                (true, Some(_)) => return broken(format!("sequence {} sent twice", u.id)),
                (false, None) => return broken(format!("sequence {} grew, unknown", u.id)),
            }
        }
        self.last_step = plan.step;
        Ok(())
    }

    /// `plan`'s chunks over the tables (apply it first).
    pub fn chunks<'a>(&'a self, plan: &'a StepPlan) -> Result<Vec<SeqChunk<'a>>> {
        plan.chunks
            .iter()
            .map(|c| {
                let table = self.tables.get(&c.id).ok_or_else(|| {
                    EngineError::Internal(format!(
                        "step {}: sequence {} has no block table",
                        plan.step, c.id
                    ))
                })?;
                Ok(SeqChunk {
                    tokens: &c.tokens,
                    start_pos: c.start,
                    block_table: table,
                    logits: c.logits,
                    prompt: c.prompt,
                    lora: c.lora,
                })
            })
            .collect()
    }

    /// Sequences with a table (for tests and leak checks).
    pub fn len(&self) -> usize {
        self.tables.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
