//! OpenAI-compatible HTTP: `GET /v1/models`, `POST /v1/completions`,
//! `POST /v1/chat/completions`, streamed as server-sent events or not, errors in OpenAI's JSON
//! shape (`{"error": {"message", "type", "param", "code"}}`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use ferrite_proto::v1 as api;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::api_error::ApiError;
use crate::auth::Caller;
use crate::logprobs::LogprobsWriter;
use crate::openai::{
    ChatRequest, CommonParams, CompletionRequest, chat_message, completion_prompt,
};
use crate::stream::{CallDelta, GenerateEvent};
use crate::tools::ToolCall;
use crate::validate::Prompt;
use crate::{Gateway, GatewayError, GenerateArgs, trace};

pub fn router(gateway: Gateway) -> Router {
    let api = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route_layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            require_key,
        ));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(ferrite_telemetry::metrics::metrics_handler))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(gateway)
}

/// 200 once placement has answered; 503 before (the gateway cannot route yet).
async fn health(State(gw): State<Gateway>) -> (StatusCode, &'static str) {
    if gw.pools().is_synced() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for placement (etcd) to answer",
        )
    }
}

/// Lets the request through if it bears one of the gateway's API keys; else a 401 in
/// OpenAI's shape (`invalid_api_key`).
async fn require_key(
    State(gw): State<Gateway>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let auth = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match gw.api_keys().check(auth) {
        Ok(caller) => {
            let mut request = request;
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(denied) => ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: denied.message().into(),
            kind: "invalid_request_error",
            code: "invalid_api_key",
            param: None,
            retry_after_s: None,
        }
        .into_response(),
    }
}

/// The largest request body accepted (a 413 past it).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// A body that did not parse: 400 for bad or mistyped JSON (as OpenAI answers; axum would say
/// 422 for the latter), 413 past [`MAX_BODY_BYTES`], 415 without a JSON content type.
fn bad_json(e: axum::extract::rejection::JsonRejection) -> ApiError {
    let mut err = ApiError::invalid(format!("bad request body: {}", e.body_text()), None);
    if matches!(
        e.status(),
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE
    ) {
        err.status = e.status();
    }
    err
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_str(r: api::FinishReason) -> &'static str {
    match r {
        api::FinishReason::Length => "length",
        api::FinishReason::ToolCalls => "tool_calls",
        _ => "stop",
    }
}

/// A message's `tool_calls`, as OpenAI writes them.
fn tool_calls_json(calls: &[ToolCall]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({ "id": c.id, "type": "function",
                "function": { "name": c.name, "arguments": c.arguments } })
        })
        .collect();
    Value::Array(calls)
}

async fn list_models(State(gw): State<Gateway>) -> Json<Value> {
    let created = unix_now();
    let mut data = Vec::new();
    for (name, max_len, _) in gw.pools().models() {
        let defaults = gw.sampling_defaults(&name).await.map(|d| defaults_json(&d));
        data.push(
            json!({ "id": name, "object": "model", "created": created, "owned_by": "ferrite",
            "max_model_len": max_len, "sampling_defaults": defaults }),
        );
    }
    Json(json!({ "object": "list", "data": data }))
}

/// A model's sampling defaults as `/v1/models` shows them: the fields it recommends, and
/// where they come from.
fn defaults_json(d: &api::SamplingDefaults) -> Value {
    let mut out: serde_json::Map<String, Value> = ferrite_proto::sampling::recommended_fields(d)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), json!(v)))
        .collect();
    out.insert("source".into(), json!(d.source));
    Value::Object(out)
}

#[derive(Clone, Copy)]
enum Kind {
    Completion,
    Chat,
}

async fn completions(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<CompletionRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let prompt = completion_prompt(&req.prompt)?;
    let caller = caller.map(|Extension(c)| c).unwrap_or_default();
    run(gw, &headers, caller, Kind::Completion, (req.common, prompt)).await
}

async fn chat_completions(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<ChatRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let messages = req
        .messages
        .iter()
        .map(chat_message)
        .collect::<Result<Vec<_>, ApiError>>()?;
    let caller = caller.map(|Extension(c)| c).unwrap_or_default();
    let request = (req.common, Prompt::Chat(messages));
    run(gw, &headers, caller, Kind::Chat, request).await
}

async fn run(
    gw: Gateway,
    headers: &HeaderMap,
    caller: Caller,
    kind: Kind,
    (common, prompt): (CommonParams, Prompt),
) -> Result<Response, ApiError> {
    let sampling = common.sampling()?;
    let constraint = common.constraint()?;
    let tools = common.tools()?.map(Arc::new);
    if tools.is_some() && matches!(kind, Kind::Completion) {
        return Err(ApiError::invalid(
            "`tools` are for /v1/chat/completions",
            Some("tools"),
        ));
    }
    let logprobs = sampling
        .logprobs
        .is_some()
        .then(|| LogprobsWriter::new(matches!(kind, Kind::Chat)));
    let started = Instant::now();
    let span = trace::request_span(&common.model, &prompt);
    ferrite_telemetry::propagation::set_parent_from_headers(&span, headers);
    let args = GenerateArgs {
        model: &common.model,
        prompt: &prompt,
        sampling: Some(sampling),
        constraint,
        tools,
        deadline: None,
        started,
        api: trace::Api::Http,
        caller,
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
        let writer = ChunkWriter {
            kind,
            id,
            created,
            include_usage: common.include_usage(),
            model: common.model,
            first: true,
            logprobs,
        };
        let stream = sse(events, writer);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut text = String::new();
    let mut finish = "stop";
    let mut usage = json!({});
    let mut token_logprobs = Vec::new();
    let mut calls = Vec::new();
    futures::pin_mut!(events);
    while let Some(ev) = events.next().await {
        match ev? {
            GenerateEvent::Delta {
                text: t, logprobs, ..
            } => {
                text.push_str(&t);
                token_logprobs.extend(logprobs);
            }
            GenerateEvent::Finish {
                reason,
                tool_calls,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
                ..
            } => {
                finish = finish_str(reason);
                usage = self::usage(prompt_tokens, cached_tokens, completion_tokens);
                calls = tool_calls;
            }
        }
    }
    let logprobs = logprobs.map_or(Value::Null, |mut w| w.render(&token_logprobs));
    let choice = match kind {
        Kind::Completion => {
            json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish })
        }
        Kind::Chat => {
            let mut message = json!({ "role": "assistant", "content": text });
            if !calls.is_empty() {
                message["tool_calls"] = tool_calls_json(&calls);
                if text.is_empty() {
                    message["content"] = Value::Null;
                }
            }
            json!({ "index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish })
        }
    };
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion",
    };
    Ok(Json(json!({ "id": id, "object": object, "created": created, "model": common.model, "choices": [choice], "usage": usage })).into_response())
}

/// Turns a completion's events into OpenAI stream chunks.
struct ChunkWriter {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    /// `stream_options.include_usage`: every chunk carries `"usage": null`, and a last chunk
    /// with no choices carries the usage; without it no chunk has a usage field.
    include_usage: bool,
    first: bool,
    /// Set when the request asked for logprobs.
    logprobs: Option<LogprobsWriter>,
}

impl ChunkWriter {
    fn chunk(&self, choices: Value) -> Value {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        let mut c = json!({ "id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// The chunk of a delta's text (and its logprobs).
    fn text_chunk(&mut self, text: String, logprobs: &[api::TokenLogprob]) -> Value {
        let logprobs = self
            .logprobs
            .as_mut()
            .map_or(Value::Null, |w| w.render(logprobs));
        let choice = match self.kind {
            Kind::Completion => {
                json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": null })
            }
            Kind::Chat => {
                let delta = if self.first {
                    json!({ "role": "assistant", "content": text })
                } else {
                    json!({ "content": text })
                };
                json!({ "index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": null })
            }
        };
        self.first = false;
        self.chunk(json!([choice]))
    }

    /// The chunks of pieces of a chat's tool calls, in order: each call's id, type and name
    /// first, then its arguments' text.
    fn call_chunks(&mut self, pieces: &[CallDelta]) -> Vec<Value> {
        let mut out = Vec::new();
        for p in pieces {
            let call = match &p.head {
                Some((id, name)) => json!({ "index": p.index, "id": id, "type": "function",
                    "function": { "name": name, "arguments": p.arguments } }),
                None => json!({ "index": p.index, "function": { "arguments": p.arguments } }),
            };
            let mut delta = json!({ "tool_calls": [call] });
            if std::mem::take(&mut self.first) {
                delta["role"] = json!("assistant");
            }
            let choice =
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": null });
            out.push(self.chunk(json!([choice])));
        }
        out
    }

    /// The calls found when the text ended that were not streamed as it was written: each
    /// one's head, then its arguments whole.
    fn unstreamed(calls: &[ToolCall], streamed: usize) -> Vec<CallDelta> {
        let rest = calls.iter().enumerate().skip(streamed);
        rest.flat_map(|(index, c)| {
            [
                CallDelta {
                    index,
                    head: Some((c.id.clone(), c.name.clone())),
                    arguments: String::new(),
                },
                CallDelta {
                    index,
                    head: None,
                    arguments: c.arguments.clone(),
                },
            ]
        })
        .collect()
    }

    /// The chunks of one event, in order.
    fn on_event(&mut self, ev: Result<GenerateEvent, GatewayError>) -> Vec<Value> {
        match ev {
            Ok(GenerateEvent::Delta {
                text,
                logprobs,
                calls,
                ..
            }) => {
                // A tool request's deltas carry no text until its end (where any content
                // comes before the last pieces of calls).
                let mut out = Vec::new();
                if calls.is_empty() || !text.is_empty() || !logprobs.is_empty() {
                    out.push(self.text_chunk(text, &logprobs));
                }
                out.extend(self.call_chunks(&calls));
                out
            }
            Ok(GenerateEvent::Finish {
                reason,
                tool_calls,
                streamed_calls,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
                ..
            }) => {
                let mut out = self.call_chunks(&Self::unstreamed(&tool_calls, streamed_calls));
                let choice = match self.kind {
                    Kind::Completion => {
                        json!({ "index": 0, "text": "", "logprobs": null, "finish_reason": finish_str(reason) })
                    }
                    Kind::Chat => {
                        json!({ "index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_str(reason) })
                    }
                };
                out.push(self.chunk(json!([choice])));
                if self.include_usage {
                    let mut last = self.chunk(json!([]));
                    last["usage"] = usage(prompt_tokens, cached_tokens, completion_tokens);
                    out.push(last);
                }
                out
            }
            // Headers are sent already: report the error in the stream, as OpenAI does.
            Err(e) => {
                let err = ApiError::from(e);
                vec![
                    json!({ "error": { "message": err.message, "type": err.kind, "param": err.param, "code": err.code } }),
                ]
            }
        }
    }
}

/// OpenAI's usage object; `prompt_tokens_details.cached_tokens` counts the prompt tokens the
/// pool's prefix cache served.
fn usage(prompt_tokens: u32, cached_tokens: u32, completion_tokens: u32) -> Value {
    json!({ "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": { "cached_tokens": cached_tokens } })
}

fn sse(
    events: impl Stream<Item = Result<GenerateEvent, GatewayError>> + Send + 'static,
    mut writer: ChunkWriter,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let chunks = events.flat_map(move |ev| {
        let events: Vec<Result<Event, Infallible>> = writer
            .on_event(ev)
            .into_iter()
            .map(|c| Ok(Event::default().data(c.to_string())))
            .collect();
        futures::stream::iter(events)
    });
    chunks.chain(futures::stream::once(async {
        Ok(Event::default().data("[DONE]"))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(kind: Kind, include_usage: bool) -> ChunkWriter {
        ChunkWriter {
            kind,
            id: "x".into(),
            created: 1,
            model: "m".into(),
            include_usage,
            first: true,
            logprobs: None,
        }
    }

    fn delta(text: &str) -> Result<GenerateEvent, GatewayError> {
        Ok(GenerateEvent::Delta {
            text: text.into(),
            token_ids: vec![1],
            logprobs: Vec::new(),
            calls: Vec::new(),
        })
    }

    fn finish() -> Result<GenerateEvent, GatewayError> {
        Ok(GenerateEvent::Finish {
            reason: api::FinishReason::Length,
            tool_calls: Vec::new(),
            streamed_calls: 0,
            prompt_tokens: 3,
            cached_tokens: 2,
            completion_tokens: 2,
            time_to_first_token_ms: 1.0,
        })
    }

    #[test]
    fn usage_is_streamed_only_when_asked_for() {
        let mut w = writer(Kind::Chat, false);
        let chunks: Vec<Value> = [delta("a"), delta("b"), finish()]
            .into_iter()
            .flat_map(|e| w.on_event(e))
            .collect();
        assert_eq!(chunks.len(), 3);
        assert!(
            chunks.iter().all(|c| c.get("usage").is_none()),
            "{chunks:?}"
        );
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks[1]["choices"][0]["delta"].get("role").is_none());
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");

        let mut w = writer(Kind::Completion, true);
        let chunks: Vec<Value> = [delta("a"), finish()]
            .into_iter()
            .flat_map(|e| w.on_event(e))
            .collect();
        assert_eq!(chunks.len(), 3, "the usage chunk comes last, on its own");
        assert!(chunks[..2].iter().all(|c| c["usage"].is_null()));
        let last = &chunks[2];
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["total_tokens"], 5);
        assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
    }

    #[test]
    fn server_faults_are_5xx() {
        let cases = [
            (
                GatewayError::InvalidArgument("x".into()),
                StatusCode::BAD_REQUEST,
            ),
            (
                GatewayError::ModelNotFound("m".into()),
                StatusCode::NOT_FOUND,
            ),
            (
                GatewayError::Unavailable("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                GatewayError::Internal("x".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                GatewayError::ResourceExhausted("x".into()),
                StatusCode::TOO_MANY_REQUESTS,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e.clone()).status(), status, "{e:?}");
        }
        // No ready pool, or a full queue: the client is told when to try again.
        for e in [
            GatewayError::Unavailable("x".into()),
            GatewayError::ResourceExhausted("x".into()),
        ] {
            let response = ApiError::from(e).into_response();
            let retry = response.headers().get(axum::http::header::RETRY_AFTER);
            assert_eq!(retry.and_then(|v| v.to_str().ok()), Some("1"));
        }
        let mut w = writer(Kind::Chat, false);
        let err = w.on_event(Err(GatewayError::Internal("boom".into())));
        assert_eq!(err[0]["error"]["type"], "server_error");
    }
}
