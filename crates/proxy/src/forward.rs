//! Forwarding a request to one endpoint of its cluster, chosen per request.

use crate::body::{answer, AnsweredBy, BodyError, ProxyBody};
use crate::config::{Cluster, Upstream};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use vectorlb_sched::{PickState, Scheduler, Target};

/// Counters of one endpoint.
#[derive(Debug)]
pub struct EndpointStats {
    /// Takes requests (its health check passes, or it has none).
    pub healthy: AtomicBool,
    pub health_checks: AtomicU64,
    pub health_failures: AtomicU64,
    pub requests: AtomicU64,
    /// Connections that could not be made (the request went to another endpoint or failed).
    pub connect_failures: AtomicU64,
    /// Responses that did not come (errors, timeouts) after the request was sent, or came
    /// broken (both Content-Length and chunked framing, a body cut or stalled).
    pub errors: AtomicU64,
    /// Requests answered 503 because every connection to it stayed busy for `queue_timeout`.
    pub queue_timeouts: AtomicU64,
    /// Writes to it that waited `send_timeout`, reads of a body that waited `read_timeout`.
    pub send_timeouts: AtomicU64,
    pub read_timeouts: AtomicU64,
}

impl Default for EndpointStats {
    fn default() -> EndpointStats {
        let z = || AtomicU64::new(0);
        EndpointStats {
            healthy: AtomicBool::new(true),
            health_checks: z(),
            health_failures: z(),
            requests: z(),
            connect_failures: z(),
            errors: z(),
            queue_timeouts: z(),
            send_timeouts: z(),
            read_timeouts: z(),
        }
    }
}

/// What an endpoint may be given at once: `max_connections` requests in flight and as many
/// connections open (idle ones included).
#[derive(Debug)]
pub struct Slots {
    pub max: usize,
    requests: Arc<Semaphore>,
    connections: Arc<Semaphore>,
}

impl Slots {
    fn new(max: usize) -> Slots {
        Slots { max, requests: Arc::new(Semaphore::new(max)), connections: Arc::new(Semaphore::new(max)) }
    }

    /// Connections open to the endpoint now.
    pub fn connections(&self) -> usize {
        self.max - self.connections.available_permits()
    }

    /// Requests in flight to the endpoint now.
    pub fn in_flight(&self) -> usize {
        self.max - self.requests.available_permits()
    }
}

/// A cluster at run time: its scheduler, its pool of upstream connections, its counters.
pub struct ClusterRt {
    pub spec: Cluster,
    /// The scheduler over the healthy endpoints (rebuilt when one changes) and its state.
    sched: Mutex<(Scheduler, PickState)>,
    client: Client<Connector, ProxyBody>,
    pub stats: Vec<Arc<EndpointStats>>,
    pub slots: Vec<Arc<Slots>>,
}

/// Opens connections to a cluster's endpoints, at most `max_connections` each (a connection
/// waits up to `queue_timeout` for one to close), every write bounded by `send_timeout`.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    endpoints: Arc<Vec<EndpointRef>>,
    queue_timeout: Duration,
    send_timeout: Duration,
}

/// An endpoint's address, limits and counters, as the connector finds them.
type EndpointRef = (SocketAddr, Arc<Slots>, Arc<EndpointStats>);

type Connecting = Pin<Box<dyn std::future::Future<Output = Result<UpstreamIo, BodyError>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = BodyError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        tower_service::Service::<Uri>::poll_ready(&mut self.http, cx).map_err(BodyError::from)
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let mut http = self.http.clone();
        let ep = uri.authority().and_then(|a| a.as_str().parse::<SocketAddr>().ok()).and_then(|a| self.endpoints.iter().find(|e| e.0 == a).cloned());
        let (queue_timeout, send_timeout) = (self.queue_timeout, self.send_timeout);
        Box::pin(async move {
            let Some((addr, slots, stats)) = ep else { return Err(format!("{uri} is not an endpoint of this cluster").into()) };
            let permit = match slots.connections.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => tokio::time::timeout(queue_timeout, slots.connections.clone().acquire_owned())
                    .await
                    .map_err(|_| format!("{addr}: all {} connections stayed busy for {queue_timeout:?}", slots.max))?
                    .map_err(|e| e.to_string())?,
            };
            let io = tower_service::Service::call(&mut http, uri).await?;
            Ok(UpstreamIo { inner: io, _permit: permit, send_timeout, timer: None, stats })
        })
    }
}

/// A connection to an endpoint: holds its place among the endpoint's connections, and fails
/// a write that waits longer than `send_timeout`.
pub struct UpstreamIo {
    inner: hyper_util::rt::TokioIo<tokio::net::TcpStream>,
    _permit: OwnedSemaphorePermit,
    send_timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    stats: Arc<EndpointStats>,
}

impl UpstreamIo {
    fn waited<T>(&mut self, cx: &mut Context<'_>, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if r.is_ready() {
            self.timer = None;
            return r;
        }
        let t = self.send_timeout;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(t)));
        if std::future::Future::poll(timer.as_mut(), cx).is_ready() {
            self.stats.send_timeouts.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("the endpoint took nothing for {t:?} (send_timeout)"))));
        }
        Poll::Pending
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: hyper::rt::ReadBufCursor<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.waited(cx, r)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.waited(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.waited(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl hyper_util::client::legacy::connect::Connection for UpstreamIo {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.inner.connected()
    }
}

/// A response body from an endpoint: holds the request's place among the endpoint's
/// requests until it ends, and fails when the next piece takes longer than `read_timeout`.
struct UpstreamBody {
    inner: Incoming,
    _permit: OwnedSemaphorePermit,
    read_timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    stats: Arc<EndpointStats>,
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => {
                let t = self.read_timeout;
                let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(t)));
                if std::future::Future::poll(timer.as_mut(), cx).is_ready() {
                    self.stats.read_timeouts.fetch_add(1, Ordering::Relaxed);
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Some(Err(format!("the endpoint sent nothing for {t:?} (read_timeout)").into())));
                }
                Poll::Pending
            }
            Poll::Ready(Some(Err(e))) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                Poll::Ready(Some(Err(e.into())))
            }
            r => {
                self.timer = None;
                r.map_err(BodyError::from)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The client side of a request being forwarded: its address, its body's deadline, and its
/// stream (marked once the request goes upstream).
pub struct ClientSide<'a> {
    pub addr: SocketAddr,
    pub stream: Option<&'a crate::client::StreamGuard>,
    pub body_timeout: Duration,
    pub stats: Option<&'a crate::client::ClientStats>,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Headers that describe one connection, not the message (RFC 9110 7.6.1); never forwarded.
const HOP_BY_HOP: [&str; 7] = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "proxy-authenticate", "proxy-authorization"];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    // TE may only say "trailers" beyond one hop (gRPC needs it).
    if h.get_all(hyper::header::TE).iter().any(|v| !v.as_bytes().eq_ignore_ascii_case(b"trailers")) {
        h.remove(hyper::header::TE);
    }
}

impl ClusterRt {
    pub fn new(spec: Cluster) -> Result<ClusterRt, vectorlb_sched::SchedError> {
        let targets: Vec<Target> = spec.endpoints.iter().map(|e| Target { weight: e.weight, key: fnv(e.address.to_string().as_bytes()) }).collect();
        let sched = Scheduler::new(spec.scheduler, &targets)?;
        let sched = Mutex::new((sched, PickState::default()));
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(spec.connect_timeout));
        http.set_nodelay(true);
        let stats: Vec<Arc<EndpointStats>> = spec.endpoints.iter().map(|_| Arc::default()).collect();
        let slots: Vec<Arc<Slots>> = spec.endpoints.iter().map(|_| Arc::new(Slots::new(spec.max_connections))).collect();
        let endpoints = Arc::new(spec.endpoints.iter().enumerate().map(|(i, e)| (e.address, slots[i].clone(), stats[i].clone())).collect());
        let conn = Connector { http, endpoints, queue_timeout: spec.queue_timeout, send_timeout: spec.send_timeout };
        let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(spec.max_idle).http2_only(spec.protocol == Upstream::Http2).build(conn);
        Ok(ClusterRt { spec, sched, client, stats, slots })
    }

    /// The endpoint for a request: round robin, weighted, or Maglev on the hash header's value
    /// (the client address without one).
    fn choose(&self, headers: &HeaderMap, client: SocketAddr, skip: Option<usize>) -> Option<usize> {
        let key = match self.spec.hash_header.as_deref().and_then(|h| headers.get(h)) {
            Some(v) => fnv(v.as_bytes()),
            None => fnv(client.ip().to_string().as_bytes()),
        };
        let h = vectorlb_sched::mix64(key);
        let first = {
            let mut g = self.sched.lock().unwrap_or_else(|e| e.into_inner());
            let (sched, st) = &mut *g;
            sched.pick(st, h, h, &[])? as usize
        };
        match skip {
            // The retry takes the next healthy endpoint that has a weight.
            Some(s) if s == first => (1..self.spec.endpoints.len()).map(|d| (first + d) % self.spec.endpoints.len()).find(|&i| self.takes_requests(i)),
            _ => Some(first),
        }
    }

    fn takes_requests(&self, i: usize) -> bool {
        self.spec.endpoints[i].weight > 0 && self.stats[i].healthy.load(Ordering::Relaxed)
    }

    /// Marks endpoint `i` healthy or not; the scheduler then balances over the healthy ones
    /// (Maglev moves only the keys of the endpoint that changed).
    pub fn set_healthy(&self, i: usize, up: bool) {
        if self.stats[i].healthy.swap(up, Ordering::Relaxed) == up {
            return;
        }
        tracing::warn!(cluster = %self.spec.name, endpoint = %self.spec.endpoints[i].address, "endpoint {}", if up { "healthy: takes requests again" } else { "unhealthy: takes no requests" });
        let targets: Vec<Target> = (0..self.spec.endpoints.len())
            .map(|j| Target { weight: if self.takes_requests(j) { self.spec.endpoints[j].weight } else { 0 }, key: fnv(self.spec.endpoints[j].address.to_string().as_bytes()) })
            .collect();
        // The same algorithm and sizes as at start, which were accepted then.
        if let Ok(s) = Scheduler::new(self.spec.scheduler, &targets) {
            *self.sched.lock().unwrap_or_else(|e| e.into_inner()) = (s, PickState::default());
        }
    }

    /// Sends `req` to an endpoint and returns its response, or an answer of the proxy's own:
    /// 503 when no endpoint could be connected to or every connection to it stayed busy for
    /// `queue_timeout`, 504 when the response head did not come in time, 502 for an upstream
    /// that broke the exchange (or framed its answer twice), 400 / 408 when the client's body
    /// was broken or stalled. A body of a known length up to `request_buffer` is read whole
    /// first; such a request (or one without a body) is sent to a second endpoint when the
    /// first refuses the connection.
    pub async fn forward(&self, req: Request<Incoming>, client: ClientSide<'_>) -> Response<ProxyBody> {
        let (mut parts, body) = req.into_parts();
        let client_error = |status: StatusCode, msg: &str| {
            if let Some(s) = client.stats {
                s.client_errors.fetch_add(1, Ordering::Relaxed);
            }
            let mut r = answer(status, msg);
            r.headers_mut().insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            r
        };
        let fault_answer = |f: crate::client::BodyFault| match f {
            crate::client::BodyFault::Framing => client_error(StatusCode::BAD_REQUEST, "the request body is badly framed"),
            crate::client::BodyFault::Timeout => {
                if let Some(s) = client.stats {
                    s.body_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                client_error(StatusCode::REQUEST_TIMEOUT, "the request body did not come in time (body_timeout)")
            }
        };
        let (body, fault) = crate::client::ClientBody::new(body, client.body_timeout);
        // A small body of a known length is read whole before any endpoint is involved.
        let known = body.size_hint().exact();
        let (buffered, mut streamed) = match known {
            Some(0) => (Some(Bytes::new()), None),
            Some(n) if n as usize <= self.spec.request_buffer => match body.collect().await {
                Ok(b) => (Some(b.to_bytes()), None),
                Err(_) => return fault_answer(fault.get().unwrap_or(crate::client::BodyFault::Framing)),
            },
            _ => (None, Some(body.boxed())),
        };
        let Some(first) = self.choose(&parts.headers, client.addr, None) else {
            return answer(StatusCode::SERVICE_UNAVAILABLE, &format!("cluster {}: no endpoint takes requests", self.spec.name));
        };
        strip_hop_by_hop(&mut parts.headers);
        // An HTTP/2 request names its host in :authority; an HTTP/1.1 upstream needs Host.
        if !parts.headers.contains_key(hyper::header::HOST) {
            if let Some(a) = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
                parts.headers.insert(hyper::header::HOST, a);
            }
        }
        let xff = match parts.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(prev) => format!("{prev}, {}", client.addr.ip()),
            None => client.addr.ip().to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            parts.headers.insert("x-forwarded-for", v);
        }
        let mut target = first;
        for attempt in 0..2 {
            let ep = self.spec.endpoints[target].address;
            let stats = &self.stats[target];
            // A place among the endpoint's requests, waited for no longer than queue_timeout.
            let slots = &self.slots[target];
            // The wait (and its timer) only when every place is taken.
            let permit = match slots.requests.clone().try_acquire_owned() {
                Ok(p) => Ok(p),
                Err(_) => tokio::time::timeout(self.spec.queue_timeout, slots.requests.clone().acquire_owned()).await.map_err(|_| ()).and_then(|r| r.map_err(|_| ())),
            };
            let permit = match permit {
                Ok(p) => p,
                Err(()) => {
                    stats.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                    return answer(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("cluster {}: all {} connections to {ep} stayed busy for {:?}", self.spec.name, self.slots[target].max, self.spec.queue_timeout),
                    );
                }
            };
            stats.requests.fetch_add(1, Ordering::Relaxed);
            let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let Ok(uri) = Uri::try_from(format!("http://{ep}{pq}")) else {
                return client_error(StatusCode::BAD_REQUEST, "the request target cannot be forwarded");
            };
            let up_body = match (&buffered, streamed.take()) {
                (Some(b), _) if b.is_empty() => Empty::new().map_err(|never| match never {}).boxed(),
                (Some(b), _) => Full::new(b.clone()).map_err(|never| match never {}).boxed(),
                (None, Some(s)) => s,
                (None, None) => return answer(StatusCode::SERVICE_UNAVAILABLE, &format!("cluster {}: cannot connect to {ep}", self.spec.name)),
            };
            let mut up = Request::new(up_body);
            *up.method_mut() = parts.method.clone();
            *up.headers_mut() = parts.headers.clone();
            *up.uri_mut() = uri;
            *up.version_mut() = match self.spec.protocol {
                Upstream::Http1 => Version::HTTP_11,
                Upstream::Http2 => Version::HTTP_2,
            };
            if let Some(s) = client.stream {
                s.forwarded();
            }
            // HTTP/1.1 only (HTTP/2 has no Transfer-Encoding): to poison the connection of a
            // double-framed answer (below).
            let captured = (self.spec.protocol == Upstream::Http1).then(|| hyper_util::client::legacy::connect::capture_connection(&mut up));
            match tokio::time::timeout(self.spec.response_timeout, self.client.request(up)).await {
                Ok(Ok(resp)) => {
                    let (mut rp, rb) = resp.into_parts();
                    // Both framings (RFC 9112 6.3): which one the endpoint meant cannot be known,
                    // so neither the answer nor its connection is used (dropping the unread body
                    // closes the connection).
                    if rp.headers.contains_key(hyper::header::TRANSFER_ENCODING) && rp.headers.contains_key(hyper::header::CONTENT_LENGTH) {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        if let Some(c) = &captured {
                            if let Some(m) = c.connection_metadata().as_ref() {
                                m.poison();
                            }
                        }
                        drop(rb);
                        tracing::warn!(cluster = %self.spec.name, endpoint = %ep, "answered with both Content-Length and Transfer-Encoding: refused");
                        return answer(StatusCode::BAD_GATEWAY, &format!("cluster {}: {ep} framed its answer twice", self.spec.name));
                    }
                    strip_hop_by_hop(&mut rp.headers);
                    rp.extensions.insert(AnsweredBy(ep));
                    let body = UpstreamBody { inner: rb, _permit: permit, read_timeout: self.spec.read_timeout, timer: None, stats: stats.clone() };
                    return Response::from_parts(rp, body.boxed());
                }
                Ok(Err(_)) if fault.get().is_some() => return fault_answer(fault.get().unwrap_or(crate::client::BodyFault::Framing)),
                Ok(Err(e)) if e.is_connect() => {
                    stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(cluster = %self.spec.name, endpoint = %ep, "connect: {e}");
                    let next = if attempt == 0 && buffered.is_some() { self.choose(&parts.headers, client.addr, Some(target)) } else { None };
                    match next {
                        Some(n) => target = n,
                        None => return answer(StatusCode::SERVICE_UNAVAILABLE, &format!("cluster {}: cannot connect to {ep}", self.spec.name)),
                    }
                }
                Ok(Err(e)) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(cluster = %self.spec.name, endpoint = %ep, "upstream: {e}");
                    return answer(StatusCode::BAD_GATEWAY, &format!("cluster {}: {ep} broke the exchange", self.spec.name));
                }
                Err(_) => {
                    if let Some(f) = fault.get() {
                        return fault_answer(f);
                    }
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    return answer(StatusCode::GATEWAY_TIMEOUT, &format!("cluster {}: no response from {ep} in {:?}", self.spec.name, self.spec.response_timeout));
                }
            }
        }
        answer(StatusCode::SERVICE_UNAVAILABLE, &format!("cluster {}: no endpoint could be connected to", self.spec.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["te", "x-kept"]);
        h.insert("te", HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key("te"));
    }
}
