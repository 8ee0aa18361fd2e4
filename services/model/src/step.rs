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
    /// The LoRA adapter the sequence runs with (an index into the model's), if any.
    pub lora: Option<u32>,
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

/// A row's penalties, as the CPU sampler applies them: repetition `r` (1: none) on every
/// token seen before, then `presence + frequency * c` off the logit of a token the output
/// holds `c > 0` times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Penalties {
    pub repetition: f32,
    pub presence: f32,
    pub frequency: f32,
}

impl Penalties {
    pub const NONE: Self = Self {
        repetition: 1.0,
        presence: 0.0,
        frequency: 0.0,
    };

    pub fn any(&self) -> bool {
        *self != Self::NONE
    }
}

/// What a row's draw needs beyond its [`DeviceSampling`] where its request asks for penalties,
/// logprobs or a logit bias: the ranks then take the CPU sampler's steps around the draw
/// themselves (the logprobs of the row as it stands, the bias and the penalties, the draw, the
/// drawn token's logprob), so the row's logits need not come back to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrawExtras {
    /// Its sampling row.
    pub row: u32,
    pub penalties: Penalties,
    /// With penalties: each distinct token of the sequence before the chunk's last token
    /// (through it, where that one is the prompt's), with how often the output holds it (0:
    /// the prompt alone).
    pub seen: Vec<(u32, u32)>,
    /// With penalties: the chunk's last token is one of the output, counted by each rank from
    /// its own input ids. In a chained step it is the draw the host has not read yet.
    pub last_is_output: bool,
    /// The logprob of the draw and of this many most likely tokens (at most the kernels'
    /// `MAX_LOGPROBS`), under the row before the bias and the penalties.
    pub logprobs: Option<u32>,
    /// Added to these tokens' logits before the penalties (each token once).
    #[serde(default)]
    pub bias: Vec<(u32, f32)>,
}

/// The logprobs of a drawn token (under the row before penalties and temperature) and of the
/// most likely tokens, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What the ranks drew for a step's sampling rows: an id each (one outside the vocabulary
/// where a row had no distribution), and the logprobs of the rows whose extras asked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draws {
    pub ids: Vec<u32>,
    /// By sampling row.
    pub logprobs: Vec<(u32, TokenLogprobs)>,
}

impl From<Vec<u32>> for Draws {
    fn from(ids: Vec<u32>) -> Self {
        Self {
            ids,
            logprobs: Vec::new(),
        }
    }
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
