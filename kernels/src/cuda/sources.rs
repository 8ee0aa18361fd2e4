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
    // A variant of a file whose instantiations are split into several programs by a define
    // (they compile in parallel; one program of them all set the cold start's critical path).
    ($name:literal, $file:literal, $define:literal) => {
        KernelSource {
            name: $name,
            source: concat!(
                "#define ",
                $define,
                "\n#line 1 \"",
                $file,
                ".cu\"\n",
                include_str!(concat!("../../cuda/", $file, ".cu"))
            ),
        }
    };
}

/// Headers the modules include, by the name they include them by.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../cuda/common.cuh")),
    ("gated.cuh", include_str!("../../cuda/gated.cuh")),
    ("gemv.cuh", include_str!("../../cuda/gemv.cuh")),
    ("mma.cuh", include_str!("../../cuda/mma.cuh")),
    ("tile8.cuh", include_str!("../../cuda/tile8.cuh")),
    ("wq_common.cuh", include_str!("../../cuda/wq_common.cuh")),
];

/// Every module ferrite loads on a CUDA device.
pub const MODULES: &[KernelSource] = &[
    module!("activation"),
    module!("attention_hd64", "attention", "ATTN_HD 64"),
    module!("attention_hd128", "attention", "ATTN_HD 128"),
    module!("attention_hd256", "attention", "ATTN_HD 256"),
    module!("convert"),
    module!("dense_gemv"),
    module!("embedding"),
    module!("fp8"),
    module!("kv_cache"),
    module!("norm"),
    module!("qkv"),
    module!("random"),
    module!("rope"),
    module!("sampling"),
    module!("w8a8"),
    module!("wq_gemv"),
    module!("wq_gemv_gated", "wq_gemv", "WQ_GEMV_GATED 1"),
    module!("wq_mins"),
    module!("wq_mma_b8", "wq_mma", "WQ_MMA_BITS 8"),
    module!("wq_mma_b4", "wq_mma", "WQ_MMA_BITS 4"),
    module!("wq_mma_b2", "wq_mma", "WQ_MMA_BITS 2"),
];
