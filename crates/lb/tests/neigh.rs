//! ARP and IPv6 neighbour discovery: answers for our addresses, learning, requests. Expected
//! frames are written out byte by byte here, not built with the code under test.

mod common;

use common::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use vectorlb_lb::{neigh, HeapBuf, Mode, PacketBuf, Verdict};
use vectorlb_packet::{checksum, proto};

const CLIENT_MAC: [u8; 6] = [2, 0xc1, 0, 0, 0, 2];

fn spec() -> vectorlb_lb::LbSpec {
    let mut s = topology();
    let f4 = Fam { v6: false };
    let f6 = Fam { v6: true };
    s.services.push(service(&f4, Mode::Fnat, proto::TCP, 80, &[(1, 80, 1)]));
    s.services.push(service(&f6, Mode::Fnat, proto::TCP, 80, &[(1, 80, 1)]));
    s
}

fn arp(op: u16, src_mac: [u8; 6], sha: [u8; 6], spa: [u8; 4], tha: [u8; 6], tpa: [u8; 4], dst: [u8; 6]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa);
    f.extend_from_slice(&tha);
    f.extend_from_slice(&tpa);
    f
}

#[test]
fn answers_arp_for_a_vip_and_learns_the_asker() {
    let lb = Lb::new(spec());
    let snap = lb.control.snapshot();
    let req = arp(1, CLIENT_MAC, CLIENT_MAC, [10, 0, 0, 2], [0; 6], [10, 0, 0, 100], [0xff; 6]);
    // The pipeline leaves ARP to the runtime.
    let mut w = Lb::new(spec());
    assert_eq!(w.run(&req).0, Verdict::Kernel);
    let mut b = HeapBuf::from_frame(&req);
    let o = neigh::handle(&mut b, &snap, 0, true);
    assert!(o.reply && o.neighbour);
    assert_eq!(o.learned, Some((IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), CLIENT_MAC)));
    let want = arp(2, EXT_MAC, EXT_MAC, [10, 0, 0, 100], CLIENT_MAC, [10, 0, 0, 2], CLIENT_MAC);
    assert_eq!(b.data(), &want[..]);
}

#[test]
fn ignores_arp_for_others_and_does_not_learn_off_link() {
    let snap = Lb::new(spec()).control.snapshot();
    // Not our address: no answer, nothing learnt, only an update offered for the control
    // thread to apply if the sender is known (RFC 826's merge).
    let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, CLIENT_MAC, [10, 0, 0, 2], [0; 6], [10, 0, 0, 77], [0xff; 6]));
    let update = Some((IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), CLIENT_MAC));
    assert_eq!(neigh::handle(&mut b, &snap, 0, true), neigh::Outcome { reply: false, learned: None, update, neighbour: true });
    // A gratuitous ARP (sender = target) from a neighbour: the same.
    let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, CLIENT_MAC, [10, 0, 0, 2], [0; 6], [10, 0, 0, 2], [0xff; 6]));
    assert_eq!(neigh::handle(&mut b, &snap, 0, true), neigh::Outcome { reply: false, learned: None, update, neighbour: true });
    // An asker outside every connected network is answered but not learnt.
    let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, CLIENT_MAC, [192, 0, 2, 9], [0; 6], [10, 0, 0, 100], [0xff; 6]));
    let o = neigh::handle(&mut b, &snap, 0, true);
    assert!(o.reply);
    assert_eq!(o.learned, None);
    // A probe (sender 0.0.0.0) is answered, not learnt; a multicast sender MAC is not learnt.
    let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, CLIENT_MAC, [0, 0, 0, 0], [0; 6], [10, 0, 0, 1], [0xff; 6]));
    assert_eq!(neigh::handle(&mut b, &snap, 0, true).learned, None);
    let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, [1, 0, 0x5e, 0, 0, 1], [10, 0, 0, 2], [0; 6], [10, 0, 0, 1], [0xff; 6]));
    assert_eq!(neigh::handle(&mut b, &snap, 0, true).learned, None);
    // Truncated ARP and non-ARP frames are left alone.
    let mut t = arp(1, CLIENT_MAC, CLIENT_MAC, [10, 0, 0, 2], [0; 6], [10, 0, 0, 100], [0xff; 6]);
    t.truncate(30);
    let mut b = HeapBuf::from_frame(&t);
    assert!(!neigh::handle(&mut b, &snap, 0, true).reply);
    let mut b = HeapBuf::from_frame(&[0u8; 60]);
    assert_eq!(neigh::handle(&mut b, &snap, 0, true), neigh::Outcome::default());
    // A port that does not exist.
    let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, CLIENT_MAC, [10, 0, 0, 2], [0; 6], [10, 0, 0, 100], [0xff; 6]));
    assert_eq!(neigh::handle(&mut b, &snap, 9, true), neigh::Outcome::default());
}

/// An NS or NA: Ethernet + IPv6 + ICMPv6 with one link-layer address option.
#[allow(clippy::too_many_arguments)]
fn nd(t: u8, flags: u8, eth_dst: [u8; 6], eth_src: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr, opt: u8, mac: [u8; 6]) -> Vec<u8> {
    let mut icmp = vec![t, 0, 0, 0, flags, 0, 0, 0];
    icmp.extend_from_slice(&target.octets());
    icmp.extend_from_slice(&[opt, 1]);
    icmp.extend_from_slice(&mac);
    let c = checksum::finish(checksum::accumulate(checksum::pseudo_v6(&src.octets(), &dst.octets(), 58, 32), &icmp));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&eth_dst);
    f.extend_from_slice(&eth_src);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 32, 58, 255]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&icmp);
    f
}

#[test]
fn answers_neighbour_solicitation_for_a_vip() {
    let snap = Lb::new(spec()).control.snapshot();
    let client: Ipv6Addr = "2001:db8::2".parse().unwrap();
    let vip: Ipv6Addr = "2001:db8::100".parse().unwrap();
    let snm: Ipv6Addr = "ff02::1:ff00:100".parse().unwrap();
    let ns = nd(135, 0, [0x33, 0x33, 0xff, 0, 1, 0], CLIENT_MAC, client, snm, vip, 1, CLIENT_MAC);
    let mut b = HeapBuf::from_frame(&ns);
    let o = neigh::handle(&mut b, &snap, 0, true);
    assert!(o.reply);
    assert_eq!(o.learned, Some((IpAddr::V6(client), CLIENT_MAC)));
    let want = nd(136, 0x60, CLIENT_MAC, EXT_MAC, vip, client, vip, 2, EXT_MAC);
    assert_eq!(b.data(), &want[..], "solicited + override advertisement with our MAC");
    // Duplicate address detection (source ::) is answered to all nodes, without the S flag.
    let dad = nd(135, 0, [0x33, 0x33, 0xff, 0, 1, 0], CLIENT_MAC, Ipv6Addr::UNSPECIFIED, snm, vip, 1, CLIENT_MAC);
    let mut b = HeapBuf::from_frame(&dad);
    let o = neigh::handle(&mut b, &snap, 0, true);
    assert!(o.reply && o.learned.is_none());
    let all: Ipv6Addr = "ff02::1".parse().unwrap();
    assert_eq!(b.data(), &nd(136, 0x20, [0x33, 0x33, 0, 0, 0, 1], EXT_MAC, vip, all, vip, 2, EXT_MAC)[..]);
    // Not ours: nothing.
    let other = nd(135, 0, [0x33, 0x33, 0xff, 0, 0, 9], CLIENT_MAC, client, snm, "2001:db8::9".parse().unwrap(), 1, CLIENT_MAC);
    let mut b = HeapBuf::from_frame(&other);
    assert!(!neigh::handle(&mut b, &snap, 0, true).reply);
}

#[test]
fn learns_from_advertisements_and_builds_requests() {
    let snap = Lb::new(spec()).control.snapshot();
    let be: Ipv6Addr = "2001:db8:1::11".parse().unwrap();
    let me: Ipv6Addr = "2001:db8:1::1".parse().unwrap();
    let na = nd(136, 0x60, INT_MAC, be_mac(1), be, me, be, 2, be_mac(1));
    let mut b = HeapBuf::from_frame(&na);
    let o = neigh::handle(&mut b, &snap, 1, true);
    assert!(!o.reply);
    assert_eq!(o.learned, Some((IpAddr::V6(be), be_mac(1))));
    // An ARP reply to our request teaches the backend's MAC.
    let rep = arp(2, be_mac(2), be_mac(2), [10, 1, 0, 12], INT_MAC, [10, 1, 0, 1], INT_MAC);
    let mut b = HeapBuf::from_frame(&rep);
    assert_eq!(neigh::handle(&mut b, &snap, 1, true).learned, Some((IpAddr::V4(Ipv4Addr::new(10, 1, 0, 12)), be_mac(2))));

    // Requests from the port's own address.
    let r = neigh::arp_request(&snap, 1, Ipv4Addr::new(10, 1, 0, 13)).unwrap();
    assert_eq!(r, arp(1, INT_MAC, INT_MAC, [10, 1, 0, 1], [0; 6], [10, 1, 0, 13], [0xff; 6]));
    let s = neigh::solicit(&snap, 1, "2001:db8:1::13".parse().unwrap()).unwrap();
    let snm: Ipv6Addr = "ff02::1:ff00:13".parse().unwrap();
    assert_eq!(s, nd(135, 0, [0x33, 0x33, 0xff, 0, 0, 0x13], INT_MAC, me, snm, "2001:db8:1::13".parse().unwrap(), 1, INT_MAC));
    assert!(neigh::arp_request(&snap, 7, Ipv4Addr::new(10, 1, 0, 13)).is_none());

    // Next hops: both gateways and every on-link backend, with their ports.
    let hops = neigh::next_hops(&snap);
    assert!(hops.contains(&(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 254)), 0)));
    assert!(hops.contains(&(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 11)), 1)));
    assert!(hops.contains(&(IpAddr::V6(be), 1)));
}

#[test]
fn a_packet_to_an_unknown_neighbour_asks_for_it() {
    // The client (on the outside network) is not in the neighbour table: the echo reply to it
    // cannot leave, and the worker reports the client for the runtime to resolve.
    let mut s = spec();
    s.routes.clear();
    let mut lb = Lb::new(s);
    let echo = vectorlb_packet::builder::Builder::icmp("10.0.0.2", "10.0.0.100", 8, 0, [0, 1, 0, 1]).macs(CLIENT_MAC, EXT_MAC).build();
    assert_eq!(lb.run(&echo).0, Verdict::Drop(vectorlb_lb::DropReason::NoRoute));
    assert!(lb.worker.has_unresolved());
    assert_eq!(lb.worker.take_unresolved(), vec![(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 0)]);
    assert!(!lb.worker.has_unresolved(), "taken once");
    // Off-link destinations are reached through the gateway: that is what must be resolved.
    let mut s = spec();
    s.neighbors.retain(|(a, _)| *a != IpAddr::V4(Ipv4Addr::new(10, 0, 0, 254)));
    let mut lb = Lb::new(s);
    let echo = vectorlb_packet::builder::Builder::icmp("192.0.2.7", "10.0.0.100", 8, 0, [0, 1, 0, 1]).macs(CLIENT_MAC, EXT_MAC).build();
    assert_eq!(lb.run(&echo).0, Verdict::Drop(vectorlb_lb::DropReason::NoRoute));
    assert_eq!(lb.worker.take_unresolved(), vec![(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 254)), 0)]);
}

#[test]
fn a_backup_node_is_silent_for_floating_addresses() {
    let snap = Lb::new(spec()).control.snapshot();
    // BACKUP (floating = false): no answer for the VIP or a local address, but the interface
    // address still answers.
    for (target, answered) in [([10, 0, 0, 100], false), ([10, 1, 0, 200], false), ([10, 0, 0, 1], true)] {
        let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, CLIENT_MAC, [10, 0, 0, 2], [0; 6], target, [0xff; 6]));
        assert_eq!(neigh::handle(&mut b, &snap, 0, false).reply, answered, "{target:?}");
    }
    let client: Ipv6Addr = "2001:db8::2".parse().unwrap();
    let vip: Ipv6Addr = "2001:db8::100".parse().unwrap();
    let ns = nd(135, 0, [0x33, 0x33, 0xff, 0, 1, 0], CLIENT_MAC, client, "ff02::1:ff00:100".parse().unwrap(), vip, 1, CLIENT_MAC);
    let mut b = HeapBuf::from_frame(&ns);
    assert!(!neigh::handle(&mut b, &snap, 0, false).reply);
    // Announcements a new MASTER sends.
    let g = neigh::gratuitous_arp(&snap, 0, Ipv4Addr::new(10, 0, 0, 100)).unwrap();
    assert_eq!(g, arp(1, EXT_MAC, EXT_MAC, [10, 0, 0, 100], [0; 6], [10, 0, 0, 100], [0xff; 6]));
    let na = neigh::unsolicited_na(&snap, 0, vip).unwrap();
    let all: Ipv6Addr = "ff02::1".parse().unwrap();
    assert_eq!(na, nd(136, 0x20, [0x33, 0x33, 0, 0, 0, 1], EXT_MAC, vip, all, vip, 2, EXT_MAC));
}

/// A sync group's peer's local address reaches this node by routing only: never answered for,
/// even by a node that answers for its floating addresses; its own local address still is.
#[test]
fn a_peers_local_address_is_never_answered_for() {
    let mut s = spec();
    s.services[0].peer_local_addrs = vec!["10.1.0.201".parse().unwrap()];
    let snap = Lb::new(s).control.snapshot();
    for (target, answered) in [([10, 1, 0, 201], false), ([10, 1, 0, 200], true)] {
        let mut b = HeapBuf::from_frame(&arp(1, CLIENT_MAC, CLIENT_MAC, [10, 1, 0, 2], [0; 6], target, [0xff; 6]));
        assert_eq!(neigh::handle(&mut b, &snap, 1, true).reply, answered, "{target:?}");
    }
}
