//! Tool calls as the model writes them, for streaming: each call's name once it is complete,
//! then the text of its arguments piece by piece, as OpenAI streams `function.arguments`.
//!
//! The scanner reads the text so far of a tool request (every format writes a call as a JSON
//! object whose `"name"` comes before its arguments object: `arguments`, or `parameters` for
//! Llama 3.1) once the text is a call in its format: the generic format's `"tool_calls"` (not
//! its `"response"`), Hermes' `<tool_call>`, Mistral's `[TOOL_CALLS]`, Granite's `<|tool_call|>`,
//! Llama 3.1's leading `{`.
//! The arguments' end is found by matching braces outside strings. The whole text is still
//! parsed when it ends ([`crate::tools::Tools::parse`]); a call the scanner streamed is not
//! sent again.

use crate::tools::ToolFormat;

/// One piece of a call, in order: its head, then pieces of its arguments' text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallPiece {
    Head { index: usize, name: String },
    Arguments { index: usize, text: String },
}

#[derive(Debug)]
enum State {
    /// Looking for the next call's name from this byte.
    Seek(usize),
    /// Inside call `index`'s arguments, which start at `start`: `sent` bytes of the text are
    /// out, `scanned` were read; `depth` of braces, within a string or not, after a `\` or not.
    Arguments {
        index: usize,
        sent: usize,
        scanned: usize,
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

/// The calls of one streamed answer found so far.
#[derive(Debug)]
pub struct CallScanner {
    format: ToolFormat,
    state: State,
    /// Where the calls begin, once the text shows it is calls (found once: the text only
    /// grows, so it stays where it was found).
    calls_at: Option<usize>,
    /// Calls whose head went out.
    heads: usize,
}

impl CallScanner {
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            state: State::Seek(0),
            calls_at: None,
            heads: 0,
        }
    }

    /// Calls whose head has been streamed.
    pub fn streamed(&self) -> usize {
        self.heads
    }

    /// The pieces `text` (the whole text so far, grown since the last call) adds.
    pub fn advance(&mut self, text: &str) -> Vec<CallPiece> {
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Seek(from) => {
                    if self.calls_at.is_none() {
                        self.calls_at = self.calls_start(text);
                    }
                    let Some(from) = self.calls_at.map(|at| at.max(from)) else {
                        return out;
                    };
                    let Some((name, args_at)) = head(text, from, self.key()) else {
                        return out;
                    };
                    let index = self.heads;
                    self.heads += 1;
                    out.push(CallPiece::Head { index, name });
                    self.state = State::Arguments {
                        index,
                        sent: args_at,
                        scanned: args_at,
                        depth: 0,
                        in_string: false,
                        escaped: false,
                    };
                }
                State::Arguments { .. } => {
                    let (piece, closed) = self.arguments(text);
                    out.extend(piece);
                    if !closed {
                        return out;
                    }
                }
            }
        }
    }

    fn key(&self) -> &'static str {
        match self.format {
            ToolFormat::Llama3 => "\"parameters\"",
            _ => "\"arguments\"",
        }
    }

    /// Where calls may start in `text`: `None` while it is not (yet) calls.
    fn calls_start(&self, text: &str) -> Option<usize> {
        let after = |marker: &str| text.find(marker).map(|i| i + marker.len());
        match self.format {
            ToolFormat::Generic => {
                let calls = text.find("\"tool_calls\"")?;
                // A `"response"` first is an answer in text, whatever it says.
                if text.find("\"response\"").is_some_and(|r| r < calls) {
                    return None;
                }
                Some(calls + "\"tool_calls\"".len())
            }
            ToolFormat::Hermes => after("<tool_call>"),
            ToolFormat::Mistral | ToolFormat::Granite => after(self.format.markers()[0]),
            // Its calls are never in the answer's text.
            ToolFormat::Harmony => None,
            ToolFormat::Llama3 => {
                let body = text.trim_start();
                let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
                body.trim_start().starts_with('{').then_some(0)
            }
        }
    }

    /// Reads the arguments' text past what was read: the next piece, if there is one, and
    /// whether they closed (the call ends there, and the scanner seeks the next).
    fn arguments(&mut self, text: &str) -> (Option<CallPiece>, bool) {
        let State::Arguments {
            index,
            sent,
            scanned,
            depth,
            in_string,
            escaped,
        } = &mut self.state
        else {
            return (None, false);
        };
        let bytes = text.as_bytes();
        let mut end = None;
        while end.is_none() && *scanned < bytes.len() {
            let b = bytes[*scanned];
            *scanned += 1;
            match (b, *in_string, *escaped) {
                (_, true, true) => *escaped = false,
                (b'\\', true, false) => *escaped = true,
                (b'"', _, false) => *in_string = !*in_string,
                (b'{', false, _) => *depth += 1,
                (b'}', false, _) => {
                    *depth = depth.saturating_sub(1);
                    if *depth == 0 {
                        end = Some(*scanned);
                    }
                }
                _ => {}
            }
        }
        let upto = end.unwrap_or(*scanned);
        let piece = (upto > *sent).then(|| CallPiece::Arguments {
            index: *index,
            text: text[*sent..upto].to_owned(),
        });
        *sent = upto;
        if let Some(e) = end {
            self.state = State::Seek(e);
        }
        (piece, end.is_some())
    }
}

/// From `from`: a complete `"name": "<name>"` followed by the arguments' `key` and its `{`.
/// Returns the name and where the arguments' `{` is.
fn head(text: &str, from: usize, key: &str) -> Option<(String, usize)> {
    let rest = &text[from..];
    let n = rest.find("\"name\"")? + "\"name\"".len();
    let after_name = rest[n..].trim_start().strip_prefix(':')?.trim_start();
    let value = after_name.strip_prefix('"')?;
    let close = value.find('"')?;
    let name = value[..close].to_owned();
    let value_end = from + (rest.len() - value.len()) + close + 1;
    let k = text[value_end..].find(key)? + value_end + key.len();
    let after_key = text[k..].trim_start().strip_prefix(':')?;
    let brace = after_key.find(|c: char| !c.is_whitespace())?;
    let at = text.len() - after_key.len() + brace;
    (text.as_bytes()[at] == b'{').then_some((name, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` fed a few bytes at a time (as tokens come): the calls put together from the
    /// pieces, as a client does, checking that each call's head comes before its arguments.
    fn stream(format: ToolFormat, text: &str, step: usize) -> Vec<(String, String, usize)> {
        let mut s = CallScanner::new(format);
        let mut calls: Vec<(String, String, usize)> = Vec::new();
        let mut end = 0;
        while end < text.len() {
            end = (end + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            for p in s.advance(&text[..end]) {
                match p {
                    CallPiece::Head { index, name } => {
                        assert_eq!(index, calls.len(), "heads in order");
                        calls.push((name, String::new(), 0));
                    }
                    CallPiece::Arguments { index, text } => {
                        let c = calls.get_mut(index).expect("the head came first");
                        c.1.push_str(&text);
                        c.2 += 1;
                    }
                }
            }
        }
        assert_eq!(s.streamed(), calls.len());
        calls
    }

    #[test]
    fn every_format_streams_names_then_argument_pieces() {
        let args = r#"{"city": "Pa\"ris {x}", "days": {"n": 3}}"#;
        let cases = [
            (
                ToolFormat::Generic,
                format!(
                    r#"{{"tool_calls": [{{"name": "get_weather", "arguments": {args}}}, {{"name": "now", "arguments": {{}}}}]}}"#
                ),
            ),
            (
                ToolFormat::Hermes,
                format!(
                    "Let me see.<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call><tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>"
                ),
            ),
            (
                ToolFormat::Mistral,
                format!(
                    r#"[TOOL_CALLS][{{"name": "get_weather", "arguments": {args}}}, {{"name": "now", "arguments": {{}}}}]"#
                ),
            ),
        ];
        for (format, text) in cases {
            for step in [1, 3, 1000] {
                let calls = stream(format, &text, step);
                assert_eq!(calls.len(), 2, "{format:?} by {step}: {calls:?}");
                assert_eq!(
                    (calls[0].0.as_str(), calls[0].1.as_str()),
                    ("get_weather", args)
                );
                assert_eq!((calls[1].0.as_str(), calls[1].1.as_str()), ("now", "{}"));
                if step == 1 {
                    assert!(calls[0].2 > 10, "{format:?}: arguments in pieces");
                }
            }
        }
        let llama = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
        let calls = stream(ToolFormat::Llama3, llama, 2);
        assert_eq!(
            calls,
            vec![(
                "get_weather".into(),
                r#"{"city": "Paris"}"#.into(),
                calls[0].2
            )]
        );
    }

    #[test]
    fn an_answer_in_text_is_no_call() {
        // The generic format's answer, even one that reads like a call inside its string.
        let text =
            r#"{"response": "use {\"tool_calls\": [{\"name\": \"x\", \"arguments\": {}}]}"}"#;
        assert!(stream(ToolFormat::Generic, text, 1).is_empty());
        assert!(stream(ToolFormat::Hermes, "The weather is fine.", 1).is_empty());
        assert!(stream(ToolFormat::Llama3, "It is sunny.", 1).is_empty());
        // Cut short: the head and the arguments so far went out; nothing closes them.
        let cut = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa"#;
        let calls = stream(ToolFormat::Generic, cut, 1);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, r#"{"city": "Pa"#);
    }
}
