//! The engine's error type. `kind()` is stable: it labels metrics and maps to a gRPC code at the
//! service boundary.

use std::path::PathBuf;

/// Everything the engine can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
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
    #[error(
        "unsupported architecture `{0}` (supported: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma2)"
    )]
    UnsupportedArchitecture(String),
    #[error("unsupported tensor type {0}")]
    UnsupportedTensorType(String),
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error(
        "model `{0}` not found: give a path to a .gguf file or a Hugging Face model directory, a Hugging Face Hub repository (`org/name`, `org/name:Q4_K_M` for a GGUF file), or one of the known names ({1})"
    )]
    ModelNotFound(String, String),
    #[error("fetching the model failed: {0}")]
    Fetch(String),
    #[error("tokenizer: {0}")]
    Text(#[from] ferrite_text::TextError),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("request does not fit: {0}")]
    DoesNotFit(String),
    #[error("duplicate request id {0}")]
    DuplicateRequest(u64),
    #[error("quantization: {0}")]
    Quant(#[from] ferrite_kernels::quant::QuantError),
    #[error("the queue is full ({0} requests waiting): try again later")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
    /// The worker shut down before the request finished (a drain past its timeout).
    #[error("the worker shut down before the request finished: {0}")]
    ShutDown(String),
    /// A device fault (a failed launch, copy or allocation): the pool is unwell, and another
    /// may serve the request.
    #[error("GPU: {0}")]
    Device(String),
    /// A collective of this rank's pool failed (inside the forward; the executor turns it into
    /// [`EngineError::RankLost`] with the step it happened in).
    #[error("collective: {0}")]
    Collective(#[from] ferrite_collective::CollectiveError),
    /// A rank of the pool died or stopped answering: the pool cannot step any more.
    #[error(
        "the pool lost {}during step {step} ({reason}); every rank finished step {} (this is rank {this_rank})",
        rank.map_or("a rank ".to_owned(), |r| if r == 0 { "rank 0 (the leader) ".to_owned() } else { format!("rank {r} ") }),
        step.saturating_sub(1)
    )]
    RankLost {
        rank: Option<usize>,
        this_rank: usize,
        step: u64,
        reason: String,
    },
    /// The model gave a request logits with no distribution in them (NaN, infinities): the
    /// pool's weights or arithmetic are broken, and another pool may serve the request.
    #[error("{0}")]
    BadLogits(String),
    /// A request's grammar could not go on (a step past llguidance's limits, a token it did
    /// not allow): that request ends alone.
    #[error("the output's grammar failed: {0}")]
    Grammar(String),
    /// A broken invariant of the engine itself: never the request's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A checkpoint's error is the engine's variant of the same name and message.
impl From<ferrite_formats::error::FormatError> for EngineError {
    fn from(e: ferrite_formats::error::FormatError) -> Self {
        use ferrite_formats::error::FormatError as F;
        match e {
            F::Io { path, source } => EngineError::Io { path, source },
            F::BadGguf { path, reason } => EngineError::BadGguf { path, reason },
            F::BadSafetensors { path, reason } => EngineError::BadSafetensors { path, reason },
            F::BadConfig(m) => EngineError::BadConfig(m),
            F::UnsupportedTensorType(m) => EngineError::UnsupportedTensorType(m),
            F::BadTensor { name, reason } => EngineError::BadTensor { name, reason },
            F::MissingTensor(m) => EngineError::MissingTensor(m),
            F::Quant(q) => EngineError::Quant(q),
        }
    }
}

/// The model's error is the engine's variant of the same name and message (a checkpoint's,
/// inside it, as above).
impl From<ferrite_model::ModelError> for EngineError {
    fn from(e: ferrite_model::ModelError) -> Self {
        use ferrite_model::ModelError as M;
        match e {
            M::Format(f) => f.into(),
            M::BadConfig(m) => EngineError::BadConfig(m),
            M::UnsupportedArchitecture(m) => EngineError::UnsupportedArchitecture(m),
            M::ModelNotFound(name, known) => EngineError::ModelNotFound(name, known),
            M::Text(t) => EngineError::Text(t),
            M::InvalidRequest(m) => EngineError::InvalidRequest(m),
            M::Device(m) => EngineError::Device(m),
            M::Collective(c) => EngineError::Collective(c),
            M::Internal(m) => EngineError::Internal(m),
        }
    }
}

/// A CUDA failure is the device's: [`EngineError::Device`].
impl From<ferrite_kernels::cuda::CudaError> for EngineError {
    fn from(e: ferrite_kernels::cuda::CudaError) -> Self {
        EngineError::Device(e.to_string())
    }
}

impl EngineError {
    /// A stable, low-cardinality name for this error.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Io { .. } => "io",
            EngineError::BadGguf { .. } => "bad_gguf",
            EngineError::BadSafetensors { .. } => "bad_safetensors",
            EngineError::BadConfig(_) => "bad_config",
            EngineError::UnsupportedArchitecture(_) => "unsupported_architecture",
            EngineError::UnsupportedTensorType(_) => "unsupported_tensor_type",
            EngineError::BadTensor { .. } => "bad_tensor",
            EngineError::MissingTensor(_) => "missing_tensor",
            EngineError::ModelNotFound(..) => "model_not_found",
            EngineError::Fetch(_) => "fetch",
            EngineError::Text(_) => "tokenizer",
            EngineError::InvalidRequest(_) => "invalid_request",
            EngineError::DoesNotFit(_) => "does_not_fit",
            EngineError::DuplicateRequest(_) => "duplicate_request",
            EngineError::Quant(_) => "quant",
            EngineError::QueueFull(_) => "queue_full",
            EngineError::Stopped => "stopped",
            EngineError::ShutDown(_) => "shut_down",
            EngineError::Device(_) => "device",
            EngineError::Collective(_) => "collective",
            EngineError::RankLost { .. } => "rank_lost",
            EngineError::BadLogits(_) => "bad_logits",
            EngineError::Grammar(_) => "grammar",
            EngineError::Internal(_) => "internal",
        }
    }
}

impl EngineError {
    /// What each request of a step that failed with `self` is told: a device fault stays one
    /// (the pool is unavailable), anything else is an internal error; neither is the request's
    /// fault.
    pub fn for_failed_step(&self) -> EngineError {
        match self {
            EngineError::Device(m) => EngineError::Device(format!("the step failed: {m}")),
            EngineError::RankLost {
                rank,
                this_rank,
                step,
                reason,
            } => EngineError::RankLost {
                rank: *rank,
                this_rank: *this_rank,
                step: *step,
                reason: reason.clone(),
            },
            other => EngineError::Internal(format!("the step failed: {other}")),
        }
    }
}

impl EngineError {
    /// Whether the pool can no longer step at all (a rank is lost): every request fails and
    /// the worker leaves.
    pub fn is_fatal(&self) -> bool {
        matches!(self, EngineError::RankLost { .. })
    }

    /// Whether a step's error belongs to one request, which ends alone while the others of the
    /// step go on.
    pub fn fails_alone(&self) -> bool {
        matches!(self, EngineError::BadLogits(_) | EngineError::Grammar(_))
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
