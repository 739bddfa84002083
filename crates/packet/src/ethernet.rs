//! Ethernet II frames with up to two 802.1Q / 802.1ad tags.

use crate::{be16, put16, Error, Result};

pub const HEADER_LEN: usize = 14;
pub const VLAN_TAG_LEN: usize = 4;

pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const VLAN: u16 = 0x8100;
    pub const IPV6: u16 = 0x86dd;
    pub const QINQ: u16 = 0x88a8;
}

mod field {
    pub const DST: std::ops::Range<usize> = 0..6;
    pub const SRC: std::ops::Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
}

pub type Mac = [u8; 6];

/// `02:00:00:00:00:01` to bytes; `None` for anything else.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return None;
        }
        m[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(m)
}

/// Bytes to `02:00:00:00:00:01`.
pub fn format_mac(m: &Mac) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

pub const BROADCAST: Mac = [0xff; 6];

/// A view of an Ethernet header (the outermost ethertype; see [`parse_l2`] for tags).
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(EthernetFrame { buffer })
    }

    pub fn dst(&self) -> Mac {
        self.buffer.as_ref()[field::DST].try_into().unwrap()
    }

    pub fn src(&self) -> Mac {
        self.buffer.as_ref()[field::SRC].try_into().unwrap()
    }

    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), field::ETHERTYPE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, mac: Mac) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&mac);
    }

    pub fn set_src(&mut self, mac: Mac) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&mac);
    }

    pub fn set_ethertype(&mut self, t: u16) {
        put16(self.buffer.as_mut(), field::ETHERTYPE, t);
    }
}

/// The layer-2 header as parsed: inner ethertype, where layer 3 starts, and the VLAN ID of the
/// innermost tag, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2 {
    pub ethertype: u16,
    pub l3_offset: usize,
    pub vlan: Option<u16>,
}

/// Walks the Ethernet header and up to two VLAN tags.
#[inline]
pub fn parse_l2(buf: &[u8]) -> Result<L2> {
    if buf.len() < HEADER_LEN {
        return Err(Error::Truncated);
    }
    let mut ethertype = be16(buf, field::ETHERTYPE);
    let mut off = HEADER_LEN;
    let mut vlan = None;
    let mut tags = 0;
    while ethertype == ethertype::VLAN || ethertype == ethertype::QINQ {
        tags += 1;
        if tags > 2 {
            return Err(Error::Malformed);
        }
        if buf.len() < off + VLAN_TAG_LEN {
            return Err(Error::Truncated);
        }
        vlan = Some(be16(buf, off) & 0x0fff);
        ethertype = be16(buf, off + 2);
        off += VLAN_TAG_LEN;
    }
    Ok(L2 { ethertype, l3_offset: off, vlan })
}

/// Writes an Ethernet header (with an 802.1Q tag when `vlan` is set) into `out`, which must be
/// exactly `header_len(vlan)` long.
#[inline]
pub fn write_header(out: &mut [u8], dst: Mac, src: Mac, vlan: Option<u16>, ethertype: u16) {
    out[field::DST].copy_from_slice(&dst);
    out[field::SRC].copy_from_slice(&src);
    match vlan {
        Some(id) => {
            put16(out, 12, self::ethertype::VLAN);
            put16(out, 14, id & 0x0fff);
            put16(out, 16, ethertype);
        }
        None => put16(out, 12, ethertype),
    }
}

/// Length of the header `write_header` writes.
#[inline]
pub const fn header_len(vlan: Option<u16>) -> usize {
    if vlan.is_some() {
        HEADER_LEN + VLAN_TAG_LEN
    } else {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_tags_are_walked() {
        let mut f = vec![0u8; 22];
        write_header(&mut f[..18], [1; 6], [2; 6], Some(100), ethertype::IPV4);
        let l2 = parse_l2(&f).unwrap();
        assert_eq!(l2, L2 { ethertype: ethertype::IPV4, l3_offset: 18, vlan: Some(100) });
        assert_eq!(parse_l2(&f[..16]), Err(Error::Truncated));
    }

    #[test]
    fn three_tags_are_refused() {
        let mut f = vec![0u8; 30];
        put16(&mut f, 12, ethertype::QINQ);
        put16(&mut f, 16, ethertype::VLAN);
        put16(&mut f, 20, ethertype::VLAN);
        assert_eq!(parse_l2(&f), Err(Error::Malformed));
    }
}
