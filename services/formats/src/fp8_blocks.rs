//! transformers' own FP8 format (`quant_method: fp8`, its `FineGrainedFP8Config`): what
//! DeepSeek-V3 and the official Qwen3 `-FP8` checkpoints ship, and vLLM reads as `fp8`.
//!
//! A linear layer `<stem>` is `<stem>.weight` F8_E4M3 `[out, in]` and `<stem>.weight_scale_inv`
//! (despite its name, the factor the codes are multiplied by): with `weight_block_size:
//! [rows, cols]` a grid of one scale per block, `[⌈out / rows⌉, ⌈in / cols⌉]`; without, one
//! scale for the tensor. Activations are quantized at run time (`activation_scheme: dynamic`),
//! per token and group of `cols` inputs with blocks (DeepSeek's `act_quant`), per token without.
//! Layers named in `modules_to_not_convert` (the LM head, usually) are plain float tensors.

use ferrite_kernels::fp8::Fp8Scales;
use serde_json::Value;

use super::compressed::{Fp8Act, describe_fp8_scales, fp8_shard_cols};
use super::{Matrix, TensorMap};
use crate::error::{FormatError, Result};

/// The `quantization_config` of a `quant_method: fp8` checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8BlockConfig {
    pub weights: Fp8Scales,
    pub act: Fp8Act,
}

impl Fp8BlockConfig {
    /// Reads a `quantization_config` whose `quant_method` is `fp8`.
    pub fn from_json(q: &Value) -> Result<Self> {
        let bad = |m: String| FormatError::BadConfig(format!("quantization_config (fp8): {m}"));
        let text = |k: &str| q.get(k).and_then(Value::as_str);
        match text("activation_scheme").unwrap_or("dynamic") {
            "dynamic" => {}
            other => {
                return Err(bad(format!(
                    "activation_scheme `{other}` is not supported (dynamic is)"
                )));
            }
        }
        if let Some(f) = text("fmt").filter(|f| !f.eq_ignore_ascii_case("e4m3")) {
            return Err(bad(format!("fmt `{f}` is not supported (e4m3 is)")));
        }
        if let Some(f) = text("scale_fmt").filter(|f| *f != "float") {
            return Err(bad(format!(
                "scale_fmt `{f}` is not supported (float32 scales are)"
            )));
        }
        let block = match q.get("weight_block_size") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let dims: Vec<u64> = v
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                match dims[..] {
                    [r, c] if r > 0 && c > 0 => Some((r as usize, c as usize)),
                    _ => return Err(bad(format!("weight_block_size {v}: [rows, cols] above 0"))),
                }
            }
        };
        let weights = match block {
            Some((rows, cols)) => Fp8Scales::Block { rows, cols },
            None => Fp8Scales::Tensor,
        };
        Ok(Self {
            weights,
            act: Fp8Act::dynamic(weights),
        })
    }

    /// The columns a column shard must keep whole (a block's width).
    pub fn group_size(&self) -> Option<usize> {
        fp8_shard_cols(self.weights, self.act)
    }

    /// The rows a row shard must keep whole (a block's height).
    pub fn row_block(&self) -> Option<usize> {
        match self.weights {
            Fp8Scales::Block { rows, .. } => Some(rows),
            _ => None,
        }
    }

    /// A one-line description for logs.
    pub fn describe(&self) -> String {
        format!(
            "fp8 (transformers' format: weights {}, activations dynamic per {})",
            describe_fp8_scales(self.weights),
            match self.act {
                Fp8Act::DynamicPerGroup(g) => format!("group of {g}"),
                _ => "token".into(),
            }
        )
    }

    /// Converts layer `<stem>` to the matrix ferrite computes with.
    pub(super) fn load_linear(&self, t: &TensorMap, stem: &str) -> Result<Matrix> {
        super::compressed::load_fp8(t, stem, "weight_scale_inv", self.weights, self.act)
            .map(Matrix::from_fp8)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn blocks_per_tensor_and_what_is_refused() {
        let q = json!({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                       "weight_block_size": [128, 64], "modules_to_not_convert": ["lm_head"]});
        let c = Fp8BlockConfig::from_json(&q).expect("Qwen3-FP8's config");
        assert_eq!(
            c.weights,
            Fp8Scales::Block {
                rows: 128,
                cols: 64
            }
        );
        assert_eq!(c.act, Fp8Act::DynamicPerGroup(64));
        assert_eq!(c.group_size(), Some(64));
        let c = Fp8BlockConfig::from_json(&json!({"quant_method": "fp8"})).expect("per tensor");
        assert_eq!(c.weights, Fp8Scales::Tensor);
        assert_eq!(c.act, Fp8Act::DynamicPerToken);
        for (k, v, want) in [
            (
                "activation_scheme",
                json!("static"),
                "activation_scheme `static`",
            ),
            ("scale_fmt", json!("ue8m0"), "scale_fmt `ue8m0`"),
            ("fmt", json!("e5m2"), "fmt `e5m2`"),
            ("weight_block_size", json!([128]), "weight_block_size [128]"),
        ] {
            let mut q = q.clone();
            q[k] = v;
            let e = Fp8BlockConfig::from_json(&q).expect_err(want);
            assert!(e.to_string().contains(want), "{e}");
        }
    }
}
