//! In-memory packets and queues: the worker loop without a NIC, for tests, `vectorlb replay`
//! and benchmarks.
//!
//! [`channel`] gives a bounded queue with any number of producers ([`Sender`], `Clone`) and
//! one consumer ([`Receiver`], not `Clone`); a full queue refuses packets rather than growing,
//! as a NIC ring does. [`Pool`] counts the buffers it hands out and the ones returned (dropped),
//! so a test can prove that nothing leaked.

use crate::{HeapBuf, NotSync, Packet, PacketBuf, PacketMeta, PacketPool, RxQueue, TxQueue};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Buffers handed out and returned, shared by every packet of a [`Pool`].
#[derive(Debug, Default)]
pub struct PoolStats {
    pub allocated: AtomicU64,
    pub returned: AtomicU64,
}

impl PoolStats {
    /// Buffers handed out and not yet returned.
    pub fn in_use(&self) -> u64 {
        self.allocated.load(Ordering::SeqCst) - self.returned.load(Ordering::SeqCst)
    }
}

/// A heap packet; dropping it counts it as returned to its pool.
pub struct MemPacket {
    buf: HeapBuf,
    meta: PacketMeta,
    stats: Arc<PoolStats>,
}

impl Drop for MemPacket {
    fn drop(&mut self) {
        self.stats.returned.fetch_add(1, Ordering::Relaxed);
    }
}

impl PacketBuf for MemPacket {
    #[inline(always)]
    fn data(&self) -> &[u8] {
        self.buf.data()
    }
    #[inline(always)]
    fn data_mut(&mut self) -> &mut [u8] {
        self.buf.data_mut()
    }
    fn prepend(&mut self, n: usize) -> bool {
        self.buf.prepend(n)
    }
    fn adj(&mut self, n: usize) {
        self.buf.adj(n)
    }
    fn set_len(&mut self, len: usize) -> bool {
        self.buf.set_len(len)
    }
    fn prefetch(&self) {
        self.buf.prefetch()
    }
    fn offload(&self) -> crate::Offload {
        self.buf.offload()
    }
    fn set_offload(&mut self, o: crate::Offload) {
        self.buf.set_offload(o)
    }
}

impl Packet for MemPacket {
    fn meta(&self) -> PacketMeta {
        self.meta
    }
    fn set_meta(&mut self, meta: PacketMeta) {
        self.meta = meta;
    }
}

/// Allocates [`MemPacket`]s of a fixed buffer size.
#[derive(Clone)]
pub struct Pool {
    headroom: usize,
    room: usize,
    stats: Arc<PoolStats>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new(crate::DEFAULT_HEADROOM, crate::DEFAULT_ROOM)
    }
}

impl Pool {
    pub fn new(headroom: usize, room: usize) -> Pool {
        Pool { headroom, room, stats: Arc::default() }
    }

    pub fn stats(&self) -> &PoolStats {
        &self.stats
    }

    /// A packet holding `frame` as if received on `port`; `None` if it does not fit.
    pub fn packet(&self, port: u16, frame: &[u8]) -> Option<MemPacket> {
        if frame.len() > self.room {
            return None;
        }
        let mut buf = HeapBuf::new(self.headroom, self.room);
        buf.load(frame);
        self.stats.allocated.fetch_add(1, Ordering::Relaxed);
        Some(MemPacket { buf, meta: PacketMeta { port, ..Default::default() }, stats: self.stats.clone() })
    }
}

impl PacketPool<MemPacket> for Pool {
    fn alloc_frame(&self, port: u16, frame: &[u8]) -> Option<MemPacket> {
        self.packet(port, frame)
    }
    fn alloc_len(&self, port: u16, len: usize) -> Option<MemPacket> {
        if len > self.room {
            return None;
        }
        let mut buf = HeapBuf::new(self.headroom, self.room);
        buf.set_len(len);
        self.stats.allocated.fetch_add(1, Ordering::Relaxed);
        Some(MemPacket { buf, meta: PacketMeta { port, ..Default::default() }, stats: self.stats.clone() })
    }
}

struct Shared<P> {
    q: Mutex<VecDeque<P>>,
    capacity: usize,
}

/// The producing side of an in-memory queue.
pub struct Sender<P> {
    shared: Arc<Shared<P>>,
}

impl<P> Clone for Sender<P> {
    fn clone(&self) -> Self {
        Sender { shared: self.shared.clone() }
    }
}

/// The consuming side of an in-memory queue: one per queue.
pub struct Receiver<P> {
    shared: Arc<Shared<P>>,
    queue: u16,
    _not_sync: NotSync,
}

/// A bounded queue of `capacity` packets; received packets get `queue` in their metadata.
pub fn channel<P: Packet>(capacity: usize, queue: u16) -> (Sender<P>, Receiver<P>) {
    let shared = Arc::new(Shared { q: Mutex::new(VecDeque::with_capacity(capacity)), capacity });
    (Sender { shared: shared.clone() }, Receiver { shared, queue, _not_sync: NotSync::default() })
}

impl<P> Shared<P> {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<P>> {
        // A panic while holding the lock leaves a consistent queue (push/pop are atomic here).
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<P: Packet> Sender<P> {
    /// Packets waiting in the queue.
    pub fn len(&self) -> usize {
        self.shared.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<P: Packet> Receiver<P> {
    /// Takes every packet waiting (for tests that look at what a worker sent).
    pub fn drain(&mut self) -> Vec<P> {
        self.shared.lock().drain(..).collect()
    }
}

impl<P: Packet> TxQueue<P> for Sender<P> {
    fn send(&mut self, pkts: &mut Vec<P>) -> usize {
        let mut q = self.shared.lock();
        let n = pkts.len().min(self.shared.capacity - q.len());
        q.extend(pkts.drain(..n));
        n
    }
}

impl<P: Packet> RxQueue<P> for Receiver<P> {
    fn recv(&mut self, out: &mut Vec<P>, max: usize) -> usize {
        let mut q = self.shared.lock();
        let n = max.min(q.len());
        for mut p in q.drain(..n) {
            let m = p.meta();
            p.set_meta(PacketMeta { queue: self.queue, ..m });
            out.push(p);
        }
        n
    }

    fn backlog(&mut self) -> Option<usize> {
        Some(self.shared.lock().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_queues_refuse_and_every_buffer_comes_back() {
        let pool = Pool::default();
        let (mut tx, mut rx) = channel::<MemPacket>(2, 3);
        let mut burst: Vec<MemPacket> = (0..3).map(|i| pool.packet(1, &[i; 60]).unwrap()).collect();
        assert_eq!(tx.send(&mut burst), 2, "a full queue takes what fits");
        assert_eq!(burst.len(), 1, "the rest stays with the caller");
        drop(burst);
        let mut got = Vec::new();
        assert_eq!(rx.recv(&mut got, 8), 2);
        assert_eq!(got[0].data()[0], 0, "in order");
        assert_eq!(got[1].meta(), PacketMeta { port: 1, queue: 3, hash: 0, class: 0 });
        assert_eq!(pool.stats().in_use(), 2);
        drop(got);
        assert_eq!(pool.stats().in_use(), 0, "dropping returns buffers");
        assert!(pool.packet(0, &[0; 4096]).is_none(), "a frame larger than the buffer");
    }
}
