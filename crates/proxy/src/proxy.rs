//! The configuration in force and what it does with a request: its one authority, its route,
//! and the answer (made here, read from a static object, or forwarded to a cluster).

use crate::body::{answer, ProxyBody};
use crate::client::{ClientStats, StreamGuard};
use crate::config::{Config, SplitTo};
use crate::error::ServeError;
use crate::forward::ClusterRt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Everything a request needs: the routes and the clusters.
pub struct Proxy {
    pub config: Config,
    /// Kept across a reload when their configuration is the same (their pools, counters and
    /// health with them).
    pub clusters: Vec<Arc<ClusterRt>>,
    /// The endpoints' connection caps, one per address, shared with every configuration
    /// before and after this one.
    pub slots: crate::forward::SlotRegistry,
    /// Per listener: its TLS acceptor and handshake counters (None: plain text).
    pub tls: Vec<Option<(boring::ssl::SslAcceptor, Arc<crate::stats::TlsStats>)>>,
    /// Per listener: requests received.
    pub requests: Vec<std::sync::atomic::AtomicU64>,
    /// Per listener: its clients' connections, deadlines and faults.
    pub clients: Vec<Arc<ClientStats>>,
    pub started: std::time::Instant,
    /// Set when a reload replaced it (its health checks stop).
    pub retired: std::sync::atomic::AtomicBool,
    pub access_log: Option<crate::access_log::AccessLog>,
    /// The pool that reads static objects by priority class (with `static` routes).
    pub dispatch: Option<Arc<crate::dispatch::Dispatcher>>,
    /// Headers that routes match on and clusters hash on: a client's `Connection` cannot
    /// strip them before they reach the upstream.
    pub routing_headers: Vec<hyper::header::HeaderName>,
}

impl Proxy {
    pub fn new(config: Config) -> Result<Proxy, ServeError> {
        Proxy::reusing(config, None)
    }

    /// As `new`, but keeping `old`'s dispatch pool when the dispatch configuration is the same
    /// (a reload then starts no threads, and old and new requests share one queue and order),
    /// its clusters whose configuration is the same, and its endpoints' caps.
    pub fn reusing(config: Config, old: Option<&Proxy>) -> Result<Proxy, ServeError> {
        config.check_descriptors(crate::client::nofile_limit())?;
        let slots = old.map(|o| o.slots.clone()).unwrap_or_default();
        let clusters = config
            .clusters
            .iter()
            .enumerate()
            .map(|(index, c)| match old.and_then(|o| o.clusters.iter().find(|k| k.spec == *c)) {
                Some(same) => Ok(same.clone()),
                None => ClusterRt::new(c.clone(), &slots).map(Arc::new).map_err(|source| ServeError::Scheduler { index, name: c.name.clone(), source }),
            })
            .collect::<Result<_, _>>()?;
        let mut tls = Vec::new();
        for (i, l) in config.listeners.iter().enumerate() {
            tls.push(match &l.tls {
                Some(t) => Some(crate::tls::acceptor(&format!("listeners[{i}].tls"), t)?),
                None => None,
            });
        }
        let requests = config.listeners.iter().map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
        let clients = config.listeners.iter().map(|_| Arc::default()).collect();
        let access_log = match &config.access_log {
            Some(p) => Some(crate::access_log::AccessLog::open(p).map_err(ServeError::AccessLog)?),
            None => None,
        };
        let dispatch = match (&config.dispatch, old.and_then(|o| o.dispatch.as_ref())) {
            (Some(d), Some(keep)) if keep.config() == d => Some(keep.clone()),
            (Some(d), _) => Some(Arc::new(crate::dispatch::Dispatcher::start(d.clone()).map_err(ServeError::Dispatch)?)),
            (None, _) => None,
        };
        let mut routing_headers: Vec<hyper::header::HeaderName> = Vec::new();
        for name in config.routes.iter().flat_map(|r| r.matches.headers.iter().map(|(n, _)| n)).chain(config.clusters.iter().filter_map(|c| c.hash_header.as_ref())) {
            if let Ok(n) = hyper::header::HeaderName::from_bytes(name.as_bytes()) {
                if !routing_headers.contains(&n) {
                    routing_headers.push(n);
                }
            }
        }
        Ok(Proxy { config, clusters, slots, tls, requests, clients, started: std::time::Instant::now(), retired: Default::default(), access_log, dispatch, routing_headers })
    }

    pub(crate) async fn handle(&self, index: usize, listener: &str, req: Request<Incoming>, client: SocketAddr, stream: &StreamGuard) -> Response<ProxyBody> {
        self.requests[index].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(log) = &self.access_log else { return self.route(index, listener, req, client, stream).await };
        let started = std::time::Instant::now();
        let (method, uri, version) = (req.method().clone(), req.uri().clone(), req.version());
        let host = req.headers().get(hyper::header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string);
        let resp = self.route(index, listener, req, client, stream).await;
        let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        log.log(&crate::access_log::Entry {
            time: (time * 1e6).round() / 1e6,
            listener,
            client: client.to_string(),
            method: method.as_str(),
            authority: uri.authority().map(|a| a.as_str()).or(host.as_deref()),
            path: uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
            protocol: match version {
                hyper::Version::HTTP_2 => "HTTP/2",
                hyper::Version::HTTP_10 => "HTTP/1.0",
                _ => "HTTP/1.1",
            },
            status: resp.status().as_u16(),
            upstream: resp.extensions().get::<crate::body::AnsweredBy>().map(|a| a.0.to_string()),
            duration_ms: (started.elapsed().as_secs_f64() * 1e6).round() / 1e3,
        });
        resp
    }

    async fn route(&self, index: usize, listener: &str, req: Request<Incoming>, client: SocketAddr, stream: &StreamGuard) -> Response<ProxyBody> {
        let (mut parts, body) = req.into_parts();
        let host = match crate::route::one_authority(&mut parts) {
            Ok(h) => h,
            Err(why) => {
                self.clients[index].client_errors.fetch_add(1, Ordering::Relaxed);
                let mut r = answer(StatusCode::BAD_REQUEST, why);
                r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
                *r.version_mut() = parts.version;
                return r;
            }
        };
        let Some(r) = crate::route::find_for_host(&self.config.routes, listener, &parts, host.as_deref()) else {
            return answer(StatusCode::NOT_FOUND, "no route for this request");
        };
        let route = &self.config.routes[r];
        let cluster = match &route.action {
            crate::config::Action::Cluster(c) => *c,
            crate::config::Action::Split(split) => match pick(split) {
                crate::config::SplitTo::Cluster(c) => c,
                crate::config::SplitTo::Status(503) => return answer(StatusCode::SERVICE_UNAVAILABLE, "this request's share of the route goes to a backend without endpoints"),
                crate::config::SplitTo::Status(st) => {
                    return answer(
                        StatusCode::from_u16(st).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        "this request's share of the route goes to a backend that could not be resolved",
                    )
                }
            },
            crate::config::Action::Redirect(rd) => {
                if host.is_none() && rd.host.is_none() {
                    return answer(StatusCode::BAD_REQUEST, "a redirect to the same host needs the request's Host");
                }
                let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
                let location = rd.location(host.as_deref().unwrap_or_default(), pq, route.matches.path.matched());
                let mut r = crate::body::respond(StatusCode::from_u16(rd.status).unwrap_or(StatusCode::FOUND), bytes::Bytes::new());
                match hyper::header::HeaderValue::from_str(&location) {
                    Ok(v) => {
                        r.headers_mut().insert(hyper::header::LOCATION, v);
                    }
                    // The request's Host is checked before routing; a name that still cannot be
                    // a header value gets a 400, not a redirect without a Location.
                    Err(_) => return answer(StatusCode::BAD_REQUEST, "this request's host cannot be redirected to"),
                }
                return r;
            }
            crate::config::Action::Respond { status, body } => {
                return crate::body::respond(StatusCode::from_u16(*status).unwrap_or(StatusCode::OK), bytes::Bytes::from(body.clone()));
            }
            crate::config::Action::Static { root, max_bytes, direct_io } => {
                let route = &self.config.routes[r];
                let Some(d) = &self.dispatch else {
                    return answer(StatusCode::INTERNAL_SERVER_ERROR, "no dispatcher");
                };
                let mut resp = Box::pin(crate::objects::serve(
                    d,
                    crate::objects::Object { root, max: *max_bytes, direct: *direct_io, prefix: route.matches.path.prefix() },
                    &route.priority,
                    &parts,
                ))
                .await;
                *resp.version_mut() = parts.version;
                return resp;
            }
        };
        // The client's version, not the upstream's, describes the response on this connection.
        let version = parts.version;
        // The client's hop-by-hop headers go first, so that the route's own edits stay.
        crate::forward::strip_hop_by_hop(&mut parts.headers, &self.routing_headers);
        route.request_headers.apply(&mut parts.headers);
        let side = crate::forward::ClientSide { addr: client, stream };
        // Boxed: the forwarding state machine is large, and every HTTP/2 stream is a task whose
        // future is moved into place when it is spawned (answers made here need none of it).
        let forward = Box::pin(self.clusters[cluster].forward(Request::from_parts(parts, body), side));
        let mut resp = match route.timeout {
            None => forward.await,
            Some(t) => match tokio::time::timeout(t, forward).await {
                Ok(r) => r,
                Err(_) => answer(StatusCode::GATEWAY_TIMEOUT, &format!("the route's timeout ({t:?}) passed before the response")),
            },
        };
        route.response_headers.apply(resp.headers_mut());
        *resp.version_mut() = version;
        resp
    }
}

/// One entry of a weighted split, drawn at random in proportion to the weights (500 when
/// every weight is 0).
fn pick(split: &[(SplitTo, u32)]) -> SplitTo {
    let total: u64 = split.iter().map(|(_, w)| u64::from(*w)).sum();
    if total == 0 {
        return SplitTo::Status(500);
    }
    let mut x = random() % total;
    for (c, w) in split {
        if x < u64::from(*w) {
            return *c;
        }
        x -= u64::from(*w);
    }
    SplitTo::Status(500)
}

/// A per-thread xorshift64* generator (weighted splits need spread, not secrecy).
fn random() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
            let here = &t as *const u64 as u64;
            (t ^ here.rotate_left(32)) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

#[cfg(test)]
mod tests {
    use super::pick;
    use crate::config::SplitTo;

    #[test]
    fn a_split_follows_its_weights() {
        let split = [(SplitTo::Cluster(0), 90), (SplitTo::Cluster(1), 10), (SplitTo::Status(500), 0)];
        let mut n = [0u32; 2];
        for _ in 0..100_000 {
            match pick(&split) {
                SplitTo::Cluster(c) => n[c] += 1,
                s => panic!("{s:?}"),
            }
        }
        assert!((88_500..=91_500).contains(&n[0]), "{n:?}");
        assert_eq!(pick(&[(SplitTo::Cluster(3), 0), (SplitTo::Status(503), 0)]), SplitTo::Status(500), "every weight 0");
        let mut failed = 0;
        for _ in 0..10_000 {
            if pick(&[(SplitTo::Cluster(0), 1), (SplitTo::Status(500), 1)]) == SplitTo::Status(500) {
                failed += 1;
            }
        }
        assert!((4_500..=5_500).contains(&failed), "an unresolved entry takes its share: {failed}");
    }
}
