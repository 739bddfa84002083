//! Static objects (routes with `static`), served as a CDN origin does: the file under the
//! route's root named by the rest of the request path, read on the dispatch pool at the
//! request's priority class (seed 000's NGINX cache server, whose thread-pool tasks are
//! ordered by a priority from the request URI).

use crate::config::Priority;
use crate::dispatch::{Dispatcher, Rejected};
use crate::forward::{answer, ProxyBody};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The file for `path` (the request path, which starts with `prefix`) under `root`. Each
/// segment is taken literally: empty ones are skipped; `.`, `..`, percent-escapes, backslashes
/// and NUL are refused, so the result never leaves `root` by its name. (A symbolic link
/// inside `root` is followed: the operator put it there.)
pub fn resolve(root: &Path, prefix: &str, path: &str) -> Result<PathBuf, &'static str> {
    let rest = path.strip_prefix(prefix).unwrap_or(path);
    let mut out = root.to_path_buf();
    let mut any = false;
    for seg in rest.split('/').filter(|s| !s.is_empty()) {
        if seg == "." || seg == ".." || seg.bytes().any(|b| b == b'%' || b == b'\\' || b == 0) {
            return Err("a path segment that is ., .., or holds %, \\ or NUL");
        }
        out.push(seg);
        any = true;
    }
    if !any {
        return Err("no object named");
    }
    Ok(out)
}

/// A class named or numbered in a request (`0`, `high`); numbers past the last class mean the
/// last.
fn parse_class(v: &str, d: &crate::dispatch::DispatchConfig) -> Option<usize> {
    match v.parse::<usize>() {
        Ok(n) => Some(n.min(d.classes.len() - 1)),
        Err(_) => d.class(v),
    }
}

/// The request's class: the query parameter, then the header, then the object's size, then
/// the route's class. Values that name no class are ignored.
pub fn class_of(p: &Priority, parts: &Parts, size: Option<u64>, d: &crate::dispatch::DispatchConfig) -> usize {
    if let (Some(name), Some(q)) = (&p.query, parts.uri.query()) {
        let v = q.split('&').find_map(|kv| kv.strip_prefix(name.as_str()).and_then(|r| r.strip_prefix('=')));
        if let Some(c) = v.and_then(|v| parse_class(v, d)) {
            return c;
        }
    }
    if let Some(h) = &p.header {
        if let Some(c) = parts.headers.get(h.as_str()).and_then(|v| v.to_str().ok()).and_then(|v| parse_class(v.trim(), d)) {
            return c;
        }
    }
    if let Some(size) = size {
        if let Some((_, c)) = p.sizes.iter().find(|(up_to, _)| size <= *up_to) {
            return *c;
        }
    }
    p.class
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("txt") => "text/plain; charset=utf-8",
        Some("css") => "text/css",
        Some("js") => "text/javascript",
        Some("json") => "application/json",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("svg") => "image/svg+xml",
        Some("mp4") => "video/mp4",
        _ => "application/octet-stream",
    }
}

/// Reads the whole file (on a pool thread), refusing more than `max` bytes.
fn read(path: &Path, max: u64) -> Result<Bytes, (StatusCode, &'static str)> {
    let f = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => (StatusCode::NOT_FOUND, "no such object"),
        std::io::ErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, "the object cannot be read"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "the object cannot be opened"),
    })?;
    let meta = f.metadata().map_err(|_| (StatusCode::INTERNAL_SERVER_ERROR, "the object cannot be examined"))?;
    if !meta.is_file() {
        return Err((StatusCode::NOT_FOUND, "no such object"));
    }
    if meta.len() > max {
        return Err((StatusCode::INTERNAL_SERVER_ERROR, "the object is larger than static.max_bytes"));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // A file that grows while it is read is cut at the limit.
    f.take(max).read_to_end(&mut buf).map_err(|_| (StatusCode::INTERNAL_SERVER_ERROR, "the object cannot be read"))?;
    Ok(Bytes::from(buf))
}

/// Serves one request of a `static` route.
pub async fn serve(d: &Dispatcher, root: &Path, max: u64, prefix: &str, priority: &Priority, parts: &Parts) -> Response<ProxyBody> {
    let head = parts.method == Method::HEAD;
    if parts.method != Method::GET && !head {
        let mut r = answer(StatusCode::METHOD_NOT_ALLOWED, "static objects take GET and HEAD");
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let path = match resolve(root, prefix, parts.uri.path()) {
        Ok(p) => p,
        Err(why) => return answer(StatusCode::BAD_REQUEST, why),
    };
    // The size is only needed (and the file only examined here) when it decides the class.
    let size = if priority.sizes.is_empty() { None } else { std::fs::metadata(&path).ok().map(|m| m.len()) };
    let class = class_of(priority, parts, size, d.config());
    let ctype = content_type(&path);
    match d.run(class, move || read(&path, max)).await {
        Ok(Ok(body)) => {
            let len = body.len();
            let mut r = if head { Response::new(Empty::new().map_err(|never| match never {}).boxed()) } else { Response::new(Full::new(body).map_err(|never| match never {}).boxed()) };
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
            r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(len));
            r
        }
        Ok(Err((status, why))) => answer(status, why),
        Err(e) => {
            let mut r = answer(StatusCode::SERVICE_UNAVAILABLE, match e {
                Rejected::Full => "the dispatch queue of this request's class is full",
                Rejected::Expired => "the request waited longer than dispatch.max_wait",
                Rejected::Stopped => "the proxy is stopping",
            });
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::{Class, DispatchConfig, Mode};

    #[test]
    fn paths_stay_under_the_root() {
        let root = Path::new("/srv/o");
        assert_eq!(resolve(root, "/objects/", "/objects/a/b.bin").unwrap(), Path::new("/srv/o/a/b.bin"));
        assert_eq!(resolve(root, "/", "//a//b").unwrap(), Path::new("/srv/o/a/b"));
        for bad in ["/objects/../etc/passwd", "/objects/a/./b", "/objects/%2e%2e/x", "/objects/a\\b", "/objects/", "/objects/a/.."] {
            assert!(resolve(root, "/objects/", bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn the_class_comes_from_query_then_header_then_size_then_route() {
        let d = DispatchConfig {
            workers: 1,
            mode: Mode::Priority,
            classes: ["high", "mid", "low"].iter().map(|n| Class { name: n.to_string(), share: 0 }).collect(),
            queue_limit: 1,
            max_wait: std::time::Duration::from_secs(1),
            lifo_above: 0,
        };
        let p = Priority { query: Some("prio".into()), header: Some("x-priority".into()), sizes: vec![(10_240, 0), (1 << 20, 1)], class: 2 };
        let parts = |uri: &str, h: Option<&str>| {
            let mut b = hyper::Request::builder().uri(uri);
            if let Some(h) = h {
                b = b.header("x-priority", h);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert_eq!(class_of(&p, &parts("/o/a?x=1&prio=1", Some("high")), Some(1), &d), 1);
        assert_eq!(class_of(&p, &parts("/o/a?prio=low", None), Some(1), &d), 2);
        assert_eq!(class_of(&p, &parts("/o/a?prio=99", None), None, &d), 2, "past the last class: the last");
        assert_eq!(class_of(&p, &parts("/o/a?prio=nonesuch", Some("high")), None, &d), 0, "an unknown value is ignored");
        assert_eq!(class_of(&p, &parts("/o/a?priority=0", None), Some(5_000), &d), 0, "another parameter is not ours");
        assert_eq!(class_of(&p, &parts("/o/a", None), Some(100_000), &d), 1);
        assert_eq!(class_of(&p, &parts("/o/a", None), Some(2 << 20), &d), 2);
        assert_eq!(class_of(&p, &parts("/o/a", None), None, &d), 2);
    }
}
