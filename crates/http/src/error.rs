//! Errors as the APIs answer them: a status and `{"error": "..."}` whose message names the
//! field at fault and says what would be accepted.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Largest request body the API reads.
pub const MAX_BODY: usize = 1024 * 1024;

/// Why a request was refused. Each variant is one status code; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The request does not match the API document (400).
    #[error("{0}")]
    BadRequest(String),
    /// No such service, backend or worker (404).
    #[error("{0}")]
    NotFound(String),
    /// A duplicate, or a change that needs a restart (409).
    #[error("{0}")]
    Conflict(String),
    /// Well formed, but the configuration cannot take it (422).
    #[error("{0}")]
    Unprocessable(String),
    /// A part of the daemon did not answer in time (503).
    #[error("{0}")]
    Unavailable(String),
    /// The daemon failed (500): writing a file, for instance.
    #[error("{0}")]
    Internal(String),
    /// A body above [`MAX_BODY`] (413).
    #[error("body: larger than {MAX_BODY} bytes")]
    TooLarge,
    /// No token, or the wrong one, on an API that needs one (401).
    #[error("{0}")]
    Unauthorized(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let challenge = matches!(self, ApiError::Unauthorized(_));
        let mut r = (self.status(), Json(serde_json::json!({ "error": self.to_string() }))).into_response();
        if challenge {
            r.headers_mut().insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer realm=\"vectorlb\""));
            // A browser asks for the token as a password (any user name): the status page's
            // login. Basic credentials only read (see server::require_token).
            r.headers_mut().append(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Basic realm=\"vectorlb\", charset=\"UTF-8\""));
        }
        r
    }
}
