//! 8-bit products of many activation rows through cuBLASLt's tensor-core GEMMs: int8 (IMMA),
//! `sums[m, n] = xq[m, k] · Wᵀ` exactly in i32, then `w8a8_scale` (`w8a8.cu`) applies the
//! epilogue the hand-written kernels apply, `xs[i] · ws[j] · sum`, rounded once (so the result
//! is the CPU's to the last bit either way); and FP8 e4m3 (sm_89+), the same product in f32
//! (full-precision accumulation: fast accumulation off), then `fp8_scale` (`fp8.cu`) with the
//! hand-written kernels' `sum · (s_w · s_x)`, for weights scaled per channel or per tensor and
//! activations per token (one scale pair per product).
//!
//! Why: the first H100 run measured W8A8 at 1,084 tok/s at high concurrency against vLLM's
//! 7,582 (CUTLASS's kernels). The hand-written prefill tile (`w8a8_gemm_t8`) reads its weights
//! from L2 per 64 tokens without staging them in shared memory; the library's Hopper kernels
//! are built for these shapes. Decode of up to 8 rows keeps the hand-written tile, which reads
//! the weights once at full bandwidth.
//!
//! The layouts are cuBLASLt's "TN" int8 case, the one its IMMA kernels take with the default
//! column order: `W` (`[n, k]` row-major) is a column-major `k × n` matrix used transposed,
//! `xq` (`[m, k]` row-major) a column-major `k × m` one, and the i32 result a column-major
//! `n × m` matrix, which is `[m, n]` row-major.

use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::CudaStream;

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};
pub(crate) use super::lt::Codes;
use super::lt::{Lt, WORKSPACE, lt_error};
use super::ops::i32_of;

/// Destroys a descriptor when dropped, whatever the call did.
struct Guard<F: FnMut()>(F);

impl<F: FnMut()> Drop for Guard<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// `sums[m, n] = xq[m, k] · wᵀ` on `stream` (`w` `[n, k]`, both row-major 8-bit codes), in i32
/// for int8 and f32 for e4m3.
///
/// # Safety
/// The pointers address buffers of those extents, 16-byte aligned; `n` and `k` multiples of 16
/// (the 8-bit kernels' requirement in the default column order).
#[allow(unsafe_code)]
pub(crate) unsafe fn gemm_8bit(
    lt: &Lt,
    stream: &CudaStream,
    codes: Codes,
    sums: DevPtr,
    xq: DevPtr,
    w: DevPtr,
    (m, n, k): (usize, usize, usize),
) -> Result<(), CudaError> {
    use sys::cublasLtMatmulDescAttributes_t as Attr;
    let err = |what: &'static str| move |e| lt_error(what, e);
    let (code_type, compute, scale_type, sum_type) = codes.types();
    let desc = lt::create_matmul_desc(compute, scale_type).map_err(err("matmul descriptor"))?;
    // SAFETY (every block below): descriptors are live until their guards drop; attribute
    // buffers are plain values of the sizes given; pointers per the caller's contract.
    let _desc = Guard(|| unsafe {
        let _ = lt::destroy_matmul_desc(desc);
    });
    let transposed: i32 = 1; // CUBLAS_OP_T
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            Attr::CUBLASLT_MATMUL_DESC_TRANSA,
            (&transposed as *const i32).cast(),
            std::mem::size_of::<i32>(),
        )
    }
    .map_err(err("transpose"))?;
    let layout = |ty, rows: usize, cols: usize, ld: usize| {
        lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64).map_err(err("layout"))
    };
    if codes == Codes::E4m3 {
        // Promote the partial sums to full f32 precision (Hopper's FP8 accumulators are
        // narrower): the hand-written kernels sum in f32.
        let fast: i8 = 0;
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                (&fast as *const i8).cast(),
                std::mem::size_of::<i8>(),
            )
        }
        .map_err(err("fast accumulation"))?;
    }
    let a = layout(code_type, k, n, k)?;
    let _a = Guard(|| unsafe {
        let _ = lt::destroy_matrix_layout(a);
    });
    let b = layout(code_type, k, m, k)?;
    let _b = Guard(|| unsafe {
        let _ = lt::destroy_matrix_layout(b);
    });
    let c = layout(sum_type, n, m, n)?;
    let _c = Guard(|| unsafe {
        let _ = lt::destroy_matrix_layout(c);
    });
    let algo = lt.algo((codes, m, n, k), || {
        let pref = lt::create_matmul_pref().map_err(err("preference"))?;
        let _pref = Guard(|| unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        });
        let room = WORKSPACE as u64;
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&room as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        }
        .map_err(err("workspace preference"))?;
        unsafe { lt::get_matmul_algo_heuristic(lt.handle(), desc, a, b, c, c, pref) }
            .map(|h| h.algo)
            .map_err(err("no 8-bit algorithm for this shape"))
    })?;
    // alpha = 1, beta = 0 in the scale type (i32 or f32: both one 4-byte word).
    let (alpha, beta): (u32, u32) = match codes {
        Codes::Int8 => (1, 0),
        Codes::E4m3 => (1f32.to_bits(), 0f32.to_bits()),
    };
    unsafe {
        lt::matmul(
            lt.handle(),
            desc,
            (&alpha as *const u32).cast::<c_void>(),
            (&beta as *const u32).cast::<c_void>(),
            w.0 as *const c_void,
            a,
            xq.0 as *const c_void,
            b,
            sums.0 as *const c_void,
            c,
            sums.0 as *mut c_void,
            c,
            &algo,
            lt.workspace_ptr() as *mut c_void,
            WORKSPACE,
            stream.cu_stream() as sys::cudaStream_t,
        )
    }
    .map_err(err("8-bit matmul"))
}

/// An 8-bit projection through the library: `out[m, n] = scale(xq[m, k] · wᵀ)`, the products
/// summed `chunk` rows at a time into `sums`, each chunk then scaled into `out` by `scale`
/// (a kernel `(T* out, sums, x_scales, w_scales, i32 m, i32 n, extra...)`, one x scale per row).
pub(crate) struct LibraryGemm<'a> {
    pub lt: &'a Lt,
    pub codes: Codes,
    pub out: DevPtr,
    pub xq: DevPtr,
    pub x_scales: DevPtr,
    pub sums: DevPtr,
    pub w: DevPtr,
    pub w_scales: DevPtr,
    /// `(m, n, k)`.
    pub shape: (usize, usize, usize),
    pub chunk: usize,
    /// The scale kernel: module and entry.
    pub scale: (&'static str, &'static str),
    /// The scale kernel's arguments after `n`.
    pub extra: &'a [Arg],
}

#[allow(unsafe_code)]
impl Gpu {
    /// Runs `g` (see [`LibraryGemm`]).
    ///
    /// # Safety
    /// The pointers address buffers of `g.shape`'s extents, 16-byte aligned; `sums` holds
    /// `chunk * n` 4-byte values; `n` and `k` multiples of 16.
    pub(crate) unsafe fn library_gemm(&self, g: LibraryGemm<'_>) -> Result<(), CudaError> {
        let (m, n, k) = g.shape;
        // cuBLASLt runs on the thread's current context (see `gemm.rs`).
        self.context().bind_to_thread()?;
        for first in (0..m).step_by(g.chunk.max(1)) {
            let rows = g.chunk.min(m - first);
            let xq = g.xq.offset::<u8>(first * k);
            let shape = (rows, n, k);
            // SAFETY: the caller's contract, for this chunk's rows.
            unsafe { gemm_8bit(g.lt, self.stream(), g.codes, g.sums, xq, g.w, shape) }?;
            let mut args = vec![
                g.out.offset::<u16>(first * n).into(),
                g.sums.into(),
                g.x_scales.offset::<f32>(first).into(),
                g.w_scales.into(),
                i32_of("m", rows)?,
                i32_of("n", n)?,
            ];
            args.extend_from_slice(g.extra);
            let grid = ((rows * n).div_ceil(256).clamp(1, 132 * 16) as u32, 1, 1);
            // SAFETY: the scale kernel's arguments; `out` holds the chunk's rows.
            unsafe { self.launch(g.scale.0, g.scale.1, grid, 256, 0, &args) }?;
        }
        Ok(())
    }
}
