//! The data plane as a memif client: a thread that connects (and reconnects, with a backoff,
//! whenever the server goes away), and receive / transmit queues that copy between the
//! client's shared buffers and the data plane's packets through a [`Copier`].
//!
//! A queue pair's buffer pool is shared by its receive and transmit handles (each a worker's),
//! behind a mutex that only those two take. Batches of an asynchronous engine hold their
//! connection, so its memory stays mapped until their copies are done even when the server
//! leaves; their buffers go back to the pool only if the queue still belongs to that
//! connection.

use crate::client::{Buf, Client, ClientConfig, ClientQueue};
use crate::conn::{Connection, Link, QueueStats};
use crate::serverq::{count_copies, lock, SharedCopier};
use crate::sock::SocketAddr;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vectorlb_io::{CopyOp, Packet, PacketMeta, PacketPool, RxQueue, TxQueue};

/// One queue pair's pool, present while connected.
pub type QueueSlot = Arc<Mutex<Option<ClientQueue>>>;

/// Connects to `addr` until `stop`; publishes each connection on the returned link and its
/// queues in the returned slots.
pub fn spawn(addr: SocketAddr, cfg: ClientConfig, stop: Arc<AtomicBool>) -> std::io::Result<(Arc<Link>, Vec<QueueSlot>, std::thread::JoinHandle<()>)> {
    let link = Link::new(cfg.queues as usize);
    let slots: Vec<QueueSlot> = (0..cfg.queues).map(|_| Arc::new(Mutex::new(None))).collect();
    let (l, s) = (link.clone(), slots.clone());
    let th = std::thread::Builder::new().name("memif-client".into()).spawn(move || run(addr, cfg, stop, l, s))?;
    Ok((link, slots, th))
}

fn run(addr: SocketAddr, cfg: ClientConfig, stop: Arc<AtomicBool>, link: Arc<Link>, slots: Vec<QueueSlot>) {
    let mut backoff = Duration::from_millis(100);
    while !stop.load(Ordering::Relaxed) {
        let mut client = match Client::connect(&addr, &cfg) {
            Ok(c) => c,
            Err(e) => {
                let why = e.to_string();
                if link.state().last_reason != why {
                    tracing::warn!("memif client {addr} id {}: {why}; retrying", cfg.id);
                }
                link.note(&why);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        tracing::info!("memif client {addr} id {}: connected to '{}' with {} queue pair(s)", cfg.id, client.server_name, client.queues.len());
        link.publish(client.connection().clone(), None);
        for (slot, q) in slots.iter().zip(std::mem::take(&mut client.queues)) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(q);
        }
        let why = loop {
            if stop.load(Ordering::Relaxed) {
                break "stopping".to_string();
            }
            if let Err(why) = client.check() {
                break why;
            }
            if let Some(why) = link.take_fault() {
                break why;
            }
            crate::sock::wait_readable(client.control_fd(), 50);
        };
        for slot in &slots {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        link.withdraw(&why);
        tracing::info!("memif client {addr} id {}: disconnected: {why}", cfg.id);
        client.disconnect(&why);
    }
}

/// A server that broke a ring: counted once and reported, so the connector drops the
/// connection and connects again.
fn report_broken(link: &Link, queue: u16, q: &mut ClientQueue) {
    if q.reported {
        return;
    }
    if let Some(why) = q.broken().map(str::to_string) {
        q.reported = true;
        QueueStats::add(&link.queues[queue as usize].bad_ring, 1);
        link.report_fault(why);
    }
}

fn slot_lock(s: &QueueSlot) -> std::sync::MutexGuard<'_, Option<ClientQueue>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

struct Batch<P> {
    cookie: u64,
    pkts: Vec<P>,
    bufs: Vec<Buf>,
    conn: Arc<Connection>,
}

/// Gives `bufs` back to the queue's pool if it still belongs to `conn`.
fn give_back(q: &mut Option<ClientQueue>, conn: &Arc<Connection>, bufs: &mut Vec<Buf>) {
    match q {
        Some(q) if Arc::ptr_eq(q.connection(), conn) => q.free(bufs),
        _ => bufs.clear(),
    }
}

/// Receives from the server-to-client ring of queue `queue`.
pub struct ClientRx<P: Packet, Pl: PacketPool<P>> {
    link: Arc<Link>,
    slot: QueueSlot,
    queue: u16,
    port: u16,
    pool: Pl,
    copier: SharedCopier,
    max_frame: usize,
    inflight: VecDeque<Batch<P>>,
    bufs: Vec<Buf>,
}

impl<P: Packet, Pl: PacketPool<P>> ClientRx<P, Pl> {
    pub fn new(link: Arc<Link>, slot: QueueSlot, queue: u16, port: u16, pool: Pl, copier: SharedCopier, max_frame: usize) -> Self {
        ClientRx { link, slot, queue, port, pool, copier, max_frame, inflight: VecDeque::new(), bufs: Vec::with_capacity(256) }
    }
}

impl<P: Packet, Pl: PacketPool<P>> RxQueue<P> for ClientRx<P, Pl> {
    fn recv(&mut self, out: &mut Vec<P>, max: usize) -> usize {
        let mut delivered = 0;
        let mut slot = slot_lock(&self.slot);
        if !self.inflight.is_empty() {
            let done = lock(&self.copier).completed();
            while self.inflight.front().is_some_and(|b| done.is_some_and(|d| b.cookie <= d)) {
                let mut b = self.inflight.pop_front().expect("checked");
                give_back(&mut slot, &b.conn, &mut b.bufs);
                delivered += b.pkts.len();
                out.append(&mut b.pkts);
            }
        }
        let Some(q) = slot.as_mut() else { return delivered };
        let stats = &self.link.queues[self.queue as usize];
        self.bufs.clear();
        q.recv(&mut self.bufs, max.saturating_sub(delivered));
        report_broken(&self.link, self.queue, q);
        if self.bufs.is_empty() {
            return delivered;
        }
        let mut copier = lock(&self.copier);
        let before = copier.stats;
        let mut pkts = Vec::with_capacity(self.bufs.len());
        let (mut start, mut bytes) = (0usize, 0u64);
        for i in 0..self.bufs.len() {
            if self.bufs[i].more {
                continue;
            }
            let frame = &self.bufs[start..=i];
            start = i + 1;
            let total: usize = frame.iter().map(|b| b.len as usize).sum();
            if total > self.max_frame {
                QueueStats::add(&stats.too_long, 1);
                continue;
            }
            let Some(mut pkt) = self.pool.alloc_len(self.port, total) else {
                QueueStats::add(&stats.no_buffer, 1);
                continue;
            };
            let dst = pkt.data_mut().as_mut_ptr();
            let mut off = 0;
            for b in frame {
                // SAFETY: the buffer is this queue's own (index checked by buf_ptr, len <= its
                // size from recv); the packet has `total` bytes; both are kept (the batch holds
                // the connection and the buffers) until the copy completes.
                unsafe { copier.copy(CopyOp { src: q.buf_ptr(b.index), dst: dst.add(off), len: b.len }) };
                off += b.len as usize;
            }
            pkt.set_meta(PacketMeta { port: self.port, queue: self.queue, ..Default::default() });
            bytes += total as u64;
            pkts.push(pkt);
        }
        let cookie = copier.flush();
        count_copies(stats, &before, &copier.stats);
        drop(copier);
        QueueStats::add(&stats.rx_packets, pkts.len() as u64);
        QueueStats::add(&stats.rx_bytes, bytes);
        match cookie {
            None => {
                q.free(&mut self.bufs);
                delivered += pkts.len();
                out.append(&mut pkts);
            }
            Some(cookie) => {
                let conn = q.connection().clone();
                self.inflight.push_back(Batch { cookie, pkts, bufs: std::mem::take(&mut self.bufs), conn });
            }
        }
        delivered
    }
}

/// Transmits into the client-to-server ring of queue `queue`.
pub struct ClientTx<P: Packet> {
    link: Arc<Link>,
    slot: QueueSlot,
    queue: u16,
    copier: SharedCopier,
    inflight: VecDeque<Batch<P>>,
    /// Ring slots the in-flight batches will take.
    reserved: usize,
}

impl<P: Packet> ClientTx<P> {
    pub fn new(link: Arc<Link>, slot: QueueSlot, queue: u16, copier: SharedCopier) -> Self {
        ClientTx { link, slot, queue, copier, inflight: VecDeque::new(), reserved: 0 }
    }
}

impl<P: Packet> ClientTx<P> {
    /// Sends the batches whose copies completed.
    fn complete(&mut self, slot: &mut Option<ClientQueue>) {
        if !self.inflight.is_empty() {
            let done = lock(&self.copier).completed();
            while self.inflight.front().is_some_and(|b| done.is_some_and(|d| b.cookie <= d)) {
                let mut b = self.inflight.pop_front().expect("checked");
                self.reserved -= b.bufs.len();
                match slot.as_mut() {
                    // Room was reserved when the batch was made, so the ring takes it all.
                    Some(q) if Arc::ptr_eq(q.connection(), &b.conn) => {
                        q.send(&mut b.bufs);
                    }
                    _ => b.bufs.clear(),
                }
            }
        }
    }
}

impl<P: Packet> TxQueue<P> for ClientTx<P> {
    fn poll(&mut self) -> bool {
        if self.inflight.is_empty() {
            return false;
        }
        let slot = self.slot.clone();
        let mut s = slot_lock(&slot);
        self.complete(&mut s);
        !self.inflight.is_empty()
    }

    fn send(&mut self, pkts: &mut Vec<P>) -> usize {
        let slot = self.slot.clone();
        let mut slot = slot_lock(&slot);
        self.complete(&mut slot);
        let Some(q) = slot.as_mut() else { return 0 };
        let stats = &self.link.queues[self.queue as usize];
        report_broken(&self.link, self.queue, q);
        let bsize = q.buffer_size() as usize;
        let mut room = (q.tx_room() as usize).saturating_sub(self.reserved);
        let mut bufs = Vec::with_capacity(pkts.len());
        let mut copier = lock(&self.copier);
        let before = copier.stats;
        let mut sent = 0;
        let mut bytes = 0u64;
        for pkt in pkts.iter() {
            let data = pkt.data();
            let need = data.len().div_ceil(bsize).max(1);
            if need > room {
                break;
            }
            let first = bufs.len();
            if !q.alloc(data.len(), &mut bufs) {
                QueueStats::add(&stats.no_buffer, 1);
                break;
            }
            let mut off = 0;
            for b in &bufs[first..] {
                // SAFETY: a buffer just allocated from this queue's pool (len <= its size); the
                // packet stays in the batch until the copy completes.
                unsafe { copier.copy(CopyOp { src: data.as_ptr().add(off), dst: q.buf_ptr(b.index), len: b.len }) };
                off += b.len as usize;
            }
            room -= need;
            sent += 1;
            bytes += data.len() as u64;
        }
        let cookie = copier.flush();
        count_copies(stats, &before, &copier.stats);
        drop(copier);
        if sent < pkts.len() {
            QueueStats::add(&stats.tx_ring_full, 1);
        }
        if sent == 0 {
            return 0;
        }
        QueueStats::add(&stats.tx_packets, sent as u64);
        QueueStats::add(&stats.tx_bytes, bytes);
        let done: Vec<P> = pkts.drain(..sent).collect();
        match cookie {
            None => {
                q.send(&mut bufs);
                let mut done = done;
                P::free_all(&mut done);
            }
            Some(cookie) => {
                self.reserved += bufs.len();
                let conn = q.connection().clone();
                self.inflight.push_back(Batch { cookie, pkts: done, bufs, conn });
            }
        }
        sent
    }
}
