//! The CUDA C sources of `kernels/cuda/`, built into the binary so a deployed `ferrite` needs
//! no source tree: one module per op family, `extern "C"` entry points `<op>_<dtype>`.

/// One `.cu` file: an NVRTC program, loaded as one CUDA module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// The file name without `.cu`; also the module's name in the cache and in spans.
    pub name: &'static str,
    pub source: &'static str,
}

macro_rules! module {
    ($name:literal) => {
        KernelSource {
            name: $name,
            source: include_str!(concat!("../../cuda/", $name, ".cu")),
        }
    };
}

/// Headers the modules include, by the name they include them by.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../cuda/common.cuh")),
    ("mma.cuh", include_str!("../../cuda/mma.cuh")),
    ("wq_common.cuh", include_str!("../../cuda/wq_common.cuh")),
];

/// Every module ferrite loads on a CUDA device.
pub const MODULES: &[KernelSource] = &[
    module!("activation"),
    module!("attention"),
    module!("convert"),
    module!("embedding"),
    module!("kv_cache"),
    module!("norm"),
    module!("qkv"),
    module!("random"),
    module!("rope"),
    module!("sampling"),
    module!("wq_gemv"),
    module!("wq_mins"),
    module!("wq_mma"),
];
