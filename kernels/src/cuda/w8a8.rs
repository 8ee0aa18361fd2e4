//! Launch wrappers for W8A8 projections (`w8a8.cu`): activations rounded to int8 per token on
//! the device, then int8 × int8 tensor-core products (`mma.sync` m16n8k32) scaled in the
//! epilogue. The device layout is the CPU's [`crate::w8a8::I8Matrix`]: int8 codes row-major,
//! one f32 scale per row; the arithmetic is the CPU's too, so the two agree to the last bit
//! before the output is rounded to the activation type.

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};
use super::ops::{Dtype, i32_of};

/// Rows of activations up to which the GEMM takes one 8-token tile per warp (decode); above,
/// eight (prefill).
pub const DECODE_MAX_M: usize = 8;
/// Weight rows one GEMM block covers (4 warps of 16).
const BLOCK_ROWS: usize = 64;

/// Weight rows a block of the 8-bit GEMMs (this module's and FP8's, both over tile8.cuh)
/// covers: 16 in decode, where its warps split k instead.
pub(crate) fn block_rows(decode: bool) -> usize {
    if decode { 16 } else { BLOCK_ROWS }
}

/// An int8 `[rows, cols]` matrix in device memory.
#[derive(Debug, Clone, Copy)]
pub struct I8Device {
    /// `rows * cols` int8 codes, row-major.
    pub codes: DevPtr,
    /// `rows` f32 scales.
    pub scales: DevPtr,
    pub rows: usize,
    pub cols: usize,
}

/// Activations rounded to int8: `m * cols` codes (16-byte aligned) and `m` f32 scales; and
/// room for the i32 products of cuBLASLt's GEMM (`sums_len` elements at `sums`, 16-byte
/// aligned; a GEMM of more rows than fit runs in chunks, and none fit where `sums_len` is 0:
/// then only the hand-written kernels run).
#[derive(Debug, Clone, Copy)]
pub struct I8Rows {
    pub codes: DevPtr,
    pub scales: DevPtr,
    pub sums: DevPtr,
    pub sums_len: usize,
}

/// Whether 8-bit GEMMs of more than [`DECODE_MAX_M`] rows (int8 here, FP8 in `fp8.rs`) go
/// through cuBLASLt where it opened: yes, unless `FERRITE_W8A8_GEMM=mma` keeps the hand-written
/// tiles (an A/B on one machine).
pub(crate) fn library_gemm() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRITE_W8A8_GEMM").as_deref() != Ok("mma"))
}

/// Whether the kernels take rows of `cols`: whole 64-byte chunks (every lane reads 16 bytes of
/// each).
pub fn check_layout(cols: usize) -> Result<(), CudaError> {
    if cols == 0 || !cols.is_multiple_of(64) {
        return Err(CudaError::Driver(format!(
            "W8A8 at {cols} columns: the GPU kernels need a multiple of 64"
        )));
    }
    Ok(())
}

fn gemm_name(decode: bool, dtype: Dtype) -> &'static str {
    match (decode, dtype) {
        (true, Dtype::F16) => "w8a8_gemm_t1_f16",
        (true, Dtype::Bf16) => "w8a8_gemm_t1_bf16",
        (false, Dtype::F16) => "w8a8_gemm_t8_f16",
        (false, Dtype::Bf16) => "w8a8_gemm_t8_bf16",
    }
}

#[allow(unsafe_code)]
impl Gpu {
    /// Rounds `m` rows of `x` (`cols` wide, the activation type) to int8 into `q`.
    ///
    /// # Safety
    /// `x` holds `m * cols` elements; `q` has room for `m * cols` codes and `m` scales.
    pub unsafe fn w8a8_quantize(
        &self,
        dtype: Dtype,
        q: I8Rows,
        x: DevPtr,
        m: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        let entry = match dtype {
            Dtype::F16 => "w8a8_quantize_f16",
            Dtype::Bf16 => "w8a8_quantize_bf16",
        };
        let args = [
            q.codes.into(),
            q.scales.into(),
            x.into(),
            i32_of("m", m)?,
            i32_of("cols", cols)?,
        ];
        let grid = (m.clamp(1, 65_535) as u32, 1, 1);
        unsafe { self.launch("w8a8", entry, grid, 256, 0, &args) }
    }

    /// `out[m, rows] = x[m, cols] · Wᵀ`, `x` rounded to int8 in `scratch` first.
    ///
    /// # Safety
    /// As [`Self::w8a8_quantize`] and [`Self::w8a8_gemm`]; `w.cols` passed [`check_layout`].
    pub unsafe fn w8a8_matmul(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &I8Device,
        m: usize,
        scratch: I8Rows,
    ) -> Result<(), CudaError> {
        unsafe {
            self.w8a8_quantize(dtype, scratch, x, m, w.cols)?;
            self.w8a8_gemm(dtype, out, scratch, w, m)
        }
    }

    /// `out[m, rows] = q · Wᵀ` for activations already rounded to int8.
    ///
    /// # Safety
    /// `q` holds `m` rows of `w.cols` codes and their scales; `out` has room for `m * w.rows`
    /// elements; the codes of both are 16-byte aligned.
    pub unsafe fn w8a8_gemm(
        &self,
        dtype: Dtype,
        out: DevPtr,
        q: I8Rows,
        w: &I8Device,
        m: usize,
    ) -> Result<(), CudaError> {
        check_layout(w.cols)?;
        let chunk = q.sums_len / w.rows.max(1);
        // cuBLASLt's 8-bit kernels in the default order want the output rows a multiple of 16.
        let takes = m > DECODE_MAX_M && chunk > 0 && w.rows.is_multiple_of(16) && library_gemm();
        if let Some(lt) = self.lt().filter(|_| takes) {
            // A shape the library turns down (no algorithm) falls back to the tile below, which
            // writes every output whatever the library had written.
            if unsafe { self.w8a8_library_gemm(lt, dtype, out, q, w, m, chunk) }.is_ok() {
                return Ok(());
            }
        }
        let decode = m <= DECODE_MAX_M;
        let tok = if decode { 1 } else { 8 };
        let grid = (
            w.rows.div_ceil(block_rows(decode)) as u32,
            m.div_ceil(8 * tok).max(1) as u32,
            1,
        );
        let args: [Arg; 8] = [
            out.into(),
            q.codes.into(),
            q.scales.into(),
            w.codes.into(),
            w.scales.into(),
            i32_of("m", m)?,
            i32_of("rows", w.rows)?,
            i32_of("cols", w.cols)?,
        ];
        unsafe { self.launch("w8a8", gemm_name(decode, dtype), grid, 128, 0, &args) }
    }

    /// [`Self::w8a8_gemm`] through cuBLASLt (`imma.rs`), `chunk` rows of `q` at a time into
    /// `q.sums`, each then scaled into `out` by `w8a8_scale`.
    ///
    /// # Safety
    /// As [`Self::w8a8_gemm`]; `q.sums` holds `chunk * w.rows` i32.
    #[allow(clippy::too_many_arguments)]
    unsafe fn w8a8_library_gemm(
        &self,
        lt: &super::lt::Lt,
        dtype: Dtype,
        out: DevPtr,
        q: I8Rows,
        w: &I8Device,
        m: usize,
        chunk: usize,
    ) -> Result<(), CudaError> {
        let gemm = super::imma::LibraryGemm {
            lt,
            dtype,
            out,
            xq: q.codes,
            x_scales: q.scales,
            sums: q.sums,
            w: w.codes,
            w_scales: w.scales,
            shape: (m, w.rows, w.cols),
            chunk,
        };
        // SAFETY: the caller's contract is `library_gemm`'s.
        unsafe { self.library_gemm(gemm) }
    }
}
