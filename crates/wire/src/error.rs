//! The body of every refusal the APIs send: a message for people and, for programs, what kind
//! of refusal it is and which operation of a batch failed. Callers match on [`ErrorKind`] and
//! [`OpError::index`], never on the message's text.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What kind of refusal. Each status has its kind; [`ErrorKind::NoNamespace`] is a 404 a caller
/// treats apart (the CNI plugin answers its runtime "unknown container").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// 400: the request does not match the API document.
    BadRequest,
    /// 401: no token, or the wrong one.
    Unauthorized,
    /// 404: no such service, backend, worker or pods port.
    NotFound,
    /// 404: the network namespace a pod's interface was asked for does not exist (the sandbox
    /// is gone).
    NoNamespace,
    /// 409: a duplicate, or a change that needs a restart.
    Conflict,
    /// 413: a body larger than the API reads.
    TooLarge,
    /// 422: well formed, but the configuration cannot take it.
    Unprocessable,
    /// 500: the daemon failed (writing a file, for instance).
    Internal,
    /// 503: a part of the daemon did not answer in time.
    Unavailable,
    /// A kind this caller does not know (a newer daemon's): act on the status.
    #[serde(other)]
    Other,
}

impl ErrorKind {
    /// The kind a status implies, for an answer without an [`ErrorBody`] (a proxy in between,
    /// an older daemon).
    pub fn of_status(status: u16) -> ErrorKind {
        match status {
            400 => ErrorKind::BadRequest,
            401 => ErrorKind::Unauthorized,
            404 => ErrorKind::NotFound,
            409 => ErrorKind::Conflict,
            413 => ErrorKind::TooLarge,
            422 => ErrorKind::Unprocessable,
            500 => ErrorKind::Internal,
            503 => ErrorKind::Unavailable,
            _ => ErrorKind::Other,
        }
    }
}

/// The operation of a batch (`POST /v1/batch`) that was refused; the batch changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpError {
    /// Its index in `ops`.
    pub index: usize,
    /// Why, without the `ops[i]` the whole message begins with.
    pub error: String,
}

/// A refusal: what was wrong, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// For people: names the field at fault and says what would be accepted.
    pub error: String,
    /// For programs.
    #[serde(default = "other")]
    pub kind: ErrorKind,
    /// The refused operation of a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<OpError>,
}

fn other() -> ErrorKind {
    ErrorKind::Other
}

impl ErrorBody {
    /// Reads a refusal's body; one that is not an [`ErrorBody`] (a proxy's page, an empty
    /// body) keeps its text, and its kind comes from the status.
    pub fn read(status: u16, body: &[u8]) -> ErrorBody {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(mut b) => {
                if b.kind == ErrorKind::Other {
                    b.kind = ErrorKind::of_status(status);
                }
                b
            }
            Err(_) => {
                let text = String::from_utf8_lossy(&body[..body.len().min(1024)]).trim().to_string();
                ErrorBody { error: if text.is_empty() { format!("status {status}") } else { text }, kind: ErrorKind::of_status(status), op: None }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_read_whatever_sent_them() {
        let b = ErrorBody::read(422, br#"{"error":"ops[2]: no","kind":"unprocessable","op":{"index":2,"error":"no"}}"#);
        assert_eq!((b.kind, b.op.map(|o| o.index)), (ErrorKind::Unprocessable, Some(2)));
        // An older daemon's body: the kind from the status.
        assert_eq!(ErrorBody::read(404, br#"{"error":"netns: gone"}"#).kind, ErrorKind::NotFound);
        // A kind from a newer daemon.
        assert_eq!(ErrorBody::read(418, br#"{"error":"x","kind":"teapot"}"#).kind, ErrorKind::Other);
        let b = ErrorBody::read(502, b"<html>bad gateway</html>");
        assert_eq!((b.kind, b.error.as_str()), (ErrorKind::Other, "<html>bad gateway</html>"));
        assert_eq!(ErrorBody::read(503, b"").error, "status 503");
        let round = ErrorBody { error: "x".into(), kind: ErrorKind::NoNamespace, op: None };
        assert_eq!(serde_json::to_string(&round).unwrap(), r#"{"error":"x","kind":"no_namespace"}"#);
    }
}
