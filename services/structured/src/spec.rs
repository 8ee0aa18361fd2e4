//! What a request asks its output to follow, and the llguidance grammar that says it.

use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

use crate::{GrammarError, bounds};

/// The largest schema or grammar text a request may carry. llguidance bounds the compile
/// itself (its lexer fuel and grammar size limits); this keeps a request from spending the
/// gateway's memory and time on parsing a megabyte of JSON first.
pub const MAX_GRAMMAR_BYTES: usize = 128 * 1024;

/// Whitespace llguidance lets a JSON output put between two tokens of the JSON: up to 16
/// characters (a newline and an indentation), never an endless run of it until `max_tokens`,
/// which is what small models fall into when whitespace is free.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,16}";

/// A request's constraint, as the APIs name it.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value of this JSON schema. `strict` (OpenAI's flag) refuses a schema using keywords
    /// llguidance cannot enforce; without it they are ignored, as OpenAI's non-strict mode
    /// and vLLM do.
    JsonSchema { schema: Value, strict: bool },
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text of this Lark grammar (llguidance's dialect).
    Lark(String),
    /// Text of the Lark grammar `lark`, in which `@NAME` is text of the spec `parts` names
    /// NAME: a model's own output format around what a request asks of the parts it frames
    /// (gpt-oss's channels around its answer; a call's header around its arguments). Each
    /// part is built as on its own (a JSON schema bounded, its whitespace too).
    Within {
        lark: String,
        parts: Vec<(String, Spec)>,
    },
}

/// A compiled-to-be grammar in llguidance's own form: what the gateway sends a pool.
#[derive(Debug, Clone)]
pub struct Grammar(pub(crate) TopLevelGrammar);

impl Spec {
    /// The grammar of this constraint. Refuses what is malformed before llguidance sees it:
    /// a schema that is not an object, text past [`MAX_GRAMMAR_BYTES`], an empty choice list.
    pub fn grammar(&self) -> Result<Grammar, GrammarError> {
        self.build(true)
    }

    /// The grammar of this constraint with a JSON schema as written: without the bounds of
    /// [`Spec::grammar`] (see `bounds.rs`), for a schema whose bounded form llguidance cannot
    /// compile (a bound meets a partner's larger minimum). Other constraints are as
    /// [`Spec::grammar`] gives them.
    pub fn grammar_as_written(&self) -> Result<Grammar, GrammarError> {
        self.build(false)
    }

    fn build(&self, bounded: bool) -> Result<Grammar, GrammarError> {
        let bad = |m: String| Err(GrammarError::Invalid(m));
        let size = match self {
            Spec::JsonObject => 0,
            Spec::JsonSchema { schema, .. } => schema.to_string().len(),
            Spec::Regex(r) | Spec::Lark(r) => r.len(),
            Spec::Choice(c) => c.iter().map(String::len).sum(),
            // The answer's own size is checked as it is built.
            Spec::Within { lark, .. } => lark.len(),
        };
        if size > MAX_GRAMMAR_BYTES {
            return bad(format!(
                "the schema or grammar is {size} bytes; at most {MAX_GRAMMAR_BYTES} are accepted"
            ));
        }
        let top = match self {
            Spec::JsonObject => json_grammar(json!({"type": "object"}), false, bounded)?,
            Spec::JsonSchema { schema, strict } => json_grammar(schema.clone(), *strict, bounded)?,
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
            Spec::Choice(choices) => {
                if choices.is_empty() {
                    return bad("the choice list is empty".into());
                }
                let alternatives: Vec<String> =
                    choices.iter().map(|c| regex_syntax::escape(c)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alternatives.join("|")))
            }
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Spec::Within { lark, parts } => {
                let mut top = TopLevelGrammar::from_lark(lark.clone());
                for (name, part) in parts {
                    let Grammar(inner) = part.build(bounded)?;
                    for (i, mut g) in inner.grammars.into_iter().enumerate() {
                        g.name = Some(if i == 0 {
                            name.clone()
                        } else {
                            format!("{name}_{i}")
                        });
                        top.grammars.push(g);
                    }
                }
                top
            }
        };
        Ok(Grammar(top))
    }
}

/// The largest magnitude a JSON number without bounds of its own may take: 2^53 - 1, the
/// integers every JSON parser keeps exactly. Unbounded, a small model writes digits until
/// `max_tokens` ("population": 1112223123123323233…) and the output never parses.
const NUMBER_BOUND: i64 = (1 << 53) - 1;

/// Keywords whose values are data, not subschemas: bounds are never added inside them.
const DATA_KEYWORDS: [&str; 4] = ["enum", "const", "default", "examples"];

/// Keywords whose value is a count: JSON Schema takes any number with no fraction (`2.0`),
/// llguidance only an integer literal.
const COUNT_KEYWORDS: [&str; 8] = [
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
];

/// Bounds every `integer` and `number` subschema of `schema` that leaves a side unbounded by
/// ±[`NUMBER_BOUND`], and writes counts given as whole floats (`2.0`) as integers.
fn normalize_numbers(schema: &mut Value) {
    match schema {
        Value::Object(obj) => {
            for key in COUNT_KEYWORDS {
                let whole = obj
                    .get(key)
                    .and_then(Value::as_f64)
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u32::MAX as f64);
                if let Some(f) = whole {
                    obj.insert(key.into(), (f as u64).into());
                }
            }
            let numeric = |t: &Value| matches!(t.as_str(), Some("integer" | "number"));
            let is_number = obj.get("type").is_some_and(|t| {
                numeric(t) || t.as_array().is_some_and(|ts| ts.iter().any(numeric))
            });
            if is_number {
                if !obj.contains_key("maximum") && !obj.contains_key("exclusiveMaximum") {
                    obj.insert("maximum".into(), NUMBER_BOUND.into());
                }
                if !obj.contains_key("minimum") && !obj.contains_key("exclusiveMinimum") {
                    obj.insert("minimum".into(), (-NUMBER_BOUND).into());
                }
            }
            for (key, value) in obj.iter_mut() {
                if !DATA_KEYWORDS.contains(&key.as_str()) {
                    normalize_numbers(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_numbers),
        _ => {}
    }
}

/// A JSON schema's grammar, with ferrite's JSON options (bounded whitespace and numbers;
/// lenient unless `strict`) under the schema's `x-guidance`, where llguidance reads them.
/// Options the schema sets itself there are kept. Keywords llguidance would ignore to the
/// output's harm are rewritten into ones it enforces or refused; `bounded` adds the bounds
/// of `bounds.rs`.
fn json_grammar(
    mut schema: Value,
    strict: bool,
    bounded: bool,
) -> Result<TopLevelGrammar, GrammarError> {
    if schema.is_object() {
        bounds::check_keywords(&mut schema)?;
        if bounded {
            // The schema's own `x-guidance` wins, as below.
            let lenient = schema
                .pointer("/x-guidance/lenient")
                .and_then(Value::as_bool)
                .unwrap_or(!strict);
            bounds::bound(&mut schema, lenient);
        }
    }
    normalize_numbers(&mut schema);
    let Some(obj) = schema.as_object_mut() else {
        return Err(GrammarError::Invalid(format!(
            "a JSON schema must be an object, not {}",
            kind(&schema)
        )));
    };
    let options = obj.entry("x-guidance").or_insert_with(|| json!({}));
    let Some(options) = options.as_object_mut() else {
        return Err(GrammarError::Invalid(
            "the schema's `x-guidance` must be an object".into(),
        ));
    };
    if !options.contains_key("whitespace_flexible") {
        options
            .entry("whitespace_pattern")
            .or_insert_with(|| JSON_WHITESPACE.into());
    }
    options.entry("lenient").or_insert_with(|| (!strict).into());
    Ok(TopLevelGrammar::from_json_schema(schema))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Grammar {
    /// The grammar as the worker API carries it (llguidance's JSON form).
    pub fn to_wire(&self) -> String {
        // A TopLevelGrammar is plain data (strings, JSON values, options): serializing it
        // cannot fail.
        serde_json::to_string(&self.0).unwrap_or_default()
    }

    /// A grammar from the worker API; refuses text that is not one.
    pub fn from_wire(text: &str) -> Result<Self, GrammarError> {
        if text.len() > 2 * MAX_GRAMMAR_BYTES {
            return Err(GrammarError::Invalid(format!(
                "the grammar is {} bytes; at most {} are accepted",
                text.len(),
                2 * MAX_GRAMMAR_BYTES
            )));
        }
        serde_json::from_str(text)
            .map(Grammar)
            .map_err(|e| GrammarError::Invalid(format!("not an llguidance grammar: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_options_bound_whitespace_and_follow_strict() {
        let g = Spec::JsonSchema {
            schema: json!({"type": "object"}),
            strict: true,
        }
        .grammar()
        .expect("grammar");
        let wire: Value = serde_json::from_str(&g.to_wire()).expect("json");
        let options = &wire["grammars"][0]["json_schema"]["x-guidance"];
        assert_eq!(options["whitespace_pattern"], JSON_WHITESPACE);
        assert_eq!(options["lenient"], false);
        // The schema's own options win.
        let own = Spec::JsonSchema {
            schema: json!({"x-guidance": {"lenient": false, "whitespace_flexible": true}}),
            strict: false,
        };
        let wire: Value = serde_json::from_str(&own.grammar().expect("g").to_wire()).expect("j");
        let options = &wire["grammars"][0]["json_schema"]["x-guidance"];
        assert_eq!(options["lenient"], false);
        assert!(options.get("whitespace_pattern").is_none(), "{options}");
    }

    #[test]
    fn unbounded_numbers_are_bounded_and_data_is_left_alone() {
        let mut schema = json!({"type": "object", "maxProperties": 2.0, "properties": {
            "n": {"type": "integer"},
            "x": {"type": ["number", "null"], "minimum": 0},
            "e": {"enum": [{"type": "integer"}]}}});
        normalize_numbers(&mut schema);
        let p = &schema["properties"];
        assert_eq!(p["n"]["maximum"], NUMBER_BOUND);
        assert_eq!(p["n"]["minimum"], -NUMBER_BOUND);
        assert_eq!(p["x"]["minimum"], 0);
        assert_eq!(p["x"]["maximum"], NUMBER_BOUND);
        assert_eq!(p["e"]["enum"][0], json!({"type": "integer"}));
        assert!(
            schema["maxProperties"].is_u64(),
            "{}",
            schema["maxProperties"]
        );
    }

    #[test]
    fn malformed_specs_are_refused_before_llguidance() {
        let cases = [
            (
                Spec::JsonSchema {
                    schema: json!(true),
                    strict: false,
                },
                "must be an object",
            ),
            (Spec::Choice(Vec::new()), "empty"),
            (Spec::Regex("a".repeat(MAX_GRAMMAR_BYTES + 1)), "bytes"),
        ];
        for (spec, want) in cases {
            let e = spec.grammar().expect_err("refused");
            assert!(e.to_string().contains(want), "{spec:?}: {e}");
        }
        assert!(Grammar::from_wire("{not json").is_err());
    }

    #[test]
    fn a_grammar_survives_the_wire() {
        let g = Spec::Choice(vec!["a|b".into(), "c".into()])
            .grammar()
            .expect("grammar");
        let back = Grammar::from_wire(&g.to_wire()).expect("parsed");
        assert_eq!(back.to_wire(), g.to_wire());
    }
}
