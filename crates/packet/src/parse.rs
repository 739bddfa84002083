//! One-pass frame parser: where each layer starts, validated against the buffer. This is the
//! parser the data plane uses; the per-field views are used after it.

use crate::ethernet::{self, ethertype};
use crate::ipv4::Ipv4Packet;
use crate::ipv6::Ipv6Packet;
use crate::{be16, proto, tcp, udp, Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Fragment position of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frag {
    /// Not a fragment.
    None,
    /// First fragment: the upper-layer header is present.
    First,
    /// A later fragment: no upper-layer header.
    Later,
}

/// Offsets of the layers of a frame. For non-IP frames only `ethertype`, `vlan` and `l3` mean
/// anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    pub ethertype: u16,
    pub vlan: Option<u16>,
    pub family: Option<Family>,
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the upper-layer header (after IPv4 options / IPv6 extension headers).
    pub l4: usize,
    /// End of the IP packet by its length field (Ethernet padding excluded).
    pub end: usize,
    /// Upper-layer protocol.
    pub proto: u8,
    pub frag: Frag,
}

impl FrameInfo {
    /// Length of the upper-layer segment (header and payload).
    pub fn l4_len(&self) -> usize {
        self.end - self.l4
    }
}

/// Parses layer 2 to layer 4. Checks that every length field fits in the buffer and that the
/// TCP/UDP/ICMP header is complete (unless the packet is a later fragment). Checksums are not
/// verified here.
#[inline]
pub fn parse_frame(buf: &[u8]) -> Result<FrameInfo> {
    // Fast path: untagged IPv4 without options, the bulk of traffic. Anything unusual (and
    // every error) takes the general path below, which gives the same answers.
    if buf.len() >= 34 && buf[12] == 0x08 && buf[13] == 0x00 && buf[14] == 0x45 {
        let tl = be16(buf, 16) as usize;
        if tl >= 20 && 14 + tl <= buf.len() {
            let ff = be16(buf, 20);
            let frag = if ff & 0x3fff == 0 {
                Frag::None
            } else if ff & 0x1fff == 0 {
                Frag::First
            } else {
                Frag::Later
            };
            let info = FrameInfo { ethertype: ethertype::IPV4, vlan: None, family: Some(Family::V4), l3: 14, l4: 34, end: 14 + tl, proto: buf[23], frag };
            if frag != Frag::Later {
                check_l4(&buf[34..14 + tl], info.proto, frag)?;
            }
            return Ok(info);
        }
    }
    let l2 = ethernet::parse_l2(buf)?;
    let l3 = l2.l3_offset;
    let mut info = FrameInfo { ethertype: l2.ethertype, vlan: l2.vlan, family: None, l3, l4: l3, end: buf.len(), proto: 0, frag: Frag::None };
    match l2.ethertype {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(&buf[l3..])?;
            info.family = Some(Family::V4);
            info.l4 = l3 + ip.header_len();
            info.end = l3 + ip.total_len() as usize;
            info.proto = ip.protocol();
            if ip.is_fragment() {
                info.frag = if ip.frag_offset() == 0 { Frag::First } else { Frag::Later };
            }
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(&buf[l3..])?;
            let up = ip.upper()?;
            info.family = Some(Family::V6);
            info.l4 = l3 + up.offset;
            info.end = l3 + ip.total_len();
            info.proto = up.protocol;
            if let Some(f) = up.fragment {
                info.frag = if f.offset != 0 {
                    Frag::Later
                } else if f.more {
                    Frag::First
                } else {
                    // An atomic fragment (offset 0, no more): a whole packet.
                    Frag::None
                };
            }
        }
        _ => return Ok(info),
    }
    if info.frag != Frag::Later {
        check_l4(&buf[info.l4..info.end], info.proto, info.frag)?;
    }
    Ok(info)
}

#[inline]
fn check_l4(seg: &[u8], protocol: u8, frag: Frag) -> Result<()> {
    match protocol {
        proto::TCP => {
            tcp::TcpPacket::new_checked(seg)?;
        }
        proto::UDP => {
            if seg.len() < udp::HEADER_LEN {
                return Err(Error::Truncated);
            }
            let len = be16(seg, udp::field::LENGTH) as usize;
            if len < udp::HEADER_LEN {
                return Err(Error::Malformed);
            }
            // A first fragment carries only part of the datagram the length field describes.
            if frag == Frag::None && len != seg.len() {
                return Err(if len > seg.len() { Error::Truncated } else { Error::Malformed });
            }
        }
        proto::ICMP | proto::ICMPV6 if seg.len() < crate::icmp::HEADER_LEN => {
            return Err(Error::Truncated);
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Builder;
    use crate::tcp::flags;

    #[test]
    fn tcp_v4_offsets() {
        let f = Builder::tcp("10.0.0.1:1000", "10.0.0.2:80", flags::SYN).payload(b"hi").build();
        let i = parse_frame(&f).unwrap();
        assert_eq!(i.family, Some(Family::V4));
        assert_eq!((i.l3, i.l4, i.end, i.proto), (14, 34, 56, proto::TCP));
    }

    #[test]
    fn udp_v6_with_padding_beyond_end() {
        let mut f = Builder::udp("[2001:db8::1]:53", "[2001:db8::2]:53").payload(&[1, 2, 3]).build();
        f.extend_from_slice(&[0; 6]);
        let i = parse_frame(&f).unwrap();
        assert_eq!(i.end, 14 + 40 + 11);
        assert_eq!(i.l4_len(), 11);
    }

    #[test]
    fn udp_length_must_match_ip_length() {
        let mut f = Builder::udp("10.0.0.1:1", "10.0.0.2:2").payload(&[0; 4]).build();
        let at = 14 + 20 + udp::field::LENGTH;
        f[at + 1] = 9;
        assert_eq!(parse_frame(&f), Err(Error::Malformed));
        f[at + 1] = 20;
        assert_eq!(parse_frame(&f), Err(Error::Truncated));
    }

    #[test]
    fn non_ip_frames_pass() {
        let mut f = vec![0u8; 60];
        f[12] = 0x08;
        f[13] = 0x06;
        let i = parse_frame(&f).unwrap();
        assert_eq!(i.ethertype, ethertype::ARP);
        assert_eq!(i.family, None);
    }
}
