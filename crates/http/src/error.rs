//! Errors as the APIs answer them: a status and an [`ErrorBody`]: a message that names the
//! field at fault and says what would be accepted, the kind of refusal for programs, and the
//! failing operation of a batch.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
pub use vectorlb_wire::error::{ErrorBody, ErrorKind, OpError};

/// Largest request body the API reads.
pub const MAX_BODY: usize = 1024 * 1024;
/// The body `POST /v1/policy` reads: a node's policy set can be large (an endpoint selected
/// by 10,000 policies carries 10,000 rules in each direction), and an endpoint is replaced
/// whole, so the controller's parts cannot always be smaller.
pub const MAX_POLICY_BODY: usize = 64 * 1024 * 1024;

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
    /// A body above [`MAX_BODY`] ([`MAX_POLICY_BODY`] for the policy set) (413).
    #[error("body: larger than {MAX_BODY} bytes ({MAX_POLICY_BODY} for POST /v1/policy)")]
    TooLarge,
    /// No token, or the wrong one, on an API that needs one (401).
    #[error("{0}")]
    Unauthorized(String),
    /// A pod's network namespace that does not exist (404, its own kind: the sandbox is gone).
    #[error("{0}")]
    NoNamespace(String),
    /// The operation `index` of a batch was refused for `error` (its status); nothing changed.
    #[error("ops[{index}]: {error}")]
    Op { index: usize, error: Box<ApiError> },
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
            ApiError::NoNamespace(_) => StatusCode::NOT_FOUND,
            ApiError::Op { error, .. } => error.status(),
        }
    }

    /// What a program calling the API matches on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::BadRequest(_) => ErrorKind::BadRequest,
            ApiError::NotFound(_) => ErrorKind::NotFound,
            ApiError::Conflict(_) => ErrorKind::Conflict,
            ApiError::Unprocessable(_) => ErrorKind::Unprocessable,
            ApiError::Unavailable(_) => ErrorKind::Unavailable,
            ApiError::Internal(_) => ErrorKind::Internal,
            ApiError::TooLarge => ErrorKind::TooLarge,
            ApiError::Unauthorized(_) => ErrorKind::Unauthorized,
            ApiError::NoNamespace(_) => ErrorKind::NoNamespace,
            ApiError::Op { error, .. } => error.kind(),
        }
    }

    /// The body sent.
    pub fn body(&self) -> ErrorBody {
        let op = match self {
            ApiError::Op { index, error } => Some(OpError { index: *index, error: error.to_string() }),
            _ => None,
        };
        ErrorBody { error: self.to_string(), kind: self.kind(), op }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let challenge = matches!(self, ApiError::Unauthorized(_));
        let mut r = (self.status(), Json(self.body())).into_response();
        if challenge {
            r.headers_mut().insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer realm=\"vectorlb\""));
            // A browser asks for the token as a password (any user name): the status page's
            // login. Basic credentials only read (see server::require_token).
            r.headers_mut().append(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Basic realm=\"vectorlb\", charset=\"UTF-8\""));
        }
        r
    }
}
