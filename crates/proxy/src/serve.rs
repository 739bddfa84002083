//! The listeners: accept, speak HTTP/1.1 and HTTP/2 (prior knowledge) per the listener's
//! protocols, route each request and forward it; drain on stop.

use crate::config::{Config, Protocols};
use crate::forward::{answer, ClusterRt, ProxyBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    #[error("listeners[{index}] ({name}): cannot listen on {address}: {source}")]
    Bind { index: usize, name: String, address: SocketAddr, source: std::io::Error },
    #[error("clusters[{index}] ({name}): {source}")]
    Scheduler { index: usize, name: String, source: vectorlb_sched::SchedError },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("admin: {0}")]
    Admin(String),
}

/// Time a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a request needs: the routes and the clusters.
pub struct Proxy {
    pub config: Config,
    pub clusters: Vec<ClusterRt>,
    /// Per listener: its TLS acceptor and handshake counters (None: plain text).
    pub tls: Vec<Option<(boring::ssl::SslAcceptor, Arc<crate::tls::TlsStats>)>>,
    /// Per listener: requests received.
    pub requests: Vec<std::sync::atomic::AtomicU64>,
    pub started: std::time::Instant,
}

impl Proxy {
    pub fn new(config: Config) -> Result<Proxy, ServeError> {
        let clusters = config
            .clusters
            .iter()
            .enumerate()
            .map(|(index, c)| ClusterRt::new(c.clone()).map_err(|source| ServeError::Scheduler { index, name: c.name.clone(), source }))
            .collect::<Result<_, _>>()?;
        let mut tls = Vec::new();
        for (i, l) in config.listeners.iter().enumerate() {
            tls.push(match &l.tls {
                Some(t) => Some(crate::tls::acceptor(&format!("listeners[{i}].tls"), t)?),
                None => None,
            });
        }
        let requests = config.listeners.iter().map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
        Ok(Proxy { config, clusters, tls, requests, started: std::time::Instant::now() })
    }

    async fn handle(&self, index: usize, listener: &str, req: Request<Incoming>, client: SocketAddr) -> Response<ProxyBody> {
        self.requests[index].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (parts, body) = req.into_parts();
        let Some(r) = crate::route::find(&self.config.routes, listener, &parts) else {
            return answer(StatusCode::NOT_FOUND, "no route for this request");
        };
        let cluster = match &self.config.routes[r].action {
            crate::config::Action::Cluster(c) => *c,
            crate::config::Action::Respond { status, body } => {
                return crate::forward::respond(StatusCode::from_u16(*status).unwrap_or(StatusCode::OK), bytes::Bytes::from(body.clone()));
            }
        };
        // The client's version, not the upstream's, describes the response on this connection.
        let version = parts.version;
        let mut resp = self.clusters[cluster].forward(Request::from_parts(parts, body), client).await;
        *resp.version_mut() = version;
        resp
    }
}

/// Bound listeners, ready to serve.
pub struct Bound {
    listeners: Vec<(usize, tokio::net::TcpListener)>,
}

/// Binds every listener, or none: a listener that cannot be bound stops the start.
pub async fn bind(config: &Config) -> Result<Bound, ServeError> {
    let mut listeners = Vec::new();
    for (index, l) in config.listeners.iter().enumerate() {
        let t = tokio::net::TcpListener::bind(l.address)
            .await
            .map_err(|source| ServeError::Bind { index, name: l.name.clone(), address: l.address, source })?;
        listeners.push((index, t));
    }
    Ok(Bound { listeners })
}

impl Bound {
    /// The addresses bound, in listener order (port 0 in the file becomes the port given).
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.listeners.iter().filter_map(|(_, l)| l.local_addr().ok()).collect()
    }
}

/// One client connection speaking `protocols`.
fn connection<I, S>(protocols: Protocols, io: I, svc: S) -> auto::Connection<'static, I, S, TokioExecutor>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<ProxyBody>, Error = std::convert::Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let mut b = auto::Builder::new(TokioExecutor::new());
    match protocols {
        Protocols::Auto => {}
        Protocols::Http1 => b = b.http1_only(),
        Protocols::Http2 => b = b.http2_only(),
    }
    b.serve_connection(io, svc).into_owned()
}

/// Serves until `stop` resolves, then stops accepting and lets the open connections finish
/// their requests for up to `drain`.
pub async fn serve(proxy: Arc<Proxy>, bound: Bound, stop: impl std::future::Future<Output = ()>, drain: Duration) {
    // Shared by the accept loops; each connection is watched so that the drain can tell it
    // to finish its requests and close.
    let graceful = Arc::new(hyper_util::server::graceful::GracefulShutdown::new());
    let (stop_tx, _) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for (index, l) in bound.listeners {
        let proxy = proxy.clone();
        let mut stopped = stop_tx.subscribe();
        let graceful = graceful.clone();
        tasks.push(tokio::spawn(async move {
            let name = proxy.config.listeners[index].name.clone();
            let protocols = proxy.config.listeners[index].protocols;
            loop {
                let (stream, peer) = tokio::select! {
                    _ = stopped.changed() => return,
                    a = l.accept() => match a {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(listener = %name, "accept: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    },
                };
                let _ = stream.set_nodelay(true);
                let proxy = proxy.clone();
                let name = name.clone();
                let graceful = graceful.clone();
                tokio::spawn(async move {
                    let svc = {
                        let proxy = proxy.clone();
                        hyper::service::service_fn(move |req| {
                            let proxy = proxy.clone();
                            let name = name.clone();
                            async move { Ok::<_, std::convert::Infallible>(proxy.handle(index, &name, req, peer).await) }
                        })
                    };
                    match &proxy.tls[index] {
                        None => {
                            let _ = graceful.watch(connection(protocols, TokioIo::new(stream), svc)).await;
                        }
                        Some((acceptor, stats)) => {
                            let started = std::time::Instant::now();
                            let s = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio_boring::accept(acceptor, stream)).await {
                                Ok(Ok(s)) => s,
                                Ok(Err(_)) => {
                                    stats.handshake_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    return;
                                }
                                Err(_) => {
                                    stats.handshake_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    return;
                                }
                            };
                            stats.handshake_seconds.observe(started.elapsed().as_secs_f64());
                            stats.handshakes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            // ALPN decides: h2 or HTTP/1.1.
                            let p = if s.ssl().selected_alpn_protocol() == Some(b"h2") { Protocols::Http2 } else { Protocols::Http1 };
                            let _ = graceful.watch(connection(p, TokioIo::new(s), svc)).await;
                        }
                    }
                });
            }
        }));
    }
    stop.await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    let graceful = Arc::into_inner(graceful).expect("the accept loops have ended");
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!("drain: connections still open after {drain:?}; closing them");
    }
}

/// `vectorlb proxy --config FILE`: runs until SIGTERM or SIGINT, then drains.
pub fn run(path: &std::path::Path) -> Result<(), ServeError> {
    let config = Config::load(path)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(config.workers).thread_name("vlb-proxy").enable_all().build().map_err(ServeError::Runtime)?;
    rt.block_on(async move {
        let proxy = Arc::new(Proxy::new(config)?);
        // The admin API first: a start that cannot serve it binds no listener.
        let admin = match &proxy.config.admin {
            None => None,
            Some(a) => {
                let token = match &a.token_file {
                    Some(f) => Some(vectorlb_api::server::read_token(f).map_err(|e| ServeError::Admin(format!("token_file: {f}: {e}")))?),
                    None => None,
                };
                let endpoint: vectorlb_api::Endpoint = a.address.parse().map_err(|e: vectorlb_client::Error| ServeError::Admin(e.to_string()))?;
                let l = vectorlb_api::server::Listener::bind(&endpoint, &vectorlb_api::Access { group: a.group.clone() }).await.map_err(|e| ServeError::Admin(e.to_string()))?;
                tracing::info!("admin API on {}", a.address);
                Some((l, token))
            }
        };
        let bound = bind(&proxy.config).await?;
        for (l, a) in proxy.config.listeners.iter().zip(bound.addresses()) {
            tracing::info!("listener {} on {a}", l.name);
        }
        let (stopped_tx, stopped_rx) = tokio::sync::watch::channel(false);
        let admin_task = admin.map(|(l, token)| {
            let mut rx = stopped_rx.clone();
            tokio::spawn(vectorlb_api::server::serve(l, crate::admin::router(proxy.clone()), token, async move {
                let _ = rx.wait_for(|s| *s).await;
            }))
        });
        let stop = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            tracing::info!("stopping: draining connections");
        };
        serve(proxy, bound, stop, Duration::from_secs(10)).await;
        let _ = stopped_tx.send(true);
        if let Some(t) = admin_task {
            let _ = t.await;
        }
        Ok(())
    })
}
