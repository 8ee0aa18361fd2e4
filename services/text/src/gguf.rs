//! GGUF vocabularies → a Hugging Face tokenizer.
//!
//! A GGUF file carries its tokenizer as `tokenizer.ggml.*` arrays. We turn
//! them into the Hugging Face tokenizer HF's own converters produce (and
//! `tokenizer.json` describes), so a GGUF tokenizer can be shipped to the
//! gateway as plain `tokenizer.json`. The BPE model (its ~50k-entry vocabulary
//! and merges) is built directly; only the small parts (normalizer,
//! pre-tokenizer, decoder, post-processor) go through their JSON form. Going
//! through JSON for the whole tokenizer, as this did first, cost 0.14 s of a
//! 0.34 s CPU start-up: the vocabulary and merges were built as JSON values,
//! copied once more by `json!`, and buffered again by serde while the
//! `tokenizers` crate deserialized them.
//!
//! - `gpt2`: byte-level BPE from tokens + merges; the pre-tokenizer is
//!   llama.cpp's regex list for `tokenizer.ggml.pre` (see the `pretok` module).
//! - `llama`: llama.cpp's "SPM" tokenizer, which repeatedly merges the
//!   adjacent pair whose concatenation is the highest-scoring vocabulary
//!   piece. That is BPE whose merge ranks are the pieces' score order, which
//!   is how HF converts SentencePiece BPE models too: we derive the merges
//!   from the scores, with `▁` for spaces and `<0xNN>` byte fallback.

use std::collections::{HashMap, HashSet};

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokenizers::models::bpe::{BPE, BpeBuilder, Merges, Vocab};
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, TokenizerBuilder,
};

use crate::{TextError, pretok};

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp defines them.
pub(crate) mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

/// The tokenizer part of a GGUF file's metadata, as plain data so this crate
/// does not depend on a GGUF reader. Field names follow the GGUF keys
/// (`tokenizer.ggml.<name>`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"`
    /// (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: pre-tokenizer name for `gpt2` vocabularies.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (required for `llama`).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges` ("left right"; required for `gpt2`).
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece's dummy prefix).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// A 256-token byte-level BPE vocabulary, token id = byte, spelled with GPT-2's byte-to-
    /// character map: any text round-trips. For stand-ins that have no model (the synthetic
    /// worker) and for tests.
    pub fn byte_level() -> Self {
        let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        // Non-printable bytes map to U+0100 onwards, in byte order.
        let mut next = 256u32;
        let tokens = (0..=255u8)
            .map(|b| {
                if printable(b) {
                    char::from(b).to_string()
                } else {
                    let c = char::from_u32(next).unwrap_or('?');
                    next += 1;
                    c.to_string()
                }
            })
            .collect();
        Self {
            model: "gpt2".into(),
            pre: Some("gpt2".into()),
            tokens,
            merges: Some(Vec::new()),
            ..Self::default()
        }
    }
}

/// What [`build`] produces.
pub(crate) struct Built {
    pub tokenizer: tokenizers::Tokenizer,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
}

/// The parts of a tokenizer besides its BPE model, in their `tokenizer.json` form (`null`
/// where absent).
struct Parts {
    normalizer: Value,
    pre_tokenizer: Value,
    post_processor: Value,
    decoder: Value,
}

const SUPPORTED_MODELS: &str = "gpt2, llama";

/// Builds the tokenizer for `v`.
pub(crate) fn build(v: &GgufVocab) -> Result<Built, TextError> {
    let n = v.tokens.len();
    if n == 0 {
        return Err(TextError::InvalidVocab(
            "tokenizer.ggml.tokens is empty".into(),
        ));
    }
    check_len("tokenizer.ggml.scores", v.scores.as_ref().map(Vec::len), n)?;
    check_len(
        "tokenizer.ggml.token_type",
        v.token_types.as_ref().map(Vec::len),
        n,
    )?;
    let tokens = unique_tokens(&v.tokens)?;
    let ty = |id: usize| -> i32 {
        v.token_types
            .as_ref()
            .and_then(|t| t.get(id).copied())
            .unwrap_or(token_type::NORMAL)
    };

    let is_llama = match v.model.as_str() {
        "gpt2" => false,
        "llama" => true,
        other => {
            return Err(TextError::UnknownModel {
                model: other.to_string(),
                supported: SUPPORTED_MODELS.to_string(),
            });
        }
    };
    // llama.cpp's defaults when the GGUF omits the ids.
    let (def_bos, def_eos, def_unk) = if is_llama {
        (Some(1), Some(2), Some(0))
    } else {
        (None, None, None)
    };
    let bos_id = checked_id("bos", v.bos_id.or(def_bos), n)?;
    let eos_id = checked_id("eos", v.eos_id.or(def_eos), n)?;
    let unk_id = checked_id("unknown", v.unk_id.or(def_unk), n)?;
    checked_id("padding", v.pad_id, n)?;

    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();

    // Control/unknown tokens are special (skipped by skip_special decode);
    // user-defined ones are matched in input text but decoded as text. Both
    // are stored pre-normalized in GGUF, hence `normalized: false`.
    let added: Vec<AddedToken> = (0..n)
        .filter_map(|id| {
            let special = match ty(id) {
                token_type::CONTROL | token_type::UNKNOWN => true,
                token_type::USER_DEFINED => false,
                _ => return None,
            };
            Some(AddedToken::from(tokens[id].clone(), special).normalized(false))
        })
        .collect();

    let (bpe, merges, mut parts, default_add_bos) = if is_llama {
        let scores = v.scores.as_ref().ok_or_else(|| {
            TextError::InvalidVocab("llama vocabulary needs tokenizer.ggml.scores".into())
        })?;
        let merges = spm_merges(&tokens, scores, &ty);
        let mut bpe = BPE::builder().fuse_unk(true).byte_fallback(true);
        if let Some(id) = unk_id {
            bpe = bpe.unk_token(tokens[id as usize].clone());
        }
        let parts = spm_parts(v.add_space_prefix.unwrap_or(true));
        (bpe, merges, parts, true)
    } else {
        let spec =
            pretok::lookup(v.pre.as_deref()).ok_or_else(|| TextError::UnknownPreTokenizer {
                pre: v.pre.clone().unwrap_or_default(),
                supported: pretok::supported_names(),
            })?;
        let merges = bpe_merges(v.merges.as_deref(), &tokens)?;
        let bpe = BPE::builder().ignore_merges(spec.ignore_merges);
        (
            bpe,
            merges,
            byte_level_parts(&spec.regexes),
            spec.default_add_bos,
        )
    };

    let add_bos = v.add_bos.unwrap_or(default_add_bos);
    let add_eos = v.add_eos.unwrap_or(false);
    let bos = if add_bos { bos_id } else { None };
    let eos = if add_eos { eos_id } else { None };
    parts.post_processor = template_processing(
        bos.map(|id| (tokens[id as usize].as_str(), id)),
        eos.map(|id| (tokens[id as usize].as_str(), id)),
    );
    Ok(Built {
        tokenizer: assemble(bpe.vocab_and_merges(vocab, merges), parts, added)?,
        bos_id,
        eos_id,
    })
}

/// The normalizer and decoder of a SentencePiece vocabulary (no pre-tokenizer; the post-
/// processor is set by the caller).
fn spm_parts(add_space_prefix: bool) -> Parts {
    // Prepend per text fragment: HF normalizes each piece between added
    // tokens separately, which gives llama.cpp's "space prefix after
    // every special token" behaviour.
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    let normalizer = if add_space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, replace]})
    } else {
        replace
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Parts {
        normalizer,
        pre_tokenizer: Value::Null,
        post_processor: Value::Null,
        decoder: json!({"type": "Sequence", "decoders": decoders}),
    }
}

/// The pre-tokenizer (`regexes`, then bytes to characters) and decoder of a byte-level BPE
/// vocabulary (no normalizer; the post-processor is set by the caller).
fn byte_level_parts(regexes: &[&str]) -> Parts {
    let mut pre: Vec<Value> = regexes
        .iter()
        .map(|re| {
            json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false})
        })
        .collect();
    // The regexes above did the splitting; ByteLevel only maps bytes to
    // its printable alphabet.
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    pre.push(byte_level.clone());
    Parts {
        normalizer: Value::Null,
        pre_tokenizer: json!({"type": "Sequence", "pretokenizers": pre}),
        post_processor: Value::Null,
        decoder: byte_level,
    }
}

/// The tokenizer of `bpe` with `parts`, then `added` added: what the `tokenizers` crate's
/// deserializer makes of the equivalent `tokenizer.json`, step for step.
fn assemble(
    bpe: BpeBuilder,
    parts: Parts,
    added: Vec<AddedToken>,
) -> Result<tokenizers::Tokenizer, TextError> {
    let model = bpe.build().map_err(|e| build_error("BPE model", e))?;
    let mut tokenizer: tokenizers::Tokenizer = TokenizerBuilder::<
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(model.into())
    .with_normalizer(part("normalizer", parts.normalizer)?)
    .with_pre_tokenizer(part("pre-tokenizer", parts.pre_tokenizer)?)
    .with_post_processor(part("post-processor", parts.post_processor)?)
    .with_decoder(part("decoder", parts.decoder)?)
    .build()
    .map_err(|e| build_error("parts", e))?
    .into();
    tokenizer
        .add_tokens(added)
        .map_err(|e| build_error("added tokens", e))?;
    Ok(tokenizer)
}

/// One of a tokenizer's parts from its `tokenizer.json` form (`null`: none).
fn part<T: DeserializeOwned>(what: &str, json: Value) -> Result<Option<T>, TextError> {
    serde_json::from_value(json).map_err(|e| build_error(what, e))
}

fn build_error(what: &str, e: impl std::fmt::Display) -> TextError {
    TextError::InvalidVocab(format!("building tokenizer ({what}): {e}"))
}

/// A `TemplateProcessing` post-processor adding BOS and/or EOS, as HF's
/// Llama converter writes it; `null` when neither is added.
pub(crate) fn template_processing(bos: Option<(&str, u32)>, eos: Option<(&str, u32)>) -> Value {
    if bos.is_none() && eos.is_none() {
        return Value::Null;
    }
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut special = serde_json::Map::new();
    for (seq, type_id) in [("A", 0), ("B", 1)] {
        let out = if seq == "A" { &mut single } else { &mut pair };
        if let Some((tok, _)) = bos {
            out.push(json!({"SpecialToken": {"id": tok, "type_id": type_id}}));
        }
        out.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        if let Some((tok, _)) = eos {
            out.push(json!({"SpecialToken": {"id": tok, "type_id": type_id}}));
        }
    }
    let pair: Vec<Value> = single.iter().cloned().chain(pair).collect();
    for (tok, id) in bos.into_iter().chain(eos) {
        special.insert(
            tok.to_string(),
            json!({"id": tok, "ids": [id], "tokens": [tok]}),
        );
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special})
}

fn check_len(key: &str, len: Option<usize>, n: usize) -> Result<(), TextError> {
    match len {
        Some(l) if l < n => Err(TextError::InvalidVocab(format!(
            "{key} has {l} entries for {n} tokens"
        ))),
        _ => Ok(()),
    }
}

fn checked_id(what: &str, id: Option<u32>, n: usize) -> Result<Option<u32>, TextError> {
    match id {
        Some(id) if id as usize >= n => Err(TextError::InvalidVocab(format!(
            "{what} token id {id} is outside the vocabulary (size {n})"
        ))),
        other => Ok(other),
    }
}

/// Token strings with llama.cpp's fix-ups: empty tokens get a placeholder
/// name, and duplicates are an error (an id could never be produced).
fn unique_tokens(tokens: &[String]) -> Result<Vec<String>, TextError> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut out = Vec::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        if let Some(prev) = seen.insert(t.as_str(), id) {
            return Err(TextError::InvalidVocab(format!(
                "duplicate token {t:?} with ids {prev} and {id}"
            )));
        }
        out.push(if t.is_empty() {
            format!("[EMPTY_{id}]")
        } else {
            t.clone()
        });
    }
    Ok(out)
}

/// GGUF merges "left right" → `[left, right]`, split at the first space
/// after the first byte as llama.cpp does. Merges whose parts or result are
/// not in the vocabulary can never produce a token id; HF's BPE rejects them,
/// so they are dropped.
fn bpe_merges(merges: Option<&[String]>, tokens: &[String]) -> Result<Merges, TextError> {
    let merges = merges.ok_or_else(|| {
        TextError::InvalidVocab("gpt2 vocabulary needs tokenizer.ggml.merges".into())
    })?;
    // A hash set, not the JSON vocabulary map (a BTreeMap): three lookups per merge over ~50k
    // merges made string comparison the largest cost of building the tokenizer.
    let vocab: HashSet<&str> = tokens.iter().map(String::as_str).collect();
    let mut joined = String::new();
    let mut out = Vec::with_capacity(merges.len());
    for m in merges {
        // Byte-wise, like llama.cpp's `find(' ', 1)`: the first token may
        // itself be a space-like multi-byte character ("Ġ t").
        let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
            continue;
        };
        let (left, right) = (&m[..pos], &m[pos + 1..]);
        joined.clear();
        joined.push_str(left);
        joined.push_str(right);
        if vocab.contains(left) && vocab.contains(right) && vocab.contains(joined.as_str()) {
            out.push((left.to_owned(), right.to_owned()));
        }
    }
    Ok(out)
}

/// Merge list equivalent to SentencePiece/llama.cpp score-driven merging:
/// every split of a normal piece into two vocabulary pieces is a merge, ranked
/// by the piece's score (highest first), ties by piece id, then by the ids of
/// the two halves (HF's `SentencePieceExtractor` order).
fn spm_merges(tokens: &[String], scores: &[f32], ty: &dyn Fn(usize) -> i32) -> Merges {
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if ty(id) != token_type::NORMAL {
            continue;
        }
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                merges.push((scores[id], id, li, ri));
            }
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    merges
        .into_iter()
        .map(|(_, _, l, r)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}
