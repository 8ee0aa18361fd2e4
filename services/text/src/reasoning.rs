//! Reasoning models' thinking, told apart from their answer (vLLM's `--reasoning-parser`).
//!
//! DeepSeek-R1, QwQ and Qwen3 think between `<think>` and `</think>` before they answer. Each
//! marker is one token of their vocabularies, so the output is split by token id, exactly: no
//! text matching, nothing held back. The split decides two things, one definition for both:
//! the gateway's `reasoning` beside the answer's `content`, and where a request's grammar
//! starts in the worker (a JSON schema holds the answer, not the thinking).
//!
//! Where the output starts: the prompt's last marker says (a template that opens the block
//! itself, as DeepSeek-R1's newer ones do, or closes it empty, as Qwen3's with
//! `enable_thinking=False`: then it is all answer). A prompt with neither: `deepseek_r1` and
//! `deepseek_v3` start inside the block (their models may leave out the opening tag), `qwen3`
//! and `glm45` in the answer, where the model may still open a block with its first token.
//!
//! gpt-oss writes its thinking and its answer as messages of channels instead
//! (`openai_gptoss`: [`crate::harmony`]), split the same way, by token.

use crate::harmony::{self, Harmony};
pub use crate::thinking::{Part, State};
use crate::{TextError, Tokenizer};

/// The parsers served, by vLLM's names: DeepSeek-R1 and QwQ (`deepseek_r1`), DeepSeek-V3.1
/// (`deepseek_v3`, whose template writes one marker or the other at the prompt's end), Qwen3
/// (`qwen3`) and GLM-4.5 (`glm45`), all of `<think>` and `</think>`; gpt-oss
/// (`openai_gptoss`), of harmony's channels.
pub const PARSERS: [&str; 5] = [
    "deepseek_r1",
    "deepseek_v3",
    "glm45",
    "openai_gptoss",
    "qwen3",
];

const START: &str = "<think>";
const END: &str = "</think>";

/// A model's reasoning parser with its markers' token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    /// Thinking between `<think>` and `</think>`.
    Think(Think),
    /// gpt-oss's channels.
    Harmony(Harmony),
}

/// A `<think>` block's markers, and where an output starts without one in its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Think {
    /// The output starts inside the block when the prompt has no marker (`deepseek_r1`,
    /// `deepseek_v3`).
    pub open_by_default: bool,
    pub start: u32,
    pub end: u32,
}

impl Reasoning {
    /// Parser `name` for `tokenizer`'s model: refused where the name is unknown or a marker is
    /// not one token of the vocabulary.
    pub fn new(name: &str, tokenizer: &Tokenizer) -> Result<Self, TextError> {
        let open_by_default = match name {
            "deepseek_r1" | "deepseek_v3" => true,
            "qwen3" | "glm45" => false,
            "openai_gptoss" => return Harmony::new(tokenizer).map(Reasoning::Harmony),
            _ => {
                return Err(TextError::Reasoning(format!(
                    "unknown reasoning parser `{name}` (served: {})",
                    PARSERS.join(", ")
                )));
            }
        };
        let id = |marker: &str| {
            tokenizer.token_to_id(marker).ok_or_else(|| {
                TextError::Reasoning(format!(
                    "reasoning parser `{name}`: `{marker}` is not a token of this model's \
                     vocabulary"
                ))
            })
        };
        Ok(Reasoning::Think(Think {
            open_by_default,
            start: id(START)?,
            end: id(END)?,
        }))
    }

    /// Where an output after `prompt` starts.
    pub fn state_after(&self, prompt: &[u32]) -> State {
        match self {
            Reasoning::Think(t) => t.state_after(prompt),
            Reasoning::Harmony(h) => h.state_after(prompt),
        }
    }

    /// The split of an output after `prompt`.
    pub fn split(&self, prompt: &[u32]) -> Split {
        self.split_from(self.state_after(prompt))
    }

    /// The split of an output that starts in `state` ([`Self::state_after`] its prompt).
    pub fn split_from(&self, state: State) -> Split {
        match self {
            Reasoning::Think(t) => Split::new((t.start, t.end), state),
            Reasoning::Harmony(h) => Split(Machine::Harmony(h.machine_from(state))),
        }
    }
}

impl Think {
    /// Where an output after `prompt` starts: inside the block where the prompt's last marker
    /// opened it, in the answer where it closed it; with no marker, as the parser says.
    pub fn state_after(&self, prompt: &[u32]) -> State {
        match prompt
            .iter()
            .rev()
            .find(|&&t| t == self.start || t == self.end)
        {
            Some(&t) if t == self.start => State::Thinking,
            Some(_) => State::Answering,
            None if self.open_by_default => State::Thinking,
            None => State::Start,
        }
    }
}

/// One output's split, token by token.
#[derive(Debug, Clone)]
pub struct Split(Machine);

#[derive(Debug, Clone)]
enum Machine {
    Think(ThinkSplit),
    Harmony(harmony::Machine),
}

impl Split {
    /// The split of an output that starts in `state`, by the `<think>` markers `(start, end)`.
    pub fn new((start, end): (u32, u32), state: State) -> Self {
        Self(Machine::Think(ThinkSplit { start, end, state }))
    }

    /// Which part `token` (the output's next) is.
    pub fn on_token(&mut self, token: u32) -> Part {
        match &mut self.0 {
            Machine::Think(t) => t.on_token(token),
            Machine::Harmony(h) => h.on_token(token),
        }
    }

    /// Whether the answer may begin with the next token (a grammar holds it from there): not
    /// inside a block (nor, for harmony, outside a `final` body). Before the first token it
    /// may, and so may the opening marker.
    pub fn answering(&self) -> bool {
        match &self.0 {
            Machine::Think(t) => t.state != State::Thinking,
            Machine::Harmony(h) => h.answering(),
        }
    }

    /// Whether the next token may open the block instead of beginning the answer.
    pub fn may_open(&self) -> bool {
        matches!(&self.0, Machine::Think(t) if t.state == State::Start)
    }

    /// gpt-oss's: the words of the header the output is in (or of its body's), by run
    /// ([`harmony::Machine::header`]); `None` for a `<think>` split.
    pub fn header(&self) -> Option<&[Vec<u32>]> {
        match &self.0 {
            Machine::Think(_) => None,
            Machine::Harmony(h) => Some(h.header()),
        }
    }

    /// The opening marker's id.
    pub fn start_token(&self) -> u32 {
        match &self.0 {
            Machine::Think(t) => t.start,
            Machine::Harmony(h) => h.start_token(),
        }
    }
}

/// A `<think>` block's split.
#[derive(Debug, Clone)]
struct ThinkSplit {
    /// The markers' ids: opening, closing.
    start: u32,
    end: u32,
    state: State,
}

impl ThinkSplit {
    fn on_token(&mut self, token: u32) -> Part {
        let (start, end) = (self.start, self.end);
        let (state, part) = match self.state {
            State::Start if token == start => (State::Thinking, Part::Marker),
            State::Start | State::Answering => (State::Answering, Part::Content),
            State::Thinking if token == end => (State::Answering, Part::Marker),
            // A model that writes the opening tag its template already wrote.
            State::Thinking if token == start => (State::Thinking, Part::Marker),
            State::Thinking => (State::Thinking, Part::Reasoning),
        };
        self.state = state;
        part
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R1: Reasoning = Reasoning::Think(Think {
        open_by_default: true,
        start: 1,
        end: 2,
    });
    const QWEN3: Reasoning = Reasoning::Think(Think {
        open_by_default: false,
        start: 1,
        end: 2,
    });

    fn parts(r: Reasoning, prompt: &[u32], output: &[u32]) -> Vec<Part> {
        let mut s = r.split(prompt);
        output.iter().map(|&t| s.on_token(t)).collect()
    }

    use Part::{Content as C, Marker as M, Reasoning as R};

    #[test]
    fn the_prompts_last_marker_says_where_the_output_starts() {
        for r in [R1, QWEN3] {
            let opened = r.state_after(&[5, 2, 6, 1, 7]);
            assert_eq!(opened, State::Thinking, "opened by the template");
            let closed = r.state_after(&[5, 1, 6, 2, 7]);
            assert_eq!(closed, State::Answering, "closed empty by the template");
        }
        assert_eq!(R1.state_after(&[5, 6]), State::Thinking);
        assert_eq!(QWEN3.state_after(&[5, 6]), State::Start);
    }

    #[test]
    fn thinking_then_answer() {
        // DeepSeek-R1: thinking from the first token, with or without the opening tag.
        assert_eq!(parts(R1, &[9], &[5, 6, 2, 7, 8]), [R, R, M, C, C]);
        assert_eq!(parts(R1, &[9], &[1, 5, 2, 7]), [M, R, M, C]);
        // Qwen3: a block only where the first token opens it; later markers are the answer's.
        assert_eq!(parts(QWEN3, &[9], &[1, 5, 2, 7]), [M, R, M, C]);
        assert_eq!(parts(QWEN3, &[9], &[7, 1, 5, 2]), [C, C, C, C]);
        // Closed by the template: all answer, markers included.
        assert_eq!(parts(R1, &[1, 2], &[5, 2, 6]), [C, C, C]);
        assert_eq!(parts(QWEN3, &[1, 2], &[1, 5, 2]), [C, C, C]);
        // A block never closed: all thinking.
        assert_eq!(parts(QWEN3, &[1], &[5, 6]), [R, R]);
    }

    #[test]
    fn the_answer_starts_where_the_block_ends() {
        let mut s = QWEN3.split(&[9]);
        assert!(s.answering() && s.may_open());
        s.on_token(1);
        assert!(!s.answering() && !s.may_open());
        s.on_token(5);
        assert!(!s.answering());
        s.on_token(2);
        assert!(s.answering() && !s.may_open());
        let s = R1.split(&[9]);
        assert!(!s.answering());
    }
}
