//! The mesh's steering through the worker: TCP between meshed pods goes to the proxy's
//! address (its MAC), the proxy's own packets and everything else go where they are addressed.
//!
//! Pods a (10.1.0.11) and b (10.1.0.12) are meshed; 10.1.0.13 stands for the proxy.

mod common;

use common::*;
use vectorlb_lb::mesh::MeshSpec;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::tcp::flags::SYN;

fn sent_to(lb: &mut Lb, f: &[u8]) -> (Verdict, [u8; 6]) {
    let mut b = HeapBuf::from_frame(f);
    let v = lb.worker.route(&mut b, lb.now);
    (v, b.data()[..6].try_into().unwrap())
}

#[test]
fn meshed_tcp_is_steered_to_the_proxy_until_the_mesh_is_off() {
    let mut lb = Lb::new(topology());
    let spec = MeshSpec { proxy: vec![ip("10.1.0.13")], proxy_mac: be_mac(3), members: vec![ip("10.1.0.11"), ip("10.1.0.12")], tunnel_port: 15008 };
    let a_to_b = Builder::tcp("10.1.0.11:1000", "10.1.0.12:8080", SYN).macs(ROUTER_MAC, INT_MAC).build();
    assert_eq!(sent_to(&mut lb, &a_to_b), (Verdict::Tx(1), be_mac(2)), "no mesh yet");
    lb.control.apply_mesh(&spec).unwrap();
    assert_eq!(sent_to(&mut lb, &a_to_b), (Verdict::Tx(1), be_mac(3)), "to the proxy");
    // The proxy's own packet (its source MAC) for the same addresses goes to b.
    let from_proxy = Builder::tcp("10.1.0.11:1000", "10.1.0.12:8080", SYN).macs(be_mac(3), INT_MAC).build();
    assert_eq!(sent_to(&mut lb, &from_proxy), (Verdict::Tx(1), be_mac(2)));
    // UDP is not steered; nor TCP to a pod outside the mesh.
    assert_eq!(sent_to(&mut lb, &Builder::udp("10.1.0.11:1000", "10.1.0.12:53").macs(ROUTER_MAC, INT_MAC).build()), (Verdict::Tx(1), be_mac(2)));
    let out = Builder::tcp("10.1.0.11:1000", "10.1.0.200:80", SYN).macs(ROUTER_MAC, INT_MAC).build();
    assert_ne!(sent_to(&mut lb, &out).1, be_mac(3));
    // A bad mesh changes nothing; an empty one stops steering.
    assert!(lb.control.apply_mesh(&MeshSpec { proxy: vec![], ..spec.clone() }).is_err());
    assert_eq!(sent_to(&mut lb, &a_to_b), (Verdict::Tx(1), be_mac(3)));
    lb.control.clear_mesh();
    assert_eq!(sent_to(&mut lb, &a_to_b), (Verdict::Tx(1), be_mac(2)));
}

#[test]
fn a_meshed_pods_connection_to_a_service_goes_to_the_proxy_once_the_backend_is_chosen() {
    // The VIP 10.0.0.100:80 is a NAT service to 10.1.0.12:8080; a (10.1.0.11) and the backend
    // are meshed; 10.1.0.13 stands for the proxy.
    let mut spec = topology();
    spec.services.push(service(&Fam { v6: false }, Mode::Nat, vectorlb_packet::proto::TCP, 80, &[(2, 8080, 1)]));
    let mut lb = Lb::new(spec);
    lb.control.apply_mesh(&MeshSpec { proxy: vec![ip("10.1.0.13")], proxy_mac: be_mac(3), members: vec![ip("10.1.0.11"), ip("10.1.0.12")], tunnel_port: 15008 }).unwrap();
    let syn = Builder::tcp("10.1.0.11:5000", "10.0.0.100:80", SYN).macs(ROUTER_MAC, INT_MAC).build();
    let (v, out) = lb.run(&syn);
    assert_eq!(v, Verdict::Tx(1));
    assert_eq!(out[..6], be_mac(3), "to the proxy");
    assert_eq!(out[14 + 16..14 + 20], [10, 1, 0, 12], "translated to the backend");
    // A client outside the mesh goes to the backend itself.
    let other = Builder::tcp("10.1.0.200:5000", "10.0.0.100:80", SYN).macs(ROUTER_MAC, INT_MAC).build();
    let (v, out) = lb.run(&other);
    assert_eq!((v, &out[..6]), (Verdict::Tx(1), &be_mac(2)[..]));
    // The proxy's answer as the backend (its MAC, the backend's address and port) is the
    // session's reply: the client gets it from the VIP.
    let reply = Builder::tcp("10.1.0.12:8080", "10.1.0.11:5000", SYN | vectorlb_packet::tcp::flags::ACK).macs(be_mac(3), INT_MAC).build();
    let (v, out) = lb.run(&reply);
    assert_eq!(v, Verdict::Tx(1), "{out:?}");
    assert_eq!(out[14 + 12..14 + 16], [10, 0, 0, 100], "from the VIP");
    // The connection's later packets (the fast path's) go to the proxy too.
    for flags in [vectorlb_packet::tcp::flags::ACK, vectorlb_packet::tcp::flags::ACK | vectorlb_packet::tcp::flags::PSH] {
        let f = Builder::tcp("10.1.0.11:5000", "10.0.0.100:80", flags).payload(b"GET / HTTP/1.1\r\n\r\n").macs(ROUTER_MAC, INT_MAC).build();
        let (v, out) = lb.run(&f);
        assert_eq!((v, &out[..6]), (Verdict::Tx(1), &be_mac(3)[..]), "flags {flags:#x}");
    }
    assert!(lb.worker.flows.counters.events.fast_path > 0, "the fast path took them");
}
