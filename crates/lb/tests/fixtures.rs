//! Packet fixtures: for every forwarding mode, family and protocol, an input frame and the
//! exact frame expected out (built independently with the packet builder), in the manner of
//! Katran's tester.

mod common;

use common::*;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::*;

const MODES: [Mode; 4] = [Mode::Nat, Mode::Fnat, Mode::Dr, Mode::Tun];

fn client_packet(f: &Fam, protocol: u8, vport: u16) -> Builder {
    let (src, dst) = (f.sock(f.client(), 40000), f.sock(f.vip(), vport));
    let b = if protocol == proto::TCP {
        Builder::tcp(&src, &dst, SYN).seq(1000)
    } else {
        Builder::udp(&src, &dst).payload(b"query")
    };
    b.macs(ROUTER_MAC, EXT_MAC)
}

/// What a packet looks like with new endpoints (same flags, payload, sequence numbers).
fn with_endpoints(b: &Builder, src: &str, dst: &str) -> Builder {
    let mut n = match &b.l4 {
        vectorlb_packet::builder::L4::Tcp(t) => Builder::tcp(src, dst, t.flags).seq(t.seq).ack(t.ack),
        _ => Builder::udp(src, dst),
    };
    n.payload = b.payload.clone();
    n.ttl = b.ttl;
    n
}

fn check(mode: Mode, v6: bool, protocol: u8) {
    let f = Fam { v6 };
    let vport = if protocol == proto::TCP { 80 } else { 53 };
    let bport = match mode {
        Mode::Nat | Mode::Fnat => 8080,
        _ => 0,
    };
    let mut spec = topology();
    spec.services.push(service(&f, mode, protocol, vport, &[(1, bport, 1)]));
    let mut lb = Lb::new(spec);
    let what = format!("{} {} {}", mode.name(), if v6 { "ipv6" } else { "ipv4" }, proto_name(protocol));

    // Client to VIP.
    let input = client_packet(&f, protocol, vport);
    let be = f.backend(1);
    let expected = match mode {
        Mode::Nat => with_endpoints(&input, &f.sock(f.client(), 40000), &f.sock(&be, 8080)).ttl(63).build_ip(),
        Mode::Fnat => with_endpoints(&input, &f.sock(f.laddr(), 1024), &f.sock(&be, 8080)).ttl(63).build_ip(),
        Mode::Dr => input.clone().ttl(63).build_ip(),
        Mode::Tun => {
            let inner = input.clone().ttl(63).build_ip();
            let outer_proto = if v6 { proto::IPV6 } else { proto::IPIP };
            Builder::raw(f.int_addr(), &be, outer_proto).ident(1).payload(&inner).build_ip()
        }
    };
    let expected = vectorlb_packet::builder::ethernet_frame(be_mac(1), INT_MAC, &expected);
    let (v, out) = lb.run(&input.build());
    assert_eq!(v, Verdict::Tx(1), "{what}: verdict");
    assert_eq!(hex(&out), hex(&expected), "{what}: client to backend");
    assert_eq!(lb.worker.table.len(), 1, "{what}: one session");

    if matches!(mode, Mode::Nat | Mode::Fnat) {
        // The backend's reply comes back through the LB.
        let to = if mode == Mode::Nat { f.sock(f.client(), 40000) } else { f.sock(f.laddr(), 1024) };
        let reply = if protocol == proto::TCP {
            Builder::tcp(&f.sock(&be, 8080), &to, SYN | ACK).seq(5000).ack(1001)
        } else {
            Builder::udp(&f.sock(&be, 8080), &to).payload(b"answer")
        }
        .macs(be_mac(1), INT_MAC);
        let expected = with_endpoints(&reply, &f.sock(f.vip(), vport), &f.sock(f.client(), 40000))
            .ttl(63)
            .macs(EXT_MAC, ROUTER_MAC)
            .build();
        let (v, out) = lb.run(&reply.build());
        assert_eq!(v, Verdict::Tx(0), "{what}: reply verdict");
        assert_eq!(hex(&out), hex(&expected), "{what}: backend to client");
    }
    // A second packet of the flow takes the same session.
    if protocol == proto::UDP {
        let (v, _) = lb.run(&input.build());
        assert_eq!(v, Verdict::Tx(1));
        assert_eq!(lb.worker.table.len(), 1, "{what}: same session");
    }
}

#[test]
fn every_mode_family_protocol() {
    for mode in MODES {
        for v6 in [false, true] {
            for p in [proto::TCP, proto::UDP] {
                check(mode, v6, p);
            }
        }
    }
}

#[test]
fn icmp_echo_to_vip() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 80, 1)]));
        let mut lb = Lb::new(spec);
        let (req_t, rep_t) = if v6 { (128, 129) } else { (8, 0) };
        let req = Builder::icmp(f.client(), f.vip(), req_t, 0, [0, 7, 0, 1]).payload(b"ping").macs(ROUTER_MAC, EXT_MAC);
        let rep = Builder::icmp(f.vip(), f.client(), rep_t, 0, [0, 7, 0, 1]).payload(b"ping").macs(EXT_MAC, ROUTER_MAC);
        lb.expect_tx(&req.build(), 0, &rep.build());
        assert_eq!(lb.worker.counters.icmp_echo_replies, 1);
        // Echo to an address that is not ours goes to the kernel.
        let other = Builder::icmp(f.client(), f.backend(1).as_str(), req_t, 0, [0; 4]).build();
        assert_eq!(lb.run(&other).0, Verdict::Kernel);
    }
}

#[test]
fn ttl_expiry_sends_time_exceeded() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Nat, proto::UDP, 53, &[(1, 53, 1)]));
    let mut lb = Lb::new(spec);
    let input = client_packet(&f, proto::UDP, 53).ttl(1);
    let quoted = input.build_ip();
    let expected = Builder::icmp(f.vip(), f.client(), 11, 0, [0; 4])
        .ident(1)
        .dont_frag(false)
        .payload(&quoted)
        .macs(EXT_MAC, ROUTER_MAC)
        .build();
    lb.expect_tx(&input.build(), 0, &expected);
    assert_eq!(lb.worker.counters.dropped(DropReason::TtlExceeded), 1);
    assert_eq!(lb.worker.table.len(), 0, "no session for an expired packet");
}

#[test]
fn path_mtu_discovery_through_the_lb() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        spec.ports[1].mtu = 1280;
        spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1)]));
        let mut lb = Lb::new(spec);
        // Handshake, then a full-size segment from the client.
        lb.run(&client_packet(&f, proto::TCP, 80).build());
        let big = Builder::tcp(&f.sock(f.client(), 40000), &f.sock(f.vip(), 80), ACK)
            .seq(1001)
            .payload(&vec![0x55; 1400])
            .macs(ROUTER_MAC, EXT_MAC);
        let ip_pkt = big.build_ip();
        let (t, code, rest): (u8, u8, [u8; 4]) =
            if v6 { (2, 0, 1280u32.to_be_bytes()) } else { (3, 4, [0, 0, 0x05, 0x00]) };
        let quote = if v6 { 1280 - 48 } else { 576 - 28 };
        let expected = Builder::icmp(f.vip(), f.client(), t, code, rest)
            .ident(1)
            .dont_frag(false)
            .payload(&ip_pkt[..quote])
            .macs(EXT_MAC, ROUTER_MAC)
            .build();
        lb.expect_tx(&big.build(), 0, &expected);
        assert_eq!(lb.worker.counters.dropped(DropReason::MtuExceeded), 1);
    }
}

#[test]
fn icmp_errors_are_translated_for_their_session() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1)]));
        let mut lb = Lb::new(spec);
        lb.run(&client_packet(&f, proto::TCP, 80).build());
        // A router on the backend side reports that the LB's packet (laddr:1024 -> backend:8080)
        // was too big; the error must reach the client about the packet it sent to the VIP.
        let be = f.backend(1);
        let sent = Builder::tcp(&f.sock(f.laddr(), 1024), &f.sock(&be, 8080), ACK).seq(1001).payload(&[1; 32]);
        let router = if v6 { "2001:db8:1::fe" } else { "10.1.0.254" };
        let (t, code, rest): (u8, u8, [u8; 4]) = if v6 { (2, 0, 1400u32.to_be_bytes()) } else { (3, 4, [0, 0, 5, 0x78]) };
        let err = Builder::icmp(router, f.laddr(), t, code, rest).payload(&sent.build_ip()).macs(be_mac(1), INT_MAC);
        let orig = with_client_view(&f, &sent);
        let expected = Builder::icmp(f.vip(), f.client(), t, code, rest)
            .ttl(63)
            .payload(&orig)
            .macs(EXT_MAC, ROUTER_MAC)
            .build();
        let (v, out) = lb.run(&err.build());
        assert_eq!(v, Verdict::Tx(0), "v6={v6}");
        // The embedded TCP checksum is not rewritten (as in IPVS): compare all but it.
        let csum_at = expected.len() - 32 - 20 + 16;
        let mut out2 = out.clone();
        out2[csum_at..csum_at + 2].copy_from_slice(&expected[csum_at..csum_at + 2]);
        // The ICMP checksum covers the embedded checksum: recompute the expectation's.
        let mut exp2 = expected.clone();
        fix_icmp_checksum(&mut exp2, v6);
        fix_icmp_checksum(&mut out2, v6);
        assert_eq!(hex(&out2), hex(&exp2), "v6={v6}");
        assert_eq!(lb.worker.counters.icmp_errors_translated, 1);
    }
}

/// The packet the client sent, as the error translation rewrites the quoted one: client:40000
/// to VIP:80 with the rest unchanged (the quoted TCP checksum is left as it was).
fn with_client_view(f: &Fam, sent: &Builder) -> Vec<u8> {
    let mut b = sent.clone();
    b.src = ip(f.client());
    b.dst = ip(f.vip());
    if let vectorlb_packet::builder::L4::Tcp(t) = &mut b.l4 {
        t.src_port = 40000;
        t.dst_port = 80;
    }
    b.build_ip()
}

fn fix_icmp_checksum(frame: &mut [u8], v6: bool) {
    let info = vectorlb_packet::parse_frame(frame).unwrap();
    frame[info.l4 + 2] = 0;
    frame[info.l4 + 3] = 0;
    let pseudo = if v6 {
        let s: [u8; 16] = frame[info.l3 + 8..info.l3 + 24].try_into().unwrap();
        let d: [u8; 16] = frame[info.l3 + 24..info.l3 + 40].try_into().unwrap();
        vectorlb_packet::checksum::pseudo_v6(&s, &d, proto::ICMPV6, info.l4_len() as u32)
    } else {
        0
    };
    let c = vectorlb_packet::checksum::finish(vectorlb_packet::checksum::accumulate(pseudo, &frame[info.l4..info.end]));
    frame[info.l4 + 2..info.l4 + 4].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn tcp_lifecycle_and_expiry() {
    let f = Fam { v6: false };
    let mut spec = topology();
    let mut s = service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1)]);
    s.timeouts.time_wait = 2_000;
    spec.services.push(s);
    let mut lb = Lb::new(spec);
    let (c, v, be, l) = f.flow();
    let steps: [(bool, u8); 8] = [
        (true, SYN),
        (false, SYN | ACK),
        (true, ACK),
        (true, ACK | PSH),
        (false, ACK | PSH),
        (true, FIN | ACK),
        (false, FIN | ACK),
        (true, ACK),
    ];
    let states = ["syn_sent", "syn_recv", "established", "established", "established", "fin_wait", "last_ack", "time_wait"];
    for (k, (inbound, fl)) in steps.iter().enumerate() {
        let pkt = if *inbound {
            Builder::tcp(&c, &v, *fl).macs(ROUTER_MAC, EXT_MAC)
        } else {
            Builder::tcp(&be, &l, *fl).macs(be_mac(1), INT_MAC)
        };
        let (verdict, _) = lb.run(&pkt.build());
        assert!(matches!(verdict, Verdict::Tx(_)), "step {k}: {verdict:?}");
        let mut st = String::new();
        lb.worker.table.for_each::<[u8; 4]>(0, |_, s| {
            st = vectorlb_lb::session::state::name(s.state).to_string();
            true
        });
        assert_eq!(st, states[k], "step {k}");
        lb.now += 10;
    }
    assert_eq!(lb.worker.table.len(), 1);
    // TIME-WAIT lasts 2 s: still there after 1 s, gone after 2.1 s.
    lb.worker.idle(lb.now + 1_000, 1000);
    assert_eq!(lb.worker.table.len(), 1);
    lb.worker.idle(lb.now + 2_100, 1000);
    assert_eq!(lb.worker.table.len(), 0);
    assert_eq!(lb.worker.table.stats.expired, 1);
    // A late ACK finds no session and is dropped, not re-scheduled.
    lb.now += 3_000;
    lb.expect_drop(&Builder::tcp(&c, &v, ACK).macs(ROUTER_MAC, EXT_MAC).build(), DropReason::NoSession);
}

#[test]
fn time_wait_zero_removes_at_last_ack() {
    let f = Fam { v6: true };
    let mut spec = topology();
    let mut s = service(&f, Mode::Nat, proto::TCP, 80, &[(1, 8080, 1)]);
    s.timeouts.time_wait = 0;
    spec.services.push(s);
    let mut lb = Lb::new(spec);
    let (c, v, be, _) = f.flow();
    for (inbound, fl) in [(true, SYN), (false, SYN | ACK), (true, ACK), (true, FIN | ACK), (false, FIN | ACK), (true, ACK)] {
        let pkt = if inbound { Builder::tcp(&c, &v, fl) } else { Builder::tcp(&be, &c, fl) };
        assert!(matches!(lb.run(&pkt.build()).0, Verdict::Tx(_)));
    }
    assert_eq!(lb.worker.table.len(), 0);
    assert_eq!(lb.worker.table.stats.removed, 1);
}

#[test]
fn full_table_refuses_new_keeps_established() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 53, 1)]));
    let mut lb = Lb::with_capacity(spec, 4);
    let pkt = |port: u16| Builder::udp(&f.sock(f.client(), port), &f.sock(f.vip(), 53)).payload(b"q").build();
    for p in 0..4 {
        assert_eq!(lb.run(&pkt(1000 + p)).0, Verdict::Tx(1));
    }
    lb.expect_drop(&pkt(2000), DropReason::TableFull);
    assert_eq!(lb.run(&pkt(1001)).0, Verdict::Tx(1), "established flow still forwarded");
    assert_eq!(lb.worker.table.len(), 4);
    assert_eq!(lb.worker.counters.dropped(DropReason::TableFull), 1);
}

#[test]
fn drained_then_removed_backend() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 53, 1), (2, 53, 1)]));
    let mut lb = Lb::new(spec.clone());
    let pkt = |port: u16| Builder::udp(&f.sock(f.client(), port), &f.sock(f.vip(), 53)).payload(b"q").build();
    let dst = |out: &[u8]| out[14 + 16..14 + 20].to_vec();
    let (_, a) = lb.run(&pkt(1000));
    let (_, b) = lb.run(&pkt(1001));
    assert_eq!(dst(&a), vec![10, 1, 0, 11]);
    assert_eq!(dst(&b), vec![10, 1, 0, 12]);
    // Drain backend 1: its session continues; new sessions avoid it.
    spec.services[0].backends[0].weight = 0;
    lb.control.apply(&spec).unwrap();
    assert_eq!(dst(&lb.run(&pkt(1000)).1), vec![10, 1, 0, 11], "established session stays");
    for p in 2000..2010 {
        assert_eq!(dst(&lb.run(&pkt(p)).1), vec![10, 1, 0, 12], "new sessions avoid the drained backend");
    }
    // Remove it: a UDP flow has no connection to break, so its session ends and the same
    // datagram starts a new one on a live backend.
    spec.services[0].backends.remove(0);
    lb.control.apply(&spec).unwrap();
    let before = lb.worker.table.len();
    assert_eq!(dst(&lb.run(&pkt(1000)).1), vec![10, 1, 0, 12]);
    assert_eq!(lb.worker.table.len(), before, "the old session went, a new one came");
}

#[test]
fn port_reuse_and_removed_backends_reschedule_new_tcp_connections() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 80, 1), (2, 80, 1)]));
    let mut lb = Lb::new(spec.clone());
    let dst = |out: &[u8]| out[14 + 16..14 + 20].to_vec();
    let c = |flags: u8| Builder::tcp(&f.sock(f.client(), 5000), &f.sock(f.vip(), 80), flags).build();
    use vectorlb_packet::tcp::flags as tf;
    // A connection to backend 1 (rr), reset by the client: CLOSE (TIME_WAIT is handled alike).
    assert_eq!(dst(&lb.run(&c(tf::SYN)).1), vec![10, 1, 0, 11]);
    lb.run(&c(tf::ACK));
    lb.run(&c(tf::RST));
    // Backend 1 is drained; the client reuses its port for a new connection: it goes to
    // backend 2, not to the drained one the old session named.
    spec.services[0].backends[0].weight = 0;
    lb.control.apply(&spec).unwrap();
    assert_eq!(dst(&lb.run(&c(tf::SYN)).1), vec![10, 1, 0, 12]);
    // Backend 2 is removed mid-connection: the connection's next packet is dropped and its
    // session ends, but a new SYN on the same port is scheduled at once.
    lb.run(&c(tf::ACK));
    spec.services[0].backends[0].weight = 1;
    spec.services[0].backends.remove(1);
    lb.control.apply(&spec).unwrap();
    // The client learns at once: a reset from the VIP, in sequence with what it sent.
    let ack_in = c(tf::ACK);
    let (v, rst) = lb.run(&ack_in);
    assert_eq!(v, Verdict::Tx(0));
    let (l3, l4) = (14, 34);
    assert_eq!(rst.len(), 14 + 40);
    assert_eq!(&rst[l3 + 12..l3 + 16], &ack_in[l3 + 16..l3 + 20], "from the VIP");
    assert_eq!(&rst[l3 + 16..l3 + 20], &ack_in[l3 + 12..l3 + 16], "to the client");
    assert_eq!(&rst[l4..l4 + 2], &ack_in[l4 + 2..l4 + 4]);
    assert_eq!(&rst[l4 + 2..l4 + 4], &ack_in[l4..l4 + 2]);
    assert_eq!(&rst[l4 + 4..l4 + 8], &ack_in[l4 + 8..l4 + 12], "seq = the segment's ACK number");
    assert_eq!(rst[l4 + 13], tf::RST);
    assert_eq!(vectorlb_packet::checksum::checksum(&rst[l3..l3 + 20]), 0, "IPv4 header checksum");
    let pseudo = vectorlb_packet::checksum::pseudo_v4(rst[l3 + 12..l3 + 16].try_into().unwrap(), rst[l3 + 16..l3 + 20].try_into().unwrap(), 6, 20);
    assert_eq!(vectorlb_packet::checksum::fold(vectorlb_packet::checksum::accumulate(pseudo, &rst[l4..])), 0xffff, "TCP checksum");
    assert_eq!(lb.worker.counters.tcp_resets_sent, 1);
    // The session is gone: a RST from the client is just dropped.
    lb.expect_drop(&c(tf::RST), DropReason::NoSession);
    assert_eq!(dst(&lb.run(&c(tf::SYN)).1), vec![10, 1, 0, 11]);
}

#[test]
fn malformed_input_has_named_verdicts() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Nat, proto::TCP, 80, &[(1, 8080, 1)]));
    let mut lb = Lb::new(spec);
    let good = client_packet(&f, proto::TCP, 80).build();
    // Truncated IPv4 header.
    lb.expect_drop(&good[..14 + 12], DropReason::Truncated);
    // Total length longer than the frame.
    let mut long = good.clone();
    long[14 + 3] = 200;
    lb.expect_drop(&long, DropReason::Truncated);
    // IHL below 5.
    let mut ihl = good.clone();
    ihl[14] = 0x44;
    lb.expect_drop(&ihl, DropReason::Malformed);
    // Bad header checksum.
    let mut csum = good.clone();
    csum[14 + 10] ^= 0xff;
    lb.expect_drop(&csum, DropReason::BadChecksum);
    // TCP data offset below 5 (header checksum fixed up so only TCP is wrong).
    let mut off = good.clone();
    off[14 + 20 + 12] = 0x40;
    lb.expect_drop(&off, DropReason::Malformed);
    // TCP header cut short.
    let mut short = good[..14 + 20 + 10].to_vec();
    short[14 + 3] = 30;
    short[14 + 10] = 0;
    short[14 + 11] = 0;
    let c = vectorlb_packet::checksum::checksum(&short[14..34]);
    short[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    lb.expect_drop(&short, DropReason::Truncated);
    // IPv6 payload length lying.
    let f6 = Fam { v6: true };
    let mut v6 = client_packet(&f6, proto::UDP, 53).build();
    v6[14 + 5] = 200;
    lb.expect_drop(&v6, DropReason::Truncated);
    // UDP length lying.
    let mut udp = client_packet(&f, proto::UDP, 53).build();
    udp[14 + 20 + 5] = 99;
    lb.expect_drop(&udp, DropReason::Truncated);
    // Runt frame.
    lb.expect_drop(&[0u8; 5], DropReason::Truncated);
    // A non-SYN segment without a session.
    let ack = Builder::tcp(&f.sock(f.client(), 1), &f.sock(f.vip(), 80), ACK).build();
    lb.expect_drop(&ack, DropReason::NoSession);
    // A bad TCP checksum is not the LB's to judge: forwarded, and still bad at the backend.
    let mut bad = good.clone();
    bad[14 + 20 + 16] ^= 0x5a;
    let (v, out) = lb.run(&bad);
    assert_eq!(v, Verdict::Tx(1));
    let info = vectorlb_packet::parse_frame(&out).unwrap();
    let pseudo = vectorlb_packet::checksum::pseudo_v4(
        out[info.l3 + 12..info.l3 + 16].try_into().unwrap(),
        out[info.l3 + 16..info.l3 + 20].try_into().unwrap(),
        proto::TCP,
        info.l4_len() as u16,
    );
    let sum = vectorlb_packet::checksum::fold(vectorlb_packet::checksum::accumulate(pseudo, &out[info.l4..info.end]));
    assert_ne!(sum, 0xffff, "corruption is preserved, not laundered");
}

#[test]
fn fragments_and_non_ip() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Nat, proto::UDP, 53, &[(1, 53, 1)]));
    let mut lb = Lb::new(spec);
    let mut frag = client_packet(&f, proto::UDP, 53).build();
    frag[14 + 6] = 0x20; // MF
    frag[14 + 10] = 0;
    frag[14 + 11] = 0;
    let c = vectorlb_packet::checksum::checksum(&frag[14..34]);
    frag[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    lb.expect_drop(&frag, DropReason::Fragment);
    let arp = vectorlb_packet::arp::build(1, ROUTER_MAC, ip4("10.0.0.254"), [0; 6], ip4("10.0.0.100"));
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&ROUTER_MAC);
    frame.extend_from_slice(&[0x08, 0x06]);
    frame.extend_from_slice(&arp);
    assert_eq!(lb.run(&frame).0, Verdict::Kernel);
    // Traffic for the host itself (SSH to the port address) goes to the kernel.
    let ssh = Builder::tcp("198.51.100.7:5000", "10.0.0.1:22", SYN).build();
    assert_eq!(lb.run(&ssh).0, Verdict::Kernel);
    // GRE to a VIP is not served.
    let gre = Builder::raw(f.client(), f.vip(), 47).payload(&[0; 8]).build();
    lb.expect_drop(&gre, DropReason::UnsupportedProtocol);
}

fn ip4(s: &str) -> std::net::Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn vlan_tagged_input_is_accepted() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Dr, proto::UDP, 53, &[(1, 0, 1)]));
    spec.ports[1].vlan = Some(20);
    let mut lb = Lb::new(spec);
    let input = client_packet(&f, proto::UDP, 53).vlan(10);
    let expected = client_packet(&f, proto::UDP, 53).ttl(63).vlan(20).macs(INT_MAC, be_mac(1)).build();
    lb.expect_tx(&input.build(), 1, &expected);
}

#[test]
fn toa_is_inserted_in_the_handshake_ack() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        let mut s = service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1)]);
        s.toa = true;
        spec.services.push(s);
        let mut lb = Lb::new(spec);
        let (c, v, be, l) = f.flow();
        lb.run(&Builder::tcp(&c, &v, SYN).seq(1).build());
        lb.run(&Builder::tcp(&be, &l, SYN | ACK).seq(9).ack(2).build());
        let ack = Builder::tcp(&c, &v, ACK).seq(2).ack(10).macs(ROUTER_MAC, EXT_MAC);
        let client_addr: Vec<u8> = match ip(f.client()) {
            std::net::IpAddr::V4(a) => a.octets().to_vec(),
            std::net::IpAddr::V6(a) => a.octets().to_vec(),
        };
        let (opt, len) = vectorlb_packet::tcp::toa_option(&client_addr, 40000);
        let expected = Builder::tcp(&l, &be, ACK)
            .seq(2)
            .ack(10)
            .ttl(63)
            .tcp_options(&opt[..len])
            .macs(INT_MAC, be_mac(1))
            .build();
        lb.expect_tx(&ack.build(), 1, &expected);
        assert_eq!(lb.worker.counters.toa_inserted, 1);
        // Later segments carry no TOA.
        let (_, out) = lb.run(&Builder::tcp(&c, &v, ACK).seq(2).ack(10).build());
        assert_eq!(out.len(), expected.len() - len);
    }
}

#[test]
fn snat_for_backend_initiated_traffic() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        let (net, len, addr, remote) = if v6 {
            ("2001:db8:1::", 64, "2001:db8::200", "2001:db8:99::9")
        } else {
            ("10.1.0.0", 24, "10.0.0.200", "203.0.113.9")
        };
        spec.snat.push(SnatSpec { source: ip(net), prefix_len: len, addrs: vec![ip(addr)], timeouts: Timeouts::default() });
        let mut lb = Lb::new(spec);
        let be = f.backend(1);
        let out = Builder::udp(&f.sock(&be, 5000), &f.sock(remote, 443)).payload(b"hi").macs(be_mac(1), INT_MAC);
        let expected =
            Builder::udp(&f.sock(addr, 1024), &f.sock(remote, 443)).payload(b"hi").ttl(63).macs(EXT_MAC, ROUTER_MAC);
        lb.expect_tx(&out.build(), 0, &expected.build());
        let back = Builder::udp(&f.sock(remote, 443), &f.sock(addr, 1024)).payload(b"yo").macs(ROUTER_MAC, EXT_MAC);
        let expected = Builder::udp(&f.sock(remote, 443), &f.sock(&be, 5000)).payload(b"yo").ttl(63).macs(INT_MAC, be_mac(1));
        lb.expect_tx(&back.build(), 1, &expected.build());
    }
}

#[test]
fn a_flow_created_earlier_in_the_same_batch_is_found() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1), (2, 8080, 1)]));
    let mut lb = Lb::new(spec);
    let c = f.sock(f.client(), 40000);
    let v = f.sock(f.vip(), 80);
    let frames = [Builder::tcp(&c, &v, SYN).build(), Builder::tcp(&c, &v, ACK).payload(b"x").build()];
    let mut bufs: Vec<HeapBuf> = frames.iter().map(|x| HeapBuf::from_frame(x)).collect();
    let mut verdicts = [Verdict::Kernel; 2];
    lb.worker.process(&mut bufs, &mut verdicts, 1);
    assert_eq!(verdicts, [Verdict::Tx(1), Verdict::Tx(1)]);
    assert_eq!(bufs[0].data()[30..34], bufs[1].data()[30..34], "same backend");
    assert_eq!(lb.worker.table.len(), 1);
}

#[test]
fn ipv4_options_are_carried_through() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 5353, 1)]));
    let mut lb = Lb::new(spec);
    // A router-alert option (RFC 2113) makes a 24-byte header: the slow parse path.
    let opts = [0x94, 0x04, 0x00, 0x00];
    let input = Builder::udp(&f.sock(f.client(), 4000), &f.sock(f.vip(), 53)).ip_options(&opts).payload(b"q");
    let expected = Builder::udp(&f.sock(f.laddr(), 1024), &f.sock(&f.backend(1), 5353))
        .ip_options(&opts)
        .payload(b"q")
        .ttl(63)
        .macs(INT_MAC, be_mac(1));
    lb.expect_tx(&input.macs(ROUTER_MAC, EXT_MAC).build(), 1, &expected.build());
}

#[test]
fn any_port_service_keeps_the_port() {
    let f = Fam { v6: true };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Nat, proto::TCP, 0, &[(2, 0, 1)]));
    let mut lb = Lb::new(spec);
    let c = f.sock(f.client(), 40000);
    let be = f.backend(2);
    for port in [22u16, 8443] {
        let syn = Builder::tcp(&c, &f.sock(f.vip(), port), SYN).macs(ROUTER_MAC, EXT_MAC);
        let expected = Builder::tcp(&c, &f.sock(&be, port), SYN).ttl(63).macs(INT_MAC, be_mac(2));
        lb.expect_tx(&syn.build(), 1, &expected.build());
        let reply = Builder::tcp(&f.sock(&be, port), &c, SYN | ACK).macs(be_mac(2), INT_MAC);
        let expected = Builder::tcp(&f.sock(f.vip(), port), &c, SYN | ACK).ttl(63).macs(EXT_MAC, ROUTER_MAC);
        lb.expect_tx(&reply.build(), 0, &expected.build());
    }
}
