//! Launch wrappers for sampling on the GPU (`sampling.cu`): greedy argmax, and temperature /
//! top-k / top-p / min-p with a counter-based random stream, over f32 logits, and the same draws
//! with penalties and logprobs (`sample_extras_f32`). The only host sync a step needs is
//! reading the sampled ids (and logprobs) back.

use super::CudaError;
use super::gpu::{Arg, DevPtr, Gpu};
use super::ops::i32_of;

/// Per-sequence sampling parameters on the device, `n_seqs` of each.
#[derive(Debug, Clone, Copy)]
pub struct SamplingArrays {
    /// f32; ≤ 0 is greedy.
    pub temperature: DevPtr,
    /// i32; ≤ 0 is off.
    pub top_k: DevPtr,
    /// f32; ≥ 1 is off.
    pub top_p: DevPtr,
    /// f32; ≤ 0 is off.
    pub min_p: DevPtr,
    /// u64: the request's seed.
    pub seeds: DevPtr,
    /// u64: which draw of the request this is (a new one every step).
    pub steps: DevPtr,
}

/// The most top logprobs a draw gives (`sampling.cu`'s `MAX_LOGPROBS`).
pub const MAX_LOGPROBS: usize = 20;
/// u32 words of one row's logprobs out of [`Gpu::sample_extras`]: the drawn token's logprob,
/// then (id, logprob) for each top token.
pub const LP_WORDS: usize = 1 + 2 * MAX_LOGPROBS;
/// Bytes of one row's extras (`sampling.cu`'s `DrawExtra`): repetition, presence and frequency
/// penalties (f32), the first of its (token, output count) pairs and their number, the index
/// of a pending token in the step's input ids (-1: none), the top logprobs wanted (-1: none),
/// the first of its (token, f32 bias bits) pairs and their number, and 12 unused bytes.
pub const DRAW_EXTRA_BYTES: usize = 48;

/// Where [`Gpu::sample_extras`]' own arrays lie.
#[derive(Debug, Clone, Copy)]
pub struct ExtrasArrays {
    /// i32, `n_seqs`: each row's index among `extras`, -1 for a plain draw.
    pub extra_of_row: DevPtr,
    /// [`DRAW_EXTRA_BYTES`] each.
    pub extras: DevPtr,
    /// i32 (token, times in the output) pairs and (token, bias bits) pairs, each row's tokens
    /// distinct in each.
    pub seen: DevPtr,
    /// The step's input ids (i32), for the pending tokens.
    pub ids: DevPtr,
    /// [`LP_WORDS`] u32 per extra: the logprobs out.
    pub logprobs: DevPtr,
}

#[allow(unsafe_code)]
impl Gpu {
    /// One token id per row of `logits` (`[n_seqs, vocab]` f32) into `out_ids` (i32).
    ///
    /// # Safety
    /// `logits` holds `n_seqs * vocab` f32, `out_ids` and every array of `params` `n_seqs`
    /// elements.
    pub unsafe fn sample(
        &self,
        out_ids: DevPtr,
        logits: DevPtr,
        n_seqs: usize,
        vocab: usize,
        params: &SamplingArrays,
    ) -> Result<(), CudaError> {
        let args = draw_args(out_ids, logits, vocab, params)?;
        let grid = (grid_of(n_seqs)?, 1, 1);
        unsafe { self.launch("sampling", "sample_f32", grid, 1024, 0, &args) }
    }

    /// [`Self::sample`], with the CPU sampler's steps around the draw for the rows with extras
    /// (`extras`): no draw (id `i32::MAX`) from a row with no distribution; the logprobs of
    /// the row as it stands; the bias and the penalties, in place; the draw; the drawn
    /// token's logprob.
    ///
    /// # Safety
    /// As [`Self::sample`]; `extras`' arrays hold what their fields say, every index in them
    /// within its array, and `logprobs` [`LP_WORDS`] u32 per extra.
    pub unsafe fn sample_extras(
        &self,
        out_ids: DevPtr,
        logits: DevPtr,
        n_seqs: usize,
        vocab: usize,
        params: &SamplingArrays,
        extras: &ExtrasArrays,
    ) -> Result<(), CudaError> {
        let mut args = draw_args(out_ids, logits, vocab, params)?.to_vec();
        args.extend::<[Arg; 5]>([
            extras.extra_of_row.into(),
            extras.extras.into(),
            extras.seen.into(),
            extras.ids.into(),
            extras.logprobs.into(),
        ]);
        let grid = (grid_of(n_seqs)?, 1, 1);
        unsafe { self.launch("sampling", "sample_extras_f32", grid, 1024, 0, &args) }
    }

    /// Sets every logit of `n_seqs` rows of `logits` (`[n_seqs, vocab]` f32) that `mask` does
    /// not allow to -inf: a grammar's bitmask (`mask[r * words + i / 32]` bit `i % 32` allows
    /// token `i` of row `r`), applied before [`Self::sample`] or [`Self::argmax`] as the CPU
    /// sampler's `apply_mask` applies it.
    ///
    /// # Safety
    /// `logits` holds `n_seqs * vocab` f32, `mask` `n_seqs * words` u32.
    pub unsafe fn mask_logits(
        &self,
        logits: DevPtr,
        mask: DevPtr,
        n_seqs: usize,
        vocab: usize,
        words: usize,
    ) -> Result<(), CudaError> {
        if words < vocab.div_ceil(32) {
            return Err(CudaError::Driver(format!(
                "mask of {words} words for a vocabulary of {vocab}"
            )));
        }
        let args = [
            logits.into(),
            mask.into(),
            i32_of("vocab", vocab)?,
            i32_of("words", words)?,
            i32_of("rows", n_seqs)?,
        ];
        let grid = (grid_of(n_seqs)?, 1, 1);
        unsafe { self.launch("sampling", "mask_logits_f32", grid, 256, 0, &args) }
    }

    /// The first index of the largest logit of each row.
    ///
    /// # Safety
    /// `logits` holds `n_seqs * vocab` f32, `out_ids` `n_seqs` i32.
    pub unsafe fn argmax(
        &self,
        out_ids: DevPtr,
        logits: DevPtr,
        n_seqs: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        if vocab == 0 {
            return Err(CudaError::Driver("argmax over an empty vocabulary".into()));
        }
        let args: [Arg; 3] = [out_ids.into(), logits.into(), i32_of("vocab", vocab)?];
        let grid = (grid_of(n_seqs)?, 1, 1);
        unsafe { self.launch("sampling", "argmax_f32", grid, 1024, 0, &args) }
    }
}

/// The arguments `sample_f32` takes, and `sample_extras_f32` first. The vocabulary must be
/// under 2^24, where the kernels' counts are exact.
fn draw_args(
    out_ids: DevPtr,
    logits: DevPtr,
    vocab: usize,
    params: &SamplingArrays,
) -> Result<[Arg; 9], CudaError> {
    if vocab == 0 || vocab >= 1 << 24 {
        return Err(CudaError::Driver(format!(
            "sampling: vocab {vocab} outside 1..2^24"
        )));
    }
    Ok([
        out_ids.into(),
        logits.into(),
        i32_of("vocab", vocab)?,
        params.temperature.into(),
        params.top_k.into(),
        params.top_p.into(),
        params.min_p.into(),
        params.seeds.into(),
        params.steps.into(),
    ])
}

fn grid_of(n_seqs: usize) -> Result<u32, CudaError> {
    match u32::try_from(n_seqs) {
        Ok(n) if n >= 1 && n <= i32::MAX as u32 => Ok(n),
        _ => Err(CudaError::Driver(format!("sampling: {n_seqs} sequences"))),
    }
}
