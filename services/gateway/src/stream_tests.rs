//! From canned worker messages to events: deltas that add up to the decoded text, stop strings
//! that end the stream early, the finish with its usage, and a worker that fails or vanishes
//! mid-stream.

use std::time::{Duration, Instant};

use ferrite_proto::v1 as api;
use ferrite_proto::worker::v1 as pb;
use futures::StreamExt;

use super::*;
use crate::models::testing::{think_model, word_model};
use crate::validate::{Chat, Prompt, validate};

fn token(id: u32, finish: pb::FinishReason) -> pb::GenerateResponse {
    pb::GenerateResponse {
        tokens: vec![pb::Token {
            id,
            logprob: -0.5,
            top: Vec::new(),
        }],
        finish_reason: finish as i32,
        cached_tokens: None,
        prompt_logprobs: Vec::new(),
        embedding: Vec::new(),
    }
}

/// The events of a request (prompt `a`, `stop` strings) whose worker sends `ids` and then
/// `end` (a finish reason on the last id, or an error, or nothing).
async fn events_of(
    ids: &[u32],
    end: Result<pb::FinishReason, tonic::Status>,
    stop: &[&str],
) -> Vec<Result<GenerateEvent, GatewayError>> {
    let prompt = Prompt::Text("a".into());
    events_for((word_model(), &prompt), ids, end, stop).await
}

/// [`events_of`] for a request of `prompt` to `model`.
async fn events_for(
    (model, prompt): (Arc<ModelText>, &Prompt),
    ids: &[u32],
    end: Result<pb::FinishReason, tonic::Status>,
    stop: &[&str],
) -> Vec<Result<GenerateEvent, GatewayError>> {
    let sampling = api::SamplingParams {
        max_tokens: Some(8),
        stop: stop.iter().map(|s| (*s).to_owned()).collect(),
        ..api::SamplingParams::default()
    };
    let req = validate(model, 16, prompt, Some(sampling), None, None).expect("valid");
    events_of_request(&req, ids, end).await
}

/// The events of `req` whose worker sends `ids` and then `end`, as [`events_for`].
async fn events_of_request(
    req: &ValidatedRequest,
    ids: &[u32],
    end: Result<pb::FinishReason, tonic::Status>,
) -> Vec<Result<GenerateEvent, GatewayError>> {
    let mut msgs: Vec<Result<pb::GenerateResponse, tonic::Status>> = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let last = i + 1 == ids.len();
        let finish = match (&end, last) {
            (Ok(reason), true) => *reason,
            _ => pb::FinishReason::Unspecified,
        };
        msgs.push(Ok(token(id, finish)));
    }
    if let Err(status) = end {
        msgs.push(Err(status));
    }
    let mut first = msgs.remove(0).expect("a first token");
    // The worker says on its first message how much of the prompt its prefix cache served.
    first.cached_tokens = Some(1);
    let trace = RequestTrace::new(
        tracing::Span::none(),
        "m",
        crate::trace::Api::Grpc,
        Instant::now(),
    );
    let upstream = Upstream::canned(first, msgs);
    events(req, upstream, trace, None, Duration::from_secs(30))
        .collect()
        .await
}

fn text_of(events: &[Result<GenerateEvent, GatewayError>]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(GenerateEvent::Delta { text, .. }) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn deltas_add_up_to_the_text_and_the_finish_counts_the_tokens() {
    let evs = events_of(&[1, 2, 3], Ok(pb::FinishReason::Length), &[]).await;
    let want = word_model()
        .tokenizer
        .decode(&[1, 2, 3], true)
        .expect("decode");
    assert_eq!(text_of(&evs), want);
    match evs.last() {
        Some(Ok(GenerateEvent::Finish {
            reason,
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            ..
        })) => {
            assert_eq!(*reason, api::FinishReason::Length);
            assert_eq!((*prompt_tokens, *completion_tokens), (1, 3));
            assert_eq!(*cached_tokens, 1, "as the worker's first message said");
        }
        other => panic!("no finish: {other:?}"),
    }
}

#[tokio::test]
async fn a_stop_string_ends_the_stream_before_it() {
    // The worker would go on (no finish): the stop string ends the request at the gateway.
    let evs = events_of(&[1, 3, 2, 1, 1], Ok(pb::FinishReason::Unspecified), &["b"]).await;
    let text = text_of(&evs);
    assert!(!text.contains('b'), "{text:?}");
    assert!(text.starts_with('a'), "{text:?}");
    match evs.last() {
        Some(Ok(GenerateEvent::Finish {
            reason,
            completion_tokens,
            ..
        })) => {
            assert_eq!(*reason, api::FinishReason::Stop);
            assert_eq!(*completion_tokens, 3, "counted up to the stop");
        }
        other => panic!("no finish: {other:?}"),
    }
}

#[tokio::test]
async fn a_worker_failing_mid_stream_ends_it_with_the_servers_fault() {
    let evs = events_of(&[1, 2], Err(tonic::Status::internal("step failed")), &[]).await;
    assert_eq!(evs.len(), 3, "{evs:?}");
    match evs.last() {
        Some(Err(e)) => assert_eq!(e.kind(), "internal", "{e:?}"),
        other => panic!("no error: {other:?}"),
    }
    let evs = events_of(&[1, 2], Err(tonic::Status::unavailable("gone")), &[]).await;
    assert!(
        matches!(evs.last(), Some(Err(GatewayError::Unavailable(_)))),
        "{evs:?}"
    );
}

#[tokio::test]
async fn a_stream_that_ends_without_a_finish_is_unavailable() {
    let evs = events_of(&[1, 2], Ok(pb::FinishReason::Unspecified), &[]).await;
    match evs.last() {
        Some(Err(GatewayError::Unavailable(m))) => assert!(m.contains("without a finish"), "{m}"),
        other => panic!("no error: {other:?}"),
    }
}

#[tokio::test]
async fn a_pool_silent_past_the_idle_bound_fails_the_stream_as_unavailable() {
    let req = validate(
        word_model(),
        16,
        &Prompt::Text("a".into()),
        None,
        None,
        None,
    )
    .expect("valid");
    let trace = RequestTrace::new(
        tracing::Span::none(),
        "m",
        crate::trace::Api::Grpc,
        Instant::now(),
    );
    let first = token(1, pb::FinishReason::Unspecified);
    let upstream =
        Upstream::canned_then_silent(first, vec![Ok(token(2, pb::FinishReason::Unspecified))]);
    let idle = Duration::from_millis(200);
    let started = Instant::now();
    let evs: Vec<_> = events(&req, upstream, trace, None, idle).collect().await;
    assert_eq!(evs.len(), 3, "two deltas, then the error: {evs:?}");
    match &evs[2] {
        Err(GatewayError::Unavailable(m)) => assert!(m.contains("sent no token for 200ms"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= idle);
}

/// A request that scores its prompt with `max_tokens` 0: the prompt's scores come first,
/// named by their tokens' text; the one token the worker was asked for is dropped, and the
/// finish says `length` with no completion token.
#[tokio::test]
async fn a_scored_prompt_comes_first_and_max_tokens_0_drops_the_token() {
    let sampling = api::SamplingParams {
        max_tokens: Some(0),
        prompt_logprobs: Some(1),
        ..api::SamplingParams::default()
    };
    let prompt = Prompt::TokenIds(vec![1, 2, 3]);
    let req = validate(word_model(), 16, &prompt, Some(sampling), None, None).expect("valid");
    assert_eq!(req.worker_request().sampling.map(|s| s.max_tokens), Some(1));
    let score = |id, logprob| pb::Token {
        id,
        logprob,
        top: vec![pb::TopLogprob {
            token_id: 1,
            logprob: -0.25,
        }],
    };
    let mut first = token(3, pb::FinishReason::Stop);
    first.prompt_logprobs = vec![score(2, -1.5), score(3, -2.5)];
    let trace = RequestTrace::new(
        tracing::Span::none(),
        "m",
        crate::trace::Api::Grpc,
        Instant::now(),
    );
    let upstream = Upstream::canned(first, Vec::new());
    let evs: Vec<_> = events(&req, upstream, trace, None, Duration::from_secs(30))
        .collect()
        .await;
    let text = |id| crate::stream::token_text(&word_model(), id).0;
    match &evs[..] {
        [
            Ok(GenerateEvent::Prompt { first, logprobs }),
            Ok(GenerateEvent::Finish {
                reason,
                completion_tokens,
                ..
            }),
        ] => {
            assert_eq!(first, &text(1));
            let got: Vec<_> = logprobs
                .iter()
                .map(|t| (t.token.clone(), t.logprob))
                .collect();
            assert_eq!(got, [(text(2), -1.5), (text(3), -2.5)]);
            assert_eq!(logprobs[0].top[0].token, text(1));
            assert_eq!(*reason, api::FinishReason::Length);
            assert_eq!(*completion_tokens, 0);
        }
        other => panic!("{other:?}"),
    }
    // Without prompt_logprobs, max_tokens 0 is refused.
    let plain = api::SamplingParams {
        max_tokens: Some(0),
        ..api::SamplingParams::default()
    };
    let err = validate(word_model(), 16, &prompt, Some(plain), None, None).expect_err("0");
    assert!(err.to_string().contains("prompt_logprobs"), "{err}");
}

/// The thinking and the answer of events, and the finish's count of thinking tokens.
fn split_of(events: &[Result<GenerateEvent, GatewayError>]) -> (String, String, u32) {
    let (mut thought, mut answer, mut tokens) = (String::new(), String::new(), 0);
    for e in events {
        match e {
            Ok(GenerateEvent::Delta {
                text, reasoning, ..
            }) => {
                thought.push_str(reasoning);
                answer.push_str(text);
            }
            Ok(GenerateEvent::Finish {
                reasoning_tokens, ..
            }) => tokens = *reasoning_tokens,
            other => panic!("{other:?}"),
        }
    }
    (thought, answer, tokens)
}

fn chat(kwargs: serde_json::Value) -> Prompt {
    Prompt::Chat(Chat {
        messages: vec![ferrite_text::ChatMessage::new("user", "x")],
        kwargs: kwargs.as_object().cloned().unwrap_or_default(),
    })
}

/// A reasoning model's chat comes apart by its markers' ids; stop strings end the answer, not
/// the thinking; completions' raw text is not split.
#[tokio::test]
async fn a_reasoning_models_thinking_comes_apart_from_its_answer() {
    let (think, end) = (8, 9);
    let qwen3 = (think_model("qwen3"), &chat(serde_json::json!({})));
    let evs = events_for(
        qwen3.clone(),
        &[think, 1, 2, end, 3, 1],
        Ok(pb::FinishReason::Stop),
        &[],
    )
    .await;
    let (thought, answer, tokens) = split_of(&evs);
    assert_eq!((thought.trim(), answer.trim(), tokens), ("a b", "c a", 4));
    // "a" stops the answer only.
    let evs = events_for(
        qwen3,
        &[think, 1, end, 3, 1, 2],
        Ok(pb::FinishReason::Stop),
        &["a"],
    )
    .await;
    let (thought, answer, _) = split_of(&evs);
    assert_eq!((thought.trim(), answer.trim()), ("a", "c"));
    // DeepSeek-R1 thinks from the first token; a template that closed the block answers.
    let r1 = (think_model("deepseek_r1"), &chat(serde_json::json!({})));
    let evs = events_for(r1, &[1, end, 2], Ok(pb::FinishReason::Stop), &[]).await;
    assert_eq!(split_of(&evs).0.trim(), "a");
    let off = chat(serde_json::json!({ "enable_thinking": false }));
    let evs = events_for(
        (think_model("deepseek_r1"), &off),
        &[1, end, 2],
        Ok(pb::FinishReason::Stop),
        &[],
    )
    .await;
    let (thought, answer, tokens) = split_of(&evs);
    assert_eq!((thought.as_str(), tokens), ("", 0));
    assert!(answer.contains('a') && answer.contains('b'), "{answer:?}");
    let text = Prompt::Text("a".into());
    let evs = events_for(
        (think_model("deepseek_r1"), &text),
        &[1, end, 2],
        Ok(pb::FinishReason::Stop),
        &[],
    )
    .await;
    assert_eq!(split_of(&evs).0, "", "completions are not split");
}

/// gpt-oss's chat comes apart by channel: `analysis` is the thinking, `final` the answer,
/// the headers neither; a stop string ends the answer only.
#[tokio::test]
async fn gpt_oss_channels_come_apart_into_thinking_and_answer() {
    let chat = chat(serde_json::json!({}));
    let ids = harmony_ids(&[
        Harmony::Header("<|channel|>analysis<|message|>"),
        Harmony::Text("x y"),
        Harmony::Header("<|end|><|start|>assistant<|channel|>final<|message|>"),
        Harmony::Text("a b"),
    ]);
    let model = crate::models::testing::harmony_model();
    let req = |stop: &[&str]| {
        let sampling = api::SamplingParams {
            stop: stop.iter().map(|s| (*s).to_owned()).collect(),
            ..api::SamplingParams::default()
        };
        validate(model.clone(), 4096, &chat, Some(sampling), None, None).expect("valid")
    };
    let evs = events_of_request(&req(&[]), &ids, Ok(pb::FinishReason::Stop)).await;
    let (thought, text, tokens) = split_of(&evs);
    // Thinking: the 3 bytes and 3 markers of its header, `<|end|>`, the next header's 13.
    assert_eq!(
        (thought.as_str(), text.as_str(), tokens),
        ("x y", "a b", 20)
    );
    let evs = events_of_request(&req(&["b"]), &ids, Ok(pb::FinishReason::Stop)).await;
    let (thought, text, _) = split_of(&evs);
    assert_eq!((thought.as_str(), text.as_str()), ("x y", "a "));
}

/// Pieces of a harmony output for [`harmony_model`]: text of markers and channel names (each
/// one token), or of bytes.
enum Harmony<'a> {
    Header(&'a str),
    Text(&'a str),
}

fn harmony_ids(pieces: &[Harmony]) -> Vec<u32> {
    let model = crate::models::testing::harmony_model();
    pieces
        .iter()
        .flat_map(|p| match p {
            Harmony::Header(h) => model.tokenizer.encode(h, false).expect("ids"),
            Harmony::Text(t) => t.bytes().map(u32::from).collect(),
        })
        .collect()
}

/// The events of `chat` to `model` with one function, `get_weather` (any arguments), called
/// as `choice` says, whose worker sends `ids` and stops.
async fn weather_events(
    model: Arc<ModelText>,
    chat: &Prompt,
    ids: &[u32],
    choice: ToolChoice,
) -> Vec<Result<GenerateEvent, GatewayError>> {
    let f = crate::tools::Function::new("get_weather", None, None).expect("f");
    let tools = Tools::new(vec![f], choice, true)
        .expect("tools")
        .map(Arc::new);
    let req = validate(model, 4096, chat, None, None, tools).expect("valid");
    events_of_request(&req, ids, Ok(pb::FinishReason::Stop)).await
}

/// gpt-oss's call is a message to `functions.NAME`: its body streams as the call's arguments,
/// neither thinking nor answer, and the output finishes on `tool_calls`; a preamble (a
/// commentary with no recipient) is thinking; under `tool_choice: none` a call is thinking
/// too.
#[tokio::test]
async fn a_gpt_oss_call_streams_as_a_tool_call() {
    let model = crate::models::testing::harmony_model();
    let chat = chat(serde_json::json!({}));
    let ids = harmony_ids(&[
        Harmony::Header("<|channel|>commentary<|message|>"),
        Harmony::Text("Let me look."),
        Harmony::Header(
            "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather \
             <|constrain|>json<|message|>",
        ),
        Harmony::Text(r#"{"city": "Paris"}"#),
        Harmony::Header("<|call|>"),
    ]);
    let evs = weather_events(model.clone(), &chat, &ids, ToolChoice::Auto).await;
    let (mut thought, mut args, mut heads) = (String::new(), String::new(), Vec::new());
    for e in &evs {
        match e {
            Ok(GenerateEvent::Delta {
                text,
                reasoning,
                calls,
                ..
            }) => {
                assert_eq!(text, "", "no answer");
                thought.push_str(reasoning);
                for c in calls {
                    heads.extend(c.head.clone().map(|(_, name)| name));
                    args.push_str(&c.arguments);
                }
            }
            Ok(GenerateEvent::Finish {
                reason,
                tool_calls,
                streamed_calls,
                ..
            }) => {
                assert_eq!(
                    (*reason, *streamed_calls),
                    (api::FinishReason::ToolCalls, 1)
                );
                assert_eq!(tool_calls.len(), 1);
                assert_eq!(tool_calls[0].name, "get_weather");
                assert_eq!(tool_calls[0].arguments, r#"{"city": "Paris"}"#);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(thought, "Let me look.");
    assert_eq!(
        (heads, args.as_str()),
        (vec!["get_weather".to_owned()], r#"{"city": "Paris"}"#)
    );
    let evs = weather_events(model, &chat, &ids, ToolChoice::None).await;
    let (thought, text, _) = split_of(&evs);
    assert_eq!(thought, r#"Let me look.{"city": "Paris"}"#);
    assert_eq!(text, "");
}

/// gpt-oss's outputs in its own vocabulary (openai-harmony's encoding of them) come apart as
/// openai-harmony reads them: thinking, answer, and the calls to functions with their
/// arguments; a built-in tool's call stays thinking.
#[tokio::test]
async fn gpt_oss_outputs_in_its_own_vocabulary_come_apart_as_openai_harmony_reads_them() {
    use crate::harmony::tests::reference_ids;
    let model = crate::models::testing::o200k_model();
    let chat = chat(serde_json::json!({}));
    let names = ["lookup_user", "list_events"];
    let functions = names.map(|n| crate::tools::Function::new(n, None, None).expect("f"));
    let tools = Tools::new(functions.to_vec(), ToolChoice::Auto, true).expect("tools");
    let req = validate(model, 4096, &chat, None, None, tools.map(Arc::new)).expect("valid");
    let cases = [
        (
            "think_then_answer",
            "User asks the capital. Paris.",
            "The capital of France is Paris.",
            None,
        ),
        (
            "call_named_after_the_role",
            "Look the user up.",
            "",
            Some(("lookup_user", r#"{"id": 7}"#)),
        ),
        (
            "preamble_then_call",
            "Checking the calendar now.",
            "",
            Some(("list_events", r#"{"day":"2026-11-29"}"#)),
        ),
        ("builtin_tool_call", r#"{"query":"ferrite"}"#, "", None),
    ];
    for (name, thought, answer, call) in cases {
        let evs = events_of_request(&req, &reference_ids(name), Ok(pb::FinishReason::Stop)).await;
        let (mut got_thought, mut got_answer, mut calls) = (String::new(), String::new(), None);
        for e in &evs {
            match e {
                Ok(GenerateEvent::Delta {
                    text, reasoning, ..
                }) => {
                    got_thought.push_str(reasoning);
                    got_answer.push_str(text);
                }
                Ok(GenerateEvent::Finish { tool_calls, .. }) => calls = Some(tool_calls.clone()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            (got_thought.as_str(), got_answer.as_str()),
            (thought, answer),
            "{name}"
        );
        let calls = calls.expect("a finish");
        let calls: Vec<(&str, &str)> = (calls.iter())
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, call.into_iter().collect::<Vec<_>>(), "{name}");
    }
}

/// Mistral's `[TOOL_CALLS]` and Granite's `<|tool_call|>` are special tokens of their
/// tokenizers, which an answer's text skips: a request that may call tools keeps its format's
/// marker, so the call after it comes back (streamed, and whole at the end); one that may not
/// gets the text without it.
#[tokio::test]
async fn a_call_after_a_special_marker_token_comes_back() {
    let list = r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}]"#;
    let chat = chat(serde_json::json!({}));
    for (marker, id) in [("[TOOL_CALLS]", 256), ("<|tool_call|>", 257)] {
        let model = crate::models::testing::marker_model(marker);
        let ids: Vec<u32> = std::iter::once(id)
            .chain(list.bytes().map(u32::from))
            .chain([258])
            .collect();
        let evs = weather_events(model.clone(), &chat, &ids, ToolChoice::Auto).await;
        let mut streamed = String::new();
        let mut finished = false;
        for e in &evs {
            match e {
                Ok(GenerateEvent::Delta { text, calls, .. }) => {
                    assert_eq!(text, "", "{marker}: no answer text");
                    streamed.extend(calls.iter().map(|c| c.arguments.as_str()));
                }
                Ok(GenerateEvent::Finish {
                    reason, tool_calls, ..
                }) => {
                    assert_eq!(*reason, api::FinishReason::ToolCalls, "{marker}");
                    assert_eq!(tool_calls.len(), 1, "{marker}");
                    assert_eq!(tool_calls[0].name, "get_weather");
                    assert_eq!(tool_calls[0].arguments, r#"{"city":"Paris"}"#);
                    finished = true;
                }
                other => panic!("{marker}: {other:?}"),
            }
        }
        assert!(finished, "{marker}");
        assert_eq!(streamed, r#"{"city": "Paris"}"#, "{marker}");
        let evs = weather_events(model, &chat, &ids, ToolChoice::None).await;
        assert_eq!(
            text_of(&evs),
            list,
            "{marker}: skipped without tools to call"
        );
    }
}
