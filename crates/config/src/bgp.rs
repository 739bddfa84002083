//! `[bgp]`: announcing the VIPs to the routers through BIRD (docs/scale-out.md).

use crate::error::{bail, Error};
use crate::file::{RawBgp, RawBgpNeighbor};
use std::net::{IpAddr, Ipv4Addr};

/// How this node announces its VIPs (`[bgp]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpSpec {
    /// This node's autonomous system.
    pub asn: u32,
    /// BGP identifier (an IPv4 address, unique among the routers' peers).
    pub router_id: Ipv4Addr,
    /// The next hop announced with the VIPs (None: this node's address on each session).
    pub next_hop: Option<IpAddr>,
    /// Seconds without a message before a session is declared down (0, or 3..=65535).
    pub hold_time: u16,
    /// Bidirectional forwarding detection on every session (sub-second failure detection).
    pub bfd: bool,
    /// BFD's interval (ms) and multiplier: a peer is down after `bfd_interval_ms` x `bfd_multiplier`.
    pub bfd_interval_ms: u32,
    pub bfd_multiplier: u8,
    /// Standard communities attached to every announcement, (ASN, value).
    pub communities: Vec<(u16, u16)>,
    pub neighbors: Vec<BgpNeighbor>,
    /// Prefixes inside which routes are taken from the neighbours and installed in the host's
    /// routing table: other nodes' pod networks (docs/pod-network.md). Empty: nothing is taken
    /// (the default; a load balancer only announces).
    pub import: Vec<(IpAddr, u8)>,
    /// The length of a node's pod network (Kubernetes' node CIDR mask size), IPv4 and IPv6:
    /// only routes of exactly this length are taken (a /32 of a pod, a default route or a
    /// shorter prefix from a neighbour is refused).
    pub import_length4: u8,
    pub import_length6: u8,
    /// The most routes taken from one neighbour; past it the neighbour's further routes are
    /// refused (BIRD's `import limit ... action block`).
    pub import_limit: u32,
    /// This node's own pod networks (the pods port's, filled in from `[[ports]]`): never taken
    /// from a neighbour, whatever it announces.
    pub own_pods: Vec<(IpAddr, u8)>,
    /// The BIRD 2 binaries.
    pub bird: String,
    pub birdc: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpNeighbor {
    pub address: IpAddr,
    pub asn: u32,
    /// TCP MD5 signature (RFC 2385) shared with the router.
    pub password: Option<String>,
}

impl BgpSpec {
    pub const DEFAULT_HOLD_TIME: u16 = 9;
    pub const DEFAULT_BFD_INTERVAL_MS: u32 = 100;
    pub const DEFAULT_BFD_MULTIPLIER: u8 = 3;
    pub const DEFAULT_BIRD: &str = "/usr/sbin/bird";
    /// Kubernetes' defaults for a node's pod network (`--node-cidr-mask-size-ipv4/ipv6`).
    pub const DEFAULT_IMPORT_LENGTH4: u8 = 24;
    pub const DEFAULT_IMPORT_LENGTH6: u8 = 64;
    /// The most blocks a default `import_limit` counts (a cluster of more nodes sets it).
    pub const MAX_DEFAULT_IMPORT_LIMIT: u64 = 4096;
    pub const DEFAULT_BIRDC: &str = "/usr/sbin/birdc";

    /// A speaker with every optional setting at its default (what `[bgp]` gives without them).
    pub fn new(asn: u32, router_id: Ipv4Addr, neighbors: Vec<BgpNeighbor>) -> BgpSpec {
        BgpSpec {
            asn,
            router_id,
            next_hop: None,
            hold_time: Self::DEFAULT_HOLD_TIME,
            bfd: true,
            bfd_interval_ms: Self::DEFAULT_BFD_INTERVAL_MS,
            bfd_multiplier: Self::DEFAULT_BFD_MULTIPLIER,
            communities: Vec::new(),
            neighbors,
            import: Vec::new(),
            import_length4: Self::DEFAULT_IMPORT_LENGTH4,
            import_length6: Self::DEFAULT_IMPORT_LENGTH6,
            import_limit: 1,
            own_pods: Vec::new(),
            bird: Self::DEFAULT_BIRD.into(),
            birdc: Self::DEFAULT_BIRDC.into(),
        }
    }
}

fn asn(what: &str, n: u64) -> Result<u32, Error> {
    match n {
        // 0 and 65535 / 4294967295 are reserved (RFC 7607, RFC 7300); 23456 is AS_TRANS.
        0 | 23456 | 65535 | 4_294_967_295 => bail!("{what}: AS {n} is reserved"),
        n if n > u32::MAX as u64 => bail!("{what}: {n} is not a 32-bit AS number"),
        n => Ok(n as u32),
    }
}

/// Text that goes into BIRD's configuration between quotes: printable, no quote or backslash.
fn quoted_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 80 && s.chars().all(|c| !c.is_control() && c != '"' && c != '\\')
}

fn neighbor(f: &str, n: &RawBgpNeighbor) -> Result<BgpNeighbor, Error> {
    let address: IpAddr = n.address.parse().map_err(|_| Error::invalid(format!("{f}.address: '{}' is not an IP address", n.address)))?;
    if address.is_unspecified() || address.is_multicast() || address.is_loopback() {
        bail!("{f}.address: {address} is not a unicast address a router has");
    }
    let password = match &n.password {
        Some(p) if !quoted_ok(p) => bail!("{f}.password: 1 to 80 printable characters, without quotes or backslashes"),
        p => p.clone(),
    };
    Ok(BgpNeighbor { address, asn: asn(&format!("{f}.asn"), n.asn)?, password })
}

/// `[bgp]`, if there is one.
pub(crate) fn bgp(raw: &Option<RawBgp>) -> Result<Option<BgpSpec>, Error> {
    let Some(b) = raw else { return Ok(None) };
    let router_id: Ipv4Addr = b.router_id.parse().map_err(|_| Error::invalid(format!("bgp.router_id: '{}' is not an IPv4 address", b.router_id)))?;
    if router_id.is_unspecified() {
        bail!("bgp.router_id: 0.0.0.0 is not an identifier");
    }
    let next_hop = match &b.next_hop {
        None => None,
        Some(s) => Some(s.parse::<IpAddr>().map_err(|_| Error::invalid(format!("bgp.next_hop: '{s}' is not an IP address")))?),
    };
    let hold_time = b.hold_time.unwrap_or(BgpSpec::DEFAULT_HOLD_TIME);
    if hold_time != 0 && hold_time < 3 {
        bail!("bgp.hold_time: {hold_time} s; 0 (no keepalives) or at least 3 (RFC 4271)");
    }
    let bfd_interval_ms = b.bfd_interval_ms.unwrap_or(BgpSpec::DEFAULT_BFD_INTERVAL_MS);
    if !(10..=10_000).contains(&bfd_interval_ms) {
        bail!("bgp.bfd_interval_ms: {bfd_interval_ms} is out of range 10..=10000");
    }
    let bfd_multiplier = b.bfd_multiplier.unwrap_or(BgpSpec::DEFAULT_BFD_MULTIPLIER);
    if !(1..=50).contains(&bfd_multiplier) {
        bail!("bgp.bfd_multiplier: {bfd_multiplier} is out of range 1..=50");
    }
    let mut communities = Vec::new();
    for (i, c) in b.communities.iter().enumerate() {
        let parsed = c.split_once(':').and_then(|(a, v)| Some((a.parse::<u16>().ok()?, v.parse::<u16>().ok()?)));
        match parsed {
            Some(p) => communities.push(p),
            None => bail!("bgp.communities[{i}]: '{c}' is not ASN:VALUE (each 0..=65535)"),
        }
    }
    if b.neighbors.is_empty() {
        bail!("bgp.neighbors: give at least one router to announce to");
    }
    let mut neighbors = Vec::new();
    for (i, n) in b.neighbors.iter().enumerate() {
        let n = neighbor(&format!("bgp.neighbors[{i}]"), n)?;
        if neighbors.iter().any(|m: &BgpNeighbor| m.address == n.address) {
            bail!("bgp.neighbors[{i}].address: {} is listed twice", n.address);
        }
        neighbors.push(n);
    }
    let mut import = Vec::new();
    for (i, p) in b.import.iter().enumerate() {
        let f = format!("bgp.import[{i}]");
        let (a, len) = crate::values::prefix(&f, p)?;
        if crate::values::masked(a, len) != a {
            bail!("{f}: '{p}' has bits set past its length (the network is {}/{len})", crate::values::masked(a, len));
        }
        if len == 0 {
            bail!("{f}: a default route is not taken from the neighbours; give the pod networks' prefix");
        }
        if import.contains(&(a, len)) {
            bail!("{f}: '{p}' is listed twice");
        }
        import.push((a, len));
    }
    let import_length4 = b.import_length4.unwrap_or(BgpSpec::DEFAULT_IMPORT_LENGTH4);
    let import_length6 = b.import_length6.unwrap_or(BgpSpec::DEFAULT_IMPORT_LENGTH6);
    if !(1..=32).contains(&import_length4) {
        bail!("bgp.import_length4: {import_length4} is not in 1..=32");
    }
    if !(1..=128).contains(&import_length6) {
        bail!("bgp.import_length6: {import_length6} is not in 1..=128");
    }
    let mut blocks: u64 = 0;
    for (i, (a, len)) in import.iter().enumerate() {
        let (block, name) = if a.is_ipv4() { (import_length4, "import_length4") } else { (import_length6, "import_length6") };
        if block < *len {
            bail!("bgp.import[{i}]: {a}/{len} is longer than bgp.{name} ({block}): no node's pod network fits in it");
        }
        blocks = blocks.saturating_add(1u64.checked_shl(u32::from(block - len)).unwrap_or(u64::MAX));
    }
    let import_limit = match b.import_limit {
        Some(n @ 1..=1_000_000) => n,
        Some(n) => bail!("bgp.import_limit: {n} is not in 1..=1000000"),
        None => blocks.clamp(1, BgpSpec::MAX_DEFAULT_IMPORT_LIMIT) as u32,
    };
    let bin = |what: &str, v: &Option<String>, default: &str| -> Result<String, Error> {
        let s = v.clone().unwrap_or_else(|| default.to_string());
        if !s.starts_with('/') || s.chars().any(char::is_control) {
            bail!("bgp.{what}: '{s}' is not an absolute path");
        }
        Ok(s)
    };
    Ok(Some(BgpSpec {
        asn: asn("bgp.asn", b.asn)?,
        router_id,
        next_hop,
        hold_time,
        bfd: b.bfd.unwrap_or(true),
        bfd_interval_ms,
        bfd_multiplier,
        communities,
        neighbors,
        import,
        import_length4,
        import_length6,
        import_limit,
        own_pods: Vec::new(),
        bird: bin("bird", &b.bird, BgpSpec::DEFAULT_BIRD)?,
        birdc: bin("birdc", &b.birdc, BgpSpec::DEFAULT_BIRDC)?,
    }))
}

/// `[bgp]` as the file writes it.
pub(crate) fn raw(s: &BgpSpec) -> RawBgp {
    RawBgp {
        asn: s.asn as u64,
        router_id: s.router_id.to_string(),
        next_hop: s.next_hop.map(|a| a.to_string()),
        hold_time: Some(s.hold_time),
        bfd: Some(s.bfd),
        bfd_interval_ms: Some(s.bfd_interval_ms),
        bfd_multiplier: Some(s.bfd_multiplier),
        communities: s.communities.iter().map(|(a, v)| format!("{a}:{v}")).collect(),
        neighbors: s.neighbors.iter().map(|n| RawBgpNeighbor { address: n.address.to_string(), asn: n.asn as u64, password: n.password.clone() }).collect(),
        import: s.import.iter().map(|(a, l)| format!("{a}/{l}")).collect(),
        import_length4: (s.import_length4 != BgpSpec::DEFAULT_IMPORT_LENGTH4).then_some(s.import_length4),
        import_length6: (s.import_length6 != BgpSpec::DEFAULT_IMPORT_LENGTH6).then_some(s.import_length6),
        import_limit: Some(s.import_limit).filter(|_| !s.import.is_empty()),
        bird: Some(s.bird.clone()),
        birdc: Some(s.birdc.clone()),
    }
}
