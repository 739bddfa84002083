//! The backends' decapsulator (`csrc/vectorlb_decap.c`), loaded into the kernel (root) and run
//! on frames with BPF_PROG_TEST_RUN: each tunnel kind opened into exactly the frame the client
//! sent (with the host's Ethernet header), everything else passed untouched, the source
//! restriction, malformed and fragmented tunnels, and mutated frames.

use vectorlb_dpdk::xdp::{self, Loaded, XDP_DROP, XDP_PASS};
use vectorlb_packet::builder::Builder;
use vectorlb_packet::checksum::checksum;

const LB: [u8; 6] = [2, 0, 0, 0, 0, 1];
const BE: [u8; 6] = [2, 0, 0, 0, 1, 0x11];

fn loaded() -> Loaded {
    // SAFETY: geteuid has no preconditions.
    assert!(unsafe { libc::geteuid() } == 0, "loading an XDP program needs root");
    Loaded::load_object(xdp::DECAP_OBJECT, xdp::DECAP_PROGRAM).expect("the kernel's verifier accepts the decapsulator")
}

/// The client's packet to the VIP, as an IP packet.
fn inner(v6: bool) -> Vec<u8> {
    let (c, v) = if v6 { ("[2001:db8:9::2]:40000", "[2001:db8:100::2]:9000") } else { ("10.9.0.2:40000", "10.100.0.2:9000") };
    Builder::tcp(c, v, 0x18).payload(b"hello through the tunnel").build_ip()
}

/// `ip` tunnelled from `src` to `dst` (both IPv4 or both IPv6), in an Ethernet frame from the
/// LB to the backend, as the LB's TUN mode sends it.
fn tunnel(src: &str, dst: &str, ip: &[u8]) -> Vec<u8> {
    let inner_proto = if ip[0] >> 4 == 4 { 4u8 } else { 41 };
    let mut f = Vec::new();
    f.extend_from_slice(&BE);
    f.extend_from_slice(&LB);
    match (src.parse::<std::net::IpAddr>().unwrap(), dst.parse::<std::net::IpAddr>().unwrap()) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let mut h = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, inner_proto, 0, 0];
            h[2..4].copy_from_slice(&((20 + ip.len()) as u16).to_be_bytes());
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let c = checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&h);
        }
        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(ip.len() as u16).to_be_bytes());
            f.extend_from_slice(&[inner_proto, 64]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => panic!("mixed families"),
    }
    f.extend_from_slice(ip);
    f
}

/// What the host's kernel must see: the backend's Ethernet header, then the client's packet.
fn opened(ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&BE);
    f.extend_from_slice(&LB);
    f.extend_from_slice(if ip[0] >> 4 == 4 { &[0x08, 0x00] } else { &[0x86, 0xdd] });
    f.extend_from_slice(ip);
    f
}

#[test]
fn every_tunnel_kind_opens_into_the_clients_packet() {
    let p = loaded();
    let cases = [("10.1.0.1", "10.1.0.11", false), ("10.1.0.1", "10.1.0.11", true), ("2001:db8:1::1", "2001:db8:1::11", true), ("2001:db8:1::1", "2001:db8:1::11", false)];
    for (src, dst, v6) in cases {
        let ip = inner(v6);
        let (v, out) = p.run_out(&tunnel(src, dst, &ip)).unwrap();
        assert_eq!(v, XDP_PASS, "{src} {v6}");
        assert_eq!(out, opened(&ip), "{src} -> {dst}, inner v6 {v6}");
    }
    let s = xdp::decap_stats(&p).unwrap();
    assert_eq!((s.v4_in_v4, s.v6_in_v4, s.v6_in_v6, s.v4_in_v6), (1, 1, 1, 1), "{s:?}");
    // What is not a tunnel passes untouched, and is not counted.
    for f in [
        Builder::tcp("10.9.0.2:1", "10.100.0.2:80", 0x02).macs(LB, BE).build(),
        Builder::udp("[2001:db8:9::2]:53", "[2001:db8:1::11]:53").payload(b"x").macs(LB, BE).build(),
        vec![0u8; 14],
        {
            let mut arp = vec![0u8; 42];
            arp[12..14].copy_from_slice(&[0x08, 0x06]);
            arp
        },
    ] {
        assert_eq!(p.run_out(&f).unwrap(), (XDP_PASS, f.clone()));
    }
    assert_eq!(xdp::decap_stats(&p).unwrap(), s);
}

#[test]
fn tunnels_from_other_sources_are_dropped_when_restricted() {
    let p = loaded();
    xdp::set_decap_from(&p, &[("10.1.0.0".parse().unwrap(), 24), ("2001:db8:1::".parse().unwrap(), 64)]).unwrap();
    let ip = inner(false);
    assert_eq!(p.run_out(&tunnel("10.1.0.3", "10.1.0.11", &ip)).unwrap(), (XDP_PASS, opened(&ip)));
    assert_eq!(p.run_out(&tunnel("2001:db8:1::3", "2001:db8:1::11", &ip)).unwrap(), (XDP_PASS, opened(&ip)));
    assert_eq!(p.run_out(&tunnel("192.0.2.7", "10.1.0.11", &ip)).unwrap().0, XDP_DROP);
    assert_eq!(p.run_out(&tunnel("2001:db8:2::3", "2001:db8:1::11", &ip)).unwrap().0, XDP_DROP);
    assert_eq!(xdp::decap_stats(&p).unwrap().not_allowed, 2);
    // No prefix: open again.
    xdp::set_decap_from(&p, &[]).unwrap();
    assert_eq!(p.run_out(&tunnel("192.0.2.7", "10.1.0.11", &ip)).unwrap().0, XDP_PASS);
}

#[test]
fn malformed_and_fragmented_tunnels_are_never_opened() {
    let p = loaded();
    let ip4 = inner(false);
    // Protocol 4 announcing an IPv4 packet that is IPv6.
    let mut f = tunnel("10.1.0.1", "10.1.0.11", &inner(true));
    f[23] = 4;
    assert_eq!(p.run_out(&f).unwrap().0, XDP_DROP);
    // An inner header cut short.
    let f = tunnel("10.1.0.1", "10.1.0.11", &ip4[..12]);
    assert_eq!(p.run_out(&f).unwrap().0, XDP_DROP);
    // An outer header length below 5 words.
    let mut f = tunnel("10.1.0.1", "10.1.0.11", &ip4);
    f[14] = 0x44;
    assert_eq!(p.run_out(&f).unwrap().0, XDP_DROP);
    // An outer fragment (more fragments set): passed unopened.
    let mut f = tunnel("10.1.0.1", "10.1.0.11", &ip4);
    f[20] |= 0x20;
    assert_eq!(p.run_out(&f).unwrap(), (XDP_PASS, f.clone()));
    let s = xdp::decap_stats(&p).unwrap();
    assert_eq!((s.malformed, s.fragment, s.v4_in_v4), (3, 1, 0), "{s:?}");
}

#[test]
fn mutated_tunnels_only_pass_or_drop() {
    let p = loaded();
    let base = [tunnel("10.1.0.1", "10.1.0.11", &inner(false)), tunnel("2001:db8:1::1", "2001:db8:1::11", &inner(false))];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20_000 {
        let mut f = base[i % 2].clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % f.len() as u64) as usize;
            f[at] = next() as u8;
        }
        // (BPF_PROG_TEST_RUN takes nothing shorter than an Ethernet header.)
        f.truncate(14 + (next() % (f.len() - 13) as u64) as usize);
        let (v, out) = p.run_out(&f).unwrap();
        assert!(v == XDP_PASS || v == XDP_DROP, "{v}");
        assert!(out.len() <= f.len(), "the program only removes");
    }
}
