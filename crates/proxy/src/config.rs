//! The proxy's configuration file (TOML): listeners, routes, clusters. Parsed whole and checked
//! whole; the first problem is reported with the field's path (`clusters[1].endpoints[0]: ...`)
//! and nothing of a bad file is used.

use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use vectorlb_sched::Algorithm;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{0}")]
    Syntax(String),
    #[error("{field}: {msg}")]
    Field { field: String, msg: String },
    #[error("{path}: {msg}")]
    Read { path: String, msg: String },
}

fn bad(field: impl Into<String>, msg: impl Into<String>) -> ConfigError {
    ConfigError::Field { field: field.into(), msg: msg.into() }
}

/// How the proxy speaks to clients on a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocols {
    /// HTTP/1.1, and HTTP/2 with prior knowledge (h2c) on the same port.
    Auto,
    Http1,
    Http2,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub name: String,
    pub address: SocketAddr,
    pub protocols: Protocols,
    /// TLS termination; plain text without it.
    pub tls: Option<Tls>,
    /// Bind with SO_REUSEPORT, so that several proxy processes share the port and the kernel
    /// spreads their connections (off by default: a second instance then fails to start).
    pub reuseport: bool,
    /// What a client may take: deadlines, connections, stream resets.
    pub limits: ClientLimits,
}

/// A listener's deadlines and limits for its clients (docs/proxy.md, "Deadlines and limits").
#[derive(Debug, Clone, PartialEq)]
pub struct ClientLimits {
    /// From the connection to the end of the TLS handshake.
    pub handshake_timeout: Duration,
    /// To receive a request head: from the connection (or its handshake) for the first
    /// request, from its first byte for the next ones on an HTTP/1.1 connection.
    pub header_timeout: Duration,
    /// A connection with no request in flight (keep-alive) is closed after this.
    pub idle_timeout: Duration,
    /// Longest wait for the next piece of a request body.
    pub body_timeout: Duration,
    /// Longest a response may wait for the client to take it (a full socket buffer, a closed
    /// HTTP/2 window): the stream's upstream is released, the connection closed.
    pub send_timeout: Duration,
    /// Connections of this listener at once (none: only the proxy's `max_connections`).
    pub max_connections: Option<usize>,
    /// Streams a client may reset after their request went upstream, per connection and
    /// `reset_window`; one more and the connection gets GOAWAY.
    pub reset_budget: u32,
    pub reset_window: Duration,
    /// Bytes a second a client must keep up, on average, in sending a request body and in
    /// taking a response, whenever the proxy waits for it; it may fall behind by
    /// `body_timeout` (sending) and `send_timeout` (taking). 0: the gap deadlines alone.
    pub min_rate: u64,
    /// Request bodies one connection may have buffered at once (its HTTP/2 streams together);
    /// past it, bodies are streamed.
    pub connection_buffer: usize,
}

impl Default for ClientLimits {
    fn default() -> ClientLimits {
        ClientLimits {
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_connections: None,
            reset_budget: 100,
            reset_window: Duration::from_secs(10),
            min_rate: DEFAULT_MIN_RATE,
            connection_buffer: DEFAULT_CONNECTION_BUFFER,
        }
    }
}

/// The default of `min_rate`, bytes a second: Apache's `mod_reqtimeout` asks request bodies
/// for 500 (its `MinRate`).
pub const DEFAULT_MIN_RATE: u64 = 500;
/// The default of `connection_buffer`: 16 bodies of the default `request_buffer`.
pub const DEFAULT_CONNECTION_BUFFER: usize = 1 << 20;
/// The default of `buffer_memory`: buffered request bodies of every connection together.
pub const DEFAULT_BUFFER_MEMORY: usize = 256 << 20;

/// Where private-key operations of TLS handshakes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// In the worker, inside the handshake (the baseline): BoringSSL, or IPP Cryptography's
    /// RSA.
    Inline { backend: InlineBackend },
    /// On a pool of crypto threads; the handshake waits without holding its worker.
    Pool { threads: usize },
    /// Per worker thread, queued up to 8 per kind of key and run as one multi-buffer
    /// operation when full or `poll_delay` after the first.
    CryptoMb { poll_delay: Duration, backend: CryptoMbBackend, fallback: CryptoMbFallback },
}

/// What signs for the `inline` provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InlineBackend {
    /// `Ippcp` where the build has it and the CPU has AVX-512 IFMA, `Boringssl` elsewhere
    /// (the default).
    Auto,
    /// BoringSSL itself (Envoy's default).
    Boringssl,
    /// IPP Cryptography's RSA (AVX-512 IFMA code where the CPU has it; ECDSA stays BoringSSL's).
    Ippcp,
}

/// What runs the lanes of the `cryptomb` provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CryptoMbBackend {
    /// Intel's crypto_mb (AVX-512 IFMA), where the build and the CPU allow it.
    CryptoMb,
    /// BoringSSL lane by lane: the same queueing and checks on any CPU.
    Portable,
}

/// What `cryptomb` with the crypto_mb backend does where it cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CryptoMbFallback {
    /// Say so at start and sign inline.
    Inline,
    /// Refuse to start.
    Refuse,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Certificate {
    /// PEM: the certificate, then its chain.
    pub cert: Pem,
    /// PEM: the private key (RSA or EC P-256).
    pub key: Pem,
}

/// PEM text in a file (`cert`, `key`) or in the configuration itself (`cert_pem`, `key_pem`:
/// what a controller pushes through `PUT /v1/config`).
#[derive(Clone, PartialEq)]
pub enum Pem {
    File(std::path::PathBuf),
    Inline(String),
}

impl Pem {
    /// Where it comes from, for messages (never the text: it may be a private key).
    pub fn source(&self) -> String {
        match self {
            Pem::File(p) => p.display().to_string(),
            Pem::Inline(_) => "(inline PEM)".into(),
        }
    }
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tls {
    /// The first is the default; the others are chosen by SNI (their DNS names).
    pub certificates: Vec<Certificate>,
    pub provider: Provider,
    /// Session resumption (tickets and the session cache); off for handshake benchmarks.
    pub resumption: bool,
    /// "1.2" or "1.3".
    pub min_version: String,
    /// "1.2" or "1.3" (default), not below `min_version`.
    pub max_version: String,
}

/// Where the admin API listens and who may use it, as the load balancer's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// `unix:PATH` (mode 0600, or 0660 with `group`) or `ADDRESS:PORT` (needs `token_file`).
    pub address: String,
    pub token_file: Option<String>,
    pub group: Option<String>,
}

/// What a route matches; every given condition must hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    /// Exact host (lower case, without port), or `*.suffix` for any subdomain.
    pub host: Option<String>,
    pub path: PathMatch,
    /// Headers (lower-case names) that must each be present with this exact value.
    pub headers: Vec<(String, String)>,
}

/// How a route matches the request's path (without its query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// A string prefix (`path_prefix`): `/api` matches `/api`, `/api/x` and `/apix`.
    Prefix(String),
    /// Whole segments (`path_segments`, the Gateway API's PathPrefix): `/api` and `/api/` match
    /// `/api`, `/api/` and `/api/x`, not `/apix`.
    Segments(String),
    /// The whole path (`path_exact`).
    Exact(String),
}

impl PathMatch {
    /// The string prefix a static route strips from the path (`/` unless `Prefix`).
    pub fn prefix(&self) -> &str {
        match self {
            PathMatch::Prefix(p) => p,
            _ => "/",
        }
    }

    /// What the route matched of the path (a redirect's `prefix` replaces it).
    pub fn matched(&self) -> &str {
        match self {
            PathMatch::Prefix(p) | PathMatch::Segments(p) | PathMatch::Exact(p) => p,
        }
    }

    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Exact(p) => path == p,
            PathMatch::Segments(p) => {
                let p = p.trim_end_matches('/');
                p.is_empty() || path.strip_prefix(p).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
        }
    }
}

/// Changes to a request's headers before it is forwarded, or to a response's before it is
/// sent (names lower case): `set` replaces every value, `add` appends one, `remove` drops them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HeaderEdit {
    pub set: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    pub add: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    pub remove: Vec<hyper::header::HeaderName>,
}

impl HeaderEdit {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    pub fn apply(&self, h: &mut hyper::HeaderMap) {
        for n in &self.remove {
            h.remove(n);
        }
        for (n, v) in &self.set {
            h.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            h.append(n.clone(), v.clone());
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Listener names the route applies to (empty: all).
    pub listeners: Vec<String>,
    pub matches: Match,
    pub action: Action,
    /// The request's priority class (routes with `static`).
    pub priority: Priority,
    /// Applied to the request before it is forwarded (`request_headers`).
    pub request_headers: HeaderEdit,
    /// Applied to the response before it is sent (`response_headers`).
    pub response_headers: HeaderEdit,
    /// From the request's arrival to the response's head (`timeout`; then 504).
    pub timeout: Option<Duration>,
}

/// What a matching route does with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Forward it to this cluster (index into [`Config::clusters`]).
    Cluster(usize),
    /// Forward each request to one of these clusters, in proportion to the weights (`clusters`);
    /// an entry may answer a status instead (a backend the configuration could not resolve:
    /// 500, the default; one without endpoints: 503); every weight 0: 500.
    Split(Vec<(SplitTo, u32)>),
    /// Answer it here: a status and a body (health endpoints, benchmarks of the front end).
    Respond { status: u16, body: String },
    /// Answer it with a redirect (the Gateway API's RequestRedirect filter).
    Redirect(Redirect),
    /// Serve files under `root` (the request path after the route's prefix), read on the
    /// dispatch pool at the request's priority class.
    Static { root: std::path::PathBuf, max_bytes: u64, direct_io: bool },
}

/// Where a redirect sends the client: `scheme://host[:port]path?query`, the request's own host
/// and path unless replaced; the port left out when it is the scheme's own (80, 443).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub status: u16,
    pub scheme: String,
    pub host: Option<String>,
    pub port: u16,
    pub path: Option<RedirectPath>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedirectPath {
    /// The whole path replaced.
    Full(String),
    /// The route's path prefix replaced, the rest kept.
    Prefix(String),
}

impl Redirect {
    /// The Location for a request to `host` (its Host, port or not) and `path_and_query`
    /// under a route whose path prefix is `prefix`.
    pub fn location(&self, host: &str, path_and_query: &str, prefix: &str) -> String {
        let host = self.host.as_deref().unwrap_or_else(|| strip_port(host));
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        let path = match &self.path {
            None => path.to_string(),
            Some(RedirectPath::Full(p)) => p.clone(),
            Some(RedirectPath::Prefix(to)) => {
                let rest = path.strip_prefix(prefix.trim_end_matches('/')).unwrap_or(path);
                let to = to.trim_end_matches('/');
                match (to.is_empty(), rest.is_empty()) {
                    (true, true) => "/".to_string(),
                    (true, false) => rest.to_string(),
                    (false, _) => format!("{to}{rest}"),
                }
            }
        };
        let port = match (self.scheme.as_str(), self.port) {
            ("http", 80) | ("https", 443) => String::new(),
            (_, p) => format!(":{p}"),
        };
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        format!("{}://{host}{port}{path}{query}", self.scheme)
    }
}

/// A Host header's name without its port (`[v6]:port` and `name:port`).
fn strip_port(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split_once(']').map(|(a, _)| &h[..a.len() + 2]).unwrap_or(h);
    }
    h.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map(|(n, _)| n).unwrap_or(h)
}

/// One entry of a weighted split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitTo {
    Cluster(usize),
    Status(u16),
}

/// Where a request's priority class comes from (routes with `static`): the first of the query
/// parameter, the header and the object's size that gives one, else `class`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Priority {
    /// A query parameter holding a class name or number (`?prio=0`).
    pub query: Option<String>,
    /// A header holding a class name or number.
    pub header: Option<String>,
    /// (largest size in bytes, class): the first whose size the object does not exceed.
    pub sizes: Vec<(u64, usize)>,
    /// The class otherwise (default: the least urgent).
    pub class: usize,
}

/// How the proxy speaks to a cluster's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    Http1,
    /// HTTP/2 with prior knowledge (gRPC backends).
    Http2,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    pub scheduler: Algorithm,
    /// The header whose value Maglev / source hashing hashes (the client address without it).
    pub hash_header: Option<String>,
    pub protocol: Upstream,
    pub connect_timeout: Duration,
    /// Time for the upstream's response head.
    pub response_timeout: Duration,
    /// Idle keep-alive connections kept per endpoint (at most `max_connections`).
    pub max_idle: usize,
    /// Connections open to one endpoint at once, idle ones included (HTTP/2 endpoints:
    /// requests in flight to it); a request waits at most `queue_timeout` for one, then 503.
    pub max_connections: usize,
    pub queue_timeout: Duration,
    /// Longest a write of a request to an endpoint may wait (its receive window is full).
    pub send_timeout: Duration,
    /// Longest wait for the next piece of a response body from an endpoint.
    pub read_timeout: Duration,
    /// A request body of a known length up to this many bytes is read whole before an
    /// endpoint is chosen (a slow client then holds no upstream connection, and the request
    /// can be retried); 0: always streamed.
    pub request_buffer: usize,
    /// Active health checks of the endpoints; without them every endpoint with a weight takes
    /// requests.
    pub health: Option<Health>,
    /// The share of an endpoint's `max_connections` one client connection may hold at once
    /// (its HTTP/2 streams together), in (0, 1]; at least one.
    pub client_share: f64,
}

/// An active health check (`[clusters.health]`): every `interval` each endpoint is checked;
/// after `fall` failures in a row it takes no requests, after `rise` successes it takes them
/// again. Endpoints start healthy.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub kind: HealthKind,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthKind {
    /// A TCP connection is accepted.
    Tcp,
    /// `GET path` over HTTP/1.1 answers `expect_status`.
    Http { path: String, expect_status: u16 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub address: SocketAddr,
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Worker threads serving connections (default: one per CPU the process may use).
    pub workers: usize,
    /// Client connections at once over all listeners (none: from the descriptor limit at
    /// start, see [`crate::client::default_max_connections`]).
    pub max_connections: Option<usize>,
    /// Bytes of request bodies buffered at once over all connections (`request_buffer`); a
    /// body that would go over it is streamed.
    pub buffer_memory: usize,
    /// The admin API (stats, Prometheus metrics); none without `[admin]`.
    pub admin: Option<Admin>,
    /// Where one JSON line per request goes ("-": standard output); none without it.
    pub access_log: Option<String>,
    pub listeners: Vec<Listener>,
    pub routes: Vec<Route>,
    pub clusters: Vec<Cluster>,
    /// The pool that runs request work by priority (present when a route serves `static`).
    pub dispatch: Option<DispatchConfig>,
}

// ---- The dispatch pool's settings (its threads and queues: crate::dispatch).

/// How the pool orders waiting items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Priority,
    Fifo,
    /// No pool and no queue: an item runs at once on the thread that submits it (the
    /// connection's own worker thread), as in a server whose workers read files themselves.
    Inline,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Priority => "priority",
            Mode::Fifo => "fifo",
            Mode::Inline => "inline",
        }
    }
}

/// What holds the waiting items.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Backend {
    /// A queue per class in memory.
    #[default]
    Software,
    /// A DPDK event device: `event_sw`, or the PCI address of a hardware one (a DLB).
    Eventdev(String),
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Software => "software",
            Backend::Eventdev(_) => "eventdev",
        }
    }
}

/// Items an event device may hold waiting (new ones, across classes): half of `event_sw`'s
/// 4096 events, leaving the rest for the later parts of admitted work.
pub const EVENTDEV_QUEUED: usize = 2048;

/// Pool threads with an event device: two ports each and one producer port, of `event_sw`'s 64.
pub const EVENTDEV_WORKERS: usize = 31;

/// A priority class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    /// Percent of the picks this class is guaranteed while it has items waiting (0: none; the
    /// most urgent class needs none).
    pub share: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DispatchConfig {
    /// Pool threads.
    pub workers: usize,
    pub mode: Mode,
    /// Most urgent first; at least one.
    pub classes: Vec<Class>,
    /// Items a class may hold waiting (in fifo mode, the whole queue: this times the classes).
    pub queue_limit: usize,
    /// Longest an item may wait before it is dropped instead of run.
    pub max_wait: Duration,
    /// A class holding more than this many items serves its newest first (0: never).
    pub lifo_above: usize,
    pub backend: Backend,
}

impl DispatchConfig {
    /// The class with this name.
    pub fn class(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c.name == name)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    workers: Option<usize>,
    max_connections: Option<usize>,
    buffer_memory: Option<usize>,
    dispatch: Option<RawDispatch>,
    access_log: Option<String>,
    admin: Option<RawAdmin>,
    #[serde(default)]
    listeners: Vec<RawListener>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    clusters: Vec<RawCluster>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    address: String,
    token_file: Option<String>,
    group: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    name: String,
    address: String,
    protocols: Option<String>,
    tls: Option<RawTls>,
    reuseport: Option<bool>,
    handshake_timeout: Option<f64>,
    header_timeout: Option<f64>,
    idle_timeout: Option<f64>,
    body_timeout: Option<f64>,
    send_timeout: Option<f64>,
    max_connections: Option<usize>,
    reset_budget: Option<u32>,
    reset_window: Option<f64>,
    min_rate: Option<u64>,
    connection_buffer: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    certificates: Vec<RawCert>,
    provider: Option<String>,
    pool_threads: Option<usize>,
    poll_delay: Option<f64>,
    inline_backend: Option<String>,
    cryptomb_backend: Option<String>,
    cryptomb_fallback: Option<String>,
    resumption: Option<bool>,
    min_version: Option<String>,
    max_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCert {
    cert: Option<String>,
    key: Option<String>,
    cert_pem: Option<String>,
    key_pem: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    #[serde(default)]
    listeners: Vec<String>,
    host: Option<String>,
    path_prefix: Option<String>,
    path_segments: Option<String>,
    path_exact: Option<String>,
    header: Option<RawHeader>,
    #[serde(default)]
    headers: Vec<RawHeader>,
    cluster: Option<String>,
    clusters: Option<Vec<RawWeighted>>,
    request_headers: Option<RawHeaderEdit>,
    response_headers: Option<RawHeaderEdit>,
    timeout: Option<f64>,
    respond: Option<RawRespond>,
    redirect: Option<RawRedirect>,
    #[serde(rename = "static")]
    static_: Option<RawStatic>,
    priority: Option<RawPriority>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDispatch {
    workers: Option<usize>,
    mode: Option<String>,
    queue_limit: Option<usize>,
    max_wait: Option<f64>,
    lifo_above: Option<usize>,
    classes: Option<Vec<RawClass>>,
    backend: Option<String>,
    eventdev: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    name: String,
    share: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStatic {
    root: String,
    max_bytes: Option<u64>,
    direct_io: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPriority {
    query: Option<String>,
    header: Option<String>,
    sizes: Option<Vec<RawSize>>,
    class: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSize {
    up_to: u64,
    class: String,
}

/// A request body of a known length up to this size is read whole before it goes upstream.
pub const DEFAULT_REQUEST_BUFFER: usize = 64 << 10;

/// The default of `client_share`: an eighth of an endpoint's connections per client connection.
pub const DEFAULT_CLIENT_SHARE: f64 = 0.125;

/// Whether a connection to `endpoint` would reach a socket listening on `listener`: the same
/// address, or the port of a listener on every address (0.0.0.0, ::) at an address of this
/// host.
fn is_same_socket(listener: SocketAddr, endpoint: SocketAddr) -> bool {
    if listener.port() != endpoint.port() || listener.port() == 0 {
        return false;
    }
    let (l, e) = (canonical_ip(listener.ip()), canonical_ip(endpoint.ip()));
    l == e || (l.is_unspecified() && (e.is_loopback() || local_addresses().contains(&e)))
}

/// An IPv4-mapped IPv6 address as IPv4.
fn canonical_ip(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    }
}

/// The addresses of this host's interfaces (empty if they cannot be read).
fn local_addresses() -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list this function frees below; every
    // node and its address are valid until then, and the address is read as the family it says.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut p = list;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() {
                match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(a as *const libc::sockaddr_in);
                        out.push(std::net::IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a as *const libc::sockaddr_in6);
                        out.push(std::net::IpAddr::V6(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
}

/// Largest static object served by default (64 MiB); larger ones get a 500.
pub const DEFAULT_MAX_OBJECT: u64 = 64 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRespond {
    status: u16,
    #[serde(default)]
    body: String,
}

fn redirect(f: &str, r: &RawRedirect) -> Result<Action, ConfigError> {
    let status = r.status.unwrap_or(302);
    if ![301, 302, 303, 307, 308].contains(&status) {
        return Err(bad(format!("{f}.status"), format!("{status} is not a redirect status (301, 302, 303, 307, 308)")));
    }
    if r.scheme != "http" && r.scheme != "https" {
        return Err(bad(format!("{f}.scheme"), format!("'{}' is not http or https", r.scheme)));
    }
    if r.port == 0 {
        return Err(bad(format!("{f}.port"), "0 is not a port"));
    }
    if let Some(h) = &r.host {
        let ok = !h.is_empty() && h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !ok {
            return Err(bad(format!("{f}.host"), format!("'{h}' is not a host name")));
        }
    }
    let path_ok = |p: &str| p.starts_with('/') && p.len() <= 1024 && !p.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#');
    let path = match (&r.path, &r.prefix) {
        (None, None) => None,
        (Some(p), None) if path_ok(p) => Some(RedirectPath::Full(p.clone())),
        (None, Some(p)) if path_ok(p) => Some(RedirectPath::Prefix(p.clone())),
        (Some(_), Some(_)) => return Err(bad(f, "path or prefix, not both")),
        (Some(p), None) | (None, Some(p)) => return Err(bad(f, format!("'{p}' is not a path"))),
    };
    Ok(Action::Redirect(Redirect { status, scheme: r.scheme.clone(), host: r.host.clone(), port: r.port, path }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedirect {
    status: Option<u16>,
    scheme: String,
    host: Option<String>,
    port: u16,
    /// The whole path replaced.
    path: Option<String>,
    /// The route's path prefix replaced.
    prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    name: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeighted {
    name: Option<String>,
    status: Option<u16>,
    weight: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaderEdit {
    #[serde(default)]
    set: Vec<RawHeader>,
    #[serde(default)]
    add: Vec<RawHeader>,
    #[serde(default)]
    remove: Vec<String>,
}

/// A header edit as the configuration gives it, checked.
fn header_edit(f: &str, e: Option<&RawHeaderEdit>) -> Result<HeaderEdit, ConfigError> {
    let Some(e) = e else { return Ok(HeaderEdit::default()) };
    let pair = |g: String, h: &RawHeader| -> Result<(hyper::header::HeaderName, hyper::header::HeaderValue), ConfigError> {
        let n = header_name(&format!("{g}.name"), &h.name)?;
        let name = hyper::header::HeaderName::from_bytes(n.as_bytes()).map_err(|_| bad(format!("{g}.name"), format!("'{n}' is not a header name")))?;
        if HOP_BY_HOP.contains(&n.as_str()) || n == "host" || n == "content-length" {
            return Err(bad(format!("{g}.name"), format!("'{n}' is the proxy's to set")));
        }
        let value = hyper::header::HeaderValue::from_str(&h.value).map_err(|_| bad(format!("{g}.value"), "not a header value (visible ASCII, spaces and tabs)"))?;
        Ok((name, value))
    };
    let set = e.set.iter().enumerate().map(|(i, h)| pair(format!("{f}.set[{i}]"), h)).collect::<Result<Vec<_>, _>>()?;
    let add = e.add.iter().enumerate().map(|(i, h)| pair(format!("{f}.add[{i}]"), h)).collect::<Result<Vec<_>, _>>()?;
    let mut remove = Vec::new();
    for (i, n) in e.remove.iter().enumerate() {
        let n = header_name(&format!("{f}.remove[{i}]"), n)?;
        remove.push(hyper::header::HeaderName::from_bytes(n.as_bytes()).map_err(|_| bad(format!("{f}.remove[{i}]"), format!("'{n}' is not a header name")))?);
    }
    Ok(HeaderEdit { set, add, remove })
}

/// Headers of one connection (RFC 9110 7.6.1): never set by a route.
const HOP_BY_HOP: [&str; 8] = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "proxy-authenticate"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    name: String,
    endpoints: Vec<RawEndpoint>,
    scheduler: Option<String>,
    hash_header: Option<String>,
    protocol: Option<String>,
    connect_timeout: Option<f64>,
    response_timeout: Option<f64>,
    max_idle: Option<usize>,
    max_connections: Option<usize>,
    queue_timeout: Option<f64>,
    send_timeout: Option<f64>,
    read_timeout: Option<f64>,
    request_buffer: Option<usize>,
    client_share: Option<f64>,
    health: Option<RawHealth>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    kind: Option<String>,
    path: Option<String>,
    expect_status: Option<u16>,
    interval: Option<f64>,
    timeout: Option<f64>,
    rise: Option<u32>,
    fall: Option<u32>,
}

fn health(f: &str, h: &RawHealth) -> Result<Health, ConfigError> {
    let kind = match h.kind.as_deref().unwrap_or("http") {
        "tcp" => {
            for (name, set) in [("path", h.path.is_some()), ("expect_status", h.expect_status.is_some())] {
                if set {
                    return Err(bad(format!("{f}.{name}"), "only for kind = \"http\""));
                }
            }
            HealthKind::Tcp
        }
        "http" => {
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!("{f}.path"), format!("'{path}' is not a path (starts with /, no spaces)")));
            }
            let expect_status = h.expect_status.unwrap_or(200);
            if !(100..=599).contains(&expect_status) {
                return Err(bad(format!("{f}.expect_status"), format!("{expect_status} is not a status in 100..=599")));
            }
            HealthKind::Http { path, expect_status }
        }
        k => return Err(bad(format!("{f}.kind"), format!("'{k}' is not http or tcp"))),
    };
    let interval = seconds(&format!("{f}.interval"), h.interval, 2.0)?;
    let timeout = seconds(&format!("{f}.timeout"), h.timeout, 1.0)?;
    if timeout > interval {
        return Err(bad(format!("{f}.timeout"), format!("{timeout:?} is longer than the interval {interval:?}")));
    }
    let count = |name: &str, v: Option<u32>, d: u32| match v.unwrap_or(d) {
        n @ 1..=100 => Ok(n),
        n => Err(bad(format!("{f}.{name}"), format!("{n} is not in 1..=100"))),
    };
    Ok(Health { kind, interval, timeout, rise: count("rise", h.rise, 2)?, fall: count("fall", h.fall, 3)? })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, untagged, expecting = "an endpoint: \"ADDRESS:PORT\" or { address = \"ADDRESS:PORT\", weight = N }")]
enum RawEndpoint {
    Plain(String),
    Weighted { address: String, weight: Option<u32> },
}

/// The cryptomb provider's default `poll_delay`, seconds: a queue that does not fill waits at
/// most this long (a millisecond is about what 8 RSA-2048 signatures take in one call).
pub const DEFAULT_POLL_DELAY: f64 = 0.001;

/// A timeout in seconds: positive, finite, at most an hour.
fn seconds(field: &str, v: Option<f64>, default: f64) -> Result<Duration, ConfigError> {
    let s = v.unwrap_or(default);
    // Deadlines are kept in milliseconds: a shorter one would pass at once, or never.
    if !(s.is_finite() && (0.001..=3600.0).contains(&s)) {
        return Err(bad(field, format!("{s} is not a number of seconds in [0.001, 3600]")));
    }
    Ok(Duration::from_secs_f64(s))
}

/// A path to match: it starts with `/` and has no query, fragment, space or control character.
fn path_field(field: &str, p: &str) -> Result<String, ConfigError> {
    if !p.starts_with('/') {
        return Err(bad(field, format!("'{p}' does not start with /")));
    }
    if p.len() > 1024 || p.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#') {
        return Err(bad(field, format!("'{p}' is not a path (no query, fragment, spaces or controls; at most 1024 bytes)")));
    }
    Ok(p.to_string())
}

/// A header name as HTTP allows it (RFC 9110 token), lower-cased.
fn header_name(field: &str, n: &str) -> Result<String, ConfigError> {
    let ok = !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !ok {
        return Err(bad(field, format!("'{n}' is not a header name")));
    }
    Ok(n.to_ascii_lowercase())
}

/// The `[dispatch]` section, or its defaults (one class, as many threads as workers).
fn dispatch(raw: Option<&RawDispatch>, workers: usize) -> Result<DispatchConfig, ConfigError> {
    let empty = RawDispatch { workers: None, mode: None, queue_limit: None, max_wait: None, lifo_above: None, classes: None, backend: None, eventdev: None };
    let d = raw.unwrap_or(&empty);
    let threads = d.workers.unwrap_or(workers);
    if !(1..=1024).contains(&threads) {
        return Err(bad("dispatch.workers", format!("{threads} is not in 1..=1024")));
    }
    let mode = match d.mode.as_deref().unwrap_or("priority") {
        "priority" => Mode::Priority,
        "fifo" => Mode::Fifo,
        "inline" => Mode::Inline,
        m => return Err(bad("dispatch.mode", format!("'{m}' is not priority, fifo or inline"))),
    };
    let queue_limit = d.queue_limit.unwrap_or(1024);
    if !(1..=1_000_000).contains(&queue_limit) {
        return Err(bad("dispatch.queue_limit", format!("{queue_limit} is not in 1..=1000000")));
    }
    let max_wait = seconds("dispatch.max_wait", d.max_wait, 1.0)?;
    let lifo_above = d.lifo_above.unwrap_or(0);
    if lifo_above > queue_limit {
        return Err(bad("dispatch.lifo_above", format!("{lifo_above} is above queue_limit {queue_limit}: it would never apply")));
    }
    let mut classes: Vec<Class> = Vec::new();
    for (i, c) in d.classes.iter().flatten().enumerate() {
        let f = format!("dispatch.classes[{i}]");
        let ok =
            !c.name.is_empty() && c.name.len() <= 64 && c.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') && !c.name.bytes().all(|b| b.is_ascii_digit());
        if !ok || classes.iter().any(|x| x.name == c.name) {
            return Err(bad(format!("{f}.name"), format!("'{}' is empty, used twice, all digits or not letters, digits, _ and -", c.name)));
        }
        let share = c.share.unwrap_or(0);
        if share > 100 {
            return Err(bad(format!("{f}.share"), format!("{share} is not a percentage in 0..=100")));
        }
        if i == 0 && share != 0 {
            return Err(bad(format!("{f}.share"), "the most urgent class is served first anyway: its share must be 0"));
        }
        classes.push(Class { name: c.name.clone(), share });
    }
    if classes.len() > 64 {
        return Err(bad("dispatch.classes", format!("{} classes; at most 64", classes.len())));
    }
    let shares: u32 = classes.iter().map(|c| c.share).sum();
    if shares >= 100 {
        return Err(bad("dispatch.classes", format!("the shares add up to {shares} %: below 100 leaves the most urgent class its turns")));
    }
    if classes.is_empty() {
        classes.push(Class { name: "default".into(), share: 0 });
    }
    let backend = match (d.backend.as_deref().unwrap_or("software"), d.eventdev.as_deref()) {
        ("software", None) => Backend::Software,
        ("software", Some(_)) => return Err(bad("dispatch.eventdev", "applies to backend = \"eventdev\" only")),
        ("eventdev", dev) => {
            let dev = match dev.unwrap_or("event_sw") {
                "event_sw" => "event_sw".to_string(),
                d => vectorlb_dpdk::eventdev::pci_address(d).ok_or_else(|| bad("dispatch.eventdev", format!("'{d}' is not event_sw or a PCI address (a DLB, 0000:6d:00.0)")))?,
            };
            if mode == Mode::Inline {
                return Err(bad("dispatch.backend", "mode inline has no queue"));
            }
            if lifo_above > 0 {
                return Err(bad("dispatch.lifo_above", "an event device is first in, first out within a class: needs backend = \"software\""));
            }
            if threads > EVENTDEV_WORKERS {
                return Err(bad("dispatch.workers", format!("{threads}; at most {EVENTDEV_WORKERS} with backend = \"eventdev\"")));
            }
            if queue_limit.saturating_mul(classes.len()) > EVENTDEV_QUEUED {
                return Err(bad("dispatch.queue_limit", format!("{queue_limit} x {} classes is above the {EVENTDEV_QUEUED} items an event device holds here", classes.len())));
            }
            Backend::Eventdev(dev)
        }
        (b, _) => return Err(bad("dispatch.backend", format!("'{b}' is not software or eventdev"))),
    };
    Ok(DispatchConfig { workers: threads, mode, classes, queue_limit, max_wait, lifo_above, backend })
}

/// A class given by name in the configuration.
fn class_named(field: &str, name: &str, d: &DispatchConfig) -> Result<usize, ConfigError> {
    d.class(name).ok_or_else(|| bad(field, format!("no dispatch class named '{name}' (dispatch.classes)")))
}

fn priority(f: &str, p: &RawPriority, d: &DispatchConfig) -> Result<Priority, ConfigError> {
    let query = match &p.query {
        Some(q) if q.is_empty() || !q.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.') => {
            return Err(bad(format!("{f}.query"), format!("'{q}' is not a query parameter name")));
        }
        q => q.clone(),
    };
    let header = p.header.as_deref().map(|h| header_name(&format!("{f}.header"), h)).transpose()?;
    let mut sizes: Vec<(u64, usize)> = Vec::new();
    for (i, s) in p.sizes.iter().flatten().enumerate() {
        if sizes.last().is_some_and(|(b, _)| *b >= s.up_to) {
            return Err(bad(format!("{f}.sizes[{i}].up_to"), format!("{} is not above the previous entry's", s.up_to)));
        }
        sizes.push((s.up_to, class_named(&format!("{f}.sizes[{i}].class"), &s.class, d)?));
    }
    let class = match &p.class {
        Some(c) => class_named(&format!("{f}.class"), c, d)?,
        None => d.classes.len() - 1,
    };
    Ok(Priority { query, header, sizes, class })
}

/// Descriptors kept for everything but client and upstream connections: listeners, the
/// admin API, logs, the runtime, static objects being read, health checks.
const RESERVED_FDS: u64 = 64;

/// The client connections `nofile` descriptors serve: half of those left after a reserve, since
/// every client connection may hold one to an upstream; at least 16.
pub fn connections_for(nofile: u64) -> usize {
    (nofile.saturating_sub(RESERVED_FDS) / 2).clamp(16, 10_000_000) as usize
}

impl Config {
    /// Refuses connection limits the descriptor limit `nofile` cannot serve (see
    /// [`connections_for`]): a limit past the descriptors would make `accept` fail instead of
    /// evicting.
    pub fn check_descriptors(&self, nofile: u64) -> Result<(), ConfigError> {
        let can = connections_for(nofile);
        let over = |field: String, n: usize| {
            bad(field, format!("{n} is above the {can} client connections that {nofile} descriptors serve (two each, 64 kept); raise the limit (ulimit -n, systemd's LimitNOFILE) or lower this"))
        };
        if let Some(n) = self.max_connections.filter(|n| *n > can) {
            return Err(over("max_connections".into(), n));
        }
        for (i, l) in self.listeners.iter().enumerate() {
            if let Some(n) = l.limits.max_connections.filter(|n| *n > can) {
                return Err(over(format!("listeners[{i}].max_connections"), n));
            }
        }
        Ok(())
    }

    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { path: path.display().to_string(), msg: e.to_string() })?;
        Config::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string().trim_end().to_string()))?;
        // No listener is a proxy waiting for a controller to push its configuration
        // (`PUT /v1/config`): only with an admin API to receive it.
        if raw.listeners.is_empty() && raw.admin.is_none() {
            return Err(bad("listeners", "at least one [[listeners]] is needed (or an [admin] API to receive them)"));
        }
        let mut listeners = Vec::new();
        for (i, l) in raw.listeners.iter().enumerate() {
            let f = format!("listeners[{i}]");
            if l.name.is_empty() || listeners.iter().any(|x: &Listener| x.name == l.name) {
                return Err(bad(format!("{f}.name"), format!("'{}' is empty or used twice", l.name)));
            }
            let address: SocketAddr = l.address.parse().map_err(|_| bad(format!("{f}.address"), format!("'{}' is not ADDRESS:PORT", l.address)))?;
            // (Port 0 asks the kernel for a free port each: not a clash.)
            if address.port() != 0 && listeners.iter().any(|x: &Listener| x.address == address) {
                return Err(bad(format!("{f}.address"), format!("{address} is used by another listener")));
            }
            let protocols = match l.protocols.as_deref().unwrap_or("auto") {
                "auto" => Protocols::Auto,
                "http1" => Protocols::Http1,
                "http2" => Protocols::Http2,
                p => return Err(bad(format!("{f}.protocols"), format!("'{p}' is not auto, http1 or http2"))),
            };
            let tls = match &l.tls {
                None => None,
                Some(t) => {
                    let ft = format!("{f}.tls");
                    if t.certificates.is_empty() {
                        return Err(bad(format!("{ft}.certificates"), "at least one { cert, key } is needed"));
                    }
                    let mut certificates = Vec::new();
                    for (j, c) in t.certificates.iter().enumerate() {
                        let pem = |file: &Option<String>, inline: &Option<String>, what: &str| match (file, inline) {
                            (Some(p), None) => Ok(Pem::File(p.into())),
                            (None, Some(t)) if t.len() <= 1 << 20 => Ok(Pem::Inline(t.clone())),
                            (None, Some(_)) => Err(bad(format!("{ft}.certificates[{j}].{what}_pem"), "longer than 1 MiB")),
                            _ => Err(bad(format!("{ft}.certificates[{j}]"), format!("give {what} (a file) or {what}_pem (the PEM text), not both"))),
                        };
                        certificates.push(Certificate { cert: pem(&c.cert, &c.cert_pem, "cert")?, key: pem(&c.key, &c.key_pem, "key")? });
                    }
                    let kind = t.provider.as_deref().unwrap_or("inline");
                    if t.pool_threads.is_some() && kind != "pool" {
                        return Err(bad(format!("{ft}.pool_threads"), "only for provider = \"pool\""));
                    }
                    if t.inline_backend.is_some() && kind != "inline" {
                        return Err(bad(format!("{ft}.inline_backend"), "only for provider = \"inline\""));
                    }
                    for (name, v) in
                        [("poll_delay", t.poll_delay.is_some()), ("cryptomb_backend", t.cryptomb_backend.is_some()), ("cryptomb_fallback", t.cryptomb_fallback.is_some())]
                    {
                        if v && kind != "cryptomb" {
                            return Err(bad(format!("{ft}.{name}"), "only for provider = \"cryptomb\""));
                        }
                    }
                    let provider = match kind {
                        "inline" => Provider::Inline {
                            backend: match t.inline_backend.as_deref().unwrap_or("auto") {
                                "auto" => InlineBackend::Auto,
                                "boringssl" => InlineBackend::Boringssl,
                                "ippcp" => InlineBackend::Ippcp,
                                b => return Err(bad(format!("{ft}.inline_backend"), format!("'{b}' is not auto, boringssl or ippcp"))),
                            },
                        },
                        "pool" => {
                            let threads = t.pool_threads.unwrap_or(1);
                            if !(1..=256).contains(&threads) {
                                return Err(bad(format!("{ft}.pool_threads"), format!("{threads} is not in 1..=256")));
                            }
                            Provider::Pool { threads }
                        }
                        "cryptomb" => {
                            let d = t.poll_delay.unwrap_or(DEFAULT_POLL_DELAY);
                            if !(d.is_finite() && d > 0.0 && d <= 1.0) {
                                return Err(bad(format!("{ft}.poll_delay"), format!("{d} is not a number of seconds in (0, 1]")));
                            }
                            let backend = match t.cryptomb_backend.as_deref().unwrap_or("crypto_mb") {
                                "crypto_mb" => CryptoMbBackend::CryptoMb,
                                "portable" => CryptoMbBackend::Portable,
                                b => return Err(bad(format!("{ft}.cryptomb_backend"), format!("'{b}' is not crypto_mb or portable"))),
                            };
                            let fallback = match t.cryptomb_fallback.as_deref().unwrap_or("inline") {
                                "inline" => CryptoMbFallback::Inline,
                                "refuse" => CryptoMbFallback::Refuse,
                                f => return Err(bad(format!("{ft}.cryptomb_fallback"), format!("'{f}' is not inline or refuse"))),
                            };
                            Provider::CryptoMb { poll_delay: Duration::from_secs_f64(d), backend, fallback }
                        }
                        p => return Err(bad(format!("{ft}.provider"), format!("'{p}' is not inline, pool or cryptomb"))),
                    };
                    let min_version = t.min_version.clone().unwrap_or_else(|| "1.2".into());
                    if min_version != "1.2" && min_version != "1.3" {
                        return Err(bad(format!("{ft}.min_version"), format!("'{min_version}' is not 1.2 or 1.3")));
                    }
                    let max_version = t.max_version.clone().unwrap_or_else(|| "1.3".into());
                    if max_version != "1.2" && max_version != "1.3" {
                        return Err(bad(format!("{ft}.max_version"), format!("'{max_version}' is not 1.2 or 1.3")));
                    }
                    if max_version < min_version {
                        return Err(bad(format!("{ft}.max_version"), format!("{max_version} is below min_version {min_version}")));
                    }
                    Some(Tls { certificates, provider, resumption: t.resumption.unwrap_or(true), min_version, max_version })
                }
            };
            if l.handshake_timeout.is_some() && tls.is_none() {
                return Err(bad(format!("{f}.handshake_timeout"), "only for a listener with tls"));
            }
            let d = ClientLimits::default();
            let secs = |name: &str, v: Option<f64>, default: Duration| seconds(&format!("{f}.{name}"), v, default.as_secs_f64());
            let limits = ClientLimits {
                handshake_timeout: secs("handshake_timeout", l.handshake_timeout, d.handshake_timeout)?,
                header_timeout: secs("header_timeout", l.header_timeout, d.header_timeout)?,
                idle_timeout: secs("idle_timeout", l.idle_timeout, d.idle_timeout)?,
                body_timeout: secs("body_timeout", l.body_timeout, d.body_timeout)?,
                send_timeout: secs("send_timeout", l.send_timeout, d.send_timeout)?,
                max_connections: match l.max_connections {
                    Some(n) if !(1..=10_000_000).contains(&n) => return Err(bad(format!("{f}.max_connections"), format!("{n} is not in 1..=10000000"))),
                    n => n,
                },
                reset_budget: match l.reset_budget.unwrap_or(d.reset_budget) {
                    n @ 1..=1_000_000 => n,
                    n => return Err(bad(format!("{f}.reset_budget"), format!("{n} is not in 1..=1000000"))),
                },
                reset_window: match secs("reset_window", l.reset_window, d.reset_window)? {
                    // Shorter, a client spreads its resets over windows and the budget never fires.
                    w if w < Duration::from_millis(100) => {
                        return Err(bad(format!("{f}.reset_window"), format!("{w:?} is below 0.1 s: a client could reset without end and never meet the budget")))
                    }
                    w => w,
                },
                min_rate: match l.min_rate.unwrap_or(d.min_rate) {
                    n @ 0..=1_000_000_000 => n,
                    n => return Err(bad(format!("{f}.min_rate"), format!("{n} is not in 0..=1000000000 bytes a second"))),
                },
                connection_buffer: match l.connection_buffer.unwrap_or(d.connection_buffer) {
                    n @ 0..=1_073_741_824 => n,
                    n => return Err(bad(format!("{f}.connection_buffer"), format!("{n} is above 1 GiB"))),
                },
            };
            listeners.push(Listener { name: l.name.clone(), address, protocols, tls, reuseport: l.reuseport.unwrap_or(false), limits });
        }
        let mut clusters = Vec::new();
        let mut by_name = HashMap::new();
        for (i, c) in raw.clusters.iter().enumerate() {
            let f = format!("clusters[{i}]");
            if c.name.is_empty() || by_name.insert(c.name.clone(), i).is_some() {
                return Err(bad(format!("{f}.name"), format!("'{}' is empty or used twice", c.name)));
            }
            if c.endpoints.is_empty() {
                return Err(bad(format!("{f}.endpoints"), "at least one endpoint is needed"));
            }
            let mut endpoints: Vec<Endpoint> = Vec::new();
            for (j, e) in c.endpoints.iter().enumerate() {
                let (a, w) = match e {
                    RawEndpoint::Plain(a) => (a, 1),
                    RawEndpoint::Weighted { address, weight } => (address, weight.unwrap_or(1)),
                };
                let fe = format!("{f}.endpoints[{j}]");
                let address: SocketAddr = a.parse().map_err(|_| bad(&fe, format!("'{a}' is not ADDRESS:PORT")))?;
                if address.port() == 0 || address.ip().is_unspecified() {
                    return Err(bad(&fe, format!("{address} cannot be connected to")));
                }
                if endpoints.iter().any(|x| x.address == address) {
                    return Err(bad(&fe, format!("{address} is listed twice")));
                }
                if w > 1_000_000 {
                    return Err(bad(format!("{fe}.weight"), format!("{w} is above 1000000")));
                }
                endpoints.push(Endpoint { address, weight: w });
            }
            if endpoints.iter().all(|e| e.weight == 0) {
                return Err(bad(format!("{f}.endpoints"), "every endpoint has weight 0"));
            }
            let scheduler = match c.scheduler.as_deref().unwrap_or("rr") {
                s @ ("rr" | "wrr" | "maglev") => Algorithm::parse(s).expect("a known name"),
                s => return Err(bad(format!("{f}.scheduler"), format!("'{s}' is not rr, wrr or maglev"))),
            };
            let hash_header = c.hash_header.as_deref().map(|h| header_name(&format!("{f}.hash_header"), h)).transpose()?;
            if hash_header.is_some() && !matches!(scheduler, Algorithm::Maglev { .. }) {
                return Err(bad(format!("{f}.hash_header"), "only for scheduler = \"maglev\""));
            }
            let protocol = match c.protocol.as_deref().unwrap_or("http1") {
                "http1" => Upstream::Http1,
                "http2" => Upstream::Http2,
                p => return Err(bad(format!("{f}.protocol"), format!("'{p}' is not http1 or http2"))),
            };
            let max_connections = c.max_connections.unwrap_or(512);
            if !(1..=1_000_000).contains(&max_connections) {
                return Err(bad(format!("{f}.max_connections"), format!("{max_connections} is not in 1..=1000000")));
            }
            let max_idle = c.max_idle.unwrap_or(32.min(max_connections));
            if max_idle > max_connections {
                return Err(bad(format!("{f}.max_idle"), format!("{max_idle} is above max_connections {max_connections}: idle connections count among them")));
            }
            let request_buffer = c.request_buffer.unwrap_or(DEFAULT_REQUEST_BUFFER);
            if request_buffer > 64 << 20 {
                return Err(bad(format!("{f}.request_buffer"), format!("{request_buffer} is above 64 MiB")));
            }
            let client_share = c.client_share.unwrap_or(DEFAULT_CLIENT_SHARE);
            if !(client_share.is_finite() && client_share > 0.0 && client_share <= 1.0) {
                return Err(bad(format!("{f}.client_share"), format!("{client_share} is not a fraction in (0, 1]")));
            }
            // One cap per endpoint (the proxy keeps one set of connections to an address).
            for e in &endpoints {
                if let Some(o) = clusters.iter().find(|o: &&Cluster| o.max_connections != max_connections && o.endpoints.iter().any(|x| x.address == e.address)) {
                    return Err(bad(
                        format!("{f}.max_connections"),
                        format!("{max_connections}, but cluster '{}' gives {} its max_connections {}: an endpoint has one cap", o.name, e.address, o.max_connections),
                    ));
                }
                // The proxy's own listener as its endpoint: every request would come back to
                // it, hop after hop, until the cap.
                if let Some(l) = listeners.iter().find(|l| is_same_socket(l.address, e.address)) {
                    return Err(bad(format!("{f}.endpoints"), format!("{} is this proxy's own listener '{}' ({}): requests would loop", e.address, l.name, l.address)));
                }
            }
            clusters.push(Cluster {
                name: c.name.clone(),
                endpoints,
                scheduler,
                hash_header,
                protocol,
                connect_timeout: seconds(&format!("{f}.connect_timeout"), c.connect_timeout, 2.0)?,
                response_timeout: seconds(&format!("{f}.response_timeout"), c.response_timeout, 30.0)?,
                max_idle,
                max_connections,
                queue_timeout: seconds(&format!("{f}.queue_timeout"), c.queue_timeout, 1.0)?,
                send_timeout: seconds(&format!("{f}.send_timeout"), c.send_timeout, 60.0)?,
                read_timeout: seconds(&format!("{f}.read_timeout"), c.read_timeout, 60.0)?,
                request_buffer,
                health: c.health.as_ref().map(|h| health(&format!("{f}.health"), h)).transpose()?,
                client_share,
            });
        }
        if raw.routes.is_empty() && !raw.listeners.is_empty() {
            return Err(bad("routes", "at least one [[routes]] is needed"));
        }
        let workers = match raw.workers {
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            Some(w) if (1..=1024).contains(&w) => w,
            Some(w) => return Err(bad("workers", format!("{w} is not in 1..=1024"))),
        };
        let dispatch = dispatch(raw.dispatch.as_ref(), workers)?;
        let max_connections = match raw.max_connections {
            Some(n) if !(1..=10_000_000).contains(&n) => return Err(bad("max_connections", format!("{n} is not in 1..=10000000"))),
            n => n,
        };
        let buffer_memory = match raw.buffer_memory.unwrap_or(DEFAULT_BUFFER_MEMORY) {
            n @ 0..=68_719_476_736 => n,
            n => return Err(bad("buffer_memory", format!("{n} is above 64 GiB"))),
        };
        let mut routes = Vec::new();
        for (i, r) in raw.routes.iter().enumerate() {
            let f = format!("routes[{i}]");
            for (j, l) in r.listeners.iter().enumerate() {
                if !listeners.iter().any(|x| &x.name == l) {
                    return Err(bad(format!("{f}.listeners[{j}]"), format!("no listener named '{l}'")));
                }
            }
            let action = match (&r.cluster, &r.respond, &r.static_) {
                (None, None, None) if r.clusters.is_none() && r.redirect.is_some() => redirect(&format!("{f}.redirect"), r.redirect.as_ref().unwrap_or_else(|| unreachable!()))?,
                _ if r.redirect.is_some() => return Err(bad(&f, "needs exactly one of cluster, clusters, respond, redirect and static")),
                (Some(_), None, None) if r.clusters.is_some() => return Err(bad(&f, "needs exactly one of cluster, clusters, respond, redirect and static")),
                (Some(c), None, None) => Action::Cluster(*by_name.get(c).ok_or_else(|| bad(format!("{f}.cluster"), format!("no cluster named '{c}'")))?),
                (None, None, None) if r.clusters.is_some() => {
                    let list = r.clusters.as_deref().unwrap_or_default();
                    if list.is_empty() || list.len() > 256 {
                        return Err(bad(format!("{f}.clusters"), format!("{} entries: give 1 to 256", list.len())));
                    }
                    let mut split = Vec::new();
                    for (j, w) in list.iter().enumerate() {
                        let c = match (&w.name, w.status) {
                            (Some(c), None) => SplitTo::Cluster(*by_name.get(c).ok_or_else(|| bad(format!("{f}.clusters[{j}].name"), format!("no cluster named '{c}'")))?),
                            (None, None) => SplitTo::Status(500),
                            (None, Some(st)) if (400..=599).contains(&st) => SplitTo::Status(st),
                            (None, Some(st)) => return Err(bad(format!("{f}.clusters[{j}].status"), format!("{st} is not an error status (400..=599)"))),
                            (Some(_), Some(_)) => return Err(bad(format!("{f}.clusters[{j}]"), "a name or a status, not both")),
                        };
                        let weight = w.weight.unwrap_or(1);
                        if weight > 1_000_000 {
                            return Err(bad(format!("{f}.clusters[{j}].weight"), format!("{weight} is not in 0..=1000000")));
                        }
                        split.push((c, weight));
                    }
                    Action::Split(split)
                }
                (None, None, Some(st)) => {
                    let root = std::path::PathBuf::from(&st.root);
                    if !root.is_absolute() {
                        return Err(bad(format!("{f}.static.root"), format!("'{}' is not an absolute path", st.root)));
                    }
                    let max_bytes = st.max_bytes.unwrap_or(DEFAULT_MAX_OBJECT);
                    if !(1..=1 << 32).contains(&max_bytes) {
                        return Err(bad(format!("{f}.static.max_bytes"), format!("{max_bytes} is not in 1..=4294967296")));
                    }
                    Action::Static { root, max_bytes, direct_io: st.direct_io.unwrap_or(false) }
                }
                (None, Some(a), None) => {
                    if !(200..=599).contains(&a.status) {
                        return Err(bad(format!("{f}.respond.status"), format!("{} is not a status in 200..=599", a.status)));
                    }
                    if a.body.len() > 65536 {
                        return Err(bad(format!("{f}.respond.body"), "longer than 64 KiB"));
                    }
                    Action::Respond { status: a.status, body: a.body.clone() }
                }
                _ => return Err(bad(&f, "needs exactly one of cluster, clusters, respond, redirect and static")),
            };
            let priority = match (&r.priority, &action) {
                (None, _) => Priority { class: dispatch.classes.len() - 1, ..Default::default() },
                (Some(p), Action::Static { .. }) => priority(&format!("{f}.priority"), p, &dispatch)?,
                (Some(_), _) => return Err(bad(format!("{f}.priority"), "only for routes with static")),
            };
            let host = match &r.host {
                Some(h) => {
                    // Compared with the request's canonical host: lower case, no trailing dot.
                    let h = h.to_ascii_lowercase();
                    let h = h.strip_suffix('.').unwrap_or(&h).to_string();
                    let name = h.strip_prefix("*.").unwrap_or(&h);
                    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
                        return Err(bad(format!("{f}.host"), format!("'{h}' is not a host name (or *.suffix)")));
                    }
                    Some(h)
                }
                None => None,
            };
            let path = match (&r.path_prefix, &r.path_segments, &r.path_exact) {
                (None, None, None) => PathMatch::Prefix("/".into()),
                (Some(p), None, None) => PathMatch::Prefix(path_field(&format!("{f}.path_prefix"), p)?),
                (None, Some(p), None) => PathMatch::Segments(path_field(&format!("{f}.path_segments"), p)?),
                (None, None, Some(p)) => PathMatch::Exact(path_field(&format!("{f}.path_exact"), p)?),
                _ => return Err(bad(&f, "give at most one of path_prefix, path_segments and path_exact")),
            };
            if matches!(action, Action::Static { .. }) && !matches!(path, PathMatch::Prefix(_)) {
                return Err(bad(&f, "a static route matches by path_prefix (the part it strips)"));
            }
            let mut headers = Vec::new();
            for (g, h) in r.header.iter().map(|h| (format!("{f}.header"), h)).chain(r.headers.iter().enumerate().map(|(j, h)| (format!("{f}.headers[{j}]"), h))) {
                headers.push((header_name(&format!("{g}.name"), &h.name)?, h.value.clone()));
            }
            if headers.len() > 64 {
                return Err(bad(format!("{f}.headers"), "more than 64 header matches"));
            }
            let request_headers = header_edit(&format!("{f}.request_headers"), r.request_headers.as_ref())?;
            let response_headers = header_edit(&format!("{f}.response_headers"), r.response_headers.as_ref())?;
            let timeout = r.timeout.map(|t| seconds(&format!("{f}.timeout"), Some(t), 0.0)).transpose()?;
            let forwards = matches!(action, Action::Cluster(_) | Action::Split(_));
            if !forwards && (!request_headers.is_empty() || timeout.is_some()) {
                return Err(bad(&f, "request_headers and timeout are for routes that forward (cluster, clusters)"));
            }
            routes.push(Route { listeners: r.listeners.clone(), matches: Match { host, path, headers }, action, priority, request_headers, response_headers, timeout });
        }
        let admin = match raw.admin {
            None => None,
            Some(a) => {
                let unix = match a.address.strip_prefix("unix:") {
                    Some(p) if p.starts_with('/') => true,
                    Some(_) => return Err(bad("admin.address", format!("'{}': unix: takes an absolute path", a.address))),
                    None => {
                        a.address.parse::<SocketAddr>().map_err(|_| bad("admin.address", format!("'{}' is not ADDRESS:PORT or unix:PATH", a.address)))?;
                        false
                    }
                };
                if unix && a.token_file.is_some() {
                    return Err(bad("admin.token_file", "a unix socket is guarded by its permissions (admin.group); the token is for a TCP address"));
                }
                if !unix && a.token_file.as_deref().is_none_or(str::is_empty) {
                    return Err(bad("admin.address", "a TCP admin API needs admin.token_file (a file only its owner can read, holding the token); or listen on unix:PATH"));
                }
                if !unix && a.group.is_some() {
                    return Err(bad("admin.group", "only for a unix:PATH address"));
                }
                Some(Admin { address: a.address, token_file: a.token_file, group: a.group })
            }
        };
        if raw.access_log.as_deref() == Some("") {
            return Err(bad("access_log", "empty: a file path, or \"-\" for standard output"));
        }
        let dispatch = (raw.dispatch.is_some() || routes.iter().any(|r| matches!(r.action, Action::Static { .. }))).then_some(dispatch);
        Ok(Config { workers, max_connections, buffer_memory, admin, access_log: raw.access_log, listeners, routes, clusters, dispatch })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[listeners]]
name = "web"
address = "127.0.0.1:8080"

[[routes]]
host = "*.example.com"
path_prefix = "/api"
header = { name = "X-Canary", value = "1" }
cluster = "api"

[[routes]]
cluster = "web"

[[clusters]]
name = "api"
endpoints = ["127.0.0.1:9001", { address = "127.0.0.1:9002", weight = 3 }]
scheduler = "maglev"
hash_header = "X-User"
protocol = "http2"
connect_timeout = 0.5

[[clusters]]
name = "web"
endpoints = ["[::1]:9003"]
"#;

    fn err(text: &str) -> String {
        Config::parse(text).expect_err("should be refused").to_string()
    }

    #[test]
    fn a_good_file() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.listeners[0].protocols, Protocols::Auto);
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[0].matches.headers, vec![("x-canary".into(), "1".into())]);
        assert_eq!(c.routes[0].matches.host.as_deref(), Some("*.example.com"));
        assert_eq!(c.routes[1].matches.path, PathMatch::Prefix("/".into()));
        assert_eq!(c.routes[1].action, Action::Cluster(1));
        let api = &c.clusters[0];
        assert_eq!(api.endpoints[1], Endpoint { address: "127.0.0.1:9002".parse().unwrap(), weight: 3 });
        assert_eq!((api.protocol, api.hash_header.as_deref()), (Upstream::Http2, Some("x-user")));
        assert_eq!(api.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.clusters[1].scheduler, Algorithm::Rr);
    }

    #[test]
    fn redirects_build_their_location() {
        let r =
            |scheme: &str, host: Option<&str>, port: u16, path: Option<RedirectPath>| Redirect { status: 302, scheme: scheme.into(), host: host.map(str::to_string), port, path };
        assert_eq!(r("http", None, 80, None).location("a.example:8080", "/x?y=1", "/"), "http://a.example/x?y=1");
        assert_eq!(r("https", Some("b.example"), 443, None).location("a.example", "/x", "/"), "https://b.example/x");
        assert_eq!(r("http", None, 8080, None).location("[2001:db8::1]:80", "/", "/"), "http://[2001:db8::1]:8080/");
        assert_eq!(r("http", None, 80, Some(RedirectPath::Full("/new".into()))).location("a", "/old/p?q", "/old"), "http://a/new?q");
        let p = |to: &str| Some(RedirectPath::Prefix(to.into()));
        assert_eq!(r("http", None, 80, p("/new")).location("a", "/old/p", "/old"), "http://a/new/p");
        assert_eq!(r("http", None, 80, p("/new")).location("a", "/old", "/old"), "http://a/new");
        assert_eq!(r("http", None, 80, p("/")).location("a", "/old/p", "/old"), "http://a/p");
        assert_eq!(r("http", None, 80, p("/")).location("a", "/old", "/old"), "http://a/");
        let base = "[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\n[[routes]]\n";
        for (route, err) in [
            ("redirect = { scheme = \"ftp\", port = 80 }", "routes[0].redirect.scheme"),
            ("redirect = { scheme = \"http\", port = 80, status = 200 }", "routes[0].redirect.status"),
            ("redirect = { scheme = \"http\", port = 0 }", "routes[0].redirect.port"),
            ("redirect = { scheme = \"http\", port = 80, host = \"a b\" }", "routes[0].redirect.host"),
            ("redirect = { scheme = \"http\", port = 80, path = \"/a\", prefix = \"/b\" }", "routes[0].redirect"),
            ("redirect = { scheme = \"http\", port = 80 }\nrespond = { status = 200 }", "routes[0]"),
        ] {
            let e = Config::parse(&format!("{base}{route}\n")).unwrap_err().to_string();
            assert!(e.starts_with(err), "{route}: {e}");
        }
        let c = Config::parse(&format!("{base}redirect = {{ scheme = \"https\", port = 443, status = 301, prefix = \"/v2\" }}\n")).unwrap();
        assert_eq!(c.routes[0].action, Action::Redirect(Redirect { status: 301, scheme: "https".into(), host: None, port: 443, path: p("/v2") }));
    }

    #[test]
    fn bad_files_are_refused_naming_the_field() {
        for (from, to, want) in [
            ("address = \"127.0.0.1:8080\"", "address = \"nowhere\"", "listeners[0].address"),
            ("name = \"web\"\naddress", "name = \"web\"\nprotocols = \"spdy\"\naddress", "listeners[0].protocols"),
            ("cluster = \"api\"", "cluster = \"apj\"", "routes[0].cluster: no cluster named 'apj'"),
            ("path_prefix = \"/api\"", "path_prefix = \"api\"", "routes[0].path_prefix"),
            ("host = \"*.example.com\"", "host = \"ex ample\"", "routes[0].host"),
            ("name = \"X-Canary\"", "name = \"X Canary\"", "routes[0].header.name"),
            ("\"127.0.0.1:9001\", {", "\"127.0.0.1:0\", {", "clusters[0].endpoints[0]"),
            ("\"127.0.0.1:9001\", {", "\"127.0.0.1:9002\", {", "clusters[0].endpoints[1]: 127.0.0.1:9002 is listed twice"),
            ("scheduler = \"maglev\"", "scheduler = \"wlc\"", "clusters[0].scheduler"),
            ("scheduler = \"maglev\"", "scheduler = \"rr\"", "clusters[0].hash_header: only for scheduler"),
            ("protocol = \"http2\"", "protocol = \"http3\"", "clusters[0].protocol"),
            ("connect_timeout = 0.5", "connect_timeout = -1", "clusters[0].connect_timeout"),
            ("connect_timeout = 0.5", "connect_timeout = nan", "clusters[0].connect_timeout"),
            ("name = \"web\"\nendpoints", "name = \"api\"\nendpoints", "clusters[1].name"),
            ("endpoints = [\"[::1]:9003\"]", "endpoints = []", "clusters[1].endpoints: at least one"),
            ("weight = 3", "weight = 3000000", "clusters[0].endpoints[1].weight"),
            ("[[listeners]]", "[[listener]]", "unknown field"),
        ] {
            assert!(GOOD.contains(from), "{from}");
            let e = err(&GOOD.replacen(from, to, 1));
            assert!(e.contains(want), "{to}: {e}");
        }
        assert!(err("").contains("listeners: at least one"));
        let idle = Config::parse("[admin]\naddress = \"unix:/run/vectorlb/gw.sock\"\n").expect("a proxy waiting for its configuration");
        assert!(idle.listeners.is_empty() && idle.routes.is_empty());
        assert!(err("[[listeners]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n").contains("routes: at least one"));
    }

    #[test]
    fn admin_workers_and_direct_responses() {
        let base = "[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\n[[routes]]\nrespond = { status = 204 }\n";
        let c = Config::parse(&format!("workers = 3\n[admin]\naddress = \"unix:/run/p.sock\"\n{base}")).unwrap();
        assert_eq!(c.workers, 3);
        assert_eq!(c.admin.unwrap().address, "unix:/run/p.sock");
        assert_eq!(c.routes[0].action, Action::Respond { status: 204, body: String::new() });
        for (text, want) in [
            (format!("workers = 0\n{base}"), "workers: 0 is not in 1..=1024"),
            (format!("[admin]\naddress = \"127.0.0.1:9901\"\n{base}"), "admin.address: a TCP admin API needs admin.token_file"),
            (format!("[admin]\naddress = \"unix:/p.sock\"\ntoken_file = \"/t\"\n{base}"), "admin.token_file: a unix socket"),
            (format!("[admin]\naddress = \"unix:p.sock\"\n{base}"), "admin.address"),
            (format!("[admin]\naddress = \"localhost\"\n{base}"), "admin.address: 'localhost' is not ADDRESS:PORT or unix:PATH"),
            (base.replace("status = 204", "status = 99"), "routes[0].respond.status"),
            (
                base.replace("respond = { status = 204 }", "respond = { status = 200 }\ncluster = \"x\""),
                "routes[0]: needs exactly one of cluster, clusters, respond, redirect and static",
            ),
        ] {
            let e = Config::parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn dispatch_classes_and_static_routes() {
        use crate::config::Mode;
        let base = "[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\n";
        let with = |d: &str, route: &str| Config::parse(&format!("workers = 2\n{d}\n{base}[[routes]]\n{route}\n")).map_err(|e| e.to_string());
        // No static route, no [dispatch]: no pool.
        assert!(with("", "respond = { status = 204 }").unwrap().dispatch.is_none());
        // A static route alone: one class, as many threads as workers.
        let c = with("", "path_prefix = \"/o/\"\nstatic = { root = \"/srv\" }").unwrap();
        let d = c.dispatch.unwrap();
        assert_eq!((d.workers, d.mode, d.classes.len(), d.queue_limit), (2, Mode::Priority, 1, 1024));
        assert_eq!(c.routes[0].action, Action::Static { root: "/srv".into(), max_bytes: DEFAULT_MAX_OBJECT, direct_io: false });
        assert_eq!(c.routes[0].priority.class, 0);
        let classes = "[dispatch]\nworkers = 3\nmode = \"fifo\"\nqueue_limit = 64\nmax_wait = 0.5\nlifo_above = 8\nclasses = [{ name = \"high\" }, { name = \"mid\", share = 10 }, { name = \"low\", share = 5 }]";
        let c = with(classes, "static = { root = \"/srv\", max_bytes = 1000 }\npriority = { query = \"prio\", header = \"X-Priority\", sizes = [{ up_to = 10240, class = \"high\" }, { up_to = 1048576, class = \"mid\" }] }").unwrap();
        let d = c.dispatch.unwrap();
        assert_eq!((d.workers, d.mode, d.queue_limit, d.max_wait, d.lifo_above), (3, Mode::Fifo, 64, Duration::from_millis(500), 8));
        assert_eq!(d.classes.iter().map(|c| (c.name.as_str(), c.share)).collect::<Vec<_>>(), vec![("high", 0), ("mid", 10), ("low", 5)]);
        assert_eq!(d.backend, Backend::Software);
        let ev =
            with("[dispatch]\nbackend = \"eventdev\"\nqueue_limit = 512\nclasses = [{ name = \"high\" }, { name = \"low\", share = 5 }]", "static = { root = \"/srv\" }").unwrap();
        assert_eq!(ev.dispatch.unwrap().backend, Backend::Eventdev("event_sw".into()));
        let p = &c.routes[0].priority;
        assert_eq!((p.query.as_deref(), p.header.as_deref(), p.sizes.clone(), p.class), (Some("prio"), Some("x-priority"), vec![(10240, 0), (1048576, 1)], 2));
        for (d, route, want) in [
            ("[dispatch]\nmode = \"lifo\"", "static = { root = \"/s\" }", "dispatch.mode: 'lifo' is not priority, fifo or inline"),
            ("[dispatch]\nworkers = 0", "static = { root = \"/s\" }", "dispatch.workers: 0 is not in 1..=1024"),
            ("[dispatch]\nqueue_limit = 0", "static = { root = \"/s\" }", "dispatch.queue_limit"),
            ("[dispatch]\nmax_wait = 0", "static = { root = \"/s\" }", "dispatch.max_wait"),
            ("[dispatch]\nqueue_limit = 4\nlifo_above = 5", "static = { root = \"/s\" }", "dispatch.lifo_above: 5 is above queue_limit 4"),
            ("[dispatch]\nclasses = [{ name = \"a\", share = 5 }]", "static = { root = \"/s\" }", "dispatch.classes[0].share: the most urgent class"),
            ("[dispatch]\nclasses = [{ name = \"a\" }, { name = \"a\" }]", "static = { root = \"/s\" }", "dispatch.classes[1].name"),
            ("[dispatch]\nclasses = [{ name = \"a\" }, { name = \"7\" }]", "static = { root = \"/s\" }", "dispatch.classes[1].name"),
            ("[dispatch]\nclasses = [{ name = \"a\" }, { name = \"b\", share = 101 }]", "static = { root = \"/s\" }", "dispatch.classes[1].share: 101"),
            ("[dispatch]\nclasses = [{ name = \"a\" }, { name = \"b\", share = 100 }]", "static = { root = \"/s\" }", "dispatch.classes: the shares add up to 100 %"),
            (
                "[dispatch]\nclasses = [{ name = \"a\" }, { name = \"b\", share = 60 }, { name = \"c\", share = 50 }]",
                "static = { root = \"/s\" }",
                "dispatch.classes: the shares add up to 110 %",
            ),
            ("[dispatch]\nthreads = 2", "static = { root = \"/s\" }", "unknown field `threads`"),
            ("[dispatch]\nbackend = \"dlb\"", "static = { root = \"/s\" }", "dispatch.backend: 'dlb' is not software or eventdev"),
            ("[dispatch]\neventdev = \"event_sw\"", "static = { root = \"/s\" }", "dispatch.eventdev: applies to backend"),
            ("[dispatch]\nbackend = \"eventdev\"\neventdev = \"eth0\"", "static = { root = \"/s\" }", "dispatch.eventdev: 'eth0' is not event_sw"),
            ("[dispatch]\nbackend = \"eventdev\"\nmode = \"inline\"", "static = { root = \"/s\" }", "dispatch.backend: mode inline"),
            ("[dispatch]\nbackend = \"eventdev\"\nlifo_above = 2", "static = { root = \"/s\" }", "dispatch.lifo_above: an event device"),
            ("[dispatch]\nbackend = \"eventdev\"\nworkers = 40", "static = { root = \"/s\" }", "dispatch.workers: 40; at most 31"),
            (
                "[dispatch]\nbackend = \"eventdev\"\nclasses = [{ name = \"a\" }, { name = \"b\" }, { name = \"c\" }]",
                "static = { root = \"/s\" }",
                "dispatch.queue_limit: 1024 x 3 classes",
            ),
            ("", "static = { root = \"srv\" }", "routes[0].static.root: 'srv' is not an absolute path"),
            ("", "static = { root = \"/s\", max_bytes = 0 }", "routes[0].static.max_bytes"),
            ("", "static = { root = \"/s\" }\ncluster = \"c\"", "routes[0]: needs exactly one of"),
            ("", "respond = { status = 204 }\npriority = { class = \"default\" }", "routes[0].priority: only for routes with static"),
            ("", "static = { root = \"/s\" }\npriority = { class = \"urgent\" }", "routes[0].priority.class: no dispatch class named 'urgent'"),
            ("", "static = { root = \"/s\" }\npriority = { query = \"a b\" }", "routes[0].priority.query"),
            ("", "static = { root = \"/s\" }\npriority = { header = \"a b\" }", "routes[0].priority.header"),
            (
                "",
                "static = { root = \"/s\" }\npriority = { sizes = [{ up_to = 10, class = \"default\" }, { up_to = 10, class = \"default\" }] }",
                "routes[0].priority.sizes[1].up_to",
            ),
        ] {
            let e = with(d, route).unwrap_err();
            assert!(e.contains(want), "{d} / {route}: {e}");
        }
    }

    #[test]
    fn client_and_upstream_limits() {
        let with = |global: &str, listener: &str, cluster: &str| {
            Config::parse(&format!(
                "{global}\n[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\n{listener}\n[[routes]]\ncluster = \"c\"\n[[clusters]]\nname = \"c\"\nendpoints = [\"127.0.0.1:9\"]\n{cluster}\n"
            ))
            .map_err(|e| e.to_string())
        };
        let c = with("", "", "").unwrap();
        assert_eq!(c.max_connections, None);
        assert_eq!(c.listeners[0].limits, ClientLimits::default());
        let u = &c.clusters[0];
        assert_eq!((u.max_connections, u.max_idle, u.queue_timeout, u.request_buffer), (512, 32, Duration::from_secs(1), DEFAULT_REQUEST_BUFFER));
        assert_eq!((u.send_timeout, u.read_timeout), (Duration::from_secs(60), Duration::from_secs(60)));
        let c = with(
            "max_connections = 5000",
            "header_timeout = 5\nidle_timeout = 30\nbody_timeout = 20\nsend_timeout = 15\nmax_connections = 100\nreset_budget = 20\nreset_window = 5",
            "max_connections = 8\nqueue_timeout = 0.2\nsend_timeout = 3\nread_timeout = 4\nrequest_buffer = 0",
        )
        .unwrap();
        assert_eq!(c.max_connections, Some(5000));
        let l = &c.listeners[0].limits;
        assert_eq!(
            (l.header_timeout, l.idle_timeout, l.body_timeout, l.send_timeout),
            (Duration::from_secs(5), Duration::from_secs(30), Duration::from_secs(20), Duration::from_secs(15))
        );
        assert_eq!((l.max_connections, l.reset_budget, l.reset_window), (Some(100), 20, Duration::from_secs(5)));
        let u = &c.clusters[0];
        assert_eq!((u.max_connections, u.max_idle, u.request_buffer), (8, 8, 0), "max_idle follows a smaller max_connections");
        for (g, l, cl, want) in [
            ("max_connections = 0", "", "", "max_connections: 0 is not in"),
            ("", "max_connections = 0", "", "listeners[0].max_connections"),
            ("", "header_timeout = 0", "", "listeners[0].header_timeout"),
            ("", "idle_timeout = -1", "", "listeners[0].idle_timeout"),
            ("", "body_timeout = nan", "", "listeners[0].body_timeout"),
            ("", "send_timeout = 7200", "", "listeners[0].send_timeout"),
            ("", "handshake_timeout = 5", "", "listeners[0].handshake_timeout: only for a listener with tls"),
            ("", "reset_budget = 0", "", "listeners[0].reset_budget"),
            ("", "reset_window = 0", "", "listeners[0].reset_window"),
            ("", "", "max_connections = 0", "clusters[0].max_connections"),
            ("", "", "max_connections = 4\nmax_idle = 5", "clusters[0].max_idle: 5 is above max_connections 4"),
            ("", "", "queue_timeout = 0", "clusters[0].queue_timeout"),
            ("", "", "read_timeout = 0", "clusters[0].read_timeout"),
            ("", "", "request_buffer = 100000000", "clusters[0].request_buffer"),
            // A budget that could never fire, deadlines that pass at once.
            ("", "reset_window = 1e-9", "", "listeners[0].reset_window: 0.000000001 is not a number of seconds"),
            ("", "reset_window = 0.05", "", "listeners[0].reset_window: 50ms is below 0.1 s"),
            ("", "body_timeout = 0.0001", "", "listeners[0].body_timeout"),
            ("", "min_rate = 2000000000", "", "listeners[0].min_rate"),
            ("", "connection_buffer = 2000000000", "", "listeners[0].connection_buffer"),
            ("buffer_memory = 100000000000", "", "", "buffer_memory: 100000000000 is above 64 GiB"),
            ("", "", "client_share = 0", "clusters[0].client_share: 0 is not a fraction"),
            ("", "", "client_share = 1.5", "clusters[0].client_share"),
            ("", "", "client_share = nan", "clusters[0].client_share"),
        ] {
            let e = with(g, l, cl).unwrap_err();
            assert!(e.contains(want), "{g} / {l} / {cl}: {e}");
        }
        // The new limits' defaults and settings.
        let c = with("", "", "").unwrap();
        assert_eq!((c.buffer_memory, c.listeners[0].limits.min_rate, c.listeners[0].limits.connection_buffer, c.clusters[0].client_share), (256 << 20, 500, 1 << 20, 0.125));
        let c = with("buffer_memory = 1000", "min_rate = 0\nconnection_buffer = 0", "client_share = 1").unwrap();
        assert_eq!((c.buffer_memory, c.listeners[0].limits.min_rate, c.listeners[0].limits.connection_buffer, c.clusters[0].client_share), (1000, 0, 0, 1.0));
        // Limits past the descriptors are refused when the proxy is built (start, reload).
        let c = with("max_connections = 500", "max_connections = 400", "").unwrap();
        assert!(c.check_descriptors(1024).unwrap_err().to_string().contains("max_connections: 500 is above the 480 client connections that 1024 descriptors serve"));
        assert!(c.check_descriptors(1088).is_ok());
        let c = with("", "max_connections = 481", "").unwrap();
        assert!(c.check_descriptors(1024).unwrap_err().to_string().starts_with("listeners[0].max_connections: 481"));
    }

    #[test]
    fn an_endpoint_has_one_cap_and_is_never_the_proxys_own_listener() {
        let with = |listener: &str, clusters: &str| {
            Config::parse(&format!("[[listeners]]\nname = \"l\"\naddress = \"{listener}\"\n[[routes]]\ncluster = \"a\"\n{clusters}")).map_err(|e| e.to_string())
        };
        let two = |a: &str, b: &str, max_a: usize, max_b: usize| {
            format!("[[clusters]]\nname = \"a\"\nendpoints = [\"{a}\"]\nmax_connections = {max_a}\n[[clusters]]\nname = \"b\"\nendpoints = [\"{b}\"]\nmax_connections = {max_b}\n")
        };
        assert!(with("127.0.0.1:8080", &two("127.0.0.1:9", "127.0.0.1:9", 64, 64)).is_ok(), "the same cap twice");
        let e = with("127.0.0.1:8080", &two("127.0.0.1:9", "127.0.0.1:9", 64, 32)).unwrap_err();
        assert!(e.contains("clusters[1].max_connections: 32, but cluster 'a' gives 127.0.0.1:9 its max_connections 64"), "{e}");
        for (listener, endpoint) in
            [("127.0.0.1:8080", "127.0.0.1:8080"), ("0.0.0.0:8080", "127.0.0.1:8080"), ("[::]:8080", "[::1]:8080"), ("127.0.0.1:8080", "[::ffff:127.0.0.1]:8080")]
        {
            let e = with(listener, &two(endpoint, "127.0.0.1:9", 1, 1)).unwrap_err();
            assert!(e.contains("clusters[0].endpoints: ") && e.contains("requests would loop"), "{listener} {endpoint}: {e}");
        }
        assert!(with("0.0.0.0:8080", &two("127.0.0.1:8081", "192.0.2.1:8080", 1, 1)).is_ok(), "another port, another host");
    }

    #[test]
    fn health_checks() {
        let with = |h: &str| {
            Config::parse(&format!(
                "[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\n[[routes]]\ncluster = \"c\"\n[[clusters]]\nname = \"c\"\nendpoints = [\"127.0.0.1:9\"]\nhealth = {h}\n"
            ))
            .map(|c| c.clusters[0].health.clone().unwrap())
            .map_err(|e| e.to_string())
        };
        let h = with("{}").unwrap();
        assert_eq!(
            h,
            Health { kind: HealthKind::Http { path: "/".into(), expect_status: 200 }, interval: Duration::from_secs(2), timeout: Duration::from_secs(1), rise: 2, fall: 3 }
        );
        assert_eq!(with("{ kind = \"tcp\", interval = 0.5, timeout = 0.2, rise = 1, fall = 1 }").unwrap().kind, HealthKind::Tcp);
        for (h, want) in [
            ("{ kind = \"icmp\" }", "clusters[0].health.kind"),
            ("{ kind = \"tcp\", path = \"/\" }", "clusters[0].health.path: only for kind = \"http\""),
            ("{ path = \"healthz\" }", "clusters[0].health.path"),
            ("{ expect_status = 42 }", "clusters[0].health.expect_status"),
            ("{ interval = 0.5, timeout = 1.0 }", "clusters[0].health.timeout"),
            ("{ rise = 0 }", "clusters[0].health.rise"),
            ("{ fall = 1000 }", "clusters[0].health.fall"),
            ("{ interval = -1 }", "clusters[0].health.interval"),
        ] {
            let e = with(h).unwrap_err();
            assert!(e.contains(want), "{h}: {e}");
        }
    }

    #[test]
    fn providers_and_their_settings() {
        let with = |tls: &str| {
            Config::parse(&format!(
                "[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\ntls = {{ certificates = [{{ cert = \"c\", key = \"k\" }}], {tls} }}\n\
                 [[routes]]\ncluster = \"c\"\n[[clusters]]\nname = \"c\"\nendpoints = [\"127.0.0.1:9\"]\n"
            ))
            .map(|c| c.listeners[0].tls.as_ref().unwrap().provider)
            .map_err(|e| e.to_string())
        };
        assert_eq!(with("provider = \"inline\""), Ok(Provider::Inline { backend: InlineBackend::Auto }));
        assert_eq!(with("provider = \"inline\", inline_backend = \"boringssl\""), Ok(Provider::Inline { backend: InlineBackend::Boringssl }));
        assert_eq!(with("provider = \"inline\", inline_backend = \"ippcp\""), Ok(Provider::Inline { backend: InlineBackend::Ippcp }));
        assert_eq!(with("provider = \"pool\", pool_threads = 3"), Ok(Provider::Pool { threads: 3 }));
        assert_eq!(
            with("provider = \"cryptomb\""),
            Ok(Provider::CryptoMb { poll_delay: Duration::from_millis(1), backend: CryptoMbBackend::CryptoMb, fallback: CryptoMbFallback::Inline })
        );
        assert_eq!(
            with("provider = \"cryptomb\", poll_delay = 0.0002, cryptomb_backend = \"portable\", cryptomb_fallback = \"refuse\""),
            Ok(Provider::CryptoMb { poll_delay: Duration::from_micros(200), backend: CryptoMbBackend::Portable, fallback: CryptoMbFallback::Refuse })
        );
        for (tls, want) in [
            ("max_version = \"1.4\"", "listeners[0].tls.max_version"),
            ("min_version = \"1.3\", max_version = \"1.2\"", "listeners[0].tls.max_version: 1.2 is below min_version 1.3"),
            ("provider = \"qat\"", "listeners[0].tls.provider: 'qat' is not inline, pool or cryptomb"),
            ("inline_backend = \"openssl\"", "listeners[0].tls.inline_backend: 'openssl' is not auto, boringssl or ippcp"),
            ("provider = \"pool\", inline_backend = \"ippcp\"", "listeners[0].tls.inline_backend: only for provider = \"inline\""),
            ("provider = \"cryptomb\", poll_delay = 0", "listeners[0].tls.poll_delay"),
            ("provider = \"cryptomb\", poll_delay = 5", "listeners[0].tls.poll_delay"),
            ("provider = \"cryptomb\", cryptomb_backend = \"qat\"", "listeners[0].tls.cryptomb_backend"),
            ("provider = \"cryptomb\", cryptomb_fallback = \"maybe\"", "listeners[0].tls.cryptomb_fallback"),
            ("provider = \"pool\", poll_delay = 0.001", "listeners[0].tls.poll_delay: only for provider = \"cryptomb\""),
            ("provider = \"cryptomb\", pool_threads = 2", "listeners[0].tls.pool_threads: only for provider = \"pool\""),
        ] {
            let e = with(tls).unwrap_err();
            assert!(e.contains(want), "{tls}: {e}");
        }
    }

    #[test]
    fn gateway_route_features_and_their_errors() {
        let base = "[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:0\"\n[[clusters]]\nname = \"a\"\nendpoints = [\"127.0.0.1:9\"]\n[[clusters]]\nname = \"b\"\nendpoints = [\"127.0.0.1:10\"]\n";
        let with = |route: &str| Config::parse(&format!("{base}[[routes]]\n{route}\n")).map_err(|e| e.to_string());
        let c = with(
            "path_segments = \"/api/\"\nheader = { name = \"X-A\", value = \"1\" }\nheaders = [{ name = \"x-b\", value = \"2\" }]\n\
             clusters = [{ name = \"a\", weight = 90 }, { name = \"b\", weight = 10 }, { weight = 5 }]\n\
             request_headers = { set = [{ name = \"X-Env\", value = \"prod\" }], add = [{ name = \"x-tag\", value = \"t\" }], remove = [\"X-Debug\"] }\n\
             response_headers = { set = [{ name = \"x-served-by\", value = \"vectorlb\" }] }\ntimeout = 2.5",
        )
        .unwrap();
        let r = &c.routes[0];
        assert_eq!(r.matches.path, PathMatch::Segments("/api/".into()));
        assert_eq!(r.matches.headers, vec![("x-a".into(), "1".into()), ("x-b".into(), "2".into())]);
        assert_eq!(r.action, Action::Split(vec![(SplitTo::Cluster(0), 90), (SplitTo::Cluster(1), 10), (SplitTo::Status(500), 5)]));
        let s = with("clusters = [{ status = 503 }]").unwrap();
        assert_eq!(s.routes[0].action, Action::Split(vec![(SplitTo::Status(503), 1)]));
        assert_eq!((r.request_headers.set.len(), r.request_headers.add.len(), r.request_headers.remove[0].as_str()), (1, 1, "x-debug"));
        assert_eq!(r.response_headers.set[0].0.as_str(), "x-served-by");
        assert_eq!(r.timeout, Some(Duration::from_millis(2500)));
        let mut h = hyper::HeaderMap::new();
        h.insert("x-env", "dev".parse().unwrap());
        h.append("x-env", "test".parse().unwrap());
        h.insert("x-debug", "1".parse().unwrap());
        h.insert("x-tag", "s".parse().unwrap());
        r.request_headers.apply(&mut h);
        assert_eq!(h.get_all("x-env").iter().collect::<Vec<_>>(), ["prod"]);
        assert_eq!(h.get_all("x-tag").iter().collect::<Vec<_>>(), ["s", "t"]);
        assert!(!h.contains_key("x-debug"));
        assert_eq!(with("path_exact = \"/x\"\ncluster = \"a\"").unwrap().routes[0].matches.path, PathMatch::Exact("/x".into()));
        for (route, want) in [
            ("path_exact = \"/x\"\npath_prefix = \"/\"\ncluster = \"a\"", "at most one of path_prefix, path_segments and path_exact"),
            ("path_segments = \"x\"\ncluster = \"a\"", "routes[0].path_segments: 'x' does not start with /"),
            ("path_exact = \"/x?y=1\"\ncluster = \"a\"", "routes[0].path_exact"),
            ("cluster = \"a\"\nclusters = [{ name = \"b\" }]", "exactly one of cluster, clusters"),
            ("clusters = []", "routes[0].clusters: 0 entries"),
            ("clusters = [{ name = \"c\" }]", "routes[0].clusters[0].name: no cluster named 'c'"),
            ("clusters = [{ name = \"a\", weight = 2000000 }]", "routes[0].clusters[0].weight"),
            ("clusters = [{ status = 200 }]", "routes[0].clusters[0].status: 200 is not an error status"),
            ("clusters = [{ name = \"a\", status = 503 }]", "a name or a status, not both"),
            ("cluster = \"a\"\nrequest_headers = { set = [{ name = \"connection\", value = \"x\" }] }", "routes[0].request_headers.set[0].name: 'connection' is the proxy's"),
            ("cluster = \"a\"\nrequest_headers = { add = [{ name = \"x\", value = \"a\\nb\" }] }", "routes[0].request_headers.add[0].value"),
            ("cluster = \"a\"\nrequest_headers = { remove = [\"a b\"] }", "routes[0].request_headers.remove[0]"),
            ("cluster = \"a\"\ntimeout = 0", "routes[0].timeout"),
            ("respond = { status = 200 }\ntimeout = 1", "for routes that forward"),
            ("path_segments = \"/o/\"\nstatic = { root = \"/srv\" }", "a static route matches by path_prefix"),
        ] {
            let e = with(route).unwrap_err();
            assert!(e.contains(want), "{route}: {e}");
        }
    }

    #[test]
    fn path_matches_by_kind() {
        let (seg, ex, pre) = (PathMatch::Segments("/api".into()), PathMatch::Exact("/api".into()), PathMatch::Prefix("/api".into()));
        for (path, s, e, p) in [
            ("/api", true, true, true),
            ("/api/", true, false, true),
            ("/api/x", true, false, true),
            ("/apix", false, false, true),
            ("/", false, false, false),
            ("/ap", false, false, false),
        ] {
            assert_eq!((seg.matches(path), ex.matches(path), pre.matches(path)), (s, e, p), "{path}");
        }
        assert!(PathMatch::Segments("/api/".into()).matches("/api"), "a trailing slash is not a segment");
        assert!(!PathMatch::Segments("/api/".into()).matches("/apix"));
        assert!(PathMatch::Segments("/".into()).matches("/anything"));
    }
}
