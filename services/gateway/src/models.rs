//! What the gateway knows of each model's text side, fetched once from a pool over
//! `GetModelInfo`: the gateway needs no model files.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use ferrite_proto::worker::v1 as pb;
use ferrite_structured::{TokenBytes, Vocabulary};
use ferrite_text::{Reasoning, ScoreTemplate, TemplateKwargs, Tokenizer};
use tokio::sync::OnceCell;

use crate::error::GatewayError;
use crate::pools::Pool;

/// A model's tokenizer and vocabulary. (Its context length is each pool's: see
/// [`crate::pools::PoolView::models`] and routing.)
#[derive(Debug)]
pub struct ModelText {
    /// The name requests ask for it by: a model's, or a LoRA adapter's.
    pub name: String,
    /// Requests for `name` run with this LoRA adapter of the pool's model.
    pub lora: Option<String>,
    pub tokenizer: Tokenizer,
    pub vocab_size: usize,
    /// Whether text prompts are encoded with the tokenizer's special tokens (BOS).
    pub add_special_tokens: bool,
    /// The pool's digest of this text side (`None` from workers that send none): requests
    /// tokenized here go only to pools advertising the same.
    pub digest: Option<String>,
    /// What requests that leave a sampling field unset get (the model's recommendation).
    pub sampling_defaults: ferrite_proto::v1::SamplingDefaults,
    /// A sequence classifier's labels (`ModelInfo.labels`); empty for a generative model.
    pub labels: Vec<String>,
    /// How a reranker's (query, document) pair becomes its prompt (`ModelInfo.score_template`);
    /// `None`: joined as the tokenizer joins a pair.
    pub score_template: Option<ScoreTemplate>,
    /// A reasoning model's markers (`ModelInfo.reasoning_parser`): its chats' outputs come
    /// apart into thinking and answer.
    pub reasoning: Option<Reasoning>,
    /// What the chat template gets unless a request sets it (`ModelInfo.
    /// default_chat_template_kwargs`).
    pub template_kwargs: TemplateKwargs,
    tokenizer_json: String,
    eos_token_ids: Vec<u32>,
    /// Each token's bytes (for log-probabilities), read on first use.
    token_bytes: OnceLock<Option<TokenBytes>>,
    /// The grammar compiler, made by the first constrained request (or why there is none).
    vocabulary: OnceLock<Result<Vocabulary, String>>,
    /// Whether JSON schemas get bounds where they leave strings, arrays and free values
    /// unbounded (`--json-schema-bounds`; see `ferrite_structured`'s `bounds.rs`).
    pub json_bounds: bool,
}

impl ModelText {
    /// `text`'s ids, with the tokenizer's special tokens (BOS) where `add_special_tokens` says,
    /// else where the model adds them to text prompts.
    pub fn encode_text(
        &self,
        text: &str,
        add_special_tokens: Option<bool>,
    ) -> Result<Vec<u32>, ferrite_text::TextError> {
        let add = add_special_tokens.unwrap_or(self.add_special_tokens);
        self.tokenizer.encode(text, add)
    }

    /// Each token's bytes, where the tokenizer's vocabulary can say them.
    pub fn token_bytes(&self) -> Option<&TokenBytes> {
        self.token_bytes
            .get_or_init(|| TokenBytes::from_tokenizer_json(&self.tokenizer_json).ok())
            .as_ref()
    }

    /// The model's grammar compiler, made on first use (a blocking call: tens of
    /// milliseconds the first time).
    pub fn vocabulary(&self) -> Result<&Vocabulary, GatewayError> {
        self.vocabulary
            .get_or_init(|| {
                let bytes = self
                    .token_bytes()
                    .ok_or("its tokenizer has no byte vocabulary")?;
                Vocabulary::new(
                    bytes,
                    self.tokenizer.clone(),
                    &self.eos_token_ids,
                    self.vocab_size,
                )
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|why| {
                GatewayError::InvalidArgument(format!(
                    "model `{}` cannot constrain its outputs: {why}",
                    self.name
                ))
            })
    }
}

impl ModelText {
    pub fn from_info(info: pb::ModelInfo) -> Result<Self, GatewayError> {
        let score_template = (info.score_template.as_deref())
            .map(|t| ScoreTemplate::new(t, info.bos_token.as_deref(), info.eos_token.as_deref()))
            .transpose()
            .map_err(|e| {
                GatewayError::Internal(format!(
                    "the score template of `{}` from its pool: {e}",
                    info.model
                ))
            })?;
        let mut config = serde_json::Map::new();
        if let Some(b) = info.bos_token {
            config.insert("bos_token".into(), b.into());
        }
        if let Some(e) = info.eos_token {
            config.insert("eos_token".into(), e.into());
        }
        if let Some(t) = info.chat_template {
            config.insert("chat_template".into(), t.into());
        }
        let tokenizer =
            Tokenizer::from_tokenizer_json(info.tokenizer_json.as_bytes(), Some(&config.into()))
                .map_err(|e| {
                    GatewayError::Internal(format!(
                        "the tokenizer of `{}` from its pool: {e}",
                        info.model
                    ))
                })?;
        let from_pool = |what: &str, e: ferrite_text::TextError| {
            GatewayError::Internal(format!("the {what} of `{}` from its pool: {e}", info.model))
        };
        let reasoning = (info.reasoning_parser.as_deref())
            .map(|name| Reasoning::new(name, &tokenizer))
            .transpose()
            .map_err(|e| from_pool("reasoning parser", e))?;
        let template_kwargs = (info.default_chat_template_kwargs.as_deref())
            .map(ferrite_text::chat::parse_kwargs)
            .transpose()
            .map_err(|e| from_pool("chat template kwargs", e))?
            .unwrap_or_default();
        Ok(Self {
            name: info.model,
            lora: None,
            tokenizer,
            vocab_size: info.vocab_size as usize,
            add_special_tokens: info.add_special_tokens,
            digest: Some(info.text_digest).filter(|d| !d.is_empty()),
            sampling_defaults: info.sampling_defaults.unwrap_or_default(),
            labels: info.labels,
            score_template,
            reasoning,
            template_kwargs,
            tokenizer_json: info.tokenizer_json,
            eos_token_ids: info.eos_token_ids,
            token_bytes: OnceLock::new(),
            vocabulary: OnceLock::new(),
            json_bounds: false,
        })
    }
}

/// Model text by name, fetched on first use from a pool, and again when the pools of that
/// model come back with a different text side (digest).
#[derive(Debug, Default)]
pub struct ModelTexts {
    // A std mutex: held only to find or replace an entry, never across the fetch, so one
    // model's fetch does not hold up requests for the others.
    entries: std::sync::Mutex<HashMap<String, Arc<Entry>>>,
    /// Given to every text fetched (see [`ModelText::json_bounds`]).
    json_bounds: bool,
}

/// One model's text side under one digest. Concurrent first requests wait for one fetch; a
/// failed fetch leaves the cell empty for the next request to try again.
#[derive(Debug)]
struct Entry {
    digest: Option<String>,
    text: OnceCell<Arc<ModelText>>,
}

/// The digest most of `pools` advertise (ties: the smallest), which requests are tokenized
/// under while pools of different text sides serve one name (a rolling upgrade).
pub fn majority_digest(pools: &[Pool]) -> Option<String> {
    let mut counts: HashMap<Option<&str>, usize> = HashMap::new();
    for p in pools {
        *counts.entry(p.record.text_digest.as_deref()).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|(da, na), (db, nb)| na.cmp(nb).then(db.cmp(da)))
        .and_then(|(d, _)| d.map(str::to_owned))
}

impl ModelTexts {
    /// Texts whose JSON schemas get bounds (see [`ModelText::json_bounds`]) when `on`.
    pub fn with_json_bounds(on: bool) -> Self {
        Self {
            json_bounds: on,
            ..Self::default()
        }
    }

    /// The text side of `model`, asking `pools` (ready pools of that model) if not cached
    /// under the digest they advertise.
    pub async fn get(&self, model: &str, pools: &[Pool]) -> Result<Arc<ModelText>, GatewayError> {
        let digest = majority_digest(pools);
        let entry = {
            let mut entries = self
                .entries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let fresh = || {
                Arc::new(Entry {
                    digest: digest.clone(),
                    text: OnceCell::new(),
                })
            };
            let e = entries.entry(model.to_owned()).or_insert_with(fresh);
            if e.digest != digest {
                tracing::info!(%model, old = ?e.digest, new = ?digest, "the model's text side changed: fetching it again");
                *e = fresh();
            }
            e.clone()
        };
        let text = entry
            .text
            .get_or_try_init(|| fetch(model, digest.as_deref(), pools, self.json_bounds))
            .await?;
        Ok(text.clone())
    }
}

/// Asks the pools advertising `digest` for the model's text side, until one answers.
async fn fetch(
    model: &str,
    digest: Option<&str>,
    pools: &[Pool],
    json_bounds: bool,
) -> Result<Arc<ModelText>, GatewayError> {
    let mut last_err = GatewayError::ModelNotFound(model.to_owned());
    for pool in pools
        .iter()
        .filter(|p| p.record.text_digest.as_deref() == digest)
    {
        let mut client = pool.client.clone();
        match client.get_model_info(pb::GetModelInfoRequest {}).await {
            Ok(info) => {
                let info = info.into_inner();
                // An adapter's requests are tokenized as its model's, and run with it.
                let lora = (info.model != model && info.lora.iter().any(|l| l == model))
                    .then(|| model.to_owned());
                let text = ModelText::from_info(info)?;
                return Ok(Arc::new(ModelText {
                    name: model.to_owned(),
                    lora,
                    json_bounds,
                    ..text
                }));
            }
            Err(s) => last_err = GatewayError::from_worker(&s),
        }
    }
    Err(last_err)
}

/// A model for unit tests: a word-level tokenizer of 8 words (`<unk> a b c user : x y`), a
/// context of 16 tokens, a chat template, and text digest `d1`.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub fn word_model() -> Arc<ModelText> {
        word_model_with(ferrite_proto::v1::SamplingDefaults::default())
    }

    /// [`word_model`] whose pools recommend `defaults`.
    pub fn word_model_with(defaults: ferrite_proto::v1::SamplingDefaults) -> Arc<ModelText> {
        word_model_of(
            defaults,
            "{% for m in messages %}{{ m.role }} : {{ m.content }} {% endfor %}",
        )
    }

    /// [`word_model`] with its chat `template`.
    pub fn word_model_of(
        defaults: ferrite_proto::v1::SamplingDefaults,
        template: &str,
    ) -> Arc<ModelText> {
        let info = pb::ModelInfo {
            text_digest: "d1".into(),
            sampling_defaults: Some(defaults),
            ..word_info(template, &[])
        };
        Arc::new(ModelText::from_info(info).expect("model text"))
    }

    /// A reasoning model: [`word_model`]'s words and `<think>` (8) and `</think>` (9), served
    /// with reasoning `parser`, and a chat template that closes the block empty where
    /// `enable_thinking` is false (as Qwen3's does).
    pub fn think_model(parser: &str) -> Arc<ModelText> {
        think_model_with(parser, None)
    }

    /// [`think_model`] whose template variables default to `kwargs` (JSON text).
    pub fn think_model_with(parser: &str, kwargs: Option<&str>) -> Arc<ModelText> {
        let template = "{% for m in messages %}{{ m.role }} : {{ m.content }} {% endfor %}\
            {% if enable_thinking is defined and not enable_thinking %}<think> </think>{% endif %}";
        let info = pb::ModelInfo {
            reasoning_parser: Some(parser.into()),
            default_chat_template_kwargs: kwargs.map(str::to_owned),
            ..word_info(template, &["<think>", "</think>"])
        };
        Arc::new(ModelText::from_info(info).expect("model text"))
    }

    /// A file of `tests/fixtures` (made by the scripts there).
    pub fn fixture(path: &str) -> String {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/");
        std::fs::read_to_string(format!("{root}{path}")).expect("a fixture")
    }

    /// The gpt-oss-shaped template the cluster tests serve (`gpt_oss_chat`'s, made by
    /// `generate_gpt_oss_chat.py`): tools as JSON in a developer message, past calls (and the
    /// `thinking` before them) and their results as gpt-oss writes them, and
    /// `<|start|>assistant` last.
    fn harmony_template() -> String {
        fixture("models/gpt_oss_chat/chat_template.jinja")
    }

    /// gpt-oss's own vocabulary, o200k_harmony (every id the real one; cut down to what
    /// `harmony_reference.json`'s outputs use, with every special token and byte), served
    /// with `openai_gptoss` and [`harmony_template`].
    pub fn o200k_model() -> Arc<ModelText> {
        let info = pb::ModelInfo {
            model: "gpt-oss".into(),
            tokenizer_json: fixture("text/o200k_harmony_subset.json"),
            chat_template: Some(harmony_template()),
            vocab_size: 201_088,
            max_model_len: 4096,
            eos_token_ids: vec![200_002, 200_012],
            reasoning_parser: Some("openai_gptoss".into()),
            ..pb::ModelInfo::default()
        };
        Arc::new(ModelText::from_info(info).expect("model text"))
    }

    /// gpt-oss's format over a byte-level vocabulary (id = byte): `<|start|>` 256,
    /// `<|channel|>` 257, `<|constrain|>` 258, `<|message|>` 259, `<|end|>` 260, `<|call|>`
    /// 261 and `<|return|>` 262 (special tokens, as gpt-oss's are), then `final` 263 and
    /// `analysis` 264 (words of one token each, as in its vocabulary). Served with
    /// `openai_gptoss`, ending on `<|return|>` or `<|call|>`, with [`harmony_template`].
    pub fn harmony_model() -> Arc<ModelText> {
        let special = [
            "<|start|>",
            "<|channel|>",
            "<|constrain|>",
            "<|message|>",
            "<|end|>",
            "<|call|>",
            "<|return|>",
        ];
        let contents: Vec<&str> = special.into_iter().chain(["final", "analysis"]).collect();
        let info = pb::ModelInfo {
            model: "m".into(),
            tokenizer_json: byte_level_json(&contents, |c| c.starts_with("<|")),
            chat_template: Some(harmony_template()),
            vocab_size: 265,
            max_model_len: 4096,
            eos_token_ids: vec![262, 261],
            reasoning_parser: Some("openai_gptoss".into()),
            ..pb::ModelInfo::default()
        };
        Arc::new(ModelText::from_info(info).expect("model text"))
    }

    /// A model whose tool calls follow `marker` as a JSON list (Mistral's `[TOOL_CALLS]` or
    /// Granite's `<|tool_call|>`, named by its chat template) over a byte-level vocabulary
    /// (id = byte): `[TOOL_CALLS]` 256, `<|tool_call|>` 257 and `</s>` 258, special tokens as
    /// in those models' tokenizers, `</s>` ending the output.
    pub fn marker_model(marker: &str) -> Arc<ModelText> {
        let template = format!(
            "{{% if tools %}}{{{{ tools | tojson }}}}{{% endif %}}{{% for m in messages %}}\
             {{% if m.tool_calls %}}{marker}{{{{ m.tool_calls | tojson }}}}\
             {{% else %}}{{{{ m.content }}}}{{% endif %}}{{% endfor %}}"
        );
        let info = pb::ModelInfo {
            model: "m".into(),
            tokenizer_json: byte_level_json(&["[TOOL_CALLS]", "<|tool_call|>", "</s>"], |_| true),
            chat_template: Some(template),
            vocab_size: 259,
            max_model_len: 4096,
            eos_token_ids: vec![258],
            ..pb::ModelInfo::default()
        };
        Arc::new(ModelText::from_info(info).expect("model text"))
    }

    /// A byte-level `tokenizer.json` (id = byte) with added tokens `contents` from id 256 on,
    /// each `special` or not.
    fn byte_level_json(contents: &[&str], special: impl Fn(&str) -> bool) -> String {
        let vocab = ferrite_text::GgufVocab::byte_level();
        let json = Tokenizer::from_gguf_vocab(vocab)
            .and_then(|t| t.to_tokenizer_json())
            .expect("a byte-level tokenizer");
        let mut json: serde_json::Value = serde_json::from_str(&json).expect("its json");
        json["added_tokens"] = added_tokens(256, contents, special).into();
        json.to_string()
    }

    /// `tokenizer.json`'s entries of added tokens `contents`, from id `first` on, each
    /// `special` or not.
    fn added_tokens(
        first: usize,
        contents: &[&str],
        special: impl Fn(&str) -> bool,
    ) -> Vec<serde_json::Value> {
        (contents.iter().enumerate())
            .map(|(i, &content)| {
                serde_json::json!({ "id": first + i, "content": content,
                    "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": special(content) })
            })
            .collect()
    }

    /// A model `m` of a word-level tokenizer of 8 words (`<unk> a b c user : x y`) and
    /// `added` after them (added tokens, not special), a context of 16 tokens and a chat
    /// `template`.
    fn word_info(template: &str, added: &[&str]) -> pb::ModelInfo {
        let words = ["<unk>", "a", "b", "c", "user", ":", "x", "y"];
        let vocab: serde_json::Map<String, serde_json::Value> = (words.iter().chain(added))
            .enumerate()
            .map(|(id, w)| ((*w).to_owned(), id.into()))
            .collect();
        let tokenizer = serde_json::json!({
            "version": "1.0",
            "added_tokens": added_tokens(words.len(), added, |_| false),
            "normalizer": null,
            "pre_tokenizer": { "type": "Whitespace" },
            "post_processor": null,
            "decoder": null,
            "model": { "type": "WordLevel", "unk_token": "<unk>", "vocab": vocab }
        });
        pb::ModelInfo {
            model: "m".into(),
            tokenizer_json: tokenizer.to_string(),
            chat_template: Some(template.into()),
            vocab_size: (words.len() + added.len()) as u32,
            max_model_len: 16,
            ..pb::ModelInfo::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::testing::pool;

    #[tokio::test]
    async fn requests_are_tokenized_under_the_digest_most_pools_advertise() {
        assert_eq!(majority_digest(&[]), None);
        let one = [pool("a", 0, Some("d1"))];
        assert_eq!(majority_digest(&one).as_deref(), Some("d1"));
        let upgrade = [
            pool("a", 0, Some("d1")),
            pool("b", 0, Some("d2")),
            pool("c", 0, Some("d2")),
        ];
        assert_eq!(majority_digest(&upgrade).as_deref(), Some("d2"));
        let tie = [pool("a", 0, Some("d2")), pool("b", 0, Some("d1"))];
        assert_eq!(majority_digest(&tie).as_deref(), Some("d1"));
    }

    #[tokio::test]
    async fn a_failed_fetch_is_not_cached_and_names_the_fault() {
        // The pool's port is closed: the fetch fails as the server's fault, not the client's.
        let texts = ModelTexts::default();
        let pools = [pool("a", 0, Some("d1"))];
        for _ in 0..2 {
            let err = texts.get("m", &pools).await.expect_err("nothing listens");
            assert!(err.retryable(), "{err:?}");
        }
    }
}
