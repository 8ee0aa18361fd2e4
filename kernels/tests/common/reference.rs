//! Independent references for the op tests: each op written out from its definition, in f64,
//! one element at a time, calling nothing of `ferrite_kernels` but the dtype rounding. The CPU
//! ops (and the CUDA ops) are compared with these, so a wrong CPU op fails its test even on a
//! machine without a GPU.
//!
//! Rounding to the stored type happens where the ops store: inputs, the residual sum, outputs.

use ferrite_kernels::cuda::ops::{Dtype, NormKind};

use super::round;

fn to_f32(xs: &[f64]) -> Vec<f32> {
    xs.iter().map(|&x| x as f32).collect()
}

/// `x / sqrt(mean(x²) + eps) * w` per row of `w.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(w.len()) {
        let ms = row
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            / row.len() as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        out.extend(
            row.iter()
                .zip(w)
                .map(|(&v, &g)| f64::from(v) * inv * f64::from(g)),
        );
    }
    to_f32(&out)
}

/// The three RMSNorm kinds of the model layers, on inputs already rounded to `dtype`: plain;
/// residual += x, then norm (returns the sum too); norm, then residual += it. `weight_offset`
/// is Gemma's `1 + w`.
pub fn norm_kinds(
    dtype: Dtype,
    kind: NormKind,
    (x, residual): (&[f32], &[f32]),
    weight: &[f32],
    eps: f64,
    weight_offset: f32,
) -> (Vec<f32>, Vec<f32>) {
    let w: Vec<f32> = weight.iter().map(|v| v + weight_offset).collect();
    let add = |a: &[f32], b: &[f32]| {
        let sum: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(&a, &b)| f64::from(a) + f64::from(b))
            .collect();
        round(dtype, &to_f32(&sum))
    };
    match kind {
        NormKind::Plain => (round(dtype, &rms_norm(x, &w, eps)), residual.to_vec()),
        NormKind::AddThenNorm => {
            let r = add(residual, x);
            (round(dtype, &rms_norm(&r, &w, eps)), r)
        }
        NormKind::NormThenAdd => {
            let n = round(dtype, &rms_norm(x, &w, eps));
            (vec![0.0; x.len()], add(residual, &n))
        }
    }
}

/// Rotary embedding of one head vector at `pos`: the first `2 * inv_freq.len()` dims rotate in
/// pairs (`i`, `i + half`) (`adjacent`: (`2i`, `2i + 1`)) by `pos·scale·inv_freq[i]`. The
/// frequencies are the model's table (as transformers keeps `inv_freq`), and the angle is taken
/// in f32 as transformers takes it: at positions near 2^17 an angle of f32 is only good to a
/// few thousandths of a radian, whoever computes it. Sine and cosine in f64.
pub fn rope_head(head: &mut [f32], pos: usize, inv_freq: &[f32], scale: f32, adjacent: bool) {
    let half = inv_freq.len();
    for (i, &f) in inv_freq.iter().enumerate() {
        let angle = f64::from(pos as f32 * scale * f);
        let (a, b) = if adjacent {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (x0, x1) = (f64::from(head[a]), f64::from(head[b]));
        head[a] = (x0 * angle.cos() - x1 * angle.sin()) as f32;
        head[b] = (x0 * angle.sin() + x1 * angle.cos()) as f32;
    }
}

/// `act(gate) * up` per row of `[gate | up]`, with SiLU or tanh-approximated GELU.
pub fn gated(gate_up: &[f32], d_ff: usize, gelu: bool) -> Vec<f32> {
    let act = |g: f64| {
        if gelu {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (c * (g + 0.044_715 * g * g * g)).tanh())
        } else {
            g / (1.0 + (-g).exp())
        }
    };
    let mut out = Vec::with_capacity(gate_up.len() / 2);
    for row in gate_up.chunks(2 * d_ff) {
        let (gate, up) = row.split_at(d_ff);
        out.extend(
            gate.iter()
                .zip(up)
                .map(|(&g, &u)| (act(f64::from(g)) * f64::from(u)) as f32),
        );
    }
    out
}

/// One query token of a paged attention: its sequence's block table and its position.
pub struct Query<'a> {
    pub table: &'a [u32],
    pub pos: usize,
}

/// The shape and options of a paged attention.
pub struct AttentionShape {
    pub n_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block: usize,
    pub scale: f64,
    pub soft_cap: Option<f64>,
    pub window: Option<usize>,
}

/// `softmax(cap(q·kᵀ·scale)) · v` over positions `lo..=pos` of the query's sequence (`lo` =
/// `pos + 1 - window` with a window), query head `h` reading KV head `h / (n_heads/kv_heads)`.
/// The cache holds `[slot, kv_head, head_dim]`, slot = `table[p / block] * block + p % block`.
pub fn attention(
    q: &[f32],
    queries: &[Query<'_>],
    k: &[f32],
    v: &[f32],
    s: &AttentionShape,
) -> Vec<f32> {
    let (hd, group) = (s.head_dim, s.n_heads / s.kv_heads);
    let mut out = Vec::with_capacity(q.len());
    for (t, query) in queries.iter().enumerate() {
        let lo = s.window.map_or(0, |w| (query.pos + 1).saturating_sub(w));
        for h in 0..s.n_heads {
            let qh = &q[(t * s.n_heads + h) * hd..][..hd];
            let at = |cache: &[f32], p: usize| -> Vec<f64> {
                let slot = query.table[p / s.block] as usize * s.block + p % s.block;
                let off = (slot * s.kv_heads + h / group) * hd;
                cache[off..off + hd].iter().map(|&x| f64::from(x)).collect()
            };
            let scores: Vec<f64> = (lo..=query.pos)
                .map(|p| {
                    let dot: f64 = qh
                        .iter()
                        .zip(at(k, p))
                        .map(|(&a, b)| f64::from(a) * b)
                        .sum();
                    let raw = dot * s.scale;
                    s.soft_cap.map_or(raw, |c| c * (raw / c).tanh())
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let mut acc = vec![0.0f64; hd];
            for (p, w) in (lo..=query.pos).zip(&weights) {
                for (a, x) in acc.iter_mut().zip(at(v, p)) {
                    *a += w / total * x;
                }
            }
            out.extend(to_f32(&acc));
        }
    }
    out
}
