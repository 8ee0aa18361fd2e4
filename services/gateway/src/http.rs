//! OpenAI-compatible HTTP: `GET /v1/models`, `POST /v1/completions`,
//! `POST /v1/chat/completions`, `POST /v1/responses` ([`crate::responses`]) and
//! `POST /v1/embeddings` ([`crate::embeddings`]), streamed as server-sent events or not,
//! errors in OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use ferrite_proto::v1 as api;
use serde_json::{Value, json};

use crate::Gateway;
use crate::api_error::{ApiError, bad_json};
use crate::asked::{Asked, open, unix_now};
use crate::auth::Caller;
use crate::openai::{
    ChatRequest, CommonParams, CompletionRequest, chat_prompt, completion_prompts, with_effort,
};
use crate::reply::{self, ChunkWriter, Kind, Reply};
use crate::validate::Prompt;

pub fn router(gateway: Gateway) -> Router {
    let api = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{model}", get(retrieve_model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(crate::responses::create))
        .route("/v1/embeddings", post(crate::embeddings::create))
        .route(
            "/v1/responses/{id}",
            get(crate::responses::retrieve).delete(crate::responses::delete),
        )
        .merge(crate::tokenizer_http::routes())
        .merge(crate::classify::routes())
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

async fn list_models(State(gw): State<Gateway>) -> Json<Value> {
    let mut data = Vec::new();
    for served in gw.pools().models() {
        data.push(model_json(&gw, served).await);
    }
    Json(json!({ "object": "list", "data": data }))
}

/// `GET /v1/models/{model}`: one model served now, as the list shows it; else a 404.
async fn retrieve_model(
    State(gw): State<Gateway>,
    axum::extract::Path(model): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    let served = gw.pools().models().into_iter().find(|s| s.name == model);
    let served = served.ok_or_else(|| crate::GatewayError::ModelNotFound(model.clone()))?;
    Ok(Json(model_json(&gw, served).await))
}

/// A model (or a LoRA adapter, with its `parent` as vLLM shows one) as `/v1/models` shows it.
async fn model_json(gw: &Gateway, served: crate::pools::Served) -> Value {
    let name = served.name;
    let defaults = gw.sampling_defaults(&name).await.map(|d| defaults_json(&d));
    json!({ "id": name, "object": "model", "created": unix_now(), "owned_by": "ferrite",
        "root": name, "parent": served.parent,
        "max_model_len": served.max_model_len, "sampling_defaults": defaults })
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

async fn completions(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<CompletionRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let prompts = completion_prompts(&req.prompt)?;
    let caller = caller.map(|Extension(c)| c).unwrap_or_default();
    run(
        gw,
        &headers,
        caller,
        Kind::Completion,
        (req.common, prompts),
    )
    .await
}

async fn chat_completions(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<ChatRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    let chat = chat_prompt(&req.messages, req.chat_template_kwargs.as_ref())?;
    let chat = with_effort(chat, req.common.reasoning_effort()?);
    let caller = caller.map(|Extension(c)| c).unwrap_or_default();
    let request = (req.common, vec![Prompt::Chat(chat)]);
    run(gw, &headers, caller, Kind::Chat, request).await
}

/// Answers a request for `common.n` choices of each of `prompts` (one, but for a batch of
/// completion prompts): choice `j` of prompt `i` has index `i * n + j`. Each prompt is a
/// request of its own to the gateway (its span, its limits), all opened at once.
async fn run(
    gw: Gateway,
    headers: &HeaderMap,
    caller: Caller,
    kind: Kind,
    (common, prompts): (CommonParams, Vec<Prompt>),
) -> Result<Response, ApiError> {
    let sampling = common.sampling()?;
    let constraint = common.constraint()?;
    let choices = common.choices()?;
    let tools = common.tools()?.map(Arc::new);
    if tools.is_some() && matches!(kind, Kind::Completion) {
        return Err(ApiError::invalid(
            "`tools` are for /v1/chat/completions",
            Some("tools"),
        ));
    }
    if common.echo() && matches!(kind, Kind::Chat) {
        return Err(ApiError::invalid(
            "`echo` is for /v1/completions",
            Some("echo"),
        ));
    }
    let echo = match common.echo() {
        true => echo_texts(&gw, &common.model, &prompts).await?,
        false => Vec::new(),
    };
    let started = Instant::now();
    let reply = Reply {
        kind,
        id: response_id(kind, started),
        created: unix_now(),
        model: common.model.clone(),
        include_usage: common.include_usage(),
        include_reasoning: common.include_reasoning(),
        logprobs: sampling.logprobs.is_some(),
        per_prompt: choices as usize,
        echo,
    };
    let asked = Asked {
        model: common.model.clone(),
        sampling,
        constraint,
        tools,
        choices,
    };
    let (events, n) = open(&gw, headers, caller, &asked, &prompts, started).await?;
    if common.stream {
        let stream = reply::sse(events, ChunkWriter::new(reply, n));
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    Ok(Json(reply::body(events, &reply, n).await?).into_response())
}

/// What `echo` puts before each prompt's choices: a text prompt as it was sent, token ids as
/// the model's tokenizer reads them.
async fn echo_texts(
    gw: &Gateway,
    model: &str,
    prompts: &[Prompt],
) -> Result<Vec<String>, ApiError> {
    let mut texts = Vec::with_capacity(prompts.len());
    // Fetched once, for the first prompt of ids.
    let mut model_text = None;
    for p in prompts {
        texts.push(match p {
            Prompt::Text(t) => t.clone(),
            Prompt::TokenIds(ids) => {
                let text = match &model_text {
                    Some(text) => text,
                    None => &*model_text.insert(gw.model_text(model).await?.0),
                };
                text.tokenizer.decode(ids, false).map_err(|e| {
                    ApiError::invalid(
                        format!("the prompt's ids do not decode: {e}"),
                        Some("prompt"),
                    )
                })?
            }
            Prompt::Chat(_) => String::new(),
        });
    }
    Ok(texts)
}

fn response_id(kind: Kind, started: Instant) -> String {
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    let nanos = started.elapsed().as_nanos() ^ u128::from(unix_now()) << 20;
    format!("{prefix}-{nanos:x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GatewayError;

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
    }
}
