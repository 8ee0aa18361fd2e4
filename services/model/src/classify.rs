//! Sequence classifiers: Hugging Face `*ForSequenceClassification` checkpoints (rerankers such
//! as Qwen3-Reranker-seq-cls and bge-reranker-v2-gemma, sentiment and topic classifiers,
//! reward models). Their layers are the causal LM's; their head, `score.weight`
//! `[labels, hidden]` with no bias, turns the last token's final hidden state into one logit
//! per label, as transformers' `*ForSequenceClassification` and vLLM pool them (the last
//! token: prompts here are never padded).
//!
//! Such a checkpoint has no LM head. The forward still ends in one ([`crate::llama`]): the
//! embedding table stands in for it, and the token it picks is never shown, so the request
//! path is an embeddings request's ([`ModelConfig::labels`]).

use ferrite_formats::TensorMap;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::naming::WeightNaming;

/// A classifier's head: its labels and their rows.
#[derive(Debug, Clone)]
pub struct Classifier {
    labels: Vec<String>,
    /// `[labels][hidden]`, in f32 whatever the checkpoint's type (a few rows).
    weight: Vec<f32>,
    hidden: usize,
}

impl Classifier {
    /// The head of the classifier `cfg` describes (`None` for a generative model), whole on
    /// every rank of a pool: it is a few rows, applied once per request.
    pub fn load(t: &TensorMap, naming: WeightNaming, cfg: &ModelConfig) -> Result<Option<Self>> {
        let Some(labels) = &cfg.labels else {
            return Ok(None);
        };
        let name = naming.global("cls.output.weight", "score.weight");
        if !t.contains(&name) {
            return Err(ModelError::BadConfig(format!(
                "a sequence classifier's checkpoint without its head `{name}`"
            )));
        }
        let head = t
            .matrix(&name)?
            .expect_shape(&name, labels.len(), cfg.hidden_size)?;
        Ok(Some(Self {
            labels: labels.clone(),
            weight: head.to_f32(),
            hidden: cfg.hidden_size,
        }))
    }

    /// The labels, in the order of [`Self::logits`].
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// One logit per label of a final hidden state (after the last norm), summed in f64.
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        (self.weight.chunks_exact(self.hidden))
            .map(|row| {
                let dot: f64 = row
                    .iter()
                    .zip(hidden)
                    .map(|(w, x)| *w as f64 * *x as f64)
                    .sum();
                dot as f32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The logits are the rows' dot products with the hidden state, in label order.
    #[test]
    fn logits_are_the_rows_dot_products() {
        let c = Classifier {
            labels: vec!["a".into(), "b".into()],
            weight: vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0],
            hidden: 3,
        };
        assert_eq!(c.logits(&[1.0, 1.0, 2.0]), vec![9.0, -0.5]);
        assert_eq!(c.labels(), ["a", "b"]);
    }
}
