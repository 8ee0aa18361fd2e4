//! Weight-only quantized projections past the GEMV: the tensor-core kernel of `wq_mma.cu`
//! (codes dequantized in registers, 9–256 activation rows), and the choice among the three
//! ways ferrite multiplies by a quantized matrix ([`WqKernel`]), with [`Gpu::wq_matmul`]
//! dispatching on it. The device layout is the GEMV's ([`WqDevice`]).

use super::CudaError;
use super::gemm::{Linear, OutType};
use super::gpu::{DevPtr, Gpu};
use super::ops::{Dtype, i32_of};
use super::wq::{WqDevice, gemv_rows};
use super::wq_mins::WqMins;
use crate::wq::Bits;

/// Activation rows up to which [`WqKernel::choose`] takes the tensor-core kernel.
pub const MMA_MAX_M: usize = 256;

/// How `out[m, rows] = x[m, cols] · Wᵀ` is computed for a quantized `W`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqKernel {
    /// `wq_gemv`: one or two n8 mma tiles of activation rows, so about the same cost for
    /// m = 1..16.
    Gemv,
    /// `wq_mma`: weights streamed once per 64 activation rows, dequantized in registers.
    Mma,
    /// `wq_dequant` into a dense scratch matrix, then cuBLAS.
    Dequant,
}

impl WqKernel {
    /// The kernel for `m` activation rows; fixed thresholds for sm_80/sm_90 (issue #6 allows
    /// one table per arch):
    ///
    /// - m ≤ 16 ([`gemv_rows`]): the GEMV. It costs about the same for 1..16 rows (its two n8
    ///   tiles share every dequantized weight fragment) and, with 16 weight rows per block and
    ///   x read straight from L2, has the most blocks in flight; the mma kernel's x staging
    ///   and 32-row tiles only pay off once x is reused across more n8 tiles.
    /// - up to 256 ([`MMA_MAX_M`]): the mma kernel. Still (near) memory-bound at 16–64 rows,
    ///   where it reads the codes once instead of once per 8 rows (the GEMV) or writing and
    ///   reading a dense copy (2 + bits/8 bytes per weight, the dequant path).
    /// - above: dequantize, then cuBLAS. The dense copy's traffic is paid once per call and
    ///   amortized over m; cuBLAS's sm_90 kernels (wgmma, TMA) multiply ~1.5× faster than
    ///   mma.sync. By that estimate the crossover lies between 256 and ~750 rows; 256 is the
    ///   conservative end until it is measured on the H100.
    ///
    /// The choice depends on `m` alone today; `_w` is taken so that a per-shape table can
    /// replace these thresholds without touching callers.
    pub fn choose(m: usize, _w: &WqDevice) -> Self {
        if m <= gemv_rows() {
            Self::Gemv
        } else if m <= MMA_MAX_M {
            Self::Mma
        } else {
            Self::Dequant
        }
    }
}

/// The block tile of one `wq_mma` launch (the `_n16`/`_n32`/`_n64` entry points); its
/// geometry mirrors `wq_mma::Tile` in `wq_mma.cu`, whose launch contract lists the shared
/// memory sizes (the kernel traps when given less than it computes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaTile {
    N16,
    N32,
    N64,
}

impl MmaTile {
    /// The tile for `m` activation rows: the narrowest that holds them, 64 above 32 (the grid
    /// then tiles over m).
    pub fn for_m(m: usize) -> Self {
        match m {
            0..=16 => Self::N16,
            17..=32 => Self::N32,
            _ => Self::N64,
        }
    }

    /// (n8 tiles, warps along weight rows, pipeline stages): `Tile<BITS, NT, WM, STAGES>`.
    fn params(self) -> (usize, usize, usize) {
        match self {
            Self::N16 => (2, 2, 6),
            Self::N32 => (4, 4, 5),
            Self::N64 => (8, 4, 4),
        }
    }

    /// Activation rows per block (`BN`).
    pub fn activation_rows(self) -> usize {
        8 * self.params().0
    }

    /// Weight rows per block (`BM`).
    pub fn weight_rows(self) -> usize {
        16 * self.params().1
    }

    /// Dynamic shared memory of a launch (`Tile::SMEM`): `STAGES` stages of codes and
    /// activations, or the K-warps' f32 sums if larger.
    pub fn shared_bytes(self, bits: Bits) -> u32 {
        let (nt, wm, stages) = self.params();
        let (wk, bm, bn) = (8 / wm, 16 * wm, 8 * nt);
        let codes_per_unit = 128 / bits.storage() as usize;
        let units_per_stage = 2 * wk;
        let code_stride = units_per_stage * 16 + 16;
        let x_pad = match bits {
            Bits::B8 => 32,
            Bits::B4 | Bits::B3 => 64,
            Bits::B2 => 16,
        };
        let x_stride = units_per_stage * codes_per_unit * 2 + x_pad;
        let stage = bm * code_stride + bn * x_stride;
        let sums = wk * bn * (bm + 4) * 4;
        (stages * stage).max(sums) as u32
    }

    fn index(self) -> usize {
        match self {
            Self::N16 => 0,
            Self::N32 => 1,
            Self::N64 => 2,
        }
    }
}

/// The entry point `wq_mma_b<bits>_<dtype>_n<BN>`.
fn entry(bits: Bits, dtype: Dtype, tile: MmaTile) -> &'static str {
    macro_rules! tiles {
        ($prefix:literal) => {
            [
                concat!($prefix, "_n16"),
                concat!($prefix, "_n32"),
                concat!($prefix, "_n64"),
            ]
        };
    }
    let names = match (bits, dtype) {
        (Bits::B8, Dtype::F16) => tiles!("wq_mma_b8_f16"),
        (Bits::B8, Dtype::Bf16) => tiles!("wq_mma_b8_bf16"),
        (Bits::B4 | Bits::B3, Dtype::F16) => tiles!("wq_mma_b4_f16"),
        (Bits::B4 | Bits::B3, Dtype::Bf16) => tiles!("wq_mma_b4_bf16"),
        (Bits::B2, Dtype::F16) => tiles!("wq_mma_b2_f16"),
        (Bits::B2, Dtype::Bf16) => tiles!("wq_mma_b2_bf16"),
    };
    names[tile.index()]
}

#[allow(unsafe_code)]
impl Gpu {
    /// `out[m, rows] = x[m, cols] · Wᵀ` (both contiguous) on tensor cores, in one launch for
    /// any `m` (the grid tiles it; the tile is [`MmaTile::for_m`]).
    ///
    /// # Safety
    /// `w`'s pointers address a matrix of its shape in a layout [`super::wq::check_layout`]
    /// accepts; `x` holds `m * cols`, `out` `m * rows` elements; `x`, `out` and the codes are
    /// 16-byte aligned.
    pub unsafe fn wq_mma(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &WqDevice,
        m: usize,
    ) -> Result<(), CudaError> {
        if m == 0 || w.rows == 0 {
            return Ok(());
        }
        let tile = MmaTile::for_m(m);
        let row_blocks = w.rows.div_ceil(tile.weight_rows());
        let grid_y = u32::try_from(row_blocks)
            .ok()
            .filter(|&y| y <= 65_535)
            .ok_or_else(|| CudaError::Driver(format!("wq_mma: {} rows exceed the grid", w.rows)))?;
        let grid_x = u32::try_from(m.div_ceil(tile.activation_rows()))
            .map_err(|_| CudaError::Driver(format!("wq_mma: m = {m} exceeds the grid")))?;
        let args = [
            out.into(),
            x.into(),
            w.codes.into(),
            w.scales.into(),
            w.zeros.unwrap_or(DevPtr::NULL).into(),
            i32_of("m", m)?,
            i32_of("rows", w.rows)?,
            i32_of("cols", w.cols)?,
            i32_of("group_size", w.group_size)?,
        ];
        let entry = entry(w.bits, dtype, tile);
        let shared = tile.shared_bytes(w.bits);
        // SAFETY: the arguments follow the launch contract above the entry points in
        // wq_mma.cu; the pointers are the caller's (see this function's contract).
        // wq_mma.cu is compiled once per code width (sources.rs).
        let module = match w.bits {
            Bits::B8 => "wq_mma_b8",
            // 3-bit codes are stored as 4-bit ones.
            Bits::B4 | Bits::B3 => "wq_mma_b4",
            Bits::B2 => "wq_mma_b2",
        };
        unsafe { self.launch(module, entry, (grid_x, grid_y, 1), 256, shared, &args) }
    }

    /// `out[m, rows] = x[m, cols] · Wᵀ` through the kernel [`WqKernel::choose`] picks, with
    /// `mins` (a matrix's per-group minimums) added: inside the GEMV, or after the other
    /// kernels by [`Self::wq_add_mins`]. `dense_scratch` is used only by
    /// [`WqKernel::Dequant`] (m > [`MMA_MAX_M`]), which dequantizes `w` into it and hands it
    /// to cuBLAS; it may be [`DevPtr::NULL`] when no call takes that path (an error if one
    /// does).
    ///
    /// # Safety
    /// As [`Self::wq_mma`] and, with `mins`, [`Self::wq_add_mins`]; a non-null
    /// `dense_scratch` holds `rows * cols` elements, 16-byte aligned, and is not read by
    /// anything queued concurrently.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn wq_matmul(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &WqDevice,
        m: usize,
        dense_scratch: DevPtr,
        mins: Option<&WqMins>,
    ) -> Result<(), CudaError> {
        // SAFETY (every call below): the caller's contract is each callee's.
        match WqKernel::choose(m, w) {
            WqKernel::Gemv => {
                return unsafe { self.wq_gemv(dtype, out, x, w, m, mins.map(|n| n.mins)) };
            }
            WqKernel::Mma => unsafe { self.wq_mma(dtype, out, x, w, m) }?,
            WqKernel::Dequant => {
                if dense_scratch == DevPtr::NULL {
                    return Err(CudaError::Driver(format!(
                        "wq_matmul: m = {m} dequantizes, but no scratch matrix was given"
                    )));
                }
                let shape = Linear {
                    m,
                    n: w.rows,
                    k: w.cols,
                    x_stride: w.cols,
                    out_stride: w.rows,
                };
                unsafe {
                    self.wq_dequant(dtype, dense_scratch, w)?;
                    self.linear(dtype, OutType::Same, out, x, dense_scratch, shape)?;
                }
            }
        }
        match mins {
            Some(n) => unsafe { self.wq_add_mins(dtype, out, x, w, n, m) },
            None => Ok(()),
        }
    }
}
