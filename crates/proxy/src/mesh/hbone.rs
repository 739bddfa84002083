//! The node proxy's tunnels: TCP between meshed pods carried in HTTP/2 CONNECT streams over
//! mutual TLS ("HBONE", the framing of Istio's ambient mode: port 15008, `:authority` the
//! destination pod's `IP:port`, `Forwarded: for="<client IP:port>"`, ALPN `h2`, TLS 1.3).
//!
//! * **Outbound** ([`Node::serve_outbound`]): a meshed pod's connection, steered here by the
//!   data plane with its destination unchanged (the accepted socket's local address *is* the
//!   original destination: the pod network's addresses are local in the proxy's namespace).
//!   To a meshed pod it goes into a tunnel; to anything else it is forwarded as it came.
//! * **Tunnels** ([`Node::connect`]): one TLS connection per (client identity, server identity,
//!   server's tunnel address, certificate generation), its streams multiplexed; the client
//!   presents its workload's certificate and checks the server's is the destination's identity.
//! * **Inbound** ([`Node::serve_inbound`]): serves the certificate of the pod the connection was
//!   addressed to, requires the client's, takes the client's identity from it, checks the claimed
//!   client address belongs to that identity, applies [`super::authz`] (401 when denied), and
//!   connects to the pod from the client's own address.

use super::authz::{Authz, Decision, Request as AuthzRequest};
use super::ca::{svid_id, system_time, Bundle, Svid};
use super::identity::SpiffeId;
use arc_swap::ArcSwap;
use boring::ssl::{AlpnError, SslAcceptor, SslConnector, SslMethod, SslVerifyMode, SslVersion};
use bytes::Bytes;
use http_body_util::Empty;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The port pods' tunnels arrive on.
pub const HBONE_PORT: u16 = 15008;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections a node proxy holds at once, inbound and outbound together, unless told otherwise.
pub const MAX_CONNECTIONS: usize = 65_536;

/// A meshed pod as every node knows it.
#[derive(Clone, Debug)]
pub struct Workload {
    pub ip: IpAddr,
    pub namespace: String,
    pub account: String,
    pub labels: BTreeMap<String, String>,
    pub node: String,
    /// Where tunnels to it are opened (its IP, port 15008, steered to its node's proxy).
    pub hbone: SocketAddr,
}

/// What a node knows of the mesh; replaced whole on every change.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub node: String,
    pub trust_domain: String,
    pub workloads: HashMap<IpAddr, Workload>,
    pub authz: Authz,
}

impl State {
    fn id_of(&self, w: &Workload) -> Option<SpiffeId> {
        SpiffeId::new(&self.trust_domain, &w.namespace, &w.account).ok()
    }
}

/// A workload certificate ready to use: its TLS contexts as server and as client.
struct Loaded {
    svid: Svid,
    acceptor: SslAcceptor,
    connector: SslConnector,
    generation: u64,
}

/// Per (client identity, server identity) counters, as the receiving or sending node saw them.
#[derive(Default)]
pub struct Pair {
    pub streams: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub denied: AtomicU64,
    pub failed: AtomicU64,
}

/// One edge of the mesh: connections from one identity to another, seen in one direction.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Edge {
    pub direction: &'static str,
    pub source: String,
    pub destination: String,
    pub streams: u64,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub denied: u64,
    pub failed: u64,
}

/// The node proxy's counters.
#[derive(Default)]
pub struct Stats {
    pub handshakes: AtomicU64,
    pub handshake_failures: AtomicU64,
    pub tunnels_opened: AtomicU64,
    pub bad_requests: AtomicU64,
    pub unknown_destination: AtomicU64,
    pub passthrough: AtomicU64,
    pub over_limit: AtomicU64,
    /// Peer chains checked in full (their signatures), and answered from [`Verified`].
    pub chains_verified: AtomicU64,
    pub chains_cached: AtomicU64,
    pub inbound: Mutex<BTreeMap<(String, String), Arc<Pair>>>,
    pub outbound: Mutex<BTreeMap<(String, String), Arc<Pair>>>,
}

impl Stats {
    fn pair(map: &Mutex<BTreeMap<(String, String), Arc<Pair>>>, src: &str, dst: &str) -> Arc<Pair> {
        map.lock().unwrap_or_else(|e| e.into_inner()).entry((src.into(), dst.into())).or_default().clone()
    }

    /// The mesh's edges as this node saw them: per direction and identity pair, its counters
    /// (the status page's table).
    pub fn edges(&self) -> Vec<Edge> {
        let mut v = Vec::new();
        for (direction, map) in [("inbound", &self.inbound), ("outbound", &self.outbound)] {
            for ((src, dst), p) in map.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                v.push(Edge {
                    direction,
                    source: src.clone(),
                    destination: dst.clone(),
                    streams: p.streams.load(Ordering::Relaxed),
                    sent_bytes: p.bytes_sent.load(Ordering::Relaxed),
                    received_bytes: p.bytes_received.load(Ordering::Relaxed),
                    denied: p.denied.load(Ordering::Relaxed),
                    failed: p.failed.load(Ordering::Relaxed),
                });
            }
        }
        v
    }

    /// The counters in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, v) in [
            ("vectorlb_mesh_handshakes_total", "TLS handshakes completed by the node proxy (both directions).", &self.handshakes),
            ("vectorlb_mesh_handshake_failures_total", "TLS handshakes that failed (bad or missing certificate, timeout).", &self.handshake_failures),
            ("vectorlb_mesh_tunnel_connections_total", "TLS connections opened to other nodes' proxies.", &self.tunnels_opened),
            ("vectorlb_mesh_bad_requests_total", "Tunnel requests refused as malformed (400).", &self.bad_requests),
            ("vectorlb_mesh_unknown_destination_total", "Connections for an address that is no meshed pod of this node.", &self.unknown_destination),
            ("vectorlb_mesh_passthrough_total", "Meshed pods' connections to peers outside the mesh, forwarded as they came.", &self.passthrough),
            ("vectorlb_mesh_over_limit_total", "Connections closed at once because the node proxy held its maximum.", &self.over_limit),
            ("vectorlb_mesh_chains_verified_total", "Peer certificate chains checked in full against the trust bundle.", &self.chains_verified),
            (
                "vectorlb_mesh_chains_cached_total",
                "Peer certificate chains already verified (same bytes, same bundle, inside their validity): not checked again.",
                &self.chains_cached,
            ),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n", v.load(Ordering::Relaxed)));
        }
        for (dir, map) in [("inbound", &self.inbound), ("outbound", &self.outbound)] {
            let map = map.lock().unwrap_or_else(|e| e.into_inner());
            for (metric, help, get) in [
                ("streams", "Connections carried between two identities.", (|p: &Pair| &p.streams) as fn(&Pair) -> &AtomicU64),
                ("sent_bytes", "Bytes from client to server.", |p| &p.bytes_sent),
                ("received_bytes", "Bytes from server to client.", |p| &p.bytes_received),
                ("denied", "Connections refused by authorization policy.", |p| &p.denied),
                ("failed", "Connections that failed (tunnel or server unreachable).", |p| &p.failed),
            ] {
                let name = format!("vectorlb_mesh_{dir}_{metric}_total");
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
                for ((src, dst), p) in map.iter() {
                    out.push_str(&format!("{name}{{source=\"{src}\",destination=\"{dst}\"}} {}\n", get(p).load(Ordering::Relaxed)));
                }
            }
        }
        out
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    src: SpiffeId,
    dst: SpiffeId,
    at: SocketAddr,
    generation: u64,
}

type Sender = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// A node's mesh proxy.
pub struct Node {
    state: ArcSwap<State>,
    ids: ArcSwap<HashMap<SpiffeId, Arc<Loaded>>>,
    bundle: ArcSwap<Option<Bundle>>,
    generation: AtomicU64,
    pool: Mutex<HashMap<PoolKey, Sender>>,
    /// Connect to a pod from its client's address (else from the proxy's own).
    original_source: bool,
    /// Where the handshakes' signatures run (None: BoringSSL, inline).
    signer: Option<crate::tls::KeySigner>,
    /// One permit per connection held (accepted inbound or outbound).
    slots: Arc<tokio::sync::Semaphore>,
    /// Tunnels are shared by the connections between two identities (else: one each, with a
    /// full handshake; a benchmark's knob).
    pooling: std::sync::atomic::AtomicBool,
    pub stats: Arc<Stats>,
}

fn tls_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// What both sides of a tunnel set alike: TLS 1.3 only, the workload's chain and key (signed
/// through `signer` when given), the trust anchors.
fn identity(b: &mut boring::ssl::SslContextBuilder, svid: &Svid, bundle: &Bundle, signer: Option<&crate::tls::KeySigner>) -> io::Result<()> {
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).map_err(tls_err)?;
    b.set_certificate(&svid.chain[0]).map_err(tls_err)?;
    for c in &svid.chain[1..] {
        b.add_extra_chain_cert(c.clone()).map_err(tls_err)?;
    }
    match signer {
        Some(k) => k.install(b, svid.key.clone()).map_err(tls_err)?,
        None => b.set_private_key(&svid.key).map_err(tls_err)?,
    }
    b.set_cert_store(bundle.store().map_err(tls_err)?);
    Ok(())
}

/// Peer chains a TLS context has verified against its trust anchors, by the SHA-256 of their
/// DER, with the window in which all of their certificates are valid (Unix seconds). The same
/// bytes verified against the same anchors with the same purpose verify again while that window
/// holds (the verification's only other input is the time), so a tunnel's second handshake
/// from a peer skips the chain's signature check; the peer still proves its key in every
/// handshake (CertificateVerify). One cache per role (its purpose: client or server) and per
/// trust bundle: [`Node::set_identities`] makes new ones, so a replaced bundle is never answered
/// from the old one's results.
pub(crate) struct Verified {
    chains: Mutex<HashMap<[u8; 32], (SystemTime, SystemTime)>>,
    stats: Arc<Stats>,
}

/// Chains a cache holds before it starts again empty (a node's peers are its mesh's identities).
const VERIFIED_MAX: usize = 4096;

impl Verified {
    fn new(stats: Arc<Stats>) -> Arc<Verified> {
        Arc::new(Verified { chains: Mutex::new(HashMap::new()), stats })
    }

    /// Whether `key` was verified and `now` is inside its window.
    fn fresh(&self, key: &[u8; 32], now: SystemTime) -> bool {
        self.chains.lock().unwrap_or_else(|e| e.into_inner()).get(key).is_some_and(|&(from, until)| from <= now && now <= until)
    }

    fn remember(&self, key: [u8; 32], from: SystemTime, until: SystemTime) {
        let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        if chains.len() >= VERIFIED_MAX {
            chains.clear();
        }
        chains.insert(key, (from, until));
    }

    /// BoringSSL's chain check for a handshake, answered from the cache when it can be.
    fn verify(&self, ctx: &mut boring::x509::X509StoreContextRef) -> bool {
        let now = SystemTime::now();
        let key = chain_key(ctx);
        if key.as_ref().is_some_and(|k| self.fresh(k, now)) {
            self.stats.chains_cached.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if !matches!(ctx.verify_cert(), Ok(true)) {
            return false;
        }
        self.stats.chains_verified.fetch_add(1, Ordering::Relaxed);
        // The window of the chain as verified: the peer's certificates and the anchor.
        let window = ctx.chain().and_then(|chain| {
            chain.iter().try_fold((SystemTime::UNIX_EPOCH, SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX))), |(from, until), c| {
                Some((from.max(system_time(c.not_before()).ok()?), until.min(system_time(c.not_after()).ok()?)))
            })
        });
        if let (Some(key), Some((from, until))) = (key, window) {
            self.remember(key, from, until);
        }
        true
    }
}

/// The SHA-256 of the chain the peer sent (its leaf, then the others), each DER length-prefixed.
fn chain_key(ctx: &boring::x509::X509StoreContextRef) -> Option<[u8; 32]> {
    let mut h = boring::sha::Sha256::new();
    let mut add = |c: &boring::x509::X509Ref| -> Option<()> {
        let der = c.to_der().ok()?;
        h.update(&(der.len() as u64).to_be_bytes());
        h.update(&der);
        Some(())
    };
    add(ctx.cert()?)?;
    if let Some(rest) = ctx.untrusted() {
        for c in rest {
            add(c)?;
        }
    }
    Some(h.finish())
}

/// The caches a generation of contexts shares: (as server, as client).
type VerifiedPair = (Arc<Verified>, Arc<Verified>);

fn contexts(svid: &Svid, bundle: &Bundle, signer: Option<&crate::tls::KeySigner>, verified: &VerifiedPair) -> io::Result<(SslAcceptor, SslConnector)> {
    let mut a = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).map_err(tls_err)?;
    identity(&mut a, svid, bundle, signer)?;
    let v = verified.0.clone();
    a.set_cert_verify_callback(move |ctx| v.verify(ctx));
    a.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    a.set_alpn_select_callback(|_, client| boring::ssl::select_next_proto(b"\x02h2", client).ok_or(AlpnError::ALERT_FATAL));
    a.set_session_cache_mode(boring::ssl::SslSessionCacheMode::OFF);
    let mut c = SslConnector::builder(SslMethod::tls()).map_err(tls_err)?;
    identity(&mut c, svid, bundle, signer)?;
    c.set_verify(SslVerifyMode::PEER);
    let v = verified.1.clone();
    c.set_cert_verify_callback(move |ctx| v.verify(ctx));
    c.set_alpn_protos(b"\x02h2").map_err(tls_err)?;
    Ok((a.build(), c.build()))
}

/// The peer's identity after a verified handshake (BoringSSL checked the chain).
fn peer_id<S>(tls: &tokio_boring::SslStream<S>, trust_domain: &str) -> io::Result<SpiffeId> {
    let cert = tls.ssl().peer_certificate().ok_or_else(|| tls_err("the peer sent no certificate"))?;
    let id = svid_id(&cert).map_err(tls_err)?;
    if id.trust_domain() != trust_domain {
        return Err(tls_err(format!("{id} is not in the trust domain {trust_domain}")));
    }
    Ok(id)
}

fn setopt(fd: std::os::fd::RawFd, level: libc::c_int, opt: libc::c_int) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and a c_int option value of its size.
    let r = unsafe { libc::setsockopt(fd, level, opt, &one as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// IP_TRANSPARENT (or IPV6_TRANSPARENT) on a socket: it may accept connections for, and send
/// from, addresses that are not the host's (CAP_NET_ADMIN). The node proxy's listeners take
/// connections for any pod's address, and it connects to a pod from its client's address.
pub fn transparent(fd: std::os::fd::RawFd, v4: bool) -> io::Result<()> {
    if v4 {
        setopt(fd, libc::IPPROTO_IP, libc::IP_TRANSPARENT)
    } else {
        setopt(fd, libc::IPPROTO_IPV6, libc::IPV6_TRANSPARENT)
    }
}

/// A listener for the node proxy: transparent when `transparent_too` (it takes connections
/// for any address the steering hands it).
pub fn listener(addr: SocketAddr, transparent_too: bool) -> io::Result<TcpListener> {
    use std::os::fd::AsRawFd;
    let sock = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    sock.set_reuseaddr(true)?;
    if transparent_too {
        transparent(sock.as_raw_fd(), addr.is_ipv4())?;
    }
    sock.bind(addr)?;
    sock.listen(4096)
}

/// `for="10.0.0.1:4000"` (or unquoted) out of a `Forwarded` header: the first `for=`, if it
/// is an address with a port.
pub fn forwarded_for(v: &str) -> Option<SocketAddr> {
    v.split([';', ',']).find_map(|p| p.trim().strip_prefix("for=")).map(|f| f.trim_matches('"')).and_then(|f| f.parse().ok())
}

fn status(code: StatusCode) -> Response<Empty<Bytes>> {
    let mut r = Response::new(Empty::new());
    *r.status_mut() = code;
    r
}

/// Copies both ways until both sides are done, counting the bytes.
async fn splice<A, B>(mut a: A, mut b: B, pair: &Pair)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    if let Ok((up, down)) = tokio::io::copy_bidirectional(&mut a, &mut b).await {
        pair.bytes_sent.fetch_add(up, Ordering::Relaxed);
        pair.bytes_received.fetch_add(down, Ordering::Relaxed);
    }
}

impl Node {
    pub fn new(state: State, original_source: bool) -> Arc<Node> {
        Node::with_signer(state, original_source, None)
    }

    /// A node whose handshakes sign through `signer` (the proxy's providers: crypto_mb's
    /// batches of eight, a thread pool, or inline).
    pub fn with_signer(state: State, original_source: bool, signer: Option<crate::tls::KeySigner>) -> Arc<Node> {
        Node::with_limit(state, original_source, signer, MAX_CONNECTIONS)
    }

    /// As [`Node::with_signer`], holding at most `max_connections` connections at once; past
    /// that a new one is closed at once and counted (`over_limit`).
    pub fn with_limit(state: State, original_source: bool, signer: Option<crate::tls::KeySigner>, max_connections: usize) -> Arc<Node> {
        Arc::new(Node {
            slots: Arc::new(tokio::sync::Semaphore::new(max_connections.clamp(1, tokio::sync::Semaphore::MAX_PERMITS))),
            pooling: std::sync::atomic::AtomicBool::new(true),
            signer,
            state: ArcSwap::from_pointee(state),
            ids: ArcSwap::from_pointee(HashMap::new()),
            bundle: ArcSwap::from_pointee(None),
            generation: AtomicU64::new(0),
            pool: Mutex::new(HashMap::new()),
            original_source,
            stats: Arc::new(Stats::default()),
        })
    }

    pub fn set_state(&self, state: State) {
        self.state.store(Arc::new(state));
    }

    pub fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// Installs the node's workload certificates and the trust bundle (a rotation): new
    /// handshakes and tunnels use them at once; tunnels open with the old ones finish their
    /// streams (they are no longer handed out).
    pub fn set_identities(&self, svids: Vec<Svid>, bundle: Bundle) -> io::Result<()> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let mut map = HashMap::new();
        let verified = (Verified::new(self.stats.clone()), Verified::new(self.stats.clone()));
        for svid in svids {
            if svid.id.trust_domain() != bundle.trust_domain() {
                return Err(tls_err(format!("{} is not in the trust domain {}", svid.id, bundle.trust_domain())));
            }
            bundle.verify(&svid.chain[0], &svid.chain[1..]).map_err(tls_err)?;
            let (acceptor, connector) = contexts(&svid, &bundle, self.signer.as_ref(), &verified)?;
            map.insert(svid.id.clone(), Arc::new(Loaded { svid, acceptor, connector, generation }));
        }
        self.ids.store(Arc::new(map));
        self.bundle.store(Arc::new(Some(bundle)));
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).retain(|k, _| k.generation == generation);
        Ok(())
    }

    /// Whether tunnels are shared (the default) or opened one per connection, each with a full
    /// handshake (to measure handshakes).
    pub fn set_pooling(&self, on: bool) {
        self.pooling.store(on, Ordering::Relaxed);
    }

    /// The handshake signer's statistics (None when BoringSSL signs inline).
    pub fn signer_stats(&self) -> Option<&Arc<crate::stats::TlsStats>> {
        self.signer.as_ref().map(|s| s.stats())
    }

    /// The identities this node holds certificates for, with their serial numbers.
    pub fn identities(&self) -> Vec<(SpiffeId, String)> {
        let mut v: Vec<_> = self.ids.load().values().map(|l| (l.svid.id.clone(), l.svid.serial())).collect();
        v.sort();
        v
    }

    /// A connection's permit, or None (counted) when the node holds its maximum.
    fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let s = self.slots.clone().try_acquire_owned().ok();
        if s.is_none() {
            self.stats.over_limit.fetch_add(1, Ordering::Relaxed);
        }
        s
    }

    /// Accepts tunnels (port 15008 on the pods' addresses) until the listener fails.
    pub async fn serve_inbound(self: Arc<Self>, listener: TcpListener) -> io::Result<()> {
        loop {
            let (tcp, _) = listener.accept().await?;
            let Some(slot) = self.slot() else { continue };
            let node = self.clone();
            tokio::spawn(async move {
                node.inbound(tcp).await;
                drop(slot);
            });
        }
    }

    async fn inbound(self: Arc<Self>, tcp: TcpStream) {
        let Ok(local) = tcp.local_addr() else { return };
        let state = self.state();
        let Some(w) = state.workloads.get(&local.ip()).filter(|w| w.node == state.node) else {
            self.stats.unknown_destination.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Some(served) = state.id_of(w) else { return };
        let Some(loaded) = self.ids.load().get(&served).cloned() else {
            self.stats.unknown_destination.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let _ = tcp.set_nodelay(true);
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio_boring::accept(&loaded.acceptor, tcp)).await {
            Ok(Ok(tls)) => tls,
            _ => {
                self.stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let client = match peer_id(&tls, &state.trust_domain) {
            Ok(id) => id,
            Err(_) => {
                self.stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        self.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        let peer = tls.get_ref().peer_addr().ok();
        let node = self.clone();
        let service = hyper::service::service_fn(move |req| {
            let node = node.clone();
            let client = client.clone();
            let served = served.clone();
            async move { Ok::<_, std::convert::Infallible>(node.tunnel_request(req, client, served, peer).await) }
        });
        let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new()).max_concurrent_streams(200).max_header_list_size(64 << 10).keep_alive_interval(Some(Duration::from_secs(30)));
        let _ = h2.serve_connection(TokioIo::new(tls), service).await;
    }

    async fn tunnel_request(self: Arc<Self>, mut req: Request<hyper::body::Incoming>, client: SpiffeId, served: SpiffeId, peer: Option<SocketAddr>) -> Response<Empty<Bytes>> {
        let bad = |node: &Node| {
            node.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            status(StatusCode::BAD_REQUEST)
        };
        if req.method() != Method::CONNECT {
            return bad(&self);
        }
        let Some(target) = req.uri().authority().and_then(|a| a.as_str().parse::<SocketAddr>().ok()) else { return bad(&self) };
        let state = self.state();
        // The target must be a pod of this node with the identity whose certificate was served
        // (what the client verified).
        let Some(w) = state.workloads.get(&target.ip()).filter(|w| w.node == state.node && state.id_of(w).as_ref() == Some(&served)) else { return bad(&self) };
        // The client's address: as forwarded, if it is a pod of the client's identity (a node
        // can speak only for its own pods' identities); else the connection's.
        let source = match req.headers().get("forwarded").and_then(|v| v.to_str().ok()).map(forwarded_for) {
            Some(Some(addr)) => match state.workloads.get(&addr.ip()) {
                Some(sw) if state.id_of(sw).as_ref() == Some(&client) => addr,
                _ => return bad(&self),
            },
            Some(None) => return bad(&self),
            None => match peer {
                Some(p) => p,
                None => return bad(&self),
            },
        };
        let pair = Stats::pair(&self.stats.inbound, &client.principal(), &served.principal());
        pair.streams.fetch_add(1, Ordering::Relaxed);
        let decision = state.authz.check(&AuthzRequest {
            source: Some(&client),
            source_ip: source.ip(),
            dest_ip: target.ip(),
            dest_port: target.port(),
            dest_namespace: &w.namespace,
            dest_labels: &w.labels,
        });
        if let Decision::Deny(why) = decision {
            pair.denied.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("mesh: {client} to {target} refused: {why}");
            return status(StatusCode::UNAUTHORIZED);
        }
        let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, self.dial(target, self.original_source.then_some(source.ip()))).await {
            Ok(Ok(s)) => s,
            _ => {
                pair.failed.fetch_add(1, Ordering::Relaxed);
                return status(StatusCode::SERVICE_UNAVAILABLE);
            }
        };
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = upgrade.await {
                splice(TokioIo::new(up), upstream, &pair).await;
            }
        });
        status(StatusCode::OK)
    }

    /// Connects to `to`, from `from` when given: an address that is not the proxy's own (its
    /// client's), which needs IP_TRANSPARENT (CAP_NET_ADMIN, as the node proxy has) for the
    /// route from it; without the capability, IP_FREEBIND (enough where the address is local,
    /// as in tests on loopback).
    async fn dial(&self, to: SocketAddr, from: Option<IpAddr>) -> io::Result<TcpStream> {
        let sock = if to.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        if let Some(ip) = from.filter(|ip| ip.is_ipv4() == to.is_ipv4()) {
            use std::os::fd::AsRawFd;
            if transparent(sock.as_raw_fd(), ip.is_ipv4()).is_err() {
                setopt(sock.as_raw_fd(), libc::IPPROTO_IP, libc::IP_FREEBIND)?;
            }
            // The port is chosen at connect, for the whole 4-tuple: a bind alone would take a
            // port of the client's address for every destination, and a busy client's ran out.
            setopt(sock.as_raw_fd(), libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT)?;
            sock.bind(SocketAddr::new(ip, 0))?;
        }
        let s = sock.connect(to).await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }

    /// A stream to `dst` (a meshed pod) for the local pod at `src`, in a tunnel to its node.
    pub async fn connect(self: &Arc<Self>, src: SocketAddr, dst: SocketAddr) -> io::Result<hyper::upgrade::Upgraded> {
        let state = self.state();
        let sw = state
            .workloads
            .get(&src.ip())
            .filter(|w| w.node == state.node)
            .ok_or_else(|| io::Error::new(io::ErrorKind::PermissionDenied, format!("{src} is no meshed pod of this node")))?;
        let dw = state.workloads.get(&dst.ip()).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{dst} is no meshed pod")))?;
        let (src_id, dst_id) = (state.id_of(sw).ok_or_else(|| tls_err("bad identity"))?, state.id_of(dw).ok_or_else(|| tls_err("bad identity"))?);
        let pair = Stats::pair(&self.stats.outbound, &src_id.principal(), &dst_id.principal());
        pair.streams.fetch_add(1, Ordering::Relaxed);
        let r = self.open_stream(&src_id, &dst_id, dw.hbone, src, dst).await;
        if r.is_err() {
            pair.failed.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    async fn open_stream(self: &Arc<Self>, src_id: &SpiffeId, dst_id: &SpiffeId, at: SocketAddr, src: SocketAddr, dst: SocketAddr) -> io::Result<hyper::upgrade::Upgraded> {
        let loaded = self.ids.load().get(src_id).cloned().ok_or_else(|| io::Error::new(io::ErrorKind::PermissionDenied, format!("this node holds no certificate for {src_id}")))?;
        let key = PoolKey { src: src_id.clone(), dst: dst_id.clone(), at, generation: loaded.generation };
        let pooling = self.pooling.load(Ordering::Relaxed);
        let pooled = if pooling { self.pool.lock().unwrap_or_else(|e| e.into_inner()).get(&key).filter(|s| !s.is_closed()).cloned() } else { None };
        let mut sender = match pooled {
            Some(s) => s,
            None => {
                let s = self.open_tunnel(&loaded, dst_id, at).await?;
                if pooling {
                    self.pool.lock().unwrap_or_else(|e| e.into_inner()).insert(key, s.clone());
                }
                s
            }
        };
        let req = Request::builder().method(Method::CONNECT).uri(dst.to_string()).header("forwarded", format!("for=\"{src}\"")).body(Empty::<Bytes>::new()).map_err(tls_err)?;
        sender.ready().await.map_err(tls_err)?;
        let resp = tokio::time::timeout(HANDSHAKE_TIMEOUT, sender.send_request(req))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the tunnel did not answer"))?
            .map_err(tls_err)?;
        match resp.status() {
            StatusCode::OK => hyper::upgrade::on(resp).await.map_err(tls_err),
            StatusCode::UNAUTHORIZED => Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{dst_id} refused {src_id} (authorization policy)"))),
            s => Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("the tunnel to {dst} answered {s}"))),
        }
    }

    async fn open_tunnel(&self, loaded: &Loaded, dst_id: &SpiffeId, at: SocketAddr) -> io::Result<Sender> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(at)).await.map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("no answer from {at}")))??;
        let _ = tcp.set_nodelay(true);
        let cfg = loaded.connector.configure().map_err(tls_err)?.verify_hostname(false).use_server_name_indication(false);
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio_boring::connect(cfg, "", tcp)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                self.stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                return Err(tls_err(format!("TLS with {at}: {e}")));
            }
            Err(_) => {
                self.stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("TLS with {at} timed out")));
            }
        };
        let server = peer_id(&tls, loaded.svid.id.trust_domain())?;
        if &server != dst_id {
            self.stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{at} presented {server}, not {dst_id}")));
        }
        self.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        self.stats.tunnels_opened.fetch_add(1, Ordering::Relaxed);
        let mut b = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new()).max_header_list_size(16 << 10).keep_alive_interval(Some(Duration::from_secs(30)));
        let (sender, conn) = b.handshake(TokioIo::new(tls)).await.map_err(tls_err)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Serves meshed pods' connections steered to the proxy: the accepted socket's local
    /// address is where the pod meant to go.
    pub async fn serve_outbound(self: Arc<Self>, listener: TcpListener) -> io::Result<()> {
        self.serve_outbound_with(listener, |s: &TcpStream| s.local_addr()).await
    }

    /// As [`Node::serve_outbound`], with the destination of each connection given by `dst`.
    pub async fn serve_outbound_with<F>(self: Arc<Self>, listener: TcpListener, dst: F) -> io::Result<()>
    where
        F: Fn(&TcpStream) -> io::Result<SocketAddr> + Send + Sync + 'static,
    {
        let dst = Arc::new(dst);
        loop {
            let (tcp, src) = listener.accept().await?;
            let Ok(to) = dst(&tcp) else { continue };
            let Some(slot) = self.slot() else { continue };
            let node = self.clone();
            tokio::spawn(async move {
                node.outbound(tcp, src, to).await;
                drop(slot);
            });
        }
    }

    async fn outbound(self: Arc<Self>, tcp: TcpStream, src: SocketAddr, dst: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        let state = self.state();
        let meshed = state.workloads.get(&dst.ip());
        if let Some(dw) = meshed.filter(|w| w.node == state.node) {
            // Both ends on this node: the connection never leaves it, so no tunnel; the
            // receiving side's checks are made here.
            let Some(sw) = state.workloads.get(&src.ip()).filter(|w| w.node == state.node) else {
                self.stats.unknown_destination.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let (Some(client), Some(server)) = (state.id_of(sw), state.id_of(dw)) else { return };
            let pair = Stats::pair(&self.stats.inbound, &client.principal(), &server.principal());
            pair.streams.fetch_add(1, Ordering::Relaxed);
            let r = AuthzRequest { source: Some(&client), source_ip: src.ip(), dest_ip: dst.ip(), dest_port: dst.port(), dest_namespace: &dw.namespace, dest_labels: &dw.labels };
            if let Decision::Deny(why) = state.authz.check(&r) {
                pair.denied.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("mesh: {client} to {dst} refused: {why}");
                return;
            }
            match tokio::time::timeout(CONNECT_TIMEOUT, self.dial(dst, self.original_source.then_some(src.ip()))).await {
                Ok(Ok(up)) => splice(tcp, up, &pair).await,
                _ => {
                    pair.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        if meshed.is_none() {
            // Outside the mesh: as it came (from the pod's own address).
            self.stats.passthrough.fetch_add(1, Ordering::Relaxed);
            if let Ok(Ok(up)) = tokio::time::timeout(CONNECT_TIMEOUT, self.dial(dst, self.original_source.then_some(src.ip()))).await {
                splice(tcp, up, &Pair::default()).await;
            }
            return;
        }
        match self.connect(src, dst).await {
            Ok(up) => {
                let state = self.state();
                let name = |ip: &IpAddr| state.workloads.get(ip).and_then(|w| state.id_of(w)).map(|i| i.principal()).unwrap_or_default();
                let pair = Stats::pair(&self.stats.outbound, &name(&src.ip()), &name(&dst.ip()));
                splice(tcp, TokioIo::new(up), &pair).await;
            }
            Err(e) => tracing::debug!("mesh: {src} to {dst}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verified_chain_counts_only_inside_its_window() {
        let v = Verified::new(Arc::new(Stats::default()));
        let (k, other) = ([1u8; 32], [2u8; 32]);
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        v.remember(k, at(100), at(200));
        assert!(v.fresh(&k, at(100)) && v.fresh(&k, at(150)) && v.fresh(&k, at(200)));
        assert!(!v.fresh(&k, at(99)), "not yet valid");
        assert!(!v.fresh(&k, at(201)), "expired since it was verified");
        assert!(!v.fresh(&other, at(150)), "other bytes were never verified");
        for i in 0..VERIFIED_MAX as u32 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_be_bytes());
            key[31] = 9;
            v.remember(key, at(0), at(1));
        }
        assert!(v.chains.lock().unwrap().len() <= VERIFIED_MAX, "bounded");
    }

    #[test]
    fn forwarded_addresses_are_read_strictly() {
        assert_eq!(forwarded_for("for=\"10.0.0.1:80\""), Some("10.0.0.1:80".parse().unwrap()));
        assert_eq!(forwarded_for("host=x; for=\"[fd00::1]:80\""), Some("[fd00::1]:80".parse().unwrap()));
        assert_eq!(forwarded_for("for=10.0.0.1:80, for=10.0.0.2:1"), Some("10.0.0.1:80".parse().unwrap()));
        assert_eq!(forwarded_for("for=\"10.0.0.1\""), None);
        assert_eq!(forwarded_for("by=x"), None);
    }
}
