//! Which captured decode graph a step replays. A pool's leader decides it once per step and
//! sends it to every rank in the step plan: a rank that chose for itself could pad a step to
//! another batch size than its peers (say, one whose capture of that size had failed), and
//! their all-reduces would then disagree in size; NCCL would hang on them.

use ferrite_model::LogitsWanted;
use ferrite_model::error::{ModelError, Result};

use super::{DeviceBatch, GpuRunner};

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
    (n > 0).then_some(())?;
    captured.into_iter().filter(|&b| b >= n).min()
}

impl GpuRunner {
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
