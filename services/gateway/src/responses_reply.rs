//! The Responses API's answer, built from one chat's events: output items (a reasoning
//! model's thinking, the assistant's message, then or between them its function calls), either whole in one response object or
//! as the API's typed stream of server-sent events (`response.created`, each item's `added`,
//! its text or arguments in deltas, its `done`, then `response.completed`, or
//! `response.incomplete` where `max_output_tokens` cut the answer short). The whole body is
//! the last event's response: one writer makes both.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::Event;
use ferrite_proto::v1 as api;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::GatewayError;
use crate::api_error::ApiError;
use crate::logprobs::LogprobsWriter;
use crate::responses_store::{ResponseStore, Stored};
use crate::stream::{CallDelta, GenerateEvent, Indexed};
use crate::tools::ToolCall;

/// What every response object of one request carries.
#[derive(Debug)]
pub struct Head {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// The request's settings as the response repeats them (`instructions`, `tools`, ...).
    pub settings: Value,
}

/// The output item being written.
#[derive(Debug)]
enum Open {
    /// A reasoning model's thinking (`reasoning_text`).
    Reasoning { id: String, text: String },
    Message {
        id: String,
        text: String,
        logprobs: Vec<Value>,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// Where a finished response is kept, with the conversation that led to it (as input items;
/// its output items are added).
#[derive(Debug)]
pub struct Keep {
    pub store: Arc<ResponseStore>,
    pub items: Vec<Value>,
}

/// One streamed event: its type and its data (which repeats the type).
pub type ResponseEvent = (&'static str, Value);

/// Turns one chat's events into the Responses API's output items and events.
#[derive(Debug)]
pub struct ResponseWriter {
    head: Head,
    /// The items written whole so far; an open item's output index is their count.
    output: Vec<Value>,
    open: Option<Open>,
    /// Chat-shaped logprobs (`{token, logprob, bytes, top_logprobs}`), where asked for.
    logprobs: Option<LogprobsWriter>,
    sequence: u64,
    status: &'static str,
    incomplete: Value,
    error: Value,
    usage: Value,
    /// Items get ids of their own: `msg_`/`fc_` + the response's id + their output index.
    items: usize,
    keep: Option<Keep>,
}

impl ResponseWriter {
    pub fn new(head: Head, logprobs: bool, keep: Option<Keep>) -> Self {
        Self {
            head,
            output: Vec::new(),
            open: None,
            logprobs: logprobs.then(|| LogprobsWriter::new(true)),
            sequence: 0,
            status: "in_progress",
            incomplete: Value::Null,
            error: Value::Null,
            usage: Value::Null,
            items: 0,
            keep,
        }
    }

    /// The response object as it stands.
    pub fn response(&self) -> Value {
        let mut r = json!({ "id": self.head.id, "object": "response",
            "created_at": self.head.created_at, "status": self.status, "model": self.head.model,
            "output": self.output, "usage": self.usage, "error": self.error,
            "incomplete_details": self.incomplete });
        if let (Some(r), Some(settings)) = (r.as_object_mut(), self.head.settings.as_object()) {
            r.extend(settings.clone());
        }
        r
    }

    fn event(&mut self, kind: &'static str, mut data: Value) -> ResponseEvent {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (kind, data)
    }

    /// The events that open the stream.
    pub fn start(&mut self) -> Vec<ResponseEvent> {
        let response = self.response();
        let created = self.event("response.created", json!({ "response": response }));
        let response = self.response();
        let in_progress = self.event("response.in_progress", json!({ "response": response }));
        vec![created, in_progress]
    }

    /// The events of one of the chat's events, in order.
    pub fn on_event(&mut self, ev: Result<GenerateEvent, GatewayError>) -> Vec<ResponseEvent> {
        match ev {
            // Only sent for a scored prompt, which this API does not ask for.
            Ok(GenerateEvent::Prompt { .. }) => Vec::new(),
            Ok(GenerateEvent::Delta {
                text,
                reasoning,
                logprobs,
                calls,
                ..
            }) => {
                let mut out = Vec::new();
                if !reasoning.is_empty() {
                    out.extend(self.reasoning(reasoning));
                }
                if !text.is_empty() || !logprobs.is_empty() {
                    out.extend(self.text(text, &logprobs));
                }
                for piece in calls {
                    out.extend(self.call_piece(piece));
                }
                out
            }
            Ok(GenerateEvent::Finish {
                reason,
                tool_calls,
                streamed_calls,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
                reasoning_tokens,
                ..
            }) => {
                self.usage = json!({ "input_tokens": prompt_tokens,
                    "input_tokens_details": { "cached_tokens": cached_tokens },
                    "output_tokens": completion_tokens,
                    "output_tokens_details": { "reasoning_tokens": reasoning_tokens },
                    "total_tokens": prompt_tokens.saturating_add(completion_tokens) });
                self.finish(reason, &tool_calls, streamed_calls)
            }
            Err(e) => self.fail(ApiError::from(e)),
        }
    }

    fn output_index(&self) -> usize {
        self.output.len()
    }

    /// A delta of the message's text, opening the message first where it is not.
    fn text(&mut self, delta: String, logprobs: &[api::TokenLogprob]) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if !matches!(self.open, Some(Open::Message { .. })) {
            out.extend(self.close());
            out.extend(self.open_message());
        }
        let rendered = match self.logprobs.as_mut() {
            Some(w) => w.render(logprobs)["content"].take(),
            None => json!([]),
        };
        let index = self.output_index();
        let Some(Open::Message { id, text, logprobs }) = self.open.as_mut() else {
            return out;
        };
        text.push_str(&delta);
        logprobs.extend(rendered.as_array().cloned().unwrap_or_default());
        let data = json!({ "item_id": id, "output_index": index, "content_index": 0,
            "delta": delta, "logprobs": rendered });
        out.push(self.event("response.output_text.delta", data));
        out
    }

    /// A delta of the thinking, opening its item first where it is not.
    fn reasoning(&mut self, delta: String) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            out.extend(self.close());
            let id = self.item_id("rs");
            let item = json!({ "id": id, "type": "reasoning", "summary": [], "content": [] });
            let data = json!({ "output_index": self.output_index(), "item": item });
            out.push(self.event("response.output_item.added", data));
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.output_index();
        let Some(Open::Reasoning { id, text }) = self.open.as_mut() else {
            return out;
        };
        text.push_str(&delta);
        let data = json!({ "item_id": id, "output_index": index, "content_index": 0,
            "delta": delta });
        out.push(self.event("response.reasoning_text.delta", data));
        out
    }

    fn open_message(&mut self) -> Vec<ResponseEvent> {
        let id = self.item_id("msg");
        let index = self.output_index();
        let item = json!({ "id": id, "type": "message", "status": "in_progress",
            "role": "assistant", "content": [] });
        let part = json!({ "type": "output_text", "text": "", "annotations": [], "logprobs": [] });
        let added = self.event(
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
        );
        let part = self.event(
            "response.content_part.added",
            json!({ "item_id": id, "output_index": index, "content_index": 0, "part": part }),
        );
        self.open = Some(Open::Message {
            id,
            text: String::new(),
            logprobs: Vec::new(),
        });
        vec![added, part]
    }

    /// A piece of a call as the model writes it: a new call's head opens its item, the
    /// arguments' text goes to the call open.
    fn call_piece(&mut self, piece: CallDelta) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if let Some((call_id, name)) = piece.head {
            out.extend(self.close());
            out.extend(self.open_call(call_id, name));
        }
        let index = self.output_index();
        if let Some(Open::Call { id, arguments, .. }) = self.open.as_mut()
            && !piece.arguments.is_empty()
        {
            arguments.push_str(&piece.arguments);
            let data = json!({ "item_id": id, "output_index": index, "delta": piece.arguments });
            out.push(self.event("response.function_call_arguments.delta", data));
        }
        out
    }

    fn open_call(&mut self, call_id: String, name: String) -> Vec<ResponseEvent> {
        let id = self.item_id("fc");
        let item = json!({ "id": id, "type": "function_call", "status": "in_progress",
            "call_id": call_id, "name": name, "arguments": "" });
        let data = json!({ "output_index": self.output_index(), "item": item });
        self.open = Some(Open::Call {
            id,
            call_id,
            name,
            arguments: String::new(),
        });
        vec![self.event("response.output_item.added", data)]
    }

    fn item_id(&mut self, prefix: &str) -> String {
        self.items += 1;
        let response = self.head.id.trim_start_matches("resp_");
        format!("{prefix}_{response}{:02x}", self.items)
    }

    /// Closes the item open, if any: its last events, and it joins the output.
    fn close(&mut self) -> Vec<ResponseEvent> {
        let index = self.output_index();
        // A message cut by `max_output_tokens` is incomplete, as its response.
        let status = match self.status {
            "incomplete" => "incomplete",
            _ => "completed",
        };
        let (item, mut out) = match self.open.take() {
            None => return Vec::new(),
            Some(Open::Reasoning { id, text }) => {
                let done = json!({ "item_id": id, "output_index": index, "content_index": 0,
                    "text": text });
                let item = json!({ "id": id, "type": "reasoning", "summary": [],
                    "content": [{ "type": "reasoning_text", "text": text }] });
                (item, vec![self.event("response.reasoning_text.done", done)])
            }
            Some(Open::Message { id, text, logprobs }) => {
                let part = json!({ "type": "output_text", "text": text, "annotations": [],
                    "logprobs": logprobs });
                let done = json!({ "item_id": id, "output_index": index, "content_index": 0,
                    "text": text, "logprobs": logprobs });
                let part_done = json!({ "item_id": id, "output_index": index,
                    "content_index": 0, "part": part });
                let item = json!({ "id": id, "type": "message", "status": status,
                    "role": "assistant", "content": [part] });
                let out = vec![
                    self.event("response.output_text.done", done),
                    self.event("response.content_part.done", part_done),
                ];
                (item, out)
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                let done = json!({ "item_id": id, "output_index": index, "name": name,
                    "arguments": arguments });
                let item = json!({ "id": id, "type": "function_call", "status": "completed",
                    "call_id": call_id, "name": name, "arguments": arguments });
                (
                    item,
                    vec![self.event("response.function_call_arguments.done", done)],
                )
            }
        };
        let data = json!({ "output_index": index, "item": item });
        out.push(self.event("response.output_item.done", data));
        self.output.push(item);
        out
    }

    /// The calls not streamed yet (each opened, its arguments whole, closed), the item open
    /// closed, and the response's last event.
    fn finish(
        &mut self,
        reason: api::FinishReason,
        calls: &[ToolCall],
        streamed: usize,
    ) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if reason == api::FinishReason::Length {
            self.status = "incomplete";
            self.incomplete = json!({ "reason": "max_output_tokens" });
        }
        for call in calls.iter().skip(streamed) {
            out.extend(self.call_piece(CallDelta {
                index: 0,
                head: Some((call.id.clone(), call.name.clone())),
                arguments: call.arguments.clone(),
            }));
        }
        out.extend(self.close());
        let kind = match self.status {
            "incomplete" => "response.incomplete",
            _ => {
                self.status = "completed";
                "response.completed"
            }
        };
        let response = self.response();
        // Kept before the last event goes out: a client may continue it at once.
        if let Some(Keep { store, mut items }) = self.keep.take() {
            items.extend(self.output.iter().cloned());
            let stored = Stored {
                items,
                response: response.clone(),
            };
            store.put(self.head.id.clone(), stored);
        }
        out.push(self.event(kind, json!({ "response": response })));
        out
    }

    /// A fault after the stream began: an `error` event, then `response.failed`.
    fn fail(&mut self, e: ApiError) -> Vec<ResponseEvent> {
        let error = self.event(
            "error",
            json!({ "code": e.code, "message": e.message, "param": e.param }),
        );
        self.open = None;
        self.status = "failed";
        self.error = json!({ "code": e.code, "message": e.message });
        let response = self.response();
        vec![
            error,
            self.event("response.failed", json!({ "response": response })),
        ]
    }
}

/// The whole response once the chat has finished; an error fails the request.
pub async fn body(
    events: impl Stream<Item = Indexed>,
    mut writer: ResponseWriter,
) -> Result<Value, ApiError> {
    futures::pin_mut!(events);
    while let Some((_, ev)) = events.next().await {
        writer.on_event(Ok(ev?));
    }
    Ok(writer.response())
}

/// The stream's server-sent events, each named by its type.
pub fn sse(
    events: impl Stream<Item = Indexed> + Send + 'static,
    mut writer: ResponseWriter,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let to_sse =
        |(kind, data): ResponseEvent| Ok(Event::default().event(kind).data(data.to_string()));
    let start: Vec<_> = writer.start().into_iter().map(to_sse).collect();
    let rest = events.flat_map(move |(_, ev)| {
        let out: Vec<_> = writer.on_event(ev).into_iter().map(to_sse).collect();
        futures::stream::iter(out)
    });
    futures::stream::iter(start).chain(rest)
}
