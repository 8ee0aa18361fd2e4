//! The CUDA backend: kernel sources compiled by NVRTC and cached as CUBIN, loaded into a
//! device context, and launched through typed wrappers.
//!
//! - [`sources`]: the `.cu` modules of `kernels/cuda/`, built into the binary.
//! - [`nvrtc`]: CUDA C to CUBIN (needs `libnvrtc`, not a GPU).
//! - [`cache`]: CUBIN on disk keyed by (source hash, arch, NVRTC version).
//! - [`nccl`]: NCCL loaded by its real soname, non-blocking communicators.
//! - [`libs`]: which CUDA libraries load, under which names, at which versions (`doctor`).
//!
//! Everything here loads the CUDA libraries at run time (cudarc's dynamic loading), so ferrite
//! builds and runs where there is no CUDA; each entry point first checks the library it needs
//! is present, because cudarc panics on a call into an absent one.

#[allow(unsafe_code)]
pub mod attention;
pub mod cache;
#[allow(unsafe_code)]
pub mod fp8;
#[allow(unsafe_code)]
pub mod gemm;
#[allow(unsafe_code)]
pub mod gpu;
#[allow(unsafe_code)]
mod imma;
#[allow(unsafe_code)]
pub mod libs;
#[allow(unsafe_code)]
mod lt;
#[allow(unsafe_code)]
pub mod nccl;
#[allow(unsafe_code)]
pub mod nvrtc;
pub mod ops;
#[allow(unsafe_code)]
pub mod sample;
pub mod sources;
#[allow(unsafe_code)]
mod transfer;
#[allow(unsafe_code)]
pub mod upload;
#[allow(unsafe_code)]
pub mod w8a8;
#[allow(unsafe_code)]
pub mod wq;
#[allow(unsafe_code)]
pub mod wq_mins;
#[allow(unsafe_code)]
pub mod wq_mma;

pub use cache::{KernelCache, ModuleBuild, default_cache_dir};
pub use gpu::{Arg, DevPtr, Gpu};
pub use sources::{HEADERS, KernelSource, MODULES};
pub use transfer::QueuedUpload;

/// What can go wrong building or running CUDA kernels.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "NVRTC (libnvrtc.so.13) could not be loaded; put the CUDA toolkit's lib directory on \
         LD_LIBRARY_PATH"
    )]
    NvrtcMissing,
    #[error("{call} failed: {message}")]
    Nvrtc { call: &'static str, message: String },
    #[error("kernel module `{module}` did not compile:\n{log}")]
    Compile { module: String, log: String },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("NCCL: {0}")]
    Nccl(String),
}

impl CudaError {
    /// A stable name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NvrtcMissing => "nvrtc_missing",
            Self::Nvrtc { .. } => "nvrtc",
            Self::Compile { .. } => "compile",
            Self::Driver(_) => "driver",
            Self::Nccl(_) => "nccl",
        }
    }
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Self::Driver(e.to_string())
    }
}

/// The CUBIN of every module for the cache's arch (compiled where not cached), in
/// [`MODULES`] order, with how each was obtained. Modules compile in parallel: NVRTC programs
/// are independent, and one (attention, with its tensor-core variants) takes most of the time.
pub fn build_modules(cache: &KernelCache) -> Result<Vec<(Vec<u8>, ModuleBuild)>, CudaError> {
    use rayon::prelude::*;
    MODULES.par_iter().map(|m| cache.cubin(m)).collect()
}

/// The NVRTC arch name of a compute capability, e.g. (9, 0) → `sm_90`.
pub fn arch_of(compute_capability: (i32, i32)) -> String {
    format!("sm_{}{}", compute_capability.0, compute_capability.1)
}
