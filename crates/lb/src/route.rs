//! Plain IP forwarding for what the load balancer itself does not handle: on a Kubernetes
//! node, the pods talking to each other, to the host and beyond. Longest-prefix route, TTL or
//! hop limit, the egress MTU, then the next hop's Ethernet header. What cannot be forwarded is
//! a counted drop: multicast and broadcast, link-local destinations, an expired TTL, no route
//! or an unreachable one (the cluster's service ranges: sent back to the host, such a packet
//! would come round again), an unresolved next hop, too long for the egress port. An expired
//! TTL and an unreachable route are answered with an ICMP error ([`Unrouted::icmp`]) by the
//! core that routes ([`crate::pipeline::Worker::route`]).

use crate::rewrite::egress;
use crate::service::{key4, key6, Snapshot};
use crate::verdict::{DropReason, Verdict};
use vectorlb_io::PacketBuf;
use vectorlb_packet::checksum::adjust16;
use vectorlb_packet::{parse_frame, Family};

/// Forwards the frame in `b` by `snap`'s routes: `Verdict::Tx(port)` with the frame rewritten,
/// or the drop and its reason.
pub fn forward<B: PacketBuf>(snap: &Snapshot, b: &mut B) -> Verdict {
    match route(snap, b) {
        Ok(v) => v,
        Err(u) => Verdict::Drop(u.reason),
    }
}

/// Why a frame was not forwarded: the reason, and the ICMP error its source should have (with
/// the offsets of the packet it would quote).
#[derive(Debug, Clone, Copy)]
pub struct Unrouted {
    pub reason: DropReason,
    pub icmp: Option<(crate::icmp::ErrorKind, crate::rewrite::Hdr)>,
}

impl From<vectorlb_packet::Error> for Unrouted {
    fn from(e: vectorlb_packet::Error) -> Unrouted {
        DropReason::from(e).into()
    }
}

impl From<DropReason> for Unrouted {
    fn from(reason: DropReason) -> Unrouted {
        Unrouted { reason, icmp: None }
    }
}

/// As [`forward`], telling what did not go and whether it deserves an ICMP error.
pub fn route<B: PacketBuf>(snap: &Snapshot, b: &mut B) -> Result<Verdict, Unrouted> {
    let info = parse_frame(b.data())?;
    route_parsed(snap, b, &info)
}

/// As [`route`] for a frame parsed already (`info` is `parse_frame` of `b`'s data).
pub fn route_parsed<B: PacketBuf>(snap: &Snapshot, b: &mut B, info: &vectorlb_packet::FrameInfo) -> Result<Verdict, Unrouted> {
    route_via(snap, b, info, None)
}

/// As [`route_parsed`], sent the way to `via` (an address key) instead of the way to its
/// destination when given: the mesh's steering, the packet itself unchanged.
pub fn route_via<B: PacketBuf>(snap: &Snapshot, b: &mut B, info: &vectorlb_packet::FrameInfo, via: Option<u128>) -> Result<Verdict, Unrouted> {
    let d = b.data();
    let family = info.family.ok_or(Unrouted::from(DropReason::UnsupportedProtocol))?;
    let l3 = info.l3;
    let v6 = family == Family::V6;
    let (dst, ttl_at) = if v6 {
        let a: [u8; 16] = d[l3 + 24..l3 + 40].try_into().expect("the parser saw the fixed header");
        // Multicast (ff00::/8) and link-local (fe80::/10) stay on their link.
        if a[0] == 0xff || (a[0] == 0xfe && a[1] & 0xc0 == 0x80) {
            return Err(DropReason::NoRoute.into());
        }
        (key6(a), l3 + 7)
    } else {
        let a: [u8; 4] = d[l3 + 16..l3 + 20].try_into().expect("the parser saw the fixed header");
        // Multicast, limited broadcast and link-local (169.254/16) stay on their link.
        if a[0] >= 224 || (a[0] == 169 && a[1] == 254) || a[0] == 0 || a[0] == 127 {
            return Err(DropReason::NoRoute.into());
        }
        (key4(a), l3 + 8)
    };
    // The packet as an ICMP error would quote it.
    let hdr = || {
        let (proto, l4) = if v6 { (d[l3 + 6], l3 + 40) } else { (d[l3 + 9], l3 + ((d[l3] & 0x0f) as usize) * 4) };
        crate::rewrite::Hdr { l3, l4: l4.min(info.end), end: info.end, v6, proto }
    };
    if d[ttl_at] <= 1 {
        return Err(Unrouted { reason: DropReason::TtlExceeded, icmp: Some((crate::icmp::ErrorKind::TimeExceeded, hdr())) });
    }
    if via.is_none() && snap.unreachable(dst, !v6) {
        return Err(Unrouted { reason: DropReason::NoRoute, icmp: Some((crate::icmp::ErrorKind::Unreachable, hdr())) });
    }
    let to = via.unwrap_or(dst);
    let Some(hop) = snap.route(to, !v6) else {
        return Err(if snap.next_hop(to, !v6).is_some() { DropReason::NoNeighbor } else { DropReason::NoRoute }.into());
    };
    // A pod's super-packet (kept whole) is measured by the packets it stands for.
    if info.end - l3 > hop.mtu as usize && !crate::rewrite::segments_fit(b, l3, info.l4, info.proto, hop.mtu as usize) {
        return Err(DropReason::MtuExceeded.into());
    }
    // Ethernet padding goes; the IP packet is what is forwarded.
    if !b.set_len(info.end) {
        return Err(DropReason::Truncated.into());
    }
    let d = b.data_mut();
    if v6 {
        d[ttl_at] -= 1;
    } else {
        let old = u16::from_be_bytes([d[ttl_at], d[ttl_at + 1]]);
        d[ttl_at] -= 1;
        let new = u16::from_be_bytes([d[ttl_at], d[ttl_at + 1]]);
        let c = u16::from_be_bytes([d[l3 + 10], d[l3 + 11]]);
        d[l3 + 10..l3 + 12].copy_from_slice(&adjust16(c, old, new).to_be_bytes());
    }
    Ok(egress(b, l3, &hop, info.ethertype))
}
