//! Static objects (routes with `static`), served as a CDN origin does: the file under the
//! route's root named by the rest of the request path, read by the dispatch pool at the
//! request's priority class (seed 000's NGINX cache server, whose thread-pool tasks are
//! ordered by a priority from the request URI). The first item opens the object and reads its
//! first 64 KiB; every further 64 KiB is another item of the same class (as NGINX's `aio
//! threads` reads a file in output-buffer chunks), so a small object of a higher class waits
//! at most for the chunks being read, not for whole large objects.

use crate::body::{answer, ProxyBody};
use crate::config::Priority;
use crate::dispatch::{Dispatcher, Rejected};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Bytes read per chunk of a streamed object (one pool item each).
pub const CHUNK: usize = 64 * 1024;

/// What the first item tells the request's task: the object's length, its first chunk and
/// the open file (for the items that read the rest), or the answer to give instead.
type Head = Result<(u64, Bytes, Arc<Opened>), (StatusCode, &'static str)>;

/// Alignment of direct-I/O buffers, offsets and lengths (a page; enough for every common
/// block device).
const ALIGN: usize = 4096;

/// Where a `static` route's objects are and how they are read.
pub struct Object<'a> {
    pub root: &'a Path,
    pub max: u64,
    /// Read with O_DIRECT, past the page cache (NGINX's `directio`): each chunk is a read
    /// from the device, as for a working set larger than memory. Filesystems without it
    /// (tmpfs) are read through the cache.
    pub direct: bool,
    pub prefix: &'a str,
}

/// An open object, and whether it is read with O_DIRECT (asked for, and the filesystem has it).
struct Opened {
    file: std::fs::File,
    direct: bool,
}

/// Opens the object and checks it.
fn open(path: &Path, max: u64, direct: bool) -> Result<(Opened, u64), (StatusCode, &'static str)> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a named pipe (or a link to one) under the root must not hold the
    // thread until a writer comes; it has no effect on reading regular files.
    let with = |flags: i32| std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | flags).open(path);
    let opened = match direct {
        true => match with(libc::O_DIRECT) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => with(0).map(|f| (f, false)),
            r => r.map(|f| (f, true)),
        },
        false => with(0).map(|f| (f, false)),
    };
    let (f, direct) = opened.map_err(|e| match e.kind() {
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
    Ok((Opened { file: f, direct }, meta.len()))
}

/// `n` bytes at `off` (a multiple of [`CHUNK`]), or None when the file no longer has them
/// (it shrank) or cannot be read. With O_DIRECT the buffer is aligned and its length rounded
/// up to [`ALIGN`] (the last chunk's read then ends short at the end of file), and the bytes
/// are copied out of it; otherwise they are read into the buffer the body sends.
fn read_at(o: &Opened, off: u64, n: usize) -> Option<Bytes> {
    use std::os::unix::fs::FileExt;
    let (want, pad) = if o.direct { (n.next_multiple_of(ALIGN), ALIGN) } else { (n, 0) };
    let mut raw = vec![0u8; want + pad];
    let a = if o.direct { raw.as_ptr().align_offset(ALIGN) } else { 0 };
    let buf = &mut raw[a..a + want];
    let mut got = 0;
    while got < n {
        match o.file.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => return None,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    if o.direct {
        return Some(Bytes::copy_from_slice(&buf[..n]));
    }
    raw.truncate(n);
    Some(Bytes::from(raw))
}

/// The first item: open, check, and read the first chunk (nothing for HEAD).
fn first(path: &Path, max: u64, direct: bool, head_only: bool) -> Head {
    let (f, len) = open(path, max, direct)?;
    let first =
        if head_only || len == 0 { Bytes::new() } else { read_at(&f, 0, CHUNK.min(len as usize)).ok_or((StatusCode::INTERNAL_SERVER_ERROR, "the object cannot be read"))? };
    Ok((len, first, Arc::new(f)))
}

/// A response body read chunk by chunk, each chunk an item of the request's class queued
/// when the previous one is handed to the connection (one chunk read ahead of the socket).
/// The pool's threads never wait for a client; a client that stops reading stops the reads.
/// A chunk that cannot be read (the file shrank, a read failed, the proxy stopped) ends the
/// body with an error, which resets the HTTP/2 stream or closes the HTTP/1.1 connection.
struct Chunks {
    d: Arc<Dispatcher>,
    class: usize,
    file: Arc<Opened>,
    /// Offset of the next chunk to ask for.
    next: u64,
    len: u64,
    /// Bytes not yet handed to the connection.
    left: u64,
    /// The first chunk, read by the admitting item.
    ready: Option<Bytes>,
    pending: Option<tokio::sync::oneshot::Receiver<Option<Bytes>>>,
}

impl Chunks {
    /// Queues the read of the next chunk, if any is left to read.
    fn ask(&mut self) {
        if self.next >= self.len {
            return;
        }
        let (off, n) = (self.next, CHUNK.min((self.len - self.next) as usize));
        self.next += n as u64;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let f = self.file.clone();
        let queued = self.d.submit_continued(self.class, move |r| {
            let _ = tx.send(r.ok().and_then(|_| read_at(&f, off, n)));
        });
        // Refused only when the proxy stops: the body then ends short.
        self.pending = queued.ok().map(|()| rx);
    }
}

fn short() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the object could not be read to its announced length")
}

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let chunk = match this.ready.take() {
            Some(b) => Some(b),
            None => {
                let Some(rx) = this.pending.as_mut() else {
                    this.left = 0;
                    return Poll::Ready(Some(Err(short())));
                };
                match std::pin::Pin::new(rx).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(r) => {
                        this.pending = None;
                        r.ok().flatten()
                    }
                }
            }
        };
        let Some(b) = chunk.filter(|b| !b.is_empty()) else {
            this.left = 0;
            return Poll::Ready(Some(Err(short())));
        };
        this.left = this.left.saturating_sub(b.len() as u64);
        // Read the next chunk while this one is sent.
        this.ask();
        Poll::Ready(Some(Ok(hyper::body::Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

/// Serves one request of a `static` route.
pub async fn serve(d: &Arc<Dispatcher>, o: Object<'_>, priority: &Priority, parts: &Parts) -> Response<ProxyBody> {
    let Object { root, max, direct, prefix } = o;
    let head_only = parts.method == Method::HEAD;
    if parts.method != Method::GET && !head_only {
        let mut r = answer(StatusCode::METHOD_NOT_ALLOWED, "static objects take GET and HEAD");
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let path = match resolve(root, prefix, parts.uri.path()) {
        Ok(p) => p,
        Err(why) => return answer(StatusCode::BAD_REQUEST, why),
    };
    // The size is only needed (and the file only examined here, off the connection's thread)
    // when it decides the class.
    let size = if priority.sizes.is_empty() {
        None
    } else {
        let p = path.clone();
        tokio::task::spawn_blocking(move || std::fs::metadata(p).ok().map(|m| m.len())).await.ok().flatten()
    };
    let class = class_of(priority, parts, size, d.config());
    let ctype = content_type(&path);
    let (tx, rx) = tokio::sync::oneshot::channel::<Head>();
    let submitted = d.submit(class, move |r| {
        let _ = tx.send(match r {
            Ok(_) => first(&path, max, direct, head_only),
            Err(e) => Err(refusal(e)),
        });
    });
    let head = match submitted {
        // The job is always called (queued items run even after a stop), unless it panicked.
        Ok(()) => rx.await.unwrap_or(Err((StatusCode::INTERNAL_SERVER_ERROR, "the object could not be read"))),
        Err(e) => Err(refusal(e)),
    };
    match head {
        Ok((len, first, file)) => {
            let mut r = if head_only {
                Response::new(Empty::new().map_err(|never| match never {}).boxed())
            } else {
                let next = first.len() as u64;
                Response::new(Chunks { d: d.clone(), class, file, next, len, left: len, ready: Some(first), pending: None }.map_err(crate::body::BodyError::from).boxed())
            };
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
            r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(len));
            r
        }
        Err((status, why)) => {
            let mut r = answer(status, why);
            if status == StatusCode::SERVICE_UNAVAILABLE {
                r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            r
        }
    }
}

fn refusal(e: Rejected) -> (StatusCode, &'static str) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        match e {
            Rejected::Full => "the dispatch queue of this request's class is full",
            Rejected::Expired => "the request waited longer than dispatch.max_wait",
            Rejected::Stopped => "the proxy is stopping",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::{Class, DispatchConfig, Mode};

    #[test]
    fn a_body_that_cannot_be_read_to_its_length_ends_in_an_error() {
        use http_body_util::BodyExt;
        let path = std::env::temp_dir().join(format!("vectorlb-short-{}", std::process::id()));
        std::fs::write(&path, vec![5u8; 100_000]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let d = Arc::new(
            Dispatcher::start(DispatchConfig {
                workers: 1,
                mode: Mode::Priority,
                classes: vec![Class { name: "c".into(), share: 0 }],
                queue_limit: 8,
                max_wait: std::time::Duration::from_secs(5),
                lifo_above: 0,
                backend: Default::default(),
            })
            .unwrap(),
        );
        // Announced 200,000 bytes (as if the file had shrunk since it was opened).
        let (len, head, file) = first(&path, 1 << 20, false, false).unwrap();
        assert_eq!((len, head.len()), (100_000, CHUNK));
        let body = Chunks { d: d.clone(), class: 0, file, next: head.len() as u64, len: 200_000, left: 200_000, ready: Some(head), pending: None };
        let got = rt.block_on(body.collect());
        assert!(got.is_err(), "a short body must end in an error");
        // The whole file, announced right: every byte, no error.
        let (len, head, file) = first(&path, 1 << 20, false, false).unwrap();
        let body = Chunks { d, class: 0, file, next: head.len() as u64, len, left: len, ready: Some(head), pending: None };
        assert_eq!(rt.block_on(body.collect()).unwrap().to_bytes().len(), 100_000);
        let _ = std::fs::remove_file(&path);
    }

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
            backend: Default::default(),
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
