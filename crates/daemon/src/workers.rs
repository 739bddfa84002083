//! The worker registry: what the rest of the daemon may ask of the workers, and what they
//! publish. Workers own their session tables and counters; every 100 ms each copies its
//! counters into its [`Published`] slot (the packet path never waits on it), and between
//! bursts it answers the [`WorkerMsg`]s sent to it.

use crate::error::DaemonError;
use crate::lock;
use crate::sessions::Page;
use std::net::IpAddr;
use std::sync::mpsc::{self, Sender, SyncSender};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vectorlb_lb::sync::{Export, SyncRecord};
use vectorlb_lb::{counter_set, Counters, Worker};
use vectorlb_packet::ethernet::Mac;

/// Requests from the control thread, the API and session sync to one worker.
pub enum WorkerMsg {
    /// Transmit this frame on a port (ARP / ND requests, announcements).
    Send { port: u16, frame: Vec<u8> },
    /// A page of this worker's sessions.
    Sessions { start: usize, limit: usize, v6: bool, reply: SyncSender<Page> },
    /// Sessions from the active node, to install (standby).
    Install(Vec<SyncRecord>),
    /// A page of sessions as sync records (bulk transfer).
    Export { v6: bool, which: Export, start: usize, limit: usize, reply: SyncSender<(Vec<SyncRecord>, Option<usize>)> },
}

/// What workers and health checks report to the control thread.
pub enum Event {
    /// A neighbour seen in ARP / ND; `reply` is our answer, to send once it is published.
    Learned { ip: IpAddr, mac: Mac, port: u16, reply: Option<Vec<u8>> },
    /// A known neighbour's ARP not addressed to us (gratuitous): update it if it is known.
    Update { ip: IpAddr, mac: Mac, port: u16 },
    /// A packet needed this next hop and its MAC is unknown: ask for it.
    Resolve { ip: IpAddr, port: u16 },
    /// A backend went up or down: publish again.
    HealthChanged,
}

counter_set! {
    /// What a worker loop counts beside the pipeline's counters.
    pub struct IoCounters {
        /// Packets the transmit queue did not take (full), dropped.
        tx_full,
        /// Chained (multi-segment) frames received, dropped (the pipeline takes single buffers).
        multi_segment,
        /// Packets handed to the worker that owns their local port.
        handed_off,
        /// Packets for another worker dropped because its hand-off ring was full.
        handoff_full,
        /// ARP and neighbour-discovery answers sent.
        neighbour_replies,
        /// Frames for the host that arrived on a port without an exception path, dropped.
        not_ours,
        /// Frames the worker built and could not send (pool empty, no such port).
        send_failed,
        /// Packets from a pods port routed (pod to pod, pod to host, host to pod).
        routed,
        /// Packets from a pods port that could not be routed (no route or neighbour, TTL
        /// expired, too long, multicast or link-local), dropped.
        not_routed,
        /// Polling rounds.
        polls,
        /// Times an idle worker slept.
        idle_sleeps,
        /// Packets toward another queue set's service (or the default set's) handed to a
        /// worker of that set (queue sets).
        steered,
        /// Packets of another set's service kept here because their session is here (a reload
        /// moved the service).
        kept_for_session,
        /// Packets a queue set's egress limit dropped.
        rate_limited,
        /// A pod's super-packets cut into packets for a port without offloads (the uplink,
        /// another worker's port).
        super_cut,
        /// The packets those super-packets became.
        super_segments,
        /// A pod's packets whose offload could not be finished for such a port (no longer TCP
        /// or UDP, no buffers), dropped.
        offload_failed,
    }
}

/// One worker's published state.
#[derive(Default, Clone)]
pub struct Published {
    pub counters: Counters,
    pub io: IoCounters,
    /// Queue waits, residence and depths (measured while there are queue sets).
    pub queues: crate::queue_sets::QueueStats,
    /// Active sessions per backend slot.
    pub active: Vec<u32>,
    pub sessions: u32,
    /// When the worker last published (it does every 100 ms while it runs).
    pub at: Option<Instant>,
}

struct Slot {
    published: Mutex<Published>,
    tx: Sender<WorkerMsg>,
}

/// Every worker's published state and message queue.
pub struct Workers {
    slots: Vec<Slot>,
    /// When the daemon started: the workers' clock (milliseconds since) starts here.
    pub started: Instant,
}

impl Published {
    /// A queue set's packet counters, from its [`Workers::group_totals`].
    pub fn group_packets(&self) -> [(&'static str, u64); 6] {
        let p = self;
        let drops: u64 = p.counters.drop_counts().map(|(_, v)| v).sum::<u64>() + p.io.tx_full + p.io.multi_segment + p.io.handoff_full + p.io.rate_limited + p.io.offload_failed;
        [
            ("rx", p.counters.events.rx),
            ("tx", p.counters.events.tx),
            ("steered", p.io.steered),
            ("kept_for_session", p.io.kept_for_session),
            ("dropped", drops),
            ("rate_limited", p.io.rate_limited),
        ]
    }
}

impl Workers {
    /// A registry for one worker per sender, in worker order.
    pub fn new(senders: Vec<Sender<WorkerMsg>>) -> Workers {
        Workers { slots: senders.into_iter().map(|tx| Slot { published: Mutex::default(), tx }).collect(), started: Instant::now() }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The workers' clock: milliseconds since the daemon started (wraps after 49 days; the
    /// session table compares times with wrapping arithmetic).
    pub fn now_ms(&self) -> u32 {
        self.started.elapsed().as_millis() as u32
    }

    /// Called by worker `w` (only) to publish its counters.
    pub fn publish(&self, w: usize, worker: &Worker, io: &IoCounters, queues: &crate::queue_sets::QueueStats) {
        let mut p = lock(&self.slots[w].published);
        p.counters.clone_from(&worker.flows.counters);
        p.io = *io;
        p.queues = *queues;
        p.active.clear();
        p.active.extend_from_slice(worker.flows.table.active());
        p.sessions = worker.flows.table.len();
        p.at = Some(Instant::now());
    }

    /// Workers that have not published for `after`: stopped or stuck.
    pub fn stalled(&self, after: Duration) -> Vec<(usize, Option<Duration>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(w, s)| {
                let since = lock(&s.published).at.map(|t| t.elapsed());
                let late = match since {
                    Some(d) => d > after,
                    None => self.started.elapsed() > after * 3,
                };
                late.then_some((w, since))
            })
            .collect()
    }

    /// Every worker's counters, summed.
    pub fn totals(&self) -> Published {
        self.totals_of(0..self.slots.len())
    }

    /// A queue set's workers' published state, summed (the API's and /metrics' view of a set).
    pub fn group_totals(&self, sets: &crate::queue_sets::QueueSets, group: usize) -> Published {
        self.totals_of(sets.members.get(group).into_iter().flatten().map(|w| *w as usize))
    }

    /// The counters of these workers, summed (a queue set's).
    pub fn totals_of(&self, workers: impl IntoIterator<Item = usize>) -> Published {
        let mut t = Published::default();
        for s in workers.into_iter().filter_map(|w| self.slots.get(w)) {
            let p = lock(&s.published);
            t.counters.add(&p.counters);
            t.io.add(&p.io);
            t.queues.merge(&p.queues);
            if t.active.len() < p.active.len() {
                t.active.resize(p.active.len(), 0);
            }
            for (a, b) in t.active.iter_mut().zip(&p.active) {
                *a += b;
            }
            t.sessions += p.sessions;
        }
        t
    }

    fn post(&self, w: usize, msg: WorkerMsg) -> Result<(), DaemonError> {
        let s = self.slots.get(w).ok_or(DaemonError::NoSuchWorker { worker: w, workers: self.slots.len() })?;
        s.tx.send(msg).map_err(|_| DaemonError::WorkerStopped(w))
    }

    fn ask<T>(&self, w: usize, msg: impl FnOnce(SyncSender<T>) -> WorkerMsg) -> Result<T, DaemonError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.post(w, msg(tx))?;
        rx.recv_timeout(Duration::from_secs(2)).map_err(|_| DaemonError::WorkerSilent(w))
    }

    /// A page of worker `w`'s sessions (the worker answers between bursts).
    pub fn sessions(&self, w: usize, start: usize, limit: usize, v6: bool) -> Result<Page, DaemonError> {
        self.ask(w, |reply| WorkerMsg::Sessions { start, limit, v6, reply })
    }

    /// A page of worker `w`'s sessions as sync records.
    pub fn export(&self, w: usize, v6: bool, which: Export, start: usize, limit: usize) -> Result<(Vec<SyncRecord>, Option<usize>), DaemonError> {
        self.ask(w, |reply| WorkerMsg::Export { v6, which, start, limit, reply })
    }

    /// Sessions for worker `w` to install.
    pub fn install(&self, w: usize, records: Vec<SyncRecord>) {
        let _ = self.post(w, WorkerMsg::Install(records));
    }

    /// Sends a frame on `port` (through worker 0).
    pub fn send(&self, port: u16, frame: Vec<u8>) {
        let _ = self.post(0, WorkerMsg::Send { port, frame });
    }
}
