//! Embeddings ([`SamplingParams::embed`]): a request whose answer is its prompt's final hidden
//! state at the last token (last-token pooling, as Qwen3-Embedding, gte-Qwen2, e5-mistral and
//! SFR-Embedding are pooled, and as vLLM pools a generative model asked for embeddings), cut
//! to its first `dimensions` where asked (Matryoshka embeddings) and L2-normalized unless the
//! model says not to.
//!
//! A sequence classifier's request ([`EmbedParams::classify`]) runs the same way, its answer
//! the classifier's logits of that hidden state ([`crate::model::classify`]): a reranker's
//! relevance, a classifier's label.
//!
//! Such a request runs as one for a single greedy token: the step that ends its prompt keeps
//! the final hidden states of its rows of logits (the executor's, on the CPU), its row is
//! pooled here, and the embedding rides on the token's event, which the caller drops. The
//! prompt goes through the scheduler, the prefix cache and the batch as any other.

use super::Engine;
use crate::error::{EngineError, Result};
use crate::executor::{EngineConfig, Executor};
use crate::kv_cache::BlockHash;
use crate::sampler::{EmbedParams, SamplingParams};
use crate::scheduler::{Schedule, SchedulerConfig};

/// `hidden`, one row of the model's final hidden state, as `p` asks for it.
pub fn pool(hidden: &[f32], p: EmbedParams) -> Vec<f32> {
    let keep = p.dimensions.unwrap_or(hidden.len()).min(hidden.len());
    let mut v = hidden[..keep].to_vec();
    if p.normalize {
        // In f64, as `torch.nn.functional.normalize`'s f32 sum would differ only in the last
        // bits; eps 1e-12 as there.
        let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let scale = 1.0 / norm.max(1e-12);
        for x in &mut v {
            *x = (*x as f64 * scale) as f32;
        }
    }
    v
}

/// The scheduler's limits for `exec`'s model under `cfg` (`seed`: its block hashes' seed, if
/// prefix caching is on). An encoder's prompts run whole (its tokens see the whole prompt),
/// so a step's budget holds the longest, and none shares a prefix (its states depend on what
/// follows it).
pub(crate) fn scheduler_config(
    exec: &Executor,
    cfg: &EngineConfig,
    seed: BlockHash,
) -> SchedulerConfig {
    let whole = exec.encodes();
    let max_num_batched_tokens = match whole {
        true => cfg.max_num_batched_tokens.max(exec.max_model_len()),
        false => cfg.max_num_batched_tokens,
    };
    SchedulerConfig {
        max_num_batched_tokens,
        max_num_seqs: cfg.max_num_seqs,
        max_model_len: exec.max_model_len(),
        block_size: cfg.block_size,
        prefix_cache: (cfg.prefix_caching && !whole).then_some(seed),
        max_logits_rows: exec.max_logits_rows(cfg.max_num_seqs, max_num_batched_tokens),
        whole_prompts: whole,
    }
}

impl Engine {
    /// A sequence classifier's labels, in the order of its logits; `None` for a generative
    /// model.
    pub fn labels(&self) -> Option<&[String]> {
        self.exec.classifier().map(|c| c.labels())
    }

    /// What [`Engine::warmup`] runs: a prompt and one decode step, or a classifier's request
    /// (a classifier generates nothing).
    pub(crate) fn warmup_params(&self) -> SamplingParams {
        match self.exec.classifier() {
            Some(_) => SamplingParams::classify(),
            None if self.exec.encodes() => SamplingParams::embed(EmbedParams {
                normalize: true,
                dimensions: None,
                classify: false,
            }),
            None => SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(2)
            },
        }
    }

    /// Why an embeddings (or classification) request with `params` cannot run here, if it
    /// cannot; and a sequence classifier generates nothing.
    pub(crate) fn check_embed(&self, params: &SamplingParams) -> Result<()> {
        let refuse = |why: String| Err(EngineError::InvalidRequest(why));
        let Some(e) = params.embed else {
            if self.exec.encodes() {
                return refuse(
                    "this model is an encoder: it makes embeddings (/v1/embeddings) and \
                     generates no text"
                        .into(),
                );
            }
            if self.exec.classifier().is_some() {
                return refuse(
                    "this model is a sequence classifier: it scores and classifies \
                     (/v1/score, /v1/rerank, /classify) and generates no text"
                        .into(),
                );
            }
            return Ok(());
        };
        if params.max_tokens != 1 || params.prompt_logprobs.is_some() {
            return refuse("an embeddings request samples one token and scores nothing".into());
        }
        if e.classify && self.exec.classifier().is_none() {
            return refuse(format!(
                "this model ({:?}) is not a sequence classifier: it has no head to score or \
                 classify with",
                self.config().architecture
            ));
        }
        let hidden = self.config().hidden_size;
        if e.dimensions.is_some_and(|d| d == 0 || d > hidden) {
            return refuse(format!(
                "dimensions must be 1 to {hidden}, the model's hidden size"
            ));
        }
        if !self.exec.gives_hidden() || self.async_scheduling {
            return refuse(format!(
                "embeddings are computed by the CPU engine without async scheduling; this \
                 pool runs on {}{}",
                self.exec.device_name(),
                if self.async_scheduling {
                    " with async scheduling"
                } else {
                    ""
                }
            ));
        }
        Ok(())
    }

    /// Whether `schedule`'s step ends an embeddings request's prompt: its hidden states are
    /// then kept (and not otherwise: nothing is left over from a step that failed).
    pub(crate) fn keep_hidden_for(&mut self, schedule: &Schedule) {
        let embeds = (schedule.chunks.iter()).any(|c| c.samples && self.embeds(c.id));
        self.exec.keep_hidden(embeds);
    }

    fn embeds(&self, id: u64) -> bool {
        self.requests
            .get(&id)
            .is_some_and(|r| r.sampler.params().embed.is_some())
    }

    /// Pools the embedding of each embeddings request whose prompt ended in `schedule`'s step,
    /// from the hidden states the step kept, for its token's event.
    pub(crate) fn pool_embeddings(&mut self, schedule: &Schedule) -> Result<()> {
        let Some(hidden) = self.exec.take_hidden() else {
            return Ok(());
        };
        let h = self.config().hidden_size;
        let mut row = 0;
        for c in &schedule.chunks {
            row += c.rows();
            let Some(req) = self.requests.get_mut(&c.id) else {
                continue;
            };
            let Some(params) = req.sampler.params().embed.filter(|_| c.samples) else {
                continue;
            };
            let last = hidden.get((row - 1) * h..row * h).ok_or_else(|| {
                EngineError::Internal(format!(
                    "{} hidden values for {row} rows of {h}",
                    hidden.len()
                ))
            })?;
            req.embedding = Some(match self.exec.classifier() {
                Some(head) if params.classify => head.logits(last),
                _ => pool(last, params),
            });
        }
        Ok(())
    }
}
