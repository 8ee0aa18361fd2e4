//! The forward pass on the GPU: the CPU `LlamaModel::forward` step for step (each layer is
//! `ferrite_model::schedule::decoder_layer`, the CPU's too, through the device's steps in
//! `layer.rs`), on device buffers allocated once for the largest step
//! (`max_num_batched_tokens` tokens, `max_num_seqs` sequences), with the paged KV cache on the
//! device.
//!
//! Per step the host sends one packed array of i32 (token ids, positions, cache slots,
//! per-sequence query starts, context lengths, the rows that want logits, block tables) and
//! reads back either the f32 logits of the rows that asked for them ([`GpuRunner::forward`])
//! or only the token ids sampled from them on the device ([`GpuRunner::launch_sampled`], in
//! [`sampling`]); everything between runs on the stream without a host sync. A step is queued
//! (`launch_*`) and read back (`finish_*`) in two calls, so the engine can plan the next step
//! while this one runs (async scheduling); the ids come back through page-locked memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice};
use ferrite_kernels::cuda::attention::{DecodeScratch, decode_parts};
use ferrite_kernels::cuda::fp8::Fp8Rows;
use ferrite_kernels::cuda::gemm::{Linear, OutType};
use ferrite_kernels::cuda::w8a8::I8Rows;
use ferrite_kernels::cuda::wq_mins::WqMins;
use ferrite_kernels::cuda::wq_mma::MMA_MAX_M;
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_model::error::{ModelError, Result};
use ferrite_model::schedule::decoder_layer;
use ferrite_model::{Carried, LogitsWanted, SeqChunk};

use ferrite_collective::Collective;

use super::matrix::DeviceMatrix;
use super::tensor::gpu_error;
use super::weights::GpuWeights;
use link::Link;

#[path = "graphs.rs"]
pub mod graphs;
#[path = "layer.rs"]
mod layer;
#[path = "link.rs"]
pub mod link;
#[path = "sampling.rs"]
pub mod sampling;
use layer::DeviceLayers;
use sampling::SamplingBuffers;

/// The most products of an int8 GEMM held at once (i32, 64 MiB): 585 rows of the 8B shape's
/// gate/up at a time.
const SUMS_8BIT: usize = 16 << 20;

/// The limits a runner's buffers are sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub max_model_len: usize,
    pub block_size: usize,
}

impl StepLimits {
    fn max_blocks(&self) -> usize {
        self.max_model_len.div_ceil(self.block_size)
    }

    /// The device metadata buffer's length (see `GpuRunner::empty_plan` for the layout).
    fn meta_len(&self) -> usize {
        // ids, positions, slots | query starts, context lengths, logits rows | block tables |
        // carried draws (pairs)
        3 * self.max_tokens + 3 * self.max_seqs + 1 + self.max_seqs * (self.max_blocks() + 2)
    }
}

/// A device buffer and its address.
struct Buf<T> {
    _buf: CudaSlice<T>,
    ptr: DevPtr,
}

fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    len: usize,
) -> Result<Buf<T>> {
    let buf = gpu.zeros::<T>(len).map_err(gpu_error)?;
    Ok(Buf {
        ptr: gpu.ptr(&buf),
        _buf: buf,
    })
}

/// The paged KV cache on the device: per layer, K and V of `[slots, kv_heads, head_dim]`.
struct DeviceKv {
    k: Vec<Buf<u16>>,
    v: Vec<Buf<u16>>,
}

/// Bytes of K and V per token per layer.
pub fn kv_bytes_per_token(kv_heads: usize, head_dim: usize, layers: usize) -> usize {
    2 * 2 * kv_heads * head_dim * layers
}

/// A model's weights (or one rank's shard of them) on the GPU with its step buffers and KV
/// cache.
///
/// Fields drop in order: the captured graphs first (they hold the buffers' addresses and,
/// with NCCL, the communicator's), then the communicator, then the buffers and weights.
pub struct GpuRunner {
    /// Captured decode steps by padded batch size.
    graphs: BTreeMap<usize, Graph>,
    /// How this rank's collectives reach the other ranks' (host for a pool of one).
    link: Link,
    w: GpuWeights,
    limits: StepLimits,
    num_blocks: usize,
    kv: DeviceKv,
    meta: CudaSlice<i32>,
    meta_ptr: DevPtr,
    x: Buf<u16>,
    xn: Buf<u16>,
    qkv: Buf<u16>,
    attn: Buf<u16>,
    proj: Buf<u16>,
    gate_up: Buf<u16>,
    act: Buf<u16>,
    picked: Buf<u16>,
    logits: CudaSlice<f32>,
    logits_ptr: DevPtr,
    part_out: Buf<f32>,
    part_max: Buf<f32>,
    part_sum: Buf<f32>,
    /// Per (sequence, kv head): how many of its partitions have finished in a decode launch.
    part_done: Buf<u32>,
    n_parts: usize,
    /// A rank's LM head logits (`max_seqs × ⌈vocab / world⌉`), and with NCCL every rank's
    /// gathered (`world ×` that): only in a pool of several ranks.
    head_part: Option<Buf<f32>>,
    head_gathered: Option<Buf<f32>>,
    /// Room for the largest quantized matrix dequantized (steps of more rows than the
    /// tensor-core kernel takes; `None` when the token budget never exceeds it).
    dequantized: Option<Buf<u16>>,
    /// Room for the group means of a step's activations, for matrices with minimums.
    means: Option<Buf<u16>>,
    /// Room for a step's activations rounded to 8 bits (codes, and up to one scale per 64
    /// inputs), for W8A8 and FP8 matrices.
    quantized_rows: Option<(Buf<u8>, Buf<f32>)>,
    /// Room for the i32 products of int8 GEMMs of many rows (cuBLASLt's, `imma.rs`): up to
    /// [`SUMS_8BIT`] elements, a step of more rows runs in chunks.
    sums_8bit: Option<(Buf<i32>, usize)>,
    /// Per-sequence sampling parameters and the sampled ids.
    sampling: SamplingBuffers,
    /// Where each step's metadata is copied to `meta` from, queued without waiting for the
    /// stream (a copy from pageable memory may wait for it).
    meta_staged: ferrite_kernels::cuda::QueuedUpload<i32>,
}

impl std::fmt::Debug for GpuRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRunner")
            .field("device", &self.w.gpu.device)
            .field("dtype", &self.w.dtype)
            .field("limits", &self.limits)
            .field("num_blocks", &self.num_blocks)
            .field("tp", &self.w.tp)
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

impl GpuRunner {
    /// Step buffers for `limits` and a KV cache of `num_blocks` blocks; `link` reaches the
    /// pool's other ranks (when `w` is a shard).
    pub(crate) fn new(
        w: GpuWeights,
        limits: StepLimits,
        num_blocks: usize,
        link: Link,
    ) -> Result<Self> {
        let c = &w.cfg;
        let gpu = w.gpu.clone();
        let g = gpu.as_ref();
        let (t, s) = (limits.max_tokens, limits.max_seqs);
        let qkv_w = c.q_dim() + 2 * c.kv_dim();
        // Partitions over every position a block table can address (whole blocks past
        // max_model_len included), so no key falls beyond the last partition.
        let n_parts = decode_parts(limits.max_blocks() * limits.block_size);
        let (po, pm) = DecodeScratch::sizes(s, c.num_heads, c.head_dim, n_parts);
        let slots = num_blocks * limits.block_size * c.kv_dim();
        let kv = DeviceKv {
            k: (0..c.num_layers)
                .map(|_| alloc(g, slots))
                .collect::<Result<_>>()?,
            v: (0..c.num_layers)
                .map(|_| alloc(g, slots))
                .collect::<Result<_>>()?,
        };
        let meta = g.zeros::<i32>(limits.meta_len()).map_err(gpu_error)?;
        let meta_staged =
            ferrite_kernels::cuda::QueuedUpload::new(g, limits.meta_len()).map_err(gpu_error)?;
        // Only a step of more rows than the tensor-core kernel takes dequantizes (prefill
        // chunks above MMA_MAX_M tokens): no scratch matrix when the token budget stays below.
        let dequantized = match w.largest(DeviceMatrix::dequantized_len) {
            n if n > 0 && t > MMA_MAX_M => Some(alloc(g, n)?),
            _ => None,
        };
        let means = match w.largest(DeviceMatrix::means_per_row) {
            0 => None,
            n => Some(alloc(g, t * n)?),
        };
        let sums_8bit = match w.largest(DeviceMatrix::library_rows) {
            0 => None,
            n => {
                let len = (t * n).min(SUMS_8BIT.max(n));
                Some((alloc(g, len)?, len))
            }
        };
        let quantized_rows = match w.largest(DeviceMatrix::quantized_input_cols) {
            0 => None,
            k => Some((alloc(g, t * k)?, alloc(g, t * k.div_ceil(64))?)),
        };
        let logits = g.zeros::<f32>(s * c.vocab_size).map_err(gpu_error)?;
        let (world, each) = (w.tp.world, c.vocab_size.div_ceil(w.tp.world));
        let head_part = (world > 1).then(|| alloc(g, s * each)).transpose()?;
        let head_gathered = match link {
            Link::Nccl { .. } if world > 1 => Some(alloc(g, world * s * each)?),
            _ => None,
        };
        Ok(Self {
            limits,
            num_blocks,
            kv,
            meta_ptr: g.ptr(&meta),
            meta,
            x: alloc(g, t * c.hidden_size)?,
            xn: alloc(g, t * c.hidden_size)?,
            qkv: alloc(g, t * qkv_w)?,
            attn: alloc(g, t * c.q_dim())?,
            proj: alloc(g, t * c.hidden_size)?,
            gate_up: alloc(g, t * 2 * c.intermediate_size)?,
            act: alloc(g, t * c.intermediate_size)?,
            picked: alloc(g, s * c.hidden_size)?,
            logits_ptr: g.ptr(&logits),
            logits,
            part_out: alloc(g, po)?,
            part_max: alloc(g, pm)?,
            part_sum: alloc(g, pm)?,
            part_done: alloc(g, s * c.num_kv_heads)?,
            n_parts,
            head_part,
            head_gathered,
            graphs: BTreeMap::new(),
            link,
            dequantized,
            means,
            quantized_rows,
            sums_8bit,
            sampling: SamplingBuffers::new(g, s, c.vocab_size)?,
            meta_staged,
            w,
        })
    }

    /// Replaces the KV cache with one of `num_blocks` blocks (the old one is freed first, so
    /// its memory counts toward the new one). Its contents are lost, and so are the captured
    /// graphs (they hold the old buffers' addresses): capture again after.
    pub fn resize_kv(&mut self, num_blocks: usize) -> Result<()> {
        self.graphs.clear();
        let c = &self.w.cfg;
        let g = self.w.gpu.clone();
        let slots = num_blocks * self.limits.block_size * c.kv_dim();
        self.kv.k.clear();
        self.kv.v.clear();
        // The frees are stream-ordered: once the stream has drained, the pool hands their
        // memory back, and the larger allocations below can use it.
        g.synchronize().map_err(gpu_error)?;
        for _ in 0..c.num_layers {
            self.kv.k.push(alloc(&g, slots)?);
            self.kv.v.push(alloc(&g, slots)?);
        }
        self.num_blocks = num_blocks;
        Ok(())
    }

    /// Bytes of weights on the device (what a decode step streams).
    pub fn weight_bytes(&self) -> usize {
        self.w.bytes()
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.w.gpu
    }

    /// Whether every rank of the pool gets the whole logits (one rank, or NCCL's all-gather
    /// of the vocabulary parts; through the host link only rank 0 does), so every rank draws
    /// the same tokens.
    pub fn logits_on_every_rank(&self) -> bool {
        self.w.tp.world == 1 || self.head_gathered.is_some()
    }

    /// Runs `seqs` (their block tables already hold room for their tokens) and returns the
    /// logits each asked for, as rows of `vocab_size`, like the CPU forward. `comm` is the
    /// pool's collective (`&mut Solo` for a whole model); in a pool, only rank 0's logits are
    /// whole (the others' are not to be read), as on the CPU.
    pub fn forward(
        &mut self,
        seqs: &[SeqChunk<'_>],
        comm: &mut dyn Collective,
    ) -> Result<Vec<f32>> {
        let graph = self.graph_for(seqs.iter().map(|s| (s.tokens.len(), s.logits)));
        self.forward_planned(seqs, graph, comm)
    }

    /// [`Self::forward`], replaying the captured decode graph `graph` names (by its batch
    /// size; `None`: eagerly), as a pool's plan says every rank must
    /// ([`graphs::decode_graph`]).
    pub fn forward_planned(
        &mut self,
        seqs: &[SeqChunk<'_>],
        graph: Option<usize>,
        comm: &mut dyn Collective,
    ) -> Result<Vec<f32>> {
        let rows = self.launch_logits(seqs, graph, &[], comm)?;
        self.finish_logits(rows)
    }

    /// Queues [`Self::forward_planned`]'s step and returns without waiting for it: the host
    /// plans the next step meanwhile. `carried`: tokens the last sampled step drew here,
    /// which the host has not read ([`Self::launch_sampled`]). [`Self::finish_logits`] with
    /// the rows returned reads the logits; only a sampled step may have been queued before it
    /// and not finished.
    pub fn launch_logits(
        &mut self,
        seqs: &[SeqChunk<'_>],
        graph: Option<usize>,
        carried: &[Carried],
        comm: &mut dyn Collective,
    ) -> Result<usize> {
        self.watched_launch(|r| r.run_step(seqs, graph, carried, comm))
    }

    /// Waits for the step [`Self::launch_logits`] queued and reads its `rows` of logits.
    pub fn finish_logits(&mut self, rows: usize) -> Result<Vec<f32>> {
        let n = rows * self.w.cfg.vocab_size;
        let logits = self.w.gpu.download(&self.logits, n).map_err(gpu_error);
        self.watch_end(logits)
    }

    /// Queues the step for `seqs`, leaving the logits rows they asked for in `self.logits`;
    /// returns how many rows. `graph`: the captured decode graph to replay, padded to its
    /// batch size (`None`: eagerly).
    fn run_step(
        &mut self,
        seqs: &[SeqChunk<'_>],
        graph: Option<usize>,
        carried: &[Carried],
        comm: &mut dyn Collective,
    ) -> Result<usize> {
        if comm.world() != self.w.tp.world {
            return Err(ModelError::Internal(format!(
                "a runner of a pool of {} ranks stepped with a collective of {}",
                self.w.tp.world,
                comm.world()
            )));
        }
        let mut plan = self.plan(seqs)?;
        let n_logits = plan.n_logits;
        let gpu = self.w.gpu.clone();
        if let Some(b) = graph {
            self.check_graph(b, &plan)?;
            self.pad_decode(&mut plan, b);
        }
        let pairs = self.add_carried(&mut plan, carried)?;
        self.queue_meta(&plan)?;
        self.carry(&plan, pairs)?;
        match graph.and_then(|b| self.graphs.get(&b)) {
            Some(graph) => graph
                .0
                .launch()
                .map_err(|e| ModelError::Device(e.to_string()))?,
            // SAFETY: every buffer was sized for `limits`, which `plan` checked this step
            // against; the metadata offsets address the packed array just copied.
            #[allow(unsafe_code)]
            None => unsafe { self.run(&gpu, &plan, comm) }?,
        }
        Ok(n_logits)
    }

    /// Queues the copy of `plan`'s metadata into `meta`, behind the work queued before it.
    fn queue_meta(&mut self, plan: &DeviceBatch) -> Result<()> {
        let (g, meta) = (&self.w.gpu, self.w.gpu.ptr(&self.meta));
        if plan.meta.len() > self.meta.len() {
            return Err(ModelError::Internal(format!(
                "{} metadata words for room for {}",
                plan.meta.len(),
                self.meta.len()
            )));
        }
        // SAFETY: `meta` holds meta_len() i32, at least the plan's (checked above), and lives
        // as long as the runner.
        #[allow(unsafe_code)]
        unsafe { self.meta_staged.queue(g, meta, &plan.meta) }.map_err(gpu_error)
    }

    /// Where each array of a step's metadata lies: fixed (from the limits) so a captured
    /// graph's pointers stay valid.
    pub(super) fn offsets(&self) -> Offsets {
        let l = &self.limits;
        let (t, s) = (l.max_tokens, l.max_seqs);
        Offsets {
            ids: 0,
            positions: t,
            slots: 2 * t,
            starts: 3 * t,
            context: 3 * t + s + 1,
            picks: 3 * t + 2 * s + 1,
            tables: 3 * t + 3 * s + 1,
        }
    }

    /// A plan with no sequences, to be padded.
    fn empty_plan(&self) -> DeviceBatch {
        let off = self.offsets();
        DeviceBatch {
            // Up to the block tables; `plan` appends the tables of the step's sequences, so a
            // step copies what it uses, not room for every sequence at full length.
            meta: vec![0; off.tables],
            off,
            n_tokens: 0,
            n_seqs: 0,
            max_q: 1,
            max_blocks: self.limits.max_blocks(),
            n_logits: 0,
        }
    }

    /// Pads a decode plan to `b` sequences of one token: padding rows read token 0 at
    /// position 0, write no KV slot (-1), attend to nothing (context 0) and get logits that
    /// nobody reads.
    fn pad_decode(&self, plan: &mut DeviceBatch, b: usize) {
        let o = plan.off;
        for i in plan.n_seqs..b {
            plan.meta[o.ids + i] = 0;
            plan.meta[o.positions + i] = 0;
            plan.meta[o.slots + i] = -1;
            plan.meta[o.starts + i + 1] = i as i32 + 1;
            plan.meta[o.context + i] = 0;
            plan.meta[o.picks + i] = i as i32;
        }
        plan.n_tokens = b;
        plan.n_seqs = b;
        plan.n_logits = b;
        plan.max_q = 1;
    }

    /// The packed metadata of a step, checked against the buffers' limits.
    fn plan(&self, seqs: &[SeqChunk<'_>]) -> Result<DeviceBatch> {
        let l = &self.limits;
        let n_tokens: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let max_blocks = l.max_blocks();
        if n_tokens == 0 || n_tokens > l.max_tokens || seqs.len() > l.max_seqs {
            return Err(ModelError::Internal(format!(
                "a GPU step of {n_tokens} tokens in {} sequences (limits {} and {})",
                seqs.len(),
                l.max_tokens,
                l.max_seqs
            )));
        }
        let mut ids = Vec::with_capacity(n_tokens);
        let mut positions = Vec::with_capacity(n_tokens);
        let mut slots = Vec::with_capacity(n_tokens);
        let mut starts = vec![0i32];
        let mut context = Vec::with_capacity(seqs.len());
        let mut tables = vec![0i32; seqs.len() * max_blocks];
        let mut max_q = 0;
        for (si, s) in seqs.iter().enumerate() {
            let end = s.start_pos + s.tokens.len();
            if s.tokens.is_empty() || end > l.max_model_len {
                return Err(ModelError::Internal(format!(
                    "a chunk of {} tokens ending at {end} (max_model_len {})",
                    s.tokens.len(),
                    l.max_model_len
                )));
            }
            let needed = end.div_ceil(l.block_size);
            if s.block_table.len() < needed || needed > max_blocks {
                return Err(ModelError::Internal(format!(
                    "block table holds {} blocks, {needed} needed",
                    s.block_table.len()
                )));
            }
            for (i, &b) in s.block_table.iter().take(max_blocks).enumerate() {
                if b as usize >= self.num_blocks {
                    return Err(ModelError::Internal(format!("KV block {b} out of range")));
                }
                tables[si * max_blocks + i] = b as i32;
            }
            // Ids are in the vocabulary: the engine admits only such prompts and samples only
            // such ids, so the step does not check them again.
            for (i, &id) in s.tokens.iter().enumerate() {
                let pos = s.start_pos + i;
                ids.push(id as i32);
                positions.push(pos as i32);
                let block = s.block_table[pos / l.block_size] as usize;
                slots.push((block * l.block_size + pos % l.block_size) as i32);
            }
            starts.push(ids.len() as i32);
            context.push(end as i32);
            max_q = max_q.max(s.tokens.len());
        }
        let picks = logits_tokens(seqs);
        if picks.len() > l.max_seqs {
            return Err(ModelError::Internal(format!(
                "{} rows of logits in one GPU step (at most {})",
                picks.len(),
                l.max_seqs
            )));
        }
        // Fixed offsets (from the limits) so a captured graph's pointers stay valid.
        let DeviceBatch { mut meta, off, .. } = self.empty_plan();
        meta.resize(off.tables + tables.len(), 0);
        for (at, v) in [
            (off.ids, &ids),
            (off.positions, &positions),
            (off.slots, &slots),
            (off.starts, &starts),
            (off.context, &context),
            (off.picks, &picks),
            (off.tables, &tables),
        ] {
            meta[at..at + v.len()].copy_from_slice(v);
        }
        Ok(DeviceBatch {
            meta,
            off,
            n_tokens,
            n_seqs: seqs.len(),
            max_q,
            max_blocks,
            n_logits: picks.len(),
        })
    }

    /// Queues the whole forward.
    ///
    /// # Safety
    /// `plan` was made by [`Self::plan`] for this runner and its metadata copied to `meta`.
    #[allow(unsafe_code)]
    unsafe fn run(&self, g: &Gpu, p: &DeviceBatch, comm: &mut dyn Collective) -> Result<()> {
        let (w, c) = (&self.w, &self.w.cfg);
        let (dt, t, h) = (w.dtype, p.n_tokens, c.hidden_size);
        // SAFETY: the caller's contract is `DeviceLayers::new`'s.
        let mut layers = unsafe { DeviceLayers::new(self, g, p, comm) };
        let ids = layers.meta(p.off.ids);
        // SAFETY: the caller's contract: `x` holds the step's rows, `ids` its tokens.
        unsafe { g.embedding(dt, self.x.ptr, w.embed.ptr, ids, t, h, c.embedding_scale)? };
        for (index, layer) in w.layers.iter().enumerate() {
            decoder_layer(&mut layers, index, layer)?;
        }
        layers.pre_norm(w.norm.ptr, None)?;
        if p.n_logits == 0 {
            return Ok(());
        }
        // The rows that want logits, gathered (an embedding lookup into `picked`).
        let (picked, picks) = (self.picked.ptr, layers.meta(p.off.picks));
        // SAFETY: as above; `picked` holds max_seqs rows, `picks` the step's row numbers.
        unsafe {
            g.embedding(dt, picked, self.xn.ptr, picks, p.n_logits, h, 1.0)?;
            self.lm_head(g, picked, p.n_logits, comm)
        }
    }
}

/// A captured graph that may move to the engine's thread with the runner.
struct Graph(CudaGraph);

// SAFETY: cudarc leaves `CudaGraph` `!Send` only because it holds raw driver handles. A graph
// executable may be launched from any thread once the context is current, which `launch`
// ensures; the runner (and so each graph) is owned by one thread at a time, never shared.
#[allow(unsafe_code)]
unsafe impl Send for Graph {}

impl GpuRunner {
    /// The scratch a step's activations are rounded to 8 bits in: codes and scales.
    fn rounding_scratch(&self) -> Result<(DevPtr, DevPtr), ferrite_kernels::cuda::CudaError> {
        let (codes, scales) = self.quantized_rows.as_ref().ok_or_else(|| {
            ferrite_kernels::cuda::CudaError::Driver("no 8-bit activation buffer".into())
        })?;
        Ok((codes.ptr, scales.ptr))
    }

    /// The 8-bit scratch as a W8A8 projection's input (codes, scales and room for products).
    fn int8_rows(&self) -> Result<I8Rows, ferrite_kernels::cuda::CudaError> {
        let (codes, scales) = self.rounding_scratch()?;
        let (sums, sums_len) = self.sums_scratch();
        Ok(I8Rows {
            codes,
            scales,
            sums,
            sums_len,
        })
    }

    /// The scratch cuBLASLt's int8 GEMMs sum into, and its length (none: 0).
    fn sums_scratch(&self) -> (DevPtr, usize) {
        match &self.sums_8bit {
            Some((b, len)) => (b.ptr, *len),
            None => (DevPtr::NULL, 0),
        }
    }

    /// `out = x · Wᵀ` through whichever kernel `w`'s storage takes: for dense weights
    /// [`Gpu::linear`]'s (the dense GEMV up to 16 rows, cuBLAS above); the int8 or FP8 kernels for W8A8 and FP8 (`x` rounded to 8 bits into the
    /// `quantized_rows` scratch); for weight-only quantized ones the kernel
    /// `WqKernel::choose` picks by rows of `x` (the GEMV up to 16, the tensor-core GEMM up to
    /// 256, above that the matrix dequantized into the scratch buffer, then cuBLAS), with a
    /// matrix's minimums summed inside the GEMV or, after the other kernels, added as group
    /// means of `x` (into the `means` scratch) times the minimums by cuBLAS.
    ///
    /// With `x_int8`, `x` was already rounded to int8 into the 8-bit scratch (by the norm
    /// that made it, [`Gpu::rms_norm_int8`]): a W8A8 matrix then skips its own rounding.
    ///
    /// # Safety
    /// As [`Gpu::linear`]; `shape` is contiguous (strides `k` and `n`).
    #[allow(unsafe_code)]
    unsafe fn project(
        &self,
        g: &Gpu,
        out: DevPtr,
        x: DevPtr,
        w: &DeviceMatrix,
        shape: Linear,
        x_int8: bool,
    ) -> Result<(), ferrite_kernels::cuda::CudaError> {
        let dt = self.w.dtype;
        let scratch = |buf: &Option<Buf<u16>>, what: &str| {
            buf.as_ref().map(|b| b.ptr).ok_or_else(|| {
                ferrite_kernels::cuda::CudaError::Driver(format!("no {what} buffer"))
            })
        };
        unsafe {
            let (w, mins) = match w {
                DeviceMatrix::Dense(t) => return g.linear(dt, OutType::Same, out, x, t.ptr, shape),
                DeviceMatrix::Quantized { w, mins, .. } => (w, mins),
                DeviceMatrix::Int8 { w, .. } if x_int8 => {
                    return g.w8a8_gemm(dt, out, self.int8_rows()?, w, shape.m);
                }
                DeviceMatrix::Int8 { w, .. } => {
                    return g.w8a8_matmul(dt, out, x, w, shape.m, self.int8_rows()?);
                }
                DeviceMatrix::Fp8 { w, .. } => {
                    let (codes, scales) = self.rounding_scratch()?;
                    let rows = Fp8Rows { codes, scales };
                    return g.fp8_matmul(dt, out, x, w, shape.m, rows);
                }
            };
            let dense = self.dequantized.as_ref().map_or(DevPtr::NULL, |b| b.ptr);
            let mins = match mins {
                Some(mins) => Some(WqMins {
                    mins: mins.ptr,
                    means: scratch(&self.means, "group means")?,
                }),
                None => None,
            };
            g.wq_matmul(dt, out, x, w, shape.m, dense, mins.as_ref())
        }
    }
}

/// The token each row of logits of `seqs` is taken at, by its index among the step's tokens.
pub(super) fn logits_tokens(seqs: &[SeqChunk<'_>]) -> Vec<i32> {
    let mut picks = Vec::new();
    let mut at = 0;
    for s in seqs {
        let end = at + s.tokens.len() as i32;
        match s.logits {
            LogitsWanted::None => {}
            LogitsWanted::Last => picks.push(end - 1),
            LogitsWanted::All => picks.extend(at..end),
        }
        at = end;
    }
    picks
}

/// Where each array sits in the packed metadata (element offsets).
#[derive(Debug, Clone, Copy)]
pub(super) struct Offsets {
    ids: usize,
    positions: usize,
    slots: usize,
    starts: usize,
    context: usize,
    picks: usize,
    tables: usize,
}

struct DeviceBatch {
    meta: Vec<i32>,
    off: Offsets,
    n_tokens: usize,
    n_seqs: usize,
    max_q: usize,
    max_blocks: usize,
    n_logits: usize,
}
