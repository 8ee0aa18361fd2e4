//! cuBLASLt as the 8-bit GEMMs of `imma.rs` use it: the handle and workspace, opened with a
//! [`super::Gpu`] where libcublasLt loads; the code types; the algorithm chosen for each shape.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::CudaError;

/// The 8-bit codes a GEMM multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Codes {
    /// int8; i32 products.
    Int8,
    /// FP8 e4m3; f32 products.
    E4m3,
}

impl Codes {
    /// (code type, compute type, scale type, result type).
    pub(crate) fn types(
        self,
    ) -> (
        sys::cudaDataType_t,
        sys::cublasComputeType_t,
        sys::cudaDataType_t,
        sys::cudaDataType_t,
    ) {
        use sys::cudaDataType_t::{CUDA_R_8F_E4M3, CUDA_R_8I, CUDA_R_32F, CUDA_R_32I};
        match self {
            Self::Int8 => (
                CUDA_R_8I,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32I,
                CUDA_R_32I,
                CUDA_R_32I,
            ),
            Self::E4m3 => (
                CUDA_R_8F_E4M3,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                CUDA_R_32F,
                CUDA_R_32F,
            ),
        }
    }
}

/// A GEMM's codes and `(m, n, k)`: what the library's choice of algorithm depends on here (the
/// descriptors' other attributes are the same for every call).
pub(crate) type AlgoKey = (Codes, usize, usize, usize);

/// cuBLASLt's workspace (NVIDIA's recommendation for Hopper).
pub(crate) const WORKSPACE: usize = 32 << 20;

/// A cuBLASLt handle and the workspace given to every call (so that it never allocates,
/// inside a graph capture least of all).
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    /// Kept alive for `workspace_ptr`.
    _workspace: CudaSlice<u8>,
    workspace_ptr: u64,
    /// The algorithm the heuristic chose for each shape seen: asked once a shape, not once a
    /// call (the query costs tens of microseconds, and a prefill step makes one per
    /// projection and layer).
    algos: Mutex<HashMap<AlgoKey, sys::cublasLtMatmulAlgo_t>>,
}

// SAFETY: the handle is only used on the owning `Gpu`'s stream, by calls that `Gpu` serializes
// as it does cuBLAS's (a runner steps one thread at a time); cuBLASLt handles may be used from
// any thread.
#[allow(unsafe_code)]
unsafe impl Send for Lt {}
#[allow(unsafe_code)]
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created by `open` and destroyed once, here.
        #[allow(unsafe_code)]
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

pub(crate) fn lt_error(what: &str, e: lt::CublasError) -> CudaError {
    CudaError::Driver(format!("cuBLASLt {what}: {e:?}"))
}

impl Lt {
    /// cuBLASLt on `stream`, or `None` where libcublasLt cannot be loaded.
    pub fn open(stream: &std::sync::Arc<CudaStream>) -> Result<Option<Self>, CudaError> {
        // SAFETY: only tries to dlopen the library by its candidate names.
        #[allow(unsafe_code)]
        if !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE)?;
        let workspace_ptr = workspace.device_ptr(stream).0;
        let handle = lt::create_handle().map_err(|e| lt_error("handle", e))?;
        Ok(Some(Self {
            handle,
            _workspace: workspace,
            workspace_ptr,
            algos: Mutex::new(HashMap::new()),
        }))
    }

    /// The algorithm for `key`: the one chosen before, or `choose`'s, kept.
    pub(crate) fn algo(
        &self,
        key: AlgoKey,
        choose: impl FnOnce() -> Result<sys::cublasLtMatmulAlgo_t, CudaError>,
    ) -> Result<sys::cublasLtMatmulAlgo_t, CudaError> {
        let mut algos = self.algos.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = algos.get(&key) {
            return Ok(*a);
        }
        let a = choose()?;
        algos.insert(key, a);
        Ok(a)
    }

    pub(crate) fn handle(&self) -> sys::cublasLtHandle_t {
        self.handle
    }

    pub(crate) fn workspace_ptr(&self) -> u64 {
        self.workspace_ptr
    }
}
