//! The executor: one rank's forward over its shard of the model and its KV cache, driven by
//! [`StepPlan`]s.
//!
//! Every rank of a pool has one. On rank 0 the leader ([`crate::engine::Engine`]) hands it each
//! plan through [`Executor::lead`], which sends the plan to the other ranks first; the other
//! ranks run [`Executor::follow`], a loop over the leader's orders. All ranks then run the same
//! forward, meeting in the collectives after the attention output and MLP down projections and
//! in the all-gather of the logits.
//!
//! A collective that fails (a rank died, or did not answer within the timeout) fails the pool:
//! the error, [`EngineError::RankLost`], names the rank and the last step every rank finished.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;

use ferrite_collective::{Collective, CollectiveError, Solo};
use ferrite_kernels::cuda::Gpu;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::gpu::{self, GpuOptions, GpuRunner, StepLimits};
use crate::kv_cache::KvCache;
use crate::model::classify::Classifier;
use crate::model::{EngineModel, MaskSource, ModelError};
use crate::plan::{BlockTables, Order, OrderRef, StepPlan};

#[path = "executor_cpu.rs"]
mod cpu;
#[path = "executor_picks.rs"]
mod picks;
use cpu::{CpuModel, cpu_step, with_carried};
pub use picks::Picks;
pub(crate) use picks::{Pick, per_chunk};

/// Engine limits (the leader's and every rank's executor's). `Default` suits the CPU.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Context length (prompt + output); `None` = the model's, capped at 8192.
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    /// Memory for K and V on the CPU; the pool gets as many blocks as fit.
    pub kv_cache_bytes: usize,
    /// What the CPU's KV cache stores (a GPU's holds the weights' dtype).
    pub kv_cache_dtype: crate::model::kv::KvDtype,
    /// Run on this GPU instead of the CPU (the KV cache is then sized from its memory).
    pub cuda: Option<CudaPlacement>,
    /// Reuse the KV blocks of prompt prefixes computed before (automatic prefix caching).
    pub prefix_caching: bool,
    /// What, besides the shape the engine sees, makes this model's keys and values what they
    /// are: its file or name, the format and quantization of its weights. Seeds the block
    /// hashes (see [`ferrite_proto::prefix`]).
    pub model_identity: String,
    /// The leader plans each step while the device runs the one before (vLLM's async
    /// scheduling; see the engine's `overlap` module). On for GPUs by the CLI; off by default,
    /// as a CPU forward leaves no time to hide.
    pub async_scheduling: bool,
    /// Speculative decoding by n-gram lookup (without async scheduling; `None`: off).
    pub speculation: Option<crate::ngram::Speculation>,
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
            kv_cache_dtype: Default::default(),
            cuda: None,
            prefix_caching: true,
            model_identity: String::new(),
            async_scheduling: false,
            speculation: None,
        }
    }
}

/// Where the forward runs.
#[derive(Debug)]
enum Backend {
    /// The CPU reference ops over the model in host memory, with the KV cache there too;
    /// `drawn`: the ids the last step drew, if it drew here (greedy picks under async
    /// scheduling: see [`Executor::start`]).
    Cpu {
        model: Box<CpuModel>,
        kv: KvCache,
        drawn: Vec<u32>,
    },
    /// The CUDA backend, with its own copy of the weights and device KV cache (the host model
    /// is dropped once copied: nothing reads it after).
    Cuda(Box<GpuRunner>),
}

/// One rank's forward, its block tables and its link to the other ranks.
pub struct Executor {
    backend: Backend,
    tables: BlockTables,
    comm: Box<dyn Collective>,
    /// The model's (not the shard's) shape.
    cfg: ModelConfig,
    /// The LoRA adapters' names (see [`Self::lora_names`]).
    lora: Vec<String>,
    max_model_len: usize,
    num_blocks: usize,
    /// A collective failed: the pool is lost, and the links are not to be used again.
    failed: Cell<bool>,
    /// The steps [`Executor::launch`] started, with their numbers, until collected, oldest
    /// first: at most [`MAX_IN_FLIGHT`].
    pending: VecDeque<(Started, u64)>,
    /// The last step whose tokens this rank drew (without grammar masks), so that the next
    /// one may take them ([`StepPlan::carried`]).
    drawn_step: Option<u64>,
    /// The final hidden states of the last CPU step's rows of logits, when asked for
    /// ([`Self::keep_hidden`]).
    hidden: Option<Vec<f32>>,
}

/// Rows of logits a CPU step brings back at most (unless it runs more sequences): a scored
/// prompt's chunk of 1024 tokens is 512 MB of logits for a vocabulary of 128K. Scoring in the
/// step's whole budget, not half of it, is 13% faster for one 1000-token prompt (the default
/// model, 2 cores).
pub const CPU_LOGITS_ROWS: usize = 1024;

/// Steps launched and not yet collected at once: async scheduling's chained launch queues a
/// step before the one before it is read back (the engine's `overlap` module).
const MAX_IN_FLIGHT: usize = 2;

/// A step begun on this rank: its picks (the CPU ran it), or the rows of ids or logits a GPU
/// step queued leaves to read back.
enum Started {
    Done(std::result::Result<Picks, ModelError>),
    /// The ids, and the sampling rows whose logits come back too.
    Ids(gpu::Drawn, Vec<u32>),
    Logits(usize),
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("rank", &self.comm.rank())
            .field("world", &self.comm.world())
            .field("device", &self.device_name())
            .field("last_step", &self.tables.last_step())
            .finish_non_exhaustive()
    }
}

/// `cfg`'s max model length (default: the model's, at most 8192), checked with the other
/// limits.
pub(crate) fn checked_max_model_len(model: &ModelConfig, cfg: &EngineConfig) -> Result<usize> {
    let max_model_len = cfg.max_model_len.unwrap_or(model.default_context());
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

impl Executor {
    /// A single-rank executor (the whole model, no collectives).
    pub fn solo(model: impl Into<EngineModel>, cfg: &EngineConfig) -> Result<Self> {
        Self::new(model.into(), cfg, Box::new(Solo))
    }

    /// This rank's executor over `model` (its shard), on the CPU or on `cfg.cuda`'s GPU, with
    /// `comm` to the other ranks. Sizes the KV cache and refuses configurations where one
    /// full-length sequence would not fit.
    pub fn new(
        mut model: EngineModel,
        cfg: &EngineConfig,
        mut comm: Box<dyn Collective>,
    ) -> Result<Self> {
        let max_model_len = checked_max_model_len(model.config(), cfg)?;
        if let EngineModel::Host(m) = &mut model {
            m.fit_context(max_model_len);
        }
        let model_cfg = model.config().clone();
        let (lora, classifies) = match &model {
            EngineModel::Host(m) => (m.lora_names(), m.classifier().is_some()),
            EngineModel::Encoder(m) => (Vec::new(), m.classifier().is_some()),
            EngineModel::DeviceRandom(_) => (Vec::new(), false),
        };
        if cfg.cuda.is_some() && !lora.is_empty() {
            return Err(EngineError::BadConfig(
                "LoRA adapters run on the CPU only for now (--device cpu)".into(),
            ));
        }
        if cfg.cuda.is_some() && classifies {
            // The GPU runner does not bring hidden states back, which a classifier's head reads.
            return Err(EngineError::BadConfig(
                "sequence classifiers run on the CPU only for now (--device cpu)".into(),
            ));
        }
        let backend = match (cfg.cuda.clone(), model) {
            (Some(CudaPlacement { gpu, opts }), model) => {
                Self::cuda(model, gpu, cfg, max_model_len, opts, comm.as_mut())?
            }
            (None, EngineModel::Host(model)) => Self::cpu(model, cfg, max_model_len)?,
            (None, EngineModel::Encoder(model)) => {
                Self::encoder(model, cfg, max_model_len, comm.world())?
            }
            (None, EngineModel::DeviceRandom(_)) => {
                return Err(EngineError::BadConfig(
                    "random weights made on the device need a GPU (--device cuda)".into(),
                ));
            }
        };
        let num_blocks = match &backend {
            Backend::Cpu { kv, .. } => kv.num_blocks,
            Backend::Cuda(r) => r.num_blocks(),
        };
        Ok(Self {
            backend,
            tables: BlockTables::default(),
            comm,
            cfg: model_cfg,
            lora,
            max_model_len,
            num_blocks,
            failed: Cell::new(false),
            pending: VecDeque::new(),
            drawn_step: None,
            hidden: None,
        })
    }

    /// The weights (this rank's shard) are copied to `gpu` and the KV cache takes what
    /// `opts.memory_utilization` leaves after a maximal step (`cfg.kv_cache_bytes` is the
    /// CPU's and is not used); in a pool, the ranks meet in `comm` while they do.
    fn cuda(
        model: EngineModel,
        gpu: Arc<Gpu>,
        cfg: &EngineConfig,
        max_model_len: usize,
        opts: gpu::GpuOptions,
        comm: &mut dyn Collective,
    ) -> Result<Backend> {
        let limits = StepLimits {
            max_tokens: cfg.max_num_batched_tokens,
            max_seqs: cfg.max_num_seqs,
            max_model_len,
            block_size: cfg.block_size,
        };
        let runner = gpu::build_runner(&model, gpu, opts, limits, comm)?;
        Ok(Backend::Cuda(Box::new(runner)))
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// The model's shape (the vocabulary is the whole model's on every rank).
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The LoRA adapters' names, in the order a plan's chunks number them.
    pub fn lora_names(&self) -> &[String] {
        &self.lora
    }

    /// A sequence classifier's head, applied to the hidden states this rank keeps
    /// ([`Self::take_hidden`]); `None` for a generative model (and on a GPU, which refuses
    /// classifiers at start-up).
    pub fn classifier(&self) -> Option<&Classifier> {
        match &self.backend {
            Backend::Cpu { model, .. } => model.classifier(),
            Backend::Cuda(_) => None,
        }
    }

    /// Whether the model is an encoder ([`crate::model::encoder`]): each of its prompts runs
    /// whole, and it makes embeddings only.
    pub fn encodes(&self) -> bool {
        matches!(&self.backend, Backend::Cpu { model, .. } if matches!(**model, CpuModel::Encoder(_)))
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// KV blocks this pool schedules: after [`Self::agree_on_blocks`], the least any rank has.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Which device runs the forward pass (`cpu`, or the CUDA device).
    pub fn device_name(&self) -> String {
        match &self.backend {
            Backend::Cpu { .. } => "cpu".into(),
            Backend::Cuda(r) => r.gpu().device.to_string(),
        }
    }

    /// Whether a step may sample on the device (any draw; the CPU draws greedy picks only,
    /// when a plan asks it to).
    pub fn samples_on_device(&self) -> bool {
        matches!(self.backend, Backend::Cuda(_))
    }

    /// Rows of logits one step may bring back, in a pool of `max_num_seqs` running at most
    /// `max_num_batched_tokens` a step: a GPU has room for `max_num_seqs`; the CPU makes room
    /// for a whole step's tokens (a scored prompt's chunks), up to [`CPU_LOGITS_ROWS`].
    pub fn max_logits_rows(&self, max_num_seqs: usize, max_num_batched_tokens: usize) -> usize {
        match self.backend {
            Backend::Cuda(_) => max_num_seqs,
            Backend::Cpu { .. } => max_num_batched_tokens
                .min(CPU_LOGITS_ROWS)
                .max(max_num_seqs),
        }
    }

    /// Every rank calls this once before the first step: the pool schedules the least number
    /// of KV blocks any rank has room for. (Counts travel as f32, exact below 2^24 blocks.)
    pub fn agree_on_blocks(&mut self) -> Result<usize> {
        if self.world() > 1 {
            let mine = [self.num_blocks.min(1 << 24) as f32];
            let mut all = vec![0f32; self.world()];
            self.comm
                .all_gather(&mine, &mut all)
                .map_err(|e| self.lost(e, 0))?;
            self.num_blocks = all.iter().fold(f32::MAX, |a, &b| a.min(b)) as usize;
        }
        Ok(self.num_blocks)
    }

    /// The leader's half of a step: decides which captured decode graph (if any) the ranks
    /// replay on a GPU (`plan.graph`), sends `plan` to the other ranks, then runs it here.
    pub fn lead(&mut self, plan: &mut StepPlan) -> Result<Picks> {
        self.lead_masked(plan, None)
    }

    /// [`Self::lead`], where the device samples under grammar masks `masks` gives once the
    /// forward is queued (the host computes them meanwhile). On the CPU, or with no device
    /// sampling in the plan, `masks` is not called: the host masks the rows it samples.
    pub fn lead_masked(
        &mut self,
        plan: &mut StepPlan,
        masks: Option<MaskSource<'_>>,
    ) -> Result<Picks> {
        self.send(plan, 0)?;
        self.run(plan, masks)
    }

    /// [`Self::lead_masked`] without waiting for the picks: on a GPU the step is queued and
    /// this returns, so the leader plans the next step while the device runs this one
    /// ([`Self::collect`] waits for it). On the CPU the step runs here.
    ///
    /// A step may be launched while the one before it is in flight, once
    /// ([`MAX_IN_FLIGHT`]).
    pub fn launch(&mut self, plan: &mut StepPlan, masks: Option<MaskSource<'_>>) -> Result<()> {
        self.send(plan, MAX_IN_FLIGHT - 1)?;
        let started = self.start(plan, masks)?;
        self.pending.push_back((started, plan.step));
        Ok(())
    }

    /// The picks of the oldest step [`Self::launch`] started (waiting for it on a GPU).
    pub fn collect(&mut self) -> Result<Picks> {
        let (started, step) = self
            .pending
            .pop_front()
            .ok_or_else(|| EngineError::Internal("picks collected with no step launched".into()))?;
        self.finish(started, step)
    }

    /// Waits for the steps launched and not collected and drops their picks (their requests
    /// failed with a step before them), so nothing of theirs is left running or watched.
    pub fn abandon(&mut self) {
        while let Some((started, step)) = self.pending.pop_front() {
            let _ = self.finish(started, step);
        }
    }

    /// Decides which captured decode graph (if any) the ranks replay on a GPU (`plan.graph`)
    /// and sends `plan` to the other ranks; `in_flight`: how many launched steps may still be
    /// uncollected.
    fn send(&mut self, plan: &mut StepPlan, in_flight: usize) -> Result<()> {
        if self.pending.len() > in_flight {
            return Err(EngineError::Internal(
                "a step was led while another one's picks were not collected".into(),
            ));
        }
        plan.graph = match &self.backend {
            Backend::Cuda(runner) => {
                runner.graph_for(plan.chunks.iter().map(|c| (c.tokens.len(), c.logits)))
            }
            Backend::Cpu { .. } => None,
        };
        if self.world() > 1 {
            let mut bytes = OrderRef::Step(plan).encode();
            self.comm
                .broadcast(&mut bytes)
                .map_err(|e| self.lost(e, plan.step))?;
        }
        Ok(())
    }

    /// Tells the other ranks the leader is alive while it has nothing to run.
    pub fn keep_alive(&mut self) -> Result<()> {
        if self.world() > 1 {
            let step = self.tables.last_step() + 1;
            self.comm
                .broadcast(&mut OrderRef::KeepAlive.encode())
                .map_err(|e| self.lost(e, step))?;
        }
        Ok(())
    }

    /// A follower's loop: runs the leader's plans until it says stop (`Ok`) or the pool
    /// fails (the leader or another rank lost: `Err`).
    pub fn follow(&mut self) -> Result<()> {
        let mut bytes = Vec::new();
        loop {
            let step = self.tables.last_step() + 1;
            self.comm
                .broadcast(&mut bytes)
                .map_err(|e| self.lost(e, step))?;
            match Order::decode(&bytes)? {
                Order::Step(plan) => {
                    self.run(&plan, None)?;
                }
                Order::KeepAlive => {}
                Order::Stop => return Ok(()),
            }
        }
    }

    /// Whether this rank's steps can keep their final hidden states (the CPU's can).
    pub fn gives_hidden(&self) -> bool {
        matches!(self.backend, Backend::Cpu { .. })
    }

    /// Whether the next step keeps the final hidden states of its rows of logits, in their
    /// order, for [`Self::take_hidden`] (an embeddings request's; on the CPU).
    pub fn keep_hidden(&mut self, keep: bool) {
        self.hidden = keep.then(Vec::new);
    }

    /// What the step after [`Self::keep_hidden`] kept (rows of `hidden_size`).
    pub fn take_hidden(&mut self) -> Option<Vec<f32>> {
        self.hidden.take()
    }

    /// Runs `plan` on this rank's shard: applies its table updates, then the forward (sampling
    /// on the device under `masks` where the plan samples there).
    fn run(&mut self, plan: &StepPlan, masks: Option<MaskSource<'_>>) -> Result<Picks> {
        let started = self.start(plan, masks)?;
        self.finish(started, plan.step)
    }

    /// [`Self::run`] up to the wait: applies `plan`'s table updates and runs the forward on
    /// the CPU, or queues it on the GPU. A plan that samples "on the device" draws on the CPU
    /// too (greedy picks only: the leader asks for no other there).
    fn start(&mut self, plan: &StepPlan, masks: Option<MaskSource<'_>>) -> Result<Started> {
        self.tables.apply(plan)?;
        self.check_carried(plan)?;
        // This step's draws stand for the next step's carried tokens only where no grammar
        // mask bent them (on the leader: the other ranks are given none, and are never asked).
        let carryable = plan.host_rows.is_empty() && masks.is_none();
        self.drawn_step = (plan.device_sampling.is_some() && carryable).then_some(plan.step);
        let comm = self.comm.as_mut();
        let started = match (&mut self.backend, &plan.device_sampling) {
            (Backend::Cpu { .. }, Some(params)) if params.iter().any(|d| d.temperature > 0.0) => {
                return Err(EngineError::Internal(
                    "a draw at a temperature asked of the CPU, which draws greedy picks only"
                        .into(),
                ));
            }
            (Backend::Cpu { model, kv, drawn }, sampling) => {
                let plan = with_carried(plan, drawn, model.config().vocab_size);
                let chunks = self.tables.chunks(&plan)?;
                let draws = sampling.is_some().then_some((drawn, plan.as_ref()));
                let hidden = self.hidden.as_mut();
                Ok(Started::Done(cpu_step(
                    model, kv, &chunks, draws, comm, hidden,
                )))
            }
            (Backend::Cuda(runner), Some(params)) => {
                let chunks = self.tables.chunks(plan)?;
                let (graph, carried) = (plan.graph, &plan.carried);
                let draws = gpu::StepDraws {
                    params,
                    extras: &plan.extras,
                };
                runner
                    .launch_sampled(&chunks, draws, graph, carried, comm, masks)
                    .map(|d| Started::Ids(d, plan.host_rows.clone()))
            }
            (Backend::Cuda(runner), None) => {
                let chunks = self.tables.chunks(plan)?;
                runner
                    .launch_logits(&chunks, plan.graph, &plan.carried, comm)
                    .map(Started::Logits)
            }
        };
        started.map_err(|e| self.model_error(e, plan.step))
    }

    /// Whether every rank draws what this one draws, from the whole logits (a pool of one, or
    /// NCCL's all-gather of them), so that a step may take the draws of the one before
    /// ([`StepPlan::carried`]). Elsewhere only the leader has the whole logits.
    fn draws_agree(&self) -> bool {
        self.world() == 1 || matches!(&self.backend, Backend::Cuda(r) if r.logits_on_every_rank())
    }

    /// Whether `plan` may carry tokens of the step before it: this rank drew them all (no
    /// row sampled on the host, no grammar mask), and every rank drew the same.
    pub fn can_carry_into(&self, plan: &StepPlan) -> bool {
        self.drawn_step.is_some_and(|s| s + 1 == plan.step) && self.draws_agree()
    }

    /// A plan that carries tokens follows a step that drew them here.
    fn check_carried(&self, plan: &StepPlan) -> Result<()> {
        if plan.carried.is_empty() || self.can_carry_into(plan) {
            return Ok(());
        }
        Err(EngineError::Internal(format!(
            "step {} carries tokens that step {} did not draw on every rank",
            plan.step,
            plan.step - 1
        )))
    }

    /// The picks of a step [`Self::start`] began (`step`: its number).
    fn finish(&mut self, started: Started, step: u64) -> Result<Picks> {
        // Only the leader samples: the other ranks' logits are not whole, nor read.
        let leads = self.rank() == 0;
        let picks = match (started, &mut self.backend) {
            (Started::Done(picks), _) => picks,
            (Started::Ids(drawn, host_rows), Backend::Cuda(runner)) => runner
                .finish_ids(drawn)
                .and_then(|ids| match host_rows.is_empty() || !leads {
                    true => Ok(Picks::Ids(ids)),
                    false => Ok(Picks::Mixed(ids, runner.logits_rows(&host_rows)?)),
                }),
            (Started::Logits(rows), Backend::Cuda(runner)) => {
                runner.finish_logits(rows).map(Picks::Logits)
            }
            (_, Backend::Cpu { .. }) => {
                return Err(EngineError::Internal(
                    "a device step to finish on the CPU".into(),
                ));
            }
        };
        picks.map_err(|e| self.model_error(e, step))
    }

    /// `e`, from the forward of `step`, as the engine reports it: a failed collective fails
    /// the pool.
    fn model_error(&self, e: ModelError, step: u64) -> EngineError {
        match e {
            ModelError::Collective(e) => self.lost(e, step),
            other => EngineError::from(other),
        }
    }

    /// The pool-failing error for collective `e` in `step`.
    fn lost(&self, e: CollectiveError, step: u64) -> EngineError {
        self.failed.set(true);
        EngineError::RankLost {
            rank: e.rank(),
            this_rank: self.rank(),
            step,
            reason: e.to_string(),
        }
    }
}

impl Drop for Executor {
    /// The leader tells the other ranks the pool is stopping (best effort: they also stop
    /// when its connections close). After a failure it only closes them: the others may be
    /// inside a collective, where an order would read as garbage. Dropped while the engine
    /// thread panics, it only closes them too: the others then fail (and exit non-zero) with
    /// the leader lost, instead of stopping as if the pool had ended well.
    fn drop(&mut self) {
        let failed = self.failed.get() || std::thread::panicking();
        if self.rank() == 0 && self.world() > 1 && !failed {
            let _ = self.comm.broadcast(&mut OrderRef::Stop.encode());
        }
    }
}
