//! The `pipeline` fuzz target's harness: the configuration, the input format, and one run of a
//! fresh `Worker` over an input with the target's checks. Shared with `examples/seeds.rs` so
//! that seeds are written in, and replayed with, exactly the target's format and setup.
//!
//! Input layout (missing bytes read as zero):
//!
//! ```text
//! byte 0      flags: bit 0: two cores (core_shift 1), bit 1: this is core 1,
//!                    bit 2: batch size 4 instead of 256 (several sub-batches per call),
//!                    bit 3: publish the second configuration (`reconfigured`) between the calls
//! bytes 1..5  now0, u32 LE: worker clock (ms) of the first process() call
//! bytes 5..9  dt, u32 LE: the second call runs at now1 = now0 + dt (wrapping)
//! byte 9      split: the first min(split, n) frames go to the first call, the rest to the second
//! then up to 32 frames, each a u16 LE length (mod 1600) followed by that many bytes (the last
//! frame is cut short if the input ends)
//! ```
//!
//! Every input gets its own `Worker`, and inputs that reconfigure their own `Control` (the
//! others share one that never changes), so no state carries over from one input to the next.

use std::sync::{Arc, OnceLock};
use vectorlb_config::Config;
use vectorlb_lb::{Control, HeapBuf, LbSpec, PacketBuf, Verdict, Worker};
use vectorlb_packet::parse_frame;

pub const CONFIG: &str = include_str!("../pipeline.toml");
pub const MAX_FRAMES: usize = 32;
pub const MAX_FRAME_LEN: usize = 1600;

pub mod flags {
    pub const TWO_CORES: u8 = 1;
    pub const CORE1: u8 = 2;
    pub const SMALL_BATCH: u8 = 4;
    pub const RECONFIGURE: u8 = 8;
}

pub struct Setup {
    pub config: Config,
    /// The control plane of inputs that do not reconfigure (never changed, so shared).
    pub control: Arc<Control>,
    /// The configuration published between the two calls when `flags::RECONFIGURE` is set.
    pub reconfigured: LbSpec,
    pub ports: u16,
}

/// `pipeline.toml` changed the way an operator might: a backend removed from the IPv4 fnat
/// (10.1.0.13, the one with weight 2) and NAT (10.1.0.12:5353) services, a DR backend drained (weight 0), the IPv6 TUN service removed, a new fnat
/// service with a new local address added (it may reuse the removed service's id), and the
/// IPv4 SNAT rule moved to another address.
fn reconfigure(spec: &LbSpec) -> LbSpec {
    let mut s = spec.clone();
    let find = |s: &LbSpec, vip: &str, port: u16| {
        let vip: std::net::IpAddr = vip.parse().unwrap();
        s.services.iter().position(|x| x.vip == vip && x.port == port).expect("service in pipeline.toml")
    };
    let fnat = find(&s, "10.0.0.100", 80);
    let removed = s.services[fnat].backends.remove(2);
    let nat = find(&s, "10.0.0.100", 53);
    s.services[nat].backends.remove(1);
    let dr = find(&s, "10.0.0.101", 80);
    s.services[dr].backends[0].weight = 0;
    let tun6 = find(&s, "2001:db8::101", 80);
    s.services.remove(tun6);
    let mut new = s.services[fnat].clone();
    new.vip = "10.0.0.104".parse().unwrap();
    new.local_addrs = vec!["10.1.0.201".parse().unwrap()];
    new.backends = vec![removed];
    new.toa = false;
    s.services.push(new);
    s.snat[0].addrs = vec!["10.0.0.201".parse().unwrap()];
    s
}

pub fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let config = Config::parse(CONFIG).expect("fuzz/pipeline.toml parses");
        let reconfigured = reconfigure(&config.spec);
        let c = Control::new(&config.spec).expect("fuzz/pipeline.toml builds");
        c.apply(&reconfigured).expect("the reconfigured spec is valid");
        let ports = config.spec.ports.len() as u16;
        let control = Control::new(&config.spec).expect("fuzz/pipeline.toml builds");
        Setup { config, control, reconfigured, ports }
    })
}

/// A decoded input.
#[derive(Debug, Clone, Default)]
pub struct Case {
    pub flags: u8,
    pub now0: u32,
    pub dt: u32,
    pub split: u8,
    pub frames: Vec<Vec<u8>>,
}

impl Case {
    pub fn decode(data: &[u8]) -> Case {
        let b = |i: usize| data.get(i).copied().unwrap_or(0);
        let mut frames = Vec::new();
        let mut rest = data.get(10..).unwrap_or(&[]);
        while frames.len() < MAX_FRAMES && rest.len() >= 2 {
            let len = u16::from_le_bytes([rest[0], rest[1]]) as usize % MAX_FRAME_LEN;
            let body = &rest[2..];
            let take = len.min(body.len());
            frames.push(body[..take].to_vec());
            rest = &body[take..];
        }
        Case { flags: b(0), now0: u32::from_le_bytes([b(1), b(2), b(3), b(4)]), dt: u32::from_le_bytes([b(5), b(6), b(7), b(8)]), split: b(9), frames }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.flags];
        out.extend_from_slice(&self.now0.to_le_bytes());
        out.extend_from_slice(&self.dt.to_le_bytes());
        out.push(self.split);
        for f in &self.frames {
            assert!(f.len() < MAX_FRAME_LEN, "frame of {} bytes does not fit the format", f.len());
            out.extend_from_slice(&(f.len() as u16).to_le_bytes());
            out.extend_from_slice(f);
        }
        out
    }
}

/// A fresh worker for an input's flags, and its control plane: the shared, never-changed one,
/// or with `flags::RECONFIGURE` a fresh one (which `run` changes between the two calls).
pub fn worker(flags: u8) -> (Arc<Control>, Worker) {
    let s = setup();
    let control = if flags & flags::RECONFIGURE != 0 { Control::new(&s.config.spec).expect("fuzz/pipeline.toml builds") } else { s.control.clone() };
    let (cores, core) = if flags & flags::TWO_CORES != 0 { (2, ((flags & flags::CORE1) != 0) as u16) } else { (1, 0) };
    let mut wc = s.config.worker_config(core, cores);
    if flags & flags::SMALL_BATCH != 0 {
        wc.batch = 4;
    }
    let w = Worker::new(control.clone(), wc).expect("worker");
    (control, w)
}

/// Every `Tx(port)` names an existing port and its frame parses.
pub fn check_tx(bufs: &[HeapBuf], verdicts: &[Verdict], now: u32) {
    let ports = setup().ports;
    for (i, (b, v)) in bufs.iter().zip(verdicts).enumerate() {
        if let Verdict::Tx(port) = *v {
            assert!(port < ports, "frame {i}: Tx({port}) but the config has {ports} ports");
            let d = b.data();
            if let Err(e) = parse_frame(d) {
                let hex: String = d.iter().map(|x| format!("{x:02x}")).collect();
                panic!("frame {i}: transmitted frame does not parse ({e:?}) at now={now}: {hex}");
            }
        }
    }
}

/// What a run did: the verdicts (first call's frames first) and the worker afterwards.
pub struct Outcome {
    pub verdicts: Vec<Verdict>,
    pub bufs: Vec<HeapBuf>,
    pub worker: Worker,
}

/// Runs an input the way the fuzz target does, with its checks (they panic):
///
/// * `process(first k frames, now0)`, then (after publishing the second configuration when
///   `flags::RECONFIGURE` is set) `process(the rest, now1)`; after each call every `Tx`
///   verdict's frame must parse;
/// * `idle(now1)` and `idle(now1 + 20 s)`, 20 s being past every timeout of `pipeline.toml`;
///   then, when the clock did not jump by 2^30 ms or more (where the wrapping comparison of
///   expiry times stops meaning "later"), the session table must be empty.
pub fn run(case: &Case) -> Outcome {
    let s = setup();
    let (control, mut worker) = worker(case.flags);
    let mut bufs: Vec<HeapBuf> = case.frames.iter().map(|f| HeapBuf::from_frame(f)).collect();
    let mut verdicts = vec![Verdict::Kernel; bufs.len()];
    let k = (case.split as usize).min(bufs.len());
    let now1 = case.now0.wrapping_add(case.dt);
    {
        let (b0, b1) = bufs.split_at_mut(k);
        let (v0, v1) = verdicts.split_at_mut(k);
        worker.process(b0, v0, case.now0);
        check_tx(b0, v0, case.now0);
        if case.flags & flags::RECONFIGURE != 0 {
            control.apply(&s.reconfigured).expect("reconfigured spec applies");
        }
        worker.process(b1, v1, now1);
        check_tx(b1, v1, now1);
    }
    // Frames for the host (ARP, ND, the rest) go through the neighbour handler, on every port
    // and one that does not exist: answers must be well-formed frames.
    let snap = worker.snapshot().clone();
    for (b, v) in bufs.iter().zip(&verdicts) {
        if *v != Verdict::Kernel {
            continue;
        }
        for port in 0..=snap.ports.len() as u16 {
            let mut c = b.clone();
            let o = vectorlb_lb::neigh::handle(&mut c, &snap, port, true);
            if o.reply {
                let d = c.data();
                let l2 = vectorlb_packet::ethernet::parse_l2(d).expect("a neighbour answer has an Ethernet header");
                if l2.ethertype == vectorlb_packet::ethernet::ethertype::ARP {
                    vectorlb_packet::arp::ArpPacket::new_checked(&d[l2.l3_offset..]).expect("ARP answer parses");
                } else {
                    vectorlb_packet::parse_frame(d).expect("neighbour advertisement parses");
                }
            }
        }
    }
    worker.idle(now1, 1000);
    worker.idle(now1.wrapping_add(20_000), 1000);
    if case.dt < 1 << 30 {
        assert_eq!(worker.flows.table.len(), 0, "sessions left after idling past every timeout (now0={} dt={})", case.now0, case.dt);
    }
    Outcome { verdicts, bufs, worker }
}
