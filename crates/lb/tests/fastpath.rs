//! The one-pass path for packets of existing flows (`Worker::forward_fast`) against the
//! general path: the same frames through two workers, one with it and one without, must give
//! the same verdicts, the same frames out, the same counters and the same sessions, whatever
//! the sequence (handshakes, data, FIN, RST, TTL 1, VLAN tags, IP options, frames above the
//! MTU, replies, expiry, a SYN-proxied service, a DR service).

mod common;

use common::*;
use proptest::prelude::*;
use std::net::IpAddr;
use vectorlb_lb::*;
use vectorlb_packet::builder::Builder;
use vectorlb_packet::tcp::flags::*;
use vectorlb_packet::{parse_frame, proto, Family};

/// (family, VIP port, protocol) of each service of `spec`.
const SERVICES: [(bool, u16, u8); 6] =
    [(false, 80, proto::TCP), (false, 53, proto::UDP), (false, 443, proto::TCP), (true, 53, proto::UDP), (true, 80, proto::TCP), (false, 22, proto::TCP)];

fn spec() -> LbSpec {
    let (f4, f6) = (Fam { v6: false }, Fam { v6: true });
    let mut spec = topology();
    let mut s = service(&f4, Mode::Fnat, proto::TCP, 80, &[(1, 8080, 1), (2, 8080, 1)]);
    s.timeouts.established = 3_000;
    spec.services.push(s);
    let mut s = service(&f4, Mode::Nat, proto::UDP, 53, &[(1, 53, 1)]);
    s.timeouts.udp = 1_000;
    spec.services.push(s);
    let mut s = service(&f4, Mode::Fnat, proto::TCP, 443, &[(3, 8443, 1)]);
    s.synproxy = SynProxy::On;
    spec.services.push(s);
    spec.services.push(service(&f6, Mode::Fnat, proto::UDP, 53, &[(1, 53, 1), (2, 53, 1)]));
    spec.services.push(service(&f6, Mode::Nat, proto::TCP, 80, &[(2, 8080, 1)]));
    spec.services.push(service(&f4, Mode::Dr, proto::TCP, 22, &[(2, 0, 1)]));
    spec
}

/// Variants of a client packet.
const SHAPES: usize = 6;

fn client_frame(svc: usize, cport: u16, flags: u8, shape: usize) -> Vec<u8> {
    let (v6, vport, protocol) = SERVICES[svc];
    let f = Fam { v6 };
    let (src, dst) = (f.sock(f.client(), cport), f.sock(f.vip(), vport));
    let mut b = if protocol == proto::TCP { Builder::tcp(&src, &dst, flags).seq(1000).ack(1) } else { Builder::udp(&src, &dst) };
    b = b.macs(ROUTER_MAC, EXT_MAC).payload(b"data");
    match shape {
        1 => b = b.ttl(1),
        2 => b = b.vlan(7),
        3 if !v6 => b = b.ip_options(&[1, 1, 1, 0]),
        4 => b = b.payload(&[7; 1600]),
        _ => {}
    }
    b.build()
}

/// The answer of the backend (or of the outside, for DR) to a frame the LB sent.
fn reply_to(out: &[u8], flags: u8) -> Option<Vec<u8>> {
    let info = parse_frame(out).ok()?;
    let (l3, l4) = (info.l3, info.l4);
    let addr = |at: usize| -> IpAddr {
        if info.family == Some(Family::V6) {
            IpAddr::from(<[u8; 16]>::try_from(&out[l3 + at..l3 + at + 16]).unwrap())
        } else {
            IpAddr::from(<[u8; 4]>::try_from(&out[l3 + at..l3 + at + 4]).unwrap())
        }
    };
    let (src, dst) = if info.family == Some(Family::V6) { (addr(8), addr(24)) } else { (addr(12), addr(16)) };
    let port = |at: usize| u16::from_be_bytes([out[l4 + at], out[l4 + at + 1]]);
    let sock = |a: IpAddr, p: u16| std::net::SocketAddr::new(a, p).to_string();
    let (from, to) = (sock(dst, port(2)), sock(src, port(0)));
    let b = match info.proto {
        proto::TCP => Builder::tcp(&from, &to, flags).seq(5000).ack(1001),
        proto::UDP => Builder::udp(&from, &to),
        _ => return None,
    };
    let (mut dmac, mut smac) = ([0u8; 6], [0u8; 6]);
    dmac.copy_from_slice(&out[6..12]);
    smac.copy_from_slice(&out[..6]);
    Some(b.macs(smac, dmac).payload(b"answer").build())
}

#[derive(Debug, Clone)]
enum Step {
    /// A client packet: service, client port, TCP flags (index), shape.
    Client(usize, u16, usize, usize),
    /// The backend answers the last frame the LB sent (TCP flags index).
    Reply(usize),
    /// The batch so far is processed; the clock then moves on by this many milliseconds.
    Run(u32),
}

const FLAGS: [u8; 7] = [SYN, ACK, ACK | PSH, FIN | ACK, RST, SYN | ACK, SYN | FIN];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..SERVICES.len(), 40000u16..40003, 0..FLAGS.len(), 0..SHAPES).prop_map(|(s, p, f, sh)| Step::Client(s, p, f, sh)),
        2 => (0..FLAGS.len()).prop_map(Step::Reply),
        2 => prop_oneof![Just(0u32), Just(10), Just(900), Just(2_500), Just(40_000)].prop_map(Step::Run),
    ]
}

fn sessions(w: &Worker) -> Vec<String> {
    let mut v = Vec::new();
    w.flows.table.for_each::<[u8; 4]>(0, |i, s| {
        v.push(format!("{i} {s:?}"));
        true
    });
    w.flows.table.for_each::<[u8; 16]>(0, |i, s| {
        v.push(format!("{i} {s:?}"));
        true
    });
    v
}

struct Pair {
    fast: Lb,
    general: Lb,
    last_out: Option<Vec<u8>>,
    fast_taken: u64,
}

impl Pair {
    fn new() -> Pair {
        let fast = Lb::with_capacity(spec(), 64);
        // Two workers of one control plane: one snapshot, one SYN-cookie secret.
        let mut cfg = WorkerConfig::new(64);
        cfg.table.index_entries = 128;
        let mut worker = Worker::new(fast.control.clone(), cfg).unwrap();
        worker.fast_path = false;
        let general = Lb { control: fast.control.clone(), worker, now: 1 };
        Pair { fast, general, last_out: None, fast_taken: 0 }
    }

    fn run(&mut self, frames: &[Vec<u8>], now: u32) {
        if frames.is_empty() {
            return;
        }
        let mut outs = Vec::new();
        for lb in [&mut self.fast, &mut self.general] {
            let mut bufs: Vec<HeapBuf> = frames.iter().map(|f| HeapBuf::from_frame(f)).collect();
            let mut v = vec![Verdict::Kernel; bufs.len()];
            lb.worker.process(&mut bufs, &mut v, now);
            outs.push((v, bufs.iter().map(|b| b.data().to_vec()).collect::<Vec<_>>()));
        }
        let (fv, fo) = &outs[0];
        let (gv, go) = &outs[1];
        for k in 0..frames.len() {
            assert_eq!(fv[k], gv[k], "verdict of frame {k}: {}", hex(&frames[k]));
            if matches!(fv[k], Verdict::Tx(_)) {
                assert_eq!(hex(&fo[k]), hex(&go[k]), "frame {k} out, from {}", hex(&frames[k]));
                self.last_out = Some(fo[k].clone());
            }
        }
        let mut fast = self.fast.worker.flows.counters.clone();
        assert_eq!(self.general.worker.flows.counters.events.fast_path, 0);
        self.fast_taken = fast.events.fast_path;
        fast.events.fast_path = 0;
        assert_eq!(fast, self.general.worker.flows.counters);
        assert_eq!(sessions(&self.fast.worker), sessions(&self.general.worker));
    }
}

fn play(steps: &[Step]) -> u64 {
    let mut p = Pair::new();
    let mut now = 1u32;
    let mut batch = Vec::new();
    for s in steps {
        match *s {
            Step::Client(svc, port, f, shape) => batch.push(client_frame(svc, port, FLAGS[f], shape)),
            Step::Reply(f) => {
                if let Some(r) = p.last_out.as_deref().and_then(|o| reply_to(o, FLAGS[f])) {
                    batch.push(r);
                }
            }
            Step::Run(dt) => {
                p.run(&batch, now);
                batch.clear();
                now = now.wrapping_add(dt);
            }
        }
    }
    p.run(&batch, now);
    p.fast_taken
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn fast_path_matches_general_path(steps in proptest::collection::vec(step(), 1..80)) {
        play(&steps);
    }
}

/// A fixed sequence in which the fast path is certainly taken (established TCP and UDP flows,
/// both families, NAT and full NAT) and certainly refused (TTL 1, VLAN, options, MTU, FIN,
/// RST, the SYN proxy's sessions), checked the same way.
#[test]
fn fast_path_taken_and_refused_alike() {
    let mut steps = Vec::new();
    for svc in 0..SERVICES.len() {
        for port in [40000u16, 40001] {
            steps.push(Step::Client(svc, port, 0, 0));
            steps.push(Step::Run(1));
            steps.push(Step::Reply(5));
            steps.push(Step::Run(1));
            for f in [1, 2, 2] {
                for shape in 0..SHAPES {
                    steps.push(Step::Client(svc, port, f, shape));
                }
            }
            steps.push(Step::Run(10));
            steps.push(Step::Client(svc, port, 3, 0));
            steps.push(Step::Run(10));
            steps.push(Step::Client(svc, port, 4, 0));
        }
    }
    steps.push(Step::Run(2_500));
    for svc in 0..SERVICES.len() {
        steps.push(Step::Client(svc, 40002, 1, 0));
    }
    steps.push(Step::Run(0));
    let taken = play(&steps);
    assert!(taken >= 40, "packets on the fast path: {taken}");
}
