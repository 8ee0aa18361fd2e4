//! The crate's one error type.

use std::time::Duration;

/// Everything a placement operation can fail with.
///
/// `kind()` is stable: it is used as a metric label and mapped to a gRPC code at
/// the service boundary, so never rename a kind.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// etcd could not be reached (connection refused, reset, no leader, ...).
    /// Retrying later is the right reaction.
    #[error("etcd unavailable: {0}")]
    Unavailable(String),
    /// An etcd request did not answer within the request timeout.
    #[error("etcd request timed out after {0:?}")]
    Timeout(Duration),
    /// The lease expired or was revoked; keys written under it are gone.
    #[error("lease {0:#x} not found (expired or revoked)")]
    LeaseNotFound(i64),
    /// An endpoint that is not a valid `http://host:port` URL.
    #[error("invalid etcd endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    /// Any other error reported by etcd.
    #[error("etcd error: {0}")]
    Etcd(String),
    /// A value under `key` is not the JSON record its key says it is.
    #[error("bad record at {key}: {source}")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// The registration task has stopped (its handle was used after a panic).
    #[error("registration task stopped")]
    Stopped,
}

impl PlacementError {
    /// A stable, lower-case name for the variant (metric label, logs).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Timeout(_) => "timeout",
            Self::LeaseNotFound(_) => "lease_not_found",
            Self::InvalidEndpoint { .. } => "invalid_endpoint",
            Self::Etcd(_) => "etcd",
            Self::Decode { .. } => "decode",
            Self::Stopped => "stopped",
        }
    }

    /// Whether the same request may succeed later without any change
    /// (etcd down or slow), as opposed to a logic or data error.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Timeout(_))
    }
}

/// Maps an etcd client error, attributing "lease not found" to `lease` when the
/// request was about one.
pub(crate) fn from_etcd(err: etcd_client::Error, lease: Option<i64>) -> PlacementError {
    use etcd_client::Error as E;
    use tonic::Code;
    match err {
        E::GRpcStatus(status) => {
            let msg = status.message();
            if let Some(id) = lease
                && msg.contains("lease not found")
            {
                return PlacementError::LeaseNotFound(id);
            }
            match status.code() {
                Code::Unavailable | Code::Cancelled | Code::Unknown | Code::DeadlineExceeded => {
                    PlacementError::Unavailable(msg.to_owned())
                }
                _ => PlacementError::Etcd(format!("{:?}: {msg}", status.code())),
            }
        }
        E::LeaseKeepAliveError(msg) if msg.contains("lease not found") => {
            PlacementError::LeaseNotFound(lease.unwrap_or_default())
        }
        E::TransportError(e) => PlacementError::Unavailable(e.to_string()),
        E::IoError(e) => PlacementError::Unavailable(e.to_string()),
        E::InvalidUri(e) => PlacementError::InvalidEndpoint {
            endpoint: String::new(),
            reason: e.to_string(),
        },
        other => PlacementError::Etcd(other.to_string()),
    }
}
