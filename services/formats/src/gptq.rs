//! GPTQ-format checkpoints (what AutoGPTQ, GPTQModel, transformers and vLLM read and write),
//! converted to and from [`WqMatrix`].
//!
//! A linear layer `<stem>` of `out` × `in` features with `g` groups is stored as:
//!
//! - `<stem>.qweight`: i32 `[in / p, out]`, `p = 32 / bits` codes per word along the input
//!   dimension: input `k` of column `n` is bits `(k % p) * bits..` of `qweight[k / p][n]`;
//! - `<stem>.qzeros`: i32 `[g, out / p]`, packed the same way along the output dimension;
//!   format `gptq` (v1) stores `zero - 1`, `gptq_v2` the zero itself;
//! - `<stem>.scales`: f16 (or bf16) `[g, out]`;
//! - `<stem>.g_idx`: i32 `[in]`, each input's group; only the contiguous order
//!   (`k / group_size`, i.e. `desc_act: false`) is supported.
//!
//! Values are `scale * (q - zero)`, exactly the [`WqMatrix`] convention.

use ferrite_kernels::wq::{Bits, ScaleType, WqFormat, WqMatrix};

use super::TensorMap;
use super::packing::{Unpacked, code, per_word, put, stored_scales};
use crate::error::{FormatError, Result};

/// The `quantization_config` of a GPTQ checkpoint's config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct GptqConfig {
    pub bits: Bits,
    /// `None` for per-channel (`group_size: -1`).
    pub group_size: Option<usize>,
    pub sym: bool,
    /// `gptq_v2` stores zero points as they are; `gptq` (v1) stores them minus one.
    pub v2: bool,
}

impl GptqConfig {
    /// Reads a `quantization_config` whose `quant_method` is `gptq`.
    pub fn from_json(q: &serde_json::Value) -> Result<Self> {
        let bad = |m: String| FormatError::BadConfig(format!("quantization_config (gptq): {m}"));
        let bits = q
            .get("bits")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad("no integer `bits`".into()))?;
        let bits = match u32::try_from(bits).unwrap_or(0) {
            3 => {
                return Err(bad(
                    "3-bit GPTQ checkpoints are not supported (their codes straddle words in \
                     groups of 32); compressed-tensors' 3-bit pack-quantized ones are"
                        .into(),
                ));
            }
            b => Bits::from_u32(b).map_err(|e| bad(e.to_string()))?,
        };
        let group_size = match q.get("group_size").and_then(|v| v.as_i64()) {
            Some(-1) => None,
            Some(g) if g > 0 => Some(g as usize),
            other => return Err(bad(format!("group_size {other:?} (a positive size or -1)"))),
        };
        if q.get("desc_act").and_then(|v| v.as_bool()) == Some(true) {
            return Err(bad(
                "desc_act (act-order) checkpoints are not supported: their groups are not \
                 contiguous"
                    .into(),
            ));
        }
        let v2 = match q.get("checkpoint_format").and_then(|v| v.as_str()) {
            None | Some("gptq") => false,
            Some("gptq_v2") => true,
            Some(other) => return Err(bad(format!("checkpoint_format `{other}`"))),
        };
        Ok(Self {
            bits,
            group_size,
            sym: q.get("sym").and_then(|v| v.as_bool()).unwrap_or(true),
            v2,
        })
    }

    /// The config for checkpoints of `format` that ferrite writes (v1, like AutoGPTQ).
    pub fn for_format(format: WqFormat) -> Self {
        Self {
            bits: format.bits,
            group_size: format.group_size,
            sym: !format.zero_point,
            v2: false,
        }
    }

    /// The `quantization_config` JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "quant_method": "gptq",
            "bits": self.bits.get(),
            "group_size": self.group_size.map_or(-1, |g| g as i64),
            "sym": self.sym,
            "desc_act": false,
            "checkpoint_format": if self.v2 { "gptq_v2" } else { "gptq" },
        })
    }

    fn zero_offset(&self) -> i32 {
        if self.v2 { 0 } else { 1 }
    }
}

/// Converts GPTQ layer `<stem>` to a [`WqMatrix`].
pub fn load_linear(t: &TensorMap, stem: &str, cfg: &GptqConfig) -> Result<WqMatrix> {
    let name = |part: &str| format!("{stem}.{part}");
    let bad = |reason: String| FormatError::BadTensor {
        name: format!("{stem}.qweight"),
        reason,
    };
    let (bits, p) = (cfg.bits.get(), per_word(cfg.bits));
    let (qshape, qweight) = t.i32_tensor(&name("qweight"))?;
    let [words_in, out] = qshape[..] else {
        return Err(bad(format!("shape {qshape:?} is not 2-D")));
    };
    let cols = words_in * p;
    let group = cfg.group_size.unwrap_or(cols);
    if group == 0 || !out.is_multiple_of(p) {
        return Err(bad(format!(
            "{out} outputs do not pack {p} codes per word, or the group size is 0"
        )));
    }
    // A last group may be shorter (inputs not a multiple of the group size).
    let groups = cols.div_ceil(group);
    let (zshape, qzeros) = t.i32_tensor(&name("qzeros"))?;
    if zshape != [groups, out / p] {
        return Err(bad(format!(
            "qzeros has shape {zshape:?}, expected [{groups}, {}]",
            out / p
        )));
    }
    let (scales_t, scale_type) = stored_scales(t, &name("scales"), [groups, out])?;
    if t.ints.contains_key(&name("g_idx")) {
        let (_, g_idx) = t.i32_tensor(&name("g_idx"))?;
        let contiguous = g_idx.len() == cols
            && g_idx
                .iter()
                .enumerate()
                .all(|(k, &g)| usize::try_from(g) == Ok(k / group));
        if !contiguous {
            return Err(bad(
                "g_idx is not in contiguous group order (act-order checkpoints are not supported)"
                    .into(),
            ));
        }
    }
    // Transpose into rows of output features.
    let mut codes = vec![0u8; out * cols];
    for (wi, words) in qweight.chunks_exact(out).enumerate() {
        for (n, &w) in words.iter().enumerate() {
            for t in 0..p {
                codes[n * cols + wi * p + t] = code(w, t, cfg.bits);
            }
        }
    }
    let mut scales = vec![0f32; out * groups];
    let mut zeros = vec![0u8; out * groups];
    for g in 0..groups {
        for n in 0..out {
            scales[n * groups + g] = scales_t[g * out + n];
            let stored = code(qzeros[g * (out / p) + n / p], n % p, cfg.bits);
            let zero = i32::from(stored) + cfg.zero_offset();
            zeros[n * groups + g] = u8::try_from(zero)
                .ok()
                .filter(|&z| z <= cfg.bits.max_code())
                .ok_or_else(|| bad(format!("zero point {zero} does not fit {bits} bits")))?;
        }
    }
    let u = Unpacked {
        rows: out,
        cols,
        codes,
        scales,
        zeros,
    };
    u.into_wq(cfg.bits, cfg.group_size, scale_type, cfg.sym)
        .map_err(|e| bad(e.to_string()))
}

/// One linear layer in GPTQ tensors, ready to write.
#[derive(Debug)]
pub struct GptqTensors {
    /// `[in / p, out]`.
    pub qweight: Vec<i32>,
    /// `[groups, out / p]`.
    pub qzeros: Vec<i32>,
    /// `[groups, out]`, as f16 or bf16 bits (`scale_type`).
    pub scales: Vec<u16>,
    pub scale_type: ScaleType,
    /// `[in]`.
    pub g_idx: Vec<i32>,
    pub rows: usize,
    pub cols: usize,
    pub groups: usize,
}

impl GptqTensors {
    /// `w` in GPTQ layout (v1 zero points: stored minus one, so every zero must be ≥ 1, as
    /// ferrite's RTN guarantees).
    pub fn from_wq(w: &WqMatrix) -> Result<Self> {
        let format = w.format();
        let (rows, cols) = (w.rows(), w.cols());
        let p = per_word(format.bits);
        let bad = |m: String| FormatError::BadTensor {
            name: "(quantized layer)".into(),
            reason: m,
        };
        if format.bits == Bits::B3 {
            return Err(bad("3-bit codes are not written in GPTQ's layout".into()));
        }
        if !cols.is_multiple_of(p) || !rows.is_multiple_of(p) {
            return Err(bad(format!(
                "{rows}x{cols} does not pack {p} codes per 32-bit word on both sides"
            )));
        }
        let groups = w.groups_per_row();
        let group = format.group_len(cols);
        let codes = w.codes();
        let mut qweight = vec![0i32; cols / p * rows];
        for n in 0..rows {
            for k in 0..cols {
                put(
                    &mut qweight[(k / p) * rows + n],
                    k % p,
                    format.bits,
                    codes[n * cols + k],
                );
            }
        }
        let zeros = w.zeros();
        let mut qzeros = vec![0i32; groups * rows / p];
        let mut scales = vec![0u16; groups * rows];
        for n in 0..rows {
            for g in 0..groups {
                let z = zeros[n * groups + g];
                let stored = z
                    .checked_sub(1)
                    .ok_or_else(|| bad("a zero point of 0 cannot be stored in GPTQ v1".into()))?;
                put(
                    &mut qzeros[g * (rows / p) + n / p],
                    n % p,
                    format.bits,
                    stored,
                );
                scales[g * rows + n] = format.scale_type.to_bits(w.scales()[n * groups + g]);
            }
        }
        Ok(Self {
            qweight,
            qzeros,
            scales,
            scale_type: format.scale_type,
            g_idx: (0..cols).map(|k| (k / group) as i32).collect(),
            rows,
            cols,
            groups,
        })
    }
}
