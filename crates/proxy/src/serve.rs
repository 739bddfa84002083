//! The listeners: accept, speak HTTP/1.1 and HTTP/2 (prior knowledge) per the listener's
//! protocols, route each request and forward it; drain on stop.

use crate::body::ProxyBody;
use crate::client::{Admission, Conn, Verdict, Watchdog, Watched};
use crate::config::{Config, Listener, Protocols};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub use crate::error::ServeError;
pub use crate::proxy::Proxy;

/// How often a new connection asks for room at a limit (2 ms apart) while the connections that
/// could make it have not been read from yet.
const ADMIT_TRIES: u32 = 25;

/// How long a connection told to go (GOAWAY) may finish the streams it has.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// The read buffer under a TLS connection: a few records of the handshake, or most of one
/// full-size record (larger reads bypass it).
const READ_BUFFER: usize = 8 * 1024;

/// Bound listeners, ready to serve: (configured listener, its socket).
pub struct Bound {
    listeners: Vec<(Listener, tokio::net::TcpListener)>,
}

/// A listening socket as tokio's `TcpListener::bind` makes one (SO_REUSEADDR, backlog 1024),
/// with SO_REUSEPORT when the listener asks for it.
fn listen(l: &Listener) -> std::io::Result<tokio::net::TcpListener> {
    let s = if l.address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    s.set_reuseaddr(true)?;
    if l.reuseport {
        s.set_reuseport(true)?;
    }
    s.bind(l.address)?;
    s.listen(1024)
}

/// Binds every listener, or none: a listener that cannot be bound stops the start.
pub async fn bind(config: &Config) -> Result<Bound, ServeError> {
    let mut listeners = Vec::new();
    for (index, l) in config.listeners.iter().enumerate() {
        let t = listen(l).map_err(|source| ServeError::Bind { index, name: l.name.clone(), address: l.address, source })?;
        listeners.push((l.clone(), t));
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

/// The configuration in force: each new connection takes the proxy current when it is
/// accepted and keeps it to its end, so a reload changes nothing for open connections.
pub struct Current {
    proxy: arc_swap::ArcSwap<Proxy>,
    /// The file reloads read (none: reload is refused).
    path: Option<std::path::PathBuf>,
    pub reloads: std::sync::atomic::AtomicU64,
    pub reload_failures: std::sync::atomic::AtomicU64,
    pub last_reload_error: std::sync::Mutex<Option<String>>,
    /// One reload at a time (SIGHUP and the admin API).
    reloading: tokio::sync::Mutex<()>,
    listeners: std::sync::Mutex<Vec<Running>>,
    /// Accept loops told to stop by a reload; the next reload waits for their sockets to
    /// close, so that it can listen on a removed listener's address again.
    stopping: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Client connections, counted and limited (kept across reloads: connections are).
    pub admission: Arc<Admission>,
    /// Set by the drain: every connection finishes its requests and closes.
    draining: tokio::sync::watch::Sender<bool>,
    /// The digest of the configuration text in force ([`digest`]).
    digest: std::sync::Mutex<String>,
}

pub use vectorlb_http::text_digest as digest;

/// An accept loop: the listener it serves as configured, and its stop.
struct Running {
    listener: Listener,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Current {
    pub fn load(&self) -> Arc<Proxy> {
        self.proxy.load_full()
    }

    /// Reads the file again and, if all of it is good and every new listener can be bound,
    /// serves it: listeners that stay (same name and address) keep their sockets, new ones
    /// start, removed ones stop accepting; open connections finish on the configuration they
    /// started with. Otherwise nothing changes and the reason is returned.
    pub async fn reload(self: &Arc<Self>) -> Result<(), String> {
        let _one = self.reloading.lock().await;
        let r = self.try_reload().await;
        self.count(&r);
        r
    }

    /// `PUT /v1/config`: serves `text` as a reload would serve the file, then keeps it in the
    /// file (written beside it and renamed over it, with the file's mode, or 0600 for a new
    /// one: it may hold private keys), so that a restart serves it too. Refused whole, naming
    /// the problem, like a bad file.
    pub async fn put_config(self: &Arc<Self>, text: String) -> Result<(), String> {
        let _one = self.reloading.lock().await;
        let r = self.try_put(&text).await;
        self.count(&r);
        r
    }

    async fn try_put(self: &Arc<Self>, text: &str) -> Result<(), String> {
        let path = self.path.as_ref().ok_or("this proxy was not started from a file")?;
        let config = Config::parse(text).map_err(|e| e.to_string())?;
        // Written beside the file first (a file that cannot be written is refused before
        // anything is served), renamed over it once served.
        let staged = vectorlb_http::files::stage(path, text.as_bytes(), vectorlb_http::files::Mode::Always(0o600)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        self.apply(config).await?;
        *self.digest.lock().unwrap_or_else(|e| e.into_inner()) = digest(text);
        staged.commit().map_err(|e| format!("served, but not kept: {}: {e}", path.display()))
    }

    /// The digest of the configuration in force.
    pub fn config_digest(&self) -> String {
        self.digest.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn count(&self, r: &Result<(), String>) {
        match r {
            Ok(()) => {
                self.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                *self.last_reload_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                tracing::info!("reloaded");
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                *self.last_reload_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.clone());
                tracing::error!("reload refused, the running configuration stays: {e}");
            }
        }
    }

    async fn try_reload(self: &Arc<Self>) -> Result<(), String> {
        let path = self.path.as_ref().ok_or("this proxy was not started from a file")?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config = Config::parse(&text).map_err(|e| e.to_string())?;
        self.apply(config).await?;
        *self.digest.lock().unwrap_or_else(|e| e.into_inner()) = digest(&text);
        Ok(())
    }

    /// Serves `config` (see [`Current::reload`]).
    async fn apply(self: &Arc<Self>, config: Config) -> Result<(), String> {
        let old = self.load();
        let new = Arc::new(Proxy::reusing(config, Some(&old)).map_err(|e| e.to_string())?);
        if new.config.admin != old.config.admin {
            return Err("admin: changing the admin API needs a restart".into());
        }
        if new.config.workers != old.config.workers {
            return Err("workers: changing the number of workers needs a restart".into());
        }
        // Listeners an earlier reload removed have closed their sockets (they stop at once).
        // Each stays listed until it has ended, so a reload cancelled here loses none.
        loop {
            let done = {
                let mut stopping = self.stopping.lock().unwrap_or_else(|e| e.into_inner());
                stopping.retain(|t| !t.is_finished());
                stopping.is_empty()
            };
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Bind what is new before anything changes; a failure leaves everything as it was.
        let mut fresh = Vec::new();
        {
            let running = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
            for (index, l) in new.config.listeners.iter().enumerate() {
                if running.iter().any(|r| r.listener.name == l.name && r.listener.address == l.address) {
                    continue;
                }
                if l.address.port() != 0 && running.iter().any(|r| r.listener.address == l.address) {
                    return Err(format!("listeners[{index}] ({}): {} is still served under another name; rename or move it in two reloads", l.name, l.address));
                }
                let t = listen(l).map_err(|e| format!("listeners[{index}] ({}): cannot listen on {}: {e}", l.name, l.address))?;
                fresh.push((l.clone(), t));
            }
        }
        self.proxy.store(new.clone());
        self.admission.set_max(max_connections(&new.config));
        self.admission.memory.set_limit(new.config.buffer_memory);
        old.retired.store(true, std::sync::atomic::Ordering::Relaxed);
        crate::health::spawn(&new);
        let mut running = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        let (kept, removed): (Vec<Running>, Vec<Running>) =
            std::mem::take(&mut *running).into_iter().partition(|r| new.config.listeners.iter().any(|l| l.name == r.listener.name && l.address == r.listener.address));
        *running = kept;
        for r in removed {
            tracing::info!("listener {} on {} stops accepting", r.listener.name, r.listener.address);
            let _ = r.stop.send(true);
            self.stopping.lock().unwrap_or_else(|e| e.into_inner()).push(r.task);
        }
        for (l, t) in fresh {
            tracing::info!("listener {} on {}", l.name, l.address);
            running.push(self.accept_loop(l, t));
        }
        Ok(())
    }

    fn accept_loop(self: &Arc<Self>, listener: Listener, l: tokio::net::TcpListener) -> Running {
        tune_listener(&l);
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let me = self.clone();
        let name = listener.name.clone();
        let task = tokio::spawn(async move {
            let mut short = ShortOfDescriptors::default();
            loop {
                let (stream, peer) = tokio::select! {
                    _ = stopped.changed() => return,
                    a = l.accept() => match a {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of descriptors (or kernel memory): make room by closing a
                            // connection that waits with no request in flight, and pause
                            // accepting rather than spin; the kernel keeps the new ones queued.
                            let evicted = me.admission.evict_one();
                            short.note(&name, &e, evicted);
                            tokio::time::sleep(Duration::from_millis(if evicted { 10 } else { 100 })).await;
                            continue;
                        }
                    },
                };
                if *me.draining.borrow() {
                    return;
                }
                let proxy = me.load();
                let Some(index) = proxy.config.listeners.iter().position(|x| x.name == name) else { continue };
                let limits = &proxy.config.listeners[index].limits;
                let conn = Conn::new(limits.clone(), proxy.clients[index].clone(), std::os::fd::AsRawFd::as_raw_fd(&stream), me.admission.memory.clone());
                // At a limit with only connections not read from yet to close, ask again a few
                // times before refusing: they are read within milliseconds, and one that sent
                // half a request head then makes room. Meanwhile new connections wait in the
                // listen queue.
                let mut tries = 0;
                let ticket = loop {
                    tries += 1;
                    match me.admission.admit(&name, limits.max_connections, conn.clone(), tries >= ADMIT_TRIES) {
                        crate::client::Admit::In(t) => break Some(t),
                        crate::client::Admit::Wait => tokio::time::sleep(Duration::from_millis(2)).await,
                        crate::client::Admit::Refused => break None,
                    }
                };
                let Some(ticket) = ticket else {
                    // No room and nobody to make it: closed at once (a reset, not a timeout).
                    let _ = stream.set_zero_linger();
                    continue;
                };
                tokio::spawn(connection_task(proxy, index, name.clone(), stream, peer, ticket, me.draining.subscribe()));
            }
        });
        Running { listener, stop, task }
    }
}

/// Rate-limits the warning about failed accepts (one line per 10 s, with the count).
#[derive(Default)]
struct ShortOfDescriptors {
    since: Option<std::time::Instant>,
    failed: u64,
    evicted: u64,
}

impl ShortOfDescriptors {
    fn note(&mut self, listener: &str, e: &std::io::Error, evicted: bool) {
        self.failed += 1;
        self.evicted += evicted as u64;
        if self.since.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            return;
        }
        tracing::warn!(listener = %listener, "accept: {e} ({} failed accepts, {} idle connections closed to make room, in the last 10 s; raise the descriptor limit or lower max_connections)", self.failed, self.evicted);
        self.since = Some(std::time::Instant::now());
        self.failed = 0;
        self.evicted = 0;
    }
}

/// Options set once on the listening socket instead of on every connection:
/// - TCP_NODELAY, which accepted connections inherit on Linux (one system call fewer per
///   connection; a test checks the inheritance);
/// - TCP_DEFER_ACCEPT: HTTP and TLS clients speak first, so the kernel hands a connection over
///   once its first bytes (the request, the ClientHello) are there, which saves a wakeup and an
///   empty read per connection. A client that sends nothing is handed over after the period
///   anyway and then meets the handshake or header timeout as before.
fn tune_listener(l: &tokio::net::TcpListener) {
    use std::os::fd::AsRawFd;
    for (name, option, value) in [("TCP_NODELAY", libc::TCP_NODELAY, 1), ("TCP_DEFER_ACCEPT", libc::TCP_DEFER_ACCEPT, 5)] {
        let value: libc::c_int = value;
        // SAFETY: the descriptor is the listener's own, open for the call; the option value is
        // a c_int and its size is passed.
        let r = unsafe { libc::setsockopt(l.as_raw_fd(), libc::IPPROTO_TCP, option, (&value as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
        if r != 0 {
            tracing::warn!("{name} on a listener: {}", std::io::Error::last_os_error());
        }
    }
}

/// Serves one accepted connection on the configuration it was accepted under.
async fn connection_task(
    proxy: Arc<Proxy>,
    index: usize,
    name: String,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    ticket: crate::client::Ticket,
    draining: tokio::sync::watch::Receiver<bool>,
) {
    let conn = ticket.conn.clone();
    let protocols = proxy.config.listeners[index].protocols;
    let svc = {
        let proxy = proxy.clone();
        let conn = conn.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let proxy = proxy.clone();
            let name = name.clone();
            let guard = conn.start(req.version());
            async move {
                let resp = proxy.handle(index, &name, req, peer, &guard).await;
                Ok::<_, std::convert::Infallible>(resp.map(|b| guard.body(b)))
            }
        })
    };
    match &proxy.tls[index] {
        None => serve_connection(connection(protocols, TokioIo::new(Watched::new(stream, conn.clone())), svc), &conn, draining).await,
        Some((acceptor, stats)) => {
            let started = std::time::Instant::now();
            // BoringSSL reads each record in two exact reads (header, then body); a buffer
            // under it takes what the socket has in one (about 5 fewer reads per handshake).
            let stream = tokio::io::BufReader::with_capacity(READ_BUFFER, stream);
            // Under cryptomb on crypto_mb the X25519 secret is computed ahead in a batch.
            let tls = proxy.config.listeners[index].tls.as_ref();
            let (stream, slot) = match tls.and_then(crate::tls::key_exchange_ahead) {
                Some((delay, tls13)) => {
                    let slot = Arc::new(crate::keyshare::Slot::default());
                    (crate::kexstream::KexStream::new(stream, slot.clone(), delay, tls13), Some(slot))
                }
                None => (crate::kexstream::KexStream::through(stream), None),
            };
            let handshake = crate::keyshare::in_handshake(slot, tokio_boring::accept(acceptor, stream));
            let s = tokio::select! {
                r = tokio::time::timeout(conn.limits().handshake_timeout, handshake) => match r {
                    Ok(Ok(s)) => s,
                    Ok(Err(_)) => {
                        stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Err(_) => {
                        stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                },
                // Evicted to make room while shaking hands.
                _ = conn.ordered() => return,
            };
            stats.handshake_seconds.observe(started.elapsed().as_secs_f64());
            stats.handshakes.fetch_add(1, Ordering::Relaxed);
            conn.handshake_done();
            // ALPN decides: h2 or HTTP/1.1.
            let p = if s.ssl().selected_alpn_protocol() == Some(b"h2") { Protocols::Http2 } else { Protocols::Http1 };
            serve_connection(connection(p, TokioIo::new(Watched::new(crate::kexstream::QuietClose::new(s), conn.clone())), svc), &conn, draining).await;
        }
    }
    drop(ticket);
}

/// Drives one connection to its end under its [`Watchdog`]: closes it at a deadline or when
/// told to (evicted), sends GOAWAY (HTTP/2; HTTP/1.1 closes after its response) when it is
/// idle, over its reset budget or draining, and closes it if it has not finished
/// [`GOAWAY_GRACE`] later (the drain waits for its own deadline instead).
async fn serve_connection<I, S>(c: auto::Connection<'static, I, S, TokioExecutor>, conn: &Arc<Conn>, mut draining: tokio::sync::watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<ProxyBody>, Error = std::convert::Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let mut c = std::pin::pin!(c);
    let mut dog = Watchdog::new(conn.clone());
    let clock = |ms: u64| tokio::time::Instant::now() + Duration::from_millis(ms.saturating_sub(crate::client::now_ms()));
    // The first deadline at once (a timer for "now" would cost every connection a wakeup).
    let mut next = match dog.check(crate::client::now_ms()) {
        Verdict::Until(ms) => clock(ms),
        _ => tokio::time::Instant::now(),
    };
    let mut going = false;
    let mut hard: Option<tokio::time::Instant> = None;
    let mut drained = *draining.borrow();
    if drained {
        c.as_mut().graceful_shutdown();
    }
    loop {
        let verdict = tokio::select! {
            _ = c.as_mut() => return,
            r = draining.changed(), if !drained => {
                drained = true;
                if r.is_ok() && *draining.borrow() {
                    c.as_mut().graceful_shutdown();
                }
                continue;
            }
            // Told to go by another part of the proxy (evicted, over its budget): at once.
            _ = conn.ordered(), if !going => dog.check(crate::client::now_ms()),
            _ = tokio::time::sleep_until(hard.unwrap_or(next)), if hard.is_some() => return,
            _ = tokio::time::sleep_until(next), if hard.is_none() => dog.check(crate::client::now_ms()),
        };
        match verdict {
            Verdict::Until(ms) => next = clock(ms),
            Verdict::Close(why) => {
                tracing::debug!("closing a client connection: {why}");
                return;
            }
            Verdict::GoAway(why) => {
                tracing::debug!("GOAWAY to a client: {why}");
                going = true;
                c.as_mut().graceful_shutdown();
                hard = Some(tokio::time::Instant::now() + GOAWAY_GRACE);
            }
        }
    }
}

/// Starts serving `bound` with `proxy` (and its health checks); reloads read `path`.
pub fn start(proxy: Arc<Proxy>, bound: Bound, path: Option<std::path::PathBuf>) -> Arc<Current> {
    crate::health::spawn(&proxy);
    let admission = Admission::new(max_connections(&proxy.config), proxy.config.buffer_memory);
    let digest = std::sync::Mutex::new(path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).map(|t| digest(&t)).unwrap_or_default());
    let cur = Arc::new(Current {
        proxy: arc_swap::ArcSwap::new(proxy),
        path,
        reloads: Default::default(),
        reload_failures: Default::default(),
        last_reload_error: Default::default(),
        reloading: tokio::sync::Mutex::new(()),
        listeners: std::sync::Mutex::new(Vec::new()),
        stopping: std::sync::Mutex::new(Vec::new()),
        admission,
        draining: tokio::sync::watch::channel(false).0,
        digest,
    });
    let running: Vec<Running> = bound.listeners.into_iter().map(|(l, t)| cur.accept_loop(l, t)).collect();
    *cur.listeners.lock().unwrap_or_else(|e| e.into_inner()) = running;
    cur
}

impl Current {
    /// Stops accepting, then lets the open connections finish their requests for up to
    /// `drain` (each is told to close: HTTP/1.1 after its request, HTTP/2 with GOAWAY).
    pub async fn drain(&self, drain: Duration) {
        let running = std::mem::take(&mut *self.listeners.lock().unwrap_or_else(|e| e.into_inner()));
        for r in &running {
            let _ = r.stop.send(true);
        }
        for r in running {
            let _ = r.task.await;
        }
        self.load().retired.store(true, std::sync::atomic::Ordering::Relaxed);
        self.draining.send_replace(true);
        let t = tokio::time::Instant::now();
        while self.admission.open() > 0 {
            if t.elapsed() >= drain {
                tracing::warn!("drain: {} connections still open after {drain:?}; closing them", self.admission.open());
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The limit of client connections over all listeners: the configured one, or one from the
/// descriptor limit.
fn max_connections(c: &Config) -> usize {
    c.max_connections.unwrap_or_else(crate::client::default_max_connections)
}

/// Serves until `stop` resolves, then stops accepting and lets the open connections finish
/// their requests for up to `drain`.
pub async fn serve(proxy: Arc<Proxy>, bound: Bound, stop: impl std::future::Future<Output = ()>, drain: Duration) {
    let cur = start(proxy, bound, None);
    stop.await;
    cur.drain(drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-connection TCP_NODELAY call was dropped on the strength of this inheritance.
    #[tokio::test]
    async fn accepted_connections_inherit_the_listeners_options() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        tune_listener(&l);
        let addr = l.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            // TCP_DEFER_ACCEPT holds the connection back until the client speaks.
            tokio::io::AsyncWriteExt::write_all(&mut c, b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
            c
        });
        let (s, _) = tokio::time::timeout(Duration::from_secs(5), l.accept()).await.unwrap().unwrap();
        assert!(s.nodelay().unwrap(), "TCP_NODELAY was not inherited");
        drop(client.await.unwrap());
    }
}
