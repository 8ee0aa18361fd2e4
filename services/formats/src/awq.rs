//! AWQ checkpoints in AutoAWQ's GEMM layout (`quant_method: awq`, `version: gemm`: what
//! AutoAWQ writes, llm-compressor exported before compressed-tensors, and vLLM and transformers
//! read), converted to and from [`WqMatrix`].
//!
//! A linear layer `<stem>` of `out` × `in` features in groups of `g` inputs is stored as:
//!
//! - `<stem>.qweight`: i32 `[in, out / 8]`, eight 4-bit codes per word along the *output*
//!   dimension, interleaved: slot `i` of word `j` holds output `8j + ORDER[i]` with
//!   `ORDER = [0, 2, 4, 6, 1, 3, 5, 7]` (AutoAWQ's `WQLinear_GEMM.from_linear`; the order suits
//!   its CUDA kernel's dequantization);
//! - `<stem>.qzeros`: i32 `[in / g, out / 8]`, packed the same way;
//! - `<stem>.scales`: f16 `[in / g, out]`.
//!
//! Values are `scale · (q − zero)`, the [`WqMatrix`] convention (zeros stored as they are).

use ferrite_kernels::wq::{Bits, ScaleType, WqMatrix};
use serde_json::{Value, json};

use super::TensorMap;
use super::packing::{Unpacked, code, put, stored_scales};
use crate::error::{FormatError, Result};

/// Which output of a word's eight each slot holds.
const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
/// AWQ's GEMM layout is 4-bit only.
const BITS: Bits = Bits::B4;

/// The `quantization_config` of an AWQ checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct AwqConfig {
    /// `None` for one group per row.
    pub group_size: Option<usize>,
}

impl AwqConfig {
    /// Reads a `quantization_config` whose `quant_method` is `awq` (AutoAWQ's keys `w_bit`,
    /// `q_group_size` too).
    pub fn from_json(q: &Value) -> Result<Self> {
        let bad = |m: String| FormatError::BadConfig(format!("quantization_config (awq): {m}"));
        let int = |a: &str, b: &str| q.get(a).or_else(|| q.get(b)).and_then(Value::as_i64);
        let bits = int("bits", "w_bit");
        if bits != Some(4) {
            return Err(bad(format!("bits {bits:?}: AWQ's GEMM layout is 4-bit")));
        }
        let version = q.get("version").and_then(Value::as_str).unwrap_or("gemm");
        if !version.eq_ignore_ascii_case("gemm") {
            return Err(bad(format!(
                "version `{version}` is not supported (gemm is: its packing differs)"
            )));
        }
        if q.get("zero_point").and_then(Value::as_bool) == Some(false) {
            return Err(bad("zero_point: false is not supported".into()));
        }
        let group_size = match int("group_size", "q_group_size") {
            Some(-1) => None,
            Some(g) if g > 0 => Some(g as usize),
            other => return Err(bad(format!("group_size {other:?} (a positive size or -1)"))),
        };
        Ok(Self { group_size })
    }

    /// The `quantization_config` ferrite writes (AutoAWQ's `save_quantized`'s).
    pub fn to_json(&self) -> Value {
        json!({
            "quant_method": "awq",
            "bits": 4,
            "group_size": self.group_size.map_or(-1, |g| g as i64),
            "zero_point": true,
            "version": "gemm",
            "modules_to_not_convert": null,
        })
    }
}

/// Converts AWQ layer `<stem>` to a [`WqMatrix`].
pub fn load_linear(t: &TensorMap, stem: &str, cfg: &AwqConfig) -> Result<WqMatrix> {
    let name = |part: &str| format!("{stem}.{part}");
    let bad = |reason: String| FormatError::BadTensor {
        name: name("qweight"),
        reason,
    };
    let (qshape, qweight) = t.i32_tensor(&name("qweight"))?;
    let [cols, words] = qshape[..] else {
        return Err(bad(format!("shape {qshape:?} is not 2-D")));
    };
    let rows = words * 8;
    let group = cfg.group_size.unwrap_or(cols);
    let groups = cols.div_ceil(group.max(1));
    let (zshape, qzeros) = t.i32_tensor(&name("qzeros"))?;
    if zshape != [groups, words] {
        return Err(bad(format!(
            "qzeros has shape {zshape:?}, expected [{groups}, {words}]"
        )));
    }
    let (stored, scale_type) = stored_scales(t, &name("scales"), [groups, rows])?;
    // Transpose into rows of output features, undoing the interleave.
    let mut codes = vec![0u8; rows * cols];
    for (k, row) in qweight.chunks_exact(words).enumerate() {
        for (j, &w) in row.iter().enumerate() {
            for (slot, &o) in ORDER.iter().enumerate() {
                codes[(8 * j + o) * cols + k] = code(w, slot, BITS);
            }
        }
    }
    let mut scales = vec![0f32; rows * groups];
    let mut zeros = vec![0u8; rows * groups];
    for g in 0..groups {
        for (j, &w) in qzeros[g * words..(g + 1) * words].iter().enumerate() {
            for (slot, &o) in ORDER.iter().enumerate() {
                let n = 8 * j + o;
                zeros[n * groups + g] = code(w, slot, BITS);
                scales[n * groups + g] = stored[g * rows + n];
            }
        }
    }
    let u = Unpacked {
        rows,
        cols,
        codes,
        scales,
        zeros,
    };
    u.into_wq(BITS, cfg.group_size, scale_type, false)
        .map_err(|e| bad(e.to_string()))
}

/// One linear layer in AWQ tensors, ready to write.
#[derive(Debug)]
pub struct AwqTensors {
    /// `[in, out / 8]`.
    pub qweight: Vec<i32>,
    /// `[groups, out / 8]`.
    pub qzeros: Vec<i32>,
    /// `[groups, out]`, f16 or bf16 bits as `scale_type` says.
    pub scales: Vec<u16>,
    pub scale_type: ScaleType,
    pub rows: usize,
    pub cols: usize,
    pub groups: usize,
}

impl AwqTensors {
    /// `w` (4-bit; a symmetric matrix is written with its fixed zero point) in AWQ's layout.
    pub fn from_wq(w: &WqMatrix) -> Result<Self> {
        let format = w.format();
        let (rows, cols, groups) = (w.rows(), w.cols(), w.groups_per_row());
        let bad = |m: String| FormatError::BadTensor {
            name: "(quantized layer)".into(),
            reason: m,
        };
        if format.bits != BITS || !rows.is_multiple_of(8) {
            return Err(bad(format!(
                "AWQ's layout holds 4-bit codes, eight outputs per word: {rows}x{cols} in \
                 {format}"
            )));
        }
        let words = rows / 8;
        let codes = w.codes();
        let zeros: Vec<u8> = if format.zero_point {
            w.zeros().to_vec()
        } else {
            vec![format.fixed_zero(); rows * groups]
        };
        let mut qweight = vec![0i32; cols * words];
        let mut qzeros = vec![0i32; groups * words];
        let mut scales = vec![0u16; groups * rows];
        for j in 0..words {
            for (slot, &o) in ORDER.iter().enumerate() {
                let n = 8 * j + o;
                for k in 0..cols {
                    put(&mut qweight[k * words + j], slot, BITS, codes[n * cols + k]);
                }
                for g in 0..groups {
                    put(
                        &mut qzeros[g * words + j],
                        slot,
                        BITS,
                        zeros[n * groups + g],
                    );
                    scales[g * rows + n] = format.scale_type.to_bits(w.scales()[n * groups + g]);
                }
            }
        }
        Ok(Self {
            qweight,
            qzeros,
            scales,
            scale_type: format.scale_type,
            rows,
            cols,
            groups,
        })
    }
}
