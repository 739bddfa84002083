//! Serving a router on a TCP address or a unix socket, with the limits a local control API
//! needs: a bounded number of connections (past it, a 503 at once), one request per
//! connection, a deadline for the request head and one for the whole exchange, bounded bodies.
//! Shared by the load balancer's API and the proxy's admin API.

use crate::error::{ApiError, MAX_BODY};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Connections served at once; the next ones get a 503 and are closed. A connection costs a
/// task and a few kilobytes, so the bound is high: clients that drip their requests time out
/// (below) without keeping others out.
pub const MAX_CONNECTIONS: usize = 512;
/// Time a client has to send the request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a whole exchange (head, body, handling, answer) may take.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);

/// Where an API listens: `ADDRESS:PORT` or `unix:PATH` (the same form clients use).
pub use vectorlb_client::Target as Endpoint;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    BadEndpoint(#[from] vectorlb_client::Error),
    #[error("cannot listen on {endpoint}: {source}{hint}")]
    Bind { endpoint: String, source: std::io::Error, hint: &'static str },
    #[error("runtime.api_group: no group named '{0}'")]
    NoGroup(String),
}

/// Who may use a unix-socket API: root only (mode 0600), or a group too (0660).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    pub group: Option<String>,
}

/// A bound listener, ready to serve.
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    /// The socket, its path and its (device, inode): only that file is removed at the end.
    Unix(tokio::net::UnixListener, PathBuf, (u64, u64)),
}

impl Listener {
    /// Binds `endpoint`. A unix socket path that exists is replaced only when it is a socket
    /// nothing answers on (a stale socket of a daemon that died); a live one is an error, and
    /// so is any other kind of file (a configuration, a directory, a link), which is never
    /// touched. A unix socket is created with mode 0600 (0660 and the group of `access`); no
    /// other user can connect, not even between its creation and the change of mode.
    pub async fn bind(endpoint: &Endpoint, access: &Access) -> Result<Listener, ServerError> {
        let fail = |source, hint| ServerError::Bind { endpoint: endpoint.to_string(), source, hint };
        match endpoint {
            Endpoint::Tcp(a) => tokio::net::TcpListener::bind(a).await.map(Listener::Tcp).map_err(|e| fail(e, " (another vectorlb running?)")),
            Endpoint::Unix(p) => {
                use std::os::unix::fs::FileTypeExt;
                match std::fs::symlink_metadata(p) {
                    Ok(m) if !m.file_type().is_socket() => {
                        return Err(fail(
                            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                            " (the path is not a socket but another kind of file; it is left as it is: choose another path)",
                        ));
                    }
                    Ok(_) => {
                        if tokio::net::UnixStream::connect(p).await.is_ok() {
                            return Err(fail(std::io::Error::from(std::io::ErrorKind::AddrInUse), " (another vectorlb is serving it)"));
                        }
                        // A socket nobody answers on: left by a process that is gone.
                        let _ = std::fs::remove_file(p);
                    }
                    Err(_) => {}
                }
                let gid = match &access.group {
                    Some(g) => Some(group_id(g).ok_or_else(|| ServerError::NoGroup(g.clone()))?),
                    None => None,
                };
                // The mask is per process: two binds at once would each put back the other's
                // 0o177 or the default, and a socket could be created 0755. One at a time.
                static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());
                let _one = UMASK.lock().unwrap_or_else(|e| e.into_inner());
                // SAFETY: umask only sets the process's file-creation mask; the previous mask is
                // put back right after the bind.
                let old = unsafe { libc::umask(0o177) };
                let bound = tokio::net::UnixListener::bind(p);
                // SAFETY: as above.
                unsafe { libc::umask(old) };
                let l = bound.map_err(|e| fail(e, ""))?;
                if let Some(gid) = gid {
                    std::os::unix::fs::chown(p, None, Some(gid)).map_err(|e| fail(e, " (changing the socket's group)"))?;
                    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o660)).map_err(|e| fail(e, ""))?;
                }
                let id = std::fs::symlink_metadata(p).map(|m| (std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m))).map_err(|e| fail(e, ""))?;
                Ok(Listener::Unix(l, p.clone(), id))
            }
        }
    }
}

/// The id of group `name`.
fn group_id(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    let mut grp: libc::group = unsafe_zeroed_group();
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r writes into `grp` and `buf` (whose length it is given) and sets `out`
    // to `&grp` on success or null; nothing is kept past the call.
    let r = unsafe { libc::getgrnam_r(c.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(grp.gr_gid)
}

fn unsafe_zeroed_group() -> libc::group {
    // SAFETY: libc::group is a plain C struct of pointers and integers; all zeroes (null
    // pointers) is a valid value, and getgrnam_r overwrites it.
    unsafe { std::mem::zeroed() }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Our socket only: not a file that replaced it meanwhile.
        if let Listener::Unix(_, p, id) = self {
            if std::fs::symlink_metadata(&p).is_ok_and(|m| (std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m)) == *id) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Serves `router` on `listener` until `stop` resolves. With a `token`, every request must
/// carry `Authorization: Bearer <token>` (a TCP API; the unix socket's mode guards it).
pub async fn serve(listener: Listener, router: Router, token: Option<String>, stop: impl std::future::Future<Output = ()>) {
    let router = match token {
        Some(t) => router.layer(axum::middleware::from_fn_with_state(Arc::new(t), require_token)),
        None => router,
    };
    let router = with_conventions(router);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // The connections served, oldest first: (whether its request head has come, its task).
    let mut open: std::collections::VecDeque<(Arc<std::sync::atomic::AtomicBool>, tokio::task::AbortHandle)> = Default::default();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            accepted = accept(&listener) => {
                let Some(conn) = accepted else { continue };
                let permit = match slots.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => {
                        // Full: the oldest connection whose request head has not come makes
                        // room (slow clients cannot keep the operator out); with none, a 503.
                        open.retain(|(_, t)| !t.is_finished());
                        let waiting = open.iter().position(|(head, _)| !head.load(std::sync::atomic::Ordering::Relaxed));
                        let freed = match waiting.and_then(|i| open.remove(i)) {
                            Some((_, t)) => {
                                t.abort();
                                tokio::time::timeout(Duration::from_millis(200), slots.clone().acquire_owned()).await.ok().and_then(Result::ok)
                            }
                            None => None,
                        };
                        match freed {
                            Some(p) => p,
                            None => {
                                tokio::spawn(refuse(conn));
                                continue;
                            }
                        }
                    }
                };
                let router = router.clone();
                let head = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let seen = head.clone();
                let task = tokio::spawn(async move {
                    let _permit = permit;
                    let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, serve_one(conn, router, seen)).await;
                });
                if open.len() >= MAX_CONNECTIONS {
                    open.retain(|(_, t)| !t.is_finished());
                }
                open.push_back((head, task.abort_handle()));
            }
        }
    }
}

trait Conn: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Conn for T {}

async fn accept(l: &Listener) -> Option<Box<dyn Conn>> {
    let r: std::io::Result<Box<dyn Conn>> = match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| Box::new(s) as Box<dyn Conn>),
        Listener::Unix(l, _, _) => l.accept().await.map(|(s, _)| Box::new(s) as Box<dyn Conn>),
    };
    match r {
        Ok(c) => Some(c),
        Err(_) => {
            // Out of file descriptors or a similar passing condition: do not spin.
            tokio::time::sleep(Duration::from_millis(20)).await;
            None
        }
    }
}

async fn refuse(mut conn: Box<dyn Conn>) {
    let body = b"{\"error\":\"too many API connections\"}\n";
    let head = format!("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = conn.write_all(head.as_bytes()).await;
        let _ = conn.write_all(body).await;
        let _ = conn.shutdown().await;
    })
    .await;
}

async fn serve_one(conn: Box<dyn Conn>, router: Router, head: Arc<std::sync::atomic::AtomicBool>) {
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        head.store(true, std::sync::atomic::Ordering::Relaxed);
        let router = router.clone();
        async move { router.oneshot(req.map(axum::body::Body::new)).await }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(false)
        // A client may shut its sending side once the request is out (curl, scripts, tests).
        .half_close(true)
        .serve_connection(TokioIo::new(conn), service)
        .await;
}

/// The conventions every API shares: bounded bodies, a trailing slash ignored, JSON for 404 and
/// 405 (with `Allow`). [`serve`] applies them; tests that drive a router directly do too.
pub fn with_conventions(router: Router) -> Router {
    let inner = router.fallback(not_found).layer(axum::extract::DefaultBodyLimit::max(MAX_BODY));
    // A layer runs after its router has matched the path, so the slash is trimmed by an outer
    // router that has no routes of its own; the inner router's 405 carries its Allow header by
    // the time the outer layer sees it.
    Router::new().fallback_service(inner).layer(axum::middleware::from_fn(json_405)).layer(axum::middleware::from_fn(trim_slash))
}

/// Reads a TCP API's token from `path`: a regular file that only its owner can read, holding
/// at least 16 printable characters. The problem, if not.
pub fn read_token(path: &str) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!("mode {:o} lets others read it (chmod 600)", meta.permissions().mode() & 0o777));
    }
    let t = std::fs::read_to_string(path).map_err(|e| e.to_string())?.trim().to_string();
    if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the token must be at least 16 printable characters (for example: openssl rand -hex 32)".into());
    }
    Ok(t)
}

/// Compares in time that does not depend on where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// What a request presents in `Authorization`.
#[derive(Debug, PartialEq, Eq)]
enum Credentials {
    /// `Bearer <token>`: `ctl`, scripts, Prometheus; may read and change.
    Bearer(Vec<u8>),
    /// `Basic base64(user:token)`, any user: a browser's login for the status page. Browsers
    /// send cached Basic credentials along with requests other sites make them send, so these
    /// only read: a change made through them would be a cross-site request forgery.
    Basic(Vec<u8>),
    Malformed,
}

fn credentials(v: &str) -> Credentials {
    if let Some(t) = v.strip_prefix("Bearer ") {
        return Credentials::Bearer(t.trim().as_bytes().to_vec());
    }
    if let Some(b) = v.strip_prefix("Basic ") {
        return match vectorlb_client::base64_decode(b.trim()) {
            Some(d) => match d.iter().position(|&c| c == b':') {
                Some(i) => Credentials::Basic(d[i + 1..].to_vec()),
                None => Credentials::Malformed,
            },
            None => Credentials::Malformed,
        };
    }
    Credentials::Malformed
}

async fn require_token(axum::extract::State(token): axum::extract::State<Arc<String>>, req: Request, next: Next) -> Response {
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(credentials);
    let reads = matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    match given {
        Some(Credentials::Bearer(g)) if same(&g, token.as_bytes()) => next.run(req).await,
        Some(Credentials::Basic(g)) if same(&g, token.as_bytes()) => {
            if reads {
                next.run(req).await
            } else {
                ApiError::Unauthorized(format!("Authorization: a browser login (Basic) only reads; {} needs `Authorization: Bearer <token>`", req.method())).into_response()
            }
        }
        Some(Credentials::Malformed) => {
            ApiError::Unauthorized("Authorization: expected `Bearer <token>` (or, to read, Basic with the token as the password)".into()).into_response()
        }
        Some(_) => ApiError::Unauthorized("Authorization: the token is wrong".into()).into_response(),
        None => ApiError::Unauthorized("Authorization: this API needs `Authorization: Bearer <token>` (vectorlb ctl --token-file FILE)".into()).into_response(),
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::NotFound(format!("no such endpoint: {} (see /openapi.json)", req.uri().path()))
}

async fn trim_slash(mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if path.len() > 1 && path.ends_with('/') {
        let trimmed = path.trim_end_matches('/');
        let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
        let pq = match req.uri().query() {
            Some(q) => format!("{trimmed}?{q}"),
            None => trimmed.to_string(),
        };
        if let Ok(uri) = pq.parse() {
            *req.uri_mut() = uri;
        }
    }
    next.run(req).await
}

async fn json_405(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let res = next.run(req).await;
    if res.status() == StatusCode::METHOD_NOT_ALLOWED {
        let allow = res.headers().get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let msg = format!("method {method} is not allowed on {path} (allowed: {allow})");
        let mut r = ApiError::BadRequest(msg).into_response();
        *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        if let Ok(v) = HeaderValue::from_str(&allow) {
            r.headers_mut().insert(header::ALLOW, v);
        }
        return r;
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_take_the_password_of_basic_and_the_token_of_bearer() {
        assert_eq!(credentials("Bearer  s3cret "), Credentials::Bearer(b"s3cret".to_vec()));
        // "ui:s3:cret" - the password is everything after the first colon.
        assert_eq!(credentials("Basic dWk6czM6Y3JldA=="), Credentials::Basic(b"s3:cret".to_vec()));
        assert_eq!(credentials("Basic dWk="), Credentials::Malformed, "no colon");
        assert_eq!(credentials("Basic ###"), Credentials::Malformed);
        assert_eq!(credentials("Digest x"), Credentials::Malformed);
    }
}
