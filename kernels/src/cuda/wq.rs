//! Launch wrappers for weight-only quantized projections (`wq_gemv.cu`): a GEMV-style kernel
//! for batches of 1–16 rows that streams the packed codes once, and a dequantizer to a dense
//! matrix for larger batches (then cuBLAS). The device layout is the CPU's (see
//! [`crate::wq`]): packed codes row-major, one scale (in the activation type) and, for the
//! asymmetric formats, one u8 zero point per (row, group). [`Gpu::wq_gemv_gated`] is the GEMV
//! reading the MLP's gate|up buffer as its input, the activation computed as it loads (the
//! decode down projection without the activation kernel).

use std::sync::OnceLock;

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};
use super::ops::{Dtype, i32_of};
use crate::wq::{Bits, WqFormat};

/// Rows of activations one GEMV launch takes at most: two n8 tiles of the mma, which share
/// every weight fragment (`wq_gemv16_*`, `dense_gemv16_*`).
pub const GEMV_MAX_M: usize = 16;

/// The most rows of `x` the GEMVs (this quantized one and the dense one, `gemm.rs`) take:
/// [`GEMV_MAX_M`], or what `FERRITE_GEMV_ROWS` says, for A/B runs on one machine: `8` (one
/// n8 tile, the limit before the second), `0` (no GEMV: cuBLAS for dense weights, the
/// tensor-core GEMM for quantized ones). Anything else keeps the default.
pub fn gemv_rows() -> usize {
    static ROWS: OnceLock<usize> = OnceLock::new();
    *ROWS.get_or_init(|| match std::env::var("FERRITE_GEMV_ROWS").as_deref() {
        Ok("0") => 0,
        Ok("8") => 8,
        _ => GEMV_MAX_M,
    })
}

/// A quantized `[rows, cols]` matrix in device memory.
#[derive(Debug, Clone, Copy)]
pub struct WqDevice {
    /// `rows * cols * bits / 8` bytes.
    pub codes: DevPtr,
    /// `rows * groups` values of the activation type.
    pub scales: DevPtr,
    /// `rows * groups` u8, or `None` for a symmetric format.
    pub zeros: Option<DevPtr>,
    pub bits: Bits,
    pub rows: usize,
    pub cols: usize,
    pub group_size: usize,
}

/// Whether the GPU kernels take `format` at rows of `cols`: each row's codes a whole number of
/// 16-byte vectors, groups a multiple of 32 (or one per row).
pub fn check_layout(format: &WqFormat, cols: usize) -> Result<(), CudaError> {
    let row_bytes = cols * format.bits.storage() as usize / 8;
    let g = format.group_len(cols);
    if !row_bytes.is_multiple_of(16) || (!g.is_multiple_of(32) && g != cols) {
        return Err(CudaError::Driver(format!(
            "{format} at {cols} columns: the GPU kernels need rows of whole 16-byte vectors and \
             groups a multiple of 32"
        )));
    }
    Ok(())
}

fn name(kind: &str, bits: Bits, dtype: Dtype) -> &'static str {
    match (kind, bits, dtype) {
        ("gemv16", Bits::B8, Dtype::F16) => "wq_gemv16_b8_f16",
        ("gemv16", Bits::B8, Dtype::Bf16) => "wq_gemv16_b8_bf16",
        ("gemv16", Bits::B4 | Bits::B3, Dtype::F16) => "wq_gemv16_b4_f16",
        ("gemv16", Bits::B4 | Bits::B3, Dtype::Bf16) => "wq_gemv16_b4_bf16",
        ("gemv16", Bits::B2, Dtype::F16) => "wq_gemv16_b2_f16",
        ("gemv16", Bits::B2, Dtype::Bf16) => "wq_gemv16_b2_bf16",
        ("gemv", Bits::B8, Dtype::F16) => "wq_gemv_b8_f16",
        ("gemv", Bits::B8, Dtype::Bf16) => "wq_gemv_b8_bf16",
        ("gemv", Bits::B4 | Bits::B3, Dtype::F16) => "wq_gemv_b4_f16",
        ("gemv", Bits::B4 | Bits::B3, Dtype::Bf16) => "wq_gemv_b4_bf16",
        ("gemv", Bits::B2, Dtype::F16) => "wq_gemv_b2_f16",
        ("gemv", Bits::B2, Dtype::Bf16) => "wq_gemv_b2_bf16",
        (_, Bits::B8, Dtype::F16) => "wq_dequant_b8_f16",
        (_, Bits::B8, Dtype::Bf16) => "wq_dequant_b8_bf16",
        (_, Bits::B4 | Bits::B3, Dtype::F16) => "wq_dequant_b4_f16",
        (_, Bits::B4 | Bits::B3, Dtype::Bf16) => "wq_dequant_b4_bf16",
        (_, Bits::B2, Dtype::F16) => "wq_dequant_b2_f16",
        (_, Bits::B2, Dtype::Bf16) => "wq_dequant_b2_bf16",
    }
}

/// The GEMV reading the gate|up buffer (`wq_gemv.cu`'s `WQ_GEMV_GATED` module): two n8 tiles
/// when `two_tiles`, GELU-tanh when `gelu`, else SiLU.
fn gated_name(two_tiles: bool, gelu: bool, bits: Bits, dtype: Dtype) -> &'static str {
    macro_rules! by_width {
        ($gemv:literal, $act:literal) => {
            match (bits, dtype) {
                (Bits::B8, Dtype::F16) => concat!("wq_", $gemv, "_", $act, "_b8_f16"),
                (Bits::B8, Dtype::Bf16) => concat!("wq_", $gemv, "_", $act, "_b8_bf16"),
                (Bits::B4 | Bits::B3, Dtype::F16) => concat!("wq_", $gemv, "_", $act, "_b4_f16"),
                (Bits::B4 | Bits::B3, Dtype::Bf16) => {
                    concat!("wq_", $gemv, "_", $act, "_b4_bf16")
                }
                (Bits::B2, Dtype::F16) => concat!("wq_", $gemv, "_", $act, "_b2_f16"),
                (Bits::B2, Dtype::Bf16) => concat!("wq_", $gemv, "_", $act, "_b2_bf16"),
            }
        };
    }
    match (two_tiles, gelu) {
        (false, false) => by_width!("gemv", "silu"),
        (false, true) => by_width!("gemv", "gelu"),
        (true, false) => by_width!("gemv16", "silu"),
        (true, true) => by_width!("gemv16", "gelu"),
    }
}

/// Where a GEMV launch reads its activation rows: x itself, or the MLP's gate|up buffer.
#[derive(Debug, Clone, Copy)]
enum XSource {
    Plain,
    Gated { gelu: bool },
}

fn tail(w: &WqDevice) -> Result<[Arg; 3], CudaError> {
    Ok([
        i32_of("rows", w.rows)?,
        i32_of("cols", w.cols)?,
        i32_of("group_size", w.group_size)?,
    ])
}

#[allow(unsafe_code)]
impl Gpu {
    /// `out[m, rows] = x[m, cols] · Wᵀ` (both contiguous), in launches of up to
    /// [`GEMV_MAX_M`] rows of `x`; with `mins` (a matrix's per-group minimums, `rows * groups`
    /// values of the activation type, see `wq_mins`), `W` is `scale·(q − zero) + min` and the
    /// minimums' term is summed in the same launch.
    ///
    /// # Safety
    /// `w`'s pointers address a matrix of its shape; `x` holds `m * cols`, `out`
    /// `m * rows` elements; `x` and the codes are 16-byte aligned; `mins` addresses
    /// `rows * groups` values.
    pub unsafe fn wq_gemv(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &WqDevice,
        m: usize,
        mins: Option<DevPtr>,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract is this one's.
        unsafe { self.wq_gemv_from(XSource::Plain, dtype, out, x, w, m, mins) }
    }

    /// The down projection of the MLP read straight from its gate|up buffer: as
    /// [`Self::wq_gemv`] with `x[n][c] = act(gate_up[n][c]) · gate_up[n][cols + c]`
    /// (GELU-tanh when `gelu`, else SiLU), each `x` value rounded to `dtype` as
    /// [`Self::gated_activation`] stores it, so the result is that op followed by
    /// [`Self::wq_gemv`], bit for bit, without the activation's launch.
    ///
    /// # Safety
    /// As [`Self::wq_gemv`], with `gate_up` (16-byte aligned) holding `m` contiguous rows of
    /// `2 * cols` elements in place of `x`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn wq_gemv_gated(
        &self,
        dtype: Dtype,
        gelu: bool,
        out: DevPtr,
        gate_up: DevPtr,
        w: &WqDevice,
        m: usize,
        mins: Option<DevPtr>,
    ) -> Result<(), CudaError> {
        let x = XSource::Gated { gelu };
        // SAFETY: the caller's contract is this one's.
        unsafe { self.wq_gemv_from(x, dtype, out, gate_up, w, m, mins) }
    }

    /// [`Self::wq_gemv`] with its activation rows from `source` at `x`.
    ///
    /// # Safety
    /// As [`Self::wq_gemv`]; `x` holds `m` rows as `source` reads them.
    #[allow(clippy::too_many_arguments)]
    unsafe fn wq_gemv_from(
        &self,
        source: XSource,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &WqDevice,
        m: usize,
        mins: Option<DevPtr>,
    ) -> Result<(), CudaError> {
        let grid = (w.rows.div_ceil(16) as u32, 1, 1);
        for first in (0..m).step_by(GEMV_MAX_M) {
            let rows_here = (m - first).min(GEMV_MAX_M);
            // One n8 tile where it holds the rows: the second would only add idle mmas.
            let two_tiles = rows_here > 8;
            let (module, entry, x_row) = match source {
                XSource::Plain => {
                    let kind = if two_tiles { "gemv16" } else { "gemv" };
                    ("wq_gemv", name(kind, w.bits, dtype), w.cols)
                }
                XSource::Gated { gelu } => (
                    "wq_gemv_gated",
                    gated_name(two_tiles, gelu, w.bits, dtype),
                    2 * w.cols,
                ),
            };
            let mut args = vec![
                out.offset::<u16>(first * w.rows).into(),
                x.offset::<u16>(first * x_row).into(),
                w.codes.into(),
                w.scales.into(),
                w.zeros.unwrap_or(DevPtr::NULL).into(),
                mins.unwrap_or(DevPtr::NULL).into(),
                i32_of("m", rows_here)?,
            ];
            args.extend(tail(w)?);
            unsafe { self.launch(module, entry, grid, 256, 0, &args) }?;
        }
        Ok(())
    }

    /// The dense `[rows, cols]` matrix of `w` into `out`.
    ///
    /// # Safety
    /// As [`Self::wq_gemv`]; `out` holds `rows * cols` elements, 16-byte aligned.
    pub unsafe fn wq_dequant(
        &self,
        dtype: Dtype,
        out: DevPtr,
        w: &WqDevice,
    ) -> Result<(), CudaError> {
        let threads = (w.rows * w.cols * w.bits.storage() as usize).div_ceil(128);
        let grid = (threads.div_ceil(256).max(1) as u32, 1, 1);
        let mut args = vec![
            out.into(),
            w.codes.into(),
            w.scales.into(),
            w.zeros.unwrap_or(DevPtr::NULL).into(),
        ];
        args.extend(tail(w)?);
        unsafe {
            self.launch(
                "wq_gemv",
                name("dequant", w.bits, dtype),
                grid,
                256,
                0,
                &args,
            )
        }
    }
}
