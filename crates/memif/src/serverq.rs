//! The server's queues: receive from a client-to-server ring, transmit into the buffers the
//! client posted on a server-to-client ring, each copy done by a [`Copier`] (the CPU, or a
//! DMA engine with a CPU fallback).
//!
//! The client is untrusted. Each descriptor is read once into local memory; its region, offset
//! and length are checked against the mapped regions before any copy, and the copy uses the
//! checked local values, so a descriptor the client rewrites afterwards changes nothing. The
//! client's index (`head`) may not run more than a ring ahead of ours; if it does, the queue
//! stops using the connection and reports a fault, which ends it. A slot goes back to the
//! client (our `tail` moves) only after the copies that read or write its buffer completed.

use crate::conn::{Connection, Link, LinkView, QueueStats};
use crate::ring::{Desc, Ring, DESC_FLAG_NEXT};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use vectorlb_io::{Copier, CopyOp, Packet, PacketMeta, PacketPool, RxQueue, TxQueue};

/// A copier shared by the receive and transmit queues of one worker.
pub type SharedCopier = Arc<Mutex<Copier>>;

/// The most buffers one frame may span.
pub const MAX_SEGMENTS: usize = 64;

pub(crate) fn lock(c: &SharedCopier) -> std::sync::MutexGuard<'_, Copier> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copies waiting for an asynchronous engine: the slots they cover are handed back (tail)
/// once `cookie` completes. The batch holds its connection, so the memory the engine reads or
/// writes stays mapped even if the peer leaves meanwhile.
pub(crate) struct Inflight<P> {
    pub cookie: u64,
    pub tail: u16,
    pub pkts: Vec<P>,
    pub _conn: Arc<Connection>,
}

/// Adds what the copier did since `before` to a queue's counters.
pub(crate) fn count_copies(stats: &QueueStats, before: &vectorlb_io::copy::CopyStats, after: &vectorlb_io::copy::CopyStats) {
    QueueStats::add(&stats.copies_cpu, after.cpu - before.cpu);
    QueueStats::add(&stats.copies_dma, after.engine - before.engine);
    QueueStats::add(&stats.copies_cpu_fallback, after.cpu_fallback - before.cpu_fallback);
}

/// Receives frames from the client-to-server ring `queue` of a link.
pub struct ServerRx<P: Packet, Pl: PacketPool<P>> {
    view: LinkView,
    queue: u16,
    port: u16,
    pool: Pl,
    copier: SharedCopier,
    max_frame: usize,
    /// Our position: slots before it are consumed (copies issued).
    next: u16,
    inflight: VecDeque<Inflight<P>>,
    batch: Vec<P>,
    /// Empty packets allocated in bulk, taken one per frame.
    spare: Vec<P>,
    /// The current frame's checked segments (address, length).
    segs: Vec<(u64, u32)>,
    /// Descriptors of this burst, each read once from the ring.
    window: Vec<Desc>,
}

/// Transmits frames into the server-to-client ring `queue` of a link.
pub struct ServerTx<P: Packet> {
    view: LinkView,
    queue: u16,
    copier: SharedCopier,
    next: u16,
    inflight: VecDeque<Inflight<P>>,
    /// Sent packets, freed in bulk.
    done: Vec<P>,
    /// The posted buffers' descriptors of this burst, each read once from the ring.
    window: Vec<Desc>,
}

/// Waits for every in-flight batch (a connection is going away): an engine completes what it
/// took, so this ends.
pub(crate) fn drain<P>(copier: &SharedCopier, inflight: &mut VecDeque<Inflight<P>>) -> Vec<P> {
    let mut out = Vec::new();
    while let Some(last) = inflight.back().map(|b| b.cookie) {
        if lock(copier).completed().is_some_and(|c| c >= last) {
            out.extend(inflight.drain(..).flat_map(|b| b.pkts));
        } else {
            std::hint::spin_loop();
        }
    }
    out
}

impl<P: Packet, Pl: PacketPool<P>> ServerRx<P, Pl> {
    /// Frames longer than `max_frame` (or than a buffer of `pool`) are dropped and counted.
    pub fn new(link: Arc<Link>, queue: u16, port: u16, pool: Pl, copier: SharedCopier, max_frame: usize) -> Self {
        ServerRx {
            view: LinkView::new(link),
            queue,
            port,
            pool,
            copier,
            max_frame,
            next: 0,
            inflight: VecDeque::new(),
            batch: Vec::with_capacity(256),
            spare: Vec::with_capacity(128),
            segs: Vec::with_capacity(MAX_SEGMENTS),
            window: Vec::with_capacity(256),
        }
    }

    fn stats(&self) -> &QueueStats {
        &self.view.link.queues[self.queue as usize]
    }

    /// Delivers batches whose copies completed, handing their slots back.
    fn complete(&mut self, ring: &Ring, out: &mut Vec<P>) -> usize {
        let Some(done) = (if self.inflight.is_empty() { None } else { lock(&self.copier).completed() }) else { return 0 };
        let mut n = 0;
        while self.inflight.front().is_some_and(|b| b.cookie <= done) {
            let b = self.inflight.pop_front().expect("checked");
            ring.set_tail(b.tail);
            n += b.pkts.len();
            out.extend(b.pkts);
        }
        n
    }
}

/// A local buffer holding `len` bytes for a received frame, from the spare list or the pool;
/// `None`, counted, when the frame is longer than the largest frame or a buffer, or no buffer
/// is left.
#[inline(always)]
fn buffer_for<P: Packet, Pl: PacketPool<P>>(spare: &mut Vec<P>, pool: &Pl, port: u16, max_frame: usize, len: usize, stats: &QueueStats) -> Option<P> {
    if len > max_frame {
        QueueStats::add(&stats.too_long, 1);
        return None;
    }
    let Some(mut pkt) = spare.pop().or_else(|| pool.alloc_len(port, 0)) else {
        QueueStats::add(&stats.no_buffer, 1);
        return None;
    };
    if !pkt.set_len(len) {
        QueueStats::add(&stats.too_long, 1);
        spare.push(pkt);
        return None;
    }
    Some(pkt)
}

impl<P: Packet, Pl: PacketPool<P>> RxQueue<P> for ServerRx<P, Pl> {
    fn recv(&mut self, out: &mut Vec<P>, max: usize) -> usize {
        if self.view.refresh() {
            let done = drain(&self.copier, &mut self.inflight);
            out.extend(done);
            // Start where the ring is (0 on a fresh connection).
            self.next = self.view.conn.as_ref().and_then(|c| c.c2s.get(self.queue as usize)).map_or(0, |h| h.ring.tail());
        }
        // Taken for the call (no reference count traffic), put back unless the peer broke
        // the ring.
        let Some(conn) = self.view.conn.take() else { return 0 };
        let (n, keep) = self.recv_from(&conn, out, max);
        if keep {
            self.view.conn = Some(conn);
        }
        n
    }
}

impl<P: Packet, Pl: PacketPool<P>> ServerRx<P, Pl> {
    /// One receive burst on `conn`; false when the connection must be dropped.
    fn recv_from(&mut self, conn: &Arc<Connection>, out: &mut Vec<P>, max: usize) -> (usize, bool) {
        let Some(h) = conn.c2s.get(self.queue as usize) else { return (0, true) };
        let ring = h.ring;
        let mut delivered = self.complete(&ring, out);
        let head = ring.head();
        let avail = head.wrapping_sub(self.next);
        if avail > ring.size() {
            QueueStats::add(&self.stats().bad_ring, 1);
            self.view.link.report_fault(format!("client-to-server ring {}: head {head} is {avail} slots ahead of {} (ring of {})", self.queue, self.next, ring.size()));
            return (delivered, false);
        }
        if avail == 0 {
            return (delivered, true);
        }
        let room = max.saturating_sub(delivered);
        if self.spare.len() < room.min(avail as usize) {
            self.pool.alloc_bulk(64.max(room.min(avail as usize)), &mut self.spare);
        }
        // The burst's descriptors, read once; the buffers they name prefetched while the
        // frames before them are copied.
        self.window.clear();
        for i in 0..(avail as usize).min(room) as u16 {
            let d = ring.desc(self.next.wrapping_add(i));
            if let Some(p) = conn.span(d.region, d.offset, d.length.min(64)) {
                vectorlb_io::prefetch(p);
            }
            self.window.push(d);
        }
        let mut consumed: u16 = 0;
        let mut bytes = 0u64;
        let mut copier = lock(&self.copier);
        let before = copier.stats;
        let stats = &self.view.link.queues[self.queue as usize];
        // Copies done here on the spot (the CPU engine, untimed), counted once at the end.
        let inline = copier.inline();
        let (mut inline_n, mut inline_bytes) = (0u64, 0u64);
        while self.batch.len() < room && consumed < avail {
            // The common case first: a frame in one buffer.
            if let Some(&d) = self.window.get(consumed as usize) {
                if d.flags & DESC_FLAG_NEXT == 0 {
                    consumed += 1;
                    let len = d.length as usize;
                    let Some(src) = conn.span(d.region, d.offset, d.length) else {
                        QueueStats::add(&stats.bad_desc, 1);
                        continue;
                    };
                    let Some(mut pkt) = buffer_for(&mut self.spare, &self.pool, self.port, self.max_frame, len, stats) else { continue };
                    let dst = pkt.data_mut().as_mut_ptr();
                    if inline {
                        // SAFETY: src..src+len lies inside a region of `conn` (span), mapped
                        // for the call; dst has len bytes (set_len); they do not overlap (our
                        // buffer, the peer's region).
                        unsafe { vectorlb_io::copy::copy_bytes(src, dst, len) };
                        inline_n += 1;
                        inline_bytes += len as u64;
                    } else {
                        // SAFETY: as in the chained case below.
                        unsafe { copier.copy(CopyOp { src, dst, len: d.length }) };
                    }
                    pkt.set_meta(PacketMeta { port: self.port, queue: self.queue, ..Default::default() });
                    bytes += len as u64;
                    self.batch.push(pkt);
                    continue;
                }
            }
            // One frame: its descriptors, each read once and checked.
            self.segs.clear();
            let mut nseg: u16 = 0;
            let mut total = 0usize;
            let mut bad = false;
            let mut complete = false;
            while consumed + nseg < avail {
                let k = (consumed + nseg) as usize;
                let d = match self.window.get(k) {
                    Some(d) => *d,
                    None => {
                        // A chain that runs past the window: read on, once each.
                        let d = ring.desc(self.next.wrapping_add(k as u16));
                        self.window.push(d);
                        d
                    }
                };
                nseg += 1;
                match conn.span(d.region, d.offset, d.length) {
                    Some(p) if self.segs.len() < MAX_SEGMENTS => {
                        self.segs.push((p as u64, d.length));
                        total += d.length as usize;
                    }
                    _ => bad = true,
                }
                if d.flags & DESC_FLAG_NEXT == 0 {
                    complete = true;
                    break;
                }
            }
            if !complete {
                // The rest of the chain is not posted yet; a full ring of an unfinished chain
                // is the client's error.
                if nseg >= ring.size() {
                    QueueStats::add(&stats.bad_desc, 1);
                    consumed += nseg;
                }
                break;
            }
            consumed += nseg;
            if bad {
                QueueStats::add(&stats.bad_desc, 1);
                continue;
            }
            let Some(mut pkt) = buffer_for(&mut self.spare, &self.pool, self.port, self.max_frame, total, stats) else { continue };
            let dst = pkt.data_mut().as_mut_ptr();
            let mut off = 0usize;
            for &(src, len) in &self.segs {
                // SAFETY: src..src+len lies inside a region of `conn` (checked by span), which
                // stays mapped until the batch completes (the batch holds the connection); dst
                // has `total` bytes and the packet is kept in the batch until then.
                unsafe { copier.copy(CopyOp { src: src as *const u8, dst: dst.add(off), len }) };
                off += len as usize;
            }
            pkt.set_meta(PacketMeta { port: self.port, queue: self.queue, ..Default::default() });
            bytes += total as u64;
            self.batch.push(pkt);
        }
        if consumed == 0 {
            return (delivered, true);
        }
        self.next = self.next.wrapping_add(consumed);
        let n = self.batch.len();
        copier.count_inline(inline_n, inline_bytes);
        let cookie = copier.flush();
        count_copies(stats, &before, &copier.stats);
        drop(copier);
        QueueStats::add(&stats.rx_packets, n as u64);
        QueueStats::add(&stats.rx_bytes, bytes);
        match cookie {
            None => {
                ring.set_tail(self.next);
                out.append(&mut self.batch);
                delivered += n;
            }
            Some(cookie) => self.inflight.push_back(Inflight { cookie, tail: self.next, pkts: std::mem::take(&mut self.batch), _conn: conn.clone() }),
        }
        (delivered, true)
    }
}

impl<P: Packet> ServerTx<P> {
    pub fn new(link: Arc<Link>, queue: u16, copier: SharedCopier) -> Self {
        ServerTx { view: LinkView::new(link), queue, copier, next: 0, inflight: VecDeque::new(), done: Vec::with_capacity(256), window: Vec::with_capacity(256) }
    }

    /// Picks up a new or withdrawn connection: batches of the old one are waited for, and the
    /// position restarts where the new ring is.
    fn follow_link(&mut self) {
        if self.view.refresh() {
            drain(&self.copier, &mut self.inflight);
            self.next = self.view.conn.as_ref().and_then(|c| c.s2c.get(self.queue as usize)).map_or(0, |h| h.ring.tail());
        }
    }

    fn complete(&mut self, conn: &Connection) {
        if self.inflight.is_empty() {
            return;
        }
        let Some(done) = lock(&self.copier).completed() else { return };
        let h = &conn.s2c[self.queue as usize];
        let mut moved = false;
        while self.inflight.front().is_some_and(|b| b.cookie <= done) {
            let b = self.inflight.pop_front().expect("checked");
            h.ring.set_tail(b.tail);
            moved = true;
        }
        if moved {
            h.notify();
        }
    }
}

impl<P: Packet> TxQueue<P> for ServerTx<P> {
    fn poll(&mut self) -> bool {
        if self.inflight.is_empty() {
            return false;
        }
        self.follow_link();
        if let Some(conn) = self.view.conn.clone() {
            self.complete(&conn);
        }
        !self.inflight.is_empty()
    }

    fn send(&mut self, pkts: &mut Vec<P>) -> usize {
        self.follow_link();
        let Some(conn) = self.view.conn.take() else { return 0 };
        let (n, keep) = self.send_to(&conn, pkts);
        if keep {
            self.view.conn = Some(conn);
        }
        n
    }
}

impl<P: Packet> ServerTx<P> {
    /// One transmit burst on `conn`; false when the connection must be dropped.
    fn send_to(&mut self, conn: &Arc<Connection>, pkts: &mut Vec<P>) -> (usize, bool) {
        let Some(h) = conn.s2c.get(self.queue as usize) else { return (0, true) };
        let ring = h.ring;
        self.complete(conn);
        let head = ring.head();
        let free = head.wrapping_sub(self.next);
        let stats = &self.view.link.queues[self.queue as usize];
        if free > ring.size() {
            QueueStats::add(&stats.bad_ring, 1);
            self.view.link.report_fault(format!("server-to-client ring {}: head {head} is {free} slots ahead of {} (ring of {})", self.queue, self.next, ring.size()));
            return (0, false);
        }
        // The posted buffers this burst will likely fill, read once and fetched for writing
        // (the client touched them last: fetched shared, they would move twice).
        self.window.clear();
        let n = pkts.len().min(free as usize) as u16;
        for i in (0..n).step_by(4) {
            ring.prefetch_desc_for_write(self.next.wrapping_add(i));
        }
        for i in 0..n {
            let d = ring.desc(self.next.wrapping_add(i));
            if let Some(p) = conn.span(d.region, d.offset, d.length.min(64)) {
                vectorlb_io::prefetch(p);
            }
            self.window.push(d);
        }
        let mut used: u16 = 0;
        let mut sent = 0usize;
        let mut bytes = 0u64;
        let mut copier = lock(&self.copier);
        let before = copier.stats;
        let inline = copier.inline();
        let (mut inline_n, mut inline_bytes) = (0u64, 0u64);
        'frames: for pkt in pkts.iter() {
            let data = pkt.data();
            // The common case first: the frame fits the next posted buffer.
            if used < free {
                if let Some(&d) = self.window.get(used as usize) {
                    let len = data.len();
                    if len != 0 && len <= d.length as usize {
                        if let Some(dst) = conn.span(d.region, d.offset, d.length) {
                            if inline {
                                // SAFETY: dst..dst+len is inside a checked region of `conn`;
                                // the source is the packet; they do not overlap.
                                unsafe { vectorlb_io::copy::copy_bytes(data.as_ptr(), dst, len) };
                                inline_n += 1;
                                inline_bytes += len as u64;
                            } else {
                                // SAFETY: as in the general case below.
                                unsafe { copier.copy(CopyOp { src: data.as_ptr(), dst, len: len as u32 }) };
                            }
                            ring.set_len_flags(self.next.wrapping_add(used), len as u32, 0);
                            used += 1;
                            sent += 1;
                            bytes += len as u64;
                            continue;
                        }
                    }
                }
            }
            let mut off = 0usize;
            let mut n: u16 = 0;
            // Fill the client's buffers in order; its descriptors give each buffer's place and
            // capacity, read once and checked.
            loop {
                if used + n >= free {
                    // Not enough posted buffers for this frame: it stays with the caller.
                    break 'frames;
                }
                let slot = self.next.wrapping_add(used + n);
                let k = (used + n) as usize;
                let d = match self.window.get(k) {
                    Some(d) => *d,
                    None => {
                        let d = ring.desc(slot);
                        self.window.push(d);
                        d
                    }
                };
                n += 1;
                let Some(dst) = conn.span(d.region, d.offset, d.length) else {
                    // A buffer outside the regions: skipped, sent back empty.
                    QueueStats::add(&stats.bad_desc, 1);
                    ring.set_len_flags(slot, 0, 0);
                    continue;
                };
                let take = (data.len() - off).min(d.length as usize);
                if take == 0 && data.len() > off {
                    ring.set_len_flags(slot, 0, 0);
                    QueueStats::add(&stats.bad_desc, 1);
                    continue;
                }
                // SAFETY: dst..dst+take is inside a checked region this queue keeps mapped;
                // the source is the packet, kept in the batch until the copy completes.
                unsafe { copier.copy(CopyOp { src: data.as_ptr().add(off), dst, len: take as u32 }) };
                off += take;
                let more = off < data.len();
                ring.set_len_flags(slot, take as u32, if more { DESC_FLAG_NEXT } else { 0 });
                if !more {
                    break;
                }
            }
            used += n;
            sent += 1;
            bytes += data.len() as u64;
        }
        if sent < pkts.len() {
            QueueStats::add(&stats.tx_ring_full, 1);
        }
        if used == 0 {
            return (0, true);
        }
        self.next = self.next.wrapping_add(used);
        copier.count_inline(inline_n, inline_bytes);
        let cookie = copier.flush();
        count_copies(stats, &before, &copier.stats);
        drop(copier);
        QueueStats::add(&stats.tx_packets, sent as u64);
        QueueStats::add(&stats.tx_bytes, bytes);
        match cookie {
            None => {
                ring.set_tail(self.next);
                h.notify();
                if sent == pkts.len() {
                    P::free_all(pkts);
                } else {
                    self.done.extend(pkts.drain(..sent));
                    P::free_all(&mut self.done);
                }
            }
            Some(cookie) => self.inflight.push_back(Inflight { cookie, tail: self.next, pkts: pkts.drain(..sent).collect(), _conn: conn.clone() }),
        }
        (sent, true)
    }
}
