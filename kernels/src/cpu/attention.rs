//! Causal attention over a paged KV cache.
//!
//! One layer's cache is `[num_blocks, block_size, kv_heads, head_dim]` for K and the same for V.
//! A sequence's block table maps its logical block `p / block_size` to a physical block; token
//! `p`'s key sits at slot `p % block_size` of that block.

use rayon::prelude::*;

/// One layer of the paged KV cache, read-only.
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl PagedKv<'_> {
    /// Offset of (position, kv head) in `k`/`v`, through the block table.
    #[inline]
    pub fn offset(&self, block_table: &[u32], pos: usize, kv_head: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        ((block * self.block_size + pos % self.block_size) * self.kv_heads + kv_head)
            * self.head_dim
    }
}

/// A query token: the block table of its sequence and its position; it attends to positions
/// `0..=pos` of that sequence.
#[derive(Debug, Clone, Copy)]
pub struct QueryToken<'a> {
    pub block_table: &'a [u32],
    pub pos: usize,
}

/// `out[t, h] = softmax(q[t, h] · K[0..=pos]ᵀ · scale) · V[0..=pos]`, with query head `h` reading
/// KV head `h / (n_heads / kv_heads)` (grouped-query attention).
///
/// `q` and `out` are `[tokens, n_heads * head_dim]`. The keys and values of every query token
/// must already be written to the cache.
///
/// # Panics
/// If the shapes disagree or a block table is too short for its position.
pub fn paged_attention(
    q: &[f32],
    tokens: &[QueryToken<'_>],
    n_heads: usize,
    kv: &PagedKv<'_>,
    scale: f32,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let row = n_heads * hd;
    assert!(
        q.len() == tokens.len() * row && out.len() == q.len(),
        "attention: shape mismatch"
    );
    assert!(
        n_heads.is_multiple_of(kv.kv_heads),
        "attention: heads not a multiple of kv heads"
    );
    let group = n_heads / kv.kv_heads;
    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let (t, h) = (i / n_heads, i % n_heads);
        let tok = &tokens[t];
        let qh = &q[t * row + h * hd..t * row + (h + 1) * hd];
        let kvh = h / group;
        let len = tok.pos + 1;
        let mut scores = Vec::with_capacity(len);
        // Walk the block table a block at a time: one offset computation per block, not per
        // position (the division by the block size was a measurable share of decode time).
        for_each_row(kv, tok.block_table, len, kvh, |off| {
            scores.push(dot(qh, &kv.k[off..off + hd]) * scale);
        });
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for s in &mut scores {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        o.fill(0.0);
        let mut p = 0;
        for_each_row(kv, tok.block_table, len, kvh, |off| {
            let w = scores[p] * inv;
            p += 1;
            for (acc, &v) in o.iter_mut().zip(&kv.v[off..off + hd]) {
                *acc += w * v;
            }
        });
    });
}

/// Calls `f` with the offset of `kv_head`'s row at positions `0..len`, in order.
#[inline]
fn for_each_row(
    kv: &PagedKv<'_>,
    block_table: &[u32],
    len: usize,
    kv_head: usize,
    mut f: impl FnMut(usize),
) {
    let stride = kv.kv_heads * kv.head_dim;
    for (bi, &block) in block_table.iter().enumerate() {
        let start = bi * kv.block_size;
        if start >= len {
            break;
        }
        let n = kv.block_size.min(len - start);
        let base = block as usize * kv.block_size * stride + kv_head * kv.head_dim;
        for slot in 0..n {
            f(base + slot * stride);
        }
    }
}

/// Dot product in 8 independent lanes, so the compiler vectorizes it.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paged attention equals dense causal attention when the blocks are scattered.
    #[test]
    fn matches_dense_attention_through_a_scattered_block_table() {
        let (kv_heads, n_heads, hd, bs, len) = (2, 4, 8, 4, 11);
        let num_blocks = 6;
        let blocks: Vec<u32> = vec![4, 1, 5]; // 11 positions need 3 blocks
        let val = |p: usize, h: usize, d: usize, s: f32| ((p * 31 + h * 7 + d) as f32 * s).sin();
        let mut k = vec![0f32; num_blocks * bs * kv_heads * hd];
        let mut v = k.clone();
        // Offsets depend only on the layout, so an empty-data view computes them.
        let layout = PagedKv {
            k: &[],
            v: &[],
            block_size: bs,
            kv_heads,
            head_dim: hd,
        };
        let offs: Vec<Vec<usize>> = (0..len)
            .map(|p| {
                (0..kv_heads)
                    .map(|h| layout.offset(&blocks, p, h))
                    .collect()
            })
            .collect();
        for p in 0..len {
            for h in 0..kv_heads {
                for d in 0..hd {
                    k[offs[p][h] + d] = val(p, h, d, 0.37);
                    v[offs[p][h] + d] = val(p, h, d, 0.11);
                }
            }
        }
        let q: Vec<f32> = (0..len * n_heads * hd)
            .map(|i| (i as f32 * 0.05).cos())
            .collect();
        let toks: Vec<QueryToken<'_>> = (0..len)
            .map(|pos| QueryToken {
                block_table: &blocks,
                pos,
            })
            .collect();
        let mut out = vec![0f32; q.len()];
        let cache = PagedKv {
            k: &k,
            v: &v,
            block_size: bs,
            kv_heads,
            head_dim: hd,
        };
        paged_attention(&q, &toks, n_heads, &cache, 0.3, &mut out);
        for t in 0..len {
            for h in 0..n_heads {
                let kvh = h / 2;
                let qh = &q[(t * n_heads + h) * hd..][..hd];
                let s: Vec<f32> = (0..=t)
                    .map(|p| (0..hd).map(|d| qh[d] * val(p, kvh, d, 0.37)).sum::<f32>() * 0.3)
                    .collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    let want: f32 = (0..=t).map(|p| e[p] / z * val(p, kvh, d, 0.11)).sum();
                    let got = out[(t * n_heads + h) * hd + d];
                    assert!((want - got).abs() < 1e-5, "t{t} h{h} d{d}: {want} vs {got}");
                }
            }
        }
    }
}
