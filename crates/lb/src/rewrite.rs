//! In-place header edits with incremental checksum updates (RFC 1624), shared by every
//! forwarding mode, plus the address-family glue the pipeline is generic over.
//!
//! The incremental sums are taken in the machine's byte order, not the network's: the
//! ones'-complement sum of byte-swapped words is the byte-swapped sum (RFC 1071 §2(B)), so
//! reading the checksum, the old and the new fields the same way gives the right checksum
//! without swapping a byte.

use crate::mem::Zeroable;
use crate::service::{key4, key6, Hop};
use crate::session::{Addr, Session};
use crate::verdict::{DropReason, Verdict};
use crate::PacketBuf;
use std::net::IpAddr;
use vectorlb_packet::checksum::adjust16;
use vectorlb_packet::ethernet::{self, ethertype};
use vectorlb_packet::proto;

/// An IP family's header layout.
pub trait Fam: Addr
where
    Session<Self>: Zeroable,
{
    const LEN: usize;
    /// The fixed header's length (options and extension headers follow it).
    const HEADER: usize;
    const SRC: usize;
    const DST: usize;
    const ETHERTYPE: u16;
    fn read(d: &[u8], at: usize) -> Self;
    fn key(&self) -> u128;
    fn bytes(&self) -> &[u8];
    fn from_ip(ip: IpAddr) -> Option<Self>;
    /// From the 16-byte form the snapshot keeps (IPv4 in the first four bytes).
    fn from16(b: &[u8; 16]) -> Self;
    /// Ones'-complement difference of replacing the address `old` by `new`, in the machine's
    /// byte order (see the module). Sums of 32-bit words fold to the same 16-bit checksum as
    /// sums of 16-bit words (2^16 = 1 mod 0xffff).
    fn delta(old: &Self, new: &Self) -> u64;
}

impl Fam for [u8; 4] {
    const LEN: usize = 4;
    const HEADER: usize = 20;
    const SRC: usize = 12;
    const DST: usize = 16;
    const ETHERTYPE: u16 = ethertype::IPV4;
    #[inline(always)]
    fn read(d: &[u8], at: usize) -> Self {
        d[at..at + 4].try_into().unwrap()
    }
    #[inline(always)]
    fn key(&self) -> u128 {
        key4(*self)
    }
    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        self
    }
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(a.octets()),
            IpAddr::V6(_) => None,
        }
    }
    #[inline(always)]
    fn from16(b: &[u8; 16]) -> Self {
        [b[0], b[1], b[2], b[3]]
    }
    #[inline(always)]
    fn delta(old: &Self, new: &Self) -> u64 {
        (!u32::from_ne_bytes(*old)) as u64 + u32::from_ne_bytes(*new) as u64
    }
}

impl Fam for [u8; 16] {
    const LEN: usize = 16;
    const HEADER: usize = 40;
    const SRC: usize = 8;
    const DST: usize = 24;
    const ETHERTYPE: u16 = ethertype::IPV6;
    #[inline(always)]
    fn read(d: &[u8], at: usize) -> Self {
        d[at..at + 16].try_into().unwrap()
    }
    #[inline(always)]
    fn key(&self) -> u128 {
        key6(*self)
    }
    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        self
    }
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(a) => Some(a.octets()),
            IpAddr::V4(_) => None,
        }
    }
    #[inline(always)]
    fn from16(b: &[u8; 16]) -> Self {
        *b
    }
    #[inline(always)]
    fn delta(old: &Self, new: &Self) -> u64 {
        let w = |a: &[u8; 16], i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]) as u64;
        let n = |a: &[u8; 16], i: usize| (!u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]])) as u64;
        n(old, 0) + n(old, 4) + n(old, 8) + n(old, 12) + w(new, 0) + w(new, 4) + w(new, 8) + w(new, 12)
    }
}

/// Whether a packet longer than `mtu` is a pod's super-packet (kept whole, its segment size in
/// [`PacketBuf::offload`]) whose packets fit: its headers and one segment. Asked only of
/// packets longer than the MTU (the offload is in the buffer's second cache line).
#[cold]
pub fn segments_fit<B: PacketBuf>(b: &B, l3: usize, l4: usize, proto: u8, mtu: usize) -> bool {
    let seg = b.offload().gso_size as usize;
    if seg == 0 {
        return false;
    }
    let l4h = if proto == proto::TCP { (b.data().get(l4 + 12).copied().unwrap_or(0xf0) >> 4) as usize * 4 } else { 8 };
    l4.saturating_sub(l3) + l4h + seg <= mtu
}

/// Where the layers of the packet being edited are.
#[derive(Debug, Clone, Copy)]
pub struct Hdr {
    pub l3: usize,
    pub l4: usize,
    pub end: usize,
    pub v6: bool,
    pub proto: u8,
}

impl Hdr {
    /// Full and plain NAT in one pass: rewrites the source and/or destination address and
    /// port (a port of 0 is left as it is), decrements the TTL, and updates the IPv4 header and
    /// upper-layer checksums once each.
    #[inline(always)]
    pub fn translate<A: Fam>(&self, d: &mut [u8], src: Option<(&A, u16)>, dst: Option<(&A, u16)>)
    where
        Session<A>: Zeroable,
    {
        // The parser checked that the IP header and the transport header are in the frame:
        // one bounds check for each, and the constant offsets below need none.
        let (head, l4h) = d.split_at_mut(self.l4);
        let ip = &mut head[self.l3..self.l3 + A::HEADER];
        let ports = &mut l4h[..8];
        let mut ip_acc = 0u64;
        let mut l4_acc = 0u64;
        if let Some((a, port)) = src {
            let old = A::read(ip, A::SRC);
            ip_acc += A::delta(&old, a);
            ip[A::SRC..A::SRC + A::LEN].copy_from_slice(a.bytes());
            if port != 0 {
                let (old, new) = (u16::from_ne_bytes([ports[0], ports[1]]), port.to_be_bytes());
                l4_acc += (!old) as u64 + u16::from_ne_bytes(new) as u64;
                ports[0..2].copy_from_slice(&new);
            }
        }
        if let Some((a, port)) = dst {
            let old = A::read(ip, A::DST);
            ip_acc += A::delta(&old, a);
            ip[A::DST..A::DST + A::LEN].copy_from_slice(a.bytes());
            if port != 0 {
                let (old, new) = (u16::from_ne_bytes([ports[2], ports[3]]), port.to_be_bytes());
                l4_acc += (!old) as u64 + u16::from_ne_bytes(new) as u64;
                ports[2..4].copy_from_slice(&new);
            }
        }
        // Addresses are in the pseudo header: they change the upper-layer checksum too.
        l4_acc += ip_acc;
        if A::V6 {
            ip[7] = ip[7].wrapping_sub(1);
        } else {
            // TTL is the first byte of its word: decrementing it subtracts that word's 1 in its
            // first byte (0x0100 read in network order), added as its complement.
            ip[8] = ip[8].wrapping_sub(1);
            ip_acc += (!u16::from_ne_bytes([1, 0])) as u64;
            apply(&mut ip[10..12], ip_acc, false);
        }
        match self.proto {
            proto::TCP => apply(&mut l4h[16..18], l4_acc, false),
            proto::UDP if A::V6 || ports[6] | ports[7] != 0 => apply(&mut ports[6..8], l4_acc, true),
            _ => {}
        }
    }

    #[inline(always)]
    pub fn ttl(&self, d: &[u8]) -> u8 {
        d[self.l3 + if self.v6 { 7 } else { 8 }]
    }

    /// Decrements TTL / hop limit (IPv4 checksum patched).
    #[inline(always)]
    pub fn dec_ttl(&self, d: &mut [u8]) {
        if self.v6 {
            d[self.l3 + 7] = d[self.l3 + 7].wrapping_sub(1);
        } else {
            let at = self.l3 + 8;
            let old = u16::from_be_bytes([d[at], d[at + 1]]);
            d[at] = d[at].wrapping_sub(1);
            let new = u16::from_be_bytes([d[at], d[at + 1]]);
            let c = u16::from_be_bytes([d[self.l3 + 10], d[self.l3 + 11]]);
            d[self.l3 + 10..self.l3 + 12].copy_from_slice(&adjust16(c, old, new).to_be_bytes());
        }
    }

    /// Length of the IP packet.
    #[inline(always)]
    pub fn ip_len(&self) -> usize {
        self.end - self.l3
    }

    #[inline(always)]
    pub fn dont_frag(&self, d: &[u8]) -> bool {
        self.v6 || d[self.l3 + 6] & 0x40 != 0
    }
}

/// Adds a difference (in the machine's byte order) to the two-byte checksum `c` (RFC 1624
/// eqn. 3).
#[inline(always)]
fn apply(c: &mut [u8], acc: u64, udp: bool) {
    let old = u16::from_ne_bytes([c[0], c[1]]);
    let mut n = !vectorlb_packet::checksum::fold((!old) as u64 + acc);
    // UDP sends a zero sum as all ones (0 means "no checksum"); both are their own swap.
    if n == 0 && udp {
        n = 0xffff;
    }
    c.copy_from_slice(&n.to_ne_bytes());
}

/// Rewrites the Ethernet header for `hop` in front of the IP header at `l3`, growing or
/// shrinking the frame's front as the egress VLAN tag requires.
#[inline(always)]
pub fn egress<B: PacketBuf>(b: &mut B, l3: usize, hop: &Hop, et: u16) -> Verdict {
    let hl = ethernet::header_len(hop.vlan);
    if l3 > hl {
        b.adj(l3 - hl);
    } else if l3 < hl && !b.prepend(hl - l3) {
        return Verdict::Drop(DropReason::NoRoom);
    }
    let d = b.data_mut();
    if hop.vlan.is_none() && d.len() >= 14 {
        // The common case: twelve bytes of addresses from the hop, then the ethertype.
        d[..12].copy_from_slice(&hop.macs);
        d[12..14].copy_from_slice(&et.to_be_bytes());
    } else {
        ethernet::write_header(&mut d[..hl], hop.dst_mac(), hop.src_mac(), hop.vlan, et);
    }
    Verdict::Tx(hop.port)
}

/// Prepends an outer header of family `O` (IPv4 or IPv6) to the packet of family `A`: next
/// protocol 4 for an IPv4 packet, 41 for an IPv6 one, so IPv4-in-IPv4, IPv6-in-IPv6 and, for
/// backends of the other family, IPv4-in-IPv6 and IPv6-in-IPv4. The inner packet's traffic
/// class goes outside; an IPv4 outer header gets the inner DF bit (always DF over IPv6, which
/// routers never fragment). `ident` gives the IPv4 header's identification (asked only for
/// IPv4).
pub(crate) fn encapsulate<A: Fam, O: Fam, B: PacketBuf>(b: &mut B, h: &Hdr, src: &O, dst: &O, ident: impl FnOnce() -> u16) -> Result<(), DropReason>
where
    Session<A>: Zeroable,
    Session<O>: Zeroable,
{
    let over = O::HEADER;
    let inner = h.ip_len();
    if !b.set_len(h.end) || !b.prepend(over) {
        return Err(DropReason::NoRoom);
    }
    let d = b.data_mut();
    let o = h.l3;
    let i = o + over;
    let next = if A::V6 { proto::IPV6 } else { proto::IPIP };
    let tos = if A::V6 { (d[i] << 4) | (d[i + 1] >> 4) } else { d[i + 1] };
    if O::V6 {
        if A::V6 {
            // Version, traffic class and flow label as the inner packet has them.
            d.copy_within(i..i + 4, o);
        } else {
            d[o..o + 4].copy_from_slice(&[0x60 | (tos >> 4), tos << 4, 0, 0]);
        }
        d[o + 4..o + 6].copy_from_slice(&(inner as u16).to_be_bytes());
        d[o + 6] = next;
        d[o + 7] = 64;
    } else {
        let ident = ident();
        d[o] = 0x45;
        d[o + 1] = tos;
        d[o + 2..o + 4].copy_from_slice(&((inner + 20) as u16).to_be_bytes());
        d[o + 4..o + 6].copy_from_slice(&ident.to_be_bytes());
        d[o + 6] = if A::V6 { 0x40 } else { d[i + 6] & 0x40 };
        d[o + 7] = 0;
        d[o + 8] = 64;
        d[o + 9] = next;
        d[o + 10] = 0;
        d[o + 11] = 0;
    }
    d[o + O::SRC..o + O::SRC + O::LEN].copy_from_slice(src.bytes());
    d[o + O::DST..o + O::DST + O::LEN].copy_from_slice(dst.bytes());
    if !O::V6 {
        vectorlb_packet::ipv4::Ipv4Packet::new_unchecked(&mut d[o..]).fill_checksum();
    }
    Ok(())
}

/// Recomputes the upper-layer checksum of `d[l4..end]` (pseudo header included where the
/// protocol has one).
pub fn fill_l4_checksum<A: Fam>(d: &mut [u8], l3: usize, l4: usize, end: usize, protocol: u8)
where
    Session<A>: Zeroable,
{
    let at = match protocol {
        proto::TCP => 16,
        proto::UDP => 6,
        proto::ICMP | proto::ICMPV6 => 2,
        _ => return,
    };
    d[l4 + at] = 0;
    d[l4 + at + 1] = 0;
    let len = end - l4;
    let pseudo = if protocol == proto::ICMP {
        0
    } else if A::V6 {
        let s: [u8; 16] = d[l3 + 8..l3 + 24].try_into().unwrap();
        let t: [u8; 16] = d[l3 + 24..l3 + 40].try_into().unwrap();
        vectorlb_packet::checksum::pseudo_v6(&s, &t, protocol, len as u32)
    } else {
        let s: [u8; 4] = d[l3 + 12..l3 + 16].try_into().unwrap();
        let t: [u8; 4] = d[l3 + 16..l3 + 20].try_into().unwrap();
        vectorlb_packet::checksum::pseudo_v4(s, t, protocol, len as u16)
    };
    let mut c = vectorlb_packet::checksum::finish(vectorlb_packet::checksum::accumulate(pseudo, &d[l4..end]));
    if c == 0 && protocol == proto::UDP {
        c = 0xffff;
    }
    d[l4 + at..l4 + at + 2].copy_from_slice(&c.to_be_bytes());
}
