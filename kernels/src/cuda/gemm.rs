//! Dense projections: `y[m, n] = x[m, k] · W[n, k]ᵀ`, the linear layer with weights as
//! checkpoints store them (`[out_features, in_features]`, row-major), f16 or bf16 operands,
//! f32 accumulation, and a 16-bit or f32 result (f32 for logits, so sampling sees them
//! unrounded). [`Gpu::linear_add`] adds the product to what the result holds instead (the
//! minimums' correction of `wq_mins`).
//!
//! Up to 16 rows of `x` (decode; [`gemv_rows`]), [`Gpu::linear`] runs ferrite's own GEMV
//! (`dense_gemv.cu`: one launch that streams the weights once); above, and for shapes it does
//! not take, cuBLAS. `FERRITE_GEMV_ROWS=0` keeps cuBLAS for every shape, so the two can be
//! compared on one machine. [`Gpu::linear_gated`] is the GEMV reading the MLP's gate|up
//! buffer as its input, the activation computed as it loads (the decode down projection
//! without the activation kernel).
//!
//! cuBLAS is column-major; a row-major `[r, c]` matrix is the column-major `[c, r]` one. So
//! `yᵀ (n × m) = W (n × k, stored as k × n, transposed) · xᵀ (k × m)`: `transa = T`,
//! `transb = N`, with the leading dimensions the row strides.

use std::ffi::c_void;

use cudarc::cublas::result as blas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};

use super::CudaError;
use super::gpu::{DevPtr, Gpu};
use super::ops::{Dtype, i32_of, to_i32};
use super::wq::gemv_rows;

/// The result type of a projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// The operands' 16-bit type.
    Same,
    F32,
}

/// One projection's operands: `out[m, n]` (rows `out_stride` apart) from `x[m, k]` (rows
/// `x_stride` apart) and `w[n, k]` (contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub x_stride: usize,
    pub out_stride: usize,
}

/// Where a product goes and how it meets what is there: `alpha · product + beta · out`.
#[derive(Debug, Clone, Copy)]
struct Output {
    ptr: DevPtr,
    ty: OutType,
    alpha: f32,
    beta: f32,
}

fn cuda_type(dtype: Dtype) -> cudaDataType_t {
    match dtype {
        Dtype::F16 => cudaDataType_t::CUDA_R_16F,
        Dtype::Bf16 => cudaDataType_t::CUDA_R_16BF,
    }
}

/// Whether [`Gpu::linear`] runs the dense GEMV for `shape` with these operands: 1 to
/// [`gemv_rows`] rows (16 unless `FERRITE_GEMV_ROWS` says 8 or 0), strides at least the
/// extents, `k` a multiple of 16 (whole pairs of 16-byte units), `w` 16-byte aligned, `x`
/// 4-byte aligned with an even row stride.
pub fn dense_gemv_takes(shape: &Linear, x: DevPtr, w: DevPtr) -> bool {
    (1..=gemv_rows()).contains(&shape.m)
        && shape.n > 0
        && shape.k.is_multiple_of(16)
        && shape.x_stride >= shape.k
        && shape.out_stride >= shape.n
        && shape.x_stride.is_multiple_of(2)
        && w.0.is_multiple_of(16)
        && x.0.is_multiple_of(4)
}

#[allow(unsafe_code)]
impl Gpu {
    /// `out = x · wᵀ` (see [`Linear`]), queued on the stream.
    ///
    /// # Safety
    /// The pointers address buffers of the extents `shape` implies; `x_stride ≥ k`,
    /// `out_stride ≥ n`.
    pub unsafe fn linear(
        &self,
        dtype: Dtype,
        out_type: OutType,
        out: DevPtr,
        x: DevPtr,
        w: DevPtr,
        shape: Linear,
    ) -> Result<(), CudaError> {
        if dense_gemv_takes(&shape, x, w) {
            // SAFETY: the caller's contract is this one's; the shape and alignment are checked.
            return unsafe { self.dense_gemv_plain(dtype, out_type, out, x, w, shape) };
        }
        let c = Output {
            ptr: out,
            ty: out_type,
            alpha: 1.0,
            beta: 0.0,
        };
        // SAFETY: the caller's contract is this one's.
        unsafe { self.gemm(dtype, c, x, w, shape) }
    }

    /// The down projection of the MLP read straight from its gate|up buffer: `out = x · wᵀ`
    /// with `x[n][c] = act(gate_up[n][c]) · gate_up[n][k + c]` (GELU-tanh when `gelu`, else
    /// SiLU), each `x` value rounded to `dtype` as [`Self::gated_activation`] stores it, so the
    /// result is that op followed by [`Self::linear`], bit for bit, in one launch of the dense
    /// GEMV. `shape.k` is d_ff; `shape.x_stride` is `gate_up`'s row stride, at least `2 · k`.
    /// Only the GEMV's shapes ([`dense_gemv_takes`]): an error otherwise, never a fallback.
    ///
    /// # Safety
    /// As [`Self::linear`], with `gate_up` holding `m` rows of `2 · k` at `x_stride`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn linear_gated(
        &self,
        dtype: Dtype,
        gelu: bool,
        out: DevPtr,
        gate_up: DevPtr,
        w: DevPtr,
        shape: Linear,
    ) -> Result<(), CudaError> {
        if !dense_gemv_takes(&shape, gate_up, w) || shape.x_stride < 2 * shape.k {
            return Err(CudaError::Driver(format!(
                "linear_gated: the dense GEMV does not take {shape:?}"
            )));
        }
        let entry = match (shape.m > 8, gelu, dtype) {
            (false, false, Dtype::F16) => "dense_gemv_silu_f16",
            (false, false, Dtype::Bf16) => "dense_gemv_silu_bf16",
            (false, true, Dtype::F16) => "dense_gemv_gelu_f16",
            (false, true, Dtype::Bf16) => "dense_gemv_gelu_bf16",
            (true, false, Dtype::F16) => "dense_gemv16_silu_f16",
            (true, false, Dtype::Bf16) => "dense_gemv16_silu_bf16",
            (true, true, Dtype::F16) => "dense_gemv16_gelu_f16",
            (true, true, Dtype::Bf16) => "dense_gemv16_gelu_bf16",
        };
        // SAFETY: the caller's contract; the shape and alignment are checked.
        unsafe { self.dense_gemv(entry, out, gate_up, w, shape) }
    }

    /// `out = x · wᵀ` by `dense_gemv.cu` (see [`dense_gemv_takes`] for what it takes).
    ///
    /// # Safety
    /// As [`Self::linear`].
    unsafe fn dense_gemv_plain(
        &self,
        dtype: Dtype,
        out_type: OutType,
        out: DevPtr,
        x: DevPtr,
        w: DevPtr,
        shape: Linear,
    ) -> Result<(), CudaError> {
        // One n8 tile where it holds the rows: the second would only add idle mmas.
        let entry = match (shape.m > 8, dtype, out_type) {
            (false, Dtype::F16, OutType::Same) => "dense_gemv_f16",
            (false, Dtype::Bf16, OutType::Same) => "dense_gemv_bf16",
            (false, Dtype::F16, OutType::F32) => "dense_gemv_f16_f32out",
            (false, Dtype::Bf16, OutType::F32) => "dense_gemv_bf16_f32out",
            (true, Dtype::F16, OutType::Same) => "dense_gemv16_f16",
            (true, Dtype::Bf16, OutType::Same) => "dense_gemv16_bf16",
            (true, Dtype::F16, OutType::F32) => "dense_gemv16_f16_f32out",
            (true, Dtype::Bf16, OutType::F32) => "dense_gemv16_bf16_f32out",
        };
        // SAFETY: as this function's.
        unsafe { self.dense_gemv(entry, out, x, w, shape) }
    }

    /// One launch of `dense_gemv.cu`'s `entry` (all take the same arguments).
    ///
    /// # Safety
    /// As [`Self::linear`], for what `entry` reads.
    unsafe fn dense_gemv(
        &self,
        entry: &'static str,
        out: DevPtr,
        x: DevPtr,
        w: DevPtr,
        shape: Linear,
    ) -> Result<(), CudaError> {
        let args = [
            out.into(),
            x.into(),
            w.into(),
            i32_of("m", shape.m)?,
            i32_of("n", shape.n)?,
            i32_of("k", shape.k)?,
            i32_of("x_stride", shape.x_stride)?,
            i32_of("out_stride", shape.out_stride)?,
        ];
        let grid = (shape.n.div_ceil(16) as u32, 1, 1);
        // SAFETY: the arguments are `dense_gemv`'s; the extents are the caller's contract.
        unsafe { self.launch("dense_gemv", entry, grid, 256, 0, &args) }
    }

    /// `out += alpha · x · wᵀ` (see [`Linear`]) with `out` of the operands' type: the
    /// product accumulated in f32 onto what `out` holds, rounded once (a correction added to a
    /// projection's result).
    ///
    /// # Safety
    /// As [`Self::linear`].
    pub unsafe fn linear_add(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: DevPtr,
        shape: Linear,
        alpha: f32,
    ) -> Result<(), CudaError> {
        let c = Output {
            ptr: out,
            ty: OutType::Same,
            alpha,
            beta: 1.0,
        };
        // SAFETY: the caller's contract is this one's.
        unsafe { self.gemm(dtype, c, x, w, shape) }
    }

    /// `c.ptr = c.alpha · x · wᵀ + c.beta · c.ptr`.
    ///
    /// # Safety
    /// As [`Self::linear`].
    unsafe fn gemm(
        &self,
        dtype: Dtype,
        c: Output,
        x: DevPtr,
        w: DevPtr,
        shape: Linear,
    ) -> Result<(), CudaError> {
        let Output {
            ptr: out,
            ty: out_type,
            alpha,
            beta,
        } = c;
        let Linear {
            m,
            n,
            k,
            x_stride,
            out_stride,
        } = shape;
        if x_stride < k || out_stride < n {
            return Err(CudaError::Driver(format!(
                "linear: strides {x_stride}/{out_stride} below k = {k} / n = {n}"
            )));
        }
        if m == 0 || n == 0 || k == 0 {
            return Ok(());
        }
        let c_type = match out_type {
            OutType::Same => cuda_type(dtype),
            OutType::F32 => cudaDataType_t::CUDA_R_32F,
        };
        // cuBLAS runs on the calling thread's current context, and the `result` layer does not
        // bind one (cudarc's safe gemm does): bind this device's, or on cuda:N, N ≠ 0, a
        // thread last bound elsewhere would launch on the wrong device.
        self.context().bind_to_thread()?;
        // SAFETY: the handle is live and bound to this stream; pointers per the caller's
        // contract; alpha/beta are host f32 as CUBLAS_COMPUTE_32F expects.
        unsafe {
            blas::gemm_ex(
                *self.blas()?.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                to_i32("n", n)?,
                to_i32("m", m)?,
                to_i32("k", k)?,
                (&alpha as *const f32).cast::<c_void>(),
                w.0 as *const c_void,
                cuda_type(dtype),
                to_i32("k", k)?,
                x.0 as *const c_void,
                cuda_type(dtype),
                to_i32("x_stride", x_stride)?,
                (&beta as *const f32).cast::<c_void>(),
                out.0 as *mut c_void,
                c_type,
                to_i32("out_stride", out_stride)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Driver(format!("cuBLAS gemm {m}x{n}x{k}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(m: usize, n: usize, k: usize) -> Linear {
        Linear {
            m,
            n,
            k,
            x_stride: k,
            out_stride: n,
        }
    }

    #[test]
    fn the_dense_gemv_takes_decode_shapes_it_can_read_whole() {
        if gemv_rows() != 16 {
            return; // FERRITE_GEMV_ROWS set for an A/B run
        }
        let (x, w) = (DevPtr(1 << 20), DevPtr(2 << 20));
        assert!(dense_gemv_takes(&shape(1, 4096, 4096), x, w));
        assert!(dense_gemv_takes(&shape(16, 49152, 576), x, w));
        // Batches above 16 rows, no rows at all: cuBLAS.
        assert!(!dense_gemv_takes(&shape(17, 4096, 4096), x, w));
        assert!(!dense_gemv_takes(&shape(0, 4096, 4096), x, w));
        // A row length that is not whole pairs of 16-byte units.
        assert!(!dense_gemv_takes(&shape(1, 4096, 4104), x, w));
        // Misaligned operands, an odd row stride, strides below the extents.
        assert!(!dense_gemv_takes(&shape(1, 64, 64), x, w.offset::<u16>(1)));
        assert!(!dense_gemv_takes(&shape(1, 64, 64), x.offset::<u8>(2), w));
        let odd = Linear {
            x_stride: 65,
            ..shape(2, 64, 64)
        };
        assert!(!dense_gemv_takes(&odd, x, w));
        let short = Linear {
            out_stride: 32,
            ..shape(2, 64, 64)
        };
        assert!(!dense_gemv_takes(&short, x, w));
    }
}
