//! What loading or running a model, on the CPU or a device, can refuse or fail at. A checkpoint's
//! own faults stay the formats crate's error, inside [`ModelError::Format`]. The engine's error
//! has a variant of each name with the same message (`From<ModelError> for EngineError`), so what
//! a caller of the engine sees does not depend on which crate refused.

use ferrite_formats::error::FormatError;

/// Everything loading a model or running its forward can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The checkpoint's files: unreadable, malformed, or tensors the model cannot take.
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("bad model config: {0}")]
    BadConfig(String),
    #[error(
        "unsupported architecture `{0}` (supported: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma2, gemma3, phi3)"
    )]
    UnsupportedArchitecture(String),
    /// A preset's name that is not one.
    #[error(
        "model `{0}` not found: give a path to a .gguf file or a Hugging Face model directory, or one of the known names ({1})"
    )]
    ModelNotFound(String, String),
    #[error("tokenizer: {0}")]
    Text(#[from] ferrite_text::TextError),
    /// Sequences a forward cannot take (more or longer than it was made for).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
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

/// A CUDA failure is the device's: [`ModelError::Device`].
impl From<ferrite_kernels::cuda::CudaError> for ModelError {
    fn from(e: ferrite_kernels::cuda::CudaError) -> Self {
        ModelError::Device(e.to_string())
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
