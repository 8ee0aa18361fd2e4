//! What a JSON schema leaves unbounded, bounded inside the grammar, so that a model held to it
//! must end: a small model, held to a schema, otherwise writes one string, one array or one
//! object's keys until `max_tokens` and the output never parses.
//!
//! Every bound only narrows the schema: any value of the narrowed schema is a value of the
//! schema as written. A schema's own bound always wins, so a schema that needs a longer string
//! says so (`"maxLength": 10000`). The bounds:
//!
//! - a string without `maxLength`, `enum` or `const` (with a `pattern` or a `format` too: an
//!   e-mail address or a URI has no end either): at most [`STRING_CHARS`] characters;
//! - an array without `maxItems`: at most [`ARRAY_ITEMS`] items (more if `minItems` or its
//!   tuple asks for more); with `uniqueItems`, which llguidance does not enforce, at most one
//!   (where `minItems` allows it: one item is unique by itself), whatever its own `maxItems`;
//! - a value the schema leaves free (`{}`, `true`, the items of an array without `items`, the
//!   values of an object without `additionalProperties`): any JSON value at most
//!   [`ANY_DEPTH`] arrays or objects deep, with the bounds above and at most [`OBJECT_KEYS`]
//!   keys an object;
//! - an object that declares `properties` and says nothing of `additionalProperties`: only
//!   its declared properties (as OpenAI's strict mode and XGrammar do);
//! - a map (an object that declares no property and no pattern): its keys at most
//!   [`STRING_CHARS`] characters, through a `patternProperties` pattern llguidance enforces;
//! - an object with values of other keys allowed (`additionalProperties` or
//!   `patternProperties`): at most [`OBJECT_KEYS`] keys past its declared ones (in
//!   llguidance's strict mode, only where every declared one is required);
//! - a recursion through `$ref`: at most [`recursion::REF_DEPTH`] levels deep, where the
//!   reference can be cut soundly (see `recursion.rs`);
//! - keywords llguidance ignores (`dependencies`, `if`/`then`/`else`) or approximates
//!   (`oneOf`, as `anyOf`): rewritten into narrower ones it enforces (see `narrow.rs`).
//!
//! Objects and free values are bounded only where no other schema is intersected with them or
//! with a schema they lie in (`allOf`, a `$ref` or `anyOf`/`oneOf` beside other keywords):
//! there, a narrowed part would take away what its partner allows. Where a narrowed schema cannot be compiled at all (a
//! partner asks for a longer string), the gateway falls back to the schema as written.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::{GrammarError, MAX_GRAMMAR_BYTES};

mod narrow;
mod recursion;

pub use recursion::REF_DEPTH;

/// The most characters of a string without a bound of its own.
pub const STRING_CHARS: u64 = 48;
/// The most items of an array without a bound of its own.
pub const ARRAY_ITEMS: u64 = 4;
/// The most keys of a free object, and past the declared ones where they are all required.
pub const OBJECT_KEYS: u64 = 8;
/// How many arrays or objects deep a free value may nest.
pub const ANY_DEPTH: usize = 2;

/// Keywords whose values are data, not subschemas.
const DATA_KEYWORDS: [&str; 4] = ["enum", "const", "default", "examples"];

/// Keywords whose value maps names (of properties, of definitions) to subschemas.
const NAMED_SCHEMAS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Keywords that intersect other schemas with the one they sit in.
const COMBINING: [&str; 4] = ["allOf", "anyOf", "oneOf", "$ref"];

/// Keywords under which a narrower subschema would not narrow the whole (it negates or only
/// decides which other subschema applies): left as written.
const NOT_NARROWING: [&str; 3] = ["not", "if", "contains"];

/// Keywords that assert something of a value; a schema object with none of them is free.
const ASSERTING: [&str; 37] = [
    "type",
    "enum",
    "const",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "properties",
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
    "required",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "items",
    "prefixItems",
    "additionalItems",
    "unevaluatedItems",
    "minItems",
    "maxItems",
    "contains",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "multipleOf",
];

/// Keywords llguidance ignores that decide which keys an object may have or what a reference
/// means: ignored, they let the grammar write outputs the schema refuses, so a schema using
/// them is refused whatever `strict` says (where they can be rewritten into what llguidance
/// enforces, [`rewrite_unevaluated`] does so first).
const REFUSED: [&str; 3] = ["$dynamicRef", "$recursiveRef", "propertyNames"];

/// Refuses the keywords of [`REFUSED`] and `unevaluated*` keywords that cannot be rewritten,
/// naming the keyword; rewrites the others (see [`rewrite_unevaluated`]).
pub fn check_keywords(schema: &mut Value) -> Result<(), GrammarError> {
    match schema {
        Value::Object(obj) => {
            if let Some(k) = REFUSED.iter().find(|k| obj.contains_key(**k)) {
                return Err(refusal(k));
            }
            rewrite_unevaluated(obj)?;
            for (key, value) in obj.iter_mut() {
                let key = key.as_str();
                if NAMED_SCHEMAS.contains(&key) {
                    // Names, not keywords: a property may be called `default`.
                    if let Value::Object(named) = value {
                        named.values_mut().try_for_each(check_keywords)?;
                    }
                } else if !DATA_KEYWORDS.contains(&key) && !key.starts_with("x-") {
                    check_keywords(value)?;
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter_mut().try_for_each(check_keywords),
        _ => Ok(()),
    }
}

fn refusal(keyword: &str) -> GrammarError {
    GrammarError::Invalid(format!(
        "`{keyword}` is not enforced by llguidance, so an output could break it; \
         the schema is refused rather than answered with an invalid value"
    ))
}

/// `unevaluatedProperties` and `unevaluatedItems`, which llguidance ignores: `true` says
/// nothing and goes; beside `additionalProperties` (`items` as a schema, `additionalItems`)
/// nothing is left unevaluated, and it goes; in a schema with no applicator
/// (`allOf`, `anyOf`, `oneOf`, `$ref`, `if`, `dependentSchemas`) it means exactly
/// `additionalProperties` (`items`) and becomes it. Anywhere else it is refused.
fn rewrite_unevaluated(obj: &mut Map<String, Value>) -> Result<(), GrammarError> {
    let applied = ["allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas"]
        .iter()
        .any(|k| obj.contains_key(*k));
    for (keyword, target, covered) in [
        (
            "unevaluatedProperties",
            "additionalProperties",
            obj.contains_key("additionalProperties"),
        ),
        (
            "unevaluatedItems",
            "items",
            obj.get("items").is_some_and(|i| !i.is_array()) || obj.contains_key("additionalItems"),
        ),
    ] {
        let Some(value) = obj.get(keyword) else {
            continue;
        };
        if *value == Value::Bool(true) || covered {
            obj.remove(keyword);
        } else if !applied && !obj.get("items").is_some_and(Value::is_array) {
            let value = obj.remove(keyword).unwrap_or(Value::Null);
            obj.insert(target.into(), value);
        } else {
            return Err(refusal(keyword));
        }
    }
    Ok(())
}

/// Adds the bounds of the module's text to `schema`, a whole request's schema; `lenient` as
/// llguidance will compile it (its strict mode refuses some bounds, see [`bound_object`]).
pub fn bound(schema: &mut Value, lenient: bool) {
    // First, so that the copies of a recursion's targets are bounded like the rest.
    recursion::unroll(schema, MAX_GRAMMAR_BYTES);
    let written = schema.clone();
    let mut combined = HashSet::new();
    let mut foreign = false;
    combined_refs(schema, false, &mut combined, &mut foreign);
    let mut walk = Walk {
        combined,
        foreign,
        lenient,
        pointer: String::new(),
    };
    walk.schema(schema, false);
    // Last, so that what it adds (`allOf`, `anyOf`) keeps no object above from its bounds.
    narrow::narrow(schema, &written);
}

/// The local `$ref`s (their fragment, `/definitions/x`) that sit where another schema is
/// intersected with their target: beside other keywords, or in `allOf`/`anyOf`/`oneOf`.
/// `foreign` is set when such a `$ref` is not local (`other.json#...`).
fn combined_refs(schema: &Value, member: bool, out: &mut HashSet<String>, foreign: &mut bool) {
    match schema {
        Value::Object(obj) => {
            if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
                let beside = obj
                    .keys()
                    .any(|k| k != "$ref" && ASSERTING.contains(&k.as_str()));
                if member || beside {
                    match r.strip_prefix('#') {
                        Some(fragment) => {
                            out.insert(fragment.to_string());
                        }
                        None => *foreign = true,
                    }
                }
            }
            for (key, value) in obj {
                if DATA_KEYWORDS.contains(&key.as_str()) {
                    continue;
                }
                let in_combiner = matches!(key.as_str(), "allOf" | "anyOf" | "oneOf");
                match value {
                    Value::Array(items) if in_combiner => {
                        for v in items {
                            combined_refs(v, true, out, foreign);
                        }
                    }
                    _ => combined_refs(value, false, out, foreign),
                }
            }
        }
        Value::Array(items) => {
            for v in items {
                combined_refs(v, false, out, foreign);
            }
        }
        _ => {}
    }
}

struct Walk {
    /// Fragments of local `$ref`s whose targets are intersected with another schema.
    combined: HashSet<String>,
    /// A `$ref` to another document is intersected with something: no target is known free.
    foreign: bool,
    /// llguidance's `lenient` option for this schema.
    lenient: bool,
    /// Where the walk is, as a JSON pointer (`/properties/a`).
    pointer: String,
}

impl Walk {
    /// Bounds one subschema; `partnered` when something else is intersected with it.
    fn schema(&mut self, schema: &mut Value, partnered: bool) {
        let partnered = partnered
            || (self.foreign && !self.pointer.is_empty())
            || self.combined.contains(&self.pointer);
        if *schema == Value::Bool(true) {
            if !partnered {
                *schema = any(ANY_DEPTH);
            }
            return;
        }
        let Value::Object(obj) = schema else { return };
        let free = !obj.keys().any(|k| ASSERTING.contains(&k.as_str()));
        // Intersected with its siblings inside, or with a partner outside.
        let combined = partnered || obj.keys().any(|k| COMBINING.contains(&k.as_str()));
        if free {
            if !combined && let Value::Object(bounded) = any(ANY_DEPTH) {
                obj.extend(bounded);
            }
            return;
        }
        bound_string(obj);
        bound_array(obj, combined);
        bound_object(obj, combined, self.lenient);
        self.children(obj, partnered);
    }

    /// Bounds the subschemas of `obj`; `partnered` when something else is intersected with
    /// `obj`: its properties' and items' schemas then meet the partner's too.
    fn children(&mut self, obj: &mut Map<String, Value>, partnered: bool) {
        let parent_asserts = obj
            .keys()
            .any(|k| !COMBINING.contains(&k.as_str()) && ASSERTING.contains(&k.as_str()));
        for (key, value) in obj.iter_mut() {
            let key = key.as_str();
            if DATA_KEYWORDS.contains(&key) || NOT_NARROWING.contains(&key) || key.starts_with("x-")
            {
                continue;
            }
            let depth = self.pointer.len();
            self.pointer.push('/');
            self.pointer.push_str(&escape(key));
            match key {
                "allOf" | "anyOf" | "oneOf" => {
                    // allOf's members meet each other; anyOf's and oneOf's meet the keywords
                    // beside them.
                    let partnered = partnered || key == "allOf" || parent_asserts;
                    self.each(value, partnered);
                }
                _ if NAMED_SCHEMAS.contains(&key) => {
                    // Definitions meet what refers to them (`combined_refs`), not `obj`'s
                    // partner.
                    // A dependency's schema meets `obj` itself (`narrow.rs` makes it a member of
                    // `obj`'s `allOf`).
                    let partnered = match key {
                        "$defs" | "definitions" => false,
                        "dependentSchemas" | "dependencies" => true,
                        _ => partnered,
                    };
                    if let Value::Object(map) = value {
                        for (name, sub) in map.iter_mut() {
                            let d = self.pointer.len();
                            self.pointer.push('/');
                            self.pointer.push_str(&escape(name));
                            // A dependency's list of names is not a schema.
                            if !sub.is_array() {
                                self.schema(sub, partnered);
                            }
                            self.pointer.truncate(d);
                        }
                    }
                }
                "items" | "prefixItems" if value.is_array() => self.each(value, partnered),
                // `then` and `else` meet `obj` (`narrow.rs` puts them in its `allOf`).
                "then" | "else" => self.schema(value, true),
                "items"
                | "additionalItems"
                | "additionalProperties"
                | "unevaluatedItems"
                | "unevaluatedProperties" => self.schema(value, partnered),
                _ => {}
            }
            self.pointer.truncate(depth);
        }
    }

    fn each(&mut self, value: &mut Value, partnered: bool) {
        if let Value::Array(items) = value {
            for (i, sub) in items.iter_mut().enumerate() {
                let d = self.pointer.len();
                self.pointer.push_str(&format!("/{i}"));
                self.schema(sub, partnered);
                self.pointer.truncate(d);
            }
        }
    }
}

/// A JSON pointer's escape of one key.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Whether `obj` allows values of type `t`: its `type` says so, or it has none and asserts
/// nothing that could make a bound meet a partner (`{"minLength": 2}` is any value, strings of
/// two characters or more).
fn has_type(obj: &Map<String, Value>, t: &str) -> bool {
    match obj.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(ts)) => ts.iter().any(|x| x.as_str() == Some(t)),
        Some(_) => false,
        None => !["enum", "const", "$dynamicRef", "$recursiveRef"]
            .iter()
            .chain(COMBINING.iter())
            .any(|k| obj.contains_key(*k)),
    }
}

fn count(obj: &Map<String, Value>, key: &str) -> u64 {
    obj.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn bound_string(obj: &mut Map<String, Value>) {
    let open = ["maxLength", "enum", "const"]
        .iter()
        .all(|k| !obj.contains_key(*k));
    if has_type(obj, "string") && open {
        let max = STRING_CHARS.max(count(obj, "minLength"));
        obj.insert("maxLength".into(), max.into());
    }
}

fn bound_array(obj: &mut Map<String, Value>, combined: bool) {
    let tuple = obj.get("items").and_then(Value::as_array).map(Vec::len);
    let prefix = obj
        .get("prefixItems")
        .and_then(Value::as_array)
        .map(Vec::len);
    if !has_type(obj, "array") || obj.contains_key("enum") || obj.contains_key("const") {
        return;
    }
    let needed = count(obj, "minItems").max(tuple.or(prefix).unwrap_or(0) as u64);
    // llguidance does not enforce `uniqueItems`; one item is unique by itself. This bound
    // is for validity, not length: it wins over the schema's own `maxItems` (a smaller one
    // stays), where one item is enough.
    let unique = obj.get("uniqueItems") == Some(&Value::Bool(true)) && needed <= 1;
    let own = obj.get("maxItems").and_then(Value::as_u64);
    if unique {
        obj.insert("maxItems".into(), own.unwrap_or(1).min(1).into());
    } else if !obj.contains_key("maxItems") {
        obj.insert("maxItems".into(), needed.max(ARRAY_ITEMS).into());
    }
    if combined || !has_type(obj, "array") {
        return;
    }
    let rest = if tuple.is_some() {
        "additionalItems"
    } else {
        "items"
    };
    obj.entry(rest).or_insert_with(|| any(ANY_DEPTH - 1));
}

fn bound_object(obj: &mut Map<String, Value>, combined: bool, lenient: bool) {
    // A schema without `type` that declares properties narrows objects only: as good.
    if combined || !has_type(obj, "object") || obj.contains_key("enum") || obj.contains_key("const")
    {
        return;
    }
    let declared: Vec<String> = obj
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let patterns = obj
        .get("patternProperties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    if !obj.contains_key("additionalProperties") {
        let rest = if declared.is_empty() || patterns {
            any(ANY_DEPTH - 1)
        } else {
            Value::Bool(false)
        };
        obj.insert("additionalProperties".into(), rest);
    }
    let patterns = patterns || (declared.is_empty() && name_keys(obj));
    let others = obj.get("additionalProperties") != Some(&Value::Bool(false)) || patterns;
    let required: HashSet<&str> = obj
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // llguidance counts maxProperties against the keys past the required ones only: what it
    // bounds is the keys past the declared ones, at most OBJECT_KEYS of them. With an optional
    // declared property written too, an output may have more keys than the bound says; that
    // breaks the bound, not the schema as written (which has no maxProperties: else none is
    // added), so it is sound. Only llguidance's strict mode refuses maxProperties beside an
    // optional declared property: there, only where every declared one is required.
    let all_required = declared.iter().all(|d| required.contains(d.as_str()));
    if others && (all_required || lenient) && !obj.contains_key("maxProperties") {
        let max = (required.len() as u64 + OBJECT_KEYS).max(count(obj, "minProperties"));
        obj.insert("maxProperties".into(), max.into());
    }
}

/// A map's keys (an object that declares no property or pattern, whose other keys' values
/// `additionalProperties` sets) at most [`STRING_CHARS`] characters: the keys go under one
/// pattern with those values, which llguidance enforces, and no key is left past it. (A key
/// is a string like any other; unbounded, a small model writes one until `max_tokens`.)
/// Returns whether it did (a map that allows no key at all is left as it is).
fn name_keys(obj: &mut Map<String, Value>) -> bool {
    match obj.get("additionalProperties") {
        None | Some(Value::Bool(false)) => false,
        Some(values) => {
            let values = values.clone();
            obj.insert("patternProperties".into(), json!({ key_pattern(): values }));
            obj.insert("additionalProperties".into(), Value::Bool(false));
            true
        }
    }
}

/// The pattern of a bounded key.
fn key_pattern() -> String {
    format!("^.{{0,{STRING_CHARS}}}$")
}

/// Any JSON value at most `depth` arrays or objects deep, under the module's bounds.
pub fn any(depth: usize) -> Value {
    let mut v = json!({
        "type": ["null", "boolean", "number", "string"],
        "maxLength": STRING_CHARS,
    });
    if depth > 0 {
        let inner = any(depth - 1);
        v = json!({
            "type": ["null", "boolean", "number", "string", "array", "object"],
            "maxLength": STRING_CHARS,
            "maxItems": ARRAY_ITEMS,
            "items": inner.clone(),
            "maxProperties": OBJECT_KEYS,
            "patternProperties": { key_pattern(): inner },
            "additionalProperties": false,
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded(mut schema: Value) -> Value {
        bound(&mut schema, true);
        schema
    }

    #[test]
    fn strings_and_arrays_get_bounds_unless_they_have_their_own() {
        let s = bounded(
            json!({"type": "object", "required": ["a", "b", "c", "d", "e"],
            "properties": {
            "a": {"type": "string"},
            "b": {"type": "string", "maxLength": 1000},
            "c": {"type": "string", "pattern": "^x+$"},
            "d": {"type": "array", "items": {"type": "string"}},
            "e": {"type": ["array", "null"], "minItems": 40}}}),
        );
        let p = &s["properties"];
        assert_eq!(p["a"]["maxLength"], STRING_CHARS);
        assert_eq!(p["b"]["maxLength"], 1000);
        assert_eq!(p["c"]["maxLength"], STRING_CHARS);
        assert_eq!(p["d"]["maxItems"], ARRAY_ITEMS);
        assert_eq!(p["d"]["items"]["maxLength"], STRING_CHARS);
        assert_eq!(p["e"]["maxItems"], 40);
        // An array without `items` takes free values, bounded.
        assert_eq!(p["e"]["items"], any(ANY_DEPTH - 1));
    }

    #[test]
    fn unique_items_without_a_bound_take_one_item() {
        let s = bounded(json!({"type": "object", "properties": {
            "one": {"type": "array", "uniqueItems": true, "items": {"type": "string"}},
            "two": {"type": "array", "uniqueItems": true, "minItems": 2},
            "own": {"type": "array", "uniqueItems": true, "maxItems": 9},
            "none": {"type": "array", "uniqueItems": true, "maxItems": 0},
            "any": {"type": "array", "uniqueItems": false}}}));
        let p = &s["properties"];
        // llguidance would let repeats through: a single item cannot repeat.
        assert_eq!(p["one"]["maxItems"], 1);
        // Where one is too few, only the usual bound (repeats stay possible).
        assert_eq!(p["two"]["maxItems"], ARRAY_ITEMS);
        // The schema's own bound gives way to validity; a smaller one stays.
        assert_eq!(p["own"]["maxItems"], 1);
        assert_eq!(p["none"]["maxItems"], 0);
        assert_eq!(p["any"]["maxItems"], ARRAY_ITEMS);
    }

    #[test]
    fn objects_keep_to_their_properties_and_free_values_are_bounded() {
        let s = bounded(json!({"type": "object", "properties": {
            "a": {}, "b": true, "c": {"type": "object"}, "m": {"minLength": 2},
            "n": {"not": {"type": "string"}}},
            "required": ["a"]}));
        assert_eq!(s["additionalProperties"], false);
        // An optional property: maxProperties would be miscounted by llguidance.
        assert!(s.get("maxProperties").is_none());
        let p = &s["properties"];
        assert_eq!(p["a"]["maxProperties"], OBJECT_KEYS);
        assert_eq!(p["b"], any(ANY_DEPTH));
        // A map: its keys bounded by a pattern, its values free and bounded.
        assert_eq!(
            p["c"]["patternProperties"][key_pattern()],
            any(ANY_DEPTH - 1)
        );
        assert_eq!(p["c"]["additionalProperties"], false);
        assert_eq!(p["c"]["maxProperties"], OBJECT_KEYS);
        // Without `type`: any value, strings of two characters or more.
        assert_eq!(p["m"]["maxLength"], STRING_CHARS);
        assert_eq!(p["m"]["items"], any(ANY_DEPTH - 1));
        assert_eq!(
            p["m"]["patternProperties"][key_pattern()],
            any(ANY_DEPTH - 1)
        );
        // A map whose values the schema sets keeps them, under bounded keys.
        let map = bounded(json!({"type": "object", "additionalProperties": {"type": "integer"}}));
        assert_eq!(
            map["patternProperties"],
            json!({ key_pattern(): {"type": "integer"} })
        );
        assert_eq!(map["additionalProperties"], false);
        // Under `not`, a narrower schema would widen the whole.
        assert_eq!(p["n"]["not"], json!({"type": "string"}));
        assert_eq!(
            any(0)["type"],
            json!(["null", "boolean", "number", "string"])
        );
    }

    #[test]
    fn other_keys_are_bounded_beside_optional_properties_unless_strict() {
        let schema = json!({"type": "object", "required": ["r"],
            "properties": {"r": {"type": "integer"}, "o": {"type": "integer"}},
            "additionalProperties": {"type": "integer"}});
        let s = bounded(schema.clone());
        assert_eq!(s["maxProperties"], 1 + OBJECT_KEYS);
        // llguidance's strict mode refuses maxProperties beside an optional property.
        let mut strict = schema;
        bound(&mut strict, false);
        assert!(strict.get("maxProperties").is_none(), "{strict}");
    }

    #[test]
    fn combined_schemas_keep_their_objects_open() {
        let s = bounded(json!({
            "definitions": {
                "base": {"type": "object", "properties": {"a": {"type": "string"}}},
                "alone": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "type": "object",
            "properties": {"x": {"$ref": "#/definitions/alone"}},
            "required": ["x"],
            "allOf": [{"$ref": "#/definitions/base"}, {"properties": {"b": {"type": "string"}}}]}));
        let d = &s["definitions"];
        // base meets allOf's other member: closing it would take `b` away.
        assert!(
            d["base"].get("additionalProperties").is_none(),
            "{}",
            d["base"]
        );
        assert_eq!(d["base"]["properties"]["a"]["maxLength"], STRING_CHARS);
        assert_eq!(d["alone"]["additionalProperties"], false);
        assert!(s.get("additionalProperties").is_none(), "{s}");
        assert!(s["allOf"][1].get("additionalProperties").is_none());
        // What a partner's property holds meets the same property of the other partner.
        let s = bounded(json!({"allOf": [
            {"properties": {"a": {"type": "object", "properties": {"x": {"type": "string"}}}}},
            {"properties": {"a": {"properties": {"y": {"type": "string"}}}}}]}));
        let a = &s["allOf"][0]["properties"]["a"];
        assert!(a.get("additionalProperties").is_none(), "{a}");
        assert_eq!(a["properties"]["x"]["maxLength"], STRING_CHARS);
    }

    #[test]
    fn keywords_llguidance_ignores_are_rewritten_or_refused() {
        let mut s = json!({"type": "object", "properties": {"a": {"type": "string"}},
            "unevaluatedProperties": false,
            "$defs": {"t": {"type": "array", "unevaluatedItems": true}}});
        check_keywords(&mut s).expect("rewritten");
        assert_eq!(s["additionalProperties"], false);
        assert!(s.get("unevaluatedProperties").is_none());
        assert!(s["$defs"]["t"].get("unevaluatedItems").is_none());
        for (schema, keyword) in [
            (json!({"propertyNames": {"maxLength": 3}}), "propertyNames"),
            (
                json!({"items": {"$dynamicRef": "#items"}, "$defs": {}}),
                "$dynamicRef",
            ),
            (
                json!({"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": false}),
                "unevaluatedProperties",
            ),
        ] {
            let mut schema = schema;
            let e = check_keywords(&mut schema).expect_err("refused");
            assert!(e.to_string().contains(&format!("`{keyword}`")), "{e}");
        }
        // Data is data: an enum value naming a keyword is no use of it; a property's name is
        // no keyword.
        let mut data = json!({"enum": [{"propertyNames": 1}]});
        check_keywords(&mut data).expect("data");
        let mut named = json!({"properties": {"default": {"propertyNames": {}}}});
        check_keywords(&mut named).expect_err("a property called default");
    }
}
