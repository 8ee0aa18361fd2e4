//! Launch wrappers for FP8 (e4m3) W8A8 projections (`fp8.cu`, sm_89+): activations rounded
//! through e4m3 on the device, then e4m3 tensor-core products (`mma.sync` m16n8k32) with the
//! scales applied per run of the scale grid. The layout and the arithmetic are the CPU's
//! [`crate::fp8::Fp8Matrix`] (whose f32 product of rounded values they equal up to f32
//! summation order).

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};
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
}

/// Activations rounded to e4m3: `m * cols` codes (16-byte aligned) and `m * cols / group` f32
/// scales; and room for the f32 products of cuBLASLt's GEMM (`sums_len` elements at `sums`,
/// as [`super::w8a8::I8Rows`]'s: chunked, and none where 0).
#[derive(Debug, Clone, Copy)]
pub struct Fp8Rows {
    pub codes: DevPtr,
    pub scales: DevPtr,
    pub sums: DevPtr,
    pub sums_len: usize,
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
        let group = w.group();
        let static_scale = match w.act {
            Fp8Activations::Static(s) => s,
            _ => 0.0,
        };
        let quantize: [Arg; 7] = [
            scratch.codes.into(),
            scratch.scales.into(),
            x.into(),
            i32_of("m", m)?,
            i32_of("cols", w.cols)?,
            i32_of("group", group)?,
            Arg::F32(static_scale),
        ];
        let jobs = (m * (w.cols / group)).clamp(1, 65_535) as u32;
        unsafe { self.launch("fp8", quantize_name(dtype), (jobs, 1, 1), 128, 0, &quantize) }?;
        let chunk = scratch.sums_len / w.rows.max(1);
        // One scale pair per product (weights per channel or tensor, activations per token), and
        // output rows a multiple of 16 (the 8-bit library kernels' requirement).
        let takes = m > DECODE_MAX_M
            && chunk > 0
            && w.run() == w.cols
            && w.rows.is_multiple_of(16)
            && super::w8a8::library_gemm();
        if let Some(lt) = self.lt().filter(|_| takes) {
            // A shape the library turns down falls back to the tiles, which write every output.
            if unsafe { self.fp8_library_gemm(lt, dtype, out, scratch, w, m, chunk) }.is_ok() {
                return Ok(());
            }
        }
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
            i32_of("group", group)?,
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

    /// The product of activations already rounded into `q` through cuBLASLt (`imma.rs`),
    /// `chunk` rows at a time into `q.sums`, each scaled into `out` by `fp8_scale`.
    ///
    /// # Safety
    /// As [`Self::fp8_matmul`], after its quantization; `q.sums` holds `chunk * w.rows` f32.
    #[allow(clippy::too_many_arguments)]
    unsafe fn fp8_library_gemm(
        &self,
        lt: &super::lt::Lt,
        dtype: Dtype,
        out: DevPtr,
        q: Fp8Rows,
        w: &Fp8Device,
        m: usize,
        chunk: usize,
    ) -> Result<(), CudaError> {
        let entry = match dtype {
            Dtype::F16 => "fp8_scale_f16",
            Dtype::Bf16 => "fp8_scale_bf16",
        };
        let (block_rows, _) = w.layout.block(w.rows, w.cols);
        let gemm = super::imma::LibraryGemm {
            lt,
            codes: super::imma::Codes::E4m3,
            out,
            xq: q.codes,
            x_scales: q.scales,
            sums: q.sums,
            w: w.codes,
            w_scales: w.scales,
            shape: (m, w.rows, w.cols),
            chunk,
            scale: ("fp8", entry),
            extra: &[i32_of("block_rows", block_rows)?],
        };
        // SAFETY: the caller's contract is `library_gemm`'s.
        unsafe { self.library_gemm(gemm) }
    }
}
