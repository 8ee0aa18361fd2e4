//! [`TextStream`]: token ids in, client text out, with stop strings applied. This is what a
//! front end (the gateway, `ferrite generate`) runs per request.

use crate::{DecodeStream, StopMatcher, StopOutput, TextError, Tokenizer};

/// A [`DecodeStream`] feeding a [`StopMatcher`].
#[derive(Debug, Clone)]
pub struct TextStream {
    decoder: DecodeStream,
    stops: StopMatcher,
}

impl TextStream {
    /// Special tokens are skipped in the text, as clients expect.
    pub fn new(tokenizer: Tokenizer, stops: Vec<String>) -> Self {
        Self {
            decoder: DecodeStream::new(tokenizer, true),
            stops: StopMatcher::new(stops),
        }
    }

    /// Keeps the special tokens `ids` in the text ([`DecodeStream::keeping`]).
    pub fn keeping(mut self, ids: Vec<u32>) -> Self {
        self.decoder = self.decoder.keeping(ids);
        self
    }

    /// Feeds one token; returns the text now safe to send and whether a stop string matched
    /// (then the text ends before it and later input is ignored).
    pub fn push(&mut self, id: u32) -> Result<StopOutput, TextError> {
        let delta = self.decoder.step(id)?;
        Ok(self.stops.push(&delta))
    }

    /// End of the token stream: releases what the decoder and the stop matcher held back. A stop
    /// string can still match in that tail.
    pub fn finish(&mut self) -> Result<StopOutput, TextError> {
        let tail = self.decoder.flush()?;
        let mut out = self.stops.push(&tail);
        if out.stopped.is_none() {
            out.text.push_str(&self.stops.finish());
        }
        Ok(out)
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stops.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufVocab;

    fn byte_tokenizer() -> Tokenizer {
        Tokenizer::from_gguf_vocab(GgufVocab::byte_level()).expect("byte tokenizer")
    }

    fn run(text: &str, stops: &[&str]) -> (String, bool) {
        let mut s = TextStream::new(
            byte_tokenizer(),
            stops.iter().map(|s| (*s).to_owned()).collect(),
        );
        let mut out = String::new();
        for b in text.bytes() {
            let o = s.push(u32::from(b)).expect("push");
            out.push_str(&o.text);
            if o.stopped.is_some() {
                return (out, true);
            }
        }
        let o = s.finish().expect("finish");
        out.push_str(&o.text);
        (out, o.stopped.is_some())
    }

    #[test]
    fn text_passes_through_and_held_back_text_is_released_at_the_end() {
        assert_eq!(
            run("héllo wor", &["world"]),
            ("héllo wor".to_owned(), false)
        );
    }

    #[test]
    fn a_stop_string_across_tokens_ends_the_text_before_it() {
        assert_eq!(run("abc END xyz", &["END"]), ("abc ".to_owned(), true));
    }
}
