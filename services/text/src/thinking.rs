//! Which part of a reasoning model's output a token is, and where an output stands: what
//! every parser ([`crate::reasoning`], [`crate::harmony`]) says of each token.

/// Which part of the output a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The thinking's text.
    Reasoning,
    /// A marker: neither part's text.
    Marker,
    /// The answer.
    Content,
}

/// Where an output stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Before the first token, outside the block: the model may open one.
    Start,
    Thinking,
    Answering,
}
