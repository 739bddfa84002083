//! ICMP on the data plane: echo replies for the LB's addresses, errors the LB originates (TTL
//! exceeded, fragmentation needed / packet too big, so path-MTU discovery works through it),
//! and errors from elsewhere about a session, translated like the session's packets so they
//! reach the host that sent the original.

use crate::flows::Flows;
use crate::mem::Zeroable;
use crate::meta::Meta;
use crate::rewrite::{egress, encapsulate, fill_l4_checksum, Fam, Hdr};
use crate::service::{Hop, Mode, Snapshot};
use crate::session::{state, Session};
use crate::verdict::{DropReason, Verdict};
use vectorlb_io::PacketBuf;
use vectorlb_packet::checksum::{self, adjust16};
use vectorlb_packet::{icmp, proto};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    TimeExceeded,
    /// Fragmentation needed (IPv4, DF set) or packet too big (IPv6), with the MTU to report.
    TooBig(u16),
    /// Destination unreachable, administratively prohibited (IPv4) or reject route (IPv6): an
    /// unreachable route's destination (the cluster's service ranges: no Service has it). Hard
    /// errors: the sender's connect or connected socket fails at once.
    Unreachable,
    /// Destination unreachable, port unreachable, from the packet's own destination: a
    /// Service with no backend refusing a UDP datagram, as kube-proxy's reject rule does (the
    /// sender's connected socket sees ECONNREFUSED).
    PortUnreachable,
}

fn ipv4_header_checksum(d: &mut [u8], l3: usize) {
    let hl = ((d[l3] & 0x0f) as usize) * 4;
    d[l3 + 10] = 0;
    d[l3 + 11] = 0;
    let c = checksum::checksum(&d[l3..l3 + hl]);
    d[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

#[inline]
fn be16(d: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([d[at], d[at + 1]])
}

/// How a translated error leaves: rewritten addresses and the next hop.
struct Translation<A> {
    outer_src: Option<A>,
    outer_dst: A,
    emb_src: Option<(A, u16)>,
    emb_dst: Option<(A, u16)>,
    hop: Hop,
    /// TUN mode: encapsulate to this backend from this source.
    tunnel: Option<(A, A)>,
}

/// The rate limit of the ICMP errors a core originates (`icmp_rate` per second, a token bucket
/// of that depth). The core's ICMP state; the rest is in the packets.
#[derive(Debug, Default)]
pub struct IcmpLimiter {
    tokens: u32,
    refill: u32,
}

impl IcmpLimiter {
    fn allowed(&mut self, snap: &Snapshot, now: u32) -> bool {
        let rate = snap.spec.icmp_rate;
        if rate == 0 {
            return false;
        }
        let elapsed = now.wrapping_sub(self.refill) as u64;
        let add = elapsed * rate as u64 / 1000;
        if add > 0 {
            self.tokens = (self.tokens as u64 + add).min(rate as u64) as u32;
            self.refill = now;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// A packet too big for the egress MTU: IPv4 without DF is dropped (the LB does not
    /// fragment); otherwise a fragmentation-needed / packet-too-big error goes to its source.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn too_big<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, snap: &Snapshot, b: &mut B, m: &Meta, mtu: usize, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        if !m.hdr().dont_frag(b.data()) {
            return Verdict::Drop(DropReason::MtuExceeded);
        }
        self.error::<A, B>(flows, snap, b, m, ErrorKind::TooBig(mtu.min(65535) as u16), DropReason::MtuExceeded, now)
    }

    /// Turns the packet in `b` into an ICMP error to its source, in place, quoting as much of it
    /// as fits in 576 (IPv4) or 1280 (IPv6) bytes. The packet itself counts as dropped for
    /// `reason`; if no error can be sent the verdict is that drop.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn error<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, snap: &Snapshot, b: &mut B, m: &Meta, kind: ErrorKind, reason: DropReason, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        self.error_hdr::<A, B>(flows, snap, b, m.hdr(), kind, reason, now)
    }

    /// As [`IcmpLimiter::error`], for a packet known by its headers' offsets alone (a routed
    /// one, which the pipeline did not parse).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn error_hdr<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, snap: &Snapshot, b: &mut B, h: Hdr, kind: ErrorKind, reason: DropReason, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let d = b.data();
        // Never an error about an ICMP error (RFC 1122 §3.2.2).
        if h.proto == proto::ICMP || h.proto == proto::ICMPV6 {
            let t = d[h.l4];
            if (A::V6 && icmp::v6::is_error(t)) || (!A::V6 && icmp::v4::is_error(t)) {
                return Verdict::Drop(reason);
            }
        }
        let orig_src = A::read(d, h.l3 + A::SRC);
        let orig_dst = A::read(d, h.l3 + A::DST);
        let Some(hop) = flows.route_to(snap, orig_src.key(), !A::V6) else {
            return Verdict::Drop(reason);
        };
        let from = if snap.is_own(orig_dst.key()) || kind == ErrorKind::PortUnreachable {
            orig_dst
        } else {
            match snap.port_addr(hop.port, !A::V6).and_then(A::from_ip) {
                Some(a) => a,
                None => return Verdict::Drop(reason),
            }
        };
        if !self.allowed(snap, now) {
            flows.counters.drop(DropReason::IcmpRateLimited);
            return Verdict::Drop(reason);
        }
        let iphl = if A::V6 { 40 } else { 20 };
        let hdr = iphl + icmp::HEADER_LEN;
        let quote = h.ip_len().min(if A::V6 { 1280 } else { 576 } - hdr);
        if !b.set_len(h.l3 + quote) || !b.prepend(hdr) {
            return Verdict::Drop(reason);
        }
        let (t, code, rest) = match (kind, A::V6) {
            (ErrorKind::TimeExceeded, false) => (icmp::v4::TIME_EXCEEDED, 0, [0; 4]),
            (ErrorKind::TimeExceeded, true) => (icmp::v6::TIME_EXCEEDED, 0, [0; 4]),
            (ErrorKind::TooBig(mtu), false) => {
                let b = mtu.to_be_bytes();
                (icmp::v4::DEST_UNREACH, icmp::v4::CODE_FRAG_NEEDED, [0, 0, b[0], b[1]])
            }
            (ErrorKind::TooBig(mtu), true) => (icmp::v6::PACKET_TOO_BIG, 0, (mtu as u32).to_be_bytes()),
            (ErrorKind::Unreachable, false) => (icmp::v4::DEST_UNREACH, icmp::v4::CODE_ADMIN_PROHIBITED, [0; 4]),
            (ErrorKind::Unreachable, true) => (icmp::v6::DEST_UNREACH, icmp::v6::CODE_REJECT_ROUTE, [0; 4]),
            (ErrorKind::PortUnreachable, false) => (icmp::v4::DEST_UNREACH, icmp::v4::CODE_PORT_UNREACH, [0; 4]),
            (ErrorKind::PortUnreachable, true) => (icmp::v6::DEST_UNREACH, icmp::v6::CODE_PORT_UNREACH, [0; 4]),
        };
        let d = b.data_mut();
        let l3 = h.l3;
        let end = l3 + hdr + quote;
        if A::V6 {
            d[l3..l3 + 4].copy_from_slice(&[0x60, 0, 0, 0]);
            d[l3 + 4..l3 + 6].copy_from_slice(&((end - l3 - 40) as u16).to_be_bytes());
            d[l3 + 6] = proto::ICMPV6;
            d[l3 + 7] = 64;
        } else {
            let ident = flows.next_ident();
            d[l3] = 0x45;
            d[l3 + 1] = 0;
            d[l3 + 2..l3 + 4].copy_from_slice(&((end - l3) as u16).to_be_bytes());
            d[l3 + 4..l3 + 6].copy_from_slice(&ident.to_be_bytes());
            d[l3 + 6] = 0;
            d[l3 + 7] = 0;
            d[l3 + 8] = 64;
            d[l3 + 9] = proto::ICMP;
        }
        d[l3 + A::SRC..l3 + A::SRC + A::LEN].copy_from_slice(from.bytes());
        d[l3 + A::DST..l3 + A::DST + A::LEN].copy_from_slice(orig_src.bytes());
        if !A::V6 {
            ipv4_header_checksum(d, l3);
        }
        icmp::emit_header(&mut d[l3 + iphl..], t, code, rest);
        fill_l4_checksum::<A>(d, l3, l3 + iphl, end, if A::V6 { proto::ICMPV6 } else { proto::ICMP });
        flows.counters.events.icmp_errors_sent += 1;
        flows.counters.drop(reason);
        egress(b, l3, &hop, A::ETHERTYPE)
    }

    /// ICMP addressed to or through the LB.
    pub(crate) fn packet<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let d = b.data();
        let t = d[h.l4];
        let dst = A::read(d, h.l3 + A::DST);
        let (echo_req, is_err) = if A::V6 { (t == icmp::v6::ECHO_REQUEST, icmp::v6::is_error(t)) } else { (t == icmp::v4::ECHO_REQUEST, icmp::v4::is_error(t)) };
        if echo_req {
            return if snap.is_own(dst.key()) { echo_reply::<A, B>(flows, snap, b, &h) } else { Verdict::Kernel };
        }
        if !is_err {
            return Verdict::Kernel;
        }
        match translate::<A>(flows, snap, b.data(), &h, now) {
            Ok(Some(tr)) => apply_translation::<A, B>(flows, b, &h, tr),
            Ok(None) => {
                if snap.is_own(dst.key()) {
                    Verdict::Drop(DropReason::IcmpNoSession)
                } else {
                    Verdict::Kernel
                }
            }
            Err(v) => v,
        }
    }
}

fn echo_reply<A: Fam, B: PacketBuf>(flows: &mut Flows, snap: &Snapshot, b: &mut B, h: &Hdr) -> Verdict
where
    Session<A>: Zeroable,
{
    let src = A::read(b.data(), h.l3 + A::SRC);
    let Some(hop) = flows.route_to(snap, src.key(), !A::V6) else {
        return Verdict::Drop(DropReason::NoRoute);
    };
    let dst = A::read(b.data(), h.l3 + A::DST);
    b.set_len(h.end);
    let d = b.data_mut();
    // Swapping addresses keeps every checksum; the type and TTL change.
    d[h.l3 + A::SRC..h.l3 + A::SRC + A::LEN].copy_from_slice(dst.bytes());
    d[h.l3 + A::DST..h.l3 + A::DST + A::LEN].copy_from_slice(src.bytes());
    let reply = if A::V6 { icmp::v6::ECHO_REPLY } else { icmp::v4::ECHO_REPLY };
    let old = be16(d, h.l4);
    d[h.l4] = reply;
    let c = adjust16(be16(d, h.l4 + 2), old, be16(d, h.l4));
    d[h.l4 + 2..h.l4 + 4].copy_from_slice(&c.to_be_bytes());
    if A::V6 {
        d[h.l3 + 7] = 64;
    } else {
        let old = be16(d, h.l3 + 8);
        d[h.l3 + 8] = 64;
        let c = adjust16(be16(d, h.l3 + 10), old, be16(d, h.l3 + 8));
        d[h.l3 + 10..h.l3 + 12].copy_from_slice(&c.to_be_bytes());
    }
    flows.counters.events.icmp_echo_replies += 1;
    egress(b, h.l3, &hop, A::ETHERTYPE)
}

/// Finds the session an ICMP error is about and how to translate it.
fn translate<A: Fam>(flows: &mut Flows, snap: &Snapshot, d: &[u8], h: &Hdr, now: u32) -> Result<Option<Translation<A>>, Verdict>
where
    Session<A>: Zeroable,
{
    let e = h.l4 + icmp::HEADER_LEN;
    let (ehl, eproto) = if A::V6 {
        if e + 44 > h.end {
            return Err(Verdict::Drop(DropReason::Truncated));
        }
        (40, d[e + 6])
    } else {
        if e + 20 > h.end || d[e] >> 4 != 4 {
            return Err(Verdict::Drop(DropReason::Truncated));
        }
        let ihl = ((d[e] & 0x0f) as usize) * 4;
        if ihl < 20 || e + ihl + 4 > h.end {
            return Err(Verdict::Drop(DropReason::Truncated));
        }
        (ihl, d[e + 9])
    };
    if eproto != proto::TCP && eproto != proto::UDP {
        return Ok(None);
    }
    let esrc = A::read(d, e + A::SRC);
    let edst = A::read(d, e + A::DST);
    let esport = be16(d, e + ehl);
    let edport = be16(d, e + ehl + 2);
    let outer_dst = A::read(d, h.l3 + A::DST);

    // The quoted packet left a VIP toward a client: the error goes to the backend.
    if let Some(sid) = snap.lookup_service(esrc.key(), esport, eproto) {
        let svc = snap.service(sid).expect("indexed service exists");
        let hh = flows.table.hash_fwd(sid, &edst, edport);
        let Some(r) = flows.table.find_fwd(hh, sid, &edst, edport).and_then(|r| flows.live::<A>(r, now)) else {
            return Ok(None);
        };
        let s = *flows.table.get::<A>(r);
        let be = snap.backend(s.backend).ok_or(Verdict::Drop(DropReason::BackendRemoved))?;
        let hop = be.hop.ok_or(Verdict::Drop(DropReason::NoNeighbor))?;
        let baddr = A::from_ip(be.addr).ok_or(Verdict::Drop(DropReason::NoRoute))?;
        let bport = if be.port != 0 { be.port } else { esport };
        return Ok(Some(match svc.spec.mode {
            Mode::Nat if s.laddr == crate::session::NO_LADDR => Translation { outer_src: None, outer_dst: baddr, emb_src: Some((baddr, bport)), emb_dst: None, hop, tunnel: None },
            Mode::Nat | Mode::Fnat => {
                let laddr = snap.laddr_addr(s.laddr).and_then(A::from_ip).ok_or(Verdict::Drop(DropReason::NoRoute))?;
                Translation { outer_src: Some(laddr), outer_dst: baddr, emb_src: Some((baddr, bport)), emb_dst: Some((laddr, s.lport)), hop, tunnel: None }
            }
            Mode::Dr => Translation { outer_src: None, outer_dst, emb_src: None, emb_dst: None, hop, tunnel: None },
            Mode::Tun => {
                let src = be.tun_src.and_then(A::from_ip).ok_or(Verdict::Drop(DropReason::NoRoute))?;
                Translation { outer_src: None, outer_dst, emb_src: None, emb_dst: None, hop, tunnel: Some((src, baddr)) }
            }
        }));
    }
    // The quoted packet left a local address (full NAT toward a backend, or SNAT outbound).
    if let Some(l) = snap.laddr(esrc.key()) {
        if !flows.table.owns_port(esport) {
            return Err(flows.elsewhere(esport));
        }
        let Some(r) = flows.table.port_lookup(l, esport) else { return Ok(None) };
        if r.is_v6() != A::V6 || flows.live::<A>(r, now).is_none() {
            return Ok(None);
        }
        let s = *flows.table.get::<A>(r);
        let hop = flows.route_to(snap, s.client.key(), !A::V6).ok_or(Verdict::Drop(DropReason::NoRoute))?;
        if s.flags & crate::session::flag::SNAT != 0 {
            return Ok(Some(Translation { outer_src: None, outer_dst: s.client, emb_src: Some((s.client, s.cport)), emb_dst: None, hop, tunnel: None }));
        }
        let svc = snap.service(s.svc).ok_or(Verdict::Drop(DropReason::BackendRemoved))?;
        let vip = A::from_ip(svc.spec.vip).ok_or(Verdict::Drop(DropReason::NoRoute))?;
        let vport = if svc.spec.port != 0 { svc.spec.port } else { edport };
        return Ok(Some(Translation { outer_src: Some(vip), outer_dst: s.client, emb_src: Some((s.client, s.cport)), emb_dst: Some((vip, vport)), hop, tunnel: None }));
    }
    // The quoted packet went from a client to a NAT backend.
    if let Some(ids) = snap.nat_backends(edst.key(), edport, eproto) {
        for &id in ids {
            let hh = flows.table.hash_rev(id, &esrc, esport);
            let Some(r) = flows.table.find_rev(hh, id, &esrc, esport).and_then(|r| flows.live::<A>(r, now)) else {
                continue;
            };
            let s = *flows.table.get::<A>(r);
            if s.state == state::FREE {
                continue;
            }
            let svc = snap.service(s.svc).ok_or(Verdict::Drop(DropReason::BackendRemoved))?;
            let vip = A::from_ip(svc.spec.vip).ok_or(Verdict::Drop(DropReason::NoRoute))?;
            let vport = if svc.spec.port != 0 { svc.spec.port } else { edport };
            let hop = flows.route_to(snap, s.client.key(), !A::V6).ok_or(Verdict::Drop(DropReason::NoRoute))?;
            return Ok(Some(Translation { outer_src: Some(vip), outer_dst: s.client, emb_src: None, emb_dst: Some((vip, vport)), hop, tunnel: None }));
        }
    }
    Ok(None)
}

fn apply_translation<A: Fam, B: PacketBuf>(flows: &mut Flows, b: &mut B, h: &Hdr, tr: Translation<A>) -> Verdict
where
    Session<A>: Zeroable,
{
    if h.ttl(b.data()) <= 1 {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    b.set_len(h.end);
    let d = b.data_mut();
    let e = h.l4 + icmp::HEADER_LEN;
    let ehl = if A::V6 { 40 } else { ((d[e] & 0x0f) as usize) * 4 };
    if let Some(a) = tr.outer_src {
        d[h.l3 + A::SRC..h.l3 + A::SRC + A::LEN].copy_from_slice(a.bytes());
    }
    d[h.l3 + A::DST..h.l3 + A::DST + A::LEN].copy_from_slice(tr.outer_dst.bytes());
    if let Some((a, p)) = tr.emb_src {
        d[e + A::SRC..e + A::SRC + A::LEN].copy_from_slice(a.bytes());
        d[e + ehl..e + ehl + 2].copy_from_slice(&p.to_be_bytes());
    }
    if let Some((a, p)) = tr.emb_dst {
        d[e + A::DST..e + A::DST + A::LEN].copy_from_slice(a.bytes());
        d[e + ehl + 2..e + ehl + 4].copy_from_slice(&p.to_be_bytes());
    }
    if !A::V6 {
        ipv4_header_checksum(d, e);
        ipv4_header_checksum(d, h.l3);
    }
    fill_l4_checksum::<A>(d, h.l3, h.l4, h.end, if A::V6 { proto::ICMPV6 } else { proto::ICMP });
    h.dec_ttl(d);
    flows.counters.events.icmp_errors_translated += 1;
    if let Some((src, dst)) = tr.tunnel {
        if let Err(e) = encapsulate::<A, A, B>(b, h, &src, &dst, || flows.next_ident()) {
            return Verdict::Drop(e);
        }
    }
    egress(b, h.l3, &tr.hop, A::ETHERTYPE)
}
