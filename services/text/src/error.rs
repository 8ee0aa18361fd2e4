//! The crate's single error type.

/// Everything that can go wrong turning text into tokens and back.
///
/// [`TextError::kind`] gives a stable, machine-readable name per variant so
/// the gateway can map errors to API responses without matching on messages.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// `tokenizer.json` or `tokenizer_config.json` is not valid JSON, or is
    /// JSON that the `tokenizers` crate does not accept.
    #[error("invalid tokenizer json: {0}")]
    InvalidTokenizerJson(String),

    /// A GGUF vocabulary whose `tokenizer.ggml.model` we cannot build.
    #[error("unsupported tokenizer model '{model}' (supported: {supported})")]
    UnknownModel {
        /// The `tokenizer.ggml.model` value.
        model: String,
        /// Comma-separated list of the models we do support.
        supported: String,
    },

    /// A GGUF `tokenizer.ggml.pre` value with no known split regex.
    #[error("unknown pre-tokenizer '{pre}' (supported: {supported})")]
    UnknownPreTokenizer {
        /// The `tokenizer.ggml.pre` value.
        pre: String,
        /// Comma-separated list of the pre-tokenizers we do support.
        supported: String,
    },

    /// A GGUF vocabulary that is internally inconsistent (missing merges,
    /// duplicate tokens, array length mismatches, out-of-range ids...).
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),

    /// Encoding or decoding failed inside the `tokenizers` crate.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),

    /// A token id outside the vocabulary was passed to decode.
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    UnknownTokenId {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },

    /// The chat template does not parse.
    #[error("chat template syntax error: {0}")]
    TemplateSyntax(String),

    /// The chat template parsed but failed while rendering (including
    /// `raise_exception(...)` called by the template itself).
    #[error("chat template render error: {0}")]
    TemplateRender(String),

    /// A reasoning parser this model cannot have (an unknown name, a marker that is not one
    /// of its tokens).
    #[error("{0}")]
    Reasoning(String),
}

impl TextError {
    /// Stable machine-readable name of the error variant.
    pub fn kind(&self) -> &'static str {
        match self {
            TextError::InvalidTokenizerJson(_) => "invalid_tokenizer_json",
            TextError::UnknownModel { .. } => "unknown_tokenizer_model",
            TextError::UnknownPreTokenizer { .. } => "unknown_pre_tokenizer",
            TextError::InvalidVocab(_) => "invalid_vocab",
            TextError::Tokenizer(_) => "tokenizer",
            TextError::UnknownTokenId { .. } => "unknown_token_id",
            TextError::TemplateSyntax(_) => "template_syntax",
            TextError::TemplateRender(_) => "template_render",
            TextError::Reasoning(_) => "reasoning_parser",
        }
    }
}
