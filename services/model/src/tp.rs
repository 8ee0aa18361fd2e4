//! Tensor parallelism: which share of the model one rank of a pool holds.
//!
//! A pool of N ranks splits every layer the Megatron way, so that each layer needs two
//! all-reduces and nothing else:
//!
//! - Q, K and V are split by heads, gate and up by rows (column-parallel): each rank computes
//!   its heads' attention and its slice of the MLP's hidden activations on its own.
//! - O and down are split by columns (row-parallel): each rank's product is a partial sum of
//!   the full output, and an all-reduce adds them up.
//! - When a model has fewer KV heads than ranks, each KV head is held by `N / kv_heads` ranks
//!   (as vLLM does), so N must divide into the KV heads or be a multiple of them.
//! - The embedding is replicated: a lookup reads one row per token, needs no collective, and
//!   its pages are mapped, so only the rows a rank sees are read. The LM head is split by
//!   vocabulary (it is the largest single product of a small model) and its logits are
//!   all-gathered for the leader to sample.
//!
//! A rank's [`ModelConfig`] is the shard's shape (heads / N, KV heads / N, intermediate / N):
//! the forward runs on it without special cases; the vocabulary stays the model's.

use std::ops::Range;

use ferrite_collective::Collective;
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// One rank's place in its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpRank {
    pub rank: usize,
    pub world: usize,
}

impl Default for TpRank {
    fn default() -> Self {
        Self::SOLO
    }
}

impl TpRank {
    /// The whole model in one rank.
    pub const SOLO: TpRank = TpRank { rank: 0, world: 1 };

    pub fn new(rank: usize, world: usize) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(ModelError::BadConfig(format!(
                "rank {rank} of a pool of {world}: the rank must be below the pool size"
            )));
        }
        Ok(Self { rank, world })
    }

    pub fn is_solo(&self) -> bool {
        self.world == 1
    }

    /// This rank's part of `0..n` cut into `world` equal parts (`n` divides: checked by
    /// [`check_split`]).
    pub fn part(&self, n: usize) -> Range<usize> {
        let each = n / self.world;
        self.rank * each..(self.rank + 1) * each
    }

    /// This rank's rows of the LM head: parts of `ceil(vocab / world)`, the last one shorter
    /// when the vocabulary does not divide (its logits are padded for the all-gather).
    pub fn vocab_part(&self, vocab: usize) -> Range<usize> {
        let each = vocab.div_ceil(self.world);
        (self.rank * each).min(vocab)..((self.rank + 1) * each).min(vocab)
    }

    /// This rank's KV heads: its part of them, or the one head its query heads read when
    /// there are fewer KV heads than ranks.
    pub fn kv_heads(&self, num_kv_heads: usize) -> Range<usize> {
        if num_kv_heads >= self.world {
            self.part(num_kv_heads)
        } else {
            let h = self.rank * num_kv_heads / self.world;
            h..h + 1
        }
    }
}

/// The rows of Q, of K and V, and of gate and up (or the columns of O and down) that a rank
/// holds, in the whole model's numbering: [`TpRank::rows`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRows {
    pub q: Range<usize>,
    pub kv: Range<usize>,
    pub ffn: Range<usize>,
}

impl TpRank {
    /// This rank's rows of the projections of a model of shape `c` (the whole model's).
    pub fn rows(&self, c: &ModelConfig) -> ShardRows {
        let heads = |r: Range<usize>| r.start * c.head_dim..r.end * c.head_dim;
        ShardRows {
            q: heads(self.part(c.num_heads)),
            kv: heads(self.kv_heads(c.num_kv_heads)),
            ffn: self.part(c.intermediate_size),
        }
    }
}

/// The whole runs a shard's cuts must keep, set by the stored formats: columns of the
/// row-parallel products (a GGUF block, a weight-only group, an FP8 block's width) and rows of
/// the column-parallel ones (an FP8 block's height).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardAlign {
    pub rows: usize,
    pub cols: usize,
}

impl ShardAlign {
    /// Columns in runs of `cols`, rows free.
    pub fn cols(cols: usize) -> Self {
        Self { rows: 1, cols }
    }
}

/// Why `cfg` cannot be split `world` ways with cuts on whole runs of `align`.
fn split_problem(cfg: &ModelConfig, world: usize, align: ShardAlign) -> Option<String> {
    // A mixture's experts split as the dense MLP does, by their own intermediate size.
    let moe = cfg.moe.as_ref();
    let experts = moe.map(|m| ("the experts'", m.expert_intermediate_size));
    let shared = moe.and_then(|m| m.shared_expert_intermediate_size);
    let shared = shared.map(|s| ("the shared expert's", s));
    // A mixture with no dense layer has no dense MLP to split.
    let dense = (moe.is_none_or(|m| m.sparse_layers.contains(&false)))
        .then_some(("the", cfg.intermediate_size));
    (dense.into_iter().chain(experts).chain(shared))
        .find_map(|mlp| split_problem_with(cfg, mlp, world, align))
}

/// [`split_problem`] for an MLP of intermediate size `ffn` (`whose` names it in the error).
fn split_problem_with(
    cfg: &ModelConfig,
    (whose, ffn): (&str, usize),
    world: usize,
    align: ShardAlign,
) -> Option<String> {
    let (heads, kv) = (cfg.num_heads, cfg.num_kv_heads);
    if !heads.is_multiple_of(world) {
        return Some(format!("{heads} attention heads do not divide by {world}"));
    }
    if !kv.is_multiple_of(world) && !world.is_multiple_of(kv) {
        return Some(format!(
            "{kv} KV heads neither divide by {world} nor divide it"
        ));
    }
    if !ffn.is_multiple_of(world) {
        return Some(format!(
            "{whose} intermediate size {ffn} does not divide by {world}"
        ));
    }
    if world == 1 {
        return None;
    }
    if cfg.qk_norm_all_heads {
        return Some(
            "its q/k norms span every head (OLMo 2's), so each rank would need the others' sums"
                .into(),
        );
    }
    let whole = |n: usize, run: usize| n.is_multiple_of(run.max(1));
    let (q_cols, ffn_cols) = (cfg.q_dim() / world, ffn / world);
    if !(whole(q_cols, align.cols) && whole(ffn_cols, align.cols)) {
        return Some(format!(
            "the attention output and {whose} down projections would be cut into {q_cols} \
             and {ffn_cols} columns per rank, not whole blocks of {} of their stored format",
            align.cols
        ));
    }
    // A rank holding one replicated KV head cuts its rows at a head boundary.
    let kv_rows = (kv / world).max(1) * cfg.head_dim;
    if ![q_cols, kv_rows, ffn_cols]
        .iter()
        .all(|&n| whole(n, align.rows))
    {
        return Some(format!(
            "the Q, K/V and {whose} gate/up projections would be cut into {q_cols}, {kv_rows} \
             and {ffn_cols} rows per rank, not whole blocks of {} rows of their stored format",
            align.rows
        ));
    }
    None
}

/// The pool sizes `cfg` splits into (up to its head count).
pub fn valid_sizes(cfg: &ModelConfig, align: ShardAlign) -> Vec<usize> {
    (1..=cfg.num_heads)
        .filter(|&n| split_problem(cfg, n, align).is_none())
        .collect()
}

/// Checks that `cfg` splits `world` ways; the error says why not and lists the sizes that do.
pub fn check_split(cfg: &ModelConfig, world: usize, align: ShardAlign) -> Result<()> {
    match split_problem(cfg, world, align) {
        None => Ok(()),
        Some(why) => Err(ModelError::BadConfig(format!(
            "this model cannot run on {world} tensor-parallel ranks: {why}; sizes that work: {:?}",
            valid_sizes(cfg, align)
        ))),
    }
}

impl ModelConfig {
    /// The shape of `tp`'s shard: heads, KV heads and intermediate size divided among the
    /// ranks (at least one KV head each). The caller checked the split with [`check_split`].
    pub fn shard(&self, tp: TpRank) -> ModelConfig {
        let mut c = self.clone();
        c.num_heads = self.num_heads / tp.world;
        c.num_kv_heads = tp.kv_heads(self.num_kv_heads).len();
        c.intermediate_size = self.intermediate_size / tp.world;
        if let Some(moe) = &mut c.moe {
            moe.expert_intermediate_size /= tp.world;
            if let Some(s) = &mut moe.shared_expert_intermediate_size {
                *s /= tp.world;
            }
        }
        c
    }
}

/// The LM head's logits of `n` rows put together on rank 0 from every rank's part: `local`
/// holds this rank's `n × each` (its vocabulary part, padded to `each = ⌈vocab / world⌉`
/// columns). Rank 0 gets the whole `n × vocab` rows, the others nothing (only the leader
/// samples).
pub fn gather_logits(
    tp: TpRank,
    vocab: usize,
    local: &[f32],
    n: usize,
    comm: &mut dyn Collective,
) -> Result<Option<Vec<f32>>> {
    if tp.rank != 0 {
        comm.gather(local, &mut [])?;
        return Ok(None);
    }
    let mut all = vec![0f32; tp.world * n * vocab.div_ceil(tp.world)];
    comm.gather(local, &mut all)?;
    Ok(Some(place_logits(tp.world, vocab, n, &all)))
}

/// Every rank's `n × each` logits (its vocabulary part padded to `each = ⌈vocab / world⌉`
/// columns; rank order, as gathered) placed into `n` whole rows of `vocab`.
pub fn place_logits(world: usize, vocab: usize, n: usize, all: &[f32]) -> Vec<f32> {
    let each = vocab.div_ceil(world);
    let mut logits = vec![0f32; n * vocab];
    for (rank, theirs) in all.chunks_exact(n * each).enumerate() {
        let part = TpRank { rank, world }.vocab_part(vocab);
        for (row, src) in logits
            .chunks_exact_mut(vocab)
            .zip(theirs.chunks_exact(each))
        {
            row[part.clone()].copy_from_slice(&src[..part.len()]);
        }
    }
    logits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    fn smollm2_shape() -> ModelConfig {
        // SmolLM2-135M: 9 heads, 3 KV heads, 1536 intermediate, 576 hidden.
        let mut c = presets::preset("llama-3-8b")
            .and_then(|p| p.config())
            .expect("preset");
        c.num_heads = 9;
        c.num_kv_heads = 3;
        c.head_dim = 64;
        c.intermediate_size = 1536;
        c
    }

    #[test]
    fn sizes_that_divide_and_the_error_that_lists_them() {
        let c = smollm2_shape();
        assert_eq!(valid_sizes(&c, ShardAlign::cols(1)), vec![1, 3]);
        // Q4_1 blocks of 32: 576 / 3 = 192 and 1536 / 3 = 512 columns are whole blocks.
        assert_eq!(valid_sizes(&c, ShardAlign::cols(32)), vec![1, 3]);
        // Groups of 128 do not fit 192 columns.
        assert_eq!(valid_sizes(&c, ShardAlign::cols(128)), vec![1]);
        // FP8 blocks 64 rows high fit 192 Q rows, 64 K/V rows (one head) and 512 gate rows;
        // 128 rows high do not.
        let blocks = |rows| ShardAlign { rows, cols: 64 };
        assert_eq!(valid_sizes(&c, blocks(64)), vec![1, 3]);
        assert_eq!(valid_sizes(&c, blocks(128)), vec![1]);
        let e = check_split(&c, 3, blocks(128)).expect_err("blocks of 128 rows");
        assert!(e.to_string().contains("192, 64 and 512 rows"), "{e}");
        let e = check_split(&c, 2, ShardAlign::cols(32)).expect_err("9 heads do not divide by 2");
        let msg = e.to_string();
        assert!(
            msg.contains("9 attention heads do not divide by 2"),
            "{msg}"
        );
        assert!(msg.contains("sizes that work: [1, 3]"), "{msg}");
    }

    /// Qwen3-30B-A3B in GGUF's Q4_K (blocks of 256): each expert's 768 columns of down split
    /// into whole blocks 3 ways only, which its 32 heads do not: one rank, and the error
    /// names the experts. Its dense `intermediate_size` (6144), which no layer uses, is not
    /// asked to split.
    #[test]
    fn a_mixtures_experts_split_on_their_own_size() {
        let c = presets::preset("qwen3-30b-a3b")
            .and_then(|p| p.config())
            .expect("preset");
        assert_eq!(valid_sizes(&c, ShardAlign::cols(256)), vec![1]);
        let e = check_split(&c, 2, ShardAlign::cols(256)).expect_err("384 columns");
        assert!(
            e.to_string().contains("the experts' down projections"),
            "{e}"
        );
        let any = vec![1, 2, 4, 8, 16, 32];
        assert_eq!(valid_sizes(&c, ShardAlign::cols(1)), any);
        let mut odd = c.clone();
        odd.intermediate_size = 6143;
        assert_eq!(valid_sizes(&odd, ShardAlign::cols(1)), any);
    }

    #[test]
    fn kv_heads_are_split_or_replicated() {
        // 8 KV heads over 4 ranks: two each.
        assert_eq!(TpRank { rank: 3, world: 4 }.kv_heads(8), 6..8);
        // 2 KV heads over 4 ranks: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1.
        let heads: Vec<_> = (0..4)
            .map(|r| TpRank { rank: r, world: 4 }.kv_heads(2))
            .collect();
        assert_eq!(heads, vec![0..1, 0..1, 1..2, 1..2]);
        let mut c = smollm2_shape();
        c.num_heads = 8;
        c.num_kv_heads = 2;
        assert!(check_split(&c, 4, ShardAlign::cols(1)).is_ok());
        assert!(check_split(&c, 3, ShardAlign::cols(1)).is_err());
        let s = c.shard(TpRank { rank: 2, world: 4 });
        assert_eq!(
            (s.num_heads, s.num_kv_heads, s.intermediate_size),
            (2, 1, 384)
        );
    }

    #[test]
    fn vocabulary_parts_cover_it_once() {
        for (vocab, world) in [(49152, 3), (32000, 3), (10, 4), (7, 8)] {
            let mut next = 0;
            for rank in 0..world {
                let p = TpRank { rank, world }.vocab_part(vocab);
                assert_eq!(p.start, next.min(vocab), "{vocab} over {world}");
                assert!(p.len() <= vocab.div_ceil(world));
                next = p.end.max(next);
            }
            assert_eq!(next, vocab);
        }
    }

    /// The logits placed from the parts equal the whole rows, for vocabularies that divide
    /// and that do not (the last part shorter, its padding dropped).
    #[test]
    fn logits_parts_are_placed_into_whole_rows() {
        for (vocab, world, n) in [(12usize, 3usize, 2usize), (10, 4, 3), (7, 8, 1)] {
            let whole: Vec<f32> = (0..n * vocab).map(|i| i as f32).collect();
            let each = vocab.div_ceil(world);
            let mut all = vec![-1f32; world * n * each];
            for rank in 0..world {
                let part = TpRank { rank, world }.vocab_part(vocab);
                for row in 0..n {
                    let dst = (rank * n + row) * each;
                    all[dst..dst + part.len()]
                        .copy_from_slice(&whole[row * vocab + part.start..row * vocab + part.end]);
                }
            }
            assert_eq!(
                place_logits(world, vocab, n, &all),
                whole,
                "{vocab} over {world}"
            );
        }
    }
}
