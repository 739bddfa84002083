//! The benchmark topology: a client side (port 0) and a backend side (port 1) with 16 backends,
//! one VIP service per run, and enough full-NAT local addresses for the sessions asked for.

use std::net::IpAddr;
use vectorlb_lb::{BackendSpec, LbSpec, Mode, ServiceSpec, Timeouts};
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

pub const BACKENDS: u32 = 16;
pub use vectorlb_lb::service::two_arm::{EXT_MAC, INT_MAC, ROUTER_MAC};
/// Ports each local address offers (1024..=65535).
pub const PORTS_PER_LADDR: u64 = 64512;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn vip(v6: bool) -> IpAddr {
    ip(if v6 { "2001:db8::100" } else { "10.0.0.100" })
}

pub fn backend(v6: bool, i: u32) -> IpAddr {
    if v6 {
        ip(&format!("2001:db8:1::{:x}", 0x100 + i))
    } else {
        ip(&format!("10.1.1.{}", i + 1))
    }
}

pub fn laddr(v6: bool, i: u32) -> IpAddr {
    if v6 {
        ip(&format!("2001:db8:2::{:x}", i + 1))
    } else {
        ip(&format!("10.2.{}.{}", i / 250, i % 250 + 1))
    }
}

/// Client `i` of a run: addresses spread over a /10 (IPv4) or a /96 (IPv6), 50,000 ports each.
pub fn client(v6: bool, i: u64) -> (IpAddr, u16) {
    let host = (i / 50_000) as u32;
    let port = 10_000 + (i % 50_000) as u16;
    let a = if v6 {
        let mut o = ip("2001:db8:c::").to_string().parse::<std::net::Ipv6Addr>().unwrap().octets();
        o[12..16].copy_from_slice(&host.to_be_bytes());
        IpAddr::from(o)
    } else {
        IpAddr::from((0x6440_0000u32 + host).to_be_bytes())
    };
    (a, port)
}

pub fn spec(mode: Mode, v6: bool, protocol: u8, sessions: u64, timeouts: Timeouts) -> LbSpec {
    let backends: Vec<BackendSpec> =
        (0..BACKENDS).map(|i| BackendSpec { addr: backend(v6, i), port: if matches!(mode, Mode::Nat | Mode::Fnat) { 8080 } else { 0 }, weight: 1, quic_id: None }).collect();
    let nladdr = if mode == Mode::Fnat { sessions.div_ceil(PORTS_PER_LADDR) as u32 + 1 } else { 0 };
    let mut spec = vectorlb_lb::service::two_arm::spec(16);
    spec.neighbors.extend((0..BACKENDS).map(|i| (backend(v6, i), [2, 0, 0, 0, 2, i as u8])));
    spec.services.push(ServiceSpec {
        vip: vip(v6),
        port: if protocol == proto::TCP { 80 } else { 53 },
        proto: protocol,
        mode,
        scheduler: Algorithm::Rr,
        backends,
        local_addrs: (0..nladdr).map(|i| laddr(v6, i)).collect(),
        peer_local_addrs: vec![],
        toa: false,
        synproxy: Default::default(),
        timeouts,
        continuation: false,
        quic: false,
        affinity_ms: 0,
        keep_source: Vec::new(),
    });
    spec
}
