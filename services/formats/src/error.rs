//! What reading a checkpoint can fail at. The engine's error type takes each variant as its
//! own variant of the same name and message (`FormatError: From<FormatError>`).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid GGUF file: {reason}")]
    BadGguf { path: PathBuf, reason: String },
    #[error("{path}: not a valid safetensors checkpoint: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("bad model config: {0}")]
    BadConfig(String),
    #[error("unsupported tensor type {0}")]
    UnsupportedTensorType(String),
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("quantization: {0}")]
    Quant(#[from] ferrite_kernels::quant::QuantError),
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
