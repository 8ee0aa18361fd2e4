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
use ferrite_kernels::cuda::w8a8::{self, I8Device};
use ferrite_kernels::cuda::wq::{WqDevice, check_layout};
use ferrite_kernels::cuda::wq_mins::means_len;
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::w8a8::I8Matrix;
use ferrite_kernels::wq::gguf::GgufRepack;
use ferrite_kernels::wq::{Bits, WqFormat};
use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::{EngineModel, LlamaModel};
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

/// A projection's host side, made before any device work: `parts` stacked row-wise, minimums
/// too, in the weight-only layout when every part has one, they stack (`GgufRepack::stack`:
/// the same format up to the code width) and the kernels can read its rows; else the parts,
/// converted row by row when copied.
pub(crate) enum HostMatrix<'a> {
    Dense(Vec<&'a Matrix>),
    Quantized(GgufRepack),
    /// W8A8: int8 codes with a scale per row, for the int8 kernels (`Gpu::w8a8_matmul`).
    Int8(I8Matrix),
}

impl<'a> HostMatrix<'a> {
    /// Repacks or stacks `parts` (CPU work: GGUF blocks are rewritten code by code, which is
    /// why the model's matrices are prepared in parallel).
    pub fn prepare(parts: &[&'a Matrix]) -> Self {
        let int8: Option<Vec<&I8Matrix>> = parts.iter().map(|m| m.as_i8()).collect();
        let int8 = int8.and_then(|p| I8Matrix::stack(&p));
        if let Some(m) = int8.filter(|m| w8a8::check_layout(m.cols()).is_ok()) {
            return Self::Int8(m);
        }
        let views: Option<Vec<_>> = parts.iter().map(|m| m.as_wq()).collect();
        let stacked = views.and_then(|v| {
            let parts: Vec<_> = v
                .iter()
                .map(|p| (p.matrix.as_ref(), p.mins.as_deref()))
                .collect();
            GgufRepack::stack(&parts)
        });
        let readable = |r: &GgufRepack| check_layout(&r.matrix.format(), r.matrix.cols()).is_ok();
        match stacked.filter(readable) {
            Some(r) => Self::Quantized(r),
            None => Self::Dense(parts.to_vec()),
        }
    }
}

/// A projection's weights on the device: dense in the model's 16-bit type, or weight-only
/// quantized codes (RTN/GPTQ matrices as they are, GGUF block types repacked) that the
/// quantized kernels read.
// Four per layer, made once at load and only ever borrowed: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum DeviceMatrix {
    Dense(DeviceTensor),
    Quantized {
        /// The buffers `w` points into, kept alive.
        codes: CudaSlice<u8>,
        scales: DeviceTensor,
        zeros: Option<CudaSlice<u8>>,
        /// Per-group minimums (`rows * groups`, the model's type) added after the quantized
        /// product (GGUF Q4_1, Q4_K, Q5_K: `Gpu::wq_add_mins`).
        mins: Option<DeviceTensor>,
        w: WqDevice,
    },
    Int8 {
        /// The buffers `w` points into, kept alive.
        codes: CudaSlice<u8>,
        scales: CudaSlice<f32>,
        w: I8Device,
    },
}

impl DeviceMatrix {
    /// `host` on the device. The large buffers (dense values, codes) are allocated now and
    /// filled when `jobs` run.
    pub fn upload<'a>(
        gpu: &Gpu,
        dtype: Dtype,
        host: HostMatrix<'a>,
        jobs: &mut Jobs<'a>,
    ) -> Result<Self> {
        let GgufRepack { matrix: m, mins } = match host {
            HostMatrix::Dense(parts) => {
                return DeviceTensor::stacked(gpu, dtype, &parts, jobs).map(Self::Dense);
            }
            HostMatrix::Quantized(r) => r,
            HostMatrix::Int8(m) => return Self::int8(gpu, m, jobs),
        };
        let f = m.format();
        let scales = DeviceTensor::from_f32(gpu, dtype, m.scales())?;
        let mins = match mins {
            Some(v) => Some(DeviceTensor::from_f32(gpu, dtype, &v)?),
            None => None,
        };
        // 3-bit codes run on the 4-bit kernels, whose symmetric zero is 8, not 4: they are given
        // their zeros (all 4) as zero points instead.
        let zeros = if f.zero_point || f.bits == Bits::B3 {
            Some(gpu.upload(&m.zeros()).map_err(gpu_error)?)
        } else {
            None
        };
        let (rows, cols) = (m.rows(), m.cols());
        let codes = gpu.zeros::<u8>(m.packed_codes().len()).map_err(gpu_error)?;
        if !m.packed_codes().is_empty() {
            jobs.push(UploadJob {
                dst: gpu.ptr(&codes),
                bytes: m.packed_codes().len(),
                unit: 1,
                fill: Box::new(move |offset, out| {
                    out.copy_from_slice(&m.packed_codes()[offset..offset + out.len()]);
                }),
            });
        }
        Ok(Self::quantized(gpu, f, rows, cols, codes, scales, zeros).with_mins(mins))
    }

    /// An int8 matrix: its scales copied now, its codes when `jobs` run.
    fn int8<'a>(gpu: &Gpu, m: I8Matrix, jobs: &mut Jobs<'a>) -> Result<Self> {
        let (rows, cols) = (m.rows(), m.cols());
        let scales = gpu.upload(m.scales()).map_err(gpu_error)?;
        let codes = gpu.zeros::<u8>(rows * cols).map_err(gpu_error)?;
        let w = I8Device {
            codes: gpu.ptr(&codes),
            scales: gpu.ptr(&scales),
            rows,
            cols,
        };
        if rows > 0 {
            jobs.push(UploadJob {
                dst: w.codes,
                bytes: rows * cols,
                unit: cols,
                fill: Box::new(move |offset, out| {
                    for (k, row) in out.chunks_exact_mut(cols).enumerate() {
                        let codes = m.row_codes(offset / cols + k);
                        for (o, q) in row.iter_mut().zip(codes) {
                            *o = q as u8;
                        }
                    }
                }),
            });
        }
        Ok(Self::Int8 { codes, scales, w })
    }

    /// This matrix with per-group minimums (none for a dense one).
    fn with_mins(mut self, added: Option<DeviceTensor>) -> Self {
        if let Self::Quantized { mins, .. } = &mut self {
            *mins = added;
        }
        self
    }

    /// A quantized matrix of `format` over its device buffers, without minimums.
    fn quantized(
        gpu: &Gpu,
        format: WqFormat,
        rows: usize,
        cols: usize,
        codes: CudaSlice<u8>,
        scales: DeviceTensor,
        zeros: Option<CudaSlice<u8>>,
    ) -> Self {
        let w = WqDevice {
            codes: gpu.ptr(&codes),
            scales: scales.ptr,
            zeros: zeros.as_ref().map(|z| gpu.ptr(z)),
            bits: format.bits,
            rows,
            cols,
            group_size: format.group_len(cols),
        };
        Self::Quantized {
            codes,
            scales,
            zeros,
            mins: None,
            w,
        }
    }

    /// A random `[rows, cols]` matrix made on the device: dense, or codes of `format`
    /// (scales small and positive, zero points within the code range).
    pub fn random(
        gpu: &Gpu,
        dtype: Dtype,
        rows: usize,
        cols: usize,
        format: Option<WqFormat>,
        seed: u64,
    ) -> Result<Self> {
        let scale = 1.0 / (cols as f32).sqrt();
        let Some(f) = format.filter(|f| check_layout(f, cols).is_ok()) else {
            return DeviceTensor::random(gpu, dtype, rows * cols, seed, scale, 0.0)
                .map(Self::Dense);
        };
        let groups = rows * f.groups_per_row(cols);
        let code_bytes = rows * cols * f.bits.storage() as usize / 8;
        let bytes_of = |n: usize, seed: u64, mask: u8| -> Result<CudaSlice<u8>> {
            let buf = gpu.zeros::<u8>(n).map_err(gpu_error)?;
            // SAFETY: `buf` holds `n` bytes.
            #[allow(unsafe_code)]
            unsafe { gpu.fill_bytes(gpu.ptr(&buf), n, seed, mask) }.map_err(gpu_error)?;
            Ok(buf)
        };
        let codes = bytes_of(code_bytes, seed, 0xFF)?;
        let scales = DeviceTensor::random(gpu, dtype, groups, seed + 1, scale / 16.0, scale / 8.0)?;
        let zeros = if f.zero_point {
            Some(bytes_of(groups, seed + 2, f.bits.max_code())?)
        } else {
            None
        };
        Ok(Self::quantized(gpu, f, rows, cols, codes, scales, zeros))
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Dense(t) => 2 * t.len,
            Self::Quantized {
                codes,
                scales,
                zeros,
                mins,
                ..
            } => {
                codes.len()
                    + 2 * scales.len
                    + zeros.as_ref().map_or(0, |z| z.len())
                    + mins.as_ref().map_or(0, |m| 2 * m.len)
            }
            Self::Int8 { codes, scales, .. } => codes.len() + 4 * scales.len(),
        }
    }

    /// Columns of the int8 activations the W8A8 kernels round a step's rows to (0 if none).
    pub fn int8_cols(&self) -> usize {
        match self {
            Self::Int8 { w, .. } => w.cols,
            _ => 0,
        }
    }

    /// Elements of the dense matrix a quantized one expands to for large batches (0 if dense).
    pub fn dequantized_len(&self) -> usize {
        match self {
            Self::Dense(_) | Self::Int8 { .. } => 0,
            Self::Quantized { w, .. } => w.rows * w.cols,
        }
    }

    /// Group means per row of activations that the minimums' correction needs (0 without
    /// minimums): the scratch `Gpu::wq_add_mins` takes.
    pub fn means_per_row(&self) -> usize {
        match self {
            Self::Quantized {
                w, mins: Some(_), ..
            } => means_len(w, 1),
            _ => 0,
        }
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
    pub cfg: ModelConfig,
    pub embed: DeviceTensor,
    /// `None`: tied to `embed`.
    pub lm_head: Option<DeviceTensor>,
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
                    HostMatrix::prepare(&[&l.q, &l.k, &l.v]),
                    HostMatrix::prepare(&[&l.o]),
                    HostMatrix::prepare(&[&l.gate, &l.up]),
                    HostMatrix::prepare(&[&l.down]),
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
        let tied = model.lm_head.same_storage(&model.embed);
        let lm_head = if tied {
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
        let w = Self::assemble(gpu, dtype, cfg, &model.rope, [embed, norm], lm_head, layers)?;
        Ok((w, jobs))
    }

    /// Random weights of `cfg`'s shape made on the device (`quantize`: the layers'
    /// projections as codes of that format), without a checkpoint or host copies: speed
    /// measurements of models larger than host memory.
    pub fn dummy(
        gpu: Arc<Gpu>,
        dtype: Dtype,
        cfg: &ModelConfig,
        quantize: Option<WqFormat>,
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

    /// The LM head's device address (the embedding table when tied).
    pub fn lm_head(&self) -> DevPtr {
        self.lm_head.as_ref().unwrap_or(&self.embed).ptr
    }
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
