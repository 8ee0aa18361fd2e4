//! An error of the OpenAI-compatible API as OpenAI clients expect it: a status and
//! `{"error": {"message", "type", "param", "code"}}`, with `Retry-After` on a 429 or 503.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::GatewayError;

/// An error as OpenAI clients expect it.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) code: &'static str,
    pub(crate) param: Option<&'static str>,
    /// Sent as `Retry-After` (seconds) with a 429 or a 503.
    pub(crate) retry_after_s: Option<u64>,
}

impl ApiError {
    /// A 400 for a bad request body, naming the field when one is to blame.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code: "invalid_argument",
            param,
            retry_after_s: None,
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn param(&self) -> Option<&'static str> {
        self.param
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        let (status, kind) = match &e {
            GatewayError::ModelNotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error"),
            GatewayError::InvalidArgument(_) | GatewayError::InvalidField { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            GatewayError::ResourceExhausted(_) | GatewayError::RateLimited { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error")
            }
            GatewayError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
            GatewayError::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "server_error"),
            GatewayError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        let param = match &e {
            GatewayError::ModelNotFound(_) => Some("model"),
            GatewayError::InvalidField { field, .. } => Some(*field),
            _ => None,
        };
        let retry_after_s = e.retry_after_s();
        Self {
            status,
            message: e.to_string(),
            kind,
            code: e.kind(),
            param,
            retry_after_s,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

/// A body that did not parse: 400 for bad or mistyped JSON (as OpenAI answers; axum would say
/// 422 for the latter), 413 past [`crate::http::MAX_BODY_BYTES`], 415 without a JSON content
/// type.
pub fn bad_json(e: axum::extract::rejection::JsonRejection) -> ApiError {
    let mut err = ApiError::invalid(format!("bad request body: {}", e.body_text()), None);
    if matches!(
        e.status(),
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE
    ) {
        err.status = e.status();
    }
    err
}
