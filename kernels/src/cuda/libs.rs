//! Which CUDA libraries this process can load, from where, and their versions: what `ferrite
//! doctor` reports, the way users of vLLM check an NCCL set-up by hand.
//!
//! Each library is tried under the sonames its packages ship, newest first. NCCL is the one
//! that matters most: its real soname is `libnccl.so.2` (the only name the `libnccl2` package
//! and the NCCL pip wheels ship), which cudarc's loader never tries (it asks for `libnccl.so`,
//! `libnccl.so.13`, `.12`, ...), so a host where NCCL is installed correctly can still look
//! as if it had none; the probe says which name was found.
//!
//! A library is opened, asked its version through its own C entry point, and closed again.

use std::ffi::c_int;

/// A CUDA library found (or not) by its sonames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryProbe {
    /// What it is (`NVRTC`, `cuBLAS`, `NCCL`, `CUDA driver`).
    pub what: &'static str,
    /// The soname that loaded, if one did.
    pub found: Option<&'static str>,
    /// `major.minor[.patch]`, when the library answered.
    pub version: Option<String>,
    /// Every name tried, in order.
    pub tried: &'static [&'static str],
}

const DRIVER: &[&str] = &["libcuda.so.1", "libcuda.so"];
const NVRTC: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
const CUBLAS: &[&str] = &["libcublas.so.13", "libcublas.so.12", "libcublas.so"];
const CUBLAS_LT: &[&str] = &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"];
pub(crate) const NCCL: &[&str] = &["libnccl.so.2", "libnccl.so"];

/// The driver, NVRTC, cuBLAS, cuBLASLt (W8A8 GEMMs of many rows) and NCCL, in that order.
pub fn probe_all() -> Vec<LibraryProbe> {
    vec![
        probe("CUDA driver", DRIVER, driver_version),
        probe("NVRTC", NVRTC, nvrtc_version),
        probe("cuBLAS", CUBLAS, cublas_version),
        probe("cuBLASLt", CUBLAS_LT, cublas_lt_version),
        probe("NCCL", NCCL, nccl_version),
    ]
}

fn probe(
    what: &'static str,
    names: &'static [&'static str],
    version: fn(&libloading::Library) -> Option<String>,
) -> LibraryProbe {
    for name in names {
        // SAFETY: loading a CUDA library runs its initializers, which only register the
        // library; nothing of it is called here but the version query below.
        if let Ok(lib) = unsafe { libloading::Library::new(*name) } {
            return LibraryProbe {
                what,
                found: Some(name),
                version: version(&lib),
                tried: names,
            };
        }
    }
    LibraryProbe {
        what,
        found: None,
        version: None,
        tried: names,
    }
}

/// Calls `symbol(int *out)`, which returns 0 on success, and gives `out`.
fn one_int(lib: &libloading::Library, symbol: &[u8]) -> Option<c_int> {
    let mut out: c_int = 0;
    // SAFETY: each symbol named here has the C signature `int f(int *)` in its library's
    // header (cuDriverGetVersion, ncclGetVersion); `out` outlives the call.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(symbol)
            .ok()?;
        (f(&mut out) == 0).then_some(out)
    }
}

fn driver_version(lib: &libloading::Library) -> Option<String> {
    // CUDA's encoding: 1000 × major + 10 × minor.
    one_int(lib, b"cuDriverGetVersion\0").map(|v| format!("{}.{}", v / 1000, v % 1000 / 10))
}

fn nccl_version(lib: &libloading::Library) -> Option<String> {
    // NCCL ≥ 2.9: 10000 × major + 100 × minor + patch.
    one_int(lib, b"ncclGetVersion\0")
        .map(|v| format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100))
}

fn nvrtc_version(lib: &libloading::Library) -> Option<String> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: `nvrtcResult nvrtcVersion(int *major, int *minor)` (nvrtc.h); both outlive it.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int>(b"nvrtcVersion\0")
            .ok()?;
        (f(&mut major, &mut minor) == 0).then(|| format!("{major}.{minor}"))
    }
}

fn cublas_version(lib: &libloading::Library) -> Option<String> {
    // `cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value)`: MAJOR_VERSION
    // = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 (library_types.h).
    let part = |kind: c_int| -> Option<c_int> {
        let mut out: c_int = 0;
        // SAFETY: the signature above; `out` outlives the call.
        unsafe {
            let f = lib
                .get::<unsafe extern "C" fn(c_int, *mut c_int) -> c_int>(b"cublasGetProperty\0")
                .ok()?;
            (f(kind, &mut out) == 0).then_some(out)
        }
    };
    Some(format!("{}.{}.{}", part(0)?, part(1)?, part(2)?))
}

fn cublas_lt_version(lib: &libloading::Library) -> Option<String> {
    // `size_t cublasLtGetVersion(void)`: 10000 × major + 100 × minor + patch.
    // SAFETY: that signature (cublasLt.h); it reads nothing of ours.
    let v = unsafe {
        let f = lib
            .get::<unsafe extern "C" fn() -> usize>(b"cublasLtGetVersion\0")
            .ok()?;
        f()
    };
    Some(format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC is what CI installs (the pip wheel, on `LD_LIBRARY_PATH`): with
    /// `FERRITE_REQUIRE_NVRTC` set, it must be found and answer its version.
    #[test]
    fn nvrtc_is_found_with_its_version_where_ci_installs_it() {
        let probes = probe_all();
        assert_eq!(probes.len(), 5);
        let nvrtc = probes.iter().find(|p| p.what == "NVRTC").expect("probed");
        if std::env::var_os("FERRITE_REQUIRE_NVRTC").is_some() {
            assert!(nvrtc.found.is_some(), "{nvrtc:?}");
            let v = nvrtc.version.as_deref().expect("nvrtcVersion answered");
            assert!(v.starts_with("13."), "{v}");
        }
        let nccl = probes.iter().find(|p| p.what == "NCCL").expect("probed");
        assert_eq!(
            nccl.tried.first(),
            Some(&"libnccl.so.2"),
            "the real soname first"
        );
    }
}
