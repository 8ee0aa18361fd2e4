//! A step's picks as the executor gives them back ([`Picks`]), and their split among the
//! step's chunks ([`per_chunk`]).

use std::collections::HashMap;

use crate::error::{EngineError, Result};
use crate::model::{Draws, TokenLogprobs};
use crate::scheduler::{Schedule, ScheduledChunk};

/// A step's picks: logits rows to sample on the host, or ids sampled on the device, or both
/// (`Mixed`: an id for every sampling row, and the logits of the rows sampled on the host, by
/// row, which take their place).
#[derive(Debug)]
pub enum Picks {
    Logits(Vec<f32>),
    Ids(Draws),
    Mixed(Draws, Vec<(u32, Vec<f32>)>),
}

/// One sampling chunk's share of a step's picks.
pub(crate) enum Pick {
    /// Its row of logits, to sample on the host; for a chunk with drafts, its rows
    /// ([`ScheduledChunk::sampling_rows`]), one after another.
    Row(Vec<f32>),
    /// The id the device sampled, with its logprobs where its request asked for them.
    Id(u32, Option<TokenLogprobs>),
    /// The device found nothing to draw: the row's logits were no distribution (NaN), and it
    /// drew an id outside the vocabulary (this one) to say so.
    Undrawn(u32),
}

/// Splits `picks` among the schedule's chunks, checking there is exactly one per sampling
/// row: a chunk with drafts takes its rows together.
pub(crate) fn per_chunk(
    picks: Picks,
    schedule: &Schedule,
    vocab: usize,
) -> Result<Vec<Option<Pick>>> {
    let wanted: usize = (schedule.chunks.iter())
        .map(ScheduledChunk::sampling_rows)
        .sum();
    let vocab = vocab.max(1);
    let picks: Vec<Pick> = match picks {
        Picks::Logits(l) if l.len() % vocab == 0 => l
            .chunks_exact(vocab)
            .map(|r| Pick::Row(r.to_vec()))
            .collect(),
        Picks::Logits(l) => {
            return Err(EngineError::Internal(format!(
                "{} logits are not whole rows of {vocab}",
                l.len()
            )));
        }
        Picks::Ids(ids) => drawn(ids, vocab),
        Picks::Mixed(ids, rows) => {
            let mut picks = drawn(ids, vocab);
            for (row, logits) in rows {
                match picks.get_mut(row as usize) {
                    Some(p) if logits.len() == vocab => *p = Pick::Row(logits),
                    _ => {
                        return Err(EngineError::Internal(format!(
                            "logits of row {row} ({} values) among {} picks",
                            logits.len(),
                            picks.len()
                        )));
                    }
                }
            }
            picks
        }
    };
    if picks.len() != wanted {
        return Err(EngineError::Internal(format!(
            "the forward gave {} picks for {wanted} sampling rows",
            picks.len()
        )));
    }
    let mut picks = picks.into_iter();
    (schedule.chunks.iter())
        .map(|c| match c.sampling_rows() {
            0 => Ok(None),
            1 => Ok(picks.next()),
            n => rows_together(picks.by_ref().take(n)).map(Some),
        })
        .collect()
}

/// The rows of a chunk with drafts as one pick: they all come back as logits (a step with
/// drafts is not drawn on the ranks).
fn rows_together(picks: impl Iterator<Item = Pick>) -> Result<Pick> {
    let mut rows = Vec::new();
    for p in picks {
        match p {
            Pick::Row(r) => rows.extend_from_slice(&r),
            _ => {
                return Err(EngineError::Internal(
                    "a chunk with drafts came back with draws, not logits".into(),
                ));
            }
        }
    }
    Ok(Pick::Row(rows))
}

/// Ids the ranks drew, as picks: one outside the vocabulary says there was nothing to draw.
fn drawn(draws: Draws, vocab: usize) -> Vec<Pick> {
    let mut logprobs: HashMap<u32, TokenLogprobs> = draws.logprobs.into_iter().collect();
    (draws.ids.into_iter().enumerate())
        .map(|(row, i)| match i as usize {
            i if i < vocab => Pick::Id(i as u32, logprobs.remove(&(row as u32))),
            _ => Pick::Undrawn(i),
        })
        .collect()
}
