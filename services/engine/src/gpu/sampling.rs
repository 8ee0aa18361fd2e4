//! Sampling on the device after a step: the logits rows stay where the step wrote them, the
//! sampling kernel (or argmax, when every sequence is greedy) picks one id per row, and only
//! the ids come back — a few bytes per sequence instead of a vocabulary of f32 each (33 MB a
//! step at 64 sequences of a 128K vocabulary).
//!
//! The kernel draws by Gumbel-max from a counter-based stream keyed by (seed, step, token), so a
//! seeded request gives the same tokens on every run of the GPU path; they differ from the CPU
//! sampler's draws for the same seed (another generator), as they do between vLLM's devices.
//! Greedy picks are the CPU's: the first index of the largest logit.

use cudarc::driver::CudaSlice;
use ferrite_kernels::cuda::sample::SamplingArrays;

use super::{Buf, GpuRunner, alloc, gpu_error};
use crate::error::{EngineError, Result};
use crate::model::SeqChunk;

/// One sequence's sampling, as the kernel takes it (and as step plans carry it).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSampling {
    /// ≤ 0: greedy.
    pub temperature: f32,
    /// ≤ 0: off.
    pub top_k: i32,
    /// ≥ 1: off.
    pub top_p: f32,
    /// ≤ 0: off.
    pub min_p: f32,
    pub seed: u64,
    /// Which draw of the request this is (its tokens generated so far).
    pub step: u64,
}

/// The per-sequence parameter arrays and the sampled ids, `max_seqs` of each.
pub(super) struct SamplingBuffers {
    temperature: Buf<f32>,
    top_k: Buf<i32>,
    top_p: Buf<f32>,
    min_p: Buf<f32>,
    seeds: Buf<u64>,
    steps: Buf<u64>,
    ids: CudaSlice<i32>,
}

impl SamplingBuffers {
    pub(super) fn new(g: &ferrite_kernels::cuda::Gpu, max_seqs: usize) -> Result<Self> {
        Ok(Self {
            temperature: alloc(g, max_seqs)?,
            top_k: alloc(g, max_seqs)?,
            top_p: alloc(g, max_seqs)?,
            min_p: alloc(g, max_seqs)?,
            seeds: alloc(g, max_seqs)?,
            steps: alloc(g, max_seqs)?,
            ids: g.zeros::<i32>(max_seqs).map_err(gpu_error)?,
        })
    }
}

impl GpuRunner {
    /// Runs `seqs` and samples one token on the device for each that asked for logits
    /// (`params[i]` for the i-th of them, in order); reads back only the ids.
    pub fn forward_sampled(
        &mut self,
        seqs: &[SeqChunk<'_>],
        params: &[DeviceSampling],
        comm: &mut dyn ferrite_collective::Collective,
    ) -> Result<Vec<u32>> {
        self.watched(|r| r.sample_step(seqs, params, comm))
    }

    fn sample_step(
        &mut self,
        seqs: &[SeqChunk<'_>],
        params: &[DeviceSampling],
        comm: &mut dyn ferrite_collective::Collective,
    ) -> Result<Vec<u32>> {
        let n = self.run_step(seqs, comm)?;
        if params.len() != n {
            return Err(EngineError::Internal(format!(
                "{} sampling parameter sets for {n} rows of logits",
                params.len()
            )));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let g = self.w.gpu.clone();
        let vocab = self.w.cfg.vocab_size;
        let b = &mut self.sampling;
        let ids = g.ptr(&b.ids);
        if params.iter().all(|p| p.temperature <= 0.0) {
            // SAFETY: the step left `n` rows of `vocab` f32 logits; `ids` holds max_seqs ≥ n.
            #[allow(unsafe_code)]
            unsafe { g.argmax(ids, self.logits_ptr, n, vocab) }.map_err(gpu_error)?;
        } else {
            let stream = g.stream();
            let copy = |e: cudarc::driver::DriverError| EngineError::Device(e.to_string());
            let col = |f: fn(&DeviceSampling) -> f32| params.iter().map(f).collect::<Vec<_>>();
            stream
                .memcpy_htod(&col(|p| p.temperature), &mut b.temperature._buf)
                .map_err(copy)?;
            stream
                .memcpy_htod(&col(|p| p.top_p), &mut b.top_p._buf)
                .map_err(copy)?;
            stream
                .memcpy_htod(&col(|p| p.min_p), &mut b.min_p._buf)
                .map_err(copy)?;
            let top_k: Vec<i32> = params.iter().map(|p| p.top_k).collect();
            stream
                .memcpy_htod(&top_k, &mut b.top_k._buf)
                .map_err(copy)?;
            let seeds: Vec<u64> = params.iter().map(|p| p.seed).collect();
            stream
                .memcpy_htod(&seeds, &mut b.seeds._buf)
                .map_err(copy)?;
            let steps: Vec<u64> = params.iter().map(|p| p.step).collect();
            stream
                .memcpy_htod(&steps, &mut b.steps._buf)
                .map_err(copy)?;
            let arrays = SamplingArrays {
                temperature: b.temperature.ptr,
                top_k: b.top_k.ptr,
                top_p: b.top_p.ptr,
                min_p: b.min_p.ptr,
                seeds: b.seeds.ptr,
                steps: b.steps.ptr,
            };
            // SAFETY: as above; every parameter array holds max_seqs ≥ n elements, the first
            // n just written.
            #[allow(unsafe_code)]
            unsafe { g.sample(ids, self.logits_ptr, n, vocab, &arrays) }.map_err(gpu_error)?;
        }
        let ids = g.download(&self.sampling.ids, n).map_err(gpu_error)?;
        Ok(ids.into_iter().map(|i| i as u32).collect())
    }
}
