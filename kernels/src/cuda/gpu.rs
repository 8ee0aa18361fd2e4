//! One CUDA device opened for ferrite: its context, the stream every op runs on, the kernel
//! modules loaded from the CUBIN cache, and a launcher that takes plain argument lists.
//!
//! One stream, with cudarc's per-buffer event tracking switched off: ferrite's ops run in
//! stream order, and CUDA graph capture refuses the cross-stream events that tracking records
//! (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`). Buffers therefore must outlive the work queued on
//! them; the engine owns every buffer for the whole life of the model, and the wrappers in
//! [`super::ops`] take device pointers ([`DevPtr`]) rather than borrowed slices so that one
//! buffer can hold several tensors (a fused QKV output, a KV cache of many layers).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::cache::{KernelCache, ModuleBuild};
use super::{CudaError, MODULES, arch_of, build_modules};
use crate::device::CudaDevice;

/// cuBLAS workspace bytes (what its documentation suggests for Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;

/// A device address (`CUdeviceptr`), passed to kernels as a `T*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevPtr(pub u64);

impl DevPtr {
    /// The address `elems` elements of `T` further on.
    pub fn offset<T>(self, elems: usize) -> Self {
        Self(self.0 + (elems * std::mem::size_of::<T>()) as u64)
    }

    /// A null pointer (optional kernel arguments such as absent zero points).
    pub const NULL: Self = Self(0);
}

/// One kernel argument. Kernels take pointers, `i32` sizes, `i64` counts, `u64` seeds and
/// `f32` scalars.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(DevPtr),
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
}

impl From<DevPtr> for Arg {
    fn from(p: DevPtr) -> Self {
        Self::Ptr(p)
    }
}

/// An opened device with ferrite's kernels loaded.
pub struct Gpu {
    pub device: CudaDevice,
    pub arch: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    /// cuBLAS on `stream`; `None` where libcublas could not be loaded.
    blas: Option<CudaBlas>,
    /// cuBLAS's workspace, given to it once so that it never allocates inside a CUDA graph
    /// capture.
    _blas_workspace: Option<CudaSlice<u8>>,
    /// cuBLASLt on `stream` (W8A8 GEMMs of many rows); `None` where libcublasLt could not be
    /// loaded or opened: the hand-written kernels then take every size.
    lt: Option<super::lt::Lt>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("device", &self.device)
            .field("arch", &self.arch)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens `cuda:<ordinal>` and loads every kernel module, compiling those not in the cache
    /// at `cache_dir`. Returns how each module was obtained (the `kernel_compile` phase).
    pub fn open(ordinal: usize, cache_dir: &Path) -> Result<(Self, Vec<ModuleBuild>), CudaError> {
        let devices = crate::device::cuda_devices().map_err(CudaError::Driver)?;
        let device = devices.get(ordinal).cloned().ok_or_else(|| {
            CudaError::Driver(format!("no cuda:{ordinal} ({} device(s))", devices.len()))
        })?;
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: no buffer exists yet, and every later one is used on `stream` only.
        #[allow(unsafe_code)]
        unsafe {
            ctx.disable_event_tracking()
        };
        let stream = ctx.new_stream()?;
        let arch = arch_of(device.compute_capability);
        let cache = KernelCache::new(cache_dir, &arch)?;
        let mut modules = HashMap::new();
        let mut builds = Vec::with_capacity(MODULES.len());
        for (source, (cubin, build)) in MODULES.iter().zip(build_modules(&cache)?) {
            modules.insert(source.name, ctx.load_module(Ptx::from_binary(cubin))?);
            builds.push(build);
        }
        // SAFETY: only tries to dlopen libcublas by its candidate names.
        #[allow(unsafe_code)]
        let (blas, blas_workspace) = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            let blas = CudaBlas::new(stream.clone())
                .map_err(|e| CudaError::Driver(format!("cuBLAS: {e}")))?;
            let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE)?;
            let ptr = workspace.device_ptr(&stream).0;
            // SAFETY: the workspace lives as long as the handle (both owned by this Gpu) and
            // is used on the handle's stream only.
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    BLAS_WORKSPACE,
                )
            }
            .result()
            .map_err(|e| CudaError::Driver(format!("cuBLAS workspace: {e}")))?;
            (Some(blas), Some(workspace))
        } else {
            (None, None)
        };
        // An optimization only: a cuBLASLt that does not open leaves the hand-written kernels.
        let lt = super::lt::Lt::open(&stream).unwrap_or(None);
        let gpu = Self {
            device,
            arch,
            ctx,
            stream,
            modules,
            blas,
            _blas_workspace: blas_workspace,
            lt,
            functions: Mutex::new(HashMap::new()),
        };
        Ok((gpu, builds))
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// cuBLAS, bound to this device's stream.
    pub fn blas(&self) -> Result<&CudaBlas, CudaError> {
        self.blas
            .as_ref()
            .ok_or_else(|| CudaError::Driver("cuBLAS (libcublas.so.13) could not be loaded".into()))
    }

    /// Free and total device memory in bytes.
    /// cuBLASLt, where it opened.
    pub(crate) fn lt(&self) -> Option<&super::lt::Lt> {
        self.lt.as_ref()
    }

    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Waits for every queued op.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }

    /// A zeroed buffer of `len` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.alloc_zeros(len.max(1))?)
    }

    /// A buffer holding a copy of `host`.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        if host.is_empty() {
            // cuMemAlloc refuses 0 bytes; an empty tensor still needs a valid address.
            // SAFETY: one element is allocated and never read before being written.
            #[allow(unsafe_code)]
            return Ok(unsafe { self.stream.alloc::<T>(1) }?);
        }
        Ok(self.stream.clone_htod(host)?)
    }

    /// Copies the first `len` elements of `buf` back to the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &CudaSlice<T>,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        // Only the `len` wanted: a step's logits are a few rows of a buffer sized for the
        // largest batch.
        let len = len.min(buf.len());
        let mut out = vec![T::default(); len];
        if len > 0 {
            self.stream.memcpy_dtoh(&buf.slice(..len), &mut out)?;
            self.stream.synchronize()?;
        }
        Ok(out)
    }

    /// `buf`'s device address.
    pub fn ptr<T>(&self, buf: &CudaSlice<T>) -> DevPtr {
        let (p, _sync) = buf.device_ptr(&self.stream);
        DevPtr(p)
    }

    fn function(
        &self,
        module: &'static str,
        entry: &'static str,
    ) -> Result<CudaFunction, CudaError> {
        let mut functions = self
            .functions
            .lock()
            .map_err(|_| CudaError::Driver("kernel table poisoned".into()))?;
        if let Some(f) = functions.get(entry) {
            return Ok(f.clone());
        }
        let m = self
            .modules
            .get(module)
            .ok_or_else(|| CudaError::Driver(format!("no kernel module `{module}`")))?;
        let f = m
            .load_function(entry)
            .map_err(|e| CudaError::Driver(format!("{module}.{entry}: {e}")))?;
        functions.insert(entry, f.clone());
        Ok(f)
    }

    /// Queues `module.entry<<<grid, block, shared>>>(args…)` on the stream.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameter list in number, order and type, and
    /// every pointer must address device memory of the extent the kernel's launch contract
    /// (its comment in `kernels/cuda/`) requires, alive until the kernel has run.
    #[allow(unsafe_code)]
    pub unsafe fn launch(
        &self,
        module: &'static str,
        entry: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        // This device's context first: loading the function and setting its attribute call
        // the driver directly (cudarc binds only inside `launch`), and on a thread whose
        // current context is another device's (cuda:N, N ≠ 0) or none they would fail or act
        // there. A thread-local compare when already bound.
        self.ctx.bind_to_thread()?;
        let f = self.function(module, entry)?;
        if shared_bytes > 48 * 1024 {
            // Above 48 KiB a kernel must opt in to more dynamic shared memory.
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes as i32,
            )?;
        }
        let mut builder = self.stream.launch_builder(&f);
        for a in args {
            match a {
                Arg::Ptr(p) => builder.arg(&p.0),
                Arg::I32(v) => builder.arg(v),
                Arg::I64(v) => builder.arg(v),
                Arg::U64(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: shared_bytes,
        };
        // SAFETY: the caller upholds the kernel's contract (see above).
        unsafe { builder.launch(cfg) }?;
        Ok(())
    }
}
