//! The fuzz targets: everything that parses input ferrite does not control. Loading a model
//! must end in a model or an error, never a panic; so must building a tokenizer, rendering a
//! chat template, reading an OpenAI request body and validating a gRPC request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_fuzz::{Target, fuzz};
use ferrite_gateway::grpc::{constraint_of, tools_of};
use ferrite_gateway::models::ModelText;
use ferrite_gateway::openai::{ChatRequest, CompletionRequest, chat_message, completion_prompts};
use ferrite_gateway::validate::{Prompt, validate};
use ferrite_proto::v1 as api;
use ferrite_proto::worker::v1 as pb;
use ferrite_text::{ChatMessage, ChatTemplate, Tokenizer};
use prost::Message;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A scratch directory of this test process.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-fuzz-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn gguf_files_load_or_fail_cleanly() {
    let dir = scratch("gguf");
    let file = dir.join("model.gguf");
    let target = Target {
        name: "gguf",
        // A Qwen2 with a byte-level tokenizer, and a Llama; metadata and tensor infos come
        // first, where the mutations mostly land.
        corpus: vec![
            read(&fixtures().join("models/qwen2/model.gguf")),
            read(&fixtures().join("models/llama2_tied/model.gguf")),
        ],
        focus: 16 << 10,
    };
    fuzz(target, |input| {
        std::fs::write(&file, input).expect("write");
        let _ = ferrite_engine::model::load(&file);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn safetensors_checkpoints_load_or_fail_cleanly() {
    let dir = scratch("safetensors");
    let config = read(&fixtures().join("models/qwen2/config.json"));
    std::fs::write(dir.join("config.json"), &config).expect("config");
    let weights = read(&fixtures().join("models/qwen2/model.safetensors"));
    // The 8-byte header length and the JSON header after it.
    let header = 8 + u64::from_le_bytes(weights[..8].try_into().expect("8 bytes")) as usize;
    let target = Target {
        name: "safetensors",
        corpus: vec![weights],
        focus: header,
    };
    fuzz(target, |input| {
        std::fs::write(dir.join("model.safetensors"), input).expect("write");
        let _ = ferrite_engine::model::load(&dir);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn model_configs_load_or_fail_cleanly() {
    let dir = scratch("config");
    std::fs::copy(
        fixtures().join("models/qwen2/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .expect("weights");
    let corpus = ["qwen2", "qwen3", "gemma2", "llama31", "mistral"]
        .map(|m| read(&fixtures().join(format!("models/{m}/config.json"))))
        .to_vec();
    fuzz(
        Target {
            name: "config",
            corpus,
            focus: 0,
        },
        |input| {
            std::fs::write(dir.join("config.json"), input).expect("write");
            let _ = ferrite_engine::model::load(&dir);
        },
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The byte-level tokenizer of the Qwen2 fixture, as tokenizer.json.
fn tokenizer_json() -> Vec<u8> {
    let loaded =
        ferrite_engine::model::load(&fixtures().join("models/qwen2/model.gguf")).expect("fixture");
    let tokenizer = loaded.tokenizer.expect("the fixture has a tokenizer");
    tokenizer.to_tokenizer_json().expect("json").into_bytes()
}

#[test]
fn tokenizers_build_encode_and_decode_or_fail_cleanly() {
    let corpus = vec![tokenizer_json()];
    fuzz(
        Target {
            name: "tokenizer",
            corpus,
            focus: 0,
        },
        |input| {
            let Ok(t) = Tokenizer::from_tokenizer_json(input, None) else {
                return;
            };
            for text in ["Hello, world!", "naïve café — 東京 🚀", ""] {
                if let Ok(ids) = t.encode(text, true) {
                    let _ = t.decode(&ids, false);
                }
            }
            let _ = t.decode(&[0, 1, 255, u32::MAX], true);
        },
    );
}

const TEMPLATES: [&str; 3] = [
    // ChatML (Qwen, SmolLM2).
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    // Llama 3.
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    // Gemma: roles checked, with raise_exception.
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}{{ '<start_of_turn>' + message['role'] + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}",
];

#[test]
fn chat_templates_compile_and_render_or_fail_cleanly() {
    let corpus = TEMPLATES.map(|t| t.as_bytes().to_vec()).to_vec();
    let messages = [
        ChatMessage::new("user", "Hi {{ there }}"),
        ChatMessage::new("assistant", "Hello"),
    ];
    fuzz(
        Target {
            name: "chat_template",
            corpus,
            focus: 0,
        },
        |input| {
            let source = String::from_utf8_lossy(input);
            if let Ok(t) = ChatTemplate::new(source, Some("<s>"), Some("</s>")) {
                let _ = t.render(&messages, true);
            }
        },
    );
}

#[test]
fn openai_bodies_parse_or_fail_cleanly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/openai");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("corpus")
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    files.sort();
    let corpus = files.iter().map(|p| read(p)).collect();
    fuzz(
        Target {
            name: "openai",
            corpus,
            focus: 0,
        },
        |input| {
            if let Ok(req) = serde_json::from_slice::<CompletionRequest>(input) {
                let _ = completion_prompts(&req.prompt);
                let _ = req.common.sampling();
                let _ = req.common.constraint();
            }
            if let Ok(req) = serde_json::from_slice::<ChatRequest>(input) {
                for m in &req.messages {
                    let _ = chat_message(m);
                }
                let _ = req.common.sampling();
                let _ = req.common.constraint();
                let _ = req.common.tools();
            }
        },
    );
}

/// A model of 8 words, a context of 16 tokens and a chat template, as a gateway holds it.
fn small_model() -> Arc<ModelText> {
    let tokenizer = serde_json::json!({
        "version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": { "type": "Whitespace" }, "post_processor": null, "decoder": null,
        "model": { "type": "WordLevel", "unk_token": "<unk>",
            "vocab": { "<unk>": 0, "a": 1, "b": 2, "c": 3, "user": 4, ":": 5, "x": 6, "y": 7 } }
    });
    let info = pb::ModelInfo {
        model: "m".into(),
        tokenizer_json: tokenizer.to_string(),
        chat_template: Some(TEMPLATES[0].into()),
        vocab_size: 8,
        max_model_len: 16,
        ..pb::ModelInfo::default()
    };
    Arc::new(ModelText::from_info(info).expect("model text"))
}

#[test]
fn grpc_requests_decode_and_validate_or_fail_cleanly() {
    let sampling = api::SamplingParams {
        max_tokens: Some(4),
        temperature: Some(0.7),
        top_p: Some(0.9),
        stop: vec!["b".into()],
        logprobs: Some(2),
        ..api::SamplingParams::default()
    };
    let prompts = [
        api::generate_request::Prompt::Text("a b c".into()),
        api::generate_request::Prompt::TokenIds(api::TokenIds { ids: vec![1, 2, 7] }),
        api::generate_request::Prompt::Chat(api::ChatMessages {
            messages: vec![api::ChatMessage {
                role: "user".into(),
                content: "x y".into(),
                ..Default::default()
            }],
        }),
    ];
    let corpus = prompts
        .into_iter()
        .map(|p| {
            api::GenerateRequest {
                model: "m".into(),
                prompt: Some(p),
                sampling: Some(sampling.clone()),
                constraint: Some(api::generate_request::Constraint::Regex("[a-c ]+".into())),
                tools: vec![api::Tool {
                    name: "f".into(),
                    parameters: r#"{"type": "object"}"#.into(),
                    ..Default::default()
                }],
                tool_choice: "auto".into(),
                chat_template_kwargs: r#"{"enable_thinking": false}"#.into(),
                ..Default::default()
            }
            .encode_to_vec()
        })
        .collect();
    let model = small_model();
    fuzz(
        Target {
            name: "grpc_request",
            corpus,
            focus: 0,
        },
        |input| {
            let Ok(req) = api::GenerateRequest::decode(input) else {
                return;
            };
            let _ = tools_of(req.tools, &req.tool_choice, req.parallel_tool_calls);
            let constraint = req.constraint.map(constraint_of).transpose();
            if let (Ok(prompt), Ok(constraint)) = (
                Prompt::from_proto(req.prompt, &req.chat_template_kwargs),
                constraint,
            ) {
                let _ = validate(
                    model.clone(),
                    16,
                    &prompt,
                    req.sampling,
                    constraint.as_ref(),
                    None,
                );
            }
        },
    );
}
