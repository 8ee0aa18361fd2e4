//! Incremental detokenization.
//!
//! Decoding one token at a time is wrong in two ways: a token may end in the
//! middle of a UTF-8 character (byte-level BPE, or SentencePiece `<0xNN>`
//! byte fallback), and SentencePiece decoders strip the leading space of the
//! *whole* output, so `decode([▁world])` is "world" while the same token
//! after "Hello" contributes " world". Like TGI and vLLM we therefore decode a
//! short window of already-emitted tokens plus the new ones and emit the text
//! the new ones added; while the result ends in U+FFFD (an incomplete
//! character) we emit nothing and wait for more tokens.

use crate::{TextError, Tokenizer};

/// Turns a stream of token ids into text deltas. Concatenating every delta
/// (plus [`DecodeStream::flush`]) gives `tokenizer.decode(all_ids, skip)`.
#[derive(Debug, Clone)]
pub struct DecodeStream {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// Special tokens kept in the text all the same ([`Self::keeping`]).
    keep: Vec<u32>,
    /// The decode window: the tokens of the last emission (context) followed
    /// by tokens not emitted yet. Older tokens are dropped, which keeps each
    /// step O(window) instead of O(sequence).
    window: Vec<u32>,
    /// `window[..read_offset]` is context that has already been emitted.
    read_offset: usize,
    /// `decode(window[..read_offset])`.
    prefix_text: String,
}

impl DecodeStream {
    /// A fresh stream; `skip_special_tokens` as in [`Tokenizer::decode`].
    pub fn new(tokenizer: Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            keep: Vec::new(),
            window: Vec::new(),
            read_offset: 0,
            prefix_text: String::new(),
        }
    }

    /// Keeps the special tokens `ids` in the text where special tokens are skipped: a tool
    /// format's markers, such as Mistral's `[TOOL_CALLS]`, which its tokenizer marks special
    /// but which say where the calls are. The other special tokens are dropped as they come,
    /// so the window decodes without skipping.
    pub fn keeping(mut self, ids: Vec<u32>) -> Self {
        self.keep = ids;
        self
    }

    /// Feeds one token; returns the text it completes (possibly empty, when
    /// the token ends mid-character or decodes to nothing).
    pub fn step(&mut self, id: u32) -> Result<String, TextError> {
        if self.filters() && !self.keep.contains(&id) && self.tokenizer.is_special(id) {
            return Ok(String::new());
        }
        self.window.push(id);
        let text = self.decode_window()?;
        if text.len() <= self.prefix_text.len() || text.ends_with('\u{FFFD}') {
            // Nothing new yet, or the new tokens end inside a character.
            return Ok(String::new());
        }
        let delta = new_suffix(&self.prefix_text, &text);
        self.advance()?;
        Ok(delta)
    }

    /// Feeds several tokens and returns their combined delta.
    pub fn step_many(&mut self, ids: &[u32]) -> Result<String, TextError> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.step(id)?);
        }
        Ok(out)
    }

    /// Emits whatever is still held back (an incomplete character becomes
    /// U+FFFD, as in a full decode). Call once the sequence has ended.
    pub fn flush(&mut self) -> Result<String, TextError> {
        if self.window.len() == self.read_offset {
            return Ok(String::new());
        }
        let text = self.decode_window()?;
        let delta = if text.len() > self.prefix_text.len() {
            new_suffix(&self.prefix_text, &text)
        } else {
            String::new()
        };
        self.advance()?;
        Ok(delta)
    }

    /// Whether special tokens are skipped as they come (some are kept), not by the decoder.
    fn filters(&self) -> bool {
        self.skip_special_tokens && !self.keep.is_empty()
    }

    fn decode_window(&self) -> Result<String, TextError> {
        let skip = self.skip_special_tokens && !self.filters();
        self.tokenizer.decode(&self.window, skip)
    }

    /// Everything in the window is now emitted: the tokens just emitted
    /// become the context for the next step.
    fn advance(&mut self) -> Result<(), TextError> {
        self.window.drain(..self.read_offset);
        self.read_offset = self.window.len();
        // Decoded on its own rather than sliced out of the full text: a
        // SentencePiece window that starts with "▁x" decodes to "x", and the
        // next comparison must be against exactly that.
        self.prefix_text = self.decode_window()?;
        Ok(())
    }
}

/// The part of `text` after `prefix`. Decoders normally extend the prefix
/// unchanged; if one rewrote it (e.g. space clean-up), fall back to the text
/// after the longest common prefix rather than slicing mid-character.
fn new_suffix(prefix: &str, text: &str) -> String {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest.to_string();
    }
    let common = prefix
        .char_indices()
        .zip(text.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prefix.len().min(text.len()), |((i, _), _)| i);
    text.get(common..).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::new_suffix;

    #[test]
    fn suffix_handles_rewritten_prefix() {
        assert_eq!(new_suffix("Hello", "Hello world"), " world");
        assert_eq!(new_suffix("", "abc"), "abc");
        assert_eq!(new_suffix("héllo", "hallo there"), "allo there");
    }
}
