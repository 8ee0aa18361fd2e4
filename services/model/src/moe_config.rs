//! The shape of a mixture of experts ([`MoeConfig`], `ModelConfig::moe`), read from a Hugging
//! Face `config.json` or GGUF metadata; the weights and the forward are [`crate::moe`]'s.

use ferrite_formats::gguf::GgufFile;
use serde_json::Value;

use crate::error::{ModelError, Result};

/// Which family's keys and defaults a mixture's config follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeFamily {
    Mixtral,
    /// Qwen2-MoE: a shared expert too, never renormalized in llama.cpp's files.
    Qwen2,
    Qwen3,
    /// gpt-oss: Mixtral's keys, with transformers' `GptOssConfig` defaults (the router's
    /// softmax over the chosen `k` alone, which is the renormalized one).
    GptOss,
}

/// The experts of a mixture-of-experts model (`ModelConfig::moe`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// `k`: how many experts each token goes through.
    pub experts_per_token: usize,
    /// Each expert's intermediate size (a rank's share of it in a shard's config).
    pub expert_intermediate_size: usize,
    /// Whether the chosen experts' weights are renormalized to sum to 1 (Mixtral always;
    /// Qwen3-MoE's `norm_topk_prob`).
    pub normalize_top_k: bool,
    /// Per layer: whether its MLP is sparse (Qwen2/3-MoE's `mlp_only_layers` and
    /// `decoder_sparse_step` keep some dense, with `intermediate_size`).
    pub sparse_layers: Vec<bool>,
    /// Qwen2-MoE: the intermediate size of the shared expert every token also goes through
    /// (a rank's share of it in a shard's config).
    pub shared_expert_intermediate_size: Option<usize>,
}

impl MoeConfig {
    /// From a Hugging Face `config.json` of `arch` (Mixtral, Qwen2-MoE or Qwen3-MoE),
    /// transformers' defaults where a key is missing.
    pub(crate) fn from_hf(cfg: &Value, family: MoeFamily, num_layers: usize) -> Result<Self> {
        let bad = |m: String| ModelError::BadConfig(format!("config.json: {m}"));
        let uint = |k: &str, default: usize| match cfg.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("`{k}` is not a count: {v}"))),
        };
        let qwen2 = family == MoeFamily::Qwen2;
        let oss = family == MoeFamily::GptOss;
        let moe = if matches!(family, MoeFamily::Mixtral | MoeFamily::GptOss) {
            MoeConfig {
                num_experts: uint("num_local_experts", if oss { 128 } else { 8 })?,
                experts_per_token: uint("num_experts_per_tok", if oss { 4 } else { 2 })?,
                expert_intermediate_size: uint(
                    "intermediate_size",
                    if oss { 2880 } else { 14336 },
                )?,
                normalize_top_k: true,
                sparse_layers: vec![true; num_layers],
                shared_expert_intermediate_size: None,
            }
        } else {
            let step = uint("decoder_sparse_step", 1)?;
            let dense: Vec<usize> = match cfg.get("mlp_only_layers") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_u64().map(|v| v as usize))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("`mlp_only_layers` is not a list of layers".into()))?,
                Some(v) => return Err(bad(format!("`mlp_only_layers` is not a list: {v}"))),
            };
            if step == 0 {
                return Err(bad("`decoder_sparse_step` is 0".into()));
            }
            // transformers' Qwen2MoeDecoderLayer and Qwen3MoeDecoderLayer.
            let sparse = |i: usize| !dense.contains(&i) && (i + 1).is_multiple_of(step);
            MoeConfig {
                // The hub's configs say `num_experts`; transformers 5 writes
                // `num_local_experts`, as Mixtral's.
                num_experts: match cfg.get("num_experts") {
                    Some(_) => uint("num_experts", if qwen2 { 60 } else { 128 })?,
                    None => uint("num_local_experts", if qwen2 { 60 } else { 128 })?,
                },
                experts_per_token: uint("num_experts_per_tok", if qwen2 { 4 } else { 8 })?,
                expert_intermediate_size: uint(
                    "moe_intermediate_size",
                    if qwen2 { 1408 } else { 768 },
                )?,
                normalize_top_k: cfg.get("norm_topk_prob").and_then(Value::as_bool) == Some(true),
                sparse_layers: (0..num_layers).map(sparse).collect(),
                shared_expert_intermediate_size: match qwen2 {
                    true => Some(uint("shared_expert_intermediate_size", 5632)?),
                    false => None,
                },
            }
        };
        moe.validate()
    }

    /// From GGUF metadata, where `{arch}.expert_count` says the model has experts (llama.cpp
    /// writes Mixtral as `llama` with experts, Qwen2/3-MoE as `qwen2moe`/`qwen3moe`); every
    /// layer is sparse, as llama.cpp runs them.
    pub(crate) fn from_gguf(
        gguf: &GgufFile,
        key: &dyn Fn(&str) -> String,
        family: MoeFamily,
        intermediate_size: usize,
        num_layers: usize,
    ) -> Result<Option<Self>> {
        let count = |k: &str| gguf.get_u64(&key(k)).map(|v| v as usize);
        let Some(num_experts) = count("expert_count").filter(|&n| n > 0) else {
            return Ok(None);
        };
        let experts_per_token = count("expert_used_count").ok_or_else(|| {
            ModelError::BadConfig(format!(
                "GGUF metadata `{}` missing",
                key("expert_used_count")
            ))
        })?;
        let moe = MoeConfig {
            num_experts,
            experts_per_token,
            expert_intermediate_size: count("expert_feed_forward_length")
                .unwrap_or(intermediate_size),
            // llama.cpp renormalizes Mixtral's and Qwen3-MoE's weights, not Qwen2-MoE's,
            // unless the file says.
            normalize_top_k: gguf
                .get(&key("expert_weights_norm"))
                .and_then(|v| v.as_bool())
                .unwrap_or(family != MoeFamily::Qwen2),
            sparse_layers: vec![true; num_layers],
            shared_expert_intermediate_size: count("expert_shared_feed_forward_length"),
        };
        moe.validate().map(Some)
    }

    fn validate(self) -> Result<Self> {
        if self.num_experts == 0
            || self.experts_per_token == 0
            || self.experts_per_token > self.num_experts
            || self.expert_intermediate_size == 0
            || self.shared_expert_intermediate_size == Some(0)
        {
            return Err(ModelError::BadConfig(format!(
                "{} experts, {} per token, intermediate size {}: a mixture of experts needs \
                 1 to {} experts per token and a non-zero size",
                self.num_experts,
                self.experts_per_token,
                self.expert_intermediate_size,
                self.num_experts
            )));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_moe_dense_layers_and_bad_counts() {
        let cfg = serde_json::json!({
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
            "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": true,
        });
        let m = MoeConfig::from_hf(&cfg, MoeFamily::Qwen3, 6).expect("config");
        assert_eq!(m.sparse_layers, [false, true, false, false, false, true]);
        assert!(m.normalize_top_k);
        assert_eq!((m.num_experts, m.experts_per_token), (8, 2));
        let bad = serde_json::json!({"num_experts": 2, "num_experts_per_tok": 3});
        let e = MoeConfig::from_hf(&bad, MoeFamily::Qwen3, 2).expect_err("3 of 2 experts");
        assert!(e.to_string().contains("1 to 2 experts per token"), "{e}");
        let mixtral = serde_json::json!({"num_local_experts": 4, "intermediate_size": 96});
        let m = MoeConfig::from_hf(&mixtral, MoeFamily::Mixtral, 2).expect("mixtral");
        assert_eq!(
            (
                m.num_experts,
                m.experts_per_token,
                m.expert_intermediate_size
            ),
            (4, 2, 96)
        );
        assert!(m.normalize_top_k && m.sparse_layers == [true, true]);
    }
}
