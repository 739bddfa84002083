//! The worker loop, written once over the I/O seam (`vectorlb-io`): a worker owns queue `id`
//! of every port, the consuming end of its hand-off ring and its own session table; it polls,
//! runs the pipeline over each burst, transmits per port, hands packets that belong to another
//! worker to that worker's ring, answers ARP / ND for our addresses, and backs off when idle.
//! DPDK ports and rings, memif ports and the in-memory queues of the tests plug in here.

use crate::ha::Ha;
use crate::queue_sets::{QueueSets, QueueStats, Steer, Steering, DEPTH_BOUNDS, TIME_BOUNDS_NS};
use crate::workers::{Event, IoCounters, WorkerMsg, Workers};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectorlb_io::{Packet, PacketPool, RxQueue, TxQueue};
use vectorlb_lb::sync::SyncRecord;
use vectorlb_lb::{neigh, Verdict, Worker};

/// Packets taken from one queue at a time.
pub const BURST: usize = 64;
/// Empty polls before the worker starts sleeping.
const SPIN_POLLS: u32 = 256;
/// A port whose queue was empty this many rounds in a row is polled every
/// `IDLE_PORT_EVERY`-th round only, until it has packets again: an empty poll of a
/// software port is a system call (AF_XDP's wake-up, the pods port's `epoll_wait`), and
/// while another port keeps the worker busy those calls take CPU from the work.
const IDLE_PORT_ROUNDS: u32 = 64;
const IDLE_PORT_EVERY: u64 = 4;
/// How often a worker publishes its counters.
const PUBLISH: Duration = Duration::from_millis(100);

/// One port as a worker sees it: its receive and transmit queue.
pub struct PortQueues<P: Packet> {
    pub rx: Box<dyn RxQueue<P>>,
    pub tx: Box<dyn TxQueue<P>>,
    /// Route what the pipeline leaves to the host (`Verdict::Kernel`) by the routes instead
    /// (the pods port: its pods' traffic to each other, to the host and beyond).
    pub forward: bool,
}

/// Everything a worker moves packets through.
pub struct WorkerIo<P: Packet> {
    /// Indexed like the configuration's ports (the pipeline's `Verdict::Tx(port)`).
    pub ports: Vec<PortQueues<P>>,
    /// Packets other workers hand to this one (replies to its local ports).
    pub inbox: Option<Box<dyn RxQueue<P>>>,
    /// The other workers' hand-off rings, indexed by worker (`None` for this one).
    pub peers: Vec<Option<Box<dyn TxQueue<P>>>>,
    /// Buffers for frames the worker builds (ARP / ND requests, announcements).
    pub pool: Arc<dyn PacketPool<P>>,
}

/// What a worker shares with the rest of the daemon.
#[derive(Clone)]
pub struct WorkerShared {
    pub workers: Arc<Workers>,
    pub ha: Arc<Ha>,
    pub stop: Arc<AtomicBool>,
    /// Set: the worker stops taking packets and only answers messages (a planned stop writes
    /// the sessions while nothing can create more).
    pub hold: Arc<AtomicBool>,
    /// Longest sleep of an idle worker, microseconds (0: busy-poll).
    pub idle_sleep_us: u32,
    /// Where changed sessions go for synchronisation (HA), when configured.
    pub changes: Option<Sender<Vec<(u8, SyncRecord)>>>,
    /// Installs of synced sessions are counted here, when configured.
    pub sync: Option<Arc<crate::sync::Sync>>,
    /// The queue sets, swapped by a reload (None: never any).
    pub queue_sets: Option<Arc<arc_swap::ArcSwap<QueueSets>>>,
}

pub struct WorkerLoop<P: Packet> {
    pub id: u16,
    io: WorkerIo<P>,
    worker: Worker,
    shared: WorkerShared,
    msgs: Receiver<WorkerMsg>,
    events: Sender<Event>,
    counters: IoCounters,
    /// Per-round scratch, kept to avoid allocating on the packet path.
    rx: Vec<P>,
    verdicts: Vec<Verdict>,
    txq: Vec<Vec<P>>,
    handoff: Vec<Vec<P>>,
    free: Vec<P>,
    changed: Vec<SyncRecord>,
    /// Queue-set steering, when there are sets.
    steering: Option<Steering>,
    /// What steering keeps of a burst.
    kept: Vec<P>,
    /// Queue waits, residence and depths (measured while there are queue sets).
    queues: QueueStats,
    /// When the previous polling round began (while there are queue sets).
    last_round: Option<Instant>,
    /// Rounds in a row each port's queue was empty (`IDLE_PORT_ROUNDS`).
    empty_rounds: Vec<u32>,
    /// The worker clock's millisecond of the last idle sweep (one per millisecond).
    last_sweep: u32,
    /// The next round polls every port (after a sleep: what woke the worker, or what came
    /// while it slept).
    poll_all: bool,
    /// Where a pod's super-packets are cut for a port without offloads.
    scratch: Vec<u8>,
}

impl<P: Packet> WorkerLoop<P> {
    pub fn new(id: u16, io: WorkerIo<P>, worker: Worker, shared: WorkerShared, msgs: Receiver<WorkerMsg>, events: Sender<Event>) -> Self {
        let txq = io.ports.iter().map(|_| Vec::with_capacity(BURST * 2)).collect();
        let handoff = io.peers.iter().map(|_| Vec::new()).collect();
        let empty_rounds = vec![0; io.ports.len()];
        WorkerLoop {
            id,
            io,
            worker,
            shared,
            msgs,
            events,
            counters: IoCounters::default(),
            rx: Vec::with_capacity(BURST),
            verdicts: vec![Verdict::Kernel; BURST],
            txq,
            handoff,
            free: Vec::with_capacity(BURST * 2),
            changed: Vec::new(),
            steering: None,
            kept: Vec::with_capacity(BURST),
            queues: QueueStats::default(),
            last_round: None,
            empty_rounds,
            last_sweep: u32::MAX,
            poll_all: true,
            scratch: Vec::new(),
        }
    }

    /// The pipeline worker (its table and counters).
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    pub fn counters(&self) -> &IoCounters {
        &self.counters
    }

    pub fn queue_stats(&self) -> &QueueStats {
        &self.queues
    }

    /// Runs until the stop flag is set, then sends what is queued and publishes its counters.
    pub fn run(mut self) {
        let mut empty_polls = 0u32;
        let mut last_publish = Instant::now();
        let max_sleep = self.shared.idle_sleep_us;
        // A worker whose queues can wake it (the pods port's interfaces) spins less before it
        // sleeps: its sleep ends when packets come, so spinning buys little and takes a core
        // from the pods it serves.
        let waitable = self.io.ports.iter_mut().any(|p| p.rx.idle_wait(0));
        let spin_polls = if waitable { SPIN_POLLS / 8 } else { SPIN_POLLS };
        self.worker.flows.table.prefault_index();
        self.worker.track_changes(self.shared.changes.is_some());
        // A group streams only what continuation cannot re-create (full NAT, node-local schedulers).
        self.worker.sync_group(self.shared.sync.as_ref().is_some_and(|s| s.spec.group));
        while !self.shared.stop.load(Ordering::Relaxed) {
            if self.shared.hold.load(Ordering::Relaxed) {
                self.messages();
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            let now = self.shared.workers.now_ms();
            let got = self.poll(now);
            if got > 0 {
                empty_polls = 0;
            } else {
                // The table's expired sessions, a slice a millisecond while idle (each
                // burst sweeps its own slice too).
                if now != self.last_sweep {
                    self.last_sweep = now;
                    self.worker.idle(now, 256);
                }
                self.messages();
                empty_polls = empty_polls.saturating_add(1);
                // A queue set's workers busy-poll (unless the set says otherwise).
                let busy = self.steering.as_ref().is_some_and(Steering::busy_polls);
                if empty_polls > spin_polls && max_sleep > 0 && !busy {
                    // Back off: 8, 16, ... microseconds up to the configured bound.
                    let k = ((empty_polls - spin_polls) / 64).min(6);
                    let us = (8u32 << k).min(max_sleep);
                    self.counters.idle_sleeps += 1;
                    // A queue that can wait for its packets (the pods port's interfaces) ends
                    // the sleep when they come; the others' packets wait no longer than before.
                    if !self.io.ports.iter_mut().any(|p| p.rx.idle_wait(us)) {
                        std::thread::sleep(Duration::from_micros(us as u64));
                    }
                    self.poll_all = true;
                } else {
                    std::hint::spin_loop();
                }
            }
            if self.counters.polls & 1023 == 0 || got == 0 {
                if got > 0 {
                    self.messages();
                }
                if last_publish.elapsed() >= PUBLISH {
                    last_publish = Instant::now();
                    self.publish();
                }
            }
        }
        self.flush();
        self.publish();
    }

    fn publish(&self) {
        self.shared.workers.publish(self.id as usize, &self.worker, &self.counters, &self.queues);
    }

    /// One round: the hand-off inbox, then every port; transmits what the pipeline decided.
    /// Returns how many packets were received. Public for tests that drive the loop by hand.
    pub fn poll(&mut self, now: u32) -> usize {
        let mut got = 0;
        self.refresh_steering();
        // With queue sets, each round is timed (module queue_sets: QueueStats).
        let start = self.steering.is_some().then(Instant::now);
        let gap = match (start, self.last_round) {
            (Some(s), Some(l)) => s.saturating_duration_since(l).as_nanos() as u64,
            _ => 0,
        };
        self.last_round = start;
        let mut rx = std::mem::take(&mut self.rx);
        if let Some(inbox) = &mut self.io.inbox {
            if inbox.recv(&mut rx, BURST) > 0 {
                got += rx.len();
                if start.is_some() {
                    Self::sample(&mut self.queues, inbox.as_mut(), rx.len(), gap);
                }
                self.burst(&mut rx, None, now);
            }
        }
        let all = std::mem::take(&mut self.poll_all) || self.counters.polls.is_multiple_of(IDLE_PORT_EVERY);
        for p in 0..self.io.ports.len() {
            if !all && self.empty_rounds[p] >= IDLE_PORT_ROUNDS {
                continue;
            }
            if self.io.ports[p].rx.recv(&mut rx, BURST) == 0 {
                self.empty_rounds[p] = self.empty_rounds[p].saturating_add(1);
            } else {
                self.empty_rounds[p] = 0;
                got += rx.len();
                if self.steering.is_some() {
                    Self::sample(&mut self.queues, self.io.ports[p].rx.as_mut(), rx.len(), gap);
                    self.steer(&mut rx);
                }
                if !rx.is_empty() {
                    self.burst(&mut rx, Some(p as u16), now);
                }
            }
        }
        self.rx = rx;
        if self.worker.has_changes() {
            self.worker.take_changes(now, &mut self.changed);
            if let Some(tx) = &self.shared.changes {
                if !self.changed.is_empty() {
                    let _ = tx.send(self.changed.drain(..).map(|r| (self.id as u8, r)).collect());
                }
            }
            self.changed.clear();
        }
        let pending = self.flush();
        self.counters.polls += 1;
        if let (Some(s), true) = (start, got > 0) {
            self.queues.residence.add(&TIME_BOUNDS_NS, s.elapsed().as_nanos() as u64, got as u64);
        }
        // Sends still waiting for their copies keep the worker awake (no idle sleep).
        got.max(pending as usize)
    }

    /// Counts a receive of `n` packets: their wait since the previous round began and the
    /// queue's depth (what was taken and what still waits, where the queue can tell; asked
    /// only after a full burst, since a shorter one emptied the queue, and counting a NIC
    /// queue walks its descriptors).
    fn sample(q: &mut QueueStats, rx: &mut dyn RxQueue<P>, n: usize, gap_ns: u64) {
        q.wait.add(&TIME_BOUNDS_NS, gap_ns, n as u64);
        let left = if n >= BURST { rx.backlog().unwrap_or(0) } else { 0 };
        let depth = n + left;
        q.depth.add(&DEPTH_BOUNDS, depth as u64, 1);
    }

    /// Picks up a reload's queue sets.
    fn refresh_steering(&mut self) {
        let Some(shared) = &self.shared.queue_sets else { return };
        let cur = shared.load();
        let same = match &self.steering {
            Some(s) => Arc::ptr_eq(&s.sets, &cur),
            None => cur.is_empty(),
        };
        if !same {
            self.steering = (!cur.is_empty()).then(|| Steering::new(Arc::clone(&cur), self.id));
        }
    }

    /// Queue sets: hands the packets of a burst that belong to another group's workers to
    /// them, before anything else runs on the burst; keeps the rest in `rx`.
    fn steer(&mut self, rx: &mut Vec<P>) {
        let Some(st) = &mut self.steering else { return };
        for m in rx.drain(..) {
            match st.steer(&self.worker, m.data()) {
                Steer::Keep => self.kept.push(m),
                Steer::KeepForSession => {
                    self.counters.kept_for_session += 1;
                    self.kept.push(m);
                }
                Steer::To(w) if w != self.id && self.io.peers.get(w as usize).is_some_and(Option::is_some) => {
                    self.counters.steered += 1;
                    self.handoff[w as usize].push(m);
                }
                // No ring to it (a single worker): served here.
                Steer::To(_) => self.kept.push(m),
            }
        }
        std::mem::swap(rx, &mut self.kept);
    }

    /// Sends every queued packet; what a queue does not take is dropped and counted. True
    /// when a queue still has sends in flight (an asynchronous copy engine).
    fn flush(&mut self) -> bool {
        let mut pending = false;
        for (p, list) in self.txq.iter_mut().enumerate() {
            if list.is_empty() {
                pending |= self.io.ports[p].tx.poll();
                continue;
            }
            self.io.ports[p].tx.send(list);
            if !list.is_empty() {
                self.counters.tx_full += list.len() as u64;
                P::free_all(list);
            }
        }
        for (w, list) in self.handoff.iter_mut().enumerate() {
            if list.is_empty() {
                continue;
            }
            let n = match &mut self.io.peers[w] {
                Some(ring) => ring.send(list),
                None => 0,
            };
            self.counters.handed_off += n as u64;
            if !list.is_empty() {
                self.counters.handoff_full += list.len() as u64;
                P::free_all(list);
            }
        }
        P::free_all(&mut self.free);
        pending
    }

    /// Runs one burst through the pipeline and sorts it by verdict. `port` is the port it
    /// came from (`None`: the hand-off inbox).
    fn burst(&mut self, rx: &mut Vec<P>, port: Option<u16>, now: u32) {
        // Chained (multi-segment) frames are not handled: drop and count them.
        let before = rx.len();
        rx.retain(|m| m.segments() == 1);
        self.counters.multi_segment += (before - rx.len()) as u64;
        let n = rx.len();
        self.worker.process(&mut rx[..], &mut self.verdicts[..n], now);
        if self.worker.has_unresolved() {
            for (ip, port) in self.worker.take_unresolved() {
                let _ = self.events.send(Event::Resolve { ip, port });
            }
        }
        // A queue set's egress limit (taken out for the loop, put back after).
        let mut bucket = self.steering.as_mut().and_then(|s| s.bucket.take());
        if let Some(b) = &mut bucket {
            b.refill(Instant::now());
        }
        // A pods port's frames may carry what a pod's kernel left to its receiver: finished
        // here for any port but a pods port (whose interfaces take it as it is).
        let from_pods = port.is_some_and(|p| self.io.ports[p as usize].forward);
        for (i, m) in rx.drain(..).enumerate() {
            match self.verdicts[i] {
                Verdict::Tx(_) if bucket.as_mut().is_some_and(|b| !b.take(m.data().len())) => {
                    self.counters.rate_limited += 1;
                    self.free.push(m);
                }
                Verdict::Tx(p) if from_pods && (p as usize) < self.txq.len() && !self.io.ports[p as usize].forward => self.finish_to(m, p as usize, false),
                Verdict::Tx(p) if (p as usize) < self.txq.len() => self.txq[p as usize].push(m),
                Verdict::Handoff(w) if from_pods && self.io.peers.get(w as usize).is_some_and(Option::is_some) => self.finish_to(m, w as usize, true),
                Verdict::Handoff(w) if self.io.peers.get(w as usize).is_some_and(Option::is_some) => self.handoff[w as usize].push(m),
                Verdict::Kernel => match port {
                    Some(port) if self.io.ports[port as usize].forward => self.route(m, now),
                    Some(port) => self.neighbour(m, port),
                    None => {
                        self.counters.not_ours += 1;
                        self.free.push(m);
                    }
                },
                Verdict::Handoff(_) => {
                    // No ring to that worker (it does not exist): as good as a full one.
                    self.counters.handoff_full += 1;
                    self.free.push(m);
                }
                Verdict::Tx(_) | Verdict::Drop(_) => self.free.push(m),
            }
        }
        if let Some(s) = &mut self.steering {
            s.bucket = bucket;
        }
    }

    /// A frame from a forwarding port that is not the load balancer's: routed (or answered with
    /// an ICMP error, which also goes out: counted in the core's `icmp_errors_sent`).
    fn route(&mut self, mut m: P, now: u32) {
        match self.worker.route(&mut m, now) {
            Verdict::Tx(p) if (p as usize) < self.txq.len() => {
                self.counters.routed += 1;
                if self.io.ports[p as usize].forward {
                    self.txq[p as usize].push(m);
                } else {
                    self.finish_to(m, p as usize, false);
                }
            }
            _ => {
                self.counters.not_routed += 1;
                self.free.push(m);
            }
        }
    }

    /// Queues a pods port's frame for transmit queue `to` (or, with `handoff`, worker `to`'s
    /// ring) after finishing what its pod's kernel left to the receiver ([`crate::offload`]).
    fn finish_to(&mut self, mut m: P, to: usize, handoff: bool) {
        let list = if handoff { &mut self.handoff[to] } else { &mut self.txq[to] };
        match crate::offload::finish(&mut m, &*self.io.pool, &mut self.scratch, list) {
            crate::offload::Finished::Whole => list.push(m),
            crate::offload::Finished::Cut(n) => {
                self.counters.super_cut += 1;
                self.counters.super_segments += n as u64;
                self.free.push(m);
            }
            crate::offload::Finished::Failed => {
                self.counters.offload_failed += 1;
                self.free.push(m);
            }
        }
    }

    /// A frame for the host: ARP and ND for our addresses are answered here.
    fn neighbour(&mut self, mut m: P, port: u16) {
        let snap = self.worker.snapshot().clone();
        let out = neigh::handle(&mut m, &snap, port, self.shared.ha.answers_floating());
        if let Some((ip, mac)) = out.learned {
            // Learn first, answer after: the control thread publishes the neighbour, then
            // sends our reply, so the asker's first packet (sent as soon as it has our
            // answer) finds its way back.
            let reply = out.reply.then(|| m.data().to_vec());
            let _ = self.events.send(Event::Learned { ip, mac, port, reply });
            self.free.push(m);
            return;
        }
        if let Some((ip, mac)) = out.update {
            let _ = self.events.send(Event::Update { ip, mac, port });
        }
        if out.reply && (port as usize) < self.txq.len() {
            self.counters.neighbour_replies += 1;
            self.txq[port as usize].push(m);
        } else {
            if !out.neighbour {
                self.counters.not_ours += 1;
            }
            self.free.push(m);
        }
    }

    /// Answers what the rest of the daemon asked (between bursts). Public for tests that drive
    /// the loop by hand.
    pub fn messages(&mut self) {
        while let Ok(msg) = self.msgs.try_recv() {
            match msg {
                WorkerMsg::Send { port, frame } => match self.io.pool.alloc_frame(port, &frame) {
                    Some(m) if (port as usize) < self.txq.len() => self.txq[port as usize].push(m),
                    _ => self.counters.send_failed += 1,
                },
                WorkerMsg::Install(records) => {
                    let now = self.shared.workers.now_ms();
                    for r in &records {
                        let res = self.worker.install(r, now);
                        if let Some(sy) = &self.shared.sync {
                            // The first few records this node cannot place, named: the nodes'
                            // configurations differ (a service, backend or local address).
                            if res == Err(vectorlb_lb::sync::InstallError::Unknown) && sy.stats.rejected_unknown.load(Ordering::Relaxed) < 5 {
                                tracing::warn!("session sync: no such service, backend or local address here for {r:?}");
                            }
                            sy.stats.count_install(res);
                        }
                    }
                }
                WorkerMsg::Export { v6, which, start, limit, reply } => {
                    let mut out = Vec::new();
                    let next = self.worker.export(v6, which, start, limit, self.shared.workers.now_ms(), &mut out);
                    let _ = reply.send((out, next));
                }
                WorkerMsg::Sessions { start, limit, v6, reply } => {
                    let _ = reply.send(crate::sessions::page(&self.worker, start, limit, v6, self.shared.workers.now_ms()));
                }
            }
        }
        self.flush();
    }
}
