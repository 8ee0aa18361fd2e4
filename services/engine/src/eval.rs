//! Perplexity of a model on a text (the quality check for quantized weights), and whole-batch
//! forwards outside the engine ([`BatchForward`]).
//!
//! The method of llama.cpp's `perplexity` tool: the tokens are cut into independent chunks of
//! `ctx` tokens; each chunk runs as one prefill, and only the second half of its positions is
//! scored, so every scored token sees at least `ctx / 2` tokens of context. Perplexity is
//! `exp(mean negative log-likelihood)` over the scored tokens.

use crate::error::{EngineError, Result};
use crate::kv_cache::{BlockTable, KvBlockPool, KvCache};
use crate::model::{LlamaModel, LogitsWanted, SeqChunk};

/// The result of [`perplexity`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    /// Mean negative log-likelihood per scored token (nats).
    pub mean_nll: f64,
    pub scored_tokens: usize,
    pub chunks: usize,
}

/// `-log softmax(logits)[target]`, in f64.
pub fn token_nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln() - logits[target as usize] as f64
}

/// Perplexity of `model` over `tokens` in chunks of `ctx` (at most `max_chunks` of them).
pub fn perplexity(
    model: &LlamaModel,
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
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
    let mut runner = BatchForward::new(model, 1, ctx)?;
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

/// Whole sequences through the model in one forward each, outside the engine (no scheduler,
/// no sampling): perplexity, and `bench forward`. The KV cache is made once, for `batch`
/// sequences of up to `max_len` tokens, and reused.
#[derive(Debug)]
pub struct BatchForward<'m> {
    model: &'m LlamaModel,
    kv: KvCache,
    tables: Vec<BlockTable>,
    max_len: usize,
}

impl<'m> BatchForward<'m> {
    /// KV blocks of 16 tokens.
    pub fn new(model: &'m LlamaModel, batch: usize, max_len: usize) -> Result<Self> {
        Self::with_block_size(model, batch, max_len, 16)
    }

    /// [`Self::new`] with KV blocks of `block_size` tokens (small ones make decode steps cross
    /// block boundaries, which tests want).
    pub fn with_block_size(
        model: &'m LlamaModel,
        batch: usize,
        max_len: usize,
        block_size: usize,
    ) -> Result<Self> {
        let c = model.config();
        let per_seq = max_len.div_ceil(block_size);
        let n_blocks = per_seq * batch;
        let kv = KvCache::new(
            c.num_layers,
            n_blocks,
            block_size,
            c.num_kv_heads,
            c.head_dim,
        );
        let mut pool = KvBlockPool::new(n_blocks as u32);
        let mut tables = vec![BlockTable::default(); batch];
        for t in &mut tables {
            if !pool.allocate_into(per_seq, t) {
                return Err(EngineError::DoesNotFit(format!("{n_blocks} KV blocks")));
            }
        }
        Ok(Self {
            model,
            kv,
            tables,
            max_len,
        })
    }

    /// One forward of `seqs` (each from position 0); the logits `wanted`, in order.
    pub fn run(&mut self, seqs: &[&[u32]], wanted: LogitsWanted) -> Result<Vec<f32>> {
        self.run_at(seqs, 0, wanted)
    }

    /// One forward of `seqs`, each continuing its sequence at `start_pos` (the cache holds the
    /// earlier positions from previous calls).
    pub fn run_at(
        &mut self,
        seqs: &[&[u32]],
        start_pos: usize,
        wanted: LogitsWanted,
    ) -> Result<Vec<f32>> {
        if seqs.len() > self.tables.len() || seqs.iter().any(|s| start_pos + s.len() > self.max_len)
        {
            return Err(EngineError::InvalidRequest(format!(
                "at most {} sequences of {} tokens",
                self.tables.len(),
                self.max_len
            )));
        }
        let chunks: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(&self.tables)
            .map(|(tokens, table)| SeqChunk {
                tokens,
                start_pos,
                block_table: table.blocks(),
                logits: wanted,
            })
            .collect();
        self.model
            .forward(&chunks, &mut self.kv, &mut ferrite_collective::Solo)
    }
}
