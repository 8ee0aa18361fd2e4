//! [`Tokenizer`]: a `tokenizers::Tokenizer` plus what serving needs around it
//! (BOS/EOS ids, the end-of-generation set, the chat template).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::gguf::{self, GgufVocab};
use crate::{ChatTemplate, DecodeStream, TextError};

/// Token texts that end a generation when they exist as special tokens.
///
/// EOS alone is not enough: chat models end a turn with a template marker
/// (`<|im_end|>`, `<|eot_id|>`...) that is often not the configured EOS, and
/// base models of the same family emit `<|endoftext|>`. This is llama.cpp's
/// end-of-generation list (`special_eog_ids` in `llama-vocab.cpp`), applied
/// the same way: a name counts if the vocabulary has it as a control /
/// added token, whatever the template says.
const EOG_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",
    "<|call|>",
];

/// In gpt-oss's vocabulary (o200k_harmony) `<|end|>` ends a message, and the output goes
/// on with the next; the output ends on `<|return|>` (the answer) or `<|call|>` (a tool
/// call). llama.cpp's rule: a vocabulary with both of those does not end on `<|end|>`.
const HARMONY_ENDS: [&str; 2] = ["<|return|>", "<|call|>"];

/// Text ↔ token ids for one model. Cheap to clone (the vocabulary is shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    vocab_size: usize,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: Option<Arc<ChatTemplate>>,
    /// Named alternatives (`tool_use`, `rag`...) from a list-valued
    /// `chat_template`; the `default` one is `chat_template`.
    named_templates: Vec<(String, Arc<ChatTemplate>)>,
}

impl fmt::Debug for Tokenizer {
    // The derived form would print the whole vocabulary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// From a Hugging Face `tokenizer.json` and, optionally, the parsed
    /// `tokenizer_config.json` next to it, which supplies `bos_token`,
    /// `eos_token` (strings or `{"content": ...}` objects), `chat_template`
    /// (a string or a list of `{name, template}`) and `add_bos_token` /
    /// `add_eos_token`. The latter are only applied when `tokenizer.json` has
    /// no post-processor: when it has one, that is what HF uses too.
    pub fn from_tokenizer_json(
        json: &[u8],
        tokenizer_config: Option<&Value>,
    ) -> Result<Self, TextError> {
        // tokenizers 0.23 panics (an `expect` in its decoder deserializer) on some malformed
        // `decoder` objects, found by the fuzzer (tests/fuzz/regressions/tokenizer/): a bad
        // file must be an error, so the panic is caught here and reported as one.
        let parsed =
            std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(json)).map_err(|_| {
                TextError::InvalidTokenizerJson(
                    "tokenizer.json: malformed (the tokenizers library could not read it)".into(),
                )
            })?;
        let mut inner =
            parsed.map_err(|e| TextError::InvalidTokenizerJson(format!("tokenizer.json: {e}")))?;
        // Some files carry the padding and truncation of the batches they were trained with
        // (sentence-transformers' all-MiniLM pads and cuts at 128): a prompt is neither padded
        // (pads would join an encoder's mean) nor cut short without a word (its length is
        // checked against the context, and refused with a reason, where it is used).
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| TextError::InvalidTokenizerJson(format!("tokenizer.json: {e}")))?;
        let empty = json!({});
        let config = tokenizer_config.unwrap_or(&empty);
        if !config.is_object() {
            return Err(TextError::InvalidTokenizerJson(
                "tokenizer_config.json: expected an object".into(),
            ));
        }
        let bos_token = token_string(config.get("bos_token"));
        let eos_token = token_string(config.get("eos_token"));
        let bos_id = bos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let eos_id = eos_token.as_deref().and_then(|t| inner.token_to_id(t));

        if inner.get_post_processor().is_none() {
            let flag = |k: &str| config.get(k).and_then(Value::as_bool).unwrap_or(false);
            let bos = bos_token
                .as_deref()
                .zip(bos_id)
                .filter(|_| flag("add_bos_token"));
            let eos = eos_token
                .as_deref()
                .zip(eos_id)
                .filter(|_| flag("add_eos_token"));
            let pp = gguf::template_processing(bos, eos);
            if !pp.is_null() {
                let pp: tokenizers::PostProcessorWrapper = serde_json::from_value(pp)
                    .map_err(|e| TextError::InvalidTokenizerJson(format!("post-processor: {e}")))?;
                inner.with_post_processor(Some(pp));
            }
        }

        let (chat_template, named_templates) =
            parse_templates(config.get("chat_template"), &bos_token, &eos_token)?;
        Ok(Self::assemble(
            inner,
            bos_id,
            eos_id,
            bos_token,
            eos_token,
            chat_template,
            named_templates,
        ))
    }

    /// From the `tokenizer.*` metadata of a GGUF file (see [`GgufVocab`]).
    /// A chat template that does not compile is an error here rather than at
    /// the first chat request.
    pub fn from_gguf_vocab(v: GgufVocab) -> Result<Self, TextError> {
        let built = gguf::build(&v)?;
        let text_of = |id: Option<u32>| id.and_then(|id| v.tokens.get(id as usize).cloned());
        let bos_token = text_of(built.bos_id);
        let eos_token = text_of(built.eos_id);
        let chat_template = match &v.chat_template {
            Some(src) => Some(Arc::new(ChatTemplate::new(
                src.clone(),
                bos_token.as_deref(),
                eos_token.as_deref(),
            )?)),
            None => None,
        };
        Ok(Self::assemble(
            built.tokenizer,
            built.bos_id,
            built.eos_id,
            bos_token,
            eos_token,
            chat_template,
            Vec::new(),
        ))
    }

    fn assemble(
        inner: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        bos_token: Option<String>,
        eos_token: Option<String>,
        chat_template: Option<Arc<ChatTemplate>>,
        named_templates: Vec<(String, Arc<ChatTemplate>)>,
    ) -> Self {
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1);
        let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
        let mut added: Vec<(u32, String)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, t.content))
            .collect();
        added.sort_unstable();
        let harmony = (HARMONY_ENDS.iter()).all(|end| added.iter().any(|(_, c)| c == end));
        for (id, content) in &added {
            if EOG_TOKENS.contains(&content.as_str()) && !eos_ids.contains(id) {
                eos_ids.push(*id);
            }
        }
        if harmony {
            let message_end = added
                .iter()
                .find(|(_, c)| c == "<|end|>")
                .map(|(id, _)| *id);
            eos_ids.retain(|id| Some(*id) != message_end);
        }
        Self {
            inner: Arc::new(inner),
            vocab_size,
            bos_id,
            eos_ids,
            bos_token,
            eos_token,
            chat_template,
            named_templates,
        }
    }

    /// Text → ids. `add_special_tokens` applies the model's BOS/EOS rule;
    /// special tokens written in `text` (`<|im_start|>`) are always
    /// recognized as single tokens.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// Text → ids with the special tokens, at most `max` of them: the text's own tokens cut at
    /// its end to leave room for the special tokens around it, as transformers'
    /// `tokenizer(text, truncation=True, max_length=max)` and sentence-transformers cut.
    pub fn encode_at_most(&self, text: &str, max: usize) -> Result<Vec<u32>, TextError> {
        use tokenizers::{PostProcessor, TruncationDirection};
        let err = |e: tokenizers::Error| TextError::Tokenizer(e.to_string());
        let mut encoding = self.inner.encode_fast(text, false).map_err(err)?;
        let added = (self.inner.get_post_processor()).map_or(0, |p| p.added_tokens(false));
        encoding.truncate(max.saturating_sub(added), 0, TruncationDirection::Right);
        let encoding = self.inner.post_process(encoding, None, true).map_err(err)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// A pair of texts → ids, joined as the tokenizer's post-processor joins a pair
    /// (transformers' `tokenizer(text, text_pair)`: a cross-encoder's query and document,
    /// with its special tokens around and between them where it has any).
    pub fn encode_pair(&self, text: &str, pair: &str) -> Result<Vec<u32>, TextError> {
        self.inner
            .encode_fast((text, pair), true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// Ids → text. With `skip_special_tokens`, control tokens (BOS, EOS,
    /// chat markers) are left out, as in HF.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TextError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// An incremental decoder over this tokenizer.
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream {
        DecodeStream::new(self.clone(), skip_special_tokens)
    }

    /// Number of token ids (highest id + 1).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The BOS id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Ids that end generation: EOS first, then any of llama.cpp's
    /// end-of-generation tokens (`<|im_end|>`, `<|eot_id|>`,
    /// `<|endoftext|>`, ...) present as special or user-defined tokens.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The BOS token text.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS token text.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Id of a token text (model vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token text of an id, in the vocabulary's own form (`Ġhello`,
    /// `▁hello`, `<0x0A>`), not decoded.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .id_to_token(id)
            .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    /// The default chat template.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_deref()
    }

    /// A named chat template (`tool_use`, `rag`, or `default`) from a
    /// list-valued `chat_template`.
    pub fn chat_template_named(&self, name: &str) -> Option<&ChatTemplate> {
        if name == "default" {
            return self.chat_template();
        }
        self.named_templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_ref())
    }

    /// Replaces the default chat template, e.g. with the contents of a
    /// `chat_template.jinja` file (newer HF repositories keep it there
    /// instead of in `tokenizer_config.json`).
    pub fn set_chat_template(&mut self, source: &str) -> Result<(), TextError> {
        let t = ChatTemplate::new(source, self.bos_token(), self.eos_token())?;
        self.chat_template = Some(Arc::new(t));
        Ok(())
    }

    /// `tokenizer.json` for this tokenizer, so a worker can ship it to the
    /// gateway. Pass it with [`Tokenizer::to_tokenizer_config`] to
    /// [`Tokenizer::from_tokenizer_json`] to get an equivalent tokenizer.
    pub fn to_tokenizer_json(&self) -> Result<String, TextError> {
        self.inner
            .to_string(false)
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// The `tokenizer_config.json` fields this crate reads: `bos_token`,
    /// `eos_token` and `chat_template`. BOS/EOS insertion is already in the
    /// `tokenizer.json` post-processor, so `add_bos_token` is not repeated.
    pub fn to_tokenizer_config(&self) -> Value {
        let mut cfg = serde_json::Map::new();
        if let Some(b) = &self.bos_token {
            cfg.insert("bos_token".into(), json!(b));
        }
        if let Some(e) = &self.eos_token {
            cfg.insert("eos_token".into(), json!(e));
        }
        if let Some(t) = &self.chat_template {
            let value = if self.named_templates.is_empty() {
                json!(t.source())
            } else {
                let mut list = vec![json!({"name": "default", "template": t.source()})];
                for (name, t) in &self.named_templates {
                    list.push(json!({"name": name, "template": t.source()}));
                }
                Value::Array(list)
            };
            cfg.insert("chat_template".into(), value);
        }
        Value::Object(cfg)
    }
}

/// `bos_token`/`eos_token` in `tokenizer_config.json`: a string, or an
/// AddedToken object with `content`.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

type Templates = (Option<Arc<ChatTemplate>>, Vec<(String, Arc<ChatTemplate>)>);

/// `chat_template` as a string, or as HF's list of `{name, template}` where
/// the one named `default` is used unless a name is asked for.
fn parse_templates(
    v: Option<&Value>,
    bos: &Option<String>,
    eos: &Option<String>,
) -> Result<Templates, TextError> {
    let compile = |src: &str| ChatTemplate::new(src, bos.as_deref(), eos.as_deref()).map(Arc::new);
    match v {
        None | Some(Value::Null) => Ok((None, Vec::new())),
        Some(Value::String(s)) => Ok((Some(compile(s)?), Vec::new())),
        Some(Value::Array(items)) => {
            let mut named: HashMap<String, Arc<ChatTemplate>> = HashMap::new();
            let mut order = Vec::new();
            for item in items {
                let name = item.get("name").and_then(Value::as_str);
                let src = item.get("template").and_then(Value::as_str);
                let (Some(name), Some(src)) = (name, src) else {
                    return Err(TextError::InvalidTokenizerJson(
                        "chat_template list entries need string `name` and `template`".into(),
                    ));
                };
                order.push(name.to_string());
                named.insert(name.to_string(), compile(src)?);
            }
            let default = named.remove("default");
            let rest = order
                .into_iter()
                .filter_map(|n| named.remove(&n).map(|t| (n, t)))
                .collect();
            Ok((default, rest))
        }
        Some(_) => Err(TextError::InvalidTokenizerJson(
            "chat_template must be a string or a list".into(),
        )),
    }
}
