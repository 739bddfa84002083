//! Session synchronisation: a session exported by one worker and installed on another (the
//! standby) translates the flow's later packets, both directions, exactly as the first would.

mod common;

use common::*;
use vectorlb_lb::sync::{InstallError, SyncRecord};
use vectorlb_lb::{Mode, Verdict};
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags as tf;

fn spec(v6: bool, mode: Mode) -> vectorlb_lb::LbSpec {
    let mut s = topology();
    let bp = if matches!(mode, Mode::Dr | Mode::Tun) { 80 } else { 8080 };
    s.services.push(service(&Fam { v6 }, mode, proto::TCP, 80, &[(1, bp, 1), (2, bp, 1), (3, bp, 1)]));
    s
}

#[test]
fn an_installed_session_forwards_like_the_original_in_every_mode_and_family() {
    for v6 in [false, true] {
        for mode in [Mode::Fnat, Mode::Nat, Mode::Dr, Mode::Tun] {
            let f = Fam { v6 };
            let mut active = Lb::new(spec(v6, mode));
            let mut standby = Lb::new(spec(v6, mode));
            active.worker.track_changes(true);
            let client = |flags: u8| Builder::tcp(&f.sock(f.client(), 40000), &f.sock(f.vip(), 80), flags).macs(ROUTER_MAC, EXT_MAC).build();
            let (v, out) = active.run(&client(tf::SYN));
            assert!(matches!(v, Verdict::Tx(_)), "{mode:?} v6={v6}: {v:?}");
            active.run(&client(tf::ACK));
            let mut recs = Vec::new();
            active.worker.take_changes(active.now, &mut recs);
            assert!(!recs.is_empty() && !active.worker.has_changes());
            let rec = *recs.last().unwrap();
            assert_eq!((rec.vport, rec.cport, rec.proto), (80, 40000, proto::TCP));
            for r in &recs {
                standby.worker.install(r, standby.now).unwrap();
            }
            assert_eq!(standby.worker.flows.table.len(), 1);
            // Client to backend: the same frame leaves both.
            let data = client(tf::ACK | tf::PSH);
            let (mut a, mut b) = (active.run(&data), standby.run(&data));
            if mode == Mode::Tun && !v6 {
                // The outer header's identification (and so its checksum) is per node.
                for x in [&mut a.1, &mut b.1] {
                    x[18..20].fill(0);
                    x[24..26].fill(0);
                }
            }
            assert_eq!(a, b, "{mode:?} v6={v6}: forward");
            // Backend to client (full NAT and NAT): the reply finds the session on the standby.
            if matches!(mode, Mode::Fnat | Mode::Nat) {
                let l3 = 14;
                let (src, dst) = if v6 { (&out[l3 + 24..l3 + 40], &out[l3 + 8..l3 + 24]) } else { (&out[l3 + 16..l3 + 20], &out[l3 + 12..l3 + 16]) };
                let l4 = if v6 { l3 + 40 } else { l3 + 20 };
                let bport = u16::from_be_bytes([out[l4 + 2], out[l4 + 3]]);
                let dst_port = u16::from_be_bytes([out[l4], out[l4 + 1]]);
                let ip = |b: &[u8]| -> String {
                    if v6 {
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap()).to_string()
                    } else {
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(b).unwrap()).to_string()
                    }
                };
                let reply = Builder::tcp(&f.sock(&ip(src), bport), &f.sock(&ip(dst), dst_port), tf::ACK | tf::PSH).macs(be_mac(1), INT_MAC).build();
                let a = active.run(&reply);
                let b = standby.run(&reply);
                assert!(matches!(a.0, Verdict::Tx(0)), "{mode:?} v6={v6}: {a:?}");
                assert_eq!(a, b, "{mode:?} v6={v6}: reply");
            }
        }
    }
}

#[test]
fn install_refuses_what_it_cannot_place_and_updates_what_it_has() {
    let f = Fam { v6: false };
    let mut active = Lb::new(spec(false, Mode::Fnat));
    let mut standby = Lb::new(spec(false, Mode::Fnat));
    active.worker.track_changes(true);
    active.run(&Builder::tcp(&f.sock(f.client(), 40000), &f.sock(f.vip(), 80), tf::SYN).build());
    let mut recs = Vec::new();
    active.worker.take_changes(1, &mut recs);
    let rec = recs[0];
    // Unknown service / backend / local address: the configurations differ.
    for bad in [
        SyncRecord { vport: 81, ..rec },
        SyncRecord { backend: "10.1.0.99".parse().unwrap(), ..rec },
        SyncRecord { local: Some(("10.1.0.99".parse().unwrap(), rec.local.unwrap().1)), ..rec },
    ] {
        assert_eq!(standby.worker.install(&bad, 1), Err(InstallError::Unknown));
    }
    assert_eq!(standby.worker.install(&SyncRecord { expire_in: 0, ..rec }, 1), Err(InstallError::Stale));
    assert_eq!(standby.worker.install(&SyncRecord { state: 99, ..rec }, 1), Err(InstallError::Stale));
    // Installed twice: updated, not duplicated.
    standby.worker.install(&rec, 1).unwrap();
    standby.worker.install(&SyncRecord { state: 3, ..rec }, 1).unwrap();
    assert_eq!(standby.worker.flows.table.len(), 1);
    // The same local port for another client: taken.
    let other = SyncRecord { cport: 40001, ..rec };
    assert_eq!(standby.worker.install(&other, 1), Err(InstallError::PortTaken));
    // Export walks the whole table (bulk transfer).
    let mut all = Vec::new();
    assert_eq!(standby.worker.export(false, vectorlb_lb::sync::Export::All, 0, 100, 1, &mut all), None);
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].state, all[0].local), (3, rec.local));
}

#[test]
fn a_proxied_session_keeps_its_sequence_translation_on_the_standby() {
    for (v6, mode) in [(false, Mode::Fnat), (true, Mode::Nat)] {
        let f = Fam { v6 };
        let mk = || {
            let mut s = topology();
            let mut svc = service(&f, mode, proto::TCP, 80, &[(1, 8080, 1)]);
            svc.synproxy = vectorlb_lb::SynProxy::On;
            s.services.push(svc);
            Lb::new(s)
        };
        let (mut active, mut standby) = (mk(), mk());
        active.worker.track_changes(true);
        let (c, v, be, _) = f.flow();
        let l4 = if v6 { 14 + 40 } else { 14 + 20 };
        let word = |o: &[u8], at: usize| u32::from_be_bytes(o[l4 + at..l4 + at + 4].try_into().unwrap());
        let (_, sa) = active.run(&Builder::tcp(&c, &v, tf::SYN).seq(1000).macs(ROUTER_MAC, EXT_MAC).build());
        let cookie = word(&sa, 4);
        let (_, syn) = active.run(&Builder::tcp(&c, &v, tf::ACK).seq(1001).ack(cookie.wrapping_add(1)).macs(ROUTER_MAC, EXT_MAC).build());
        let lport = u16::from_be_bytes([syn[l4], syn[l4 + 1]]);
        let to = if mode == Mode::Fnat { f.sock(f.laddr(), lport) } else { c.clone() };
        let (v1, _) = active.run(&Builder::tcp(&be, &to, tf::SYN | tf::ACK).seq(90_000).ack(1001).macs(be_mac(1), INT_MAC).build());
        assert!(matches!(v1, Verdict::Tx(1)), "{v1:?}");
        let mut recs = Vec::new();
        active.worker.take_changes(active.now, &mut recs);
        for r in &recs {
            standby.worker.install(r, standby.now).unwrap();
        }
        // Both directions leave both nodes identical, translated.
        let down = Builder::tcp(&be, &to, tf::ACK | tf::PSH).seq(90_001).ack(1001).payload(b"hello").macs(be_mac(1), INT_MAC).build();
        let (a, b) = (active.run(&down), standby.run(&down));
        assert_eq!(a, b, "{mode:?} v6={v6}: backend to client");
        assert_eq!(word(&a.1, 4), cookie.wrapping_add(1), "in the client's numbers");
        let up = Builder::tcp(&c, &v, tf::ACK).seq(1001).ack(cookie.wrapping_add(6)).macs(ROUTER_MAC, EXT_MAC).build();
        let (a, b) = (active.run(&up), standby.run(&up));
        assert_eq!(a, b, "{mode:?} v6={v6}: client to backend");
        assert_eq!(word(&a.1, 8), 90_006, "in the backend's numbers");
    }
}

/// A sync group (scale-out): node B lists node A's local address as a peer's. A's session
/// installed on B serves both directions there with A's address and port (after A's loss the
/// router brings A's replies to B); B never allocates from A's address; each node's refresh
/// exports only the sessions on its own addresses.
#[test]
fn a_peers_session_on_a_peers_local_address_serves_both_directions() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let other = if v6 { "2001:db8:1::201" } else { "10.1.0.201" };
        let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
        let node = |own: &str, peer: &str| {
            let mut s = spec(v6, Mode::Fnat);
            s.services[0].local_addrs = vec![ip(own)];
            s.services[0].peer_local_addrs = vec![ip(peer)];
            Lb::new(s)
        };
        let (mut a, mut b) = (node(f.laddr(), other), node(other, f.laddr()));
        a.worker.track_changes(true);
        let client = |port: u16, flags: u8| Builder::tcp(&f.sock(f.client(), port), &f.sock(f.vip(), 80), flags).macs(ROUTER_MAC, EXT_MAC).build();
        let (_, out) = a.run(&client(40000, tf::SYN));
        a.run(&client(40000, tf::ACK));
        let mut recs = Vec::new();
        a.worker.take_changes(a.now, &mut recs);
        assert_eq!(recs.last().unwrap().local.unwrap().0, ip(f.laddr()));
        for r in &recs {
            b.worker.install(r, b.now).unwrap();
        }
        // Forward on B: A's local address and port, as A would send it.
        let data = client(40000, tf::ACK | tf::PSH);
        assert_eq!(a.run(&data), b.run(&data), "v6={v6}: forward");
        // The backend's reply to A's address, arriving at B: back to the client.
        let l3 = 14;
        // The frame A sent to the backend: from A's local address and port.
        let (la, be, l4) = if v6 { (&out[l3 + 8..l3 + 24], &out[l3 + 24..l3 + 40], l3 + 40) } else { (&out[l3 + 12..l3 + 16], &out[l3 + 16..l3 + 20], l3 + 20) };
        let show = |x: &[u8]| -> String {
            if v6 {
                std::net::Ipv6Addr::from(<[u8; 16]>::try_from(x).unwrap()).to_string()
            } else {
                std::net::Ipv4Addr::from(<[u8; 4]>::try_from(x).unwrap()).to_string()
            }
        };
        assert_eq!(show(la), f.laddr());
        let (lport, bport) = (u16::from_be_bytes([out[l4], out[l4 + 1]]), u16::from_be_bytes([out[l4 + 2], out[l4 + 3]]));
        let reply = Builder::tcp(&f.sock(&show(be), bport), &f.sock(&show(la), lport), tf::ACK | tf::PSH).macs(be_mac(1), INT_MAC).build();
        let (ra, rb) = (a.run(&reply), b.run(&reply));
        assert!(matches!(rb.0, Verdict::Tx(0)), "v6={v6}: {rb:?}");
        assert_eq!(ra, rb, "v6={v6}: reply");
        // B's own new flows use its own address only.
        let (_, out) = b.run(&client(40001, tf::SYN));
        assert_eq!(show(if v6 { &out[l3 + 8..l3 + 24] } else { &out[l3 + 12..l3 + 16] }), other, "v6={v6}: B allocates from its own address");
        // The refresh: each node's own full-NAT sessions only.
        let export = |lb: &Lb, which| {
            let mut v = Vec::new();
            lb.worker.export(v6, which, 0, 100, lb.now, &mut v);
            v.iter().map(|r| r.cport).collect::<Vec<_>>()
        };
        use vectorlb_lb::sync::Export;
        assert_eq!(export(&a, Export::OwnFullNat), [40000]);
        let mut all_b = export(&b, Export::All);
        all_b.sort();
        assert_eq!(all_b, [40000, 40001]);
        assert_eq!(export(&b, Export::OwnFullNat), [40001], "v6={v6}: A's session is A's to refresh");
        // A peer's different session for the same flow (what is left of an earlier connection
        // from the client's port) never replaces one on this node's own address in a group;
        // a pair's standby takes the active node's word.
        let mut stale = *recs.last().unwrap();
        stale.local = Some((ip(other), 2000));
        a.worker.sync_group(true);
        assert_eq!(a.worker.install(&stale, a.now), Err(InstallError::Stale), "v6={v6}");
        let (_, out) = a.run(&data);
        assert_eq!(show(if v6 { &out[l3 + 8..l3 + 24] } else { &out[l3 + 12..l3 + 16] }), f.laddr(), "v6={v6}: ours kept");
        a.worker.sync_group(false);
        a.worker.install(&stale, a.now).unwrap();
        let (_, out) = a.run(&data);
        assert_eq!(show(if v6 { &out[l3 + 8..l3 + 24] } else { &out[l3 + 12..l3 + 16] }), other, "v6={v6}: a pair's standby replaces");
    }
}
