//! A loaded model's weights copied to the GPU in its 16-bit type, with the projections that
//! read the same input fused at load: q, k and v into one `[q + 2·kv, hidden]` matrix, gate
//! and up into one `[2·ffn, hidden]`, so each is one cuBLAS call.
//!
//! Copying is planned, then run in one go: [`GpuWeights::upload`] prepares every matrix's host
//! side in parallel (repacking GGUF blocks, stacking fused parts: [`HostMatrix`]), allocates
//! every device buffer and describes each matrix's bytes as an [`UploadJob`] (which rows of
//! which host tensors, converted how); the caller then runs all the jobs through the pinned,
//! multi-lane uploader (`Gpu::upload_jobs`), so reading the checkpoint, converting and copying
//! overlap across the whole model rather than tensor by tensor.
//!
//! F16 and BF16 tensors of the checkpoint's own type go over as they are mapped; any other
//! weight-only quantized matrix (RTN or GPTQ codes, GGUF block types repacked with their
//! per-group minimums) stays quantized for the quantized kernels; the other 16-bit type and
//! F32 are converted row by row on the CPU first.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use ferrite_formats::LoadQuantize;
use ferrite_kernels::cpu::matmul::Weight;
use ferrite_kernels::cpu::rope::{Rope, RopePairing};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_kernels::quant::GgmlType;
use ferrite_model::config::ModelConfig;
use ferrite_model::error::{ModelError, Result};
use ferrite_model::moe::moe_unsupported;
use ferrite_model::tp::TpRank;
use ferrite_model::{EngineModel, LlamaModel};
use rayon::prelude::*;

use super::matrix::{DeviceMatrix, HostMatrix};
use super::tensor::{DeviceTensor, Jobs, gpu_error};

/// One decoder layer on the device.
pub(crate) struct GpuLayer {
    pub attn_norm: DeviceTensor,
    /// `[q_dim + 2 kv_dim, hidden]`.
    pub qkv: DeviceMatrix,
    pub qkv_bias: Option<DeviceTensor>,
    pub qk_norm: Option<[DeviceTensor; 2]>,
    pub o: DeviceMatrix,
    pub post_norms: Option<[DeviceTensor; 2]>,
    pub ffn_norm: DeviceTensor,
    /// `[2 ffn, hidden]`: gate rows, then up rows.
    pub gate_up: DeviceMatrix,
    pub down: DeviceMatrix,
}

impl GpuLayer {
    pub fn matrices(&self) -> [&DeviceMatrix; 4] {
        [&self.qkv, &self.o, &self.gate_up, &self.down]
    }
}

/// Every weight of a model on the device.
pub(crate) struct GpuWeights {
    pub gpu: Arc<Gpu>,
    pub dtype: Dtype,
    /// The shard's shape (the whole model's for a pool of one; the vocabulary always whole).
    pub cfg: ModelConfig,
    /// Which shard of the model these are.
    pub tp: TpRank,
    pub embed: DeviceTensor,
    /// `None`: tied to `embed`.
    pub lm_head: Option<DeviceTensor>,
    /// The LM head's rows here: the vocabulary, or this rank's part of it.
    pub head_rows: usize,
    pub norm: DeviceTensor,
    pub layers: Vec<GpuLayer>,
    /// The layers' rotary frequencies; Gemma 3's sliding layers have their own.
    pub rope: DeviceRope,
    pub local_rope: Option<DeviceRope>,
    pub adjacent_rope: bool,
}

/// A rotary embedding's frequencies on the device (kept alive here; kernels get
/// `inv_freq_ptr`), its position scale and its cos/sin scale.
#[derive(Debug)]
pub struct DeviceRope {
    _inv_freq: CudaSlice<f32>,
    pub inv_freq_ptr: DevPtr,
    pub position_scale: f32,
    pub scale: f32,
}

impl DeviceRope {
    fn upload(gpu: &Gpu, rope: &Rope) -> Result<Self> {
        let inv_freq = gpu.upload(&rope.inv_freq).map_err(gpu_error)?;
        Ok(Self {
            inv_freq_ptr: gpu.ptr(&inv_freq),
            _inv_freq: inv_freq,
            position_scale: rope.position_scale,
            scale: rope.scale,
        })
    }
}

impl GpuWeights {
    /// The rotary embedding of layer `index`: the sliding layers' own where there is one.
    pub fn rope_of(&self, index: usize) -> &DeviceRope {
        match &self.local_rope {
            Some(local) if self.cfg.local_rope_at(index) => local,
            _ => &self.rope,
        }
    }

    /// `model`'s weights on `gpu` as `dtype`: every buffer allocated (the small vectors
    /// already copied), and the jobs that copy the matrices, to be run by
    /// `Gpu::upload_jobs` before the weights are used.
    pub fn upload(gpu: Arc<Gpu>, dtype: Dtype, model: &LlamaModel) -> Result<(Self, Jobs<'_>)> {
        let cfg = model.config().clone();
        cfg.gpu_check()?;
        let g = gpu.as_ref();
        let mut jobs = Vec::new();
        let host: Vec<[HostMatrix<'_>; 4]> = model
            .layers()
            .par_iter()
            .map(|l| {
                let f = l
                    .mlp
                    .dense()
                    .ok_or_else(|| moe_unsupported("the GPU runner"))?;
                Ok([
                    HostMatrix::prepare(&[&l.q, &l.k, &l.v], &g.arch),
                    HostMatrix::prepare(&[&l.o], &g.arch),
                    HostMatrix::prepare(&[&f.gate, &f.up], &g.arch),
                    HostMatrix::prepare(&[&f.down], &g.arch),
                ])
            })
            .collect::<Result<_>>()?;
        let vec = |v: &[f32]| DeviceTensor::from_f32(g, dtype, v);
        let mut layers = Vec::with_capacity(model.layers().len());
        for (l, [qkv, o, gate_up, down]) in model.layers().iter().zip(host) {
            let qkv_bias = match &l.qkv_bias {
                Some([bq, bk, bv]) => Some(vec(&[bq.as_slice(), bk, bv].concat())?),
                None => None,
            };
            let pair = |p: &Option<[Vec<f32>; 2]>| -> Result<Option<[DeviceTensor; 2]>> {
                Ok(match p {
                    Some([a, b]) => Some([vec(a)?, vec(b)?]),
                    None => None,
                })
            };
            // `gpu_check` refused a model without them (OLMo 2).
            let pre_norm = |n: &Option<Vec<f32>>| match n {
                Some(w) => vec(w),
                None => Err(ModelError::BadConfig(
                    "the GPU runner needs the norms before attention and the MLP".into(),
                )),
            };
            let layer = GpuLayer {
                attn_norm: pre_norm(&l.attn_norm)?,
                qkv: DeviceMatrix::upload(g, dtype, qkv, &mut jobs)?,
                qkv_bias,
                qk_norm: pair(&l.qk_norm)?,
                o: DeviceMatrix::upload(g, dtype, o, &mut jobs)?,
                post_norms: pair(&l.post_norms)?,
                ffn_norm: pre_norm(&l.ffn_norm)?,
                gate_up: DeviceMatrix::upload(g, dtype, gate_up, &mut jobs)?,
                down: DeviceMatrix::upload(g, dtype, down, &mut jobs)?,
            };
            layers.push(layer);
        }
        let embed = DeviceTensor::stacked(g, dtype, &[model.embed()], &mut jobs)?;
        let lm_head = if head_is_embedding(model) {
            None
        } else {
            Some(DeviceTensor::stacked(
                g,
                dtype,
                &[model.lm_head()],
                &mut jobs,
            )?)
        };
        let norm = vec(model.norm())?;
        let mut w = Self::assemble(
            gpu,
            dtype,
            cfg,
            (model.rope(), model.local_rope()),
            [embed, norm],
            lm_head,
            layers,
        )?;
        w.tp = model.tp();
        w.head_rows = model.lm_head().rows;
        Ok((w, jobs))
    }

    /// Random weights of `cfg`'s shape made on the device (`quantize`: the layers'
    /// projections as codes of that format), without a checkpoint or host copies: speed
    /// measurements of models larger than host memory.
    pub fn dummy(
        gpu: Arc<Gpu>,
        dtype: Dtype,
        cfg: &ModelConfig,
        quantize: Option<LoadQuantize>,
        seed: u64,
    ) -> Result<Self> {
        let g = gpu.as_ref();
        let (h, q, kv, ff) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let mut next = seed.wrapping_mul(1_000_003);
        let mut seed = || {
            next += 16;
            next
        };
        let norm = |s| DeviceTensor::random(g, dtype, h, s, 0.1, 1.0);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for _ in 0..cfg.num_layers {
            let mat = |rows, cols, s| DeviceMatrix::random(g, dtype, rows, cols, quantize, s);
            let layer = GpuLayer {
                attn_norm: norm(seed())?,
                qkv: mat(q + 2 * kv, h, seed())?,
                qkv_bias: None,
                qk_norm: None,
                o: mat(h, q, seed())?,
                post_norms: if cfg.post_norms {
                    Some([norm(seed())?, norm(seed())?])
                } else {
                    None
                },
                ffn_norm: norm(seed())?,
                gate_up: mat(2 * ff, h, seed())?,
                down: mat(h, ff, seed())?,
            };
            layers.push(layer);
        }
        let embed = DeviceTensor::random(g, dtype, cfg.vocab_size * h, seed(), 1.0, 0.0)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            let scale = 1.0 / (h as f32).sqrt();
            Some(DeviceTensor::random(
                g,
                dtype,
                cfg.vocab_size * h,
                seed(),
                scale,
                0.0,
            )?)
        };
        let rope = cfg.rope(None, cfg.default_context());
        let local = cfg.local_rope();
        let final_norm = norm(seed())?;
        Self::assemble(
            gpu,
            dtype,
            cfg.clone(),
            (&rope, local.as_ref()),
            [embed, final_norm],
            lm_head,
            layers,
        )
    }

    /// The weights from their parts (`[embedding table, final norm]`), with the rotary
    /// frequencies (and the sliding layers' own, if any) copied to the device.
    fn assemble(
        gpu: Arc<Gpu>,
        dtype: Dtype,
        cfg: ModelConfig,
        (rope, local): (&Rope, Option<&Rope>),
        [embed, norm]: [DeviceTensor; 2],
        lm_head: Option<DeviceTensor>,
        layers: Vec<GpuLayer>,
    ) -> Result<Self> {
        let local_rope = local.map(|l| DeviceRope::upload(&gpu, l)).transpose()?;
        Ok(Self {
            rope: DeviceRope::upload(&gpu, rope)?,
            local_rope,
            tp: TpRank::SOLO,
            head_rows: cfg.vocab_size,
            embed,
            lm_head,
            norm,
            layers,
            adjacent_rope: rope.pairing == RopePairing::Adjacent,
            cfg,
            dtype,
            gpu,
        })
    }

    /// Bytes of weights on the device (what a decode step streams).
    pub fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .flat_map(|l| l.matrices())
            .map(DeviceMatrix::bytes)
            .sum();
        layers + 2 * (self.embed.len + self.lm_head.as_ref().map_or(0, |t| t.len))
    }

    /// The largest `f` over every layer's projections (0 without layers): what a scratch
    /// buffer shared by all of them must hold.
    pub fn largest(&self, f: fn(&DeviceMatrix) -> usize) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.matrices())
            .map(f)
            .max()
            .unwrap_or(0)
    }

    /// The LM head's device address (the embedding table when tied).
    pub fn lm_head(&self) -> DevPtr {
        self.lm_head.as_ref().unwrap_or(&self.embed).ptr
    }
}

/// Whether `model`'s LM head is its embedding table itself (tied, and whole): then the
/// device holds one copy. A rank's part of a tied head starts where the table does on rank 0,
/// the same storage but fewer rows: that part gets a copy of its own.
pub(crate) fn head_is_embedding(model: &LlamaModel) -> bool {
    model.lm_head().same_storage(model.embed()) && model.lm_head().rows == model.embed().rows
}

/// The 16-bit type a model runs in on the GPU: the checkpoint's own where it is BF16, else F16
/// (random weights too).
pub fn default_dtype(model: &EngineModel) -> Dtype {
    match model {
        EngineModel::Host(m) => match m.embed().view() {
            Weight::Ggml(v) if v.ty == GgmlType::BF16 => Dtype::Bf16,
            _ => Dtype::F16,
        },
        EngineModel::DeviceRandom(_) | EngineModel::Encoder(_) => Dtype::F16,
    }
}
