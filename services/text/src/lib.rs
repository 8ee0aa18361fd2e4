//! Text ↔ tokens for ferrite: tokenizers, chat templates, incremental
//! detokenization and stop strings.
//!
//! In ferrite the gateway owns text and workers own tokens: the gateway
//! tokenizes prompts, renders chat templates, detokenizes streamed ids and
//! applies stop strings without any model weights. The engine uses the same
//! code for `ferrite generate`. This crate therefore does not depend on the
//! engine: a GGUF vocabulary arrives as the plain [`GgufVocab`] struct.
//!
//! # Layout
//!
//! - [`tokenizer`]: [`Tokenizer`], built from a Hugging Face `tokenizer.json`
//!   (+ `tokenizer_config.json`) or from a [`GgufVocab`]; encode/decode,
//!   BOS/EOS and end-of-generation ids, and export back to `tokenizer.json`
//!   so a worker can ship its tokenizer to the gateway.
//! - [`gguf`]: GGUF `tokenizer.ggml.*` → `tokenizer.json` (byte-level BPE for
//!   `gpt2`, score-ranked BPE with byte fallback for SentencePiece `llama`).
//! - `pretok`: llama.cpp's split regexes per `tokenizer.ggml.pre`.
//! - [`chat`]: [`ChatTemplate`], minijinja configured like HF's jinja2
//!   environment; [`score_template`]: a reranker's query and document as one
//!   prompt through such a template.
//! - [`reasoning`]: a reasoning model's thinking told apart from its answer, by token
//!   (gpt-oss's channels: [`harmony`]).
//! - `strftime`: the date formatting behind the `strftime_now` template global.
//! - [`stream`]: [`DecodeStream`], token-by-token text deltas.
//! - [`stop`]: [`StopMatcher`], stop strings across delta boundaries.
//! - [`text_stream`]: [`TextStream`], both of the above per request: ids in, client text out.
//! - `error`: [`TextError`].

pub mod chat;
mod error;
pub mod gguf;
pub mod harmony;
mod pretok;
pub mod reasoning;
pub mod score_template;
pub mod stop;
pub mod stream;
mod strftime;
pub mod text_stream;
mod thinking;
pub mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate, TemplateKwargs};
pub use error::TextError;
pub use gguf::GgufVocab;
pub use reasoning::Reasoning;
pub use score_template::ScoreTemplate;
pub use stop::{StopMatcher, StopOutput};
pub use stream::DecodeStream;
pub use text_stream::TextStream;
pub use tokenizer::Tokenizer;
