//! The leader's step loop: `schedule → plan → execute → sample → update`.
//!
//! [`Engine`] owns the scheduler, each request's sampler and rank 0's [`Executor`] (which holds
//! the model shard and KV cache, and reaches the other ranks of a tensor-parallel pool). One
//! thread calls [`Engine::step`] repeatedly; requests are added and aborted between steps.
//! Aborting frees a request's KV blocks at once, so a cancelled client's blocks are back in the
//! pool before the next step is planned.
//!
//! Prefix caching (on unless [`EngineConfig::prefix_caching`] is off) is the leader's
//! decision alone: the scheduler starts a new sequence's table with cached blocks and its first
//! chunk after them, and the plan carries that table like any other, so every rank simply
//! follows. Block hashes are seeded with the model's identity ([`EngineConfig::model_identity`],
//! its shape and the device's dtype), so blocks of different models or weights never match.
//!
//! On a GPU a step samples on the device: only the ids come back, and the logits rows of the
//! requests that need them on the host (logprobs, or penalties over the tokens so far), from
//! which each such request's [`Sampler`] picks, as on the CPU (in parallel, `pick`). A step
//! where every request needs them brings back only logits.
//!
//! Under async scheduling ([`EngineConfig::async_scheduling`], on for GPUs) the loop is
//! pipelined: a step plans the next one while the device runs the one before, and returns the
//! tokens of the one before (see `overlap`).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::config::ModelConfig;
use crate::constraint::{Constraint, with_masks};
use crate::error::{EngineError, Result};
use crate::executor::{Executor, Pick, Picks, per_chunk};
use crate::kv_cache::{BlockHash, KvEvent};
use crate::model::EngineModel;
use crate::model::MaskSource;
use crate::plan::{PlanBuilder, StepPlan};
use crate::sampler::{Rng, SampledToken, Sampler, SamplingParams};
use crate::scheduler::{Schedule, Scheduler, SeqId, SeqState};
use draws::{STAND_IN, device_sampling, draw_extras, extras_on_ranks, ranks_draw, wants_extras};

pub use crate::executor::{CudaPlacement, EngineConfig};

/// Why a request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS or stop token (or, decided by the caller, a stop string).
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// Aborted by the caller.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// A token produced for a request in a step.
#[derive(Debug, Clone)]
pub struct TokenEvent {
    pub id: SeqId,
    pub token: SampledToken,
    /// Set on the request's last token.
    pub finish: Option<FinishReason>,
    /// How the request went, on its last token (for its trace spans and latency metrics).
    pub timing: Option<RequestTiming>,
    /// On the request's first token: how many of its prompt tokens came from the prefix cache.
    pub cached_tokens: Option<usize>,
    /// On a scored request's first token ([`SamplingParams::prompt_logprobs`]): each prompt
    /// token from the second, with its logprob given the tokens before it.
    pub prompt_logprobs: Vec<SampledToken>,
    /// On an embeddings request's token ([`SamplingParams::embed`]): its prompt's embedding.
    pub embedding: Option<Vec<f32>>,
}

/// When a request reached each stage, as seen by the engine thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTiming {
    /// Added to the engine (queued).
    pub arrived: Instant,
    /// First planned into a step (its prefill began).
    pub scheduled: Instant,
    /// Its first token was sampled.
    pub first_token: Instant,
    /// Its last token was sampled.
    pub finished: Instant,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache (when first scheduled).
    pub cached_tokens: usize,
    pub output_tokens: usize,
    /// Times it lost its KV blocks and was recomputed.
    pub preemptions: u32,
}

/// What one step did.
#[derive(Debug, Default)]
pub struct StepOutput {
    pub events: Vec<TokenEvent>,
    /// Requests that failed alone in this step (their logits held no distribution); they are
    /// gone from the engine, the others of the step went on.
    pub failed: Vec<(SeqId, EngineError)>,
    /// Tokens run through the model (prefill + decode).
    pub num_tokens: usize,
    pub num_preempted: usize,
    /// Under async scheduling: the next step was launched before the draws of the one before
    /// it were back, taking them on the ranks (see `overlap`).
    pub chained: bool,
}

/// Load figures, for routing and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// Blocks held by queued or running requests (cached blocks no request holds are free).
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Blocks the prefix cache names.
    pub kv_blocks_cached: usize,
    /// Free blocks holding no cached prefix: taking them evicts nothing.
    pub kv_blocks_empty: usize,
    /// Tokens the requests in the engine still have to run through the model.
    pub pending_tokens: usize,
    /// Preemptions since the engine started.
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache, and those found there, since start.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Draft tokens checked under speculative decoding, and those accepted, since start.
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
}

#[derive(Debug)]
struct Request {
    sampler: Sampler,
    /// The grammar its output follows, if any.
    constraint: Option<Box<dyn Constraint>>,
    /// This step's mask of allowed tokens (while a constrained request samples).
    mask: Option<std::result::Result<Vec<u32>, String>>,
    /// The seed of the GPU sampler's stream (the request's, else a random one).
    device_seed: u64,
    /// Its tokens so far, for the ranks' draws with penalties.
    seen: draws::SeenSoFar,
    /// Its prompt's logprobs so far, where it asked for them (`scoring`).
    prompt_logprobs: Vec<SampledToken>,
    /// The drafts it may guess next under speculative decoding (`speculate`'s schedule).
    draft_len: usize,
    /// What its grammar said of the drafts it already followed while they were checked
    /// (`pick`'s `pick_drafted`), oldest first: [`Engine::accept_token`] takes these.
    ahead: std::collections::VecDeque<(bool, bool)>,
    stop_ids: Vec<u32>,
    arrived: Instant,
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    preemptions: u32,
    /// An embeddings request's embedding, pooled when its prompt ended (`embed`).
    embedding: Option<Vec<f32>>,
}

/// The leader of a pool: request state, the scheduler and sampling (rank 0 only). Each step it
/// plans, hands the plan to its [`Executor`] (which sends it to the other ranks and runs this
/// rank's shard), and samples from the logits that come back.
#[derive(Debug)]
pub struct Engine {
    /// The model's shape.
    cfg: ModelConfig,
    pub(crate) exec: Executor,
    pub(crate) sched: Scheduler,
    pub(crate) plans: PlanBuilder,
    requests: HashMap<SeqId, Request>,
    eos_ids: Vec<u32>,
    preemptions: u64,
    /// Plan each step while the device runs the one before ([`EngineConfig::async_scheduling`]).
    pub(crate) async_scheduling: bool,
    /// The step launched and not yet collected, under async scheduling.
    pub(crate) inflight: Option<crate::inflight::InFlight>,
    /// Speculative decoding, when on (`speculate`).
    speculation: Option<Speculation>,
    /// The seeds of each LoRA adapter's block hashes, in the executor's order of them.
    lora_seeds: Vec<BlockHash>,
    /// Draft tokens checked, and accepted, since start.
    draft_tokens: u64,
    accepted_tokens: u64,
    /// Faults the unit tests make a step meet.
    #[cfg(test)]
    pub(crate) faults: tests::Faults,
}

impl Engine {
    /// A single-rank engine on the CPU, or on `cfg.cuda`'s GPU when set. Sizes the KV cache
    /// and refuses configurations where one full-length sequence would not fit.
    pub fn new(
        model: impl Into<EngineModel>,
        eos_ids: Vec<u32>,
        cfg: EngineConfig,
    ) -> Result<Self> {
        Self::from_executor(Executor::solo(model, &cfg)?, eos_ids, &cfg)
    }

    /// The leader over rank 0's executor. With other ranks, they must be running their
    /// followers' side ([`Executor::agree_on_blocks`], then [`Executor::follow`]): the pool
    /// schedules the least number of KV blocks any rank has.
    pub fn from_executor(
        mut exec: Executor,
        eos_ids: Vec<u32>,
        cfg: &EngineConfig,
    ) -> Result<Self> {
        let num_blocks = exec.agree_on_blocks()?;
        let num_blocks = u32::try_from(num_blocks).unwrap_or(u32::MAX - 1);
        let seed = prefix_cache_seed(&exec, cfg);
        let lora_seeds = lora::seeds(seed, exec.lora_names());
        let sched = Scheduler::new(embed::scheduler_config(&exec, cfg, seed), num_blocks);
        let mut engine = Self {
            cfg: exec.config().clone(),
            exec,
            sched,
            plans: PlanBuilder::default(),
            requests: HashMap::new(),
            eos_ids,
            preemptions: 0,
            async_scheduling: cfg.async_scheduling,
            inflight: None,
            speculation: None,
            lora_seeds,
            draft_tokens: 0,
            accepted_tokens: 0,
            #[cfg(test)]
            faults: tests::Faults::default(),
        };
        engine.set_speculation(cfg.speculation);
        Ok(engine)
    }

    /// Which device runs the forward pass (`cpu`, or the CUDA device).
    pub fn device_name(&self) -> String {
        self.exec.device_name()
    }

    /// Tells the other ranks the leader is alive (call when idle; they time out otherwise).
    /// An error means the pool is lost.
    pub fn keep_alive(&mut self) -> Result<()> {
        self.exec.keep_alive()
    }

    /// Runs one short prefill and one decode step through the model (then frees them), so the
    /// first request finds the weights, caches and thread pool warm. Returns the tokens run.
    pub fn warmup(&mut self) -> Result<usize> {
        let prompt_len = 16.min(self.max_model_len() - 1);
        let _span = tracing::info_span!(target: crate::model::STARTUP_TARGET, "warmup",
            prompt_tokens = prompt_len as i64, decode_steps = 1)
        .entered();
        let params = self.warmup_params();
        // Any in-vocabulary ids do; the request id is one submitted requests never get.
        let prompt = (0..prompt_len as u32).collect();
        self.run_to_completion(vec![(SeqId::MAX, prompt, params)], |_| true)?;
        // A fresh pool holds no one's prefix.
        self.sched.reset_prefix_cache();
        Ok(prompt_len + 1)
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.sched.config().block_size
    }

    /// The seed of this engine's block hashes, when prefix caching is on.
    pub fn prefix_cache_seed(&self) -> Option<BlockHash> {
        self.sched.config().prefix_cache
    }

    /// Starts (or stops) recording changes to the prefix cache for [`Self::take_kv_events`].
    pub fn record_kv_events(&mut self, on: bool) {
        self.sched.pool_mut().record_events(on);
    }

    /// Changes to the prefix cache since the last call, oldest first.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.sched.take_kv_events()
    }

    /// Every block hash the prefix cache holds now.
    pub fn cached_block_hashes(&self) -> Vec<BlockHash> {
        self.sched.cached_hashes()
    }

    /// Forgets every cached block no request holds. Returns how many.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.sched.reset_prefix_cache()
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn max_model_len(&self) -> usize {
        self.sched.config().max_model_len
    }

    /// Why a request would be refused, if it would: bad parameters, an empty prompt, token ids
    /// outside the vocabulary, a prompt that can never fit.
    pub fn check_request(&self, prompt: &[u32], params: &SamplingParams) -> Result<()> {
        params.validate()?;
        self.check_embed(params)?;
        if prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        let vocab = self.cfg.vocab_size;
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        if let Some((bad, _)) = params.logit_bias.iter().find(|(t, _)| *t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "logit_bias names token {bad}, outside the vocabulary (size {vocab})"
            )));
        }
        self.sched
            .check_fits(prompt.len())
            .map_err(EngineError::DoesNotFit)
    }

    /// Queues a request. Refuses bad parameters, token ids outside the vocabulary, empty
    /// prompts and prompts that can never fit, with a message saying which.
    pub fn add_request(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<()> {
        self.add_constrained(id, prompt, params, None)
    }

    /// [`Engine::add_request`] for a request whose output follows `constraint`.
    pub fn add_constrained(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        params: SamplingParams,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Result<()> {
        if self.requests.contains_key(&id) {
            return Err(EngineError::DuplicateRequest(id));
        }
        self.check_request(&prompt, &params)?;
        let adapter = self.seq_adapter(&params)?;
        let scored = params.prompt_logprobs.is_some();
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend(&self.eos_ids);
        }
        self.requests.insert(
            id,
            Request {
                device_seed: params
                    .seed
                    .unwrap_or_else(|| Rng::from_entropy().next_u64()),
                sampler: Sampler::new(params),
                constraint,
                mask: None,
                seen: Default::default(),
                prompt_logprobs: Vec::new(),
                draft_len: usize::MAX,
                ahead: Default::default(),
                stop_ids,
                arrived: Instant::now(),
                scheduled: None,
                first_token: None,
                preemptions: 0,
                embedding: None,
            },
        );
        self.sched.add_with(id, prompt, scored, adapter);
        Ok(())
    }

    /// Drops a request and frees its KV blocks. Returns false if it was not known.
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.requests.remove(&id);
        self.retire(id);
        self.sched.remove(id).is_some()
    }

    /// `id` is gone: the ranks drop its table with the next plan, and the step in flight (if
    /// any) drops its pick.
    pub(crate) fn retire(&mut self, id: SeqId) {
        self.plans.forget(id);
        if let Some(f) = &mut self.inflight {
            f.retire(id);
        }
    }

    /// Whether `id` is queued or running.
    pub fn contains(&self, id: SeqId) -> bool {
        self.requests.contains_key(&id)
    }

    pub fn has_unfinished(&self) -> bool {
        self.sched.has_work() || self.inflight.is_some()
    }

    pub fn stats(&self) -> EngineStats {
        let (prefix_cache_queries, prefix_cache_hits) = self.sched.prefix_cache_counts();
        EngineStats {
            running: self.sched.num_running(),
            waiting: self.sched.num_waiting(),
            kv_blocks_used: self.sched.blocks_used(),
            kv_blocks_total: self.sched.blocks_total(),
            kv_blocks_cached: self.sched.blocks_cached(),
            kv_blocks_empty: self.sched.blocks_empty(),
            pending_tokens: self.sched.pending_tokens(),
            preemptions: self.preemptions,
            prefix_cache_queries,
            prefix_cache_hits,
            spec_draft_tokens: self.draft_tokens,
            spec_accepted_tokens: self.accepted_tokens,
        }
    }

    /// Runs one step. A forward error fails the step's requests (they are removed) and is
    /// returned; so does an inconsistency between the plan, the requests and the picks (an
    /// [`EngineError::Internal`]), rather than leaving a sequence without its token.
    ///
    /// Under async scheduling a step plans and launches the next forward and returns the
    /// tokens of the one before (the `overlap` module).
    pub fn step(&mut self) -> Result<StepOutput> {
        crate::failpoints::engine_step();
        if self.async_scheduling {
            return self.step_overlapped();
        }
        self.propose_drafts();
        let schedule = self.sched.schedule();
        let now = Instant::now();
        let mut out = self.begin_step(&schedule, now);
        if schedule.chunks.is_empty() {
            return Ok(out);
        }
        self.keep_hidden_for(&schedule);
        let picks = match self.execute(&schedule).and_then(|p| {
            self.pool_embeddings(&schedule)?;
            Ok(p)
        }) {
            Ok(p) => p,
            Err(e) => {
                self.fail(schedule.chunks.iter().map(|c| c.id));
                return Err(e);
            }
        };
        let tokens = self.pick_all(&schedule.chunks, picks);
        for (c, picked) in schedule.chunks.iter().zip(tokens) {
            // Of its drafts, those its rows agreed with (all its tokens but the last).
            let accepted = match &picked {
                Some(Ok(tokens)) => tokens.len().saturating_sub(1),
                _ => 0,
            };
            self.count_drafts(c, accepted);
            self.sched.mark_computed(c, accepted);
            let Some(picked) = picked else { continue };
            if let Err(e) = self.record_tokens(c, picked, now, &mut out) {
                self.fail(schedule.chunks.iter().map(|c| c.id));
                return Err(e);
            }
        }
        Ok(out)
    }

    /// A step's output before its tokens: counts the preemptions `schedule` made and notes
    /// when each of its requests was first scheduled.
    pub(crate) fn begin_step(&mut self, schedule: &Schedule, now: Instant) -> StepOutput {
        self.preemptions += schedule.preempted.len() as u64;
        for id in &schedule.preempted {
            if let Some(r) = self.requests.get_mut(id) {
                r.preemptions += 1;
            }
        }
        for c in &schedule.chunks {
            if let Some(r) = self.requests.get_mut(&c.id) {
                r.scheduled.get_or_insert(now);
            }
        }
        StepOutput {
            num_tokens: schedule.num_tokens(),
            num_preempted: schedule.preempted.len(),
            ..StepOutput::default()
        }
    }

    /// Fails the requests `ids` (a step of theirs failed): they are removed.
    pub(crate) fn fail(&mut self, ids: impl IntoIterator<Item = SeqId>) {
        for id in ids {
            self.abort(id);
        }
    }

    /// Plans `schedule` for the ranks, runs it and returns, for each chunk, its pick (`None`
    /// for a chunk that does not sample). Nothing is changed when the plan's or the picks'
    /// checks fail.
    fn execute(&mut self, schedule: &Schedule) -> Result<Vec<Option<Pick>>> {
        let mut plan = self.plan_step(schedule)?;
        let picks = self.run_masked(schedule, &mut plan, &HashSet::new(), |exec, plan, m| {
            exec.lead_masked(plan, m)
        })?;
        self.split_picks(picks, schedule)
    }

    /// Runs `lead` (the executor leading `plan`, `schedule`'s plan) while the masks of the
    /// requests sampling in it under a grammar are computed beside the forward (they depend
    /// only on the tokens so far), and keeps each request's mask for its pick. `ended`:
    /// requests whose grammar is complete, which sample nothing any more.
    pub(crate) fn run_masked<T>(
        &mut self,
        schedule: &Schedule,
        plan: &mut StepPlan,
        ended: &HashSet<SeqId>,
        lead: impl FnOnce(&mut Executor, &mut StepPlan, Option<MaskSource<'_>>) -> Result<T>,
    ) -> Result<T> {
        // Each request sampling under a grammar, with the tokens its output may still take.
        let constrained: HashMap<SeqId, usize> = (schedule.chunks.iter())
            .filter(|c| c.samples && !ended.contains(&c.id))
            .filter_map(|c| Some((c.id, self.grammar_budget(c.id)?)))
            .collect();
        if constrained.is_empty() {
            return lead(&mut self.exec, plan, None);
        }
        let words = self.cfg.vocab_size.div_ceil(32);
        // The sampling rows in order, with the request of each that has a grammar.
        let rows: Vec<Option<SeqId>> = (schedule.chunks.iter())
            .filter(|c| c.samples)
            .map(|c| constrained.contains_key(&c.id).then_some(c.id))
            .collect();
        let grammars = (self.requests.iter_mut())
            .filter_map(|(id, r)| Some((*id, *constrained.get(id)?, r.constraint.as_deref_mut()?)))
            .collect();
        let (led, masks) = with_masks(&mut self.exec, plan, grammars, &rows, words, |e, p, m| {
            lead(e, p, Some(m))
        });
        for (id, mask) in masks {
            if let Some(req) = self.requests.get_mut(&id) {
                req.mask = Some(mask);
            }
        }
        led
    }

    /// The plan of `schedule` for the ranks, after checking that every planned sequence is
    /// known to both the scheduler and the request table and writes only blocks of its own.
    pub(crate) fn plan_step(&mut self, schedule: &Schedule) -> Result<StepPlan> {
        let (mut on_device, mut extras) = (Vec::new(), Vec::new());
        // A scored prompt's rows all come back, with the step's others: the host samples.
        let ranks_may_draw = (self.exec.samples_on_device() || self.async_scheduling)
            && !schedule.chunks.iter().any(|c| c.all_logits);
        for c in &schedule.chunks {
            let (Some(seq), Some(req)) = (self.sched.get(c.id), self.requests.get_mut(&c.id))
            else {
                return Err(EngineError::Internal(format!(
                    "sequence {} was planned but is not known to both the scheduler and the request table",
                    c.id
                )));
            };
            if c.samples {
                let draw = device_sampling(req, seq.output().len());
                let ranks = ranks_may_draw
                    && ranks_draw(&self.exec, req, &draw)
                    && (!wants_extras(req) || extras_on_ranks());
                if ranks {
                    let row = on_device.len() as u32;
                    extras.extend(draw_extras(req, seq, c.start + c.len, row));
                }
                on_device.push(ranks.then_some(draw));
            }
            // A chunk writes only blocks of its own that no other sequence can read.
            self.sched.check_writes(c).map_err(EngineError::Internal)?;
        }
        let mut plan = self.plans.build(schedule, &self.sched)?;
        // The ranks draw the rows they can and bring back ids; the other rows' logits come
        // back too, to be sampled here. A step with no row to draw brings back logits only.
        let draws = on_device.iter().filter(|d| d.is_some()).count();
        if ranks_may_draw && (draws > 0 || on_device.is_empty()) {
            plan.host_rows = (on_device.iter().enumerate())
                .filter(|(_, d)| d.is_none())
                .map(|(row, _)| row as u32)
                .collect();
            plan.device_sampling = Some(
                on_device
                    .into_iter()
                    .map(|d| d.unwrap_or(STAND_IN))
                    .collect(),
            );
            plan.extras = extras;
        }
        Ok(plan)
    }

    /// `picks` split among `schedule`'s chunks ([`per_chunk`]), after the faults a test set,
    /// once the rows of scored prompts are taken out and scored.
    pub(crate) fn split_picks(
        &mut self,
        mut picks: Picks,
        schedule: &Schedule,
    ) -> Result<Vec<Option<Pick>>> {
        self.score_prompts(&mut picks, schedule)?;
        #[cfg(test)]
        let picks = self.faults.apply(picks, self.cfg.vocab_size)?;
        per_chunk(picks, schedule, self.cfg.vocab_size)
    }

    /// The tokens request `id`'s output may still take (the next one included) before
    /// `max_tokens` or the context ends it ([`tokens_left`]); `None` for an unknown request.
    pub(crate) fn tokens_left_of(&self, id: SeqId) -> Option<usize> {
        let req = self.requests.get(&id)?;
        let seq = self.sched.get(id)?;
        let max_model_len = self.sched.config().max_model_len;
        Some(tokens_left(
            seq,
            req.sampler.params().max_tokens,
            max_model_len,
        ))
    }

    /// Whether request `id` has a grammar.
    pub(crate) fn has_grammar(&self, id: SeqId) -> bool {
        self.requests
            .get(&id)
            .is_some_and(|r| r.constraint.is_some())
    }

    /// For a request under a grammar, the tokens its output may still take (this step's
    /// included) before `max_tokens` or the context ends it.
    fn grammar_budget(&self, id: SeqId) -> Option<usize> {
        self.requests.get(&id).filter(|r| r.constraint.is_some())?;
        Some(self.tokens_left_of(id)?.max(1))
    }

    /// Request `id`'s grammar, if it has one, follows `token`: whether that completed it, and
    /// whether by narrowing to the budget (see [`Constraint::cut_short`]).
    /// A draft it followed already, while its rows were checked, is not followed again.
    pub(crate) fn accept_token(&mut self, id: SeqId, token: u32) -> Result<(bool, bool)> {
        let Some(req) = self.requests.get_mut(&id) else {
            return Ok((false, false));
        };
        if let Some(said) = req.ahead.pop_front() {
            return Ok(said);
        }
        Ok(match req.constraint.as_mut() {
            Some(c) => (
                c.accept(token).map_err(EngineError::Grammar)?,
                c.cut_short(),
            ),
            None => (false, false),
        })
    }

    /// Records `token`, request `id`'s token at `index` of its sequence (already in the
    /// scheduler's copy, and followed by its grammar: `(completed, cut_short)`), finishing the
    /// request when it stops.
    pub(crate) fn record_token(
        &mut self,
        id: SeqId,
        token: SampledToken,
        index: usize,
        now: Instant,
        (completed, cut_short): (bool, bool),
    ) -> Result<TokenEvent> {
        let max_model_len = self.sched.config().max_model_len;
        let (Some(req), Some(seq)) = (self.requests.get_mut(&id), self.sched.get(id)) else {
            return Err(EngineError::Internal(format!(
                "sequence {id} vanished mid-step"
            )));
        };
        let generated = index + 1 - seq.prompt_len;
        let max_tokens = req.sampler.params().max_tokens;
        let last = tokens_left_at(seq.prompt_len, index, max_tokens, max_model_len) <= 1;
        let finish = if completed && cut_short {
            Some(FinishReason::Length)
        } else if completed || req.stop_ids.contains(&token.id) {
            Some(FinishReason::Stop)
        } else if last {
            Some(FinishReason::Length)
        } else {
            None
        };
        let sampled_at = Instant::now();
        let is_first = req.first_token.is_none();
        let first_token = *req.first_token.get_or_insert(sampled_at);
        let cached = seq.num_cached_tokens.unwrap_or(0);
        let timing = finish.map(|_| RequestTiming {
            arrived: req.arrived,
            scheduled: req.scheduled.unwrap_or(now),
            first_token,
            finished: sampled_at,
            prompt_tokens: seq.prompt().len(),
            cached_tokens: cached,
            output_tokens: generated,
            preemptions: req.preemptions,
        });
        let prompt_logprobs = match is_first {
            true => std::mem::take(&mut req.prompt_logprobs),
            false => Vec::new(),
        };
        let embedding = req.embedding.take();
        if finish.is_some() {
            self.requests.remove(&id);
            self.retire(id);
            self.sched.remove(id);
        }
        Ok(TokenEvent {
            id,
            token,
            finish,
            timing,
            cached_tokens: is_first.then_some(cached),
            prompt_logprobs,
            embedding,
        })
    }
}

/// Tokens `seq`'s output may still take, the next one included, before `max_tokens` or the
/// context (`max_model_len`) ends it: the next one is its last at 1.
fn tokens_left(seq: &SeqState, max_tokens: usize, max_model_len: usize) -> usize {
    // Its drafts are guesses of tokens still to come.
    let next = seq.tokens.len() - seq.drafts;
    tokens_left_at(seq.prompt_len, next, max_tokens, max_model_len)
}

/// [`tokens_left`] of a sequence whose next token is at `index` (its prompt: `prompt_len`).
pub(crate) fn tokens_left_at(
    prompt_len: usize,
    index: usize,
    max_tokens: usize,
    max_model_len: usize,
) -> usize {
    let by_tokens = max_tokens.saturating_sub(index - prompt_len);
    by_tokens.min(max_model_len.saturating_sub(index))
}

/// The seed of `exec`'s block hashes: the model's identity as the caller knows it, its shape,
/// and the dtype its keys and values are computed in.
fn prefix_cache_seed(exec: &Executor, cfg: &EngineConfig) -> BlockHash {
    let dtype = cfg.cuda.as_ref().map_or_else(
        || "cpu f32".to_owned(),
        |c| format!("cuda {:?}", c.opts.dtype),
    );
    ferrite_proto::prefix::seed(&format!(
        "{}\n{:?}\n{dtype}",
        cfg.model_identity,
        exec.config()
    ))
}

pub use crate::complete::Generation;

/// Whether the environment turns the switch `var` off (`0` or `off`): the A/B switches of the
/// runbook's `ab` stage, each read once by its caller.
pub(crate) fn switched_off(var: &str) -> bool {
    matches!(std::env::var(var).as_deref(), Ok("0" | "off"))
}

#[path = "draws.rs"]
mod draws;
#[path = "embed.rs"]
pub mod embed;
#[path = "lora.rs"]
mod lora;
#[path = "pick.rs"]
mod pick;
#[path = "scoring.rs"]
mod scoring;
#[path = "speculate.rs"]
mod speculate;

pub use crate::ngram::Speculation;
pub use crate::sampler::EmbedParams;

#[cfg(test)]
#[path = "engine_tests.rs"]
pub(crate) mod tests;
