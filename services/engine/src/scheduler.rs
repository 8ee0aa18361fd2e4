//! Continuous batching: which tokens of which sequences run in the next step.
//!
//! Each step gets a budget of `max_num_batched_tokens`. Running sequences go first, oldest
//! first: a decoding sequence takes one token, a sequence still in its prompt takes as much of
//! the rest as the budget allows (chunked prefill). Waiting sequences are admitted after, in
//! arrival order, while the budget, `max_num_seqs` and free KV blocks allow.
//!
//! When a running sequence needs a block and none is free, the newest running sequence is
//! preempted by recompute: its blocks are freed, its computed-token count goes back to zero, and
//! it returns to the front of the waiting queue; when readmitted it prefills its prompt and the
//! tokens it already generated, then continues. No step admits new sequences after it had to
//! preempt, so a preempted sequence is not starved by newcomers.
//!
//! A sequence is never admitted unless it can ever fit: [`Scheduler::check_fits`] refuses
//! prompts at or over `max_model_len`, and the engine refuses configurations whose pool cannot
//! hold one `max_model_len` sequence.

use std::collections::{HashMap, VecDeque};

use crate::kv_cache::{BlockTable, KvBlockPool, blocks_for};

pub type SeqId = u64;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Token budget of one step (prefill chunk tokens + decode tokens).
    pub max_num_batched_tokens: usize,
    /// Running sequences at most.
    pub max_num_seqs: usize,
    /// Prompt + generated tokens of one sequence at most.
    pub max_model_len: usize,
    pub block_size: usize,
}

/// What the scheduler knows of a sequence: its tokens and where its KV is.
#[derive(Debug)]
pub struct SeqState {
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose keys and values are in the cache.
    pub num_computed: usize,
    pub block_table: BlockTable,
    pub num_preemptions: u32,
}

impl SeqState {
    pub fn new(prompt: Vec<u32>) -> Self {
        Self {
            prompt_len: prompt.len(),
            tokens: prompt,
            num_computed: 0,
            block_table: BlockTable::default(),
            num_preemptions: 0,
        }
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }
}

/// One sequence's share of a step: tokens `start..start + len` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub id: SeqId,
    pub start: usize,
    pub len: usize,
    /// The chunk reaches the sequence's last token, so the step samples its next token.
    pub samples: bool,
}

/// The scheduler's decision for one step (the leader turns it into a
/// [`crate::plan::StepPlan`] for the ranks).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    pub chunks: Vec<ScheduledChunk>,
    /// Sequences preempted (blocks freed) while planning this step.
    pub preempted: Vec<SeqId>,
}

impl Schedule {
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum()
    }
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: KvBlockPool,
    seqs: HashMap<SeqId, SeqState>,
    waiting: VecDeque<SeqId>,
    /// Oldest first.
    running: Vec<SeqId>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, num_blocks: u32) -> Self {
        Self {
            cfg,
            pool: KvBlockPool::new(num_blocks),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Why a prompt of `prompt_len` tokens can never run, if it cannot.
    pub fn check_fits(&self, prompt_len: usize) -> Result<(), String> {
        if prompt_len >= self.cfg.max_model_len {
            return Err(format!(
                "the prompt has {prompt_len} tokens; the context holds {} (prompt plus at least one new token)",
                self.cfg.max_model_len
            ));
        }
        Ok(())
    }

    /// Queues a sequence. The caller checked [`Self::check_fits`] and that `id` is new.
    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>) {
        self.seqs.insert(id, SeqState::new(prompt));
        self.waiting.push_back(id);
    }

    /// Removes a sequence wherever it is and frees its blocks. Returns its state.
    pub fn remove(&mut self, id: SeqId) -> Option<SeqState> {
        let mut seq = self.seqs.remove(&id)?;
        self.pool.release(&mut seq.block_table);
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        Some(seq)
    }

    pub fn get(&self, id: SeqId) -> Option<&SeqState> {
        self.seqs.get(&id)
    }

    /// Appends a sampled token to a sequence.
    pub fn push_token(&mut self, id: SeqId, token: u32) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.tokens.push(token);
        }
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    pub fn blocks_used(&self) -> usize {
        self.pool.num_used()
    }

    pub fn blocks_total(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Plans the next step and allocates the blocks it needs. The chunks' tokens must then be
    /// computed and [`Self::mark_computed`] called for each.
    pub fn schedule(&mut self) -> Schedule {
        let mut plan = Schedule::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(want) = self.chunk_len(id, budget) else {
                i += 1;
                continue;
            };
            if self.make_room(id, want, &mut plan) {
                budget -= self.push_chunk(id, want, &mut plan);
                i += 1;
            }
            // else: `id` itself was preempted and left `running`; `i` now points at the next.
        }
        if plan.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(want) = self.chunk_len(id, budget) else {
                    break;
                };
                let Some(seq) = self.seqs.get_mut(&id) else {
                    self.waiting.pop_front();
                    continue;
                };
                let need = blocks_for(seq.num_computed + want, self.cfg.block_size)
                    - seq.block_table.len();
                if !self.pool.allocate_into(need, &mut seq.block_table) {
                    break;
                }
                self.waiting.pop_front();
                self.running.push(id);
                budget -= self.push_chunk(id, want, &mut plan);
            }
        }
        plan
    }

    /// Tokens of `id` to run this step within `budget`, or None if it has none left to run.
    fn chunk_len(&self, id: SeqId, budget: usize) -> Option<usize> {
        let seq = self.seqs.get(&id)?;
        let left = seq.tokens.len().saturating_sub(seq.num_computed);
        (left > 0).then(|| left.min(budget))
    }

    /// Ensures `id` has blocks for `want` more tokens, preempting the newest other running
    /// sequences as needed. Returns false if `id` itself had to be preempted.
    fn make_room(&mut self, id: SeqId, want: usize, plan: &mut Schedule) -> bool {
        loop {
            let Some(seq) = self.seqs.get_mut(&id) else {
                return false;
            };
            let need = blocks_for(seq.num_computed + want, self.cfg.block_size)
                .saturating_sub(seq.block_table.len());
            if self.pool.allocate_into(need, &mut seq.block_table) {
                return true;
            }
            let Some(&victim) = self.running.last() else {
                return false;
            };
            self.preempt(victim, plan);
            if victim == id {
                return false;
            }
        }
    }

    fn preempt(&mut self, id: SeqId, plan: &mut Schedule) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.pool.release(&mut seq.block_table);
            seq.num_computed = 0;
            seq.num_preemptions += 1;
        }
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        plan.chunks.retain(|c| c.id != id);
        plan.preempted.push(id);
    }

    fn push_chunk(&mut self, id: SeqId, len: usize, plan: &mut Schedule) -> usize {
        let Some(seq) = self.seqs.get(&id) else {
            return 0;
        };
        plan.chunks.push(ScheduledChunk {
            id,
            start: seq.num_computed,
            len,
            samples: seq.num_computed + len == seq.tokens.len(),
        });
        len
    }

    /// Records that a chunk's tokens are now in the cache.
    pub fn mark_computed(&mut self, chunk: &ScheduledChunk) {
        if let Some(seq) = self.seqs.get_mut(&chunk.id) {
            seq.num_computed = chunk.start + chunk.len;
        }
    }

    /// The block table of a sequence (for the forward).
    pub fn block_table(&self, id: SeqId) -> &[u32] {
        self.seqs.get(&id).map_or(&[], |s| s.block_table.blocks())
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
