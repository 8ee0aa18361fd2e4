//! A projection's weights on the way to the device ([`HostMatrix`], prepared on the host) and
//! on it ([`DeviceMatrix`]): dense 16-bit values for cuBLAS, or the codes and scales the
//! quantized kernels read (weight-only codes, W8A8 int8, FP8 on sm_89+).

use cudarc::driver::CudaSlice;
use ferrite_formats::{LoadQuantize, Matrix};
use ferrite_kernels::cuda::Gpu;
use ferrite_kernels::cuda::fp8::{self, Fp8Device};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::upload::UploadJob;
use ferrite_kernels::cuda::w8a8::{self, I8Device};
use ferrite_kernels::cuda::wq::{WqDevice, check_layout};
use ferrite_kernels::cuda::wq_mins::means_len;
use ferrite_kernels::fp8::{Fp8Activations, Fp8Matrix, Fp8Scales};
use ferrite_kernels::w8a8::I8Matrix;
use ferrite_kernels::wq::gguf::GgufRepack;
use ferrite_kernels::wq::{Bits, WqFormat};
use ferrite_model::error::Result;

use super::tensor::{DeviceTensor, Jobs, gpu_error};

/// A projection's host side, made before any device work: `parts` stacked row-wise in the
/// first layout that holds them all and whose kernels take their rows (W8A8 int8; FP8; the
/// weight-only layout with minimums, `GgufRepack::stack`: the same format up to the code
/// width); else the parts, converted to 16-bit row by row when copied.
pub(crate) enum HostMatrix<'a> {
    Dense(Vec<&'a Matrix>),
    Quantized(GgufRepack),
    /// W8A8: int8 codes with a scale per row, for the int8 kernels (`Gpu::w8a8_matmul`).
    Int8(I8Matrix),
    /// FP8: e4m3 codes and their scale grid, for the FP8 kernels (`Gpu::fp8_matmul`).
    Fp8(Fp8Matrix),
}

impl<'a> HostMatrix<'a> {
    /// Repacks or stacks `parts` (CPU work: GGUF blocks are rewritten code by code, which is
    /// why the model's matrices are prepared in parallel). FP8 takes its kernels where `arch`
    /// (e.g. `sm_90`) has them.
    pub fn prepare(parts: &[&'a Matrix], arch: &str) -> Self {
        let int8: Option<Vec<&I8Matrix>> = parts.iter().map(|m| m.as_i8()).collect();
        let int8 = int8.and_then(|p| I8Matrix::stack(&p));
        if let Some(m) = int8.filter(|m| w8a8::check_layout(m.cols()).is_ok()) {
            return Self::Int8(m);
        }
        let fp8: Option<Vec<&Fp8Matrix>> = parts.iter().map(|m| m.as_fp8()).collect();
        let fp8 = fp8
            .and_then(|p| Fp8Matrix::stack(&p))
            .filter(|m| fp8::check_layout(arch, m.layout(), m.activations(), m.cols()).is_ok());
        if let Some(m) = fp8 {
            return Self::Fp8(m);
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

/// A projection's weights on the device: dense in the model's 16-bit type, weight-only
/// quantized codes (RTN/GPTQ matrices as they are, GGUF block types repacked), or int8 and
/// e4m3 codes with f32 scales, each read by its kernels.
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
    Fp8 {
        /// The buffers `w` points into, kept alive.
        codes: CudaSlice<u8>,
        scales: CudaSlice<f32>,
        w: Fp8Device,
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
            HostMatrix::Fp8(m) => return Self::fp8(gpu, m, jobs),
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

    /// An FP8 matrix: its scales copied now, its codes when `jobs` run.
    fn fp8<'a>(gpu: &Gpu, m: Fp8Matrix, jobs: &mut Jobs<'a>) -> Result<Self> {
        let (layout, scales) = fp8::device_scales(&m);
        let scales = gpu.upload(&scales).map_err(gpu_error)?;
        let codes = gpu.zeros::<u8>(m.codes().len()).map_err(gpu_error)?;
        let w = Fp8Device {
            codes: gpu.ptr(&codes),
            scales: gpu.ptr(&scales),
            layout,
            act: m.activations(),
            rows: m.rows(),
            cols: m.cols(),
        };
        if !m.codes().is_empty() {
            jobs.push(UploadJob {
                dst: w.codes,
                bytes: m.codes().len(),
                unit: 1,
                fill: Box::new(move |offset, out| {
                    out.copy_from_slice(&m.codes()[offset..offset + out.len()]);
                }),
            });
        }
        Ok(Self::Fp8 { codes, scales, w })
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

    /// A random `[rows, cols]` matrix made on the device: dense, or codes as `quantize` says
    /// where the kernels take them (scales small and positive, zero points within the code
    /// range, no NaN among FP8 codes).
    pub fn random(
        gpu: &Gpu,
        dtype: Dtype,
        rows: usize,
        cols: usize,
        quantize: Option<LoadQuantize>,
        seed: u64,
    ) -> Result<Self> {
        let scale = 1.0 / (cols as f32).sqrt();
        let bytes_of = |n: usize, seed: u64, mask: u8| -> Result<CudaSlice<u8>> {
            let buf = gpu.zeros::<u8>(n).map_err(gpu_error)?;
            // SAFETY: `buf` holds `n` bytes.
            #[allow(unsafe_code)]
            unsafe { gpu.fill_bytes(gpu.ptr(&buf), n, seed, mask) }.map_err(gpu_error)?;
            Ok(buf)
        };
        // Per-row f32 scales of W8A8 and FP8: codes up to `top` become values up to `scale`.
        let row_scales = |top: f32| gpu.upload(&vec![scale / top; rows]).map_err(gpu_error);
        let fp8_layout = (Fp8Scales::Channel, Fp8Activations::DynamicPerToken);
        match quantize {
            Some(LoadQuantize::Weights(f)) if check_layout(&f, cols).is_ok() => {
                let groups = rows * f.groups_per_row(cols);
                let codes = bytes_of(rows * cols * f.bits.storage() as usize / 8, seed, 0xFF)?;
                let scales =
                    DeviceTensor::random(gpu, dtype, groups, seed + 1, scale / 16.0, scale / 8.0)?;
                let zeros = match f.zero_point {
                    true => Some(bytes_of(groups, seed + 2, f.bits.max_code())?),
                    false => None,
                };
                Ok(Self::quantized(gpu, f, rows, cols, codes, scales, zeros))
            }
            Some(LoadQuantize::W8A8) if w8a8::check_layout(cols).is_ok() => {
                let (codes, scales) = (bytes_of(rows * cols, seed, 0xFF)?, row_scales(128.0)?);
                let (c, s) = (gpu.ptr(&codes), gpu.ptr(&scales));
                let w = I8Device {
                    codes: c,
                    scales: s,
                    rows,
                    cols,
                };
                Ok(Self::Int8 { codes, scales, w })
            }
            Some(LoadQuantize::Fp8)
                if fp8::check_layout(&gpu.arch, fp8_layout.0, fp8_layout.1, cols).is_ok() =>
            {
                // Mask 0xF7 keeps the exponent below 15: no NaN code, values up to ±240.
                let (codes, scales) = (bytes_of(rows * cols, seed, 0xF7)?, row_scales(240.0)?);
                let w = Fp8Device {
                    codes: gpu.ptr(&codes),
                    scales: gpu.ptr(&scales),
                    layout: fp8_layout.0,
                    act: fp8_layout.1,
                    rows,
                    cols,
                };
                Ok(Self::Fp8 { codes, scales, w })
            }
            _ => DeviceTensor::random(gpu, dtype, rows * cols, seed, scale, 0.0).map(Self::Dense),
        }
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
            Self::Int8 { codes, scales, .. } | Self::Fp8 { codes, scales, .. } => {
                codes.len() + 4 * scales.len()
            }
        }
    }

    /// Columns of the 8-bit activations the W8A8 and FP8 kernels round a step's rows to (0
    /// if none).
    pub fn quantized_input_cols(&self) -> usize {
        match self {
            Self::Int8 { w, .. } => w.cols,
            Self::Fp8 { w, .. } => w.cols,
            _ => 0,
        }
    }

    /// Output rows of a W8A8 int8 matrix, whose products cuBLASLt sums in i32 before they are
    /// scaled (0 for any other: FP8's products the library scales itself).
    pub fn library_rows(&self) -> usize {
        match self {
            Self::Int8 { w, .. } => w.rows,
            _ => 0,
        }
    }

    /// Elements of the dense matrix a quantized one expands to for large batches (0 if dense).
    pub fn dequantized_len(&self) -> usize {
        match self {
            Self::Dense(_) | Self::Int8 { .. } | Self::Fp8 { .. } => 0,
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
