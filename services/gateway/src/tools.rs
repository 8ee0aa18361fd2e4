//! Tool calling: the request's tools put before the model, the grammar that holds it to them,
//! and its output read back as calls.
//!
//! A model's template that names `tools` gets them as HF templates expect, and the model
//! answers in its family's own format: Hermes/Qwen `<tool_call>{json}</tool_call>`, Llama 3.1
//! `{"name", "parameters"}`, Mistral `[TOOL_CALLS][...]`, Granite `<|tool_call|>[...]`, gpt-oss
//! a message to `functions.NAME` in its harmony channels ([`crate::harmony`]). A format's
//! markers may be special tokens of the model's tokenizer (Mistral's and Granite's are): the
//! grammars then name them by id, and the answer's text keeps them ([`ToolFormat::markers`]). A template that ignores tools
//! (SmolLM2's) gets them in a system message, with the generic format: one JSON object, either
//! `{"tool_calls": [{"name", "arguments"}]}` or `{"response": "..."}`, held to it by a grammar.
//! `required` and a named function are enforced by a grammar in every format.

use serde_json::{Value, json};

use ferrite_structured::Spec;
use ferrite_text::{ChatMessage, Tokenizer};

/// A request's functions and how the model may call them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub functions: Vec<Function>,
    pub choice: ToolChoice,
    /// Several calls in one answer (OpenAI's `parallel_tool_calls`, default true).
    pub parallel: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of its arguments (default: any object).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// No call: the model answers in text (past calls in the history still render).
    None,
    Auto,
    Required,
    Named(String),
}

/// How a model family writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Generic,
    Hermes,
    Llama3,
    Mistral,
    /// Granite 3.x's: `<|tool_call|>` and a JSON list of calls, as Mistral's.
    Granite,
    /// gpt-oss's: a call is a message of its own, read by token ([`crate::harmony`]), never
    /// in the answer's text.
    Harmony,
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// What a model answered: text, calls, or both.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutput {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// A call of a past assistant message (its arguments parsed: templates take an object).
#[derive(Debug, Clone, PartialEq)]
pub struct PastCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

impl PastCall {
    /// A past call whose arguments come as JSON text, as both APIs carry them.
    pub fn new(id: String, name: String, arguments: &str) -> Result<Self, String> {
        let arguments = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments)
                .map_err(|e| format!("the arguments of call `{id}` are not JSON: {e}"))?
        };
        Ok(Self {
            id,
            name,
            arguments,
        })
    }
}

/// The roles a chat message may have. `developer` is OpenAI's newer name for `system`, which
/// chat templates know.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// A chat message of either API as the template renders it. Refused, with what is wrong: an
/// unknown role, a tool message without the call it answers, calls on a message not the
/// assistant's.
pub fn chat_message(
    role: &str,
    content: String,
    calls: Vec<PastCall>,
    tool_call_id: Option<String>,
) -> Result<ChatMessage, String> {
    let role = match role {
        "developer" => "system",
        r if ROLES.contains(&r) => r,
        other => return Err(format!("role `{other}` is not one of {}", ROLES.join(", "))),
    };
    let mut out = ChatMessage::new(role, content);
    match (role, tool_call_id.filter(|id| !id.is_empty())) {
        ("tool", Some(id)) => out.tool_call_id = Some(id),
        ("tool", None) => return Err("a tool message needs the `tool_call_id` it answers".into()),
        _ => {}
    }
    if !calls.is_empty() {
        if role != "assistant" {
            return Err("only assistant messages have `tool_calls`".into());
        }
        let calls: Vec<Value> = calls
            .into_iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        out.tool_calls = Some(Value::Array(calls));
    }
    Ok(out)
}

impl Function {
    /// A function as a request names it: a name as OpenAI allows them (`[a-zA-Z0-9_-]{1,64}`)
    /// and a JSON schema object for its parameters (default: any object).
    pub fn new(
        name: &str,
        description: Option<String>,
        parameters: Option<Value>,
    ) -> Result<Self, String> {
        let well_named = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !well_named {
            return Err(format!("`{name}` is not 1 to 64 letters, digits, _ or -"));
        }
        let parameters = match parameters {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p,
            Some(_) => return Err(format!("the parameters of `{name}` are not a JSON schema")),
        };
        Ok(Self {
            name: name.to_owned(),
            description,
            parameters,
        })
    }
}

impl Tools {
    /// A request's tools (`None` without functions), or what is wrong with its choice: a name
    /// that is not one of them, a call required of no tools.
    pub fn new(
        functions: Vec<Function>,
        choice: ToolChoice,
        parallel: bool,
    ) -> Result<Option<Self>, String> {
        if let ToolChoice::Named(name) = &choice
            && !functions.iter().any(|f| &f.name == name)
        {
            return Err(format!("no tool is named `{name}`"));
        }
        if functions.is_empty() {
            return match choice {
                ToolChoice::Auto | ToolChoice::None => Ok(None),
                _ => Err("`tool_choice` needs `tools`".into()),
            };
        }
        Ok(Some(Self {
            functions,
            choice,
            parallel,
        }))
    }
}

impl ToolFormat {
    /// The format of a model whose template is `source` (`None`: no template takes tools).
    pub fn of(source: Option<&str>) -> Self {
        match source {
            Some(s) if s.contains("<tool_call>") => ToolFormat::Hermes,
            Some(s) if s.contains("[TOOL_CALLS]") => ToolFormat::Mistral,
            Some(s) if s.contains("<|tool_call|>") => ToolFormat::Granite,
            Some(s) if s.contains("<|python_tag|>") || s.contains("ipython") => ToolFormat::Llama3,
            _ => ToolFormat::Generic,
        }
    }

    /// The texts that mark a format's calls, which a tokenizer may hold as special tokens
    /// (skipped in an answer's text unless kept): what opens the calls, and Hermes' close.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>", "</tool_call>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]"],
            ToolFormat::Granite => &["<|tool_call|>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Generic | ToolFormat::Harmony => &[],
        }
    }

    /// The key of a call's arguments in this format.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

impl Tools {
    /// The functions the model may call now (a named choice: that one alone).
    pub(crate) fn callable(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(|f| match &self.choice {
            ToolChoice::Named(n) => &f.name == n,
            _ => true,
        })
    }

    /// The schema of one call in `format`: the name of a callable function and its arguments.
    fn call_schema(&self, format: ToolFormat) -> Value {
        let key = format.arguments_key();
        let calls: Vec<Value> = self
            .callable()
            .map(|f| {
                json!({"type": "object", "additionalProperties": false,
                    "required": ["name", key],
                    "properties": {"name": {"const": f.name}, key: f.parameters}})
            })
            .collect();
        json!({"anyOf": calls})
    }

    /// The schema of a list of calls (one, without `parallel` or with a named choice).
    fn calls_schema(&self, format: ToolFormat) -> Value {
        let mut list = json!({"type": "array", "minItems": 1, "items": self.call_schema(format)});
        if !self.parallel || matches!(self.choice, ToolChoice::Named(_)) {
            list["maxItems"] = json!(1);
        }
        list
    }

    /// Whether the model may call tools in this answer (its output is then read as calls).
    pub fn may_call(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The grammar the output follows, if the choice or the format needs one. `special`
    /// gives the id of a marker the tokenizer holds as a special token: the grammar names it
    /// by id (`<[id]>`), as no spelling of its text is that token.
    pub fn constraint(
        &self,
        format: ToolFormat,
        special: &dyn Fn(&str) -> Option<u32>,
    ) -> Option<Spec> {
        if !self.may_call() {
            return None;
        }
        let calls = self.calls_schema(format);
        let generic_calls = json!({"type": "object", "additionalProperties": false,
            "required": ["tool_calls"], "properties": {"tool_calls": calls}});
        let must_call = matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_));
        let schema = |schema: Value| Spec::JsonSchema {
            schema,
            strict: false,
        };
        match format {
            ToolFormat::Generic if must_call => Some(schema(generic_calls)),
            ToolFormat::Generic => {
                let response = json!({"type": "object", "additionalProperties": false,
                    "required": ["response"], "properties": {"response": {"type": "string"}}});
                Some(schema(json!({"anyOf": [generic_calls, response]})))
            }
            // A model with its own format answers in text or calls as it likes under `auto`.
            _ if !must_call => None,
            // Its grammar holds its channels too, and is built with them.
            ToolFormat::Harmony => None,
            // The calls' JSON is a part of the format's grammar, built as a schema's is
            // (bounded, its whitespace too).
            ToolFormat::Hermes => {
                let repeat = if self.parallel && !matches!(self.choice, ToolChoice::Named(_)) {
                    "+"
                } else {
                    ""
                };
                let [open, close] = ["<tool_call>", "</tool_call>"].map(|m| lark(m, special));
                Some(Spec::Within {
                    lark: format!(
                        "start: call{repeat}\ncall: {open} \"\\n\" @call \"\\n\" {close}\n"
                    ),
                    parts: vec![("call".into(), schema(self.call_schema(format)))],
                })
            }
            ToolFormat::Llama3 => Some(schema(self.call_schema(format))),
            ToolFormat::Mistral | ToolFormat::Granite => Some(Spec::Within {
                lark: format!("start: {} @calls\n", lark(format.markers()[0], special)),
                parts: vec![("calls".into(), schema(calls))],
            }),
        }
    }

    /// The OpenAI tool list a template that takes tools renders.
    pub fn for_template(&self) -> Value {
        let tools: Vec<Value> = self
            .functions
            .iter()
            .map(|f| {
                json!({"type": "function", "function": {"name": f.name,
                    "description": f.description, "parameters": f.parameters}})
            })
            .collect();
        Value::Array(tools)
    }

    /// The conversation as a template that ignores tools sees it: the tools and the answer
    /// format in a system message (unless no call is allowed), past calls and their results
    /// as JSON text.
    pub fn generic_messages(&self, messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(messages.len() + 1);
        let mut messages = messages.into_iter().peekable();
        if self.may_call() {
            let prompt = self.generic_prompt();
            match messages.peek() {
                Some(m) if m.role == "system" => {
                    if let Some(mut first) = messages.next() {
                        first.content = format!("{}\n\n{prompt}", first.content);
                        out.push(first);
                    }
                }
                _ => out.push(ChatMessage::new("system", prompt)),
            }
        }
        // Which function each past call (by id) named, for its result.
        let mut named: Vec<(String, String)> = Vec::new();
        for mut m in messages {
            if let Some(calls) = m.tool_calls.take() {
                let calls: Vec<Value> = calls
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let name = &c["function"]["name"];
                        if let (Some(id), Some(n)) = (c["id"].as_str(), name.as_str()) {
                            named.push((id.to_owned(), n.to_owned()));
                        }
                        json!({"name": name, "arguments": c["function"]["arguments"]})
                    })
                    .collect();
                // Past calls in the answer format while the model may call again; else in
                // words, so it answers in text rather than repeat the format.
                m.content = if self.may_call() {
                    json!({"tool_calls": calls}).to_string()
                } else {
                    let said: Vec<String> = calls
                        .iter()
                        .map(|c| {
                            format!(
                                "{} with {}",
                                c["name"].as_str().unwrap_or("?"),
                                c["arguments"]
                            )
                        })
                        .collect();
                    format!("I called {}.", said.join(" and "))
                };
            }
            if let Some(id) = m.tool_call_id.take() {
                let name = named
                    .iter()
                    .find(|(i, _)| *i == id)
                    .map_or("the tool", |(_, n)| n);
                m = ChatMessage::new("user", format!("{name} returned: {}", m.content));
            }
            out.push(m);
        }
        out
    }

    fn generic_prompt(&self) -> String {
        let tools: Vec<Value> = self
            .callable()
            .map(|f| json!({"name": f.name, "description": f.description, "arguments": f.parameters}))
            .collect();
        let answer = match self.choice {
            ToolChoice::Auto => {
                "Answer with one JSON object: {\"tool_calls\": [{\"name\": <a tool's name>, \
                 \"arguments\": <its arguments>}]} to call tools, or {\"response\": <your \
                 answer>} to answer directly."
            }
            _ => {
                "Answer with one JSON object calling a tool: {\"tool_calls\": [{\"name\": <a \
                 tool's name>, \"arguments\": <its arguments>}]}."
            }
        };
        format!(
            "You can call these tools:\n{}\n{answer}",
            Value::Array(tools)
        )
    }

    /// Reads the model's `text` in `format` as calls and content. Calls are named
    /// `call_{prefix}_{i}`; text that holds no well-formed call is content.
    pub fn parse(&self, format: ToolFormat, text: &str, prefix: &str) -> ToolOutput {
        let id = |i: usize| call_id(prefix, i);
        let found = match format {
            ToolFormat::Generic => generic_calls(text),
            ToolFormat::Hermes => hermes_calls(text),
            ToolFormat::Llama3 => llama3_calls(text),
            ToolFormat::Mistral | ToolFormat::Granite => list_calls(text, format.markers()[0]),
            ToolFormat::Harmony => None,
        };
        let Some((content, raw)) = found else {
            return ToolOutput {
                content: text.to_owned(),
                calls: Vec::new(),
            };
        };
        let key = format.arguments_key();
        let calls = raw
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let name = c.get("name")?.as_str()?.to_owned();
                let arguments = c.get(key).cloned().unwrap_or(json!({}));
                Some(ToolCall {
                    id: id(i),
                    name,
                    arguments: arguments.to_string(),
                })
            })
            .collect();
        ToolOutput { content, calls }
    }
}

/// Call `i`'s id in the answer whose calls are named from `prefix`.
pub fn call_id(prefix: &str, i: usize) -> String {
    format!("call_{prefix}_{i}")
}

/// A random number, for call ids no other response shares.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// `{"tool_calls": [...]}` or `{"response": "..."}`.
fn generic_calls(text: &str) -> Option<(String, Vec<Value>)> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    if let Some(r) = v.get("response").and_then(Value::as_str) {
        return Some((r.to_owned(), Vec::new()));
    }
    let calls = v.get("tool_calls")?.as_array()?.clone();
    Some((String::new(), calls))
}

/// Text, then `<tool_call>{json}</tool_call>` blocks. A block may hold a list of calls
/// (Granite 3.1 and later write `<tool_call>[...]`, with no close), as vLLM's Granite parser
/// reads it.
fn hermes_calls(text: &str) -> Option<(String, Vec<Value>)> {
    let start = text.find("<tool_call>")?;
    let mut calls = Vec::new();
    for block in text[start..].split("<tool_call>").skip(1) {
        let body = block.split("</tool_call>").next().unwrap_or(block);
        match serde_json::from_str(body.trim()).ok()? {
            Value::Array(list) => calls.extend(list),
            call => calls.push(call),
        }
    }
    Some((text[..start].trim().to_owned(), calls))
}

/// `<|python_tag|>`, or nothing, then `{"name", "parameters"}` (or several, by `;`).
fn llama3_calls(text: &str) -> Option<(String, Vec<Value>)> {
    let body = text.trim();
    let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
    if !body.starts_with('{') {
        return None;
    }
    let calls = body
        .split(';')
        .map(|c| serde_json::from_str::<Value>(c.trim()).ok())
        .collect::<Option<Vec<_>>>()?;
    calls
        .iter()
        .all(|c| c.get("name").is_some())
        .then(|| (String::new(), calls))
}

/// Text, then `marker` (Mistral's `[TOOL_CALLS]`, Granite's `<|tool_call|>`) and a JSON list
/// of calls.
fn list_calls(text: &str, marker: &str) -> Option<(String, Vec<Value>)> {
    let start = text.find(marker)?;
    let list: Value = serde_json::from_str(text[start + marker.len()..].trim()).ok()?;
    Some((text[..start].trim().to_owned(), list.as_array()?.clone()))
}

/// `marker` in Lark: its special token by id where the tokenizer holds it as one, else its
/// text.
fn lark(marker: &str, special: &dyn Fn(&str) -> Option<u32>) -> String {
    match special(marker) {
        Some(id) => format!("<[{id}]>"),
        None => format!("\"{marker}\""),
    }
}

/// The id of `marker` where `tokenizer` holds it as one special token (which an answer's text
/// skips, and no spelling of its text produces).
pub fn special_id(tokenizer: &Tokenizer, marker: &str) -> Option<u32> {
    (tokenizer.token_to_id(marker)).filter(|&id| tokenizer.is_special(id))
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
