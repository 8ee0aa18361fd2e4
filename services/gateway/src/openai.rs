//! The OpenAI request bodies: what ferrite reads from them, and a clear refusal (400, naming the
//! field) of every field it would otherwise ignore while the client counts on it (a suffix,
//! candidates beyond the choices returned, the legacy functions).
//!
//! Completions' `echo` puts the prompt before each choice's text, and with `logprobs` its
//! tokens' logprobs before the completion's (the first token's null), as an evaluation
//! harness asks for loglikelihoods; with `max_tokens` 0 nothing is generated.
//!
//! Structured outputs come as OpenAI's `response_format` (`json_object`, `json_schema`) or as
//! vLLM's `structured_outputs` extension (`json`, `regex`, `choice`, `grammar` in Lark).

use ferrite_proto::v1 as api;
use ferrite_structured::Spec;
use serde::Deserialize;
use serde_json::Value;

use crate::api_error::ApiError;
use crate::tools::{self, Function, PastCall, ToolChoice, Tools};
use crate::validate::{Chat, Constraint, Prompt};

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
    /// Chat: a bool (with `top_logprobs` alternatives); completions: the count of alternatives.
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    functions: Option<Value>,
    function_call: Option<Value>,
    response_format: Option<Value>,
    structured_outputs: Option<Value>,
    echo: Option<bool>,
    /// A reasoning model's thinking in the answer (vLLM's; default true).
    include_reasoning: Option<bool>,
    /// OpenAI's `reasoning_effort`: the chat template's `reasoning_effort` (as vLLM passes it).
    reasoning_effort: Option<String>,
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
    /// More variables for the chat template (vLLM's; Qwen3's `enable_thinking`).
    pub chat_template_kwargs: Option<Value>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Value,
    /// An assistant message's calls.
    tool_calls: Option<Value>,
    /// A tool message's call.
    tool_call_id: Option<String>,
    /// A past assistant message's thinking (DeepSeek's and vLLM's older name, and vLLM's
    /// newer one).
    reasoning_content: Option<String>,
    reasoning: Option<String>,
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

    /// Whether a reasoning model's thinking comes back (`include_reasoning`, default true).
    pub fn include_reasoning(&self) -> bool {
        self.include_reasoning != Some(false)
    }

    /// `reasoning_effort`, checked, for the chat template.
    pub fn reasoning_effort(&self) -> Result<Option<&str>, ApiError> {
        effort(self.reasoning_effort.as_deref(), "reasoning_effort")
    }

    /// How many choices to make (`n`; 1 unset).
    pub fn choices(&self) -> Result<u32, ApiError> {
        ferrite_proto::sampling::choices(self.n).map_err(|e| ApiError::invalid(e, Some("n")))
    }

    /// Refuses every field that ferrite does not serve, rather than ignoring it.
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let unsupported = |param: &'static str, what: &str| {
            Err(ApiError::invalid(
                format!("`{param}` is not supported: {what}"),
                Some(param),
            ))
        };
        // best_of = n draws no more candidates than are returned: nothing to choose among.
        if self.best_of.is_some_and(|b| b != 1 && Some(b) != self.n) {
            return unsupported("best_of", "no candidates beyond the `n` choices returned");
        }
        let legacy = [
            ("functions", &self.functions),
            ("function_call", &self.function_call),
        ];
        for (param, v) in legacy {
            // "none" and "auto" without functions mean no call: harmless.
            let off = matches!(v.as_ref().and_then(Value::as_str), Some("none" | "auto"));
            if set(v) && !off {
                return unsupported(param, "send `tools` and `tool_choice` instead");
            }
        }
        if set(&self.suffix) {
            return unsupported("suffix", "no insertion after a suffix");
        }
        Ok(())
    }

    /// Whether the prompt comes back before each choice's text (`echo`).
    pub fn echo(&self) -> bool {
        self.echo == Some(true)
    }

    /// The sampling parameters of the request, after refusing what is not served. Ranges are
    /// checked by validation, as for gRPC requests.
    pub fn sampling(&self) -> Result<api::SamplingParams, ApiError> {
        self.refuse_unsupported()?;
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        let logprobs = self.logprobs()?;
        // An echoed prompt's tokens are scored where logprobs are asked for, and where the
        // prompt is all that comes back (max_tokens 0 is a scoring request).
        let prompt_logprobs = match (self.echo(), logprobs, max_tokens) {
            (true, Some(n), _) => Some(n),
            (true, None, Some(0)) => Some(0),
            _ => None,
        };
        Ok(api::SamplingParams {
            max_tokens,
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
            logprobs,
            ignore_eos: self.ignore_eos,
            logit_bias: self.logit_bias()?,
            prompt_logprobs,
        })
    }

    /// OpenAI's `logit_bias`: token ids (as strings) to biases; their ranges are checked by
    /// validation, as for gRPC requests.
    fn logit_bias(&self) -> Result<Vec<api::LogitBias>, ApiError> {
        let bad = |m: String| Err(ApiError::invalid(m, Some("logit_bias")));
        let map = match &self.logit_bias {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Object(map)) => map,
            Some(_) => return bad("logit_bias must map token ids to biases".into()),
        };
        let mut out = Vec::with_capacity(map.len());
        for (key, value) in map {
            let Ok(token) = key.trim().parse::<u32>() else {
                return bad(format!("logit_bias key `{key}` is not a token id"));
            };
            let Some(bias) = value.as_f64() else {
                return bad(format!("logit_bias for token {token} is not a number"));
            };
            out.push(api::LogitBias {
                token,
                bias: bias as f32,
            });
        }
        Ok(out)
    }

    /// The alternatives to return per token, if logprobs are asked for: chat's `logprobs:
    /// true` with `top_logprobs` (default 0), or completions' `logprobs: n`.
    fn logprobs(&self) -> Result<Option<u32>, ApiError> {
        let bad = |m: &str, param| Err(ApiError::invalid(m.to_owned(), Some(param)));
        let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let top = match &self.top_logprobs {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) => Some(count(n)),
                None => return bad("top_logprobs must be a whole number", "top_logprobs"),
            },
        };
        match &self.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => match top {
                Some(n) if n > 0 => bad("top_logprobs needs logprobs: true", "top_logprobs"),
                _ => Ok(None),
            },
            Some(Value::Bool(true)) => Ok(Some(top.unwrap_or(0))),
            Some(v) => match (v.as_u64(), top) {
                (Some(n), None) => Ok(Some(count(n))),
                (Some(_), Some(_)) => bad(
                    "top_logprobs goes with chat's logprobs: true; completions take logprobs: n",
                    "top_logprobs",
                ),
                (None, _) => bad(
                    "logprobs must be a boolean (chat) or a whole number (completions)",
                    "logprobs",
                ),
            },
        }
    }

    /// The request's tools, unless it has none.
    pub fn tools(&self) -> Result<Option<Tools>, ApiError> {
        let named = ToolNaming {
            read: |v| v["function"]["name"].as_str(),
            shape: "{\"type\": \"function\", \"function\": {\"name\": ...}}",
        };
        tools_of(
            (self.tools.as_ref(), self.tool_choice.as_ref()),
            self.parallel_tool_calls,
            function,
            named,
        )
    }

    /// What the output must follow: `response_format` or `structured_outputs` (not both).
    pub fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        let format = response_format(self.response_format.as_ref())?;
        let extension = structured_outputs(self.structured_outputs.as_ref())?;
        match (format, extension) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "give response_format or structured_outputs, not both",
                Some("structured_outputs"),
            )),
            (a, b) => Ok(a.or(b)),
        }
    }
}

/// How a `tool_choice` object names its function: where the name is, and the shape to say
/// when it is not there.
pub(crate) struct ToolNaming {
    pub read: fn(&Value) -> Option<&str>,
    pub shape: &'static str,
}

/// A request's tools (each read by `function`) and its `tool_choice` among them: `none`,
/// `auto` (the default), `required`, or an object naming one function.
pub(crate) fn tools_of(
    (tools, choice): (Option<&Value>, Option<&Value>),
    parallel: Option<bool>,
    function: fn(usize, &Value) -> Result<Function, ApiError>,
    named: ToolNaming,
) -> Result<Option<Tools>, ApiError> {
    let functions: Vec<Function> = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, t)| function(i, t))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid("`tools` must be a list", Some("tools"))),
    };
    let bad = |m: String| ApiError::invalid(format!("`tool_choice`: {m}"), Some("tool_choice"));
    let choice = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "`{other}` is not none, auto, required or a function"
                )));
            }
        },
        Some(v) => match (named.read)(v) {
            Some(name) => ToolChoice::Named(name.to_owned()),
            None => return Err(bad(format!("a named choice is {}", named.shape))),
        },
    };
    Tools::new(functions, choice, parallel.unwrap_or(true)).map_err(bad)
}

/// Tool `i` of a request: `{"type": "function", "function": {"name", "description",
/// "parameters"}}`.
fn function(i: usize, tool: &Value) -> Result<Function, ApiError> {
    if tool["type"] != "function" {
        return Err(tool_error(i, "`type` must be \"function\"".into()));
    }
    function_fields(i, &tool["function"], "function.name")
}

/// `tools[i]`'s error.
pub(crate) fn tool_error(i: usize, m: String) -> ApiError {
    ApiError::invalid(format!("`tools[{i}]`: {m}"), Some("tools"))
}

/// A function tool's `name`, `description` and `parameters`: chat's `function` object, or
/// the Responses API's flat tool; `name_field` is what a missing name is called.
pub(crate) fn function_fields(i: usize, f: &Value, name_field: &str) -> Result<Function, ApiError> {
    let name = f["name"]
        .as_str()
        .ok_or_else(|| tool_error(i, format!("no `{name_field}`")))?;
    let description = f["description"].as_str().map(str::to_owned);
    Function::new(name, description, f.get("parameters").cloned()).map_err(|m| tool_error(i, m))
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object`, or `json_schema` with its
/// `schema` (default: any JSON value) and `strict`.
fn response_format(v: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    output_format(v, v.get("json_schema"), "response_format")
}

/// An output format of type `text` (no constraint), `json_object`, or `json_schema`, whose
/// `schema` and `strict` are in `schema_of` (chat's `json_schema` object; the Responses API's
/// format itself); refused naming `field`.
pub(crate) fn output_format(
    format: &Value,
    schema_of: Option<&Value>,
    field: &'static str,
) -> Result<Option<Constraint>, ApiError> {
    let bad = |m: String| Err(ApiError::invalid(format!("`{field}`: {m}"), Some(field)));
    let spec = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Spec::JsonObject,
        Some("json_schema") => {
            let Some(js) = schema_of.filter(|j| j.is_object()) else {
                return bad("type json_schema needs a `json_schema` object".into());
            };
            Spec::JsonSchema {
                schema: js.get("schema").cloned().unwrap_or(serde_json::json!({})),
                strict: js.get("strict").and_then(Value::as_bool).unwrap_or(false),
            }
        }
        Some(other) => {
            return bad(format!(
                "type `{other}` is not one of text, json_object, json_schema"
            ));
        }
        None => return bad("needs a `type` (text, json_object or json_schema)".into()),
    };
    Ok(Some(Constraint { spec, field }))
}

/// vLLM's `structured_outputs`: exactly one of `json` (a schema, or its JSON text), `regex`,
/// `choice` (a list of strings), `grammar` (Lark), `json_object: true`.
fn structured_outputs(v: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    const FIELD: &str = "structured_outputs";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |m: String| ApiError::invalid(format!("`{FIELD}`: {m}"), Some(FIELD));
    let Some(obj) = v.as_object() else {
        return Err(bad("must be an object".into()));
    };
    let mut specs = Vec::new();
    for (key, value) in obj {
        let text = || value.as_str().map(str::to_owned);
        let spec = match key.as_str() {
            "json" => Some(match value {
                Value::String(s) => Spec::JsonSchema {
                    schema: serde_json::from_str(s)
                        .map_err(|e| bad(format!("`json` is not JSON: {e}")))?,
                    strict: false,
                },
                other => Spec::JsonSchema {
                    schema: other.clone(),
                    strict: false,
                },
            }),
            "regex" => Some(Spec::Regex(
                text().ok_or_else(|| bad("`regex` must be a string".into()))?,
            )),
            "grammar" => Some(Spec::Lark(
                text().ok_or_else(|| bad("`grammar` must be a string".into()))?,
            )),
            "choice" => Some(Spec::Choice(
                serde_json::from_value(value.clone())
                    .map_err(|_| bad("`choice` must be a list of strings".into()))?,
            )),
            "json_object" => (value == &Value::Bool(true)).then_some(Spec::JsonObject),
            other => {
                return Err(bad(format!(
                    "`{other}` is not one of json, regex, choice, grammar, json_object"
                )));
            }
        };
        specs.extend(spec);
    }
    match specs.len() {
        0 => Ok(None),
        1 => Ok(specs.pop().map(|spec| Constraint { spec, field: FIELD })),
        _ => Err(bad(
            "give one of json, regex, choice, grammar, json_object".into()
        )),
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

/// The most prompts one completion request (or inputs one embeddings request) may carry.
pub const MAX_PROMPTS: usize = 128;

/// A completion's `prompt`: a string, a list of token ids, or a batch of them (a list of
/// strings or of lists of token ids, at most [`MAX_PROMPTS`]), whose choices come in its order.
/// A token id past 32 bits is refused, not truncated.
pub fn completion_prompts(prompt: &Value) -> Result<Vec<Prompt>, ApiError> {
    prompts_in(prompt, "prompt")
}

/// [`completion_prompts`] of the request's field `field` (an embeddings request's `input`),
/// refused naming it.
pub fn prompts_in(prompt: &Value, field: &'static str) -> Result<Vec<Prompt>, ApiError> {
    let shape = || {
        ApiError::invalid(
            format!(
                "{field} must be a string, a list of token ids, or a list of strings or of \
                 lists of token ids"
            ),
            Some(field),
        )
    };
    let batch = match prompt {
        Value::String(s) => return Ok(vec![Prompt::Text(s.clone())]),
        // An empty list is one empty prompt, which validation refuses as such.
        Value::Array(a) if a.first().is_none_or(Value::is_number) => {
            return Ok(vec![Prompt::TokenIds(token_ids(a, shape, field)?)]);
        }
        Value::Array(a) => a,
        _ => return Err(shape()),
    };
    if batch.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            format!(
                "at most {MAX_PROMPTS} {field}s per request, not {}",
                batch.len()
            ),
            Some(field),
        ));
    }
    batch
        .iter()
        .map(|p| match p {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(ids) => token_ids(ids, shape, field).map(Prompt::TokenIds),
            _ => Err(shape()),
        })
        .collect()
}

fn token_ids(
    ids: &[Value],
    shape: impl Fn() -> ApiError,
    field: &'static str,
) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|v| {
            let n = v.as_u64().ok_or_else(&shape)?;
            u32::try_from(n).map_err(|_| {
                ApiError::invalid(
                    format!("token id {n} is not a 32-bit token id"),
                    Some(field),
                )
            })
        })
        .collect()
}

/// A chat message as the template renders it (see [`crate::tools::chat_message`]); what is
/// wrong with it is refused naming `messages`.
pub fn chat_message(m: &ChatMessageIn) -> Result<ferrite_text::ChatMessage, ApiError> {
    let bad = |m: String| ApiError::invalid(format!("`messages`: {m}"), Some("messages"));
    let calls = match &m.tool_calls {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|c| {
                let f = &c["function"];
                let name = f["name"]
                    .as_str()
                    .ok_or("a tool call without function.name")?;
                let arguments = match &f["arguments"] {
                    Value::String(text) => text.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                let id = c["id"].as_str().unwrap_or_default().to_owned();
                PastCall::new(id, name.to_owned(), &arguments)
            })
            .collect::<Result<_, String>>()
            .map_err(bad)?,
        Some(_) => return Err(bad("`tool_calls` must be a list".into())),
    };
    let content = message_text(&m.content)?;
    let mut message =
        tools::chat_message(&m.role, content, calls, m.tool_call_id.clone()).map_err(bad)?;
    message.reasoning_content = m.reasoning_content.clone().or_else(|| m.reasoning.clone());
    Ok(message)
}

/// The efforts OpenAI names.
const EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

/// A reasoning effort (`field`'s), one OpenAI names.
pub fn effort<'a>(
    effort: Option<&'a str>,
    field: &'static str,
) -> Result<Option<&'a str>, ApiError> {
    match effort {
        Some(e) if !EFFORTS.contains(&e) => Err(ApiError::invalid(
            format!("`{field}` must be one of {}", EFFORTS.join(", ")),
            Some(field),
        )),
        e => Ok(e),
    }
}

/// A chat's `reasoning_effort` as its template reads it, unless `chat_template_kwargs` set it.
pub fn with_effort(mut chat: Chat, effort: Option<&str>) -> Chat {
    if let Some(e) = effort {
        chat.kwargs
            .entry("reasoning_effort")
            .or_insert_with(|| e.into());
    }
    chat
}

/// A chat prompt of `messages`, with `chat_template_kwargs` (an object, or null) for its
/// template; what is wrong with either is refused naming its field.
pub fn chat_prompt(messages: &[ChatMessageIn], kwargs: Option<&Value>) -> Result<Chat, ApiError> {
    let messages = messages
        .iter()
        .map(chat_message)
        .collect::<Result<Vec<_>, ApiError>>()?;
    let bad = |m: String| ApiError::invalid(m, Some("chat_template_kwargs"));
    let kwargs = match kwargs {
        None | Some(Value::Null) => Default::default(),
        Some(Value::Object(map)) => {
            ferrite_text::chat::check_kwargs(map).map_err(|e| bad(e.to_string()))?;
            map.clone()
        }
        Some(_) => return Err(bad("`chat_template_kwargs` must be an object".into())),
    };
    Ok(Chat { messages, kwargs })
}

/// A chat message's `content`: a string, or the content-parts form with text parts only.
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

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
