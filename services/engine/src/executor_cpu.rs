//! The CPU's side of the executor: the model it runs (a decoder over its KV cache, or an
//! encoder, which keeps nothing between steps), and a step's forward and greedy draws.

use std::collections::HashMap;

use ferrite_collective::Collective;

use super::{Backend, EngineConfig, Executor, Picks};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::kv_cache::{KvCache, blocks_for};
use crate::model::classify::Classifier;
use crate::model::encoder::EncoderModel;
use crate::model::{DrawExtras, Draws, LlamaModel, ModelError, SeqChunk, TokenLogprobs};
use crate::plan::StepPlan;

/// What the CPU runs.
#[derive(Debug)]
pub(super) enum CpuModel {
    Decoder(LlamaModel),
    /// An encoder ([`crate::model::encoder`]): each step's prompts whole, pooled; its KV cache
    /// holds no layer (its blocks are the scheduler's count of sequences only).
    Encoder(EncoderModel),
}

impl CpuModel {
    pub(super) fn config(&self) -> &ModelConfig {
        match self {
            Self::Decoder(m) => m.config(),
            Self::Encoder(m) => m.config(),
        }
    }

    pub(super) fn classifier(&self) -> Option<&Classifier> {
        match self {
            Self::Decoder(m) => m.classifier(),
            Self::Encoder(m) => m.classifier(),
        }
    }

    /// The logits of `chunks`' rows, and with `hidden` their final hidden states kept there:
    /// an encoder's pooled rows, and logits of zeros (a token is drawn from them and never
    /// shown: an encoder's requests are embeddings).
    fn forward(
        &self,
        chunks: &[SeqChunk<'_>],
        kv: &mut KvCache,
        comm: &mut dyn Collective,
        hidden: Option<&mut Vec<f32>>,
    ) -> std::result::Result<Vec<f32>, ModelError> {
        match (self, hidden) {
            (Self::Decoder(m), Some(kept)) => {
                let (logits, rows) = m.forward_with_hidden(chunks, kv, comm)?;
                *kept = rows;
                Ok(logits)
            }
            (Self::Decoder(m), None) => m.forward(chunks, kv, comm),
            (Self::Encoder(m), hidden) => {
                let pooled = m.forward(chunks)?;
                if let Some(kept) = hidden {
                    *kept = pooled;
                }
                Ok(vec![0.0; chunks.len() * m.config().vocab_size])
            }
        }
    }
}

impl Executor {
    /// The CPU's backend over a decoder: the KV cache takes `cfg.kv_cache_bytes`.
    pub(super) fn cpu(
        model: LlamaModel,
        cfg: &EngineConfig,
        max_model_len: usize,
    ) -> Result<Backend> {
        let mc = model.config();
        let dtype = cfg.kv_cache_dtype;
        let per_token =
            KvCache::bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, dtype);
        let num_blocks = cfg.kv_cache_bytes / (per_token * cfg.block_size);
        let needed = blocks_for(max_model_len, cfg.block_size);
        if num_blocks < needed {
            return Err(EngineError::BadConfig(format!(
                "a KV cache of {} MiB holds {} tokens, less than one {max_model_len}-token sequence ({} MiB): lower max_model_len or give the KV cache more memory",
                cfg.kv_cache_bytes >> 20,
                num_blocks * cfg.block_size,
                (needed * cfg.block_size * per_token) >> 20
            )));
        }
        let num_blocks = num_blocks.min(u32::MAX as usize - 1);
        let _span = tracing::info_span!(target: crate::model::STARTUP_TARGET, "kv_cache_init",
            device = "cpu", dtype = dtype.as_str(), num_blocks = num_blocks as i64,
            block_size = cfg.block_size as i64,
            bytes = (num_blocks * cfg.block_size * per_token) as i64,
            max_model_len = max_model_len as i64, max_num_seqs = cfg.max_num_seqs as i64,
            max_num_batched_tokens = cfg.max_num_batched_tokens as i64)
        .entered();
        let shape = (num_blocks, cfg.block_size, mc.num_kv_heads, mc.head_dim);
        let kv = KvCache::with_dtype(mc.num_layers, shape, dtype);
        Ok(Backend::Cpu {
            model: Box::new(CpuModel::Decoder(model)),
            kv,
            drawn: Vec::new(),
        })
    }

    /// The CPU's backend over an encoder: no KV cache, and blocks enough for `max_num_seqs`
    /// prompts of `max_model_len` (the scheduler counts them; nothing is stored in them).
    pub(super) fn encoder(
        model: EncoderModel,
        cfg: &EngineConfig,
        max_model_len: usize,
        world: usize,
    ) -> Result<Backend> {
        let mc = model.config();
        if world > 1 {
            return Err(EngineError::BadConfig(
                "an encoder runs whole on one rank: serve it with --tp 1".into(),
            ));
        }
        if max_model_len > mc.max_position_embeddings {
            return Err(EngineError::BadConfig(format!(
                "max_model_len {max_model_len}: this encoder takes {} tokens (max_model_len \
                 {} at most: a prompt and the one token an embeddings request samples)",
                mc.max_position_embeddings - 1,
                mc.max_position_embeddings
            )));
        }
        let num_blocks = cfg.max_num_seqs * blocks_for(max_model_len, cfg.block_size);
        let shape = (num_blocks, cfg.block_size, mc.num_kv_heads, mc.head_dim);
        Ok(Backend::Cpu {
            kv: KvCache::with_dtype(0, shape, cfg.kv_cache_dtype),
            model: Box::new(CpuModel::Encoder(model)),
            drawn: Vec::new(),
        })
    }
}

/// `plan` with the tokens it carries put in their placeholders' place, from `drawn` (the CPU's
/// draws of the step before). A draw outside the vocabulary (a row with no distribution)
/// becomes token 0, as on a GPU: its request fails when the draw is read, and what this step
/// computes for it is dropped.
pub(super) fn with_carried<'a>(
    plan: &'a StepPlan,
    drawn: &[u32],
    vocab: usize,
) -> std::borrow::Cow<'a, StepPlan> {
    if plan.carried.is_empty() {
        return std::borrow::Cow::Borrowed(plan);
    }
    let mut plan = plan.clone();
    for c in &plan.carried {
        let token = (plan.chunks.get_mut(c.chunk as usize))
            .and_then(|ch| ch.tokens.get_mut(c.index as usize));
        if let (Some(t), Some(&d)) = (token, drawn.get(c.row as usize)) {
            *t = if (d as usize) < vocab { d } else { 0 };
        }
    }
    std::borrow::Cow::Owned(plan)
}

/// The CPU's forward of `chunks`; with `draws` (`drawn`, and `plan`, the step's with its
/// carried tokens in place), it also draws each row's greedy pick there (with the plan's
/// extras, [`cpu_draws`]), keeps them in `drawn` for the next step's carried tokens, and
/// gives back the logits of the plan's host rows as well. With `hidden`, the rows' final
/// hidden states are kept there.
pub(super) fn cpu_step(
    model: &CpuModel,
    kv: &mut KvCache,
    chunks: &[SeqChunk<'_>],
    draws: Option<(&mut Vec<u32>, &StepPlan)>,
    comm: &mut dyn Collective,
    hidden: Option<&mut Vec<f32>>,
) -> std::result::Result<Picks, ModelError> {
    let mut logits = model.forward(chunks, kv, comm, hidden)?;
    let Some((drawn, plan)) = draws else {
        return Ok(Picks::Logits(logits));
    };
    let vocab = model.config().vocab_size.max(1);
    let draws = cpu_draws(&mut logits, vocab, plan);
    drawn.clone_from(&draws.ids);
    if plan.host_rows.is_empty() {
        return Ok(Picks::Ids(draws));
    }
    let rows = (plan.host_rows.iter())
        .filter_map(|&r| {
            let at = r as usize * vocab;
            Some((r, logits.get(at..at + vocab)?.to_vec()))
        })
        .collect();
    Ok(Picks::Mixed(draws, rows))
}

/// The greedy pick of each row of `logits`, taken as a GPU takes it: with the penalties and
/// logprobs of `plan`'s extras where the row has them (each chunk's last token, in `plan`,
/// is the one [`DrawExtras::last_is_output`] counts). A row with no distribution (a NaN or
/// infinite logit) draws `u32::MAX`: the engine fails that request alone.
fn cpu_draws(logits: &mut [f32], vocab: usize, plan: &StepPlan) -> Draws {
    use rayon::prelude::*;
    let last: Vec<Option<u32>> = (plan.chunks.iter())
        .filter(|c| c.samples())
        .map(|c| c.tokens.last().copied())
        .collect();
    let extras: HashMap<u32, &DrawExtras> = plan.extras.iter().map(|x| (x.row, x)).collect();
    // A row with extras is penalized in place: its logits are not among those that come back.
    let draw = |(row, l): (usize, &mut [f32])| match extras.get(&(row as u32)) {
        None => (crate::sampler::greedy_pick(l).unwrap_or(u32::MAX), None),
        Some(x) => {
            let last = last.get(row).copied().flatten();
            crate::sampler::greedy_with_extras(l, x, last)
        }
    };
    // Rows with extras in parallel (each a few passes over the row), as the host samples them.
    let drawn: Vec<(u32, Option<TokenLogprobs>)> = match plan.extras.len() > 1 {
        true => (logits.par_chunks_exact_mut(vocab).enumerate())
            .map(draw)
            .collect(),
        false => logits
            .chunks_exact_mut(vocab)
            .enumerate()
            .map(draw)
            .collect(),
    };
    let mut draws = Draws::default();
    for (row, (id, logprobs)) in drawn.into_iter().enumerate() {
        draws.ids.push(id);
        draws.logprobs.extend(logprobs.map(|lp| (row as u32, lp)));
    }
    draws
}
