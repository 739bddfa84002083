//! The worker loop over the in-memory side of the I/O seam: no NIC, no DPDK. Forwarding by
//! verdict, transmit queues that refuse, frames the worker builds, hand-off of a reply to the
//! worker that owns its local port, and every buffer back in its pool at the end.

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use vectorlb_config::QueueSetSpec;
use vectorlb_daemon::ha::{Ha, STANDALONE};
use vectorlb_daemon::queue_sets::QueueSets;
use vectorlb_daemon::worker::{PortQueues, WorkerIo, WorkerLoop, WorkerShared};
use vectorlb_daemon::workers::{Event, WorkerMsg, Workers};
use vectorlb_io::mem::{self, MemPacket, Pool};
use vectorlb_io::{PacketBuf, PacketPool, RxQueue, TxQueue};
use vectorlb_lb::{BackendSpec, Control, LbSpec, Mode, PortSpec, RouteSpec, ServiceSpec, Timeouts, Worker, WorkerConfig};
use vectorlb_packet::builder::Builder;
use vectorlb_packet::{parse_frame, proto};
use vectorlb_sched::Algorithm;

const ROUTER: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
const EXT: [u8; 6] = [2, 0, 0, 0, 0, 1];
const INT: [u8; 6] = [2, 0, 0, 0, 1, 1];
const BE: [u8; 6] = [2, 0, 0, 0, 1, 0x11];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Client side on port 0, one backend on port 1; full NAT for UDP 10.0.0.100:53 and :11211.
fn spec() -> LbSpec {
    let port = |name: &str, mac, addr: &str, len| PortSpec { name: name.into(), mac, addrs: vec![(ip(addr), len)], vlan: None, mtu: 1500 };
    let svc = |p: u16| ServiceSpec {
        vip: ip("10.0.0.100"),
        port: p,
        proto: proto::UDP,
        mode: Mode::Fnat,
        scheduler: Algorithm::Rr,
        backends: vec![BackendSpec { addr: ip("10.1.0.11"), port: p, weight: 1, quic_id: None }],
        local_addrs: vec![ip("10.1.0.200")],
        peer_local_addrs: vec![],
        toa: false,
        synproxy: Default::default(),
        timeouts: Timeouts::default(),
        continuation: false,
        quic: false,
        affinity_ms: 0,
        keep_source: Vec::new(),
    };
    LbSpec {
        ports: vec![port("ext", EXT, "10.0.0.1", 24), port("int", INT, "10.1.0.1", 24)],
        routes: vec![RouteSpec { prefix: ip("0.0.0.0"), len: 0, port: 0, via: ip("10.0.0.254") }],
        neighbors: vec![(ip("10.0.0.254"), ROUTER), (ip("10.1.0.11"), BE)],
        services: vec![svc(53), svc(11211)],
        snat: vec![],
        icmp_rate: 1000,
        cluster_key: 0,
        host_addrs: Vec::new(),
    }
}

/// The test's ends of one port: where it puts received frames, where it finds sent ones.
struct Wire {
    to_worker: mem::Sender<MemPacket>,
    from_worker: mem::Receiver<MemPacket>,
}

struct Harness {
    sets: Arc<arc_swap::ArcSwap<QueueSets>>,
    pool: Pool,
    wires: Vec<Vec<Wire>>,
    loops: Vec<WorkerLoop<MemPacket>>,
    events: mpsc::Receiver<Event>,
    msgs: Vec<mpsc::Sender<WorkerMsg>>,
}

/// `n` workers on two ports; `tx_room` packets fit each transmit queue.
fn harness(n: u16, tx_room: usize) -> Harness {
    harness_with(n, tx_room, &[])
}

/// The same with queue sets.
fn harness_with(n: u16, tx_room: usize, queue_sets: &[QueueSetSpec]) -> Harness {
    let sets = Arc::new(arc_swap::ArcSwap::new(QueueSets::new(queue_sets, n)));
    let pool = Pool::default();
    let control = Control::new(&spec()).unwrap();
    let (ev_tx, events) = mpsc::channel();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..n {
        let (tx, rx) = mpsc::channel();
        senders.push(tx);
        receivers.push(rx);
    }
    let workers = Arc::new(Workers::new(senders.clone()));
    let rings: Vec<_> = (0..n).map(|w| mem::channel::<MemPacket>(64, w)).collect();
    let mut inboxes: Vec<Option<mem::Receiver<MemPacket>>> = Vec::new();
    let mut outboxes = Vec::new();
    for (tx, rx) in rings {
        outboxes.push(tx);
        inboxes.push(Some(rx));
    }
    let mut wires = Vec::new();
    let mut loops = Vec::new();
    for (w, msgs) in receivers.into_iter().enumerate() {
        let mut ports = Vec::new();
        let mut my_wires = Vec::new();
        for _ in 0..2 {
            let (to_worker, rx) = mem::channel(256, w as u16);
            let (tx, from_worker) = mem::channel(tx_room, w as u16);
            ports.push(PortQueues { rx: Box::new(rx) as Box<dyn RxQueue<MemPacket>>, tx: Box::new(tx) as Box<dyn TxQueue<MemPacket>>, forward: false });
            my_wires.push(Wire { to_worker, from_worker });
        }
        let io = WorkerIo {
            ports,
            inbox: if n > 1 { inboxes[w].take().map(|r| Box::new(r) as Box<dyn RxQueue<MemPacket>>) } else { None },
            peers: outboxes.iter().enumerate().map(|(v, t)| (v != w && n > 1).then(|| Box::new(t.clone()) as Box<dyn TxQueue<MemPacket>>)).collect(),
            pool: Arc::new(pool.clone()) as Arc<dyn PacketPool<MemPacket>>,
        };
        let mut cfg = WorkerConfig::new(1000);
        cfg.table.core = w as u16;
        cfg.table.cores = n;
        cfg.table.core_shift = (n as u32).next_power_of_two().trailing_zeros() as u8;
        let worker = Worker::new(control.clone(), cfg).unwrap();
        let shared = WorkerShared {
            workers: workers.clone(),
            ha: Arc::new(Ha::new(STANDALONE)),
            stop: Arc::new(AtomicBool::new(false)),
            hold: Arc::new(AtomicBool::new(false)),
            idle_sleep_us: 0,
            changes: None,
            sync: None,
            queue_sets: Some(sets.clone()),
        };
        loops.push(WorkerLoop::new(w as u16, io, worker, shared, msgs, ev_tx.clone()));
        wires.push(my_wires);
    }
    Harness { sets, pool, wires, loops, events, msgs: senders }
}

impl Harness {
    fn inject(&self, w: usize, port: usize, frame: &[u8]) {
        let mut v = vec![self.pool.packet(port as u16, frame).unwrap()];
        assert_eq!(self.wires[w][port].to_worker.clone().send(&mut v), 1);
    }

    fn sent(&mut self, w: usize, port: usize) -> Vec<Vec<u8>> {
        self.wires[w][port].from_worker.drain().iter().map(|p| p.data().to_vec()).collect()
    }
}

fn dst(f: &[u8]) -> (IpAddr, u16) {
    let p = parse_frame(f).unwrap();
    let a: [u8; 4] = f[p.l3 + 16..p.l3 + 20].try_into().unwrap();
    (IpAddr::from(a), u16::from_be_bytes([f[p.l4 + 2], f[p.l4 + 3]]))
}

fn src(f: &[u8]) -> (IpAddr, u16) {
    let p = parse_frame(f).unwrap();
    let a: [u8; 4] = f[p.l3 + 12..p.l3 + 16].try_into().unwrap();
    (IpAddr::from(a), u16::from_be_bytes([f[p.l4], f[p.l4 + 1]]))
}

#[test]
fn forwards_by_verdict_counts_full_queues_and_returns_every_buffer() {
    let mut h = harness(1, 2);
    let query = |sport: u16| Builder::udp(&format!("198.51.100.7:{sport}"), "10.0.0.100:53").payload(b"q").macs(ROUTER, EXT).build();
    h.inject(0, 0, &query(4000));
    assert_eq!(h.loops[0].poll(1), 1);
    let out = h.sent(0, 1);
    assert_eq!(out.len(), 1, "client to backend leaves on the backend's port");
    assert_eq!(dst(&out[0]), (ip("10.1.0.11"), 53));
    assert_eq!(src(&out[0]).0, ip("10.1.0.200"), "full NAT: from the local address");
    // The backend answers to the local port: back to the client, from the VIP.
    let lport = src(&out[0]).1;
    let reply = Builder::udp("10.1.0.11:53", &format!("10.1.0.200:{lport}")).payload(b"a").macs(BE, INT).build();
    h.inject(0, 1, &reply);
    h.loops[0].poll(2);
    let back = h.sent(0, 0);
    assert_eq!(back.len(), 1);
    assert_eq!((src(&back[0]), dst(&back[0])), ((ip("10.0.0.100"), 53), (ip("198.51.100.7"), 4000)));
    // Five flows at once into a transmit queue with room for two: two leave, three are
    // dropped and counted, and none is lost track of.
    for p in 0..5 {
        h.inject(0, 0, &query(5000 + p));
    }
    h.loops[0].poll(3);
    assert_eq!(h.sent(0, 1).len(), 2);
    assert_eq!(h.loops[0].counters().tx_full, 3);
    // A frame the daemon asks the worker to send (an ARP request, say) goes out on its port.
    h.msgs[0].send(WorkerMsg::Send { port: 0, frame: query(6000) }).unwrap();
    h.msgs[0].send(WorkerMsg::Send { port: 9, frame: query(6001) }).unwrap();
    h.loops[0].messages();
    assert_eq!(h.sent(0, 0).len(), 1);
    assert_eq!(h.loops[0].counters().send_failed, 1, "no port 9");
    let w = &h.loops[0].worker().flows.counters;
    assert_eq!((w.events.rx, w.events.tx), (7, 7), "the pipeline decided Tx for all; the full queue dropped three: {w:?}");
    drop(h.loops);
    assert_eq!(h.pool.stats().in_use(), 0, "every buffer went back to its pool");
    assert!(h.events.try_recv().is_err());
}

#[test]
fn a_reply_to_another_workers_local_port_is_handed_to_it() {
    let mut h = harness(2, 64);
    // A flow opened on worker 0 takes one of worker 0's local ports (even ones).
    let q = Builder::udp("198.51.100.7:4000", "10.0.0.100:53").payload(b"q").macs(ROUTER, EXT).build();
    h.inject(0, 0, &q);
    h.loops[0].poll(1);
    let out = h.sent(0, 1);
    let lport = src(&out[0]).1;
    assert_eq!(lport % 2, 0, "worker 0 of 2 owns the even ports");
    // Its reply arrives on worker 1 (RSS does not know our ports): worker 1 hands it over.
    let reply = Builder::udp("10.1.0.11:53", &format!("10.1.0.200:{lport}")).payload(b"a").macs(BE, INT).build();
    h.inject(1, 1, &reply);
    h.loops[1].poll(2);
    assert_eq!(h.loops[1].counters().handed_off, 1);
    assert_eq!(h.loops[1].worker().flows.counters.events.handoff, 1);
    assert!(h.sent(1, 0).is_empty(), "worker 1 does not answer for worker 0's session");
    h.loops[0].poll(3);
    let back = h.sent(0, 0);
    assert_eq!(back.len(), 1, "worker 0 sends the reply to the client");
    assert_eq!(dst(&back[0]), (ip("198.51.100.7"), 4000));
    assert_eq!(h.loops[0].worker().flows.counters.dropped(vectorlb_lb::DropReason::Misdirected), 0);
    drop(h.loops);
    assert_eq!(h.pool.stats().in_use(), 0);
}

/// The set "mc": UDP 10.0.0.100:11211 on the given workers.
fn mc(workers: &[u16]) -> QueueSetSpec {
    QueueSetSpec { name: "mc".into(), services: vec![(ip("10.0.0.100"), 11211, proto::UDP)], workers: workers.to_vec(), rate: None, busy_poll: true }
}

fn query(dport: u16, sport: u16) -> Vec<u8> {
    Builder::udp(&format!("198.51.100.7:{sport}"), &format!("10.0.0.100:{dport}")).payload(b"q").macs(ROUTER, EXT).build()
}

impl Harness {
    /// Polls every worker a few rounds (hand-offs take one more).
    fn settle(&mut self) {
        for now in 10..14 {
            for l in &mut self.loops {
                l.poll(now);
            }
        }
    }

    /// Destination ports of what worker `w` sent to the backends.
    fn sent_to_backends(&mut self, w: usize) -> Vec<u16> {
        self.sent(w, 1).iter().map(|f| dst(f).1).collect()
    }
}

#[test]
fn a_sets_traffic_reaches_its_workers_and_no_other() {
    // Three workers; the set "mc" has worker 2. Packets of both services arrive everywhere.
    let mut h = harness_with(3, 256, &[mc(&[2])]);
    for w in 0..3 {
        for i in 0..10 {
            h.inject(w, 0, &query(11211, 7000 + (w * 10 + i) as u16));
            h.inject(w, 0, &query(53, 8000 + (w * 10 + i) as u16));
        }
    }
    h.settle();
    let out: Vec<Vec<u16>> = (0..3).map(|w| h.sent_to_backends(w)).collect();
    assert!(out[2].iter().all(|p| *p == 11211) && out[2].len() == 30, "worker 2 sent only and all of the set's: {:?}", out[2]);
    assert!(out[0].iter().chain(&out[1]).all(|p| *p == 53), "the default workers sent none of the set's");
    assert_eq!(out[0].len() + out[1].len(), 30, "and every default packet");
    assert!(!out[0].is_empty() && !out[1].is_empty(), "the default flows spread over both default workers");
    // Worker 2 handed its 10 default packets on; workers 0 and 1 their 10 set packets and
    // some default ones (the flow's hash picks the default worker).
    assert_eq!(h.loops[2].counters().steered, 10);
    assert!(h.loops[0].counters().steered >= 10 && h.loops[1].counters().steered >= 10);
    let handoff_full: u64 = h.loops.iter().map(|l| l.counters().handoff_full).sum();
    assert_eq!(handoff_full, 0);
    drop(h.loops);
    assert_eq!(h.pool.stats().in_use(), 0);
}

#[test]
fn a_flood_of_the_default_set_does_not_drop_the_sets_packets() {
    // Worker 0 (default) gets a flood larger than its transmit queue takes; the set's packets
    // arrive on the same queue and on the set's own worker 1.
    let mut h = harness_with(2, 64, &[mc(&[1])]);
    for round in 0..5u16 {
        for i in 0..200u16 {
            h.inject(0, 0, &query(53, 10_000 + round * 200 + i));
        }
        for i in 0..20u16 {
            h.inject(0, 0, &query(11211, 20_000 + round * 40 + i));
            h.inject(1, 0, &query(11211, 20_020 + round * 40 + i));
        }
        h.settle();
        let set: Vec<u16> = h.sent_to_backends(1);
        assert_eq!(set.len(), 40, "round {round}: every set packet left");
        h.sent_to_backends(0);
    }
    assert!(h.loops[0].counters().tx_full > 0, "the flood overflowed the default worker's queue");
    let c1 = h.loops[1].counters();
    assert_eq!((c1.tx_full, c1.handoff_full, c1.rate_limited), (0, 0, 0), "the set's worker dropped nothing");
    assert_eq!(h.loops[1].worker().flows.counters.events.rx, 200, "and saw none of the flood");
    drop(h.loops);
    assert_eq!(h.pool.stats().in_use(), 0);
}

#[test]
fn a_reload_that_adds_or_removes_a_set_keeps_every_session() {
    // Worker 0 and 1, no sets: a flow of the mc service lives where it arrived (worker 0).
    let mut h = harness(2, 256);
    h.inject(0, 0, &query(11211, 7000));
    h.settle();
    let first = h.sent(0, 1);
    assert_eq!(first.len(), 1);
    let lport = src(&first[0]).1;
    // The set "mc" on worker 1 appears: the existing flow stays on worker 0 with its session
    // (the same local port); a new flow goes to worker 1.
    h.sets.store(QueueSets::new(&[mc(&[1])], 2));
    h.inject(0, 0, &query(11211, 7000));
    h.inject(0, 0, &query(11211, 7001));
    h.settle();
    let w0 = h.sent(0, 1);
    assert_eq!(w0.len(), 1, "the old flow, still on worker 0");
    assert_eq!(src(&w0[0]).1, lport, "with its session's local port");
    assert_eq!(h.loops[0].counters().kept_for_session, 1);
    let w1 = h.sent(1, 1);
    assert_eq!(w1.len(), 1, "the new flow went to the set's worker");
    let lport1 = src(&w1[0]).1;
    // The set goes away again: nothing is steered any more, and each flow's packets, arriving
    // on the worker that holds its session (as RSS keeps them), keep their local ports.
    h.sets.store(QueueSets::new(&[], 2));
    h.inject(1, 0, &query(11211, 7001));
    h.inject(0, 0, &query(11211, 7000));
    h.settle();
    assert_eq!(src(&h.sent(1, 1)[0]).1, lport1);
    assert_eq!(src(&h.sent(0, 1)[0]).1, lport);
    drop(h.loops);
    assert_eq!(h.pool.stats().in_use(), 0);
}

#[test]
fn a_sets_egress_limit_drops_and_counts_the_excess() {
    // 1,000 packets/s with a 10 ms burst: 10 packets at once; 50 offered at once.
    let mut set = mc(&[1]);
    set.rate = Some(vectorlb_config::RateSpec { bps: None, pps: Some(1000), burst_ms: 10 });
    let mut h = harness_with(2, 256, &[set]);
    for i in 0..50u16 {
        h.inject(1, 0, &query(11211, 9000 + i));
    }
    h.loops[1].poll(1);
    let sent = h.sent_to_backends(1).len();
    let limited = h.loops[1].counters().rate_limited;
    assert!((10..=11).contains(&sent), "{sent} sent");
    assert_eq!(sent as u64 + limited, 50);
    // The default set has no limit.
    for i in 0..50u16 {
        h.inject(0, 0, &query(53, 9000 + i));
    }
    h.loops[0].poll(2);
    assert_eq!(h.sent_to_backends(0).len(), 50);
    drop(h.loops);
    assert_eq!(h.pool.stats().in_use(), 0);
}

#[test]
fn a_sets_workers_time_their_queues_and_measure_their_depth() {
    use vectorlb_daemon::queue_sets::{DEPTH_BOUNDS, TIME_BOUNDS_NS};
    // Worker 1 serves the set. 100 of the set's packets wait on its port queue: the first
    // receive takes a burst (64) and sees 36 more waiting (the in-memory queue can tell).
    let mut h = harness_with(2, 256, &[mc(&[1])]);
    h.loops[1].poll(10);
    for i in 0..100u16 {
        h.inject(1, 0, &query(11211, 30_000 + i));
    }
    std::thread::sleep(std::time::Duration::from_millis(3));
    h.loops[1].poll(11);
    let q = *h.loops[1].queue_stats();
    assert_eq!(q.wait.count(), 64, "every packet received is timed");
    assert_eq!(q.depth.count(), 1, "one receive found packets");
    assert_eq!(q.depth.quantile_bound(&DEPTH_BOUNDS, 0.5), Some(128), "100 waiting: the bucket up to 128");
    assert_eq!(q.depth.sum, 100);
    // They waited at least the 3 ms since the previous round began (bucket up to 5 ms, or
    // later on a loaded machine), and every packet received was also timed to its transmit.
    let wait = q.wait.quantile_bound(&TIME_BOUNDS_NS, 0.5);
    assert!(wait.is_none_or(|w| w >= 5_000_000), "wait bucket {wait:?}");
    assert!(q.wait.sum >= 64 * 3_000_000);
    assert_eq!(q.residence.count(), 64);
    h.loops[1].poll(12);
    let q = *h.loops[1].queue_stats();
    assert_eq!((q.wait.count(), q.residence.count(), q.depth.count()), (100, 100, 2));
    assert_eq!(q.depth.sum, 136, "the second receive found the 36 left");
    assert_eq!(h.sent_to_backends(1).len(), 100);
    // Without sets nothing is timed.
    let mut plain = harness(1, 256);
    plain.inject(0, 0, &query(53, 4000));
    plain.loops[0].poll(10);
    assert_eq!(plain.loops[0].queue_stats().wait.count(), 0);
}
