//! Guides over a byte-level vocabulary (token id = byte), with padding past it.

use ferrite_text::{GgufVocab, Tokenizer};
use serde_json::json;

use crate::{Guide, Spec, TokenBytes, Vocabulary};

/// Logits rows of 300: 256 byte tokens, the end-of-sequence token 256, padding after it.
const WIDTH: usize = 300;
const EOS: u32 = 256;

fn vocabulary() -> Vocabulary {
    let tokenizer = Tokenizer::from_gguf_vocab(GgufVocab::byte_level()).expect("tokenizer");
    let json = tokenizer.to_tokenizer_json().expect("json");
    let bytes = TokenBytes::from_tokenizer_json(&json).expect("bytes");
    assert_eq!(bytes.get(u32::from(b'{')), b"{");
    Vocabulary::new(&bytes, tokenizer, &[EOS], WIDTH).expect("vocabulary")
}

/// `schema`'s grammar in strict mode.
fn strict(schema: serde_json::Value) -> crate::Grammar {
    Spec::JsonSchema {
        schema,
        strict: true,
    }
    .grammar()
    .expect("grammar")
}

/// What `guide` allows next, with a budget far from its end.
fn allowed(guide: &mut Guide) -> Vec<u32> {
    allowed_within(guide, 100_000)
}

fn allowed_within(guide: &mut Guide, budget: usize) -> Vec<u32> {
    let mut mask = vec![0u32; guide.mask_words()];
    guide.allowed(&mut mask, budget).expect("mask");
    (0..WIDTH as u32)
        .filter(|&i| mask[i as usize / 32] >> (i % 32) & 1 == 1)
        .collect()
}

/// Feeds `text` byte by byte, checking each byte was allowed; returns whether the last one
/// completed the grammar.
fn feed(guide: &mut Guide, text: &str) -> bool {
    let mut done = false;
    for b in text.bytes() {
        assert!(!done, "the grammar ended before {text:?} did");
        assert!(
            allowed(guide).contains(&u32::from(b)),
            "{:?} not allowed",
            b as char
        );
        done = guide.accept(u32::from(b)).expect("accepted");
    }
    done
}

#[test]
fn a_schema_allows_its_values_only_and_ends_with_them() {
    let v = vocabulary();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"], "additionalProperties": false});
    let grammar = strict(schema);
    let mut g = v.compile(&grammar).expect("compiled");
    assert_eq!(allowed(&mut g), [u32::from(b'{')], "only an object opens");
    let ended = feed(&mut g, r#"{"n": 42"#);
    assert!(!ended);
    // An integer without bounds of its own stops at 2^53 - 1: 16 digits at most.
    let mut long = v.compile(&grammar).expect("compiled");
    feed(&mut long, &format!(r#"{{"n": {}"#, "1".repeat(16)));
    assert!(
        !allowed(&mut long).contains(&u32::from(b'1')),
        "a 17th digit"
    );
    let next = allowed(&mut g);
    assert!(next.contains(&u32::from(b'}')) && next.contains(&u32::from(b'7')));
    assert!(!next.contains(&u32::from(b'"')), "no second key");
    // Closing the object completes the grammar: the output ends there.
    assert!(feed(&mut g, "}"));
    assert_eq!(allowed(&mut g), [EOS]);
    assert!(g.accept(u32::from(b'x')).is_err(), "nothing after the end");
    // Where the value could go on, the end-of-sequence token ends it.
    let mut g = v
        .compile(&Spec::Regex("[0-9]+".into()).grammar().expect("g"))
        .expect("c");
    assert!(!feed(&mut g, "12"));
    assert!(allowed(&mut g).contains(&EOS));
    assert!(g.accept(EOS).expect("eos"));
}

#[test]
fn padding_ids_are_never_allowed() {
    let v = vocabulary();
    let mut g = v
        .compile(&Spec::Regex(".*".into()).grammar().expect("g"))
        .expect("c");
    let ids = allowed(&mut g);
    assert!(
        ids.iter().all(|&i| i <= EOS),
        "{:?}",
        ids.iter().rev().take(3).collect::<Vec<_>>()
    );
    assert!(ids.contains(&u32::from(b'a')));
}

#[test]
fn whitespace_inside_json_is_bounded() {
    let v = vocabulary();
    let mut g = v
        .compile(&Spec::JsonObject.grammar().expect("g"))
        .expect("c");
    feed(&mut g, "{");
    feed(&mut g, &" ".repeat(16));
    assert!(!allowed(&mut g).contains(&u32::from(b' ')), "a 17th space");
}

#[test]
fn a_choice_is_one_of_its_strings_taken_literally() {
    let v = vocabulary();
    let spec = Spec::Choice(vec!["a.b".into(), "c|d".into()]);
    let mut g = v.compile(&spec.grammar().expect("g")).expect("c");
    assert!(feed(&mut g, "c|d") || allowed(&mut g) == [EOS]);
    let mut g = v.compile(&spec.grammar().expect("g")).expect("c");
    feed(&mut g, "a");
    assert!(
        !allowed(&mut g).contains(&u32::from(b'x')),
        "the dot is literal"
    );
}

#[test]
fn what_llguidance_cannot_compile_is_refused_with_its_reason() {
    let v = vocabulary();
    let cases = [
        Spec::Regex("(unclosed".into()),
        Spec::Lark("start: undefined_rule".into()),
        Spec::JsonSchema {
            schema: json!({"type": "no-such-type"}),
            strict: true,
        },
    ];
    for spec in cases {
        let e = v.compile(&spec.grammar().expect("g")).expect_err("refused");
        assert!(!e.to_string().is_empty(), "{spec:?}");
    }
}

#[test]
fn what_a_schema_leaves_unbounded_ends_under_the_grammar() {
    let v = vocabulary();
    let schema = json!({"type": "object", "required": ["s", "a"], "properties": {
        "s": {"type": "string"}, "a": {"type": "array", "items": {"type": "integer"}}}});
    let grammar = Spec::JsonSchema {
        schema,
        strict: false,
    }
    .grammar()
    .expect("grammar");
    let mut g = v.compile(&grammar).expect("compiled");
    let limit = crate::STRING_CHARS as usize;
    feed(&mut g, &format!(r#"{{"s": "{}"#, "x".repeat(limit)));
    assert_eq!(
        allowed(&mut g),
        [u32::from(b'"')],
        "a string past its bound"
    );
    let items = vec!["1"; crate::ARRAY_ITEMS as usize].join(",");
    feed(&mut g, &format!(r#"", "a": [{items}"#));
    assert!(
        !allowed(&mut g).contains(&u32::from(b',')),
        "an item past the bound"
    );
    // Declared properties only: no key after the last one.
    feed(&mut g, "]");
    assert!(
        !allowed(&mut g).contains(&u32::from(b',')),
        "a key past the declared ones"
    );
    assert!(feed(&mut g, "}"));
}

/// A map's keys end: llguidance holds them to the bounded key pattern.
#[test]
fn a_maps_keys_end_under_the_grammar() {
    let v = vocabulary();
    let schema = json!({"type": "object", "additionalProperties": {"type": "integer"}});
    let (_, mut g) = v
        .compile_spec(
            &Spec::JsonSchema {
                schema,
                strict: false,
            },
            true,
        )
        .expect("compiled");
    feed(
        &mut g,
        &format!(r#"{{"{}"#, "k".repeat(crate::STRING_CHARS as usize)),
    );
    assert_eq!(allowed(&mut g), [u32::from(b'"')], "a key past its bound");
    assert!(feed(&mut g, r#"": 7}"#));
}

#[test]
fn a_bound_that_meets_a_larger_minimum_leaves_the_schema_as_written() {
    let v = vocabulary();
    let spec = Spec::JsonSchema {
        schema: json!({"allOf": [{"type": "string"}, {"minLength": 200}]}),
        strict: false,
    };
    v.compile(&spec.grammar().expect("g"))
        .expect_err("maxLength 64 under minLength 200");
    let (sent, _) = v.compile_spec(&spec, true).expect("compiled");
    assert_eq!(
        sent.to_wire(),
        spec.grammar_as_written().expect("g").to_wire()
    );
    let mut g = v
        .compile(&spec.grammar_as_written().expect("g"))
        .expect("as written");
    feed(&mut g, &format!("\"{}", "x".repeat(300)));
}

/// Bounds are the caller's choice (`--json-schema-bounds`, off by default): unbounded, a string
/// the schema leaves open runs past the 64 characters a bounded grammar stops at.
#[test]
fn bounds_apply_only_when_asked_for() {
    let v = vocabulary();
    let spec = Spec::JsonSchema {
        schema: json!({"type": "string"}),
        strict: false,
    };
    let (open, mut g) = v.compile_spec(&spec, false).expect("compiled");
    assert_eq!(
        open.to_wire(),
        spec.grammar_as_written().expect("g").to_wire()
    );
    feed(&mut g, &format!("\"{}", "x".repeat(300)));
    let (bounded, mut g) = v.compile_spec(&spec, true).expect("compiled");
    assert_ne!(bounded.to_wire(), open.to_wire());
    feed(
        &mut g,
        &format!("\"{}", "x".repeat(crate::STRING_CHARS as usize)),
    );
    assert!(
        !allowed(&mut g).contains(&u32::from(b'x')),
        "a character past the bound"
    );
}

/// Over the 234 schemas of `tests/fixtures/schemas/`: the bounded form compiles wherever the
/// schema as written does, except one whose bounds meet what the schema combines (the gateway
/// falls back to it as written); the schemas refused name their keyword.
#[test]
fn bounded_fixtures_compile_where_the_schemas_do() {
    let v = vocabulary();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/schemas/schemas.json"
    );
    let entries: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    assert_eq!(entries.len(), 234);
    let (mut fallback, mut refused) = (Vec::new(), Vec::new());
    for e in &entries {
        let id = e["id"].as_str().expect("id");
        let spec = Spec::JsonSchema {
            schema: e["schema"].clone(),
            strict: false,
        };
        let Ok(bounded) = spec.grammar() else {
            refused.push(id);
            continue;
        };
        let as_written = v.compile(&spec.grammar_as_written().expect("as written"));
        if v.compile(&bounded).is_err() && as_written.is_ok() {
            fallback.push(id);
            // What the gateway sends: the schema as written.
            let (sent, _) = v.compile_spec(&spec, true).expect("compiled");
            assert_eq!(
                sent.to_wire(),
                spec.grammar_as_written().expect("g").to_wire()
            );
        }
    }
    assert_eq!(
        fallback,
        ["ss-json-schemastore-org-servicehub-config-schema-json"]
    );
    assert_eq!(refused.len(), 6, "{refused:?}");
}

/// A recursion through `$ref` ends: past the last level the optional property is gone.
#[test]
fn a_recursion_ends_after_its_last_level() {
    let v = vocabulary();
    let spec = Spec::JsonSchema {
        schema: json!({"properties": {"foo": {"$ref": "#"}}, "additionalProperties": false}),
        strict: false,
    };
    let (_, mut g) = v.compile_spec(&spec, true).expect("compiled");
    feed(&mut g, &r#"{"foo":"#.repeat(crate::REF_DEPTH));
    feed(&mut g, "{");
    assert!(
        !allowed(&mut g).contains(&u32::from(b'"')),
        "a key past the last level"
    );
    assert!(feed(&mut g, &"}".repeat(crate::REF_DEPTH + 1)));
    // Unbounded, the recursion goes on.
    let (_, mut g) = v.compile_spec(&spec, false).expect("compiled");
    feed(&mut g, &r#"{"foo":"#.repeat(10));
}

fn bounded_guide(v: &Vocabulary, schema: serde_json::Value) -> Guide {
    let spec = Spec::JsonSchema {
        schema,
        strict: false,
    };
    v.compile_spec(&spec, true).expect("compiled").1
}

/// `oneOf` members without a `type` match any number: bounded, a member is an object.
#[test]
fn one_of_members_that_overlap_are_told_apart_under_the_grammar() {
    let v = vocabulary();
    let schema = json!({"type": "array", "items": {"oneOf": [
        {"required": ["a"], "properties": {"a": {"type": "integer"}}},
        {"required": ["b"], "properties": {"b": {"type": "integer"}}}]}});
    let mut g = bounded_guide(&v, schema.clone());
    feed(&mut g, "[");
    let next = allowed(&mut g);
    assert!(next.contains(&u32::from(b'{')));
    assert!(
        !next.contains(&u32::from(b'1')),
        "a number matches both members"
    );
    assert!(feed(&mut g, r#"{"a": 1}]"#));
    // Unbounded, as llguidance takes `oneOf` (as `anyOf`), a number is allowed.
    let (_, mut g) = v
        .compile_spec(
            &Spec::JsonSchema {
                schema,
                strict: false,
            },
            false,
        )
        .expect("compiled");
    feed(&mut g, "[1");
}

/// `dependencies`: where `a` is written, `b` must be.
#[test]
fn dependencies_hold_under_the_grammar() {
    let v = vocabulary();
    let schema = json!({"type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependencies": {"a": ["b"]}});
    let mut g = bounded_guide(&v, schema.clone());
    feed(&mut g, r#"{"a": 1"#);
    assert!(!allowed(&mut g).contains(&u32::from(b'}')), "a without b");
    assert!(feed(&mut g, r#", "b": 2}"#));
    let mut g = bounded_guide(&v, schema);
    assert!(feed(&mut g, r#"{"b": 2}"#), "b alone");
}

/// `if`/`then`/`else`: each branch holds for the values its condition picks.
#[test]
fn conditionals_hold_under_the_grammar() {
    let v = vocabulary();
    let schema = json!({"type": "object",
        "properties": {"kind": {"type": "string", "enum": ["x", "y"]}, "n": {"type": "integer"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "x"}}},
        "then": {"required": ["n"]},
        "else": {"properties": {"n": false}}});
    let mut g = bounded_guide(&v, schema.clone());
    feed(&mut g, r#"{"kind": "x""#);
    assert!(!allowed(&mut g).contains(&u32::from(b'}')), "x without n");
    assert!(feed(&mut g, r#", "n": 3}"#));
    let mut g = bounded_guide(&v, schema);
    feed(&mut g, r#"{"kind": "y""#);
    assert!(!allowed(&mut g).contains(&u32::from(b',')), "n beside y");
    assert!(feed(&mut g, "}"));
}

/// Keys past the declared ones end beside an optional property (llguidance counts them alone).
#[test]
fn other_keys_end_beside_optional_properties() {
    let v = vocabulary();
    let mut g = bounded_guide(
        &v,
        json!({"type": "object", "properties": {"o": {"type": "integer"}},
            "additionalProperties": {"type": "integer"}}),
    );
    let keys: Vec<String> = (0..crate::OBJECT_KEYS)
        .map(|i| format!(r#""k{i}": 1"#))
        .collect();
    feed(&mut g, &format!(r#"{{"o": 1, {}"#, keys.join(", ")));
    assert!(
        !allowed(&mut g).contains(&u32::from(b',')),
        "a key past the bound"
    );
    assert!(feed(&mut g, "}"));
}

/// Follows `guide` with `budget` tokens left and the model's choices being `model`'s bytes
/// while the guide leaves them open; returns the output and whether the guide closed it.
fn run_out(guide: &mut Guide, model: &str, budget: usize) -> (String, bool) {
    let mut out = Vec::new();
    let mut model = model.bytes().cycle();
    for left in (1..=budget).rev() {
        let next = allowed_within(guide, left);
        let wanted = model.next().map(u32::from).expect("cycles");
        let token = if next.contains(&wanted) {
            wanted
        } else {
            next[0]
        };
        if token == EOS {
            assert!(guide.accept(token).expect("eos"));
            return (String::from_utf8(out).expect("utf8"), guide.cut_short());
        }
        out.push(u8::try_from(token).expect("a byte"));
        if guide.accept(token).expect("accepted") {
            return (String::from_utf8(out).expect("utf8"), guide.cut_short());
        }
    }
    panic!("cut at the budget: {:?}", String::from_utf8_lossy(&out));
}

#[test]
fn a_guide_finishes_its_schema_inside_the_budget() {
    let v = vocabulary();
    let schema = json!({"type": "object", "additionalProperties": false,
        "required": ["name", "tags", "at"],
        "properties": {"name": {"type": "string"}, "at": {"type": "integer", "minimum": 5},
            "tags": {"type": "array", "minItems": 2, "items": {"type": "string", "pattern": "^x[a-z]+$"}}}});
    let grammar = strict(schema);
    // A model that writes one string without end: cut at 128 tokens, the guide closes it.
    let mut g = v.compile(&grammar).expect("compiled");
    let (out, closed) = run_out(&mut g, r#"{"name": "abcabcabc"#, 128);
    assert!(closed, "{out}");
    let value: serde_json::Value = serde_json::from_str(&out).expect(&out);
    assert!(
        value["name"].as_str().is_some_and(|n| n.starts_with("abc")),
        "{out}"
    );
    let tags = value["tags"].as_array().expect("tags");
    assert!(
        tags.len() >= 2
            && tags.iter().all(|t| t
                .as_str()
                .is_some_and(|t| t.starts_with('x') && t.len() > 1)),
        "{out}"
    );
    assert!(value["at"].as_i64().is_some_and(|n| n >= 5), "{out}");
    // Far from the budget, the model chooses among everything the grammar allows.
    let mut g = v.compile(&grammar).expect("compiled");
    feed(&mut g, r#"{"name": "ab"#);
    assert!(allowed_within(&mut g, 1000).len() > 90);
    assert!(!g.cut_short());
    // Near it, one token: the end of the string.
    assert_eq!(allowed_within(&mut g, 30), [u32::from(b'"')]);
}

#[test]
fn a_model_that_finishes_by_itself_is_not_cut_short() {
    let v = vocabulary();
    let grammar = Spec::JsonObject.grammar().expect("g");
    let mut g = v.compile(&grammar).expect("compiled");
    let (out, closed) = run_out(&mut g, r#"{"a": 1}"#, 64);
    assert_eq!(out, r#"{"a": 1}"#);
    assert!(!closed);
}

#[test]
fn a_guide_closes_in_time_a_nesting_that_grows_with_each_token() {
    let v = vocabulary();
    // Each `[` the model writes adds to what finishing takes (an item and a `]`).
    let schema = json!({"anyOf": [{"type": "integer", "minimum": 10},
        {"type": "array", "minItems": 1, "items": {"$ref": "#"}}]});
    let grammar = Spec::JsonSchema {
        schema,
        strict: false,
    }
    .grammar_as_written()
    .expect("grammar");
    let mut g = v.compile(&grammar).expect("compiled");
    let (out, closed) = run_out(&mut g, "[", 200);
    assert!(closed, "{out}");
    let depth = out.bytes().take_while(|&b| b == b'[').count();
    assert!(
        depth > 40,
        "the model wrote only {depth} before the guide closed: {out}"
    );
    let mut value: serde_json::Value = serde_json::from_str(&out).expect(&out);
    for _ in 0..depth {
        value = value
            .as_array()
            .and_then(|a| a.first())
            .cloned()
            .expect(&out);
    }
    assert!(value.as_i64().is_some_and(|n| n >= 10), "{out}");
}

#[test]
fn a_guide_leaves_room_for_the_item_a_model_may_start_next() {
    let v = vocabulary();
    // Each item needs 6 dates of 10 characters: starting one adds about 90 tokens at once.
    let date = json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"});
    let keys = ["a", "b", "c", "d", "e", "f"];
    let item = json!({"type": "object", "additionalProperties": false, "required": keys,
        "properties": keys.iter().map(|k| (k.to_string(), date.clone())).collect::<serde_json::Map<_, _>>()});
    let schema = json!({"type": "array", "items": item});
    let grammar = strict(schema);
    let one = keys.map(|k| format!(r#""{k}":"2020-01-31""#)).join(",");
    for budget in [150, 200, 333] {
        let mut g = v.compile(&grammar).expect("compiled");
        let (out, closed) = run_out(
            &mut g,
            &format!("[{{{one}}},{{{one}}},{{{one}}},{{{one}}},"),
            budget,
        );
        assert!(closed, "{out}");
        let value: serde_json::Value = serde_json::from_str(&out).expect(&out);
        assert!(value.as_array().is_some_and(|a| !a.is_empty()), "{out}");
    }
}

#[test]
fn a_short_answer_within_its_budget_is_the_models() {
    let v = vocabulary();
    let spec = Spec::Choice(vec!["yes".into(), "no".into(), "maybe".into()]);
    let mut g = v.compile(&spec.grammar().expect("g")).expect("c");
    let first = allowed_within(&mut g, 10);
    assert!(
        [b'y', b'n', b'm']
            .iter()
            .all(|&b| first.contains(&u32::from(b))),
        "{first:?}"
    );
    // With what finishing takes left (here 6: "maybe", the closer's first choice, and the end),
    // the closer writes it.
    let mut g = v.compile(&spec.grammar().expect("g")).expect("c");
    let (out, closed) = run_out(&mut g, "x", 6);
    assert!(closed, "{out}");
    assert_eq!(out, "maybe");
}

/// A model's own format around the request's answer: the format's text is forced, the answer
/// follows the request's schema (bounded, as on its own), and the format goes on after it.
#[test]
fn an_answer_within_a_format_follows_its_own_spec() {
    let v = vocabulary();
    let answer = Spec::JsonSchema {
        schema: json!({"type": "object", "properties": {"n": {"type": "integer"}},
            "required": ["n"], "additionalProperties": false}),
        strict: true,
    };
    let spec = Spec::Within {
        lark: "start: (\"think \" /[a-z]+/ \";\")* \"say \" @answer \"!\" | \"do \" @why".into(),
        parts: vec![
            ("answer".into(), answer),
            ("why".into(), Spec::Regex("[0-9]".into())),
        ],
    };
    let mut g = v.compile(&spec.grammar().expect("g")).expect("c");
    assert!(!feed(&mut g, "think abc;think d;say "));
    assert_eq!(allowed(&mut g), [u32::from(b'{')], "the answer's schema");
    feed(&mut g, &format!(r#"{{"n": {}"#, "1".repeat(16)));
    assert!(!allowed(&mut g).contains(&u32::from(b'1')), "bounded");
    assert!(!feed(&mut g, "}"), "the format goes on after the answer");
    assert!(feed(&mut g, "!"));
    let mut g = v.compile(&spec.grammar().expect("g")).expect("c");
    assert!(feed(&mut g, "do 7"), "the other part");
    // A part's own faults are the request's, named as on their own.
    let bad = Spec::Within {
        lark: "start: @answer".into(),
        parts: vec![("answer".into(), Spec::Choice(Vec::new()))],
    };
    assert!(bad.grammar().is_err());
}
