//! The virtio-net header that a tun interface opened with `IFF_VNET_HDR` puts before every
//! packet (linux/virtio_net.h), and what a data plane must do with the packets it describes:
//! complete a partial checksum (`NEEDS_CSUM`: the checksum field holds the pseudo-header's sum,
//! the rest is ours to add) and cut a segmentation-offload super-packet (TCP over IPv4 or IPv6,
//! UDP with `UDP_L4`) into packets of at most `gso_size` payload bytes, each with its own
//! lengths, sequence number and complete checksums.
//!
//! The header comes from the other side of the interface (a pod's kernel, on behalf of any
//! process in the pod) and is not trusted: its `hdr_len` is ignored (the headers are measured
//! from the packet), its checksum offsets and segment size are checked against the packet, and
//! what does not agree is an [`Error`], never a read outside the buffer.

use crate::checksum::{accumulate, fold, pseudo_v4, pseudo_v6};
use crate::ipv4::Ipv4Packet;
use crate::ipv6::Ipv6Packet;
use crate::{be16, be32, proto, Error, Result};

/// Bytes of the header (`struct virtio_net_hdr`, without `num_buffers`).
pub const HDR_LEN: usize = 10;

/// `flags`: the checksum from `csum_start` on is to be completed.
pub const NEEDS_CSUM: u8 = 1;
/// `flags`: the checksums were checked already.
pub const DATA_VALID: u8 = 2;

/// `gso_type` values (the ECN bit aside).
pub mod gso {
    pub const NONE: u8 = 0;
    pub const TCPV4: u8 = 1;
    /// UDP fragmentation offload (IP fragments of one datagram): never negotiated here.
    pub const UDP: u8 = 3;
    pub const TCPV6: u8 = 4;
    /// UDP segmentation (each segment its own datagram).
    pub const UDP_L4: u8 = 5;
    /// The super-packet's TCP had congestion experienced set (its segments keep CWR rules).
    pub const ECN: u8 = 0x80;
}

/// The smallest segment size accepted: below it a 64 KB super-packet would become thousands
/// of packets of headers.
pub const MIN_GSO_SIZE: u16 = 64;

/// A virtio-net header, its fields in host order (the wire is little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads the header at the start of `b`.
    pub fn parse(b: &[u8]) -> Result<VnetHdr> {
        let b: &[u8; HDR_LEN] = b.get(..HDR_LEN).ok_or(Error::Truncated)?.try_into().map_err(|_| Error::Truncated)?;
        let le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(VnetHdr { flags: b[0], gso_type: b[1], hdr_len: le(2), gso_size: le(4), csum_start: le(6), csum_offset: le(8) })
    }

    /// Writes the header to the start of `out` (at least [`HDR_LEN`] bytes).
    pub fn emit(&self, out: &mut [u8]) -> Result<()> {
        let o = out.get_mut(..HDR_LEN).ok_or(Error::Truncated)?;
        o[0] = self.flags;
        o[1] = self.gso_type;
        o[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        o[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        o[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        o[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        Ok(())
    }

    /// The segmentation type without the ECN bit.
    pub fn gso_kind(&self) -> u8 {
        self.gso_type & !gso::ECN
    }
}

/// Where an IP packet's upper layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Upper {
    v6: bool,
    proto: u8,
    /// The upper-layer header's offset.
    l4: usize,
    /// The packet's end as its IP header says (at most the buffer's).
    end: usize,
}

fn upper(ip: &[u8]) -> Result<Upper> {
    match ip.first().map(|b| b >> 4) {
        Some(4) => {
            let p = Ipv4Packet::new_checked(ip)?;
            if p.is_fragment() {
                // A fragment: no whole upper layer to complete or cut.
                return Err(Error::Malformed);
            }
            Ok(Upper { v6: false, proto: p.protocol(), l4: p.header_len(), end: p.total_len() as usize })
        }
        Some(6) => {
            let p = Ipv6Packet::new_checked(ip)?;
            let u = p.upper()?;
            if u.fragment.is_some() {
                return Err(Error::Malformed);
            }
            Ok(Upper { v6: true, proto: u.protocol, l4: u.offset, end: p.total_len() })
        }
        Some(_) => Err(Error::Malformed),
        None => Err(Error::Truncated),
    }
}

/// The pseudo-header sum of the packet's upper layer with `len` bytes of it.
fn pseudo(ip: &[u8], u: &Upper, len: usize) -> u64 {
    if u.v6 {
        let a: &[u8; 16] = ip[8..24].try_into().expect("a checked IPv6 header");
        let b: &[u8; 16] = ip[24..40].try_into().expect("a checked IPv6 header");
        pseudo_v6(a, b, u.proto, len as u32)
    } else {
        pseudo_v4(ip[12..16].try_into().expect("a checked IPv4 header"), ip[16..20].try_into().expect("a checked IPv4 header"), u.proto, len as u16)
    }
}

/// A ones' complement sum as a checksum field: zero is sent as all ones (UDP's zero means
/// "no checksum"; for TCP the two are the same).
fn field(sum: u64) -> u16 {
    match !fold(sum) {
        0 => 0xffff,
        c => c,
    }
}

/// Completes the partial checksum of the IP packet `ip` that `h` describes (`NEEDS_CSUM`): the
/// 16-bit field at `csum_start + csum_offset` holds the sum the sender started with (the
/// pseudo-header's); the sum of everything from `csum_start` to the packet's end is folded
/// into it. Nothing to do without `NEEDS_CSUM`.
pub fn complete_checksum(ip: &mut [u8], h: &VnetHdr) -> Result<()> {
    if h.flags & NEEDS_CSUM == 0 {
        return Ok(());
    }
    let u = upper(ip)?;
    let (start, at) = (h.csum_start as usize, h.csum_start as usize + h.csum_offset as usize);
    // The sum must cover the upper layer only, and its field must lie inside what it covers.
    if start < u.l4 || at + 2 > u.end || h.csum_offset & 1 != 0 {
        return Err(Error::Malformed);
    }
    let c = field(accumulate(0, &ip[start..u.end]));
    ip[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Whether a packet read with header `h` can cross the data plane whole, to be written to
/// another interface with offloads (a TCP or UDP packet, not a fragment, whose segmentation
/// agrees with its family and protocol): the segment size to carry with it (0 for a packet
/// that is not a super-packet). Its checksum offsets are not trusted: [`offload_hdr`]
/// measures them again when the packet is written.
pub fn keepable(ip: &[u8], h: &VnetHdr) -> Result<u16> {
    let u = upper(ip)?;
    let tcp = match u.proto {
        proto::TCP => true,
        proto::UDP => false,
        _ => return Err(Error::Malformed),
    };
    let l4len = l4_len(ip, &u, tcp)?;
    match (h.gso_kind(), u.v6, tcp) {
        (gso::NONE, ..) => Ok(0),
        (gso::TCPV4, false, true) | (gso::TCPV6, true, true) | (gso::UDP_L4, _, false) if h.gso_size >= MIN_GSO_SIZE => {
            // Only what is longer than one segment is a super-packet.
            Ok(if u.end - u.l4 - l4len > h.gso_size as usize { h.gso_size } else { 0 })
        }
        _ => Err(Error::Malformed),
    }
}

/// The upper-layer header's length (TCP's from its data offset).
fn l4_len(ip: &[u8], u: &Upper, tcp: bool) -> Result<usize> {
    let n = if tcp {
        let b = ip.get(u.l4 + 12).ok_or(Error::Truncated)?;
        let n = (b >> 4) as usize * 4;
        if n < 20 {
            return Err(Error::Malformed);
        }
        n
    } else {
        8
    };
    if u.l4 + n > u.end {
        return Err(Error::Truncated);
    }
    Ok(n)
}

/// The header to write before a TCP or UDP packet kept whole ([`keepable`]) to a tun
/// interface with offloads: its checksum left to the receiver (`NEEDS_CSUM`, the field given
/// the pseudo-header sum of the packet as it is now: its addresses or ports may have been
/// translated since it was read) and, when it is longer than one `gso_size` segment, its
/// segmentation. Anything else (a packet no longer TCP or UDP) is an error: write it plain.
pub fn offload_hdr(ip: &mut [u8], gso_size: u16) -> Result<VnetHdr> {
    let u = upper(ip)?;
    let (tcp, at) = match u.proto {
        proto::TCP => (true, 16),
        proto::UDP => (false, 6),
        _ => return Err(Error::Malformed),
    };
    let l4len = l4_len(ip, &u, tcp)?;
    let seed = fold(pseudo(ip, &u, u.end - u.l4));
    ip[u.l4 + at..u.l4 + at + 2].copy_from_slice(&seed.to_be_bytes());
    let big = gso_size >= MIN_GSO_SIZE && u.end - u.l4 - l4len > gso_size as usize;
    let gso_type = match (big, tcp, u.v6) {
        (false, ..) => gso::NONE,
        (true, true, false) => gso::TCPV4,
        (true, true, true) => gso::TCPV6,
        (true, false, _) => gso::UDP_L4,
    };
    let gso_size = if big { gso_size } else { 0 };
    Ok(VnetHdr { flags: NEEDS_CSUM, gso_type, hdr_len: (u.l4 + l4len) as u16, gso_size, csum_start: u.l4 as u16, csum_offset: at as u16 })
}

/// How many packets [`segment`] makes of a super-packet, and how long the longest is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segments {
    pub count: usize,
    pub largest: usize,
}

/// Cuts the super-packet `ip` that `h` describes (`gso_type` TCPV4, TCPV6 or UDP_L4) into
/// packets of at most `gso_size` payload bytes, each handed to `out` whole: its own IP
/// lengths (an IPv4 identifier one more than the last; the header checksum computed), for TCP
/// its own sequence number (FIN and PSH only on the last, CWR only on the first), for UDP its
/// own length, and its upper-layer checksum complete. A packet without segmentation
/// (`gso::NONE`) is handed on with its checksum completed. The `scratch` buffer is reused for
/// every packet (grown to the largest).
pub fn segment(ip: &[u8], h: &VnetHdr, scratch: &mut Vec<u8>, mut out: impl FnMut(&[u8])) -> Result<Segments> {
    let kind = h.gso_kind();
    if kind == gso::NONE {
        scratch.clear();
        scratch.extend_from_slice(ip);
        complete_checksum(scratch, h)?;
        let n = upper(scratch)?.end;
        out(&scratch[..n]);
        return Ok(Segments { count: 1, largest: n });
    }
    let u = upper(ip)?;
    let tcp = match (kind, u.v6, u.proto) {
        (gso::TCPV4, false, proto::TCP) | (gso::TCPV6, true, proto::TCP) => true,
        (gso::UDP_L4, _, proto::UDP) => false,
        _ => return Err(Error::Malformed),
    };
    let mss = h.gso_size as usize;
    if h.gso_size < MIN_GSO_SIZE {
        return Err(Error::Malformed);
    }
    let hdr = u.l4 + l4_len(ip, &u, tcp)?;
    let payload = &ip[hdr..u.end];
    let chunks = payload.len().div_ceil(mss).max(1);
    let seq = if tcp { be32(ip, u.l4 + 4) } else { 0 };
    let id = if u.v6 { 0 } else { be16(ip, 4) };
    let mut largest = 0;
    for (i, chunk) in payload.chunks(mss).chain(payload.is_empty().then_some(payload)).enumerate() {
        let (first, last) = (i == 0, i + 1 == chunks);
        scratch.clear();
        scratch.extend_from_slice(&ip[..hdr]);
        scratch.extend_from_slice(chunk);
        let n = scratch.len();
        let s = &mut scratch[..];
        if u.v6 {
            s[4..6].copy_from_slice(&((n - 40) as u16).to_be_bytes());
        } else {
            s[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
            let mut v4 = Ipv4Packet::new_unchecked(&mut s[..]);
            v4.set_total_len(n as u16);
            v4.fill_checksum();
        }
        let l4 = u.l4;
        let at = if tcp {
            s[l4 + 4..l4 + 8].copy_from_slice(&seq.wrapping_add((i * mss) as u32).to_be_bytes());
            let mut flags = s[l4 + 13];
            if !last {
                flags &= !(0x01 | 0x08); // FIN, PSH
            }
            if !first {
                flags &= !0x80; // CWR
            }
            s[l4 + 13] = flags;
            l4 + 16
        } else {
            s[l4 + 4..l4 + 6].copy_from_slice(&((n - l4) as u16).to_be_bytes());
            l4 + 6
        };
        s[at..at + 2].copy_from_slice(&[0, 0]);
        let c = field(accumulate(pseudo(s, &u, n - l4), &s[l4..n]));
        s[at..at + 2].copy_from_slice(&c.to_be_bytes());
        largest = largest.max(n);
        out(&scratch[..n]);
    }
    Ok(Segments { count: chunks, largest })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::checksum;

    /// A TCP super-packet as a sender's kernel hands it over with TSO: full IP lengths, the
    /// checksum field holding the pseudo-header sum only.
    fn tcp_super(v6: bool, ext: bool, payload: &[u8], flags: u8) -> (Vec<u8>, VnetHdr) {
        let mut tcp = vec![0u8; 32]; // 12 bytes of options (NOP NOP timestamp)
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&0xffff_ff00u32.to_be_bytes()); // wraps within the test
        tcp[8..12].copy_from_slice(&7u32.to_be_bytes());
        tcp[12] = 8 << 4;
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&512u16.to_be_bytes());
        tcp[20..32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        let mut ip = Vec::new();
        let l4len = tcp.len() + payload.len();
        if v6 {
            let exth = if ext { 8 } else { 0 };
            ip.extend_from_slice(&[0x60, 0, 0, 0]);
            ip.extend_from_slice(&((l4len + exth) as u16).to_be_bytes());
            ip.extend_from_slice(&[if ext { proto::IPV6_OPTS } else { proto::TCP }, 64]);
            ip.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            ip.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            if ext {
                ip.extend_from_slice(&[proto::TCP, 0, 1, 4, 0, 0, 0, 0]); // PadN
            }
        } else {
            ip.extend_from_slice(&[0x45, 0]);
            ip.extend_from_slice(&((20 + l4len) as u16).to_be_bytes());
            ip.extend_from_slice(&[0xff, 0xfe, 0x40, 0, 64, proto::TCP, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
            let c = checksum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        let l4 = ip.len();
        ip.extend_from_slice(&tcp);
        ip.extend_from_slice(payload);
        let u = upper(&ip).unwrap();
        let partial = fold(pseudo(&ip, &u, l4len));
        ip[l4 + 16..l4 + 18].copy_from_slice(&partial.to_be_bytes());
        let h =
            VnetHdr { flags: NEEDS_CSUM, gso_type: if v6 { gso::TCPV6 } else { gso::TCPV4 }, hdr_len: (l4 + 32) as u16, gso_size: 1000, csum_start: l4 as u16, csum_offset: 16 };
        (ip, h)
    }

    fn udp_super(v6: bool, payload: &[u8]) -> (Vec<u8>, VnetHdr) {
        let (mut ip, _) = tcp_super(v6, false, &[], 0);
        // Rewrite as UDP: the same IP header, an 8-byte UDP header.
        let l4 = if v6 { 40 } else { 20 };
        ip.truncate(l4);
        if v6 {
            ip[6] = proto::UDP;
            ip[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        } else {
            ip[9] = proto::UDP;
            ip[2..4].copy_from_slice(&((l4 + 8 + payload.len()) as u16).to_be_bytes());
            ip[10..12].copy_from_slice(&[0, 0]);
            let c = checksum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        ip.extend_from_slice(&[0x13, 0x88, 0x13, 0x89]);
        ip.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 0]);
        ip.extend_from_slice(payload);
        let u = upper(&ip).unwrap();
        let partial = fold(pseudo(&ip, &u, 8 + payload.len()));
        ip[l4 + 6..l4 + 8].copy_from_slice(&partial.to_be_bytes());
        (ip, VnetHdr { flags: NEEDS_CSUM, gso_type: gso::UDP_L4, hdr_len: 0, gso_size: 1200, csum_start: l4 as u16, csum_offset: 6 })
    }

    /// Whether a whole packet's checksums verify (IPv4 header, upper layer with its pseudo
    /// header).
    fn verifies(p: &[u8]) -> bool {
        let u = upper(p).unwrap();
        let ipok = u.v6 || checksum(&p[..u.l4]) == 0;
        ipok && fold(accumulate(pseudo(p, &u, u.end - u.l4), &p[u.l4..u.end])) == 0xffff
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn the_header_reads_and_writes_little_endian() {
        let h = VnetHdr { flags: NEEDS_CSUM, gso_type: gso::TCPV4 | gso::ECN, hdr_len: 66, gso_size: 1448, csum_start: 34, csum_offset: 16 };
        let mut b = [0u8; HDR_LEN];
        h.emit(&mut b).unwrap();
        assert_eq!(b, [1, 0x81, 66, 0, 0xa8, 5, 34, 0, 16, 0]);
        assert_eq!(VnetHdr::parse(&b), Ok(h));
        assert_eq!(h.gso_kind(), gso::TCPV4);
        assert_eq!(VnetHdr::parse(&b[..9]), Err(Error::Truncated));
    }

    #[test]
    fn a_partial_checksum_is_completed_for_both_families_and_extension_headers() {
        for (v6, ext) in [(false, false), (true, false), (true, true)] {
            for n in [0, 1, 999, 1000, 1001] {
                let (mut ip, mut h) = tcp_super(v6, ext, &payload(n), 0x18);
                h.gso_type = gso::NONE;
                complete_checksum(&mut ip, &h).unwrap();
                assert!(verifies(&ip), "v6 {v6} ext {ext} n {n}");
            }
        }
        let (mut ip, mut h) = udp_super(false, &payload(33));
        h.gso_type = gso::NONE;
        complete_checksum(&mut ip, &h).unwrap();
        assert!(verifies(&ip));
    }

    #[test]
    fn checksum_offsets_outside_the_upper_layer_are_refused() {
        let (ip, h) = tcp_super(false, false, &payload(10), 0);
        for bad in
            [VnetHdr { csum_start: 10, ..h }, VnetHdr { csum_offset: 500, ..h }, VnetHdr { csum_offset: 17, ..h }, VnetHdr { csum_start: u16::MAX, csum_offset: u16::MAX, ..h }]
        {
            let mut p = ip.clone();
            assert_eq!(complete_checksum(&mut p, &bad), Err(Error::Malformed), "{bad:?}");
            assert_eq!(p, ip, "nothing written");
        }
        // Without NEEDS_CSUM the offsets are not used.
        let mut p = ip.clone();
        assert_eq!(complete_checksum(&mut p, &VnetHdr { flags: 0, csum_start: u16::MAX, ..h }), Ok(()));
    }

    #[test]
    fn tcp_super_packets_become_segments_with_their_own_sequence_lengths_and_checksums() {
        for (v6, ext) in [(false, false), (true, false), (true, true)] {
            for n in [1, 999, 1000, 1001, 2500, 65_000 - 100] {
                let data = payload(n);
                let (ip, h) = tcp_super(v6, ext, &data, 0x80 | 0x18 | 0x01); // CWR PSH ACK FIN
                let mut segs = Vec::new();
                let r = segment(&ip, &h, &mut Vec::new(), |s| segs.push(s.to_vec())).unwrap();
                assert_eq!(r.count, n.div_ceil(1000));
                assert_eq!(segs.len(), r.count);
                let mut joined = Vec::new();
                for (i, s) in segs.iter().enumerate() {
                    assert!(verifies(s), "v6 {v6} ext {ext} n {n} segment {i}");
                    let u = upper(s).unwrap();
                    assert_eq!(u.end, s.len());
                    let seq = be32(s, u.l4 + 4);
                    assert_eq!(seq, 0xffff_ff00u32.wrapping_add(i as u32 * 1000));
                    let flags = s[u.l4 + 13];
                    let last = i + 1 == segs.len();
                    assert_eq!(flags & 0x01 != 0, last, "FIN only on the last");
                    assert_eq!(flags & 0x08 != 0, last, "PSH only on the last");
                    assert_eq!(flags & 0x80 != 0, i == 0, "CWR only on the first");
                    assert_eq!(flags & 0x10, 0x10, "ACK on all");
                    if !v6 {
                        assert_eq!(be16(s, 4), 0xfffeu16.wrapping_add(i as u16), "IPv4 identifiers count on (and wrap)");
                    }
                    assert_eq!(&s[u.l4 + 20..u.l4 + 32], &ip[u.l4 + 20..u.l4 + 32], "options on every segment");
                    joined.extend_from_slice(&s[u.l4 + 32..]);
                    assert!(s.len() - u.l4 - 32 <= 1000);
                }
                assert_eq!(joined, data);
            }
        }
    }

    #[test]
    fn udp_super_packets_become_datagrams() {
        for v6 in [false, true] {
            let data = payload(5000);
            let (ip, h) = udp_super(v6, &data);
            let mut segs = Vec::new();
            let r = segment(&ip, &h, &mut Vec::new(), |s| segs.push(s.to_vec())).unwrap();
            assert_eq!(r.count, 5);
            let mut joined = Vec::new();
            for s in &segs {
                assert!(verifies(s));
                let u = upper(s).unwrap();
                assert_eq!(be16(s, u.l4 + 4) as usize, s.len() - u.l4);
                joined.extend_from_slice(&s[u.l4 + 8..]);
            }
            assert_eq!(joined, data);
        }
    }

    #[test]
    fn a_packet_without_segmentation_is_handed_on_completed() {
        let (ip, mut h) = tcp_super(true, true, &payload(700), 0x18);
        h.gso_type = gso::NONE;
        let mut got = Vec::new();
        assert_eq!(segment(&ip, &h, &mut Vec::new(), |s| got = s.to_vec()), Ok(Segments { count: 1, largest: ip.len() }));
        assert!(verifies(&got));
    }

    #[test]
    fn a_kept_packet_translated_on_its_way_is_completed_right_by_the_receiver() {
        // A super-packet kept whole, its destination rewritten (a Service's translation), then
        // written with offload_hdr: what the receiving kernel would do (segment, or complete
        // the checksum) gives packets that verify, for both families, TCP and UDP.
        for v6 in [false, true] {
            for tcp in [true, false] {
                let (mut ip, h) = if tcp { tcp_super(v6, false, &payload(2500), 0x18) } else { udp_super(v6, &payload(2500)) };
                let keep = keepable(&ip, &h).unwrap();
                assert_eq!(keep, h.gso_size);
                let dst = if v6 { 24..40 } else { 16..20 };
                ip[dst.start] ^= 0x5a;
                if !v6 {
                    Ipv4Packet::new_unchecked(&mut ip[..]).fill_checksum();
                }
                let out = offload_hdr(&mut ip, keep).unwrap();
                assert_eq!((out.flags, out.gso_size), (NEEDS_CSUM, h.gso_size));
                assert_eq!(out.gso_type, h.gso_type, "v6 {v6} tcp {tcp}");
                assert_eq!((out.csum_start, out.csum_offset), (h.csum_start, h.csum_offset));
                let mut n = 0;
                segment(&ip, &out, &mut Vec::new(), |s| {
                    assert!(verifies(s));
                    n += 1;
                })
                .unwrap();
                assert_eq!(n, 3);
                // One segment's worth or less: a plain packet with its checksum left to the
                // receiver.
                let (mut small, h) = if tcp { tcp_super(v6, false, &payload(900), 0x18) } else { udp_super(v6, &payload(900)) };
                assert_eq!(keepable(&small, &h), Ok(0));
                let out = offload_hdr(&mut small, 0).unwrap();
                assert_eq!((out.gso_type, out.gso_size), (gso::NONE, 0));
                complete_checksum(&mut small, &out).unwrap();
                assert!(verifies(&small));
            }
        }
        // Not TCP or UDP, a type that disagrees, a fragment: not kept.
        let (ip, h) = tcp_super(false, false, &payload(2500), 0x18);
        assert_eq!(keepable(&ip, &VnetHdr { gso_type: gso::TCPV6, ..h }), Err(Error::Malformed));
        assert_eq!(keepable(&ip, &VnetHdr { gso_size: 10, ..h }), Err(Error::Malformed));
        assert_eq!(keepable(&ip, &VnetHdr { gso_type: gso::UDP, ..h }), Err(Error::Malformed));
        let mut icmp = ip.clone();
        icmp[9] = proto::ICMP;
        assert_eq!(keepable(&icmp, &VnetHdr { gso_type: gso::NONE, ..h }), Err(Error::Malformed));
        assert_eq!(offload_hdr(&mut icmp, 1000), Err(Error::Malformed));
        let mut frag = ip.clone();
        frag[6] = 0x20;
        assert_eq!(keepable(&frag, &h), Err(Error::Malformed));
        for n in 0..ip.len().min(200) {
            let _ = keepable(&ip[..n], &h);
            let _ = offload_hdr(&mut ip[..n].to_vec(), 1000);
        }
    }

    #[test]
    fn hostile_headers_are_refused_not_followed() {
        let (ip, h) = tcp_super(false, false, &payload(3000), 0x10);
        let none = |p: &[u8], h: &VnetHdr| segment(p, h, &mut Vec::new(), |_| panic!("no segment of a refused packet"));
        // A segment size that would make thousands of packets, or none.
        assert_eq!(none(&ip, &VnetHdr { gso_size: 0, ..h }), Err(Error::Malformed));
        assert_eq!(none(&ip, &VnetHdr { gso_size: MIN_GSO_SIZE - 1, ..h }), Err(Error::Malformed));
        // A type that does not match the packet: TCPV6 on IPv4, TCP on a UDP packet, UFO.
        assert_eq!(none(&ip, &VnetHdr { gso_type: gso::TCPV6, ..h }), Err(Error::Malformed));
        assert_eq!(none(&ip, &VnetHdr { gso_type: gso::UDP_L4, ..h }), Err(Error::Malformed));
        assert_eq!(none(&ip, &VnetHdr { gso_type: gso::UDP, ..h }), Err(Error::Malformed));
        // IP lengths longer than the buffer, a TCP header longer than the packet, a fragment.
        let mut long = ip.clone();
        long[2..4].copy_from_slice(&(ip.len() as u16 + 1).to_be_bytes());
        assert_eq!(none(&long, &h), Err(Error::Truncated));
        let mut short = ip[..20 + 20].to_vec();
        short[2..4].copy_from_slice(&40u16.to_be_bytes());
        assert_eq!(none(&short, &h), Err(Error::Truncated), "the data offset says 32 bytes of TCP header, 20 are there");
        let mut frag = ip.clone();
        frag[6] = 0x20;
        assert_eq!(none(&frag, &h), Err(Error::Malformed));
        // hdr_len is not trusted: a lie changes nothing.
        let mut a = Vec::new();
        let mut b = Vec::new();
        segment(&ip, &h, &mut Vec::new(), |s| a.push(s.to_vec())).unwrap();
        segment(&ip, &VnetHdr { hdr_len: 3, ..h }, &mut Vec::new(), |s| b.push(s.to_vec())).unwrap();
        assert_eq!(a, b);
        // Truncated and garbage buffers of every length: errors, never a panic.
        for n in 0..ip.len().min(200) {
            let _ = segment(&ip[..n], &h, &mut Vec::new(), |_| {});
            let mut p = ip[..n].to_vec();
            let _ = complete_checksum(&mut p, &h);
        }
    }
}
