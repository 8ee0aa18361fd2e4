//! ferrite's GPU runner: a model run on a CUDA device. Its weights are copied to the GPU
//! (`weights.rs`), a forward pass runs on device buffers with the paged KV cache there
//! ([`runner`]), and the KV cache is sized from the memory a maximal step leaves free, as vLLM's
//! `--gpu-memory-utilization` defines ([`build_runner`]).
//!
//! The weights are read from the host model (memory-mapped checkpoint tensors, or quantized
//! copies), or made on the device for `--load-format dummy`; the engine drops its host model
//! once they are copied.
//!
//! # Layout
//!
//! - this file: [`GpuOptions`], [`build_runner`] (the start-up phases: `model_init`,
//!   `load_weights`, `kv_cache_profiling`, `kv_cache_init`, `graph_capturing`), and
//!   [`dummy_runner`] for whole-model measurements.
//! - `tensor.rs`, `matrix.rs`: device buffers, and a projection's layout there for each storage.
//! - `weights.rs`: the whole model's weights on the device, fused and repacked at upload.
//! - [`runner`]: the forward, step for step the CPU's; its `link` to the other ranks (NCCL, or
//!   the host's collective), `sampling` on the device after a step, and `graphs`: which
//!   captured decode graph a step replays, the pool leader's choice.
//! - `watchdog.rs`: a stuck NCCL call is aborted after the collective timeout.
//!
//! It may use the model crate (shapes, the host model to upload, what a step is given:
//! [`ferrite_model::SeqChunk`], [`ferrite_model::DeviceSampling`]), the formats, kernels and
//! collective crates, and never the engine: the engine's executor builds a runner and drives it
//! with each step's chunks, and re-exports this crate as `ferrite_engine::gpu`. CUDA is loaded
//! at run time (cudarc), so the crate builds and its host-side tests run without a GPU.

mod matrix;
pub mod runner;
#[cfg(test)]
mod shard_layouts;
mod tensor;
mod watchdog;
pub(crate) mod weights;

use std::sync::Arc;
use std::time::Duration;

use ferrite_collective::Collective;
use ferrite_kernels::cuda::Gpu;
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_model::error::{ModelError, Result};
use ferrite_model::kv::blocks_for;
use ferrite_model::{EngineModel, LogitsWanted, RandomShape, SeqChunk};

pub use runner::link::{CollectiveKind, host_all_reduce};
pub use runner::sampling::{Drawn, StepDraws};
pub use runner::{GpuRunner, StepLimits, kv_bytes_per_token};
use tensor::gpu_error;
use weights::GpuWeights;
pub use weights::default_dtype;

/// How a model runs on the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuOptions {
    pub dtype: Dtype,
    /// The fraction of the device's memory this process may use (weights, activations and KV
    /// cache together), as vLLM's `--gpu-memory-utilization`.
    pub memory_utilization: f64,
    /// Capture decode steps in CUDA graphs (vLLM's `--enforce-eager` turns this off).
    pub cuda_graphs: bool,
    /// How the ranks of a pool exchange activations (`--collective`).
    pub collective: CollectiveKind,
    /// How long the ranks' NCCL communicator may take to form, and one NCCL call to be taken
    /// in (the pool's start-up and collective timeouts).
    pub comm_init_timeout: Duration,
    pub collective_timeout: Duration,
}

impl GpuOptions {
    /// f16 or bf16, 90% of the memory, CUDA graphs, the collective chosen automatically.
    pub fn new(dtype: Dtype) -> Self {
        Self {
            dtype,
            memory_utilization: 0.9,
            cuda_graphs: true,
            collective: CollectiveKind::Auto,
            comm_init_timeout: Duration::from_secs(300),
            collective_timeout: Duration::from_secs(30),
        }
    }
}

/// Copies `model` to `gpu` (or makes its random weights there), profiles a maximal step and
/// gives the KV cache what is left of `memory_utilization × total memory`. Refuses when not
/// even one `max_model_len` sequence fits. In a pool (`model` a shard, `comm` its collective),
/// every rank calls this at the same time: the ranks agree on their link first, and the
/// profiling step runs their collectives.
pub fn build_runner(
    model: &EngineModel,
    gpu: Arc<Gpu>,
    opts: GpuOptions,
    limits: StepLimits,
    comm: &mut dyn Collective,
) -> Result<GpuRunner> {
    let (link, sharing) = runner::link::open(&opts, &gpu, comm)?;
    let c = model.config();
    let span = tracing::info_span!(target: ferrite_model::STARTUP_TARGET, "model_init",
        device = %gpu.device, dtype = opts.dtype.name(), weight_bytes = tracing::field::Empty);
    // Spans time from creation to close: `model_init` (planning: allocations, fusing,
    // repacking) closes before the copies of `load_weights` start, so the phases do not
    // overlap.
    let weights = match model {
        EngineModel::Host(m) => {
            let (w, jobs) = span.in_scope(|| GpuWeights::upload(gpu.clone(), opts.dtype, m))?;
            span.record("weight_bytes", w.bytes() as i64);
            drop(span);
            copy_weights(&gpu, &jobs)?;
            w
        }
        EngineModel::DeviceRandom(shape) => {
            // Nothing to plan: the weights are made in `load_weights`.
            drop(span);
            random_weights(gpu.clone(), opts.dtype, shape)?
        }
        EngineModel::Encoder(_) => {
            return Err(ModelError::BadConfig(
                "encoders run on the CPU only for now (--device cpu)".into(),
            ));
        }
    };
    let per_block =
        kv_bytes_per_token(c.num_kv_heads, c.head_dim, c.num_layers) * limits.block_size;
    let profile = tracing::info_span!(target: ferrite_model::STARTUP_TARGET, "kv_cache_profiling",
        peak_tokens = limits.max_tokens as i64, free_bytes = tracing::field::Empty,
        budget_bytes = tracing::field::Empty)
    .entered();
    // A maximal step (every token of the budget in one prompt, or max_model_len of them) with
    // just the blocks it needs, so the peak of activations and cuBLAS workspace is in use.
    let probe_tokens = limits.max_tokens.min(limits.max_model_len);
    let probe_blocks = blocks_for(probe_tokens, limits.block_size);
    let mut runner = GpuRunner::new(weights, limits, probe_blocks, link)?;
    let table: Vec<u32> = (0..probe_blocks as u32).collect();
    let tokens = vec![0u32; probe_tokens];
    let probe = SeqChunk {
        tokens: &tokens,
        start_pos: 0,
        block_table: &table,
        logits: LogitsWanted::Last,
        prompt: true,
        lora: None,
    };
    runner.forward(&[probe], comm)?;
    gpu.synchronize().map_err(gpu_error)?;
    // Ranks sharing one GPU (`--collective host`) split what the budget leaves after all of
    // their weights and peak steps: every rank measures once all are loaded and before any
    // takes its KV cache (a pool of one: no-ops).
    comm.barrier()?;
    let (free, total) = gpu.memory().map_err(gpu_error)?;
    comm.barrier()?;
    let used = total - free;
    let budget = (opts.memory_utilization * total as f64) as usize;
    let left = budget.saturating_sub(used) / sharing + probe_blocks * per_block;
    profile.record("free_bytes", free as i64);
    profile.record("budget_bytes", left as i64);
    drop(profile);
    let num_blocks = left / per_block.max(1);
    let needed = blocks_for(limits.max_model_len, limits.block_size);
    if num_blocks < needed {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        return Err(ModelError::BadConfig(format!(
            "on {}: {:.2} GiB are left for the KV cache at --gpu-memory-utilization {} \
             ({:.2} GiB in use after the weights and a maximal step), but one {}-token sequence \
             needs {:.2} GiB: lower --max-model-len or raise --gpu-memory-utilization",
            gpu.device,
            gib(left),
            opts.memory_utilization,
            gib(used),
            limits.max_model_len,
            gib(needed * per_block)
        )));
    }
    let _init = tracing::info_span!(target: ferrite_model::STARTUP_TARGET, "kv_cache_init",
        device = %gpu.device, num_blocks = num_blocks as i64,
        block_size = limits.block_size as i64, bytes = (num_blocks * per_block) as i64)
    .entered();
    runner.resize_kv(num_blocks)?;
    drop(_init);
    if opts.cuda_graphs {
        let span = tracing::info_span!(target: ferrite_model::STARTUP_TARGET, "graph_capturing",
            sizes = tracing::field::Empty, count = tracing::field::Empty);
        let _e = span.enter();
        let sizes = runner.capture_graphs()?;
        let listed: Vec<String> = sizes.iter().map(usize::to_string).collect();
        span.record("sizes", listed.join(",").as_str());
        span.record("count", sizes.len() as i64);
    }
    Ok(runner)
}

/// The GPU's part of the `load_weights` phase: runs the planned copies of the weights'
/// matrices through pinned staging buffers on several threads (the host's part mapped the
/// checkpoint, leaving its pages to be read here).
fn copy_weights(gpu: &Gpu, jobs: &tensor::Jobs<'_>) -> Result<()> {
    let span = tracing::info_span!(target: ferrite_model::STARTUP_TARGET, "load_weights",
        format = "device", mode = "pinned", device = %gpu.device, bytes = tracing::field::Empty,
        gb_per_s = tracing::field::Empty, lanes = tracing::field::Empty,
        pieces = tracing::field::Empty);
    let _e = span.enter();
    // SAFETY: every job's destination is a buffer of the planned weights, alive (owned by the
    // caller) until this returns; the jobs' regions are distinct buffers.
    #[allow(unsafe_code)]
    let stats = unsafe { gpu.upload_jobs(jobs) }.map_err(gpu_error)?;
    span.record("bytes", stats.bytes as i64);
    span.record(
        "gb_per_s",
        stats.bytes as f64 / stats.seconds.max(1e-9) / 1e9,
    );
    span.record("lanes", stats.lanes as i64);
    span.record("pieces", stats.pieces as i64);
    Ok(())
}

/// `shape`'s random weights made on `gpu`: the `load_weights` phase of `--load-format dummy`
/// on a GPU, with no host copy.
fn random_weights(gpu: Arc<Gpu>, dtype: Dtype, shape: &RandomShape) -> Result<GpuWeights> {
    let span = tracing::info_span!(target: ferrite_model::STARTUP_TARGET, "load_weights",
        format = "dummy", mode = "random-on-device", bytes = tracing::field::Empty);
    let _e = span.enter();
    let w = GpuWeights::dummy(gpu, dtype, &shape.cfg, shape.quantize, shape.seed)?;
    span.record("bytes", w.bytes() as i64);
    Ok(w)
}

/// A runner over random weights of `cfg`'s shape made on the device (`quantize`: the layers'
/// projections as codes of that format) with a KV cache of `num_blocks` blocks, its decode
/// steps captured in graphs when `opts.cuda_graphs`: whole-model speed measurements, models
/// larger than host memory included.
pub fn dummy_runner(
    gpu: Arc<Gpu>,
    cfg: &ferrite_model::config::ModelConfig,
    opts: GpuOptions,
    quantize: Option<ferrite_formats::LoadQuantize>,
    limits: StepLimits,
    num_blocks: usize,
) -> Result<GpuRunner> {
    let (link, _) = runner::link::open(&opts, &gpu, &mut ferrite_collective::Solo)?;
    let weights = GpuWeights::dummy(gpu, opts.dtype, cfg, quantize, 0)?;
    let mut runner = GpuRunner::new(weights, limits, num_blocks, link)?;
    if opts.cuda_graphs {
        runner.capture_graphs()?;
    }
    Ok(runner)
}
