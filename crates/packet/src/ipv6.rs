//! IPv6 headers (RFC 8200) and the walk over extension headers.

use crate::{be16, be32, proto, put16, Error, Result};
use std::net::Ipv6Addr;

pub const HEADER_LEN: usize = 40;
/// Extension headers walked before giving up (a defence against long chains).
pub const MAX_EXT_HEADERS: usize = 8;

pub mod field {
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

/// A view of an IPv6 header and its payload.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

/// Fragment header contents (RFC 8200 §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentHeader {
    /// Offset in bytes.
    pub offset: u16,
    pub more: bool,
    pub ident: u32,
}

/// Where the upper-layer header starts, after the extension headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Upper {
    /// Upper-layer protocol (TCP, UDP, ICMPv6, ...), or the next header where the walk stopped
    /// (a non-first fragment, ESP, or no-next-header).
    pub protocol: u8,
    /// Offset of the upper-layer header from the start of the IPv6 header.
    pub offset: usize,
    pub fragment: Option<FragmentHeader>,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Validates the version and that the payload length fits in the buffer. Jumbograms
    /// (payload length 0 with a hop-by-hop jumbo option) are refused as malformed.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Ipv6Packet { buffer };
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[0] >> 4 != 6 {
            return Err(Error::Malformed);
        }
        if b.len() < HEADER_LEN + self.payload_len() as usize {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    #[inline]
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }

    #[inline]
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len() as usize
    }

    #[inline]
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HEADER]
    }

    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    #[inline]
    pub fn traffic_class(&self) -> u8 {
        ((be16(self.buffer.as_ref(), 0) >> 4) & 0xff) as u8
    }

    #[inline]
    pub fn flow_label(&self) -> u32 {
        be32(self.buffer.as_ref(), 0) & 0x000f_ffff
    }

    #[inline]
    pub fn src_bytes(&self) -> [u8; 16] {
        self.buffer.as_ref()[field::SRC..field::SRC + 16].try_into().unwrap()
    }

    #[inline]
    pub fn dst_bytes(&self) -> [u8; 16] {
        self.buffer.as_ref()[field::DST..field::DST + 16].try_into().unwrap()
    }

    pub fn src(&self) -> Ipv6Addr {
        self.src_bytes().into()
    }

    pub fn dst(&self) -> Ipv6Addr {
        self.dst_bytes().into()
    }

    /// Walks hop-by-hop, routing, destination-options, AH and fragment headers to the upper
    /// layer. Stops at a non-first fragment (its upper-layer header is not in this packet).
    pub fn upper(&self) -> Result<Ipv6Upper> {
        let b = self.buffer.as_ref();
        let end = self.total_len();
        let mut next = self.next_header();
        let mut off = HEADER_LEN;
        let mut fragment = None;
        for _ in 0..=MAX_EXT_HEADERS {
            match next {
                proto::HOPOPT | proto::IPV6_ROUTE | proto::IPV6_OPTS | proto::AH => {
                    if off + 8 > end {
                        return Err(Error::Truncated);
                    }
                    let len = if next == proto::AH { (b[off + 1] as usize + 2) * 4 } else { (b[off + 1] as usize + 1) * 8 };
                    if next == proto::HOPOPT && off != HEADER_LEN {
                        // Hop-by-hop is only allowed first.
                        return Err(Error::Malformed);
                    }
                    next = b[off];
                    off += len;
                    if off > end {
                        return Err(Error::Truncated);
                    }
                }
                proto::IPV6_FRAG => {
                    if off + 8 > end {
                        return Err(Error::Truncated);
                    }
                    if fragment.is_some() {
                        return Err(Error::Malformed);
                    }
                    let fo = be16(b, off + 2);
                    let f = FragmentHeader { offset: fo & 0xfff8, more: fo & 1 != 0, ident: be32(b, off + 4) };
                    fragment = Some(f);
                    next = b[off];
                    off += 8;
                    if f.offset != 0 {
                        return Ok(Ipv6Upper { protocol: next, offset: off, fragment });
                    }
                }
                _ => return Ok(Ipv6Upper { protocol: next, offset: off, fragment }),
            }
        }
        Err(Error::Malformed)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }

    pub fn set_payload_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::PAYLOAD_LEN, v);
    }

    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[field::NEXT_HEADER] = v;
    }

    pub fn set_src(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::SRC..field::SRC + 16].copy_from_slice(&a);
    }

    pub fn set_dst(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::DST..field::DST + 16].copy_from_slice(&a);
    }
}

/// A plain description of an IPv6 header, for building packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub next_header: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub payload_len: usize,
}

impl Ipv6Repr {
    pub fn emit(&self, out: &mut [u8]) {
        let w = (6u32 << 28) | ((self.traffic_class as u32) << 20) | (self.flow_label & 0xfffff);
        out[0..4].copy_from_slice(&w.to_be_bytes());
        put16(out, field::PAYLOAD_LEN, self.payload_len as u16);
        out[field::NEXT_HEADER] = self.next_header;
        out[field::HOP_LIMIT] = self.hop_limit;
        out[field::SRC..field::SRC + 16].copy_from_slice(&self.src.octets());
        out[field::DST..field::DST + 16].copy_from_slice(&self.dst.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(next: u8, ext: &[u8], payload_len: usize) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + ext.len() + payload_len];
        Ipv6Repr {
            src: "2001:db8::1".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
            next_header: next,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 5,
            payload_len: ext.len() + payload_len,
        }
        .emit(&mut b);
        b[HEADER_LEN..HEADER_LEN + ext.len()].copy_from_slice(ext);
        b
    }

    #[test]
    fn walks_extension_headers() {
        // hop-by-hop (8 bytes) -> fragment (first, more) -> UDP
        let ext = [proto::IPV6_FRAG, 0, 1, 4, 0, 0, 0, 0, proto::UDP, 0, 0, 1, 0, 0, 0, 9];
        let b = packet(proto::HOPOPT, &ext, 8);
        let up = Ipv6Packet::new_checked(&b[..]).unwrap().upper().unwrap();
        assert_eq!(up.protocol, proto::UDP);
        assert_eq!(up.offset, HEADER_LEN + 16);
        assert_eq!(up.fragment, Some(FragmentHeader { offset: 0, more: true, ident: 9 }));
    }

    #[test]
    fn non_first_fragment_stops_the_walk() {
        let ext = [proto::TCP, 0, 0x05, 0x00, 0, 0, 0, 1];
        let b = packet(proto::IPV6_FRAG, &ext, 8);
        let up = Ipv6Packet::new_checked(&b[..]).unwrap().upper().unwrap();
        assert_eq!(up.fragment.unwrap().offset, 0x500);
        assert_eq!(up.protocol, proto::TCP);
    }

    #[test]
    fn bad_chains_are_errors() {
        // Extension header claims more bytes than the payload has.
        let b = packet(proto::IPV6_OPTS, &[proto::UDP, 9, 0, 0, 0, 0, 0, 0], 0);
        assert_eq!(Ipv6Packet::new_checked(&b[..]).unwrap().upper(), Err(Error::Truncated));
        // Hop-by-hop after another header.
        let b = packet(proto::IPV6_OPTS, &[proto::HOPOPT, 0, 0, 0, 0, 0, 0, 0, proto::UDP, 0, 0, 0, 0, 0, 0, 0], 0);
        assert_eq!(Ipv6Packet::new_checked(&b[..]).unwrap().upper(), Err(Error::Malformed));
        // Payload length beyond the buffer.
        let mut b = packet(proto::UDP, &[], 8);
        b.truncate(44);
        assert_eq!(Ipv6Packet::new_checked(&b[..]).err(), Some(Error::Truncated));
    }
}
