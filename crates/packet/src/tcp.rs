//! TCP headers (RFC 9293), options, and the TOA option that carries a client address to a
//! backend behind full NAT.

use crate::{be16, be32, put16, Error, Result};

pub const MIN_HEADER_LEN: usize = 20;
pub const MAX_HEADER_LEN: usize = 60;

pub mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ: usize = 4;
    pub const ACK: usize = 8;
    pub const OFF_FLAGS: usize = 12;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    pub const URGENT: usize = 18;
}

pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
}

pub mod option {
    pub const END: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WSCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMP: u8 = 8;
    /// TOA ("TCP option address"), the kind used by the Linux TOA module and DPVS.
    pub const TOA: u8 = 254;
    pub const TOA_V4_LEN: usize = 8;
    pub const TOA_V6_LEN: usize = 20;
}

/// A view of a TCP segment.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Validates the data offset against the buffer (the segment is the whole buffer).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let p = TcpPacket { buffer };
        let hl = p.header_len();
        if hl < MIN_HEADER_LEN {
            return Err(Error::Malformed);
        }
        if hl > p.buffer.as_ref().len() {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    #[inline]
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SRC_PORT)
    }

    #[inline]
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DST_PORT)
    }

    #[inline]
    pub fn seq(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SEQ)
    }

    #[inline]
    pub fn ack(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ACK)
    }

    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::OFF_FLAGS] >> 4) as usize) * 4
    }

    #[inline]
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::OFF_FLAGS + 1]
    }

    #[inline]
    pub fn window(&self) -> u16 {
        be16(self.buffer.as_ref(), field::WINDOW)
    }

    #[inline]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM)
    }

    pub fn options(&self) -> Options<'_> {
        Options { data: &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()] }
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    pub fn set_src_port(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::SRC_PORT, v);
    }

    pub fn set_dst_port(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::DST_PORT, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::CHECKSUM, v);
    }
}

/// One TCP option. Lengths are validated; unknown kinds are returned raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpOption<'a> {
    End,
    Nop,
    Mss(u16),
    WindowScale(u8),
    SackPermitted,
    Timestamp {
        value: u32,
        echo: u32,
    },
    /// A TOA option: the client port and address (4 or 16 bytes).
    Toa {
        port: u16,
        addr: &'a [u8],
    },
    Unknown {
        kind: u8,
        data: &'a [u8],
    },
}

/// Iterator over TCP options; yields `Err` once on a malformed option and then stops.
pub struct Options<'a> {
    data: &'a [u8],
}

impl<'a> Iterator for Options<'a> {
    type Item = Result<TcpOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        let d = self.data;
        let kind = *d.first()?;
        match kind {
            option::END => {
                self.data = &[];
                Some(Ok(TcpOption::End))
            }
            option::NOP => {
                self.data = &d[1..];
                Some(Ok(TcpOption::Nop))
            }
            _ => {
                if d.len() < 2 || (d[1] as usize) < 2 || d[1] as usize > d.len() {
                    self.data = &[];
                    return Some(Err(Error::Malformed));
                }
                let len = d[1] as usize;
                let body = &d[2..len];
                self.data = &d[len..];
                let opt = match (kind, len) {
                    (option::MSS, 4) => TcpOption::Mss(be16(body, 0)),
                    (option::WSCALE, 3) => TcpOption::WindowScale(body[0]),
                    (option::SACK_PERMITTED, 2) => TcpOption::SackPermitted,
                    (option::TIMESTAMP, 10) => TcpOption::Timestamp { value: be32(body, 0), echo: be32(body, 4) },
                    (option::TOA, option::TOA_V4_LEN) | (option::TOA, option::TOA_V6_LEN) => TcpOption::Toa { port: be16(body, 0), addr: &body[2..] },
                    (option::MSS, _) | (option::WSCALE, _) | (option::SACK_PERMITTED, _) | (option::TIMESTAMP, _) => {
                        self.data = &[];
                        return Some(Err(Error::Malformed));
                    }
                    _ => TcpOption::Unknown { kind, data: body },
                };
                Some(Ok(opt))
            }
        }
    }
}

/// Encodes a TOA option for a client address (4 or 16 bytes) and port; returns the bytes and
/// their length (8 or 20).
pub fn toa_option(addr: &[u8], port: u16) -> ([u8; option::TOA_V6_LEN], usize) {
    let mut o = [0u8; option::TOA_V6_LEN];
    let len = 4 + addr.len();
    o[0] = option::TOA;
    o[1] = len as u8;
    o[2..4].copy_from_slice(&port.to_be_bytes());
    o[4..len].copy_from_slice(addr);
    (o, len)
}

/// Inserts `opt` at the end of the options of the segment `seg[..seg_len]`, padded with NOPs to
/// a multiple of four, moving the payload back. `seg` must have room for the grown segment.
/// Returns the number of bytes added. The checksum is left for the caller to recompute.
///
/// Fails with `Malformed` when the grown header would exceed 60 bytes, and `Truncated` when the
/// buffer has no room.
pub fn insert_option(seg: &mut [u8], seg_len: usize, opt: &[u8]) -> Result<usize> {
    if seg_len < MIN_HEADER_LEN || seg_len > seg.len() {
        return Err(Error::Truncated);
    }
    let hl = ((seg[field::OFF_FLAGS] >> 4) as usize) * 4;
    if hl < MIN_HEADER_LEN || hl > seg_len {
        return Err(Error::Malformed);
    }
    let add = opt.len().div_ceil(4) * 4;
    if hl + add > MAX_HEADER_LEN {
        return Err(Error::Malformed);
    }
    if seg_len + add > seg.len() {
        return Err(Error::Truncated);
    }
    seg.copy_within(hl..seg_len, hl + add);
    let pad = add - opt.len();
    seg[hl..hl + pad].fill(option::NOP);
    seg[hl + pad..hl + add].copy_from_slice(opt);
    let new_off = ((hl + add) / 4) as u8;
    seg[field::OFF_FLAGS] = (new_off << 4) | (seg[field::OFF_FLAGS] & 0x0f);
    Ok(add)
}

/// A plain description of a TCP header, for building packets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    /// Option bytes; padded with zeros (end-of-list) to a multiple of four.
    pub options: Vec<u8>,
}

impl TcpRepr {
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.len().div_ceil(4) * 4
    }

    /// Writes the header with a zero checksum.
    pub fn emit(&self, out: &mut [u8]) {
        let hl = self.header_len();
        out[..hl].fill(0);
        put16(out, field::SRC_PORT, self.src_port);
        put16(out, field::DST_PORT, self.dst_port);
        out[field::SEQ..field::SEQ + 4].copy_from_slice(&self.seq.to_be_bytes());
        out[field::ACK..field::ACK + 4].copy_from_slice(&self.ack.to_be_bytes());
        out[field::OFF_FLAGS] = ((hl / 4) as u8) << 4;
        out[field::OFF_FLAGS + 1] = self.flags;
        put16(out, field::WINDOW, self.window);
        out[MIN_HEADER_LEN..MIN_HEADER_LEN + self.options.len()].copy_from_slice(&self.options);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_and_validated() {
        let repr = TcpRepr { src_port: 1, dst_port: 2, flags: flags::SYN, options: vec![2, 4, 5, 0xb4, 1, 3, 3, 7, 4, 2, 0, 0], ..Default::default() };
        let mut b = vec![0u8; repr.header_len()];
        repr.emit(&mut b);
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        let opts: Vec<_> = p.options().collect::<Result<_>>().unwrap();
        assert_eq!(opts[0], TcpOption::Mss(1460));
        assert_eq!(opts[2], TcpOption::WindowScale(7));
        assert_eq!(opts[3], TcpOption::SackPermitted);
        // An option whose length runs past the header.
        b[20] = 2;
        b[21] = 40;
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert!(p.options().any(|o| o.is_err()));
    }

    #[test]
    fn toa_insertion_moves_payload() {
        let repr = TcpRepr { src_port: 1, dst_port: 2, flags: flags::ACK, ..Default::default() };
        let mut b = vec![0u8; 64];
        repr.emit(&mut b);
        b[20..23].copy_from_slice(b"abc");
        let (opt, len) = toa_option(&[192, 0, 2, 7], 4321);
        let added = insert_option(&mut b, 23, &opt[..len]).unwrap();
        assert_eq!(added, 8);
        let p = TcpPacket::new_checked(&b[..31]).unwrap();
        assert_eq!(p.header_len(), 28);
        assert_eq!(p.payload(), b"abc");
        let toa = p.options().find_map(|o| match o {
            Ok(TcpOption::Toa { port, addr }) => Some((port, addr.to_vec())),
            _ => None,
        });
        assert_eq!(toa, Some((4321, vec![192, 0, 2, 7])));
    }

    #[test]
    fn toa_refused_without_room() {
        let repr = TcpRepr { options: vec![1; 36], ..Default::default() };
        let mut b = vec![0u8; 80];
        repr.emit(&mut b);
        let (opt, len) = toa_option(&[1, 2, 3, 4], 1);
        assert_eq!(insert_option(&mut b, 56, &opt[..len]), Err(Error::Malformed));
        let mut small = vec![0u8; 24];
        TcpRepr::default().emit(&mut small);
        assert_eq!(insert_option(&mut small, 20, &opt[..len]), Err(Error::Truncated));
    }
}
