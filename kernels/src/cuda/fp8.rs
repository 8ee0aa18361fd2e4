//! Launch wrappers for FP8 (e4m3) W8A8 projections (`fp8.cu`, sm_89+): activations rounded
//! through e4m3 on the device, then e4m3 tensor-core products (`mma.sync` m16n8k32) with the
//! scales applied per run of the scale grid. The layout and the arithmetic are the CPU's
//! [`crate::fp8::Fp8Matrix`] (whose f32 product of rounded values they equal up to f32
//! summation order).
//!
//! More than [`DECODE_MAX_M`] rows go through cuBLASLt where it applies the scales itself
//! ([`Scaling`], cuBLASLt 12.9+ on sm_90): weights per channel (or per tensor, uploaded as per
//! channel) with one activation scale per token, and DeepSeek-V3's 128 × 128 weight blocks
//! with activation runs of 128. One library call writes the 16-bit result: no f32 products
//! and no epilogue kernel. Where the library has no algorithm (older libraries, other
//! devices, other layouts) the hand-written tiles run.

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};
use super::lt::{Codes, Lt, Matmul, Product, Scaling};
use super::ops::{Dtype, i32_of};
use super::w8a8::block_rows as gemm_block_rows;
use crate::fp8::{Fp8Activations, Fp8Scales};

/// Rows of activations up to which the GEMM takes one 8-token tile per warp; above, eight.
pub const DECODE_MAX_M: usize = 8;

/// An FP8 `[rows, cols]` matrix in device memory.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Device {
    /// `rows * cols` e4m3 codes, row-major.
    pub codes: DevPtr,
    /// The f32 scale grid, row-major ([`Fp8Scales::grid`]).
    pub scales: DevPtr,
    pub layout: Fp8Scales,
    pub act: Fp8Activations,
    pub rows: usize,
    pub cols: usize,
}

impl Fp8Device {
    fn group(&self) -> usize {
        group_of(self.act, self.cols)
    }

    /// Inputs per product summed apart: one weight scale and one activation scale each.
    fn run(&self) -> usize {
        let (_, block_cols) = self.layout.block(self.rows, self.cols);
        block_cols.min(self.group())
    }

    /// The scales cuBLASLt would apply to this matrix's products, if it takes its layout:
    /// output rows a multiple of 16 (its 8-bit kernels' requirement), and one of
    /// [`Scaling`]'s layouts. The weights' row of 128-column blocks must be a multiple of 4
    /// long, as the library reads it (this grid is not padded).
    fn library_scaling(&self) -> Option<Scaling> {
        if !self.rows.is_multiple_of(16) {
            return None;
        }
        match (self.layout, self.act) {
            (Fp8Scales::Channel, Fp8Activations::DynamicPerToken | Fp8Activations::Static(_)) => {
                Some(Scaling::Outer)
            }
            (
                Fp8Scales::Block {
                    rows: 128,
                    cols: 128,
                },
                Fp8Activations::DynamicPerGroup(128),
            ) if (self.cols / 128).is_multiple_of(4) => Some(Scaling::Blocks),
            _ => None,
        }
    }
}

/// `m`'s weight scales as the device takes them, and their layout: one per tensor goes up as one
/// per row (the same products, which the library then scales as per channel, [`Scaling`]).
pub fn device_scales(m: &crate::fp8::Fp8Matrix) -> (Fp8Scales, std::borrow::Cow<'_, [f32]>) {
    match m.layout() {
        Fp8Scales::Tensor => (Fp8Scales::Channel, vec![m.scales()[0]; m.rows()].into()),
        layout => (layout, m.scales().into()),
    }
}

/// Activations rounded to e4m3: `m * cols` codes (16-byte aligned) and `m * cols / group` f32
/// scales.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Rows {
    pub codes: DevPtr,
    pub scales: DevPtr,
}

/// Whether the kernels take FP8 weights of `cols` columns scaled as `layout`, their inputs
/// quantized as `act`: a device of compute capability 8.9 or above (`arch`, e.g. `sm_90`),
/// quantized activations, and rows of whole weight blocks and activation groups whose runs
/// are whole 64-byte chunks.
pub fn check_layout(
    arch: &str,
    layout: Fp8Scales,
    act: Fp8Activations,
    cols: usize,
) -> Result<(), CudaError> {
    let cc: u32 = arch.trim_start_matches("sm_").parse().unwrap_or(0);
    let (_, block_cols) = layout.block(1, cols);
    let group = group_of(act, cols);
    let run = block_cols.min(group);
    let why = if cc < 89 {
        Some(format!(
            "{arch} has no FP8 tensor cores (sm_89 and above do)"
        ))
    } else if act == Fp8Activations::None {
        Some("weights without activation quantization run as 16-bit".into())
    } else if !run.is_multiple_of(64)
        || [block_cols, group]
            .iter()
            .any(|&b| b == 0 || !cols.is_multiple_of(b))
    {
        Some(format!(
            "{cols} columns in weight blocks of {block_cols} and activation groups of \
             {group}: whole runs of a multiple of 64 are needed"
        ))
    } else if !block_cols.max(group).is_multiple_of(run) {
        Some("weight blocks and activation groups that do not nest".into())
    } else {
        None
    };
    match why {
        Some(why) => Err(CudaError::Driver(format!("FP8 on the GPU: {why}"))),
        None => Ok(()),
    }
}

/// Inputs per activation scale.
fn group_of(act: Fp8Activations, cols: usize) -> usize {
    match act {
        Fp8Activations::DynamicPerGroup(g) => g,
        _ => cols,
    }
}

/// `dtype` as cuBLASLt names it.
fn library_type(dtype: Dtype) -> cudarc::cublaslt::sys::cudaDataType_t {
    use cudarc::cublaslt::sys::cudaDataType_t::{CUDA_R_16BF, CUDA_R_16F};
    match dtype {
        Dtype::F16 => CUDA_R_16F,
        Dtype::Bf16 => CUDA_R_16BF,
    }
}

fn quantize_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F16 => "fp8_quantize_f16",
        Dtype::Bf16 => "fp8_quantize_bf16",
    }
}

fn gemm_name(decode: bool, dtype: Dtype) -> &'static str {
    match (decode, dtype) {
        (true, Dtype::F16) => "fp8_gemm_t1_f16",
        (true, Dtype::Bf16) => "fp8_gemm_t1_bf16",
        (false, Dtype::F16) => "fp8_gemm_t8_f16",
        (false, Dtype::Bf16) => "fp8_gemm_t8_bf16",
    }
}

#[allow(unsafe_code)]
impl Gpu {
    /// `out[m, rows] = x[m, cols] · Wᵀ`, `x` rounded through e4m3 into `scratch` first.
    ///
    /// # Safety
    /// `x` holds `m * w.cols` elements of `dtype`, `out` room for `m * w.rows`; `scratch` room
    /// for `m * w.cols` codes and `m * w.cols / 64` scales.
    pub unsafe fn fp8_matmul(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &Fp8Device,
        m: usize,
        scratch: Fp8Rows,
    ) -> Result<(), CudaError> {
        check_layout(&self.arch, w.layout, w.act, w.cols)?;
        if let Some(library) = self.fp8_library(dtype, w, m, scratch) {
            // The library took the product: its activation scales laid out as it reads them.
            let by_run = library.scaling() == Some(Scaling::Blocks);
            unsafe { self.fp8_quantize(dtype, x, w, m, scratch, by_run) }?;
            return unsafe { library.run(self.stream(), w.codes.0, scratch.codes.0, out.0) };
        }
        unsafe { self.fp8_tiles(dtype, out, x, w, m, scratch) }
    }

    /// Whether [`Self::fp8_matmul`] of `m` rows through `w` goes through cuBLASLt.
    pub fn fp8_library_takes(&self, dtype: Dtype, w: &Fp8Device, m: usize) -> bool {
        let none = Fp8Rows {
            codes: DevPtr::NULL,
            scales: DevPtr::NULL,
        };
        self.fp8_library(dtype, w, m, none).is_some()
    }

    /// [`Self::fp8_matmul`] through the hand-written tiles at any `m`.
    ///
    /// # Safety
    /// As [`Self::fp8_matmul`].
    pub unsafe fn fp8_tiles(
        &self,
        dtype: Dtype,
        out: DevPtr,
        x: DevPtr,
        w: &Fp8Device,
        m: usize,
        scratch: Fp8Rows,
    ) -> Result<(), CudaError> {
        check_layout(&self.arch, w.layout, w.act, w.cols)?;
        unsafe { self.fp8_quantize(dtype, x, w, m, scratch, false) }?;
        let (block_rows, block_cols) = w.layout.block(w.rows, w.cols);
        let (_, grid_cols) = w.layout.grid(w.rows, w.cols);
        let decode = m <= DECODE_MAX_M;
        let tok = if decode { 1 } else { 8 };
        let grid = (
            w.rows.div_ceil(gemm_block_rows(decode)) as u32,
            m.div_ceil(8 * tok).max(1) as u32,
            1,
        );
        let gemm: [Arg; 13] = [
            out.into(),
            scratch.codes.into(),
            scratch.scales.into(),
            i32_of("group", w.group())?,
            w.codes.into(),
            w.scales.into(),
            i32_of("block_rows", block_rows)?,
            i32_of("block_cols", block_cols)?,
            i32_of("grid_cols", grid_cols)?,
            i32_of("m", m)?,
            i32_of("rows", w.rows)?,
            i32_of("cols", w.cols)?,
            i32_of("run", w.run())?,
        ];
        unsafe { self.launch("fp8", gemm_name(decode, dtype), grid, 128, 0, &gemm) }
    }

    /// cuBLASLt's product for `m` rows through `w`, described, where the library takes it:
    /// more rows than a decode step's, a layout it scales ([`Fp8Device::library_scaling`]),
    /// and an algorithm for the shape (asked once per shape; `FERRITE_W8A8_GEMM=mma` keeps the
    /// tiles).
    fn fp8_library(
        &self,
        dtype: Dtype,
        w: &Fp8Device,
        m: usize,
        scratch: Fp8Rows,
    ) -> Option<Matmul<'_>> {
        let lt: &Lt = self.lt()?;
        let scaling = w.library_scaling()?;
        if m <= DECODE_MAX_M || !super::w8a8::library_gemm() {
            return None;
        }
        // cuBLASLt runs on the thread's current context (see `gemm.rs`).
        self.context().bind_to_thread().ok()?;
        let product = Product {
            codes: Codes::E4m3,
            shape: (m, w.rows, w.cols),
            scaled: Some((scaling, library_type(dtype))),
        };
        Matmul::new(lt, product, (w.scales.0, scratch.scales.0)).ok()
    }

    /// `x` rounded through e4m3 into `scratch`: the codes, and the scales per token and run,
    /// `[m][runs]` for the tiles or `[runs][m]` (`by_run`) for cuBLASLt's 1 × 128 blocks.
    ///
    /// # Safety
    /// As [`Self::fp8_matmul`].
    unsafe fn fp8_quantize(
        &self,
        dtype: Dtype,
        x: DevPtr,
        w: &Fp8Device,
        m: usize,
        scratch: Fp8Rows,
        by_run: bool,
    ) -> Result<(), CudaError> {
        let group = w.group();
        let runs = w.cols / group;
        let static_scale = match w.act {
            Fp8Activations::Static(s) => s,
            _ => 0.0,
        };
        let (token_stride, run_stride) = if by_run { (1, m) } else { (runs, 1) };
        let args: [Arg; 9] = [
            scratch.codes.into(),
            scratch.scales.into(),
            x.into(),
            i32_of("m", m)?,
            i32_of("cols", w.cols)?,
            i32_of("group", group)?,
            Arg::F32(static_scale),
            i32_of("token stride", token_stride)?,
            i32_of("run stride", run_stride)?,
        ];
        let jobs = (m * runs).clamp(1, 65_535) as u32;
        unsafe { self.launch("fp8", quantize_name(dtype), (jobs, 1, 1), 128, 0, &args) }
    }
}
