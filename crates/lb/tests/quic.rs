//! QUIC connection-id routing (Katran's scheme, `vectorlb_lb::quic`): a new flow whose packet
//! carries a backend's server id goes to that backend whatever its 5-tuple; Initial and 0-RTT
//! packets, unknown ids and ids of backends that take no new flows go by the hash, as without
//! QUIC routing; all counted.

mod common;

use common::*;
use vectorlb_lb::quic::connection_id;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

/// A UDP service on 443 (TUN, maglev); backends 1..3 with server ids 101..103 when `quic`.
fn spec(f: &Fam, quic: bool, weights: [u32; 3]) -> LbSpec {
    let mut spec = topology();
    let mut s = service(f, Mode::Tun, proto::UDP, 443, &[(1, 0, weights[0]), (2, 0, weights[1]), (3, 0, weights[2])]);
    s.scheduler = Algorithm::parse("maglev").unwrap();
    s.quic = quic;
    if quic {
        for (i, b) in s.backends.iter_mut().enumerate() {
            b.quic_id = Some(101 + i as u32);
        }
    }
    spec.services.push(s);
    spec
}

fn short(cid: &[u8; 8]) -> Vec<u8> {
    let mut p = vec![0x41];
    p.extend_from_slice(cid);
    p.extend_from_slice(&[0x5a; 30]);
    p
}

fn initial(cid: &[u8; 8]) -> Vec<u8> {
    let mut p = vec![0xc3, 0, 0, 0, 1, 8];
    p.extend_from_slice(cid);
    p.extend_from_slice(&[8, 9, 9, 9, 9, 9, 9, 9, 9, 0, 0x44, 0xd0]);
    p.resize(1200, 0);
    p
}

fn client(f: &Fam, n: u32) -> String {
    if f.v6 {
        format!("[2001:db8:ff::{:x}:{:x}]:{}", n >> 16, n & 0xffff, 1024 + n % 60_000)
    } else {
        format!("198.51.{}.{}:{}", (n >> 8) as u8, n as u8, 1024 + n % 60_000)
    }
}

/// The backend (1..=3) a tunnelled frame went to, from its destination MAC.
fn backend(out: &[u8]) -> u8 {
    (1..=3u8).find(|&i| out[..6] == be_mac(i)).unwrap_or_else(|| panic!("not to a backend: {}", hex(&out[..14])))
}

fn send(lb: &mut Lb, f: &Fam, n: u32, payload: &[u8]) -> u8 {
    let pkt = Builder::udp(&client(f, n), &f.sock(f.vip(), 443)).payload(payload).macs(ROUTER_MAC, EXT_MAC).build();
    let (v, out) = lb.run(&pkt);
    assert!(matches!(v, Verdict::Tx(1)), "{v:?}");
    backend(&out)
}

#[test]
fn short_headers_go_to_the_server_their_connection_id_names() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut lb = Lb::with_capacity(spec(&f, true, [1, 1, 1]), 10_000);
        // 300 clients (new 5-tuples: migrated clients, or flows new to this node), each id
        // version, always the named backend.
        for n in 0..300u32 {
            let (v, be) = ((n % 3) as u8 + 1, (n % 3) as u8 + 1);
            let cid = connection_id(v, 100 + be as u32);
            assert_eq!(send(&mut lb, &f, n, &short(&cid)), be, "v6 {v6} client {n}");
        }
        let ev = lb.worker.flows.counters.events;
        assert_eq!((ev.quic_by_server_id, ev.quic_unknown_server_id, ev.quic_by_hash), (300, 0, 0));
    }
}

#[test]
fn what_names_no_server_goes_by_the_hash_as_without_quic() {
    let f = Fam { v6: false };
    let mut quic = Lb::with_capacity(spec(&f, true, [1, 1, 1]), 10_000);
    let mut plain = Lb::with_capacity(spec(&f, false, [1, 1, 1]), 10_000);
    let unknown = connection_id(2, 999);
    let mut spread = [0u32; 3];
    for n in 0..600u32 {
        let p = match n % 3 {
            0 => initial(&connection_id(1, 102)),
            1 => short(&unknown),
            _ => short(&[0u8; 8]),
        };
        let be = send(&mut quic, &f, n, &p);
        assert_eq!(be, send(&mut plain, &f, n, &p), "client {n}: the hash's choice");
        spread[be as usize - 1] += 1;
    }
    assert!(spread.iter().all(|&c| c > 120), "spread by the hash: {spread:?}");
    let ev = quic.worker.flows.counters.events;
    assert_eq!((ev.quic_by_server_id, ev.quic_unknown_server_id, ev.quic_by_hash), (0, 200, 400));
    assert_eq!(plain.worker.flows.counters.events.quic_by_hash, 0, "not counted without quic");
}

#[test]
fn a_drained_server_gets_no_new_flows_by_its_id() {
    let f = Fam { v6: false };
    let mut lb = Lb::with_capacity(spec(&f, true, [1, 0, 1]), 10_000);
    for n in 0..100u32 {
        assert_ne!(send(&mut lb, &f, n, &short(&connection_id(1, 102))), 2);
    }
    assert_eq!(lb.worker.flows.counters.events.quic_unknown_server_id, 100);
}

#[test]
fn a_migrating_client_keeps_its_server() {
    let f = Fam { v6: true };
    let mut lb = Lb::with_capacity(spec(&f, true, [1, 1, 1]), 10_000);
    // The handshake goes by the hash; the server answers with its own id; the client moves.
    let first = send(&mut lb, &f, 7, &initial(&[0x11; 8]));
    let cid = connection_id(3, 100 + first as u32);
    assert_eq!(send(&mut lb, &f, 7, &short(&cid)), first, "same 5-tuple: its session");
    for moved in [70_000u32, 80_000, 123_456] {
        assert_eq!(send(&mut lb, &f, moved, &short(&cid)), first, "a new address and port: the id");
    }
}

#[test]
fn quic_settings_are_checked() {
    let f = Fam { v6: false };
    let mut s = spec(&f, true, [1, 1, 1]);
    s.services[0].proto = proto::TCP;
    assert!(Control::new(&s).err().unwrap().to_string().contains("quic routes UDP services only"));
    let mut s = spec(&f, true, [1, 1, 1]);
    s.services[0].backends[2].quic_id = Some(101);
    assert!(Control::new(&s).err().unwrap().to_string().contains("quic_id 101 is given to two backends"));
    let mut s = spec(&f, false, [1, 1, 1]);
    s.services[0].backends[0].quic_id = Some(5);
    assert!(Control::new(&s).err().unwrap().to_string().contains("quic is off"));
}
