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

fn allowed(guide: &mut Guide) -> Vec<u32> {
    let mut mask = vec![0u32; guide.mask_words()];
    guide.allowed(&mut mask).expect("mask");
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
    let grammar = Spec::JsonSchema {
        schema,
        strict: true,
    }
    .grammar()
    .expect("grammar");
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
