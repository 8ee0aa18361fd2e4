//! What one forward step is given, on any backend: each sequence's chunk of tokens, where its
//! KV blocks lie, which logits it wants back, and, on a device that samples them itself, how.

use serde::{Deserialize, Serialize};

/// Which logits a sequence chunk wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogitsWanted {
    /// A prefill chunk that does not reach the end of the prompt.
    None,
    /// The next-token logits (at the chunk's last token).
    Last,
    /// Logits at every token of the chunk (prompt logprobs, tests).
    All,
}

/// One sequence's tokens in a forward: `tokens` sit at positions `start_pos..`, and the block
/// table already has room for them.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub block_table: &'a [u32],
    pub logits: LogitsWanted,
    /// The chunk holds a token of the request's prompt (its last one, after a prefix-cache
    /// hit, included), or several tokens, not one generated token: the step then takes
    /// nearly exact activations on the CPU (see [`crate::llama::LayerAt::prompt`]).
    pub prompt: bool,
}

/// One sequence's sampling, as the kernel takes it (and as step plans carry it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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

/// Where a device that samples gets the step's grammar masks: called once the forward is
/// queued (so the host computes the masks while the device runs it), it gives one entry per
/// row that samples, in order: a bitmask over the logits row (bit `i % 32` of word `i / 32`
/// allows token `i`) or `None` (no grammar).
pub type MaskSource<'a> = &'a mut dyn FnMut() -> Vec<Option<Vec<u32>>>;

/// A token of a step that the step before it drew and the host has not read yet (async
/// scheduling launches a step before the last one's draws are back, as vLLM v1 does): the
/// token at `index` of chunk `chunk` is the previous step's draw for its sampling row `row`.
/// The step's tokens hold a placeholder there; the rank that runs it puts its own draw in its
/// place (on a GPU, without the draw leaving the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    pub chunk: u32,
    pub index: u32,
    pub row: u32,
}
