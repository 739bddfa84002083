//! Behavioural tests of the pipeline whose expectations are not one fixed frame: TCP state and
//! expiry, a full table, drained and removed backends, client port reuse, lookups within one
//! batch, corruption carried through.
//!
//! The packet-exact fixtures (a frame in, the exact frame out, for every mode, family and
//! protocol, ICMP, TOA, SNAT, VLAN, options, and the named drops of malformed input) are the
//! golden table in `tests/golden/`, whose expected frames scapy makes (`golden.rs`).

mod common;

use common::*;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::*;

fn client_packet(f: &Fam, protocol: u8, vport: u16) -> Builder {
    let (src, dst) = (f.sock(f.client(), 40000), f.sock(f.vip(), vport));
    let b = if protocol == proto::TCP { Builder::tcp(&src, &dst, SYN).seq(1000) } else { Builder::udp(&src, &dst).payload(b"query") };
    b.macs(ROUTER_MAC, EXT_MAC)
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
    let steps: [(bool, u8); 8] = [(true, SYN), (false, SYN | ACK), (true, ACK), (true, ACK | PSH), (false, ACK | PSH), (true, FIN | ACK), (false, FIN | ACK), (true, ACK)];
    let states = ["syn_sent", "syn_recv", "established", "established", "established", "fin_wait", "last_ack", "time_wait"];
    for (k, (inbound, fl)) in steps.iter().enumerate() {
        let pkt = if *inbound { Builder::tcp(&c, &v, *fl).macs(ROUTER_MAC, EXT_MAC) } else { Builder::tcp(&be, &l, *fl).macs(be_mac(1), INT_MAC) };
        let (verdict, _) = lb.run(&pkt.build());
        assert!(matches!(verdict, Verdict::Tx(_)), "step {k}: {verdict:?}");
        let mut st = String::new();
        lb.worker.flows.table.for_each::<[u8; 4]>(0, |_, s| {
            st = vectorlb_lb::session::state::name(s.state).to_string();
            true
        });
        assert_eq!(st, states[k], "step {k}");
        lb.now += 10;
    }
    assert_eq!(lb.worker.flows.table.len(), 1);
    // TIME-WAIT lasts 2 s: still there after 1 s, gone after 2.1 s.
    lb.worker.idle(lb.now + 1_000, 1000);
    assert_eq!(lb.worker.flows.table.len(), 1);
    lb.worker.idle(lb.now + 2_100, 1000);
    assert_eq!(lb.worker.flows.table.len(), 0);
    assert_eq!(lb.worker.flows.table.stats.expired, 1);
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
    assert_eq!(lb.worker.flows.table.len(), 0);
    assert_eq!(lb.worker.flows.table.stats.removed, 1);
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
    assert_eq!(lb.worker.flows.table.len(), 4);
    assert_eq!(lb.worker.flows.counters.dropped(DropReason::TableFull), 1);
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
    let before = lb.worker.flows.table.len();
    assert_eq!(dst(&lb.run(&pkt(1000)).1), vec![10, 1, 0, 12]);
    assert_eq!(lb.worker.flows.table.len(), before, "the old session went, a new one came");
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
    assert_eq!(lb.worker.flows.counters.events.tcp_resets_sent, 1);
    // The session is gone: a RST from the client is just dropped.
    lb.expect_drop(&c(tf::RST), DropReason::NoSession);
    assert_eq!(dst(&lb.run(&c(tf::SYN)).1), vec![10, 1, 0, 11]);
}

/// A bad TCP checksum is not the LB's to judge: the segment is forwarded, and is still bad at
/// the backend (the incremental update carries the error along instead of laundering it).
#[test]
fn bad_tcp_checksum_is_forwarded_not_laundered() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Nat, proto::TCP, 80, &[(1, 8080, 1)]));
    let mut lb = Lb::new(spec);
    let good = client_packet(&f, proto::TCP, 80).build();
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
    assert_eq!(lb.worker.flows.table.len(), 1);
}

#[test]
fn a_service_without_a_usable_backend_refuses_new_tcp_connections_and_udp_datagrams() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 0), (2, 8080, 0)]));
    spec.services.push(service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 53, 0)]));
    let mut lb = Lb::new(spec);
    let (c, v, _, _) = f.flow();
    let (verdict, out) = lb.run(&Builder::tcp(&c, &v, SYN).seq(77).macs(ROUTER_MAC, EXT_MAC).build());
    assert_eq!(verdict, Verdict::Tx(0), "the reset goes back to the client");
    let info = vectorlb_packet::parse_frame(&out).unwrap();
    let t = &out[info.l4..];
    assert_eq!(t[13], RST | ACK, "RST+ACK to a SYN");
    assert_eq!(u32::from_be_bytes(t[8..12].try_into().unwrap()), 78, "acknowledges the SYN");
    assert_eq!((lb.worker.flows.counters.events.tcp_resets_sent, lb.worker.flows.table.len()), (1, 0), "counted, no session");
    // UDP: an ICMP port unreachable from the VIP, quoting the datagram (the client's
    // connected socket sees ECONNREFUSED), counted; no session.
    let q = Builder::udp(&f.sock(f.client(), 4000), &f.sock(f.vip(), 53)).macs(ROUTER_MAC, EXT_MAC).payload(b"q").build();
    let drops = lb.worker.flows.counters.dropped(DropReason::NoBackend);
    let (verdict, out) = lb.run(&q);
    assert_eq!(verdict, Verdict::Tx(0), "the error goes back to the client");
    let (l3, l4) = (14, 34);
    assert_eq!(out[l3 + 9], vectorlb_packet::proto::ICMP);
    assert_eq!(&out[l3 + 12..l3 + 16], &q[l3 + 16..l3 + 20], "from the VIP");
    assert_eq!(&out[l3 + 16..l3 + 20], &q[l3 + 12..l3 + 16], "to the client");
    assert_eq!((out[l4], out[l4 + 1]), (3, 3), "destination unreachable, port unreachable");
    assert_eq!(&out[l4 + 8..l4 + 8 + q.len() - 14], &q[14..], "quotes the datagram");
    assert_eq!(vectorlb_packet::checksum::checksum(&out[l4..]), 0, "ICMP checksum");
    assert_eq!(lb.worker.flows.counters.events.icmp_errors_sent, 1);
    assert_eq!(lb.worker.flows.counters.dropped(DropReason::NoBackend), drops + 1, "the datagram counts as dropped");
    assert_eq!(lb.worker.flows.table.len(), 0);
}

#[test]
fn impossible_tcp_flags_open_no_session_and_are_counted() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        for mode in [Mode::Nat, Mode::Fnat] {
            let mut spec = topology();
            spec.services.push(service(&f, mode, proto::TCP, 80, &[(1, 8080, 1)]));
            let mut lb = Lb::new(spec);
            let (c, v, _, _) = f.flow();
            let bad = [SYN | FIN, SYN | RST, SYN | FIN | ACK, FIN, 0, FIN | SYN | RST | PSH | ACK | URG, FIN | PSH | URG, RST | FIN];
            for fl in bad {
                lb.expect_drop(&Builder::tcp(&c, &v, fl).macs(ROUTER_MAC, EXT_MAC).build(), DropReason::InvalidTcpFlags);
            }
            assert_eq!(lb.worker.flows.table.len(), 0, "{mode:?} v6={v6}: no session from impossible flags");
            assert_eq!(lb.worker.flows.counters.drops[DropReason::InvalidTcpFlags as usize], bad.len() as u64);
            // The same client then connects normally, and a segment of its session with
            // impossible flags is dropped without harming the session.
            let (verdict, _) = lb.run(&Builder::tcp(&c, &v, SYN).macs(ROUTER_MAC, EXT_MAC).build());
            assert!(matches!(verdict, Verdict::Tx(_)), "{verdict:?}");
            lb.expect_drop(&Builder::tcp(&c, &v, SYN | FIN).macs(ROUTER_MAC, EXT_MAC).build(), DropReason::InvalidTcpFlags);
            let (verdict, _) = lb.run(&Builder::tcp(&c, &v, ACK | PSH).macs(ROUTER_MAC, EXT_MAC).build());
            assert!(matches!(verdict, Verdict::Tx(_)), "{verdict:?}");
            assert_eq!(lb.worker.flows.table.len(), 1);
        }
    }
}

#[test]
fn the_valid_flag_table_is_conntracks() {
    let valid = [
        SYN,
        SYN | URG,
        SYN | ACK,
        RST,
        RST | ACK,
        RST | ACK | PSH,
        ACK,
        ACK | URG,
        ACK | PSH,
        ACK | PSH | URG,
        FIN | ACK,
        FIN | ACK | URG,
        FIN | ACK | PSH,
        FIN | ACK | PSH | URG,
    ];
    for f in 0u8..=0x3f {
        assert_eq!(vectorlb_lb::pipeline::tcp_flags_valid(f), valid.contains(&f), "flags {f:#04x}");
        // ECE and CWR do not change the verdict.
        assert_eq!(vectorlb_lb::pipeline::tcp_flags_valid(f | 0xc0), valid.contains(&f));
    }
}

#[test]
fn a_full_table_makes_room_from_closed_sessions_oldest_first_and_then_refuses() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1)]));
        // 20 sessions (a full-NAT one takes two index entries of the 40).
        let mut lb = Lb::with_capacity(spec, 20);
        let v = f.sock(f.vip(), 80);
        let l4 = if v6 { 14 + 40 } else { 14 + 20 };
        let from = |p: u16, fl: u8| Builder::tcp(&f.sock(f.client(), p), &v, fl).macs(ROUTER_MAC, EXT_MAC).build();
        let open = |lb: &mut Lb, p: u16| -> Option<u16> {
            let (verdict, syn) = lb.run(&from(p, SYN));
            if verdict != Verdict::Tx(1) {
                assert_eq!(verdict, Verdict::Drop(DropReason::TableFull), "SYN {p}");
                return None;
            }
            let lport = u16::from_be_bytes([syn[l4], syn[l4 + 1]]);
            let back = Builder::tcp(&f.sock(&f.backend(1), 8080), &f.sock(f.laddr(), lport), SYN | ACK).macs(be_mac(1), INT_MAC).build();
            assert_eq!(lb.run(&back).0, Verdict::Tx(0));
            assert_eq!(lb.run(&from(p, ACK)).0, Verdict::Tx(1));
            Some(lport)
        };
        // Ten connections open and close (both FINs and the last ACK: TIME_WAIT, 2 s), one
        // a millisecond apart.
        let lports: Vec<(u16, u16)> = (0..10u16).map(|p| (30000 + p, open(&mut lb, 30000 + p).expect("room"))).collect();
        for (p, lport) in lports {
            let back = |fl: u8| Builder::tcp(&f.sock(&f.backend(1), 8080), &f.sock(f.laddr(), lport), fl).macs(be_mac(1), INT_MAC).build();
            assert_eq!(lb.run(&from(p, FIN | ACK)).0, Verdict::Tx(1));
            assert_eq!(lb.run(&back(FIN | ACK)).0, Verdict::Tx(0));
            assert_eq!(lb.run(&from(p, ACK)).0, Verdict::Tx(1));
            lb.now += 1;
        }
        assert_eq!(lb.worker.flows.table.len(), 10);
        // Ten established ones fill the table.
        for p in 0..10u16 {
            assert!(open(&mut lb, 31000 + p).is_some(), "connection {p} while the table has room");
        }
        assert_eq!(lb.worker.flows.table.len(), 20);
        // Each new connection takes the place of the oldest closed session...
        for p in 0..10u16 {
            assert!(open(&mut lb, 32000 + p).is_some(), "connection {p} into a full table with closed sessions");
            assert_eq!(lb.worker.flows.counters.events.closed_evicted, p as u64 + 1);
            assert_eq!(lb.worker.flows.table.len(), 20);
        }
        // ...and once none is left, a new connection is refused and counted; the established
        // ones keep forwarding.
        let full = lb.worker.flows.counters.dropped(DropReason::TableFull);
        assert!(open(&mut lb, 33000).is_none());
        assert_eq!(lb.worker.flows.counters.dropped(DropReason::TableFull), full + 1);
        for p in (0..10u16).map(|p| 31000 + p).chain((0..10u16).map(|p| 32000 + p)) {
            assert_eq!(lb.run(&from(p, ACK | PSH)).0, Verdict::Tx(1), "established flow {p} still forwarded");
        }
    }
}

#[test]
fn the_half_open_budget_bounds_a_syn_flood_and_never_touches_established_sessions() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        spec.services.push(service(&f, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1)]));
        // 200 sessions: a budget of 50 half-open ones (the default quarter).
        let mut lb = Lb::with_capacity(spec, 200);
        let v = f.sock(f.vip(), 80);
        let from = |p: u16, fl: u8| Builder::tcp(&f.sock(f.client(), p), &v, fl).macs(ROUTER_MAC, EXT_MAC).build();
        // Ten connections complete their handshakes.
        for p in 0..10u16 {
            let (_, syn) = lb.run(&from(30000 + p, SYN));
            let l4 = if v6 { 14 + 40 } else { 14 + 20 };
            let lport = u16::from_be_bytes([syn[l4], syn[l4 + 1]]);
            let back = Builder::tcp(&f.sock(&f.backend(1), 8080), &f.sock(f.laddr(), lport), SYN | ACK).macs(be_mac(1), INT_MAC).build();
            assert_eq!(lb.run(&back).0, Verdict::Tx(0));
            assert_eq!(lb.run(&from(30000 + p, ACK)).0, Verdict::Tx(1));
        }
        assert_eq!(lb.worker.flows.table.half_open(), 0);
        // A flood of 1,000 SYNs from other ports: the half-open sessions never pass the budget,
        // each new SYN still gets through (an older half-open session makes room).
        for p in 0..1000u16 {
            assert_eq!(lb.run(&from(40000 + p, SYN)).0, Verdict::Tx(1), "SYN {p}");
            assert!(lb.worker.flows.table.half_open() <= 50);
            lb.now += 1;
        }
        assert_eq!(lb.worker.flows.table.half_open(), 50);
        assert_eq!(lb.worker.flows.counters.events.half_open_evicted, 950);
        assert_eq!(lb.worker.flows.table.len(), 60, "the ten established sessions stay");
        for p in 0..10u16 {
            assert_eq!(lb.run(&from(30000 + p, ACK | PSH)).0, Verdict::Tx(1), "established flow {p} still forwarded");
        }
        // Under pressure the handshake timeout shrinks from 30 s to the 1 s floor: the flood's
        // sessions are gone 1 s after it stops, the established ones are not.
        lb.worker.idle(lb.now + 1_001, 10_000);
        assert_eq!((lb.worker.flows.table.half_open(), lb.worker.flows.table.len()), (0, 10));
    }
}

/// Hairpin: a NAT service's backend connecting to the service itself and picked as its own
/// backend (a pod through its own Service). The forward packet's source becomes the VIP (the
/// client's port kept), since the backend's kernel would take a packet from its own address
/// for a stranger's; its reply, to the VIP, finds the session and goes back as the VIP's.
#[test]
fn a_nat_backend_reaches_itself_through_its_service() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut spec = topology();
        spec.services.push(service(&f, Mode::Nat, proto::TCP, 80, &[(1, 8080, 1)]));
        spec.services.push(service(&f, Mode::Nat, proto::UDP, 53, &[(1, 5353, 1)]));
        let mut lb = Lb::new(spec);
        let me = f.backend(1);
        for (udp, vport, bport) in [(false, 80, 8080), (true, 53, 5353)] {
            let (from, to) = (f.sock(&me, 40000), f.sock(f.vip(), vport));
            let out = if udp { Builder::udp(&from, &to).payload(b"q") } else { Builder::tcp(&from, &to, SYN).seq(7) };
            let (v, fwd) = lb.run(&out.macs(be_mac(1), INT_MAC).build());
            assert_eq!(v, Verdict::Tx(1), "v6 {v6} udp {udp}: to the backend");
            let i = vectorlb_packet::parse_frame(&fwd).unwrap();
            let (n, src_at, dst_at) = if v6 { (16, 8, 24) } else { (4, 12, 16) };
            let vip: std::net::IpAddr = f.vip().parse().unwrap();
            let me_ip: std::net::IpAddr = me.parse().unwrap();
            let bytes = |a: std::net::IpAddr| match a {
                std::net::IpAddr::V4(a) => a.octets().to_vec(),
                std::net::IpAddr::V6(a) => a.octets().to_vec(),
            };
            assert_eq!(fwd[i.l3 + src_at..i.l3 + src_at + n], bytes(vip)[..], "v6 {v6} udp {udp}: from the VIP");
            assert_eq!(fwd[i.l3 + dst_at..i.l3 + dst_at + n], bytes(me_ip)[..], "to the backend, itself");
            assert_eq!(u16::from_be_bytes([fwd[i.l4], fwd[i.l4 + 1]]), 40000, "the client's port kept");
            assert_eq!(u16::from_be_bytes([fwd[i.l4 + 2], fwd[i.l4 + 3]]), bport);
            // The reply, to the VIP and the client's port.
            let (rf, rt) = (f.sock(&me, bport), f.sock(f.vip(), 40000));
            let back = if udp { Builder::udp(&rf, &rt).payload(b"a") } else { Builder::tcp(&rf, &rt, SYN | ACK).seq(100).ack(8) };
            let (v, rep) = lb.run(&back.macs(be_mac(1), INT_MAC).build());
            assert_eq!(v, Verdict::Tx(1), "v6 {v6} udp {udp}: the reply goes back to the client");
            let i = vectorlb_packet::parse_frame(&rep).unwrap();
            assert_eq!(rep[i.l3 + src_at..i.l3 + src_at + n], bytes(vip)[..], "the reply comes from the VIP");
            assert_eq!(rep[i.l3 + dst_at..i.l3 + dst_at + n], bytes(me_ip)[..]);
            assert_eq!(u16::from_be_bytes([rep[i.l4], rep[i.l4 + 1]]), vport, "from the service's port");
            assert_eq!(u16::from_be_bytes([rep[i.l4 + 2], rep[i.l4 + 3]]), 40000, "to the client's port");
        }
    }
}

/// A NAT service with local addresses masquerades the clients outside `keep_source` (a node's
/// own processes reaching a cluster IP: their replies would otherwise bypass this node) and
/// keeps the address of those inside (the pods): the masqueraded flow leaves from a local
/// port, its reply to that port goes back as the VIP's, and its later packets take the fast
/// path with the same result; the kept flow is as plain NAT's.
#[test]
fn a_nat_service_masquerades_clients_outside_the_kept_networks() {
    for v6 in [false, true] {
        for udp in [false, true] {
            let f = Fam { v6 };
            let mut spec = topology();
            let mut s = service(&f, Mode::Nat, if udp { proto::UDP } else { proto::TCP }, 80, &[(1, 8080, 1)]);
            s.local_addrs = vec![ip(f.laddr())];
            s.keep_source = vec![if v6 { (ip("2001:db8:ff::"), 48) } else { (ip("198.51.100.0"), 24) }];
            spec.services.push(s);
            let mut lb = Lb::new(spec);
            let (n, src_at, dst_at) = if v6 { (16, 8, 24) } else { (4, 12, 16) };
            let bytes = |a: &str| match ip(a) {
                std::net::IpAddr::V4(a) => a.octets().to_vec(),
                std::net::IpAddr::V6(a) => a.octets().to_vec(),
            };
            let pkt = |from: &str, to: &str, fl: u8| if udp { Builder::udp(from, to).payload(b"q") } else { Builder::tcp(from, to, fl).seq(7) };
            let outsider = if v6 { "2001:db8:ee::9" } else { "192.0.2.9" };
            let what = format!("v6 {v6} udp {udp}");
            // The outsider's first packet: from a local address and port.
            let (v, fwd) = lb.run(&pkt(&f.sock(outsider, 41000), &f.sock(f.vip(), 80), SYN).macs(ROUTER_MAC, EXT_MAC).build());
            assert!(matches!(v, Verdict::Tx(_)), "{what}: {v:?}");
            let i = vectorlb_packet::parse_frame(&fwd).unwrap();
            assert_eq!(fwd[i.l3 + src_at..i.l3 + src_at + n], bytes(f.laddr())[..], "{what}: masqueraded to the local address");
            assert_eq!(fwd[i.l3 + dst_at..i.l3 + dst_at + n], bytes(&f.backend(1))[..]);
            let lport = u16::from_be_bytes([fwd[i.l4], fwd[i.l4 + 1]]);
            // The backend's reply to that port goes back to the outsider from the VIP.
            let (v, rep) = lb.run(&pkt(&f.sock(&f.backend(1), 8080), &f.sock(f.laddr(), lport), SYN | ACK).macs(be_mac(1), INT_MAC).build());
            assert!(matches!(v, Verdict::Tx(_)), "{what}: the reply: {v:?}");
            let i = vectorlb_packet::parse_frame(&rep).unwrap();
            assert_eq!(rep[i.l3 + src_at..i.l3 + src_at + n], bytes(f.vip())[..], "{what}: the reply comes from the VIP");
            assert_eq!(rep[i.l3 + dst_at..i.l3 + dst_at + n], bytes(outsider)[..]);
            assert_eq!(u16::from_be_bytes([rep[i.l4], rep[i.l4 + 1]]), 80);
            assert_eq!(u16::from_be_bytes([rep[i.l4 + 2], rep[i.l4 + 3]]), 41000);
            // Its next packets (established: the fast path) keep the same local port.
            let fast_before = lb.worker.flows.counters.events.fast_path;
            for fl in [ACK, ACK | PSH] {
                let (v, fwd) = lb.run(&pkt(&f.sock(outsider, 41000), &f.sock(f.vip(), 80), fl).macs(ROUTER_MAC, EXT_MAC).build());
                assert!(matches!(v, Verdict::Tx(_)), "{what}: {v:?}");
                let i = vectorlb_packet::parse_frame(&fwd).unwrap();
                assert_eq!(fwd[i.l3 + src_at..i.l3 + src_at + n], bytes(f.laddr())[..]);
                assert_eq!(u16::from_be_bytes([fwd[i.l4], fwd[i.l4 + 1]]), lport, "{what}: the same local port");
            }
            assert!(lb.worker.flows.counters.events.fast_path > fast_before, "{what}: the established packets took the fast path");
            // A client inside the kept networks keeps its address and port.
            let (v, fwd) = lb.run(&pkt(&f.sock(f.client(), 40000), &f.sock(f.vip(), 80), SYN).macs(ROUTER_MAC, EXT_MAC).build());
            assert!(matches!(v, Verdict::Tx(_)), "{what}: {v:?}");
            let i = vectorlb_packet::parse_frame(&fwd).unwrap();
            assert_eq!(fwd[i.l3 + src_at..i.l3 + src_at + n], bytes(f.client())[..], "{what}: a kept client's address");
            assert_eq!(u16::from_be_bytes([fwd[i.l4], fwd[i.l4 + 1]]), 40000);
            let (v, rep) = lb.run(&pkt(&f.sock(&f.backend(1), 8080), &f.sock(f.client(), 40000), SYN | ACK).macs(be_mac(1), INT_MAC).build());
            assert!(matches!(v, Verdict::Tx(_)), "{what}: the kept client's reply: {v:?}");
            let i = vectorlb_packet::parse_frame(&rep).unwrap();
            assert_eq!(rep[i.l3 + src_at..i.l3 + src_at + n], bytes(f.vip())[..]);
        }
    }
}

/// Local addresses and `keep_source` are checked: nat without local addresses takes no
/// `keep_source`, a prefix of the other family is refused, dr takes no local addresses.
#[test]
fn keep_source_is_checked() {
    let f = Fam { v6: false };
    let bad = |edit: &dyn Fn(&mut ServiceSpec)| {
        let mut spec = topology();
        let mut s = service(&f, Mode::Nat, proto::TCP, 80, &[(1, 8080, 1)]);
        edit(&mut s);
        spec.services.push(s);
        Control::new(&spec).err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(bad(&|s| s.keep_source = vec![(ip("10.244.0.0"), 16)]).contains("keep_source: only nat services with local addresses"));
    assert!(bad(&|s| {
        s.local_addrs = vec![ip(f.laddr())];
        s.keep_source = vec![(ip("fd00::"), 8)];
    })
    .contains("not of the VIP's family"));
    assert!(bad(&|s| {
        s.mode = Mode::Dr;
        s.backends[0].port = 0;
        s.local_addrs = vec![ip(f.laddr())];
    })
    .contains("only fnat and nat services"));
    assert_eq!(
        bad(&|s| {
            s.local_addrs = vec![ip(f.laddr())];
            s.keep_source = vec![(ip("10.244.0.0"), 16)];
        }),
        ""
    );
}

/// A VIP's port no service has is dropped, unless the address is also the host's
/// (`host_addrs`: a node's address with NodePorts), whose sockets may listen there.
#[test]
fn an_unserved_port_of_a_vip_that_is_the_hosts_goes_to_the_host() {
    for host in [false, true] {
        let f = Fam { v6: false };
        let mut spec = topology();
        spec.services.push(service(&f, Mode::Nat, proto::TCP, 80, &[(1, 8080, 1)]));
        if host {
            spec.host_addrs.push(ip(f.vip()));
        }
        let mut lb = Lb::new(spec);
        let (v, _) = lb.run(&client_packet(&f, proto::TCP, 81).build());
        assert_eq!(v, if host { Verdict::Kernel } else { Verdict::Drop(DropReason::NoSession) }, "host {host}");
        let (v, _) = lb.run(&client_packet(&f, proto::TCP, 80).build());
        assert_eq!(v, Verdict::Tx(1), "the served port is the service's either way");
    }
}

/// A backend may be a VIP's address on a port no service of it has (a hostNetwork endpoint on
/// a node's address that has NodePorts), not on one that has (it would forward to itself).
#[test]
fn a_backend_on_a_vips_other_port_is_accepted_and_on_a_served_one_refused() {
    let f = Fam { v6: false };
    let build = |bport: u16| {
        let mut spec = topology();
        spec.services.push(service(&f, Mode::Nat, proto::TCP, 80, &[(1, 8080, 1)]));
        let mut other = service(&f, Mode::Nat, proto::TCP, 30080, &[]);
        other.backends = vec![BackendSpec { addr: ip(f.vip()), port: bport, weight: 1, quic_id: None }];
        spec.services.push(other);
        Control::new(&spec).err().map(|e| e.to_string())
    };
    assert_eq!(build(8083), None);
    assert!(build(80).is_some_and(|e| e.contains("a VIP with a service on that port")));
}

/// An SNAT rule with `except` and `outbound_only` (the pods' masquerade of what leaves the
/// cluster): what the inside opens toward the outside is translated; toward an excepted
/// network it keeps its address; a TCP segment of a connection the outside opened, and the
/// reply to a UDP flow from the outside, pass as they are. Without `outbound_only` the
/// segment is dropped and the UDP reply translated, as before.
#[test]
fn an_outbound_only_snat_rule_translates_what_the_inside_opens_and_nothing_else() {
    for outbound_only in [true, false] {
        let f = Fam { v6: false };
        let mut spec = topology();
        spec.snat.push(SnatSpec {
            source: ip("10.1.0.0"),
            prefix_len: 24,
            addrs: vec![ip("10.0.0.200")],
            timeouts: Timeouts::default(),
            except: vec![(ip("10.2.0.0"), 16)],
            outbound_only,
        });
        let mut lb = Lb::new(spec);
        let src_of = |frame: &[u8]| {
            let i = vectorlb_packet::parse_frame(frame).unwrap();
            std::net::Ipv4Addr::new(frame[i.l3 + 12], frame[i.l3 + 13], frame[i.l3 + 14], frame[i.l3 + 15]).to_string()
        };
        let inside = f.backend(1);
        // Opened by the inside, to the outside: translated.
        let (v, out) = lb.run(&Builder::udp(&f.sock(&inside, 5000), "198.51.100.7:53").payload(b"q").macs(be_mac(1), INT_MAC).build());
        assert!(matches!(v, Verdict::Tx(_)), "{outbound_only}: {v:?}");
        assert_eq!(src_of(&out), "10.0.0.200");
        // To an excepted network: as it is.
        let (v, _) = lb.run(&Builder::udp(&f.sock(&inside, 5001), "10.2.0.5:53").payload(b"q").macs(be_mac(1), INT_MAC).build());
        assert_eq!(v, Verdict::Kernel, "{outbound_only}: the cluster's own network keeps the source");
        // A SYN-ACK of a connection the outside opened.
        let (v, _) = lb.run(&Builder::tcp(&f.sock(&inside, 8080), "198.51.100.9:40000", SYN | ACK).seq(1).ack(2).macs(be_mac(1), INT_MAC).build());
        assert_eq!(v, if outbound_only { Verdict::Kernel } else { Verdict::Drop(DropReason::NoSession) }, "{outbound_only}");
        // A UDP flow from the outside, then the inside's reply.
        let (v, _) = lb.run(&Builder::udp("198.51.100.9:7000", &f.sock(&f.backend(2), 6000)).payload(b"hi").macs(ROUTER_MAC, EXT_MAC).build());
        assert_eq!(v, Verdict::Kernel, "{outbound_only}: the datagram goes on as it is");
        let (v, out) = lb.run(&Builder::udp(&f.sock(&f.backend(2), 6000), "198.51.100.9:7000").payload(b"re").macs(be_mac(2), INT_MAC).build());
        if outbound_only {
            assert_eq!(v, Verdict::Kernel, "the reply keeps the inside's address");
        } else {
            assert!(matches!(v, Verdict::Tx(_)) && src_of(&out) == "10.0.0.200", "translated as a flow the inside opened: {v:?}");
        }
    }
}
