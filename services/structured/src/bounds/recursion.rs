//! Recursion through `$ref`, unrolled to [`REF_DEPTH`] levels.
//!
//! llguidance compiles a cyclic `$ref` into a recursive grammar rule, so nothing in the
//! grammar ends a recursion: a small model held to `{"properties": {"foo": {"$ref": "#"}}}`
//! writes `{"foo":{"foo":…` until `max_tokens`. Here every target of a cyclic reference is
//! copied [`REF_DEPTH`] times, each level's references pointing at the next level's copies,
//! and at the last level a reference is cut where dropping it narrows the schema (`false`
//! where the value may be absent or left out: an optional property, the items of an array
//! that may be empty, a map's values, an `anyOf` member beside others). Where it may not (a
//! required property, a `oneOf` member: dropping one could let a value match exactly one
//! member where the original matched two), the reference stays and points at its own level:
//! recursion there is left as the schema wrote it.
//!
//! The copies are the targets as written, so up to the last level the unrolled schema has
//! exactly the values of the original; the cuts only take values away.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::{DATA_KEYWORDS, NAMED_SCHEMAS};

/// How many times a value may pass through a cyclic reference before it is cut.
pub const REF_DEPTH: usize = 3;

/// Unrolls the cyclic local references of `schema` (a whole request's schema); leaves it as
/// it is where a reference cannot be resolved here (an anchor, another document, an `$id`
/// below the root changing what a reference means) or where the copies would pass
/// `max_bytes`.
pub fn unroll(schema: &mut Value, max_bytes: usize) {
    let Some(root) = schema.as_object() else {
        return;
    };
    let mut refs = Vec::new();
    if !collect_refs(schema, true, &mut refs) {
        return;
    }
    let mut targets: Vec<String> = Vec::new();
    for r in &refs {
        let Some(fragment) = local_fragment(r) else {
            // Another document: llguidance resolves it (or refuses); nothing cyclic here.
            continue;
        };
        if !fragment.is_empty() && !fragment.starts_with('/') {
            // An anchor (`#node`): not a pointer this module can follow.
            return;
        }
        if !targets.contains(&fragment) {
            targets.push(fragment);
        }
    }
    // Each target's outgoing references (its definitions aside: they assert nothing).
    let mut edges: HashMap<&str, Vec<String>> = HashMap::new();
    for t in &targets {
        let Some(target) = schema.pointer(t) else {
            return;
        };
        let mut out = Vec::new();
        collect_refs(target, false, &mut out);
        edges.insert(t, out.iter().filter_map(|r| local_fragment(r)).collect());
    }
    let cyclic: Vec<String> = targets
        .iter()
        .filter(|t| reaches(t, t, &edges))
        .cloned()
        .collect();
    if cyclic.is_empty() {
        return;
    }
    let defs = if root.contains_key("definitions") && !root.contains_key("$defs") {
        "definitions"
    } else {
        "$defs"
    };
    let index: HashMap<&str, usize> = cyclic
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let name = |level: usize, i: usize| format!("ferrite-ref-{level}-{i}");
    let mut copies = Map::new();
    for level in 1..=REF_DEPTH {
        for (i, t) in cyclic.iter().enumerate() {
            let Some(Value::Object(target)) = schema.pointer(t) else {
                // A boolean target (`true`) refers to nothing; it cannot be cyclic.
                return;
            };
            let mut copy = target.clone();
            for k in ["$defs", "definitions", "$schema", "$id", "x-guidance"] {
                copy.remove(k);
            }
            let mut copy = Value::Object(copy);
            let relink = Relink {
                index: &index,
                defs,
                level,
            };
            relink.schema(&mut copy);
            copies.insert(name(level, i), copy);
        }
    }
    let mut unrolled = schema.clone();
    Relink {
        index: &index,
        defs,
        level: 0,
    }
    .schema(&mut unrolled);
    let Some(obj) = unrolled.as_object_mut() else {
        return;
    };
    match obj.entry(defs).or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(map) => map.extend(copies),
        _ => return,
    }
    if unrolled.to_string().len() <= max_bytes {
        *schema = unrolled;
    }
}

/// `#/definitions/x` → `/definitions/x`; `#` → the root, ``; another document → None.
fn local_fragment(r: &str) -> Option<String> {
    let fragment = r.strip_prefix('#')?;
    Some(if fragment == "/" {
        String::new()
    } else {
        fragment.to_string()
    })
}

/// Whether `to` is reachable from `from` through one reference or more.
fn reaches(from: &str, to: &str, edges: &HashMap<&str, Vec<String>>) -> bool {
    let mut seen = HashSet::new();
    let mut stack: Vec<&str> = edges
        .get(from)
        .map(|e| e.iter().map(String::as_str).collect())
        .unwrap_or_default();
    while let Some(n) = stack.pop() {
        if n == to {
            return true;
        }
        if seen.insert(n) {
            stack.extend(edges.get(n).into_iter().flatten().map(String::as_str));
        }
    }
    false
}

/// Collects the `$ref`s of `schema`, its definitions too where `definitions` says so.
/// Returns false where an `$id` below the root makes references relative to another base.
fn collect_refs(schema: &Value, definitions: bool, out: &mut Vec<String>) -> bool {
    collect(schema, definitions, true, out)
}

fn collect(schema: &Value, definitions: bool, root: bool, out: &mut Vec<String>) -> bool {
    let Value::Object(obj) = schema else {
        return true;
    };
    if !root
        && ["$id", "id"]
            .iter()
            .any(|k| obj.get(*k).is_some_and(Value::is_string))
    {
        return false;
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        out.push(r.to_string());
    }
    for (key, value) in obj {
        let key = key.as_str();
        if DATA_KEYWORDS.contains(&key) || key.starts_with("x-") {
            continue;
        }
        if !definitions && matches!(key, "$defs" | "definitions") {
            continue;
        }
        let ok = match value {
            Value::Object(named) if NAMED_SCHEMAS.contains(&key) => {
                named.values().all(|v| collect(v, definitions, false, out))
            }
            Value::Array(items) => items.iter().all(|v| collect(v, definitions, false, out)),
            v => collect(v, definitions, false, out),
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Points one level's cyclic references at the next level's copies; at the last level,
/// cuts them where that narrows.
struct Relink<'a> {
    index: &'a HashMap<&'a str, usize>,
    defs: &'a str,
    level: usize,
}

impl Relink<'_> {
    /// Whether `schema` refers to a cyclic target.
    fn cyclic(&self, schema: &Value) -> bool {
        schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(local_fragment)
            .is_some_and(|f| self.index.contains_key(f.as_str()))
    }

    /// Relinks `schema`, which is where it must be (not cut).
    fn schema(&self, schema: &mut Value) {
        let Value::Object(obj) = schema else { return };
        if let Some(Value::String(r)) = obj.get_mut("$ref")
            && let Some(&i) = local_fragment(r).and_then(|f| self.index.get(f.as_str()))
        {
            // At the last level, a reference that may not be cut recurses there.
            let next = (self.level + 1).min(REF_DEPTH);
            *r = format!("#/{}/ferrite-ref-{next}-{i}", self.defs);
        }
        let last = self.level == REF_DEPTH;
        let required: HashSet<String> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let may_be_empty = obj.get("minItems").and_then(Value::as_f64).unwrap_or(0.0) == 0.0
            && !obj.contains_key("contains");
        for (key, value) in obj.iter_mut() {
            let key = key.as_str();
            if DATA_KEYWORDS.contains(&key) || key.starts_with("x-") {
                continue;
            }
            match value {
                Value::Object(named) if NAMED_SCHEMAS.contains(&key) => {
                    for (name, sub) in named.iter_mut() {
                        // An optional property's value, a map's values: the key may be left
                        // out.
                        let absent = match key {
                            "properties" => !required.contains(name),
                            "patternProperties" => true,
                            _ => false,
                        };
                        self.cut_or_relink(sub, last && absent);
                    }
                }
                Value::Array(items) if key == "anyOf" => {
                    // One member may go while another, not cyclic, remains.
                    let others = items.iter().any(|m| !self.cyclic(m));
                    for m in items.iter_mut() {
                        self.cut_or_relink(m, last && others);
                    }
                }
                Value::Array(items) => items.iter_mut().for_each(|m| self.schema(m)),
                v => {
                    let absent = match key {
                        "additionalProperties" | "additionalItems" => true,
                        "items" => may_be_empty,
                        _ => false,
                    };
                    self.cut_or_relink(v, last && absent);
                }
            }
        }
    }

    fn cut_or_relink(&self, sub: &mut Value, cut: bool) {
        if cut && self.cyclic(sub) {
            *sub = Value::Bool(false);
        } else {
            self.schema(sub);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn unrolled(mut schema: Value) -> Value {
        unroll(&mut schema, usize::MAX);
        schema
    }

    #[test]
    fn a_recursion_through_an_optional_property_ends_after_the_last_level() {
        let s =
            unrolled(json!({"properties": {"foo": {"$ref": "#"}}, "additionalProperties": false}));
        assert_eq!(s["properties"]["foo"]["$ref"], "#/$defs/ferrite-ref-1-0");
        let defs = &s["$defs"];
        assert_eq!(
            defs["ferrite-ref-1-0"]["properties"]["foo"]["$ref"],
            "#/$defs/ferrite-ref-2-0"
        );
        assert_eq!(
            defs["ferrite-ref-2-0"]["properties"]["foo"]["$ref"],
            "#/$defs/ferrite-ref-3-0"
        );
        assert_eq!(defs["ferrite-ref-3-0"]["properties"]["foo"], false);
        assert_eq!(defs["ferrite-ref-3-0"]["additionalProperties"], false);
    }

    #[test]
    fn only_cuts_that_narrow_are_made() {
        let s = unrolled(json!({
            "definitions": {
                "node": {"type": "object", "required": ["next"], "properties": {
                    "next": {"$ref": "#/definitions/node"},
                    "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}},
                    "some": {"type": "array", "minItems": 1,
                        "items": {"$ref": "#/definitions/node"}},
                    "either": {"anyOf": [{"$ref": "#/definitions/node"}, {"type": "null"}]},
                    "one": {"oneOf": [{"$ref": "#/definitions/node"}, {"type": "null"}]}}},
                "leaf": {"type": "string"}},
            "properties": {"root": {"$ref": "#/definitions/node"},
                "leaf": {"$ref": "#/definitions/leaf"}}}));
        // Definitions stay where the schema keeps them; a target that is not cyclic is
        // referred to as before.
        assert_eq!(
            s["properties"]["root"]["$ref"],
            "#/definitions/ferrite-ref-1-0"
        );
        assert_eq!(s["properties"]["leaf"]["$ref"], "#/definitions/leaf");
        let last = &s["definitions"]["ferrite-ref-3-0"]["properties"];
        assert_eq!(last["kids"]["items"], false);
        assert_eq!(last["either"]["anyOf"][0], false);
        // Required, at least one item, a oneOf member: not cut, recursing at the last level.
        let own = "#/definitions/ferrite-ref-3-0";
        assert_eq!(last["next"]["$ref"], own);
        assert_eq!(last["some"]["items"]["$ref"], own);
        assert_eq!(last["one"]["oneOf"][0]["$ref"], own);
    }

    #[test]
    fn what_cannot_be_followed_is_left_alone() {
        for schema in [
            json!({"$defs": {"a": {"$anchor": "a", "properties": {"x": {"$ref": "#a"}}}},
                "$ref": "#a"}),
            json!({"properties": {"x": {"$id": "other", "properties": {"y": {"$ref": "#"}}}}}),
            json!({"properties": {"x": {"$ref": "other.json#/a"}}}),
        ] {
            assert_eq!(unrolled(schema.clone()), schema);
        }
        // Copies past the size limit: the schema as written.
        let s = json!({"properties": {"foo": {"$ref": "#"}}});
        let mut small = s.clone();
        unroll(&mut small, 60);
        assert_eq!(small, s);
    }
}
