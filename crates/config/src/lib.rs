//! The configuration file: TOML, documented in `docs/configuration.md`.
//!
//! Unknown keys are errors (a misspelt key must not silently fall back to a default), and every
//! error names the field it is about. [`Config::parse`] returns the service model
//! ([`vectorlb_lb::LbSpec`]) plus the engine settings that size each worker.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use vectorlb_lb::{BackendSpec, LbSpec, Mode, PortSpec, RouteSpec, ServiceSpec, SnatSpec, SynProxy, Timeouts};
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

/// What is wrong with a configuration. Messages name the field (`services[0].mode: ...`) and
/// say what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    /// An error in the file named.
    #[error("{path}: {source}")]
    InFile { path: String, source: Box<Error> },
    /// Not TOML, or a key the format does not have (the message gives line and column).
    #[error("{0}")]
    Syntax(String),
    /// A field holds a value that does not apply.
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    /// The service model refused the whole (families, routes, tables).
    #[error("{0}")]
    Model(#[from] vectorlb_lb::ConfigError),
}

impl Error {
    /// An [`Error::Invalid`] from a "field: problem" message.
    fn invalid(msg: String) -> Error {
        match msg.split_once(": ") {
            Some((field, problem)) => Error::Invalid { field: field.to_string(), problem: problem.to_string() },
            None => Error::Invalid { field: String::new(), problem: msg },
        }
    }
}

macro_rules! bail {
    ($($t:tt)*) => { return Err(Error::invalid(format!($($t)*))) };
}

/// The machine's memory in bytes (MemTotal), or a generous guess when it cannot be read.
pub fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()))
        .map_or(u64::MAX, |kb| kb * 1024)
}

/// Largest configuration file read.
pub const MAX_FILE: u64 = 16 * 1024 * 1024;

/// A TOML error about a number, in the field's terms (`an integer in 0..=65535`, not `u16`).
fn number_terms(msg: &str) -> String {
    msg.replace("expected u8", "expected an integer in 0..=255")
        .replace("expected u16", "expected an integer in 0..=65535")
        .replace("expected u32", "expected an integer in 0..=4294967295")
        .replace("expected usize", "expected a non-negative integer")
}

/// A memif port (`[ports.memif]`): the data plane's end of a shared-memory interface to a pod.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemifSpec {
    /// `server` (the data plane listens; pods connect) or `client`.
    #[serde(default = "MemifSpec::default_role")]
    pub role: String,
    /// The control socket: a path, or `@NAME` in the abstract namespace.
    #[serde(default = "MemifSpec::default_socket")]
    pub socket: String,
    /// The interface id on that socket.
    #[serde(default)]
    pub id: u32,
    /// The shared secret the client presents (1..=23 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Who copies frames between the shared memory and the data plane's buffers: `cpu`, or
    /// `dma` (the worker's dmadev, `runtime.dma_devices`).
    #[serde(default = "MemifSpec::default_copy")]
    pub copy: String,
    /// `ethernet` (frames with an Ethernet header), or `ip` (bare IPv4 / IPv6 packets: the
    /// port adds and removes the header, and every next hop on it is the peer).
    #[serde(default = "MemifSpec::default_mode")]
    pub mode: String,
    /// Client role: log2 of the slots per ring.
    #[serde(default = "MemifSpec::default_log2_ring")]
    pub log2_ring: u8,
    /// Client role: bytes per shared buffer (frames longer than one are chained).
    #[serde(default = "MemifSpec::default_buffer_size")]
    pub buffer_size: u32,
    /// Map regions that are not sealed against shrinking (DPDK's zero-copy client shares its
    /// huge pages that way). Only for a peer you trust: it could crash the data plane.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trust_peer: bool,
}

impl MemifSpec {
    fn default_role() -> String {
        "server".into()
    }
    fn default_socket() -> String {
        "/run/vectorlb/memif.sock".into()
    }
    fn default_copy() -> String {
        "cpu".into()
    }
    fn default_mode() -> String {
        "ethernet".into()
    }
    pub fn ip_mode(&self) -> bool {
        self.mode == "ip"
    }
    fn default_log2_ring() -> u8 {
        10
    }
    fn default_buffer_size() -> u32 {
        2048
    }
    pub fn is_server(&self) -> bool {
        self.role == "server"
    }
    pub fn uses_dma(&self) -> bool {
        self.copy == "dma"
    }

    fn check(&self, f: &str) -> Result<(), Error> {
        if !matches!(self.role.as_str(), "server" | "client") {
            bail!("{f}.role: '{}' is not one of server, client", self.role);
        }
        if !matches!(self.copy.as_str(), "cpu" | "dma") {
            bail!("{f}.copy: '{}' is not one of cpu, dma", self.copy);
        }
        if !matches!(self.mode.as_str(), "ethernet" | "ip") {
            bail!("{f}.mode: '{}' is not one of ethernet, ip", self.mode);
        }
        let name = self.socket.strip_prefix('@').unwrap_or(&self.socket);
        if name.is_empty() || self.socket.len() > 106 || self.socket.contains('\0') || !(self.socket.starts_with('@') || self.socket.starts_with('/')) {
            bail!("{f}.socket: '{}' is not an absolute path or @name of at most 106 bytes", self.socket);
        }
        if let Some(s) = &self.secret {
            if s.is_empty() || s.len() > 23 || s.contains('\0') {
                bail!("{f}.secret: must be 1..=23 bytes");
            }
        }
        if !(1..=14).contains(&self.log2_ring) {
            bail!("{f}.log2_ring: {} is out of range 1..=14", self.log2_ring);
        }
        if !(64..=65472).contains(&self.buffer_size) || !self.buffer_size.is_multiple_of(64) {
            bail!("{f}.buffer_size: {} is not a multiple of 64 in 64..=65472", self.buffer_size);
        }
        Ok(())
    }
}

/// Settings that size and tune each worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub max_sessions: u32,
    pub index_entries: u32,
    pub batch: usize,
    pub local_port_min: u16,
    pub local_port_max: u16,
    pub sweep_budget: u32,
    /// The share of a core's sessions and local ports that half-open TCP sessions may hold,
    /// in thousandths (`half_open_share` in the file).
    pub half_open_permille: u16,
}

/// Settings of the daemon (`vectorlb run`): threads, DPDK, the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// Worker threads; each owns one rx/tx queue on every port and its own session table.
    pub workers: u16,
    /// CPUs to pin the workers to, in order (empty: not pinned).
    pub cpus: Vec<usize>,
    /// EAL arguments (devices are added from the ports).
    pub eal: Vec<String>,
    /// Packet buffers in the pool shared by all ports.
    pub mbufs: u32,
    /// Descriptors per rx and per tx queue.
    pub queue_desc: u16,
    /// Where the control API (and its status page) listens: "unix:/run/vectorlb/api.sock" (the
    /// default), or "ADDRESS:PORT", which needs `api_token_file`; or several of them (a unix
    /// socket for `ctl` and an address for browsers and Prometheus). Never empty.
    pub api: Vec<String>,
    /// A file holding the bearer token every request on a TCP API must carry. Only its owner
    /// may read it.
    pub api_token_file: Option<String>,
    /// The group that may use the unix socket (mode 0660); without it, root only (0600).
    pub api_group: Option<String>,
    /// Memory the session tables of all workers may take at most, MiB; `None`: half of the
    /// machine's memory.
    pub memory_budget_mb: Option<u64>,
    /// Longest sleep of an idle worker, microseconds (its wake-up latency bound). 0: busy-poll.
    pub idle_sleep_us: u32,
    /// Learned neighbours not confirmed for this long are forgotten (seconds).
    pub neighbor_timeout: u32,
    /// Directory for run-time files (the XDP object).
    pub run_dir: String,
    /// HA state at start: "standalone" (no HA), "master" or "backup" (keepalived's notify
    /// scripts change it through the API).
    pub ha_state: String,
    /// The dmadev of each worker (memif ports with `copy = "dma"`); `dma_skeleton*` names are
    /// DPDK's software device, created as needed.
    pub dma_devices: Vec<String>,
    /// Copies shorter than this go to the CPU even with `copy = "dma"`, bytes.
    pub dma_threshold: u32,
}

/// Copies below this many bytes stay on the CPU with a DMA engine (docs/memif.md says where the
/// figure comes from).
pub const DEFAULT_DMA_THRESHOLD: u32 = 256;

/// Where the control API listens unless configured.
pub const DEFAULT_API: &str = "unix:/run/vectorlb/api.sock";

pub const DEFAULT_EAL: &[&str] = &["-l", "0", "--in-memory", "--log-level", "*:warning"];

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            workers: 1,
            cpus: Vec::new(),
            eal: DEFAULT_EAL.iter().map(|s| s.to_string()).collect(),
            mbufs: 16383,
            queue_desc: 1024,
            api: vec![DEFAULT_API.into()],
            api_token_file: None,
            api_group: None,
            memory_budget_mb: None,
            idle_sleep_us: 200,
            neighbor_timeout: 300,
            run_dir: "/run/vectorlb".into(),
            ha_state: "standalone".into(),
            dma_devices: Vec::new(),
            dma_threshold: DEFAULT_DMA_THRESHOLD,
        }
    }
}

/// How a service's backends are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// A TCP connection opens.
    Tcp,
    /// `GET path` answers `expect_status` (over TLS when `tls`; the certificate is not
    /// verified, as with keepalived's SSL_GET: a health check asks "is it serving").
    Http { path: String, host: Option<String>, expect_status: u16, tls: bool },
    /// A datagram `send` gets an answer (containing `expect` when given).
    Udp { send: Vec<u8>, expect: Vec<u8> },
    /// A command exits 0 (`VLB_BACKEND_ADDR`, `VLB_BACKEND_PORT`, `VLB_VIP`, `VLB_VPORT` set).
    Exec { command: String },
}

/// What happens to a failed backend's established sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDown {
    /// They continue until they end (the backend only stops getting new ones).
    Keep,
    /// They end at once: the backend leaves the published configuration, and the next packet
    /// of each of its TCP connections is answered with a reset.
    Reset,
}

/// A service's health check (`[services.health]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    pub kind: CheckKind,
    /// Milliseconds between checks of one backend.
    pub interval: u32,
    /// Milliseconds a check may take.
    pub timeout: u32,
    /// Consecutive successes that bring a down backend up.
    pub rise: u32,
    /// Consecutive failures that take an up backend down.
    pub fall: u32,
    /// Port to check (0: the backend's port).
    pub port: u16,
    pub on_down: OnDown,
}

/// Session synchronisation between HA nodes (`[ha]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSpec {
    /// Where this node receives sync messages (a host address, not a data-plane one).
    pub listen: std::net::SocketAddr,
    /// Where it sends them: the peers, or one multicast group.
    pub peers: Vec<std::net::SocketAddr>,
    /// The HMAC-SHA256 key every message is signed with.
    pub key: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub engine: Engine,
    pub spec: LbSpec,
    pub runtime: Runtime,
    /// Per port (same order as `spec.ports`): the DPDK device string, if any.
    pub devices: Vec<Option<String>>,
    /// Per port: whether the MAC address was left to the device.
    pub mac_from_device: Vec<bool>,
    /// Per port: its memif settings, for a memif port.
    pub memif: Vec<Option<MemifSpec>>,
    /// Per port: `trust_peer` (a net_memif device is accepted only with it).
    pub trust_peer: Vec<bool>,
    /// Per port: the MTU given in the file (None: the default).
    pub mtu_given: Vec<bool>,
    /// Per service (same order as `spec.services`): its health check, if any.
    pub health: Vec<Option<HealthSpec>>,
    pub sync: Option<SyncSpec>,
    /// The file's `[timeouts]`: services and SNAT rules without their own use these, and so
    /// do services added through the API.
    pub timeouts: Timeouts,
    /// Application queue sets (`[[queue_sets]]`): services whose packets only dedicated
    /// workers handle.
    pub queue_sets: Vec<QueueSetSpec>,
    /// `[default_set] ingress`: on AF_XDP ports, the XDP program drops packets of the default
    /// set (everything outside the queue sets) above this rate before they reach the data
    /// plane's shared receive ring.
    pub default_ingress: Option<RateSpec>,
}

/// An application queue set: the packets of its services go to its workers and no other, and
/// its workers take no other traffic; what they send may be rate limited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSetSpec {
    pub name: String,
    /// (VIP, port, protocol) of each service in the set.
    pub services: Vec<(IpAddr, u16, u8)>,
    /// Its dedicated workers (indexes), in order.
    pub workers: Vec<u16>,
    /// The egress limit of what its workers transmit.
    pub rate: Option<RateSpec>,
    /// Whether its workers poll without ever sleeping (the default, as ADQ's pollers do);
    /// false lets them nap when idle like the others (small machines, where a core that
    /// never rests is one the application cannot use).
    pub busy_poll: bool,
}

/// A token bucket: bits and/or packets per second, with a burst of `burst_ms` at that rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSpec {
    pub bps: Option<u64>,
    pub pps: Option<u64>,
    pub burst_ms: u32,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawQueueSet {
    name: String,
    #[serde(default)]
    services: Vec<String>,
    workers: Vec<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate: Option<RawRate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    busy_poll: Option<bool>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    #[serde(skip_serializing_if = "Option::is_none")]
    bps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst_ms: Option<u32>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawDefaultSet {
    #[serde(skip_serializing_if = "Option::is_none")]
    ingress: Option<RawRate>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGlobal {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_sessions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    index_entries: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    icmp_rate: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    local_port_min: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    local_port_max: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sweep_budget: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    half_open_share: Option<f64>,
}

#[derive(Deserialize, Serialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    #[serde(skip_serializing_if = "Option::is_none")]
    syn: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    established: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fin: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    time_wait: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    close: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    udp: Option<f64>,
}

/// A string or a list of strings (`runtime.api`).
#[derive(Deserialize, Serialize, Clone)]
#[serde(untagged, expecting = "an endpoint (\"unix:PATH\" or \"ADDRESS:PORT\") or a list of them")]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<Vec<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eal: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mbufs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_desc: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api: Option<OneOrMany>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_budget_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_sleep_us: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    neighbor_timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ha_state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dma_devices: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dma_threshold: Option<u32>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
    #[serde(default)]
    addrs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vlan: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memif: Option<MemifSpec>,
    /// The device's peer may be trusted with memory the data plane maps (net_memif devices).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    trust_peer: bool,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    prefix: String,
    via: String,
    port: String,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawNeighbor {
    ip: String,
    mac: String,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    addr: String,
    #[serde(default)]
    port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    weight: Option<u32>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    vip: String,
    #[serde(default)]
    port: u16,
    proto: String,
    mode: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    scheduler: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    table_size: Option<u32>,
    #[serde(default)]
    local_addrs: Vec<String>,
    #[serde(default)]
    toa: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    synproxy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    synproxy_half_open: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeouts: Option<RawTimeouts>,
    #[serde(default)]
    backends: Vec<RawBackend>,
    #[serde(skip_serializing_if = "Option::is_none")]
    health: Option<RawHealth>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawHa {
    sync_listen: String,
    sync_peers: Vec<String>,
    sync_key: String,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    interval: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rise: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fall: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    send: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_down: Option<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawSnat {
    source: String,
    addrs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeouts: Option<RawTimeouts>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    global: RawGlobal,
    #[serde(default)]
    runtime: RawRuntime,
    #[serde(skip_serializing_if = "Option::is_none")]
    ha: Option<RawHa>,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ports: Vec<RawPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<RawRoute>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    neighbors: Vec<RawNeighbor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    services: Vec<RawService>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    snat: Vec<RawSnat>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    queue_sets: Vec<RawQueueSet>,
    #[serde(skip_serializing_if = "Option::is_none")]
    default_set: Option<RawDefaultSet>,
}

pub use vectorlb_packet::ethernet::{format_mac, parse_mac};

/// A service as queue sets name it: `10.0.0.100:11211/tcp`, `[2001:db8::1]:53/udp`.
pub fn service_name(vip: IpAddr, port: u16, p: u8) -> String {
    let proto = if p == proto::TCP { "tcp" } else { "udp" };
    match vip {
        IpAddr::V4(a) => format!("{a}:{port}/{proto}"),
        IpAddr::V6(a) => format!("[{a}]:{port}/{proto}"),
    }
}

/// Longest burst of a queue set's rate limit, milliseconds.
pub const MAX_BURST_MS: u32 = 10_000;

/// `[[queue_sets]]`: names unique, services of this file (each in one set at most), workers
/// that exist, each in one set at most, and at least one worker left for everything else.
fn queue_sets(raw: &[RawQueueSet], spec: &LbSpec, workers: u16) -> Result<Vec<QueueSetSpec>, Error> {
    let mut out: Vec<QueueSetSpec> = Vec::new();
    let mut taken_workers = std::collections::HashSet::new();
    let mut taken_services = std::collections::HashSet::new();
    for (i, q) in raw.iter().enumerate() {
        let f = format!("queue_sets[{i}]");
        let ok = !q.name.is_empty() && q.name.len() <= 32 && q.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok || out.iter().any(|o| o.name == q.name) || q.name == "default" {
            bail!("{f}.name: '{}' is empty, used twice, 'default' or not letters, digits, _ and - (at most 32)", q.name);
        }
        let mut services = Vec::new();
        for (j, name) in q.services.iter().enumerate() {
            let found = spec.services.iter().find(|s| service_name(s.vip, s.port, s.proto) == *name);
            let Some(s) = found else {
                bail!("{f}.services[{j}]: '{name}' is not a service of this file (written VIP:PORT/tcp or /udp, [IPv6]:PORT/udp)");
            };
            if !taken_services.insert((s.vip, s.port, s.proto)) {
                bail!("{f}.services[{j}]: '{name}' is already in a set");
            }
            services.push((s.vip, s.port, s.proto));
        }
        if q.workers.is_empty() {
            bail!("{f}.workers: a set needs at least one worker of its own");
        }
        for (j, w) in q.workers.iter().enumerate() {
            if *w >= workers {
                bail!("{f}.workers[{j}]: worker {w} does not exist (runtime.workers = {workers}: 0 to {})", workers - 1);
            }
            if !taken_workers.insert(*w) {
                bail!("{f}.workers[{j}]: worker {w} is already dedicated to a set");
            }
        }
        let rate = q.rate.as_ref().map(|r| rate_spec(&format!("{f}.rate"), r)).transpose()?;
        out.push(QueueSetSpec { name: q.name.clone(), services, workers: q.workers.clone(), rate, busy_poll: q.busy_poll.unwrap_or(true) });
    }
    if !out.is_empty() && taken_workers.len() >= workers as usize {
        bail!("queue_sets: every worker is dedicated to a set; leave at least one for the rest of the traffic (runtime.workers = {workers})");
    }
    Ok(out)
}

/// A rate limit: bps and/or pps, neither 0, a burst within 1..=MAX_BURST_MS (default 10).
fn rate_spec(f: &str, r: &RawRate) -> Result<RateSpec, Error> {
    if r.bps.is_none() && r.pps.is_none() {
        bail!("{f}: give bps, pps or both");
    }
    if r.bps == Some(0) || r.pps == Some(0) {
        bail!("{f}: a rate of 0 would pass nothing (leave the rate out for none)");
    }
    let burst_ms = r.burst_ms.unwrap_or(10);
    if !(1..=MAX_BURST_MS).contains(&burst_ms) {
        bail!("{f}.burst_ms: {burst_ms} is not in 1..={MAX_BURST_MS}");
    }
    Ok(RateSpec { bps: r.bps, pps: r.pps, burst_ms })
}

fn ip(field: &str, s: &str) -> Result<IpAddr, Error> {
    s.parse().map_err(|_| Error::invalid(format!("{field}: '{s}' is not an IP address")))
}

/// "10.0.0.0/24" or "2001:db8::/64"; a bare address is a host prefix.
pub fn prefix(field: &str, s: &str) -> Result<(IpAddr, u8), Error> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr = ip(field, a)?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match l {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => bail!("{field}: '{s}' has an invalid prefix length (0..={max})"),
        },
    };
    Ok((addr, len))
}

fn ms(field: &str, v: Option<f64>, default: u32) -> Result<u32, Error> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (0.0..=1_000_000.0).contains(&x) => Ok((x * 1000.0).round() as u32),
        Some(x) => bail!("{field}: {x} is not a number of seconds in 0..=1000000"),
    }
}

fn timeouts(field: &str, r: &RawTimeouts, base: &Timeouts) -> Result<Timeouts, Error> {
    let t = Timeouts {
        syn: ms(&format!("{field}.syn"), r.syn, base.syn)?,
        established: ms(&format!("{field}.established"), r.established, base.established)?,
        fin: ms(&format!("{field}.fin"), r.fin, base.fin)?,
        time_wait: ms(&format!("{field}.time_wait"), r.time_wait, base.time_wait)?,
        close: ms(&format!("{field}.close"), r.close, base.close)?,
        udp: ms(&format!("{field}.udp"), r.udp, base.udp)?,
    };
    for (n, v) in [("syn", t.syn), ("established", t.established), ("fin", t.fin), ("udp", t.udp)] {
        if v == 0 {
            bail!("{field}.{n}: must be above 0 (only time_wait and close may be 0)");
        }
    }
    Ok(t)
}

fn health_spec(f: &str, h: &RawHealth, protocol: u8) -> Result<HealthSpec, Error> {
    let only = |what: &str, set: bool, kinds: &str| -> Result<(), Error> {
        if set {
            bail!("{f}.{what}: only for kind {kinds}");
        }
        Ok(())
    };
    let kind = match h.kind.as_str() {
        "tcp" => CheckKind::Tcp,
        "http" | "https" => {
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            if !path.starts_with('/') || path.contains(char::is_whitespace) {
                bail!("{f}.path: '{path}' must start with / and hold no spaces");
            }
            let expect_status = h.expect_status.unwrap_or(200);
            if !(100..=599).contains(&expect_status) {
                bail!("{f}.expect_status: {expect_status} is not an HTTP status");
            }
            if h.host.as_deref().is_some_and(|x| x.is_empty() || x.contains(char::is_whitespace)) {
                bail!("{f}.host: must be a host name");
            }
            CheckKind::Http { path, host: h.host.clone(), expect_status, tls: h.kind == "https" }
        }
        "udp" => {
            let send = h.send.clone().unwrap_or_default().into_bytes();
            if send.is_empty() {
                bail!("{f}.send: a udp check needs the datagram to send");
            }
            CheckKind::Udp { send, expect: h.expect.clone().unwrap_or_default().into_bytes() }
        }
        "exec" => {
            let command = h.command.clone().unwrap_or_default();
            if command.trim().is_empty() {
                bail!("{f}.command: an exec check needs a command");
            }
            CheckKind::Exec { command }
        }
        k => bail!("{f}.kind: '{k}' is not one of tcp, http, https, udp, exec"),
    };
    only("path", h.path.is_some() && !matches!(kind, CheckKind::Http { .. }), "http")?;
    only("host", h.host.is_some() && !matches!(kind, CheckKind::Http { .. }), "http")?;
    only("expect_status", h.expect_status.is_some() && !matches!(kind, CheckKind::Http { .. }), "http")?;
    only("send", h.send.is_some() && !matches!(kind, CheckKind::Udp { .. }), "udp")?;
    only("expect", h.expect.is_some() && !matches!(kind, CheckKind::Udp { .. }), "udp")?;
    only("command", h.command.is_some() && !matches!(kind, CheckKind::Exec { .. }), "exec")?;
    if matches!(kind, CheckKind::Tcp | CheckKind::Http { .. }) && protocol != proto::TCP && h.port.is_none() {
        bail!("{f}.kind: a {} check of a udp service needs an explicit port", h.kind);
    }
    let interval = ms(&format!("{f}.interval"), h.interval, 2000)?;
    let timeout = ms(&format!("{f}.timeout"), h.timeout, interval.min(1000))?;
    if !(50..=3_600_000).contains(&interval) {
        bail!("{f}.interval: must be in 0.05..=3600 seconds");
    }
    if timeout < 10 || timeout > interval.max(10) {
        bail!("{f}.timeout: must be at least 0.01 s and at most the interval");
    }
    let rise = h.rise.unwrap_or(2);
    let fall = h.fall.unwrap_or(3);
    if !(1..=100).contains(&rise) || !(1..=100).contains(&fall) {
        bail!("{f}.rise/fall: must be in 1..=100");
    }
    let on_down = match h.on_down.as_deref().unwrap_or("keep") {
        "keep" => OnDown::Keep,
        "reset" => OnDown::Reset,
        o => bail!("{f}.on_down: '{o}' is not keep or reset"),
    };
    Ok(HealthSpec { kind, interval, timeout, rise, fall, port: h.port.unwrap_or(0), on_down })
}

fn raw_health(h: &HealthSpec) -> RawHealth {
    let mut r = RawHealth {
        kind: String::new(),
        interval: Some(h.interval as f64 / 1000.0),
        timeout: Some(h.timeout as f64 / 1000.0),
        rise: Some(h.rise),
        fall: Some(h.fall),
        port: Some(h.port),
        path: None,
        host: None,
        expect_status: None,
        send: None,
        expect: None,
        command: None,
        on_down: Some(if h.on_down == OnDown::Keep { "keep" } else { "reset" }.into()),
    };
    match &h.kind {
        CheckKind::Tcp => r.kind = "tcp".into(),
        CheckKind::Http { path, host, expect_status, tls } => {
            r.kind = if *tls { "https" } else { "http" }.into();
            r.path = Some(path.clone());
            r.host = host.clone();
            r.expect_status = Some(*expect_status);
        }
        CheckKind::Udp { send, expect } => {
            r.kind = "udp".into();
            r.send = Some(String::from_utf8_lossy(send).into_owned());
            r.expect = (!expect.is_empty()).then(|| String::from_utf8_lossy(expect).into_owned());
        }
        CheckKind::Exec { command } => {
            r.kind = "exec".into();
            r.command = Some(command.clone());
        }
    }
    r
}

fn runtime(r: &RawRuntime) -> Result<Runtime, Error> {
    let d = Runtime::default();
    let workers = r.workers.unwrap_or(d.workers);
    if !(1..=64).contains(&workers) {
        bail!("runtime.workers: {workers} is out of range 1..=64");
    }
    let cpus = r.cpus.clone().unwrap_or_default();
    if !cpus.is_empty() && cpus.len() < workers as usize {
        bail!("runtime.cpus: {} CPUs for {workers} workers (give one per worker, or none)", cpus.len());
    }
    let mbufs = r.mbufs.unwrap_or(d.mbufs);
    if !(1024..=16_777_215).contains(&mbufs) {
        bail!("runtime.mbufs: {mbufs} is out of range 1024..=16777215");
    }
    let queue_desc = r.queue_desc.unwrap_or(d.queue_desc);
    if !(64..=16384).contains(&queue_desc) || !queue_desc.is_power_of_two() {
        bail!("runtime.queue_desc: {queue_desc} must be a power of two in 64..=16384");
    }
    let api = match &r.api {
        None => d.api,
        Some(OneOrMany::One(a)) => vec![a.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    if api.is_empty() {
        bail!("runtime.api: give at least one endpoint (unix:PATH or ADDRESS:PORT)");
    }
    for (i, a) in api.iter().enumerate() {
        if api[..i].contains(a) {
            bail!("runtime.api: '{a}' is listed twice");
        }
        if let Some(path) = a.strip_prefix("unix:") {
            if path.is_empty() {
                bail!("runtime.api: 'unix:' needs a socket path");
            }
        } else if a.parse::<std::net::SocketAddr>().is_err() {
            bail!("runtime.api: '{a}' is not ADDRESS:PORT or unix:PATH");
        }
    }
    let any_tcp = api.iter().any(|a| !a.starts_with("unix:"));
    if any_tcp && r.api_token_file.as_deref().is_none_or(str::is_empty) {
        bail!("runtime.api: a TCP API needs runtime.api_token_file (a file only root can read, holding the token); or listen on unix:PATH");
    }
    if !any_tcp && r.api_token_file.is_some() {
        bail!("runtime.api_token_file: a unix socket is guarded by its permissions (runtime.api_group); the token is for a TCP API");
    }
    if r.api_group.is_some() && api.iter().all(|a| !a.starts_with("unix:")) {
        bail!("runtime.api_group: only for a unix socket API");
    }
    let idle_sleep_us = r.idle_sleep_us.unwrap_or(d.idle_sleep_us);
    if idle_sleep_us > 100_000 {
        bail!("runtime.idle_sleep_us: {idle_sleep_us} is above 100000");
    }
    let neighbor_timeout = r.neighbor_timeout.unwrap_or(d.neighbor_timeout);
    if neighbor_timeout < 10 {
        bail!("runtime.neighbor_timeout: {neighbor_timeout} is below 10 seconds");
    }
    let ha_state = r.ha_state.clone().unwrap_or(d.ha_state);
    if !matches!(ha_state.as_str(), "standalone" | "master" | "backup") {
        bail!("runtime.ha_state: '{ha_state}' is not standalone, master or backup");
    }
    Ok(Runtime {
        ha_state,
        workers,
        cpus,
        eal: r.eal.clone().unwrap_or(d.eal),
        mbufs,
        queue_desc,
        api,
        api_token_file: r.api_token_file.clone(),
        api_group: r.api_group.clone(),
        memory_budget_mb: match r.memory_budget_mb {
            Some(0) => bail!("runtime.memory_budget_mb: must be above 0"),
            m => m,
        },
        idle_sleep_us,
        neighbor_timeout,
        run_dir: r.run_dir.clone().unwrap_or(d.run_dir),
        dma_devices: match &r.dma_devices {
            Some(v) if v.iter().any(|d| d.is_empty() || d.contains(char::is_whitespace) || d.contains(',')) => {
                bail!("runtime.dma_devices: device names without spaces or commas (dma_skeleton0, or a dmadev name such as 0000:6a:01.0-wq0.0)")
            }
            Some(v) if !v.is_empty() && v.len() < workers as usize => bail!("runtime.dma_devices: {} device(s) for {workers} workers (one per worker)", v.len()),
            v => v.clone().unwrap_or_default(),
        },
        dma_threshold: match r.dma_threshold {
            Some(t) if t > 65536 => bail!("runtime.dma_threshold: {t} is above 65536"),
            t => t.unwrap_or(DEFAULT_DMA_THRESHOLD),
        },
    })
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, Error> {
        let name = path.display().to_string();
        let read = |message: String| Error::Read { path: name.clone(), message };
        // Looked at before opening: a FIFO or a device would block or never end.
        let meta = std::fs::metadata(path).map_err(|e| read(e.to_string()))?;
        if !meta.is_file() {
            return Err(read("not a regular file".into()));
        }
        if meta.len() > MAX_FILE {
            return Err(read(format!("{} bytes; a configuration file is at most {MAX_FILE}", meta.len())));
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(path).map_err(|e| read(e.to_string()))?, MAX_FILE + 1), &mut bytes)
            .map_err(|e| read(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let before = &e.as_bytes()[..at];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
            read(format!("line {line}, column {column}: not UTF-8 text"))
        })?;
        Config::parse(&text).map_err(|e| Error::InFile { path: name, source: Box::new(e) })
    }

    pub fn parse(text: &str) -> Result<Config, Error> {
        let raw: Raw = toml::from_str(text).map_err(|e| Error::Syntax(number_terms(e.to_string().trim_end())))?;
        let g = &raw.global;
        let base = timeouts("timeouts", &raw.timeouts, &Timeouts::default())?;

        let mut port_ids = HashMap::new();
        let mut ports = Vec::new();
        let mut devices = Vec::new();
        let mut memifs: Vec<Option<MemifSpec>> = Vec::new();
        let mut trust_peer = Vec::new();
        let mut mac_from_device = Vec::new();
        let mut mtu_given = Vec::new();
        for (i, p) in raw.ports.iter().enumerate() {
            let f = format!("ports[{i}]");
            if p.name.is_empty() {
                bail!("{f}.name: must not be empty");
            }
            if port_ids.insert(p.name.clone(), i as u16).is_some() {
                bail!("{f}.name: '{}' is used twice", p.name);
            }
            let mac = match (&p.mac, &p.device) {
                (Some(m), _) => parse_mac(m).ok_or_else(|| Error::invalid(format!("{f}.mac: '{m}' is not a MAC address")))?,
                (None, Some(_)) => [0u8; 6],
                (None, None) if p.memif.is_some() => bail!("{f}.mac: required for a memif port (it has no hardware address)"),
                (None, None) => bail!("{f}.mac: required when the port has no device (the device's own MAC is used otherwise)"),
            };
            if let Some(m) = &p.memif {
                if p.device.is_some() {
                    bail!("{f}.memif: a port is either a DPDK device or a memif interface, not both");
                }
                m.check(&format!("{f}.memif"))?;
                if m.trust_peer != p.trust_peer && p.trust_peer {
                    bail!("{f}.trust_peer: for a memif port, set memif.trust_peer");
                }
                let dup = memifs.iter().position(|o: &Option<MemifSpec>| o.as_ref().is_some_and(|o| o.socket == m.socket && o.id == m.id && o.role == m.role));
                if let Some(j) = dup {
                    bail!("{f}.memif: socket {} id {} is also ports[{j}]'s", m.socket, m.id);
                }
                if !m.is_server() && memifs.iter().flatten().any(|o| o.socket == m.socket && o.is_server())
                    || m.is_server() && memifs.iter().flatten().any(|o| o.socket == m.socket && !o.is_server())
                {
                    bail!("{f}.memif.socket: {} is used as both server and client", m.socket);
                }
            }
            if let Some(d) = &p.device {
                if d.starts_with("net_memif") && !p.trust_peer {
                    bail!("{f}.device: DPDK's net_memif trusts its peer's descriptors (a pod can crash the data plane through it); use a memif port ([ports.memif]) or set trust_peer = true for a peer you control");
                }
            }
            if let Some(d) = &p.device {
                if d.trim().is_empty() || d.contains(char::is_whitespace) {
                    bail!("{f}.device: '{d}' is not a DPDK device string (net_af_xdp0,iface=eth0 or a PCI address)");
                }
            }
            if let Some(d) = &p.device {
                let key = |d: &str| d.split(',').find_map(|kv| kv.strip_prefix("iface=")).map(str::to_string).unwrap_or_else(|| d.split(',').next().unwrap_or(d).to_string());
                if let Some(j) = devices.iter().position(|o: &Option<String>| o.as_deref().is_some_and(|o| key(o) == key(d))) {
                    bail!("{f}.device: '{}' is also ports[{j}]'s device; two ports cannot share an interface", key(d));
                }
            }
            devices.push(p.device.clone());
            memifs.push(p.memif.clone());
            trust_peer.push(p.trust_peer || p.memif.as_ref().is_some_and(|m| m.trust_peer));
            mac_from_device.push(p.mac.is_none());
            mtu_given.push(p.mtu.is_some());
            let addrs = p.addrs.iter().map(|a| prefix(&format!("{f}.addrs"), a)).collect::<Result<Vec<_>, _>>()?;
            let mtu = p.mtu.unwrap_or(1500);
            if !(576..=9216).contains(&mtu) {
                bail!("{f}.mtu: {mtu} is out of range 576..=9216");
            }
            ports.push(PortSpec { name: p.name.clone(), mac, addrs, vlan: p.vlan, mtu });
        }
        let mut routes = Vec::new();
        for (i, r) in raw.routes.iter().enumerate() {
            let f = format!("routes[{i}]");
            let (pfx, len) = prefix(&format!("{f}.prefix"), &r.prefix)?;
            let via = ip(&format!("{f}.via"), &r.via)?;
            let Some(&port) = port_ids.get(&r.port) else {
                bail!("{f}.port: no port named '{}'", r.port);
            };
            routes.push(RouteSpec { prefix: pfx, len, port, via });
        }
        let mut neighbors = Vec::new();
        for (i, n) in raw.neighbors.iter().enumerate() {
            let f = format!("neighbors[{i}]");
            let a = ip(&format!("{f}.ip"), &n.ip)?;
            let mac = parse_mac(&n.mac).ok_or_else(|| Error::invalid(format!("{f}.mac: '{}' is not a MAC address", n.mac)))?;
            if vectorlb_lb::service::is_group_mac(&mac) {
                bail!("{f}.mac: '{}' is a group (multicast or broadcast) address, not a host's", n.mac);
            }
            neighbors.push((a, mac));
        }
        let mut services = Vec::new();
        let mut health = Vec::new();
        // A unicast address, or an error naming the field.
        let unicast = |field: String, a: IpAddr| -> Result<IpAddr, Error> {
            match vectorlb_lb::service::not_unicast(a) {
                Some(why) => Err(Error::Invalid { field, problem: format!("'{a}' is {why}") }),
                None => Ok(a),
            }
        };
        for (i, s) in raw.services.iter().enumerate() {
            let f = format!("services[{i}]");
            let vip = unicast(format!("{f}.vip"), ip(&format!("{f}.vip"), &s.vip)?)?;
            let protocol = match s.proto.as_str() {
                "tcp" => proto::TCP,
                "udp" => proto::UDP,
                p => bail!("{f}.proto: '{p}' is not tcp or udp"),
            };
            let mode = Mode::parse(&s.mode).ok_or_else(|| Error::invalid(format!("{f}.mode: '{}' is not one of nat, fnat, dr, tun", s.mode)))?;
            let sched_name = s.scheduler.as_deref().unwrap_or("wrr");
            let mut scheduler = Algorithm::parse(sched_name).ok_or_else(|| Error::invalid(format!("{f}.scheduler: '{sched_name}' is not one of rr, wrr, wlc, sh, maglev")))?;
            if let Some(n) = s.table_size {
                match &mut scheduler {
                    Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => *table_size = n,
                    _ => bail!("{f}.table_size: only sh and maglev have a table"),
                }
            }
            let mut local_addrs: Vec<IpAddr> = Vec::new();
            for (k, a) in s.local_addrs.iter().enumerate() {
                let lf = format!("{f}.local_addrs[{k}]");
                let a = unicast(lf.clone(), ip(&lf, a)?)?;
                if local_addrs.contains(&a) {
                    bail!("{lf}: '{a}' is listed twice");
                }
                local_addrs.push(a);
            }
            if mode != Mode::Fnat && !local_addrs.is_empty() {
                bail!("{f}.local_addrs: only fnat services use local addresses");
            }
            if s.toa && (mode != Mode::Fnat || protocol != proto::TCP) {
                bail!("{f}.toa: only tcp fnat services can insert the TOA option");
            }
            let sp_word = s.synproxy.as_deref().unwrap_or("off");
            let synproxy = SynProxy::parse(sp_word, s.synproxy_half_open).ok_or_else(|| Error::invalid(format!("{f}.synproxy: '{sp_word}' is not one of off, on, auto")))?;
            if synproxy != SynProxy::Off && (protocol != proto::TCP || !matches!(mode, Mode::Nat | Mode::Fnat)) {
                bail!("{f}.synproxy: only tcp nat and fnat services (the proxy must see both directions)");
            }
            match (s.synproxy_half_open, synproxy) {
                (Some(_), SynProxy::On | SynProxy::Off) => bail!("{f}.synproxy_half_open: only with synproxy = \"auto\""),
                (Some(0), _) => bail!("{f}.synproxy_half_open: must be at least 1"),
                _ => {}
            }
            let mut backends = Vec::new();
            for (j, b) in s.backends.iter().enumerate() {
                let bf = format!("{f}.backends[{j}]");
                backends.push(BackendSpec { addr: unicast(format!("{bf}.addr"), ip(&format!("{bf}.addr"), &b.addr)?)?, port: b.port, weight: b.weight.unwrap_or(1) });
            }
            let t = match &s.timeouts {
                Some(r) => timeouts(&format!("{f}.timeouts"), r, &base)?,
                None => base,
            };
            services.push(ServiceSpec { vip, port: s.port, proto: protocol, mode, scheduler, backends, local_addrs, toa: s.toa, synproxy, timeouts: t });
            health.push(match &s.health {
                Some(h) => Some(health_spec(&format!("{f}.health"), h, protocol)?),
                None => None,
            });
        }
        // No backend is one of the load balancer's own addresses (it would forward to itself).
        let ours: Vec<IpAddr> = services.iter().flat_map(|s| std::iter::once(s.vip).chain(s.local_addrs.iter().copied())).collect();
        for (i, s) in services.iter().enumerate() {
            for (j, b) in s.backends.iter().enumerate() {
                if ours.contains(&b.addr) {
                    bail!("services[{i}].backends[{j}].addr: '{}' is a VIP or local address of this load balancer", b.addr);
                }
            }
        }
        let mut snat = Vec::new();
        for (i, r) in raw.snat.iter().enumerate() {
            let f = format!("snat[{i}]");
            let (source, prefix_len) = prefix(&format!("{f}.source"), &r.source)?;
            let addrs = r.addrs.iter().map(|a| ip(&format!("{f}.addrs"), a)).collect::<Result<Vec<_>, _>>()?;
            let t = match &r.timeouts {
                Some(x) => timeouts(&format!("{f}.timeouts"), x, &base)?,
                None => base,
            };
            snat.push(SnatSpec { source, prefix_len, addrs, timeouts: t });
        }
        let max_sessions = g.max_sessions.unwrap_or(1_000_000);
        if max_sessions == 0 {
            bail!("global.max_sessions: must be above 0");
        }
        let has_nat = services.iter().any(|s| s.mode == Mode::Nat);
        let index_entries = g.index_entries.unwrap_or(if has_nat { max_sessions.saturating_mul(2) } else { max_sessions });
        if index_entries < max_sessions {
            bail!("global.index_entries: {index_entries} is below max_sessions ({max_sessions})");
        }
        let batch = g.batch.unwrap_or(256);
        if !(1..=4096).contains(&batch) {
            bail!("global.batch: {batch} is out of range 1..=4096");
        }
        let local_port_min = g.local_port_min.unwrap_or(1024);
        let local_port_max = g.local_port_max.unwrap_or(65535);
        if local_port_min == 0 || local_port_min > local_port_max {
            bail!("global.local_port_min/local_port_max: need 1 <= min <= max");
        }
        let spec = LbSpec { ports, routes, neighbors, services, snat, icmp_rate: g.icmp_rate.unwrap_or(1000) };
        let runtime = runtime(&raw.runtime)?;
        let sync = match &raw.ha {
            None => None,
            Some(h) => {
                let listen = h.sync_listen.parse().map_err(|_| Error::invalid(format!("ha.sync_listen: '{}' is not ADDRESS:PORT", h.sync_listen)))?;
                let mut peers = Vec::new();
                for (i, p) in h.sync_peers.iter().enumerate() {
                    peers.push(p.parse().map_err(|_| Error::invalid(format!("ha.sync_peers[{i}]: '{p}' is not ADDRESS:PORT")))?);
                }
                if peers.is_empty() {
                    bail!("ha.sync_peers: give the peer(s), or one multicast group");
                }
                if h.sync_key.len() < 16 {
                    bail!("ha.sync_key: at least 16 characters (it signs every sync message)");
                }
                Some(SyncSpec { listen, peers, key: h.sync_key.clone().into_bytes() })
            }
        };
        // Build once to report semantic errors (families, routes, tables) at load time.
        vectorlb_lb::Control::new(&spec)?;
        let queue_sets = queue_sets(&raw.queue_sets, &spec, runtime.workers)?;
        Ok(Config {
            engine: Engine {
                max_sessions,
                index_entries,
                batch,
                local_port_min,
                local_port_max,
                sweep_budget: g.sweep_budget.unwrap_or(64).max(1),
                half_open_permille: match g.half_open_share {
                    None => vectorlb_lb::pipeline::DEFAULT_HALF_OPEN_PERMILLE,
                    Some(x) if (0.001..=1.0).contains(&x) => (x * 1000.0).round() as u16,
                    Some(x) => bail!("global.half_open_share: {x} is not between 0.001 and 1"),
                },
            },
            spec,
            runtime,
            devices,
            memif: memifs,
            trust_peer,
            mac_from_device,
            mtu_given,
            health,
            sync,
            timeouts: base,
            queue_sets,
            default_ingress: raw.default_set.as_ref().and_then(|d| d.ingress.as_ref()).map(|r| rate_spec("default_set.ingress", r)).transpose()?,
        })
    }

    /// The configuration as a TOML file that [`Config::parse`] reads back to the same value
    /// (the API's "save" writes this). Comments of the original file are not kept.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(&self.to_raw()).expect("the file model serialises to TOML");
        format!("# The running configuration, written by vectorlb.\n\n{body}")
    }

    /// The file model of this configuration: what [`Config::parse`] reads.
    fn to_raw(&self) -> Raw {
        let secs = |ms: u32| Some(ms as f64 / 1000.0);
        let raw_timeouts = |t: &Timeouts| RawTimeouts {
            syn: secs(t.syn),
            established: secs(t.established),
            fin: secs(t.fin),
            time_wait: secs(t.time_wait),
            close: secs(t.close),
            udp: secs(t.udp),
        };
        let e = &self.engine;
        let r = &self.runtime;
        let port_name = |i: u16| self.spec.ports.get(i as usize).map(|p| p.name.clone()).unwrap_or_default();
        Raw {
            global: RawGlobal {
                max_sessions: Some(e.max_sessions),
                index_entries: Some(e.index_entries),
                batch: Some(e.batch),
                icmp_rate: Some(self.spec.icmp_rate),
                local_port_min: Some(e.local_port_min),
                local_port_max: Some(e.local_port_max),
                sweep_budget: Some(e.sweep_budget),
                half_open_share: Some(e.half_open_permille as f64 / 1000.0),
            },
            runtime: RawRuntime {
                workers: Some(r.workers),
                cpus: Some(r.cpus.clone()),
                eal: Some(r.eal.clone()),
                mbufs: Some(r.mbufs),
                queue_desc: Some(r.queue_desc),
                api: Some(match r.api.as_slice() {
                    [one] => OneOrMany::One(one.clone()),
                    many => OneOrMany::Many(many.to_vec()),
                }),
                api_token_file: r.api_token_file.clone(),
                api_group: r.api_group.clone(),
                memory_budget_mb: r.memory_budget_mb,
                idle_sleep_us: Some(r.idle_sleep_us),
                neighbor_timeout: Some(r.neighbor_timeout),
                run_dir: Some(r.run_dir.clone()),
                ha_state: Some(r.ha_state.clone()),
                dma_devices: (!r.dma_devices.is_empty()).then(|| r.dma_devices.clone()),
                dma_threshold: (r.dma_threshold != DEFAULT_DMA_THRESHOLD).then_some(r.dma_threshold),
            },
            ha: self.sync.as_ref().map(|h| RawHa {
                sync_listen: h.listen.to_string(),
                sync_peers: h.peers.iter().map(|p| p.to_string()).collect(),
                sync_key: String::from_utf8_lossy(&h.key).into_owned(),
            }),
            timeouts: raw_timeouts(&self.timeouts),
            ports: self
                .spec
                .ports
                .iter()
                .enumerate()
                .map(|(i, p)| RawPort {
                    name: p.name.clone(),
                    device: self.devices.get(i).cloned().flatten(),
                    mac: (!self.mac_from_device.get(i).copied().unwrap_or(false)).then(|| format_mac(&p.mac)),
                    addrs: p.addrs.iter().map(|(a, l)| format!("{a}/{l}")).collect(),
                    vlan: p.vlan,
                    mtu: self.mtu_given.get(i).copied().unwrap_or(true).then_some(p.mtu),
                    memif: self.memif.get(i).cloned().flatten(),
                    trust_peer: self.memif.get(i).is_some_and(Option::is_none) && self.trust_peer.get(i).copied().unwrap_or(false),
                })
                .collect(),
            routes: self.spec.routes.iter().map(|r| RawRoute { prefix: format!("{}/{}", r.prefix, r.len), via: r.via.to_string(), port: port_name(r.port) }).collect(),
            neighbors: self.spec.neighbors.iter().map(|(a, m)| RawNeighbor { ip: a.to_string(), mac: format_mac(m) }).collect(),
            services: self
                .spec
                .services
                .iter()
                .enumerate()
                .map(|(i, s)| RawService {
                    vip: s.vip.to_string(),
                    port: s.port,
                    proto: if s.proto == proto::TCP { "tcp" } else { "udp" }.into(),
                    mode: s.mode.name().into(),
                    scheduler: Some(s.scheduler.name().into()),
                    table_size: match s.scheduler {
                        Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => Some(table_size),
                        _ => None,
                    },
                    local_addrs: s.local_addrs.iter().map(|a| a.to_string()).collect(),
                    toa: s.toa,
                    synproxy: (s.synproxy != SynProxy::Off).then(|| s.synproxy.name().into()),
                    synproxy_half_open: s.synproxy.half_open(),
                    timeouts: Some(raw_timeouts(&s.timeouts)),
                    backends: s.backends.iter().map(|b| RawBackend { addr: b.addr.to_string(), port: b.port, weight: Some(b.weight) }).collect(),
                    health: self.health.get(i).cloned().flatten().map(|h| raw_health(&h)),
                })
                .collect(),
            snat: self
                .spec
                .snat
                .iter()
                .map(|r| RawSnat {
                    source: format!("{}/{}", r.source, r.prefix_len),
                    addrs: r.addrs.iter().map(|a| a.to_string()).collect(),
                    timeouts: Some(raw_timeouts(&r.timeouts)),
                })
                .collect(),
            queue_sets: self
                .queue_sets
                .iter()
                .map(|q| RawQueueSet {
                    name: q.name.clone(),
                    // (A service the API removed since is left out: the file must load.)
                    services: q
                        .services
                        .iter()
                        .filter(|k| self.spec.services.iter().any(|s| (s.vip, s.port, s.proto) == **k))
                        .map(|(vip, port, p)| service_name(*vip, *port, *p))
                        .collect(),
                    workers: q.workers.clone(),
                    rate: q.rate.map(|r| RawRate { bps: r.bps, pps: r.pps, burst_ms: Some(r.burst_ms) }),
                    busy_poll: (!q.busy_poll).then_some(false),
                })
                .collect(),
            default_set: self.default_ingress.map(|r| RawDefaultSet { ingress: Some(RawRate { bps: r.bps, pps: r.pps, burst_ms: Some(r.burst_ms) }) }),
        }
    }

    /// Memory the session tables of every worker need at most, bytes, and the part of it made
    /// resident at start (the indexes).
    pub fn session_memory(&self) -> (u64, u64) {
        let f = vectorlb_lb::session::Footprint::of(&self.worker_config(0, self.runtime.workers).table);
        let w = self.runtime.workers as u64;
        (f.total() * w, f.index_bytes * w)
    }

    /// The memory budget of `runtime.memory_budget_mb`, or half of `mem_total` bytes.
    pub fn memory_budget(&self, mem_total: u64) -> u64 {
        self.runtime.memory_budget_mb.map_or(mem_total / 2, |m| m << 20)
    }

    /// What `vectorlb run` needs beyond a valid file: a port at least, a DPDK device for every
    /// port, enough packet buffers for every queue, and session tables within the memory
    /// budget. `check` runs the same test.
    pub fn check_for_run(&self) -> Result<(), Error> {
        self.check_for_run_with(mem_total())
    }

    /// [`Config::check_for_run`] for a machine with `mem_total` bytes of memory.
    pub fn check_for_run_with(&self, mem_total: u64) -> Result<(), Error> {
        self.check_memory_with(mem_total)?;
        self.check_ports_for_run()
    }

    /// The session tables' memory against the budget (`replay` builds the same tables).
    pub fn check_memory(&self) -> Result<(), Error> {
        self.check_memory_with(mem_total())
    }

    /// [`Config::check_memory`] for a machine with `mem_total` bytes of memory.
    pub fn check_memory_with(&self, mem_total: u64) -> Result<(), Error> {
        let (need, resident) = self.session_memory();
        let budget = self.memory_budget(mem_total);
        if need > budget {
            bail!(
                "global.max_sessions: {} sessions per worker x {} worker(s) need up to {} MiB ({} MiB of index made resident at start, the rest as sessions arrive); the budget is {} MiB (runtime.memory_budget_mb; by default half of this machine's memory)",
                self.engine.max_sessions,
                self.runtime.workers,
                need >> 20,
                resident >> 20,
                budget >> 20
            );
        }
        Ok(())
    }

    fn check_ports_for_run(&self) -> Result<(), Error> {
        if self.spec.ports.is_empty() {
            bail!("ports: `vectorlb run` needs at least one port");
        }
        if let Some(i) = (0..self.devices.len()).find(|&i| self.devices[i].is_none() && self.memif.get(i).is_none_or(Option::is_none)) {
            bail!("ports[{i}].device: `vectorlb run` needs a DPDK device (net_af_xdp0,iface=eth0, a PCI address, ...) or a memif interface ([ports.memif]) for every port");
        }
        let dma = self.memif.iter().flatten().any(MemifSpec::uses_dma);
        if dma && !self.runtime.eal.iter().any(|a| a == "--iova-mode=va") && !self.runtime.eal.windows(2).any(|w| w[0] == "--iova-mode" && w[1] == "va") {
            // The daemon adds it; an explicit other mode is a contradiction.
            if self.runtime.eal.iter().any(|a| a.starts_with("--iova-mode")) {
                bail!("runtime.eal: memif ports with copy = \"dma\" need --iova-mode=va");
            }
        }
        let r = &self.runtime;
        // Every rx and tx ring of every queue can hold a descriptor's worth of buffers, plus
        // the per-thread caches and what is in flight.
        let need = self.spec.ports.len() as u64 * r.workers as u64 * 2 * r.queue_desc as u64 + 256 * (r.workers as u64 + 1) + 1024;
        if (r.mbufs as u64) < need {
            bail!(
                "runtime.mbufs: {} is too few for {} port(s) x {} worker(s) x 2 rings x {} descriptors; give at least {need} (or lower runtime.queue_desc)",
                r.mbufs,
                self.spec.ports.len(),
                r.workers,
                r.queue_desc
            );
        }
        Ok(())
    }

    /// Worker settings for core `core` of `cores`.
    pub fn worker_config(&self, core: u16, cores: u16) -> vectorlb_lb::WorkerConfig {
        let shift = (cores.max(1) as u32).next_power_of_two().trailing_zeros() as u8;
        let mut w = vectorlb_lb::WorkerConfig::new(self.engine.max_sessions);
        w.batch = self.engine.batch;
        w.table.index_entries = self.engine.index_entries;
        w.table.core = core;
        w.table.core_shift = shift;
        w.table.cores = cores.max(1);
        w.table.port_min = self.engine.local_port_min;
        w.table.port_max = self.engine.local_port_max;
        w.table.sweep_budget = self.engine.sweep_budget;
        w.half_open_permille = self.engine.half_open_permille;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small valid file; the tests edit it to make each error.
    const GOOD: &str = include_str!("../testdata/good.toml");

    #[test]
    fn parses_a_good_file() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.engine.max_sessions, 1000);
        assert_eq!(c.spec.services[0].backends[0].weight, 2);
        assert_eq!(c.spec.services[0].mode, Mode::Fnat);
    }

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn queue_sets_are_checked_and_written_back() {
        let base = format!("{GOOD}\n[runtime]\nworkers = 3\n");
        let good = format!("{base}\n[[queue_sets]]\nname = \"web\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [2]\nrate = {{ bps = 1000000000, pps = 100000 }}\n");
        let c = Config::parse(&good).unwrap();
        let q = &c.queue_sets[0];
        assert_eq!((q.name.as_str(), q.services.clone(), q.workers.clone()), ("web", vec![("10.0.0.100".parse().unwrap(), 80, proto::TCP)], vec![2]));
        assert_eq!(q.rate, Some(RateSpec { bps: Some(1_000_000_000), pps: Some(100_000), burst_ms: 10 }));
        assert!(q.busy_poll);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        let napping = Config::parse(&good.replace("workers = [2]\n", "workers = [2]\nbusy_poll = false\n")).unwrap();
        assert!(!napping.queue_sets[0].busy_poll);
        assert_eq!(Config::parse(&napping.to_toml()).unwrap(), napping);
        let set = |body: &str| format!("{base}\n[[queue_sets]]\n{body}\n");
        for (body, want) in [
            ("name = \"default\"\nservices = []\nworkers = [1]", "queue_sets[0].name"),
            ("name = \"w\"\nservices = [\"10.0.0.100:81/tcp\"]\nworkers = [1]", "queue_sets[0].services[0]: '10.0.0.100:81/tcp' is not a service of this file"),
            ("name = \"w\"\nservices = [\"10.0.0.100:80/udp\"]\nworkers = [1]", "is not a service"),
            ("name = \"w\"\nservices = []\nworkers = []", "queue_sets[0].workers: a set needs at least one worker"),
            ("name = \"w\"\nservices = []\nworkers = [3]", "queue_sets[0].workers[0]: worker 3 does not exist"),
            ("name = \"w\"\nservices = []\nworkers = [0, 1, 2]", "leave at least one"),
            ("name = \"w\"\nservices = []\nworkers = [1]\nrate = {}", "queue_sets[0].rate: give bps, pps or both"),
            ("name = \"w\"\nservices = []\nworkers = [1]\nrate = { pps = 0 }", "a rate of 0"),
            ("name = \"w\"\nservices = []\nworkers = [1]\nrate = { pps = 5, burst_ms = 0 }", "queue_sets[0].rate.burst_ms"),
            ("name = \"w\"\nservices = []\nworkers = [1]\ncpus = [1]", "unknown field `cpus`"),
        ] {
            let e = err(&set(body));
            assert!(e.contains(want), "{body}: {e}");
        }
        let two = format!("{base}\n[[queue_sets]]\nname = \"a\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [1]\n[[queue_sets]]\nname = \"b\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [1]\n");
        assert!(err(&two).contains("queue_sets[1].services[0]: '10.0.0.100:80/tcp' is already in a set"), "{}", err(&two));
        let two = two.replacen("services = [\"10.0.0.100:80/tcp\"]\nworkers = [1]\n[[", "services = []\nworkers = [1]\n[[", 1);
        assert!(err(&two).contains("queue_sets[1].workers[0]: worker 1 is already dedicated"), "{}", err(&two));
        // A service the API removed leaves its set; the file written back still loads.
        let mut c = Config::parse(&good).unwrap();
        c.spec.services.clear();
        c.health.clear();
        let back = Config::parse(&c.to_toml()).unwrap();
        assert!(back.queue_sets[0].services.is_empty());
        // The default set's ingress limit (the XDP program polices it).
        let policed = Config::parse(&format!(
            "{good}
[default_set]
ingress = {{ pps = 20000, burst_ms = 5 }}
"
        ))
        .unwrap();
        assert_eq!(policed.default_ingress, Some(RateSpec { bps: None, pps: Some(20_000), burst_ms: 5 }));
        assert_eq!(Config::parse(&policed.to_toml()).unwrap(), policed);
        assert_eq!(Config::parse(&good).unwrap().default_ingress, None);
        for (body, want) in [
            ("ingress = {}", "default_set.ingress: give bps, pps or both"),
            ("ingress = { bps = 0 }", "default_set.ingress: a rate of 0"),
            ("ingress = { pps = 1, burst_ms = 10001 }", "default_set.ingress.burst_ms"),
            ("egress = { pps = 1 }", "unknown field `egress`"),
        ] {
            let e = err(&format!(
                "{base}
[default_set]
{body}
"
            ));
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn writes_back_what_it_reads() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/fnat-demo.toml")).unwrap();
        let c = Config::parse(&text).unwrap();
        let again = Config::parse(&c.to_toml()).unwrap();
        assert_eq!(c, again);
        let dev = GOOD.replace("mac = \"02:00:00:00:00:01\"", "device = \"net_af_xdp0,iface=v\\\"x\"\nmtu = 1400") + "\n[runtime]\nworkers = 2\napi = \"unix:/tmp/x.sock\"\n";
        let c = Config::parse(&dev).unwrap();
        assert_eq!(c.devices[0].as_deref(), Some("net_af_xdp0,iface=v\"x"));
        assert!(c.mac_from_device[0]);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn health_checks_parse_write_back_and_name_their_errors() {
        let with = |h: &str| GOOD.replace("backends = [{", &format!("health = {h}\nbackends = [{{"));
        let c = Config::parse(&with("{ kind = \"http\", path = \"/healthz\", interval = 0.5, rise = 1, fall = 2, on_down = \"reset\" }")).unwrap();
        let h = c.health[0].as_ref().unwrap();
        assert_eq!((h.interval, h.timeout, h.rise, h.fall, h.on_down), (500, 500, 1, 2, OnDown::Reset));
        assert_eq!(h.kind, CheckKind::Http { path: "/healthz".into(), host: None, expect_status: 200, tls: false });
        let c = Config::parse(&with("{ kind = \"https\", host = \"be.example\", expect_status = 204 }")).unwrap();
        assert_eq!(c.health[0].as_ref().unwrap().kind, CheckKind::Http { path: "/".into(), host: Some("be.example".into()), expect_status: 204, tls: true });
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        let c = Config::parse(&with("{ kind = \"exec\", command = \"/bin/true\" }")).unwrap();
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        assert!(err(&with("{ kind = \"icmp\" }")).contains("services[0].health.kind"));
        assert!(err(&with("{ kind = \"tcp\", path = \"/\" }")).contains("services[0].health.path: only for kind http"));
        assert!(err(&with("{ kind = \"udp\" }")).contains("services[0].health.send"));
        assert!(err(&with("{ kind = \"tcp\", interval = 1, timeout = 2 }")).contains("services[0].health.timeout"));
        assert!(err(&with("{ kind = \"tcp\", on_down = \"end\" }")).contains("services[0].health.on_down"));
        assert!(err(&with("{ kind = \"tcp\", rise = 0 }")).contains("rise/fall"));
    }

    #[test]
    fn runtime_errors_name_the_field() {
        assert!(err(&format!("{GOOD}\n[runtime]\nworkers = 0\n")).contains("runtime.workers"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = \"nowhere\"\n")).contains("runtime.api"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = \"127.0.0.1:9180\"\n")).starts_with("runtime.api: a TCP API needs runtime.api_token_file"));
        let tcp = Config::parse(&format!("{GOOD}\n[runtime]\napi = \"127.0.0.1:9180\"\napi_token_file = \"/etc/vectorlb/api.token\"\n")).unwrap();
        assert_eq!(Config::parse(&tcp.to_toml()).unwrap(), tcp);
        assert!(err(&format!("{GOOD}\n[runtime]\napi_token_file = \"/x\"\n")).starts_with("runtime.api_token_file:"));
        // Several listeners: a unix socket for ctl and an address for browsers.
        let both = Config::parse(&format!("{GOOD}\n[runtime]\napi = [\"unix:/tmp/a.sock\", \"127.0.0.1:9180\"]\napi_token_file = \"/t\"\n")).unwrap();
        assert_eq!(both.runtime.api, ["unix:/tmp/a.sock", "127.0.0.1:9180"]);
        assert_eq!(Config::parse(&both.to_toml()).unwrap(), both);
        assert_eq!(tcp.runtime.api, ["127.0.0.1:9180"]);
        assert!(tcp.to_toml().contains("api = \"127.0.0.1:9180\""), "one endpoint is written as a string");
        assert!(err(&format!("{GOOD}\n[runtime]\napi = [\"unix:/tmp/a.sock\", \"127.0.0.1:9180\"]\n")).starts_with("runtime.api: a TCP API needs runtime.api_token_file"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = []\n")).starts_with("runtime.api: give at least one endpoint"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = [\"unix:/a\", \"unix:/a\"]\n")).contains("listed twice"));
        let e = err(&format!("{GOOD}\n[runtime]\napi = 7\n"));
        assert!(e.contains("api = 7") && e.contains("or a list of them"), "{e}");
        assert!(err(&format!("{GOOD}\n[runtime]\napi = [\"127.0.0.1:1\"]\napi_group = \"adm\"\napi_token_file = \"/t\"\n")).starts_with("runtime.api_group"));
        assert!(err(&format!("{GOOD}\n[runtime]\nqueue_desc = 1000\n")).contains("runtime.queue_desc"));
        assert!(err(&GOOD.replace("mac = \"02:00:00:00:00:01\"", "")).contains("ports[0].mac"));
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err(&GOOD.replace("\"fnat\"", "\"xnat\"")).contains("services[0].mode"));
        assert!(err(&GOOD.replace("10.0.0.11\", port", "10.0.0.311\", port")).contains("services[0].backends[0].addr"));
        assert!(err(&GOOD.replace("max_sessions", "max_sesions")).contains("unknown field"));
        assert!(err(&GOOD.replace("02:00:00:00:00:01", "02:00:00:00:01")).contains("ports[0].mac"));
        assert!(err(&GOOD.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\ntable_size = 65536")).contains("not prime"));
        assert!(err(&GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = []")).contains("local address"));
        assert!(err(&GOOD.replace("port = 8080", "port = 8080000")).contains("port"));
    }

    #[test]
    fn nonsense_is_refused_with_the_field_named() {
        for (vip, why) in [("0.0.0.0", "unspecified"), ("255.255.255.255", "broadcast"), ("224.0.0.1", "multicast"), ("127.0.0.1", "loopback")] {
            let e = err(&GOOD.replace("vip = \"10.0.0.100\"", &format!("vip = \"{vip}\"")));
            assert!(e.starts_with("services[0].vip:") && e.contains(why), "{vip}: {e}");
        }
        let v6 = GOOD.replace("10.0.0.1/24", "2001:db8::1/64").replace("10.0.0.11", "2001:db8::11").replace("10.0.0.200", "2001:db8::200");
        for vip in ["::", "::ffff:10.0.0.100", "ff02::1", "::1"] {
            let e = err(&v6.replace("vip = \"10.0.0.100\"", &format!("vip = \"{vip}\"")));
            assert!(e.starts_with("services[0].vip:"), "{vip}: {e}");
        }
        let e = err(&GOOD.replace("{ addr = \"10.0.0.11\"", "{ addr = \"10.0.0.100\""));
        assert!(e.starts_with("services[0].backends[0].addr:") && e.contains("VIP or local address"), "{e}");
        let e = err(&GOOD.replace("{ addr = \"10.0.0.11\"", "{ addr = \"10.0.0.200\""));
        assert!(e.starts_with("services[0].backends[0].addr:"), "{e}");
        let e = err(&GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = [\"10.0.0.200\", \"10.0.0.200\"]"));
        assert!(e.starts_with("services[0].local_addrs[1]:") && e.contains("twice"), "{e}");
        let e = err(&GOOD.replace("mac = \"02:00:00:00:00:11\"", "mac = \"ff:ff:ff:ff:ff:ff\""));
        assert!(e.starts_with("neighbors[0].mac:") && e.contains("group"), "{e}");
        let e = err(&GOOD.replace("mac = \"02:00:00:00:00:11\"", "mac = \"01:00:5e:00:00:01\""));
        assert!(e.starts_with("neighbors[0].mac:"), "{e}");
        let e = err(&GOOD.replace("port = 8080", "port = 70000"));
        assert!(e.contains("expected an integer in 0..=65535"), "numbers in the field's terms: {e}");
    }

    #[test]
    fn what_run_refuses_check_refuses() {
        let c = Config::parse(GOOD).unwrap();
        assert!(c.check_for_run().unwrap_err().to_string().starts_with("ports[0].device:"));
        let with_dev = GOOD.replace("mac = \"02:00:00:00:00:01\"", "device = \"net_null0\"");
        Config::parse(&with_dev).unwrap().check_for_run().unwrap();
        let few = format!("{with_dev}\n[runtime]\nmbufs = 1024\n");
        assert!(Config::parse(&few).unwrap().check_for_run().unwrap_err().to_string().starts_with("runtime.mbufs:"));
        let none = "[global]\nmax_sessions = 10\n";
        assert!(Config::parse(none).unwrap().check_for_run().unwrap_err().to_string().starts_with("ports:"));
        // Memory: 4 billion sessions is refused with the figures; a budget can be given.
        let huge = with_dev.replace("max_sessions = 1000", "max_sessions = 4000000000");
        let e = Config::parse(&huge).unwrap().check_for_run_with(24 << 30).unwrap_err().to_string();
        assert!(e.starts_with("global.max_sessions:") && e.contains("MiB") && e.contains("budget is 12288 MiB"), "{e}");
        let ten_m = with_dev.replace("max_sessions = 1000", "max_sessions = 10000000");
        let c = Config::parse(&ten_m).unwrap();
        let (need, resident) = c.session_memory();
        assert!(need > 300 << 20 && need < 700 << 20 && resident < need, "10 M sessions: {need} bytes, {resident} resident at start");
        c.check_for_run_with(24 << 30).unwrap();
        let tight = Config::parse(&format!("{ten_m}\n[runtime]\nmemory_budget_mb = 100\n")).unwrap();
        assert!(tight.check_for_run_with(24 << 30).unwrap_err().to_string().contains("budget is 100 MiB"));
    }

    #[test]
    fn only_regular_text_files_are_read() {
        let dir = std::env::temp_dir().join(format!("vectorlb-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Config::load(Path::new("/dev/urandom")).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } == 0 {
            assert!(Config::load(&fifo).unwrap_err().to_string().contains("not a regular file"), "a FIFO is refused, not read (it would block)");
        }
        let bin = dir.join("bin.toml");
        std::fs::write(&bin, b"[global]\nmax_sessions = 1\n# caf\xe9\n").unwrap();
        let e = Config::load(&bin).unwrap_err().to_string();
        assert!(e.contains("line 3, column 6: not UTF-8"), "{e}");
        let big = dir.join("big.toml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_FILE + 1).unwrap();
        assert!(Config::load(&big).unwrap_err().to_string().contains("at most"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
