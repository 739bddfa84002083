//! Scale-out in the core: every node picks a flow's backend from the configuration alone
//! (cluster key, consistent hash), and a mid-flow segment that finds no session (its flow was
//! served by another node, or by this one before a restart) continues on that backend, within
//! a budget that a flood of such segments cannot break out of.

mod common;

use common::*;
use vectorlb_lb::session::state;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::*;
use vectorlb_sched::Algorithm;

/// A node: its own random session-table key (as every daemon draws one), the shared
/// configuration.
fn node(spec: &LbSpec, max: u32, seed: u64) -> Lb {
    let control = Control::new(spec).expect("valid spec");
    let mut cfg = WorkerConfig::new(max);
    cfg.table.index_entries = max * 2;
    cfg.table.seed = seed;
    Lb { worker: Worker::new(control.clone(), cfg).unwrap(), control, now: 1 }
}

fn spec_with(f: &Fam, mode: Mode, scheduler: Algorithm, continuation: bool) -> LbSpec {
    let mut spec = topology();
    let port = if matches!(mode, Mode::Nat | Mode::Fnat) { 8080 } else { 0 };
    let mut s = service(f, mode, proto::TCP, 80, &[(1, port, 1), (2, port, 1), (3, port, 1)]);
    s.scheduler = scheduler;
    s.continuation = continuation;
    spec.services.push(s);
    spec
}

fn from_client(f: &Fam, cport: u16, flags: u8) -> Vec<u8> {
    Builder::tcp(&f.sock(f.client(), cport), &f.sock(f.vip(), 80), flags).macs(ROUTER_MAC, EXT_MAC).build()
}

/// The backend (1..=3) a forwarded frame went to, from its destination MAC.
fn backend_of(out: &[u8]) -> u8 {
    (1..=3u8).find(|&i| out[..6] == be_mac(i)).unwrap_or_else(|| panic!("not to a backend: {}", hex(&out[..14])))
}

fn states(lb: &Lb, v6: bool) -> Vec<&'static str> {
    let mut st = Vec::new();
    if v6 {
        lb.worker.flows.table.for_each::<[u8; 16]>(0, |_, s| {
            st.push(state::name(s.state));
            true
        });
    } else {
        lb.worker.flows.table.for_each::<[u8; 4]>(0, |_, s| {
            st.push(state::name(s.state));
            true
        });
    }
    st
}

#[test]
fn a_mid_flow_segment_without_a_session_goes_where_the_syn_went() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        for mode in [Mode::Dr, Mode::Tun, Mode::Nat] {
            let spec = spec_with(&f, mode, Algorithm::parse("maglev").unwrap(), true);
            let (mut a, mut b) = (node(&spec, 10_000, 1), node(&spec, 10_000, 0xdead_beef));
            for cport in 40_000..40_050u16 {
                let (v, out) = a.run(&from_client(&f, cport, SYN));
                assert!(matches!(v, Verdict::Tx(1)), "{mode:?} v6 {v6}: {v:?}");
                let first = backend_of(&out);
                // The flow moves to node b mid-connection (an ECMP change, a node lost).
                let (v, out) = b.run(&from_client(&f, cport, ACK | PSH));
                assert!(matches!(v, Verdict::Tx(1)), "{mode:?} v6 {v6}: {v:?}");
                assert_eq!(backend_of(&out), first, "{mode:?} v6 {v6} port {cport}");
            }
            let ev = b.worker.flows.counters.events;
            assert_eq!((ev.continued, b.worker.flows.table.continued()), (50, 50), "{mode:?} v6 {v6}");
            assert!(states(&b, v6).iter().all(|s| *s == "continued"));
            // NAT: confirmed by the backend's reply. DR and TUN: the client's second segment
            // gives the established timeout but the session stays continued.
            for cport in 40_000..40_050u16 {
                if mode == Mode::Nat {
                    let be = f.backend(1);
                    let reply = |i: u8| Builder::tcp(&f.sock(&f.backend(i), 8080), &f.sock(f.client(), cport), ACK).macs(be_mac(i), INT_MAC).build();
                    // Whichever backend holds it answers; the others' replies match no session.
                    let mut sent = 0;
                    for i in 1..=3u8 {
                        if let (Verdict::Tx(0), _) = b.run(&reply(i)) {
                            sent += 1;
                        }
                    }
                    assert_eq!(sent, 1, "one backend holds the flow ({be})");
                } else {
                    assert!(matches!(b.run(&from_client(&f, cport, ACK)).0, Verdict::Tx(1)));
                }
            }
            if mode == Mode::Nat {
                assert_eq!(b.worker.flows.table.continued(), 0, "{mode:?} v6 {v6}: all confirmed");
                assert!(states(&b, v6).iter().all(|s| *s == "established"), "{mode:?}: {:?}", states(&b, v6));
            } else {
                // One way, nothing confirms: the sessions stay in the continuation budget.
                assert_eq!(b.worker.flows.table.continued(), 50, "{mode:?} v6 {v6}");
                assert!(states(&b, v6).iter().all(|s| *s == "continued"), "{mode:?}: {:?}", states(&b, v6));
            }
            // Without continuation the same segment is dropped, as before.
            let spec = spec_with(&f, mode, Algorithm::parse("maglev").unwrap(), false);
            let mut c = node(&spec, 10_000, 7);
            c.expect_drop(&from_client(&f, 40_000, ACK), DropReason::NoSession);
            // A reset without a session opens nothing, with continuation or not.
            b.expect_drop(&from_client(&f, 41_000, RST | ACK), DropReason::NoSession);
        }
    }
}

#[test]
fn a_segment_that_closes_keeps_its_session_within_the_budget() {
    let f = Fam { v6: false };
    let spec = spec_with(&f, Mode::Dr, Algorithm::parse("maglev").unwrap(), true);
    let mut b = node(&spec, 10_000, 3);
    assert!(matches!(b.run(&from_client(&f, 40_000, FIN | ACK)).0, Verdict::Tx(1)));
    assert_eq!(states(&b, false), ["continued"]);
    assert_eq!(b.worker.flows.table.continued(), 1);
    // A new SYN on the tuple starts over as an ordinary connection.
    assert!(matches!(b.run(&from_client(&f, 40_000, SYN)).0, Verdict::Tx(1)));
    assert_eq!(states(&b, false), ["syn_sent"]);
    assert_eq!((b.worker.flows.table.continued(), b.worker.flows.table.half_open()), (0, 1));
}

#[test]
fn an_ack_flood_churns_only_the_continuation_budget() {
    // Each spoofed ACK once, and each sent twice (the second copy is what a client's second
    // segment looks like in the one-way modes): neither leaves the budget.
    for (mode, copies) in [(Mode::Dr, 1), (Mode::Dr, 2), (Mode::Tun, 2), (Mode::Nat, 2)] {
        let f = Fam { v6: false };
        let spec = spec_with(&f, mode, Algorithm::parse("maglev").unwrap(), true);
        // 20,000 sessions, a tenth of them (2,000) for continued sessions.
        let mut lb = node(&spec, 20_000, 11);
        // 500 established connections first (SYN, then the client's ACK; NAT: and the
        // backend's SYN-ACK between them).
        let mut want = Vec::new();
        for cport in 1_000..1_500u16 {
            let (_, out) = lb.run(&from_client(&f, cport, SYN));
            let be = backend_of(&out);
            if mode == Mode::Nat {
                let synack = Builder::tcp(&f.sock(&f.backend(be), 8080), &f.sock(f.client(), cport), SYN | ACK).macs(be_mac(be), INT_MAC).build();
                assert!(matches!(lb.run(&synack).0, Verdict::Tx(0)));
            }
            want.push((cport, be));
            lb.run(&from_client(&f, cport, ACK));
        }
        assert_eq!(states(&lb, false).iter().filter(|s| **s == "established").count(), 500, "{mode:?}");
        // 200,000 spoofed ACKs from random sources and ports.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 / copies {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let src = format!("203.{}.{}.{}:{}", (x >> 8) as u8, (x >> 16) as u8, (x >> 24) as u8, 1024 + (x >> 32) as u16 % 60_000);
            let pkt = Builder::tcp(&src, &f.sock(f.vip(), 80), ACK).macs(ROUTER_MAC, EXT_MAC).build();
            for _ in 0..copies {
                assert!(matches!(lb.run(&pkt).0, Verdict::Tx(1)), "{mode:?}: every spoofed ACK still goes to its hash's backend");
            }
            lb.now += 1;
        }
        let t = &lb.worker.flows.table;
        assert!(t.continued() <= 2_000, "{mode:?} x{copies}: bounded: {}", t.continued());
        assert!(t.len() <= 2_500, "{mode:?} x{copies}: the table holds the budget and the real connections: {}", t.len());
        let ev = lb.worker.flows.counters.events;
        assert!(ev.continued_evicted >= 200_000 / copies - 2_000, "{mode:?} x{copies}: {}", ev.continued_evicted);
        assert_eq!(lb.worker.flows.counters.drops[DropReason::ContinuationLimit as usize], 0, "{mode:?} x{copies}");
        // The established connections are all there and go on to their backends.
        for &(cport, be) in &want {
            let (v, out) = lb.run(&from_client(&f, cport, ACK | PSH));
            assert!(matches!(v, Verdict::Tx(1)));
            assert_eq!(backend_of(&out), be);
        }
        assert_eq!(states(&lb, false).iter().filter(|s| **s == "established").count(), 500, "{mode:?} x{copies}");
        // A new connection opens as usual.
        assert!(matches!(lb.run(&from_client(&f, 2_000, SYN)).0, Verdict::Tx(1)));
        assert_eq!(lb.worker.flows.table.half_open(), 1);
    }
}

#[test]
fn nodes_from_one_configuration_agree_on_every_flow() {
    // 100,000 random flows through two nodes with their own random session keys: the same
    // backend for each, for every scheduler that can agree, with and without a cluster key;
    // another cluster key spreads them otherwise.
    for v6 in [false, true] {
        let f = Fam { v6 };
        for sched in ["maglev", "sh"] {
            let picks = |key: u64, seed: u64| {
                let mut spec = spec_with(&f, Mode::Dr, Algorithm::parse(sched).unwrap(), true);
                spec.cluster_key = key;
                let mut lb = node(&spec, 200_000, seed);
                let mut x = 0x2545_f491_4f6c_dd1du64;
                (0..100_000)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let src = if v6 {
                            format!("[2001:db8:ff::{:x}:{:x}]:{}", (x >> 8) as u16, (x >> 24) as u16, 1024 + (x >> 40) as u16 % 60_000)
                        } else {
                            format!("198.{}.{}.{}:{}", (x >> 8) as u8, (x >> 16) as u8, (x >> 24) as u8, 1024 + (x >> 40) as u16 % 60_000)
                        };
                        let pkt = Builder::tcp(&src, &f.sock(f.vip(), 80), SYN).macs(ROUTER_MAC, EXT_MAC).build();
                        backend_of(&lb.run(&pkt).1)
                    })
                    .collect::<Vec<u8>>()
            };
            let a = picks(0, 1);
            assert_eq!(a, picks(0, 99), "{sched} v6 {v6}");
            let key = vectorlb_lb::hash::cluster_key("a cluster's shared secret");
            let k = picks(key, 5);
            assert_eq!(k, picks(key, 77), "{sched} v6 {v6}, keyed");
            let moved = a.iter().zip(&k).filter(|(x, y)| x != y).count();
            assert!(moved > 30_000, "{sched}: the key changes the spread ({moved} of 100,000 moved)");
            for i in 1..=3u8 {
                let n = k.iter().filter(|b| **b == i).count();
                assert!(n > 25_000, "{sched}: backend {i} got {n} of 100,000");
            }
        }
    }
}

#[test]
fn continuation_is_refused_where_it_cannot_work() {
    let f = Fam { v6: false };
    for (mode, sched, why) in [(Mode::Dr, "rr", "picks differently on every node"), (Mode::Fnat, "maglev", "not with fnat")] {
        let spec = spec_with(&f, mode, Algorithm::parse(sched).unwrap(), true);
        let e = Control::new(&spec).err().expect("refused").to_string();
        assert!(e.contains(why), "{e}");
    }
    let mut spec = spec_with(&f, Mode::Nat, Algorithm::parse("maglev").unwrap(), true);
    spec.services[0].synproxy = SynProxy::On;
    assert!(Control::new(&spec).err().expect("refused").to_string().contains("not with the SYN proxy"));
    assert!(ServiceSpec::continuation_default(proto::TCP, Mode::Dr, Algorithm::parse("maglev").unwrap(), SynProxy::Off));
    assert!(!ServiceSpec::continuation_default(proto::TCP, Mode::Dr, Algorithm::Wrr, SynProxy::Off));
    assert!(!ServiceSpec::continuation_default(proto::UDP, Mode::Dr, Algorithm::parse("sh").unwrap(), SynProxy::Off));
    assert!(!ServiceSpec::continuation_default(proto::TCP, Mode::Fnat, Algorithm::parse("sh").unwrap(), SynProxy::Off));
}
