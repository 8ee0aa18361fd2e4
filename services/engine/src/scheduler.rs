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
//! A step brings back at most `max_logits_rows` rows of logits: one per chunk that samples,
//! and every row of a chunk of a scored prompt (below). Each running sequence keeps a row for
//! itself, so a scored prompt's chunks are cut to what is left and never crowd out a decode.
//!
//! A sequence is never admitted unless it can ever fit: [`Scheduler::check_fits`] refuses
//! prompts at or over `max_model_len`, and the engine refuses configurations whose pool cannot
//! hold one `max_model_len` sequence.
//!
//! # Prefix caching
//!
//! With a seed for block hashes ([`SchedulerConfig::prefix_cache`]), a sequence's full blocks
//! are named by chained hashes of its tokens ([`ferrite_proto::prefix`]). When a sequence is
//! admitted with nothing computed (new, or back after a preemption), its longest run of leading
//! blocks found in the pool's index is taken as computed: its table starts with those shared
//! blocks and its first chunk starts after them. The last token is always computed (its logits
//! give the next token), so at most `(len − 1) / block_size` blocks are reused. Once a chunk is
//! computed, the blocks it filled are registered in the index for later sequences. A sequence
//! writes only past its computed tokens, so it never writes a shared block
//! ([`Scheduler::check_writes`] checks it every step). Finished and preempted sequences' blocks
//! stay cached until the pool needs them (least recently freed first).
//!
//! # Scored prompts
//!
//! A sequence added by [`Scheduler::add_scored`] wants the logprob of each of its prompt's
//! tokens: every position of its prompt must be computed, so it takes nothing from the prefix
//! cache, and each chunk that holds a prompt position followed by another prompt token
//! brings back a row of logits per token ([`ScheduledChunk::all_logits`]).
//!
//! # Draft tokens
//!
//! Under speculative decoding the engine guesses a decoding sequence's next tokens
//! ([`Scheduler::set_drafts`]): they follow its last token in `tokens`, and its chunk runs
//! them with it, bringing back a row of logits per token. They run only whole (a chunk that
//! the step's tokens, rows or free blocks would cut loses its drafts, and so does a sequence
//! preempted), and never at another's expense: each later running sequence keeps a token, a
//! row and a block. Once the step's tokens are known, [`Scheduler::mark_computed`] keeps the
//! drafts the engine accepted and drops the rest, before any of their blocks is named.

use std::collections::{HashMap, VecDeque};

use ferrite_proto::prefix;

use crate::kv_cache::{BlockHash, BlockTable, KvBlockPool, KvEvent, blocks_for};

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
    /// With prefix caching on, the seed of the block hashes (a hash of the model's identity:
    /// [`prefix::seed`]); `None`: off.
    pub prefix_cache: Option<BlockHash>,
    /// Rows of logits one step may bring back (a GPU's room for them; at least
    /// `max_num_seqs`).
    pub max_logits_rows: usize,
    /// A prompt runs in one chunk or waits (an encoder's: each token sees the whole prompt).
    pub whole_prompts: bool,
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
    /// Chained hashes of the full blocks of `tokens` (prefix caching on).
    pub block_hashes: Vec<BlockHash>,
    /// Leading blocks of the table the index names (reused, or registered once computed).
    num_registered: usize,
    /// Prompt tokens found in the cache when first admitted (`None` until then).
    pub num_cached_tokens: Option<usize>,
    /// Its prompt is scored ([`Scheduler::add_scored`]).
    pub scored: bool,
    /// The trailing tokens of `tokens` that are guesses ([`Scheduler::set_drafts`]).
    pub drafts: usize,
    /// The LoRA adapter it runs with, if any.
    pub adapter: Option<SeqAdapter>,
}

/// A sequence's LoRA adapter: its index in the model's list, and the seed of its block
/// hashes, which are not the base model's ([`ferrite_proto::prefix::adapter_seed`]): keys
/// and values computed with an adapter are not the base's, nor another adapter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqAdapter {
    pub index: u32,
    pub seed: BlockHash,
}

impl SeqState {
    pub fn new(prompt: Vec<u32>) -> Self {
        Self {
            prompt_len: prompt.len(),
            tokens: prompt,
            num_computed: 0,
            block_table: BlockTable::default(),
            num_preemptions: 0,
            block_hashes: Vec::new(),
            num_registered: 0,
            num_cached_tokens: None,
            scored: false,
            drafts: 0,
            adapter: None,
        }
    }

    /// The seed of its block hashes, with prefix caching on (`base`, the pool's).
    fn seed(&self, base: Option<BlockHash>) -> Option<BlockHash> {
        base.map(|b| self.adapter.map_or(b, |a| a.seed))
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    /// Whether a chunk from position `start` brings back every row of its logits: the
    /// sequence is scored, and position `start` is followed by a prompt token; or it has
    /// drafts to check.
    fn keeps_rows(&self, start: usize) -> bool {
        (self.scored && start + 1 < self.prompt_len) || self.drafts > 0
    }

    /// Whether its next step decodes: every token but the last is computed.
    pub fn decodes(&self) -> bool {
        self.num_computed + 1 == self.tokens.len()
    }

    fn drop_drafts(&mut self) {
        self.tokens.truncate(self.tokens.len() - self.drafts);
        self.drafts = 0;
    }

    /// How many tokens from position `start` one chunk may take within `budget` tokens and
    /// `rows` rows of logits: a chunk that keeps every row is cut to `rows`, and one that
    /// samples needs a row. 0: none this step.
    fn chunk_cap(&self, start: usize, budget: usize, rows: usize) -> usize {
        let want = self.tokens.len().saturating_sub(start).min(budget);
        if self.keeps_rows(start) {
            want.min(rows)
        } else if start + want == self.tokens.len() && rows == 0 {
            0
        } else {
            want
        }
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
    /// Every row of the chunk's logits comes back (a scored prompt's, or one with drafts):
    /// row `i` scores the token after position `start + i`; with `samples`, the last
    /// `1 + drafts` rows are the sampling rows.
    pub all_logits: bool,
    /// Its last `drafts` tokens are guesses, each checked against the row before it.
    pub drafts: usize,
}

impl ScheduledChunk {
    /// The rows of logits the chunk brings back.
    pub fn rows(&self) -> usize {
        match (self.all_logits, self.samples) {
            (true, _) => self.len,
            (false, true) => 1,
            (false, false) => 0,
        }
    }

    /// The rows its tokens are sampled from: the row after its last token that is not a
    /// draft, and one per draft (0 for a chunk that does not sample).
    pub fn sampling_rows(&self) -> usize {
        match self.samples {
            true => 1 + self.drafts,
            false => 0,
        }
    }

    /// The position of the first token it samples (the one after its last non-draft).
    pub fn first_sampled(&self) -> usize {
        self.start + self.len - self.drafts
    }
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
    /// Prompt tokens looked up in the prefix cache at admission, and those found.
    prefix_queries: u64,
    prefix_hits: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, num_blocks: u32) -> Self {
        Self {
            cfg,
            pool: KvBlockPool::new(num_blocks),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix_queries: 0,
            prefix_hits: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Why a prompt of `prompt_len` tokens can never run, if it cannot.
    pub fn check_fits(&self, prompt_len: usize) -> Result<(), String> {
        let positions = self.cfg.max_model_len - 1;
        if self.cfg.whole_prompts && prompt_len > positions {
            return Err(format!(
                "the prompt has {prompt_len} tokens; this encoder takes {positions} at most"
            ));
        }
        if prompt_len >= self.cfg.max_model_len {
            return Err(format!(
                "the prompt has {prompt_len} tokens; the context holds {} (prompt plus at least one new token)",
                self.cfg.max_model_len
            ));
        }
        Ok(())
    }

    /// Queues a sequence. The caller checked [`Self::check_fits`] and that `id` is new. With
    /// prefix caching on, the prompt's full blocks are hashed here, once.
    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>) {
        self.insert(id, SeqState::new(prompt));
    }

    /// [`Self::add`] for a sequence whose prompt is scored (see the module doc).
    pub fn add_scored(&mut self, id: SeqId, prompt: Vec<u32>) {
        self.add_with(id, prompt, true, None);
    }

    /// [`Self::add`] for a sequence that may be scored and may run with a LoRA adapter.
    pub fn add_with(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        scored: bool,
        adapter: Option<SeqAdapter>,
    ) {
        let seq = SeqState {
            scored,
            adapter,
            ..SeqState::new(prompt)
        };
        self.insert(id, seq);
    }

    fn insert(&mut self, id: SeqId, mut seq: SeqState) {
        if let Some(seed) = seq.seed(self.cfg.prefix_cache) {
            prefix::extend(
                &mut seq.block_hashes,
                seed,
                self.cfg.block_size,
                &seq.tokens,
            );
        }
        self.seqs.insert(id, seq);
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

    /// Puts `token` at `index` of a sequence's tokens, in place of what stood there (the
    /// placeholder of a token still being sampled, under async scheduling).
    pub fn set_token(&mut self, id: SeqId, index: usize, token: u32) {
        if let Some(t) = self.seqs.get_mut(&id).and_then(|s| s.tokens.get_mut(index)) {
            *t = token;
        }
    }

    /// Guesses `drafts` as the next tokens of `id`, in place of any it had: a running
    /// sequence that decodes takes them (see the module doc); others take none.
    pub fn set_drafts(&mut self, id: SeqId, drafts: &[u32]) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        seq.drop_drafts();
        if !drafts.is_empty() && seq.decodes() && self.running.contains(&id) {
            seq.tokens.extend_from_slice(drafts);
            seq.drafts = drafts.len();
        }
    }

    /// The running sequences, oldest first.
    pub fn running(&self) -> &[SeqId] {
        &self.running
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

    /// Blocks the prefix cache names (held or free).
    pub fn blocks_cached(&self) -> usize {
        self.pool.num_cached()
    }

    /// Free blocks holding no cached prefix (what admits work without evicting any).
    pub fn blocks_empty(&self) -> usize {
        self.pool.num_empty()
    }

    /// Prompt tokens looked up in the prefix cache at admission, and those found, since start.
    pub fn prefix_cache_counts(&self) -> (u64, u64) {
        (self.prefix_queries, self.prefix_hits)
    }

    /// Tokens the queued and running sequences still have to run through the model (prompts
    /// not yet prefilled, one per decoding sequence): the pool's backlog, for routing.
    pub fn pending_tokens(&self) -> usize {
        self.waiting
            .iter()
            .chain(&self.running)
            .filter_map(|id| self.seqs.get(id))
            .map(|s| s.tokens.len().saturating_sub(s.num_computed))
            .sum()
    }

    /// The pool's block index, for KV events and cache resets.
    pub fn pool_mut(&mut self) -> &mut KvBlockPool {
        &mut self.pool
    }

    /// Every hash the cache names now (a snapshot for a new listener).
    pub fn cached_hashes(&self) -> Vec<BlockHash> {
        self.pool.cached_hashes()
    }

    /// The index changes since last taken (see [`KvBlockPool::record_events`]).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.pool.take_events()
    }

    /// Plans the next step and allocates the blocks it needs. The chunks' tokens must then be
    /// computed and [`Self::mark_computed`] called for each.
    pub fn schedule(&mut self) -> Schedule {
        let mut plan = Schedule::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut rows = self.cfg.max_logits_rows;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            // Every running sequence after this one keeps a row of logits for itself.
            let later = self.running.len() - i - 1;
            self.fit_drafts(id, budget, rows, later);
            let Some(want) = self.chunk_len(id, budget, rows.saturating_sub(later)) else {
                i += 1;
                continue;
            };
            if self.make_room(id, want, &mut plan) {
                let chunk = self.push_chunk(id, want, &mut plan);
                budget -= chunk.len;
                rows = rows.saturating_sub(chunk.rows());
                i += 1;
            }
            // else: `id` itself was preempted and left `running`; `i` now points at the next.
        }
        if plan.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                if !self.seqs.contains_key(&id) {
                    self.waiting.pop_front();
                    continue;
                }
                let Some(want) = self.admit(id, budget, rows) else {
                    break;
                };
                self.waiting.pop_front();
                self.running.push(id);
                let chunk = self.push_chunk(id, want, &mut plan);
                budget -= chunk.len;
                rows = rows.saturating_sub(chunk.rows());
            }
        }
        plan
    }

    /// Drops `id`'s drafts unless its whole chunk fits in `budget` tokens, `rows` rows and the
    /// free blocks, with one of each left for each of the `later` running sequences.
    fn fit_drafts(&mut self, id: SeqId, budget: usize, rows: usize, later: usize) {
        let bs = self.cfg.block_size;
        let free = self.pool.num_free();
        let Some(seq) = self.seqs.get_mut(&id).filter(|s| s.drafts > 0) else {
            return;
        };
        let want = seq.tokens.len() - seq.num_computed;
        let blocks = blocks_for(seq.tokens.len(), bs).saturating_sub(seq.block_table.len());
        if want + later > budget || want + later > rows || blocks + later > free {
            seq.drop_drafts();
        }
    }

    /// Gives waiting sequence `id` its table: the cached blocks of its longest cached prefix
    /// (taken as computed) and new blocks for a first chunk of at most `budget` tokens and
    /// `rows` rows of logits. Returns the chunk's length, or `None` (nothing taken) when the
    /// pool has too few free blocks, or the step too few rows.
    fn admit(&mut self, id: SeqId, budget: usize, rows: usize) -> Option<usize> {
        let bs = self.cfg.block_size;
        let seq = self.seqs.get_mut(&id)?;
        // A waiting sequence holds no blocks (it is new, or its blocks went when preempted),
        // so only it can start from cached blocks.
        let fresh = seq.block_table.is_empty();
        let mut hits = Vec::new();
        // A scored prompt's every position is computed: it takes nothing from the cache.
        if let Some(seed) = seq.seed(self.cfg.prefix_cache)
            && fresh
            && !seq.scored
        {
            prefix::extend(&mut seq.block_hashes, seed, bs, &seq.tokens);
            // The last token is computed in any case: its logits pick the next one.
            let most = seq.tokens.len().saturating_sub(1) / bs;
            for &h in seq.block_hashes.iter().take(most) {
                match self.pool.lookup(h) {
                    Some(b) => hits.push(b),
                    None => break,
                }
            }
        }
        let computed = if fresh {
            hits.len() * bs
        } else {
            seq.num_computed
        };
        let want = seq.chunk_cap(computed, budget, rows);
        let cut = self.cfg.whole_prompts && computed + want < seq.tokens.len();
        if want == 0 || cut {
            return None;
        }
        let have = seq.block_table.len() + hits.len();
        let need = blocks_for(computed + want, bs).saturating_sub(have);
        // Hits that are free now leave the free queue: they count against what is free.
        let reclaimed = hits
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        if self.pool.num_free() < need + reclaimed {
            return None;
        }
        let held = self.pool.hold_into(&hits, &mut seq.block_table);
        let allocated = self.pool.allocate_into(need, &mut seq.block_table);
        debug_assert!(held && allocated, "counted above");
        if fresh {
            seq.num_computed = computed;
            seq.num_registered = hits.len();
        }
        if self.cfg.prefix_cache.is_some() && !seq.scored {
            self.prefix_queries += seq.tokens.len() as u64;
            self.prefix_hits += computed as u64;
        }
        seq.num_cached_tokens
            .get_or_insert(computed.min(seq.prompt_len));
        Some(want)
    }

    /// Tokens of `id` to run this step within `budget` and `rows` rows of logits, or None if
    /// it has none left to run (or no row to run them with).
    fn chunk_len(&self, id: SeqId, budget: usize, rows: usize) -> Option<usize> {
        let seq = self.seqs.get(&id)?;
        Some(seq.chunk_cap(seq.num_computed, budget, rows)).filter(|&n| n > 0)
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
            seq.drop_drafts();
            seq.num_computed = 0;
            seq.num_registered = 0;
            seq.num_preemptions += 1;
        }
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        plan.chunks.retain(|c| c.id != id);
        plan.preempted.push(id);
    }

    /// Plans `len` tokens of `id` from its first uncomputed one; returns the chunk (of no
    /// tokens for an unknown sequence, which is not planned).
    fn push_chunk(&mut self, id: SeqId, len: usize, plan: &mut Schedule) -> ScheduledChunk {
        let Some(seq) = self.seqs.get(&id) else {
            return ScheduledChunk {
                id,
                start: 0,
                len: 0,
                samples: false,
                all_logits: false,
                drafts: 0,
            };
        };
        let start = seq.num_computed;
        let samples = start + len == seq.tokens.len();
        let chunk = ScheduledChunk {
            id,
            start,
            len,
            samples,
            all_logits: seq.keeps_rows(start),
            // Drafts run only whole (`fit_drafts`): a chunk with drafts samples.
            drafts: if samples { seq.drafts } else { 0 },
        };
        plan.chunks.push(chunk);
        chunk
    }

    /// Records that a chunk's tokens are now in the cache, of its drafts the first `accepted`
    /// (the others leave the sequence; their keys and values are overwritten later); with
    /// prefix caching on, the blocks it filled are registered for later sequences.
    pub fn mark_computed(&mut self, chunk: &ScheduledChunk, accepted: usize) {
        let Some(seq) = self.seqs.get_mut(&chunk.id) else {
            return;
        };
        let rejected = chunk.drafts - accepted.min(chunk.drafts);
        seq.tokens
            .truncate(seq.tokens.len() - rejected.min(seq.drafts));
        seq.drafts = 0;
        seq.num_computed = chunk.start + chunk.len - rejected;
        let Some(seed) = seq.seed(self.cfg.prefix_cache) else {
            return;
        };
        let bs = self.cfg.block_size;
        let full = seq.num_computed / bs;
        if full <= seq.num_registered {
            return;
        }
        prefix::extend(&mut seq.block_hashes, seed, bs, &seq.tokens[..full * bs]);
        for j in seq.num_registered..full {
            // A block already named by another sequence's copy stays private (invariant 7).
            self.pool
                .register(seq.block_table.blocks()[j], seq.block_hashes[j]);
        }
        seq.num_registered = full;
    }

    /// Why `chunk` would write a block it must not (one shared or cached), if it would: the
    /// positions it computes must lie in blocks held by its sequence alone and not cached.
    pub fn check_writes(&self, chunk: &ScheduledChunk) -> Result<(), String> {
        let bs = self.cfg.block_size;
        let table = self.block_table(chunk.id);
        if chunk.len == 0 {
            return Ok(());
        }
        for j in chunk.start / bs..=(chunk.start + chunk.len - 1) / bs {
            match table.get(j) {
                Some(&b) if self.pool.is_private(b) => {}
                Some(&b) => {
                    return Err(format!(
                        "sequence {} would write block {b} (position {}..{}), which is shared \
                         ({} holders) or cached",
                        chunk.id,
                        chunk.start,
                        chunk.start + chunk.len,
                        self.pool.ref_count(b)
                    ));
                }
                None => {
                    return Err(format!(
                        "sequence {} has no block {j} for positions {}..{}",
                        chunk.id,
                        chunk.start,
                        chunk.start + chunk.len
                    ));
                }
            }
        }
        Ok(())
    }

    /// Forgets every cached block no sequence holds (after warm-up, so a fresh pool starts
    /// empty). Returns how many were forgotten.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.pool.reset_cache()
    }

    /// The block table of a sequence (for the forward).
    pub fn block_table(&self, id: SeqId) -> &[u32] {
        self.seqs.get(&id).map_or(&[], |s| s.block_table.blocks())
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
