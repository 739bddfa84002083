//! The bodies and answers every part of the proxy passes around: a boxed body whose error
//! ends a stream early, and the plain-text answers the proxy makes itself.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use std::net::SocketAddr;

pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// Why a body ended before its end: an upstream's error, or an object that could not be read
/// to its announced length. hyper then resets the HTTP/2 stream or closes the HTTP/1.1
/// connection, so the client never takes a short body for a whole one.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// Which endpoint answered a response (a response extension, for the access log).
#[derive(Debug, Clone, Copy)]
pub struct AnsweredBy(pub SocketAddr);

/// A plain-text answer of the proxy itself.
pub fn answer(status: StatusCode, msg: &str) -> Response<ProxyBody> {
    respond(status, Bytes::from(format!("{msg}\n")))
}

/// A plain-text response made here.
pub fn respond(status: StatusCode, body: Bytes) -> Response<ProxyBody> {
    let mut r = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}
