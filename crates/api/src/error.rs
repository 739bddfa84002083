//! The JSON body extractor of the control API: malformed input becomes an [`ApiError`] (400)
//! whose message names the field. The errors themselves are the shared HTTP crate's.

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
pub use vectorlb_http::error::{ApiError, MAX_BODY};

/// A JSON request body. Unlike axum's `Json`, any content type is read, and a body that does
/// not fit the type is a 400 whose message names the field (`backends[0].weight: ...`).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge
            } else {
                ApiError::BadRequest(format!("body: {}", e.body_text()))
            }
        })?;
        parse_body(&bytes).map(JsonBody)
    }
}

/// Parses a JSON body into `T`; errors name the field and the problem.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("body: a JSON object is required".into()));
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::BadRequest("body: must be a JSON object".into()));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let what = if inner.is_syntax() || inner.is_eof() { "invalid JSON: " } else { "" };
        // serde_json appends " at line L column C", which says nothing for one-line bodies.
        let msg = inner.to_string();
        let msg = msg.rsplit_once(" at line ").map(|(m, _)| m.to_string()).unwrap_or(msg);
        if path == "." || path == "?" {
            ApiError::BadRequest(format!("body: {what}{msg}"))
        } else {
            ApiError::BadRequest(format!("{path}: {what}{msg}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NewService;

    fn err(body: &str) -> String {
        parse_body::<NewService>(body.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn body_errors_name_the_field() {
        assert_eq!(err(""), "body: a JSON object is required");
        assert!(err("{").starts_with("body: invalid JSON"), "{}", err("{"));
        assert_eq!(err("[]"), "body: must be a JSON object");
        assert!(err(r#"{"vip": "10.0.0.1", "port": 70000}"#).starts_with("port: invalid value"));
        assert!(err(r#"{"vip": "10.0.0.999"}"#).starts_with("vip: invalid IP address"), "{}", err(r#"{"vip": "10.0.0.999"}"#));
        assert!(err(r#"{"vip": "10.0.0.1", "mode": "xnat"}"#).starts_with("mode: unknown variant `xnat`"));
        assert!(err(r#"{"vip": "10.0.0.1", "backends": [{"addr": "10.1.0.1", "weight": -1}]}"#).starts_with("backends[0].weight: invalid value"));
        assert!(err(r#"{"vip": "10.0.0.1", "colour": 1}"#).contains("unknown field `colour`"));
        assert!(err(r#"{"port": 80}"#).contains("missing field `vip`"));
        assert!(err(r#"{"vip": "10.0.0.1", "port": 80.5}"#).starts_with("port: invalid value: floating point `80.5`, expected an integer in 0..=65535"));
        let f: NewService = parse_body(br#"{"vip": "10.0.0.1", "port": 80.0, "table_size": 7.0}"#).unwrap();
        assert_eq!((f.port, f.table_size), (80, Some(7)), "JSON counts 80.0 as an integer");
        let ok: NewService = parse_body(br#"{"vip": "2001:db8::1"}"#).unwrap();
        assert_eq!((ok.port, ok.proto, ok.mode, ok.toa), (0, crate::model::Proto::Tcp, crate::model::ModeName::Fnat, false));
    }
}
