//! NVRTC compiles every kernel module, and the CUBIN cache is keyed and reused as it should
//! be. NVRTC needs no GPU, so these run on any machine that can load `libnvrtc.so.13`; CI
//! installs it (the `nvidia-cuda-nvrtc` wheel) and sets `FERRITE_REQUIRE_NVRTC=1`, which turns
//! a missing library into a failure instead of a skip.

use std::path::PathBuf;

use ferrite_kernels::cuda::{self, CudaError, KernelCache, KernelSource, nvrtc};

fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc::nvrtc_present() {
        return true;
    }
    assert!(
        std::env::var_os("FERRITE_REQUIRE_NVRTC").is_none(),
        "FERRITE_REQUIRE_NVRTC is set but libnvrtc cannot be loaded (LD_LIBRARY_PATH?)"
    );
    eprintln!("{test}: skipped, no libnvrtc");
    false
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

const SCALE: KernelSource = KernelSource {
    name: "scale_test",
    source: r#"
#include "common.cuh"
template <typename T>
__device__ void scale(T* x, int n, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = from_f32<T>(to_f32(x[i]) * s);
}
extern "C" __global__ void scale_f16(f16* x, int n, float s) { scale(x, n, s); }
extern "C" __global__ void scale_bf16(bf16* x, int n, float s) { scale(x, n, s); }
"#,
};

/// For the H100 (sm_90) that ferrite is measured on. (The kernels also compile for sm_80;
/// compiling them twice would double the longest step of this test.)
#[test]
fn every_module_compiles_for_hopper() {
    if !nvrtc_or_skip("every_module_compiles_for_hopper") {
        return;
    }
    let dir = scratch_dir("all-modules");
    let cache = KernelCache::new(&dir, "sm_90").expect("nvrtc");
    let built = cuda::build_modules(&cache).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.len(), cuda::MODULES.len());
    for (module, (cubin, build)) in cuda::MODULES.iter().zip(&built) {
        assert_eq!(build.module, module.name);
        assert!(cubin.starts_with(b"\x7fELF"), "{}", module.name);
        assert!(
            !build.hit,
            "{} was cached in a fresh directory",
            module.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cache_compiles_once_and_keys_on_source_and_arch() {
    if !nvrtc_or_skip("the_cache_compiles_once_and_keys_on_source_and_arch") {
        return;
    }
    let dir = scratch_dir("cache");
    let cache = KernelCache::new(&dir, "sm_90").expect("nvrtc");
    let (first, build) = cache.cubin(&SCALE).expect("compiles");
    assert!(!build.hit);
    assert!(cache.path_of(&SCALE).is_file());
    let (again, build) = cache.cubin(&SCALE).expect("cached");
    assert!(build.hit, "second request compiled again");
    assert_eq!(first, again);

    // Another arch or another source is another entry.
    let ampere = KernelCache::new(&dir, "sm_80").expect("nvrtc");
    assert_ne!(ampere.path_of(&SCALE), cache.path_of(&SCALE));
    assert!(!ampere.cubin(&SCALE).expect("compiles").1.hit);
    let edited = KernelSource {
        source: "#include \"common.cuh\"\nextern \"C\" __global__ void k() {}\n",
        ..SCALE
    };
    assert_ne!(cache.path_of(&edited), cache.path_of(&SCALE));

    // A damaged entry is compiled again, not loaded.
    std::fs::write(cache.path_of(&SCALE), b"not a cubin").expect("write");
    let (repaired, build) = cache.cubin(&SCALE).expect("recompiles");
    assert!(!build.hit);
    assert_eq!(repaired, first);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_compile_error_names_the_module_and_carries_the_log() {
    if !nvrtc_or_skip("a_compile_error_names_the_module_and_carries_the_log") {
        return;
    }
    let dir = scratch_dir("broken");
    let cache = KernelCache::new(&dir, "sm_90").expect("nvrtc");
    let broken = KernelSource {
        name: "broken",
        source: "extern \"C\" __global__ void k(int* x) { x[0] = undefined_name; }\n",
    };
    match cache.cubin(&broken) {
        Err(CudaError::Compile { module, log }) => {
            assert_eq!(module, "broken");
            assert!(log.contains("undefined_name"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert!(
        !cache.path_of(&broken).exists(),
        "a failed compile was cached"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The modules with tensor-core instructions newer than sm_80 (FP8 mma and conversions, behind
/// `__CUDA_ARCH__` guards) also compile for the A100, where the FP8 kernels are never chosen.
#[test]
fn the_fp8_and_int8_modules_compile_for_ampere() {
    if !nvrtc_or_skip("the_fp8_and_int8_modules_compile_for_ampere") {
        return;
    }
    let dir = scratch_dir("ampere");
    let cache = KernelCache::new(&dir, "sm_80").expect("nvrtc");
    for name in ["fp8", "w8a8"] {
        let module = cuda::MODULES
            .iter()
            .find(|m| m.name == name)
            .expect("module");
        let (cubin, _) = cache
            .cubin(module)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
