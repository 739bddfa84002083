//! IP fragments of the LB's flows (IPv4 and IPv6, every mode, both directions).
//!
//! The LB does not reassemble. The **first fragment** carries the ports: it is classified and
//! translated like an unfragmented packet of its flow (the L4 checksum, which covers the whole
//! datagram, is updated incrementally, which stays right for the reassembled datagram), and what
//! it became is remembered per core under (source, destination, protocol, identification):
//! the new addresses, the tunnel header for `tun`, the Ethernet header and port it left on.
//! **Later fragments** have no ports; they are found in that table and rewritten the same way
//! (addresses, TTL, the outer header). The table is small (at most [`MAX_FRAGS`] datagrams per
//! core) and short-lived ([`FRAG_TTL`]); a later fragment whose first one was not seen (lost,
//! reordered, or never sent to this core) is dropped and counted (`fragment_no_first`) when
//! it is addressed to the LB, and goes to the kernel otherwise.

use crate::flows::Flows;
use crate::hash::FxHashMap;
use crate::mem::Zeroable;
use crate::rewrite::{encapsulate, Fam, Hdr};
use crate::session::{expired, Session};
use crate::verdict::{DropReason, Verdict};
use vectorlb_io::PacketBuf;
use vectorlb_packet::checksum::adjust;

/// Datagrams remembered per core.
pub const MAX_FRAGS: usize = 4096;
/// How long a datagram's first fragment is remembered (ms).
pub const FRAG_TTL: u32 = 2_000;

/// A datagram: source, destination, protocol, identification.
pub(crate) type FragKey = (u128, u128, u8, u32);

/// What a datagram's first fragment became.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FragOut {
    src: [u8; 16],
    dst: [u8; 16],
    /// The outer source and destination (`tun`).
    tunnel: Option<([u8; 16], [u8; 16])>,
    /// The Ethernet header it left with (14 or 18 bytes) and the port.
    l2: [u8; 18],
    l2_len: u8,
    port: u16,
    mtu: u16,
    expire: u32,
}

/// The datagram a fragment belongs to (source, destination, protocol, identification); a
/// malformed IPv6 fragment header is dropped.
pub(crate) fn key<A: Fam>(d: &[u8], h: &Hdr) -> Result<FragKey, Verdict>
where
    Session<A>: Zeroable,
{
    let src = A::read(d, h.l3 + A::SRC);
    let dst = A::read(d, h.l3 + A::DST);
    let id = if A::V6 {
        match vectorlb_packet::ipv6::Ipv6Packet::new_checked(&d[h.l3..]).ok().and_then(|p| p.upper().ok()).and_then(|u| u.fragment) {
            Some(f) => f.ident,
            None => return Err(Verdict::Drop(DropReason::Malformed)),
        }
    } else {
        u16::from_be_bytes([d[h.l3 + 4], d[h.l3 + 5]]) as u32
    };
    Ok((src.key(), dst.key(), h.proto, id))
}

/// What the first fragments of datagrams became, for their later fragments: the core's
/// fragment state.
#[derive(Default)]
pub struct FragTable {
    map: FxHashMap<FragKey, FragOut>,
}

impl FragTable {
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Records what the first fragment in `out` (as it leaves on `port`, whose MTU is `mtu`)
    /// became; false when the table is full of live datagrams (the later fragments will be
    /// dropped or go to the kernel).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn remember<A: Fam>(&mut self, out: &[u8], key: FragKey, port: u16, mtu: u16, tun: bool, now: u32) -> bool
    where
        Session<A>: Zeroable,
    {
        // The Ethernet header egress wrote: 14 bytes, or 18 with a VLAN tag.
        let l3 = if out.len() > 14 && out[12..14] == [0x81, 0x00] { 18 } else { 14 };
        if out.len() < l3 + A::HEADER * if tun { 2 } else { 1 } {
            return true;
        }
        // A tunnel to a backend of the other family: its later fragments are not followed
        // (counted as untracked; the first one went).
        if out[l3 - 2..l3] != A::ETHERTYPE.to_be_bytes() {
            return false;
        }
        let a16 = |at: usize| {
            let mut x = [0u8; 16];
            x[..A::LEN].copy_from_slice(&out[at..at + A::LEN]);
            x
        };
        let (src, dst, tunnel) = if tun {
            let inner = l3 + A::HEADER;
            (a16(inner + A::SRC), a16(inner + A::DST), Some((a16(l3 + A::SRC), a16(l3 + A::DST))))
        } else {
            (a16(l3 + A::SRC), a16(l3 + A::DST), None)
        };
        let mut l2 = [0u8; 18];
        l2[..l3].copy_from_slice(&out[..l3]);
        if self.map.len() >= MAX_FRAGS {
            self.map.retain(|_, e| !expired(now, e.expire));
            if self.map.len() >= MAX_FRAGS {
                return false;
            }
        }
        self.map.insert(key, FragOut { src, dst, tunnel, l2, l2_len: l3 as u8, port, mtu, expire: now.wrapping_add(FRAG_TTL) });
        true
    }

    /// A later fragment: rewritten as its datagram's first fragment was.
    /// `own`: the datagram is addressed to the LB (no first fragment: dropped, not the kernel's).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn later<A: Fam, B: PacketBuf>(&self, flows: &mut Flows, b: &mut B, h: &Hdr, key: &FragKey, own: bool, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let Some(e) = self.map.get(key).copied().filter(|e| !expired(now, e.expire)) else {
            return if own { Verdict::Drop(DropReason::FragmentNoFirst) } else { Verdict::Kernel };
        };
        if h.ttl(b.data()) <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let over = if e.tunnel.is_some() { A::HEADER } else { 0 };
        if h.ip_len() + over > e.mtu as usize {
            return Verdict::Drop(DropReason::MtuExceeded);
        }
        let d = b.data_mut();
        let ip = &mut d[h.l3..h.l3 + A::HEADER];
        let (nsrc, ndst) = (A::from16(&e.src), A::from16(&e.dst));
        if !A::V6 {
            // Addresses and TTL, with the header checksum updated for what changed.
            let mut c = u16::from_be_bytes([ip[10], ip[11]]);
            c = adjust(c, &ip[A::SRC..A::SRC + 4], nsrc.bytes());
            c = adjust(c, &ip[A::DST..A::DST + 4], ndst.bytes());
            let ttl = [ip[8], ip[9]];
            ip[8] = ip[8].wrapping_sub(1);
            c = adjust(c, &ttl, &[ip[8], ip[9]]);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        } else {
            ip[7] = ip[7].wrapping_sub(1);
        }
        ip[A::SRC..A::SRC + A::LEN].copy_from_slice(nsrc.bytes());
        ip[A::DST..A::DST + A::LEN].copy_from_slice(ndst.bytes());
        if let Some((ts, td)) = e.tunnel {
            if let Err(r) = encapsulate::<A, A, B>(b, h, &A::from16(&ts), &A::from16(&td), || flows.next_ident()) {
                return Verdict::Drop(r);
            }
        }
        // The first fragment's Ethernet header, in front of the IP header.
        let hl = e.l2_len as usize;
        if h.l3 > hl {
            b.adj(h.l3 - hl);
        } else if h.l3 < hl && !b.prepend(hl - h.l3) {
            return Verdict::Drop(DropReason::NoRoom);
        }
        b.data_mut()[..hl].copy_from_slice(&e.l2[..hl]);
        flows.counters.events.fragments_forwarded += 1;
        Verdict::Tx(e.port)
    }
}
