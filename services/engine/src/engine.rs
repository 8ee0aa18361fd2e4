//! The step loop: `schedule → forward → sample → update`.
//!
//! [`Engine`] owns the model, the KV cache, the scheduler and each request's sampler. One
//! thread calls [`Engine::step`] repeatedly; requests are added and aborted between steps.
//! Aborting frees a request's KV blocks at once, so a cancelled client's blocks are back in the
//! pool before the next step is planned.
//!
//! On a GPU a step samples on the device when none of its requests needs the logits on the
//! host (logprobs, or penalties over the tokens so far): only the ids come back. Otherwise the
//! logits rows come back and each request's [`Sampler`] picks, as on the CPU.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ferrite_kernels::cuda::Gpu;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::gpu::{self, DeviceSampling, GpuOptions, GpuRunner, StepLimits};
use crate::kv_cache::{KvCache, blocks_for};
use crate::model::{EngineModel, LlamaModel, LogitsWanted, SeqChunk};
use crate::sampler::{Rng, SampledToken, Sampler, SamplingParams};
use crate::scheduler::{Scheduler, SchedulerConfig, SeqId, StepPlan};

/// Engine limits. `Default` suits the CPU.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Context length (prompt + output); `None` = the model's, capped at 8192.
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    /// Memory for K and V on the CPU; the pool gets as many blocks as fit.
    pub kv_cache_bytes: usize,
    /// Run on this GPU instead of the CPU (the KV cache is then sized from its memory).
    pub cuda: Option<CudaPlacement>,
}

/// A GPU for the engine and how the model runs there.
#[derive(Debug, Clone)]
pub struct CudaPlacement {
    pub gpu: Arc<Gpu>,
    pub opts: GpuOptions,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_model_len: None,
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            block_size: 16,
            kv_cache_bytes: 1 << 30,
            cuda: None,
        }
    }
}

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
    pub output_tokens: usize,
    /// Times it lost its KV blocks and was recomputed.
    pub preemptions: u32,
}

/// What one step did.
#[derive(Debug, Default)]
pub struct StepOutput {
    pub events: Vec<TokenEvent>,
    /// Tokens run through the model (prefill + decode).
    pub num_tokens: usize,
    pub num_preempted: usize,
}

/// Load figures, for routing and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Preemptions since the engine started.
    pub preemptions: u64,
}

#[derive(Debug)]
struct Request {
    sampler: Sampler,
    /// The seed of the GPU sampler's stream (the request's, else a random one).
    device_seed: u64,
    stop_ids: Vec<u32>,
    arrived: Instant,
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    preemptions: u32,
}

/// Where the forward pass runs.
#[derive(Debug)]
enum Executor {
    /// The CPU reference ops over the model in host memory, with the KV cache there too.
    Cpu { model: Box<LlamaModel>, kv: KvCache },
    /// The CUDA backend, with its own copy of the weights and device KV cache (the host model
    /// is dropped once copied: nothing reads it after).
    Cuda(Box<GpuRunner>),
}

#[derive(Debug)]
pub struct Engine {
    /// The model's shape.
    cfg: ModelConfig,
    exec: Executor,
    sched: Scheduler,
    requests: HashMap<SeqId, Request>,
    eos_ids: Vec<u32>,
    preemptions: u64,
    /// Faults the unit tests make a step meet.
    #[cfg(test)]
    faults: tests::Faults,
}

/// A step's picks: logits rows to sample on the host, or ids sampled on the device.
enum Picks {
    Logits(Vec<f32>),
    Ids(Vec<u32>),
}

/// `req`'s next draw as the GPU sampler takes it, or `None` when the device cannot make it
/// alone: penalties need the tokens so far, logprobs the distribution on the host.
fn device_sampling(req: &Request, generated: usize) -> Option<DeviceSampling> {
    let p = req.sampler.params();
    let plain = p.logprobs.is_none()
        && p.repetition_penalty == 1.0
        && p.presence_penalty == 0.0
        && p.frequency_penalty == 0.0;
    plain.then(|| DeviceSampling {
        temperature: p.temperature,
        top_k: i32::try_from(p.top_k).unwrap_or(i32::MAX),
        top_p: p.top_p,
        min_p: p.min_p,
        seed: req.device_seed,
        step: generated as u64,
    })
}

/// `cfg`'s max model length (default: the model's, at most 8192), checked with the other
/// limits.
fn checked_max_model_len(model: &ModelConfig, cfg: &EngineConfig) -> Result<usize> {
    let max_model_len = cfg
        .max_model_len
        .unwrap_or(model.max_position_embeddings.min(8192));
    if max_model_len < 2
        || cfg.block_size == 0
        || cfg.max_num_seqs == 0
        || cfg.max_num_batched_tokens == 0
    {
        return Err(EngineError::BadConfig(
            "max_model_len must be ≥ 2; block size, max_num_seqs and max_num_batched_tokens ≥ 1"
                .into(),
        ));
    }
    Ok(max_model_len)
}

impl Engine {
    /// An engine on the CPU, or on `cfg.cuda`'s GPU when set (see [`Self::new_cuda`]). Sizes
    /// the KV cache and refuses configurations where one full-length sequence would not fit.
    pub fn new(
        model: impl Into<EngineModel>,
        eos_ids: Vec<u32>,
        cfg: EngineConfig,
    ) -> Result<Self> {
        let model = model.into();
        if let Some(CudaPlacement { gpu, opts }) = cfg.cuda.clone() {
            return Self::new_cuda(model, gpu, opts, eos_ids, cfg);
        }
        let EngineModel::Host(model) = model else {
            return Err(EngineError::BadConfig(
                "random weights made on the device need a GPU (--device cuda)".into(),
            ));
        };
        let max_model_len = checked_max_model_len(model.config(), &cfg)?;
        let mc = model.config().clone();
        let per_token = KvCache::bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim);
        let num_blocks = cfg.kv_cache_bytes / (per_token * cfg.block_size);
        let needed = blocks_for(max_model_len, cfg.block_size);
        if num_blocks < needed {
            return Err(EngineError::BadConfig(format!(
                "a KV cache of {} MiB holds {} tokens, less than one {max_model_len}-token sequence ({} MiB): lower max_model_len or give the KV cache more memory",
                cfg.kv_cache_bytes >> 20,
                num_blocks * cfg.block_size,
                (needed * cfg.block_size * per_token) >> 20
            )));
        }
        let num_blocks = u32::try_from(num_blocks).unwrap_or(u32::MAX - 1);
        let _span = tracing::info_span!(target: crate::model::STARTUP_TARGET, "kv_cache_init",
            device = "cpu", num_blocks = i64::from(num_blocks), block_size = cfg.block_size as i64,
            bytes = (num_blocks as usize * cfg.block_size * per_token) as i64,
            max_model_len = max_model_len as i64, max_num_seqs = cfg.max_num_seqs as i64,
            max_num_batched_tokens = cfg.max_num_batched_tokens as i64)
        .entered();
        let kv = KvCache::new(
            mc.num_layers,
            num_blocks as usize,
            cfg.block_size,
            mc.num_kv_heads,
            mc.head_dim,
        );
        Ok(Self::assemble(
            mc,
            Executor::Cpu {
                model: Box::new(model),
                kv,
            },
            num_blocks,
            max_model_len,
            eos_ids,
            &cfg,
        ))
    }

    /// An engine whose forward runs on `gpu`: the weights are copied there and the KV cache
    /// takes what `opts.memory_utilization` leaves after a maximal step (`cfg.kv_cache_bytes`
    /// is the CPU's and is not used).
    fn new_cuda(
        model: EngineModel,
        gpu: Arc<Gpu>,
        opts: GpuOptions,
        eos_ids: Vec<u32>,
        cfg: EngineConfig,
    ) -> Result<Self> {
        let max_model_len = checked_max_model_len(model.config(), &cfg)?;
        let limits = StepLimits {
            max_tokens: cfg.max_num_batched_tokens,
            max_seqs: cfg.max_num_seqs,
            max_model_len,
            block_size: cfg.block_size,
        };
        let runner = gpu::build_runner(&model, gpu, opts, limits)?;
        let num_blocks = u32::try_from(runner.num_blocks()).unwrap_or(u32::MAX - 1);
        let exec = Executor::Cuda(Box::new(runner));
        Ok(Self::assemble(
            model.config().clone(),
            exec,
            num_blocks,
            max_model_len,
            eos_ids,
            &cfg,
        ))
    }

    fn assemble(
        model: ModelConfig,
        exec: Executor,
        num_blocks: u32,
        max_model_len: usize,
        eos_ids: Vec<u32>,
        cfg: &EngineConfig,
    ) -> Self {
        let sched = Scheduler::new(
            SchedulerConfig {
                max_num_batched_tokens: cfg.max_num_batched_tokens,
                max_num_seqs: cfg.max_num_seqs,
                max_model_len,
                block_size: cfg.block_size,
            },
            num_blocks,
        );
        Self {
            cfg: model,
            exec,
            sched,
            requests: HashMap::new(),
            eos_ids,
            preemptions: 0,
            #[cfg(test)]
            faults: tests::Faults::default(),
        }
    }

    /// Which device runs the forward pass (`cpu`, or the CUDA device).
    pub fn device_name(&self) -> String {
        match &self.exec {
            Executor::Cpu { .. } => "cpu".into(),
            Executor::Cuda(r) => r.gpu().device.to_string(),
        }
    }

    /// Runs one short prefill and one decode step through the model (then frees them), so the
    /// first request finds the weights, caches and thread pool warm. Returns the tokens run.
    pub fn warmup(&mut self) -> Result<usize> {
        let prompt_len = 16.min(self.max_model_len() - 1);
        let _span = tracing::info_span!(target: crate::model::STARTUP_TARGET, "warmup",
            prompt_tokens = prompt_len as i64, decode_steps = 1)
        .entered();
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(2)
        };
        // Any in-vocabulary ids do; the request id is one submitted requests never get.
        let prompt = (0..prompt_len as u32).collect();
        self.run_to_completion(vec![(SeqId::MAX, prompt, params)], |_| true)?;
        Ok(prompt_len + 1)
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
        if prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        let vocab = self.cfg.vocab_size;
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
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
        if self.requests.contains_key(&id) {
            return Err(EngineError::DuplicateRequest(id));
        }
        self.check_request(&prompt, &params)?;
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
                stop_ids,
                arrived: Instant::now(),
                scheduled: None,
                first_token: None,
                preemptions: 0,
            },
        );
        self.sched.add(id, prompt);
        Ok(())
    }

    /// Drops a request and frees its KV blocks. Returns false if it was not known.
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.requests.remove(&id);
        self.sched.remove(id).is_some()
    }

    /// Whether `id` is queued or running.
    pub fn contains(&self, id: SeqId) -> bool {
        self.requests.contains_key(&id)
    }

    pub fn has_unfinished(&self) -> bool {
        self.sched.has_work()
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.sched.num_running(),
            waiting: self.sched.num_waiting(),
            kv_blocks_used: self.sched.blocks_used(),
            kv_blocks_total: self.sched.blocks_total(),
            preemptions: self.preemptions,
        }
    }

    /// Runs one step. A forward error fails the step's requests (they are removed) and is
    /// returned; so does an inconsistency between the plan, the requests and the picks (an
    /// [`EngineError::Internal`]), rather than leaving a sequence without its token.
    pub fn step(&mut self) -> Result<StepOutput> {
        let plan = self.sched.schedule();
        let now = Instant::now();
        let mut out = StepOutput {
            num_tokens: plan.num_tokens(),
            num_preempted: plan.preempted.len(),
            ..StepOutput::default()
        };
        self.preemptions += plan.preempted.len() as u64;
        for id in &plan.preempted {
            if let Some(r) = self.requests.get_mut(id) {
                r.preemptions += 1;
            }
        }
        for c in &plan.chunks {
            if let Some(r) = self.requests.get_mut(&c.id) {
                r.scheduled.get_or_insert(now);
            }
        }
        if plan.chunks.is_empty() {
            return Ok(out);
        }
        let picks = match self.execute(&plan) {
            Ok(p) => p,
            Err(e) => {
                for c in &plan.chunks {
                    self.abort(c.id);
                }
                return Err(e);
            }
        };
        for (c, pick) in plan.chunks.iter().zip(picks) {
            self.sched.mark_computed(c);
            let Some(pick) = pick else { continue };
            match self.take_token(c.id, pick, now) {
                Ok(ev) => out.events.push(ev),
                Err(e) => {
                    for c in &plan.chunks {
                        self.abort(c.id);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Runs the plan's forward and returns, for each chunk, its pick (`None` for a chunk that
    /// does not sample). Checks first that every planned sequence is known to both the
    /// scheduler and the request table, and after that the forward gave one pick per sampling
    /// chunk: nothing is changed when either fails.
    fn execute(&mut self, plan: &StepPlan) -> Result<Vec<Option<Pick>>> {
        let mut chunks = Vec::with_capacity(plan.chunks.len());
        let mut on_device = Vec::new();
        for c in &plan.chunks {
            let (Some(seq), Some(req)) = (self.sched.get(c.id), self.requests.get(&c.id)) else {
                return Err(EngineError::Internal(format!(
                    "sequence {} was planned but is not known to both the scheduler and the request table",
                    c.id
                )));
            };
            chunks.push(SeqChunk {
                tokens: &seq.tokens[c.start..c.start + c.len],
                start_pos: c.start,
                block_table: seq.block_table.blocks(),
                logits: if c.samples {
                    LogitsWanted::Last
                } else {
                    LogitsWanted::None
                },
            });
            if c.samples {
                on_device.push(device_sampling(req, seq.output().len()));
            }
        }
        // On a GPU, a step whose every sampling request the device can serve alone samples
        // there and reads back ids only.
        let on_device: Option<Vec<DeviceSampling>> = on_device.into_iter().collect();
        let picks = match (&mut self.exec, on_device) {
            (Executor::Cpu { model, kv }, _) => model.forward(&chunks, kv).map(Picks::Logits),
            (Executor::Cuda(runner), Some(params)) => {
                runner.forward_sampled(&chunks, &params).map(Picks::Ids)
            }
            (Executor::Cuda(runner), None) => runner.forward(&chunks).map(Picks::Logits),
        }?;
        #[cfg(test)]
        let picks = self.faults.apply(picks, self.cfg.vocab_size)?;
        picks.per_chunk(plan, self.cfg.vocab_size)
    }

    /// Samples (or takes the device's pick for) request `id`'s next token and records it,
    /// finishing the request when it stops.
    fn take_token(&mut self, id: SeqId, pick: Pick, now: Instant) -> Result<TokenEvent> {
        let max_model_len = self.sched.config().max_model_len;
        let (Some(req), Some(seq)) = (self.requests.get_mut(&id), self.sched.get(id)) else {
            // `execute` checked that `id` is in both tables; nothing removes it since.
            return Err(EngineError::Internal(format!(
                "sequence {id} vanished mid-step"
            )));
        };
        let token = match pick {
            Pick::Row(mut row) => req.sampler.sample(&mut row, seq.prompt(), seq.output()),
            // Sampled on the device: no distribution on the host, so no logprob (the request
            // asked for none, or it would have been sampled here).
            Pick::Id(id) => SampledToken {
                id,
                logprob: f32::NAN,
                top: Vec::new(),
            },
        };
        let generated = seq.output().len() + 1;
        let total = seq.tokens.len() + 1;
        let finish = if req.stop_ids.contains(&token.id) {
            Some(FinishReason::Stop)
        } else if generated >= req.sampler.params().max_tokens || total >= max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        };
        let sampled_at = Instant::now();
        let first_token = *req.first_token.get_or_insert(sampled_at);
        let timing = finish.map(|_| RequestTiming {
            arrived: req.arrived,
            scheduled: req.scheduled.unwrap_or(now),
            first_token,
            finished: sampled_at,
            prompt_tokens: seq.prompt().len(),
            output_tokens: generated,
            preemptions: req.preemptions,
        });
        self.sched.push_token(id, token.id);
        if finish.is_some() {
            self.requests.remove(&id);
            self.sched.remove(id);
        }
        Ok(TokenEvent {
            id,
            token,
            finish,
            timing,
        })
    }
}

/// One sampling chunk's share of a step's picks.
enum Pick {
    /// Its row of logits, to sample on the host.
    Row(Vec<f32>),
    /// The id the device sampled.
    Id(u32),
}

impl Picks {
    /// Splits the picks among the plan's chunks, checking there is exactly one per sampling
    /// chunk and that device-sampled ids are in the vocabulary.
    fn per_chunk(self, plan: &StepPlan, vocab: usize) -> Result<Vec<Option<Pick>>> {
        let wanted = plan.chunks.iter().filter(|c| c.samples).count();
        let vocab = vocab.max(1);
        let picks: Vec<Pick> = match self {
            Picks::Logits(l) if l.len() % vocab == 0 => l
                .chunks_exact(vocab)
                .map(|r| Pick::Row(r.to_vec()))
                .collect(),
            Picks::Logits(l) => {
                return Err(EngineError::Internal(format!(
                    "{} logits are not whole rows of {vocab}",
                    l.len()
                )));
            }
            Picks::Ids(ids) => {
                if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
                    return Err(EngineError::Internal(format!(
                        "the device sampled id {bad}, outside the vocabulary (size {vocab})"
                    )));
                }
                ids.into_iter().map(Pick::Id).collect()
            }
        };
        if picks.len() != wanted {
            return Err(EngineError::Internal(format!(
                "the forward gave {} picks for {wanted} sampling sequences",
                picks.len()
            )));
        }
        let mut picks = picks.into_iter();
        Ok(plan
            .chunks
            .iter()
            .map(|c| if c.samples { picks.next() } else { None })
            .collect())
    }
}

/// The result of running a request to completion.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    pub tokens: Vec<SampledToken>,
    pub finish: Option<FinishReason>,
}

impl Generation {
    pub fn token_ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }
}

impl Engine {
    /// Adds `requests` and steps until all finish; `on_event` sees every token as it comes.
    /// For the CLI, tests and benchmarks; a server drives [`Engine::step`] itself.
    pub fn run_to_completion(
        &mut self,
        requests: Vec<(SeqId, Vec<u32>, SamplingParams)>,
        mut on_event: impl FnMut(&TokenEvent) -> bool,
    ) -> Result<HashMap<SeqId, Generation>> {
        let mut results: HashMap<SeqId, Generation> = HashMap::new();
        for (id, prompt, params) in requests {
            self.add_request(id, prompt, params)?;
            results.insert(id, Generation::default());
        }
        while self.has_unfinished() {
            let out = self.step()?;
            for ev in out.events {
                let keep_going = on_event(&ev);
                let g = results.entry(ev.id).or_default();
                g.tokens.push(ev.token);
                g.finish = ev.finish;
                if !keep_going && ev.finish.is_none() {
                    self.abort(ev.id);
                    g.finish = Some(FinishReason::Stop);
                }
            }
        }
        Ok(results)
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
