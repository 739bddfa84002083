//! ARP and IPv6 neighbour discovery for the LB's own addresses (interface addresses, VIPs,
//! full-NAT local addresses).
//!
//! The pipeline hands ARP and ND to the runtime as [`crate::Verdict::Kernel`]; the runtime
//! calls [`handle`], which answers requests for our addresses in place (the buffer becomes the
//! reply, sent back on the port it came from) and reports the sender's address and MAC when
//! it is on a connected network, so the control thread can learn it. [`arp_request`] and
//! [`solicit`] build the frames the control thread sends to resolve next hops.

use crate::service::{key, key4, key6, Snapshot};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use vectorlb_io::PacketBuf;
use vectorlb_packet::checksum;
use vectorlb_packet::ethernet::{self, ethertype, Mac};
use vectorlb_packet::{arp, proto};

const BROADCAST: Mac = [0xff; 6];
const ND_NS: u8 = 135;
const ND_NA: u8 = 136;
const OPT_SLLA: u8 = 1;
const OPT_TLLA: u8 = 2;

/// What [`handle`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The buffer now holds a reply to send on the port the frame came from.
    pub reply: bool,
    /// A neighbour seen on a connected network: its address and MAC.
    pub learned: Option<(IpAddr, Mac)>,
    /// An ARP packet not for us (a gratuitous one, say) from a neighbour on a connected
    /// network: its address and MAC, to update the entry only if the address is known
    /// already (RFC 826's merge: a backend's address moved to a new MAC is followed at once,
    /// and strangers fill no table).
    pub update: Option<(IpAddr, Mac)>,
    /// The frame was ARP or ND at all (otherwise the caller drops it as non-LB traffic).
    pub neighbour: bool,
}

fn port_mac(snap: &Snapshot, port: u16) -> Option<(Mac, Option<u16>)> {
    snap.ports.get(port as usize).map(|p| (p.spec.mac, p.spec.vlan))
}

fn frame(dst: Mac, src: Mac, vlan: Option<u16>, etype: u16, payload: &[u8]) -> Vec<u8> {
    let h = ethernet::header_len(vlan);
    let mut f = vec![0u8; h + payload.len()];
    ethernet::write_header(&mut f[..h], dst, src, vlan, etype);
    f[h..].copy_from_slice(payload);
    f
}

fn store<B: PacketBuf>(buf: &mut B, f: &[u8]) -> bool {
    if !buf.set_len(f.len()) {
        return false;
    }
    buf.data_mut().copy_from_slice(f);
    true
}

/// Whether we answer for `a`: every address of ours, except the floating ones (VIPs and
/// full-NAT/SNAT local addresses, which move between HA nodes) when `floating` is false (a
/// BACKUP node). Never for a peer's local address (a sync group's other node owns it; it
/// reaches this node by routing after that node's loss).
fn answers(snap: &Snapshot, a: u128, floating: bool) -> bool {
    snap.dst(a).is_some_and(|d| !d.peer && (floating || !(d.vip || d.laddr.is_some())))
}

/// Handles an ARP or ND frame received on `port`. `floating`: answer for VIPs and local
/// addresses too (false on an HA BACKUP node).
pub fn handle<B: PacketBuf>(buf: &mut B, snap: &Snapshot, port: u16, floating: bool) -> Outcome {
    let mut out = Outcome::default();
    let Some((mac, vlan)) = port_mac(snap, port) else { return out };
    let data = buf.data();
    let Ok(l2) = ethernet::parse_l2(data) else { return out };
    let eth_src: Mac = data[6..12].try_into().unwrap();
    let l3 = &data[l2.l3_offset..];
    if l2.ethertype == ethertype::ARP {
        out.neighbour = true;
        let Ok(a) = arp::ArpPacket::new_checked(l3) else { return out };
        let (sip, smac, tip) = (a.sender_ip(), a.sender_mac(), a.target_ip());
        let ours = answers(snap, key4(tip.octets()), floating);
        if !sip.is_unspecified() && smac != BROADCAST && smac[0] & 1 == 0 && !snap.is_own(key4(sip.octets())) && snap.on_link(key4(sip.octets()), true) {
            if ours {
                out.learned = Some((IpAddr::V4(sip), smac));
            } else {
                out.update = Some((IpAddr::V4(sip), smac));
            }
        }
        if a.operation() == arp::OP_REQUEST && ours && sip != tip {
            let body = arp::build(arp::OP_REPLY, mac, tip, smac, sip);
            out.reply = store(buf, &frame(eth_src, mac, vlan, ethertype::ARP, &body));
        }
        return out;
    }
    if l2.ethertype != ethertype::IPV6 || l3.len() < 40 + 24 || l3[6] != proto::ICMPV6 || l3[7] != 255 {
        return out;
    }
    let src: [u8; 16] = l3[8..24].try_into().unwrap();
    let icmp = &l3[40..];
    let (t, code) = (icmp[0], icmp[1]);
    if code != 0 || (t != ND_NS && t != ND_NA) {
        return out;
    }
    out.neighbour = true;
    let target: [u8; 16] = icmp[8..24].try_into().unwrap();
    let plen = u16::from_be_bytes([l3[4], l3[5]]) as usize;
    let opts = &icmp[24..plen.min(icmp.len()).max(24)];
    let lla = link_option(opts, if t == ND_NS { OPT_SLLA } else { OPT_TLLA });
    let unspecified = src == [0u8; 16];
    if t == ND_NA {
        let m = lla.unwrap_or(eth_src);
        if snap.on_link(key6(target), false) && !snap.is_own(key6(target)) && m[0] & 1 == 0 {
            out.learned = Some((IpAddr::V6(Ipv6Addr::from(target)), m));
        }
        return out;
    }
    if !answers(snap, key6(target), floating) {
        return out;
    }
    if !unspecified {
        if let Some(m) = lla {
            if snap.on_link(key6(src), false) && m[0] & 1 == 0 {
                out.learned = Some((IpAddr::V6(Ipv6Addr::from(src)), m));
            }
        }
    }
    // Neighbour advertisement: solicited (unless answering DAD), override, our MAC.
    let dst: [u8; 16] = if unspecified { Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets() } else { src };
    let dst_mac = if unspecified { [0x33, 0x33, 0, 0, 0, 1] } else { lla.unwrap_or(eth_src) };
    let flags: u8 = if unspecified { 0x20 } else { 0x60 };
    let f = nd_frame(mac, vlan, dst_mac, &target, &dst, ND_NA, flags, &target, OPT_TLLA);
    out.reply = store(buf, &f);
    out
}

fn link_option(mut opts: &[u8], want: u8) -> Option<Mac> {
    while opts.len() >= 8 {
        let len = opts[1] as usize * 8;
        if len == 0 || len > opts.len() {
            return None;
        }
        if opts[0] == want && len >= 8 {
            return opts[2..8].try_into().ok();
        }
        opts = &opts[len..];
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn nd_frame(mac: Mac, vlan: Option<u16>, dst_mac: Mac, src: &[u8; 16], dst: &[u8; 16], t: u8, flags: u8, target: &[u8; 16], opt: u8) -> Vec<u8> {
    let mut ip = [0u8; 40 + 32];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&32u16.to_be_bytes());
    ip[6] = proto::ICMPV6;
    ip[7] = 255;
    ip[8..24].copy_from_slice(src);
    ip[24..40].copy_from_slice(dst);
    let icmp = &mut ip[40..];
    icmp[0] = t;
    icmp[4] = flags;
    icmp[8..24].copy_from_slice(target);
    icmp[24] = opt;
    icmp[25] = 1;
    icmp[26..32].copy_from_slice(&mac);
    let acc = checksum::accumulate(checksum::pseudo_v6(src, dst, proto::ICMPV6, 32), icmp);
    let c = checksum::finish(acc);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    frame(dst_mac, mac, vlan, ethertype::IPV6, &ip)
}

/// An ARP request for `target` from `port`'s IPv4 address (None: the port has none).
pub fn arp_request(snap: &Snapshot, port: u16, target: Ipv4Addr) -> Option<Vec<u8>> {
    let (mac, vlan) = port_mac(snap, port)?;
    let IpAddr::V4(src) = snap.port_addr(port, true)? else { return None };
    let body = arp::build(arp::OP_REQUEST, mac, src, [0; 6], target);
    Some(frame(BROADCAST, mac, vlan, ethertype::ARP, &body))
}

/// A gratuitous ARP announcing `addr` (one of ours) on `port`.
pub fn gratuitous_arp(snap: &Snapshot, port: u16, addr: Ipv4Addr) -> Option<Vec<u8>> {
    let (mac, vlan) = port_mac(snap, port)?;
    let body = arp::build(arp::OP_REQUEST, mac, addr, [0; 6], addr);
    Some(frame(BROADCAST, mac, vlan, ethertype::ARP, &body))
}

/// A neighbour solicitation for `target` from `port`'s IPv6 address, to its solicited-node
/// multicast group.
pub fn solicit(snap: &Snapshot, port: u16, target: Ipv6Addr) -> Option<Vec<u8>> {
    let (mac, vlan) = port_mac(snap, port)?;
    let IpAddr::V6(src) = snap.port_addr(port, false)? else { return None };
    let t = target.octets();
    let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | t[13] as u16, u16::from_be_bytes([t[14], t[15]])).octets();
    let dst_mac = [0x33, 0x33, dst[12], dst[13], dst[14], dst[15]];
    Some(nd_frame(mac, vlan, dst_mac, &src.octets(), &dst, ND_NS, 0, &t, OPT_SLLA))
}

/// An unsolicited neighbour advertisement for `addr` (one of ours) to all nodes on `port`.
pub fn unsolicited_na(snap: &Snapshot, port: u16, addr: Ipv6Addr) -> Option<Vec<u8>> {
    let (mac, vlan) = port_mac(snap, port)?;
    let all = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets();
    Some(nd_frame(mac, vlan, [0x33, 0x33, 0, 0, 0, 1], &addr.octets(), &all, ND_NA, 0x20, &addr.octets(), OPT_TLLA))
}

/// The next hops the LB needs resolved: route gateways and on-link backends, with the port
/// each is reached through.
pub fn next_hops(snap: &Snapshot) -> Vec<(IpAddr, u16)> {
    let mut v: Vec<(IpAddr, u16)> = Vec::new();
    for r in &snap.spec.routes {
        v.push((r.via, r.port));
    }
    for s in &snap.spec.services {
        for b in &s.backends {
            let v4 = b.addr.is_ipv4();
            if snap.on_link(key(b.addr), v4) {
                if let Some(h) = snap.route_port(key(b.addr), v4) {
                    v.push((b.addr, h));
                }
            }
        }
    }
    v.sort();
    v.dedup();
    v
}
