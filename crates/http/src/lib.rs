//! The control API's HTTP/1.1 server side: request parsing with hard limits, and responses.
//! The API needs little (one request per connection, JSON bodies), so this is ours rather than
//! an async web stack: fewer dependencies on a two-core build machine, and a parser we fuzz
//! (`fuzz/fuzz_targets/http_request.rs`).

use std::io::{Read, Write};
use std::time::Duration;

pub const MAX_HEAD: usize = 16 * 1024;
pub const MAX_BODY: usize = 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path without the query string, percent-decoded.
    pub path: String,
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn query(&self, k: &str) -> Option<&str> {
        self.query.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }

    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers.iter().find(|(a, _)| a.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str())
    }
}

/// Why a request could not be parsed, with the status to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

fn bad(status: u16, m: impl Into<String>) -> HttpError {
    HttpError { status, message: m.into() }
}

fn percent_decode(s: &str) -> Result<String, HttpError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = b.get(i + 1..i + 3).ok_or_else(|| bad(400, "path: truncated percent escape"))?;
                let h = std::str::from_utf8(h).ok().and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| bad(400, "path: invalid percent escape"))?;
                out.push(h);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad(400, "path: not UTF-8"))
}

/// Parses one request from the start of `buf`. `Ok(None)`: incomplete, read more.
pub fn parse(buf: &[u8]) -> Result<Option<(Request, usize)>, HttpError> {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            return Err(bad(431, "request head larger than 16 KiB"));
        }
        return Ok(None);
    };
    if head_end > MAX_HEAD {
        return Err(bad(431, "request head larger than 16 KiB"));
    }
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad(400, "request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(bad(400, "malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad(505, "only HTTP/1.x is served"));
    }
    if method.is_empty() || !method.bytes().all(|c| c.is_ascii_uppercase()) {
        return Err(bad(400, "malformed method"));
    }
    if !target.starts_with('/') {
        return Err(bad(400, "request target must be a path"));
    }
    let mut headers = Vec::new();
    for l in lines {
        let (k, v) = l.split_once(':').ok_or_else(|| bad(400, "malformed header line"))?;
        if k.is_empty() || k.contains(' ') {
            return Err(bad(400, "malformed header name"));
        }
        headers.push((k.to_string(), v.trim().to_string()));
        if headers.len() > 100 {
            return Err(bad(431, "more than 100 headers"));
        }
    }
    if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding")) {
        return Err(bad(501, "chunked request bodies are not accepted; send Content-Length"));
    }
    let len = match headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        Some((_, v)) => v.parse::<usize>().map_err(|_| bad(400, "content-length: not a number"))?,
        None => 0,
    };
    if len > MAX_BODY {
        return Err(bad(413, "body larger than 1 MiB"));
    }
    let body_start = head_end + 4;
    if buf.len() < body_start + len {
        return Ok(None);
    }
    let (p, q) = target.split_once('?').unwrap_or((target, ""));
    let path = percent_decode(p)?;
    let mut query = Vec::new();
    for kv in q.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        query.push((percent_decode(k)?, percent_decode(v)?));
    }
    Ok(Some((
        Request { method: method.to_string(), path, query, headers, body: buf[body_start..body_start + len].to_vec() },
        body_start + len,
    )))
}

/// Reads one request from a stream (5 s timeout).
pub fn read_request<S: Read>(s: &mut S) -> Result<Request, HttpError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((r, _)) = parse(&buf)? {
            return Ok(r);
        }
        let n = s.read(&mut chunk).map_err(|_| bad(408, "timed out reading the request"))?;
        if n == 0 {
            return Err(bad(400, "connection closed mid-request"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_HEAD + MAX_BODY + 4 {
            return Err(bad(413, "request too large"));
        }
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Writes a response and closes the exchange (`Connection: close`). `allow` is sent as the
/// `Allow` header (405 answers must list the methods a resource takes).
pub fn write_response<S: Write>(s: &mut S, status: u16, content_type: &str, body: &[u8], allow: Option<&str>) -> std::io::Result<()> {
    let allow = allow.map(|a| format!("Allow: {a}\r\n")).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    s.flush()
}

pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests_and_limits() {
        let (r, n) = parse(b"POST /v1/x%20y?a=1&b HTTP/1.1\r\nContent-Length: 2\r\nHost: h\r\n\r\n{}rest").unwrap().unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str(), n), ("POST", "/v1/x y", 63));
        assert_eq!((r.query("a"), r.query("b"), r.body.as_slice()), (Some("1"), Some(""), b"{}".as_slice()));
        assert_eq!(parse(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab").unwrap(), None);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n").unwrap(), None);
        assert_eq!(parse(b"GET /  HTTP/1.1\r\n\r\n").unwrap_err().status, 400);
        assert_eq!(parse(b"GET / HTTP/2\r\n\r\n").unwrap_err().status, 505);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n").unwrap_err().status, 413);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n").unwrap_err().status, 400);
        assert_eq!(parse(b"GET /%zz HTTP/1.1\r\n\r\n").unwrap_err().status, 400);
        assert_eq!(parse(&[b'a'; MAX_HEAD + 1]).unwrap_err().status, 431);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap_err().status, 501);
    }
}
