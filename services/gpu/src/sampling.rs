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
//! A request with penalties or logprobs draws here too ([`DrawExtras`]): the kernel takes the
//! CPU sampler's steps around the draw (the logprobs of the row as it stands, the penalties
//! over the tokens so far, the drawn token's logprob), and only the logprobs asked for come
//! back with the ids. The tokens so far come from the host, all but the sequence's newest
//! when that one is a draw (the kernel reads it from the step's input ids): a chained step
//! can then penalize its draw before any host has read it.
//!
//! A sequence under a grammar samples here too: its bitmask, computed on the host while the
//! forward runs ([`MaskSource`]), is uploaded once the forward is queued and applied to its row
//! (`mask_logits`) before the draw, as the CPU sampler applies it.

use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice, sys};
use ferrite_kernels::cuda::sample::{ExtrasArrays, LP_WORDS, MAX_LOGPROBS, SamplingArrays};
use ferrite_kernels::cuda::{DevPtr, QueuedUpload};
use ferrite_model::error::{ModelError, Result};
use ferrite_model::{
    Carried, DeviceSampling, DrawExtras, Draws, MaskSource, SeqChunk, TokenLogprobs,
};

use super::{Buf, DeviceBatch, GpuRunner, alloc, gpu_error, logits_tokens};

/// A step's draws: each sampling row's parameters, and the extras of the rows that have them.
#[derive(Debug, Clone, Copy)]
pub struct StepDraws<'a> {
    pub params: &'a [DeviceSampling],
    pub extras: &'a [DrawExtras],
}

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
    /// `sample_extras_f32`'s own arrays ([`packed_extras`]), grown when a step needs more.
    extras: Buf<i32>,
    staged_extras: QueuedUpload<i32>,
    extras_room: usize,
    /// [`LP_WORDS`] per row with extras: the logprobs they give.
    logprobs: CudaSlice<u32>,
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
    /// The logprobs of the rows with extras, copied behind the ids where a row asked for them.
    host_logprobs: PinnedHostSlice<u32>,
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
            // SAFETY: as `host_ids`.
            #[allow(unsafe_code)]
            host_logprobs: unsafe {
                g.context()
                    .alloc_pinned_with_flags::<u32>(max_seqs.max(1) * LP_WORDS, 0)
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
            extras: alloc(g, EXTRAS_ROOM)?,
            staged_extras: QueuedUpload::new(g, EXTRAS_ROOM).map_err(gpu_error)?,
            extras_room: EXTRAS_ROOM,
            logprobs: g.zeros::<u32>(max_seqs * LP_WORDS).map_err(gpu_error)?,
            ids: g.zeros::<i32>(max_seqs).map_err(gpu_error)?,
            rooms: [IdsRoom::new(g, max_seqs)?, IdsRoom::new(g, max_seqs)?],
            next_room: 0,
        })
    }
}

/// A sampled step queued: how many ids it draws, the room they come back to, and the rows
/// whose logprobs come back with them.
#[derive(Debug, Clone)]
pub struct Drawn {
    pub rows: usize,
    room: usize,
    logprobs: Vec<LogprobsAt>,
}

/// Where a row's logprobs come back: its sampling row, its place among the extras (of
/// [`LP_WORDS`] each), and how many top tokens it has.
#[derive(Debug, Clone, Copy)]
struct LogprobsAt {
    row: u32,
    extra: usize,
    top: usize,
}

/// Words of room for the extras to start with (pairs of a few thousand tokens a row for a
/// batch of dozens); a step that needs more grows it.
const EXTRAS_ROOM: usize = 1 << 18;

/// Words of a row's record in [`packed_extras`] (`sampling.cu`'s `DrawExtra`).
const RECORD_WORDS: usize = ferrite_kernels::cuda::sample::DRAW_EXTRA_BYTES / 4;

/// `sample_extras_f32`'s arrays in one block of i32 words, so a step copies them at once: each
/// of the `rows` sampling rows' index among `extras` (-1: none), then each extra's record
/// (`DrawExtra`), then their (token, output count) pairs and (token, bias bits) pairs.
/// `tokens[r]`: the index among the step's input ids of row r's last token (where its
/// `last_is_output` token is read). Returns the block and where the records and the pairs
/// start (in words).
fn packed_extras(
    extras: &[DrawExtras],
    rows: usize,
    tokens: &[i32],
) -> Result<(Vec<i32>, usize, usize)> {
    let records = rows;
    let pairs = records + extras.len() * RECORD_WORDS;
    let n_pairs: usize = extras.iter().map(|x| x.seen.len() + x.bias.len()).sum();
    let mut b = vec![-1i32; pairs];
    b.reserve(2 * n_pairs);
    let word = |n: usize| i32::try_from(n).map_err(|_| internal(format!("{n} words of extras")));
    for (e, x) in extras.iter().enumerate() {
        let row = x.row as usize;
        let token = tokens
            .get(row)
            .copied()
            .filter(|_| row < rows && b[row] == -1);
        let Some(token) = token else {
            return Err(internal(format!(
                "extras for row {row} of {rows} (or twice for one row)"
            )));
        };
        b[row] = word(e)?;
        let top = x.logprobs.map_or(-1, |n| n.min(MAX_LOGPROBS as u32) as i32);
        let (at, first) = (records + e * RECORD_WORDS, (b.len() - pairs) / 2);
        let first_bias = first + x.seen.len();
        b[at..at + RECORD_WORDS].copy_from_slice(&[
            x.penalties.repetition.to_bits() as i32,
            x.penalties.presence.to_bits() as i32,
            x.penalties.frequency.to_bits() as i32,
            word(first)?,
            word(x.seen.len())?,
            if x.last_is_output { token } else { -1 },
            top,
            word(first_bias)?,
            word(x.bias.len())?,
            0,
            0,
            0,
        ]);
        // A token past i32 is outside every vocabulary, which the kernel skips.
        let id = |t: u32| i32::try_from(t).unwrap_or(-1);
        let count = |c: u32| i32::try_from(c).unwrap_or(i32::MAX);
        b.extend((x.seen.iter()).flat_map(|&(t, c)| [id(t), count(c)]));
        b.extend((x.bias.iter()).flat_map(|&(t, v)| [id(t), v.to_bits() as i32]));
    }
    Ok((b, records, pairs))
}

fn internal(what: String) -> ModelError {
    ModelError::Internal(what)
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

/// The logprobs of the rows `at` names, from the words a step copied back (`ids`: its draws;
/// a row that drew nothing, out of the vocabulary, has none).
fn logprobs_of(at: &[LogprobsAt], words: &[u32], ids: &[u32]) -> Vec<(u32, TokenLogprobs)> {
    (at.iter())
        .filter(|a| {
            ids.get(a.row as usize)
                .is_some_and(|&id| id < i32::MAX as u32)
        })
        .filter_map(|a| {
            let w = words.get(a.extra * LP_WORDS..(a.extra + 1) * LP_WORDS)?;
            let top = (0..a.top)
                .map(|j| (w[1 + 2 * j], f32::from_bits(w[2 + 2 * j])))
                .collect();
            let logprob = f32::from_bits(w[0]);
            Some((a.row, TokenLogprobs { logprob, top }))
        })
        .collect()
}

impl GpuRunner {
    /// Queues the step for `seqs` (replaying the decode graph `graph` names, as
    /// [`GpuRunner::forward_planned`]), a draw of one token on the device for each that asked
    /// for logits (`draws.params[i]` for the i-th of them, in order, with its extras where
    /// `draws.extras` has them) under the grammar masks `masks` gives (once the forward is
    /// queued), and the copy of the ids (and logprobs) to the host; returns without waiting
    /// for them, so the host can plan the next step meanwhile. `carried`: tokens of `seqs` the
    /// last sampled step drew ([`Self::carry`]).
    /// [`Self::finish_ids`] reads the ids; one more step may be queued before it.
    pub fn launch_sampled(
        &mut self,
        seqs: &[SeqChunk<'_>],
        draws: StepDraws<'_>,
        graph: Option<usize>,
        carried: &[Carried],
        comm: &mut dyn ferrite_collective::Collective,
        masks: Option<MaskSource<'_>>,
    ) -> Result<Drawn> {
        self.watched_launch(|r| r.sample_step(seqs, draws, graph, carried, comm, masks))
    }

    /// Waits for the step [`Self::launch_sampled`] queued as `drawn` and reads its draws.
    pub fn finish_ids(&mut self, drawn: Drawn) -> Result<Draws> {
        let room = &self.sampling.rooms[drawn.room];
        let read = room.copied.synchronize().and_then(|()| {
            let ids: Vec<u32> = (room.host_ids.as_slice()?[..drawn.rows].iter())
                .map(|&i| i as u32)
                .collect();
            let words = match drawn.logprobs.is_empty() {
                true => &[][..],
                false => room.host_logprobs.as_slice()?,
            };
            let logprobs = logprobs_of(&drawn.logprobs, words, &ids);
            Ok(Draws { ids, logprobs })
        });
        let draws = read.map_err(|e| ModelError::Device(e.to_string()));
        self.watch_end(draws)
    }

    fn sample_step(
        &mut self,
        seqs: &[SeqChunk<'_>],
        draws: StepDraws<'_>,
        graph: Option<usize>,
        carried: &[Carried],
        comm: &mut dyn ferrite_collective::Collective,
        masks: Option<MaskSource<'_>>,
    ) -> Result<Drawn> {
        let params = draws.params;
        let n = self.run_step(seqs, graph, carried, comm)?;
        if params.len() != n {
            return Err(ModelError::Internal(format!(
                "{} sampling parameter sets for {n} rows of logits",
                params.len()
            )));
        }
        let room = self.sampling.next_room;
        if n == 0 {
            return Ok(Drawn {
                rows: 0,
                room,
                logprobs: Vec::new(),
            });
        }
        let g = self.w.gpu.clone();
        let vocab = self.w.cfg.vocab_size;
        if let Some(source) = masks {
            self.apply_masks(&g, source(), n)?;
        }
        let mut logprobs = Vec::new();
        let ids = g.ptr(&self.sampling.ids);
        if !draws.extras.is_empty() {
            logprobs = self.sample_extras(&g, seqs, draws, n)?;
        } else if params.iter().all(|p| p.temperature <= 0.0) {
            // SAFETY: the step left `n` rows of `vocab` f32 logits; `ids` holds max_seqs ≥ n.
            #[allow(unsafe_code)]
            unsafe { g.argmax(ids, self.logits_ptr, n, vocab) }.map_err(gpu_error)?;
        } else {
            let arrays = self.queue_params(&g, params)?;
            // SAFETY: every parameter array holds the n elements just queued; `ids` holds
            // max_seqs ≥ n.
            #[allow(unsafe_code)]
            unsafe { g.sample(ids, self.logits_ptr, n, vocab, &arrays) }.map_err(gpu_error)?;
        }
        let b = &mut self.sampling;
        b.next_room = 1 - room;
        let r = &mut b.rooms[room];
        // Into page-locked memory, so the copy is queued like a kernel and the host need not
        // wait for it here (a copy to pageable memory returns only once it is done). The whole
        // buffer: the copy's length is the host side's, and both hold max_seqs ids.
        let stream = g.stream();
        stream
            .memcpy_dtoh(&b.ids, &mut r.host_ids)
            .and_then(|()| match logprobs.is_empty() {
                true => Ok(()),
                false => stream.memcpy_dtoh(&b.logprobs, &mut r.host_logprobs),
            })
            .and_then(|()| r.copied.record(stream))
            .map_err(|e| ModelError::Device(e.to_string()))?;
        Ok(Drawn {
            rows: n,
            room,
            logprobs,
        })
    }

    /// Queues `sample_extras_f32` for the `n` rows of the step: `draws` with their extras
    /// (`seqs`: the step's chunks, whose last tokens the extras may count). Returns where
    /// the logprobs asked for will lie.
    fn sample_extras(
        &mut self,
        g: &ferrite_kernels::cuda::Gpu,
        seqs: &[SeqChunk<'_>],
        draws: StepDraws<'_>,
        n: usize,
    ) -> Result<Vec<LogprobsAt>> {
        let vocab = self.w.cfg.vocab_size;
        let (block, records, pairs) = packed_extras(draws.extras, n, &logits_tokens(seqs))?;
        self.extras_room_for(g, block.len())?;
        let input_ids = self.meta_ptr.offset::<i32>(self.offsets().ids);
        let arrays = self.queue_params(g, draws.params)?;
        let b = &mut self.sampling;
        let base = b.extras.ptr;
        let at = ExtrasArrays {
            extra_of_row: base,
            extras: base.offset::<i32>(records),
            seen: base.offset::<i32>(pairs),
            ids: input_ids,
            logprobs: g.ptr(&b.logprobs),
        };
        // SAFETY: the block fits its buffer (grown to fit above), and `packed_extras` checked
        // every row and record index; the parameters are queued; the input ids are the step's
        // metadata, copied before the forward.
        #[allow(unsafe_code)]
        unsafe {
            b.staged_extras.queue(g, base, &block).map_err(gpu_error)?;
            g.sample_extras(g.ptr(&b.ids), self.logits_ptr, n, vocab, &arrays, &at)
                .map_err(gpu_error)?;
        }
        let top = |x: &DrawExtras| {
            x.logprobs
                .map(|t| (t as usize).min(MAX_LOGPROBS).min(vocab))
        };
        Ok((draws.extras.iter().enumerate())
            .filter_map(|(extra, x)| {
                Some(LogprobsAt {
                    row: x.row,
                    extra,
                    top: top(x)?,
                })
            })
            .collect())
    }

    /// Queues the copy of the draws' parameters `params` (one per row, at most max_seqs) and
    /// returns where each array lies once copied.
    fn queue_params(
        &mut self,
        g: &ferrite_kernels::cuda::Gpu,
        params: &[DeviceSampling],
    ) -> Result<SamplingArrays> {
        if params.len() > self.limits.max_seqs {
            return Err(ModelError::Internal(format!(
                "{} sampling parameter sets for room for {}",
                params.len(),
                self.limits.max_seqs
            )));
        }
        let b = &mut self.sampling;
        let (block, arrays) = packed(params, b.params.ptr);
        // SAFETY: the block holds at most max_seqs sequences' parameters, PACKED_BYTES each:
        // within the buffer.
        #[allow(unsafe_code)]
        unsafe { b.staged_params.queue(g, b.params.ptr, &block) }.map_err(gpu_error)?;
        Ok(arrays)
    }

    /// Room for `words` of extras, grown (after the work in flight, which may read the
    /// old room) where it has less.
    fn extras_room_for(&mut self, g: &ferrite_kernels::cuda::Gpu, words: usize) -> Result<()> {
        let b = &mut self.sampling;
        if words <= b.extras_room {
            return Ok(());
        }
        g.stream()
            .synchronize()
            .map_err(|e| ModelError::Device(e.to_string()))?;
        let room = words.next_power_of_two();
        b.extras = alloc(g, room)?;
        b.staged_extras = QueuedUpload::new(g, room).map_err(gpu_error)?;
        b.extras_room = room;
        Ok(())
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

    fn extra(
        row: u32,
        seen: Vec<(u32, u32)>,
        last_is_output: bool,
        logprobs: Option<u32>,
    ) -> DrawExtras {
        DrawExtras {
            row,
            penalties: ferrite_model::Penalties {
                repetition: 1.5,
                presence: 0.25,
                frequency: row as f32,
            },
            seen,
            last_is_output,
            logprobs,
            bias: match row {
                0 => vec![(8, -100.0), (2, 0.5)],
                _ => Vec::new(),
            },
        }
    }

    /// Each row names its record or -1; each record holds its penalties' bits, where its
    /// pairs start and how many, the input index of its last token where that one is a draw,
    /// its top count (at most the kernel's), and where its biases start and how many; the
    /// pairs follow, row after row, each row's biases after its tokens seen.
    #[test]
    fn the_extras_block_holds_each_rows_record_and_pairs() {
        let extras = [
            extra(2, vec![(7, 0), (9, 2)], true, Some(3)),
            extra(0, vec![(4, 1)], false, None),
            extra(3, vec![], false, Some(99)),
        ];
        let tokens = [4, 9, 15, 16];
        let (b, records, pairs) = packed_extras(&extras, 4, &tokens).expect("packed");
        assert_eq!((records, pairs), (4, 4 + 3 * RECORD_WORDS));
        assert_eq!(b[..4], [1, -1, 0, 2]);
        let record = |e: usize| &b[records + e * RECORD_WORDS..records + (e + 1) * RECORD_WORDS];
        let bits = |f: f32| f.to_bits() as i32;
        // Row 2's record: penalties, pairs 0..2, its last token at input 15, 3 top, no bias.
        let want = [bits(1.5), bits(0.25), bits(2.0), 0, 2, 15, 3, 2, 0, 0, 0, 0];
        assert_eq!(record(0), want);
        // Row 0's: pair 2, no pending token, no logprobs, two biases from pair 3.
        let want = [
            bits(1.5),
            bits(0.25),
            bits(0.0),
            2,
            1,
            -1,
            -1,
            3,
            2,
            0,
            0,
            0,
        ];
        assert_eq!(record(1), want);
        assert_eq!(record(2)[3..9], [5, 0, -1, MAX_LOGPROBS as i32, 5, 0]);
        let bias = [8, bits(-100.0), 2, bits(0.5)];
        assert_eq!(b[pairs..], [&[7, 0, 9, 2][..], &[4, 1], &bias].concat());
        // A row twice, or past the step's rows, is refused.
        let twice = [extras[0].clone(), extras[0].clone()];
        assert!(packed_extras(&twice, 4, &tokens).is_err());
        assert!(packed_extras(&extras, 3, &tokens[..3]).is_err());
    }

    /// The logprobs come back by row, with as many top tokens as each asked for; a row that
    /// drew nothing has none.
    #[test]
    fn the_logprobs_words_are_read_by_row() {
        let mut words = vec![0u32; 2 * LP_WORDS];
        words[0] = (-0.5f32).to_bits();
        words[1..5].copy_from_slice(&[11, (-0.25f32).to_bits(), 12, (-2.0f32).to_bits()]);
        words[LP_WORDS] = (-1.0f32).to_bits();
        let at = [
            LogprobsAt {
                row: 1,
                extra: 0,
                top: 2,
            },
            LogprobsAt {
                row: 0,
                extra: 1,
                top: 0,
            },
        ];
        let got = logprobs_of(&at, &words, &[5, 6]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 1);
        assert_eq!(got[0].1.logprob, -0.5);
        assert_eq!(got[0].1.top, [(11, -0.25), (12, -2.0)]);
        assert_eq!(
            (got[1].0, got[1].1.logprob, got[1].1.top.len()),
            (0, -1.0, 0)
        );
        assert!(logprobs_of(&at, &words, &[5, i32::MAX as u32]).len() == 1);
    }
}
