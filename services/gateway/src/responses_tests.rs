use std::sync::Arc;

use super::*;
use crate::GatewayError;
use crate::responses_reply::{Head, ResponseEvent};
use crate::stream::{CallDelta, GenerateEvent};
use crate::tools::{ToolCall, ToolChoice};
use ferrite_structured::Spec;

fn request(body: Value) -> ResponsesRequest {
    let mut full = json!({ "model": "m", "input": "hi" });
    if let (Some(full), Some(body)) = (full.as_object_mut(), body.as_object()) {
        full.extend(body.clone());
    }
    serde_json::from_value(full).expect("a request body")
}

/// The chat of a request continuing nothing.
fn chat(req: &ResponsesRequest) -> Result<Vec<ChatMessage>, ApiError> {
    req.messages(&req.conversation_items(None)?)
}

fn refusal(body: Value) -> ApiError {
    let req = request(body);
    let checks = [
        req.refuse_unsupported().err(),
        chat(&req).err(),
        req.tools().err(),
        text_format(req.text.as_ref()).err(),
    ];
    checks.into_iter().flatten().next().expect("refused")
}

#[test]
fn input_items_become_the_chats_messages() {
    let req = request(json!({ "instructions": "Be brief.", "input": [
        { "role": "developer", "content": "Use tools." },
        { "type": "message", "role": "user",
          "content": [{ "type": "input_text", "text": "Weather in " },
                      { "type": "input_text", "text": "Paris?" }] },
        { "type": "message", "role": "assistant",
          "content": [{ "type": "output_text", "text": "Let me look." }] },
        { "type": "function_call", "call_id": "call_1", "name": "weather",
          "arguments": "{\"city\": \"Paris\"}" },
        { "type": "function_call", "call_id": "call_2", "name": "time", "arguments": "{}" },
        { "type": "function_call_output", "call_id": "call_1", "output": "sunny" },
        { "type": "function_call", "call_id": "call_3", "name": "time", "arguments": "" },
    ]}));
    let m = chat(&req).expect("messages");
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "system", "user", "assistant", "tool", "assistant"]
    );
    assert_eq!(m[0].content, "Be brief.");
    assert_eq!(m[2].content, "Weather in Paris?");
    // The calls after the assistant's text are that message's; a call after the tool's answer
    // is a message of its own.
    assert_eq!(m[3].content, "Let me look.");
    let calls = m[3].tool_calls.as_ref().and_then(Value::as_array);
    assert_eq!(calls.map(Vec::len), Some(2));
    assert_eq!(
        m[3].tool_calls
            .as_ref()
            .map(|c| &c[0]["function"]["arguments"]["city"]),
        Some(&json!("Paris"))
    );
    assert_eq!(m[4].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(m[4].content, "sunny");
    assert_eq!(m[5].content, "");
    // A text is one user message.
    let m = chat(&request(json!({ "input": "Hello" }))).expect("messages");
    assert_eq!((m.len(), m[0].role.as_str()), (1, "user"));
}

#[test]
fn what_is_not_served_is_refused_naming_its_field() {
    let cases = [
        (json!({ "conversation": "conv_1" }), "conversation"),
        (json!({ "background": true }), "background"),
        (json!({ "reasoning": { "effort": "extreme" } }), "reasoning"),
        (json!({ "truncation": "auto" }), "truncation"),
        (
            json!({ "include": ["reasoning.encrypted_content"] }),
            "include",
        ),
        (
            json!({ "input": [{ "type": "item_reference", "id": "x" }] }),
            "input",
        ),
        (
            json!({ "input": [{ "role": "user", "content": [{ "type": "input_image",
            "image_url": "x" }] }] }),
            "input",
        ),
        (
            json!({ "input": [{ "type": "function_call_output", "output": "x" }] }),
            "input",
        ),
        (
            json!({ "input": [{ "role": "wizard", "content": "x" }] }),
            "input",
        ),
        (json!({ "input": 7 }), "input"),
        (json!({ "tools": [{ "type": "web_search" }] }), "tools"),
        (json!({ "tools": [{ "type": "function" }] }), "tools"),
        (
            json!({ "tools": [{ "type": "function", "name": "f" }],
            "tool_choice": { "type": "function", "name": "g" } }),
            "tool_choice",
        ),
        (
            json!({ "text": { "format": { "type": "yaml" } } }),
            "text.format",
        ),
    ];
    for (body, param) in cases {
        let e = refusal(body.clone());
        assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    }
    // The defaults and their explicit forms pass.
    let req = request(
        json!({ "truncation": "disabled", "store": true, "reasoning": null,
        "include": [LOGPROBS_INCLUDE], "top_logprobs": 2, "max_output_tokens": 5 }),
    );
    assert!(req.refuse_unsupported().is_ok());
    // An effort OpenAI names reaches the template; a summary is never made, and not refused.
    let effort = request(json!({ "reasoning": { "effort": "high", "summary": "auto" } }));
    assert!(effort.refuse_unsupported().is_ok());
    assert_eq!(effort.effort().expect("an effort"), Some("high"));
    let sampling = req.sampling().expect("sampling");
    assert_eq!((sampling.logprobs, sampling.max_tokens), (Some(2), Some(5)));
}

#[test]
fn text_format_and_tools_take_the_flat_forms() {
    let format = json!({ "format": { "type": "json_schema", "name": "city", "strict": true,
        "schema": { "type": "object" } } });
    let c = text_format(Some(&format))
        .expect("ok")
        .expect("a constraint");
    assert_eq!(c.field, "text.format");
    assert!(
        matches!(c.spec, Spec::JsonSchema { strict: true, .. }),
        "{:?}",
        c.spec
    );
    assert!(
        text_format(Some(&json!({ "format": { "type": "text" } })))
            .expect("ok")
            .is_none()
    );
    let req = request(json!({ "tools": [{ "type": "function", "name": "weather",
        "parameters": { "type": "object" } }], "tool_choice": { "type": "function",
        "name": "weather" }, "parallel_tool_calls": false }));
    let tools = req.tools().expect("ok").expect("tools");
    assert_eq!(tools.functions[0].name, "weather");
    assert_eq!(tools.choice, ToolChoice::Named("weather".into()));
    assert!(!tools.parallel);
}

fn writer(logprobs: bool) -> ResponseWriter {
    let head = Head {
        id: "resp_ab".into(),
        created_at: 1,
        model: "m".into(),
        settings: json!({ "store": false, "tools": [] }),
    };
    ResponseWriter::new(head, logprobs, None)
}

fn delta(text: &str, calls: Vec<CallDelta>) -> Result<GenerateEvent, GatewayError> {
    Ok(GenerateEvent::Delta {
        text: text.into(),
        reasoning: String::new(),
        token_ids: vec![1],
        logprobs: Vec::new(),
        calls,
    })
}

fn finish(
    reason: api::FinishReason,
    calls: Vec<ToolCall>,
    streamed: usize,
) -> Result<GenerateEvent, GatewayError> {
    Ok(GenerateEvent::Finish {
        reason,
        tool_calls: calls,
        streamed_calls: streamed,
        prompt_tokens: 7,
        cached_tokens: 4,
        completion_tokens: 3,
        reasoning_tokens: 0,
        time_to_first_token_ms: 1.0,
    })
}

fn run(
    w: &mut ResponseWriter,
    events: Vec<Result<GenerateEvent, GatewayError>>,
) -> Vec<ResponseEvent> {
    let mut out = w.start();
    for ev in events {
        out.extend(w.on_event(ev));
    }
    out
}

fn kinds(events: &[ResponseEvent]) -> Vec<&'static str> {
    events.iter().map(|(k, _)| *k).collect()
}

#[test]
fn a_text_answer_streams_its_message_and_ends_in_the_whole_response() {
    let mut w = writer(false);
    let events = run(
        &mut w,
        vec![
            delta("Pa", vec![]),
            delta("ris", vec![]),
            finish(api::FinishReason::Stop, vec![], 0),
        ],
    );
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (kind, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], *kind);
        assert_eq!(data["sequence_number"], i);
    }
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[6].1["text"], "Paris");
    let last = &events[9].1["response"];
    assert_eq!(*last, w.response());
    assert_eq!(last["status"], "completed");
    assert_eq!(last["output"][0]["content"][0]["text"], "Paris");
    assert_eq!(last["output"][0]["id"], events[2].1["item"]["id"]);
    assert_eq!(last["usage"]["input_tokens"], 7);
    assert_eq!(last["usage"]["input_tokens_details"]["cached_tokens"], 4);
    assert_eq!(last["usage"]["total_tokens"], 10);
    assert_eq!(last["store"], false);
}

#[test]
fn calls_become_items_of_their_own_streamed_or_not_and_a_cut_answer_is_incomplete() {
    let mut w = writer(false);
    let head = |id: &str, name: &str| Some((id.to_owned(), name.to_owned()));
    let piece = |head, arguments: &str| CallDelta {
        index: 0,
        head,
        arguments: arguments.into(),
    };
    let call = |id: &str, arguments: &str| ToolCall {
        id: id.into(),
        name: "f".into(),
        arguments: arguments.into(),
    };
    let events = run(
        &mut w,
        vec![
            delta("Looking.", vec![piece(head("call_1", "f"), "")]),
            delta("", vec![piece(None, "{\"a\":"), piece(None, " 1}")]),
            finish(
                api::FinishReason::Length,
                vec![call("call_1", "{\"a\": 1}"), call("call_2", "{}")],
                1,
            ),
        ],
    );
    let r = w.response();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(events.last().map(|(k, _)| *k), Some("response.incomplete"));
    let output = r["output"].as_array().expect("output");
    let types: Vec<&str> = output.iter().filter_map(|i| i["type"].as_str()).collect();
    assert_eq!(types, ["message", "function_call", "function_call"]);
    assert_eq!(output[1]["call_id"], "call_1");
    assert_eq!(output[1]["arguments"], "{\"a\": 1}");
    assert_eq!(output[2]["call_id"], "call_2");
    assert_eq!(output[2]["arguments"], "{}");
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| *k == "response.function_call_arguments.delta")
        .map(|(_, d)| &d["delta"])
        .collect();
    assert_eq!(deltas, [&json!("{\"a\":"), &json!(" 1}"), &json!("{}")]);
    // Each item's events carry its output index.
    let done: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| *k == "response.output_item.done")
        .map(|(_, d)| &d["output_index"])
        .collect();
    assert_eq!(done, [&json!(0), &json!(1), &json!(2)]);
}

#[test]
fn a_fault_mid_stream_is_an_error_event_then_a_failed_response() {
    let mut w = writer(true);
    let events = run(
        &mut w,
        vec![
            delta("a", vec![]),
            Err(GatewayError::Unavailable("pool gone".into())),
        ],
    );
    let tail: Vec<&str> = kinds(&events).into_iter().rev().take(2).collect();
    assert_eq!(tail, ["response.failed", "error"]);
    let r = w.response();
    assert_eq!(r["status"], "failed");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("pool gone")),
        "{r}"
    );
}

/// A kept response holds its conversation (input, then output items) before its last event
/// goes out, and a request continuing it puts that conversation before its own input, without
/// the earlier instructions.
#[test]
fn a_kept_response_continues_its_conversation() {
    let store = Arc::new(crate::responses_store::ResponseStore::default());
    let first = request(json!({ "instructions": "Be brief.", "input": "Hi" }));
    let items = first.conversation_items(None).expect("items");
    let head = Head {
        id: "resp_1".into(),
        created_at: 1,
        model: "m".into(),
        settings: json!({}),
    };
    let keep = crate::responses_reply::Keep {
        store: store.clone(),
        items,
    };
    let mut w = ResponseWriter::new(head, false, Some(keep));
    let events = run(
        &mut w,
        vec![
            delta("Hello!", vec![]),
            finish(api::FinishReason::Stop, vec![], 0),
        ],
    );
    assert_eq!(events.last().map(|(k, _)| *k), Some("response.completed"));
    let kept = store.get("resp_1").expect("kept");
    assert_eq!(kept.response, w.response());
    let second = request(json!({ "previous_response_id": "resp_1", "input": "Again?" }));
    let m = second
        .messages(&second.conversation_items(Some(kept)).expect("items"))
        .expect("chat");
    let turns: Vec<(&str, &str)> = m
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    assert_eq!(
        turns,
        [("user", "Hi"), ("assistant", "Hello!"), ("user", "Again?")]
    );
}

/// A reasoning model's thinking is an item of its own before the message (streamed as
/// `reasoning_text` deltas), counted in the usage; sent back as input, it is the thinking of
/// the assistant message after it.
#[test]
fn thinking_is_a_reasoning_item_and_comes_back_as_input() {
    let thinking = GenerateEvent::thinking;
    let mut w = writer(false);
    let events = run(
        &mut w,
        vec![
            thinking("Hm", ""),
            thinking("!", "O"),
            delta("K", Vec::new()),
            finish(api::FinishReason::Stop, Vec::new(), 0),
        ],
    );
    let reasoning_events: Vec<_> = kinds(&events)
        .into_iter()
        .filter(|k| k.contains("reasoning"))
        .collect();
    assert_eq!(
        reasoning_events,
        [
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done"
        ]
    );
    let output = w.response()["output"].clone();
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(
        output[0]["content"],
        json!([{ "type": "reasoning_text", "text": "Hm!" }])
    );
    assert_eq!(output[1]["type"], "message");
    assert_eq!(output[1]["content"][0]["text"], "OK");
    let mut items = vec![json!({ "role": "user", "content": "q" })];
    items.extend(output.as_array().cloned().unwrap_or_default());
    items.push(json!({ "role": "user", "content": "again" }));
    let messages = chat(&request(json!({ "model": "m", "input": items }))).expect("a chat");
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(messages[1].content, "OK");
    assert_eq!(messages[1].reasoning_content.as_deref(), Some("Hm!"));
    // Another server's item that carries no text adds nothing.
    let items = json!([{ "role": "user", "content": "q" },
        { "type": "reasoning", "summary": [], "encrypted_content": "x" },
        { "role": "assistant", "content": "OK" }]);
    let messages = chat(&request(json!({ "model": "m", "input": items }))).expect("a chat");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1].reasoning_content, None);
}
