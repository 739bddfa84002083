//! IPv4 headers (RFC 791), options included.

use crate::{be16, checksum, put16, Error, Result};
use std::net::Ipv4Addr;

pub const MIN_HEADER_LEN: usize = 20;

pub mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

pub const FLAG_DF: u16 = 0x4000;
pub const FLAG_MF: u16 = 0x2000;

/// A view of an IPv4 header and its payload.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Validates version, header length and total length against the buffer. The buffer may be
    /// longer than the total length (Ethernet padding); it may not be shorter.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Ipv4Packet { buffer };
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 4 {
            return Err(Error::Malformed);
        }
        let hl = self.header_len();
        if hl < MIN_HEADER_LEN {
            return Err(Error::Malformed);
        }
        let tl = self.total_len() as usize;
        if tl < hl {
            return Err(Error::Malformed);
        }
        if b.len() < hl || b.len() < tl {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    #[inline]
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }

    #[inline]
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH)
    }

    #[inline]
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), field::IDENT)
    }

    #[inline]
    pub fn dont_frag(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLAGS_FRAG) & FLAG_DF != 0
    }

    #[inline]
    pub fn more_frags(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLAGS_FRAG) & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (be16(self.buffer.as_ref(), field::FLAGS_FRAG) & 0x1fff) << 3
    }

    #[inline]
    pub fn is_fragment(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLAGS_FRAG) & (FLAG_MF | 0x1fff) != 0
    }

    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    #[inline]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM)
    }

    #[inline]
    pub fn src_bytes(&self) -> [u8; 4] {
        self.buffer.as_ref()[field::SRC..field::SRC + 4].try_into().unwrap()
    }

    #[inline]
    pub fn dst_bytes(&self) -> [u8; 4] {
        self.buffer.as_ref()[field::DST..field::DST + 4].try_into().unwrap()
    }

    pub fn src(&self) -> Ipv4Addr {
        self.src_bytes().into()
    }

    pub fn dst(&self) -> Ipv4Addr {
        self.dst_bytes().into()
    }

    /// The option bytes between the fixed header and the payload.
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }

    /// The payload as bounded by the total-length field (not by the buffer).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len() as usize]
    }

    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::accumulate(0, &self.buffer.as_ref()[..self.header_len()])) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    pub fn set_total_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::LENGTH, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    pub fn set_src(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::SRC..field::SRC + 4].copy_from_slice(&a);
    }

    pub fn set_dst(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::DST..field::DST + 4].copy_from_slice(&a);
    }

    /// Recomputes the header checksum from scratch.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::checksum(&self.buffer.as_ref()[..hl]);
        self.set_checksum(c);
    }

    /// Decrements the TTL and patches the checksum incrementally (RFC 1624).
    pub fn decrement_ttl(&mut self) {
        let b = self.buffer.as_mut();
        let old = be16(b, field::TTL);
        b[field::TTL] = b[field::TTL].wrapping_sub(1);
        let new = be16(b, field::TTL);
        let c = checksum::adjust16(be16(b, field::CHECKSUM), old, new);
        put16(b, field::CHECKSUM, c);
    }
}

/// A plain description of an IPv4 header, for building packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub ttl: u8,
    pub tos: u8,
    pub ident: u16,
    pub dont_frag: bool,
    pub more_frags: bool,
    pub frag_offset: u16,
    /// Option bytes; padded with zeros to a multiple of four.
    pub options: Vec<u8>,
    pub payload_len: usize,
}

impl Ipv4Repr {
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.len().div_ceil(4) * 4
    }

    /// Writes the header (checksum included) into the start of `out`.
    pub fn emit(&self, out: &mut [u8]) {
        let hl = self.header_len();
        out[..hl].fill(0);
        out[field::VER_IHL] = 0x40 | (hl / 4) as u8;
        out[field::TOS] = self.tos;
        put16(out, field::LENGTH, (hl + self.payload_len) as u16);
        put16(out, field::IDENT, self.ident);
        let mut ff = (self.frag_offset >> 3) & 0x1fff;
        if self.dont_frag {
            ff |= FLAG_DF;
        }
        if self.more_frags {
            ff |= FLAG_MF;
        }
        put16(out, field::FLAGS_FRAG, ff);
        out[field::TTL] = self.ttl;
        out[field::PROTOCOL] = self.protocol;
        out[field::SRC..field::SRC + 4].copy_from_slice(&self.src.octets());
        out[field::DST..field::DST + 4].copy_from_slice(&self.dst.octets());
        out[MIN_HEADER_LEN..MIN_HEADER_LEN + self.options.len()].copy_from_slice(&self.options);
        let c = checksum::checksum(&out[..hl]);
        put16(out, field::CHECKSUM, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr() -> Ipv4Repr {
        Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            protocol: 17,
            ttl: 64,
            tos: 0,
            ident: 7,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
            options: vec![1, 1, 1, 0],
            payload_len: 4,
        }
    }

    #[test]
    fn emit_and_parse() {
        let r = repr();
        let mut b = vec![0u8; 28];
        r.emit(&mut b);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert!(p.verify_checksum());
        assert!(p.dont_frag() && !p.is_fragment());
        assert_eq!(p.payload().len(), 4);
    }

    #[test]
    fn lying_lengths_are_errors() {
        let mut b = vec![0u8; 28];
        repr().emit(&mut b);
        let mut long = b.clone();
        put16(&mut long, field::LENGTH, 100);
        assert_eq!(Ipv4Packet::new_checked(&long[..]).err(), Some(Error::Truncated));
        let mut short = b.clone();
        put16(&mut short, field::LENGTH, 10);
        assert_eq!(Ipv4Packet::new_checked(&short[..]).err(), Some(Error::Malformed));
        let mut ihl = b.clone();
        ihl[0] = 0x44;
        assert_eq!(Ipv4Packet::new_checked(&ihl[..]).err(), Some(Error::Malformed));
        assert_eq!(Ipv4Packet::new_checked(&b[..19]).err(), Some(Error::Truncated));
    }

    #[test]
    fn ttl_decrement_keeps_checksum_valid() {
        let mut b = vec![0u8; 28];
        repr().emit(&mut b);
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        p.decrement_ttl();
        assert_eq!(p.ttl(), 63);
        assert!(p.verify_checksum());
    }
}
