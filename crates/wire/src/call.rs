//! One typed call to another of the project's binaries: the body serialized from a wire type,
//! the answer read into one, and a refusal read into an [`ErrorBody`] whose kind the caller
//! matches on.

use crate::error::{ErrorBody, ErrorKind};
use crate::Wire;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;
pub use vectorlb_client::{Error as ClientError, Method, Options, Target};
use vectorlb_client::{Request, Response};

/// An API to call: where, with which token, within which limits.
#[derive(Debug, Clone)]
pub struct Api {
    pub target: Target,
    pub token: Option<String>,
    pub options: Options,
}

/// Why a call gave no answer of the expected type.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// `ADDRESS:PORT` or `unix:PATH` was neither.
    #[error("'{0}' is not unix:PATH or ADDRESS:PORT")]
    BadTarget(String),
    /// No answer: not listening, the connection failed, or no answer in time (a daemon that is
    /// starting or restarting).
    #[error("{target} does not answer: {error}")]
    Unreachable { target: String, error: vectorlb_client::Error },
    /// The API refused the request.
    #[error("{method} {path}: {status} {}", body.error)]
    Refused { method: Method, path: String, status: u16, body: Box<ErrorBody> },
    /// A success whose body is not the type the API documents.
    #[error("{method} {path}: the answer is not what the API documents: {error}")]
    Answer { method: Method, path: String, error: String },
}

impl CallError {
    /// The refusal's kind (`None`: no refusal, the call itself failed).
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            CallError::Refused { body, .. } => Some(body.kind),
            _ => None,
        }
    }

    /// The refusal's body.
    pub fn refusal(&self) -> Option<&ErrorBody> {
        match self {
            CallError::Refused { body, .. } => Some(body),
            _ => None,
        }
    }
}

impl Api {
    /// `target`: `unix:PATH` or `ADDRESS:PORT`.
    pub fn new(target: &str, token: Option<String>) -> Result<Api, CallError> {
        let target = target.parse().map_err(|_| CallError::BadTarget(target.to_string()))?;
        Ok(Api { target, token, options: Options { timeout: Duration::from_secs(30), max_body: 256 << 20, ..Options::default() } })
    }

    fn request<B: Serialize + Wire>(&self, method: &Method, path: &str, body: Option<&B>) -> Request {
        Request {
            method: method.clone(),
            path: path.to_string(),
            host: "vectorlb".into(),
            // A wire type always serializes (no maps with non-string keys, no failing
            // serializer); an empty body would be refused with a 400 that names it.
            body: body.map(|b| serde_json::to_vec(b).unwrap_or_default()),
            content_type: "application/json",
            bearer: self.token.clone(),
        }
    }

    async fn send(&self, r: &Request) -> Result<Response, CallError> {
        vectorlb_client::request(&self.target, r, &self.options).await.map_err(|error| CallError::Unreachable { target: self.target.to_string(), error })
    }

    fn send_blocking(&self, r: &Request) -> Result<Response, CallError> {
        vectorlb_client::request_blocking(&self.target, r, &self.options).map_err(|error| CallError::Unreachable { target: self.target.to_string(), error })
    }

    fn answer<R: DeserializeOwned + Wire>(method: Method, path: &str, res: Response, also: &[u16]) -> Result<R, CallError> {
        let status = res.status.as_u16();
        if !(200..300).contains(&status) && !also.contains(&status) {
            return Err(CallError::Refused { method, path: path.to_string(), status, body: Box::new(ErrorBody::read(status, &res.body)) });
        }
        serde_json::from_slice(&res.body).map_err(|e| CallError::Answer { method, path: path.to_string(), error: e.to_string() })
    }

    /// One request on a new connection.
    pub async fn call<B: Serialize + Wire, R: DeserializeOwned + Wire>(&self, method: Method, path: &str, body: Option<&B>) -> Result<R, CallError> {
        let r = self.request(&method, path, body);
        let res = self.send(&r).await?;
        Self::answer(method, path, res, &[])
    }

    /// `method path` with a body that is not JSON (the proxy's configuration, TOML).
    pub async fn send_text<R: DeserializeOwned + Wire>(&self, method: Method, path: &str, body: Vec<u8>, content_type: &'static str) -> Result<R, CallError> {
        let mut r = self.request::<()>(&method, path, None);
        r.body = Some(body);
        r.content_type = content_type;
        let res = self.send(&r).await?;
        Self::answer(method, path, res, &[])
    }

    /// `GET path` where the statuses `also` carry the documented body too (`/v1/health`
    /// answers 503 with its report when the daemon is unwell).
    pub async fn get_also<R: DeserializeOwned + Wire>(&self, path: &str, also: &[u16]) -> Result<R, CallError> {
        let r = self.request::<()>(&Method::GET, path, None);
        let res = self.send(&r).await?;
        Self::answer(Method::GET, path, res, also)
    }

    /// [`Api::call`] for a caller without a runtime (the CNI plugin, the CLI).
    pub fn call_blocking<B: Serialize + Wire, R: DeserializeOwned + Wire>(&self, method: Method, path: &str, body: Option<&B>) -> Result<R, CallError> {
        let r = self.request(&method, path, body);
        let res = self.send_blocking(&r)?;
        Self::answer(method, path, res, &[])
    }

    /// `GET path`.
    pub async fn get<R: DeserializeOwned + Wire>(&self, path: &str) -> Result<R, CallError> {
        self.call::<(), R>(Method::GET, path, None).await
    }

    /// [`Api::get_also`], blocking.
    pub fn get_also_blocking<R: DeserializeOwned + Wire>(&self, path: &str, also: &[u16]) -> Result<R, CallError> {
        let r = self.request::<()>(&Method::GET, path, None);
        let res = self.send_blocking(&r)?;
        Self::answer(Method::GET, path, res, also)
    }

    /// `GET path`, blocking.
    pub fn get_blocking<R: DeserializeOwned + Wire>(&self, path: &str) -> Result<R, CallError> {
        self.call_blocking::<(), R>(Method::GET, path, None)
    }
}

/// An answer whose body the caller does not read (`DELETE`'s).
pub type Ignored = serde::de::IgnoredAny;
