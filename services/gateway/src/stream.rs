//! From worker token ids to client text: incremental detokenization and stop strings.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_proto::v1 as api;
use ferrite_proto::worker::v1 as pb;
use ferrite_text::reasoning::{Part, Split};
use ferrite_text::{TextError, TextStream};
use futures::{Stream, StreamExt};
use tracing::Instrument;

use crate::EventStream;
use crate::error::GatewayError;
use crate::models::ModelText;
use crate::route::Upstream;
use crate::tool_stream::{CallPiece, CallScanner};
use crate::tools::{ToolCall, ToolChoice, ToolFormat, Tools};
use crate::trace::RequestTrace;
use crate::validate::ValidatedRequest;

/// One event of a completion, independent of the wire format (gRPC or HTTP/SSE).
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateEvent {
    /// The prompt's scores, first, where the request asked for them (`prompt_logprobs`).
    Prompt {
        /// The prompt's first token's text (it has no score).
        first: String,
        /// Each prompt token from the second.
        logprobs: Vec<api::TokenLogprob>,
    },
    Delta {
        /// The answer's new text.
        text: String,
        /// A reasoning model's new thinking (empty for other models).
        reasoning: String,
        token_ids: Vec<u32>,
        logprobs: Vec<api::TokenLogprob>,
        /// Requests with tools: the pieces of calls written in this delta (for streaming).
        calls: Vec<CallDelta>,
    },
    Finish {
        reason: api::FinishReason,
        /// The calls the model made (requests with tools).
        tool_calls: Vec<ToolCall>,
        /// How many of them went out as [`CallDelta`]s already (their heads at least).
        streamed_calls: usize,
        prompt_tokens: u32,
        /// Prompt tokens the pool found in its prefix cache.
        cached_tokens: u32,
        completion_tokens: u32,
        /// Of the completion's tokens, a reasoning model's thinking (its markers included).
        reasoning_tokens: u32,
        time_to_first_token_ms: f64,
    },
}

#[cfg(test)]
impl GenerateEvent {
    /// A delta of one token (id 1) that adds `reasoning` and `text`, for the writers' tests.
    pub(crate) fn thinking(reasoning: &str, text: &str) -> Result<Self, GatewayError> {
        Ok(Self::Delta {
            text: text.into(),
            reasoning: reasoning.into(),
            token_ids: vec![1],
            logprobs: Vec::new(),
            calls: Vec::new(),
        })
    }
}

/// One choice's event, with the choice's index.
pub type Indexed = (usize, Result<GenerateEvent, GatewayError>);

/// Every choice's events as they come, each with its choice's index (its place in `choices`).
/// The stream ends after the first error, which fails the whole request: the other choices'
/// streams are dropped, which cancels their requests.
pub fn merge(choices: Vec<EventStream>) -> impl Stream<Item = Indexed> + Send {
    let tagged = choices
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.map(move |ev| (i, ev)));
    let all = futures::stream::select_all(tagged);
    futures::stream::unfold((all, false), |(mut all, failed)| async move {
        if failed {
            return None;
        }
        let (i, ev) = all.next().await?;
        let failed = ev.is_err();
        Some(((i, ev), (all, failed)))
    })
}

/// A piece of call `index`: its id and name first (`head`), then pieces of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallDelta {
    pub index: usize,
    /// The call's id and function name, in its first piece only.
    pub head: Option<(String, String)>,
    pub arguments: String,
}

struct State {
    upstream: Option<Upstream>,
    pending_first: Option<pb::GenerateResponse>,
    text: TextStream,
    prompt_tokens: u32,
    cached_tokens: u32,
    completion_tokens: u32,
    trace: RequestTrace,
    deadline: Option<Instant>,
    /// How long the pool may go without sending anything.
    idle: Duration,
    /// The model's text side, when the request asked for logprobs (it names their tokens).
    logprobs_of: Option<Arc<ModelText>>,
    /// Until the first message, where the request scores its prompt: the model's text side
    /// and the prompt's first id.
    scores: Option<(Arc<ModelText>, u32)>,
    /// The request generates nothing (`max_tokens` 0): the worker's one token is dropped.
    prompt_only: bool,
    /// With tools: the text, held back until the end, when it is read as calls or content.
    tools: Option<ToolText>,
    /// A reasoning model's chat: its thinking, told apart from its answer by token.
    reasoning: Option<Thinking>,
    done: bool,
}

/// A reasoning model's thinking so far: which part each token is, the thinking's own
/// detokenizer (no stop strings: they end the answer, not the thinking), and its tokens.
struct Thinking {
    split: Split,
    text: TextStream,
    tokens: u32,
    /// gpt-oss's: whether the body being written is a call (known from its first token on).
    calling: Option<bool>,
}

impl Thinking {
    /// Takes `token` where it is the thinking's (its text onto `thought`), a marker, or, for
    /// gpt-oss with `tools` that may be called, a call's (onto the calls): `false` where it is
    /// the answer's.
    fn take(
        &mut self,
        token: u32,
        thought: &mut String,
        tools: Option<&mut ToolText>,
    ) -> Result<bool, TextError> {
        match self.split.on_token(token) {
            Part::Content => return Ok(false),
            Part::Marker => self.calling = None,
            Part::Reasoning => {
                let harmony = tools.filter(|t| t.format == ToolFormat::Harmony);
                if let (Some(tools), Some(header)) = (harmony, self.split.header()) {
                    let calling = match self.calling {
                        Some(calling) => calling,
                        None => *self.calling.insert(tools.open_call(header)?),
                    };
                    if calling {
                        return tools.call_token(token).map(|()| true);
                    }
                }
                thought.push_str(&self.text.push(token)?.text);
            }
        }
        self.tokens += 1;
        Ok(true)
    }
}

/// The special tokens a request's answer keeps in its text: its tool format's markers, where
/// the tokenizer holds them as special tokens and the answer may hold calls (read from the
/// text at its end).
fn kept_markers(req: &ValidatedRequest) -> Vec<u32> {
    let Some((_, format)) = req.tools().filter(|(t, _)| t.may_call()) else {
        return Vec::new();
    };
    let tokenizer = &req.model_text().tokenizer;
    (format.markers().iter())
        .filter_map(|m| crate::tools::special_id(tokenizer, m))
        .collect()
}

/// The events of one request, from its upstream stream. Dropping the returned stream drops the
/// upstream, which cancels the worker's request.
/// Past `deadline` the stream ends with [`GatewayError::DeadlineExceeded`]; when the pool sends
/// nothing for `idle`, with UNAVAILABLE. The request's span and metrics (`trace`) end with the
/// stream.
pub fn events(
    req: &ValidatedRequest,
    upstream: Upstream,
    trace: RequestTrace,
    deadline: Option<Instant>,
    idle: Duration,
) -> impl Stream<Item = Result<GenerateEvent, GatewayError>> + Send + use<> {
    let text = req.model_text();
    let state = State {
        pending_first: Some(upstream.first.clone()),
        upstream: Some(upstream),
        text: TextStream::new(text.tokenizer.clone(), req.stop().to_vec())
            .keeping(kept_markers(req)),
        prompt_tokens: u32::try_from(req.prompt_ids().len()).unwrap_or(u32::MAX),
        cached_tokens: 0,
        completion_tokens: 0,
        trace,
        deadline,
        idle,
        logprobs_of: req.sampling().logprobs.is_some().then(|| text.clone()),
        scores: (req.sampling().prompt_logprobs.is_some())
            .then(|| (text.clone(), req.prompt_ids()[0])),
        prompt_only: req.prompt_only(),
        reasoning: req.reasoning_split().map(|split| Thinking {
            split,
            text: TextStream::new(text.tokenizer.clone(), Vec::new()),
            tokens: 0,
            calling: None,
        }),
        tools: req
            .tools()
            .filter(|(t, _)| t.may_call())
            .map(|(tools, format)| ToolText {
                tools: tools.clone(),
                format: *format,
                text: String::new(),
                prefix: format!("{:016x}", crate::tools::random_u64()),
                scanner: CallScanner::new(*format),
                tokenizer: text.tokenizer.clone(),
                read: Vec::new(),
                pending: Vec::new(),
            }),
        done: false,
    };
    futures::stream::unfold(state, |st| {
        // OpenTelemetry ends a span at its last exit: enter the request's (and the upstream
        // call's) span while handling each message, so they end with the last one.
        let span = st.trace.span().clone();
        let upstream_span = st.upstream.as_ref().map(|u| u.span.clone());
        async move { st.next_events().await }
            .instrument(upstream_span.unwrap_or_else(tracing::Span::none))
            .instrument(span)
    })
    .flat_map(futures::stream::iter)
}

impl State {
    /// The events of the next upstream message (`None` once done).
    async fn next_events(self) -> Option<(Vec<Result<GenerateEvent, GatewayError>>, Self)> {
        let mut st = self;
        if st.done {
            return None;
        }
        let msg = match st.pending_first.take() {
            Some(m) => Ok(m),
            None => {
                let patience = Instant::now() + st.idle;
                let until = st.deadline.map_or(patience, |d| d.min(patience));
                let (idle, pool) = (st.idle, st.upstream.as_ref()?.pool.clone());
                let next = st.upstream.as_mut()?.rest.next();
                let next = tokio::time::timeout_at(until.into(), next)
                    .await
                    .map_err(|_| {
                        if until < patience {
                            GatewayError::DeadlineExceeded
                        } else {
                            GatewayError::Unavailable(format!(
                                "pool {pool} sent no token for {idle:?}"
                            ))
                        }
                    });
                match next {
                    Ok(Some(Ok(m))) => Ok(m),
                    Ok(Some(Err(s))) => Err(GatewayError::from_worker(&s)),
                    Ok(None) => Err(GatewayError::Unavailable(
                        "the worker stream ended without a finish".into(),
                    )),
                    Err(e) => Err(e),
                }
            }
        };
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                st.done = true;
                st.trace.failed(&e);
                // Dropping the upstream cancels the worker's request.
                st.upstream = None;
                return Some((vec![Err(e)], st));
            }
        };
        Some((st.on_message(msg), st))
    }

    /// Ends the stream with a detokenization error.
    fn fail(&mut self, e: TextError) -> Vec<Result<GenerateEvent, GatewayError>> {
        self.done = true;
        let e = GatewayError::Internal(format!("detokenizing: {e}"));
        self.trace.failed(&e);
        vec![Err(e)]
    }

    fn on_message(
        &mut self,
        msg: pb::GenerateResponse,
    ) -> Vec<Result<GenerateEvent, GatewayError>> {
        let mut out = Vec::new();
        let mut emit = String::new();
        let mut thought = String::new();
        let mut stopped = false;
        let mut token_ids = Vec::new();
        let mut logprobs = Vec::new();
        if let Some(c) = msg.cached_tokens {
            self.cached_tokens = c;
        }
        if let Some((text, first)) = self.scores.take() {
            out.push(Ok(prompt_event(&text, first, &msg.prompt_logprobs)));
        }
        let tokens = match self.prompt_only {
            true => &[][..],
            false => &msg.tokens[..],
        };
        for t in tokens {
            self.completion_tokens += 1;
            token_ids.push(t.id);
            if let Some(text) = &self.logprobs_of {
                logprobs.push(token_logprob(text, t));
            }
            let taken =
                (self.reasoning.as_mut()).map(|r| r.take(t.id, &mut thought, self.tools.as_mut()));
            match taken {
                Some(Ok(true)) => continue,
                Some(Err(e)) => return self.fail(e),
                Some(Ok(false)) | None => {}
            }
            match self.text.push(t.id) {
                Ok(o) => {
                    emit.push_str(&o.text);
                    stopped |= o.stopped.is_some();
                }
                Err(e) => return self.fail(e),
            }
        }
        let finish =
            pb::FinishReason::try_from(msg.finish_reason).unwrap_or(pb::FinishReason::Unspecified);
        let last = finish != pb::FinishReason::Unspecified;
        if let Some(r) = self.reasoning.as_mut().filter(|_| last || stopped) {
            match r.text.finish() {
                Ok(o) => thought.push_str(&o.text),
                Err(e) => return self.fail(e),
            }
        }
        if last && !stopped {
            match self.text.finish() {
                Ok(o) => {
                    emit.push_str(&o.text);
                    stopped = o.stopped.is_some();
                }
                Err(e) => return self.fail(e),
            }
        }
        let mut reason = match finish {
            // max_tokens 0 ends it, whatever the dropped token was.
            _ if self.prompt_only => api::FinishReason::Length,
            _ if stopped => api::FinishReason::Stop,
            pb::FinishReason::Length => api::FinishReason::Length,
            _ => api::FinishReason::Stop,
        };
        let ttft_ms = self.trace.delta(token_ids.len()) * 1e3;
        let (mut tool_calls, mut calls, mut streamed_calls) = (Vec::new(), Vec::new(), 0);
        let flushed = (self.tools.as_mut())
            .filter(|_| last || stopped)
            .map_or(Ok(()), ToolText::flush_calls);
        if let Err(e) = flushed {
            return self.fail(e);
        }
        if let Some(t) = &mut self.tools {
            t.text.push_str(&std::mem::take(&mut emit));
            calls = t.pieces();
            if last || stopped {
                let (content, found, called) = t.finish(reason);
                (emit, tool_calls, reason) = (content, found, called);
                streamed_calls = t.streamed();
            }
        }
        if !self.prompt_only {
            out.push(Ok(GenerateEvent::Delta {
                text: emit,
                reasoning: thought,
                token_ids,
                logprobs,
                calls,
            }));
        }
        if last || stopped {
            self.done = true;
            // Dropping the upstream cancels the worker's request (stop string case).
            self.upstream = None;
            self.trace.finished(
                match reason {
                    api::FinishReason::Length => "length",
                    _ => "stop",
                },
                self.completion_tokens,
            );
            out.push(Ok(GenerateEvent::Finish {
                reason,
                tool_calls,
                streamed_calls,
                prompt_tokens: self.prompt_tokens,
                cached_tokens: self.cached_tokens,
                completion_tokens: self.completion_tokens,
                reasoning_tokens: self.reasoning.as_ref().map_or(0, |r| r.tokens),
                time_to_first_token_ms: ttft_ms,
            }));
        }
        out
    }
}

/// A tool request's text so far, and how to read it: as it is written (for streaming) and
/// when it ends. gpt-oss's calls are not in the text: they come token by token.
struct ToolText {
    tools: Arc<Tools>,
    format: ToolFormat,
    text: String,
    /// Names this answer's calls (`call_<prefix>_<i>`), streamed or parsed at the end alike.
    prefix: String,
    scanner: CallScanner,
    tokenizer: ferrite_text::Tokenizer,
    /// gpt-oss's calls so far, each with its arguments' detokenizer.
    read: Vec<(ToolCall, TextStream)>,
    /// Pieces of them not yet sent.
    pending: Vec<CallDelta>,
}

impl ToolText {
    /// Whether a gpt-oss body whose header's words are `header` is a call; if so, it is
    /// the next call, its head the next piece.
    fn open_call(&mut self, header: &[Vec<u32>]) -> Result<bool, TextError> {
        let Some(name) = crate::harmony::function(&self.tokenizer, header)? else {
            return Ok(false);
        };
        let index = self.read.len();
        let id = crate::tools::call_id(&self.prefix, index);
        self.pending.push(CallDelta {
            index,
            head: Some((id.clone(), name.clone())),
            arguments: String::new(),
        });
        let call = ToolCall {
            id,
            name,
            arguments: String::new(),
        };
        let text = TextStream::new(self.tokenizer.clone(), Vec::new());
        self.read.push((call, text));
        Ok(true)
    }

    /// The next token of the last call's arguments.
    fn call_token(&mut self, token: u32) -> Result<(), TextError> {
        let index = self.read.len().saturating_sub(1);
        let Some((call, text)) = self.read.last_mut() else {
            return Ok(());
        };
        let piece = text.push(token)?.text;
        add_arguments(call, &mut self.pending, index, piece);
        Ok(())
    }

    /// The pieces of calls the text (or gpt-oss's tokens) added since the last time.
    fn pieces(&mut self) -> Vec<CallDelta> {
        if self.format == ToolFormat::Harmony {
            return std::mem::take(&mut self.pending);
        }
        self.scanner
            .advance(&self.text)
            .into_iter()
            .map(|p| match p {
                CallPiece::Head { index, name } => CallDelta {
                    index,
                    head: Some((crate::tools::call_id(&self.prefix, index), name)),
                    arguments: String::new(),
                },
                CallPiece::Arguments { index, text } => CallDelta {
                    index,
                    head: None,
                    arguments: text,
                },
            })
            .collect()
    }

    /// The output ended: what gpt-oss's calls' detokenizers held back goes out.
    fn flush_calls(&mut self) -> Result<(), TextError> {
        for (index, (call, text)) in self.read.iter_mut().enumerate() {
            let rest = text.finish()?.text;
            add_arguments(call, &mut self.pending, index, rest);
        }
        Ok(())
    }

    /// Calls whose head has been streamed.
    fn streamed(&self) -> usize {
        self.scanner.streamed() + self.read.len()
    }

    /// The content, the calls and the finish reason of the whole text: `tool_calls` when the
    /// model chose to call (OpenAI says `stop` for a call it was told to make by name).
    fn finish(&mut self, reason: api::FinishReason) -> (String, Vec<ToolCall>, api::FinishReason) {
        let mut out = self.tools.parse(self.format, &self.text, &self.prefix);
        out.calls
            .extend(self.read.iter().map(|(call, _)| call.clone()));
        let chose = !matches!(self.tools.choice, ToolChoice::Named(_));
        let reason = if !out.calls.is_empty() && chose && reason == api::FinishReason::Stop {
            api::FinishReason::ToolCalls
        } else {
            reason
        };
        (out.content, out.calls, reason)
    }
}

/// `piece` of gpt-oss's call `index` (`call`): onto its arguments, and out as a piece.
fn add_arguments(call: &mut ToolCall, pending: &mut Vec<CallDelta>, index: usize, piece: String) {
    if !piece.is_empty() {
        call.arguments.push_str(&piece);
        pending.push(CallDelta {
            index,
            head: None,
            arguments: piece,
        });
    }
}

/// The event of a prompt whose first token is `first` and whose next ones scored `scores`.
fn prompt_event(text: &ModelText, first: u32, scores: &[pb::Token]) -> GenerateEvent {
    GenerateEvent::Prompt {
        first: token_text(text, first).0,
        logprobs: scores.iter().map(|t| token_logprob(text, t)).collect(),
    }
}

/// The scores of `req`'s prompt, as its first choice's first message (`first`) brought them,
/// for its later choices to share (they then do not score it again).
pub fn shared_prompt_event(req: &ValidatedRequest, first: &pb::GenerateResponse) -> GenerateEvent {
    prompt_event(req.model(), req.prompt_ids()[0], &first.prompt_logprobs)
}

/// Token `t` and its logprobs, each token named by its text.
fn token_logprob(text: &ModelText, t: &pb::Token) -> api::TokenLogprob {
    let (token, bytes) = token_text(text, t.id);
    let top = (t.top.iter())
        .map(|x| {
            let (token, bytes) = token_text(text, x.token_id);
            api::TopLogprob {
                token_id: x.token_id,
                logprob: x.logprob,
                token,
                bytes,
            }
        })
        .collect();
    api::TokenLogprob {
        token_id: t.id,
        logprob: t.logprob,
        top,
        token,
        bytes,
    }
}

/// Token `id`'s text and bytes, as OpenAI's logprobs name a token: its bytes as UTF-8 where
/// they are, else `bytes:` and their escapes (a token ending inside a character).
pub fn token_text(text: &ModelText, id: u32) -> (String, Vec<u8>) {
    let bytes = match text.token_bytes() {
        Some(b) => b.get(id).to_vec(),
        None => text
            .tokenizer
            .decode(&[id], false)
            .unwrap_or_default()
            .into_bytes(),
    };
    let token = match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let escaped: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("bytes:{escaped}")
        }
    };
    (token, bytes)
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
