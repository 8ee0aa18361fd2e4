//! Perplexity of a model on a text (the quality check for quantized weights).
//!
//! The method of llama.cpp's `perplexity` tool: the tokens are cut into independent chunks of
//! `ctx` tokens; each chunk runs as one prefill, and only the second half of its positions is
//! scored, so every scored token sees at least `ctx / 2` tokens of context. Perplexity is
//! `exp(mean negative log-likelihood)` over the scored tokens.

use ferrite_engine::model::kv::KvDtype;
use ferrite_engine::model::{BatchForward, LlamaModel, LogitsWanted};
use ferrite_engine::sampler::token_nll;
use ferrite_engine::{EngineError, Result};

/// The result of [`perplexity`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    /// Mean negative log-likelihood per scored token (nats).
    pub mean_nll: f64,
    pub scored_tokens: usize,
    pub chunks: usize,
}

/// Perplexity of `model` over `tokens` in chunks of `ctx` (at most `max_chunks` of them), its
/// KV cache storing `kv` (f32: the exact path).
pub fn perplexity(
    model: &LlamaModel,
    tokens: &[u32],
    (ctx, max_chunks): (usize, Option<usize>),
    kv: KvDtype,
) -> Result<Perplexity> {
    let c = model.config();
    if ctx < 4 || ctx > c.max_position_embeddings {
        return Err(EngineError::InvalidRequest(format!(
            "context {ctx} must be in 4..={}",
            c.max_position_embeddings
        )));
    }
    let chunks = (tokens.len() / ctx).min(max_chunks.unwrap_or(usize::MAX));
    if chunks == 0 {
        return Err(EngineError::InvalidRequest(format!(
            "the text has {} tokens, fewer than one chunk of {ctx}",
            tokens.len()
        )));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        return Err(EngineError::InvalidRequest(format!(
            "token id {bad} is outside the vocabulary (size {})",
            c.vocab_size
        )));
    }
    let mut runner = BatchForward::new(model, 1, ctx)?.with_kv_dtype(kv);
    let (mut nll, mut scored) = (0f64, 0usize);
    let vocab = c.vocab_size;
    for chunk in tokens.chunks_exact(ctx).take(chunks) {
        let logits = runner.run(&[chunk], LogitsWanted::All)?;
        for pos in ctx / 2..ctx - 1 {
            nll += token_nll(&logits[pos * vocab..(pos + 1) * vocab], chunk[pos + 1]);
            scored += 1;
        }
    }
    let mean_nll = nll / scored as f64;
    Ok(Perplexity {
        ppl: mean_nll.exp(),
        mean_nll,
        scored_tokens: scored,
        chunks,
    })
}
