//! gpt-oss's outputs, as token ids of its real vocabulary, read by ferrite's harmony machine
//! and by OpenAI's `openai-harmony` (`tests/fixtures/text/generate_harmony.py`): the same
//! messages, with the same recipients, thinking and answer told apart as gpt-oss's channels
//! say.

mod common;

use common::fixture;
use ferrite_text::harmony::{Harmony, recipient};
use ferrite_text::reasoning::{Part, State};
use serde_json::Value;

/// A message as both readings give it: its recipient, its text, and whether it is the answer.
#[derive(Debug, PartialEq)]
struct Message {
    recipient: Option<String>,
    text: String,
    answer: bool,
}

fn harmony(f: &Value) -> Harmony {
    let id = |name: &str| f["tokens"][name].as_u64().expect("id") as u32;
    Harmony {
        start: id("<|start|>"),
        channel: id("<|channel|>"),
        constrain: id("<|constrain|>"),
        message: id("<|message|>"),
        end: id("<|end|>"),
        call: id("<|call|>"),
        return_: id("<|return|>"),
        final_channel: id("final"),
        analysis_channel: id("analysis"),
    }
}

/// The bytes of tokens `ids`, from the fixture's table.
fn bytes(f: &Value, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|t| {
            let hex = f["token_bytes"][t.to_string()]
                .as_str()
                .expect("a token's bytes");
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// An output's messages as ferrite reads it: each body, with the recipient its header names.
fn ferrite_messages(f: &Value, h: Harmony, ids: &[u32]) -> Vec<Message> {
    let prompt: Vec<u32> = serde_json::from_value(f["prompt"].clone()).expect("prompt");
    assert_eq!(
        h.state_after(&prompt),
        State::Start,
        "the prompt ends in a header"
    );
    let mut m = h.machine_from(State::Start);
    let (mut out, mut body, mut in_body) = (Vec::new(), Vec::new(), None::<Message>);
    for &t in ids {
        match m.on_token(t) {
            Part::Marker => {
                if let Some(mut msg) = in_body.take() {
                    msg.text = String::from_utf8(std::mem::take(&mut body)).expect("utf-8");
                    out.push(msg);
                }
            }
            part => {
                let msg = in_body.get_or_insert_with(|| {
                    let words: Vec<String> = (m.header().iter())
                        .map(|run| String::from_utf8(bytes(f, run)).expect("utf-8"))
                        .collect();
                    Message {
                        recipient: recipient(&words.join(" ")).map(str::to_owned),
                        text: String::new(),
                        answer: part == Part::Content,
                    }
                });
                assert_eq!(msg.answer, part == Part::Content, "one part per body");
                body.extend(bytes(f, &[t]));
            }
        }
    }
    assert!(
        in_body.is_none(),
        "every output ends on <|return|> or <|call|>"
    );
    out
}

#[test]
fn ferrite_reads_gpt_oss_outputs_as_openai_harmony_does() {
    let f = fixture("harmony_reference.json");
    let h = harmony(&f);
    let stops: Vec<u32> = serde_json::from_value(f["stop_tokens"].clone()).expect("stops");
    assert_eq!(
        stops,
        [h.return_, h.call],
        "the ends of an assistant's output"
    );
    let outputs = f["outputs"].as_object().expect("outputs");
    assert_eq!(outputs.len(), 6);
    for (name, output) in outputs {
        let ids: Vec<u32> = serde_json::from_value(output["ids"].clone()).expect("ids");
        let want: Vec<Message> = (output["messages"].as_array().expect("messages").iter())
            .map(|m| Message {
                recipient: m["recipient"].as_str().map(str::to_owned),
                text: m["text"].as_str().expect("text").to_owned(),
                answer: m["channel"] == "final",
            })
            .collect();
        assert_eq!(ferrite_messages(&f, h, &ids), want, "{name}");
    }
}
