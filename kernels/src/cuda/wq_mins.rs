//! The per-group minimums of a weight-only quantized matrix on the GPU (GGUF Q4_1, Q4_K and
//! Q5_K repacked, see [`crate::wq::gguf`]): `w = scale·(q − zero) + min`. The GEMV (up to 16
//! rows, decode) sums the minimums' term itself, from group sums of `x` it takes with one more
//! mma per fragment (`wq_gemv.cu`): one launch, not three. The other kernels (`wq_mma`;
//! `wq_dequant`, then cuBLAS) compute the `scale·(q − zero)` part; [`Gpu::wq_add_mins`] adds
//! the rest,
//!
//! `out[i, r] += Σ_g min[r, g] · Σ_{k∈g} x[i, k] = group_size · Σ_g min[r, g] · mean[i, g]`,
//!
//! in two launches: the group means of `x` (`wq_mins.cu`, into a scratch the caller owns), then
//! their product with the minimums accumulated into `out` by cuBLAS (`beta = 1`,
//! [`Gpu::linear_add`]).
//!
//! Why cuBLAS for the product: it is `m · rows · groups` multiply-adds, `1/group_size` of the
//! projection's, and on tensor cores stays that small a fraction at prefill sizes, where a
//! hand-written CUDA-core kernel (~15× less throughput per multiply-add on an H100) would add
//! about half the projection's time; at decode sizes either is a few microseconds. The price
//! is that means and minimums are in the activation type (the product still accumulates in
//! f32, onto `out`'s value, and is rounded once); the repacks keep the minimums small (codes
//! centred on their zero), so their rounding adds little to the main product's.

use super::CudaError;
use super::gemm::Linear;
use super::gpu::{DevPtr, Gpu};
use super::ops::{Dtype, i32_of};
use super::wq::WqDevice;

/// A quantized matrix's minimums on the device, with the scratch their correction uses.
#[derive(Debug, Clone, Copy)]
pub struct WqMins {
    /// `rows * groups` values of the activation type, row-major like the matrix's scales.
    pub mins: DevPtr,
    /// Room for [`means_len`] values of the activation type (the largest `m` passed).
    pub means: DevPtr,
}

/// Values of the activation type [`WqMins::means`] needs for `m` rows of `x`: one per row and
/// group.
pub fn means_len(w: &WqDevice, m: usize) -> usize {
    m * w.cols.div_ceil(w.group_size.max(1))
}

#[allow(unsafe_code)]
impl Gpu {
    /// `out[m, rows] += x[m, cols] · Mᵀ`, `M[r, k] = mins[r, k / group_size]`: the minimums of
    /// `w`'s groups added to the product with `w` that `out` already holds. Allocates nothing
    /// and never synchronizes, so it can be captured in a CUDA graph (after one eager run, as
    /// for any cuBLAS call, so cuBLAS has chosen its kernels).
    ///
    /// # Safety
    /// `out` holds `m * rows` and `x` `m * cols` elements of `dtype`, both contiguous; `mins`
    /// addresses `w`'s `rows * groups` minimums and `means` room for `means_len(w, m)`
    /// elements that nothing else uses while the stream runs this.
    pub unsafe fn wq_add_mins(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &WqDevice,
        mins: &WqMins,
        m: usize,
    ) -> Result<(), CudaError> {
        if w.group_size == 0 {
            return Err(CudaError::Driver("wq_add_mins: group size 0".into()));
        }
        let n = means_len(w, m);
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        let groups = n / m;
        let grid = u32::try_from(n.div_ceil(256))
            .ok()
            .filter(|&g| g <= i32::MAX as u32)
            .ok_or_else(|| CudaError::Driver(format!("{n} group means exceed a grid")))?;
        let entry = match dtype {
            Dtype::F16 => "wq_group_means_f16",
            Dtype::Bf16 => "wq_group_means_bf16",
        };
        let args = [
            mins.means.into(),
            x.into(),
            i32_of("m", m)?,
            i32_of("cols", w.cols)?,
            i32_of("group_size", w.group_size)?,
        ];
        let product = Linear {
            m,
            n: w.rows,
            k: groups,
            x_stride: groups,
            out_stride: w.rows,
        };
        // SAFETY: the arguments follow `wq_group_means`' launch contract: `means` holds
        // m * groups elements and `x` m * cols, per this function's contract; the product reads
        // the means just written (same stream), the `rows * groups` minimums and `out`.
        unsafe {
            self.launch("wq_mins", entry, (grid, 1, 1), 256, 0, &args)?;
            self.linear_add(
                dtype,
                out,
                mins.means,
                mins.mins,
                product,
                w.group_size as f32,
            )
        }
    }
}
