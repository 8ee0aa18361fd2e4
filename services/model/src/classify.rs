//! Sequence classifiers: Hugging Face `*ForSequenceClassification` checkpoints (rerankers such
//! as Qwen3-Reranker-seq-cls, sentiment and topic classifiers, reward models). Their layers are the causal LM's; their head, `score.weight`
//! `[labels, hidden]` with no bias, turns the last token's final hidden state into one logit
//! per label, as transformers' `*ForSequenceClassification` and vLLM pool them (the last
//! token: prompts here are never padded).
//!
//! Such a checkpoint has no LM head. The forward still ends in one ([`crate::llama`]): the
//! embedding table stands in for it, and the token it picks is never shown, so the request
//! path is an embeddings request's ([`ModelConfig::labels`]).
//!
//! A causal LM trained to answer a relevance question with a token (Qwen3-Reranker answers
//! `yes` or `no`) is served as a classifier too, as vLLM's
//! `classifier_from_token` does ([`by_tokens`], `--classifier-from-tokens`): its head is the
//! LM head's rows of those tokens. Two tokens (`no,yes`) make one label, the second's row
//! minus the first's, whose sigmoid is the softmax probability of the second token over the
//! two: what Qwen3-Reranker's model card computes.

use ferrite_formats::{Matrix, TensorMap};
use ferrite_text::Tokenizer;

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
    /// One per label (an encoder's head has them), or none.
    bias: Vec<f32>,
}

impl Classifier {
    /// The head of the classifier `cfg` describes (`None` for a generative model), whole on
    /// every rank of a pool: it is a few rows, applied once per request.
    pub fn load(t: &TensorMap, naming: WeightNaming, cfg: &ModelConfig) -> Result<Option<Self>> {
        let Some(labels) = &cfg.labels else {
            return Ok(None);
        };
        let weight = match &cfg.label_tokens {
            Some(ids) => token_rows(&lm_head(t, naming, cfg)?, ids),
            None => {
                let name = naming.global("cls.output.weight", "score.weight");
                if !t.contains(&name) {
                    return Err(ModelError::BadConfig(format!(
                        "a sequence classifier's checkpoint without its head `{name}`"
                    )));
                }
                let head = t.matrix(&name)?;
                head.expect_shape(&name, labels.len(), cfg.hidden_size)?
                    .to_f32()
            }
        };
        Ok(Some(Self {
            labels: labels.clone(),
            weight,
            hidden: cfg.hidden_size,
            bias: Vec::new(),
        }))
    }

    /// A head of `labels` rows of `weight` (`[labels][hidden]`) and, where not empty, their
    /// `bias`.
    pub(crate) fn new(labels: Vec<String>, weight: Vec<f32>, bias: Vec<f32>) -> Self {
        let hidden = weight.len() / labels.len().max(1);
        Self {
            labels,
            weight,
            hidden,
            bias,
        }
    }

    /// The labels, in the order of [`Self::logits`].
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// One logit per label of a final hidden state (after the last norm), summed in f64, and
    /// its bias.
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        (self.weight.chunks_exact(self.hidden))
            .enumerate()
            .map(|(i, row)| {
                let dot: f64 = row
                    .iter()
                    .zip(hidden)
                    .map(|(w, x)| *w as f64 * *x as f64)
                    .sum();
                let bias = self.bias.get(i).copied().unwrap_or(0.0);
                (dot + bias as f64) as f32
            })
            .collect()
    }
}

/// Makes `cfg`, a causal LM's, a classifier's whose head is its LM head's rows of the
/// tokens named (`--classifier-from-tokens`, as the tokenizer's vocabulary spells them): one
/// label per token, or for two tokens one label, the second's row minus the first's.
pub fn by_tokens(
    cfg: &mut ModelConfig,
    names: &[String],
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    let bad = |m: String| {
        Err(ModelError::BadConfig(format!(
            "--classifier-from-tokens: {m}"
        )))
    };
    if cfg.labels.is_some() {
        return bad("the model is a sequence classifier already".into());
    }
    if cfg.final_logit_softcap.is_some() || cfg.logits_divisor != 1.0 {
        return bad(
            "this model's logits are soft-capped or divided, which rows of its head do not give"
                .into(),
        );
    }
    let Some(tokenizer) = tokenizer else {
        return bad("the model has no tokenizer to find the tokens in".into());
    };
    let mut ids = Vec::with_capacity(names.len());
    for name in names {
        match tokenizer.token_to_id(name) {
            Some(id) if (id as usize) < cfg.vocab_size => ids.push(id),
            _ => return bad(format!("`{name}` is not a token of the model's vocabulary")),
        }
    }
    cfg.labels = Some(match names {
        [] => return bad("no tokens".into()),
        [_, yes] => vec![yes.clone()],
        _ => names.to_vec(),
    });
    cfg.label_tokens = Some(ids);
    Ok(())
}

/// The whole LM head (the embeddings where tied): a rank's shard holds only its rows.
fn lm_head(t: &TensorMap, naming: WeightNaming, cfg: &ModelConfig) -> Result<Matrix> {
    let head = naming.global("output.weight", "lm_head.weight");
    let name = match t.contains(&head) {
        true => head,
        false => naming.global("token_embd.weight", "model.embed_tokens.weight"),
    };
    Ok(t.matrix(&name)?
        .expect_shape(&name, cfg.vocab_size, cfg.hidden_size)?)
}

/// The rows of `ids` in `head`, or for two ids the second's minus the first's.
fn token_rows(head: &Matrix, ids: &[u32]) -> Vec<f32> {
    let row = |id: u32| {
        let mut r = vec![0.0; head.cols];
        head.dequantize_row(id as usize, &mut r);
        r
    };
    match ids {
        [no, yes] => (row(*yes).iter().zip(row(*no)))
            .map(|(y, n)| y - n)
            .collect(),
        _ => ids.iter().flat_map(|&id| row(id)).collect(),
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
            bias: Vec::new(),
        };
        assert_eq!(c.logits(&[1.0, 1.0, 2.0]), vec![9.0, -0.5]);
        assert_eq!(c.labels(), ["a", "b"]);
        let biased = Classifier::new(c.labels.clone(), c.weight.clone(), vec![0.5, -1.0]);
        assert_eq!(biased.logits(&[1.0, 1.0, 2.0]), vec![9.5, -1.5]);
    }
}
