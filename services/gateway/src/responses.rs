//! OpenAI's Responses API, `POST /v1/responses`: what the official SDKs' `responses.create`
//! and `responses.parse` send (and agent frameworks built on them). A request is one chat: its
//! `instructions` and `input` items become the chat's messages, `text.format` its structured
//! output, `tools` its function tools; the answer's text and calls come back as output items,
//! whole or as the API's typed stream of events ([`crate::responses_reply`]).
//!
//! A gateway keeps the last responses in memory ([`crate::responses_store`]; unless a request
//! says `store: false`): a later request continues one by `previous_response_id` (its
//! conversation's items come before the new input; its `instructions` do not carry over, as
//! OpenAI's), and `GET`/`DELETE /v1/responses/{id}` show or drop one. `conversation` objects
//! and `item_reference` items are refused. So are the hosted tools (web or file search, computer use...), images and files,
//! and `truncation: auto`: a 400 naming the field, never a silent difference. A reasoning
//! model's thinking is a `reasoning` item before the message (its text whole: no summaries).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ferrite_proto::v1 as api;
use ferrite_text::ChatMessage;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Gateway;
use crate::api_error::{ApiError, bad_json};
use crate::asked::{Asked, open, unix_now};
use crate::auth::Caller;
use crate::openai::{
    ToolNaming, function_fields, output_format, tool_error, tools_of, with_effort,
};
use crate::responses_reply::{self, Keep, ResponseWriter};
use crate::responses_store::{CAPACITY, Stored};
use crate::tools::{self, Function, PastCall, Tools};
use crate::validate::{Chat, Constraint, Prompt};

/// `POST /v1/responses`.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    model: String,
    input: Value,
    instructions: Option<String>,
    #[serde(default)]
    stream: bool,
    max_output_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    text: Option<Value>,
    top_logprobs: Option<u32>,
    include: Option<Vec<String>>,
    metadata: Option<Value>,
    /// vLLM's extensions, as on the chat endpoint.
    #[serde(flatten)]
    extra: Extensions,
    store: Option<bool>,
    previous_response_id: Option<String>,
    /// Refused when set (see the module's note).
    conversation: Option<Value>,
    background: Option<bool>,
    /// `{effort, summary}`: the effort reaches the chat template as `reasoning_effort`; a
    /// reasoning model's thinking comes back whole, never summarized.
    reasoning: Option<Value>,
    truncation: Option<String>,
    prompt: Option<Value>,
}

/// The sampling fields vLLM takes beside the Responses API's own.
#[derive(Debug, Default, Deserialize)]
struct Extensions {
    top_k: Option<u32>,
    min_p: Option<f32>,
    seed: Option<u64>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    #[serde(default)]
    ignore_eos: bool,
}

/// What `include` may ask for.
const LOGPROBS_INCLUDE: &str = "message.output_text.logprobs";

/// `POST /v1/responses`: one chat, answered as a response object or its stream of events.
pub async fn create(
    State(gw): State<Gateway>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Json<ResponsesRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(bad_json)?;
    req.refuse_unsupported()?;
    let previous = req.previous(&gw)?;
    let items = req.conversation_items(previous)?;
    let messages = req.messages(&items)?;
    let asked = Asked {
        model: req.model.clone(),
        sampling: req.sampling()?,
        constraint: text_format(req.text.as_ref())?,
        tools: req.tools()?.map(Arc::new),
        choices: 1,
    };
    let started = Instant::now();
    let keep = (req.store != Some(false)).then(|| Keep {
        store: gw.stored_responses().clone(),
        items,
    });
    let writer = ResponseWriter::new(req.echo(&asked), asked.sampling.logprobs.is_some(), keep);
    let caller = caller.map(|Extension(c)| c).unwrap_or_default();
    let prompts = [Prompt::Chat(with_effort(
        Chat::new(messages),
        req.effort()?,
    ))];
    let (events, _) = open(&gw, &headers, caller, &asked, &prompts, started).await?;
    if req.stream {
        let stream = responses_reply::sse(events, writer);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    Ok(Json(responses_reply::body(events, writer).await?).into_response())
}

/// `GET /v1/responses/{id}`: a response this gateway keeps.
pub async fn retrieve(
    State(gw): State<Gateway>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    let kept = gw.stored_responses().get(&id);
    kept.map(|k| Json(k.response))
        .ok_or_else(|| not_kept(&id, None))
}

/// `DELETE /v1/responses/{id}`: forgets a kept response.
pub async fn delete(
    State(gw): State<Gateway>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    match gw.stored_responses().remove(&id) {
        true => Ok(Json(
            json!({ "id": id, "object": "response.deleted", "deleted": true }),
        )),
        false => Err(not_kept(&id, None)),
    }
}

/// A 404 for a response this gateway does not keep, saying why it may not.
fn not_kept(id: &str, param: Option<&'static str>) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::NOT_FOUND,
        message: format!(
            "no response `{id}` here: a gateway keeps the last {CAPACITY} responses in its \
             memory (not those of another replica, nor across a restart; behind several \
             replicas, keep a client on the one it used)"
        ),
        kind: "invalid_request_error",
        code: "not_found",
        param,
        retry_after_s: None,
    }
}

impl ResponsesRequest {
    /// `reasoning.effort`, checked (the rest of `reasoning` asks for nothing ferrite does).
    fn effort(&self) -> Result<Option<&str>, ApiError> {
        let effort = self.reasoning.as_ref().and_then(|r| r.get("effort"));
        match effort {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(e)) => crate::openai::effort(Some(e), "reasoning"),
            Some(_) => Err(ApiError::invalid(
                "`reasoning.effort` must be a string",
                Some("reasoning"),
            )),
        }
    }

    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let refuse = |param: &'static str, why: &str| {
            Err(ApiError::invalid(
                format!("`{param}` is not supported: {why}"),
                Some(param),
            ))
        };
        if is_set(&self.conversation) {
            return refuse(
                "conversation",
                "no conversation objects; continue a response by `previous_response_id`, or \
                 send the whole conversation as `input`",
            );
        }
        if self.background == Some(true) {
            return refuse(
                "background",
                "responses are answered while the request waits",
            );
        }
        self.effort()?;
        if self.truncation.as_deref().is_some_and(|t| t != "disabled") {
            return refuse(
                "truncation",
                "only `disabled`: a conversation longer than the context is refused",
            );
        }
        if is_set(&self.prompt) {
            return refuse("prompt", "no stored prompt templates");
        }
        for item in self.include.iter().flatten() {
            if item != LOGPROBS_INCLUDE {
                return Err(ApiError::invalid(
                    format!("`include`: `{item}` is not served (only `{LOGPROBS_INCLUDE}`)"),
                    Some("include"),
                ));
            }
        }
        Ok(())
    }

    fn sampling(&self) -> Result<api::SamplingParams, ApiError> {
        let asked = self.include.iter().flatten().any(|i| i == LOGPROBS_INCLUDE);
        let logprobs = (asked || self.top_logprobs.is_some_and(|n| n > 0))
            .then(|| self.top_logprobs.unwrap_or(0));
        let x = &self.extra;
        Ok(api::SamplingParams {
            max_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_k: x.top_k,
            top_p: self.top_p,
            min_p: x.min_p,
            seed: x.seed,
            repetition_penalty: x.repetition_penalty,
            presence_penalty: x.presence_penalty,
            frequency_penalty: x.frequency_penalty,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            logprobs,
            ignore_eos: x.ignore_eos,
            logit_bias: Vec::new(),
            prompt_logprobs: None,
        })
    }

    /// The response `previous_response_id` continues, if any: kept by this gateway.
    fn previous(&self, gw: &Gateway) -> Result<Option<Stored>, ApiError> {
        let Some(id) = &self.previous_response_id else {
            return Ok(None);
        };
        let kept = gw.stored_responses().get(id);
        kept.map(Some)
            .ok_or_else(|| not_kept(id, Some("previous_response_id")))
    }

    /// The conversation as input items: the previous response's (its input and output), then
    /// this request's `input` (a text is one user message).
    fn conversation_items(&self, previous: Option<Stored>) -> Result<Vec<Value>, ApiError> {
        let mut items = previous.map(|p| p.items).unwrap_or_default();
        match &self.input {
            Value::String(text) => items.push(json!({ "role": "user", "content": text })),
            Value::Array(input) => items.extend(input.iter().cloned()),
            _ => return Err(bad_input("must be a text or a list of items".into())),
        }
        Ok(items)
    }

    /// The chat: `instructions` as its system message, then the conversation's items.
    fn messages(&self, items: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
        let mut out = Vec::new();
        if let Some(text) = &self.instructions {
            out.push(ChatMessage::new("system", text.clone()));
        }
        out.extend(input_messages(items).map_err(bad_input)?);
        Ok(out)
    }

    /// The request's function tools, unless it has none.
    fn tools(&self) -> Result<Option<Tools>, ApiError> {
        let named = ToolNaming {
            read: |v| match v["type"].as_str() {
                Some("function") => v["name"].as_str(),
                _ => None,
            },
            shape: "{\"type\": \"function\", \"name\": ...}",
        };
        tools_of(
            (self.tools.as_ref(), self.tool_choice.as_ref()),
            self.parallel_tool_calls,
            function,
            named,
        )
    }

    /// The request's settings as the response object repeats them.
    fn echo(&self, asked: &Asked) -> responses_reply::Head {
        let format = self
            .text
            .as_ref()
            .and_then(|t| t.get("format"))
            .cloned()
            .unwrap_or_else(|| json!({ "type": "text" }));
        let settings = json!({
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            // Unset, the model's recommended sampling applies (as `/v1/models` shows it).
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_logprobs": self.top_logprobs.unwrap_or(0),
            "tools": self.tools.clone().unwrap_or_else(|| json!([])),
            "tool_choice": self.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "parallel_tool_calls": self.parallel_tool_calls.unwrap_or(true),
            "text": { "format": format },
            "metadata": self.metadata.clone().unwrap_or_else(|| json!({})),
            "truncation": "disabled",
            "store": self.store != Some(false),
            "background": false,
            "previous_response_id": self.previous_response_id,
            "reasoning": self.reasoning.clone().unwrap_or(Value::Null),
        });
        responses_reply::Head {
            id: response_id(),
            created_at: unix_now(),
            model: asked.model.clone(),
            settings,
        }
    }
}

/// Whether a field that may be sent as null is set.
fn is_set(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null())
}

fn bad_input(m: String) -> ApiError {
    ApiError::invalid(format!("`input`: {m}"), Some("input"))
}

/// A `resp_` id, unique enough within a gateway's life.
fn response_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("resp_{:x}{n:06x}", unix_now())
}

/// Tool `i` of a request: `{"type": "function", "name", "description", "parameters"}` (the
/// Responses API's flat form; `strict` is how ferrite holds every call anyway).
fn function(i: usize, tool: &Value) -> Result<Function, ApiError> {
    match tool["type"].as_str() {
        Some("function") => function_fields(i, tool, "name"),
        Some(other) => Err(tool_error(
            i,
            format!("type `{other}` is not served: only function tools"),
        )),
        None => Err(tool_error(i, "needs a `type`".into())),
    }
}

/// `text.format`: chat's `response_format` in the Responses API's flat form (`schema` and
/// `strict` beside the `type`).
fn text_format(text: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    match text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        Some(format) => output_format(format, Some(format), "text.format"),
        None => Ok(None),
    }
}

/// A chat message being gathered from input items: an assistant's text and the calls that
/// follow it are one message.
struct Pending {
    role: String,
    content: String,
    calls: Vec<PastCall>,
    tool_call_id: Option<String>,
    /// An assistant's thinking (a `reasoning` item before its message).
    reasoning: Option<String>,
}

impl Pending {
    fn new(role: String, content: String) -> Self {
        Self {
            role,
            content,
            calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
        }
    }

    fn message(self) -> Result<ChatMessage, String> {
        let mut m = tools::chat_message(&self.role, self.content, self.calls, self.tool_call_id)?;
        m.reasoning_content = self.reasoning;
        Ok(m)
    }

    /// An assistant message begun by a `reasoning` item, still waiting for its text.
    fn thought_only(&self) -> bool {
        self.reasoning.is_some() && self.content.is_empty() && self.calls.is_empty()
    }
}

/// The chat messages of `input` items: messages (`role` and `content`), the model's past
/// `function_call`s (joined to the assistant message before them) and their
/// `function_call_output`s.
fn input_messages(items: &[Value]) -> Result<Vec<ChatMessage>, String> {
    let mut pending: Vec<Pending> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("message");
        let at = |m: String| format!("item {i}: {m}");
        let text = |key: &str| item[key].as_str().map(str::to_owned);
        match kind {
            "message" => {
                let role = text("role").ok_or_else(|| at("a message needs a `role`".into()))?;
                let content = content_text(&item["content"]).map_err(at)?;
                match pending.last_mut() {
                    Some(last) if role == "assistant" && last.thought_only() => {
                        last.content = content;
                    }
                    _ => pending.push(Pending::new(role, content)),
                }
            }
            // The model's thinking: the assistant message it comes before has it (one that
            // carries no text, another server's, adds nothing).
            "reasoning" => {
                let thought = reasoning_text(item);
                if !thought.is_empty() {
                    pending.push(Pending {
                        reasoning: Some(thought),
                        ..Pending::new("assistant".into(), String::new())
                    });
                }
            }
            "function_call" => {
                let (Some(id), Some(name)) = (text("call_id"), text("name")) else {
                    return Err(at("a function_call needs `call_id` and `name`".into()));
                };
                let args = text("arguments").unwrap_or_default();
                let call = PastCall::new(id, name, &args).map_err(at)?;
                match pending.last_mut() {
                    Some(last) if last.role == "assistant" => last.calls.push(call),
                    _ => pending.push(Pending {
                        calls: vec![call],
                        ..Pending::new("assistant".into(), String::new())
                    }),
                }
            }
            "function_call_output" => pending.push(Pending {
                tool_call_id: Some(
                    text("call_id")
                        .ok_or_else(|| at("a function_call_output needs `call_id`".into()))?,
                ),
                ..Pending::new("tool".into(), content_text(&item["output"]).map_err(at)?)
            }),
            other => {
                return Err(at(format!(
                    "type `{other}` is not served (messages, reasoning, function_call and function_call_output are)"
                )));
            }
        }
    }
    pending
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            p.message()
                .map_err(|m| format!("message {i} of the chat: {m}"))
        })
        .collect()
}

/// A `reasoning` item's text: its `reasoning_text` parts, else its summary's `summary_text`
/// (none: another server's item that carries only what it encrypted).
fn reasoning_text(item: &Value) -> String {
    let parts = |key: &str, kind: &str| -> Option<String> {
        let list = item[key].as_array().filter(|l| !l.is_empty())?;
        list.iter()
            .map(|p| {
                (p["type"].as_str() == Some(kind))
                    .then(|| p["text"].as_str())
                    .flatten()
            })
            .collect()
    };
    parts("content", "reasoning_text")
        .or_else(|| parts("summary", "summary_text"))
        .unwrap_or_default()
}

/// A message's `content` (or a call output's `output`): a text, or parts of text
/// (`input_text`, `output_text`).
fn content_text(content: &Value) -> Result<String, String> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                (Some("input_text" | "output_text" | "text"), Some(t)) => Ok(t.to_owned()),
                (kind, _) => Err(format!(
                    "content part `{}` is not served (text parts are)",
                    kind.unwrap_or("without a type")
                )),
            })
            .collect(),
        _ => Err("content must be a text or a list of parts".into()),
    }
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
