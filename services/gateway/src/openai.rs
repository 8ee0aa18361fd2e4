//! The OpenAI request bodies: what ferrite reads from them, and a clear refusal (400, naming the
//! field) of every field it would otherwise ignore while the client counts on it: tools,
//! structured output, logit bias, logprobs over HTTP, several choices.

use ferrite_proto::v1 as api;
use serde::Deserialize;
use serde_json::Value;

use crate::http::ApiError;
use crate::validate::Prompt;

/// Fields shared by both completion endpoints.
#[derive(Debug, Deserialize)]
pub struct CommonParams {
    pub model: String,
    #[serde(default)]
    pub stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stop: Option<Value>,
    #[serde(default)]
    ignore_eos: bool,
    n: Option<u32>,
    logit_bias: Option<Value>,
    /// Chat: a bool; completions: a count. Either way not served over HTTP yet.
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    functions: Option<Value>,
    function_call: Option<Value>,
    response_format: Option<Value>,
    echo: Option<bool>,
    suffix: Option<Value>,
    best_of: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    pub content: Value,
}

/// Whether a field that may be sent as its "off" value is set to something else.
fn set(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

impl CommonParams {
    /// Whether the stream ends with a usage chunk (`stream_options.include_usage`).
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// Refuses every field that ferrite does not serve, rather than ignoring it.
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let unsupported = |param: &'static str, what: &str| {
            Err(ApiError::invalid(
                format!("`{param}` is not supported: {what}"),
                Some(param),
            ))
        };
        if self.n.is_some_and(|n| n != 1) {
            return unsupported("n", "one choice per request (n = 1)");
        }
        if self.best_of.is_some_and(|n| n != 1) {
            return unsupported("best_of", "one candidate per request");
        }
        let tools = [
            ("tools", &self.tools),
            ("tool_choice", &self.tool_choice),
            ("functions", &self.functions),
            ("function_call", &self.function_call),
        ];
        for (param, v) in tools {
            // "none" and "auto" without tools mean no tool call: harmless.
            let off = matches!(v.as_ref().and_then(Value::as_str), Some("none" | "auto"));
            if set(v) && !off {
                return unsupported(param, "ferrite does not call tools yet");
            }
        }
        let format = self.response_format.as_ref().filter(|v| !v.is_null());
        if format.is_some_and(|f| f.get("type").and_then(Value::as_str) != Some("text")) {
            return unsupported(
                "response_format",
                "only {\"type\": \"text\"}; structured output is not served yet",
            );
        }
        if set(&self.logit_bias) {
            return unsupported("logit_bias", "no logit bias");
        }
        if set(&self.logprobs) || set(&self.top_logprobs) {
            return unsupported(
                "logprobs",
                "the HTTP API does not return logprobs yet; ferrite.v1.Inference/Generate does",
            );
        }
        if self.echo == Some(true) {
            return unsupported("echo", "the prompt is not echoed");
        }
        if set(&self.suffix) {
            return unsupported("suffix", "no insertion after a suffix");
        }
        Ok(())
    }

    /// The sampling parameters of the request, after refusing what is not served. Ranges are
    /// checked by validation, as for gRPC requests.
    pub fn sampling(&self) -> Result<api::SamplingParams, ApiError> {
        self.refuse_unsupported()?;
        Ok(api::SamplingParams {
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            stop: stop_strings(&self.stop)?,
            stop_token_ids: Vec::new(),
            logprobs: None,
            ignore_eos: self.ignore_eos,
        })
    }
}

fn stop_strings(stop: &Option<Value>) -> Result<Vec<String>, ApiError> {
    match stop {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ApiError::invalid("stop must be strings", Some("stop")))
            })
            .collect(),
        Some(_) => Err(ApiError::invalid(
            "stop must be a string or a list of strings",
            Some("stop"),
        )),
    }
}

/// A completion's `prompt`: a string, a list of one string, or a list of token ids (each a
/// 32-bit id: a larger number is refused, not truncated).
pub fn completion_prompt(prompt: &Value) -> Result<Prompt, ApiError> {
    let shape = || {
        ApiError::invalid(
            "prompt must be a string, a list of one string or a list of token ids",
            Some("prompt"),
        )
    };
    match prompt {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_owned()))
        }
        Value::Array(a) => a
            .iter()
            .map(|v| {
                let n = v.as_u64().ok_or_else(shape)?;
                u32::try_from(n).map_err(|_| {
                    ApiError::invalid(
                        format!("token id {n} is not a 32-bit token id"),
                        Some("prompt"),
                    )
                })
            })
            .collect::<Result<_, _>>()
            .map(Prompt::TokenIds),
        _ => Err(shape()),
    }
}

/// A chat message's `content`: a string, or the content-parts form with text parts only.
pub fn message_text(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        // The content-parts form: concatenate the text parts.
        Value::Array(parts) => parts
            .iter()
            .map(|p| {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => Ok(t.to_owned()),
                    _ => Err(ApiError::invalid(
                        "only text content parts are supported",
                        Some("messages"),
                    )),
                }
            })
            .collect(),
        _ => Err(ApiError::invalid(
            "message content must be a string or a list of parts",
            Some("messages"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(p: Prompt) -> Vec<u32> {
        match p {
            Prompt::TokenIds(ids) => ids,
            other => panic!("not ids: {other:?}"),
        }
    }

    #[test]
    fn prompts_of_every_shape() {
        let text = completion_prompt(&json!("hi")).expect("text");
        assert!(matches!(text, Prompt::Text(t) if t == "hi"));
        let one = completion_prompt(&json!(["hi"])).expect("one string");
        assert!(matches!(one, Prompt::Text(t) if t == "hi"));
        let max = u64::from(u32::MAX);
        assert_eq!(
            ids(completion_prompt(&json!([1, 2, max])).expect("ids")),
            [1, 2, u32::MAX]
        );
        for bad in [json!(3), json!(["a", "b"]), json!([1, -2]), json!([1.5])] {
            let e = completion_prompt(&bad).expect_err("bad shape");
            assert_eq!(e.param(), Some("prompt"), "{bad}");
        }
    }

    #[test]
    fn a_token_id_past_32_bits_is_refused_not_truncated() {
        // 4294967301 = 2^32 + 5: truncation would run token 5.
        let e = completion_prompt(&json!([4_294_967_301u64])).expect_err("too large");
        assert!(e.message().contains("4294967301"), "{}", e.message());
    }

    fn params(extra: Value) -> CommonParams {
        let mut body = json!({ "model": "m" });
        if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(x.clone());
        }
        serde_json::from_value(body).expect("params")
    }

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        let cases = [
            (json!({ "n": 2 }), "n"),
            (json!({ "best_of": 3 }), "best_of"),
            (json!({ "tools": [{ "type": "function" }] }), "tools"),
            (json!({ "tool_choice": "required" }), "tool_choice"),
            (json!({ "function_call": { "name": "f" } }), "function_call"),
            (json!({ "functions": [{}] }), "functions"),
            (
                json!({ "response_format": { "type": "json_object" } }),
                "response_format",
            ),
            (json!({ "logit_bias": { "50256": -100 } }), "logit_bias"),
            (json!({ "logprobs": true }), "logprobs"),
            (json!({ "logprobs": 2 }), "logprobs"),
            (json!({ "top_logprobs": 3 }), "logprobs"),
            (json!({ "echo": true }), "echo"),
            (json!({ "suffix": "x" }), "suffix"),
        ];
        for (extra, param) in cases {
            let e = params(extra.clone()).sampling().expect_err("refused");
            assert_eq!(e.param(), Some(param), "{extra}");
            assert!(e.message().contains("not supported"), "{}", e.message());
        }
    }

    #[test]
    fn off_values_of_unsupported_fields_are_accepted() {
        let off = json!({ "n": 1, "tools": [], "tool_choice": "none", "logit_bias": {},
            "logprobs": false, "response_format": { "type": "text" }, "echo": false,
            "stream_options": { "include_usage": true } });
        let p = params(off);
        assert!(p.include_usage());
        let s = p.sampling().expect("accepted");
        assert_eq!(s.logprobs, None);
        assert!(!params(json!({})).include_usage());
    }

    #[test]
    fn stop_is_a_string_or_strings() {
        let s = params(json!({ "stop": ["a", "b"] }))
            .sampling()
            .expect("ok");
        assert_eq!(s.stop, ["a", "b"]);
        let s = params(json!({ "stop": "x" })).sampling().expect("ok");
        assert_eq!(s.stop, ["x"]);
        let e = params(json!({ "stop": [1] })).sampling().expect_err("bad");
        assert_eq!(e.param(), Some("stop"));
    }

    #[test]
    fn content_parts_must_be_text() {
        let parts = json!([{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }]);
        assert_eq!(message_text(&parts).expect("text"), "ab");
        let image = json!([{ "type": "image_url", "image_url": { "url": "x" } }]);
        assert!(message_text(&image).is_err());
    }
}
