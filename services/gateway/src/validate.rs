//! Turning a public request into a [`ValidatedRequest`], the only way to build one: the
//! routing and streaming code never re-checks.

use std::sync::Arc;

use ferrite_proto::v1 as api;
use ferrite_proto::worker::v1 as pb;
use ferrite_structured::Spec;
use ferrite_text::reasoning::{Reasoning, Split, State};
use ferrite_text::{ChatMessage, TemplateKwargs};

use crate::error::GatewayError;
use crate::models::ModelText;
use crate::tools::{self, PastCall, ToolFormat, Tools};

pub const DEFAULT_MAX_TOKENS: u32 = 256;
pub const MAX_STOP_STRINGS: usize = 16;

/// A request that passed validation: token ids inside the vocabulary, within the context,
/// sampling parameters in their ranges ([`ferrite_proto::sampling`]).
#[derive(Debug, Clone)]
pub struct ValidatedRequest {
    text: Arc<ModelText>,
    prompt_ids: Vec<u32>,
    sampling: pb::SamplingParams,
    stop: Vec<String>,
    /// The grammar the output follows (checked: it compiles), as the worker API carries it.
    grammar: Option<String>,
    /// The tools the model may call, and the format it calls them in.
    tools: Option<(Arc<Tools>, ToolFormat)>,
    /// `max_tokens` 0 with prompt logprobs: the prompt is scored and nothing generated (the
    /// worker is asked for one token, which is dropped).
    prompt_only: bool,
    /// An embeddings request: the worker answers with the prompt's embedding.
    embed: Option<pb::EmbedOptions>,
    /// A reasoning model's chat: its markers, and where the output starts.
    reasoning: Option<(Reasoning, State)>,
}

/// What a request's output must follow, and the request field that asked for it (named by
/// a refusal).
#[derive(Debug, Clone)]
pub struct Constraint {
    pub spec: Spec,
    pub field: &'static str,
}

impl ValidatedRequest {
    pub fn model(&self) -> &ModelText {
        &self.text
    }

    pub fn model_text(&self) -> Arc<ModelText> {
        self.text.clone()
    }

    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }

    pub fn sampling(&self) -> &pb::SamplingParams {
        &self.sampling
    }

    pub fn stop(&self) -> &[String] {
        &self.stop
    }

    /// The tools the model may call, and the format it calls them in.
    pub fn tools(&self) -> Option<&(Arc<Tools>, ToolFormat)> {
        self.tools.as_ref()
    }

    /// A reasoning model's chat: how its output comes apart into thinking and answer.
    pub fn reasoning_split(&self) -> Option<Split> {
        self.reasoning.map(|(r, state)| r.split_from(state))
    }

    /// The request scores its prompt and generates nothing (`max_tokens` 0).
    pub fn prompt_only(&self) -> bool {
        self.prompt_only
    }

    /// The context a pool needs for this request: its prompt and `max_tokens`.
    pub fn context_needed(&self) -> usize {
        self.prompt_ids.len() + self.sampling.max_tokens as usize
    }

    /// Choice `index` of a request for several (OpenAI's `n`): the same request, whose seed, if
    /// it has one, is the request's plus `index`, so that seeded choices differ from one another
    /// and each is reproduced by the same request.
    pub fn for_choice(&self, index: u32) -> Self {
        let mut choice = self.clone();
        if let Some(seed) = choice.sampling.seed.as_mut() {
            *seed = seed.wrapping_add(u64::from(index));
        }
        choice
    }

    /// The same request, not scoring its prompt (a later choice, given its first choice's
    /// scores); with `max_tokens` 0 it still generates nothing.
    pub fn without_prompt_scores(mut self) -> Self {
        self.sampling.prompt_logprobs = None;
        self
    }

    /// The same request, for the prompt's embedding (its first `dimensions` values; 0: all),
    /// or with `classify` a sequence classifier's logits.
    pub fn embedding(mut self, dimensions: u32, classify: bool) -> Self {
        self.embed = Some(pb::EmbedOptions {
            dimensions,
            classify,
        });
        self
    }

    pub fn worker_request(&self) -> pb::GenerateRequest {
        pb::GenerateRequest {
            prompt_token_ids: self.prompt_ids.clone(),
            sampling: Some(self.sampling.clone()),
            grammar: self.grammar.clone(),
            embed: self.embed,
            lora: self.text.lora.clone(),
            // The grammar holds the answer, not the thinking.
            reasoning: self.reasoning_span().filter(|_| self.grammar.is_some()),
        }
    }

    /// Where a reasoning model's chat thinks, as the worker API says it.
    fn reasoning_span(&self) -> Option<pb::ReasoningSpan> {
        let (r, state) = match self.reasoning {
            Some((Reasoning::Think(r), state)) => (r, state),
            // Refused with a grammar at validation.
            Some((Reasoning::Harmony(_), _)) | None => return None,
        };
        Some(pb::ReasoningSpan {
            start_token: r.start,
            end_token: r.end,
            start: match state {
                State::Start => pb::ReasoningStart::MayOpen,
                State::Thinking => pb::ReasoningStart::Thinking,
                State::Answering => pb::ReasoningStart::Answering,
            } as i32,
        })
    }
}

/// The prompt forms a request can carry.
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Chat(Chat),
    TokenIds(Vec<u32>),
}

/// A chat prompt: its messages, and what its template gets besides them
/// (`chat_template_kwargs`, over the model's defaults).
#[derive(Debug, Clone, Default)]
pub struct Chat {
    pub messages: Vec<ChatMessage>,
    pub kwargs: TemplateKwargs,
}

impl Chat {
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        Self {
            messages,
            kwargs: TemplateKwargs::new(),
        }
    }

    /// `chat_template_kwargs` (JSON text, empty for none), checked as it comes.
    pub fn with_kwargs_json(mut self, json: &str) -> Result<Self, GatewayError> {
        if !json.trim().is_empty() {
            self.kwargs =
                ferrite_text::chat::parse_kwargs(json).map_err(|e| GatewayError::InvalidField {
                    field: "chat_template_kwargs",
                    message: e.to_string(),
                })?;
        }
        Ok(self)
    }
}

impl Prompt {
    /// A request's prompt, with its chat's `chat_template_kwargs` (JSON text; empty: none).
    pub fn from_proto(
        p: Option<api::generate_request::Prompt>,
        kwargs: &str,
    ) -> Result<Self, GatewayError> {
        use api::generate_request::Prompt as P;
        match p {
            Some(P::Text(t)) => Ok(Prompt::Text(t)),
            Some(P::Chat(c)) => c
                .messages
                .into_iter()
                .map(chat_message_of)
                .collect::<Result<_, _>>()
                .map(Chat::new)?
                .with_kwargs_json(kwargs)
                .map(Prompt::Chat),
            Some(P::TokenIds(t)) => Ok(Prompt::TokenIds(t.ids)),
            None => Err(GatewayError::InvalidArgument(
                "the request has no prompt (text, chat or token_ids)".into(),
            )),
        }
    }
}

/// How a chat with tools is put before `text`'s model: in the format its template knows, or
/// the generic one.
pub fn tool_format(text: &ModelText) -> ToolFormat {
    if matches!(text.reasoning, Some(Reasoning::Harmony(_))) {
        return ToolFormat::Harmony;
    }
    let template = text.tokenizer.chat_template();
    ToolFormat::of(template.filter(|t| t.takes_tools()).map(|t| t.source()))
}

/// A `ferrite.v1` chat message, checked as the OpenAI API checks its own.
fn chat_message_of(m: api::ChatMessage) -> Result<ChatMessage, GatewayError> {
    let bad = |message: String| GatewayError::InvalidField {
        field: "chat",
        message,
    };
    let calls = m
        .tool_calls
        .into_iter()
        .map(|c| PastCall::new(c.id, c.name, &c.arguments))
        .collect::<Result<_, _>>()
        .map_err(bad)?;
    let id = Some(m.tool_call_id).filter(|id| !id.is_empty());
    let mut message = tools::chat_message(&m.role, m.content, calls, id).map_err(bad)?;
    message.reasoning_content = Some(m.reasoning).filter(|r| !r.is_empty());
    Ok(message)
}

/// Renders and tokenizes `prompt` for `text`'s model, with `tools` for a chat. Returns the
/// ids and, for chats, the rendered prompt.
pub fn tokenize(
    text: &ModelText,
    prompt: &Prompt,
    tools: Option<&Tools>,
) -> Result<(Vec<u32>, Option<String>), GatewayError> {
    let bad = |m: String| GatewayError::InvalidArgument(m);
    match prompt {
        Prompt::Text(t) => {
            if t.is_empty() {
                return Err(bad("the prompt is empty".into()));
            }
            let ids = text.encode_text(t, None).map_err(|e| bad(e.to_string()))?;
            Ok((ids, None))
        }
        Prompt::Chat(Chat { messages, kwargs }) => {
            if messages.is_empty() {
                return Err(bad("the chat has no messages".into()));
            }
            let template = text.tokenizer.chat_template().ok_or_else(|| {
                bad(format!(
                    "model `{}` has no chat template; send text or token_ids",
                    text.name
                ))
            })?;
            let harmony;
            let messages = match text.reasoning {
                Some(Reasoning::Harmony(_)) => {
                    harmony = crate::harmony::template_messages(messages);
                    &harmony
                }
                _ => messages,
            };
            // The request's variables over the model's defaults.
            let mut vars = text.template_kwargs.clone();
            vars.extend(kwargs.clone());
            let rendered = match tools.map(|t| (t, tool_format(text))) {
                None => template.render_with(messages, None, true, &vars),
                Some((t, ToolFormat::Generic)) => {
                    template.render_with(&t.generic_messages(messages.clone()), None, true, &vars)
                }
                Some((t, _)) => {
                    template.render_with(messages, Some(&t.for_template()), true, &vars)
                }
            }
            .map_err(|e| bad(format!("chat template: {e}")))?;
            let ids = text
                .tokenizer
                .encode(&rendered, false)
                .map_err(|e| bad(e.to_string()))?;
            Ok((ids, Some(rendered)))
        }
        Prompt::TokenIds(ids) => Ok((ids.clone(), None)),
    }
}

/// The wire form of `constraint`'s grammar for `text`'s model, once llguidance compiled it
/// here: a schema or grammar it cannot compile is the request's fault, named by its field.
fn grammar(text: &ModelText, constraint: &Constraint) -> Result<String, GatewayError> {
    let bad = |e: ferrite_structured::GrammarError| GatewayError::InvalidField {
        field: constraint.field,
        message: e.to_string(),
    };
    // Bounded where the gateway says so (`--json-schema-bounds`), so that a small model ends.
    let (grammar, _) = text
        .vocabulary()?
        .compile_spec(&constraint.spec, text.json_bounds)
        .map_err(bad)?;
    Ok(grammar.to_wire())
}

/// Validates a request for `text`'s model, whose pools hold at most `context` tokens (prompt
/// plus output) per request. A blocking call: it tokenizes, and compiles a constraint.
pub fn validate(
    text: Arc<ModelText>,
    context: usize,
    prompt: &Prompt,
    sampling: Option<api::SamplingParams>,
    constraint: Option<&Constraint>,
    tools: Option<Arc<Tools>>,
) -> Result<ValidatedRequest, GatewayError> {
    let bad = |m: String| Err(GatewayError::InvalidArgument(m));
    if tools.is_some() && !matches!(prompt, Prompt::Chat(_)) {
        return Err(GatewayError::InvalidField {
            field: "tools",
            message: "tools need a chat prompt".into(),
        });
    }
    let (prompt_ids, _) = tokenize(&text, prompt, tools.as_deref())?;
    if prompt_ids.is_empty() {
        return bad("the prompt is empty".into());
    }
    if let Some(id) = prompt_ids
        .iter()
        .find(|&&id| id as usize >= text.vocab_size)
    {
        return bad(format!(
            "token id {id} is outside the vocabulary (size {})",
            text.vocab_size
        ));
    }
    let limit = context;
    if prompt_ids.len() >= limit {
        return bad(format!(
            "the prompt has {} tokens; `{}` takes {} at most (its context length {limit}, less \
             one new token)",
            prompt_ids.len(),
            text.name,
            limit - 1
        ));
    }
    let s = sampling.unwrap_or_default();
    let room = limit - prompt_ids.len();
    // Unset, it is what fits (at most the default), so a request without it cannot be refused.
    let max_tokens = s
        .max_tokens
        .unwrap_or(DEFAULT_MAX_TOKENS.min(u32::try_from(room).unwrap_or(u32::MAX)));
    // 0 scores the prompt alone: the worker makes one token, which is dropped.
    let prompt_only = max_tokens == 0 && s.prompt_logprobs.is_some();
    let max_tokens = max_tokens.max(u32::from(prompt_only));
    if max_tokens == 0 || max_tokens as usize > room {
        return bad(format!(
            "max_tokens {max_tokens} is out of range: it must be between 1 and {room} (the context length {limit} minus the prompt's {} tokens), or 0 to score the prompt alone (with prompt_logprobs, or /v1/completions' echo)",
            prompt_ids.len()
        ));
    }
    if s.stop.len() > MAX_STOP_STRINGS || s.stop.iter().any(String::is_empty) {
        return bad(format!(
            "stop: at most {MAX_STOP_STRINGS} non-empty strings"
        ));
    }
    // A field the request leaves unset: the model's recommendation, else the neutral value.
    let d = &text.sampling_defaults;
    let sampling = pb::SamplingParams {
        max_tokens,
        temperature: s.temperature.or(d.temperature).unwrap_or(1.0),
        top_k: s.top_k.or(d.top_k).unwrap_or(0),
        top_p: s.top_p.or(d.top_p).unwrap_or(1.0),
        min_p: s.min_p.or(d.min_p).unwrap_or(0.0),
        seed: s.seed,
        repetition_penalty: s.repetition_penalty.or(d.repetition_penalty).unwrap_or(1.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        stop_token_ids: s.stop_token_ids,
        ignore_eos: s.ignore_eos,
        logprobs: s.logprobs,
        logit_bias: s.logit_bias,
        prompt_logprobs: s.prompt_logprobs,
    };
    // The same ranges the engine admits: a bad value is refused here, not by a worker.
    ferrite_proto::sampling::check(&sampling).map_err(GatewayError::InvalidArgument)?;
    // A reasoning model's chats think before they answer (completions' raw text does not).
    let reasoning = (text.reasoning)
        .filter(|_| matches!(prompt, Prompt::Chat(_)))
        .map(|r| (r, r.state_after(&prompt_ids)));
    let tools = tools.map(|t| {
        let format = tool_format(&text);
        (t, format)
    });
    let special = |marker: &str| crate::tools::special_id(&text.tokenizer, marker);
    let constraint = output_constraint(
        constraint,
        tools.as_ref().map(|(t, f)| (t.as_ref(), *f)),
        reasoning,
        &special,
    )?;
    let grammar = constraint.map(|c| grammar(&text, &c)).transpose()?;
    Ok(ValidatedRequest {
        text,
        prompt_ids,
        sampling,
        stop: s.stop,
        grammar,
        tools,
        prompt_only,
        embed: None,
        reasoning,
    })
}

/// What the output follows: the request's `constraint`, or the grammar its `tools` need (in
/// the format they are called in), or, for gpt-oss (harmony `reasoning`), a grammar of its
/// channels holding either. Refused where both hold the whole output.
fn output_constraint(
    constraint: Option<&Constraint>,
    tools: Option<(&Tools, ToolFormat)>,
    reasoning: Option<(Reasoning, State)>,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Result<Option<Constraint>, GatewayError> {
    if let Some((Reasoning::Harmony(h), state)) = reasoning {
        // The answer's schema is the request's constraint's, named by its field.
        let field = constraint.map_or("tools", |c| c.field);
        let answer = constraint.map(|c| c.spec.clone());
        return crate::harmony::grammar(&h, state, answer, tools.map(|(t, _)| t))
            .map(|spec| spec.map(|spec| Constraint { spec, field }))
            .map_err(|message| GatewayError::InvalidField {
                field: "tools",
                message,
            });
    }
    let tool_constraint = tools.and_then(|(t, f)| t.constraint(f, special));
    match (constraint, tool_constraint) {
        (Some(_), Some(_)) => Err(GatewayError::InvalidField {
            field: "tools",
            message: "tools that must be called (or a model without its own tool format) \
                      cannot also follow response_format or structured_outputs"
                .into(),
        }),
        (Some(c), None) => Ok(Some(c.clone())),
        (None, t) => Ok(t.map(|spec| Constraint {
            spec,
            field: "tools",
        })),
    }
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
