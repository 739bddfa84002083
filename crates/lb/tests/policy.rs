//! Network policy through the worker: routed flows between pods and a service's flows to a
//! pod, decided on their first packet and remembered.
//!
//! Pods a (10.1.0.11), b (10.1.0.12) and c (10.1.0.13) sit behind the `int` port of the
//! two-arm topology; the VIP 10.0.0.100:80 is a NAT service to b:8080.

mod common;

use common::*;
use vectorlb_lb::policy::{Action, DirectionSpec, EndpointSpec, PolicySpec, Ports, Rule};
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::{ACK, SYN};

const A: &str = "10.1.0.11";
const B: &str = "10.1.0.12";
const C: &str = "10.1.0.13";

fn frame(b: Builder) -> Vec<u8> {
    b.macs(ROUTER_MAC, INT_MAC).build()
}

/// b takes TCP 8080 from a only (NetworkPolicy `ns/b-from-a`); nothing restricts a or c.
fn b_from_a() -> PolicySpec {
    PolicySpec {
        policies: vec!["NetworkPolicy/ns/b-from-a".into()],
        identities: vec![(ip(A), 1), (ip(B), 2), (ip(C), 3)],
        prefixes: vec![],
        endpoints: vec![
            EndpointSpec { name: "ns/a".into(), addrs: vec![ip(A)], ..Default::default() },
            EndpointSpec {
                name: "ns/b".into(),
                addrs: vec![ip(B)],
                ingress: DirectionSpec {
                    isolated_by: Some(0),
                    allow: vec![Rule { peers: Some(vec![1]), ports: vec![Ports { proto: proto::TCP, lo: 8080, hi: 8080 }], action: Action::Allow, policy: 0 }],
                    ..Default::default()
                },
                ..Default::default()
            },
            EndpointSpec { name: "ns/c".into(), addrs: vec![ip(C)], ..Default::default() },
        ],
    }
}

fn lb() -> Lb {
    let mut spec = topology();
    let svc = service(&Fam { v6: false }, Mode::Nat, proto::TCP, 80, &[(2, 8080, 1)]);
    spec.services.push(svc);
    Lb::new(spec)
}

fn route(lb: &mut Lb, f: &[u8]) -> Verdict {
    let mut b = HeapBuf::from_frame(f);
    lb.worker.route(&mut b, lb.now)
}

#[test]
fn routed_flows_are_decided_once_and_their_replies_pass() {
    let mut lb = lb();
    // Without policies everything is routed.
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{C}:1000"), &format!("{B}:8080"), SYN))), Verdict::Tx(1));
    lb.control.apply_policy(&b_from_a()).unwrap();
    // c's flow to b started before any policy: remembered as open, it is not cut (nor its
    // reply); a new one from c is decided by b's ingress.
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{C}:1000"), &format!("{B}:8080"), ACK))), Verdict::Tx(1));
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{B}:8080"), &format!("{C}:1000"), ACK))), Verdict::Tx(1));
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{C}:1001"), &format!("{B}:8080"), SYN))), Verdict::Drop(DropReason::PolicyDenied));
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{A}:1001"), &format!("{B}:8081"), SYN))), Verdict::Drop(DropReason::PolicyDenied), "a port no rule names");
    assert_eq!(route(&mut lb, &frame(Builder::udp(&format!("{A}:1001"), &format!("{B}:8080")))), Verdict::Drop(DropReason::PolicyDenied), "UDP where TCP is allowed");
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{A}:1001"), &format!("{B}:8080"), SYN))), Verdict::Tx(1));
    // b's reply: b's ingress would refuse a flow from b to a, but this one is a's, remembered.
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{B}:8080"), &format!("{A}:1001"), SYN | ACK))), Verdict::Tx(1));
    // a flow b opens to c touches no policy of b's egress; c's reply comes back to b, whose
    // ingress refuses c: it passes only as the reply of the remembered flow.
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{B}:2000"), &format!("{C}:22"), SYN))), Verdict::Tx(1));
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{C}:22"), &format!("{B}:2000"), SYN | ACK))), Verdict::Tx(1));
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{C}:22"), &format!("{B}:2001"), SYN | ACK))), Verdict::Drop(DropReason::PolicyDenied), "not a reply of any flow");
    // Flows between endpoints no policy selects are remembered too (as open), once.
    let before = lb.control.policy_flows.len();
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{A}:3000"), &format!("{C}:80"), SYN))), Verdict::Tx(1));
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{C}:80"), &format!("{A}:3000"), SYN | ACK))), Verdict::Tx(1));
    assert_eq!(lb.control.policy_flows.len(), before + 1);
    let d = lb.control.policy_counters.snapshot();
    assert_eq!(d.policies, vec![("NetworkPolicy/ns/b-from-a".to_string(), 4)]);
    assert!(d.endpoints.contains(&("ns/b".to_string(), 4, 0)), "{d:?}");
}

#[test]
fn a_policy_change_cuts_no_allowed_flow_and_decides_new_ones() {
    let mut lb = lb();
    lb.control.apply_policy(&b_from_a()).unwrap();
    let open = frame(Builder::tcp(&format!("{A}:1001"), &format!("{B}:8080"), SYN));
    assert_eq!(route(&mut lb, &open), Verdict::Tx(1));
    // Now b takes nothing at all.
    let mut deny_all = b_from_a();
    deny_all.endpoints[1].ingress.allow.clear();
    lb.control.apply_policy(&deny_all).unwrap();
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{A}:1001"), &format!("{B}:8080"), ACK))), Verdict::Tx(1), "the flow allowed at its start goes on");
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{A}:1002"), &format!("{B}:8080"), SYN))), Verdict::Drop(DropReason::PolicyDenied));
    // And a set without policies lets everything through again.
    lb.control.apply_policy(&PolicySpec::default()).unwrap();
    assert_eq!(route(&mut lb, &frame(Builder::tcp(&format!("{C}:1003"), &format!("{B}:8080"), SYN))), Verdict::Tx(1));
}

#[test]
fn icmp_is_decided_as_icmp_and_errors_about_remembered_flows_pass() {
    let mut lb = lb();
    lb.control.apply_policy(&b_from_a()).unwrap();
    let echo = |src: &str, dst: &str, t: u8| frame(Builder::icmp(src, dst, t, 0, [0, 7, 0, 1]));
    assert_eq!(route(&mut lb, &echo(A, B, 8)), Verdict::Drop(DropReason::PolicyDenied), "the rule names TCP 8080 only");
    // b pings c (b's egress is open): the echo reply comes back as the flow's reply.
    assert_eq!(route(&mut lb, &echo(B, C, 8)), Verdict::Tx(1));
    assert_eq!(route(&mut lb, &echo(C, B, 0)), Verdict::Tx(1));
    // A UDP flow from b to c, and c's port unreachable about it.
    let udp = Builder::udp(&format!("{B}:4000"), &format!("{C}:53"));
    assert_eq!(route(&mut lb, &frame(udp.clone())), Verdict::Tx(1));
    let quoted = udp.build_ip();
    let rest = [0u8; 4];
    let err = Builder::icmp(C, B, 3, 3, rest).payload(&quoted[..28]);
    assert_eq!(route(&mut lb, &frame(err)), Verdict::Tx(1));
    let other = Builder::udp(&format!("{B}:4001"), &format!("{C}:53")).build_ip();
    assert_eq!(route(&mut lb, &frame(Builder::icmp(C, B, 3, 3, rest).payload(&other[..28]))), Verdict::Drop(DropReason::PolicyDenied), "an error about no flow of b's");
    // Cut short: a counted drop, never a read past the frame.
    let mut short = frame(Builder::tcp(&format!("{C}:1"), &format!("{B}:8080"), SYN));
    short.truncate(14 + 20 + 2);
    assert!(matches!(route(&mut lb, &short), Verdict::Drop(_)));
}

#[test]
fn a_services_flow_is_decided_when_its_session_opens() {
    let mut lb = lb();
    lb.control.apply_policy(&b_from_a()).unwrap();
    let vip = |src: &str, port: u16, flags: u8| frame(Builder::tcp(&format!("{src}:{port}"), "10.0.0.100:80", flags));
    assert_eq!(lb.run(&vip(C, 5000, SYN)).0, Verdict::Drop(DropReason::PolicyDenied));
    assert_eq!(lb.run(&vip(A, 5000, SYN)).0, Verdict::Tx(1));
    let created = lb.worker.flows.counters.events.sessions_created;
    assert_eq!(created, 1, "the denied flow opened no session");
    // The session is the memory: its later packets pass whatever the policy says now.
    let mut deny_all = b_from_a();
    deny_all.endpoints[1].ingress.allow.clear();
    lb.control.apply_policy(&deny_all).unwrap();
    assert_eq!(lb.run(&vip(A, 5000, ACK)).0, Verdict::Tx(1));
    assert_eq!(lb.run(&vip(A, 5001, SYN)).0, Verdict::Drop(DropReason::PolicyDenied));
    assert!(lb.worker.flows.counters.drops[DropReason::PolicyDenied as usize] >= 2);
}

#[test]
fn a_pods_flow_leaving_through_snat_is_decided_when_its_session_opens() {
    let mut spec = topology();
    // Pods of 10.1.0.0/24 leave masqueraded to the ext port's address.
    spec.snat.push(SnatSpec { source: ip("10.1.0.0"), prefix_len: 24, addrs: vec![ip("10.0.0.1")], timeouts: Timeouts::default(), except: Vec::new(), outbound_only: false });
    let mut lb = Lb::new(spec);
    // Before any policy: a's flow to 198.51.100.1:443 opens (and is remembered as open).
    let (v, early) = lb.run(&frame(Builder::tcp(&format!("{A}:4100"), "198.51.100.1:443", SYN)));
    assert_eq!(v, Verdict::Tx(0));
    let early_port = u16::from_be_bytes([early[14 + 20], early[14 + 21]]);
    let mut p = b_from_a();
    // a may leave for 203.0.113.0/24 on TCP 443 only.
    p.prefixes.push((ip("203.0.113.0"), 24, 50));
    p.endpoints[0].egress = DirectionSpec {
        isolated_by: Some(0),
        allow: vec![Rule { peers: Some(vec![50]), ports: vec![Ports { proto: proto::TCP, lo: 443, hi: 443 }], action: Action::Allow, policy: 0 }],
        ..Default::default()
    };
    // and takes nothing in.
    p.endpoints[0].ingress = DirectionSpec { isolated_by: Some(0), ..Default::default() };
    lb.control.apply_policy(&p).unwrap();
    let out = |dst: &str| frame(Builder::tcp(&format!("{A}:4000"), dst, SYN));
    let (v, sent) = lb.run(&out("203.0.113.9:443"));
    assert_eq!(v, Verdict::Tx(0));
    // The same source port to a destination the policy denies: the SNAT session is the
    // source port's, the policy's decision the flow's.
    assert_eq!(lb.run(&out("203.0.113.9:80")).0, Verdict::Drop(DropReason::PolicyDenied));
    assert_eq!(lb.run(&out("198.51.100.1:443")).0, Verdict::Drop(DropReason::PolicyDenied));
    // The reply comes back; another remote using the mapping does not get in (a's ingress).
    let mapped = u16::from_be_bytes([sent[14 + 20], sent[14 + 21]]);
    let back = |src: &str| Builder::tcp(src, &format!("10.0.0.1:{mapped}"), SYN | ACK).macs(ROUTER_MAC, EXT_MAC).build();
    assert_eq!(lb.run(&back("203.0.113.9:443")).0, Verdict::Tx(1));
    assert_eq!(lb.run(&back("198.51.100.66:443")).0, Verdict::Drop(DropReason::PolicyDenied));
    // The flow a opened before the policy goes on, both ways; a new one to the same remote
    // does not.
    assert_eq!(lb.run(&frame(Builder::tcp(&format!("{A}:4100"), "198.51.100.1:443", ACK))).0, Verdict::Tx(0));
    let early_back = Builder::tcp("198.51.100.1:443", &format!("10.0.0.1:{early_port}"), ACK).macs(ROUTER_MAC, EXT_MAC).build();
    assert_eq!(lb.run(&early_back).0, Verdict::Tx(1));
    assert_eq!(lb.run(&frame(Builder::tcp(&format!("{A}:4101"), "198.51.100.1:443", SYN))).0, Verdict::Drop(DropReason::PolicyDenied));
    // c, under no policy, leaves freely.
    assert_eq!(lb.run(&frame(Builder::tcp(&format!("{C}:4000"), "198.51.100.1:80", SYN))).0, Verdict::Tx(0));
}
