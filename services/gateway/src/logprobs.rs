//! Log-probabilities in OpenAI's shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}` and the legacy completions' `{tokens, token_logprobs, top_logprobs,
//! text_offset}`, for a whole response or one streamed chunk at a time.

use ferrite_proto::v1 as api;
use serde_json::{Map, Value, json};

/// Renders the logprobs of a response's tokens, chunk after chunk (completions' text offsets
/// run on across chunks).
#[derive(Debug)]
pub struct LogprobsWriter {
    chat: bool,
    /// Characters of the completion before the next token.
    offset: usize,
}

impl LogprobsWriter {
    pub fn new(chat: bool) -> Self {
        Self { chat, offset: 0 }
    }

    /// The `logprobs` value of a choice holding `tokens`.
    pub fn render(&mut self, tokens: &[api::TokenLogprob]) -> Value {
        self.render_after(None, tokens)
    }

    /// [`Self::render`], after an echoed prompt's first token `first` (completions only),
    /// which has no logprob: its `token_logprobs` and `top_logprobs` are null.
    pub fn render_after(&mut self, first: Option<&str>, tokens: &[api::TokenLogprob]) -> Value {
        if self.chat {
            let content: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let top: Vec<Value> = t
                        .top
                        .iter()
                        .map(
                            |x| json!({ "token": x.token, "logprob": x.logprob, "bytes": x.bytes }),
                        )
                        .collect();
                    json!({ "token": t.token, "logprob": t.logprob, "bytes": t.bytes,
                        "top_logprobs": top })
                })
                .collect();
            return json!({ "content": content, "refusal": null });
        }
        let (mut texts, mut logprobs, mut top, mut offsets) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        if let Some(first) = first {
            offsets.push(self.offset);
            self.offset += first.chars().count();
            texts.push(first);
            logprobs.push(Value::Null);
            top.push(Value::Null);
        }
        for t in tokens {
            offsets.push(self.offset);
            self.offset += t.token.chars().count();
            texts.push(&t.token);
            logprobs.push(json!(t.logprob));
            let alternatives: Map<String, Value> = (t.top.iter())
                .map(|x| (x.token.clone(), json!(x.logprob)))
                .collect();
            top.push(Value::Object(alternatives));
        }
        json!({
            "tokens": texts,
            "token_logprobs": logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str, logprob: f32, top: &[(&str, f32)]) -> api::TokenLogprob {
        api::TokenLogprob {
            token_id: 0,
            logprob,
            top: top
                .iter()
                .map(|(t, l)| api::TopLogprob {
                    token_id: 0,
                    logprob: *l,
                    token: (*t).into(),
                    bytes: t.as_bytes().to_vec(),
                })
                .collect(),
            token: text.into(),
            bytes: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn chat_and_completions_shapes() {
        let tokens = [
            token("Pa", -0.5, &[("Pa", -0.5), ("Lo", -1.5)]),
            token("ris", -0.25, &[]),
        ];
        let chat = LogprobsWriter::new(true).render(&tokens);
        assert_eq!(chat["content"][0]["token"], "Pa");
        assert_eq!(chat["content"][0]["bytes"], json!([80, 97]));
        assert_eq!(chat["content"][0]["top_logprobs"][1]["token"], "Lo");
        assert_eq!(chat["content"][1]["logprob"], -0.25);
        // Completions: offsets run on from one chunk to the next.
        let mut w = LogprobsWriter::new(false);
        let first = w.render(&tokens);
        assert_eq!(first["tokens"], json!(["Pa", "ris"]));
        assert_eq!(first["text_offset"], json!([0, 2]));
        assert_eq!(first["top_logprobs"][0], json!({ "Pa": -0.5, "Lo": -1.5 }));
        let next = w.render(&tokens[..1]);
        assert_eq!(next["text_offset"], json!([5]));
        // An echoed prompt's first token has no logprob; the offsets count it.
        let echoed = LogprobsWriter::new(false).render_after(Some("The"), &tokens);
        assert_eq!(echoed["tokens"], json!(["The", "Pa", "ris"]));
        assert_eq!(echoed["token_logprobs"], json!([null, -0.5, -0.25]));
        assert_eq!(echoed["top_logprobs"][0], Value::Null);
        assert_eq!(echoed["top_logprobs"][2], json!({}));
        assert_eq!(echoed["text_offset"], json!([0, 3, 5]));
    }
}
