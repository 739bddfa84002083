//! The service model and the immutable configuration snapshot the packet path reads.
//!
//! Operators describe the load balancer with an [`LbSpec`]. [`Control::apply`] validates it,
//! assigns stable ids (services, backends, local addresses keep their ids across changes, so
//! live sessions keep pointing at the right objects), compiles a [`Snapshot`] and publishes it
//! atomically. Workers pick the new snapshot up between batches: the per-packet path reads one
//! snapshot per batch and never takes a lock. A spec that fails validation changes nothing.

use crate::hash::{FxHashMap, FxHashSet};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vectorlb_packet::ethernet::Mac;
use vectorlb_packet::proto;
use vectorlb_sched::{Algorithm, Scheduler, Target};

/// Backend ids are a slot (low 24 bits) and a generation (high 8 bits): a slot freed by a
/// removed backend and reused by a new one gets a new generation, so stale sessions of the old
/// backend never reach the new one.
pub const BACKEND_SLOT_BITS: u32 = 24;
pub const MAX_SERVICES: usize = 0x7fff;
/// SNAT rule ids live in the service id space with this bit set.
pub const SNAT_ID_BIT: u16 = 0x8000;

#[inline(always)]
pub fn backend_slot(id: u32) -> u32 {
    id & ((1 << BACKEND_SLOT_BITS) - 1)
}

pub use crate::addr::{key, key4, key6};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Destination NAT: VIP:port to backend:port; replies must come back through the LB.
    Nat,
    /// Full NAT: the source becomes a local address and port too, so backends need no route
    /// back through the LB.
    Fnat,
    /// Direct routing: only the destination MAC changes; the backend holds the VIP.
    Dr,
    /// IP-in-IP (IPv4) or IPv6-in-IPv6 tunnel to the backend.
    Tun,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Nat => "nat",
            Mode::Fnat => "fnat",
            Mode::Dr => "dr",
            Mode::Tun => "tun",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "nat" => Mode::Nat,
            "fnat" => Mode::Fnat,
            "dr" => Mode::Dr,
            "tun" => Mode::Tun,
            _ => return None,
        })
    }
}

/// Session timeouts in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Handshake in progress (SYN seen, or SYN and SYN-ACK).
    pub syn: u32,
    pub established: u32,
    /// One side has sent FIN, or both have and the last ACK is awaited.
    pub fin: u32,
    /// After the last ACK. 0 removes the session at once (what seed 003's HDSLB does).
    pub time_wait: u32,
    /// After a RST.
    pub close: u32,
    pub udp: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { syn: 30_000, established: 900_000, fin: 30_000, time_wait: 2_000, close: 2_000, udp: 300_000 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    pub addr: IpAddr,
    /// 0: the client's destination port (for any-port services).
    pub port: u16,
    pub weight: u32,
    /// The server id this backend writes into its QUIC connection ids (services with `quic`;
    /// [`crate::quic`]).
    pub quic_id: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub vip: IpAddr,
    /// 0: every port of the VIP.
    pub port: u16,
    /// `proto::TCP` or `proto::UDP`.
    pub proto: u8,
    pub mode: Mode,
    pub scheduler: Algorithm,
    pub backends: Vec<BackendSpec>,
    /// Full-NAT source addresses; on a NAT service, the masquerade addresses of clients
    /// outside `keep_source`.
    pub local_addrs: Vec<IpAddr>,
    /// NAT services with `local_addrs`: the clients (prefixes of the VIP's family) that keep
    /// their address; any other client is translated to a local address, as full NAT would
    /// (kube-proxy's masquerade of traffic to a cluster IP from outside the cluster's pod
    /// networks: a node's own processes, whose replies would otherwise bypass this node).
    pub keep_source: Vec<(IpAddr, u8)>,
    /// The local addresses of this service on the other nodes of a sync group: never
    /// allocated here, but sessions synchronised from those nodes may hold them, and after a
    /// peer's loss the backends' replies to them arrive here (docs/scale-out.md).
    pub peer_local_addrs: Vec<IpAddr>,
    /// Insert the TOA option (client address) in full-NAT TCP handshakes.
    pub toa: bool,
    /// Answer SYNs with SYN cookies (TCP NAT and full-NAT services).
    pub synproxy: SynProxy,
    pub timeouts: Timeouts,
    /// Stateless continuation: a TCP segment other than a SYN that matches no session goes to
    /// the backend its flow's consistent hash gives (the one a SYN would have got on any node
    /// of the cluster) and opens a session there ([`ServiceSpec::continuation_default`]).
    pub continuation: bool,
    /// QUIC connection-id routing (UDP): a new flow whose packet carries a backend's server id
    /// goes to that backend, whatever its 5-tuple ([`crate::quic`]).
    pub quic: bool,
    /// Client affinity ([`crate::affinity`]): milliseconds a client keeps its backend after its
    /// last new flow; 0 for none.
    pub affinity_ms: u32,
}

impl ServiceSpec {
    /// Why continuation cannot work on a TCP service of this mode, scheduler and SYN proxy, if
    /// it cannot. Full NAT's sessions carry a local port the backend knows, which another node
    /// cannot invent (its sessions are synchronised instead); the SYN proxy's translate
    /// sequence numbers only the node that answered the handshake knows, and it exists to drop
    /// ACKs without a session; rr, wrr and wlc pick differently on every node.
    pub fn continuation_refused(mode: Mode, scheduler: Algorithm, synproxy: SynProxy) -> Option<String> {
        if mode == Mode::Fnat {
            Some("not with fnat (a full-NAT session's local port cannot be invented by another node; its sessions are synchronised instead)".into())
        } else if synproxy != SynProxy::Off {
            Some("not with the SYN proxy (its sessions translate sequence numbers only the node that answered knows)".into())
        } else if !scheduler.consistent() {
            Some(format!("the {} scheduler picks differently on every node; use maglev or sh", scheduler.name()))
        } else {
            None
        }
    }

    /// Continuation's default: on where it can work, TCP services that
    /// [`ServiceSpec::continuation_refused`] does not refuse (nat, dr and tun with maglev or sh
    /// and no SYN proxy).
    pub fn continuation_default(protocol: u8, mode: Mode, scheduler: Algorithm, synproxy: SynProxy) -> bool {
        protocol == proto::TCP && Self::continuation_refused(mode, scheduler, synproxy).is_none()
    }
}

/// When a service's SYNs are answered by the SYN proxy rather than forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SynProxy {
    #[default]
    Off,
    On,
    /// While the core holds at least this many half-open sessions.
    Auto {
        half_open: u32,
    },
}

impl SynProxy {
    /// What `auto` engages at unless configured.
    pub const DEFAULT_AUTO_HALF_OPEN: u32 = 1024;

    /// From the configuration's words: `off`, `on`, `auto` (engaging at `half_open`, or the
    /// default).
    pub fn parse(s: &str, half_open: Option<u32>) -> Option<SynProxy> {
        match s {
            "off" => Some(SynProxy::Off),
            "on" => Some(SynProxy::On),
            "auto" => Some(SynProxy::Auto { half_open: half_open.unwrap_or(Self::DEFAULT_AUTO_HALF_OPEN) }),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynProxy::Off => "off",
            SynProxy::On => "on",
            SynProxy::Auto { .. } => "auto",
        }
    }

    /// The `auto` threshold, when it is one.
    pub fn half_open(self) -> Option<u32> {
        match self {
            SynProxy::Auto { half_open } => Some(half_open),
            _ => None,
        }
    }
}

/// Source NAT for connections backends open to the outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnatSpec {
    pub source: IpAddr,
    pub prefix_len: u8,
    pub addrs: Vec<IpAddr>,
    pub timeouts: Timeouts,
    /// Destinations (prefixes of the source's family) whose traffic keeps its source: a
    /// cluster's own networks, when the rule masquerades only what leaves it.
    pub except: Vec<(IpAddr, u8)>,
    /// Only what the inside opens is translated, as conntrack's masquerade does: a TCP
    /// segment of a connection opened from outside passes as it is (instead of being dropped
    /// for want of a session), and a UDP flow from outside to an inside address and port marks
    /// it, so that the inside's replies keep their address.
    pub outbound_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    pub name: String,
    pub mac: Mac,
    /// Interface addresses with their prefix lengths (each gives a connected route).
    pub addrs: Vec<(IpAddr, u8)>,
    pub vlan: Option<u16>,
    pub mtu: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub prefix: IpAddr,
    pub len: u8,
    pub port: u16,
    /// The gateway; the unspecified address of the family makes it an unreachable route
    /// (what matches it is answered with an ICMP unreachable, never forwarded).
    pub via: IpAddr,
}

/// Why `a` cannot be a VIP, a local address or a backend; `None` for a unicast address.
pub fn not_unicast(a: IpAddr) -> Option<&'static str> {
    match a {
        IpAddr::V4(v) if v.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(v) if v.is_broadcast() => Some("the broadcast address"),
        IpAddr::V4(v) if v.is_multicast() => Some("a multicast address"),
        IpAddr::V4(v) if v.is_loopback() => Some("a loopback address"),
        IpAddr::V6(v) if v.is_unspecified() => Some("the unspecified address"),
        IpAddr::V6(v) if v.is_multicast() => Some("a multicast address"),
        IpAddr::V6(v) if v.is_loopback() => Some("the loopback address"),
        IpAddr::V6(v) if v.to_ipv4_mapped().is_some() => Some("an IPv4-mapped IPv6 address (write the IPv4 address)"),
        _ => None,
    }
}

/// Whether a MAC address is a group (multicast or broadcast) address, which no neighbour has.
pub fn is_group_mac(m: &Mac) -> bool {
    m[0] & 1 != 0
}

/// The two-arm topology that the tests, the benchmarks and the documentation's examples share:
/// clients behind a router on port 0 (`ext`), backends on port 1 (`int`).
///
/// ```text
/// router 10.0.0.254 / 2001:db8::fe (02:00:00:00:00:fe)
/// [port 0 "ext" 02:00:00:00:00:01  10.0.0.1/24  2001:db8::1/64]  default routes via the router
/// [port 1 "int" 02:00:00:00:01:01  10.1.0.1/<int_len>  2001:db8:1::1/64]
/// ```
pub mod two_arm {
    use super::{LbSpec, PortSpec, RouteSpec};
    use std::net::IpAddr;
    use vectorlb_packet::ethernet::Mac;

    pub const ROUTER_MAC: Mac = [2, 0, 0, 0, 0, 0xfe];
    pub const EXT_MAC: Mac = [2, 0, 0, 0, 0, 1];
    pub const INT_MAC: Mac = [2, 0, 0, 0, 1, 1];

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("a literal address")
    }

    /// The ports, the default routes and the router as a neighbour; no services yet. The
    /// backends' network is 10.1.0.0/`int_len`.
    pub fn spec(int_len: u8) -> LbSpec {
        let port = |name: &str, mac, v4: &str, len, v6: &str| PortSpec { name: name.into(), mac, addrs: vec![(ip(v4), len), (ip(v6), 64)], vlan: None, mtu: 1500 };
        LbSpec {
            ports: vec![port("ext", EXT_MAC, "10.0.0.1", 24, "2001:db8::1"), port("int", INT_MAC, "10.1.0.1", int_len, "2001:db8:1::1")],
            routes: vec![RouteSpec { prefix: ip("0.0.0.0"), len: 0, port: 0, via: ip("10.0.0.254") }, RouteSpec { prefix: ip("::"), len: 0, port: 0, via: ip("2001:db8::fe") }],
            neighbors: vec![(ip("10.0.0.254"), ROUTER_MAC), (ip("2001:db8::fe"), ROUTER_MAC)],
            services: vec![],
            snat: vec![],
            icmp_rate: 1000,
            cluster_key: 0,
            host_addrs: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LbSpec {
    pub ports: Vec<PortSpec>,
    pub routes: Vec<RouteSpec>,
    pub neighbors: Vec<(IpAddr, Mac)>,
    pub services: Vec<ServiceSpec>,
    pub snat: Vec<SnatSpec>,
    /// ICMP errors the LB may originate per second per core (TTL exceeded, too big).
    pub icmp_rate: u32,
    /// Keys the flow hashes and the Maglev tables ([`crate::hash::cluster_key`] of
    /// `global.cluster_key`; 0 without one): nodes with the same configuration pick the same
    /// backend for a flow.
    pub cluster_key: u64,
    /// The host's own addresses that VIPs may share (a node's addresses with NodePorts): a
    /// port of one that no service has goes to the host (whose sockets may listen there)
    /// instead of being dropped as a VIP's unserved port.
    pub host_addrs: Vec<IpAddr>,
}

/// Why a service model cannot be built. Messages name the port, route, service or SNAT rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A limit of the model (services, backends, local addresses).
    #[error("{0}")]
    Limit(String),
    /// Something that does not apply; `what` names it (`service tcp 10.0.0.100:80`, ...).
    #[error("{what}: {problem}")]
    Invalid { what: String, problem: String },
    /// The scheduler refused its backends (a Maglev table too small, not prime, ...).
    #[error("{service}: {source}")]
    Scheduler { service: String, source: vectorlb_sched::SchedError },
}

impl ConfigError {
    fn from_message(m: String) -> ConfigError {
        match m.split_once(": ") {
            Some((what, problem)) => ConfigError::Invalid { what: what.to_string(), problem: problem.to_string() },
            None => ConfigError::Limit(m),
        }
    }
}

macro_rules! bail {
    ($($t:tt)*) => { return Err(ConfigError::from_message(format!($($t)*))) };
}

/// Where a packet leaves: port, addresses to write in the Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    pub port: u16,
    /// Destination then source MAC, as an Ethernet header starts.
    pub macs: [u8; 12],
    pub vlan: Option<u16>,
    pub mtu: u16,
}

impl Hop {
    pub fn new(port: u16, dst_mac: Mac, src_mac: Mac, vlan: Option<u16>, mtu: u16) -> Hop {
        let mut macs = [0u8; 12];
        macs[..6].copy_from_slice(&dst_mac);
        macs[6..].copy_from_slice(&src_mac);
        Hop { port, macs, vlan, mtu }
    }

    pub fn dst_mac(&self) -> Mac {
        self.macs[..6].try_into().unwrap()
    }

    pub fn src_mac(&self) -> Mac {
        self.macs[6..].try_into().unwrap()
    }
}

#[derive(Debug, Clone)]
pub struct Port {
    pub spec: PortSpec,
    pub v4: Option<[u8; 4]>,
    pub v6: Option<[u8; 16]>,
}

#[derive(Debug, Clone)]
struct Route {
    net: u128,
    mask: u128,
    v4: bool,
    port: u16,
    via: Option<u128>,
    /// An unreachable route ([`RouteSpec::via`] unspecified).
    reject: bool,
}

#[derive(Debug, Clone)]
pub struct Service {
    pub id: u16,
    pub spec: ServiceSpec,
    pub vip_key: u128,
    pub vip_bytes: [u8; 16],
    /// Shared with the snapshots before this one while the service's algorithm and backends
    /// stay the same: a Maglev table is built once, not at every change of another service.
    pub sched: Arc<Scheduler>,
    /// The cluster key the flow hashes are keyed with.
    pub hash_key: u64,
    /// Backend ids, in spec order (the scheduler's indices).
    pub backends: Vec<u32>,
    pub laddrs: Vec<u16>,
    /// `keep_source` as (network, mask) keys.
    pub keep: Vec<(u128, u128)>,
    /// QUIC server id -> index in `backends` (services with `quic`).
    pub quic_ids: FxHashMap<u32, u32>,
    /// Client affinity entries, kept across snapshots while the service keeps the same
    /// timeout (services with `affinity_ms`).
    pub affinity: Option<Arc<crate::affinity::Affinity>>,
}

#[derive(Debug, Clone)]
pub struct Backend {
    pub id: u32,
    pub svc: u16,
    pub addr: IpAddr,
    /// The address's bytes (IPv4 in the first four), for the packet path.
    pub bytes: [u8; 16],
    pub key: u128,
    pub port: u16,
    pub weight: u32,
    /// How to reach it; `None` when its next hop has no known MAC.
    pub hop: Option<Hop>,
    /// Tunnel source (the egress port's address) for TUN mode.
    pub tun_src: Option<IpAddr>,
}

#[derive(Debug, Clone)]
pub struct SnatRule {
    pub id: u16,
    pub net: u128,
    pub mask: u128,
    pub v4: bool,
    pub laddrs: Vec<u16>,
    pub timeouts: Timeouts,
    /// `except` as (network, mask) keys.
    pub except: Vec<(u128, u128)>,
    pub outbound_only: bool,
}

/// What the LB knows of one of its own addresses.
#[derive(Debug, Clone, Default)]
pub struct Dst {
    pub vip: bool,
    pub laddr: Option<u16>,
    /// A peer's local address (`peer_local_addrs`): reached by routing, never answered for by
    /// ARP or neighbour discovery.
    pub peer: bool,
    /// Also the host's ([`LbSpec::host_addrs`]): its unserved ports go to the host.
    pub host: bool,
    /// (port, protocol, service id): exact ports first, then any-port services (port 0).
    services: Vec<(u16, u8, u16)>,
}

impl Service {
    /// Whether a new session of `client` takes a local address: always on full NAT; on NAT
    /// with local addresses, for a client outside `keep_source` (masquerade).
    #[inline]
    pub fn translates_client(&self, client: u128) -> bool {
        match self.spec.mode {
            Mode::Fnat => true,
            Mode::Nat => !self.laddrs.is_empty() && !self.keep.iter().any(|&(net, mask)| client & mask == net),
            _ => false,
        }
    }
}

impl Dst {
    #[inline(always)]
    pub fn service(&self, port: u16, proto: u8) -> Option<u16> {
        self.services.iter().find(|s| (s.0 == port || s.0 == 0) && s.1 == proto).map(|s| s.2)
    }
}

/// The last destination a batch looked up and the last (port, protocol) looked up in it: most
/// packets of a batch go to the same few services. Lives for one batch, so one snapshot.
/// Lookups that miss run out of line, so that a hit costs two compares.
pub struct DstMemo<'a> {
    /// The address key, and whether it is the LB's; `key` starts at a value no address has.
    key: u128,
    dst: Option<&'a Dst>,
    /// `port << 8 | protocol` of the service lookup (`u32::MAX`: none yet), and its answer.
    pp: u32,
    svc: Option<u16>,
}

impl Default for DstMemo<'_> {
    fn default() -> Self {
        // `!0` is the key of ffff:...:ffff, a multicast address, which no port address, VIP or
        // local address can be (configuration refuses them): it starts out matching nothing.
        DstMemo { key: !0, dst: None, pp: u32::MAX, svc: None }
    }
}

impl<'a> DstMemo<'a> {
    /// [`Dst::service`] of the destination [`Snapshot::dst_memo`] returned last, `own`.
    #[inline(always)]
    pub fn service(&mut self, own: &Dst, port: u16, proto: u8) -> Option<u16> {
        let pp = (port as u32) << 8 | proto as u32;
        if pp == self.pp {
            return self.svc;
        }
        self.service_miss(own, pp)
    }

    #[cold]
    #[inline(never)]
    fn service_miss(&mut self, own: &Dst, pp: u32) -> Option<u16> {
        self.pp = pp;
        self.svc = own.service((pp >> 8) as u16, pp as u8);
        self.svc
    }
}

/// An immutable, compiled configuration.
pub struct Snapshot {
    pub generation: u64,
    pub spec: LbSpec,
    services: Vec<Option<Service>>,
    /// Every address the LB owns: interface addresses, VIPs, local addresses. One lookup per
    /// packet answers "is it ours, which service, which local address".
    dsts: FxHashMap<u128, Dst>,
    backends: Vec<Option<Backend>>,
    nat_replies: FxHashMap<(u128, u16, u8), Vec<u32>>,
    laddrs: Vec<Option<(IpAddr, [u8; 16])>>,
    /// Local address ids that are peers' (`peer_local_addrs`).
    peer_laddrs: FxHashSet<u16>,
    pub snat: Vec<SnatRule>,
    pub ports: Vec<Port>,
    routes: Vec<Route>,
    neighbors: FxHashMap<u128, Mac>,
}

fn prefix_mask(v4: bool, len: u8) -> u128 {
    let bits = if v4 { 96 + len as u32 } else { len as u32 };
    if bits == 0 {
        0
    } else {
        u128::MAX << (128 - bits)
    }
}

impl Snapshot {
    #[inline(always)]
    pub fn service(&self, id: u16) -> Option<&Service> {
        self.services.get(id as usize)?.as_ref()
    }

    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.iter().flatten()
    }

    /// The LB's own address entry, if `a` is one.
    #[inline(always)]
    pub fn dst(&self, a: u128) -> Option<&Dst> {
        self.dsts.get(&a)
    }

    /// Like [`Snapshot::dst`], remembering the last address looked up in `memo` (most packets
    /// of a batch go to the same few VIPs).
    #[inline(always)]
    pub fn dst_memo<'a>(&'a self, a: u128, memo: &mut DstMemo<'a>) -> Option<&'a Dst> {
        if a == memo.key {
            return memo.dst;
        }
        self.dst_miss(a, memo)
    }

    #[cold]
    #[inline(never)]
    fn dst_miss<'a>(&'a self, a: u128, memo: &mut DstMemo<'a>) -> Option<&'a Dst> {
        *memo = DstMemo { key: a, dst: self.dsts.get(&a), ..DstMemo::default() };
        memo.dst
    }

    /// The service for a destination: exact port first, then an any-port service.
    #[inline(always)]
    pub fn lookup_service(&self, dst: u128, port: u16, proto: u8) -> Option<u16> {
        self.dst(dst)?.service(port, proto)
    }

    /// The backend for an id, if it still exists with that generation.
    #[inline(always)]
    pub fn backend(&self, id: u32) -> Option<&Backend> {
        match self.backends.get(backend_slot(id) as usize) {
            Some(Some(b)) if b.id == id => Some(b),
            _ => None,
        }
    }

    pub fn backends(&self) -> impl Iterator<Item = &Backend> {
        self.backends.iter().flatten()
    }

    /// NAT backends with this address and port (replies from them are translated back).
    #[inline(always)]
    pub fn nat_backends(&self, src: u128, port: u16, proto: u8) -> Option<&[u32]> {
        if self.nat_replies.is_empty() {
            return None;
        }
        self.nat_replies.get(&(src, port, proto)).or_else(|| self.nat_replies.get(&(src, 0, proto))).map(|v| &v[..])
    }

    #[inline(always)]
    /// The address of local address `id`, as a key.
    pub fn laddr_key(&self, id: u16) -> Option<u128> {
        self.laddrs.get(id as usize)?.as_ref().map(|(a, _)| key(*a))
    }

    pub fn laddr(&self, a: u128) -> Option<u16> {
        self.dst(a)?.laddr
    }

    pub fn laddr_addr(&self, idx: u16) -> Option<IpAddr> {
        self.laddrs.get(idx as usize)?.map(|l| l.0)
    }

    /// Whether local address `idx` is another node's (`peer_local_addrs`).
    #[inline]
    pub fn is_peer_laddr(&self, idx: u16) -> bool {
        self.peer_laddrs.contains(&idx)
    }

    /// A local address's bytes (IPv4 in the first four).
    #[inline(always)]
    pub fn laddr_bytes(&self, idx: u16) -> Option<&[u8; 16]> {
        self.laddrs.get(idx as usize)?.as_ref().map(|l| &l.1)
    }

    /// One past the largest service id and backend slot (for sizing per-core counters).
    pub fn id_bounds(&self) -> (usize, usize) {
        (self.services.len(), self.backends.len())
    }

    /// Whether the LB owns this address (interface, VIP or local address).
    #[inline(always)]
    pub fn is_own(&self, a: u128) -> bool {
        self.dsts.contains_key(&a)
    }

    /// Whether some service listens on this address.
    #[inline(always)]
    pub fn is_vip(&self, a: u128) -> bool {
        self.dst(a).is_some_and(|d| d.vip)
    }

    /// The SNAT rule for a packet from `src` to `dst`, if one applies.
    #[inline]
    pub fn snat_rule(&self, src: u128, dst: u128, v4: bool) -> Option<&SnatRule> {
        self.snat.iter().find(|r| r.v4 == v4 && src & r.mask == r.net && !r.except.iter().any(|&(net, mask)| dst & mask == net))
    }

    /// The `outbound_only` SNAT rule whose inside a packet from the outside (`src`) to `dst`
    /// enters, if one does.
    #[inline]
    pub fn snat_inbound(&self, src: u128, dst: u128, v4: bool) -> Option<&SnatRule> {
        self.snat.iter().find(|r| r.outbound_only && r.v4 == v4 && dst & r.mask == r.net && src & r.mask != r.net && !r.except.iter().any(|&(net, mask)| src & mask == net))
    }

    pub fn snat_by_id(&self, id: u16) -> Option<&SnatRule> {
        self.snat.iter().find(|r| r.id == id)
    }

    /// Next hop toward `dst`: longest-prefix route, then the neighbour's MAC (none through an
    /// unreachable route).
    pub fn route(&self, dst: u128, v4: bool) -> Option<Hop> {
        let r = self.routes.iter().find(|r| r.v4 == v4 && dst & r.mask == r.net).filter(|r| !r.reject)?;
        let nh = r.via.unwrap_or(dst);
        let mac = *self.neighbors.get(&nh)?;
        let p = &self.ports[r.port as usize];
        Some(Hop::new(r.port, mac, p.spec.mac, p.spec.vlan, p.spec.mtu))
    }

    /// The next hop toward `dst` (the gateway, or `dst` itself on a connected network) and its
    /// port, whether or not its MAC is known.
    pub fn next_hop(&self, dst: u128, v4: bool) -> Option<(u128, u16)> {
        let r = self.routes.iter().find(|r| r.v4 == v4 && dst & r.mask == r.net).filter(|r| !r.reject)?;
        Some((r.via.unwrap_or(dst), r.port))
    }

    /// Whether the route toward `dst` is an unreachable route.
    pub fn unreachable(&self, dst: u128, v4: bool) -> bool {
        self.routes.iter().find(|r| r.v4 == v4 && dst & r.mask == r.net).is_some_and(|r| r.reject)
    }

    /// The port of the route toward `dst`, whether or not its next hop is resolved.
    pub fn route_port(&self, dst: u128, v4: bool) -> Option<u16> {
        self.routes.iter().find(|r| r.v4 == v4 && dst & r.mask == r.net).filter(|r| !r.reject).map(|r| r.port)
    }

    /// Whether `dst` is on a connected network (no gateway).
    pub fn on_link(&self, dst: u128, v4: bool) -> bool {
        self.routes.iter().find(|r| r.v4 == v4 && dst & r.mask == r.net).is_some_and(|r| r.via.is_none() && !r.reject)
    }

    /// The egress port's own address of a family (source of ICMP errors and tunnels).
    pub fn port_addr(&self, port: u16, v4: bool) -> Option<IpAddr> {
        let p = self.ports.get(port as usize)?;
        if v4 {
            p.v4.map(IpAddr::from)
        } else {
            p.v6.map(IpAddr::from)
        }
    }
}

/// Ids that stay stable across snapshots.
#[derive(Default)]
struct Registry {
    services: HashMap<(u128, u16, u8), u16>,
    free_services: Vec<u16>,
    backends: HashMap<(u16, u128, u16), u32>,
    slot_gen: Vec<u8>,
    free_slots: Vec<u32>,
    laddrs: HashMap<u128, u16>,
    /// Each service's scheduler with what it was built from.
    scheds: HashMap<(u128, u16, u8), SchedEntry>,
    /// Each affinity service's entries.
    affinities: HashMap<(u128, u16, u8), Arc<crate::affinity::Affinity>>,
}

type SchedEntry = (Algorithm, Vec<Target>, Arc<Scheduler>);

impl Registry {
    /// The scheduler for service `k`: the one built before if its algorithm and targets are
    /// the same, else a new one.
    fn scheduler(&mut self, k: (u128, u16, u8), alg: Algorithm, targets: Vec<Target>) -> Result<Arc<Scheduler>, vectorlb_sched::SchedError> {
        if let Some((a, t, s)) = self.scheds.get(&k) {
            if *a == alg && *t == targets {
                return Ok(s.clone());
            }
        }
        let s = Arc::new(Scheduler::new(alg, &targets)?);
        self.scheds.insert(k, (alg, targets, s.clone()));
        Ok(s)
    }

    fn service_id(&mut self, k: (u128, u16, u8)) -> Result<u16, ConfigError> {
        if let Some(&id) = self.services.get(&k) {
            return Ok(id);
        }
        let id = match self.free_services.pop() {
            Some(id) => id,
            None if self.services.len() < MAX_SERVICES => self.services.len() as u16,
            None => bail!("too many services (limit {MAX_SERVICES})"),
        };
        self.services.insert(k, id);
        Ok(id)
    }

    fn backend_id(&mut self, k: (u16, u128, u16)) -> Result<u32, ConfigError> {
        if let Some(&id) = self.backends.get(&k) {
            return Ok(id);
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None if self.slot_gen.len() < (1 << BACKEND_SLOT_BITS) => {
                self.slot_gen.push(0);
                (self.slot_gen.len() - 1) as u32
            }
            None => bail!("too many backends"),
        };
        let id = slot | (self.slot_gen[slot as usize] as u32) << BACKEND_SLOT_BITS;
        self.backends.insert(k, id);
        Ok(id)
    }

    fn laddr_id(&mut self, a: u128) -> Result<u16, ConfigError> {
        if let Some(&id) = self.laddrs.get(&a) {
            return Ok(id);
        }
        if self.laddrs.len() >= u16::MAX as usize - 1 {
            bail!("too many local addresses");
        }
        let id = self.laddrs.len() as u16;
        self.laddrs.insert(a, id);
        Ok(id)
    }

    /// Forgets services and backends that are not in use any more. Local address ids are kept
    /// for the process lifetime: port maps are indexed by them.
    fn retain(&mut self, svcs: &FxHashSet<(u128, u16, u8)>, backends: &FxHashSet<(u16, u128, u16)>) {
        self.scheds.retain(|k, _| svcs.contains(k));
        self.affinities.retain(|k, _| svcs.contains(k));
        let gone: Vec<_> = self.services.keys().filter(|k| !svcs.contains(k)).copied().collect();
        for k in gone {
            let id = self.services.remove(&k).unwrap();
            self.free_services.push(id);
        }
        let gone: Vec<_> = self.backends.keys().filter(|k| !backends.contains(k)).copied().collect();
        for k in gone {
            let id = self.backends.remove(&k).unwrap();
            let slot = backend_slot(id);
            self.slot_gen[slot as usize] = self.slot_gen[slot as usize].wrapping_add(1);
            self.free_slots.push(slot);
        }
    }
}

/// An address's bytes in a 16-byte array (IPv4 in the first four).
pub fn bytes16(a: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(x) => b[..4].copy_from_slice(&x.octets()),
        IpAddr::V6(x) => b = x.octets(),
    }
    b
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

fn build(spec: &LbSpec, reg: &mut Registry, generation: u64) -> Result<Snapshot, ConfigError> {
    let mut ports = Vec::new();
    let mut routes = Vec::new();
    let mut dsts: FxHashMap<u128, Dst> = FxHashMap::default();
    for (i, p) in spec.ports.iter().enumerate() {
        if p.mtu < 576 {
            bail!("port {}: mtu {} is below 576", p.name, p.mtu);
        }
        if let Some(v) = p.vlan {
            if v == 0 || v > 4094 {
                bail!("port {}: vlan {v} is out of range 1..=4094", p.name);
            }
        }
        let mut v4 = None;
        let mut v6 = None;
        for &(a, len) in &p.addrs {
            let max = if a.is_ipv4() { 32 } else { 128 };
            if len > max {
                bail!("port {}: prefix length /{len} is too long for {a}", p.name);
            }
            // (Loopback addresses serve tests on `lo`.)
            if let Some(why) = not_unicast(a).filter(|_| !a.is_loopback()) {
                bail!("port {}: address {a} is {why}", p.name);
            }
            match a {
                IpAddr::V4(x) => v4 = v4.or(Some(x.octets())),
                IpAddr::V6(x) => v6 = v6.or(Some(x.octets())),
            }
            dsts.entry(key(a)).or_default();
            let mask = prefix_mask(a.is_ipv4(), len);
            routes.push((len, Route { net: key(a) & mask, mask, v4: a.is_ipv4(), port: i as u16, via: None, reject: false }));
        }
        ports.push(Port { spec: p.clone(), v4, v6 });
    }
    for r in &spec.routes {
        if r.port as usize >= ports.len() {
            bail!("route {}/{}: port {} does not exist", r.prefix, r.len, r.port);
        }
        if !same_family(r.prefix, r.via) {
            bail!("route {}/{}: gateway {} is of another family", r.prefix, r.len, r.via);
        }
        let max = if r.prefix.is_ipv4() { 32 } else { 128 };
        if r.len > max {
            bail!("route {}/{}: prefix length is too long", r.prefix, r.len);
        }
        let mask = prefix_mask(r.prefix.is_ipv4(), r.len);
        let reject = r.via.is_unspecified();
        routes.push((r.len, Route { net: key(r.prefix) & mask, mask, v4: r.prefix.is_ipv4(), port: r.port, via: (!reject).then(|| key(r.via)), reject }));
    }
    // Longest prefix first; connected routes before gateways of the same length.
    routes.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.via.is_some().cmp(&b.1.via.is_some())));
    for (ip, mac) in &spec.neighbors {
        if is_group_mac(mac) {
            bail!("neighbor {ip}: {} is a group (multicast or broadcast) address, not a host's", vectorlb_packet::ethernet::format_mac(mac));
        }
    }
    let neighbors: FxHashMap<u128, Mac> = spec.neighbors.iter().map(|(ip, mac)| (key(*ip), *mac)).collect();
    // What no backend can be: a local address (its replies are the load balancer's), or a
    // VIP's port that a service has (the load balancer would forward to itself, round and
    // round). Another port of a VIP can: a node's address with NodePorts is also where
    // hostNetwork endpoints listen.
    let laddrs_all: FxHashSet<u128> = spec.services.iter().flat_map(|s| s.local_addrs.iter().chain(s.peer_local_addrs.iter())).map(|a| key(*a)).collect();
    let vip_ports: FxHashSet<(u128, u16, u8)> = spec.services.iter().map(|s| (key(s.vip), s.port, s.proto)).collect();
    let vips: FxHashSet<u128> = spec.services.iter().map(|s| key(s.vip)).collect();
    let served = |a: IpAddr, port: u16, proto: u8| {
        let k = key(a);
        laddrs_all.contains(&k) || (vips.contains(&k) && (port == 0 || vip_ports.contains(&(k, port, proto)) || vip_ports.contains(&(k, 0, proto))))
    };

    let mut snap = Snapshot {
        generation,
        spec: spec.clone(),
        services: Vec::new(),
        dsts,
        backends: Vec::new(),
        nat_replies: FxHashMap::default(),
        laddrs: Vec::new(),
        peer_laddrs: FxHashSet::default(),
        snat: Vec::new(),
        ports,
        routes: routes.into_iter().map(|(_, r)| r).collect(),
        neighbors,
    };

    let mut used_svcs = FxHashSet::default();
    let mut used_backends = FxHashSet::default();
    let add_laddr = |snap: &mut Snapshot, reg: &mut Registry, a: IpAddr| -> Result<u16, ConfigError> {
        let id = reg.laddr_id(key(a))?;
        let d = snap.dsts.entry(key(a)).or_default();
        if d.vip {
            bail!("local address {a}: it is also a VIP");
        }
        d.laddr = Some(id);
        if snap.laddrs.len() <= id as usize {
            snap.laddrs.resize(id as usize + 1, None);
        }
        snap.laddrs[id as usize] = Some((a, bytes16(a)));
        Ok(id)
    };

    for s in &spec.services {
        let name = format!("service {} {}:{}", if s.proto == proto::TCP { "tcp" } else { "udp" }, s.vip, s.port);
        if s.proto != proto::TCP && s.proto != proto::UDP {
            bail!("{name}: protocol {} is not supported (tcp or udp)", s.proto);
        }
        let k = (key(s.vip), s.port, s.proto);
        if !used_svcs.insert(k) {
            bail!("{name}: defined twice");
        }
        if let Some(why) = not_unicast(s.vip) {
            bail!("{name}: the VIP is {why}");
        }
        if s.mode == Mode::Fnat && s.local_addrs.is_empty() {
            bail!("{name}: fnat needs at least one local address");
        }
        if !matches!(s.mode, Mode::Fnat | Mode::Nat) && !s.local_addrs.is_empty() {
            bail!("{name}: local addresses: only fnat and nat services use them");
        }
        if !s.keep_source.is_empty() && (s.mode != Mode::Nat || s.local_addrs.is_empty()) {
            bail!("{name}: keep_source: only nat services with local addresses (the others' clients all keep their address, or none does)");
        }
        for &(a, len) in &s.keep_source {
            if !same_family(a, s.vip) {
                bail!("{name}: keep_source {a}/{len} is not of the VIP's family");
            }
            if len > if a.is_ipv4() { 32 } else { 128 } {
                bail!("{name}: keep_source {a}/{len}: the prefix length is too long");
            }
        }
        if s.synproxy != SynProxy::Off && (s.proto != proto::TCP || !matches!(s.mode, Mode::Nat | Mode::Fnat)) {
            bail!("{name}: synproxy: only tcp nat and fnat services (the proxy must see both directions)");
        }
        if s.synproxy == (SynProxy::Auto { half_open: 0 }) {
            bail!("{name}: synproxy half_open threshold must be at least 1");
        }
        if s.continuation && s.proto == proto::TCP {
            if let Some(why) = ServiceSpec::continuation_refused(s.mode, s.scheduler, s.synproxy) {
                bail!("{name}: continuation: {why}");
            }
        }
        let mut laddrs_seen = FxHashSet::default();
        for &l in &s.local_addrs {
            if !same_family(l, s.vip) {
                bail!("{name}: local address {l} is not of the VIP's family");
            }
            if let Some(why) = not_unicast(l) {
                bail!("{name}: local address {l} is {why}");
            }
            if !laddrs_seen.insert(l) {
                bail!("{name}: local address {l} is listed twice");
            }
        }
        if s.mode != Mode::Fnat && !s.peer_local_addrs.is_empty() {
            bail!("{name}: peer local addresses: only fnat services use local addresses");
        }
        for &l in &s.peer_local_addrs {
            if !same_family(l, s.vip) {
                bail!("{name}: peer local address {l} is not of the VIP's family");
            }
            if let Some(why) = not_unicast(l) {
                bail!("{name}: peer local address {l} is {why}");
            }
            if !laddrs_seen.insert(l) {
                bail!("{name}: peer local address {l} is listed twice, or is also a local address of this node");
            }
        }
        let id = reg.service_id(k)?;
        let mut targets = Vec::new();
        let mut ids = Vec::new();
        let mut seen = FxHashSet::default();
        for b in &s.backends {
            // Only a tunnel can carry a packet to a backend of the other family.
            if !same_family(b.addr, s.vip) && s.mode != Mode::Tun {
                bail!("{name}: backend {} is not of the VIP's family (only tun services may mix families: IPv4-in-IPv6 and the reverse)", b.addr);
            }
            if b.weight > 65535 {
                bail!("{name}: backend {} weight {} is above 65535", b.addr, b.weight);
            }
            if s.port == 0 && b.port != 0 {
                bail!("{name}: an any-port service forwards to the same port; backend {} must have port 0", b.addr);
            }
            if matches!(s.mode, Mode::Dr | Mode::Tun) && b.port != 0 && b.port != s.port {
                bail!("{name}: {} does not translate ports; backend {} must have port 0 or {}", s.mode.name(), b.addr, s.port);
            }
            if !seen.insert((key(b.addr), b.port)) {
                bail!("{name}: backend {}:{} listed twice", b.addr, b.port);
            }
            if let Some(why) = not_unicast(b.addr) {
                bail!("{name}: backend {} is {why}", b.addr);
            }
            if served(b.addr, if b.port == 0 { s.port } else { b.port }, s.proto) {
                bail!("{name}: backend {} is a local address of this load balancer, or a VIP with a service on that port", b.addr);
            }
            if matches!(s.mode, Mode::Dr) && !snap.on_link(key(b.addr), b.addr.is_ipv4()) {
                bail!("{name}: dr backend {} is not on a connected network of any port", b.addr);
            }
            let bk = (id, key(b.addr), b.port);
            used_backends.insert(bk);
            let bid = reg.backend_id(bk)?;
            let hop = snap.route(key(b.addr), b.addr.is_ipv4());
            let tun_src = hop.and_then(|h| snap.port_addr(h.port, b.addr.is_ipv4()));
            if s.mode == Mode::Tun && hop.is_some() && tun_src.is_none() {
                bail!("{name}: tun backend {}: its egress port has no address of its family", b.addr);
            }
            let slot = backend_slot(bid) as usize;
            if snap.backends.len() <= slot {
                snap.backends.resize(slot + 1, None);
            }
            snap.backends[slot] = Some(Backend { id: bid, svc: id, addr: b.addr, bytes: bytes16(b.addr), key: key(b.addr), port: b.port, weight: b.weight, hop, tun_src });
            if s.mode == Mode::Nat {
                let port = if b.port == 0 { 0 } else { b.port };
                snap.nat_replies.entry((key(b.addr), port, s.proto)).or_default().push(bid);
            }
            ids.push(bid);
            targets.push(Target { weight: b.weight, key: crate::hash::mix64(spec.cluster_key ^ key(b.addr) as u64 ^ ((key(b.addr) >> 64) as u64) ^ b.port as u64) });
        }
        let sched = reg.scheduler(k, s.scheduler, targets).map_err(|source| ConfigError::Scheduler { service: name.clone(), source })?;
        let mut quic_ids = FxHashMap::default();
        if s.quic && s.proto != vectorlb_packet::proto::UDP {
            bail!("{name}: quic routes UDP services only");
        }
        for (i, b) in s.backends.iter().enumerate() {
            let Some(q) = b.quic_id else { continue };
            if !s.quic {
                bail!("{name}: backend {} has a quic_id but the service's quic is off", b.addr);
            }
            if q == 0 {
                bail!("{name}: backend {}: quic_id 0 is no server id", b.addr);
            }
            if quic_ids.insert(q, i as u32).is_some() {
                bail!("{name}: quic_id {q} is given to two backends");
            }
        }
        let mut laddrs = Vec::new();
        if matches!(s.mode, Mode::Fnat | Mode::Nat) {
            for &l in &s.local_addrs {
                laddrs.push(add_laddr(&mut snap, reg, l)?);
            }
            for &l in &s.peer_local_addrs {
                let id = add_laddr(&mut snap, reg, l)?;
                snap.peer_laddrs.insert(id);
                snap.dsts.entry(key(l)).or_default().peer = true;
            }
        }
        let keep = s.keep_source.iter().map(|&(a, len)| (prefix_mask(a.is_ipv4(), len), key(a))).map(|(m, k)| (k & m, m)).collect();
        let d = snap.dsts.entry(key(s.vip)).or_default();
        if d.laddr.is_some() {
            bail!("{name}: the VIP is also a local address");
        }
        d.vip = true;
        d.services.push((s.port, s.proto, id));
        d.services.sort_by_key(|&(port, _, _)| (port == 0, port));
        if snap.services.len() <= id as usize {
            snap.services.resize(id as usize + 1, None);
        }
        // Entries survive changes of the backends (a client keeps a backend that stays); a
        // new timeout, or affinity switched off and on, starts afresh.
        let affinity = if s.affinity_ms == 0 {
            reg.affinities.remove(&k);
            None
        } else {
            let a = reg.affinities.entry(k).or_insert_with(|| Arc::new(crate::affinity::Affinity::new(s.affinity_ms)));
            if a.timeout_ms != s.affinity_ms {
                *a = Arc::new(crate::affinity::Affinity::new(s.affinity_ms));
            }
            Some(a.clone())
        };
        snap.services[id as usize] = Some(Service {
            id,
            spec: s.clone(),
            vip_key: key(s.vip),
            vip_bytes: bytes16(s.vip),
            sched,
            hash_key: spec.cluster_key,
            backends: ids,
            laddrs,
            keep,
            quic_ids,
            affinity,
        });
    }
    for svc in snap.services.iter().flatten() {
        if let Some(&l) = svc.laddrs.iter().find(|l| snap.peer_laddrs.contains(l)) {
            let a = snap.laddr_addr(l).map_or_else(|| l.to_string(), |a| a.to_string());
            bail!("local address {a}: this node's on one service, a peer's (peer_local_addrs) on another");
        }
    }
    for a in &spec.host_addrs {
        if let Some(d) = snap.dsts.get_mut(&key(*a)) {
            d.host = true;
        }
    }
    for (i, r) in spec.snat.iter().enumerate() {
        if r.addrs.is_empty() {
            bail!("snat rule {}/{}: needs at least one address", r.source, r.prefix_len);
        }
        let max = if r.source.is_ipv4() { 32 } else { 128 };
        if r.prefix_len > max {
            bail!("snat rule {}/{}: prefix length is too long", r.source, r.prefix_len);
        }
        let mut laddrs = Vec::new();
        for &a in &r.addrs {
            if !same_family(a, r.source) {
                bail!("snat rule {}/{}: address {a} is of another family", r.source, r.prefix_len);
            }
            laddrs.push(add_laddr(&mut snap, reg, a)?);
        }
        let mut except = Vec::with_capacity(r.except.len());
        for &(a, len) in &r.except {
            if !same_family(a, r.source) || len > if a.is_ipv4() { 32 } else { 128 } {
                bail!("snat rule {}/{}: except {a}/{len} is not a prefix of the source's family", r.source, r.prefix_len);
            }
            let m = prefix_mask(a.is_ipv4(), len);
            except.push((key(a) & m, m));
        }
        let mask = prefix_mask(r.source.is_ipv4(), r.prefix_len);
        snap.snat.push(SnatRule {
            id: SNAT_ID_BIT | i as u16,
            net: key(r.source) & mask,
            mask,
            v4: r.source.is_ipv4(),
            laddrs,
            timeouts: r.timeouts,
            except,
            outbound_only: r.outbound_only,
        });
    }
    reg.retain(&used_svcs, &used_backends);
    Ok(snap)
}

/// Holds the current snapshot; shared by the control plane and every worker.
pub struct Control {
    /// The SYN cookies' secret, shared by every worker (a flow's SYN and ACK may reach
    /// different cores when the port's spreading changes).
    pub(crate) cookie_key: [u64; 2],
    current: ArcSwap<Snapshot>,
    generation: AtomicU64,
    registry: Mutex<Registry>,
    /// The network policies ([`crate::policy`]), published apart from the snapshot: a policy
    /// change rebuilds no service.
    policy: ArcSwap<crate::policy::PolicySet>,
    policy_generation: AtomicU64,
    /// Flows allowed by policy, shared by every worker.
    pub policy_flows: crate::policy::Flows,
    /// Denied flows by policy and by endpoint, kept across policy sets.
    pub policy_counters: crate::policy::Counters,
    /// What the mesh steers to the node's proxy ([`crate::mesh`]), published apart too.
    mesh: ArcSwap<crate::mesh::Mesh>,
    mesh_generation: AtomicU64,
}

impl Control {
    pub fn new(spec: &LbSpec) -> Result<Arc<Control>, ConfigError> {
        let mut reg = Registry::default();
        let snap = build(spec, &mut reg, 1)?;
        Ok(Arc::new(Control {
            cookie_key: [crate::hash::random_seed(), crate::hash::random_seed()],
            current: ArcSwap::from_pointee(snap),
            generation: AtomicU64::new(1),
            registry: Mutex::new(reg),
            policy: ArcSwap::from_pointee(crate::policy::PolicySet::default()),
            policy_generation: AtomicU64::new(0),
            policy_flows: crate::policy::Flows::new(crate::policy::FLOWS),
            policy_counters: crate::policy::Counters::default(),
            mesh: ArcSwap::from_pointee(crate::mesh::Mesh::default()),
            mesh_generation: AtomicU64::new(0),
        }))
    }

    /// Validates and publishes a new configuration. On error nothing changes.
    pub fn apply(&self, spec: &LbSpec) -> Result<u64, ConfigError> {
        let mut reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Build against a copy so that a failed build leaves the registry as it was.
        let mut trial = Registry {
            services: reg.services.clone(),
            free_services: reg.free_services.clone(),
            backends: reg.backends.clone(),
            slot_gen: reg.slot_gen.clone(),
            free_slots: reg.free_slots.clone(),
            laddrs: reg.laddrs.clone(),
            scheds: reg.scheds.clone(),
            affinities: reg.affinities.clone(),
        };
        let generation = self.generation.load(Ordering::Relaxed) + 1;
        let snap = build(spec, &mut trial, generation)?;
        *reg = trial;
        self.current.store(Arc::new(snap));
        self.generation.store(generation, Ordering::Release);
        Ok(generation)
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Cheap check for workers: has a new snapshot been published?
    #[inline(always)]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Compiles and publishes a policy set. On error nothing changes. Flows allowed before
    /// stay allowed (they are remembered, or have sessions).
    pub fn apply_policy(&self, spec: &crate::policy::PolicySpec) -> Result<u64, crate::policy::PolicyError> {
        // One publisher at a time (the registry's lock), so generations only grow.
        let _reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let generation = self.policy_generation.load(Ordering::Relaxed) + 1;
        let set = crate::policy::PolicySet::build(spec, &self.policy_counters, generation)?;
        self.policy.store(Arc::new(set));
        self.policy_generation.store(generation, Ordering::Release);
        Ok(generation)
    }

    pub fn policy(&self) -> Arc<crate::policy::PolicySet> {
        self.policy.load_full()
    }

    #[inline(always)]
    pub fn policy_generation(&self) -> u64 {
        self.policy_generation.load(Ordering::Acquire)
    }

    /// Publishes what the mesh steers (an empty member list steers nothing). On error nothing
    /// changes.
    pub fn apply_mesh(&self, spec: &crate::mesh::MeshSpec) -> Result<u64, String> {
        let _reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let generation = self.mesh_generation.load(Ordering::Relaxed) + 1;
        self.mesh.store(Arc::new(crate::mesh::Mesh::build(spec, generation)?));
        self.mesh_generation.store(generation, Ordering::Release);
        Ok(generation)
    }

    /// Stops steering (the mesh is off).
    pub fn clear_mesh(&self) {
        let _reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let generation = self.mesh_generation.load(Ordering::Relaxed) + 1;
        self.mesh.store(Arc::new(crate::mesh::Mesh::off(generation)));
        self.mesh_generation.store(generation, Ordering::Release);
    }

    pub fn mesh(&self) -> Arc<crate::mesh::Mesh> {
        self.mesh.load_full()
    }

    #[inline(always)]
    pub fn mesh_generation(&self) -> u64 {
        self.mesh_generation.load(Ordering::Acquire)
    }
}
