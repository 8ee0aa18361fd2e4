//! Launch wrappers for paged attention (`attention.cu`): decode split over partitions of the
//! context, which the last partition to finish combines (one launch), and prefill (chunked, causal) either on tensor cores (`mma.sync`,
//! head sizes 64/128/256 exactly) or on CUDA cores (any multiple of 8 up to 256, in the
//! kernel of the next size up: its lanes past the head's end idle).

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};
use super::ops::{Dtype, i32_of};

/// Positions one decode block covers at most (the kernel allows up to 512). A short context in
/// a small batch is cut finer (down to 32 positions, into at most [`DECODE_SHORT_PARTS`]
/// parts) so that a batch-1 decode spreads over more SMs: `partition_of` in `attention.cu`.
pub const DECODE_PARTITION: usize = 256;

/// The most partitions the kernel cuts a context of up to `DECODE_SHORT_PARTS ×
/// DECODE_PARTITION` positions into (`DEC_SHORT_PARTS` in `attention.cu`).
pub const DECODE_SHORT_PARTS: usize = 16;

/// Partitions per sequence (the decode grid's depth and the scratch's rows) for contexts of up
/// to `max_len` positions: a long context in partitions of [`DECODE_PARTITION`], a short one
/// in up to [`DECODE_SHORT_PARTS`].
pub fn decode_parts(max_len: usize) -> usize {
    max_len.div_ceil(DECODE_PARTITION).max(DECODE_SHORT_PARTS)
}

/// What attention needs to find a layer's keys and values and score them.
#[derive(Debug, Clone, Copy)]
pub struct PagedAttention {
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
    /// i32 `[n_seqs, max_blocks]`.
    pub block_tables: DevPtr,
    pub max_blocks: usize,
    /// i32 `[n_seqs]`: tokens in the cache per sequence, this step's included.
    pub context_lens: DevPtr,
    pub n_seqs: usize,
    pub n_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
    /// 0: none.
    pub soft_cap: f32,
    /// 0: none.
    pub window: usize,
}

/// Scratch of a decode step: f32 `part_out` holds `n_seqs * n_heads * n_parts * head_dim`,
/// `part_max` and `part_sum` `n_seqs * n_heads * n_parts` each; u32 `counters` holds
/// `n_seqs * kv_heads`, zero when allocated (each launch leaves them zero again).
#[derive(Debug, Clone, Copy)]
pub struct DecodeScratch {
    pub part_out: DevPtr,
    pub part_max: DevPtr,
    pub part_sum: DevPtr,
    /// How many partitions of each (sequence, kv head) have finished: the last one combines
    /// them, so a decode step is one launch.
    pub counters: DevPtr,
    /// Partitions per sequence: `ceil(max_model_len / DECODE_PARTITION)`, fixed so a captured
    /// graph serves every context length.
    pub n_parts: usize,
}

impl DecodeScratch {
    /// f32 elements of (`part_out`, `part_max` and `part_sum` each) for a batch.
    pub fn sizes(n_seqs: usize, n_heads: usize, head_dim: usize, n_parts: usize) -> (usize, usize) {
        let per = n_seqs * n_heads * n_parts;
        (per * head_dim, per)
    }
}

/// The module holding a head-size bucket's kernels (`attention.cu` is compiled once per
/// bucket).
fn module_of(bucket: usize) -> &'static str {
    match bucket {
        64 => "attention_hd64",
        128 => "attention_hd128",
        _ => "attention_hd256",
    }
}

fn head_bucket(head_dim: usize) -> Result<usize, CudaError> {
    match head_dim {
        d if d == 0 || d % 8 != 0 || d > 256 => Err(CudaError::Driver(format!(
            "attention: head_dim {d} is not a multiple of 8 up to 256"
        ))),
        d if d <= 64 => Ok(64),
        d if d <= 128 => Ok(128),
        _ => Ok(256),
    }
}

fn common_args(a: &PagedAttention) -> Result<Vec<Arg>, CudaError> {
    Ok(vec![
        a.k_cache.into(),
        a.v_cache.into(),
        a.block_tables.into(),
        i32_of("max_blocks", a.max_blocks)?,
    ])
}

fn check(a: &PagedAttention) -> Result<(), CudaError> {
    if a.kv_heads == 0 || !a.n_heads.is_multiple_of(a.kv_heads) || a.block_size == 0 {
        return Err(CudaError::Driver(format!(
            "attention: {} heads over {} kv heads, block size {}",
            a.n_heads, a.kv_heads, a.block_size
        )));
    }
    Ok(())
}

#[allow(unsafe_code)]
impl Gpu {
    /// One query token per sequence (its last position): `out` rows `out_stride` apart from `q`
    /// rows `q_stride` apart (both multiples of 8).
    ///
    /// # Safety
    /// The pointers of `a` and `scratch` address buffers of the sizes they document; `q`/`out`
    /// hold `n_seqs` rows; every block table entry below a sequence's length names a block
    /// of the cache.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_decode(
        &self,
        dtype: Dtype,
        out: DevPtr,
        out_stride: usize,
        q: DevPtr,
        q_stride: usize,
        a: &PagedAttention,
        scratch: &DecodeScratch,
    ) -> Result<(), CudaError> {
        check(a)?;
        let bucket = head_bucket(a.head_dim)?;
        let name = match (bucket, dtype) {
            (64, Dtype::F16) => "attention_decode_hd64_f16",
            (64, Dtype::Bf16) => "attention_decode_hd64_bf16",
            (128, Dtype::F16) => "attention_decode_hd128_f16",
            (128, Dtype::Bf16) => "attention_decode_hd128_bf16",
            (_, Dtype::F16) => "attention_decode_hd256_f16",
            (_, Dtype::Bf16) => "attention_decode_hd256_bf16",
        };
        let mut args = vec![
            out.into(),
            i32_of("out_stride", out_stride)?,
            scratch.counters.into(),
            scratch.part_out.into(),
            scratch.part_max.into(),
            scratch.part_sum.into(),
            q.into(),
            i32_of("q_stride", q_stride)?,
        ];
        args.extend(common_args(a)?);
        args.extend([
            a.context_lens.into(),
            i32_of("n_heads", a.n_heads)?,
            i32_of("kv_heads", a.kv_heads)?,
            i32_of("head_dim", a.head_dim)?,
            i32_of("block_size", a.block_size)?,
            Arg::F32(a.scale),
            Arg::F32(a.soft_cap),
            i32_of("window", a.window)?,
            i32_of("partition_size", DECODE_PARTITION)?,
            i32_of("n_parts", scratch.n_parts)?,
        ]);
        let grid = (a.kv_heads as u32, a.n_seqs as u32, scratch.n_parts as u32);
        unsafe { self.launch(module_of(bucket), name, grid, 128, 0, &args) }
    }

    /// Causal attention of chunks of query tokens (`query_start`: i32 `[n_seqs + 1]`
    /// cumulative counts; the longest chunk has `max_q` tokens) over the cache, which already
    /// holds their keys and values.
    ///
    /// # Safety
    /// As [`Self::attention_decode`], with `q`/`out` holding `query_start[n_seqs]` rows.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_prefill(
        &self,
        dtype: Dtype,
        out: DevPtr,
        out_stride: usize,
        q: DevPtr,
        q_stride: usize,
        query_start: DevPtr,
        max_q: usize,
        a: &PagedAttention,
    ) -> Result<(), CudaError> {
        unsafe {
            self.prefill(
                dtype,
                true,
                out,
                out_stride,
                q,
                q_stride,
                query_start,
                max_q,
                a,
            )
        }
    }

    /// [`Self::attention_prefill`] through the CUDA-core kernel whatever the head size (the
    /// tests compare both kernels).
    ///
    /// # Safety
    /// As [`Self::attention_prefill`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_prefill_simt(
        &self,
        dtype: Dtype,
        out: DevPtr,
        out_stride: usize,
        q: DevPtr,
        q_stride: usize,
        query_start: DevPtr,
        max_q: usize,
        a: &PagedAttention,
    ) -> Result<(), CudaError> {
        unsafe {
            self.prefill(
                dtype,
                false,
                out,
                out_stride,
                q,
                q_stride,
                query_start,
                max_q,
                a,
            )
        }
    }

    /// The prefill launch: on tensor cores when `tensor_cores` and the head size has an `mma`
    /// instantiation, else on CUDA cores.
    #[allow(clippy::too_many_arguments)]
    unsafe fn prefill(
        &self,
        dtype: Dtype,
        tensor_cores: bool,
        out: DevPtr,
        out_stride: usize,
        q: DevPtr,
        q_stride: usize,
        query_start: DevPtr,
        max_q: usize,
        a: &PagedAttention,
    ) -> Result<(), CudaError> {
        check(a)?;
        let bucket = head_bucket(a.head_dim)?;
        // Tensor cores need the head size the kernel was instantiated for.
        let mma = tensor_cores && bucket == a.head_dim;
        let name = match (bucket, dtype, mma) {
            (64, Dtype::F16, true) => "attention_prefill_mma_hd64_f16",
            (64, Dtype::Bf16, true) => "attention_prefill_mma_hd64_bf16",
            (128, Dtype::F16, true) => "attention_prefill_mma_hd128_f16",
            (128, Dtype::Bf16, true) => "attention_prefill_mma_hd128_bf16",
            (_, Dtype::F16, true) => "attention_prefill_mma_hd256_f16",
            (_, Dtype::Bf16, true) => "attention_prefill_mma_hd256_bf16",
            (64, Dtype::F16, false) => "attention_prefill_hd64_f16",
            (64, Dtype::Bf16, false) => "attention_prefill_hd64_bf16",
            (128, Dtype::F16, false) => "attention_prefill_hd128_f16",
            (128, Dtype::Bf16, false) => "attention_prefill_hd128_bf16",
            (_, Dtype::F16, false) => "attention_prefill_hd256_f16",
            (_, Dtype::Bf16, false) => "attention_prefill_hd256_bf16",
        };
        // Query rows per block: 64 for the tensor-core kernel, 16 for the other.
        let rows_per_block = if mma { 64 } else { 16 };
        let mut args = vec![
            out.into(),
            i32_of("out_stride", out_stride)?,
            q.into(),
            i32_of("q_stride", q_stride)?,
        ];
        args.extend(common_args(a)?);
        args.extend([
            query_start.into(),
            a.context_lens.into(),
            i32_of("n_heads", a.n_heads)?,
            i32_of("kv_heads", a.kv_heads)?,
            i32_of("head_dim", a.head_dim)?,
            i32_of("block_size", a.block_size)?,
            Arg::F32(a.scale),
            Arg::F32(a.soft_cap),
            i32_of("window", a.window)?,
        ]);
        let grid = (
            max_q.div_ceil(rows_per_block).max(1) as u32,
            a.n_heads as u32,
            a.n_seqs as u32,
        );
        unsafe { self.launch(module_of(bucket), name, grid, 128, 0, &args) }
    }
}
