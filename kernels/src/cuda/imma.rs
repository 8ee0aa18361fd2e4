//! int8 products of many activation rows through cuBLASLt's tensor-core GEMMs (IMMA):
//! `sums[m, n] = xq[m, k] · Wᵀ` exactly in i32, then `w8a8_scale` (`w8a8.cu`) applies the
//! epilogue the hand-written kernels apply, `xs[i] · ws[j] · sum`, rounded once (so the result
//! is the CPU's to the last bit either way). FP8 has the library apply its scales instead
//! (`fp8.rs`).
//!
//! Why: the first H100 run measured W8A8 at 1,084 tok/s at high concurrency against vLLM's
//! 7,582 (CUTLASS's kernels). The hand-written prefill tile (`w8a8_gemm_t8`) reads its weights
//! from L2 per 64 tokens without staging them in shared memory; the library's Hopper kernels
//! are built for these shapes. Decode of up to 8 rows keeps the hand-written tile, which reads
//! the weights once at full bandwidth.

use super::CudaError;
use super::gpu::{DevPtr, Gpu};
use super::lt::{Codes, Lt, Matmul, Product};
use super::ops::{Dtype, i32_of};

/// A W8A8 projection through the library: `out[m, n] = xs · ws · (xq[m, k] · wᵀ)`, the
/// products summed `chunk` rows at a time into `sums`, each chunk then scaled into `out`.
pub(crate) struct LibraryGemm<'a> {
    pub lt: &'a Lt,
    pub dtype: Dtype,
    pub out: DevPtr,
    pub xq: DevPtr,
    /// One per row of `xq`.
    pub x_scales: DevPtr,
    pub sums: DevPtr,
    pub w: DevPtr,
    /// One per row of `w`.
    pub w_scales: DevPtr,
    /// `(m, n, k)`.
    pub shape: (usize, usize, usize),
    pub chunk: usize,
}

#[allow(unsafe_code)]
impl Gpu {
    /// Runs `g` (see [`LibraryGemm`]).
    ///
    /// # Safety
    /// The pointers address buffers of `g.shape`'s extents, 16-byte aligned; `sums` holds
    /// `chunk * n` i32; `n` and `k` multiples of 16.
    pub(crate) unsafe fn library_gemm(&self, g: LibraryGemm<'_>) -> Result<(), CudaError> {
        let (m, n, k) = g.shape;
        let entry = match g.dtype {
            Dtype::F16 => "w8a8_scale_f16",
            Dtype::Bf16 => "w8a8_scale_bf16",
        };
        // cuBLASLt runs on the thread's current context (see `gemm.rs`).
        self.context().bind_to_thread()?;
        for first in (0..m).step_by(g.chunk.max(1)) {
            let rows = g.chunk.min(m - first);
            let product = Product {
                codes: Codes::Int8,
                shape: (rows, n, k),
                scaled: None,
            };
            let mm = Matmul::new(g.lt, product, (0, 0))?;
            // SAFETY: the caller's contract, for this chunk's rows.
            let xq = g.xq.offset::<u8>(first * k);
            unsafe { mm.run(self.stream(), g.w.0, xq.0, g.sums.0) }?;
            let args = [
                g.out.offset::<u16>(first * n).into(),
                g.sums.into(),
                g.x_scales.offset::<f32>(first).into(),
                g.w_scales.into(),
                i32_of("m", rows)?,
                i32_of("n", n)?,
            ];
            let grid = ((rows * n).div_ceil(256).clamp(1, 132 * 16) as u32, 1, 1);
            // SAFETY: the scale kernel's arguments; `out` holds the chunk's rows.
            unsafe { self.launch("w8a8", entry, grid, 256, 0, &args) }?;
        }
        Ok(())
    }
}
