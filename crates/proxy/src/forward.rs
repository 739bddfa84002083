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
    /// Of those, requests whose own client connection held its `client_share` of them.
    pub share_timeouts: AtomicU64,
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
            share_timeouts: z(),
            send_timeouts: z(),
            read_timeouts: z(),
        }
    }
}

/// What an endpoint may be given at once: `max_connections` requests in flight and as many
/// connections open (idle ones included). One per endpoint address for the life of the
/// process ([`SlotRegistry`]): every cluster naming the address and every configuration
/// a reload serves share it, so that reloads never add a cap.
#[derive(Debug)]
pub struct Slots {
    max: std::sync::atomic::AtomicUsize,
    requests: Arc<Semaphore>,
    connections: Arc<Semaphore>,
}

impl Slots {
    fn new(max: usize) -> Slots {
        Slots { max: max.into(), requests: Arc::new(Semaphore::new(max)), connections: Arc::new(Semaphore::new(max)) }
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// A reload's new cap: permits added, or taken away as they come back.
    fn resize(&self, max: usize) {
        let old = self.max.swap(max, Ordering::Relaxed);
        for sem in [&self.requests, &self.connections] {
            if max > old {
                sem.add_permits(max - old);
            } else if max < old {
                let fewer = old - max;
                let rest = fewer - sem.forget_permits(fewer);
                if rest > 0 {
                    if let Ok(rt) = tokio::runtime::Handle::try_current() {
                        let sem = sem.clone();
                        rt.spawn(async move {
                            if let Ok(p) = sem.acquire_many_owned(rest as u32).await {
                                p.forget();
                            }
                        });
                    }
                }
            }
        }
    }

    /// Connections open to the endpoint now.
    pub fn connections(&self) -> usize {
        self.max().saturating_sub(self.connections.available_permits())
    }

    /// Requests in flight to the endpoint now.
    pub fn in_flight(&self) -> usize {
        self.max().saturating_sub(self.requests.available_permits())
    }
}

/// The [`Slots`] of every endpoint address, shared by every configuration the process serves.
pub type SlotRegistry = Arc<Mutex<std::collections::HashMap<SocketAddr, std::sync::Weak<Slots>>>>;

/// The slots of `addr` with cap `max`: the ones in use (resized), or new ones.
fn slots_for(registry: &SlotRegistry, addr: SocketAddr, max: usize) -> Arc<Slots> {
    let mut r = registry.lock().unwrap_or_else(|e| e.into_inner());
    r.retain(|_, w| w.strong_count() > 0);
    if let Some(s) = r.get(&addr).and_then(std::sync::Weak::upgrade) {
        if s.max() != max {
            s.resize(max);
        }
        return s;
    }
    let s = Arc::new(Slots::new(max));
    r.insert(addr, Arc::downgrade(&s));
    s
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
                    .map_err(|_| format!("{addr}: all {} connections stayed busy for {queue_timeout:?}", slots.max()))?
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
    /// The place among the client connection's share of the endpoint.
    _share: OwnedSemaphorePermit,
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

/// The client side of a request being forwarded: its address and its stream (marked once the
/// request goes upstream; its connection has the client's limits, counters and budgets).
pub struct ClientSide<'a> {
    pub addr: SocketAddr,
    pub stream: &'a crate::client::StreamGuard,
}

/// A request body read whole before forwarding ([`buffer`]), or as much of it as the memory
/// budgets allowed, the rest to stream.
enum Buffered {
    Whole(Bytes),
    Part(Vec<Bytes>, crate::client::ClientBody),
}

/// Memory taken from a connection's budgets for a buffered body; given back when dropped.
struct Held {
    conn: Arc<crate::client::Conn>,
    bytes: usize,
}

impl Held {
    fn grow(&mut self, n: usize) -> bool {
        let ok = self.conn.take_buffer(n);
        if ok {
            self.bytes += n;
        }
        ok
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.conn.give_buffer(self.bytes);
    }
}

/// Reads a body of `len` bytes whole, copying each piece into one allocation (a piece holds
/// the read buffer it came in, so keeping the pieces of a body sent a byte per segment would
/// keep a buffer per byte). The allocation grows by doubling, each step charged to `held`
/// first; when a budget refuses, what came so far is returned with the body, to stream.
async fn buffer(mut body: crate::client::ClientBody, len: usize, held: &mut Held) -> Result<Buffered, ()> {
    let mut buf: Vec<u8> = Vec::new();
    while let Some(f) = body.frame().await {
        // Trailers of a body of a known length are not forwarded (as before buffering).
        let Ok(data) = f.map_err(|_| ())?.into_data() else { continue };
        let need = buf.len() + data.len();
        if need > buf.capacity() {
            let want = (buf.capacity() * 2).max(4096).min(len).max(need);
            if !held.grow(want - buf.capacity()) {
                let head = [Bytes::from(buf), data].into_iter().filter(|b| !b.is_empty()).collect();
                return Ok(Buffered::Part(head, body));
            }
            buf.reserve_exact(want - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(Buffered::Whole(Bytes::from(buf)))
}

/// A request body whose first pieces were read ahead.
struct Prefixed {
    head: std::collections::VecDeque<Bytes>,
    rest: crate::client::ClientBody,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
        if let Some(b) = self.head.pop_front() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(b))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        let head: u64 = self.head.iter().map(|b| b.len() as u64).sum();
        let rest = self.rest.size_hint();
        let mut h = hyper::body::SizeHint::new();
        h.set_lower(rest.lower() + head);
        if let Some(u) = rest.upper() {
            h.set_upper(u + head);
        }
        h
    }
}

/// A place among `sem`'s, waited for until `deadline` (set on the first wait, so that the
/// waits of one request share one `queue_timeout`); None when it passed.
async fn acquire(sem: &Arc<Semaphore>, deadline: &mut Option<tokio::time::Instant>, wait: Duration) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = sem.clone().try_acquire_owned() {
        return Some(p);
    }
    let d = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + wait);
    tokio::time::timeout_at(d, sem.clone().acquire_owned()).await.ok()?.ok()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Headers that describe one connection, not the message (RFC 9110 7.6.1); never forwarded.
const HOP_BY_HOP: [&str; 7] = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "proxy-authenticate", "proxy-authorization"];

/// Removes the hop-by-hop headers and those `Connection` names, except the names in `keep`
/// (and Host and Content-Length, always): a peer must not be able to strip the headers a
/// request was routed on (`Connection: host` would leave the upstream its own address as the
/// host) or the framing of a message.
pub fn strip_hop_by_hop(h: &mut HeaderMap, keep: &[HeaderName]) {
    let listed: Vec<HeaderName> = h
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .filter(|n| *n != hyper::header::HOST && *n != hyper::header::CONTENT_LENGTH && !keep.contains(n))
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
    /// A cluster's run time; its endpoints' slots from `registry` (one cap per address).
    pub fn new(spec: Cluster, registry: &SlotRegistry) -> Result<ClusterRt, vectorlb_sched::SchedError> {
        let targets: Vec<Target> = spec.endpoints.iter().map(|e| Target { weight: e.weight, key: fnv(e.address.to_string().as_bytes()) }).collect();
        let sched = Scheduler::new(spec.scheduler, &targets)?;
        let sched = Mutex::new((sched, PickState::default()));
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(spec.connect_timeout));
        http.set_nodelay(true);
        let stats: Vec<Arc<EndpointStats>> = spec.endpoints.iter().map(|_| Arc::default()).collect();
        let slots: Vec<Arc<Slots>> = spec.endpoints.iter().map(|e| slots_for(registry, e.address, spec.max_connections)).collect();
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
    /// 503 when no endpoint could be connected to, every connection to it stayed busy for
    /// `queue_timeout` (or the client connection's share of them did), or the client
    /// connection is going away (over its reset budget, evicted); 504 when the response head
    /// did not come in time, 502 for an upstream that broke the exchange (framed its answer
    /// twice, switched protocols unasked), 400 / 408 when the client's body was broken or too
    /// slow. A body of a known length up to `request_buffer` is read whole first, within the
    /// connection's and the process's memory budgets (else streamed); such a request (or one
    /// without a body) is sent to a second endpoint when the first refuses the connection.
    pub async fn forward(&self, req: Request<Incoming>, client: ClientSide<'_>) -> Response<ProxyBody> {
        let (mut parts, body) = req.into_parts();
        let conn = client.stream.conn();
        let going = || answer(StatusCode::SERVICE_UNAVAILABLE, "this connection is closing: none of its requests goes upstream any more");
        if conn.going() {
            return going();
        }
        let client_error = |status: StatusCode, msg: &str| {
            conn.stats().client_errors.fetch_add(1, Ordering::Relaxed);
            let mut r = answer(status, msg);
            r.headers_mut().insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            r
        };
        let fault_answer = |f: crate::client::BodyFault| match f {
            crate::client::BodyFault::Framing => client_error(StatusCode::BAD_REQUEST, "the request body is badly framed"),
            crate::client::BodyFault::Timeout => {
                conn.stats().body_timeouts.fetch_add(1, Ordering::Relaxed);
                client_error(StatusCode::REQUEST_TIMEOUT, "the request body did not come in time (body_timeout, min_rate)")
            }
        };
        // A gRPC body is a stream of messages at the application's pace: the gap deadline only.
        let grpc = parts.headers.get(hyper::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let limits = conn.limits();
        let (body, fault) = crate::client::ClientBody::new(body, limits.body_timeout, if grpc { 0 } else { limits.min_rate }, Some(conn.clone()));
        // A small body of a known length is read whole before any endpoint is involved.
        let mut held = Held { conn: conn.clone(), bytes: 0 };
        let (buffered, mut streamed) = match body.size_hint().exact() {
            Some(0) => (Some(Bytes::new()), None),
            Some(n) if n as usize <= self.spec.request_buffer => match buffer(body, n as usize, &mut held).await {
                Ok(Buffered::Whole(b)) => (Some(b), None),
                Ok(Buffered::Part(head, rest)) => (None, Some(Prefixed { head: head.into(), rest }.boxed())),
                Err(()) => return fault_answer(fault.get().unwrap_or(crate::client::BodyFault::Framing)),
            },
            _ => (None, Some(body.boxed())),
        };
        let Some(first) = self.choose(&parts.headers, client.addr, None) else {
            return answer(StatusCode::SERVICE_UNAVAILABLE, &format!("cluster {}: no endpoint takes requests", self.spec.name));
        };
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
            let slots = &self.slots[target];
            // A place among the client connection's share of the endpoint, then among the
            // endpoint's requests; both waited for no longer than queue_timeout together.
            let mut deadline = None;
            let Some(share) = acquire(&conn.share(ep, slots.max(), self.spec.client_share), &mut deadline, self.spec.queue_timeout).await else {
                stats.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                stats.share_timeouts.fetch_add(1, Ordering::Relaxed);
                return answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!(
                        "cluster {}: this client connection held its share ({}) of the connections to {ep} for {:?}",
                        self.spec.name, self.spec.client_share, self.spec.queue_timeout
                    ),
                );
            };
            let Some(permit) = acquire(&slots.requests, &mut deadline, self.spec.queue_timeout).await else {
                stats.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                return answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("cluster {}: all {} connections to {ep} stayed busy for {:?}", self.spec.name, slots.max(), self.spec.queue_timeout),
                );
            };
            // Over its reset budget while it waited: refused at once, not sent.
            if conn.going() {
                return going();
            }
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
            client.stream.forwarded();
            // HTTP/1.1 only (HTTP/2 has no Transfer-Encoding): to poison the connection of a
            // double-framed answer (below).
            let captured = (self.spec.protocol == Upstream::Http1).then(|| hyper_util::client::legacy::connect::capture_connection(&mut up));
            match tokio::time::timeout(self.spec.response_timeout, self.client.request(up)).await {
                Ok(Ok(resp)) => {
                    let (mut rp, rb) = resp.into_parts();
                    // Both framings (RFC 9112 6.3): which one the endpoint meant cannot be known,
                    // so neither the answer nor its connection is used (dropping the unread body
                    // closes the connection). A 101 answers an upgrade nobody asked for (the
                    // proxy forwards no Upgrade): what follows is not HTTP, and HTTP/2 has no 101.
                    let double = rp.headers.contains_key(hyper::header::TRANSFER_ENCODING) && rp.headers.contains_key(hyper::header::CONTENT_LENGTH);
                    if double || rp.status == StatusCode::SWITCHING_PROTOCOLS {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        if let Some(c) = &captured {
                            if let Some(m) = c.connection_metadata().as_ref() {
                                m.poison();
                            }
                        }
                        drop(rb);
                        let why = if double { "framed its answer twice" } else { "switched protocols unasked (101)" };
                        tracing::warn!(cluster = %self.spec.name, endpoint = %ep, "{why}: refused");
                        return answer(StatusCode::BAD_GATEWAY, &format!("cluster {}: {ep} {why}", self.spec.name));
                    }
                    strip_hop_by_hop(&mut rp.headers, &[]);
                    rp.extensions.insert(AnsweredBy(ep));
                    let body = UpstreamBody { inner: rb, _permit: permit, _share: share, read_timeout: self.spec.read_timeout, timer: None, stats: stats.clone() };
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
        strip_hop_by_hop(&mut h, &[]);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["te", "x-kept"]);
        h.insert("te", HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h, &[]);
        assert!(!h.contains_key("te"));
        // Connection cannot name what a request is routed or framed on.
        h.insert("connection", HeaderValue::from_static("host, Content-Length, x-route, x-other"));
        for n in ["host", "content-length", "x-route", "x-other"] {
            h.insert(n, HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut h, &[HeaderName::from_static("x-route")]);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["content-length", "host", "x-kept", "x-route"]);
    }
}
