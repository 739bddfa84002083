//! Forwarding a request to one endpoint of its cluster, chosen per request.

use crate::config::{Cluster, Upstream};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use vectorlb_sched::{PickState, Scheduler, Target};

pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// Why a body ended before its end: an upstream's error, or an object that could not be read
/// to its announced length. hyper then resets the HTTP/2 stream or closes the HTTP/1.1
/// connection, so the client never takes a short body for a whole one.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// Which endpoint answered a response (a response extension, for the access log).
#[derive(Debug, Clone, Copy)]
pub struct AnsweredBy(pub SocketAddr);

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
    /// Responses that did not come (errors, timeouts) after the request was sent.
    pub errors: AtomicU64,
}

impl Default for EndpointStats {
    fn default() -> EndpointStats {
        EndpointStats { healthy: AtomicBool::new(true), health_checks: AtomicU64::new(0), health_failures: AtomicU64::new(0), requests: AtomicU64::new(0), connect_failures: AtomicU64::new(0), errors: AtomicU64::new(0) }
    }
}

/// A cluster at run time: its scheduler, its pool of upstream connections, its counters.
pub struct ClusterRt {
    pub spec: Cluster,
    /// The scheduler over the healthy endpoints (rebuilt when one changes) and its state.
    sched: Mutex<(Scheduler, PickState)>,
    client: Client<HttpConnector, ProxyBody>,
    pub stats: Vec<EndpointStats>,
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

impl ClusterRt {
    pub fn new(spec: Cluster) -> Result<ClusterRt, vectorlb_sched::SchedError> {
        let targets: Vec<Target> = spec.endpoints.iter().map(|e| Target { weight: e.weight, key: fnv(e.address.to_string().as_bytes()) }).collect();
        let sched = Scheduler::new(spec.scheduler, &targets)?;
        let sched = Mutex::new((sched, PickState::default()));
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(spec.connect_timeout));
        conn.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(spec.max_idle)
            .http2_only(spec.protocol == Upstream::Http2)
            .build(conn);
        let stats = spec.endpoints.iter().map(|_| EndpointStats::default()).collect();
        Ok(ClusterRt { spec, sched, client, stats })
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
    /// 503 when no endpoint could be connected to, 504 when the response head did not come in
    /// time, 502 for an upstream that broke the exchange. A request without a body is sent to
    /// a second endpoint when the first refuses the connection.
    pub async fn forward(&self, req: Request<Incoming>, client: SocketAddr) -> Response<ProxyBody> {
        let (mut parts, body) = req.into_parts();
        let Some(first) = self.choose(&parts.headers, client, None) else {
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
            Some(prev) => format!("{prev}, {}", client.ip()),
            None => client.ip().to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            parts.headers.insert("x-forwarded-for", v);
        }
        let empty = body.is_end_stream();
        let mut body = Some(body.map_err(BodyError::from).boxed());
        let mut target = first;
        for attempt in 0..2 {
            let ep = self.spec.endpoints[target].address;
            let stats = &self.stats[target];
            stats.requests.fetch_add(1, Ordering::Relaxed);
            let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let Ok(uri) = Uri::try_from(format!("http://{ep}{pq}")) else {
                return answer(StatusCode::BAD_REQUEST, "the request target cannot be forwarded");
            };
            let mut up = Request::new(body.take().unwrap_or_else(|| Empty::new().map_err(|never| match never {}).boxed()));
            *up.method_mut() = parts.method.clone();
            *up.headers_mut() = parts.headers.clone();
            *up.uri_mut() = uri;
            *up.version_mut() = match self.spec.protocol {
                Upstream::Http1 => Version::HTTP_11,
                Upstream::Http2 => Version::HTTP_2,
            };
            match tokio::time::timeout(self.spec.response_timeout, self.client.request(up)).await {
                Ok(Ok(resp)) => {
                    let (mut rp, rb) = resp.into_parts();
                    strip_hop_by_hop(&mut rp.headers);
                    rp.extensions.insert(AnsweredBy(ep));
                    return Response::from_parts(rp, rb.map_err(BodyError::from).boxed());
                }
                Ok(Err(e)) if e.is_connect() => {
                    stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(cluster = %self.spec.name, endpoint = %ep, "connect: {e}");
                    let next = if attempt == 0 && empty { self.choose(&parts.headers, client, Some(target)) } else { None };
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
