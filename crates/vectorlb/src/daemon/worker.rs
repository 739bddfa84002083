//! A worker thread: owns queue `id` on every port and its own session table; polls, runs the
//! pipeline over each burst, transmits, answers ARP/ND, and backs off when idle.

use super::{Event, Shared, WorkerMsg};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectorlb_dpdk::{free_bulk, Mbuf, Port, Ring};
use vectorlb_lb::{neigh, DropReason, PacketBuf, Verdict, Worker};
use vectorlb_packet::parse_frame;

pub const BURST: usize = 64;
/// Empty polls before the worker starts sleeping.
const SPIN_POLLS: u32 = 256;

pub struct WorkerCtx {
    pub id: u16,
    pub ports: Vec<Port>,
    pub worker: Worker,
    pub shared: Arc<Shared>,
    pub msgs: Receiver<WorkerMsg>,
    pub events: Sender<Event>,
    /// Every worker's hand-off ring (index = worker id); ours is `rings[id]`.
    pub rings: Arc<Vec<Ring>>,
    /// log2 of the local-port partitions (see `TableConfig::core_shift`).
    pub core_shift: u8,
    /// Where changed sessions go for synchronisation (HA), when configured.
    pub changes: Option<Sender<Vec<(u8, vectorlb_lb::sync::SyncRecord)>>>,
}

/// Per-worker counters the runtime adds to the pipeline's.
#[derive(Debug, Clone, Copy, Default)]
pub struct IoCounters {
    pub tx_full: u64,
    pub multi_segment: u64,
    pub handed_off: u64,
    pub neighbour_replies: u64,
    pub not_ours: u64,
    pub polls: u64,
    pub idle_sleeps: u64,
}

impl WorkerCtx {
    pub fn run(mut self) {
        let q = self.id;
        let start = self.shared.started;
        let mut rx: Vec<Option<Mbuf>> = (0..BURST).map(|_| None).collect();
        let mut verdicts = vec![Verdict::Kernel; BURST];
        let mut txq: Vec<Vec<Mbuf>> = self.ports.iter().map(|_| Vec::with_capacity(BURST * 2)).collect();
        let mut free: Vec<Mbuf> = Vec::with_capacity(BURST * 2);
        let mut handoff: Vec<Vec<Mbuf>> = self.rings.iter().map(|_| Vec::new()).collect();
        let mut io = IoCounters::default();
        let mut empty_polls = 0u32;
        let mut last_publish = Instant::now();
        let max_sleep = self.shared.idle_sleep_us;
        self.worker.table.prefault_index();
        self.worker.track_changes(self.changes.is_some());
        let mut changed = Vec::new();
        loop {
            if self.shared.stopping() {
                break;
            }
            let now = start.elapsed().as_millis() as u32;
            let mut got = 0usize;
            // Packets other workers handed to us (replies to our local ports), then each port.
            for src in 0..=self.ports.len() {
                let n = if src == 0 {
                    if self.rings.len() < 2 {
                        continue;
                    }
                    self.rings[q as usize].dequeue(&mut rx)
                } else {
                    self.ports[src - 1].rx(q, &mut rx)
                };
                if n == 0 {
                    continue;
                }
                got += n;
                self.burst(&mut rx[..n], &mut verdicts, now, &mut txq, &mut free, &mut handoff, &mut io);
            }
            if self.worker.has_changes() {
                self.worker.take_changes(now, &mut changed);
                if let Some(tx) = &self.changes {
                    if !changed.is_empty() {
                        let _ = tx.send(changed.drain(..).map(|r| (q as u8, r)).collect());
                    }
                }
                changed.clear();
            }
            for (p, list) in txq.iter_mut().enumerate() {
                if list.is_empty() {
                    continue;
                }
                let sent = self.ports[p].tx(q, list);
                if sent < list.len() {
                    io.tx_full += (list.len() - sent) as u64;
                    free_bulk(&mut list[sent..]);
                }
                // SAFETY of the clear: the first `sent` now belong to the driver, the rest were
                // freed; none may be dropped or used again (Mbuf has no Drop).
                list.clear();
            }
            for (w, list) in handoff.iter_mut().enumerate() {
                if list.is_empty() {
                    continue;
                }
                let n = self.rings[w].enqueue(list);
                io.handed_off += n as u64;
                // The pipeline counted these as misdirected drops; they were delivered.
                let d = &mut self.worker.counters.drops[DropReason::Misdirected as usize];
                *d = d.saturating_sub(n as u64);
                if n < list.len() {
                    free_bulk(&mut list[n..]);
                }
                list.clear();
            }
            if !free.is_empty() {
                free_bulk(&mut free);
                free.clear();
            }
            io.polls += 1;
            if got > 0 {
                empty_polls = 0;
            } else {
                self.worker.idle(now, 256);
                self.messages(&mut txq);
                empty_polls = empty_polls.saturating_add(1);
                if empty_polls > SPIN_POLLS && max_sleep > 0 {
                    // Back off: 8, 16, ... microseconds up to the configured bound.
                    let k = ((empty_polls - SPIN_POLLS) / 64).min(6);
                    let us = (8u32 << k).min(max_sleep);
                    io.idle_sleeps += 1;
                    std::thread::sleep(Duration::from_micros(us as u64));
                } else {
                    std::hint::spin_loop();
                }
            }
            if io.polls & 1023 == 0 || got == 0 {
                if got > 0 {
                    self.messages(&mut txq);
                }
                if last_publish.elapsed() >= Duration::from_millis(100) {
                    last_publish = Instant::now();
                    self.shared.workers[q as usize].publish(&self.worker, &io);
                }
            }
        }
        // Drain: send what is queued, publish the last counters.
        for (p, list) in txq.iter_mut().enumerate() {
            let sent = self.ports[p].tx(q, list);
            free_bulk(&mut list[sent..]);
            list.clear();
        }
        self.shared.workers[q as usize].publish(&self.worker, &io);
    }

    #[allow(clippy::too_many_arguments)]
    fn burst(
        &mut self,
        rx: &mut [Option<Mbuf>],
        verdicts: &mut [Verdict],
        now: u32,
        txq: &mut [Vec<Mbuf>],
        free: &mut Vec<Mbuf>,
        handoff: &mut [Vec<Mbuf>],
        io: &mut IoCounters,
    ) {
        let n = rx.len();
        // Chained (multi-segment) frames are not handled: drop and count them.
        let mut k = 0;
        for i in 0..n {
            let m = rx[i].take().expect("rx returned n packets");
            if m.segments() != 1 {
                io.multi_segment += 1;
                free.push(m);
            } else {
                rx[k] = Some(m);
                k += 1;
            }
        }
        // SAFETY: rx[..k] are all Some, and Option<Mbuf> has Mbuf's layout (a non-null
        // pointer), so this is a valid &mut [Mbuf] for the duration of the call.
        let bufs: &mut [Mbuf] = unsafe { std::slice::from_raw_parts_mut(rx.as_mut_ptr() as *mut Mbuf, k) };
        self.worker.process(bufs, &mut verdicts[..k], now);
        if self.worker.has_unresolved() {
            for (ip, port) in self.worker.take_unresolved() {
                let _ = self.events.send(Event::Resolve { ip, port });
            }
        }
        for i in 0..k {
            let mut m = rx[i].take().unwrap();
            match verdicts[i] {
                Verdict::Tx(p) if (p as usize) < txq.len() => txq[p as usize].push(m),
                Verdict::Tx(_) => free.push(m),
                Verdict::Drop(DropReason::Misdirected) if self.rings.len() > 1 => {
                    match self.owner(&m) {
                        Some(w) if w != self.id as usize => handoff[w].push(m),
                        _ => free.push(m),
                    }
                }
                Verdict::Drop(_) => free.push(m),
                Verdict::Kernel => {
                    let port = m.port();
                    let snap = self.worker.snapshot().clone();
                    let out = neigh::handle(&mut m, &snap, port, self.shared.ha.answers_floating());
                    if let Some((ip, mac)) = out.learned {
                        // Learn first, answer after: the control thread publishes the
                        // neighbour, then sends our reply, so the asker's first packet (sent as
                        // soon as it has our answer) finds its way back.
                        let reply = out.reply.then(|| m.data().to_vec());
                        let _ = self.events.send(Event::Learned { ip, mac, port, reply });
                        free.push(m);
                        continue;
                    }
                    if out.reply && (port as usize) < txq.len() {
                        io.neighbour_replies += 1;
                        txq[port as usize].push(m);
                    } else {
                        if !out.neighbour {
                            io.not_ours += 1;
                        }
                        free.push(m);
                    }
                }
            }
        }
    }

    /// The worker that owns the local port a reply is addressed to.
    fn owner(&self, m: &Mbuf) -> Option<usize> {
        let d = m.data();
        let p = parse_frame(d).ok()?;
        let dport = u16::from_be_bytes([*d.get(p.l4 + 2)?, *d.get(p.l4 + 3)?]);
        let w = (dport as usize) & ((1usize << self.core_shift) - 1);
        (w < self.rings.len()).then_some(w)
    }

    fn messages(&mut self, txq: &mut [Vec<Mbuf>]) {
        while let Ok(msg) = self.msgs.try_recv() {
            match msg {
                WorkerMsg::Send { port, frame } => {
                    if let Some(mut m) = self.shared.pool.alloc() {
                        if (port as usize) < txq.len() && m.load(&frame) {
                            txq[port as usize].push(m);
                        } else {
                            free_bulk(std::slice::from_mut(&mut m));
                        }
                    }
                }
                WorkerMsg::Install(records) => {
                    let now = self.shared.started.elapsed().as_millis() as u32;
                    for r in &records {
                        let res = self.worker.install(r, now);
                        if let Some(sy) = &self.shared.sync {
                            sy.stats.count_install(res);
                        }
                    }
                }
                WorkerMsg::Export { v6, start, limit, reply } => {
                    let now = self.shared.started.elapsed().as_millis() as u32;
                    let mut out = Vec::new();
                    let next = self.worker.export(v6, start, limit, now, &mut out);
                    let _ = reply.send((out, next));
                }
                WorkerMsg::Sessions { start, limit, v6, reply } => {
                    let page = super::sessions::page(&self.worker, start, limit, v6, self.shared.started.elapsed().as_millis() as u32);
                    let _ = reply.send(page);
                }
            }
        }
    }
}
