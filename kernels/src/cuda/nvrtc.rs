//! NVRTC: CUDA C source to CUBIN for one GPU arch, at run time.
//!
//! cudarc's safe wrapper only returns PTX (which the driver would JIT again at every start);
//! ferrite wants CUBIN it can cache on disk, so the few NVRTC calls are made here through
//! cudarc's dynamically loaded bindings. NVRTC needs no GPU, so this runs (and is tested)
//! anywhere `libnvrtc.so.13` can be loaded.

use std::ffi::{CStr, CString, c_char, c_int};

use cudarc::nvrtc::sys;

use super::CudaError;

/// The options every module is compiled with (part of the cache key).
pub const COMPILE_OPTIONS: &[&str] = &["--std=c++17", "-default-device"];

/// Whether `libnvrtc` can be loaded. cudarc panics on the first call into a library that is
/// absent, so this is asked before anything else here.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names and drops the handle.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NvrtcMissing);
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two valid out-pointers; the library is present (checked above).
    check("nvrtcVersion", unsafe {
        sys::nvrtcVersion(&mut major, &mut minor)
    })?;
    Ok((major, minor))
}

/// Compiles `source` (file name `name`, which appears in diagnostics) with `headers` (include
/// name, text) for `arch` (e.g. `sm_90`), returning the CUBIN image.
pub fn compile_cubin(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
) -> Result<Vec<u8>, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NvrtcMissing);
    }
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| CudaError::Compile {
            module: name.to_owned(),
            log: "a source, header or option contains a NUL byte".into(),
        })
    };
    let c_source = cstr(source)?;
    let c_name = cstr(name)?;
    let c_header_texts = headers
        .iter()
        .map(|(_, text)| cstr(text))
        .collect::<Result<Vec<_>, _>>()?;
    let c_header_names = headers
        .iter()
        .map(|(n, _)| cstr(n))
        .collect::<Result<Vec<_>, _>>()?;
    let text_ptrs: Vec<*const c_char> = c_header_texts.iter().map(|c| c.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = c_header_names.iter().map(|c| c.as_ptr()).collect();
    let mut options = vec![cstr(&format!("--gpu-architecture={arch}"))?];
    for o in COMPILE_OPTIONS {
        options.push(cstr(o)?);
    }
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string kept alive until the program is
    // destroyed below; the header arrays have `headers.len()` entries each.
    check("nvrtcCreateProgram", unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            c_source.as_ptr(),
            c_name.as_ptr(),
            headers.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    })?;
    let program = Program(prog);
    // SAFETY: `program.0` is a live program; the options array has `options.len()` entries.
    let compiled = unsafe {
        sys::nvrtcCompileProgram(program.0, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            module: name.to_owned(),
            log: program.log().unwrap_or_else(|e| e.to_string()),
        });
    }
    let mut size = 0usize;
    // SAFETY: live program, valid out-pointer.
    check("nvrtcGetCUBINSize", unsafe {
        sys::nvrtcGetCUBINSize(program.0, &mut size)
    })?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported.
    check("nvrtcGetCUBIN", unsafe {
        sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast())
    })?;
    Ok(cubin)
}

/// Destroys the NVRTC program when dropped, on every return path.
struct Program(sys::nvrtcProgram);

impl Program {
    fn log(&self) -> Result<String, CudaError> {
        let mut size = 0usize;
        // SAFETY: live program, valid out-pointer.
        check("nvrtcGetProgramLogSize", unsafe {
            sys::nvrtcGetProgramLogSize(self.0, &mut size)
        })?;
        let mut log = vec![0u8; size.max(1)];
        // SAFETY: `log` holds the reported size (which includes the NUL).
        check("nvrtcGetProgramLog", unsafe {
            sys::nvrtcGetProgramLog(self.0, log.as_mut_ptr().cast())
        })?;
        let text = CStr::from_bytes_until_nul(&log)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(&log).into_owned());
        Ok(text.trim().to_owned())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        // A failure to free it cannot be acted on here.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn check(call: &'static str, result: sys::nvrtcResult) -> Result<(), CudaError> {
    if result == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any result.
    let text = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(result)) };
    Err(CudaError::Nvrtc {
        call,
        message: text.to_string_lossy().into_owned(),
    })
}
