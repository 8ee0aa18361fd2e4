//! A cuBLASLt handle and its workspace, opened with a [`super::Gpu`] where libcublasLt loads
//! (the 8-bit GEMMs of `imma.rs` use it).

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::CudaError;

/// cuBLASLt's workspace (NVIDIA's recommendation for Hopper).
pub(crate) const WORKSPACE: usize = 32 << 20;

/// A cuBLASLt handle and the workspace given to every call (so that it never allocates,
/// inside a graph capture least of all).
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    /// Kept alive for `workspace_ptr`.
    _workspace: CudaSlice<u8>,
    workspace_ptr: u64,
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
        }))
    }

    pub(crate) fn handle(&self) -> sys::cublasLtHandle_t {
        self.handle
    }

    pub(crate) fn workspace_ptr(&self) -> u64 {
        self.workspace_ptr
    }
}
