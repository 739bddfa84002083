//! Building whole frames with correct lengths and checksums, for tests, fixtures and
//! benchmarks. The data plane never builds packets this way.

use crate::checksum;
use crate::ethernet::{self, ethertype, Mac};
use crate::icmp;
use crate::ipv4::Ipv4Repr;
use crate::ipv6::{self, Ipv6Repr};
use crate::proto;
use crate::tcp::TcpRepr;
use crate::udp;
use std::net::{IpAddr, SocketAddr};

/// The upper layer of a frame being built.
#[derive(Debug, Clone)]
pub enum L4 {
    Tcp(TcpRepr),
    Udp {
        src_port: u16,
        dst_port: u16,
    },
    Icmp {
        msg_type: u8,
        code: u8,
        rest: [u8; 4],
    },
    /// Any other protocol; the payload is written as is.
    Raw(u8),
}

/// A frame description with chainable setters.
#[derive(Debug, Clone)]
pub struct Builder {
    pub eth_src: Mac,
    pub eth_dst: Mac,
    pub vlan: Option<u16>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ttl: u8,
    pub tos: u8,
    pub ident: u16,
    pub dont_frag: bool,
    pub ip_options: Vec<u8>,
    pub l4: L4,
    pub payload: Vec<u8>,
}

fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|_| panic!("not a socket address: {s}"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| panic!("not an IP address: {s}"))
}

impl Builder {
    fn new(src: IpAddr, dst: IpAddr, l4: L4) -> Self {
        assert_eq!(src.is_ipv4(), dst.is_ipv4(), "source and destination families differ");
        Builder {
            eth_src: [0x02, 0, 0, 0, 0, 0x01],
            eth_dst: [0x02, 0, 0, 0, 0, 0x02],
            vlan: None,
            src,
            dst,
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
            ip_options: Vec::new(),
            l4,
            payload: Vec::new(),
        }
    }

    /// A TCP segment between two socket addresses ("10.0.0.1:1000" or "[2001:db8::1]:1000").
    pub fn tcp(src: &str, dst: &str, flags: u8) -> Self {
        let (s, d) = (sock(src), sock(dst));
        let repr = TcpRepr { src_port: s.port(), dst_port: d.port(), flags, window: 65535, ..Default::default() };
        Builder::new(s.ip(), d.ip(), L4::Tcp(repr))
    }

    pub fn udp(src: &str, dst: &str) -> Self {
        let (s, d) = (sock(src), sock(dst));
        Builder::new(s.ip(), d.ip(), L4::Udp { src_port: s.port(), dst_port: d.port() })
    }

    /// An ICMP (v4) or ICMPv6 message, chosen by the address family.
    pub fn icmp(src: &str, dst: &str, msg_type: u8, code: u8, rest: [u8; 4]) -> Self {
        Builder::new(ip(src), ip(dst), L4::Icmp { msg_type, code, rest })
    }

    pub fn raw(src: &str, dst: &str, protocol: u8) -> Self {
        Builder::new(ip(src), ip(dst), L4::Raw(protocol))
    }

    pub fn macs(mut self, src: Mac, dst: Mac) -> Self {
        self.eth_src = src;
        self.eth_dst = dst;
        self
    }

    pub fn vlan(mut self, id: u16) -> Self {
        self.vlan = Some(id);
        self
    }

    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }

    pub fn ident(mut self, ident: u16) -> Self {
        self.ident = ident;
        self
    }

    pub fn dont_frag(mut self, df: bool) -> Self {
        self.dont_frag = df;
        self
    }

    pub fn ip_options(mut self, opts: &[u8]) -> Self {
        self.ip_options = opts.to_vec();
        self
    }

    pub fn payload(mut self, p: &[u8]) -> Self {
        self.payload = p.to_vec();
        self
    }

    pub fn seq(mut self, seq: u32) -> Self {
        if let L4::Tcp(t) = &mut self.l4 {
            t.seq = seq;
        }
        self
    }

    pub fn ack(mut self, ack: u32) -> Self {
        if let L4::Tcp(t) = &mut self.l4 {
            t.ack = ack;
        }
        self
    }

    pub fn window(mut self, window: u16) -> Self {
        if let L4::Tcp(t) = &mut self.l4 {
            t.window = window;
        }
        self
    }

    pub fn tcp_options(mut self, opts: &[u8]) -> Self {
        if let L4::Tcp(t) = &mut self.l4 {
            t.options = opts.to_vec();
        }
        self
    }

    fn protocol(&self) -> u8 {
        match (&self.l4, self.src) {
            (L4::Tcp(_), _) => proto::TCP,
            (L4::Udp { .. }, _) => proto::UDP,
            (L4::Icmp { .. }, IpAddr::V4(_)) => proto::ICMP,
            (L4::Icmp { .. }, IpAddr::V6(_)) => proto::ICMPV6,
            (L4::Raw(p), _) => *p,
        }
    }

    /// The upper-layer segment with its checksum.
    fn segment(&self) -> Vec<u8> {
        let hl = match &self.l4 {
            L4::Tcp(t) => t.header_len(),
            L4::Udp { .. } => udp::HEADER_LEN,
            L4::Icmp { .. } => icmp::HEADER_LEN,
            L4::Raw(_) => 0,
        };
        let mut seg = vec![0u8; hl + self.payload.len()];
        seg[hl..].copy_from_slice(&self.payload);
        let csum_at = match &self.l4 {
            L4::Tcp(t) => {
                t.emit(&mut seg);
                Some(crate::tcp::field::CHECKSUM)
            }
            L4::Udp { src_port, dst_port } => {
                udp::emit_header(&mut seg, *src_port, *dst_port, self.payload.len());
                Some(udp::field::CHECKSUM)
            }
            L4::Icmp { msg_type, code, rest } => {
                icmp::emit_header(&mut seg, *msg_type, *code, *rest);
                Some(2)
            }
            L4::Raw(_) => None,
        };
        if let Some(at) = csum_at {
            let protocol = self.protocol();
            let pseudo = match (self.src, self.dst) {
                (IpAddr::V4(_), _) if protocol == proto::ICMP => 0,
                (IpAddr::V4(s), IpAddr::V4(d)) => checksum::pseudo_v4(s.octets(), d.octets(), protocol, seg.len() as u16),
                (IpAddr::V6(s), IpAddr::V6(d)) => checksum::pseudo_v6(&s.octets(), &d.octets(), protocol, seg.len() as u32),
                _ => unreachable!(),
            };
            let mut c = checksum::finish(checksum::accumulate(pseudo, &seg));
            if protocol == proto::UDP && c == 0 {
                c = 0xffff;
            }
            seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        seg
    }

    /// The IP packet, without Ethernet header.
    pub fn build_ip(&self) -> Vec<u8> {
        let seg = self.segment();
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let repr = Ipv4Repr {
                    src: s,
                    dst: d,
                    protocol: self.protocol(),
                    ttl: self.ttl,
                    tos: self.tos,
                    ident: self.ident,
                    dont_frag: self.dont_frag,
                    more_frags: false,
                    frag_offset: 0,
                    options: self.ip_options.clone(),
                    payload_len: seg.len(),
                };
                let hl = repr.header_len();
                let mut p = vec![0u8; hl + seg.len()];
                repr.emit(&mut p);
                p[hl..].copy_from_slice(&seg);
                p
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let repr = Ipv6Repr { src: s, dst: d, next_header: self.protocol(), hop_limit: self.ttl, traffic_class: self.tos, flow_label: 0, payload_len: seg.len() };
                let mut p = vec![0u8; ipv6::HEADER_LEN + seg.len()];
                repr.emit(&mut p);
                p[ipv6::HEADER_LEN..].copy_from_slice(&seg);
                p
            }
            _ => unreachable!(),
        }
    }

    /// The whole Ethernet frame.
    pub fn build(&self) -> Vec<u8> {
        let ip = self.build_ip();
        let et = if self.src.is_ipv4() { ethertype::IPV4 } else { ethertype::IPV6 };
        let hl = ethernet::header_len(self.vlan);
        let mut f = vec![0u8; hl + ip.len()];
        ethernet::write_header(&mut f[..hl], self.eth_dst, self.eth_src, self.vlan, et);
        f[hl..].copy_from_slice(&ip);
        f
    }
}

/// Wraps an IP packet in an Ethernet header.
pub fn ethernet_frame(dst: Mac, src: Mac, ip_packet: &[u8]) -> Vec<u8> {
    let et = if ip_packet.first().map(|b| b >> 4) == Some(6) { ethertype::IPV6 } else { ethertype::IPV4 };
    let mut f = vec![0u8; ethernet::HEADER_LEN + ip_packet.len()];
    ethernet::write_header(&mut f[..ethernet::HEADER_LEN], dst, src, None, et);
    f[ethernet::HEADER_LEN..].copy_from_slice(ip_packet);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipv4::Ipv4Packet;
    use crate::parse_frame;

    #[test]
    fn tcp_checksum_verifies() {
        let f = Builder::tcp("10.1.1.1:5555", "10.2.2.2:80", crate::tcp::flags::SYN).payload(b"x").build();
        let i = parse_frame(&f).unwrap();
        let ip = Ipv4Packet::new_checked(&f[i.l3..]).unwrap();
        assert!(ip.verify_checksum());
        let pseudo = checksum::pseudo_v4(ip.src_bytes(), ip.dst_bytes(), proto::TCP, i.l4_len() as u16);
        assert_eq!(checksum::fold(checksum::accumulate(pseudo, &f[i.l4..i.end])), 0xffff);
    }

    #[test]
    fn icmpv6_checksum_verifies() {
        let f = Builder::icmp("2001:db8::1", "2001:db8::2", icmp::v6::ECHO_REQUEST, 0, [0, 1, 0, 1]).build();
        let i = parse_frame(&f).unwrap();
        let s: [u8; 16] = f[i.l3 + 8..i.l3 + 24].try_into().unwrap();
        let d: [u8; 16] = f[i.l3 + 24..i.l3 + 40].try_into().unwrap();
        let pseudo = checksum::pseudo_v6(&s, &d, proto::ICMPV6, i.l4_len() as u32);
        assert_eq!(checksum::fold(checksum::accumulate(pseudo, &f[i.l4..i.end])), 0xffff);
    }
}
