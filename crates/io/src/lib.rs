//! The I/O seam between a worker loop and whatever moves its packets.
//!
//! A worker owns, for every port it serves, one [`RxQueue`] and one [`TxQueue`]; the handles
//! are neither `Copy` nor `Clone`, and are `Send` but not `Sync`, so the type system (not a
//! comment) keeps each hardware or software queue on the one thread that owns it. Packets are
//! owned values of a type implementing [`Packet`]: dropping one returns it to its pool, so an
//! early return or a panic cannot leak buffers. Each packet carries its [`PacketMeta`] (port,
//! queue, hash, class).
//!
//! Implementations: DPDK ethdev queues and rings (`vectorlb-dpdk`) and the in-memory queues of
//! [`mem`] (the worker loop's tests), and memif ports (`vectorlb-memif`'s server and client
//! queues). The worker loop is
//! written once, over these traits (`vectorlb-daemon`). `vectorlb replay` and the in-memory
//! benchmarks drive the pipeline directly with [`HeapBuf`]s: they measure or replay the core
//! alone, on the capture's clock.

pub mod buf;
pub mod copy;
pub mod mem;

pub use buf::{HeapBuf, Offload, PacketBuf, DEFAULT_HEADROOM, DEFAULT_ROOM};
pub use copy::{Copier, CopyEngine, CopyOp, CpuEngine};

/// What a packet knows about where it came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketMeta {
    /// The port it was received on (an index into the worker's ports).
    pub port: u16,
    /// The receive queue of that port.
    pub queue: u16,
    /// The receive hash the port computed (RSS), 0 when it computes none.
    pub hash: u32,
    /// A traffic class set by early classification (0: the default class).
    pub class: u8,
}

/// An owned packet buffer. Dropping it gives the buffer back to its pool.
pub trait Packet: PacketBuf + Send + Sized {
    fn meta(&self) -> PacketMeta;
    fn set_meta(&mut self, meta: PacketMeta);
    /// Buffers in the chain; 1 when the whole frame is in [`PacketBuf::data`].
    fn segments(&self) -> u16 {
        1
    }
    /// Frees every packet in `pkts` (drivers free a burst faster than one by one); empties it.
    fn free_all(pkts: &mut Vec<Self>) {
        pkts.clear();
    }
}

/// A receive queue, owned by one worker.
pub trait RxQueue<P: Packet>: Send {
    /// Appends up to `max` received packets to `out`; returns how many.
    fn recv(&mut self, out: &mut Vec<P>, max: usize) -> usize;

    /// Packets still waiting after the last `recv`, where the queue can tell (a ring, the
    /// in-memory queues, drivers with `rte_eth_rx_queue_count`); `None` where it cannot.
    fn backlog(&mut self) -> Option<usize> {
        None
    }

    /// An idle worker's sleep of up to `us` microseconds, ended early when this queue has
    /// packets, where the queue can wait for them (descriptors it can poll); false (nothing
    /// done) where it cannot, and the worker sleeps the whole time.
    fn idle_wait(&mut self, _us: u32) -> bool {
        false
    }
}

/// A transmit queue, owned by one worker (or, for a hand-off ring, one of its producers).
pub trait TxQueue<P: Packet>: Send {
    /// Sends packets from the front of `pkts` and removes the ones sent; returns how many.
    /// Those left in `pkts` were not taken (the queue is full) and still belong to the caller.
    fn send(&mut self, pkts: &mut Vec<P>) -> usize;

    /// Finishes earlier sends that wait on something (an asynchronous copy engine); called by
    /// the worker every round. True while some remain unfinished.
    fn poll(&mut self) -> bool {
        false
    }
}

impl<P: Packet, R: RxQueue<P> + ?Sized> RxQueue<P> for Box<R> {
    #[inline]
    fn recv(&mut self, out: &mut Vec<P>, max: usize) -> usize {
        (**self).recv(out, max)
    }
    #[inline]
    fn backlog(&mut self) -> Option<usize> {
        (**self).backlog()
    }
    #[inline]
    fn idle_wait(&mut self, us: u32) -> bool {
        (**self).idle_wait(us)
    }
}

impl<P: Packet, T: TxQueue<P> + ?Sized> TxQueue<P> for Box<T> {
    #[inline]
    fn send(&mut self, pkts: &mut Vec<P>) -> usize {
        (**self).send(pkts)
    }
    #[inline]
    fn poll(&mut self) -> bool {
        (**self).poll()
    }
}

/// Where a worker gets buffers for frames it builds itself (ARP and ND requests).
pub trait PacketPool<P: Packet>: Send + Sync {
    /// A packet holding a copy of `frame`, to leave on `port`; `None` when the pool is empty
    /// or the frame does not fit a buffer.
    fn alloc_frame(&self, port: u16, frame: &[u8]) -> Option<P>;
    /// A packet of `len` bytes whose contents the caller is about to write (a copy engine
    /// fills it); `None` when the pool is empty or `len` does not fit a buffer.
    fn alloc_len(&self, port: u16, len: usize) -> Option<P>;
    /// Appends `n` empty packets to `out` (all or none, as DPDK's bulk allocation); returns
    /// how many.
    fn alloc_bulk(&self, n: usize, out: &mut Vec<P>) -> usize {
        let start = out.len();
        for _ in 0..n {
            match self.alloc_len(0, 0) {
                Some(p) => out.push(p),
                None => {
                    out.truncate(start);
                    return 0;
                }
            }
        }
        n
    }
}

impl<P: Packet, T: PacketPool<P> + ?Sized> PacketPool<P> for std::sync::Arc<T> {
    fn alloc_frame(&self, port: u16, frame: &[u8]) -> Option<P> {
        (**self).alloc_frame(port, frame)
    }
    fn alloc_len(&self, port: u16, len: usize) -> Option<P> {
        (**self).alloc_len(port, len)
    }
    fn alloc_bulk(&self, n: usize, out: &mut Vec<P>) -> usize {
        (**self).alloc_bulk(n, out)
    }
}

/// Hints that the cache line at `p` will be read soon. Never faults, whatever the address.
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults and has no effect on memory contents.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Whether the CPU has PREFETCHW (CPUID 0x8000_0001 ECX bit 8), read once.
#[cfg(target_arch = "x86_64")]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            // SAFETY: CPUID is present on every x86_64 CPU; leaf 0x8000_0000 tells whether the
            // extended leaf exists before it is read.
            let yes = { std::arch::x86_64::__cpuid(0x8000_0000).eax >= 0x8000_0001 && std::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0 };
            HAS.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

/// Hints that the cache line at `p` is about to be written: fetched for ownership at once
/// (PREFETCHW where the CPU has it), so a line another core holds moves once instead of being
/// read shared and then upgraded. A read prefetch elsewhere.
#[inline(always)]
pub fn prefetch_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_prefetchw() {
            // SAFETY: a prefetch is a hint; it never faults, whatever the address, and changes
            // no memory; the CPU has the instruction (checked above).
            unsafe { std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly)) };
        } else {
            prefetch(p);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Makes a type `!Sync` while leaving it `Send`: a queue handle may move to its worker's
/// thread but never be shared between threads.
pub type NotSync = std::marker::PhantomData<std::cell::Cell<()>>;
