//! Keywords llguidance ignores (or, for `oneOf`, takes as `anyOf`), narrowed into keywords it
//! enforces, under the bounds: without this an output may break `dependencies`, an `if`'s
//! `then` or `oneOf`'s "exactly one". As everywhere under the bounds, every rewrite only
//! narrows: any value of the rewritten schema is a value of the schema as written.
//!
//! - `dependencies`, `dependentRequired`, `dependentSchemas`: "where `a` is present, `b` is
//!   too" is exactly "`a` absent, or `b` present" (`anyOf`), which llguidance enforces;
//! - `if`/`then`/`else`: `allOf[if, then]` where llguidance enforces `if` no more loosely than
//!   a validator does; `else` beside a negation of `if` where one can be written (a
//!   property's value outside the values `if` accepts, out of the property's own `enum`);
//! - `oneOf`: each member narrowed (to objects, a key another member requires made absent)
//!   until no value of it can match another member as written; members that cannot be
//!   separated so are dropped, and what remains is an `anyOf`, which is then exact.
//!
//! It runs after the bounds, so the keywords it adds (`allOf`, `anyOf`) do not keep the
//! bounds from closing objects; what is known of a `oneOf`'s *other* members is read from the
//! schema before the bounds (a bound is no fact of the schema as written).

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use super::{DATA_KEYWORDS, NAMED_SCHEMAS, NOT_NARROWING};

/// The most dependencies of one object written exactly, as an `anyOf` of two each: llguidance
/// multiplies an object by each `anyOf` it meets, so n of them make 2^n objects in the grammar.
/// Past it, a dependency is narrowed one way (see [`Narrow::dependencies`]).
const EXACT_DEPENDENCIES: usize = 4;

/// Keywords that llguidance enforces no more loosely than a JSON Schema validator: an `if`
/// made of them and annotations only can go into `allOf` (llguidance is stricter in places,
/// an integer never `1.0`, which only narrows). Left out: `pattern` and `format` (another
/// regex dialect, other format checkers), `minProperties`/`maxProperties` (llguidance counts
/// past the required keys), `oneOf` (taken as `anyOf`), draft 4's boolean `exclusiveMinimum`,
/// `$ref` and every keyword llguidance ignores.
const EXACT: [&str; 15] = [
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "anyOf",
];

/// Keywords that say nothing of a value.
const ANNOTATIONS: [&str; 8] = [
    "title",
    "description",
    "$comment",
    "default",
    "examples",
    "readOnly",
    "writeOnly",
    "deprecated",
];

/// Rewrites `schema` (bounded already); `written` is the same schema before the bounds.
pub fn narrow(schema: &mut Value, written: &Value) {
    let current = schema.clone();
    let walk = Narrow {
        written,
        current: &current,
    };
    walk.schema(schema, &mut String::new());
}

struct Narrow<'a> {
    /// The schema before the bounds: what a `oneOf`'s other members are as written.
    written: &'a Value,
    /// The schema bounded, before this walk: where a member's `$ref` leads.
    current: &'a Value,
}

impl Narrow<'_> {
    fn schema(&self, schema: &mut Value, pointer: &mut String) {
        let Value::Object(obj) = schema else { return };
        self.dependencies(obj);
        self.conditional(obj);
        self.one_of(obj, pointer);
        for (key, value) in obj.iter_mut() {
            let key = key.as_str();
            if DATA_KEYWORDS.contains(&key) || NOT_NARROWING.contains(&key) || key.starts_with("x-")
            {
                continue;
            }
            let depth = pointer.len();
            pointer.push('/');
            pointer.push_str(&super::escape(key));
            match value {
                Value::Object(named) if NAMED_SCHEMAS.contains(&key) => {
                    for (name, sub) in named.iter_mut() {
                        let d = pointer.len();
                        pointer.push('/');
                        pointer.push_str(&super::escape(name));
                        self.schema(sub, pointer);
                        pointer.truncate(d);
                    }
                }
                Value::Array(items) => {
                    for (i, sub) in items.iter_mut().enumerate() {
                        let d = pointer.len();
                        pointer.push_str(&format!("/{i}"));
                        self.schema(sub, pointer);
                        pointer.truncate(d);
                    }
                }
                v => self.schema(v, pointer),
            }
            pointer.truncate(depth);
        }
    }

    /// `dependencies` (both forms), `dependentRequired`, `dependentSchemas`, written as what
    /// llguidance enforces and removed. "`a` needs `b`" is exactly `anyOf[a absent, b
    /// present]` (and `b present` alone where `a` is required). Past [`EXACT_DEPENDENCIES`]
    /// such pairs, one side is kept: where `a` is optional, `a` absent. That keeps every value
    /// the rest of the object allows without `a`, and asks the model for no key more (making
    /// `b` required would ask for one more value in every output, and more outputs would run
    /// past `max_tokens`).
    fn dependencies(&self, obj: &mut Map<String, Value>) {
        let required = names(obj.get("required"));
        let mut clauses = Vec::new();
        let mut pairs = 0;
        for keyword in ["dependencies", "dependentRequired", "dependentSchemas"] {
            let Some(Value::Object(deps)) = obj.get(keyword) else {
                continue;
            };
            for (trigger, dep) in deps {
                let needs = match dep {
                    Value::Array(list) => {
                        let list: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
                        if list.is_empty() {
                            continue;
                        }
                        json!({ "required": list })
                    }
                    Value::Bool(true) => continue,
                    Value::Bool(false) | Value::Object(_) => dep.clone(),
                    _ => continue,
                };
                let absent = json!({ "properties": { trigger.as_str(): false } });
                let clause = if required.contains(trigger.as_str()) {
                    needs
                } else if pairs < EXACT_DEPENDENCIES {
                    pairs += 1;
                    json!({ "anyOf": [absent, needs] })
                } else {
                    absent
                };
                clauses.push(clause);
            }
        }
        for keyword in ["dependencies", "dependentRequired", "dependentSchemas"] {
            if obj.get(keyword).is_some_and(Value::is_object) {
                obj.remove(keyword);
            }
        }
        conjoin(obj, clauses);
    }

    /// `if`/`then`/`else`, as an `anyOf` of `allOf[if, then]` and `allOf[not if, else]`
    /// where each can be written soundly (see [`exact`] and [`negation`]); an `else` that is
    /// itself an `if` gives its own branches, each beside the negation. Left as written where
    /// neither branch can be.
    fn conditional(&self, obj: &mut Map<String, Value>) {
        let Some(condition) = obj.get("if") else {
            return;
        };
        if !obj.contains_key("then") && !obj.contains_key("else") {
            // An `if` alone asserts nothing.
            obj.remove("if");
            return;
        }
        let properties = obj.get("properties").cloned().unwrap_or(Value::Null);
        let branches = self.branches(condition, obj.get("then"), obj.get("else"), &properties);
        if branches.is_empty() {
            return;
        }
        for k in ["if", "then", "else"] {
            obj.remove(k);
        }
        conjoin(obj, vec![json!({ "anyOf": branches })]);
    }

    fn branches(
        &self,
        condition: &Value,
        then: Option<&Value>,
        otherwise: Option<&Value>,
        properties: &Value,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        if exact(condition) {
            let mut all = vec![condition.clone()];
            all.extend(then.cloned());
            out.push(json!({ "allOf": all }));
        }
        let Some(not) = self.negation(condition, properties) else {
            return out;
        };
        match otherwise {
            Some(Value::Object(e)) if e.contains_key("if") => {
                // An `else` that is an `if` itself (with keywords beside it, which hold in
                // each of its branches).
                let inner = self.branches(&e["if"], e.get("then"), e.get("else"), properties);
                if inner.is_empty() {
                    // The nested `if` cannot be written: nor can this branch.
                    return out;
                }
                let rest: Map<String, Value> = e
                    .iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "if" | "then" | "else"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                for b in inner {
                    let mut all = vec![not.clone()];
                    if !rest.is_empty() {
                        all.push(Value::Object(rest.clone()));
                    }
                    all.push(b);
                    out.push(json!({ "allOf": all }));
                }
            }
            Some(e) => out.push(json!({ "allOf": [not, e.clone()] })),
            None => out.push(not),
        }
        out
    }

    /// Objects that `condition` refuses, for a condition of `properties` (and `required`)
    /// only: a property present with a value of its own `enum` (in `properties`, the object's)
    /// that the condition's schema for it refuses, or a required key absent. Each disjunct
    /// found refuses the condition; one that cannot be written is left out (fewer values,
    /// still only ones the condition refuses). None where none can be written.
    fn negation(&self, condition: &Value, properties: &Value) -> Option<Value> {
        let cond = condition.as_object()?;
        if !cond.keys().all(|k| {
            matches!(k.as_str(), "properties" | "required") || ANNOTATIONS.contains(&k.as_str())
        }) {
            return None;
        }
        let mut any = Vec::new();
        for key in names(cond.get("required")) {
            any.push(json!({"type": "object", "properties": { key: false }}));
        }
        if let Some(Value::Object(props)) = cond.get("properties") {
            for (name, accepted) in props {
                let Some(own) = properties.get(name).and_then(|p| values(p, self.current)) else {
                    continue;
                };
                if own
                    .iter()
                    .any(|v| v.is_number() || v.is_array() || v.is_object())
                {
                    // 1 and 1.0 are one value to a validator, two to `==` (inside an array
                    // or object too).
                    continue;
                }
                let mut refused = Vec::new();
                let mut known = true;
                for v in own {
                    match accepts(accepted, &v) {
                        Some(false) => refused.push(v),
                        Some(true) => {}
                        None => known = false,
                    }
                }
                if known && !refused.is_empty() {
                    any.push(json!({
                        "type": "object", "required": [name], "properties": { name: { "enum": refused } }
                    }));
                }
            }
        }
        match any.len() {
            0 => None,
            1 => any.pop(),
            _ => Some(json!({ "anyOf": any })),
        }
    }

    /// A `oneOf` whose members may overlap, as an `anyOf` of members that cannot: each member
    /// narrowed to objects where it is about objects, and a key that another member requires
    /// made absent where that separates them; a member still not shown apart from every other
    /// member as written is dropped. Where none is left, the `oneOf` stays as written.
    fn one_of(&self, obj: &mut Map<String, Value>, pointer: &str) {
        let Some(Value::Array(written)) = self
            .written
            .pointer(pointer)
            .and_then(|w| w.get("oneOf"))
            .cloned()
        else {
            return;
        };
        let Some(Value::Array(members)) = obj.get("oneOf") else {
            return;
        };
        if members.len() != written.len() || members.len() < 2 {
            return;
        }
        let others: Vec<Facts> = written.iter().map(|m| Facts::of(m, self.written)).collect();
        let parent = Facts::of_map(obj);
        let mut kept = Vec::new();
        for (i, member) in members.iter().enumerate() {
            let mut facts = Facts::of(member, self.current);
            let object = parent.types_only("object")
                || facts.types_only("object")
                || (facts.types.is_none() && facts.about_objects);
            if facts.never || (!object && facts.types.is_none() && facts.values.is_none()) {
                continue;
            }
            let types = facts.types.as_deref().unwrap_or_default();
            if object && !types.is_empty() && !types.iter().any(|t| t == "object") {
                // A member of another type under a parent that takes objects only matches
                // nothing: made an object, it would match what it does not as written.
                continue;
            }
            let mut absent = Vec::new();
            let mut needed = Vec::new();
            // Already about objects alone: no `type` to add (nor, for a reference, an
            // `allOf` around it, which llguidance refuses around a recursive one).
            let to_objects = object && !facts.types_only("object");
            if object {
                facts.types = Some(vec!["object".into()]);
                facts.required.extend(parent.required.iter().cloned());
                for (k, v) in &parent.properties {
                    facts
                        .properties
                        .entry(k.clone())
                        .or_insert_with(|| v.clone());
                }
            }
            let separated = others.iter().enumerate().all(|(j, other)| {
                if j == i || facts.excludes(other, self.current, self.written) {
                    return true;
                }
                if !object {
                    return false;
                }
                // A key the other member requires, made absent here.
                if let Some(k) = other.required.iter().find(|k| !facts.required.contains(*k)) {
                    absent.push(k.clone());
                    facts.properties.insert(k.clone(), Value::Bool(false));
                    return true;
                }
                // A key both members declare with values apart (`{"events": [...]}` and
                // `{"events": "all"}`), made required here: `{}` matches both as written.
                let key = facts.properties.iter().find_map(|(k, here)| {
                    let there = other.properties.get(k)?;
                    let apart = *here != Value::Bool(false)
                        && !facts.required.contains(k)
                        && Facts::of(here, self.current).apart(&Facts::of(there, self.written));
                    apart.then(|| k.clone())
                });
                match key {
                    Some(k) => {
                        facts.required.insert(k.clone());
                        needed.push(k);
                        true
                    }
                    None => false,
                }
            });
            if separated {
                kept.push(narrowed(member, to_objects, &absent, &needed));
            }
        }
        if kept.is_empty() {
            return;
        }
        obj.remove("oneOf");
        if obj.contains_key("anyOf") {
            conjoin(obj, vec![json!({ "anyOf": kept })]);
        } else {
            obj.insert("anyOf".into(), Value::Array(kept));
        }
    }
}

/// `member` narrowed to objects where `to_objects`, without the keys `absent` and with the
/// keys `needed`.
fn narrowed(member: &Value, to_objects: bool, absent: &[String], needed: &[String]) -> Value {
    if !to_objects && absent.is_empty() && needed.is_empty() {
        return member.clone();
    }
    let mut m = match member {
        Value::Object(m) if !m.contains_key("$ref") => m.clone(),
        // A reference's target is not copied: its narrowing goes beside it.
        other => {
            let mut m = Map::new();
            m.insert("allOf".into(), Value::Array(vec![other.clone()]));
            m
        }
    };
    if to_objects {
        m.insert("type".into(), "object".into());
    }
    if !absent.is_empty() {
        let props = m
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(props) = props {
            for k in absent {
                props.insert(k.clone(), Value::Bool(false));
            }
        }
    }
    if !needed.is_empty() {
        let mut required: Vec<Value> = m
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        required.extend(needed.iter().map(|k| Value::String(k.clone())));
        m.insert("required".into(), Value::Array(required));
    }
    Value::Object(m)
}

/// Adds `clauses` to `obj`'s `allOf`.
fn conjoin(obj: &mut Map<String, Value>, clauses: Vec<Value>) {
    if clauses.is_empty() {
        return;
    }
    // An `allOf` that is not an array: llguidance refuses the schema anyway.
    if let Value::Array(all) = obj
        .entry("allOf")
        .or_insert_with(|| Value::Array(Vec::new()))
    {
        all.extend(clauses);
    }
}

fn names(v: Option<&Value>) -> HashSet<String> {
    v.and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `schema` with its `$ref`s followed (local ones, a few deep); None where one cannot be.
fn resolve<'a>(mut schema: &'a Value, doc: &'a Value) -> Option<&'a Value> {
    for _ in 0..8 {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let fragment = r.strip_prefix('#')?;
                schema = if fragment.is_empty() || fragment == "/" {
                    doc
                } else {
                    doc.pointer(fragment)?
                };
            }
            None => return Some(schema),
        }
    }
    None
}

/// The values a schema allows, where it lists them (`const`, `enum`, `false`).
fn values(schema: &Value, doc: &Value) -> Option<Vec<Value>> {
    let s = resolve(schema, doc)?;
    if *s == Value::Bool(false) {
        return Some(Vec::new());
    }
    if let Some(c) = s.get("const") {
        return Some(vec![c.clone()]);
    }
    s.get("enum").and_then(Value::as_array).cloned()
}

/// Whether `schema` accepts `value` (a string, boolean or null), for a schema of `const`,
/// `enum`, `type` and `anyOf` only; None for anything else.
fn accepts(schema: &Value, value: &Value) -> Option<bool> {
    let obj = match schema {
        Value::Bool(b) => return Some(*b),
        Value::Object(obj) => obj,
        _ => return None,
    };
    let mut ok = true;
    for (k, v) in obj {
        ok &= match k.as_str() {
            "const" => v == value,
            "enum" => v.as_array()?.contains(value),
            "type" => {
                let t = match value {
                    Value::String(_) => "string",
                    Value::Bool(_) => "boolean",
                    Value::Null => "null",
                    _ => return None,
                };
                match v {
                    Value::String(s) => s == t,
                    Value::Array(ts) => ts.iter().any(|x| x.as_str() == Some(t)),
                    _ => return None,
                }
            }
            "anyOf" => {
                let mut any = false;
                for m in v.as_array()? {
                    any |= accepts(m, value)?;
                }
                any
            }
            a if ANNOTATIONS.contains(&a) => true,
            _ => return None,
        };
    }
    Some(ok)
}

/// Whether llguidance enforces `schema` no more loosely than a validator (see [`EXACT`]).
fn exact(schema: &Value) -> bool {
    let Value::Object(obj) = schema else {
        return schema.is_boolean();
    };
    obj.iter().all(|(k, v)| match k.as_str() {
        "properties" => v.as_object().is_some_and(|p| p.values().all(exact)),
        "items" | "additionalProperties" => v.is_boolean() || exact(v),
        "prefixItems" | "anyOf" => v.as_array().is_some_and(|a| a.iter().all(exact)),
        k => EXACT.contains(&k) || ANNOTATIONS.contains(&k),
    })
}

/// What one `oneOf` member says of a value, as far as telling members apart needs.
#[derive(Default)]
struct Facts {
    /// Its `type`, where it has one.
    types: Option<Vec<String>>,
    /// It allows nothing.
    never: bool,
    /// It has object keywords (so without a `type`, it is about objects).
    about_objects: bool,
    required: HashSet<String>,
    properties: Map<String, Value>,
    /// No key but its `properties`.
    closed: bool,
    /// Its `const` or `enum`.
    values: Option<Vec<Value>>,
}

impl Facts {
    /// The facts of `member`, its `$ref` followed in `doc` (a validator of draft 7 or
    /// earlier ignores a reference's siblings: only the target's facts are used).
    fn of(member: &Value, doc: &Value) -> Facts {
        match resolve(member, doc) {
            Some(Value::Object(obj)) => {
                let mut f = Facts::of_map(obj);
                f.values = values(&Value::Object(obj.clone()), doc);
                f
            }
            Some(Value::Bool(false)) => Facts {
                never: true,
                ..Facts::default()
            },
            _ => Facts::default(),
        }
    }

    fn of_map(obj: &Map<String, Value>) -> Facts {
        let types = match obj.get("type") {
            Some(Value::String(t)) => Some(vec![t.clone()]),
            Some(Value::Array(ts)) => Some(
                ts.iter()
                    .filter_map(|t| t.as_str().map(String::from))
                    .collect(),
            ),
            _ => None,
        };
        let properties = obj
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let patterns = obj
            .get("patternProperties")
            .and_then(Value::as_object)
            .is_some_and(|p| !p.is_empty());
        Facts {
            types,
            never: false,
            about_objects: [
                "properties",
                "required",
                "additionalProperties",
                "patternProperties",
            ]
            .iter()
            .any(|k| obj.contains_key(*k)),
            required: names(obj.get("required")),
            properties,
            closed: obj.get("additionalProperties") == Some(&Value::Bool(false)) && !patterns,
            values: None,
        }
    }

    fn types_only(&self, t: &str) -> bool {
        self.types
            .as_ref()
            .is_some_and(|ts| ts.iter().all(|x| x == t) && !ts.is_empty())
    }

    /// Whether no value these facts allow is one `other` allows, by type or listed values.
    fn apart(&self, other: &Facts) -> bool {
        if self.never || other.never {
            return true;
        }
        if let (Some(a), Some(b)) = (&self.types, &other.types) {
            let overlap = a.iter().any(|x| {
                b.iter().any(|y| {
                    x == y || (x == "integer" && y == "number") || (x == "number" && y == "integer")
                })
            });
            if !overlap {
                return true;
            }
        }
        matches!((&self.values, &other.values), (Some(a), Some(b)) if disjoint(a, b))
    }

    /// Whether no value these facts allow (they are enforced: read from the grammar's
    /// schema) is a value of `other` (read from the schema as written).
    fn excludes(&self, other: &Facts, doc: &Value, written: &Value) -> bool {
        if self.apart(other) {
            return true;
        }
        if !self.types_only("object") {
            return false;
        }
        let required_here = self.required.iter().any(|k| {
            let unknown_there = other.closed && !other.properties.contains_key(k);
            let apart = match (self.properties.get(k), other.properties.get(k)) {
                (Some(here), Some(there)) => Facts::of(here, doc).apart(&Facts::of(there, written)),
                _ => false,
            };
            unknown_there || apart
        });
        let required_there = other.required.iter().any(|k| match self.properties.get(k) {
            Some(p) => *p == Value::Bool(false),
            None => self.closed,
        });
        required_here || required_there
    }
}

/// Whether no value of `a` equals one of `b` (numbers compared as numbers).
fn disjoint(a: &[Value], b: &[Value]) -> bool {
    let same = |x: &Value, y: &Value| match (x.as_f64(), y.as_f64()) {
        (Some(p), Some(q)) => p == q,
        _ => x == y,
    };
    !a.iter().any(|x| b.iter().any(|y| same(x, y)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn narrowed(mut schema: Value) -> Value {
        let written = schema.clone();
        narrow(&mut schema, &written);
        schema
    }

    #[test]
    fn one_of_members_are_told_apart_or_dropped() {
        let s = narrowed(json!({"type": "array", "items": {"oneOf": [
            {"required": ["a"], "properties": {"a": {"const": "x"}}},
            {"required": ["b"], "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}},
            {"required": ["c"], "additionalProperties": false, "properties": {"c": {}}},
            {"type": "string"}]}}));
        let items = &s["items"];
        assert!(items.get("oneOf").is_none(), "{items}");
        let any = items["anyOf"].as_array().expect("anyOf");
        // The string member is dropped: a string matches the typeless members too.
        assert_eq!(any.len(), 3, "{items}");
        assert_eq!(any[0]["type"], "object");
        // Each of the first two could have the key the other requires: no longer.
        assert_eq!(any[0]["properties"]["b"], false);
        assert_eq!(any[1]["properties"]["a"], false);
        assert_eq!(any[1]["properties"]["b"], json!({"type": "integer"}));
        // Closed without `a` or `b`, the third meets neither; they require a key it lacks.
        assert_eq!(any[2]["properties"], json!({"c": {}}));
        // Members told apart by a required key's values (from the parent and a reference),
        // with no key taken away.
        let s = narrowed(json!({
            "definitions": {"p": {"properties": {"kind": {"enum": ["p"]}}},
                "q": {"properties": {"kind": {"const": "q"}}}},
            "required": ["kind"],
            "oneOf": [{"$ref": "#/definitions/p"}, {"$ref": "#/definitions/q"}]}));
        assert_eq!(
            s["anyOf"][0],
            json!({"allOf": [{"$ref": "#/definitions/p"}], "type": "object"})
        );
        // Nothing tells these apart: left as written.
        let overlapping = json!({"oneOf": [{"minLength": 2}, {"maxLength": 5}]});
        assert_eq!(narrowed(overlapping.clone()), overlapping);
        // Members that require nothing: `{}` matches both; a key both declare with values
        // of other types is made required in each.
        let s = narrowed(json!({"oneOf": [
            {"properties": {"e": {"type": "array"}}},
            {"properties": {"e": {"$ref": "#/$defs/e"}}}],
            "$defs": {"e": {"type": "string", "enum": ["all"]}}}));
        assert_eq!(s["anyOf"][0]["required"], json!(["e"]), "{s}");
        assert_eq!(s["anyOf"][1]["required"], json!(["e"]), "{s}");
        // Under a parent that takes objects only, a string member matches nothing: dropped,
        // not made an object.
        let s = narrowed(json!({"type": "object", "oneOf": [
            {"type": "string"}, {"required": ["a"]}, {"required": ["b"]}]}));
        let any = s["anyOf"].as_array().expect("anyOf");
        assert_eq!(any.len(), 2, "{s}");
        assert!(any.iter().all(|m| m.get("required").is_some()), "{s}");
        // Typed members of different types need nothing.
        let typed = narrowed(json!({"oneOf": [{"type": "string"}, {"type": "integer"}]}));
        assert_eq!(
            typed,
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})
        );
    }

    #[test]
    fn dependencies_become_what_llguidance_enforces() {
        let s = narrowed(json!({"type": "object", "required": ["r"],
            "dependencies": {"a": ["b"], "r": ["c"], "e": []},
            "dependentSchemas": {"s": {"required": ["t"]}}}));
        assert!(s.get("dependencies").is_none() && s.get("dependentSchemas").is_none());
        assert_eq!(
            s["allOf"],
            json!([
                {"anyOf": [{"properties": {"a": false}}, {"required": ["b"]}]},
                // `r` is always there: so is `c`.
                {"required": ["c"]},
                {"anyOf": [{"properties": {"s": false}}, {"required": ["t"]}]}])
        );
        // Past the exact ones, an optional trigger is made absent.
        let many: Map<String, Value> = (0..=EXACT_DEPENDENCIES)
            .map(|i| (format!("k{i}"), json!(["z"])))
            .collect();
        let s = narrowed(json!({"dependentRequired": many}));
        let all = s["allOf"].as_array().expect("allOf");
        assert_eq!(all.len(), EXACT_DEPENDENCIES + 1);
        assert_eq!(
            all[EXACT_DEPENDENCIES],
            json!({"properties": {format!("k{EXACT_DEPENDENCIES}"): false}})
        );
    }

    #[test]
    fn conditionals_become_branches_where_they_can_be_written() {
        let s = narrowed(json!({"type": "object",
            "properties": {"kind": {"type": "string", "enum": ["a", "b", "c"]}},
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"required": ["x"]},
            "else": {"if": {"properties": {"kind": {"enum": ["b"]}}}, "then": {"required": ["y"]}}}));
        assert!(s.get("if").is_none() && s.get("then").is_none() && s.get("else").is_none());
        let not_a = json!({"type": "object", "required": ["kind"],
            "properties": {"kind": {"enum": ["b", "c"]}}});
        let not_b = json!({"type": "object", "required": ["kind"],
            "properties": {"kind": {"enum": ["a", "c"]}}});
        assert_eq!(
            s["allOf"][0]["anyOf"],
            json!([
                {"allOf": [{"properties": {"kind": {"const": "a"}}}, {"required": ["x"]}]},
                {"allOf": [not_a, {"allOf": [{"properties": {"kind": {"enum": ["b"]}}},
                    {"required": ["y"]}]}]},
                {"allOf": [not_a, not_b]}])
        );
        // A condition llguidance may hold more loosely (a pattern) gives no `then` branch;
        // one without values to negate (numbers) no `else` branch; neither: as written.
        let loose = json!({"properties": {"n": {"enum": [1, 2]}},
            "if": {"properties": {"n": {"pattern": "^1$"}}}, "then": {"required": ["x"]}});
        assert_eq!(narrowed(loose.clone()), loose);
        let s = narrowed(json!({"properties": {"k": {"enum": ["a", "b"]}},
            "if": {"properties": {"k": {"pattern": "a"}}}, "then": {"required": ["x"]}}));
        assert!(
            s.get("if").is_some(),
            "the pattern's values cannot be told: {s}"
        );
        // An `if` alone asserts nothing.
        assert_eq!(narrowed(json!({"if": {"required": ["a"]}})), json!({}));
    }
}
