//! gpt-oss's output format (OpenAI's "harmony"): the model writes messages, each a header and
//! a body, `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`,
//! ending on `<|return|>` (or `<|call|>`; both are its end-of-sequence tokens). The `analysis`
//! channel is its thinking, `final` its answer, `commentary` its preambles and tool calls.
//!
//! Every marker is one special token, and the names of the `final` and `analysis` channels
//! are one token each in the o200k vocabulary (`commentary` is two), so the output comes
//! apart by token id, as `<think>` blocks do ([`crate::reasoning`]):
//! headers are markers, a `final` body is the answer, every other body thinking. A tool call is
//! a body whose header names its recipient (`<|channel|>commentary to=functions.get_weather
//! <|constrain|>json<|message|>{…}<|call|>`): the header's words are ordinary tokens, kept
//! ([`Machine::header`]) for the gateway to read the recipient from ([`recipient`]).

use crate::thinking::{Part, State};
use crate::{TextError, Tokenizer};

/// The format's tokens, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Harmony {
    /// `<|start|>`: a message's header begins (the role, then the channel).
    pub start: u32,
    /// `<|channel|>`: the channel's name follows.
    pub channel: u32,
    /// `<|constrain|>`: the body's format follows (`json`), after the name.
    pub constrain: u32,
    /// `<|message|>`: the body begins.
    pub message: u32,
    /// `<|end|>`: the body ends.
    pub end: u32,
    /// `<|call|>`, `<|return|>`: the body ends, and with it the output (a tool call; the
    /// final answer).
    pub call: u32,
    pub return_: u32,
    /// `final`: the answer's channel.
    pub final_channel: u32,
    /// `analysis`: the thinking's channel (a grammar names channels by these two tokens, so
    /// that the model cannot spell them in other tokens the split would not know).
    pub analysis_channel: u32,
}

impl Harmony {
    /// The tokens of `tokenizer`'s vocabulary: refused where one is missing (not a gpt-oss
    /// tokenizer).
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, TextError> {
        let id = |token: &str| {
            tokenizer.token_to_id(token).ok_or_else(|| {
                TextError::Reasoning(format!(
                    "reasoning parser `openai_gptoss`: `{token}` is not a token of this \
                     model's vocabulary (it reads gpt-oss's harmony format)"
                ))
            })
        };
        Ok(Self {
            start: id("<|start|>")?,
            channel: id("<|channel|>")?,
            constrain: id("<|constrain|>")?,
            message: id("<|message|>")?,
            end: id("<|end|>")?,
            call: id("<|call|>")?,
            return_: id("<|return|>")?,
            final_channel: id("final")?,
            analysis_channel: id("analysis")?,
        })
    }

    /// Where an output after `prompt` starts: in a body where the prompt opened one (a
    /// template that writes `<|channel|>final<|message|>` itself), else in a header (the
    /// template's `<|start|>assistant`).
    pub fn state_after(&self, prompt: &[u32]) -> State {
        let from = prompt.iter().rposition(|&t| t == self.start).unwrap_or(0);
        let mut m = self.machine(Place::Header { name: false });
        prompt[from..].iter().for_each(|&t| {
            m.on_token(t);
        });
        match m.place {
            Place::Body { answer: true } => State::Answering,
            Place::Body { answer: false } => State::Thinking,
            Place::Header { .. } | Place::Between => State::Start,
        }
    }

    /// The split of an output that starts in `state` ([`Self::state_after`]).
    pub fn machine_from(&self, state: State) -> Machine {
        self.machine(match state {
            State::Start => Place::Header { name: false },
            State::Thinking => Place::Body { answer: false },
            State::Answering => Place::Body { answer: true },
        })
    }

    fn machine(&self, place: Place) -> Machine {
        Machine {
            tokens: *self,
            place,
            final_seen: false,
            header: Vec::new(),
        }
    }
}

/// Where in a message the output stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In a header; `name` where the next token is the channel's name.
    Header { name: bool },
    /// In a body: the answer's (the `final` channel) or thinking.
    Body { answer: bool },
    /// After a body's `<|end|>`, before the next `<|start|>`.
    Between,
}

/// One output's split, token by token.
#[derive(Debug, Clone)]
pub struct Machine {
    tokens: Harmony,
    place: Place,
    /// Whether the current header named the `final` channel.
    final_seen: bool,
    /// The current (or last) header's words: its runs of ordinary tokens, one per run
    /// between markers (`assistant to=functions.f`, `commentary`, `json`).
    header: Vec<Vec<u32>>,
}

impl Machine {
    /// Which part `token` (the output's next) is.
    pub fn on_token(&mut self, token: u32) -> Part {
        let h = self.tokens;
        let (place, part) = match self.place {
            Place::Header { .. } if token == h.message => {
                let answer = std::mem::take(&mut self.final_seen);
                (Place::Body { answer }, Part::Marker)
            }
            Place::Header { .. } if token == h.channel => {
                self.header.push(Vec::new());
                (Place::Header { name: true }, Part::Marker)
            }
            Place::Header { .. } if token == h.constrain => {
                self.header.push(Vec::new());
                (Place::Header { name: false }, Part::Marker)
            }
            Place::Header { name } => {
                // The channel's name is its first token (`final` is one): what follows it
                // (` <|constrain|>json`, a recipient) leaves it as it is.
                if name {
                    self.final_seen = token == h.final_channel;
                }
                match self.header.last_mut() {
                    Some(run) => run.push(token),
                    None => self.header.push(vec![token]),
                }
                (Place::Header { name: false }, Part::Marker)
            }
            Place::Body { .. } if [h.end, h.call, h.return_].contains(&token) => {
                (Place::Between, Part::Marker)
            }
            Place::Body { answer: true } => (self.place, Part::Content),
            Place::Body { answer: false } => (self.place, Part::Reasoning),
            Place::Between if token == h.start => {
                self.header.clear();
                (Place::Header { name: false }, Part::Marker)
            }
            // Text with no header: the model answered outright.
            Place::Between => (Place::Body { answer: true }, Part::Content),
        };
        self.place = place;
        part
    }

    /// Whether the next token may be the answer's: inside a `final` body.
    pub fn answering(&self) -> bool {
        self.place == (Place::Body { answer: true })
    }

    /// The opening marker's id: `<|start|>`.
    pub fn start_token(&self) -> u32 {
        self.tokens.start
    }

    /// The words of the header the output is in, or of the body it is in: runs of ordinary
    /// tokens, one per run between the header's markers. (Before the output's first
    /// `<|start|>`, the prompt's part of the header, `assistant`, is not among them.)
    pub fn header(&self) -> &[Vec<u32>] {
        &self.header
    }
}

/// The recipient a header's text names (`to=functions.get_weather`), wherever in the header
/// it stands: after the role (`assistant to=…`) or after the channel (`commentary to=…`).
pub fn recipient(header: &str) -> Option<&str> {
    header
        .split_whitespace()
        .find_map(|word| word.strip_prefix("to="))
        .filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Part::{Content as C, Marker as M, Reasoning as R};

    // <|start|> 1, <|channel|> 2, <|constrain|> 3, <|message|> 4, <|end|> 5, final 6;
    // analysis 7, assistant 8, commentary 9, words 10 to 97, <|call|> 98, <|return|> 99.
    const H: Harmony = Harmony {
        start: 1,
        channel: 2,
        constrain: 3,
        message: 4,
        end: 5,
        call: 98,
        return_: 99,
        final_channel: 6,
        analysis_channel: 7,
    };

    fn parts(prompt: &[u32], output: &[u32]) -> Vec<Part> {
        let mut m = H.machine_from(H.state_after(prompt));
        output.iter().map(|&t| m.on_token(t)).collect()
    }

    #[test]
    fn analysis_is_thinking_and_final_the_answer() {
        let prompt = [1, 8, 10, 5, 1, 8];
        let output = [2, 7, 4, 10, 11, 5, 1, 8, 2, 6, 4, 12, 13];
        let want = [M, M, M, R, R, M, M, M, M, M, M, C, C];
        assert_eq!(parts(&prompt, &output), want);
        // A preamble in commentary is thinking too; a header's constraint is a marker.
        let output = [2, 9, 3, 10, 4, 11, 5];
        assert_eq!(parts(&prompt, &output), [M, M, M, M, M, R, M]);
    }

    #[test]
    fn the_prompts_open_body_says_where_the_output_starts() {
        assert_eq!(H.state_after(&[1, 8]), State::Start);
        assert_eq!(H.state_after(&[1, 8, 2, 6, 4]), State::Answering);
        assert_eq!(H.state_after(&[1, 8, 2, 7, 4]), State::Thinking);
        assert_eq!(parts(&[1, 8, 2, 6, 4], &[10, 11]), [C, C]);
        // Text after a body's end with no header: the answer.
        assert_eq!(parts(&[1, 8], &[2, 7, 4, 10, 5, 11]), [M, M, M, R, M, C]);
    }

    #[test]
    fn only_a_final_body_is_answering() {
        let mut m = H.machine_from(State::Start);
        for t in [2, 6] {
            m.on_token(t);
            assert!(!m.answering());
        }
        m.on_token(4);
        assert!(m.answering());
        m.on_token(5);
        assert!(!m.answering());
    }

    #[test]
    fn a_headers_words_are_kept_by_run_and_calls_and_returns_end_bodies() {
        let mut m = H.machine_from(State::Start);
        // <|channel|>commentary to=f <|constrain|>json<|message|>{…}<|call|>
        let call = [2, 9, 10, 11, 3, 12, 4, 13, 98];
        let parts: Vec<Part> = call.iter().map(|&t| m.on_token(t)).collect();
        assert_eq!(parts, [M, M, M, M, M, M, M, R, M]);
        assert_eq!(m.header(), [vec![9, 10, 11], vec![12]]);
        // The next message's header starts afresh; the role's words are a run of their own.
        for t in [1, 8, 10, 2, 6, 4] {
            m.on_token(t);
        }
        assert_eq!(m.header(), [vec![8, 10], vec![6]]);
        assert!(m.answering());
        assert_eq!(m.on_token(99), M, "<|return|> ends the answer");
        assert!(!m.answering());
        // What follows the channel's name in its header leaves it the answer's:
        // <|start|>assistant<|channel|>final <|constrain|>json<|message|>
        for t in [1, 8, 2, 6, 10, 3, 12, 4] {
            m.on_token(t);
        }
        assert!(m.answering());
    }

    #[test]
    fn the_recipient_is_read_wherever_the_header_names_it() {
        assert_eq!(
            recipient("commentary to=functions.get_weather json"),
            Some("functions.get_weather")
        );
        assert_eq!(
            recipient("assistant to=functions.f commentary"),
            Some("functions.f")
        );
        assert_eq!(recipient("commentary"), None);
        assert_eq!(recipient("commentary to= json"), None);
    }
}
