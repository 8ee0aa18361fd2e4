//! Bad inputs give typed errors with useful messages, never panics. Uses
//! small synthetic vocabularies, so no model file is needed.

use ferrite_text::{ChatTemplate, GgufVocab, TextError, Tokenizer};

/// A tiny byte-level BPE vocabulary: the letters of "hello" and two merges.
fn tiny_gpt2() -> GgufVocab {
    let tokens = [
        "<|endoftext|>",
        "h",
        "e",
        "l",
        "o",
        "he",
        "ll",
        "Ġ",
        "<|im_end|>",
    ];
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("gpt2".into()),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        token_types: Some(vec![3, 1, 1, 1, 1, 1, 1, 1, 3]),
        merges: Some(vec!["h e".into(), "l l".into()]),
        eos_id: Some(0),
        ..GgufVocab::default()
    }
}

fn expect_err<T: std::fmt::Debug>(r: Result<T, TextError>, kind: &str) -> TextError {
    match r {
        Err(e) => {
            assert_eq!(e.kind(), kind, "{e}");
            e
        }
        Ok(v) => panic!("expected {kind} error, got {v:?}"),
    }
}

#[test]
fn tiny_vocab_works() -> Result<(), TextError> {
    let tok = Tokenizer::from_gguf_vocab(tiny_gpt2())?;
    assert_eq!(tok.encode("hello", false)?, vec![5, 6, 4]);
    assert_eq!(tok.encode("hello<|im_end|>", false)?, vec![5, 6, 4, 8]);
    assert_eq!(tok.decode(&[5, 6, 4, 8], true)?, "hello");
    // EOS plus <|im_end|>, which is on the end-of-generation list.
    assert_eq!(tok.eos_ids(), &[0, 8]);
    assert_eq!(tok.bos_id(), None);
    Ok(())
}

#[test]
fn unknown_pre_tokenizer_lists_supported_ones() {
    let v = GgufVocab {
        pre: Some("mystery-bpe".into()),
        ..tiny_gpt2()
    };
    let e = expect_err(Tokenizer::from_gguf_vocab(v), "unknown_pre_tokenizer");
    let msg = e.to_string();
    assert!(msg.contains("mystery-bpe"), "{msg}");
    for name in [
        "default",
        "gpt2",
        "llama-bpe",
        "llama3",
        "smollm",
        "qwen2",
        "deepseek-llm",
    ] {
        assert!(msg.contains(name), "{msg} should list {name}");
    }
}

#[test]
fn missing_pre_falls_back_to_default_like_llama_cpp() -> Result<(), TextError> {
    let tok = Tokenizer::from_gguf_vocab(GgufVocab {
        pre: None,
        ..tiny_gpt2()
    })?;
    assert_eq!(tok.encode("hello", false)?, vec![5, 6, 4]);
    Ok(())
}

#[test]
fn every_supported_pre_builds() -> Result<(), TextError> {
    for pre in [
        "default",
        "gpt2",
        "gpt-2",
        "llama-bpe",
        "llama3",
        "smollm",
        "qwen2",
        "qwen35",
        "deepseek-llm",
        "deepseek-coder",
        "deepseek-v3",
        "falcon",
        "starcoder",
        "tekken",
        "gpt-4o",
        "poro-chat",
        "viking",
        "chatglm-bpe",
        "seed-coder",
        "bailingmoe",
    ] {
        let tok = Tokenizer::from_gguf_vocab(GgufVocab {
            pre: Some(pre.into()),
            ..tiny_gpt2()
        })?;
        assert_eq!(
            tok.decode(&tok.encode("hello hello", false)?, false)?,
            "hello hello",
            "{pre}"
        );
    }
    Ok(())
}

#[test]
fn unknown_model_type() {
    let v = GgufVocab {
        model: "bert".into(),
        ..tiny_gpt2()
    };
    let e = expect_err(Tokenizer::from_gguf_vocab(v), "unknown_tokenizer_model");
    assert!(e.to_string().contains("bert"));
    assert!(e.to_string().contains("gpt2, llama"));
}

#[test]
fn inconsistent_vocabularies() {
    let cases = [
        GgufVocab {
            merges: None,
            ..tiny_gpt2()
        },
        GgufVocab {
            tokens: vec![],
            ..tiny_gpt2()
        },
        GgufVocab {
            token_types: Some(vec![1, 1]),
            ..tiny_gpt2()
        },
        GgufVocab {
            eos_id: Some(1000),
            ..tiny_gpt2()
        },
        GgufVocab {
            tokens: vec!["a".into(), "a".into()],
            token_types: None,
            ..tiny_gpt2()
        },
        // SentencePiece without scores.
        GgufVocab {
            model: "llama".into(),
            ..tiny_gpt2()
        },
    ];
    for v in cases {
        expect_err(Tokenizer::from_gguf_vocab(v), "invalid_vocab");
    }
}

#[test]
fn bad_tokenizer_json() {
    expect_err(
        Tokenizer::from_tokenizer_json(b"{not json", None),
        "invalid_tokenizer_json",
    );
    expect_err(
        Tokenizer::from_tokenizer_json(br#"{"model": {"type": "Nope"}}"#, None),
        "invalid_tokenizer_json",
    );
    let json = Tokenizer::from_gguf_vocab(tiny_gpt2())
        .and_then(|t| t.to_tokenizer_json())
        .expect("tiny json");
    let bad_config = serde_json::json!({"chat_template": 42});
    expect_err(
        Tokenizer::from_tokenizer_json(json.as_bytes(), Some(&bad_config)),
        "invalid_tokenizer_json",
    );
}

#[test]
fn template_syntax_errors() {
    let e = expect_err(ChatTemplate::new("{% if %}", None, None), "template_syntax");
    assert!(e.to_string().contains("syntax"), "{e}");
    expect_err(
        Tokenizer::from_gguf_vocab(GgufVocab {
            chat_template: Some("{{ messages[0 }}".into()),
            ..tiny_gpt2()
        }),
        "template_syntax",
    );
}

#[test]
fn tokenizer_config_fields() -> Result<(), TextError> {
    let json = Tokenizer::from_gguf_vocab(tiny_gpt2())?.to_tokenizer_json()?;
    let config = serde_json::json!({
        "bos_token": {"content": "h", "special": true},
        "eos_token": "<|endoftext|>",
        "add_bos_token": true,
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"},
            {"name": "tool_use", "template": "tools:{{ tools }}"}
        ]
    });
    let tok = Tokenizer::from_tokenizer_json(json.as_bytes(), Some(&config))?;
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids(), &[0, 8]);
    // No post-processor in the JSON, so add_bos_token applies.
    assert_eq!(tok.encode("e", true)?, vec![1, 2]);
    assert_eq!(tok.encode("e", false)?, vec![2]);
    let msgs = [ferrite_text::ChatMessage::new("user", "x")];
    assert_eq!(
        tok.chat_template()
            .map(|t| t.render(&msgs, false))
            .transpose()?
            .as_deref(),
        Some("hx")
    );
    let tool = tok.chat_template_named("tool_use").expect("named template");
    assert_eq!(tool.render(&msgs, false)?, "tools:None");
    // The exported config carries both templates.
    let again = Tokenizer::from_tokenizer_json(
        tok.to_tokenizer_json()?.as_bytes(),
        Some(&tok.to_tokenizer_config()),
    )?;
    assert!(again.chat_template_named("tool_use").is_some());
    assert_eq!(again.encode("e", true)?, vec![1, 2]);
    // A separate chat_template.jinja replaces the default one.
    let mut again = again;
    again.set_chat_template("{{ eos_token }}")?;
    assert_eq!(
        again
            .chat_template()
            .map(|t| t.render(&msgs, true))
            .transpose()?
            .as_deref(),
        Some("<|endoftext|>")
    );
    expect_err(again.set_chat_template("{% endfor %}"), "template_syntax");
    Ok(())
}

/// A file's padding and truncation (sentence-transformers' tokenizers pad and cut at their
/// training length) are dropped: a prompt is neither padded nor cut short.
#[test]
fn a_files_padding_and_truncation_are_dropped() -> Result<(), TextError> {
    let json = Tokenizer::from_gguf_vocab(tiny_gpt2())?.to_tokenizer_json()?;
    let mut file: serde_json::Value = serde_json::from_str(&json).expect("json");
    file["truncation"] = serde_json::json!({"direction": "Right", "max_length": 2,
        "strategy": "LongestFirst", "stride": 0});
    file["padding"] = serde_json::json!({"strategy": {"Fixed": 8}, "direction": "Right",
        "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"});
    let tok = Tokenizer::from_tokenizer_json(file.to_string().as_bytes(), None)?;
    let plain = Tokenizer::from_tokenizer_json(json.as_bytes(), None)?;
    let ids = plain.encode("hello hello", false)?;
    assert!(ids.len() > 2 && ids.len() < 8, "{ids:?}");
    assert_eq!(tok.encode("hello hello", false)?, ids);
    Ok(())
}

/// `<|end|>` ends Phi-3's turn, but only a message of gpt-oss's (whose vocabulary also has
/// `<|return|>` and `<|call|>`, its outputs' two ends): llama.cpp's end-of-generation rule.
#[test]
fn harmony_ends_on_return_or_call_not_on_a_messages_end() -> Result<(), TextError> {
    let with = |specials: &[&str]| -> Result<Vec<u32>, TextError> {
        let mut v = tiny_gpt2();
        v.tokens.extend(specials.iter().map(|s| s.to_string()));
        let types = v.token_types.get_or_insert_with(Vec::new);
        types.extend(specials.iter().map(|_| 3));
        Ok(Tokenizer::from_gguf_vocab(v)?.eos_ids().to_vec())
    };
    assert_eq!(
        with(&["<|end|>"])?,
        [0, 8, 9],
        "Phi-3's turn ends on <|end|>"
    );
    let harmony = with(&["<|end|>", "<|return|>", "<|call|>"])?;
    assert_eq!(harmony, [0, 8, 10, 11]);
    Ok(())
}
