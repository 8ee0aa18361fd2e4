//! The default model's tokenizer (SmolLM2-135M-Instruct GGUF: byte-level BPE,
//! `pre = smollm`) against reference ids and chat renders produced by Hugging
//! Face transformers (`tests/fixtures/text/generate.py`).

mod common;

use std::sync::OnceLock;

use common::{fixture, gguf_path, gguf_vocab, ids, stream_decode};
use ferrite_text::{ChatMessage, ChatTemplate, StopMatcher, TextError, Tokenizer};
use serde_json::Value;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        Tokenizer::from_gguf_vocab(gguf_vocab(&gguf_path())).expect("build SmolLM2 tokenizer")
    })
}

fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| fixture("smollm2_reference.json"))
}

fn cases() -> impl Iterator<Item = (&'static str, &'static Value)> {
    reference()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| (c["text"].as_str().expect("text"), c))
}

/// Reference policy: llama.cpp's ids (llama-cpp-python) when the fixture has
/// them, and always the original SmolLM2 pipeline (`Digits` split, then
/// GPT-2 ByteLevel), which is what `pre = smollm` means. transformers' GGUF
/// converter drops the digit split, so its ids are only expected to match
/// where they agree with that pipeline; the generator records the
/// disagreement (non-ASCII numerals like "½", "٣", "①").
#[test]
fn encode_matches_reference_ids() {
    let tok = tokenizer();
    let mut failures = Vec::new();
    let mut transformers_disagrees = Vec::new();
    let mut llama_checked = 0;
    for (text, case) in cases() {
        let got = tok.encode(text, false).expect("encode");
        let original = ids(&case["original_pipeline_ids"]);
        let mut refs = vec![("original_pipeline_ids", original.clone())];
        if let Some(v) = case.get("llama_cpp_ids") {
            refs.push(("llama_cpp_ids", ids(v)));
            llama_checked += 1;
        }
        let transformers = ids(&case["transformers_ids"]);
        if transformers == original {
            refs.push(("transformers_ids", transformers));
        } else {
            transformers_disagrees.push(text);
        }
        for (name, want) in refs {
            if got != want {
                failures.push(format!("{name} {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        llama_checked > 0,
        "fixture lacks llama.cpp ids; regenerate with llama-cpp-python"
    );
    assert!(
        transformers_disagrees.len() <= 1,
        "transformers now disagrees on more strings: {transformers_disagrees:?}"
    );
}

#[test]
fn decode_matches_reference_and_round_trips() {
    let tok = tokenizer();
    for (text, case) in cases() {
        let ids = ids(&case["transformers_ids"]);
        assert_eq!(
            tok.decode(&ids, false).expect("decode"),
            case["transformers_decoded"].as_str().expect("decoded"),
            "decode {text:?}"
        );
        assert_eq!(
            tok.decode(&ids, true).expect("decode"),
            case["transformers_decoded_skip_special"]
                .as_str()
                .expect("decoded"),
            "decode(skip_special) {text:?}"
        );
        let round = tok.decode(&tok.encode(text, false).expect("encode"), false);
        assert_eq!(round.expect("decode"), text, "round trip");
    }
}

#[test]
fn decode_stream_deltas_concatenate_to_full_decode() {
    let tok = tokenizer();
    let mut saw_split_char = false;
    for (text, _) in cases() {
        let ids = tok.encode(text, false).expect("encode");
        for skip in [false, true] {
            let (streamed, deltas) = stream_decode(tok, &ids, skip);
            assert_eq!(
                streamed,
                tok.decode(&ids, skip).expect("decode"),
                "stream {text:?} skip={skip}"
            );
            // A token that ends mid-character must yield an empty delta
            // rather than a replacement character.
            assert!(
                deltas.iter().all(|d| !d.contains('\u{FFFD}')),
                "{text:?}: {deltas:?}"
            );
            saw_split_char |= deltas.iter().any(String::is_empty);
        }
    }
    assert!(
        saw_split_char,
        "fixtures should include characters split across tokens (emoji, CJK)"
    );
}

#[test]
fn special_tokens_and_ids() {
    let tok = tokenizer();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    // EOS (<|im_end|>) first, then <|endoftext|> from llama.cpp's EOG list.
    assert_eq!(tok.eos_ids(), &[2, 0]);
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert!(tok.is_special(1));
    assert!(!tok.is_special(tok.token_to_id("Hello").expect("Hello in vocab")));
    assert_eq!(tok.encode("<|im_start|>", false).expect("encode"), vec![1]);
    // add_bos_token is false in this GGUF.
    assert_eq!(
        tok.encode("hi", true).expect("encode"),
        tok.encode("hi", false).expect("encode")
    );
    assert_eq!(
        reference()["bos_token"].as_str(),
        tok.bos_token(),
        "transformers agrees on BOS"
    );
}

fn conversation(i: u64) -> Vec<ChatMessage> {
    serde_json::from_value(reference()["conversations"][i as usize].clone()).expect("conversation")
}

#[test]
fn chat_templates_render_like_transformers() {
    let tok = tokenizer();
    let r = reference();
    let bos = r["bos_token"].as_str();
    let eos = r["eos_token"].as_str();
    let mut checked = 0;
    for render in r["renders"].as_array().expect("renders") {
        let name = render["template"].as_str().expect("template name");
        let template = if name == "model" {
            tok.chat_template()
                .expect("model has a chat template")
                .clone()
        } else {
            let src = r["extra_templates"][name]
                .as_str()
                .expect("template source");
            ChatTemplate::new(src, bos, eos).expect("compile")
        };
        let conv = conversation(render["conversation"].as_u64().expect("index"));
        let gen_prompt = render["add_generation_prompt"].as_bool().expect("flag");
        let got = template.render(&conv, gen_prompt);
        match (render.get("rendered"), got) {
            (Some(want), Ok(got)) => assert_eq!(got, want.as_str().expect("str"), "{render}"),
            (None, Err(e @ TextError::TemplateRender(_))) => {
                let want = render["error"].as_str().expect("error");
                assert!(e.to_string().contains(want), "{e} should mention {want}");
            }
            (_, got) => panic!("{render}: got {got:?}"),
        }
        checked += 1;
    }
    assert!(checked >= 6);
}

#[test]
fn rendered_prompt_encodes_with_special_tokens() {
    let tok = tokenizer();
    let msgs = [ChatMessage::new("user", "hi")];
    let prompt = tok
        .chat_template()
        .expect("template")
        .render(&msgs, true)
        .expect("render");
    let ids = tok.encode(&prompt, false).expect("encode");
    assert_eq!(ids[0], 1, "<|im_start|> is a single token");
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2, "two <|im_end|>");
}

#[test]
fn shipped_tokenizer_json_is_equivalent() {
    let tok = tokenizer();
    let json = tok.to_tokenizer_json().expect("to json");
    let config = tok.to_tokenizer_config();
    let shipped = Tokenizer::from_tokenizer_json(json.as_bytes(), Some(&config)).expect("reload");
    for (text, _) in cases() {
        assert_eq!(
            shipped.encode(text, true).expect("encode"),
            tok.encode(text, true).expect("encode"),
            "{text:?}"
        );
    }
    assert_eq!(shipped.eos_ids(), tok.eos_ids());
    assert_eq!(shipped.bos_id(), tok.bos_id());
    assert_eq!(shipped.vocab_size(), tok.vocab_size());
    let msgs = conversation(1);
    assert_eq!(
        shipped
            .chat_template()
            .expect("template")
            .render(&msgs, true)
            .expect("render"),
        tok.chat_template()
            .expect("template")
            .render(&msgs, true)
            .expect("render"),
    );
}

#[test]
fn stop_strings_over_streamed_tokens() {
    let tok = tokenizer();
    let text = "The answer is 42.\nUser: next question";
    let ids = tok.encode(text, false).expect("encode");
    let mut stream = tok.decode_stream(true);
    let mut stop = StopMatcher::new(["\nUser:"]);
    let mut out = String::new();
    let mut stopped = None;
    for &id in &ids {
        let delta = stream.step(id).expect("step");
        let o = stop.push(&delta);
        out.push_str(&o.text);
        if o.stopped.is_some() {
            stopped = o.stopped;
            break;
        }
    }
    assert_eq!(out, "The answer is 42.");
    assert_eq!(stopped.as_deref(), Some("\nUser:"));
}

#[test]
fn decode_rejects_out_of_range_ids() {
    let err = tokenizer().decode(&[5, 49152], false);
    match err {
        Err(e @ TextError::UnknownTokenId { id: 49152, .. }) => {
            assert_eq!(e.kind(), "unknown_token_id")
        }
        other => panic!("expected UnknownTokenId, got {other:?}"),
    }
}

/// A stream that keeps one special token (a tool format's marker) gives the text of a decode
/// without skipping, of the ids less the other special tokens; one that keeps none skips
/// them all, as a decode with skipping does.
#[test]
fn a_stream_keeps_the_special_tokens_it_is_told_to() {
    let tok = tokenizer();
    let (start, end) = (1, 2); // <|im_start|>, <|im_end|>: control tokens
    assert!(tok.is_special(start) && tok.is_special(end));
    let word = |s: &str| tok.encode(s, false).expect("encode");
    let ids: Vec<u32> = [
        word("Héllo"),
        vec![start],
        word(" world"),
        vec![end],
        word("!"),
    ]
    .concat();
    let streamed = |keep: Vec<u32>| {
        let mut s = tok.decode_stream(true).keeping(keep);
        let mut out: String = ids.iter().map(|&id| s.step(id).expect("step")).collect();
        out.push_str(&s.flush().expect("flush"));
        out
    };
    let without_end: Vec<u32> = ids.iter().copied().filter(|&id| id != end).collect();
    let kept = streamed(vec![start]);
    assert_eq!(kept, tok.decode(&without_end, false).expect("decode"));
    assert_eq!(kept, "Héllo<|im_start|> world!");
    assert_eq!(
        streamed(Vec::new()),
        tok.decode(&ids, true).expect("decode")
    );
}
