//! A loaded model's weights copied to the GPU in its 16-bit type, with the projections that
//! read the same input fused at load: q, k and v into one `[q + 2·kv, hidden]` matrix, gate
//! and up into one `[2·ffn, hidden]`, so each is one cuBLAS call.
//!
//! F16 and BF16 tensors of the checkpoint's own type go over as they are mapped; any other
//! weight-only quantized matrix (RTN or GPTQ codes, GGUF Q8_0/Q4_0 repacked exactly) stays
//! quantized for the quantized kernels; any other storage (GGUF Q4_1/K-quants, the other
//! 16-bit type) is dequantized row by row on the CPU first.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use ferrite_kernels::cpu::matmul::Weight;
use ferrite_kernels::cpu::rope::{Rope, RopePairing};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::wq::{WqDevice, check_layout};
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::wq::{WqFormat, WqMatrix};
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

    /// Several matrices of the same width stacked row-wise (a fused projection).
    pub fn stacked(gpu: &Gpu, dtype: Dtype, parts: &[&Matrix]) -> Result<Self> {
        let cols = parts.first().map_or(0, |m| m.cols);
        let rows: usize = parts.iter().map(|m| m.rows).sum();
        let mut host = vec![0u16; rows * cols];
        let mut rest = host.as_mut_slice();
        for m in parts {
            let (head, tail) = rest.split_at_mut(m.rows * cols);
            fill(m, dtype, head);
            rest = tail;
        }
        Self::upload(gpu, &host)
    }
}

/// `m`'s elements as `dtype` bits into `out` (`rows * cols`).
fn fill(m: &Matrix, dtype: Dtype, out: &mut [u16]) {
    let same_type = matches!(
        (m.view(), dtype),
        (Weight::Ggml(v), Dtype::F16) if v.ty == GgmlType::F16
    ) || matches!(
        (m.view(), dtype),
        (Weight::Ggml(v), Dtype::Bf16) if v.ty == GgmlType::BF16
    );
    let cols = m.cols.max(1);
    if same_type && let Weight::Ggml(v) = m.view() {
        out.par_chunks_mut(cols).enumerate().for_each(|(i, row)| {
            for (o, b) in row.iter_mut().zip(v.row(i).chunks_exact(2)) {
                *o = u16::from_le_bytes([b[0], b[1]]);
            }
        });
        return;
    }
    out.par_chunks_mut(cols).enumerate().for_each_init(
        || vec![0f32; cols],
        |row_f32, (i, row)| {
            m.dequantize_row(i, row_f32);
            for (o, &x) in row.iter_mut().zip(row_f32.iter()) {
                *o = dtype.bits_of(x);
            }
        },
    );
}

/// A projection's weights on the device: dense in the model's 16-bit type, or weight-only
/// quantized codes (RTN/GPTQ matrices as they are, GGUF Q8_0/Q4_0 repacked) that the
/// quantized kernels read.
pub(crate) enum DeviceMatrix {
    Dense(DeviceTensor),
    Quantized {
        /// The buffers `w` points into, kept alive.
        codes: CudaSlice<u8>,
        scales: DeviceTensor,
        zeros: Option<CudaSlice<u8>>,
        w: WqDevice,
    },
}

impl DeviceMatrix {
    /// `parts` stacked row-wise: quantized when every part has the same weight-only format
    /// and the kernels can read its rows, else dense.
    pub fn upload(gpu: &Gpu, dtype: Dtype, parts: &[&Matrix]) -> Result<Self> {
        let wq: Option<Vec<_>> = parts.iter().map(|m| m.as_wq()).collect();
        let stacked =
            wq.and_then(|w| WqMatrix::stack(&w.iter().map(|c| c.as_ref()).collect::<Vec<_>>()));
        let Some(m) = stacked.filter(|m| check_layout(&m.format(), m.cols()).is_ok()) else {
            return DeviceTensor::stacked(gpu, dtype, parts).map(Self::Dense);
        };
        let f = m.format();
        let codes = gpu.upload(m.packed_codes()).map_err(gpu_error)?;
        let scales = DeviceTensor::from_f32(gpu, dtype, m.scales())?;
        let zeros = if f.zero_point {
            Some(gpu.upload(&m.zeros()).map_err(gpu_error)?)
        } else {
            None
        };
        Ok(Self::quantized(
            gpu,
            f,
            m.rows(),
            m.cols(),
            codes,
            scales,
            zeros,
        ))
    }

    /// A quantized matrix of `format` over its device buffers.
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
        let code_bytes = rows * cols * f.bits.get() as usize / 8;
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
                ..
            } => codes.len() + 2 * scales.len + zeros.as_ref().map_or(0, |z| z.len()),
        }
    }

    /// Elements of the dense matrix a quantized one expands to for large batches (0 if dense).
    pub fn dequantized_len(&self) -> usize {
        match self {
            Self::Dense(_) => 0,
            Self::Quantized { w, .. } => w.rows * w.cols,
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
    /// Copies `model`'s weights to `gpu` as `dtype`.
    pub fn upload(gpu: Arc<Gpu>, dtype: Dtype, model: &LlamaModel) -> Result<Self> {
        let cfg = model.cfg.clone();
        let g = gpu.as_ref();
        let vec = |v: &[f32]| DeviceTensor::from_f32(g, dtype, v);
        let mut layers = Vec::with_capacity(model.layers.len());
        for l in &model.layers {
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
                qkv: DeviceMatrix::upload(g, dtype, &[&l.q, &l.k, &l.v])?,
                qkv_bias,
                qk_norm: pair(&l.qk_norm)?,
                o: DeviceMatrix::upload(g, dtype, &[&l.o])?,
                post_norms: pair(&l.post_norms)?,
                ffn_norm: vec(&l.ffn_norm)?,
                gate_up: DeviceMatrix::upload(g, dtype, &[&l.gate, &l.up])?,
                down: DeviceMatrix::upload(g, dtype, &[&l.down])?,
            };
            layers.push(layer);
        }
        let embed = DeviceTensor::stacked(g, dtype, &[&model.embed])?;
        let tied = model.lm_head.same_storage(&model.embed);
        let lm_head = if tied {
            None
        } else {
            Some(DeviceTensor::stacked(g, dtype, &[&model.lm_head])?)
        };
        let norm = vec(&model.norm)?;
        Self::assemble(gpu, dtype, cfg, &model.rope, [embed, norm], lm_head, layers)
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
