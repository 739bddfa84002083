//! UDP headers (RFC 768).

use crate::{be16, put16, Error, Result};

pub const HEADER_LEN: usize = 8;

pub mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
}

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Validates the length field: at least 8 and no longer than the buffer.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = be16(b, field::LENGTH) as usize;
        if len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len > b.len() {
            return Err(Error::Truncated);
        }
        Ok(UdpPacket { buffer })
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
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH)
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() as usize == HEADER_LEN
    }

    #[inline]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM)
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
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

/// Writes a UDP header with a zero checksum.
pub fn emit_header(out: &mut [u8], src_port: u16, dst_port: u16, payload_len: usize) {
    put16(out, field::SRC_PORT, src_port);
    put16(out, field::DST_PORT, dst_port);
    put16(out, field::LENGTH, (HEADER_LEN + payload_len) as u16);
    put16(out, field::CHECKSUM, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_field_is_checked() {
        let mut b = [0u8; 12];
        emit_header(&mut b, 1, 2, 4);
        assert_eq!(UdpPacket::new_checked(&b[..]).unwrap().payload().len(), 4);
        assert_eq!(UdpPacket::new_checked(&b[..11]).err(), Some(Error::Truncated));
        put16(&mut b, field::LENGTH, 7);
        assert_eq!(UdpPacket::new_checked(&b[..]).err(), Some(Error::Malformed));
    }
}
