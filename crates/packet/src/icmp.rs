//! ICMPv4 (RFC 792) and ICMPv6 (RFC 4443) messages: echo, and errors that embed the header of
//! the packet that caused them.

use crate::{be16, be32, put16, Error, Result};

pub const HEADER_LEN: usize = 8;

pub mod v4 {
    pub const ECHO_REPLY: u8 = 0;
    pub const DEST_UNREACH: u8 = 3;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    pub const PARAM_PROBLEM: u8 = 12;
    /// Destination unreachable code: fragmentation needed and DF set.
    pub const CODE_FRAG_NEEDED: u8 = 4;
    pub const CODE_PORT_UNREACH: u8 = 3;
    /// Communication administratively prohibited: what a rejecting route answers (a hard
    /// error: a connected socket sees EHOSTUNREACH at once, where host unreachable is retried).
    pub const CODE_ADMIN_PROHIBITED: u8 = 13;

    pub fn is_error(t: u8) -> bool {
        matches!(t, DEST_UNREACH | TIME_EXCEEDED | PARAM_PROBLEM)
    }
}

pub mod v6 {
    pub const DEST_UNREACH: u8 = 1;
    /// Destination unreachable: reject route to destination (RFC 4443; a hard error, EACCES).
    pub const CODE_REJECT_ROUTE: u8 = 6;
    /// Destination unreachable: port unreachable (RFC 4443; ECONNREFUSED on a connected socket).
    pub const CODE_PORT_UNREACH: u8 = 4;
    pub const PACKET_TOO_BIG: u8 = 2;
    pub const TIME_EXCEEDED: u8 = 3;
    pub const PARAM_PROBLEM: u8 = 4;
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
    pub const ROUTER_SOLICIT: u8 = 133;
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    pub const NEIGHBOR_ADVERT: u8 = 136;

    pub fn is_error(t: u8) -> bool {
        t < 128
    }
}

/// A view of an ICMPv4 or ICMPv6 message (the two share their first eight bytes' layout).
#[derive(Debug, Clone)]
pub struct IcmpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> IcmpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        IcmpPacket { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(IcmpPacket { buffer })
    }

    #[inline]
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    #[inline]
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    #[inline]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }

    /// Echo identifier.
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }

    /// Echo sequence number.
    #[inline]
    pub fn echo_seq(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }

    /// ICMPv4 "fragmentation needed" next-hop MTU (RFC 1191).
    #[inline]
    pub fn v4_next_hop_mtu(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }

    /// ICMPv6 "packet too big" MTU.
    #[inline]
    pub fn v6_mtu(&self) -> u32 {
        be32(self.buffer.as_ref(), 4)
    }

    /// The bytes after the 8-byte header: echo data, or the embedded original packet.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IcmpPacket<T> {
    pub fn set_msg_type(&mut self, t: u8) {
        self.buffer.as_mut()[0] = t;
    }

    pub fn set_checksum(&mut self, v: u16) {
        put16(self.buffer.as_mut(), 2, v);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// Writes an ICMP header: type, code, zero checksum, and the 4-byte rest-of-header.
pub fn emit_header(out: &mut [u8], msg_type: u8, code: u8, rest: [u8; 4]) {
    out[0] = msg_type;
    out[1] = code;
    out[2] = 0;
    out[3] = 0;
    out[4..8].copy_from_slice(&rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let mut b = [0u8; 12];
        emit_header(&mut b, v4::DEST_UNREACH, v4::CODE_FRAG_NEEDED, [0, 0, 0x05, 0xdc]);
        let p = IcmpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.v4_next_hop_mtu(), 1500);
        assert!(v4::is_error(p.msg_type()));
        assert!(IcmpPacket::new_checked(&b[..7]).is_err());
        assert!(!v6::is_error(v6::ECHO_REQUEST));
    }
}
