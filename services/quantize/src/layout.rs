//! The tensors a quantized projection is written as, per [`OutputFormat`]:
//!
//! - weight-only codes ([`WqMatrix`]): GPTQ (`qweight`, `qzeros`, `scales`, `g_idx`), AWQ
//!   (`qweight`, `qzeros`, `scales`) or compressed-tensors `pack-quantized` (`weight_packed`,
//!   `weight_scale`, `weight_shape`, `weight_zero_point` when asymmetric);
//! - W8A8 ([`I8Matrix`]): compressed-tensors `int-quantized` (int8 `weight`, f32
//!   `weight_scale` `[out, 1]`);
//! - FP8 ([`Fp8Matrix`]): compressed-tensors `float-quantized` (F8_E4M3 `weight`, f32
//!   `weight_scale`, `input_scale` for a static activation scale);
//! - anything else in its float type.
//!
//! Each format's layout is defined once, in [`ferrite_formats`] (the loaders read the same
//! structures); this module names the tensors and picks their dtypes.

use ferrite_kernels::cpu::matmul::Weight;
use ferrite_kernels::fp8::{Fp8Matrix, Fp8Scales};
use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::w8a8::I8Matrix;
use ferrite_kernels::wq::{ScaleType, WqMatrix};
use safetensors::Dtype;

use ferrite_engine::{EngineError, Result};
use ferrite_formats::Matrix;
use ferrite_formats::awq::AwqTensors;
use ferrite_formats::compressed::{Fp8Tensors, PackedTensors};
use ferrite_formats::gptq::GptqTensors;

use super::OutputFormat;

/// One tensor to write.
pub(super) struct Out {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
    /// Part of a quantized projection (not counted as a tensor kept in float).
    pub quantized: bool,
}

pub(super) fn f32_tensor(name: String, shape: Vec<usize>, v: &[f32]) -> Out {
    Out {
        name,
        dtype: Dtype::F32,
        shape,
        bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        quantized: false,
    }
}

/// A float matrix in its stored float type, or dequantized to f32.
pub(super) fn float_matrix(name: String, m: &Matrix) -> Out {
    let shape = vec![m.rows, m.cols];
    if let Weight::Ggml(v) = m.view() {
        let dtype = match v.ty {
            GgmlType::F32 => Some(Dtype::F32),
            GgmlType::F16 => Some(Dtype::F16),
            GgmlType::BF16 => Some(Dtype::BF16),
            _ => None,
        };
        if let Some(dtype) = dtype {
            return Out {
                name,
                dtype,
                shape,
                bytes: v.bytes.to_vec(),
                quantized: false,
            };
        }
    }
    f32_tensor(name, shape, &m.to_f32())
}

/// Collects one projection's tensors, named `<stem>.<part>`.
struct Parts<'a> {
    stem: &'a str,
    out: &'a mut Vec<Out>,
}

impl Parts<'_> {
    fn push(&mut self, part: &str, dtype: Dtype, shape: Vec<usize>, bytes: Vec<u8>) {
        self.out.push(Out {
            name: format!("{}.{part}", self.stem),
            dtype,
            shape,
            bytes,
            quantized: true,
        });
    }

    fn words(&mut self, part: &str, shape: Vec<usize>, v: &[i32]) {
        let bytes = v.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.push(part, Dtype::I32, shape, bytes);
    }

    fn scales(&mut self, part: &str, ty: ScaleType, shape: Vec<usize>, bits: &[u16]) {
        let dtype = match ty {
            ScaleType::F16 => Dtype::F16,
            ScaleType::Bf16 => Dtype::BF16,
        };
        self.push(
            part,
            dtype,
            shape,
            bits.iter().flat_map(|s| s.to_le_bytes()).collect(),
        );
    }

    fn f32s(&mut self, part: &str, shape: Vec<usize>, v: &[f32]) {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.push(part, Dtype::F32, shape, bytes);
    }

    /// Names errors of converting layer `stem`.
    fn named(&self, e: EngineError) -> EngineError {
        match e {
            EngineError::BadTensor { reason, .. } => EngineError::BadTensor {
                name: format!("{}.weight", self.stem),
                reason,
            },
            other => other,
        }
    }
}

fn gptq(w: &WqMatrix, p: &mut Parts<'_>) -> Result<()> {
    let g = GptqTensors::from_wq(w).map_err(|e| p.named(e.into()))?;
    let per = 32 / w.format().bits.get() as usize;
    p.words("qweight", vec![g.cols / per, g.rows], &g.qweight);
    p.words("qzeros", vec![g.groups, g.rows / per], &g.qzeros);
    p.scales("scales", g.scale_type, vec![g.groups, g.rows], &g.scales);
    p.words("g_idx", vec![g.cols], &g.g_idx);
    Ok(())
}

fn awq(w: &WqMatrix, p: &mut Parts<'_>) -> Result<()> {
    let a = AwqTensors::from_wq(w).map_err(|e| p.named(e.into()))?;
    p.words("qweight", vec![a.cols, a.rows / 8], &a.qweight);
    p.words("qzeros", vec![a.groups, a.rows / 8], &a.qzeros);
    p.scales("scales", a.scale_type, vec![a.groups, a.rows], &a.scales);
    Ok(())
}

fn packed(w: &WqMatrix, p: &mut Parts<'_>) -> Result<()> {
    let t = PackedTensors::from_wq(w).map_err(|e| p.named(e.into()))?;
    let words = |n: usize| (n * w.format().bits.get() as usize).div_ceil(32);
    p.words(
        "weight_packed",
        vec![t.rows, words(t.cols)],
        &t.weight_packed,
    );
    p.scales(
        "weight_scale",
        t.scale_type,
        vec![t.rows, t.groups],
        &t.weight_scale,
    );
    let shape = [t.rows as i64, t.cols as i64];
    let bytes = shape.iter().flat_map(|d| d.to_le_bytes()).collect();
    p.push("weight_shape", Dtype::I64, vec![2], bytes);
    if let Some(z) = &t.weight_zero_point {
        p.words("weight_zero_point", vec![words(t.rows), t.groups], z);
    }
    Ok(())
}

fn int8(w: &I8Matrix, order: &[usize], p: &mut Parts<'_>) {
    let codes: Vec<u8> = order
        .iter()
        .flat_map(|&r| w.row_codes(r).into_iter().map(|q| q as u8))
        .collect();
    let scales: Vec<f32> = order.iter().map(|&r| w.scales()[r]).collect();
    p.push("weight", Dtype::I8, vec![w.rows(), w.cols()], codes);
    p.f32s("weight_scale", vec![w.rows(), 1], &scales);
}

fn fp8(w: &Fp8Matrix, order: &[usize], p: &mut Parts<'_>) -> Result<()> {
    let t = Fp8Tensors::from_fp8(w);
    let codes: Vec<u8> = order
        .iter()
        .flat_map(|&r| t.weight[r * t.cols..(r + 1) * t.cols].to_vec())
        .collect();
    let scales: Vec<f32> = match w.layout() {
        Fp8Scales::Tensor => t.weight_scale.clone(),
        Fp8Scales::Channel => order.iter().map(|&r| t.weight_scale[r]).collect(),
        // GGUF's Q and K rows are put back in Hugging Face order within each head: when every
        // block holds whole heads, each row stays in its block and the grid is unchanged.
        // Rows moved across blocks would need a scale each: not a block layout.
        Fp8Scales::Block { rows, .. }
            if order.iter().enumerate().all(|(i, &r)| i / rows == r / rows) =>
        {
            t.weight_scale.clone()
        }
        Fp8Scales::Block { rows, .. } => {
            return Err(EngineError::BadConfig(format!(
                "{}: FP8 blocks of {rows} rows cannot be written in Hugging Face row order \
                 (its rows move across blocks: blocks must hold whole heads)",
                p.stem
            )));
        }
    };
    p.push("weight", Dtype::F8_E4M3, vec![t.rows, t.cols], codes);
    p.f32s("weight_scale", t.scale_shape.clone(), &scales);
    if let Some(s) = t.input_scale {
        p.f32s("input_scale", vec![1], &[s]);
    }
    Ok(())
}

fn permute_rows(w: &WqMatrix, order: &[usize]) -> Result<WqMatrix> {
    let (cols, groups) = (w.cols(), w.groups_per_row());
    let (codes, scales, zeros) = (w.codes(), w.scales(), w.zeros());
    let mut c2 = Vec::with_capacity(codes.len());
    let mut s2 = Vec::with_capacity(scales.len());
    let mut z2 = Vec::with_capacity(zeros.len());
    for &r in order {
        c2.extend_from_slice(&codes[r * cols..(r + 1) * cols]);
        s2.extend_from_slice(&scales[r * groups..(r + 1) * groups]);
        z2.extend_from_slice(&zeros[r * groups..(r + 1) * groups]);
    }
    let format = w.format();
    let z = format.zero_point.then_some(z2.as_slice());
    WqMatrix::from_codes(format, order.len(), cols, &c2, &s2, z)
        .map_err(|e| EngineError::Internal(format!("reordering quantized rows: {e}")))
}

/// Projection `stem`'s tensors in `format`, rows put in Hugging Face order when `order` is
/// given (row `i` written is row `order[i]` of `m`).
pub(super) fn projection(
    stem: &str,
    m: &Matrix,
    order: Option<&[usize]>,
    format: OutputFormat,
    out: &mut Vec<Out>,
) -> Result<()> {
    let identity: Vec<usize> = (0..m.rows).collect();
    let rows = order.unwrap_or(&identity);
    let mut p = Parts { stem, out };
    if let Some(w) = m.as_i8() {
        int8(w, rows, &mut p);
        return Ok(());
    }
    if let Some(w) = m.as_fp8() {
        return fp8(w, rows, &mut p);
    }
    let Some(view) = m.as_wq() else {
        let name = format!("{stem}.weight");
        match order {
            Some(o) => {
                let w = m.to_f32();
                let rows: Vec<f32> = o
                    .iter()
                    .flat_map(|&r| w[r * m.cols..(r + 1) * m.cols].to_vec())
                    .collect();
                out.push(f32_tensor(name, vec![m.rows, m.cols], &rows));
            }
            None => out.push(float_matrix(name, m)),
        }
        return Ok(());
    };
    let w = match order {
        Some(o) => std::borrow::Cow::Owned(permute_rows(&view.matrix, o)?),
        None => view.matrix,
    };
    match format {
        OutputFormat::Gptq => gptq(&w, &mut p),
        OutputFormat::Awq => awq(&w, &mut p),
        OutputFormat::CompressedTensors => packed(&w, &mut p),
    }
}
