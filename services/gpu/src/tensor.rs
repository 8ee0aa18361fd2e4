//! A 16-bit tensor in device memory ([`DeviceTensor`]) and how one is filled: from the host
//! model's rows (planned as [`Jobs`] for the pinned uploader), from f32 values, or made random on
//! the device. What the weights ([`super::weights`]) and the projections' layouts
//! ([`super::matrix`]) both build on.

use cudarc::driver::CudaSlice;
use ferrite_formats::Matrix;
use ferrite_kernels::cpu::matmul::Weight;
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::upload::{Fill, UploadJob};
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_kernels::quant::GgmlType;
use ferrite_model::error::{ModelError, Result};

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

/// A CUDA failure as the device's fault ([`ModelError::Device`]), for `map_err`.
pub(crate) fn gpu_error(e: ferrite_kernels::cuda::CudaError) -> ModelError {
    e.into()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use ferrite_formats::{TensorEntry, TensorMap};
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
