//! ARP for IPv4 over Ethernet (RFC 826).

use crate::{be16, Error, Result};
use std::net::Ipv4Addr;

pub const PACKET_LEN: usize = 28;
pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;

/// A view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Accepts only hardware type Ethernet (1), protocol IPv4, address lengths 6 and 4.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < PACKET_LEN {
            return Err(Error::Truncated);
        }
        if be16(b, 0) != 1 || be16(b, 2) != 0x0800 || b[4] != 6 || b[5] != 4 {
            return Err(Error::Malformed);
        }
        Ok(ArpPacket { buffer })
    }

    pub fn operation(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }

    pub fn sender_mac(&self) -> [u8; 6] {
        self.buffer.as_ref()[8..14].try_into().unwrap()
    }

    pub fn sender_ip(&self) -> Ipv4Addr {
        <[u8; 4]>::try_from(&self.buffer.as_ref()[14..18]).unwrap().into()
    }

    pub fn target_mac(&self) -> [u8; 6] {
        self.buffer.as_ref()[18..24].try_into().unwrap()
    }

    pub fn target_ip(&self) -> Ipv4Addr {
        <[u8; 4]>::try_from(&self.buffer.as_ref()[24..28]).unwrap().into()
    }
}

/// Builds an ARP packet (without Ethernet header).
pub fn build(op: u16, sha: [u8; 6], spa: Ipv4Addr, tha: [u8; 6], tpa: Ipv4Addr) -> [u8; PACKET_LEN] {
    let mut p = [0u8; PACKET_LEN];
    p[0..2].copy_from_slice(&1u16.to_be_bytes());
    p[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
    p[4] = 6;
    p[5] = 4;
    p[6..8].copy_from_slice(&op.to_be_bytes());
    p[8..14].copy_from_slice(&sha);
    p[14..18].copy_from_slice(&spa.octets());
    p[18..24].copy_from_slice(&tha);
    p[24..28].copy_from_slice(&tpa.octets());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let p = build(OP_REQUEST, [1; 6], Ipv4Addr::new(10, 0, 0, 1), [0; 6], Ipv4Addr::new(10, 0, 0, 2));
        let v = ArpPacket::new_checked(&p[..]).unwrap();
        assert_eq!(v.operation(), OP_REQUEST);
        assert_eq!(v.target_ip(), Ipv4Addr::new(10, 0, 0, 2));
        assert!(ArpPacket::new_checked(&p[..27]).is_err());
    }
}
