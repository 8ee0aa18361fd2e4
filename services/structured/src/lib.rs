//! Structured outputs: the grammar a request's output must follow, and which tokens may come
//! next under it.
//!
//! A request names its constraint as a [`Spec`] (a JSON schema, `json_object`, a regular
//! expression, a list of choices or a Lark grammar); [`Spec::grammar`] turns it into a
//! [`Grammar`], the form that travels from the gateway to a pool. A model's [`Vocabulary`]
//! (one per model, made once: its token trie) compiles a grammar into a [`Guide`], one per
//! sequence, which gives the bitmask of allowed tokens and follows the tokens chosen.
//!
//! llguidance does the compiling and the masks. This crate knows no engine and no HTTP: the
//! gateway uses it to build and check grammars, the worker to guide sequences.

mod bounds;
mod closing;
mod spec;
mod vocabulary;

pub use bounds::{ANY_DEPTH, ARRAY_ITEMS, OBJECT_KEYS, REF_DEPTH, STRING_CHARS};
pub use spec::{Grammar, MAX_GRAMMAR_BYTES, Spec};
pub use vocabulary::{Guide, TokenBytes, Vocabulary};

/// Why a grammar was refused (the request's fault) or could not be followed.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The request's schema or grammar is malformed, too large, or llguidance cannot compile
    /// it; the message is llguidance's own where it has one.
    #[error("{0}")]
    Invalid(String),
    /// The model's tokenizer cannot be turned into a token trie (an unknown decoder).
    #[error("this model's vocabulary cannot guide outputs: {0}")]
    Vocabulary(String),
}

#[cfg(test)]
mod tests;
