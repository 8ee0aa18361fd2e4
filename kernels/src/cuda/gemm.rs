//! Dense projections through cuBLAS: `y[m, n] = x[m, k] · W[n, k]ᵀ`, the linear layer with
//! weights as checkpoints store them (`[out_features, in_features]`, row-major), f16 or bf16
//! operands, f32 accumulation, and a 16-bit or f32 result (f32 for logits, so sampling sees
//! them unrounded). [`Gpu::linear_add`] adds the product to what the result holds instead (the
//! minimums' correction of `wq_mins`).
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
use super::ops::{Dtype, to_i32};

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
        let c = Output {
            ptr: out,
            ty: out_type,
            alpha: 1.0,
            beta: 0.0,
        };
        // SAFETY: the caller's contract is this one's.
        unsafe { self.gemm(dtype, c, x, w, shape) }
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
