//! The SYN proxy, packet by packet: cookies answered without a session, a valid cookie ACK
//! turned into the backend's SYN, the splice, and the translation of sequence numbers, SACK
//! blocks, timestamps and windows in both directions; forged cookies, early data, a refusing
//! backend, clients without options, and `auto`. NAT and full NAT, IPv4 and IPv6. Every frame
//! the proxy writes has its checksums verified.

mod common;

use common::*;
use vectorlb_lb::session::state;
use vectorlb_lb::synproxy::{scan, Opts, WSCALE};
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::checksum;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::*;

/// A TCP segment as it leaves the LB.
#[derive(Debug)]
struct Seg {
    src: String,
    dst: String,
    seq: u32,
    ack: u32,
    flags: u8,
    win: u16,
    opts: Opts,
    payload: Vec<u8>,
    sack: Vec<u32>,
}

/// Parses a frame the LB sent and checks its IP and TCP checksums.
fn seg(frame: &[u8]) -> Seg {
    let i = vectorlb_packet::parse_frame(frame).expect("a frame that parses");
    assert_eq!(i.proto, proto::TCP);
    let ip = &frame[i.l3..i.end];
    let t = &frame[i.l4..i.end];
    let v6 = ip[0] >> 4 == 6;
    let (src, dst, pseudo) = if v6 {
        let s: [u8; 16] = ip[8..24].try_into().unwrap();
        let d: [u8; 16] = ip[24..40].try_into().unwrap();
        (std::net::Ipv6Addr::from(s).to_string(), std::net::Ipv6Addr::from(d).to_string(), checksum::pseudo_v6(&s, &d, proto::TCP, t.len() as u32))
    } else {
        assert_eq!(checksum::checksum(&ip[..20]), 0, "IPv4 header checksum");
        let s: [u8; 4] = ip[12..16].try_into().unwrap();
        let d: [u8; 4] = ip[16..20].try_into().unwrap();
        (std::net::Ipv4Addr::from(s).to_string(), std::net::Ipv4Addr::from(d).to_string(), checksum::pseudo_v4(s, d, proto::TCP, t.len() as u16))
    };
    assert_eq!(checksum::finish(checksum::accumulate(pseudo, t)), 0, "TCP checksum");
    let doff = (t[12] >> 4) as usize * 4;
    let opts = scan(t, doff);
    let sack = match opts.sack {
        Some((at, n)) => (0..n * 2).map(|k| u32::from_be_bytes(t[at + 4 * k..at + 4 * k + 4].try_into().unwrap())).collect(),
        None => vec![],
    };
    let port = |at: usize| u16::from_be_bytes([t[at], t[at + 1]]);
    let sock = |a: &str, p: u16| if v6 { format!("[{a}]:{p}") } else { format!("{a}:{p}") };
    Seg {
        src: sock(&src, port(0)),
        dst: sock(&dst, port(2)),
        seq: u32::from_be_bytes(t[4..8].try_into().unwrap()),
        ack: u32::from_be_bytes(t[8..12].try_into().unwrap()),
        flags: t[13],
        win: port(14),
        opts,
        payload: t[doff..].to_vec(),
        sack,
    }
}

const MSS_1460: [u8; 4] = [2, 4, 0x05, 0xb4];

fn ts(val: u32, ecr: u32) -> Vec<u8> {
    let mut o = vec![1, 1, 8, 10];
    o.extend_from_slice(&val.to_be_bytes());
    o.extend_from_slice(&ecr.to_be_bytes());
    o
}

/// A Linux-like SYN's options: MSS 1460, SACK permitted, timestamp, window scale `ws`.
fn syn_opts(tsval: u32, ws: u8) -> Vec<u8> {
    let mut o = MSS_1460.to_vec();
    o.extend_from_slice(&[4, 2, 8, 10]);
    o.extend_from_slice(&tsval.to_be_bytes());
    o.extend_from_slice(&[0, 0, 0, 0, 1, 3, 3, ws]);
    o
}

fn proxied(f: &Fam, mode: Mode, sp: SynProxy) -> Lb {
    let mut spec = topology();
    let mut s = service(f, mode, proto::TCP, 80, &[(1, 8080, 1)]);
    s.synproxy = sp;
    spec.services.push(s);
    Lb::new(spec)
}

fn tx(lb: &mut Lb, b: Builder, port: u16) -> Seg {
    let (v, out) = lb.run(&b.build());
    assert_eq!(v, Verdict::Tx(port), "verdict");
    seg(&out)
}

fn session_state(lb: &Lb, v6: bool) -> Vec<&'static str> {
    let mut v = Vec::new();
    let mut f = |_: usize, st: u8| {
        v.push(state::name(st));
        true
    };
    if v6 {
        lb.worker.flows.table.for_each::<[u8; 16]>(0, |i, s| f(i, s.state));
    } else {
        lb.worker.flows.table.for_each::<[u8; 4]>(0, |i, s| f(i, s.state));
    }
    v
}

/// The whole life of a proxied connection with every option, in one mode and family.
fn connection(f: &Fam, mode: Mode) {
    let mut lb = proxied(f, mode, SynProxy::On);
    let (c, v, be, _) = f.flow();
    let from_client = |fl: u8| Builder::tcp(&c, &v, fl).macs(ROUTER_MAC, EXT_MAC);
    // 1. The SYN is answered from the LB; nothing is stored.
    let sa = tx(&mut lb, from_client(SYN).seq(1000).window(64240).tcp_options(&syn_opts(100, 9)), 0);
    assert_eq!((sa.src.as_str(), sa.dst.as_str()), (v.as_str(), c.as_str()));
    assert_eq!((sa.flags, sa.ack), (SYN | ACK, 1001));
    let (our_ts, echo, _) = sa.opts.ts.expect("a timestamp");
    assert_eq!(echo, 100);
    assert_eq!((sa.opts.wscale, sa.opts.sack_ok), (Some(WSCALE), true));
    assert_eq!(sa.opts.mss, Some(if f.v6 { 1440 } else { 1460 }), "the client-facing MTU's MSS");
    assert_eq!(lb.worker.flows.table.len(), 0, "no session for a SYN");
    assert_eq!(lb.worker.flows.counters.events.syncookies_sent, 1);
    let cookie = sa.seq;
    // 2. The client's ACK returns the cookie: the backend gets a SYN with the client's ISN and
    //    options.
    let syn = tx(&mut lb, from_client(ACK).seq(1001).ack(cookie.wrapping_add(1)).window(502).tcp_options(&ts(101, our_ts)), 1);
    assert_eq!(syn.flags, SYN);
    assert_eq!((syn.seq, syn.win), (1000, 502));
    assert_eq!(syn.dst, be);
    let expected_src = if mode == Mode::Fnat { f.laddr() } else { f.client() };
    assert!(syn.src.contains(expected_src), "{} from {expected_src}", syn.src);
    assert_eq!((syn.opts.mss, syn.opts.wscale, syn.opts.sack_ok), (Some(1460), Some(9), true));
    assert_eq!(syn.opts.ts.map(|t| (t.0, t.1)), Some((101, 0)));
    assert_eq!(lb.worker.flows.table.half_open(), 1);
    assert_eq!(lb.worker.flows.counters.events.syncookies_valid, 1);
    // The client's first data meanwhile is held for the backend; more is dropped (the client
    // retransmits it).
    let early = from_client(ACK | PSH).seq(1001).ack(cookie.wrapping_add(1)).tcp_options(&ts(102, our_ts)).payload(b"GET /");
    lb.expect_drop(&early.clone().build(), DropReason::SynproxyHeld);
    lb.expect_drop(&early.build(), DropReason::SynproxyPending);
    lb.expect_drop(&from_client(ACK | PSH).seq(1006).ack(cookie.wrapping_add(1)).payload(b"more").build(), DropReason::SynproxyPending);
    // 3. The backend answers: the LB completes its handshake; the client sees nothing.
    let from_backend = |fl: u8| Builder::tcp(&be, &syn.src, fl).macs(be_mac(1), INT_MAC);
    let mut bopts = MSS_1460.to_vec();
    bopts.extend_from_slice(&[4, 2]);
    bopts.extend_from_slice(&ts(7000, 101)[2..]);
    bopts.extend_from_slice(&[1, 3, 3, 5]);
    let ack = tx(&mut lb, from_backend(SYN | ACK).seq(5000).ack(1001).tcp_options(&bopts), 1);
    assert_eq!((ack.src.as_str(), ack.dst.as_str()), (syn.src.as_str(), be.as_str()));
    // The ACK completing the backend's handshake carries the held data.
    assert_eq!((ack.flags, ack.seq, ack.ack, ack.win), (ACK | PSH, 1001, 5001, 502));
    assert_eq!(ack.payload, b"GET /");
    assert_eq!(ack.opts.ts.map(|t| (t.0, t.1)), Some((102, 7000)));
    assert_eq!((lb.worker.flows.counters.events.synproxy_held, lb.worker.flows.counters.events.synproxy_held_sent), (1, 1));
    assert_eq!(session_state(&lb, f.v6), ["established"]);
    assert_eq!(lb.worker.flows.table.half_open(), 0);
    assert_eq!(lb.worker.flows.counters.events.synproxy_spliced, 1);
    // 4. Client to backend: acknowledgements, SACK blocks and timestamp echoes move into the
    //    backend's numbers; the client's own sequence numbers stay.
    let delta = 5000u32.wrapping_sub(cookie);
    let mut copts = ts(102, our_ts.wrapping_add(3));
    copts.extend_from_slice(&[1, 1, 5, 10]);
    copts.extend_from_slice(&cookie.wrapping_add(10).to_be_bytes());
    copts.extend_from_slice(&cookie.wrapping_add(20).to_be_bytes());
    let d = tx(&mut lb, from_client(ACK | PSH).seq(1001).ack(cookie.wrapping_add(1)).tcp_options(&copts).payload(b"GET /"), 1);
    assert_eq!((d.seq, d.ack, d.payload.as_slice()), (1001, 5001, &b"GET /"[..]));
    assert_eq!(d.sack, [cookie.wrapping_add(10).wrapping_add(delta), cookie.wrapping_add(20).wrapping_add(delta)]);
    assert_eq!(d.opts.ts.map(|t| (t.0, t.1)), Some((102, 7003)));
    // 5. Backend to client: sequence numbers and timestamps move into the proxy's; the window
    //    is rescaled from the backend's scale (5) to the announced one (7).
    let r = tx(&mut lb, from_backend(ACK | PSH).seq(5001).ack(1006).window(1000).tcp_options(&ts(7005, 102)).payload(b"200 OK"), 0);
    assert_eq!((r.src.as_str(), r.dst.as_str()), (v.as_str(), c.as_str()));
    assert_eq!((r.seq, r.ack), (cookie.wrapping_add(1), 1006));
    assert_eq!(r.opts.ts.map(|t| (t.0, t.1)), Some((our_ts.wrapping_add(5), 102)));
    assert_eq!(r.win, 1000 * 32 / 128);
    assert_eq!(r.payload, b"200 OK");
    // 6. The close runs through the usual state machine.
    tx(&mut lb, from_client(FIN | ACK).seq(1006).ack(cookie.wrapping_add(7)), 1);
    tx(&mut lb, from_backend(FIN | ACK).seq(5007).ack(1007), 0);
    tx(&mut lb, from_client(ACK).seq(1007).ack(cookie.wrapping_add(8)), 1);
    assert_eq!(session_state(&lb, f.v6), ["time_wait"]);
}

#[test]
fn a_proxied_connection_through_nat_and_full_nat_over_ipv4_and_ipv6() {
    for v6 in [false, true] {
        for mode in [Mode::Nat, Mode::Fnat] {
            eprintln!("{mode:?} v6={v6}");
            connection(&Fam { v6 }, mode);
        }
    }
}

#[test]
fn forged_and_stale_cookies_open_nothing() {
    let f = Fam { v6: false };
    let mut lb = proxied(&f, Mode::Fnat, SynProxy::On);
    let (c, v, _, _) = f.flow();
    let sa = tx(&mut lb, Builder::tcp(&c, &v, SYN).seq(1000).macs(ROUTER_MAC, EXT_MAC), 0);
    // Another sequence number, another port, a guessed cookie.
    for b in [
        Builder::tcp(&c, &v, ACK).seq(1001 + 0x10000).ack(sa.seq.wrapping_add(1)),
        Builder::tcp(&f.sock(f.client(), 40001), &v, ACK).seq(1001).ack(sa.seq.wrapping_add(1)),
        Builder::tcp(&c, &v, ACK).seq(1001).ack(sa.seq.wrapping_add(0x0100_0001)),
    ] {
        lb.expect_drop(&b.macs(ROUTER_MAC, EXT_MAC).build(), DropReason::BadSyncookie);
    }
    // The right cookie, five minutes late.
    lb.now += 5 * 60_000;
    lb.expect_drop(&Builder::tcp(&c, &v, ACK).seq(1001).ack(sa.seq.wrapping_add(1)).macs(ROUTER_MAC, EXT_MAC).build(), DropReason::BadSyncookie);
    assert_eq!(lb.worker.flows.table.len(), 0);
    assert_eq!(lb.worker.flows.counters.dropped(DropReason::BadSyncookie), 4);
    // Malformed options in a SYN: answered without them, nothing read outside the header.
    let sa = tx(&mut lb, Builder::tcp(&c, &v, SYN).seq(7).tcp_options(&[2, 4, 1, 0, 8, 40, 0, 0]).macs(ROUTER_MAC, EXT_MAC), 0);
    assert_eq!((sa.opts.ts, sa.opts.wscale), (None, None));
}

#[test]
fn a_client_without_options_and_a_refusing_backend() {
    for v6 in [false, true] {
        let f = Fam { v6 };
        let mut lb = proxied(&f, Mode::Nat, SynProxy::On);
        let (c, v, be, _) = f.flow();
        let sa = tx(&mut lb, Builder::tcp(&c, &v, SYN).seq(9).macs(ROUTER_MAC, EXT_MAC), 0);
        // Without a timestamp the cookie carries the MSS only; no scaling, no SACK offered.
        assert_eq!((sa.opts.mss.is_some(), sa.opts.ts, sa.opts.wscale, sa.opts.sack_ok), (true, None, None, false));
        let syn = tx(&mut lb, Builder::tcp(&c, &v, ACK).seq(10).ack(sa.seq.wrapping_add(1)).macs(ROUTER_MAC, EXT_MAC), 1);
        assert_eq!((syn.opts.mss, syn.opts.ts, syn.opts.wscale, syn.opts.sack_ok), (Some(536), None, None, false));
        // The backend refuses: the client gets a reset it accepts (in its window).
        let rst = tx(&mut lb, Builder::tcp(&be, &c, RST | ACK).seq(0).ack(10).macs(be_mac(1), INT_MAC), 0);
        assert_eq!((rst.flags & RST, rst.seq, rst.src.as_str()), (RST, sa.seq.wrapping_add(1), v.as_str()));
        assert_eq!(session_state(&lb, v6), ["close"]);
    }
}

#[test]
fn auto_engages_at_its_half_open_threshold_and_established_flows_keep_going() {
    let f = Fam { v6: false };
    let mut lb = proxied(&f, Mode::Fnat, SynProxy::Auto { half_open: 3 });
    let v = f.sock(f.vip(), 80);
    // Three SYNs open sessions (forwarded to the backend); the fourth meets the threshold.
    for p in 0..3u16 {
        tx(&mut lb, Builder::tcp(&f.sock(f.client(), 41000 + p), &v, SYN).seq(1).macs(ROUTER_MAC, EXT_MAC), 1);
    }
    assert_eq!(lb.worker.flows.table.half_open(), 3);
    let sa = tx(&mut lb, Builder::tcp(&f.sock(f.client(), 41003), &v, SYN).seq(1).macs(ROUTER_MAC, EXT_MAC), 0);
    assert_eq!(sa.flags, SYN | ACK);
    assert_eq!(lb.worker.flows.table.len(), 3);
    // A session-less ACK is checked as a cookie even when not engaged.
    let syn = tx(&mut lb, Builder::tcp(&f.sock(f.client(), 41003), &v, ACK).seq(2).ack(sa.seq.wrapping_add(1)).macs(ROUTER_MAC, EXT_MAC), 1);
    assert_eq!(syn.flags, SYN);
    assert_eq!(lb.worker.flows.table.half_open(), 4);
}

#[test]
fn configuration_refuses_the_proxy_where_it_cannot_work() {
    let f = Fam { v6: false };
    for (mode, p) in [(Mode::Dr, proto::TCP), (Mode::Tun, proto::TCP), (Mode::Nat, proto::UDP)] {
        let mut spec = topology();
        let mut s = service(&f, mode, p, 80, &[(1, if matches!(mode, Mode::Dr | Mode::Tun) { 0 } else { 8080 }, 1)]);
        s.synproxy = SynProxy::On;
        spec.services.push(s);
        let e = Control::new(&spec).err().expect("refused").to_string();
        assert!(e.contains("synproxy"), "{e}");
    }
}
