//! Chat templates: Jinja templates from `tokenizer_config.json` or GGUF
//! `tokenizer.chat_template`, rendered the way Hugging Face
//! `tokenizer.apply_chat_template(..., tokenize=False)` renders them.
//!
//! HF compiles templates with jinja2's `ImmutableSandboxedEnvironment(
//! trim_blocks=True, lstrip_blocks=True)` plus the `loopcontrols` extension,
//! overrides `tojson` (no HTML escaping, Python `json.dumps` spacing), and adds
//! the globals `raise_exception` and `strftime_now`. We configure minijinja the
//! same way; `minijinja-contrib`'s `pycompat` supplies the Python string and
//! dict methods (`.strip()`, `.startswith()`, `.items()`...) templates use.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::TextError;

/// Name under which the single template is stored in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ... (passed through verbatim).
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant message's tool calls, as templates read them: `[{"id", "type":
    /// "function", "function": {"name", "arguments": {...}}}]` (arguments as an object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool message's answer is to this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A past assistant message's thinking (`reasoning_content`, as Qwen3's and DeepSeek's
    /// templates read it; most leave it out of the history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same, by the name gpt-oss's template reads (`thinking`): set in its stead for a
    /// model served with harmony.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    /// Convenience constructor.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
            thinking: None,
        }
    }
}

/// The instructions one render may run: real templates take a few hundred per message, so
/// this is thousands of messages, and stops a runaway loop within milliseconds.
const RENDER_FUEL: u64 = 5_000_000;

/// A compiled chat template together with the special-token strings HF
/// exposes to it (`bos_token`, `eos_token`).
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`. Syntax errors are reported here, not at render
    /// time, so a broken template is noticed when the model is loaded.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, TextError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // jinja2's default, which HF keeps: one trailing newline is dropped.
        env.set_keep_trailing_newline(false);
        // A template comes with a model, and the gateway renders it for every chat request:
        // one that loops for ever (nested `range`s) must fail the request, not hold a core.
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| TextError::TemplateSyntax(describe(&e)))?;
        Ok(Self {
            env,
            source,
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// The template text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `bos_token` string the template sees, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` string the template sees, if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders a conversation. `add_generation_prompt` appends the header of
    /// an assistant turn (if the template supports it) so the model continues
    /// as the assistant.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Whether the template renders `tools` itself (it names them): a model trained to call
    /// tools in its own format.
    pub fn takes_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// [`ChatTemplate::render`] with the `tools` HF passes (OpenAI's list of
    /// `{"type": "function", "function": {...}}`), if any.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.render_with(
            messages,
            tools,
            add_generation_prompt,
            &TemplateKwargs::new(),
        )
    }

    /// [`ChatTemplate::render_with_tools`] with more variables for the template (HF's
    /// `apply_chat_template(..., **kwargs)`, vLLM's `chat_template_kwargs`: Qwen3's
    /// `enable_thinking`, for one). They cannot replace the variables set here
    /// ([`RESERVED_VARIABLES`]): [`check_kwargs`] refuses them.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &TemplateKwargs,
    ) -> Result<String, TextError> {
        check_kwargs(kwargs)?;
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TextError::TemplateRender(describe(&e)))?;
        // Same variables HF passes: messages, tools/documents (None when not
        // given, which templates test with `is not none`),
        // add_generation_prompt and the special tokens map.
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert(
            "tools",
            tools.map_or(Value::from(()), Value::from_serialize),
        );
        ctx.insert("documents", Value::from(()));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        for (name, value) in kwargs {
            ctx.insert(name, Value::from_serialize(value));
        }
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token", Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token", Value::from(eos.as_str()));
        }
        template
            .render(ctx)
            .map_err(|e| TextError::TemplateRender(describe(&e)))
    }
}

/// Variables a request gives a chat template besides the messages (JSON values by name).
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// The variables every render sets itself, which `chat_template_kwargs` may not replace.
pub const RESERVED_VARIABLES: [&str; 6] = [
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// Refuses `kwargs` that would replace a variable the render sets ([`RESERVED_VARIABLES`]).
pub fn check_kwargs(kwargs: &TemplateKwargs) -> Result<(), TextError> {
    match kwargs
        .keys()
        .find(|k| RESERVED_VARIABLES.contains(&k.as_str()))
    {
        Some(k) => Err(TextError::TemplateRender(format!(
            "`{k}` is set by the server, not by chat_template_kwargs"
        ))),
        None => Ok(()),
    }
}

/// `chat_template_kwargs` given as JSON text: an object, checked as [`check_kwargs`] does.
pub fn parse_kwargs(json: &str) -> Result<TemplateKwargs, TextError> {
    let bad = |why: String| TextError::TemplateRender(format!("chat_template_kwargs: {why}"));
    match serde_json::from_str(json) {
        Ok(serde_json::Value::Object(map)) => {
            check_kwargs(&map)?;
            Ok(map)
        }
        Ok(_) => Err(bad("not a JSON object".into())),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// minijinja's `Display` omits the cause chain; include it so template
/// authors see e.g. the `raise_exception` message and line.
fn describe(e: &Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let _ = write!(out, ": {s}");
        source = s.source();
    }
    out
}

/// Prints values the way jinja2 does where minijinja differs: Python's
/// `True`/`False`/`None` instead of `true`/`false`/`none`.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" })?,
        ValueKind::None => out.write_str("None")?,
        _ => minijinja::escape_formatter(out, state, value)?,
    }
    Ok(())
}

/// HF's `raise_exception(message)`: aborts rendering with the message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// HF's `strftime_now(format)`: the current time formatted with Python
/// `strftime` directives. Python uses local time; servers run in UTC, and
/// taking UTC avoids a timezone database dependency.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Value::from(crate::strftime::format_utc(secs, &format)))
}

/// HF's `tojson`: Python `json.dumps(x, ensure_ascii=False, indent=indent,
/// sort_keys=sort_keys)`, i.e. `", "`/`": "` separators and no HTML
/// escaping (minijinja's builtin escapes `<`, `>`, `&` and `'`).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // Accepted for signature compatibility; we always emit non-ASCII as is.
    let _ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(seps) if seps.len() == Some(2) => (
            seps.get_item_by_index(0)?.to_string(),
            seps.get_item_by_index(1)?.to_string(),
        ),
        // Python drops the space after ',' when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    let fmt = JsonFmt {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        item_sep: &item_sep,
        key_sep: &key_sep,
    };
    fmt.write(&mut out, &value, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonFmt<'a> {
    indent: Option<usize>,
    sort_keys: bool,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl JsonFmt<'_> {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value),
            ValueKind::String | ValueKind::Bytes | ValueKind::Plain => {
                write_json_str(out, &value.to_string())
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, '[', ']', items.len(), depth, |out, i, d| {
                    self.write(out, &items[i], d)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                self.write_container(out, '{', '}', keys.len(), depth, |out, i, d| {
                    let key = &keys[i];
                    write_json_str(out, &key.to_string());
                    out.push_str(self.key_sep);
                    self.write(out, &value.get_item(key)?, d)
                })?;
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: cannot serialize {value:?}"),
                ));
            }
        }
        Ok(())
    }

    fn write_container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len > 0 {
            for i in 0..len {
                if i > 0 {
                    out.push_str(self.item_sep);
                }
                self.newline(out, depth + 1);
                item(out, i, depth + 1)?;
            }
            self.newline(out, depth);
        }
        out.push(close);
        Ok(())
    }
}

fn write_number(out: &mut String, value: &Value) {
    if let Some(i) = value.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Ok(f) = f64::try_from(value.clone()) {
        if f.is_nan() {
            out.push_str("NaN");
        } else if f.is_infinite() {
            out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        } else {
            // `{:?}` keeps the ".0" Python's float repr has ("1.0", not "1").
            let _ = write!(out, "{f:?}");
        }
    } else {
        out.push_str(&value.to_string());
    }
}

fn write_json_str(out: &mut String, s: &str) {
    // serde_json escapes exactly what json.dumps(ensure_ascii=False) escapes:
    // quote, backslash and control characters.
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, msgs: &[ChatMessage], gen_prompt: bool) -> Result<String, TextError> {
        ChatTemplate::new(src, Some("<s>"), Some("</s>"))?.render(msgs, gen_prompt)
    }

    #[test]
    fn a_runaway_template_fails_the_render_instead_of_holding_a_core() {
        let src = "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}";
        let started = std::time::Instant::now();
        let err = render(src, &[ChatMessage::new("user", "hi")], false).expect_err("no end");
        assert!(err.to_string().contains("fuel"), "{err}");
        assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
        // A long real conversation stays well inside the budget.
        let chatml = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}";
        let long: Vec<ChatMessage> = (0..5000)
            .map(|i| ChatMessage::new("user", format!("turn {i}")))
            .collect();
        render(chatml, &long, false).expect("5000 turns render");
    }

    #[test]
    fn trim_and_lstrip_blocks_match_jinja2_settings() -> Result<(), TextError> {
        let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
        let out = render(src, &[ChatMessage::new("user", "hi")], false)?;
        assert_eq!(out, "U:hi\n");
        Ok(())
    }

    #[test]
    fn pycompat_methods_and_specials() -> Result<(), TextError> {
        let src = "{{ bos_token }}{{ messages[0]['content'].strip() }}|{{ messages[0].content.startswith(' x') }}{{ eos_token }}";
        let out = render(src, &[ChatMessage::new("user", " x y ")], false)?;
        assert_eq!(out, "<s>x y|True</s>");
        Ok(())
    }

    #[test]
    fn tojson_matches_python_json_dumps() -> Result<(), TextError> {
        let src = "{{ messages[0] | tojson }}|{{ {'a': [1, 2.5, none, true]} | tojson }}|{{ {'a': {'b': 1}, 'c': []} | tojson(indent=2) }}";
        let out = render(src, &[ChatMessage::new("user", "<b>&'é\n")], false)?;
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"<b>&'é\\n\"}|{\"a\": [1, 2.5, null, true]}|{\n  \"a\": {\n    \"b\": 1\n  },\n  \"c\": []\n}"
        );
        Ok(())
    }

    #[test]
    fn raise_exception_is_a_render_error() {
        let err = render("{{ raise_exception('no system role') }}", &[], false);
        match err {
            Err(e @ TextError::TemplateRender(_)) => {
                assert!(e.to_string().contains("no system role"), "{e}");
                assert_eq!(e.kind(), "template_render");
            }
            other => panic!("expected render error, got {other:?}"),
        }
    }

    #[test]
    fn syntax_error_is_reported_at_construction() {
        let err = ChatTemplate::new("{% for m in messages %}", None, None);
        match err {
            Err(e) => assert_eq!(e.kind(), "template_syntax"),
            Ok(_) => panic!("unterminated for loop must not compile"),
        }
    }

    #[test]
    fn strftime_now_renders_a_date() -> Result<(), TextError> {
        let out = render("{{ strftime_now('%Y-%m-%d') }}", &[], false)?;
        assert_eq!(out.len(), 10, "{out}");
        assert!(out.starts_with("20"), "{out}");
        Ok(())
    }

    #[test]
    fn loop_controls_and_namespace() -> Result<(), TextError> {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}";
        let msgs = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        assert_eq!(render(src, &msgs, false)?, "1");
        Ok(())
    }

    /// The constructs gpt-oss's chat template leans on, in a template of its shape: a recursive
    /// macro with a default argument rendering a tool's JSON schema (`is iterable`, `is not
    /// mapping`, `.items()`, `not in (x or [])`), a loop variable reassigned, slices of the
    /// messages (`messages[1:]`, `loop_messages[loop.index:]`), `"key" in message` for absent
    /// keys, namespaces set inside loops. The expected text is jinja2 3.1's rendering of the
    /// same template and inputs (trim and lstrip blocks, as transformers sets them).
    #[test]
    fn gpt_oss_template_constructs_render_as_jinja2() -> Result<(), TextError> {
        let src = r#"{%- macro ts(spec, required, is_nullable=false) -%}
{%- if spec.type == "array" -%}{{ ts(spec['items'], required) + "[]" }}
{%- elif spec.type is defined and spec.type is iterable and spec.type is not string and spec.type is not mapping and spec.type[0] is defined -%}{{ spec.type | join(" | ") }}
{%- elif spec.type == "object" -%}{{ "{" }}{%- for name, p in spec.properties.items() -%}{{ name }}{%- if name not in (spec.required or []) -%}?{%- endif -%}: {{ ts(p, spec.required or []) }}{%- if not loop.last -%}, {% endif -%}{%- endfor -%}{{ "}" }}
{%- else -%}{{ spec.type }}{%- endif -%}
{%- endmacro -%}
{%- set last = namespace(name=none) -%}
<|start|>system<|message|>{{ "Reasoning: " + (reasoning_effort if reasoning_effort is defined else "medium") }}<|end|>
{%- for tool in tools -%}{%- set tool = tool.function -%}// {{ tool.name }}: {{ ts(tool.parameters, tool.parameters.required or []) }}{%- endfor -%}
{%- set loop_messages = messages[1:] if messages[0].role == "system" else messages -%}
{%- for message in loop_messages -%}
{%- set later = namespace(found=false) -%}
{%- for future in loop_messages[loop.index:] -%}{%- if future.role == 'assistant' and "tool_calls" not in future -%}{%- set later.found = true -%}{%- endif -%}{%- endfor -%}
<|start|>{{ message.role }}{% if "thinking" in message %} thinking{% endif %}{% if later.found %} later{% endif %}<|message|>{{ message.content }}<|end|>
{%- set last.name = message.role -%}
{%- endfor -%}
{{ last.name }}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"#;
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"},
            "days": {"type": "array", "items": {"type": "integer"}},
            "unit": {"type": ["string", "null"]}}, "required": ["location"]}}}]);
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello"),
            ChatMessage::new("user", "Weather?"),
        ];
        let t = ChatTemplate::new(src, None, None)?;
        let out = t.render_with_tools(&msgs, Some(&tools), true)?;
        let want = "<|start|>system<|message|>Reasoning: medium<|end|>// get_weather: {location: \
            string, days?: integer[], unit?: string | null}<|start|>user later<|message|>Hi<|end|>\
            <|start|>assistant<|message|>Hello<|end|><|start|>user<|message|>Weather?<|end|>user\
            <|start|>assistant";
        assert_eq!(out, want);
        Ok(())
    }
}
