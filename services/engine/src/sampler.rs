//! Turning a row of logits into the next token.
//!
//! Order, as Hugging Face and vLLM apply them: logit bias → repetition / presence / frequency
//! penalties → temperature (0 = greedy) → top-k → top-p → min-p → draw from the renormalized
//! distribution. Logprobs are reported from the raw model distribution (before the bias, the
//! penalties and the temperature), as vLLM does by default.
//!
//! Each request owns its random generator; with a seed, the same request yields the same tokens
//! whatever else is in the batch.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::{EngineError, Result};
use crate::model::{DrawExtras, Penalties, TokenLogprobs};

/// How to pick tokens for one request. Build with [`SamplingParams::greedy`] or a struct
/// literal, then [`SamplingParams::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub max_tokens: usize,
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 means no top-k.
    pub top_k: usize,
    /// 1 means no top-p.
    pub top_p: f32,
    /// 0 means no min-p.
    pub min_p: f32,
    pub seed: Option<u64>,
    /// 1 means none; > 1 discourages tokens already in the prompt or output.
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Generation stops after emitting any of these (the EOS ids are added unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Return this many top alternatives (with their logprobs) per token.
    pub logprobs: Option<usize>,
    /// Added to these tokens' logits before the penalties (OpenAI's `logit_bias`): each token
    /// once, in the vocabulary.
    pub logit_bias: Vec<(u32, f32)>,
    /// Score the prompt too: each prompt token's logprob (from the second), with this many
    /// top alternatives. Its prompt is then computed whole, never taken from the prefix cache.
    pub prompt_logprobs: Option<usize>,
    /// An embeddings request (`max_tokens` 1): its token's event carries the prompt's
    /// embedding. Not on the wire: the worker sets it from the request.
    pub embed: Option<EmbedParams>,
    /// The LoRA adapter the request runs with, by its number in [`Engine::lora_names`]
    /// (`None`: the base model). Not on the wire: the worker sets it from the adapter's name.
    ///
    /// [`Engine::lora_names`]: crate::engine::Engine::lora_names
    pub lora: Option<u32>,
}

/// How an embeddings request's vector is made from the hidden state (the engine's `embed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedParams {
    /// Divide by the L2 norm (after the cut to `dimensions`).
    pub normalize: bool,
    /// Keep only the first this many of the hidden state's values.
    pub dimensions: Option<usize>,
    /// The classifier's logits of the hidden state instead (a sequence classifier's
    /// [`Executor::classifier`]; `normalize` and `dimensions` do not apply).
    ///
    /// [`Executor::classifier`]: crate::executor::Executor::classifier
    pub classify: bool,
}

use ferrite_proto::worker::v1 as pb;

pub const MAX_LOGPROBS: usize = ferrite_proto::sampling::MAX_LOGPROBS as usize;

impl SamplingParams {
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            logit_bias: Vec::new(),
            prompt_logprobs: None,
            embed: None,
            lora: None,
        }
    }

    /// A sequence classifier's request: one greedy token, never shown; the classifier's
    /// logits of the prompt ride on its event.
    pub fn classify() -> Self {
        Self::embed(EmbedParams {
            normalize: false,
            dimensions: None,
            classify: true,
        })
    }

    /// An embeddings request (a classifier's, with `e.classify`): one greedy token, never
    /// shown; the embedding of the prompt rides on its event.
    pub fn embed(e: EmbedParams) -> Self {
        Self {
            ignore_eos: true,
            embed: Some(e),
            ..Self::greedy(1)
        }
    }

    /// Checks every field's range (the ranges of [`ferrite_proto::sampling`], the gateway's
    /// too); the message names the field and its limit.
    pub fn validate(&self) -> Result<()> {
        ferrite_proto::sampling::check(&self.to_wire()).map_err(EngineError::InvalidRequest)
    }

    /// The penalties, as the ranks take them ([`DrawExtras`]).
    pub fn penalties(&self) -> Penalties {
        Penalties {
            repetition: self.repetition_penalty,
            presence: self.presence_penalty,
            frequency: self.frequency_penalty,
        }
    }

    /// These parameters as the worker API carries them (counts past `u32` saturate, which
    /// the ranges then refuse or treat alike).
    pub fn to_wire(&self) -> pb::SamplingParams {
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        pb::SamplingParams {
            max_tokens: n(self.max_tokens),
            temperature: self.temperature,
            top_k: n(self.top_k),
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            logprobs: self.logprobs.map(n),
            logit_bias: (self.logit_bias.iter())
                .map(|&(token, bias)| ferrite_proto::v1::LogitBias { token, bias })
                .collect(),
            prompt_logprobs: self.prompt_logprobs.map(n),
        }
    }
}

impl From<pb::SamplingParams> for SamplingParams {
    fn from(p: pb::SamplingParams) -> Self {
        Self {
            max_tokens: p.max_tokens as usize,
            temperature: p.temperature,
            top_k: p.top_k as usize,
            top_p: p.top_p,
            min_p: p.min_p,
            seed: p.seed,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            stop_token_ids: p.stop_token_ids,
            ignore_eos: p.ignore_eos,
            logprobs: p.logprobs.map(|n| n as usize),
            logit_bias: p.logit_bias.iter().map(|b| (b.token, b.bias)).collect(),
            prompt_logprobs: p.prompt_logprobs.map(|n| n as usize),
            embed: None,
            lora: None,
        }
    }
}

/// A chosen token and, if asked, its logprob and the top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    /// Log-probability of `id` under the raw model distribution.
    pub logprob: f32,
    /// The `logprobs` most likely tokens with their logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// xoshiro256** seeded through SplitMix64: small, fast, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn seeded(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// Seeded from the process's random hasher keys and the clock: for unseeded requests.
    pub fn from_entropy() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.write_u128(nanos);
        Self::seeded(h.finish())
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Picks tokens for one request.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = params.seed.map_or_else(Rng::from_entropy, Rng::seeded);
        Self { params, rng }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (modified in place). `seen` is the request's tokens
    /// so far with their counts in the output ([`seen_tokens`], or a [`Seen`] kept from step
    /// to step), read only where penalties apply.
    ///
    /// A row with a NaN or an infinite logit (or none above -inf) has no distribution to draw
    /// from: that is the model's fault (broken weights, an overflow), reported as
    /// [`EngineError::BadLogits`] for this request alone, never a panic.
    pub fn sample(&mut self, logits: &mut [f32], seen: &[(u32, u32)]) -> Result<SampledToken> {
        let Self { params: p, rng } = self;
        let penalties = p.penalties();
        let seen = match penalties.any() {
            true => seen,
            false => &[],
        };
        let adjust = Adjustments {
            bias: &p.logit_bias,
            penalties: &penalties,
            seen,
        };
        sample_around(logits, &adjust, p.logprobs, |l| {
            match p.temperature == 0.0 {
                true => argmax(l),
                false => draw(l, p, rng),
            }
        })
    }
}

/// What moves a row's logits before the draw: the logit bias, then the penalties over the
/// tokens `seen` ([`seen_tokens`]).
struct Adjustments<'a> {
    bias: &'a [(u32, f32)],
    penalties: &'a Penalties,
    seen: &'a [(u32, u32)],
}

/// The steps around a draw from `logits` (modified in place), in the order of
/// [`Sampler::sample`]: a row with no distribution is refused; the `logprobs` most likely
/// tokens are taken from the row as it stands; the bias and the penalties are applied
/// (`adjust`); `draw` picks from the adjusted row; the pick's logprob is its logit's with the
/// adjustments undone. The ranks take the same steps for a row with [`DrawExtras`]
/// ([`greedy_with_extras`] on the CPU; on a GPU, `sampling.cu`'s `sample_extras_f32`).
fn sample_around(
    logits: &mut [f32],
    adjust: &Adjustments<'_>,
    logprobs: Option<usize>,
    draw: impl FnOnce(&[f32]) -> u32,
) -> Result<SampledToken> {
    let raw_lse = log_sum_exp(logits);
    if !raw_lse.is_finite() {
        return Err(EngineError::BadLogits(describe_bad_row(logits)));
    }
    let raw_top = logprobs.map(|n| top_by_logit(logits, n, raw_lse));
    adjust.apply(logits);
    let id = draw(logits);
    // The chosen token's logprob under the raw distribution (adjustments undone for it).
    let logprob = adjust.raw_logit(id, logits) - raw_lse;
    Ok(SampledToken {
        id,
        logprob,
        top: raw_top.unwrap_or_default(),
    })
}

/// The greedy pick a rank makes for a row with `x`'s extras, as a GPU's `sample_extras_f32`
/// makes it: `last` is the chunk's last token (counted where [`DrawExtras::last_is_output`]).
/// A row with no distribution draws `u32::MAX`, which the engine refuses as bad logits.
pub fn greedy_with_extras(
    row: &mut [f32],
    x: &DrawExtras,
    last: Option<u32>,
) -> (u32, Option<TokenLogprobs>) {
    let seen = match last.filter(|_| x.last_is_output && x.penalties.any()) {
        Some(t) => Cow::Owned(seen_with(&x.seen, t)),
        None => Cow::Borrowed(x.seen.as_slice()),
    };
    let logprobs = x.logprobs.map(|n| n as usize);
    let adjust = Adjustments {
        bias: &x.bias,
        penalties: &x.penalties,
        seen: &seen,
    };
    match sample_around(row, &adjust, logprobs, argmax) {
        Ok(t) => (
            t.id,
            x.logprobs.map(|_| TokenLogprobs {
                logprob: t.logprob,
                top: t.top,
            }),
        ),
        Err(_) => (u32::MAX, None),
    }
}

/// Each distinct token of `prompt` and `output` once, in the order first seen, with how often
/// `output` holds it (0: the prompt alone): what the penalties read.
pub fn seen_tokens(prompt: &[u32], output: &[u32]) -> Vec<(u32, u32)> {
    let mut seen = Seen::default();
    for (i, &t) in prompt.iter().chain(output).enumerate() {
        seen.add(t, i >= prompt.len());
    }
    seen.pairs
}

/// Tokens seen so far, as [`seen_tokens`] gives them, added one at a time.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pairs: Vec<(u32, u32)>,
    at: HashMap<u32, usize>,
}

impl Seen {
    /// One more `token`, of the output or the prompt.
    pub fn add(&mut self, token: u32, in_output: bool) {
        let slot = *self.at.entry(token).or_insert_with(|| {
            self.pairs.push((token, 0));
            self.pairs.len() - 1
        });
        self.pairs[slot].1 += u32::from(in_output);
    }

    pub fn pairs(&self) -> &[(u32, u32)] {
        &self.pairs
    }
}

/// `seen` with one more occurrence of `token` in the output.
fn seen_with(seen: &[(u32, u32)], token: u32) -> Vec<(u32, u32)> {
    let mut out = seen.to_vec();
    match out.iter_mut().find(|(t, _)| *t == token) {
        Some((_, c)) => *c += 1,
        None => out.push((token, 1)),
    }
    out
}

/// What is wrong with a row of logits whose log-sum-exp is not finite.
fn describe_bad_row(logits: &[f32]) -> String {
    let nan = logits.iter().filter(|l| l.is_nan()).count();
    let inf = logits.iter().filter(|l| **l == f32::INFINITY).count();
    format!(
        "the model's logits are not a distribution ({nan} NaN and {inf} infinite of {}): its \
         weights or its arithmetic are broken",
        logits.len()
    )
}

/// Draws from the temperature-scaled, top-k/top-p/min-p-truncated distribution.
///
/// The candidates are walked from the most likely down (ties: the smaller id first): the
/// top-k, top-p and min-p cuts are prefixes of that order, and the draw walks it until the
/// uniform number falls in a token's share. Only as much of the order as the walk reads is
/// sorted ([`Ranked`]): at temperature 1 nearly every token of a 128K vocabulary is a
/// candidate, and sorting them all cost 4 ms a row, most of a step on the CPU and, for rows
/// sampled on the host, many times a GPU step.
fn draw(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    let inv_t = 1.0 / p.temperature;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Tokens with probability below e^-40 of the best can never be drawn in f64 arithmetic
    // over a vocabulary of this size; dropping them first keeps the walk short.
    let floor = max - 40.0 * p.temperature;
    let cand: Vec<Candidate> = logits
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l >= floor)
        .map(|(i, &l)| {
            let s = (l - max) * inv_t;
            Candidate {
                id: i as u32,
                s,
                w: f64::from(s).exp(),
            }
        })
        .collect();
    let mut ranked = Ranked::new(cand);
    if p.top_k > 0 {
        ranked.truncate(p.top_k);
    }
    // The weights' sum in the candidates' own order: the walk needs no more of the order.
    let total: f64 = ranked.items.iter().map(|c| c.w).sum();
    let mut keep = ranked.items.len();
    if p.top_p < 1.0 {
        let (want, mut acc) = (f64::from(p.top_p), 0.0);
        keep = (0..keep)
            .find(|&i| {
                acc += ranked.get(i).w / total;
                acc >= want
            })
            .map_or(keep, |i| i + 1);
    }
    if p.min_p > 0.0 {
        // The best token's weight is exp(0) = 1: min-p keeps the weights ≥ min_p.
        let at_least = f64::from(p.min_p);
        let passing = (0..keep)
            .find(|&i| ranked.get(i).w < at_least)
            .unwrap_or(keep);
        keep = keep.min(passing.max(1));
    }
    let keep = keep.max(1);
    let kept_total: f64 = match keep == ranked.items.len() {
        true => total,
        false => (0..keep).map(|i| ranked.get(i).w).sum(),
    };
    let mut u = rng.next_f64() * kept_total;
    for i in 0..keep {
        let c = ranked.get(i);
        if u < c.w {
            return c.id;
        }
        u -= c.w;
    }
    ranked.get(keep - 1).id
}

/// A token that can be drawn: its id, its scaled logit `s` (≤ 0: the best is 0) and its
/// weight `w = exp(s)`, in proportion to its probability.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    s: f32,
    w: f64,
}

/// The draw's order: the larger scaled logit first, then the smaller id.
fn draw_order(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.s.total_cmp(&a.s).then(a.id.cmp(&b.id))
}

/// Candidates in the draw's order as far as it has been read: `items[..sorted]` are the
/// largest in order, the rest smaller, in any order. Reading past the sorted part puts the
/// next block of the largest in order (at least as many as are sorted already, so the whole
/// costs about one sort at worst).
struct Ranked {
    items: Vec<Candidate>,
    sorted: usize,
}

impl Ranked {
    fn new(items: Vec<Candidate>) -> Self {
        Self { items, sorted: 0 }
    }

    /// The `i`-th candidate in the draw's order (`i` < the number of candidates).
    fn get(&mut self, i: usize) -> Candidate {
        while i >= self.sorted && self.sorted < self.items.len() {
            let rest = &mut self.items[self.sorted..];
            let n = rest.len().min(self.sorted.max(64));
            if n < rest.len() {
                rest.select_nth_unstable_by(n - 1, draw_order);
            }
            rest[..n].sort_unstable_by(draw_order);
            self.sorted += n;
        }
        self.items[i]
    }

    /// Keeps the `k` first in the draw's order.
    fn truncate(&mut self, k: usize) {
        if k < self.items.len() {
            self.get(k - 1);
            self.items.truncate(k);
        }
    }
}

impl Adjustments<'_> {
    /// The bias, then the penalties: repetition on each token seen, then presence and
    /// frequency on those the output holds.
    fn apply(&self, logits: &mut [f32]) {
        for &(t, b) in self.bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        let p = self.penalties;
        let by_count = p.presence != 0.0 || p.frequency != 0.0;
        for &(t, c) in self.seen {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if p.repetition != 1.0 {
                *l = if *l > 0.0 {
                    *l / p.repetition
                } else {
                    *l * p.repetition
                };
            }
            if by_count && c > 0 {
                *l -= p.presence + p.frequency * c as f32;
            }
        }
    }

    /// The logit of `id` before the adjustments: each moves a token's logit by a known rule,
    /// undone for `id` in the reverse order.
    fn raw_logit(&self, id: u32, adjusted: &[f32]) -> f32 {
        let (p, mut l) = (self.penalties, adjusted[id as usize]);
        if let Some(&(_, count)) = self.seen.iter().find(|(t, _)| *t == id) {
            if count > 0 {
                l += p.presence + p.frequency * count as f32;
            }
            if p.repetition != 1.0 {
                l = if l > 0.0 {
                    l * p.repetition
                } else {
                    l / p.repetition
                };
            }
        }
        match self.bias.iter().find(|(t, _)| *t == id) {
            Some(&(_, b)) => l - b,
            None => l,
        }
    }
}

fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // f32 in 8 lanes (vectorizes); every term is ≤ 1, so the sum keeps ~7 significant digits.
    let mut lanes = [0f32; 8];
    let chunks = logits.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|&l| (l - max).exp()).sum();
    for c in chunks {
        for (acc, &l) in lanes.iter_mut().zip(c) {
            *acc += (l - max).exp();
        }
    }
    max + (lanes.iter().sum::<f32>() + tail).ln()
}

/// The `n` largest logits as (id, logprob), largest first; ties broken by the smaller id.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    top_by_logit(logits, n, log_sum_exp(logits))
}

/// How `target` scores under the raw distribution of `logits`: its logprob and the `n` most
/// likely tokens (a scored prompt's token). A row with no distribution gives NaN and none.
pub fn score_token(logits: &[f32], target: u32, n: usize) -> SampledToken {
    let lse = log_sum_exp(logits);
    let logit = logits.get(target as usize).copied().unwrap_or(f32::NAN);
    if !lse.is_finite() {
        return SampledToken {
            id: target,
            logprob: f32::NAN,
            top: Vec::new(),
        };
    }
    SampledToken {
        id: target,
        logprob: logit - lse,
        top: top_by_logit(logits, n, lse),
    }
}

/// Up to this many most likely tokens are kept in one pass over the row, each candidate
/// put in its place among them; past it, the row's ids are partly sorted.
const TOP_IN_ONE_PASS: usize = 32;

/// [`top_logprobs`] with the log-sum-exp of `logits` already known.
fn top_by_logit(logits: &[f32], n: usize, lse: f32) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    // Larger logit first (in `total_cmp`'s order: +0 above -0), ties to the smaller id.
    let cmp = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if n <= TOP_IN_ONE_PASS {
        return top_in_one_pass(logits, n, cmp)
            .into_iter()
            .map(|i| (i, logits[i as usize] - lse))
            .collect();
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(idx.len());
    if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, cmp);
        idx.truncate(n);
    }
    idx.sort_unstable_by(cmp);
    idx.into_iter()
        .map(|i| (i, logits[i as usize] - lse))
        .collect()
}

/// The `n` first ids of `logits` in `cmp`'s order, in one pass: each id that beats the last
/// kept takes its place and moves up. Ids come in increasing order, so an equal logit never
/// displaces an earlier id, as `cmp` wants.
fn top_in_one_pass(
    logits: &[f32],
    n: usize,
    cmp: impl Fn(&u32, &u32) -> std::cmp::Ordering,
) -> Vec<u32> {
    let mut kept: Vec<u32> = Vec::with_capacity(n + 1);
    for i in 0..logits.len() as u32 {
        if kept.len() == n {
            match kept.last() {
                Some(last) if cmp(&i, last).is_lt() => {
                    kept.pop();
                }
                _ => continue,
            }
        }
        let at = kept.partition_point(|k| cmp(k, &i).is_lt());
        kept.insert(at, i);
    }
    kept
}

/// The index of the largest logit (the first, on ties, as torch.argmax does).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The greedy pick of `logits`, or `None` where the row has no distribution (a NaN or an
/// infinite logit, or none above -inf), which [`Sampler::sample`] refuses too.
pub fn greedy_pick(logits: &[f32]) -> Option<u32> {
    log_sum_exp(logits).is_finite().then(|| argmax(logits))
}

/// `-log softmax(logits)[target]`, in f64: a token's score (perplexity sums it; tests compare
/// logprobs with it).
pub fn token_nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln() - logits[target as usize] as f64
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
