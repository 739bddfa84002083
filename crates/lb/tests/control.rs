//! Configuration changes while traffic flows: validation is all-or-nothing, and ids stay
//! stable so live sessions keep their backends.

mod common;

use common::*;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;

#[test]
fn a_bad_spec_changes_nothing() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 53, 1)]));
    let lb = Lb::new(spec.clone());
    let gen = lb.control.generation();
    let mut bad = spec.clone();
    bad.services[0].local_addrs.clear();
    assert!(lb.control.apply(&bad).unwrap_err().to_string().contains("local address"));
    let mut bad = spec.clone();
    bad.services.push(bad.services[0].clone());
    assert!(lb.control.apply(&bad).unwrap_err().to_string().contains("defined twice"));
    let mut bad = spec.clone();
    bad.services[0].backends[0].addr = ip("2001:db8:1::11");
    assert!(lb.control.apply(&bad).is_err());
    let mut bad = spec.clone();
    bad.services[0].mode = Mode::Dr;
    bad.services[0].local_addrs.clear();
    bad.services[0].backends[0].port = 5353;
    assert!(lb.control.apply(&bad).unwrap_err().to_string().contains("port 0 or 53"));
    let mut bad = spec.clone();
    bad.services[0].scheduler = vectorlb_sched::Algorithm::Maglev { table_size: 100 };
    assert!(lb.control.apply(&bad).unwrap_err().to_string().contains("not prime"));
    // Port addresses are unicast (the packet path's destination memo relies on it).
    for a in ["224.0.0.1", "ff02::1", "255.255.255.255", "0.0.0.0"] {
        let mut bad = spec.clone();
        bad.ports[0].addrs.push((ip(a), 32));
        let e = lb.control.apply(&bad).unwrap_err().to_string();
        assert!(e.contains(&format!("address {a} is")), "{a}: {e}");
    }
    assert_eq!(lb.control.generation(), gen, "no snapshot published");
}

#[test]
fn adding_services_keeps_existing_sessions() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 53, 1), (2, 53, 1)]));
    let mut lb = Lb::new(spec.clone());
    let pkt = Builder::udp(&f.sock(f.client(), 1000), &f.sock(f.vip(), 53)).payload(b"q").build();
    let (_, first) = lb.run(&pkt);
    // Add a service in front and reorder backends: ids are stable, the session keeps going to
    // the same backend.
    let mut svc2 = service(&f, Mode::Nat, proto::TCP, 80, &[(3, 80, 1)]);
    svc2.vip = ip("10.0.0.99");
    spec.services.insert(0, svc2);
    spec.services[1].backends.reverse();
    lb.control.apply(&spec).unwrap();
    let (v, again) = lb.run(&pkt);
    assert_eq!(v, Verdict::Tx(1));
    assert_eq!(first[30..34], again[30..34], "same backend after the change");
    assert_eq!(lb.worker.flows.table.len(), 1);
}

#[test]
fn wlc_balances_active_sessions() {
    let f = Fam { v6: false };
    let mut spec = topology();
    let mut s = service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 53, 1), (2, 53, 3)]);
    s.scheduler = vectorlb_sched::Algorithm::Wlc;
    spec.services.push(s);
    let mut lb = Lb::new(spec);
    let mut count = [0usize; 2];
    for p in 0..400u16 {
        let pkt = Builder::udp(&f.sock(f.client(), 1000 + p), &f.sock(f.vip(), 53)).payload(b"q").build();
        let (_, out) = lb.run(&pkt);
        count[(out[33] - 11) as usize] += 1;
    }
    assert_eq!(count, [100, 300]);
}

#[test]
fn maglev_sessions_stick_and_spread() {
    let f = Fam { v6: true };
    let mut spec = topology();
    let mut s = service(&f, Mode::Nat, proto::TCP, 80, &[(1, 80, 1), (2, 80, 1), (3, 80, 1)]);
    s.scheduler = vectorlb_sched::Algorithm::Maglev { table_size: 65537 };
    spec.services.push(s);
    let mut lb = Lb::with_capacity(spec, 10_000);
    let mut count = [0usize; 3];
    for p in 0..3000u16 {
        let syn = Builder::tcp(&f.sock(f.client(), 10000 + p), &f.sock(f.vip(), 80), vectorlb_packet::tcp::flags::SYN).build();
        let (v, out) = lb.run(&syn);
        assert_eq!(v, Verdict::Tx(1));
        let be = out[14 + 24 + 15];
        count[(be - 0x11) as usize] += 1;
        // The next segment of the flow goes to the same backend.
        let ack = Builder::tcp(&f.sock(f.client(), 10000 + p), &f.sock(f.vip(), 80), vectorlb_packet::tcp::flags::ACK).build();
        let (_, out2) = lb.run(&ack);
        assert_eq!(out2[14 + 24 + 15], be);
    }
    for c in count {
        assert!((850..1150).contains(&c), "{count:?}");
    }
}

#[test]
fn sessions_on_a_removed_local_address_end() {
    let f = Fam { v6: false };
    let mut spec = topology();
    spec.services.push(service(&f, Mode::Fnat, proto::UDP, 53, &[(1, 53, 1)]));
    spec.snat.push(SnatSpec { source: ip("10.1.0.0"), prefix_len: 24, addrs: vec![ip("10.0.0.200")], timeouts: Timeouts::default(), except: Vec::new(), outbound_only: false });
    let mut lb = Lb::new(spec.clone());
    let q = Builder::udp(&f.sock(f.client(), 1000), &f.sock(f.vip(), 53)).payload(b"q").build();
    let out = Builder::udp("10.1.0.12:7000", "203.0.113.1:9").payload(b"o").build();
    assert_eq!(lb.run(&q).0, Verdict::Tx(1));
    assert_eq!(lb.run(&out).0, Verdict::Tx(0));
    assert_eq!(lb.worker.flows.table.len(), 2);
    // Move both the full-NAT local address and the SNAT address.
    spec.services[0].local_addrs = vec![ip("10.1.0.201")];
    spec.snat[0].addrs = vec![ip("10.0.0.201")];
    lb.control.apply(&spec).unwrap();
    lb.expect_drop(&q, DropReason::NoRoute);
    lb.expect_drop(&out, DropReason::NoRoute);
    assert_eq!(lb.worker.flows.table.len(), 0, "stale sessions are removed");
    // The flows' next packets get sessions on the new addresses.
    let (v, o) = lb.run(&q);
    assert_eq!(v, Verdict::Tx(1));
    assert_eq!(&o[26..30], &[10, 1, 0, 201]);
    let (v, o) = lb.run(&out);
    assert_eq!(v, Verdict::Tx(0));
    assert_eq!(&o[26..30], &[10, 0, 0, 201]);
}
