//! Whole sequences through the CPU model, outside the engine: no scheduler, no sampling, one
//! forward of every sequence at a time ([`BatchForward`]). Perplexity, `bench forward` and the
//! engine's own tests run the model this way.

use crate::error::{ModelError, Result};
use crate::kv::KvCache;
use crate::llama::LlamaModel;
use crate::step::{LogitsWanted, SeqChunk};

/// Whole sequences through the model in one forward each, outside the engine (no scheduler,
/// no sampling): perplexity, and `bench forward`. The KV cache is made once, for `batch`
/// sequences of up to `max_len` tokens, and reused.
#[derive(Debug)]
pub struct BatchForward<'m> {
    model: &'m LlamaModel,
    kv: KvCache,
    /// Each sequence's block table: its own run of blocks, the first sequence's first.
    tables: Vec<Vec<u32>>,
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
        let tables = (0..batch)
            .map(|s| (s * per_seq..(s + 1) * per_seq).map(|b| b as u32).collect())
            .collect();
        Ok(Self {
            model,
            kv,
            tables,
            max_len,
        })
    }

    /// The same, its KV cache (emptied) storing its values as `dtype`.
    pub fn with_kv_dtype(mut self, dtype: crate::kv::KvDtype) -> Self {
        let k = &self.kv;
        let shape = (k.num_blocks, k.block_size, k.kv_heads, k.head_dim);
        self.kv = KvCache::with_dtype(self.model.config().num_layers, shape, dtype);
        self
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
            return Err(ModelError::InvalidRequest(format!(
                "at most {} sequences of {} tokens",
                self.tables.len(),
                self.max_len
            )));
        }
        let chunks: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(&self.tables)
            .map(|(tokens, table)| SeqChunk {
                lora: None,
                tokens,
                start_pos,
                block_table: table,
                logits: wanted,
                // Whole sequences from the start, or tokens after them: one at a time is a
                // decode step (the tests teacher-force one token at a time).
                prompt: start_pos == 0 || tokens.len() > 1,
            })
            .collect();
        self.model
            .forward(&chunks, &mut self.kv, &mut ferrite_collective::Solo)
    }
}
