//! The XDP flow director itself, loaded into the kernel (root) and run on frames with
//! BPF_PROG_TEST_RUN: what it sends to the data plane, each queue set's counters, and the
//! default set's ingress policer. (The AF_XDP driver on veth takes one queue, so a daemon on
//! veth cannot have the two workers a set needs; here the program is tested without one.)
//! With no AF_XDP socket in its map the program's redirect falls back to XDP_PASS, so what it
//! takes for the data plane shows in its counters, and a policed packet as XDP_DROP.

use std::time::Instant;
use vectorlb_dpdk::xdp::{self, Loaded, Police, QsMatch, QS_DEFAULT, XDP_DROP, XDP_PASS, XDP_REDIRECT};
use vectorlb_packet::builder::Builder;

const ROUTER: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
const LB: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

fn tcp(src: &str, dst: &str) -> Vec<u8> {
    Builder::tcp(src, dst, 0x02).macs(ROUTER, LB).build()
}

fn udp(src: &str, dst: &str, len: usize) -> Vec<u8> {
    Builder::udp(src, dst).payload(&vec![0u8; len]).macs(ROUTER, LB).build()
}

fn loaded() -> Loaded {
    // SAFETY: geteuid has no preconditions.
    assert!(unsafe { libc::geteuid() } == 0, "loading an XDP program needs root");
    let p = Loaded::load().expect("the kernel's verifier accepts the program");
    xdp::set_addrs(&p, &[(ip("10.0.0.100"), xdp::FLAG_DST), (ip("2001:db8::100"), xdp::FLAG_DST), (ip("10.1.0.200"), xdp::FLAG_DST), (ip("10.1.0.11"), xdp::FLAG_SRC)]).unwrap();
    p
}

/// The set "mc" (index 0): memcached on the VIP, TCP 11211, v4 and v6, and its backend.
fn mc() -> Vec<(QsMatch, u32)> {
    vec![
        (QsMatch::Service { vip: ip("10.0.0.100"), port: 11211, proto: 6 }, 0),
        (QsMatch::Service { vip: ip("2001:db8::100"), port: 11211, proto: 6 }, 0),
        (QsMatch::Backend { addr: ip("10.1.0.11"), port: 11211, proto: 6 }, 0),
        (QsMatch::Vip { addr: ip("10.0.0.100") }, 0),
        (QsMatch::Vip { addr: ip("2001:db8::100") }, 0),
    ]
}

fn stats(p: &Loaded, i: u32) -> xdp::QsStats {
    xdp::queue_set_stats(p, &[i]).unwrap()[0]
}

#[test]
fn it_sends_ours_to_the_data_plane_and_counts_each_queue_sets_packets() {
    let p = loaded();
    let to_mc = tcp("198.51.100.7:4000", "10.0.0.100:11211");
    assert_eq!(p.run(&to_mc).unwrap(), XDP_PASS);
    // Without sets or a limit nothing is counted.
    assert_eq!(stats(&p, QS_DEFAULT), xdp::QsStats::default());
    xdp::set_queue_sets(&p, &mc(), None).unwrap();
    // Not ours (the kernel's): not counted.
    assert_eq!(p.run(&udp("198.51.100.7:4000", "192.0.2.1:53", 10)).unwrap(), XDP_PASS);
    assert_eq!(p.run(&tcp("10.1.0.12:11211", "10.1.0.99:40000")).unwrap(), XDP_PASS);
    assert_eq!(stats(&p, QS_DEFAULT).packets + stats(&p, 0).packets, 0);
    let frames = [
        (to_mc.clone(), 0),
        (tcp("[2001:db8:5::7]:4000", "[2001:db8::100]:11211"), 0),
        // The backend's reply (full NAT: to the local address).
        (tcp("10.1.0.11:11211", "10.1.0.200:40000"), 0),
        // With IP options the ports are further in.
        (Builder::tcp("198.51.100.7:4001", "10.0.0.100:11211", 0x02).ip_options(&[1, 1, 1, 1]).macs(ROUTER, LB).build(), 0),
        (tcp("198.51.100.7:4000", "10.0.0.100:80"), QS_DEFAULT),
        (udp("198.51.100.7:4000", "10.0.0.100:11211", 10), QS_DEFAULT),
        (tcp("10.1.0.11:80", "10.1.0.200:40000"), QS_DEFAULT),
    ];
    let mut want = [0u64; 2];
    for (f, set) in &frames {
        assert_eq!(p.run(f).unwrap(), XDP_PASS);
        want[(*set == QS_DEFAULT) as usize] += 1;
    }
    // A later fragment carries no ports: it goes by its destination, a set's VIP; to another
    // address of ours, the default set's. An IPv6 packet with an extension header the same.
    let mut frag = to_mc.clone();
    frag[20..22].copy_from_slice(&0x0010u16.to_be_bytes()); // offset 128 bytes, no DF
    assert_eq!(p.run(&frag).unwrap(), XDP_PASS);
    want[0] += 1;
    let mut frag_local = tcp("10.1.0.11:80", "10.1.0.200:40000");
    frag_local[20..22].copy_from_slice(&0x0010u16.to_be_bytes());
    assert_eq!(p.run(&frag_local).unwrap(), XDP_PASS);
    want[1] += 1;
    let mut ext = tcp("[2001:db8:5::7]:4000", "[2001:db8::100]:80");
    ext[20] = 60; // next header: destination options (the rest is not parsed)
    assert_eq!(p.run(&ext).unwrap(), XDP_PASS);
    want[0] += 1;
    let (s, d) = (stats(&p, 0), stats(&p, QS_DEFAULT));
    assert_eq!((s.packets, d.packets), (want[0], want[1]), "set {s:?} default {d:?}");
    assert!(s.bytes >= 54 * want[0] && s.policed == 0 && d.policed == 0);
    // Truncated frames (the kernel takes none shorter than an Ethernet header) are never read
    // past their end.
    // Cut before the ports (14 + 20 + 4 bytes) they are not the set's; with them they are.
    for cut in [14, 20, 33, 34, 36, 37] {
        assert_eq!(p.run(&to_mc[..cut]).unwrap(), XDP_PASS, "cut at {cut}");
    }
    assert_eq!(stats(&p, 0).packets, s.packets, "cut before the ports: not the set's");
    for cut in [38, 40] {
        p.run(&to_mc[..cut]).unwrap();
    }
    let s = stats(&p, 0);
    assert_eq!(s.packets, want[0] + 2, "with the ports: the set's");
    // A hostile header length: below 20 bytes, or 60 bytes in a frame that ends before the
    // ports: the default set's, never read past the frame.
    let before = stats(&p, QS_DEFAULT).packets;
    for ihl in [0u8, 4, 15] {
        let mut f = to_mc.clone();
        f[14] = 0x40 | ihl;
        assert_eq!(p.run(&f).unwrap(), XDP_PASS, "ihl {ihl}");
    }
    assert_eq!(stats(&p, 0).packets, want[0] + 2, "none of them the set's (its VIP is not in the default's way: they are not fragments)");
    assert_eq!(stats(&p, QS_DEFAULT).packets, before + 3);
    // Removing the sets stops the counting.
    xdp::set_queue_sets(&p, &[], None).unwrap();
    p.run(&to_mc).unwrap();
    assert_eq!(stats(&p, 0).packets, s.packets);
}

/// Offers `n` frames of the default set (and one of the set's after each) as fast as the
/// test can; returns (passed, dropped, seconds).
fn offer(p: &Loaded, n: usize, frame: &[u8], set_frame: &[u8]) -> (u64, u64, f64) {
    let t0 = Instant::now();
    let (mut passed, mut dropped) = (0, 0);
    for _ in 0..n {
        match p.run(frame).unwrap() {
            XDP_PASS | XDP_REDIRECT => passed += 1,
            XDP_DROP => dropped += 1,
            v => panic!("verdict {v}"),
        }
        assert_eq!(p.run(set_frame).unwrap(), XDP_PASS, "a set's packet is never policed");
    }
    (passed, dropped, t0.elapsed().as_secs_f64())
}

#[test]
fn the_default_sets_ingress_limit_drops_the_excess_before_the_ring() {
    let p = loaded();
    let bulk = udp("198.51.100.7:4000", "10.0.0.100:9", 1000);
    let set = tcp("198.51.100.7:5000", "10.0.0.100:11211");
    // 1,000 packets/s with a 10 ms burst: 10 at once (and one more at the edge), then one a ms.
    xdp::set_queue_sets(&p, &mc(), Some(Police { pps: Some(1_000), bps: None, burst_ms: 10 })).unwrap();
    let (passed, dropped, secs) = offer(&p, 3_000, &bulk, &set);
    assert_eq!(passed + dropped, 3_000);
    let most = 11.0 + 1_000.0 * secs + 1.0;
    assert!(passed >= 10 && passed as f64 <= most, "{passed} passed in {secs:.4} s (at most {most:.0})");
    assert!(dropped > 0, "the test offered more than 1,000/s: {secs:.4} s for 3,000");
    let d = stats(&p, QS_DEFAULT);
    assert_eq!((d.packets, d.policed), (passed, dropped));
    assert_eq!((stats(&p, 0).packets, stats(&p, 0).policed), (3_000, 0));
    // Bits per second: 8 Mb/s is 1,000 B/ms; a 10 ms burst passes 10 frames of ~1,042 B.
    xdp::set_queue_sets(&p, &mc(), Some(Police { pps: None, bps: Some(8_000_000), burst_ms: 10 })).unwrap();
    let (passed, dropped, secs) = offer(&p, 2_000, &bulk, &set);
    let most = (10_000.0 + 1_000_000.0 * secs) / bulk.len() as f64 + 2.0;
    assert!(passed >= 9 && passed as f64 <= most && dropped > 0, "{passed} passed, {dropped} dropped in {secs:.4} s (at most {most:.0})");
    // A limit no one reaches, and no limit: nothing dropped.
    for police in [Some(Police { pps: Some(u64::MAX), bps: Some(u64::MAX), burst_ms: 1 }), None] {
        xdp::set_queue_sets(&p, &mc(), police).unwrap();
        let (passed, dropped, _) = offer(&p, 500, &bulk, &set);
        assert_eq!((passed, dropped), (500, 0), "{police:?}");
    }
    // ICMP errors and neighbour discovery are never policed (they keep the sets' flows and
    // addresses working); echo requests are.
    xdp::set_queue_sets(&p, &mc(), Some(Police { pps: Some(1), bps: None, burst_ms: 1 })).unwrap();
    let icmp = |src: &str, dst: &str, t: u8| Builder::icmp(src, dst, t, 0, [0; 4]).macs(ROUTER, LB).build();
    for (f, what) in [
        (icmp("198.51.100.7", "10.0.0.100", 3), "v4 unreachable"),
        (icmp("198.51.100.7", "10.0.0.100", 11), "v4 time exceeded"),
        (icmp("2001:db8:5::7", "2001:db8::100", 2), "v6 packet too big"),
        (icmp("2001:db8:5::7", "2001:db8::100", 135), "v6 neighbour solicitation"),
    ] {
        assert!((0..50).all(|_| p.run(&f).unwrap() == XDP_PASS), "{what} policed");
    }
    let echo = icmp("198.51.100.7", "10.0.0.100", 8);
    assert!((0..50).filter(|_| p.run(&echo).unwrap() == XDP_DROP).count() >= 48, "echo requests are policed");
    // The limit alone, without sets: everything ours is the default set's.
    xdp::set_queue_sets(&p, &[], Some(Police { pps: Some(1_000), bps: None, burst_ms: 10 })).unwrap();
    let before = stats(&p, QS_DEFAULT).policed;
    let dropped = (0..2_000).filter(|_| p.run(&set).unwrap() == XDP_DROP).count() as u64;
    assert!(dropped > 0);
    assert_eq!(stats(&p, QS_DEFAULT).policed - before, dropped);
}
