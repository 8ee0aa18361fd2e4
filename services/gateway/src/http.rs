//! OpenAI-compatible HTTP: `GET /v1/models`, `POST /v1/completions`,
//! `POST /v1/chat/completions`, streamed as server-sent events or not, errors in OpenAI's JSON
//! shape (`{"error": {"message", "type", "param", "code"}}`).

use std::convert::Infallible;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferrite_proto::v1 as api;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::stream::GenerateEvent;
use crate::validate::Prompt;
use crate::{Gateway, GatewayError, GenerateArgs, trace};

pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(ferrite_telemetry::metrics::metrics_handler))
        .with_state(gateway)
}

/// An error as OpenAI clients expect it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    code: &'static str,
    param: Option<&'static str>,
}

impl ApiError {
    fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code: "invalid_argument",
            param,
        }
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        let (status, kind) = match &e {
            GatewayError::ModelNotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error"),
            GatewayError::InvalidArgument(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            GatewayError::ResourceExhausted(_) => {
                (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error")
            }
            GatewayError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
            GatewayError::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "server_error"),
            GatewayError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        let param = matches!(e, GatewayError::ModelNotFound(_)).then_some("model");
        Self {
            status,
            message: e.to_string(),
            kind,
            code: e.kind(),
            param,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } });
        (self.status, Json(body)).into_response()
    }
}

fn bad_json(e: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("bad request body: {e}"), None)
}

/// Fields shared by both completion endpoints.
#[derive(Debug, Deserialize)]
struct CommonParams {
    model: String,
    #[serde(default)]
    stream: bool,
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
}

impl CommonParams {
    fn sampling(&self, logprobs: Option<u32>) -> Result<api::SamplingParams, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("only n = 1 is supported", Some("n")));
        }
        let stop = match &self.stop {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| ApiError::invalid("stop must be strings", Some("stop")))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(ApiError::invalid(
                    "stop must be a string or a list of strings",
                    Some("stop"),
                ));
            }
        };
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
            stop,
            stop_token_ids: Vec::new(),
            logprobs,
            ignore_eos: self.ignore_eos,
        })
    }
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: Value,
    logprobs: Option<u32>,
    #[serde(flatten)]
    common: CommonParams,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    common: CommonParams,
}

#[derive(Debug, Deserialize)]
struct ChatMessageIn {
    role: String,
    content: Value,
}

fn message_text(content: &Value) -> Result<String, ApiError> {
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

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_str(r: api::FinishReason) -> &'static str {
    match r {
        api::FinishReason::Length => "length",
        _ => "stop",
    }
}

async fn list_models(State(gw): State<Gateway>) -> Json<Value> {
    let created = unix_now();
    let data: Vec<Value> = gw
        .pools()
        .models()
        .into_iter()
        .map(|(name, max_len, _)| json!({ "id": name, "object": "model", "created": created, "owned_by": "ferrite", "max_model_len": max_len }))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

#[derive(Clone, Copy)]
enum Kind {
    Completion,
    Chat,
}

async fn completions(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Result<Json<CompletionRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let prompt = match &req.prompt {
        Value::String(s) => Prompt::Text(s.clone()),
        Value::Array(a) if a.iter().all(Value::is_u64) => Prompt::TokenIds(
            a.iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
        ),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Prompt::Text(a[0].as_str().unwrap_or_default().to_owned())
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt must be a string or a list of token ids",
                Some("prompt"),
            ));
        }
    };
    let sampling = req.common.sampling(req.logprobs)?;
    run(gw, &headers, Kind::Completion, req.common, prompt, sampling).await
}

async fn chat_completions(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Result<Json<ChatRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let messages = req
        .messages
        .iter()
        .map(|m| {
            Ok(ferrite_text::ChatMessage::new(
                m.role.clone(),
                message_text(&m.content)?,
            ))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let sampling = req.common.sampling(None)?;
    run(
        gw,
        &headers,
        Kind::Chat,
        req.common,
        Prompt::Chat(messages),
        sampling,
    )
    .await
}

async fn run(
    gw: Gateway,
    headers: &HeaderMap,
    kind: Kind,
    common: CommonParams,
    prompt: Prompt,
    sampling: api::SamplingParams,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let span = trace::request_span(&common.model, &prompt);
    ferrite_telemetry::propagation::set_parent_from_headers(&span, headers);
    let args = GenerateArgs {
        model: &common.model,
        prompt: &prompt,
        sampling: Some(sampling),
        deadline: None,
        started,
        api: trace::Api::Http,
    };
    let events = gw.generate(args, span).await?;
    let id = format!(
        "{}-{:x}",
        match kind {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        },
        started.elapsed().as_nanos() ^ u128::from(unix_now()) << 20
    );
    let created = unix_now();
    if common.stream {
        let stream = sse(events, kind, id, created, common.model);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut text = String::new();
    let mut finish = "stop";
    let mut usage = json!({});
    futures::pin_mut!(events);
    while let Some(ev) = events.next().await {
        match ev? {
            GenerateEvent::Delta { text: t, .. } => text.push_str(&t),
            GenerateEvent::Finish {
                reason,
                prompt_tokens,
                completion_tokens,
                ..
            } => {
                finish = finish_str(reason);
                usage = json!({ "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens });
            }
        }
    }
    let choice = match kind {
        Kind::Completion => {
            json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": finish })
        }
        Kind::Chat => {
            json!({ "index": 0, "message": { "role": "assistant", "content": text }, "logprobs": null, "finish_reason": finish })
        }
    };
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion",
    };
    Ok(Json(json!({ "id": id, "object": object, "created": created, "model": common.model, "choices": [choice], "usage": usage })).into_response())
}

fn sse(
    events: impl Stream<Item = Result<GenerateEvent, GatewayError>> + Send + 'static,
    kind: Kind,
    id: String,
    created: u64,
    model: String,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let mut first = true;
    let chunks = events.map(move |ev| {
        let body = match ev {
            Ok(GenerateEvent::Delta { text, .. }) => {
                let choice = match kind {
                    Kind::Completion => json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": null }),
                    Kind::Chat => {
                        let delta = if first { json!({ "role": "assistant", "content": text }) } else { json!({ "content": text }) };
                        json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": null })
                    }
                };
                first = false;
                json!({ "id": id, "object": object, "created": created, "model": model, "choices": [choice] })
            }
            Ok(GenerateEvent::Finish { reason, prompt_tokens, completion_tokens, .. }) => {
                let choice = match kind {
                    Kind::Completion => json!({ "index": 0, "text": "", "logprobs": null, "finish_reason": finish_str(reason) }),
                    Kind::Chat => json!({ "index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_str(reason) }),
                };
                json!({ "id": id, "object": object, "created": created, "model": model, "choices": [choice],
                        "usage": { "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens } })
            }
            // Headers are sent already: report the error in the stream, as OpenAI does.
            Err(e) => {
                let err = ApiError::from(e);
                json!({ "error": { "message": err.message, "type": err.kind, "param": err.param, "code": err.code } })
            }
        };
        Ok(Event::default().data(body.to_string()))
    });
    chunks.chain(futures::stream::once(async {
        Ok(Event::default().data("[DONE]"))
    }))
}
