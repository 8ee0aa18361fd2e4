//! Launch wrappers for sampling on the GPU (`sampling.cu`): greedy argmax, and temperature /
//! top-k / top-p / min-p with a counter-based random stream, over f32 logits. The only host
//! sync a step needs is reading the sampled ids back.

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
        if vocab == 0 || vocab >= 1 << 24 {
            return Err(CudaError::Driver(format!(
                "sampling: vocab {vocab} outside 1..2^24"
            )));
        }
        let args = [
            out_ids.into(),
            logits.into(),
            i32_of("vocab", vocab)?,
            params.temperature.into(),
            params.top_k.into(),
            params.top_p.into(),
            params.min_p.into(),
            params.seeds.into(),
            params.steps.into(),
        ];
        let grid = (grid_of(n_seqs)?, 1, 1);
        unsafe { self.launch("sampling", "sample_f32", grid, 1024, 0, &args) }
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

fn grid_of(n_seqs: usize) -> Result<u32, CudaError> {
    match u32::try_from(n_seqs) {
        Ok(n) if n >= 1 && n <= i32::MAX as u32 => Ok(n),
        _ => Err(CudaError::Driver(format!("sampling: {n_seqs} sequences"))),
    }
}
