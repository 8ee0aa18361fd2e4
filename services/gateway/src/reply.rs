//! OpenAI's answer to a completion request, built from the events of its choices' streams
//! (several with OpenAI's `n`): one JSON body, or the chunks of a server-sent event stream.
//! Either way each choice carries its `index`, and the usage counts the prompt once and the
//! completion tokens of every choice. With `echo`, each choice's text begins with its prompt
//! (a stream's first chunk of the choice is the prompt), and its logprobs with the prompt's.

use std::convert::Infallible;

use axum::response::sse::Event;
use ferrite_proto::v1 as api;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::GatewayError;
use crate::api_error::ApiError;
use crate::logprobs::LogprobsWriter;
use crate::stream::{CallDelta, GenerateEvent, Indexed};
use crate::tools::ToolCall;

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Completion,
    Chat,
}

/// What every body or chunk of one response carries.
#[derive(Debug)]
pub struct Reply {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// `stream_options.include_usage`: every chunk carries `"usage": null`, and a last chunk
    /// with no choices carries the usage; without it no chunk has a usage field.
    pub include_usage: bool,
    /// Set when the request asked for logprobs.
    pub logprobs: bool,
    /// Choices per prompt (`n`): choice `i` is of prompt `i / per_prompt`.
    pub per_prompt: usize,
    /// With `echo`, each prompt's text, to put before its choices' (empty without).
    pub echo: Vec<String>,
    /// A reasoning model's thinking goes out (`include_reasoning`, default true).
    pub include_reasoning: bool,
}

impl Reply {
    /// The text choice `index` begins with (`echo`), if any.
    fn echo_of(&self, index: usize) -> Option<&str> {
        self.echo
            .get(index / self.per_prompt.max(1))
            .map(String::as_str)
    }

    fn logprobs_writer(&self) -> Option<LogprobsWriter> {
        self.logprobs
            .then(|| LogprobsWriter::new(matches!(self.kind, Kind::Chat)))
    }
}

pub fn finish_str(r: api::FinishReason) -> &'static str {
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

/// OpenAI's usage object of the choices finished so far: each prompt once, every choice's
/// completion tokens; `prompt_tokens_details.cached_tokens` counts the prompt tokens the pool's
/// prefix cache served to each prompt's first choice (its later choices are sent where the
/// prompt is cached).
#[derive(Debug, Default)]
struct Usage {
    prompt: u32,
    cached: u32,
    completion: u32,
    reasoning: u32,
}

impl Usage {
    /// Counts the finish of choice `index` of a reply with `per_prompt` choices per prompt.
    fn add(&mut self, index: usize, per_prompt: usize, finish: &GenerateEvent) {
        if let GenerateEvent::Finish {
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            reasoning_tokens,
            ..
        } = finish
        {
            if index.is_multiple_of(per_prompt.max(1)) {
                self.prompt = self.prompt.saturating_add(*prompt_tokens);
                self.cached = self.cached.saturating_add(*cached_tokens);
            }
            self.completion = self.completion.saturating_add(*completion_tokens);
            self.reasoning = self.reasoning.saturating_add(*reasoning_tokens);
        }
    }

    fn json(&self) -> Value {
        json!({ "prompt_tokens": self.prompt, "completion_tokens": self.completion,
            "total_tokens": self.prompt.saturating_add(self.completion),
            "prompt_tokens_details": { "cached_tokens": self.cached },
            "completion_tokens_details": { "reasoning_tokens": self.reasoning } })
    }
}

/// What one choice's text, logprobs and calls add up to, for a body.
#[derive(Debug)]
struct ChoiceBody {
    text: String,
    /// A reasoning model's thinking.
    reasoning: String,
    finish: &'static str,
    /// An echoed prompt's first token, whose logprob is null.
    first: Option<String>,
    logprobs: Vec<api::TokenLogprob>,
    calls: Vec<ToolCall>,
}

impl ChoiceBody {
    fn json(self, index: usize, reply: &Reply) -> Value {
        let ChoiceBody {
            text,
            reasoning,
            finish,
            first,
            logprobs,
            calls,
        } = self;
        let logprobs = reply.logprobs_writer().map_or(Value::Null, |mut w| {
            w.render_after(first.as_deref(), &logprobs)
        });
        match reply.kind {
            Kind::Completion => {
                json!({ "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish })
            }
            Kind::Chat => {
                let mut message = json!({ "role": "assistant", "content": text });
                if !reasoning.is_empty() && reply.include_reasoning {
                    with_reasoning(&mut message, reasoning);
                }
                if !calls.is_empty() {
                    message["tool_calls"] = tool_calls_json(&calls);
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({ "index": index, "message": message, "logprobs": logprobs, "finish_reason": finish })
            }
        }
    }
}

/// `reasoning` in a chat message or delta, under vLLM's name and DeepSeek's (vLLM's older
/// one, which most clients read).
fn with_reasoning(message: &mut Value, reasoning: String) {
    message["reasoning_content"] = json!(reasoning);
    message["reasoning"] = json!(reasoning);
}

/// The whole response body of `n` choices (of every prompt), once every one has finished; the
/// first error fails the request.
pub async fn body(
    events: impl Stream<Item = Indexed>,
    reply: &Reply,
    n: usize,
) -> Result<Value, ApiError> {
    let mut choices: Vec<ChoiceBody> = (0..n)
        .map(|i| ChoiceBody {
            text: reply.echo_of(i).unwrap_or_default().to_owned(),
            reasoning: String::new(),
            finish: "stop",
            first: None,
            logprobs: Vec::new(),
            calls: Vec::new(),
        })
        .collect();
    let mut usage = Usage::default();
    futures::pin_mut!(events);
    while let Some((i, ev)) = events.next().await {
        let ev = ev?;
        usage.add(i, reply.per_prompt, &ev);
        let Some(choice) = choices.get_mut(i) else {
            continue;
        };
        match ev {
            // It comes first: the prompt's logprobs lead the choice's.
            GenerateEvent::Prompt { first, logprobs } => {
                choice.first = Some(first);
                choice.logprobs.extend(logprobs);
            }
            GenerateEvent::Delta {
                text,
                reasoning,
                logprobs,
                ..
            } => {
                choice.text.push_str(&text);
                choice.reasoning.push_str(&reasoning);
                choice.logprobs.extend(logprobs);
            }
            GenerateEvent::Finish {
                reason, tool_calls, ..
            } => {
                choice.finish = finish_str(reason);
                choice.calls = tool_calls;
            }
        }
    }
    let object = match reply.kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion",
    };
    let choices: Vec<Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.json(i, reply))
        .collect();
    Ok(
        json!({ "id": reply.id, "object": object, "created": reply.created,
        "model": reply.model, "choices": choices, "usage": usage.json() }),
    )
}

/// Where one choice's stream of chunks stands.
#[derive(Debug)]
struct ChoiceChunks {
    /// No chunk of this choice went out yet (a chat's first delta names the role).
    first: bool,
    /// With `echo`: the prompt's chunk has not gone out yet.
    echo: bool,
    logprobs: Option<LogprobsWriter>,
}

/// Turns the choices' events into OpenAI stream chunks.
#[derive(Debug)]
pub struct ChunkWriter {
    reply: Reply,
    choices: Vec<ChoiceChunks>,
    /// Choices not finished yet: the usage chunk follows the last one's finish.
    left: usize,
    usage: Usage,
}

impl ChunkWriter {
    pub fn new(reply: Reply, n: usize) -> Self {
        let choices = (0..n)
            .map(|i| ChoiceChunks {
                first: true,
                echo: reply.echo_of(i).is_some(),
                logprobs: reply.logprobs_writer(),
            })
            .collect();
        Self {
            reply,
            choices,
            left: n,
            usage: Usage::default(),
        }
    }

    fn chunk(&self, choices: Value) -> Value {
        let r = &self.reply;
        let object = match r.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        let mut c = json!({ "id": r.id, "object": object, "created": r.created, "model": r.model,
            "choices": choices });
        if r.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// Whether choice `index` has had no chunk yet (then it has one from now on).
    fn take_first(&mut self, index: usize) -> bool {
        self.choices
            .get_mut(index)
            .is_some_and(|c| std::mem::take(&mut c.first))
    }

    /// The chunk of a delta's text (and its logprobs, after an echoed prompt's `first`
    /// token).
    fn text_chunk(
        &mut self,
        index: usize,
        text: String,
        logprobs: (Option<&str>, &[api::TokenLogprob]),
    ) -> Value {
        match self.reply.kind {
            Kind::Completion => {
                let logprobs = self.logprobs_json(index, logprobs);
                let choice = json!({ "index": index, "text": text, "logprobs": logprobs,
                    "finish_reason": null });
                self.chunk(json!([choice]))
            }
            Kind::Chat => self.delta_chunk(index, json!({ "content": text }), logprobs),
        }
    }

    /// The chunk of a chat's new thinking (and its delta's logprobs, where no text follows).
    fn reasoning_chunk(
        &mut self,
        index: usize,
        reasoning: String,
        logprobs: &[api::TokenLogprob],
    ) -> Value {
        let mut delta = json!({});
        with_reasoning(&mut delta, reasoning);
        self.delta_chunk(index, delta, (None, logprobs))
    }

    /// The chunk of a chat's `delta` (naming the role in the choice's first), with its
    /// logprobs.
    fn delta_chunk(
        &mut self,
        index: usize,
        mut delta: Value,
        logprobs: (Option<&str>, &[api::TokenLogprob]),
    ) -> Value {
        let logprobs = self.logprobs_json(index, logprobs);
        if self.take_first(index) {
            delta["role"] = json!("assistant");
        }
        let choice =
            json!({ "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": null });
        self.chunk(json!([choice]))
    }

    /// Choice `index`'s logprobs of `logprobs` (after an echoed prompt's `first` token), or
    /// null where the request asked for none.
    fn logprobs_json(
        &mut self,
        index: usize,
        (first, logprobs): (Option<&str>, &[api::TokenLogprob]),
    ) -> Value {
        let writer = self
            .choices
            .get_mut(index)
            .and_then(|c| c.logprobs.as_mut());
        writer.map_or(Value::Null, |w| w.render_after(first, logprobs))
    }

    /// The chunks of pieces of a chat's tool calls, in order: each call's id, type and name
    /// first, then its arguments' text.
    fn call_chunks(&mut self, index: usize, pieces: &[CallDelta]) -> Vec<Value> {
        let mut out = Vec::new();
        for p in pieces {
            let call = match &p.head {
                Some((id, name)) => json!({ "index": p.index, "id": id, "type": "function",
                    "function": { "name": name, "arguments": p.arguments } }),
                None => json!({ "index": p.index, "function": { "arguments": p.arguments } }),
            };
            let mut delta = json!({ "tool_calls": [call] });
            if self.take_first(index) {
                delta["role"] = json!("assistant");
            }
            let choice =
                json!({ "index": index, "delta": delta, "logprobs": null, "finish_reason": null });
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

    /// The chunks of choice `index`'s event, in order.
    pub fn on_event(
        &mut self,
        index: usize,
        ev: Result<GenerateEvent, GatewayError>,
    ) -> Vec<Value> {
        let ev = match ev {
            Ok(ev) => ev,
            // Headers are sent already: report the error in the stream, as OpenAI does.
            Err(e) => {
                let err = ApiError::from(e);
                return vec![
                    json!({ "error": { "message": err.message, "type": err.kind, "param": err.param, "code": err.code } }),
                ];
            }
        };
        self.usage.add(index, self.reply.per_prompt, &ev);
        let mut out = Vec::new();
        if let Some(c) = self.choices.get_mut(index)
            && std::mem::take(&mut c.echo)
        {
            let echo = self.reply.echo_of(index).unwrap_or_default().to_owned();
            let (first, logprobs) = match &ev {
                GenerateEvent::Prompt { first, logprobs } => (Some(first.as_str()), &logprobs[..]),
                _ => (None, &[][..]),
            };
            out.push(self.text_chunk(index, echo, (first, logprobs)));
        }
        out.extend(self.event_chunks(index, ev));
        out
    }

    /// The chunks of choice `index`'s event (its prompt echoed already, where it is).
    fn event_chunks(&mut self, index: usize, ev: GenerateEvent) -> Vec<Value> {
        match ev {
            // Only sent with `echo`, and gone out with the prompt.
            GenerateEvent::Prompt { .. } => Vec::new(),
            GenerateEvent::Delta {
                text,
                reasoning,
                logprobs,
                calls,
                ..
            } => {
                let mut out = Vec::new();
                // Thinking comes before any answer; a delta of thinking alone is one chunk,
                // with the delta's logprobs.
                let thinking = !reasoning.is_empty() && self.reply.include_reasoning;
                let alone = thinking && text.is_empty();
                if thinking {
                    let logprobs = if alone { &logprobs[..] } else { &[] };
                    out.push(self.reasoning_chunk(index, reasoning, logprobs));
                }
                // A tool request's deltas carry no text until its end (where any content
                // comes before the last pieces of calls).
                if !alone && (calls.is_empty() || !text.is_empty() || !logprobs.is_empty()) {
                    out.push(self.text_chunk(index, text, (None, &logprobs)));
                }
                out.extend(self.call_chunks(index, &calls));
                out
            }
            GenerateEvent::Finish {
                reason,
                tool_calls,
                streamed_calls,
                ..
            } => self.finish_chunks(index, reason, &tool_calls, streamed_calls),
        }
    }

    /// A choice's last chunks: its calls not streamed yet, its finish reason, and the usage
    /// chunk after the last choice's finish.
    fn finish_chunks(
        &mut self,
        index: usize,
        reason: api::FinishReason,
        calls: &[ToolCall],
        streamed: usize,
    ) -> Vec<Value> {
        let mut out = self.call_chunks(index, &Self::unstreamed(calls, streamed));
        let reason = finish_str(reason);
        let choice = match self.reply.kind {
            Kind::Completion => {
                json!({ "index": index, "text": "", "logprobs": null, "finish_reason": reason })
            }
            Kind::Chat => {
                json!({ "index": index, "delta": {}, "logprobs": null, "finish_reason": reason })
            }
        };
        out.push(self.chunk(json!([choice])));
        self.left = self.left.saturating_sub(1);
        if self.reply.include_usage && self.left == 0 {
            let mut last = self.chunk(json!([]));
            last["usage"] = self.usage.json();
            out.push(last);
        }
        out
    }
}

/// The server-sent events of the choices' chunks, then `[DONE]`.
pub fn sse(
    events: impl Stream<Item = Indexed> + Send + 'static,
    mut writer: ChunkWriter,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let chunks = events.flat_map(move |(i, ev)| {
        let events: Vec<Result<Event, Infallible>> = writer
            .on_event(i, ev)
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
#[path = "reply_tests.rs"]
mod tests;
