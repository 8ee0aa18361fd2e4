//! The gateway's errors: one enum, mapped to gRPC status here and to OpenAI's JSON error shape
//! in the HTTP module.

use tonic::{Code, Status};

#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("model `{0}` is not served here (see ListModels)")]
    ModelNotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// A bad value of one request field, which the OpenAI API names as the error's `param`.
    #[error("`{field}`: {message}")]
    InvalidField {
        field: &'static str,
        message: String,
    },
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Unavailable(String),
    /// A caller's rate limit: RESOURCE_EXHAUSTED / 429, retry after the delay.
    #[error("{message}; retry in {}s", retry_after_s(*retry_after))]
    RateLimited {
        message: String,
        retry_after: std::time::Duration,
    },
    #[error("the request's deadline passed")]
    DeadlineExceeded,
    #[error("{0}")]
    Internal(String),
}

/// Whole seconds to wait, rounded up (a `Retry-After` value).
pub fn retry_after_s(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl GatewayError {
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayError::ModelNotFound(_) => "model_not_found",
            GatewayError::InvalidArgument(_) | GatewayError::InvalidField { .. } => {
                "invalid_argument"
            }
            GatewayError::ResourceExhausted(_) => "resource_exhausted",
            GatewayError::RateLimited { .. } => "rate_limited",
            GatewayError::Unavailable(_) => "unavailable",
            GatewayError::DeadlineExceeded => "deadline_exceeded",
            GatewayError::Internal(_) => "internal",
        }
    }

    /// Whether another pool might succeed where this one failed (before any token was sent):
    /// it was unavailable, or its queue was full.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            GatewayError::Unavailable(_) | GatewayError::ResourceExhausted(_)
        )
    }

    /// Seconds a client should wait before trying again, when the error says so: a rate
    /// limit's delay; a full queue, or no pool ready, soon.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            GatewayError::RateLimited { retry_after, .. } => Some(retry_after_s(*retry_after)),
            GatewayError::ResourceExhausted(_) | GatewayError::Unavailable(_) => Some(1),
            _ => None,
        }
    }

    /// A worker's status, as the gateway reports it.
    pub fn from_worker(s: &Status) -> Self {
        let msg = s.message().to_owned();
        match s.code() {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                GatewayError::InvalidArgument(msg)
            }
            Code::ResourceExhausted => GatewayError::ResourceExhausted(msg),
            Code::DeadlineExceeded => GatewayError::DeadlineExceeded,
            Code::Unavailable | Code::Cancelled | Code::Unknown | Code::Aborted => {
                GatewayError::Unavailable(format!("the worker pool failed: {msg}"))
            }
            _ => GatewayError::Internal(format!("worker: {} ({:?})", msg, s.code())),
        }
    }
}

impl From<GatewayError> for Status {
    fn from(e: GatewayError) -> Self {
        let msg = e.to_string();
        let retry_after = e.retry_after_s();
        let mut s = match e {
            GatewayError::ModelNotFound(_) => Status::not_found(msg),
            GatewayError::InvalidArgument(_) | GatewayError::InvalidField { .. } => {
                Status::invalid_argument(msg)
            }
            GatewayError::ResourceExhausted(_) | GatewayError::RateLimited { .. } => {
                Status::resource_exhausted(msg)
            }
            GatewayError::Unavailable(_) => Status::unavailable(msg),
            GatewayError::DeadlineExceeded => Status::deadline_exceeded(msg),
            GatewayError::Internal(_) => Status::internal(msg),
        };
        if let Some(v) = retry_after.and_then(|r| r.to_string().parse().ok()) {
            s.metadata_mut().insert("retry-after", v);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_fault_is_never_the_clients_mistake() {
        let cases = [
            (
                Status::invalid_argument("bad"),
                "invalid_argument",
                Code::InvalidArgument,
            ),
            (
                Status::resource_exhausted("full"),
                "resource_exhausted",
                Code::ResourceExhausted,
            ),
            (
                Status::unavailable("step failed: GPU"),
                "unavailable",
                Code::Unavailable,
            ),
            (
                Status::internal("step failed: broken"),
                "internal",
                Code::Internal,
            ),
            (Status::unknown("?"), "unavailable", Code::Unavailable),
            (Status::data_loss("?"), "internal", Code::Internal),
        ];
        for (status, kind, code) in cases {
            let e = GatewayError::from_worker(&status);
            assert_eq!(e.kind(), kind, "{status:?}");
            assert_eq!(Status::from(e.clone()).code(), code, "{status:?}");
            let retryable = kind == "unavailable" || kind == "resource_exhausted";
            assert_eq!(e.retryable(), retryable, "{status:?}");
        }
    }
}
