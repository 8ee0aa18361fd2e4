//! cuBLASLt as the 8-bit GEMMs use it (int8 in `imma.rs`, FP8 in `fp8.rs`): the handle and
//! workspace, opened with a [`super::Gpu`] where libcublasLt loads; the code types and the
//! scales the library applies; one product's descriptors ([`Matmul`]), with the algorithm
//! chosen for each shape.
//!
//! The layouts are cuBLASLt's "TN" case, the one its 8-bit kernels take in the default column
//! order: `W` (`[n, k]` row-major) is a column-major `k × n` matrix used transposed, `xq`
//! (`[m, k]` row-major) a column-major `k × m` one, and the result a column-major `n × m`
//! matrix, which is `[m, n]` row-major.

use std::collections::HashMap;
use std::ffi::c_void;
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

/// The scales cuBLASLt applies to an FP8 product itself (cuBLASLt 12.9 and later, on sm_90),
/// writing the result in 16 bits with no epilogue kernel and no f32 products in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scaling {
    /// One f32 per weight row and one per token (`OUTER_VEC_32F` both).
    Outer,
    /// One f32 per 128 × 128 weight block, `[rows / 128][cols / 128]` row-major, that row of
    /// blocks a multiple of 4 long (`BLK128x128_32F`); and one per token and run of 128
    /// inputs, token-major within a run: `[cols / 128][m]` (`VEC128_32F`). PyTorch's
    /// `_scaled_mm` asks the same of these layouts (strides `(1, round_up(k / 128, 4))` and
    /// `(1, m)`).
    Blocks,
}

impl Scaling {
    /// (weights', activations') scale modes.
    fn modes(
        self,
    ) -> (
        sys::cublasLtMatmulMatrixScale_t,
        sys::cublasLtMatmulMatrixScale_t,
    ) {
        use sys::cublasLtMatmulMatrixScale_t as S;
        match self {
            Self::Outer => (
                S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
                S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
            ),
            Self::Blocks => (
                S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
            ),
        }
    }
}

/// One product: its codes, `(m, n, k)`, and either the sums in the compute type (`scaled`
/// `None`) or the result scaled by the library into a 16-bit type (`CUDA_R_16F`/`16BF`). What the library's choice of
/// algorithm depends on here (the descriptors' other attributes are the same for every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Product {
    pub codes: Codes,
    pub shape: (usize, usize, usize),
    pub scaled: Option<(Scaling, sys::cudaDataType_t)>,
}

/// cuBLASLt's workspace (NVIDIA's recommendation for Hopper).
pub(crate) const WORKSPACE: usize = 32 << 20;

/// A cuBLASLt handle and the workspace given to every call (so that it never allocates,
/// inside a graph capture least of all).
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    /// Kept alive for `workspace_ptr`.
    _workspace: CudaSlice<u8>,
    workspace_ptr: u64,
    /// The algorithm the heuristic chose for each product seen, or `None` where it had none:
    /// asked once a product, not once a call (the query costs tens of microseconds, and a
    /// prefill step makes one per projection and layer).
    algos: Mutex<HashMap<Product, Option<sys::cublasLtMatmulAlgo_t>>>,
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

    /// The algorithm for `key`: the one chosen before, or `choose`'s, kept; a refusal is kept
    /// too (a library without the scale modes answers the same every time).
    fn algo(
        &self,
        key: Product,
        choose: impl FnOnce() -> Result<sys::cublasLtMatmulAlgo_t, CudaError>,
    ) -> Result<sys::cublasLtMatmulAlgo_t, CudaError> {
        let mut algos = self.algos.lock().unwrap_or_else(|e| e.into_inner());
        match algos.get(&key) {
            Some(Some(a)) => return Ok(*a),
            Some(None) => {
                return Err(CudaError::Driver(format!(
                    "cuBLASLt has no algorithm for {key:?}"
                )));
            }
            None => {}
        }
        let a = choose();
        algos.insert(key, a.as_ref().ok().copied());
        a
    }
}

/// A product's descriptors: destroyed when dropped, whatever step of [`Matmul::new`] failed.
struct Descriptors {
    desc: sys::cublasLtMatmulDesc_t,
    /// `W`, `xq` and the result, as created.
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each was created by `Matmul::new` and is destroyed once, here.
        #[allow(unsafe_code)]
        unsafe {
            for &l in &self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

impl Descriptors {
    fn set<T>(
        &self,
        attr: sys::cublasLtMatmulDescAttributes_t,
        value: &T,
    ) -> Result<(), CudaError> {
        // SAFETY: the descriptor is live; the attribute buffer is a plain value of the size
        // given, the type cuBLASLt documents for `attr`.
        #[allow(unsafe_code)]
        unsafe {
            lt::set_matmul_desc_attribute(
                self.desc,
                attr,
                (value as *const T).cast(),
                std::mem::size_of::<T>(),
            )
        }
        .map_err(|e| lt_error(&format!("{attr:?}"), e))
    }

    fn abd(&self) -> [sys::cublasLtMatrixLayout_t; 3] {
        [self.layouts[0], self.layouts[1], self.layouts[2]]
    }

    /// The heuristic's first choice for these descriptors.
    fn heuristic(&self, lt: &Lt) -> Result<sys::cublasLtMatmulAlgo_t, CudaError> {
        let pref = lt::create_matmul_pref().map_err(|e| lt_error("preference", e))?;
        let room = WORKSPACE as u64;
        let [a, b, d] = self.abd();
        // SAFETY: the preference lives until destroyed below; the descriptors are live.
        #[allow(unsafe_code)]
        unsafe {
            let chosen = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&room as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
            .and_then(|()| lt::get_matmul_algo_heuristic(lt.handle, self.desc, a, b, d, d, pref));
            let _ = lt::destroy_matmul_pref(pref);
            chosen
                .map(|h| h.algo)
                .map_err(|e| lt_error("no algorithm for this product", e))
        }
    }
}

/// One product, described, with the algorithm for it.
pub(crate) struct Matmul<'a> {
    lt: &'a Lt,
    product: Product,
    d: Descriptors,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl<'a> Matmul<'a> {
    /// Describes `product`; where it is scaled, `scales` are the device addresses of the
    /// weights' and the activations' f32 scales, laid out as its [`Scaling`] says. An error where the library has no
    /// algorithm for it (a shape it does not take, or a library without the scale modes).
    pub(crate) fn new(lt: &'a Lt, product: Product, scales: (u64, u64)) -> Result<Self, CudaError> {
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        let (code_type, compute, scale_type, sum_type) = product.codes.types();
        let desc =
            lt::create_matmul_desc(compute, scale_type).map_err(|e| lt_error("descriptor", e))?;
        let mut d = Descriptors {
            desc,
            layouts: Vec::with_capacity(3),
        };
        d.set(Attr::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
        if product.codes == Codes::E4m3 {
            // Promote the partial sums to full f32 precision (Hopper's FP8 accumulators are
            // narrower): the hand-written kernels sum in f32.
            d.set(Attr::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &0i8)?;
        }
        let out_type = match product.scaled {
            Some((scaling, out_type)) => {
                let (w_mode, x_mode) = scaling.modes();
                d.set(Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &(w_mode as u32))?;
                d.set(Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &(x_mode as u32))?;
                d.set(Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.0)?;
                d.set(Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.1)?;
                out_type
            }
            None => sum_type,
        };
        let (m, n, k) = product.shape;
        for (ty, rows, cols) in [(code_type, k, n), (code_type, k, m), (out_type, n, m)] {
            let l = lt::create_matrix_layout(ty, rows as u64, cols as u64, rows as i64)
                .map_err(|e| lt_error("layout", e))?;
            d.layouts.push(l);
        }
        let algo = lt.algo(product, || d.heuristic(lt))?;
        Ok(Self {
            lt,
            product,
            d,
            algo,
        })
    }

    /// The scales the library applies, if any.
    pub(crate) fn scaling(&self) -> Option<Scaling> {
        self.product.scaled.map(|(s, _)| s)
    }

    /// `out = xq · wᵀ` (scaled where the product is) on `stream`; device addresses.
    ///
    /// # Safety
    /// The addresses are of buffers of the product's extents, 16-byte aligned, and so do the
    /// scales given to `new`; `n` and `k` multiples of 16 (the 8-bit kernels' requirement in
    /// the default column order).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn run(
        &self,
        stream: &CudaStream,
        w: u64,
        xq: u64,
        out: u64,
    ) -> Result<(), CudaError> {
        let [a, b, d] = self.d.abd();
        // alpha = 1, beta = 0 in the scale type (i32 or f32: both one 4-byte word).
        let (alpha, beta): (u32, u32) = match self.product.codes {
            Codes::Int8 => (1, 0),
            Codes::E4m3 => (1f32.to_bits(), 0f32.to_bits()),
        };
        // SAFETY: the caller's contract; beta is 0, so C is never read (it is D).
        unsafe {
            lt::matmul(
                self.lt.handle,
                self.d.desc,
                (&alpha as *const u32).cast::<c_void>(),
                (&beta as *const u32).cast::<c_void>(),
                w as *const c_void,
                a,
                xq as *const c_void,
                b,
                out as *const c_void,
                d,
                out as *mut c_void,
                d,
                &self.algo,
                self.lt.workspace_ptr as *mut c_void,
                WORKSPACE,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_error("8-bit matmul", e))
    }
}
