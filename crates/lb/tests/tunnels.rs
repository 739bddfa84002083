//! TUN services whose backends are of the other family (Katran's IPv4-in-IPv6, and the
//! reverse): the outer header is the backend's family, its next protocol the client's packet's,
//! the client's packet rides unchanged but for its TTL / hop limit; MTU and refusals.

mod common;

use common::*;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::checksum::checksum;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::*;
use vectorlb_sched::Algorithm;

/// A TUN service on `vip_fam`'s VIP whose three backends are of `be_fam`'s family.
fn cross(vip_fam: &Fam, be_fam: &Fam) -> LbSpec {
    let mut spec = topology();
    let mut s = service(vip_fam, Mode::Tun, proto::TCP, 80, &[(1, 0, 1), (2, 0, 1), (3, 0, 1)]);
    s.scheduler = Algorithm::parse("maglev").unwrap();
    s.backends = (1..=3).map(|i| BackendSpec { addr: ip(&be_fam.backend(i)), port: 0, weight: 1, quic_id: None }).collect();
    spec.services.push(s);
    spec
}

#[test]
fn an_ipv4_vip_reaches_ipv6_backends_in_ipv4_in_ipv6() {
    let (v4, v6) = (Fam { v6: false }, Fam { v6: true });
    let mut lb = Lb::new(cross(&v4, &v6));
    let pkt = Builder::tcp(&v4.sock(v4.client(), 40000), &v4.sock(v4.vip(), 80), SYN).macs(ROUTER_MAC, EXT_MAC).build();
    let (v, out) = lb.run(&pkt);
    assert!(matches!(v, Verdict::Tx(1)), "{v:?}");
    assert_eq!(&out[12..14], &[0x86, 0xdd], "an IPv6 frame");
    let o = &out[14..54];
    assert_eq!(o[0] >> 4, 6);
    assert_eq!(o[6], 4, "next header: IPv4");
    assert_eq!(o[7], 64);
    let inner = &out[54..];
    assert_eq!(u16::from_be_bytes([o[4], o[5]]) as usize, inner.len(), "payload length: the inner packet");
    assert_eq!(&o[8..24], &ip(v6.int_addr()).to_canonical().to_string().parse::<std::net::Ipv6Addr>().unwrap().octets(), "from the LB's IPv6 address");
    let be = (1..=3u8).find(|&i| o[24..40] == ip(&v6.backend(i)).to_string().parse::<std::net::Ipv6Addr>().unwrap().octets()).expect("to an IPv6 backend");
    assert_eq!(&out[..6], &be_mac(be), "to that backend's MAC");
    // The client's packet, as sent but for its TTL (and so its header checksum).
    let sent = &pkt[14..];
    assert_eq!(inner.len(), sent.len());
    assert_eq!(inner[8], sent[8] - 1, "TTL");
    assert_eq!(checksum(&inner[..20]), 0, "inner header checksum");
    assert_eq!((&inner[..8], &inner[9..10], &inner[12..]), (&sent[..8], &sent[9..10], &sent[12..]));
    // Its next segment goes to the same backend.
    let (_, out2) = lb.run(&Builder::tcp(&v4.sock(v4.client(), 40000), &v4.sock(v4.vip(), 80), ACK).macs(ROUTER_MAC, EXT_MAC).build());
    assert_eq!(out2[..6], out[..6]);
    assert_eq!(out2[14 + 24..14 + 40], out[14 + 24..14 + 40]);
}

#[test]
fn an_ipv6_vip_reaches_ipv4_backends_in_ipv6_in_ipv4() {
    let (v4, v6) = (Fam { v6: false }, Fam { v6: true });
    let mut lb = Lb::new(cross(&v6, &v4));
    let pkt = Builder::tcp(&v6.sock(v6.client(), 40000), &v6.sock(v6.vip(), 80), SYN).macs(ROUTER_MAC, EXT_MAC).build();
    let (v, out) = lb.run(&pkt);
    assert!(matches!(v, Verdict::Tx(1)), "{v:?}");
    assert_eq!(&out[12..14], &[0x08, 0x00], "an IPv4 frame");
    let o = &out[14..34];
    assert_eq!((o[0], o[9], o[8]), (0x45, 41, 64), "IPv4, protocol 41, TTL 64");
    assert_eq!(o[6] & 0x40, 0x40, "DF: the inner IPv6 packet may not be fragmented on the way");
    assert_eq!(checksum(o), 0, "outer header checksum");
    let inner = &out[34..];
    assert_eq!(u16::from_be_bytes([o[2], o[3]]) as usize, 20 + inner.len());
    assert_eq!(&o[12..16], &[10, 1, 0, 1], "from the LB's IPv4 address");
    assert!((1..=3u8).any(|i| o[16..20] == ip(&v4.backend(i)).to_string().parse::<std::net::Ipv4Addr>().unwrap().octets()));
    let sent = &pkt[14..];
    assert_eq!(inner[7], sent[7] - 1, "hop limit");
    assert_eq!((&inner[..7], &inner[8..]), (&sent[..7], &sent[8..]));
}

#[test]
fn the_tunnel_header_counts_against_the_backends_mtu() {
    // 1,480 bytes of IPv4: no room for 40 bytes of IPv6 in 1,500; the client is told 1,460.
    let (v4, v6) = (Fam { v6: false }, Fam { v6: true });
    let mut lb = Lb::new(cross(&v4, &v6));
    let big = Builder::tcp(&v4.sock(v4.client(), 40000), &v4.sock(v4.vip(), 80), ACK | PSH).payload(&[7u8; 1440]).macs(ROUTER_MAC, EXT_MAC).build();
    lb.run(&Builder::tcp(&v4.sock(v4.client(), 40000), &v4.sock(v4.vip(), 80), SYN).macs(ROUTER_MAC, EXT_MAC).build());
    let (v, out) = lb.run(&big);
    assert!(matches!(v, Verdict::Tx(0)), "an ICMP error back to the client: {v:?}");
    assert_eq!((out[14 + 9], out[34], out[35]), (1, 3, 4), "ICMP destination unreachable, fragmentation needed");
    assert_eq!(u16::from_be_bytes([out[40], out[41]]), 1460);
}

#[test]
fn only_tunnels_mix_families() {
    let (v4, v6) = (Fam { v6: false }, Fam { v6: true });
    for mode in [Mode::Dr, Mode::Nat, Mode::Fnat] {
        let mut spec = cross(&v4, &v6);
        spec.services[0].mode = mode;
        if mode == Mode::Fnat {
            spec.services[0].local_addrs = vec![ip(v4.laddr())];
        }
        if mode != Mode::Dr {
            spec.services[0].scheduler = Algorithm::Rr;
            spec.services[0].backends.iter_mut().for_each(|b| b.port = 8080);
        }
        let e = Control::new(&spec).err().unwrap_or_else(|| panic!("{mode:?} with IPv6 backends on an IPv4 VIP was accepted")).to_string();
        assert!(e.contains("not of the VIP's family"), "{e}");
    }
}
