//! Sampling on the device after a step: the logits rows stay where the step wrote them, the
//! sampling kernel (or argmax, when every sequence is greedy) picks one id per row, and only
//! the ids come back — a few bytes per sequence instead of a vocabulary of f32 each (33 MB a
//! step at 64 sequences of a 128K vocabulary).
//!
//! The kernel draws by Gumbel-max from a counter-based stream keyed by (seed, step, token), so a
//! seeded request gives the same tokens on every run of the GPU path; they differ from the CPU
//! sampler's draws for the same seed (another generator), as they do between vLLM's devices.
//! Greedy picks are the CPU's: the first index of the largest logit.
//!
//! A sequence under a grammar samples here too: its bitmask, computed on the host while the
//! forward runs ([`MaskSource`]), is uploaded once the forward is queued and applied to its row
//! (`mask_logits`) before the draw, as the CPU sampler applies it.

use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice, sys};
use ferrite_kernels::cuda::sample::SamplingArrays;
use ferrite_kernels::cuda::{DevPtr, QueuedUpload};
use ferrite_model::error::{ModelError, Result};
use ferrite_model::{Carried, DeviceSampling, MaskSource, SeqChunk};

use super::{Buf, DeviceBatch, GpuRunner, alloc, gpu_error};

/// The per-sequence parameter arrays (one block, [`packed`]), the grammar masks (`words`
/// u32 a row), the sampled ids and their copies on the host.
pub(super) struct SamplingBuffers {
    params: Buf<u8>,
    masks: Buf<u32>,
    /// Where the parameters and the masks are copied from: queued behind the forward without
    /// waiting for it, so a sampled step returns as soon as it is queued.
    staged_params: QueuedUpload<u8>,
    staged_masks: QueuedUpload<u32>,
    words: usize,
    /// The last sampled step's draws, which the next step may take as input ids
    /// ([`GpuRunner::carry`]) before any host has read them.
    ids: CudaSlice<i32>,
    /// Two, used in turn: under async scheduling a step is launched before the one before it
    /// is read back, and each needs its own room until then.
    rooms: [IdsRoom; 2],
    next_room: usize,
}

/// Page-locked room the ids of a step are copied to, and the event recorded behind the copy.
struct IdsRoom {
    host_ids: PinnedHostSlice<i32>,
    /// Waited for before the ids are read. The pinned slice's own event is not: cudarc
    /// records it only where the context tracks events, and `Gpu::open` turns that off (one
    /// stream), so `as_slice` would not wait.
    copied: CudaEvent,
}

impl IdsRoom {
    fn new(g: &ferrite_kernels::cuda::Gpu, max_seqs: usize) -> Result<Self> {
        let device = |e: cudarc::driver::DriverError| ModelError::Device(e.to_string());
        Ok(Self {
            // Cached (not write-combined) memory: the host reads it.
            // SAFETY: the buffer is only written by the copies `sample_step` queues and read
            // after the event recorded behind them.
            #[allow(unsafe_code)]
            host_ids: unsafe {
                g.context()
                    .alloc_pinned_with_flags::<i32>(max_seqs.max(1), 0)
            }
            .map_err(device)?,
            copied: g
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(device)?,
        })
    }
}

impl Drop for IdsRoom {
    fn drop(&mut self) {
        // A copy of the ids may still be writing `host_ids`: let it land before the slice
        // frees it. An error has nowhere to go here.
        let _ = self.copied.synchronize();
    }
}

impl SamplingBuffers {
    pub(super) fn new(
        g: &ferrite_kernels::cuda::Gpu,
        max_seqs: usize,
        vocab: usize,
    ) -> Result<Self> {
        let words = vocab.div_ceil(32);
        Ok(Self {
            params: alloc(g, max_seqs * PACKED_BYTES)?,
            masks: alloc(g, max_seqs * words)?,
            staged_params: QueuedUpload::new(g, max_seqs * PACKED_BYTES).map_err(gpu_error)?,
            staged_masks: QueuedUpload::new(g, max_seqs * words).map_err(gpu_error)?,
            words,
            ids: g.zeros::<i32>(max_seqs).map_err(gpu_error)?,
            rooms: [IdsRoom::new(g, max_seqs)?, IdsRoom::new(g, max_seqs)?],
            next_room: 0,
        })
    }
}

/// A sampled step queued: how many ids it draws, and the room they come back to.
#[derive(Debug, Clone, Copy)]
pub struct Drawn {
    pub rows: usize,
    room: usize,
}

/// Bytes of one sequence's parameters: two u64, three f32, one i32.
const PACKED_BYTES: usize = 2 * 8 + 4 * 4;

/// The kernel's six parameter arrays for `params`, one after the other in one block, so a
/// step copies them to the device at once (six small copies from pageable memory, each a
/// synchronous round trip, were a fixed cost of every sampled step). The u64 arrays come
/// first, so every array stays aligned. Returns the block and where each array lies once the
/// block is copied to `base`.
fn packed(params: &[DeviceSampling], base: DevPtr) -> (Vec<u8>, SamplingArrays) {
    let n = params.len();
    let mut b = Vec::with_capacity(n * PACKED_BYTES);
    let at = |b: &Vec<u8>| base.offset::<u8>(b.len());
    let seeds = at(&b);
    b.extend(params.iter().flat_map(|p| p.seed.to_le_bytes()));
    let steps = at(&b);
    b.extend(params.iter().flat_map(|p| p.step.to_le_bytes()));
    let temperature = at(&b);
    b.extend(params.iter().flat_map(|p| p.temperature.to_le_bytes()));
    let top_p = at(&b);
    b.extend(params.iter().flat_map(|p| p.top_p.to_le_bytes()));
    let min_p = at(&b);
    b.extend(params.iter().flat_map(|p| p.min_p.to_le_bytes()));
    let top_k = at(&b);
    b.extend(params.iter().flat_map(|p| p.top_k.to_le_bytes()));
    let arrays = SamplingArrays {
        temperature,
        top_k,
        top_p,
        min_p,
        seeds,
        steps,
    };
    (b, arrays)
}

impl GpuRunner {
    /// Queues the step for `seqs` (replaying the decode graph `graph` names, as
    /// [`GpuRunner::forward_planned`]), a draw of one token on the device for each that asked
    /// for logits (`params[i]` for the i-th of them, in order) under the grammar masks `masks`
    /// gives (once the forward is queued), and the copy of the ids to the host; returns
    /// without waiting for them, so the host can plan the next step meanwhile. `carried`:
    /// tokens of `seqs` the last sampled step drew ([`Self::carry`]).
    /// [`Self::finish_ids`] reads the ids; one more step may be queued before it.
    pub fn launch_sampled(
        &mut self,
        seqs: &[SeqChunk<'_>],
        params: &[DeviceSampling],
        graph: Option<usize>,
        carried: &[Carried],
        comm: &mut dyn ferrite_collective::Collective,
        masks: Option<MaskSource<'_>>,
    ) -> Result<Drawn> {
        self.watched_launch(|r| r.sample_step(seqs, params, graph, carried, comm, masks))
    }

    /// Waits for the step [`Self::launch_sampled`] queued as `drawn` and reads its ids.
    pub fn finish_ids(&mut self, drawn: Drawn) -> Result<Vec<u32>> {
        let room = &self.sampling.rooms[drawn.room];
        let ids = match room
            .copied
            .synchronize()
            .and_then(|()| room.host_ids.as_slice())
        {
            Ok(ids) => Ok(ids[..drawn.rows].iter().map(|&i| i as u32).collect()),
            Err(e) => Err(ModelError::Device(e.to_string())),
        };
        self.watch_end(ids)
    }

    fn sample_step(
        &mut self,
        seqs: &[SeqChunk<'_>],
        params: &[DeviceSampling],
        graph: Option<usize>,
        carried: &[Carried],
        comm: &mut dyn ferrite_collective::Collective,
        masks: Option<MaskSource<'_>>,
    ) -> Result<Drawn> {
        let n = self.run_step(seqs, graph, carried, comm)?;
        if params.len() != n {
            return Err(ModelError::Internal(format!(
                "{} sampling parameter sets for {n} rows of logits",
                params.len()
            )));
        }
        let room = self.sampling.next_room;
        if n == 0 {
            return Ok(Drawn { rows: 0, room });
        }
        let g = self.w.gpu.clone();
        let vocab = self.w.cfg.vocab_size;
        if let Some(source) = masks {
            self.apply_masks(&g, source(), n)?;
        }
        let b = &mut self.sampling;
        let ids = g.ptr(&b.ids);
        if params.iter().all(|p| p.temperature <= 0.0) {
            // SAFETY: the step left `n` rows of `vocab` f32 logits; `ids` holds max_seqs ≥ n.
            #[allow(unsafe_code)]
            unsafe { g.argmax(ids, self.logits_ptr, n, vocab) }.map_err(gpu_error)?;
        } else {
            let (block, arrays) = packed(params, b.params.ptr);
            // SAFETY: the block holds n ≤ max_seqs sequences' parameters, PACKED_BYTES each:
            // within the buffer.
            #[allow(unsafe_code)]
            unsafe { b.staged_params.queue(&g, b.params.ptr, &block) }.map_err(gpu_error)?;
            // SAFETY: as above; every parameter array holds the n elements just written.
            #[allow(unsafe_code)]
            unsafe { g.sample(ids, self.logits_ptr, n, vocab, &arrays) }.map_err(gpu_error)?;
        }
        let b = &mut self.sampling;
        b.next_room = 1 - room;
        let r = &mut b.rooms[room];
        // Into page-locked memory, so the copy is queued like a kernel and the host need not
        // wait for it here (a copy to pageable memory returns only once it is done). The whole
        // buffer: the copy's length is the host side's, and both hold max_seqs ids.
        g.stream()
            .memcpy_dtoh(&b.ids, &mut r.host_ids)
            .and_then(|()| r.copied.record(g.stream()))
            .map_err(|e| ModelError::Device(e.to_string()))?;
        Ok(Drawn { rows: n, room })
    }

    /// The logits of the sampling rows `rows` of the step [`Self::finish_ids`] read (rows
    /// sampled on the host beside the device's draws), each a row of the vocabulary. Only
    /// that step may have been queued: the next one's head would overwrite them (a step
    /// with such rows is never chained, see the engine's overlap module).
    pub fn logits_rows(&self, rows: &[u32]) -> Result<Vec<(u32, Vec<f32>)>> {
        let (g, vocab) = (&self.w.gpu, self.w.cfg.vocab_size);
        let max_seqs = self.limits.max_seqs;
        (rows.iter())
            .map(|&r| {
                if r as usize >= max_seqs {
                    return Err(ModelError::Internal(format!(
                        "logits row {r} of a step of at most {max_seqs}"
                    )));
                }
                let mut row = vec![0f32; vocab];
                let at = self.logits_ptr.offset::<f32>(r as usize * vocab);
                // SAFETY: `logits` holds max_seqs rows of `vocab` f32; `r` < max_seqs.
                #[allow(unsafe_code)]
                unsafe { g.download_at(at, &mut row) }.map_err(gpu_error)?;
                Ok((r, row))
            })
            .collect()
    }

    /// Appends to `plan`'s metadata the pairs (input id's index, draw's row) of `carried`;
    /// returns where they start and how many there are.
    pub(super) fn add_carried(
        &self,
        plan: &mut DeviceBatch,
        carried: &[Carried],
    ) -> Result<(usize, usize)> {
        let at = plan.meta.len();
        for c in carried {
            let chunk = c.chunk as usize;
            let token = (chunk < plan.n_seqs)
                .then(|| plan.meta[plan.off.starts + chunk] + c.index as i32)
                .filter(|&t| t < plan.meta[plan.off.starts + chunk + 1]);
            let Some(token) = token.filter(|_| (c.row as usize) < self.limits.max_seqs) else {
                return Err(ModelError::Internal(format!(
                    "a carried draw ({c:?}) outside a step of {} sequences",
                    plan.n_seqs
                )));
            };
            plan.meta.extend([token, c.row as i32]);
        }
        Ok((at, carried.len()))
    }

    /// Puts the draws the pairs at `(at, n)` of the metadata name in the step's input ids
    /// (queued after the metadata's copy, before the forward that reads them).
    pub(super) fn carry(&self, plan: &DeviceBatch, (at, n): (usize, usize)) -> Result<()> {
        let g = &self.w.gpu;
        let meta = self.meta_ptr;
        // SAFETY: the metadata copied holds the ids at `off.ids` and the pairs at `at`, whose
        // indices `add_carried` checked against the step's tokens and the draws' buffer.
        #[allow(unsafe_code)]
        unsafe {
            g.carry_ids(
                meta.offset::<i32>(plan.off.ids),
                g.ptr(&self.sampling.ids),
                meta.offset::<i32>(at),
                n,
                self.w.cfg.vocab_size,
            )
        }
        .map_err(gpu_error)
    }

    /// Uploads `rows` (one per sampling row: a bitmask, or `None` for all tokens) and masks the
    /// step's logits with them; nothing when no row has a grammar.
    fn apply_masks(
        &mut self,
        g: &ferrite_kernels::cuda::Gpu,
        rows: Vec<Option<Vec<u32>>>,
        n: usize,
    ) -> Result<()> {
        if rows.iter().all(Option::is_none) {
            return Ok(());
        }
        let words = self.sampling.words;
        if rows.len() != n || rows.iter().flatten().any(|m| m.len() != words) {
            return Err(ModelError::Internal(format!(
                "{} grammar masks for {n} sampling rows of {words} words",
                rows.len()
            )));
        }
        let mut flat = vec![u32::MAX; n * words];
        for (dst, row) in flat.chunks_exact_mut(words).zip(&rows) {
            if let Some(m) = row {
                dst.copy_from_slice(m);
            }
        }
        let (mask, vocab) = (self.sampling.masks.ptr, self.w.cfg.vocab_size);
        // SAFETY: `flat` is n ≤ max_seqs rows of `words`: within the mask buffer; the step
        // left `n` rows of `vocab` f32 logits.
        #[allow(unsafe_code)]
        unsafe {
            self.sampling
                .staged_masks
                .queue(g, mask, &flat)
                .map_err(gpu_error)?;
            g.mask_logits(self.logits_ptr, mask, n, vocab, words)
                .map_err(gpu_error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each array lies where its pointer says, from the block's base, aligned for its type,
    /// and the block holds nothing else.
    #[test]
    fn the_packed_block_holds_each_array_at_its_offset() {
        let params: Vec<DeviceSampling> = (0..3)
            .map(|i| DeviceSampling {
                temperature: 0.5 + i as f32,
                top_k: 10 + i,
                top_p: 0.9 - i as f32 / 10.0,
                min_p: 0.05 * i as f32,
                seed: 1 << (40 + i),
                step: 7 + i as u64,
            })
            .collect();
        let base = DevPtr(4096);
        let (block, at) = packed(&params, base);
        assert_eq!(block.len(), params.len() * PACKED_BYTES);
        let word = |ptr: DevPtr, i: usize, size: usize| {
            let address = ptr.0 as usize + i * size;
            assert_eq!(address % size, 0, "aligned");
            let start = address - base.0 as usize;
            &block[start..start + size]
        };
        for (i, p) in params.iter().enumerate() {
            assert_eq!(word(at.seeds, i, 8), p.seed.to_le_bytes());
            assert_eq!(word(at.steps, i, 8), p.step.to_le_bytes());
            assert_eq!(word(at.temperature, i, 4), p.temperature.to_le_bytes());
            assert_eq!(word(at.top_p, i, 4), p.top_p.to_le_bytes());
            assert_eq!(word(at.min_p, i, 4), p.min_p.to_le_bytes());
            assert_eq!(word(at.top_k, i, 4), p.top_k.to_le_bytes());
        }
    }
}
