//! Tool formats: what each family's output reads back as, and the grammars that hold a model
//! to its tools.

use serde_json::json;

use super::*;

/// A tokenizer that holds no format's marker as a special token.
fn no_special(_: &str) -> Option<u32> {
    None
}

fn tools(choice: ToolChoice, parallel: bool) -> Tools {
    let f = |name: &str| Function {
        name: name.into(),
        description: Some(format!("the {name} tool")),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}),
    };
    Tools {
        functions: vec![f("weather"), f("time")],
        choice,
        parallel,
    }
}

#[test]
fn each_family_reads_back_as_calls() {
    let t = tools(ToolChoice::Auto, true);
    let cases = [
        (
            ToolFormat::Generic,
            r#"{"tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}]}"#,
        ),
        (
            ToolFormat::Hermes,
            "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ),
        (
            ToolFormat::Llama3,
            r#"<|python_tag|>{"name": "weather", "parameters": {"city": "Paris"}}"#,
        ),
        (
            ToolFormat::Mistral,
            r#"[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Paris"}}]"#,
        ),
        (
            ToolFormat::Granite,
            r#"<|tool_call|>[{"name": "weather", "arguments": {"city": "Paris"}}]"#,
        ),
        // Granite 3.1 and later may write its list after Hermes' opening, unclosed.
        (
            ToolFormat::Hermes,
            r#"<tool_call>[{"name": "weather", "arguments": {"city": "Paris"}}]"#,
        ),
    ];
    for (format, text) in cases {
        let out = t.parse(format, text, "x");
        assert_eq!(out.calls.len(), 1, "{format:?}: {out:?}");
        assert_eq!(out.calls[0].name, "weather");
        assert_eq!(out.calls[0].id, "call_x_0");
        let args: serde_json::Value = serde_json::from_str(&out.calls[0].arguments).expect("json");
        assert_eq!(args, json!({"city": "Paris"}), "{format:?}");
    }
    let hermes = t.parse(ToolFormat::Hermes, cases[1].1, "x");
    assert_eq!(hermes.content, "Let me look.");
}

#[test]
fn an_answer_without_calls_is_content() {
    let t = tools(ToolChoice::Auto, true);
    let generic = t.parse(ToolFormat::Generic, r#"{"response": "It is sunny."}"#, "x");
    assert_eq!(
        generic,
        ToolOutput {
            content: "It is sunny.".into(),
            calls: vec![]
        }
    );
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Granite,
    ] {
        let plain = t.parse(format, "It is sunny.", "x");
        assert_eq!(plain.content, "It is sunny.", "{format:?}");
        assert!(plain.calls.is_empty());
    }
    // A broken call is not half read: the text stays content.
    let broken = t.parse(
        ToolFormat::Hermes,
        "<tool_call>{\"name\": </tool_call>",
        "x",
    );
    assert!(broken.calls.is_empty());
}

#[test]
fn the_grammar_follows_the_choice() {
    // Generic: always a grammar; `auto` allows an answer, the others a call only.
    let auto = tools(ToolChoice::Auto, true).constraint(ToolFormat::Generic, &no_special);
    let Some(Spec::JsonSchema { schema, .. }) = auto else {
        panic!("generic auto: {auto:?}")
    };
    assert_eq!(schema["anyOf"].as_array().map(Vec::len), Some(2));
    let named =
        tools(ToolChoice::Named("time".into()), true).constraint(ToolFormat::Generic, &no_special);
    let Some(Spec::JsonSchema { schema, .. }) = named else {
        panic!("generic named: {named:?}")
    };
    let calls = &schema["properties"]["tool_calls"];
    assert_eq!(calls["maxItems"], 1);
    assert_eq!(calls["items"]["anyOf"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        calls["items"]["anyOf"][0]["properties"]["name"]["const"],
        "time"
    );
    // A family with its own format calls or answers freely under `auto`.
    assert_eq!(
        tools(ToolChoice::Auto, true).constraint(ToolFormat::Hermes, &no_special),
        None
    );
    let required = tools(ToolChoice::Required, false).constraint(ToolFormat::Hermes, &no_special);
    let Some(Spec::Within { lark, .. }) = required else {
        panic!("hermes required: {required:?}")
    };
    assert!(
        lark.starts_with("start: call\n"),
        "one call without parallel: {lark}"
    );
    // Every grammar compiles, and takes the call of its format (over a byte-level vocabulary).
    let model = crate::models::testing::harmony_model();
    let vocabulary = model.vocabulary().expect("vocabulary");
    for (format, call) in [
        (
            ToolFormat::Generic,
            r#"{"tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}]}"#,
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ),
        (
            ToolFormat::Llama3,
            r#"{"name": "weather", "parameters": {"city": "Paris"}}"#,
        ),
        (
            ToolFormat::Mistral,
            r#"[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Paris"}}]"#,
        ),
        (
            ToolFormat::Granite,
            r#"<|tool_call|>[{"name": "weather", "arguments": {"city": "Paris"}}]"#,
        ),
    ] {
        for choice in [ToolChoice::Required, ToolChoice::Named("weather".into())] {
            let spec = tools(choice, true)
                .constraint(format, &no_special)
                .expect("a grammar");
            let mut guide = vocabulary
                .compile(&spec.grammar().expect("built"))
                .expect("compiled");
            let ended = call.bytes().map(|b| guide.accept(u32::from(b))).last();
            let ended = ended.map(|r| r.expect("accepted"));
            // Done, or (more calls allowed) free to end there: on `<|return|>`, 262.
            let may_end = crate::harmony::tests::allows(&mut guide, 262);
            assert!(ended == Some(true) || may_end, "{format:?}: {call}");
        }
    }
    // The calls' JSON is bounded as a response format's: no 17th space before a key.
    let hermes = tools(ToolChoice::Required, false).constraint(ToolFormat::Hermes, &no_special);
    let mut guide = vocabulary
        .compile(&hermes.expect("a grammar").grammar().expect("built"))
        .expect("compiled");
    for b in "<tool_call>\n{".bytes().chain([b' '; 16]) {
        guide.accept(u32::from(b)).expect("accepted");
    }
    assert!(guide.accept(u32::from(b' ')).is_err(), "a 17th space");
    // A marker the tokenizer holds as a special token is that token in the grammar (here the
    // byte-level vocabulary's 257, `<|channel|>`), not its spelling.
    let special = |m: &str| (m == "[TOOL_CALLS]").then_some(257);
    let mistral = tools(ToolChoice::Required, true).constraint(ToolFormat::Mistral, &special);
    let mistral = mistral.expect("a grammar").grammar().expect("built");
    let mut guide = vocabulary.compile(&mistral).expect("compiled");
    assert!(
        !crate::harmony::tests::allows(&mut guide, u32::from(b'[')),
        "its spelling"
    );
    guide.accept(257).expect("the marker's token");
    let list = r#"[{"name": "weather", "arguments": {"city": "Paris"}}]"#;
    let ended = list.bytes().map(|b| guide.accept(u32::from(b))).last();
    assert!(ended.is_some_and(|r| r.is_ok()), "the list after it");
}

#[test]
fn a_template_without_tools_sees_them_in_a_system_message() {
    let t = tools(ToolChoice::Auto, true);
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(json!([{"id": "c1", "type": "function",
        "function": {"name": "weather", "arguments": {"city": "Paris"}}}]));
    let mut result = ChatMessage::new("tool", "sunny");
    result.tool_call_id = Some("c1".into());
    let messages = vec![ChatMessage::new("user", "Weather in Paris?"), call, result];
    let out = t.generic_messages(messages);
    assert_eq!(out[0].role, "system");
    assert!(out[0].content.contains("\"weather\"") && out[0].content.contains("\"response\""));
    let past: serde_json::Value = serde_json::from_str(&out[2].content).expect("json");
    assert_eq!(
        past,
        json!({"tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}]})
    );
    assert_eq!(out[3].role, "user");
    assert_eq!(out[3].content, "weather returned: sunny");
    assert!(
        out.iter()
            .all(|m| m.tool_calls.is_none() && m.tool_call_id.is_none())
    );
}

#[test]
fn the_format_comes_from_the_template() {
    assert_eq!(ToolFormat::of(None), ToolFormat::Generic);
    assert_eq!(
        ToolFormat::of(Some("{{ '<tool_call>' }}")),
        ToolFormat::Hermes
    );
    assert_eq!(ToolFormat::of(Some("[TOOL_CALLS]")), ToolFormat::Mistral);
    let granite = "respond only with <|tool_call|> followed by a JSON list of tools used";
    assert_eq!(ToolFormat::of(Some(granite)), ToolFormat::Granite);
    assert_eq!(ToolFormat::of(Some("<|python_tag|>")), ToolFormat::Llama3);
}

#[test]
fn with_choice_none_the_history_renders_and_nothing_constrains() {
    let t = tools(ToolChoice::None, true);
    assert_eq!(t.constraint(ToolFormat::Generic, &no_special), None);
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(json!([{"id": "c1", "type": "function",
        "function": {"name": "weather", "arguments": {"city": "Paris"}}}]));
    let mut result = ChatMessage::new("tool", "sunny");
    result.tool_call_id = Some("c1".into());
    let out = t.generic_messages(vec![ChatMessage::new("user", "Weather?"), call, result]);
    assert_eq!(out.len(), 3, "no tool prompt: {out:?}");
    // In words, not in the call format: the model answers in text.
    assert_eq!(out[1].content, r#"I called weather with {"city":"Paris"}."#);
    assert_eq!(out[2].content, "weather returned: sunny");
}
