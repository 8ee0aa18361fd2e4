//! Collectives between the ranks of a tensor-parallel pool, behind one small trait.
//!
//! # Layout
//!
//! - [`Collective`]: all-reduce (sum), all-gather, gather to rank 0, broadcast of bytes,
//!   barrier. The engine's
//!   executor will call these after the attention output and MLP down projections.
//! - [`tcp`]: the CPU backend, rank processes on one or several hosts over TCP. Rank 0 is the
//!   hub: every other rank keeps one connection to it. An all-reduce gathers every rank's
//!   buffer at rank 0, sums them in rank order (so the result is the same bits on every run
//!   and for every N) and sends the sum back. Sockets block with timeouts: nothing spins, and
//!   nothing waits for ever: a rank that dies or stalls fails the collective within the
//!   timeout, with an error naming it.
//!
//! - [`Solo`]: a pool of one rank, where every collective is a no-op (the forward calls the
//!   same collectives at any pool size).
//!
//! The NCCL backend (same trait, on the GPU host) is the next step of the tensor-parallel work.

pub mod tcp;

use std::time::Duration;

/// Why a collective failed. Every variant names the rank at fault where one is known.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error("rank {rank}: {what}: {source}")]
    Io {
        rank: usize,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rank {rank} sent no answer within {timeout:?} ({what})")]
    Timeout {
        rank: usize,
        what: &'static str,
        timeout: Duration,
    },
    #[error("rank {rank}: {reason}")]
    Protocol { rank: usize, reason: String },
    #[error("the pool did not form: {0}")]
    Rendezvous(String),
    /// A device collective (NCCL) failed or stalled; it cannot say which peer is at fault.
    #[error("{0}")]
    Device(String),
}

impl CollectiveError {
    /// The rank at fault, if one is known.
    pub fn rank(&self) -> Option<usize> {
        match self {
            Self::Io { rank, .. } | Self::Timeout { rank, .. } | Self::Protocol { rank, .. } => {
                Some(*rank)
            }
            Self::Rendezvous(_) | Self::Device(_) => None,
        }
    }
}

/// What every rank of a pool can do together. Every rank calls the same collectives in the
/// same order with buffers of the same length.
pub trait Collective: Send {
    /// This process's rank, `0..world`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// Replaces `buf` on every rank with the element-wise sum over ranks, added in rank order.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError>;

    /// `out` (`world × mine.len()`) on every rank: rank r's `mine` at `r × mine.len()`.
    fn all_gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError>;

    /// [`Self::all_gather`] to rank 0 only (the logits, which only the leader samples): `out`
    /// is filled on rank 0; the other ranks send `mine` and leave `out` as it is (it may be
    /// empty there).
    fn gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError>;

    /// `bytes` on every rank becomes rank 0's (the step plan, sent by the leader).
    fn broadcast(&mut self, bytes: &mut Vec<u8>) -> Result<(), CollectiveError>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.all_reduce_sum(&mut [0.0])
    }
}

/// The one rank of a pool of one: every collective leaves its buffer as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn all_reduce_sum(&mut self, _buf: &mut [f32]) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn all_gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        if out.len() != mine.len() {
            return Err(CollectiveError::Protocol {
                rank: 0,
                reason: format!(
                    "all_gather: {} slots for 1 rank of {}",
                    out.len(),
                    mine.len()
                ),
            });
        }
        out.copy_from_slice(mine);
        Ok(())
    }

    fn gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        self.all_gather(mine, out)
    }

    fn broadcast(&mut self, _bytes: &mut Vec<u8>) -> Result<(), CollectiveError> {
        Ok(())
    }
}
