//! Causal attention over a paged KV cache.
//!
//! One layer's cache is `[num_blocks, block_size, kv_heads, head_dim]` for K and the same for V.
//! A sequence's block table maps its logical block `p / block_size` to a physical block; token
//! `p`'s key sits at slot `p % block_size` of that block.
//!
//! The cache holds f32, f16 or FP8 e4m3 ([`KvElem`]): f16 halves its memory and what
//! attention reads (llama.cpp's default), e4m3 quarters it (vLLM's `fp8` cache, scale 1);
//! each row is widened to f32 as it is loaded, so the arithmetic is the f32 kernels' on the
//! stored values.

use std::ops::Range;

use rayon::prelude::*;

pub use super::kv_elem::{E4m3, KvElem};

/// One layer of the paged KV cache, read-only.
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a, E = f32> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl<E> PagedKv<'_, E> {
    /// Offset of (position, kv head) in `k`/`v`, through the block table.
    #[inline]
    pub fn offset(&self, block_table: &[u32], pos: usize, kv_head: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        ((block * self.block_size + pos % self.block_size) * self.kv_heads + kv_head)
            * self.head_dim
    }
}

/// A query token: the block table of its sequence and its position; it attends to positions
/// `0..=pos` of that sequence (the last [`AttentionOptions::sliding_window`] of them when set).
#[derive(Debug, Clone, Copy)]
pub struct QueryToken<'a> {
    pub block_table: &'a [u32],
    pub pos: usize,
}

/// How one layer's attention scores its keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOptions<'a> {
    /// Multiplies `q · k` (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Gemma 2: scores become `tanh(s / cap) * cap` after scaling, before the softmax.
    pub soft_cap: Option<f32>,
    /// A token at `pos` sees only positions `pos + 1 - w ..= pos` (itself and the `w - 1` before
    /// it), as transformers' sliding-window mask and llama.cpp's SWA do. `None`: all of `0..=pos`.
    pub sliding_window: Option<usize>,
    /// gpt-oss: one learned logit per query head (indexed by head) that joins each softmax as
    /// a position with no value: it takes its share of the weight, so a head can attend to
    /// nothing (transformers' `sinks`, the "attention sink" of StreamingLLM).
    pub sinks: Option<&'a [f32]>,
}

impl AttentionOptions<'_> {
    /// Plain causal attention with `scale`.
    pub fn causal(scale: f32) -> Self {
        Self {
            scale,
            soft_cap: None,
            sliding_window: None,
            sinks: None,
        }
    }

    /// Head `h`'s sink logit (minus infinity, which takes no weight, without sinks).
    #[inline]
    fn sink(&self, h: usize) -> f32 {
        self.sinks.map_or(f32::NEG_INFINITY, |s| s[h])
    }
}

/// `out[t, h] = softmax(cap(q[t, h] · K[lo..=pos]ᵀ · scale)) · V[lo..=pos]`, with query head `h`
/// reading KV head `h / (n_heads / kv_heads)` (grouped-query attention), `lo` the window's first
/// position (0 without one) and `cap` the optional soft cap.
///
/// `q` and `out` are `[tokens, n_heads * head_dim]`. The keys and values of every query token
/// must already be written to the cache.
///
/// # Panics
/// If the shapes disagree, a block table is too short for its position, or the window is 0.
pub fn paged_attention<E: KvElem>(
    q: &[f32],
    tokens: &[QueryToken<'_>],
    n_heads: usize,
    kv: &PagedKv<'_, E>,
    opts: AttentionOptions<'_>,
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
    assert!(opts.sliding_window != Some(0), "attention: empty window");
    assert!(
        opts.sinks.is_none_or(|s| s.len() == n_heads),
        "attention: one sink per head"
    );
    let group = n_heads / kv.kv_heads;
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = crate::quant::Avx512::detect().filter(|_| matches!(hd, 64 | 128)) {
        // One task per token and KV head: its query heads (contiguous in q and out) read each
        // key and value row once, together.
        out.par_chunks_mut(group * hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (i, o)| {
                let (t, kv_head) = (i / kv.kv_heads, i % kv.kv_heads);
                let at = t * row + kv_head * group * hd;
                let heads = x86::Heads {
                    q: &q[at..at + group * hd],
                    tok: &tokens[t],
                    kv_head,
                    first_head: kv_head * group,
                };
                x86::attend_heads(w, &heads, kv, opts, scores, o);
            });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let avx2 = crate::quant::Avx2::detect();
    out.par_chunks_mut(hd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (i, o)| {
            let (t, h) = (i / n_heads, i % n_heads);
            let head = Head {
                q: &q[t * row + h * hd..t * row + (h + 1) * hd],
                tok: &tokens[t],
                kv_head: h / group,
                sink: opts.sink(h),
            };
            #[cfg(target_arch = "x86_64")]
            if let Some(a) = avx2 {
                return a.attend(&head, kv, opts, scores, o);
            }
            attend::<Portable, E>(&head, kv, opts, scores, o);
        });
}

/// One query head of one token, the KV head it reads, and its sink logit.
struct Head<'a> {
    q: &'a [f32],
    tok: &'a QueryToken<'a>,
    kv_head: usize,
    sink: f32,
}

/// The two vector operations of attention, as one instruction set implements them, over rows
/// of the cache (`b`, `v`) stored as `E`.
trait Lanes {
    /// `a · b` (equal lengths).
    fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32;
    /// `acc += w · v` (equal lengths).
    fn axpy<E: KvElem>(w: f32, v: &[E], acc: &mut [f32]);
}

/// `o = softmax(cap(q · Kᵀ · scale)) · V` for one head (its sink, if any, in the softmax);
/// `scores` is reused scratch.
#[inline(always)]
fn attend<L: Lanes, E: KvElem>(
    head: &Head<'_>,
    kv: &PagedKv<'_, E>,
    opts: AttentionOptions<'_>,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let hd = kv.head_dim;
    let end = head.tok.pos + 1;
    let start = opts.sliding_window.map_or(0, |w| end.saturating_sub(w));
    let table = head.tok.block_table;
    scores.clear();
    // Walk the block table a block at a time: one offset computation per block, not per
    // position (the division by the block size was a measurable share of decode time).
    for_each_row(kv, table, start..end, head.kv_head, |off| {
        let s = L::dot(head.q, &kv.k[off..off + hd]) * opts.scale;
        scores.push(opts.soft_cap.map_or(s, |cap| super::norm::soft_cap(s, cap)));
    });
    let inv = exp_normalizer(scores, head.sink);
    o.fill(0.0);
    let mut p = 0;
    for_each_row(kv, table, start..end, head.kv_head, |off| {
        L::axpy(scores[p] * inv, &kv.v[off..off + hd], o);
        p += 1;
    });
}

/// `scores = softmax(scores)`, row by row of `len` (each row's exponentials of its
/// differences from its largest, over their sum), 16 at a time on AVX-512 as attention's own:
/// an encoder's prompt attention takes `len²` of them per head.
///
/// # Panics
/// If `scores.len()` is not a multiple of `len`.
pub fn softmax_rows(scores: &mut [f32], len: usize) {
    assert!(
        len > 0 && scores.len().is_multiple_of(len),
        "softmax: shape mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    let wide = crate::quant::Avx512::detect();
    for row in scores.chunks_exact_mut(len) {
        #[cfg(target_arch = "x86_64")]
        let inv = match wide {
            Some(proof) => x86::exp_normalizer_on(proof, row),
            None => exp_normalizer(row, f32::NEG_INFINITY),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let inv = exp_normalizer(row, f32::NEG_INFINITY);
        row.iter_mut().for_each(|s| *s *= inv);
    }
}

/// Replaces each score by `exp(s - max)` and returns `1 / Σ`: the softmax, its division left
/// to the weighted sum. `sink` is one more logit in the softmax, with no score of its own to
/// weigh (minus infinity: none).
#[inline]
fn exp_normalizer(scores: &mut [f32], sink: f32) -> f32 {
    let max = scores.iter().copied().fold(sink, f32::max);
    let mut sum = (sink - max).exp();
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    1.0 / sum
}

/// Calls `f` with the offset of `kv_head`'s row at each of `positions`, in order.
#[inline]
fn for_each_row<E>(
    kv: &PagedKv<'_, E>,
    block_table: &[u32],
    positions: Range<usize>,
    kv_head: usize,
    mut f: impl FnMut(usize),
) {
    let stride = kv.kv_heads * kv.head_dim;
    let bs = kv.block_size;
    let mut pos = positions.start;
    while pos < positions.end {
        let (block, slot) = (block_table[pos / bs] as usize, pos % bs);
        let n = (bs - slot).min(positions.end - pos);
        let base = (block * bs + slot) * stride + kv_head * kv.head_dim;
        for i in 0..n {
            f(base + i * stride);
        }
        pos += n;
    }
}

/// Plain Rust, vectorized by the compiler for the baseline instruction set.
struct Portable;

impl Lanes for Portable {
    /// 8 independent lanes, so the compiler vectorizes the sum.
    #[inline(always)]
    fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
        let mut acc = [0f32; 8];
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y.to_f32())
            .sum();
        for (x, y) in ca.zip(cb) {
            for l in 0..8 {
                acc[l] += x[l] * y[l].to_f32();
            }
        }
        acc.iter().sum::<f32>() + tail
    }

    #[inline(always)]
    fn axpy<E: KvElem>(w: f32, v: &[E], acc: &mut [f32]) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a += w * x.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    //! AVX2 + FMA (+ F16C, which the [`Avx2`] token also proves): the baseline build only has SSE2, which made attention ~14% of batch-1
    //! decode time on the default model.

    use std::arch::x86_64::*;

    use super::super::exp16::exp16;
    use super::{AttentionOptions, Head, KvElem, Lanes, PagedKv, QueryToken, attend, for_each_row};
    use crate::quant::Avx2;

    pub(super) struct Fma;

    impl Lanes for Fma {
        #[inline(always)]
        fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
            assert_eq!(a.len(), b.len());
            let n8 = a.len() - a.len() % 8;
            // SAFETY: used only where AVX2, FMA and F16C were detected (`attend_avx2`, and the
            // unit test after detection); every load reads 8 values at e < n8 <= len of both.
            unsafe {
                let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let mut e = 0;
                while e + 16 <= n8 {
                    let (pa, pb) = (a.as_ptr().add(e), b.as_ptr().add(e));
                    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa), E::load8(pb), s0);
                    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(8)), E::load8(pb.add(8)), s1);
                    e += 16;
                }
                if e < n8 {
                    let (pa, pb) = (a.as_ptr().add(e), b.as_ptr().add(e));
                    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa), E::load8(pb), s0);
                }
                let tail: f32 = (a[n8..].iter().zip(&b[n8..]))
                    .map(|(x, y)| x * y.to_f32())
                    .sum();
                crate::quant::hsum256(_mm256_add_ps(s0, s1)) + tail
            }
        }

        #[inline(always)]
        fn axpy<E: KvElem>(w: f32, v: &[E], acc: &mut [f32]) {
            assert_eq!(v.len(), acc.len());
            let n8 = v.len() - v.len() % 8;
            // SAFETY: as in `dot`; loads and stores stay below n8 <= len of both slices.
            unsafe {
                let wv = _mm256_set1_ps(w);
                let mut e = 0;
                while e < n8 {
                    let pa = acc.as_mut_ptr().add(e);
                    let x = E::load8(v.as_ptr().add(e));
                    _mm256_storeu_ps(pa, _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(pa)));
                    e += 8;
                }
            }
            for (a, &x) in acc[n8..].iter_mut().zip(&v[n8..]) {
                *a += w * x.to_f32();
            }
        }
    }

    /// [`attend`] compiled for AVX2 + FMA.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn attend_avx2<E: KvElem>(
        head: &Head<'_>,
        kv: &PagedKv<'_, E>,
        opts: AttentionOptions<'_>,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        attend::<Fma, E>(head, kv, opts, scores, o);
    }

    /// The query heads of one token that read one KV head (contiguous: `q` is `heads × hd`).
    pub(super) struct Heads<'a> {
        pub(super) q: &'a [f32],
        pub(super) tok: &'a QueryToken<'a>,
        pub(super) kv_head: usize,
        /// The index of `q`'s first head among the token's (its sink's index).
        pub(super) first_head: usize,
    }

    /// [`attend`] for every query head of `heads`, of 64 or 128 dims, on AVX-512: up to 4
    /// (64 dims) or 2 (128) heads at a time read each key and value row once, and their
    /// queries and weighted sums of values stay in registers across every position (the AVX2
    /// version reloads the output row at each position, for one head).
    pub(super) fn attend_heads<E: KvElem>(
        _proof: crate::quant::Avx512,
        heads: &Heads<'_>,
        kv: &PagedKv<'_, E>,
        opts: AttentionOptions<'_>,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        let hd = kv.head_dim;
        let per = if hd == 64 { 4 } else { 2 };
        let n = heads.q.len() / hd;
        let mut h = 0;
        while h < n {
            let g = per.min(n - h);
            let q = &heads.q[h * hd..(h + g) * hd];
            let o = &mut o[h * hd..(h + g) * hd];
            let first = heads.first_head + h;
            // SAFETY: an `Avx512` exists only where detection found AVX-512F (and AVX2/FMA);
            // the caller took this path for heads of 64 or 128 dims only, which N matches,
            // and q and o hold g heads of them.
            unsafe {
                match (hd, g) {
                    (64, 4) => wide::<E, 4, 4>(q, heads, first, kv, opts, scores, o),
                    (64, 3) => wide::<E, 4, 3>(q, heads, first, kv, opts, scores, o),
                    (64, 2) => wide::<E, 4, 2>(q, heads, first, kv, opts, scores, o),
                    (64, _) => wide::<E, 4, 1>(q, heads, first, kv, opts, scores, o),
                    (_, 2) => wide::<E, 8, 2>(q, heads, first, kv, opts, scores, o),
                    _ => wide::<E, 8, 1>(q, heads, first, kv, opts, scores, o),
                }
            }
            h += g;
        }
    }

    /// `G` query heads of `16·N` dims (`q`, `o`: `G × 16N`) against one KV head.
    ///
    /// # Safety
    /// AVX-512F available; `kv.head_dim == 16 * N`; `q` and `o` hold `G` heads.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[allow(clippy::needless_range_loop)] // index loops read clearest over register arrays
    unsafe fn wide<E: KvElem, const N: usize, const G: usize>(
        q: &[f32],
        heads: &Heads<'_>,
        first: usize,
        kv: &PagedKv<'_, E>,
        opts: AttentionOptions<'_>,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        let hd = 16 * N;
        assert!(kv.head_dim == hd && q.len() == G * hd && o.len() == G * hd);
        let end = heads.tok.pos + 1;
        let start = opts.sliding_window.map_or(0, |w| end.saturating_sub(w));
        let len = end - start;
        let table = heads.tok.block_table;
        // SAFETY: q holds G·16N f32s (asserted).
        let qv: [[__m512; N]; G] = std::array::from_fn(|g| {
            std::array::from_fn(|j| unsafe { _mm512_loadu_ps(q.as_ptr().add(g * hd + 16 * j)) })
        });
        scores.clear();
        scores.resize(G * len, 0.0);
        let mut p = 0;
        for_each_row(kv, table, start..end, heads.kv_head, |off| {
            // SAFETY: the row at `off` holds hd = 16N values of the cache.
            let k: [__m512; N] = std::array::from_fn(|j| unsafe {
                E::load16(kv.k[off..off + hd].as_ptr().add(16 * j))
            });
            for g in 0..G {
                let mut acc = _mm512_mul_ps(qv[g][0], k[0]);
                for j in 1..N {
                    acc = _mm512_fmadd_ps(qv[g][j], k[j], acc);
                }
                let s = _mm512_reduce_add_ps(acc) * opts.scale;
                scores[g * len + p] = opts
                    .soft_cap
                    .map_or(s, |cap| super::super::norm::soft_cap(s, cap));
            }
            p += 1;
        });
        // SAFETY: this function's own features (AVX-512F) cover `exp_normalizer_wide`'s.
        let inv: [f32; G] = std::array::from_fn(|g| unsafe {
            exp_normalizer_wide(&mut scores[g * len..(g + 1) * len], opts.sink(first + g))
        });
        let mut acc = [[_mm512_setzero_ps(); N]; G];
        let mut p = 0;
        for_each_row(kv, table, start..end, heads.kv_head, |off| {
            // SAFETY: as for the keys.
            let v: [__m512; N] = std::array::from_fn(|j| unsafe {
                E::load16(kv.v[off..off + hd].as_ptr().add(16 * j))
            });
            for g in 0..G {
                let w = _mm512_set1_ps(scores[g * len + p] * inv[g]);
                for j in 0..N {
                    acc[g][j] = _mm512_fmadd_ps(w, v[j], acc[g][j]);
                }
            }
            p += 1;
        });
        for g in 0..G {
            for j in 0..N {
                // SAFETY: o holds G·16N f32s (asserted).
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(g * hd + 16 * j), acc[g][j]) };
            }
        }
    }

    /// [`exp_normalizer_wide`], where `_proof` shows the CPU has AVX-512.
    pub(super) fn exp_normalizer_on(_proof: crate::quant::Avx512, scores: &mut [f32]) -> f32 {
        // SAFETY: an `Avx512` exists only where detection found AVX-512F.
        unsafe { exp_normalizer_wide(scores, f32::NEG_INFINITY) }
    }

    /// [`exp_normalizer`] 16 scores at a time, with [`exp16`] for libm's `expf`: a
    /// one-token step of 8 sequences of the default model spent 4.5% of its time in `expf`.
    ///
    /// # Safety
    /// AVX-512F available.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn exp_normalizer_wide(scores: &mut [f32], sink: f32) -> f32 {
        let max = scores.iter().copied().fold(sink, f32::max);
        let (m, mut sum) = (_mm512_set1_ps(max), _mm512_setzero_ps());
        let mut chunks = scores.chunks_exact_mut(16);
        for c in &mut chunks {
            // SAFETY: 16 f32s in `c`.
            unsafe {
                let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), m));
                _mm512_storeu_ps(c.as_mut_ptr(), e);
                sum = _mm512_add_ps(sum, e);
            }
        }
        let rest = chunks.into_remainder();
        let mask: __mmask16 = ((1u32 << rest.len()) - 1) as u16;
        // SAFETY: the mask covers the remainder's lanes only; the others are zero and stay
        // out of the sum.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask, rest.as_ptr());
            let e = _mm512_maskz_mov_ps(mask, exp16(_mm512_sub_ps(x, m)));
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, e);
            sum = _mm512_add_ps(sum, e);
        }
        1.0 / (_mm512_reduce_add_ps(sum) + (sink - max).exp())
    }

    impl Avx2 {
        /// [`attend`] on AVX2 + FMA, which this token proves the CPU has.
        pub(super) fn attend<E: KvElem>(
            self,
            head: &Head<'_>,
            kv: &PagedKv<'_, E>,
            opts: AttentionOptions<'_>,
            scores: &mut Vec<f32>,
            o: &mut [f32],
        ) {
            // SAFETY: an `Avx2` exists only where detection found AVX2 and FMA.
            unsafe { attend_avx2(head, kv, opts, scores, o) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// Each row of `softmax_rows` (rows longer and shorter than 16 lanes) is the softmax of
    /// that row computed in f64.
    #[test]
    fn softmax_rows_are_each_rows_softmax() {
        for len in [1usize, 5, 16, 37] {
            let mut x: Vec<f32> = (0..3 * len)
                .map(|i| ((i * 7919) % 23) as f32 * 0.37 - 4.0)
                .collect();
            let want: Vec<f64> = (x.chunks_exact(len))
                .flat_map(|row| {
                    let max = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
                    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
                    row.iter()
                        .map(move |&v| (v as f64 - max).exp() / sum)
                        .collect::<Vec<_>>()
                })
                .collect();
            softmax_rows(&mut x, len);
            for (got, want) in x.iter().zip(&want) {
                assert!(
                    (*got as f64 - want).abs() < 1e-6,
                    "len {len}: {got} vs {want}"
                );
            }
        }
    }

    const KV_HEADS: usize = 2;
    const N_HEADS: usize = 4;
    const HD: usize = 8;
    const BS: usize = 4;
    const LEN: usize = 11;

    fn val(p: usize, h: usize, d: usize, s: f32) -> f32 {
        ((p * 31 + h * 7 + d) as f32 * s).sin()
    }

    /// Runs paged attention over `LEN` tokens whose K/V sit in scattered blocks, and checks it
    /// against dense attention over the positions each token may see, at several head sizes,
    /// with the cache in f32, f16 and e4m3 (against the values rounded as the cache holds
    /// them).
    fn check_against_dense(opts: AttentionOptions<'_>) {
        // 8 runs the generic lanes; 64 and 128 the AVX-512 kernels where the CPU has them.
        for hd in [HD, 64, 128] {
            check_against_dense_hd::<f32>(opts, hd);
            check_against_dense_hd::<f16>(opts, hd);
            check_against_dense_hd::<E4m3>(opts, hd);
        }
    }

    fn check_against_dense_hd<E: KvElem>(opts: AttentionOptions<'_>, hd: usize) {
        // What the cache holds of each value.
        let val = |p, h, d, s| E::from_f32(val(p, h, d, s)).to_f32();
        let num_blocks = 6;
        let blocks: Vec<u32> = vec![4, 1, 5]; // 11 positions need 3 blocks
        let mut k = vec![E::from_f32(0.0); num_blocks * BS * KV_HEADS * hd];
        let mut v = k.clone();
        // Offsets depend only on the layout, so an empty-data view computes them.
        let layout = PagedKv::<f32> {
            k: &[],
            v: &[],
            block_size: BS,
            kv_heads: KV_HEADS,
            head_dim: hd,
        };
        for p in 0..LEN {
            for h in 0..KV_HEADS {
                let off = layout.offset(&blocks, p, h);
                for d in 0..hd {
                    k[off + d] = E::from_f32(val(p, h, d, 0.37));
                    v[off + d] = E::from_f32(val(p, h, d, 0.11));
                }
            }
        }
        // Large enough that scores reach a few units, where a soft cap of 1-2 bends them.
        let q: Vec<f32> = (0..LEN * N_HEADS * hd)
            .map(|i| 3.0 * (i as f32 * 0.05).cos())
            .collect();
        let toks: Vec<QueryToken<'_>> = (0..LEN)
            .map(|pos| QueryToken {
                block_table: &blocks,
                pos,
            })
            .collect();
        let mut out = vec![0f32; q.len()];
        let cache = PagedKv {
            k: &k,
            v: &v,
            block_size: BS,
            kv_heads: KV_HEADS,
            head_dim: hd,
        };
        paged_attention(&q, &toks, N_HEADS, &cache, opts, &mut out);
        for t in 0..LEN {
            let lo = opts.sliding_window.map_or(0, |w| (t + 1).saturating_sub(w));
            for h in 0..N_HEADS {
                let kvh = h / (N_HEADS / KV_HEADS);
                let qh = &q[(t * N_HEADS + h) * hd..][..hd];
                let s: Vec<f32> = (lo..=t)
                    .map(|p| {
                        let raw = (0..hd).map(|d| qh[d] * val(p, kvh, d, 0.37)).sum::<f32>();
                        let scaled = raw * opts.scale;
                        opts.soft_cap.map_or(scaled, |c| c * (scaled / c).tanh())
                    })
                    .collect();
                let sink = opts.sinks.map_or(f32::NEG_INFINITY, |s| s[h]);
                let m = s.iter().cloned().fold(sink, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum::<f32>() + (sink - m).exp();
                for d in 0..hd {
                    let want: f32 = (lo..=t).map(|p| e[p - lo] / z * val(p, kvh, d, 0.11)).sum();
                    let got = out[(t * N_HEADS + h) * hd + d];
                    assert!(
                        (want - got).abs() < 1e-5,
                        "{opts:?} t{t} h{h} d{d}: {want} vs {got}"
                    );
                }
            }
        }
    }

    /// Paged attention equals dense causal attention when the blocks are scattered.
    #[test]
    fn matches_dense_attention_through_a_scattered_block_table() {
        check_against_dense(AttentionOptions::causal(0.3));
    }

    /// Windows shorter than, equal to and longer than a block; 1 attends to the token itself.
    #[test]
    fn sliding_window_matches_dense_attention_over_the_window() {
        for w in [1, 3, BS, 6, LEN, 100] {
            check_against_dense(AttentionOptions {
                sliding_window: Some(w),
                ..AttentionOptions::causal(0.3)
            });
        }
    }

    #[test]
    fn soft_capped_scores_match_dense_attention() {
        let capped = AttentionOptions {
            soft_cap: Some(1.5),
            ..AttentionOptions::causal(0.3)
        };
        check_against_dense(capped);
        check_against_dense(AttentionOptions {
            sliding_window: Some(5),
            ..capped
        });
    }

    /// gpt-oss's sinks: each head's own extra logit in its softmax, near the scores' size so
    /// that it takes a real share (from most of the weight to little of it), with and without
    /// a window.
    #[test]
    fn sinks_take_their_share_of_each_softmax() {
        let sinks: Vec<f32> = (0..N_HEADS).map(|h| 4.0 - 2.5 * h as f32).collect();
        let with_sinks = AttentionOptions {
            sinks: Some(&sinks),
            ..AttentionOptions::causal(0.3)
        };
        check_against_dense(with_sinks);
        check_against_dense(AttentionOptions {
            sliding_window: Some(3),
            ..with_sinks
        });
    }

    /// Each instruction set's `dot` and `axpy` equal f64 sums, at lengths with and without a
    /// tail of fewer than 8 (the head sizes attention meets are multiples of 8, but need not be),
    /// over rows stored in f32, f16 and e4m3.
    #[test]
    fn lanes_match_a_plain_sum_at_every_length() {
        fn check<L: Lanes, E: KvElem>() {
            for n in [0, 1, 7, 8, 9, 16, 24, 64, 67, 128] {
                let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
                let b: Vec<E> = (0..n)
                    .map(|i| E::from_f32((i as f32 * 0.7).cos()))
                    .collect();
                let bf: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
                let want: f64 = a.iter().zip(&bf).map(|(x, y)| f64::from(x * y)).sum();
                assert!(
                    (f64::from(L::dot(&a, &b)) - want).abs() < 1e-5,
                    "dot, n = {n}"
                );
                let mut acc = a.clone();
                L::axpy(0.5, &b, &mut acc);
                for i in 0..n {
                    assert!(
                        (acc[i] - (a[i] + 0.5 * bf[i])).abs() < 1e-6,
                        "axpy, n = {n}"
                    );
                }
            }
        }
        check::<Portable, f32>();
        check::<Portable, f16>();
        check::<Portable, E4m3>();
        #[cfg(target_arch = "x86_64")]
        if crate::quant::Avx2::detect().is_some() {
            check::<x86::Fma, f32>();
            check::<x86::Fma, f16>();
            check::<x86::Fma, E4m3>();
        }
    }

    /// The cap changes the result (the test data reaches scores where tanh bends).
    #[test]
    fn soft_cap_is_active_on_the_test_data() {
        let blocks = [0u32];
        let k: Vec<f32> = (0..BS * HD).map(|i| (i as f32 * 0.7).sin()).collect();
        let v: Vec<f32> = (0..BS * HD).map(|i| (i as f32 * 0.3).cos()).collect();
        let cache = PagedKv {
            k: &k,
            v: &v,
            block_size: BS,
            kv_heads: 1,
            head_dim: HD,
        };
        let q: Vec<f32> = k[3 * HD..].iter().map(|x| 4.0 * x).collect();
        let toks = [QueryToken {
            block_table: &blocks,
            pos: 3,
        }];
        let run = |opts| {
            let mut out = vec![0f32; HD];
            paged_attention(&q, &toks, 1, &cache, opts, &mut out);
            out
        };
        let plain = run(AttentionOptions::causal(1.0));
        let capped = run(AttentionOptions {
            soft_cap: Some(1.0),
            ..AttentionOptions::causal(1.0)
        });
        let diff = plain.iter().zip(&capped).map(|(a, b)| (a - b).abs());
        assert!(diff.fold(0f32, f32::max) > 0.05);
    }
}
