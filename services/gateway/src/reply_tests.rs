use super::*;
use crate::EventStream;
use crate::stream::merge;

fn reply(kind: Kind, include_usage: bool) -> Reply {
    Reply {
        kind,
        id: "x".into(),
        created: 1,
        model: "m".into(),
        include_usage,
        logprobs: false,
        per_prompt: 1,
        echo: Vec::new(),
        include_reasoning: true,
    }
}

fn writer(kind: Kind, include_usage: bool) -> ChunkWriter {
    ChunkWriter::new(reply(kind, include_usage), 1)
}

fn delta(text: &str) -> Result<GenerateEvent, GatewayError> {
    Ok(GenerateEvent::Delta {
        text: text.into(),
        reasoning: String::new(),
        token_ids: vec![1],
        logprobs: Vec::new(),
        calls: Vec::new(),
    })
}

fn finish_of(completion_tokens: u32, cached_tokens: u32) -> Result<GenerateEvent, GatewayError> {
    Ok(GenerateEvent::Finish {
        reason: api::FinishReason::Length,
        tool_calls: Vec::new(),
        streamed_calls: 0,
        prompt_tokens: 3,
        cached_tokens,
        completion_tokens,
        reasoning_tokens: 0,
        time_to_first_token_ms: 1.0,
    })
}

fn finish() -> Result<GenerateEvent, GatewayError> {
    finish_of(2, 2)
}

#[test]
fn usage_is_streamed_only_when_asked_for() {
    let mut w = writer(Kind::Chat, false);
    let chunks: Vec<Value> = [delta("a"), delta("b"), finish()]
        .into_iter()
        .flat_map(|e| w.on_event(0, e))
        .collect();
    assert_eq!(chunks.len(), 3);
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "{chunks:?}"
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks[1]["choices"][0]["delta"].get("role").is_none());
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");

    let mut w = writer(Kind::Completion, true);
    let chunks: Vec<Value> = [delta("a"), finish()]
        .into_iter()
        .flat_map(|e| w.on_event(0, e))
        .collect();
    assert_eq!(chunks.len(), 3, "the usage chunk comes last, on its own");
    assert!(chunks[..2].iter().all(|c| c["usage"].is_null()));
    let last = &chunks[2];
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["total_tokens"], 5);
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

#[test]
fn an_error_is_a_server_error_chunk() {
    let mut w = writer(Kind::Chat, false);
    let err = w.on_event(0, Err(GatewayError::Internal("boom".into())));
    assert_eq!(err[0]["error"]["type"], "server_error");
}

/// Interleaved choices: each chat choice names its role in its own first delta, every chunk
/// carries its choice's index, and the usage (the prompt once, every choice's tokens, choice
/// 0's cached tokens) follows the last finish, whichever choice that is.
#[test]
fn each_choice_streams_under_its_index_and_the_usage_follows_the_last_finish() {
    let mut w = ChunkWriter::new(
        Reply {
            per_prompt: 3,
            ..reply(Kind::Chat, true)
        },
        3,
    );
    let events = [
        (0, delta("a")),
        (2, delta("b")),
        (0, delta("c")),
        (0, finish_of(2, 16)),
        (1, delta("d")),
        (2, finish_of(4, 0)),
        (1, finish_of(1, 0)),
    ];
    let chunks: Vec<Value> = events
        .into_iter()
        .flat_map(|(i, e)| w.on_event(i, e))
        .collect();
    assert_eq!(chunks.len(), 8, "{chunks:#?}");
    let index = |c: &Value| c["choices"][0]["index"].as_u64();
    let indexes: Vec<_> = chunks[..7].iter().map(index).collect();
    let want = [0, 2, 0, 0, 1, 2, 1].map(Some);
    assert_eq!(indexes, want);
    let roles: Vec<bool> = chunks[..7]
        .iter()
        .map(|c| c["choices"][0]["delta"].get("role").is_some())
        .collect();
    assert_eq!(roles, [true, true, false, false, true, false, false]);
    assert!(chunks[..7].iter().all(|c| c["usage"].is_null()));
    let usage = &chunks[7]["usage"];
    assert_eq!(usage["prompt_tokens"], 3);
    assert_eq!(usage["completion_tokens"], 7);
    assert_eq!(usage["total_tokens"], 10);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 16);
}

fn stream_of(events: Vec<Result<GenerateEvent, GatewayError>>) -> EventStream {
    Box::pin(futures::stream::iter(events))
}

/// Two prompts of two choices each: each prompt is counted once, with its first choice's
/// cached tokens.
#[test]
fn the_usage_counts_each_prompt_of_a_batch_once() {
    let mut usage = Usage::default();
    let finish = |prompt_tokens, cached_tokens| GenerateEvent::Finish {
        reason: api::FinishReason::Stop,
        tool_calls: Vec::new(),
        streamed_calls: 0,
        prompt_tokens,
        cached_tokens,
        completion_tokens: 5,
        reasoning_tokens: 0,
        time_to_first_token_ms: 1.0,
    };
    for (i, ev) in [
        (3, finish(7, 7)),
        (0, finish(10, 0)),
        (1, finish(10, 10)),
        (2, finish(7, 0)),
    ] {
        usage.add(i, 2, &ev);
    }
    let u = usage.json();
    assert_eq!(u["prompt_tokens"], 17);
    assert_eq!(u["completion_tokens"], 20);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
}

/// A body holds every choice by index, whatever order they finished in.
#[tokio::test]
async fn a_body_holds_every_choice_in_order_of_index() {
    let choices = vec![
        stream_of(vec![delta("a"), delta("b"), finish_of(2, 3)]),
        stream_of(vec![delta("c"), finish_of(1, 0)]),
        stream_of(vec![finish_of(0, 0)]),
    ];
    let reply = Reply {
        per_prompt: 3,
        ..reply(Kind::Completion, false)
    };
    let body = body(merge(choices), &reply, 3).await.expect("a body");
    let texts: Vec<_> = body["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| (c["index"].as_u64(), c["text"].as_str().map(str::to_owned)))
        .collect();
    let want = [(0, "ab"), (1, "c"), (2, "")].map(|(i, t)| (Some(i), Some(t.to_owned())));
    assert_eq!(texts, want);
    assert_eq!(body["usage"]["completion_tokens"], 3);
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

/// An error in any choice fails the request, and the merged stream ends with it: the other
/// choices are not read any further.
#[tokio::test]
async fn an_error_in_one_choice_ends_the_request() {
    let endless: EventStream =
        Box::pin(futures::stream::iter([delta("a")]).chain(futures::stream::pending()));
    let gone = stream_of(vec![Err(GatewayError::Unavailable("gone".into()))]);
    let choices = vec![endless, gone];
    let merged: Vec<Indexed> = merge(choices).collect().await;
    assert_eq!(merged.len(), 2, "{merged:?}");
    assert!(merged[1].1.is_err());
    let choices = vec![
        stream_of(vec![delta("a"), finish()]),
        stream_of(vec![Err(GatewayError::Internal("boom".into()))]),
    ];
    let e = body(merge(choices), &reply(Kind::Chat, false), 2)
        .await
        .expect_err("failed");
    assert_eq!(e.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
}

fn scored(text: &str, logprob: f32) -> api::TokenLogprob {
    api::TokenLogprob {
        token_id: 0,
        logprob,
        top: Vec::new(),
        token: text.into(),
        bytes: text.as_bytes().to_vec(),
    }
}

/// `echo` with logprobs, two choices of one prompt: each choice's text begins with the prompt
/// and its logprobs with the prompt's tokens (the first null); a stream sends the prompt as
/// each choice's first chunk, with the prompt's logprobs, before its own tokens.
#[tokio::test]
async fn an_echoed_prompt_leads_each_choice_with_its_logprobs() {
    let prompt = || {
        Ok(GenerateEvent::Prompt {
            first: "The".into(),
            logprobs: vec![scored(" sky", -2.0)],
        })
    };
    let token = |text: &str| {
        Ok(GenerateEvent::Delta {
            text: text.into(),
            reasoning: String::new(),
            token_ids: vec![1],
            logprobs: vec![scored(text, -0.5)],
            calls: Vec::new(),
        })
    };
    let echoed = || Reply {
        per_prompt: 2,
        logprobs: true,
        echo: vec!["The sky".into()],
        ..reply(Kind::Completion, false)
    };
    let choices = vec![
        stream_of(vec![prompt(), token(" is"), finish_of(1, 0)]),
        stream_of(vec![prompt(), finish_of(0, 0)]),
    ];
    let body = body(merge(choices), &echoed(), 2).await.expect("a body");
    let first = &body["choices"][0];
    assert_eq!(first["text"], "The sky is");
    assert_eq!(first["logprobs"]["tokens"], json!(["The", " sky", " is"]));
    assert_eq!(
        first["logprobs"]["token_logprobs"],
        json!([null, -2.0, -0.5])
    );
    assert_eq!(first["logprobs"]["text_offset"], json!([0, 3, 7]));
    assert_eq!(body["choices"][1]["text"], "The sky");

    let mut w = ChunkWriter::new(echoed(), 2);
    let chunks: Vec<Value> = [(0, prompt()), (1, prompt()), (0, token(" is"))]
        .into_iter()
        .flat_map(|(i, e)| w.on_event(i, e))
        .collect();
    assert_eq!(chunks.len(), 3, "{chunks:#?}");
    let choice = |c: &Value| c["choices"][0].clone();
    assert_eq!(choice(&chunks[0])["text"], "The sky");
    assert_eq!(
        choice(&chunks[0])["logprobs"]["token_logprobs"],
        json!([null, -2.0])
    );
    assert_eq!(choice(&chunks[1])["index"], 1);
    assert_eq!(choice(&chunks[2])["text"], " is");
    assert_eq!(choice(&chunks[2])["logprobs"]["text_offset"], json!([7]));
    // Without logprobs the prompt is echoed all the same, before the first delta.
    let mut w = ChunkWriter::new(
        Reply {
            echo: vec!["The sky".into()],
            ..reply(Kind::Completion, false)
        },
        1,
    );
    let chunks = w.on_event(0, delta(" is"));
    assert_eq!(chunks.len(), 2);
    assert_eq!(choice(&chunks[0])["text"], "The sky");
    assert_eq!(choice(&chunks[0])["logprobs"], Value::Null);
}

/// A reasoning model's thinking: its own chunks before the answer's (the first naming the
/// role), beside the content in the body, under both names; its tokens in the usage; left out
/// with `include_reasoning: false`.
#[tokio::test]
async fn thinking_goes_out_beside_the_answer() {
    let thinking = GenerateEvent::thinking;
    let events = || {
        let finish = Ok(GenerateEvent::Finish {
            reason: api::FinishReason::Stop,
            tool_calls: Vec::new(),
            streamed_calls: 0,
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 4,
            reasoning_tokens: 3,
            time_to_first_token_ms: 1.0,
        });
        vec![
            thinking("Hm", ""),
            thinking("!", "O"),
            thinking("", "K"),
            finish,
        ]
    };
    let mut w = writer(Kind::Chat, true);
    let chunks: Vec<Value> = events()
        .into_iter()
        .flat_map(|e| w.on_event(0, e))
        .collect();
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(
        deltas[0],
        &json!({ "role": "assistant", "reasoning": "Hm", "reasoning_content": "Hm" })
    );
    assert_eq!(
        deltas[1],
        &json!({ "reasoning": "!", "reasoning_content": "!" })
    );
    assert_eq!(deltas[2], &json!({ "content": "O" }));
    assert_eq!(deltas[3], &json!({ "content": "K" }));
    let usage = &chunks.last().expect("usage")["usage"];
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 3);

    let whole = body(
        merge(vec![stream_of(events())]),
        &reply(Kind::Chat, false),
        1,
    )
    .await
    .expect("body");
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        (&message["content"], &message["reasoning_content"]),
        (&json!("OK"), &json!("Hm!"))
    );
    assert_eq!(message["reasoning"], "Hm!");
    assert_eq!(
        whole["usage"]["completion_tokens_details"]["reasoning_tokens"],
        3
    );

    let hidden = Reply {
        include_reasoning: false,
        ..reply(Kind::Chat, false)
    };
    let whole = body(merge(vec![stream_of(events())]), &hidden, 1)
        .await
        .expect("body");
    assert!(
        whole["choices"][0]["message"].get("reasoning").is_none(),
        "{whole}"
    );
    let mut w = ChunkWriter::new(hidden, 1);
    let chunks: Vec<Value> = events()
        .into_iter()
        .flat_map(|e| w.on_event(0, e))
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["choices"][0]["delta"].get("reasoning").is_none())
    );
}
