use super::*;
use serde_json::json;

fn ids(p: Prompt) -> Vec<u32> {
    match p {
        Prompt::TokenIds(ids) => ids,
        other => panic!("not ids: {other:?}"),
    }
}

#[test]
fn prompts_of_every_shape() {
    let one = |v: Value| {
        let mut all = completion_prompts(&v).expect("a prompt");
        assert_eq!(all.len(), 1, "{v}");
        all.remove(0)
    };
    assert!(matches!(one(json!("hi")), Prompt::Text(t) if t == "hi"));
    assert!(matches!(one(json!(["hi"])), Prompt::Text(t) if t == "hi"));
    let max = u64::from(u32::MAX);
    assert_eq!(ids(one(json!([1, 2, max]))), [1, 2, u32::MAX]);
    assert_eq!(ids(one(json!([[7, 8]]))), [7, 8]);
    assert_eq!(ids(one(json!([]))), Vec::<u32>::new());
    let batch = completion_prompts(&json!(["a", [5], "b"])).expect("a batch");
    assert!(
        matches!(&batch[..], [Prompt::Text(a), Prompt::TokenIds(ids), Prompt::Text(b)]
        if a == "a" && ids == &[5] && b == "b")
    );
    let bad = [
        json!(3),
        json!([1, -2]),
        json!([1.5]),
        json!([1, "a"]),
        json!(["a", 1]),
        json!([["a"]]),
        json!([{}]),
    ];
    for bad in bad {
        let e = completion_prompts(&bad).expect_err("bad shape");
        assert_eq!(e.param(), Some("prompt"), "{bad}");
    }
    let many = Value::Array(vec![json!("x"); MAX_PROMPTS + 1]);
    let e = completion_prompts(&many).expect_err("too many");
    assert!(
        e.message().contains("at most 128 prompts"),
        "{}",
        e.message()
    );
    assert!(completion_prompts(&Value::Array(vec![json!("x"); MAX_PROMPTS])).is_ok());
}

#[test]
fn a_token_id_past_32_bits_is_refused_not_truncated() {
    // 4294967301 = 2^32 + 5: truncation would run token 5.
    for p in [json!([4_294_967_301u64]), json!([[4_294_967_301u64]])] {
        let e = completion_prompts(&p).expect_err("too large");
        assert!(e.message().contains("4294967301"), "{}", e.message());
    }
}

fn params(extra: Value) -> CommonParams {
    let mut body = json!({ "model": "m" });
    if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(x.clone());
    }
    serde_json::from_value(body).expect("params")
}

#[test]
fn unsupported_fields_are_refused_by_name() {
    let cases = [
        (json!({ "best_of": 3 }), "best_of"),
        (json!({ "n": 2, "best_of": 3 }), "best_of"),
        (json!({ "function_call": { "name": "f" } }), "function_call"),
        (json!({ "functions": [{}] }), "functions"),
        (json!({ "suffix": "x" }), "suffix"),
    ];
    for (extra, param) in cases {
        let e = params(extra.clone()).sampling().expect_err("refused");
        assert_eq!(e.param(), Some(param), "{extra}");
        assert!(e.message().contains("not supported"), "{}", e.message());
    }
}

#[test]
fn off_values_of_unsupported_fields_are_accepted() {
    let off = json!({ "n": 1, "tools": [], "tool_choice": "none", "logit_bias": {},
        "logprobs": false, "response_format": { "type": "text" }, "echo": false,
        "stream_options": { "include_usage": true } });
    let p = params(off);
    assert!(p.include_usage());
    let s = p.sampling().expect("accepted");
    assert_eq!(s.logprobs, None);
    assert!(!params(json!({})).include_usage());
}

/// `echo` scores the prompt where logprobs are asked for, or where nothing is generated.
#[test]
fn echo_scores_the_prompt_with_logprobs_or_max_tokens_0() {
    let scored = |body| params(body).sampling().expect("accepted").prompt_logprobs;
    assert_eq!(scored(json!({ "echo": true, "logprobs": 2 })), Some(2));
    assert_eq!(scored(json!({ "echo": true, "max_tokens": 0 })), Some(0));
    assert_eq!(scored(json!({ "echo": true, "max_tokens": 5 })), None);
    assert_eq!(scored(json!({ "logprobs": 2, "max_tokens": 0 })), None);
    assert!(params(json!({ "echo": true })).echo());
}

/// `logit_bias` maps token ids, as strings, to biases; anything else is refused naming it.
#[test]
fn logit_bias_maps_token_ids_to_biases() {
    let p = params(json!({ "logit_bias": { "50256": -100, " 7": 2.5 } }));
    let mut got: Vec<(u32, f32)> = (p.sampling().expect("accepted").logit_bias.iter())
        .map(|b| (b.token, b.bias))
        .collect();
    got.sort_by_key(|b| b.0);
    assert_eq!(got, [(7, 2.5), (50256, -100.0)]);
    for bad in [
        json!({ "logit_bias": { "the": 1 } }),
        json!({ "logit_bias": { "-3": 1 } }),
        json!({ "logit_bias": { "3": "1" } }),
        json!({ "logit_bias": [[3, 1]] }),
    ] {
        let e = params(bad.clone()).sampling().expect_err("refused");
        assert_eq!(e.param(), Some("logit_bias"), "{bad}");
    }
}

#[test]
fn logprobs_are_chats_bool_or_a_completions_count() {
    let cases = [
        (json!({ "logprobs": true }), Some(0)),
        (json!({ "logprobs": true, "top_logprobs": 3 }), Some(3)),
        (json!({ "logprobs": 2 }), Some(2)),
        (json!({ "logprobs": false, "top_logprobs": 0 }), None),
    ];
    for (extra, want) in cases {
        let s = params(extra.clone()).sampling().expect("accepted");
        assert_eq!(s.logprobs, want, "{extra}");
    }
    let bad = [
        (json!({ "top_logprobs": 3 }), "top_logprobs"),
        (json!({ "logprobs": 2, "top_logprobs": 3 }), "top_logprobs"),
        (json!({ "logprobs": "yes" }), "logprobs"),
        (
            json!({ "logprobs": true, "top_logprobs": -1 }),
            "top_logprobs",
        ),
    ];
    for (extra, param) in bad {
        let e = params(extra.clone()).sampling().expect_err("refused");
        assert_eq!(e.param(), Some(param), "{extra}");
    }
}

#[test]
fn constraints_from_response_format_or_structured_outputs() {
    let schema = json!({ "type": "object" });
    let cases = [
        (json!({ "response_format": { "type": "text" } }), None),
        (
            json!({ "response_format": { "type": "json_object" } }),
            Some(Spec::JsonObject),
        ),
        (
            json!({ "response_format": { "type": "json_schema",
                "json_schema": { "name": "x", "schema": schema, "strict": true } } }),
            Some(Spec::JsonSchema {
                schema: schema.clone(),
                strict: true,
            }),
        ),
        (
            json!({ "structured_outputs": { "json": "{\"type\": \"object\"}" } }),
            Some(Spec::JsonSchema {
                schema: schema.clone(),
                strict: false,
            }),
        ),
        (
            json!({ "structured_outputs": { "choice": ["a", "b"] } }),
            Some(Spec::Choice(vec!["a".into(), "b".into()])),
        ),
        (
            json!({ "structured_outputs": { "regex": "[0-9]+" } }),
            Some(Spec::Regex("[0-9]+".into())),
        ),
    ];
    for (extra, want) in cases {
        let c = params(extra.clone()).constraint().expect("accepted");
        assert_eq!(c.map(|c| c.spec), want, "{extra}");
    }
    let bad = [
        (
            json!({ "response_format": { "type": "yaml" } }),
            "response_format",
        ),
        (
            json!({ "response_format": { "type": "json_schema" } }),
            "response_format",
        ),
        (
            json!({ "structured_outputs": { "json": "{not json" } }),
            "structured_outputs",
        ),
        (
            json!({ "structured_outputs": { "choice": [1] } }),
            "structured_outputs",
        ),
        (
            json!({ "structured_outputs": { "regex": "a", "choice": ["b"] } }),
            "structured_outputs",
        ),
        (
            json!({ "structured_outputs": { "xml": "a" } }),
            "structured_outputs",
        ),
        (
            json!({ "response_format": { "type": "json_object" },
                "structured_outputs": { "regex": "a" } }),
            "structured_outputs",
        ),
    ];
    for (extra, param) in bad {
        let e = params(extra.clone()).constraint().expect_err("refused");
        assert_eq!(e.param(), Some(param), "{extra}: {}", e.message());
    }
}

#[test]
fn tools_and_their_choice_are_read_or_refused_by_field() {
    let tool = |name: &str| json!({"type": "function", "function": {"name": name}});
    let t = params(
        json!({"tools": [tool("a"), tool("b")], "tool_choice": "required",
        "parallel_tool_calls": false}),
    )
    .tools()
    .expect("read")
    .expect("tools");
    assert_eq!(t.choice, ToolChoice::Required);
    assert!(!t.parallel);
    assert_eq!(t.functions[1].parameters, json!({"type": "object"}));
    let named = json!({"tools": [tool("a")],
        "tool_choice": {"type": "function", "function": {"name": "a"}}});
    let t = params(named).tools().expect("read").expect("tools");
    assert_eq!(t.choice, ToolChoice::Named("a".into()));
    assert!(
        params(json!({"tool_choice": "auto"}))
            .tools()
            .expect("ok")
            .is_none()
    );
    let bad = [
        (
            json!({"tools": [tool("a")], "tool_choice": {"type": "function",
            "function": {"name": "missing"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": [tool("a b")]}), "tools"),
        (json!({"tools": [{"type": "retrieval"}]}), "tools"),
        (json!({"tools": {"a": 1}}), "tools"),
    ];
    for (extra, param) in bad {
        let e = params(extra.clone()).tools().expect_err("refused");
        assert_eq!(e.param(), Some(param), "{extra}: {}", e.message());
    }
}

#[test]
fn tool_messages_need_their_call_and_calls_become_objects() {
    let msg = |v: Value| serde_json::from_value::<ChatMessageIn>(v).expect("message");
    let e = chat_message(&msg(json!({"role": "tool", "content": "42"}))).expect_err("no id");
    assert_eq!(e.param(), Some("messages"));
    let e = chat_message(&msg(json!({"role": "user", "content": "x",
        "tool_calls": [{"id": "c", "function": {"name": "f"}}]})))
    .expect_err("not an assistant");
    assert_eq!(e.param(), Some("messages"));
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
        "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
    let m = chat_message(&msg(call)).expect("ok");
    assert_eq!(
        m.tool_calls.expect("calls")[0]["function"]["arguments"],
        json!({"x": 1})
    );
    let bad_args = json!({"role": "assistant", "tool_calls": [{"id": "c1",
        "function": {"name": "f", "arguments": "{not json"}}]});
    assert!(chat_message(&msg(bad_args)).is_err());
}

#[test]
fn stop_is_a_string_or_strings() {
    let s = params(json!({ "stop": ["a", "b"] }))
        .sampling()
        .expect("ok");
    assert_eq!(s.stop, ["a", "b"]);
    let s = params(json!({ "stop": "x" })).sampling().expect("ok");
    assert_eq!(s.stop, ["x"]);
    let e = params(json!({ "stop": [1] })).sampling().expect_err("bad");
    assert_eq!(e.param(), Some("stop"));
}

#[test]
fn content_parts_must_be_text() {
    let parts = json!([{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }]);
    assert_eq!(message_text(&parts).expect("text"), "ab");
    let image = json!([{ "type": "image_url", "image_url": { "url": "x" } }]);
    assert!(message_text(&image).is_err());
}

/// `reasoning_effort` reaches the chat template (unless `chat_template_kwargs` set it), and
/// only the efforts OpenAI names are taken; the kwargs must be an object without the
/// variables the server sets.
#[test]
fn reasoning_effort_and_template_kwargs() {
    let request = |body: Value| -> ChatRequest { serde_json::from_value(body).expect("a request") };
    let chat = |body: Value| {
        let req = request(body);
        let chat = chat_prompt(&req.messages, req.chat_template_kwargs.as_ref())?;
        Ok::<_, ApiError>(with_effort(chat, req.common.reasoning_effort()?))
    };
    let messages = json!([{ "role": "user", "content": "x" }]);
    let c = chat(json!({ "model": "m", "messages": messages, "reasoning_effort": "low" }))
        .expect("an effort");
    assert_eq!(c.kwargs["reasoning_effort"], "low");
    let c = chat(
        json!({ "model": "m", "messages": messages, "reasoning_effort": "low",
        "chat_template_kwargs": { "reasoning_effort": "high" } }),
    )
    .expect("kwargs first");
    assert_eq!(c.kwargs["reasoning_effort"], "high");
    for (body, param) in [
        (json!({ "reasoning_effort": "extreme" }), "reasoning_effort"),
        (
            json!({ "chat_template_kwargs": [1] }),
            "chat_template_kwargs",
        ),
        (
            json!({ "chat_template_kwargs": { "tools": [] } }),
            "chat_template_kwargs",
        ),
    ] {
        let mut body = body;
        body["model"] = json!("m");
        body["messages"] = messages.clone();
        let e = chat(body.clone()).expect_err("refused");
        assert_eq!(e.param, Some(param), "{body}: {}", e.message);
    }
}
