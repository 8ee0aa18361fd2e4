//! OpenAI's embeddings endpoint, `POST /v1/embeddings`: each input's embedding from a pool of
//! its model (the worker pools the last token's final hidden state as the model says:
//! `GenerateRequest.embed`), as floats or base64 (little-endian f32, what the official clients
//! ask for by default), in the inputs' order, with the prompt tokens counted.
//!
//! An input is tokenized as a completion's prompt is (the tokenizer's special tokens added,
//! so Qwen3-Embedding's end-of-text token closes it), or given as token ids. Each input is a
//! request of its own to the gateway: routed (KV-aware: a repeated document finds its prefix),
//! rate-limited, traced (`embeddings {model}`) and retried on another pool before it answers.

use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use ferrite_proto::v1 as api;
use ferrite_telemetry::{OpenTelemetrySpanExt, genai};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::api_error::{ApiError, bad_json};
use crate::auth::Caller;
use crate::error::GatewayError;
use crate::openai::prompts_in;
use crate::trace::{Api, RequestTrace};
use crate::validate::{self, Prompt};
use crate::{Gateway, ModelText, route};

/// `gen_ai.operation.name` of an embeddings request.
const OP_EMBEDDINGS: &str = "embeddings";

/// An embeddings request, as OpenAI's API takes it (`user` is accepted and not used).
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u32>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
    /// vLLM's: cut each input to this many tokens (its special tokens kept), or with -1 to
    /// the most the model takes, rather than refuse a longer one.
    #[serde(default)]
    truncate_prompt_tokens: Option<i64>,
}

/// How the vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Float,
    Base64,
}

impl EmbeddingsRequest {
    fn encoding(&self) -> Result<Encoding, ApiError> {
        match self.encoding_format.as_deref() {
            None | Some("float") => Ok(Encoding::Float),
            Some("base64") => Ok(Encoding::Base64),
            Some(other) => Err(ApiError::invalid(
                format!("encoding_format `{other}`: it is `float` or `base64`"),
                Some("encoding_format"),
            )),
        }
    }

    /// `truncate_prompt_tokens` as [`EmbedArgs::truncate`] takes it.
    fn truncate(&self) -> Result<Option<usize>, ApiError> {
        match self.truncate_prompt_tokens {
            None => Ok(None),
            Some(-1) => Ok(Some(usize::MAX)),
            Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            Some(n) => Err(ApiError::invalid(
                format!("truncate_prompt_tokens {n}: it is at least 1, or -1 (the model's most)"),
                Some("truncate_prompt_tokens"),
            )),
        }
    }

    /// `dimensions`, as the worker takes it (0: all).
    fn dimensions(&self) -> Result<u32, ApiError> {
        match self.dimensions {
            Some(0) => Err(ApiError::invalid(
                "dimensions must be at least 1",
                Some("dimensions"),
            )),
            d => Ok(d.unwrap_or(0)),
        }
    }
}

/// `POST /v1/embeddings`.
pub async fn create(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<EmbeddingsRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let Json(req) = body.map_err(bad_json)?;
    let (encoding, dimensions, truncate) = (req.encoding()?, req.dimensions()?, req.truncate()?);
    let inputs = inputs_of(&req.input)?;
    let caller = caller.map(|Extension(c)| c).unwrap_or_default();
    let asked = inputs.iter().map(|input| {
        let span = embeddings_span(&req.model);
        ferrite_telemetry::propagation::set_parent_from_headers(&span, &headers);
        let args = EmbedArgs {
            model: &req.model,
            input,
            dimensions,
            classify: false,
            truncate,
            caller,
            started,
            api: Api::Http,
        };
        gw.embed(args, span)
    });
    let embedded = futures::future::try_join_all(asked).await?;
    let prompt_tokens: usize = embedded.iter().map(|(_, n)| n).sum();
    let data: Vec<Value> = (embedded.iter().enumerate())
        .map(|(index, (vector, _))| {
            json!({"object": "embedding", "index": index, "embedding": encode(vector, encoding)})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": req.model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }))
    .into_response())
}

/// The inputs of `input` (as a completion's prompts), none of them empty (OpenAI refuses an
/// empty input too).
fn inputs_of(input: &Value) -> Result<Vec<Prompt>, ApiError> {
    let inputs = prompts_in(input, "input")?;
    match first_empty(&inputs) {
        Some(i) => Err(ApiError::invalid(
            format!("input {i} is empty"),
            Some("input"),
        )),
        None => Ok(inputs),
    }
}

/// The first of `inputs` that is empty, if one is.
pub(crate) fn first_empty(inputs: &[Prompt]) -> Option<usize> {
    inputs.iter().position(|p| match p {
        Prompt::Text(t) => t.is_empty(),
        Prompt::TokenIds(ids) => ids.is_empty(),
        Prompt::Chat(c) => c.messages.is_empty(),
    })
}

/// `vector` as the response carries it: a list of numbers, or its little-endian f32 bytes in
/// base64.
fn encode(vector: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(vector),
        Encoding::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// An embeddings request's span; set its parent (the client's context) before using it.
pub(crate) fn embeddings_span(model: &str) -> tracing::Span {
    request_span(OP_EMBEDDINGS, model)
}

/// The span of one input of a pooling request (`op`: embeddings, rerank, score, classify).
pub(crate) fn request_span(op: &str, model: &str) -> tracing::Span {
    let span = tracing::info_span!("gen_ai.request",
        otel.name = %format!("{op} {model}"), otel.kind = "server",
        otel.status_code = tracing::field::Empty);
    span.set_attribute(genai::OPERATION_NAME, op.to_owned());
    span.set_attribute(genai::PROVIDER_NAME, genai::PROVIDER);
    span.set_attribute(genai::REQUEST_MODEL, model.to_owned());
    span
}

/// One input of an embeddings request, as [`Gateway::embed`] takes it.
#[derive(Debug)]
pub struct EmbedArgs<'a> {
    pub model: &'a str,
    pub input: &'a Prompt,
    /// Keep the first this many values (0: all).
    pub dimensions: u32,
    /// A sequence classifier's logits instead (`crate::classify`).
    pub classify: bool,
    /// Cut the input to at most this many tokens (the model's most, if fewer), its special
    /// tokens kept, instead of refusing a longer one; `None`: refuse.
    pub truncate: Option<usize>,
    pub caller: Caller,
    /// When the request arrived.
    pub started: Instant,
    pub api: Api,
}

impl Gateway {
    /// The embedding of one input, and its prompt tokens: validated as a one-token
    /// completion of it would be, routed, answered by the pool in one message. `span` is the
    /// request's ([`embeddings_span`]).
    pub async fn embed(
        &self,
        args: EmbedArgs<'_>,
        span: tracing::Span,
    ) -> Result<(Vec<f32>, usize), GatewayError> {
        let mut trace = RequestTrace::new(span.clone(), args.model, args.api, args.started);
        let answered = async {
            self.limiter.check_requests(args.caller, Instant::now())?;
            let (text, context) = self.model_text(args.model).await?;
            let input = args.input.clone();
            let one_token = api::SamplingParams {
                max_tokens: Some(1),
                temperature: Some(0.0),
                ..api::SamplingParams::default()
            };
            let truncate = args.truncate;
            let validated = tokio::task::spawn_blocking(move || {
                let input = match truncate {
                    Some(n) => truncated(&text, input, n.min(context - 1))?,
                    None => input,
                };
                validate::validate(text, context, &input, Some(one_token), None, None)
            })
            .await
            .map_err(|e| GatewayError::Internal(format!("the tokenizing thread: {e}")))??
            .embedding(args.dimensions, args.classify);
            trace.validated(&validated);
            let prompt_tokens = validated.prompt_ids().len();
            self.limiter
                .admit(args.caller, prompt_tokens, Instant::now())?;
            let routes = (self.routing, self.limits);
            let up = route::open(&self.pools, &validated, None, routes, None).await?;
            if up.first.embedding.is_empty() {
                return Err(GatewayError::Internal(format!(
                    "pool {} answered an embeddings request without one",
                    up.pool
                )));
            }
            Ok((up.first.embedding, prompt_tokens))
        }
        .instrument(span)
        .await;
        match &answered {
            Ok(_) => trace.finished("stop", 0),
            Err(e) => trace.failed(e),
        }
        answered
    }
}

/// `input` as at most `max` tokens: a text tokenized (as a prompt is) and cut at its end, its
/// special tokens kept; token ids cut at their end.
fn truncated(text: &ModelText, input: Prompt, max: usize) -> Result<Prompt, GatewayError> {
    let bad = |e: ferrite_text::TextError| GatewayError::InvalidArgument(e.to_string());
    let mut ids = match input {
        Prompt::Text(t) if text.add_special_tokens => {
            return Ok(Prompt::TokenIds(
                text.tokenizer.encode_at_most(&t, max).map_err(bad)?,
            ));
        }
        Prompt::Text(t) => text.encode_text(&t, None).map_err(bad)?,
        Prompt::TokenIds(ids) => ids,
        chat => return Ok(chat),
    };
    ids.truncate(max);
    Ok(Prompt::TokenIds(ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(extra: Value) -> EmbeddingsRequest {
        let mut v = json!({"model": "m", "input": "hi"});
        for (k, x) in extra.as_object().expect("object") {
            v[k] = x.clone();
        }
        serde_json::from_value(v).expect("request")
    }

    #[test]
    fn truncate_prompt_tokens_is_a_count_or_the_models_most() {
        let t = |v: Value| request(json!({"truncate_prompt_tokens": v})).truncate();
        assert_eq!(request(json!({})).truncate().expect("unset"), None);
        assert_eq!(t(json!(8)).expect("8"), Some(8));
        assert_eq!(t(json!(-1)).expect("-1"), Some(usize::MAX));
        for bad in [json!(0), json!(-2)] {
            let e = t(bad).expect_err("refused");
            assert_eq!(e.param, Some("truncate_prompt_tokens"));
        }
    }

    #[test]
    fn empty_inputs_are_refused_naming_input() {
        for bad in [json!(""), json!([]), json!(["a", ""]), json!([[1], []])] {
            let e = inputs_of(&bad).expect_err("empty");
            assert_eq!(e.param, Some("input"), "{bad}");
        }
        assert_eq!(
            inputs_of(&json!(["a", [1, 2]])).map(|v| v.len()).ok(),
            Some(2)
        );
    }

    #[test]
    fn encodings_and_dimensions() {
        assert_eq!(request(json!({})).encoding().ok(), Some(Encoding::Float));
        let b64 = request(json!({"encoding_format": "base64"}));
        assert_eq!(b64.encoding().ok(), Some(Encoding::Base64));
        let bad = request(json!({"encoding_format": "int8"})).encoding();
        assert_eq!(bad.err().and_then(|e| e.param), Some("encoding_format"));
        assert_eq!(request(json!({"dimensions": 8})).dimensions().ok(), Some(8));
        assert_eq!(request(json!({})).dimensions().ok(), Some(0));
        let zero = request(json!({"dimensions": 0})).dimensions();
        assert_eq!(zero.err().and_then(|e| e.param), Some("dimensions"));
    }

    /// Base64 is the vector's little-endian f32 bytes, as numpy's `frombuffer` reads them.
    #[test]
    fn base64_is_little_endian_f32() {
        let v = [1.0f32, -0.5, 3.25];
        let Value::String(s) = encode(&v, Encoding::Base64) else {
            panic!("not a string")
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .expect("base64");
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(back, v);
        assert_eq!(encode(&v, Encoding::Float), json!([1.0, -0.5, 3.25]));
    }
}
