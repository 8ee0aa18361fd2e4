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
use ferrite_kernels::cpu::matmul::Weight;
use ferrite_kernels::cpu::rope::{Rope, RopePairing};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::upload::{Fill, UploadJob};
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_kernels::quant::GgmlType;
use rayon::prelude::*;

use super::matrix::{DeviceMatrix, HostMatrix};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::{EngineModel, LlamaModel, LoadQuantize};
use crate::tp::TpRank;
use crate::weights::Matrix;

/// A 16-bit tensor in device memory.
pub(crate) struct DeviceTensor {
    /// Keeps the allocation alive; kernels get [`Self::ptr`].
    _buf: CudaSlice<u16>,
    pub ptr: DevPtr,
    pub len: usize,
}

/// The copies a planned upload still has to run: their destinations are buffers of the
/// tensors planned with them.
pub(crate) type Jobs<'a> = Vec<UploadJob<'a>>;

impl DeviceTensor {
    fn upload(gpu: &Gpu, host: &[u16]) -> Result<Self> {
        let buf = gpu.upload(host).map_err(gpu_error)?;
        Ok(Self {
            ptr: gpu.ptr(&buf),
            len: host.len(),
            _buf: buf,
        })
    }

    /// `n` random values `offset + scale · u`, `u` uniform in [-1, 1), made on the device.
    pub fn random(
        gpu: &Gpu,
        dtype: Dtype,
        n: usize,
        seed: u64,
        scale: f32,
        offset: f32,
    ) -> Result<Self> {
        let buf = gpu.zeros::<u16>(n).map_err(gpu_error)?;
        let ptr = gpu.ptr(&buf);
        // SAFETY: `buf` holds `n` 16-bit elements.
        #[allow(unsafe_code)]
        unsafe { gpu.fill_uniform(dtype, ptr, n, seed, scale, offset) }.map_err(gpu_error)?;
        Ok(Self {
            _buf: buf,
            ptr,
            len: n,
        })
    }

    /// A vector of f32 (norm weights, biases) rounded to `dtype`.
    pub fn from_f32(gpu: &Gpu, dtype: Dtype, v: &[f32]) -> Result<Self> {
        let bits: Vec<u16> = v.iter().map(|&x| dtype.bits_of(x)).collect();
        Self::upload(gpu, &bits)
    }

    /// Several matrices of the same width stacked row-wise (a fused projection), allocated
    /// now and converted to `dtype` row by row when `jobs` run.
    pub fn stacked<'a>(
        gpu: &Gpu,
        dtype: Dtype,
        parts: &[&'a Matrix],
        jobs: &mut Jobs<'a>,
    ) -> Result<Self> {
        let cols = parts.first().map_or(0, |m| m.cols);
        let rows: usize = parts.iter().map(|m| m.rows).sum();
        let parts = parts.to_vec();
        let fill: Fill<'a> =
            Box::new(move |offset, out| fill_rows(&parts, dtype, offset / (2 * cols), out));
        Self::planned(gpu, rows * cols, 2 * cols, fill, jobs)
    }

    /// An `n`-element tensor allocated now, whose bytes `fill` writes (in pieces of whole
    /// `row_bytes`) when `jobs` run.
    fn planned<'a>(
        gpu: &Gpu,
        n: usize,
        row_bytes: usize,
        fill: Fill<'a>,
        jobs: &mut Jobs<'a>,
    ) -> Result<Self> {
        let buf = gpu.zeros::<u16>(n).map_err(gpu_error)?;
        let ptr = gpu.ptr(&buf);
        if n > 0 && row_bytes > 0 {
            jobs.push(UploadJob {
                dst: ptr,
                bytes: 2 * n,
                unit: row_bytes,
                fill,
            });
        }
        Ok(Self {
            _buf: buf,
            ptr,
            len: n,
        })
    }
}

/// Rows `first..` of `parts` stacked, as little-endian `dtype` values, into `out` (a whole
/// number of rows): the checkpoint's bytes as they are where its type is `dtype`, else each
/// row dequantized and rounded.
fn fill_rows(parts: &[&Matrix], dtype: Dtype, first: usize, out: &mut [u8]) {
    let Some(cols) = parts.first().map(|m| m.cols).filter(|&c| c > 0) else {
        return;
    };
    let mut row_f32 = Vec::new();
    for (k, row) in out.chunks_exact_mut(2 * cols).enumerate() {
        let (mut m, mut i) = (parts[0], first + k);
        for p in parts {
            m = p;
            if i < p.rows {
                break;
            }
            i -= p.rows;
        }
        match m.view() {
            Weight::Ggml(v) if v.ty == dtype_ggml(dtype) => row.copy_from_slice(v.row(i)),
            _ => {
                row_f32.resize(cols, 0.0);
                m.dequantize_row(i, &mut row_f32);
                for (o, &x) in row.chunks_exact_mut(2).zip(&row_f32) {
                    o.copy_from_slice(&dtype.bits_of(x).to_le_bytes());
                }
            }
        }
    }
}

/// The GGUF/safetensors storage type that is `dtype` bit for bit.
fn dtype_ggml(dtype: Dtype) -> GgmlType {
    match dtype {
        Dtype::F16 => GgmlType::F16,
        Dtype::Bf16 => GgmlType::BF16,
    }
}

pub(crate) fn gpu_error(e: ferrite_kernels::cuda::CudaError) -> EngineError {
    EngineError::Device(e.to_string())
}

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
    /// Keeps the RoPE frequencies alive; kernels get `inv_freq_ptr`.
    pub _inv_freq: CudaSlice<f32>,
    pub inv_freq_ptr: DevPtr,
    pub position_scale: f32,
    pub adjacent_rope: bool,
}

impl GpuWeights {
    /// `model`'s weights on `gpu` as `dtype`: every buffer allocated (the small vectors
    /// already copied), and the jobs that copy the matrices, to be run by
    /// `Gpu::upload_jobs` before the weights are used.
    pub fn upload(gpu: Arc<Gpu>, dtype: Dtype, model: &LlamaModel) -> Result<(Self, Jobs<'_>)> {
        let cfg = model.cfg.clone();
        let g = gpu.as_ref();
        let mut jobs = Vec::new();
        let host: Vec<[HostMatrix<'_>; 4]> = model
            .layers
            .par_iter()
            .map(|l| {
                [
                    HostMatrix::prepare(&[&l.q, &l.k, &l.v], &g.arch),
                    HostMatrix::prepare(&[&l.o], &g.arch),
                    HostMatrix::prepare(&[&l.gate, &l.up], &g.arch),
                    HostMatrix::prepare(&[&l.down], &g.arch),
                ]
            })
            .collect();
        let vec = |v: &[f32]| DeviceTensor::from_f32(g, dtype, v);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (l, [qkv, o, gate_up, down]) in model.layers.iter().zip(host) {
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
            let layer = GpuLayer {
                attn_norm: vec(&l.attn_norm)?,
                qkv: DeviceMatrix::upload(g, dtype, qkv, &mut jobs)?,
                qkv_bias,
                qk_norm: pair(&l.qk_norm)?,
                o: DeviceMatrix::upload(g, dtype, o, &mut jobs)?,
                post_norms: pair(&l.post_norms)?,
                ffn_norm: vec(&l.ffn_norm)?,
                gate_up: DeviceMatrix::upload(g, dtype, gate_up, &mut jobs)?,
                down: DeviceMatrix::upload(g, dtype, down, &mut jobs)?,
            };
            layers.push(layer);
        }
        let embed = DeviceTensor::stacked(g, dtype, &[&model.embed], &mut jobs)?;
        let lm_head = if head_is_embedding(model) {
            None
        } else {
            Some(DeviceTensor::stacked(
                g,
                dtype,
                &[&model.lm_head],
                &mut jobs,
            )?)
        };
        let norm = vec(&model.norm)?;
        let mut w = Self::assemble(gpu, dtype, cfg, &model.rope, [embed, norm], lm_head, layers)?;
        w.tp = model.tp;
        w.head_rows = model.lm_head.rows;
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
        let rope = crate::model::llama::build_rope(cfg, None);
        let final_norm = norm(seed())?;
        Self::assemble(
            gpu,
            dtype,
            cfg.clone(),
            &rope,
            [embed, final_norm],
            lm_head,
            layers,
        )
    }

    /// The weights from their parts (`[embedding table, final norm]`), with `rope`'s
    /// frequencies copied to the device.
    fn assemble(
        gpu: Arc<Gpu>,
        dtype: Dtype,
        cfg: ModelConfig,
        rope: &Rope,
        [embed, norm]: [DeviceTensor; 2],
        lm_head: Option<DeviceTensor>,
        layers: Vec<GpuLayer>,
    ) -> Result<Self> {
        let inv_freq = gpu.upload(&rope.inv_freq).map_err(gpu_error)?;
        Ok(Self {
            tp: TpRank::SOLO,
            head_rows: cfg.vocab_size,
            embed,
            lm_head,
            norm,
            layers,
            inv_freq_ptr: gpu.ptr(&inv_freq),
            _inv_freq: inv_freq,
            position_scale: rope.position_scale,
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
    model.lm_head.same_storage(&model.embed) && model.lm_head.rows == model.embed.rows
}

/// The 16-bit type a model runs in on the GPU: the checkpoint's own where it is BF16, else F16
/// (random weights too).
pub fn default_dtype(model: &EngineModel) -> Dtype {
    match model {
        EngineModel::Host(m) => match m.embed.view() {
            Weight::Ggml(v) if v.ty == GgmlType::BF16 => Dtype::Bf16,
            _ => Dtype::F16,
        },
        EngineModel::DeviceRandom(_) => Dtype::F16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::{TensorEntry, TensorMap};
    use ferrite_kernels::cuda::upload::pieces;
    use ferrite_kernels::mapped::MappedFile;

    /// An F16 `[3, 8]`, an F32 `[5, 8]` and a BF16 `[2, 8]` matrix in one in-memory file.
    fn three_matrices() -> Vec<Matrix> {
        let value = |i: usize| (i as f32 * 0.37).sin() * 3.0;
        let parts = [
            (GgmlType::F16, 3, 2),
            (GgmlType::F32, 5, 4),
            (GgmlType::BF16, 2, 2),
        ];
        let mut bytes = Vec::new();
        let mut map_entries = Vec::new();
        for (k, &(ty, rows, size)) in parts.iter().enumerate() {
            let start = bytes.len();
            for i in 0..rows * 8 {
                let x = value(100 * k + i);
                match ty {
                    GgmlType::F16 => bytes.extend(half::f16::from_f32(x).to_le_bytes()),
                    GgmlType::BF16 => bytes.extend(half::bf16::from_f32(x).to_le_bytes()),
                    _ => bytes.extend(x.to_le_bytes()),
                }
            }
            assert_eq!(bytes.len() - start, rows * 8 * size);
            let entry = TensorEntry {
                ty,
                shape: vec![rows, 8],
                file: 0,
                start,
                end: bytes.len(),
            };
            map_entries.push((format!("m{k}"), entry));
        }
        let mut map = TensorMap::new(vec![Arc::new(MappedFile::from_vec(bytes))]);
        for (name, entry) in map_entries {
            map.insert(name, entry);
        }
        (0..3)
            .map(|k| map.matrix(&format!("m{k}")).expect("matrix"))
            .collect()
    }

    /// The stacked rows a fused upload writes, filled piece by piece as the uploader cuts
    /// them (pieces that straddle the parts' boundaries), are each part's rows converted to
    /// the device type; rows already of that type are copied bit for bit.
    #[test]
    fn stacked_rows_fill_in_pieces_across_parts() {
        let m = three_matrices();
        let parts: Vec<&Matrix> = m.iter().collect();
        let cols = 8;
        for dtype in [Dtype::F16, Dtype::Bf16] {
            let mut want = Vec::new();
            let mut row = vec![0f32; cols];
            for p in &parts {
                for i in 0..p.rows {
                    p.dequantize_row(i, &mut row);
                    want.extend(row.iter().flat_map(|&x| dtype.bits_of(x).to_le_bytes()));
                }
            }
            let total = want.len();
            let mut got = vec![0u8; total];
            // Three rows per piece: pieces start inside the first and second parts.
            for (_, offset, n) in pieces(&[(total, 2 * cols)], 3 * 2 * cols).expect("pieces") {
                fill_rows(
                    &parts,
                    dtype,
                    offset / (2 * cols),
                    &mut got[offset..offset + n],
                );
            }
            assert_eq!(got, want, "{}", dtype.name());
            let same = if dtype == Dtype::F16 { 0 } else { 2 };
            let Weight::Ggml(v) = parts[same].view() else {
                panic!("a mapped matrix")
            };
            let at = if same == 0 { 0 } else { 8 * 2 * cols };
            assert_eq!(&got[at..at + 2 * cols], v.row(0), "copied as stored");
        }
    }
}
