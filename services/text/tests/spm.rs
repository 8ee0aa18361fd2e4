//! `tokenizer.ggml.model = llama` (SentencePiece BPE) against `sentencepiece`
//! itself, on a tiny model trained by `tests/fixtures/text/generate.py`
//! (byte fallback, user-defined `<|im_start|>`/`<|im_end|>`).

mod common;

use common::{fixture, ids, spm_vocab, stream_decode};
use ferrite_text::{GgufVocab, Tokenizer};

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf_vocab(spm_vocab()).expect("build SPM tokenizer")
}

fn cases() -> Vec<(String, Vec<u32>, String)> {
    fixture("spm_reference.json")["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            (
                c["text"].as_str().expect("text").to_string(),
                ids(&c["ids"]),
                c["decoded"].as_str().expect("decoded").to_string(),
            )
        })
        .collect()
}

/// sentencepiece's ids for each fragment between special tokens, and
/// llama.cpp's ids for the whole string (recorded when llama-cpp-python was
/// available to the generator); the two agree on every fixture string.
#[test]
fn encode_matches_sentencepiece_and_llama_cpp() {
    let tok = tokenizer();
    let reference = fixture("spm_reference.json");
    let mut failures = Vec::new();
    let mut llama_checked = 0;
    for case in reference["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let got = tok.encode(text, false).expect("encode");
        let mut refs = vec![("sentencepiece", ids(&case["ids"]))];
        if let Some(v) = case.get("llama_cpp_ids") {
            refs.push(("llama.cpp", ids(v)));
            llama_checked += 1;
        }
        for (name, want) in refs {
            if got != want {
                let pieces: Vec<_> = got.iter().map(|&i| tok.id_to_token(i)).collect();
                failures.push(format!(
                    "{name} {text:?}\n  got  {got:?} {pieces:?}\n  want {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        llama_checked > 0,
        "fixture lacks llama.cpp ids; regenerate with llama-cpp-python"
    );
}

#[test]
fn decode_matches_sentencepiece_and_round_trips() {
    let tok = tokenizer();
    for (text, want_ids, want_text) in cases() {
        assert_eq!(tok.decode(&want_ids, false).expect("decode"), want_text);
        if !text.contains("<|") {
            let round = tok.decode(&tok.encode(&text, false).expect("encode"), true);
            assert_eq!(round.expect("decode"), text);
        }
    }
}

#[test]
fn bos_is_added_by_default_and_skipped_on_decode() {
    let tok = tokenizer();
    assert_eq!(tok.bos_id(), Some(1));
    // </s>, then the user-defined <|im_end|> (on the end-of-generation list).
    assert_eq!(tok.eos_ids(), &[2, 4]);
    let ids = tok.encode("Hello world", true).expect("encode");
    assert_eq!(ids[0], 1);
    assert_eq!(&ids[1..], tok.encode("Hello world", false).expect("encode"));
    assert_eq!(tok.decode(&ids, true).expect("decode"), "Hello world");
    assert_eq!(tok.decode(&ids, false).expect("decode"), "<s> Hello world");
    assert!(tok.is_special(1));
    // User-defined tokens are matched in text but are not "special".
    assert!(!tok.is_special(tok.token_to_id("<|im_end|>").expect("in vocab")));
}

#[test]
fn add_space_prefix_false_is_respected() {
    let tok = Tokenizer::from_gguf_vocab(GgufVocab {
        add_space_prefix: Some(false),
        ..spm_vocab()
    })
    .expect("build");
    let with = tokenizer().encode("Hello", false).expect("encode");
    let without = tok.encode("Hello", false).expect("encode");
    assert_ne!(with, without);
    assert_eq!(tok.decode(&without, false).expect("decode"), "Hello");
    assert_eq!(
        tok.decode(&tok.encode(" Hi", false).expect("e"), false)
            .expect("d"),
        " Hi"
    );
}

#[test]
fn decode_stream_matches_full_decode() {
    let tok = tokenizer();
    for (text, _, _) in cases() {
        for add_special in [false, true] {
            let ids = tok.encode(&text, add_special).expect("encode");
            for skip in [false, true] {
                let (streamed, deltas) = stream_decode(&tok, &ids, skip);
                assert_eq!(
                    streamed,
                    tok.decode(&ids, skip).expect("decode"),
                    "{text:?} bos={add_special} skip={skip}: {deltas:?}"
                );
            }
        }
    }
}

#[test]
fn byte_fallback_emoji_is_held_until_complete() {
    let tok = tokenizer();
    let ids = tok.encode("😀", false).expect("encode");
    // "▁" then four <0xNN> byte tokens.
    assert_eq!(ids.len(), 5, "{ids:?}");
    let (text, deltas) = stream_decode(&tok, &ids, true);
    assert_eq!(text, "😀");
    assert_eq!(deltas[..4].concat(), "", "no partial output: {deltas:?}");
    assert_eq!(deltas[4], "😀");
}

#[test]
fn leading_space_of_later_words_survives_streaming() {
    let tok = tokenizer();
    let ids = tok.encode("This License applies", true).expect("encode");
    let (_, deltas) = stream_decode(&tok, &ids, true);
    let words: Vec<&str> = deltas
        .iter()
        .map(String::as_str)
        .filter(|d| !d.is_empty())
        .collect();
    assert_eq!(words.concat(), "This License applies");
    assert!(
        words.iter().skip(1).any(|d| d.starts_with(' ')),
        "{words:?}"
    );
}

#[test]
fn shipped_tokenizer_json_is_equivalent() {
    let tok = tokenizer();
    let json = tok.to_tokenizer_json().expect("to json");
    let shipped = Tokenizer::from_tokenizer_json(json.as_bytes(), Some(&tok.to_tokenizer_config()))
        .expect("reload");
    for (text, _, _) in cases() {
        assert_eq!(
            shipped.encode(&text, true).expect("encode"),
            tok.encode(&text, true).expect("encode")
        );
    }
    assert_eq!(shipped.bos_id(), tok.bos_id());
    assert_eq!(shipped.eos_ids(), tok.eos_ids());
}
