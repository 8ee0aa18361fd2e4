//! What loading or running a model, on the CPU or a device, can refuse or fail at. The engine's error has a variant of
//! each name with the same message (`From<ModelError> for EngineError`), so what a caller of
//! the engine sees does not depend on which crate refused.

use std::path::PathBuf;

/// Everything loading a model or running its forward can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
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
    #[error("unsupported architecture `{0}` (supported: llama, mistral, qwen2, qwen3, gemma2)")]
    UnsupportedArchitecture(String),
    #[error("unsupported tensor type {0}")]
    UnsupportedTensorType(String),
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error(
        "model `{0}` not found: give a path to a .gguf file or a Hugging Face model directory, or one of the known names ({1})"
    )]
    ModelNotFound(String, String),
    #[error("tokenizer: {0}")]
    Text(#[from] ferrite_text::TextError),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("quantization: {0}")]
    Quant(#[from] ferrite_kernels::quant::QuantError),
    /// A device fault (a failed launch, copy or allocation): the pool is unwell, and another
    /// may serve the request.
    #[error("GPU: {0}")]
    Device(String),
    /// A collective of this rank's pool failed inside the forward.
    #[error("collective: {0}")]
    Collective(#[from] ferrite_collective::CollectiveError),
    /// A broken invariant of the model code itself: never the caller's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A checkpoint's error is the model's variant of the same name and message.
impl From<ferrite_formats::error::FormatError> for ModelError {
    fn from(e: ferrite_formats::error::FormatError) -> Self {
        use ferrite_formats::error::FormatError as F;
        match e {
            F::Io { path, source } => ModelError::Io { path, source },
            F::BadGguf { path, reason } => ModelError::BadGguf { path, reason },
            F::BadSafetensors { path, reason } => ModelError::BadSafetensors { path, reason },
            F::BadConfig(m) => ModelError::BadConfig(m),
            F::UnsupportedTensorType(m) => ModelError::UnsupportedTensorType(m),
            F::BadTensor { name, reason } => ModelError::BadTensor { name, reason },
            F::MissingTensor(m) => ModelError::MissingTensor(m),
            F::Quant(q) => ModelError::Quant(q),
        }
    }
}

/// A CUDA failure is the device's: [`ModelError::Device`].
impl From<ferrite_kernels::cuda::CudaError> for ModelError {
    fn from(e: ferrite_kernels::cuda::CudaError) -> Self {
        ModelError::Device(e.to_string())
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
