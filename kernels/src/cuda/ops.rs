//! Launch wrappers for the element-wise and row-wise kernels: embedding, RMSNorm (plain, fused
//! with the residual add, and Gemma 2's post-norm add), RoPE, SiLU/GELU-and-mul, the KV-cache
//! write, f32 ⇄ f16/bf16 conversion, soft-capping and sampling.
//!
//! Each wrapper checks what it can (sizes that must fit an `i32`, grid limits) and states the
//! rest as its safety contract: the pointers must address buffers of the stated extents.
//! Grids and block sizes follow the launch contract written above each kernel in
//! `kernels/cuda/`.

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};

/// The 16-bit float type of a model's activations and weights on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// `x` rounded to this type, as its bits.
    pub fn bits_of(self, x: f32) -> u16 {
        match self {
            Self::F16 => half::f16::from_f32(x).to_bits(),
            Self::Bf16 => half::bf16::from_f32(x).to_bits(),
        }
    }

    /// The value of `bits` of this type.
    pub fn value_of(self, bits: u16) -> f32 {
        match self {
            Self::F16 => half::f16::from_bits(bits).to_f32(),
            Self::Bf16 => half::bf16::from_bits(bits).to_f32(),
        }
    }
}

/// The entry point `<op>_<dtype>` of a kernel compiled for both 16-bit types.
macro_rules! entry {
    ($dtype:expr, $op:literal) => {
        match $dtype {
            Dtype::F16 => concat!($op, "_f16"),
            Dtype::Bf16 => concat!($op, "_bf16"),
        }
    };
}

/// `n` as a kernel's or cuBLAS's `i32` size.
pub(crate) fn to_i32(what: &str, n: usize) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Driver(format!("{what} = {n} does not fit an i32")))
}

/// `n` as a kernel's `i32` size argument.
pub(crate) fn i32_of(what: &str, n: usize) -> Result<Arg, CudaError> {
    to_i32(what, n).map(Arg::I32)
}

/// Blocks for a grid-stride loop over `n` items with `block` threads: enough to fill the
/// device several times over, never more than the items need.
fn stride_grid(n: usize, block: u32) -> u32 {
    n.div_ceil(block as usize).clamp(1, 132 * 16) as u32
}

/// The 2-D grid of the row-gather kernels (embedding, gated activations, KV write): x over
/// 2048-element chunks of a row (8 per thread of 256), y over rows, both grid-strided.
fn row_chunks_grid(width: usize, rows: usize) -> (u32, u32, u32) {
    (
        width.div_ceil(2048).max(1) as u32,
        rows.clamp(1, 65_535) as u32,
        1,
    )
}

/// Grid x for one block per row (the x dimension allows 2^31 - 1 blocks).
fn rows_grid(rows: usize) -> Result<u32, CudaError> {
    u32::try_from(rows.max(1))
        .ok()
        .filter(|&r| r <= i32::MAX as u32)
        .ok_or_else(|| CudaError::Driver(format!("{rows} rows exceed a grid")))
}

/// The RMSNorm variants of `norm.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// `out = norm(x)`.
    Plain,
    /// `residual += x; out = norm(residual)` (pre-norm blocks, fused).
    AddThenNorm,
    /// `residual += norm(x)` (Gemma 2's post-attention and post-FFN norms; `out` unused).
    NormThenAdd,
}

/// The shape and constants of an RMSNorm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormShape {
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
    /// Added to every weight (1.0 for Gemma's `(1 + w)` norms).
    pub weight_offset: f32,
}

/// The shape of a RoPE application over q and k heads in place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeShape {
    pub tokens: usize,
    pub q_stride: usize,
    pub k_stride: usize,
    pub n_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The dimensions of each head that rotate; 0: none (the launch only writes the cache).
    pub rope_dim: usize,
    pub position_scale: f32,
    /// Multiplies the rotation's cos and sin (YaRN's and LongRoPE's attention factor; 1
    /// otherwise).
    pub scale: f32,
    /// Pairs `(2i, 2i+1)` (llama.cpp NORM) instead of `(i, i + rope_dim/2)`.
    pub adjacent: bool,
}

/// Where [`Gpu::rope_then_cache`] writes a step's keys and values: one layer's K and V caches
/// (`[num_slots, kv_heads, head_dim]`), the V rows (`v_stride` apart) and each token's slot
/// (i32, < 0 for padding).
#[derive(Debug, Clone, Copy)]
pub struct CacheWrite {
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
    pub v: DevPtr,
    pub v_stride: usize,
    pub slots: DevPtr,
}

#[allow(unsafe_code)]
impl Gpu {
    /// Launches a kernel that walks `n` elements in a grid-stride loop of 256-thread blocks
    /// (the conversions, the soft cap, the random fills).
    ///
    /// # Safety
    /// As [`Gpu::launch`].
    unsafe fn launch_over(
        &self,
        module: &'static str,
        entry: &'static str,
        n: usize,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        unsafe { self.launch(module, entry, (stride_grid(n, 256), 1, 1), 256, 0, args) }
    }

    /// `out[t] = table[ids[t]] * scale`, rows of `hidden`.
    ///
    /// # Safety
    /// `out` holds `tokens * hidden` elements, `ids` `tokens` valid row indices of `table`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn embedding(
        &self,
        dtype: Dtype,
        out: DevPtr,
        table: DevPtr,
        ids: DevPtr,
        tokens: usize,
        hidden: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        let args = [
            out.into(),
            table.into(),
            ids.into(),
            i32_of("tokens", tokens)?,
            i32_of("hidden", hidden)?,
            Arg::F32(scale),
        ];
        let grid = row_chunks_grid(hidden, tokens);
        unsafe { self.launch("embedding", entry!(dtype, "embedding"), grid, 256, 0, &args) }
    }

    /// `ids[pairs[2i]] = drawn[pairs[2i + 1]]` for `i < n` (i32 throughout): a step's input
    /// ids that the step before it drew on the device. A draw outside `0..vocab` becomes 0.
    ///
    /// # Safety
    /// `pairs` holds `2n` i32, each first one an index into `ids` and each second one into
    /// `drawn`.
    pub unsafe fn carry_ids(
        &self,
        ids: DevPtr,
        drawn: DevPtr,
        pairs: DevPtr,
        n: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let args = [
            ids.into(),
            drawn.into(),
            pairs.into(),
            i32_of("carried ids", n)?,
            i32_of("vocab", vocab)?,
        ];
        unsafe { self.launch("embedding", "carry_ids", (1, 1, 1), 1024, 0, &args) }
    }

    /// RMSNorm of `shape.rows` rows (see [`NormKind`]). `x` rows are `x_stride` apart; `out`
    /// and `residual` rows are contiguous.
    ///
    /// # Safety
    /// Every pointer the kind uses addresses `rows` rows; `weight` holds `hidden` elements.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rms_norm(
        &self,
        dtype: Dtype,
        kind: NormKind,
        out: DevPtr,
        residual: DevPtr,
        x: DevPtr,
        x_stride: usize,
        weight: DevPtr,
        shape: NormShape,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract; nothing is rounded to int8.
        unsafe { self.rms_norm_int8(dtype, kind, out, residual, x, x_stride, weight, shape, None) }
    }

    /// [`Self::rms_norm`], and with `int8` = (codes, scales) its output rounded to int8 per
    /// row into those codes (`rows * hidden`) and scales (`rows` f32) in the same launch, as
    /// [`Self::w8a8_quantize`] would round it: the input of a W8A8 projection without a launch
    /// of its own. [`NormKind::NormThenAdd`], which writes no output, takes none.
    ///
    /// # Safety
    /// As [`Self::rms_norm`]; `int8`'s buffers hold `rows * hidden` codes and `rows` scales.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rms_norm_int8(
        &self,
        dtype: Dtype,
        kind: NormKind,
        out: DevPtr,
        residual: DevPtr,
        x: DevPtr,
        x_stride: usize,
        weight: DevPtr,
        shape: NormShape,
        int8: Option<(DevPtr, DevPtr)>,
    ) -> Result<(), CudaError> {
        if int8.is_some() && kind == NormKind::NormThenAdd {
            return Err(CudaError::Driver(
                "rms_norm_add writes no output to round to int8".into(),
            ));
        }
        let (q, q_scales) = int8.unwrap_or((DevPtr::NULL, DevPtr::NULL));
        let NormShape {
            rows,
            hidden,
            eps,
            weight_offset,
        } = shape;
        let mut tail = vec![
            i32_of("rows", rows)?,
            i32_of("hidden", hidden)?,
            Arg::F32(eps),
            Arg::F32(weight_offset),
        ];
        if kind != NormKind::NormThenAdd {
            tail.extend([Arg::from(q), Arg::from(q_scales)]);
        }
        let grid = (rows_grid(rows)?, 1, 1);
        // Wider rows get more threads per row (the kernel takes any multiple of 32).
        let block = if hidden > 4096 { 512 } else { 256 };
        let (name, head): (_, Vec<Arg>) = match kind {
            NormKind::Plain => (
                entry!(dtype, "rms_norm"),
                vec![
                    out.into(),
                    x.into(),
                    i32_of("x_stride", x_stride)?,
                    weight.into(),
                ],
            ),
            NormKind::AddThenNorm => (
                entry!(dtype, "add_rms_norm"),
                vec![out.into(), residual.into(), x.into(), weight.into()],
            ),
            NormKind::NormThenAdd => (
                entry!(dtype, "rms_norm_add"),
                vec![residual.into(), x.into(), weight.into()],
            ),
        };
        let args: Vec<Arg> = head.into_iter().chain(tail).collect();
        unsafe { self.launch("norm", name, grid, block, 0, &args) }
    }

    /// Rotates the first `rope_dim` dimensions of every q and k head by its token's position,
    /// in place. `inv_freq` holds `rope_dim / 2` f32 (scaling already applied), and
    /// `shape.scale` multiplies cos and sin.
    ///
    /// # Safety
    /// `q`/`k` address `tokens` rows at their strides; `positions` `tokens` i32.
    pub unsafe fn rope(
        &self,
        dtype: Dtype,
        q: DevPtr,
        k: DevPtr,
        positions: DevPtr,
        inv_freq: DevPtr,
        shape: RopeShape,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract; no cache is written.
        unsafe { self.rope_then_cache(dtype, q, k, positions, inv_freq, shape, None) }
    }

    /// [`Self::rope`], and in the same launch each token's rotated K row and its V row into
    /// the KV cache, as [`Self::kv_write`] writes them (`cache`; `None`: rope alone).
    ///
    /// # Safety
    /// As [`Self::rope`] and, with `cache`, [`Self::kv_write`] (`k` rows at `shape.k_stride`).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rope_then_cache(
        &self,
        dtype: Dtype,
        q: DevPtr,
        k: DevPtr,
        positions: DevPtr,
        inv_freq: DevPtr,
        shape: RopeShape,
        cache: Option<CacheWrite>,
    ) -> Result<(), CudaError> {
        let c = cache.unwrap_or(CacheWrite {
            k_cache: DevPtr::NULL,
            v_cache: DevPtr::NULL,
            v: DevPtr::NULL,
            v_stride: 0,
            slots: DevPtr::NULL,
        });
        let args = [
            q.into(),
            i32_of("q_stride", shape.q_stride)?,
            k.into(),
            i32_of("k_stride", shape.k_stride)?,
            positions.into(),
            inv_freq.into(),
            i32_of("tokens", shape.tokens)?,
            i32_of("n_heads", shape.n_heads)?,
            i32_of("kv_heads", shape.kv_heads)?,
            i32_of("head_dim", shape.head_dim)?,
            i32_of("rope_dim", shape.rope_dim)?,
            Arg::F32(shape.position_scale),
            Arg::F32(shape.scale),
            Arg::I32(shape.adjacent.into()),
            c.k_cache.into(),
            c.v_cache.into(),
            c.v.into(),
            i32_of("v_stride", c.v_stride)?,
            c.slots.into(),
        ];
        let grid = (rows_grid(shape.tokens)?, 1, 1);
        unsafe { self.launch("rope", entry!(dtype, "rope"), grid, 256, 0, &args) }
    }

    /// `out = act(gate) * up` over rows `[gate | up]` of `2 * d_ff`; GELU (tanh) when `gelu`,
    /// else SiLU.
    ///
    /// # Safety
    /// `gate_up` holds `tokens * 2 * d_ff` elements, `out` `tokens * d_ff`.
    pub unsafe fn gated_activation(
        &self,
        dtype: Dtype,
        gelu: bool,
        out: DevPtr,
        gate_up: DevPtr,
        tokens: usize,
        d_ff: usize,
    ) -> Result<(), CudaError> {
        let args = [
            out.into(),
            gate_up.into(),
            i32_of("tokens", tokens)?,
            i32_of("d_ff", d_ff)?,
        ];
        let name = if gelu {
            entry!(dtype, "gelu_tanh_mul")
        } else {
            entry!(dtype, "silu_mul")
        };
        let grid = row_chunks_grid(d_ff, tokens);
        unsafe { self.launch("activation", name, grid, 256, 0, &args) }
    }

    /// Writes each token's K and V rows (`kv_heads * head_dim`) to its slot of one layer's
    /// cache; a negative slot skips the token (batch padding).
    ///
    /// # Safety
    /// `k`/`v` address `tokens` rows at their strides, `slots` `tokens` i32 below the cache's
    /// slot count.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kv_write(
        &self,
        dtype: Dtype,
        k_cache: DevPtr,
        v_cache: DevPtr,
        k: DevPtr,
        k_stride: usize,
        v: DevPtr,
        v_stride: usize,
        slots: DevPtr,
        tokens: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        let args = [
            k_cache.into(),
            v_cache.into(),
            k.into(),
            i32_of("k_stride", k_stride)?,
            v.into(),
            i32_of("v_stride", v_stride)?,
            slots.into(),
            i32_of("tokens", tokens)?,
            i32_of("kv_heads", kv_heads)?,
            i32_of("head_dim", head_dim)?,
        ];
        let grid = row_chunks_grid(kv_heads * head_dim, tokens);
        unsafe { self.launch("kv_cache", entry!(dtype, "kv_write"), grid, 256, 0, &args) }
    }

    /// `x[t, j] += bias[j]` for the first `width` elements of `rows` rows `stride` apart
    /// (Qwen's QKV biases, on the fused QKV buffer).
    ///
    /// # Safety
    /// `x` addresses `rows` rows at `stride`; `bias` holds `width` elements.
    pub unsafe fn add_bias(
        &self,
        dtype: Dtype,
        x: DevPtr,
        stride: usize,
        bias: DevPtr,
        rows: usize,
        width: usize,
    ) -> Result<(), CudaError> {
        let args = [
            x.into(),
            i32_of("stride", stride)?,
            bias.into(),
            i32_of("rows", rows)?,
            i32_of("width", width)?,
        ];
        let grid = (rows_grid(rows)?, 1, 1);
        unsafe { self.launch("qkv", entry!(dtype, "qkv_bias"), grid, 256, 0, &args) }
    }

    /// RMSNorm of each of the first `heads` heads of `rows` rows `stride` apart, in place
    /// (Qwen3's q and k norms).
    ///
    /// # Safety
    /// `x` addresses `rows` rows at `stride`, each with `heads * head_dim` elements;
    /// `weight` holds `head_dim`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn head_rms_norm(
        &self,
        dtype: Dtype,
        x: DevPtr,
        stride: usize,
        weight: DevPtr,
        rows: usize,
        heads: usize,
        head_dim: usize,
        eps: f32,
        weight_offset: f32,
    ) -> Result<(), CudaError> {
        let args = [
            x.into(),
            i32_of("stride", stride)?,
            weight.into(),
            i32_of("rows", rows)?,
            i32_of("heads", heads)?,
            i32_of("head_dim", head_dim)?,
            Arg::F32(eps),
            Arg::F32(weight_offset),
        ];
        let grid = (stride_grid(rows * heads, 4), 1, 1);
        unsafe { self.launch("qkv", entry!(dtype, "head_rms_norm"), grid, 128, 0, &args) }
    }

    /// `out[i] = offset + scale · u` with `u` uniform in [-1, 1), a function of (`seed`, `i`):
    /// random weights made on the device.
    ///
    /// # Safety
    /// `out` addresses `n` elements of `dtype`.
    pub unsafe fn fill_uniform(
        &self,
        dtype: Dtype,
        out: DevPtr,
        n: usize,
        seed: u64,
        scale: f32,
        offset: f32,
    ) -> Result<(), CudaError> {
        let args = [
            out.into(),
            Arg::I64(n as i64),
            Arg::U64(seed),
            Arg::F32(scale),
            Arg::F32(offset),
        ];
        unsafe { self.launch_over("random", entry!(dtype, "fill_uniform"), n, &args) }
    }

    /// `n` random bytes, each `& mask` (quantized codes; zero points within their range).
    ///
    /// # Safety
    /// `out` addresses `n` bytes.
    pub unsafe fn fill_bytes(
        &self,
        out: DevPtr,
        n: usize,
        seed: u64,
        mask: u8,
    ) -> Result<(), CudaError> {
        let args = [
            out.into(),
            Arg::I64(n as i64),
            Arg::U64(seed),
            Arg::I32(mask.into()),
        ];
        unsafe { self.launch_over("random", "fill_bytes", n, &args) }
    }

    /// `n` f32 rounded into `dtype`.
    ///
    /// # Safety
    /// Both pointers address `n` elements.
    pub unsafe fn from_f32(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        n: usize,
    ) -> Result<(), CudaError> {
        let name = match dtype {
            Dtype::F16 => "f32_to_f16",
            Dtype::Bf16 => "f32_to_bf16",
        };
        let args = [out.into(), x.into(), Arg::I64(n as i64)];
        unsafe { self.launch_over("convert", name, n, &args) }
    }

    /// `n` elements of `dtype` widened to f32.
    ///
    /// # Safety
    /// Both pointers address `n` elements.
    pub unsafe fn to_f32(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        n: usize,
    ) -> Result<(), CudaError> {
        let name = match dtype {
            Dtype::F16 => "f16_to_f32",
            Dtype::Bf16 => "bf16_to_f32",
        };
        let args = [out.into(), x.into(), Arg::I64(n as i64)];
        unsafe { self.launch_over("convert", name, n, &args) }
    }

    /// `x = tanh(x / cap) * cap` over `n` f32 in place (Gemma 2's final logits).
    ///
    /// # Safety
    /// `x` addresses `n` f32.
    pub unsafe fn soft_cap(&self, x: DevPtr, n: usize, cap: f32) -> Result<(), CudaError> {
        let args = [x.into(), Arg::I64(n as i64), Arg::F32(cap)];
        unsafe { self.launch_over("convert", "soft_cap_f32", n, &args) }
    }
}
