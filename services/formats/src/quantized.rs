//! Quantized Hugging Face checkpoints: which format config.json's `quantization_config` names,
//! and the loader of each one's linear layers.
//!
//! - `gptq` ([`super::gptq`]): AutoGPTQ / GPTQModel / `ferrite quantize --format gptq`;
//! - `awq` ([`super::awq`]): AutoAWQ's GEMM layout / `ferrite quantize --format awq`;
//! - `compressed-tensors` ([`super::compressed`]): llm-compressor / vLLM / `ferrite quantize
//!   --format compressed-tensors`, in its `pack-quantized`, `int-quantized` (W8A8) and
//!   `float-quantized` (FP8) forms;
//! - `fp8` ([`super::fp8_blocks`]): transformers' FP8 format (DeepSeek-V3, Qwen3-FP8), scaled
//!   per block or per tensor.
//!
//! A layer `<stem>` is quantized when its format's tensors are there (`<stem>.qweight`,
//! `<stem>.weight_packed`, or an I8/F8 `<stem>.weight`); anything else (embeddings, the LM
//! head, layers the quantizer left alone) loads as the float tensor it is.

use serde_json::Value;

use super::awq::AwqConfig;
use super::compressed::CompressedConfig;
use super::fp8_blocks::Fp8BlockConfig;
use super::gptq::GptqConfig;
use super::{IntType, Matrix, TensorMap};
use crate::error::{FormatError, Result};

/// A checkpoint's `quantization_config`.
#[derive(Debug, Clone, PartialEq)]
pub enum QuantConfig {
    Gptq(GptqConfig),
    Awq(AwqConfig),
    Compressed(CompressedConfig),
    Fp8Blocks(Fp8BlockConfig),
}

impl QuantConfig {
    /// Reads config.json's `quantization_config`; `Ok(None)` when there is none, or where
    /// the model's own loader reads the quantized tensors: gpt-oss's `mxfp4` experts
    /// ([`crate::mxfp4`]; every other tensor of those checkpoints is bf16).
    pub fn from_hf_config(cfg: &Value) -> Result<Option<Self>> {
        let Some(q) = cfg.get("quantization_config") else {
            return Ok(None);
        };
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
        Ok(Some(match method {
            "mxfp4" => return Ok(None),
            "gptq" => Self::Gptq(GptqConfig::from_json(q)?),
            "awq" => Self::Awq(AwqConfig::from_json(q)?),
            "compressed-tensors" => Self::Compressed(CompressedConfig::from_json(q)?),
            "fp8" => Self::Fp8Blocks(Fp8BlockConfig::from_json(q)?),
            other => {
                return Err(FormatError::BadConfig(format!(
                    "quantization_config: quant_method `{other}` is not supported (gptq, awq, \
                     compressed-tensors, fp8 and gpt-oss's mxfp4 are; or load the unquantized model with \
                     --quantize rtn-w4g128)"
                )));
            }
        }))
    }

    /// The group length of the weight-only formats (what a column shard must keep whole).
    pub fn group_size(&self) -> Option<usize> {
        match self {
            Self::Gptq(g) => g.group_size,
            Self::Awq(a) => a.group_size,
            Self::Compressed(c) => c.group_size(),
            Self::Fp8Blocks(f) => f.group_size(),
        }
    }

    /// The row run a row shard must keep whole: FP8 blocks' height (1 for the others).
    pub fn row_block(&self) -> usize {
        let rows = match self {
            Self::Compressed(c) => c.row_block(),
            Self::Fp8Blocks(f) => f.row_block(),
            Self::Gptq(_) | Self::Awq(_) => None,
        };
        rows.unwrap_or(1)
    }

    /// A one-line description when the CPU runs the format by dequantizing it (FP8).
    fn dequantized_on_cpu(&self) -> Option<String> {
        match self {
            Self::Compressed(c) if c.dequantizes_on_cpu() => Some(c.describe()),
            Self::Fp8Blocks(f) => Some(f.describe()),
            _ => None,
        }
    }

    /// Whether layer `stem`'s tensors in `t` are this format's.
    fn holds(&self, t: &TensorMap, stem: &str) -> bool {
        let int = |suffix: &str| t.ints.contains_key(&format!("{stem}.{suffix}"));
        match self {
            Self::Gptq(_) | Self::Awq(_) => int("qweight"),
            Self::Fp8Blocks(_) => t.int_type(&format!("{stem}.weight")) == Some(IntType::F8E4M3),
            Self::Compressed(_) => {
                int("weight_packed")
                    || t.ints
                        .get(&format!("{stem}.weight"))
                        .is_some_and(|e| matches!(e.ty, IntType::I8 | IntType::F8E4M3))
            }
        }
    }

    fn load_linear(&self, t: &TensorMap, stem: &str) -> Result<Matrix> {
        match self {
            Self::Gptq(g) => super::gptq::load_linear(t, stem, g).map(Matrix::from_wq),
            Self::Awq(a) => super::awq::load_linear(t, stem, a).map(Matrix::from_wq),
            Self::Compressed(c) => c.load_linear(t, stem),
            Self::Fp8Blocks(f) => f.load_linear(t, stem),
        }
    }
}

impl TensorMap {
    /// Marks the checkpoint as quantized (from config.json's `quantization_config`).
    pub fn set_quant(&mut self, cfg: QuantConfig) {
        if let Some(what) = cfg.dequantized_on_cpu() {
            // A warning, so it shows at the default log level: the memory and speed cost is
            // the user's to know.
            tracing::warn!(
                "{}: on the CPU, FP8 weights are dequantized to f32 on first use (4 bytes per \
                 weight) and activations rounded through FP8 before an f32 matmul: correct, not \
                 fast (GPUs of sm_89 and above run them on FP8 tensor cores, older ones as \
                 dense 16-bit weights)",
                what
            );
        }
        self.quant = Some(cfg);
    }

    pub fn quant(&self) -> Option<&QuantConfig> {
        self.quant.as_ref()
    }

    /// For `<stem>.weight` of a quantized layer: the stem.
    pub(super) fn quantized_stem<'n>(&self, name: &'n str) -> Option<&'n str> {
        let q = self.quant.as_ref()?;
        let stem = name.strip_suffix(".weight")?;
        q.holds(self, stem).then_some(stem)
    }

    /// Quantized layer `stem` converted to the layout ferrite computes with.
    pub(super) fn quantized_matrix(&self, stem: &str) -> Result<Matrix> {
        match &self.quant {
            Some(q) => q.load_linear(self, stem),
            None => Err(FormatError::MissingTensor(format!("{stem}.weight"))),
        }
    }
}
