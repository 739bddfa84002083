//! The control API's request and response bodies, and their limits. Every type here is part
//! of the generated OpenAPI document (`vectorlb-api`), so the document cannot drift from what
//! the server reads and writes; the CLI, the controller and the CNI plugin read and write the
//! same types.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;
use utoipa::openapi::schema::{AnyOfBuilder, KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoParams, ToSchema};

/// The JSON schema of an IP address: a string in IPv4 or IPv6 form.
pub fn ip_schema() -> Schema {
    let fmt = |f| ObjectBuilder::new().schema_type(Type::String).format(Some(SchemaFormat::KnownFormat(f))).build();
    Schema::AnyOf(AnyOfBuilder::new().item(fmt(KnownFormat::Ipv4)).item(fmt(KnownFormat::Ipv6)).description(Some("IPv4 or IPv6 address")).build())
}

/// The JSON schema of a list of IP addresses.
pub fn ip_list_schema() -> Schema {
    Schema::Array(utoipa::openapi::schema::ArrayBuilder::new().items(RefOr::T(ip_schema())).build())
}

/// Integers in request bodies. JSON (and JSON Schema) count `80.0` as the integer 80, which
/// serde's integer types refuse; these accept any number with no fractional part in range.
pub mod int {
    use serde::de::{Deserializer, Error, Visitor};
    use std::fmt;
    use std::marker::PhantomData;

    struct Int<T>(PhantomData<T>);

    impl<T: TryFrom<u64> + Bounded> Visitor<'_> for Int<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an integer in 0..={}", T::MAX)
        }
        fn visit_u64<E: Error>(self, v: u64) -> Result<T, E> {
            T::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_i64<E: Error>(self, v: i64) -> Result<T, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self)).and_then(|v| self.visit_u64(v))
        }
        fn visit_f64<E: Error>(self, v: f64) -> Result<T, E> {
            if v.fract() != 0.0 || !(0.0..=T::MAX as f64).contains(&v) {
                return Err(E::invalid_value(serde::de::Unexpected::Float(v), &self));
            }
            self.visit_u64(v as u64)
        }
    }

    /// The largest value of an unsigned integer type.
    pub trait Bounded {
        const MAX: u64;
    }
    impl Bounded for u16 {
        const MAX: u64 = u16::MAX as u64;
    }
    impl Bounded for u32 {
        const MAX: u64 = u32::MAX as u64;
    }

    pub fn de<'de, D: Deserializer<'de>, T: TryFrom<u64> + Bounded>(d: D) -> Result<T, D::Error> {
        d.deserialize_any(Int(PhantomData))
    }

    pub fn opt<'de, D: Deserializer<'de>, T: TryFrom<u64> + Bounded>(d: D) -> Result<Option<T>, D::Error> {
        struct Opt<T>(PhantomData<T>);
        impl<'de, T: TryFrom<u64> + Bounded> Visitor<'de> for Opt<T> {
            type Value = Option<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an integer in 0..={}, or null", T::MAX)
            }
            fn visit_none<E: Error>(self) -> Result<Option<T>, E> {
                Ok(None)
            }
            fn visit_unit<E: Error>(self) -> Result<Option<T>, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
                de(d).map(Some)
            }
        }
        d.deserialize_option(Opt(PhantomData))
    }
}

pub use crate::error::{ErrorBody, ErrorKind, OpError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }

    pub fn parse(s: &str) -> Option<Proto> {
        match s {
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            _ => None,
        }
    }

    /// From an IP protocol number (17 is UDP; anything else a service has is TCP).
    pub fn of(number: u8) -> Proto {
        if number == 17 {
            Proto::Udp
        } else {
            Proto::Tcp
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
}

/// Forwarding mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    Nat,
    Fnat,
    Dr,
    Tun,
}

impl ModeName {
    /// As the API and the file write it.
    pub fn name(self) -> &'static str {
        match self {
            ModeName::Nat => "nat",
            ModeName::Fnat => "fnat",
            ModeName::Dr => "dr",
            ModeName::Tun => "tun",
        }
    }
}

/// Scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerName {
    Rr,
    Wrr,
    Wlc,
    Sh,
    Maglev,
}

impl SchedulerName {
    pub fn name(self) -> &'static str {
        match self {
            SchedulerName::Rr => "rr",
            SchedulerName::Wrr => "wrr",
            SchedulerName::Wlc => "wlc",
            SchedulerName::Sh => "sh",
            SchedulerName::Maglev => "maglev",
        }
    }
}

/// Largest backend weight.
pub const MAX_WEIGHT: u32 = 1_000_000;
/// Bounds of an sh / maglev table size.
pub const TABLE_SIZE: std::ops::RangeInclusive<u32> = 3..=16_777_216;

fn default_weight() -> u32 {
    1
}

fn default_proto() -> Proto {
    Proto::Tcp
}

fn default_mode() -> ModeName {
    ModeName::Fnat
}

/// A backend (real server) of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewBackend {
    #[schema(schema_with = ip_schema)]
    pub addr: IpAddr,
    /// 0: the client's destination port.
    #[serde(default, deserialize_with = "int::de")]
    #[schema(minimum = 0, maximum = 65535)]
    pub port: u16,
    #[serde(default = "default_weight", deserialize_with = "int::de")]
    #[schema(default = 1, minimum = 0, maximum = 1000000)]
    pub weight: u32,
}

/// A service to add.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewService {
    #[schema(schema_with = ip_schema)]
    pub vip: IpAddr,
    /// 0: every port.
    #[serde(default, deserialize_with = "int::de")]
    #[schema(minimum = 0, maximum = 65535)]
    pub port: u16,
    #[serde(default = "default_proto")]
    #[schema(default = "tcp")]
    pub proto: Proto,
    #[serde(default = "default_mode")]
    #[schema(default = "fnat")]
    pub mode: ModeName,
    /// Default wrr.
    #[serde(default)]
    pub scheduler: Option<SchedulerName>,
    /// sh / maglev table size, a prime (65537 by default).
    #[serde(default, deserialize_with = "int::opt")]
    #[schema(minimum = 3, maximum = 16777216)]
    pub table_size: Option<u32>,
    /// Full-NAT local addresses.
    #[serde(default)]
    #[schema(schema_with = ip_list_schema)]
    pub local_addrs: Vec<IpAddr>,
    /// nat services with `local_addrs`: the client prefixes ("10.244.0.0/16") that keep
    /// their address; other clients are masqueraded to a local address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_source: Vec<String>,
    /// The local addresses of this service on the sync group's other nodes (fnat only):
    /// sessions synchronised from them may hold these; never allocated here.
    #[serde(default)]
    #[schema(schema_with = ip_list_schema)]
    pub peer_local_addrs: Vec<IpAddr>,
    /// Insert the TOA option (tcp fnat only).
    #[serde(default)]
    pub toa: bool,
    /// SYN proxy: off (default), on, auto (tcp nat and fnat only).
    #[serde(default)]
    pub synproxy: Option<SynProxyName>,
    /// Client affinity: a client's new flows go to the backend it had while it opened one
    /// within this many seconds (1 to 86400; none: no affinity).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "int::opt")]
    #[schema(minimum = 1, maximum = 86400)]
    pub affinity_timeout_s: Option<u32>,
    /// The backends' health check (none: every backend is taken as up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthCheck>,
    #[serde(default)]
    pub backends: Vec<NewBackend>,
}

/// A service's health check, as `[services.health]` in the file (docs/configuration.md); the
/// API takes no `exec` checks (it would run commands for its callers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    pub kind: HealthKind,
    /// Milliseconds between checks of a backend (default 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u32>,
    /// Milliseconds a check may take (default the interval, at most 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
    /// Successes in a row that bring a backend up (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rise: Option<u32>,
    /// Failures in a row that take it down (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fall: Option<u32>,
    /// The port checked (default the backend's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// http, https: the path asked for (default /), the Host sent, the status expected (200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<u16>,
    /// udp: the datagram sent, and what the answer must contain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<String>,
    /// A failed backend's sessions: keep (default) or reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_down: Option<OnDownName>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthKind {
    Tcp,
    Http,
    Https,
    Udp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnDownName {
    Keep,
    Reset,
}

/// Changes to a service; absent fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServicePatch {
    #[serde(default)]
    pub scheduler: Option<SchedulerName>,
    /// sh / maglev table size, a prime.
    #[serde(default, deserialize_with = "int::opt")]
    #[schema(minimum = 3, maximum = 16777216)]
    pub table_size: Option<u32>,
    #[serde(default)]
    pub toa: Option<bool>,
    #[serde(default)]
    pub synproxy: Option<SynProxyName>,
}

/// One change of a batch (`POST /v1/batch`).
// Ops travel in a Vec built once per request: the Delete variant's unused room is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum BatchOp {
    /// Adds the service, or replaces the whole of an existing one with the same protocol,
    /// address and port (its sessions stay: backends are matched by address and port).
    Put(NewService),
    /// Removes a service (absent: not an error).
    Delete(ServiceRef),
}

/// A service named by its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceRef {
    pub proto: Proto,
    #[schema(schema_with = ip_schema)]
    pub vip: IpAddr,
    #[serde(deserialize_with = "int::de")]
    #[schema(minimum = 0, maximum = 65535)]
    pub port: u16,
}

/// Several service changes applied as one: all of them, published together, or none (the
/// error names the first bad one as `ops[i]`). A controller converges a daemon with one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    pub ops: Vec<BatchOp>,
}

/// The result of a batch.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchDone {
    /// Operations applied.
    pub applied: usize,
    /// The configuration generation that carries them.
    pub generation: u64,
}

/// The most operations one batch may carry.
pub const MAX_BATCH: usize = 100_000;

/// When SYNs are answered with SYN cookies: never, always, or while a core holds many
/// half-open sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SynProxyName {
    Off,
    On,
    Auto,
}

impl SynProxyName {
    /// As the API and the file write it.
    pub fn name(self) -> &'static str {
        match self {
            SynProxyName::Off => "off",
            SynProxyName::On => "on",
            SynProxyName::Auto => "auto",
        }
    }
}

/// A backend's new weight (0 drains it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendPatch {
    #[serde(deserialize_with = "int::de")]
    #[schema(minimum = 0, maximum = 1000000)]
    pub weight: u32,
}

/// A service, as the path names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceKey {
    pub proto: Proto,
    pub vip: IpAddr,
    pub port: u16,
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} service {}", self.proto.name(), std::net::SocketAddr::new(self.vip, self.port))
    }
}

/// The result of a backend's health checks.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BackendHealth {
    /// up or down.
    pub state: String,
    pub since_seconds: f64,
    pub consecutive_successes: u32,
    pub consecutive_failures: u32,
    pub checks: u64,
    pub failed_checks: u64,
    pub transitions: u64,
    pub last_check_ms: f64,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BackendStatus {
    pub addr: String,
    pub port: u16,
    pub weight: u32,
    /// Whether its next hop's MAC address is known.
    pub resolved: bool,
    pub active_sessions: u64,
    pub packets: u64,
    pub bytes: u64,
    /// Sessions scheduled to it.
    pub new_sessions: u64,
    /// Per second, over the last 10 s.
    pub rates: Rates,
    /// Null when the service has no health check.
    pub health: Option<BackendHealth>,
}

/// Per-second rates over a sliding window (the last 10 s; shorter just after start): a
/// burst reads as a burst for the window and then decays to zero.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
pub struct Rates {
    pub new_sessions_per_second: f64,
    pub packets_per_second: f64,
    pub bytes_per_second: f64,
}

/// Recent rates for the status page's charts: one point a second, oldest first, each the
/// sliding-window rate (as in [`Rates`]) at that second.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct History {
    pub step_seconds: f64,
    pub services: Vec<ServiceHistory>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceHistory {
    pub proto: Proto,
    pub vip: String,
    pub port: u16,
    pub series: RateSeries,
    pub backends: Vec<BackendHistory>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct BackendHistory {
    pub addr: String,
    pub port: u16,
    pub series: RateSeries,
}

/// Series of equal length, oldest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct RateSeries {
    pub new_sessions_per_second: Vec<f32>,
    pub packets_per_second: Vec<f32>,
    pub bytes_per_second: Vec<f32>,
}

/// The whole data plane's rates over the same window.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct GlobalRates {
    /// The span the rates cover, seconds.
    pub window_seconds: f64,
    pub rx_packets_per_second: f64,
    pub tx_packets_per_second: f64,
    /// Drops of every reason.
    pub drops_per_second: f64,
    pub new_sessions_per_second: f64,
    /// Drops per second by reason (every reason, zero or not).
    pub drops_by_reason: BTreeMap<String, f64>,
}

/// A port's traffic per second over the same window.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
pub struct PortRates {
    pub rx_packets_per_second: f64,
    pub tx_packets_per_second: f64,
    pub rx_bytes_per_second: f64,
    pub tx_bytes_per_second: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ServiceStats {
    pub packets: u64,
    pub bytes: u64,
    pub new_sessions: u64,
    /// Over the last 10 s (the same as `rates.new_sessions_per_second`).
    pub new_sessions_per_second: f64,
    /// Per second, over the last 10 s.
    pub rates: Rates,
}

/// A service's timeouts, seconds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceTimeouts {
    pub syn: f64,
    pub established: f64,
    pub fin: f64,
    pub time_wait: f64,
    pub close: f64,
    pub udp: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceStatus {
    pub vip: String,
    pub port: u16,
    pub proto: Proto,
    pub mode: ModeName,
    pub scheduler: SchedulerName,
    /// sh and maglev only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u32>,
    pub local_addrs: Vec<String>,
    /// nat services: the client prefixes that keep their address (the others are
    /// masqueraded to `local_addrs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_source: Vec<String>,
    /// The sync group's other nodes' local addresses for this service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_local_addrs: Vec<String>,
    pub toa: bool,
    pub synproxy: SynProxyName,
    /// Client affinity's timeout in seconds (none: no affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_s: Option<u32>,
    pub timeouts: ServiceTimeouts,
    /// Its health check (an `exec` check from the file is not shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthCheck>,
    pub backends: Vec<BackendStatus>,
    pub stats: ServiceStats,
}

/// Whether the data plane works: `ok`, or `degraded` with what is wrong (answered with 503,
/// so that keepalived's track script, `vectorlb ctl --ha`, moves the VIPs away).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    /// Generation of the running configuration.
    pub generation: u64,
    /// What is wrong (a port's XDP program gone, a link down, a worker stuck, BIRD not
    /// running); empty when ok.
    #[serde(default)]
    pub problems: Vec<String>,
    /// The BGP speaker (`[bgp]`): what is announced and the neighbours' states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpStatus>,
}

/// The VIPs announced by BGP through BIRD (`[bgp]`, docs/scale-out.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct BgpStatus {
    /// `announcing` (every VIP with a backend up), `withdrawn` (nothing announced: the data
    /// plane is broken or no service has a backend up), `draining` (withdrawn by `ctl drain`,
    /// flows still served), `drained` (no session left, or the drain's deadline passed).
    pub state: String,
    /// Why a VIP is not announced, one line per reason.
    #[serde(default)]
    pub reasons: Vec<String>,
    /// The prefixes announced now (`ADDRESS/LEN`): VIPs, and this node's full-NAT local
    /// addresses (the backends' replies come back to them).
    pub announced: Vec<String>,
    /// The sync group's other nodes' local addresses, announced with a longer AS path: the
    /// routers use them only when their node's own route is gone, and this node then serves
    /// that node's synchronised full-NAT sessions.
    #[serde(default)]
    pub announced_backup: Vec<String>,
    /// VIPs configured but not announced.
    #[serde(default)]
    pub withheld: Vec<String>,
    pub bird_running: bool,
    /// Times BIRD was started again after it died.
    pub bird_restarts: u64,
    /// The last error from BIRD or birdc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Changes of the announced set sent to BIRD.
    pub changes: u64,
    pub neighbors: Vec<BgpNeighborStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainStatus>,
}

/// One BGP session, as BIRD reports it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct BgpNeighborStatus {
    pub address: String,
    pub asn: u32,
    /// Whether the session is established.
    pub established: bool,
    /// BIRD's protocol state (`up`, `start`, `down`, `unknown` when BIRD cannot be asked).
    pub state: String,
    /// The BGP state (`Established`, `Active`, `Connect`, ...) and BIRD's last error.
    pub info: String,
}

/// A drain in progress or done.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct DrainStatus {
    pub since_seconds: f64,
    /// Seconds until the deadline (0 once passed).
    pub deadline_in_seconds: f64,
    /// Live sessions left on this node.
    pub sessions: u64,
    /// No session left, or the deadline passed.
    pub done: bool,
}

/// `POST /v1/drain`: withdraw this node's VIPs and keep serving its flows (`drain: true`), or
/// announce them again (`drain: false`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainChange {
    pub drain: bool,
    /// How long existing flows are given (1..=86400 s; default 300).
    #[serde(default)]
    pub deadline_seconds: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Created {
    pub created: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Updated {
    pub updated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Deleted {
    pub deleted: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Reloaded {
    pub reloaded: bool,
    pub generation: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Saved {
    /// The file written.
    pub saved: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HaState {
    Standalone,
    Master,
    Backup,
}

impl HaState {
    pub fn name(self) -> &'static str {
        match self {
            HaState::Standalone => "standalone",
            HaState::Master => "master",
            HaState::Backup => "backup",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HaStatus {
    pub state: HaState,
    pub since_seconds: f64,
    pub transitions: u64,
    pub announcements: u64,
}

/// keepalived's notify scripts set the state (`vectorlb ctl --ha-state`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HaChange {
    pub state: HaState,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HaChanged {
    pub state: HaState,
    pub previous: HaState,
}

/// Session synchronisation between HA nodes (`[ha]`); all zero when not configured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SyncStatus {
    pub configured: bool,
    /// A group of active nodes (`ha.group`) rather than an active/standby pair.
    #[serde(default)]
    pub group: bool,
    /// A group's node has the group's sessions (its BGP speaker waits for this); always true
    /// in a pair.
    #[serde(default)]
    pub ready: bool,
    pub records_sent: u64,
    /// Changes not sent: above `ha.max_rate` for longer than the sender's queue holds.
    #[serde(default)]
    pub records_dropped: u64,
    pub datagrams_sent: u64,
    /// Datagrams the standby has not acknowledged (the lag).
    pub unacked_datagrams: u64,
    /// The current batching period (it adapts to load and acknowledgements).
    pub batch_period_ms: f64,
    pub records_received: u64,
    pub installed: u64,
    pub rejected: SyncRejected,
    pub refused: SyncRefused,
    pub bulk: SyncBulk,
    pub last_received_seconds_ago: Option<f64>,
}

/// Records the standby did not install, by reason.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SyncRejected {
    pub unknown: u64,
    pub stale: u64,
    pub port_taken: u64,
    pub table_full: u64,
}

/// Messages dropped unread, by reason.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SyncRefused {
    /// From an address that is not a configured peer (`ha.sync_peers`, `ha.sync_sources`):
    /// dropped before any cryptography.
    pub foreign: u64,
    /// The authentication tag failed (another key, or altered on the way). (Named for the
    /// HMAC of wire version 2; version 3 seals with AES-256-GCM.)
    pub bad_hmac: u64,
    pub truncated: u64,
    pub malformed: u64,
    /// Authentic, but its (epoch, sequence) was already seen from that address.
    pub replayed: u64,
    /// Authentic, but sealed more than 60 s from this node's clock (a captured message
    /// replayed after a restart emptied the windows, or clocks apart).
    #[serde(default)]
    pub outdated: u64,
}

/// Whole-table transfers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SyncBulk {
    pub records_sent: u64,
    pub records_received: u64,
    pub requests: u64,
    pub completed: u64,
    /// Transfers that ended with records missing (asked for again).
    #[serde(default)]
    pub incomplete: u64,
    /// BULK_DONE messages that answered no request of this node's (an older transfer's, or
    /// a replay): not taken as the end of a transfer.
    #[serde(default)]
    pub unrequested: u64,
}

/// Global counters. Beside the fields listed, the object holds every pipeline counter by name
/// (`rx`, `tx`, `to_kernel`, `handoff`, `sessions_created`, `icmp_echo_replies`, ...; the list
/// with their meanings is in docs/metrics.md).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Stats {
    pub uptime_seconds: f64,
    pub generation: u64,
    pub workers: u16,
    /// The pipeline's counters by name (rx, tx, to_kernel, handoff, sessions_created, ...; the
    /// list is in docs/metrics.md).
    #[serde(flatten)]
    pub packets: BTreeMap<String, u64>,
    /// Drops by reason (every reason, zero or not).
    pub drops: BTreeMap<String, u64>,
    /// Live sessions.
    pub sessions: u64,
    /// The worker loops' counters (transmit queue full, hand-offs, polls, ...).
    pub io: BTreeMap<String, u64>,
    pub reloads: u64,
    pub reload_failures: u64,
    pub mbufs_available: u64,
    pub ha: HaStatus,
    pub sync: SyncStatus,
    /// The BGP speaker (absent without `[bgp]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpStatus>,
    /// Per second, over the last 10 s.
    pub rates: GlobalRates,
    /// Application queue sets (`[[queue_sets]]`), then the default set (every worker of no
    /// set); empty without sets.
    #[serde(default)]
    pub queue_sets: Vec<QueueSetStatus>,
}

/// A queue set: its workers and what they counted.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct QueueSetStatus {
    /// The set's name (`default`: the workers of no set).
    pub name: String,
    pub workers: Vec<u16>,
    /// Its services, `VIP:PORT/PROTO`.
    pub services: Vec<String>,
    /// Whether its workers poll without sleeping.
    pub busy_poll: bool,
    /// Its egress limit, bits and packets per second (absent: none).
    pub rate_bps: Option<u64>,
    pub rate_pps: Option<u64>,
    /// Its workers' counters: `rx`, `tx` (the pipeline's), `steered` (handed to another
    /// set's worker), `kept_for_session`, `dropped` (every reason), `rate_limited`.
    pub packets: BTreeMap<String, u64>,
    /// Its workers' queues, from histograms (docs/queue-sets.md says what each measures).
    #[serde(default)]
    pub queues: QueueSetQueues,
    /// What the XDP programs of the AF_XDP ports counted of it before the receive ring
    /// (absent without AF_XDP ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp: Option<QueueSetXdp>,
    /// Flow rules that put its traffic on its workers' queues, over the ports whose driver
    /// takes them (`rte_flow`; 0 on software ports, where the receiving worker hands its
    /// packets on).
    #[serde(default)]
    pub flow_rules: u32,
}

/// A queue set's packets as the XDP program saw them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct QueueSetXdp {
    /// Passed on to the data plane.
    pub packets: u64,
    pub bytes: u64,
    /// Dropped by the default set's ingress limit (`[default_set] ingress`).
    pub policed: u64,
}

/// A queue set's queue statistics. Quantiles are the upper bound of the histogram bucket that
/// holds them (`null` when nothing was counted or when they fall past the last bucket:
/// 10,000 µs, 1,024 packets).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct QueueSetQueues {
    /// Packets timed (each one received by the set's workers).
    pub packets: u64,
    /// How long a packet may have waited on its queue before its worker looked, µs.
    pub wait_us: Quantiles,
    /// From the polling round that took a packet to the end of its transmit, µs.
    pub residence_us: Quantiles,
    /// Receives that found packets.
    pub receives: u64,
    /// Packets waiting per receive (taken and still queued, where the queue can tell).
    pub depth: Quantiles,
}

/// Quantiles of a histogram, as bucket upper bounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Quantiles {
    pub p50: Option<u64>,
    pub p99: Option<u64>,
    pub p999: Option<u64>,
    /// Mean (exact: from the histogram's sum).
    pub mean: f64,
}

/// A port. Beside the fields listed, the object holds the driver's basic counters by name
/// (`ipackets`, `opackets`, `ibytes`, `obytes`, `imissed`, `ierrors`, `oerrors`, `rx_nombuf`:
/// DPDK's `rte_eth_stats`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PortStatus {
    pub name: String,
    pub device: String,
    pub port_id: u16,
    pub mac: String,
    pub link_up: bool,
    pub speed_mbps: u32,
    /// The kernel interface of an AF_XDP port.
    pub xdp_interface: Option<String>,
    /// A memif port's interface: its peer and per-queue counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memif: Option<MemifStatus>,
    /// Per second, over the last 10 s.
    #[serde(default)]
    pub rates: PortRates,
    #[serde(flatten)]
    pub counters: BTreeMap<String, u64>,
}

/// A memif port: the interface's state and each queue pair's counters.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemifStatus {
    /// `server` or `client`.
    pub role: String,
    /// The control socket (`@name` for the abstract namespace).
    pub socket: String,
    pub id: u32,
    /// `cpu` or `dma`.
    pub copy: String,
    /// `ethernet` or `ip`.
    pub mode: String,
    pub connected: bool,
    /// The peer's name (from its INIT or HELLO).
    pub peer: String,
    /// The peer's process id (server role).
    pub peer_pid: Option<i32>,
    pub connects: u64,
    pub disconnects: u64,
    /// Why the last connection ended, or why the last handshake was refused.
    pub last_reason: String,
    /// Queue pairs of the current (or last) connection.
    pub rings: u16,
    /// Slots per ring.
    pub ring_size: u32,
    pub queues: Vec<MemifQueue>,
}

/// One memif queue pair's counters.
// The daemon fills them by name from vectorlb-memif's declaration (`queue_counters!`): a
// counter added there must be added here, or the daemon's test fails.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemifQueue {
    pub queue: u16,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Descriptors outside the peer's memory or with impossible lengths (dropped).
    pub bad_desc: u64,
    /// Ring indexes the peer moved to impossible values (the connection was ended).
    pub bad_ring: u64,
    /// Frames longer than a packet buffer (dropped).
    pub too_long: u64,
    /// Frames that found no packet buffer (dropped).
    pub no_buffer: u64,
    /// Transmit bursts that found the peer's ring full.
    pub tx_ring_full: u64,
    /// IP mode: frames that were not IPv4 or IPv6, from the peer or for it (dropped).
    pub not_ip: u64,
    /// Copies done by the CPU (the cpu engine, or below the DMA threshold).
    pub copies_cpu: u64,
    /// Copies done by the DMA engine.
    pub copies_dma: u64,
    /// Copies the CPU did because the DMA ring was full.
    pub copies_cpu_fallback: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Neighbor {
    pub ip: String,
    pub mac: String,
    /// From the configuration file (true) or learned (false).
    #[serde(rename = "static")]
    pub is_static: bool,
    /// Learned neighbours: the port and how long ago it was last confirmed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub proto: Proto,
    pub client: String,
    /// VIP:port, or "snat".
    pub vip: String,
    pub backend: String,
    pub local: Option<String>,
    pub state: String,
    pub expires_ms: i64,
    pub snat: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionPage {
    pub worker: u16,
    pub family: u8,
    pub sessions: Vec<Session>,
    /// Where the next page starts; null on the last page.
    pub next_cursor: Option<u64>,
}

/// Which sessions to list (query parameters of `GET /v1/sessions`; parsed by the handler so
/// that each error names its parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionQuery {
    pub worker: u16,
    pub v6: bool,
    pub cursor: u32,
    pub limit: u32,
}

impl IntoParams for SessionQuery {
    fn into_params(_: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        let int = |min: u64, max: u64, default: u64| {
            ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(min as f64)).maximum(Some(max as f64)).default(Some(default.into())).build()
        };
        let p = |name: &str, desc: &str, schema: Schema| ParameterBuilder::new().name(name).parameter_in(ParameterIn::Query).description(Some(desc)).schema(Some(schema)).build();
        let family = ObjectBuilder::new().schema_type(Type::Integer).enum_values(Some([4, 6])).default(Some(4.into())).build();
        vec![
            p("worker", "The worker whose table to read.", Schema::Object(int(0, 65535, 0))),
            p("family", "4 or 6.", Schema::Object(family)),
            p("cursor", "The next_cursor of the previous page.", Schema::Object(int(0, u32::MAX as u64, 0))),
            p("limit", "Sessions per page.", Schema::Object(int(1, 10_000, 100))),
        ]
    }
}

/// Longest container id a pod's interface is attached for (the daemon names its state file
/// after it and the interface name, within a file name's 255 bytes).
pub const MAX_CONTAINER_ID: usize = 200;
/// Longest interface name (the kernel's `IFNAMSIZ` less its terminating zero).
pub const MAX_IFNAME: usize = 15;
/// Most port ranges a pod's memif takes.
pub const MAX_MEMIF_RANGES: usize = 16;

/// Whether `id` is a container id the daemon attaches for.
pub fn is_container_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_CONTAINER_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) && !id.starts_with('.')
}

/// The path of one attached interface (`DELETE /v1/pods/{container_id}/{ifname}`). Bytes
/// outside the names' alphabet are percent-encoded, so each stays one segment (and the daemon
/// refuses the name).
pub fn pod_path(container_id: &str, ifname: &str) -> String {
    let enc = |s: &str| s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect::<String>();
    format!("/v1/pods/{}/{}", enc(container_id), enc(ifname))
}

/// Whether `name` is an interface name the daemon creates.
pub fn is_ifname(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_IFNAME && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) && name != "." && name != ".."
}

/// A pod's interface to attach (`POST /v1/pods`, the CNI plugin's ADD): a tun interface named
/// `ifname` in the network namespace `netns`, with the addresses the IPAM plugin gave.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPod {
    /// The container runtime's id of the sandbox (1..=200 bytes, `MAX_CONTAINER_ID`: letters,
    /// digits, `-_.`, not starting with `.`).
    pub container_id: String,
    /// The interface name inside the pod (1..=15 bytes, `MAX_IFNAME`: letters, digits, `-_.`,
    /// not `.` or `..`).
    pub ifname: String,
    /// The pod's network namespace (a path such as `/var/run/netns/NAME`).
    pub netns: String,
    /// The pod's addresses, each `ADDR` or `ADDR/LEN` (at most one per family), inside the
    /// node's pod networks (the pods port's `addrs`).
    pub ips: Vec<String>,
    /// The interface's MTU (default: the pods port's).
    #[serde(default)]
    pub mtu: Option<u16>,
    /// The pod's name and namespace, for people reading `GET /v1/pods`.
    #[serde(default)]
    pub pod: Option<String>,
    /// The CNI network the attachment belongs to (its configuration's `name`; 1..=253 bytes):
    /// the plugin's GC removes only its own network's attachments.
    #[serde(default)]
    pub network: Option<String>,
    /// Destination ports that go to a memif of the pod's own instead of its interface (the
    /// pod annotation `vectorlb.io/memif-ports`, docs/pod-network.md); at most 16 ranges.
    #[serde(default)]
    pub memif_ports: Vec<MemifPorts>,
    /// The pod's host ports (its containers' `hostPort`s, the CNI `portMappings` capability):
    /// at most 64 (`MAX_HOST_PORTS`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
}

/// The most host ports one pod may have.
pub const MAX_HOST_PORTS: usize = 64;

/// A port of the node forwarded to a port of the pod (a container's `hostPort`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostPort {
    /// `tcp` or `udp`.
    pub proto: String,
    /// The node's port (1..=65535).
    pub host_port: u16,
    /// The pod's port (1..=65535).
    pub container_port: u16,
    /// The node address it is on: none (or the unspecified address) for each of the node's
    /// addresses (`[ports.pods] node_port_addresses`) of the pod's families, one of them, or
    /// the loopback address of a family (TCP only: relayed by the daemon on the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub host_ip: Option<IpAddr>,
}

impl NewPod {
    /// What can be checked without the node: the addresses (each `ADDR` or `ADDR/LEN` with a
    /// length of its family), the memif ports' protocols, the network's name (1..=253
    /// printable bytes). (The daemon checks the rest: names, ranges, its pod networks.) The parsed addresses, or a message
    /// for a 400 naming the field.
    pub fn addresses(&self) -> Result<Vec<IpAddr>, String> {
        let mut ips = Vec::with_capacity(self.ips.len());
        for a in &self.ips {
            let (addr, len) = match a.split_once('/') {
                Some((a, l)) => (a, Some(l)),
                None => (a.as_str(), None),
            };
            let ip: IpAddr = addr.parse().map_err(|_| format!("ips: '{}' is not an IP address", a.escape_debug()))?;
            if let Some(len) = len {
                let max = if ip.is_ipv4() { 32 } else { 128 };
                if len.parse::<u8>().ok().is_none_or(|l| l > max) {
                    return Err(format!("ips: '{}' has no valid prefix length", a.escape_debug()));
                }
            }
            ips.push(ip);
        }
        for (i, r) in self.memif_ports.iter().enumerate() {
            if r.proto != "tcp" && r.proto != "udp" {
                return Err(format!("memif_ports[{i}].proto: '{}' is not tcp or udp", r.proto.escape_debug()));
            }
        }
        if self.host_ports.len() > MAX_HOST_PORTS {
            return Err(format!("host_ports: {} of them; at most {MAX_HOST_PORTS}", self.host_ports.len()));
        }
        for (i, h) in self.host_ports.iter().enumerate() {
            if h.proto != "tcp" && h.proto != "udp" {
                return Err(format!("host_ports[{i}].proto: '{}' is not tcp or udp", h.proto.escape_debug()));
            }
            if h.host_port == 0 || h.container_port == 0 {
                return Err(format!("host_ports[{i}]: ports are 1..=65535"));
            }
            if h.host_ip.is_some_and(|a| a.is_multicast()) {
                return Err(format!("host_ports[{i}].host_ip: {} is a multicast address", h.host_ip.unwrap()));
            }
        }
        if let Some(n) = &self.network {
            if n.is_empty() || n.len() > 253 || !n.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("network: '{}' is not a network name (1 to 253 printable characters)", n.escape_debug()));
            }
        }
        Ok(ips)
    }
}

/// Destination ports of one protocol (`first..=last`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemifPorts {
    /// `tcp` or `udp`.
    pub proto: String,
    pub first: u16,
    pub last: u16,
}

/// A pod's memif.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PodMemif {
    /// Its control socket, in the pod's network namespace (`@NAME`: the abstract namespace).
    pub socket: String,
    pub ports: Vec<MemifPorts>,
    /// Whether an application in the pod is connected.
    pub connected: bool,
}

/// An attached pod interface.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PodStatus {
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub ips: Vec<String>,
    pub mtu: u16,
    /// Its slot on the pods port (the last four bytes of the MAC its neighbour entries carry).
    pub slot: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The CNI network the attachment belongs to (none: attached without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Packets read from the pod's interface, and written to it.
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Packets from the pod with a source address that is not its own (dropped).
    pub spoofed: u64,
    /// Packets for the pod its interface did not take (its queue was full), or for its memif
    /// while no application was connected, dropped.
    pub tx_dropped: u64,
    /// Whether its interface has offloads (a virtio-net header: checksums left to the data
    /// plane, TCP handed over up to 64 KB at once; docs/pod-network.md).
    #[serde(default)]
    pub offloads: bool,
    /// Super-packets read from it (TCP segmentation offload), and packets whose offload
    /// header did not agree with the packet (dropped).
    #[serde(default)]
    pub rx_super: u64,
    #[serde(default)]
    pub rx_bad_offload: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memif: Option<PodMemif>,
    /// Its host ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
}

#[cfg(test)]
mod names {
    use super::*;

    #[test]
    fn the_documented_limits_are_the_checked_ones() {
        let src = include_str!("model.rs");
        assert!(src.contains(&format!("(1..={MAX_CONTAINER_ID} bytes, `MAX_CONTAINER_ID`")));
        assert!(src.contains(&format!("(1..={MAX_IFNAME} bytes, `MAX_IFNAME`")));
        assert!(src.contains(&format!("at most {MAX_MEMIF_RANGES} ranges")));
        assert!(is_container_id(&"a".repeat(MAX_CONTAINER_ID)) && !is_container_id(&"a".repeat(MAX_CONTAINER_ID + 1)));
        assert!(!is_container_id(".x") && !is_container_id("") && !is_container_id("a/b"));
        assert!(is_ifname("eth0") && !is_ifname(&"e".repeat(MAX_IFNAME + 1)) && !is_ifname("..") && !is_ifname("a b"));
        assert_eq!(pod_path("c1", "eth0"), "/v1/pods/c1/eth0");
        assert_eq!(pod_path("../x", "e/0"), "/v1/pods/..%2Fx/e%2F0", "each stays one segment");
    }

    #[test]
    fn names_are_the_wire_words() {
        for m in [ModeName::Nat, ModeName::Fnat, ModeName::Dr, ModeName::Tun] {
            assert_eq!(serde_json::to_string(&m).unwrap(), format!("\"{}\"", m.name()));
        }
        for p in [SynProxyName::Off, SynProxyName::On, SynProxyName::Auto] {
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{}\"", p.name()));
        }
    }
}

/// Network policy as the controller compiles it (`POST /v1/policy`): changes to the node's
/// policy set, applied as one edit (all or none). The data plane sees no labels or selectors:
/// peers are identities (numbers the controller gives each distinct set of labels), and each
/// of this node's pods has what policies say about its two directions. docs/network-policy.md.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyChanges {
    /// Start from an empty set (the controller's first push, or a resync); then the rest.
    #[serde(default)]
    pub reset: bool,
    /// Addresses (the cluster's pods, on every node) and their identities, added or replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<PolicyIdentity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<String>)]
    pub identities_removed: Vec<IpAddr>,
    /// Prefixes (`ADDR/LEN`) and their identities, for addresses `identities` does not hold:
    /// the longest prefix holding an address gives its identity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<PolicyPrefix>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes_removed: Vec<String>,
    /// This node's pods under policy, added or replaced by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<PolicyEndpoint>,
    /// Names of endpoints that go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints_removed: Vec<String>,
}

/// The most policy names, identities, prefixes, endpoints, or rules, peers and ports together,
/// one policy set holds.
pub const MAX_POLICY_ITEMS: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyIdentity {
    #[schema(value_type = String)]
    pub addr: IpAddr,
    pub identity: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyPrefix {
    /// `ADDR/LEN`, no host bits set.
    pub prefix: String,
    pub identity: u32,
}

/// A pod of this node and what policies say about its traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyEndpoint {
    /// `namespace/name` (1..=253 bytes): what counters and the denied-flow log name it by.
    pub name: String,
    /// Its addresses (one or two: a family each).
    #[schema(value_type = Vec<String>)]
    pub addrs: Vec<IpAddr>,
    #[serde(default)]
    pub ingress: PolicyDirection,
    #[serde(default)]
    pub egress: PolicyDirection,
}

/// One direction of an endpoint, by tier: the admin policies in priority order (the first
/// rule that matches decides; `pass` hands over), then NetworkPolicy (an isolated endpoint
/// takes what an `allow` rule names and nothing else), then, for an endpoint no NetworkPolicy
/// isolates, the baseline (first match); then allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyDirection {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin: Vec<PolicyRule>,
    /// The NetworkPolicy that isolates the endpoint in this direction (what is denied is
    /// counted against it); none: not isolated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated_by: Option<String>,
    /// NetworkPolicy rules (action `allow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<PolicyRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline: Vec<PolicyRule>,
}

/// A rule: peers (none: every peer, outside the cluster included), ports (none: every
/// protocol and port), what it does, and the policy it comes from (`Kind/namespace/name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PolicyPorts>,
    /// `allow`, `deny` or `pass` (admin rules only).
    pub action: String,
    pub policy: String,
}

/// Ports `port..=end_port` (`end_port` absent: `port` alone) of `tcp`, `udp` or `sctp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyPorts {
    pub protocol: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<u16>,
}

/// The node's policy set and what it has denied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PolicyStatus {
    /// Grows with every edit applied (0: none yet).
    pub generation: u64,
    pub identities: usize,
    pub prefixes: usize,
    pub endpoints: usize,
    /// Endpoints with at least one direction under policy.
    pub enforced: usize,
    /// Flows remembered as allowed (live or not yet swept).
    pub flows: usize,
    /// Denied flows by policy (`Kind/namespace/name`), policies that denied nothing included.
    pub denied_by_policy: BTreeMap<String, u64>,
    /// Denied flows by endpoint: `[coming in, going out]`.
    pub denied_by_endpoint: BTreeMap<String, [u64; 2]>,
}

/// Denied flows logged since a sequence number (`GET /v1/policy/denied?after=SEQ`): the daemon
/// keeps the last 1,024, at most 100 a second.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PolicyDeniedLog {
    /// Oldest first.
    pub entries: Vec<PolicyDeniedFlow>,
    /// Ask again with `after` = this to follow (the last entry's sequence number, or `after`).
    pub next: u64,
    /// Denied flows the rate limit left out of the log since the daemon started (all are counted).
    pub suppressed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PolicyDeniedFlow {
    pub seq: u64,
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    #[schema(value_type = String)]
    pub src: IpAddr,
    #[schema(value_type = String)]
    pub dst: IpAddr,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6`, or the protocol number.
    pub protocol: String,
    /// The destination port (0: a protocol without ports).
    pub port: u16,
    /// `ingress` (the destination's policy denied it) or `egress` (the source's).
    pub direction: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// Meshed pods at most in `PUT /v1/mesh` (every node's).
pub const MAX_MESH_MEMBERS: usize = 1 << 20;

/// The mesh's steering on a node (`PUT /v1/mesh`, docs/mesh.md): TCP between meshed pods,
/// and to a meshed pod's tunnel port, goes to the node proxy's pod interface, unchanged.
/// Replaced whole by each PUT; not kept across daemon restarts (the controller sets it again).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshSteering {
    /// The node proxy's attachment on the pods port (as `POST /v1/pods` made it): it may send
    /// from any address (it answers for the pods it carries connections of).
    pub proxy_container_id: String,
    pub proxy_ifname: String,
    /// Every meshed pod's address, on this node and the others (at most `MAX_MESH_MEMBERS`).
    #[schema(value_type = Vec<String>)]
    pub members: Vec<IpAddr>,
    /// The port tunnels between node proxies arrive on (default 15008).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_port: Option<u16>,
}

/// The mesh's steering as the node runs it (`GET /v1/mesh`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshStatus {
    /// Whether anything is steered.
    pub enabled: bool,
    /// The proxy's attachment (`CONTAINER_ID/IFNAME`) and addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proxy_ips: Vec<String>,
    /// Meshed pods (distinct addresses).
    pub members: u64,
    pub tunnel_port: u16,
}
