//! The decode steps' CUDA graphs: their capture at start-up, and which one a step replays.
//!
//! Which graph a step replays, the pool's leader decides once per step and sends it to every
//! rank in the step plan: a rank that chose for itself could pad a step to another batch size
//! than its peers (say, one whose capture of that size had failed), and their all-reduces
//! would then disagree in size; NCCL would hang on them.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use ferrite_collective::Solo;
use ferrite_model::LogitsWanted;
use ferrite_model::error::{ModelError, Result};

use super::link::Link;
use super::{DeviceBatch, GpuRunner, Graph, gpu_error};

/// The captured graph (by its batch size) for a step of `chunks`, each `(tokens, logits)`: for
/// a decode step (one token per sequence, each wanting its logits) the smallest of the
/// `captured` sizes that holds all its sequences, padded up to it; `None`, run eagerly,
/// otherwise or where no size is large enough.
pub fn decode_graph(
    captured: impl IntoIterator<Item = usize>,
    chunks: impl IntoIterator<Item = (usize, LogitsWanted)>,
) -> Option<usize> {
    let mut n = 0;
    for (tokens, logits) in chunks {
        if tokens != 1 || logits == LogitsWanted::None {
            return None;
        }
        n += 1;
    }
    if n == 0 {
        return None;
    }
    captured.into_iter().filter(|&b| b >= n).min()
}

impl GpuRunner {
    /// Captures one CUDA graph per decode batch size of the ladder 1, 2, 4, 8, 16, 24, 32, …
    /// (steps of 8) up to `max_seqs` (and the step's token budget). Each size runs once
    /// eagerly first (under the NCCL watchdog), so cuBLAS has chosen its kernels before the
    /// capture records them (and NCCL, which connects lazily, has connected). Returns the
    /// sizes captured: none for a rank whose collectives go through the host (a graph cannot
    /// wait on a socket).
    pub fn capture_graphs(&mut self) -> Result<Vec<usize>> {
        if matches!(self.link, Link::Host) && !self.w.tp.is_solo() {
            return Ok(Vec::new());
        }
        let gpu = self.w.gpu.clone();
        let top = self.limits.max_seqs.min(self.limits.max_tokens);
        let mut sizes: Vec<usize> = [1, 2, 4].into_iter().filter(|&b| b <= top).collect();
        sizes.extend((8..=top).step_by(8));
        if sizes.last() != Some(&top) {
            sizes.push(top);
        }
        let err =
            |e: cudarc::driver::DriverError| ModelError::Device(format!("graph capture: {e}"));
        for &b in &sizes {
            let mut plan = self.empty_plan();
            self.pad_decode(&mut plan, b);
            self.queue_meta(&plan)?;
            // Under the watchdog like any step: NCCL connects here, and a peer that died
            // since start-up would otherwise hang this rank's start.
            self.watched(|r| {
                // SAFETY: as in `forward`; every row is padding (no KV slot is written). A
                // pool that captures reduces with NCCL, which needs no host collective.
                #[allow(unsafe_code)]
                unsafe { r.run(&gpu, &plan, &mut Solo) }?;
                gpu.synchronize().map_err(gpu_error)
            })?;
            gpu.stream()
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(err)?;
            // SAFETY: as above; kernels are recorded, not run.
            #[allow(unsafe_code)]
            let recorded = unsafe { self.run(&gpu, &plan, &mut Solo) };
            // End the capture whatever happened, so the stream is usable again.
            let graph = gpu
                .stream()
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(err)?;
            recorded?;
            let graph =
                graph.ok_or_else(|| ModelError::Device("graph capture recorded nothing".into()))?;
            graph.upload().map_err(err)?;
            self.graphs.insert(b, Graph(graph));
        }
        gpu.synchronize().map_err(gpu_error)?;
        Ok(sizes)
    }

    /// [`decode_graph`] among the graphs this runner captured.
    pub fn graph_for(
        &self,
        chunks: impl IntoIterator<Item = (usize, LogitsWanted)>,
    ) -> Option<usize> {
        decode_graph(self.graphs.keys().copied(), chunks)
    }

    /// Checks that the plan's graph `b` is one this rank captured and holds `step`: a decode
    /// step of at most `b` sequences.
    pub(super) fn check_graph(&self, b: usize, step: &DeviceBatch) -> Result<()> {
        if !self.graphs.contains_key(&b) {
            return Err(ModelError::Internal(format!(
                "the plan replays the decode graph of batch {b}, which this rank did not capture"
            )));
        }
        if step.max_q != 1 || step.n_logits != step.n_seqs || step.n_seqs > b {
            return Err(ModelError::Internal(format!(
                "the plan replays the decode graph of batch {b} for a step of {} sequences, \
                 {} rows of logits and up to {} tokens a sequence",
                step.n_seqs, step.n_logits, step.max_q
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LogitsWanted::{All, Last, None as Skip};

    #[test]
    fn a_decode_step_takes_the_smallest_graph_that_holds_it() {
        let ladder = [1, 2, 4, 8, 16];
        let decode = |n: usize| vec![(1, Last); n];
        assert_eq!(decode_graph(ladder, decode(1)), Some(1));
        assert_eq!(decode_graph(ladder, decode(3)), Some(4));
        assert_eq!(decode_graph(ladder, decode(8)), Some(8));
        assert_eq!(decode_graph(ladder, decode(9)), Some(16));
        // The order of the sizes does not matter.
        assert_eq!(decode_graph([16, 4, 8], decode(3)), Some(4));
        // One token wanting every row's logits is one row too.
        assert_eq!(decode_graph(ladder, [(1, All), (1, Last)]), Some(2));
    }

    #[test]
    fn anything_else_runs_eagerly() {
        let ladder = [1, 2, 4, 8];
        assert_eq!(decode_graph(ladder, vec![(1, Last); 9]), None, "too many");
        assert_eq!(
            decode_graph(ladder, [(1, Last), (5, Last)]),
            None,
            "a prefill"
        );
        assert_eq!(
            decode_graph(ladder, [(1, Last), (1, Skip)]),
            None,
            "no logits"
        );
        assert_eq!(decode_graph(ladder, []), None, "an empty step");
        assert_eq!(decode_graph([], [(1, Last)]), None, "nothing captured");
    }
}
