//! What a connected interface shares between its control side (the handshake, in a control
//! thread) and its queues (in workers): the mapped regions, the rings, the eventfds, and a
//! [`Link`] through which the control side publishes a connection and takes it back.
//!
//! A queue holds an `Arc<Connection>` while it uses it; the control side drops its own when
//! the peer goes away, and the memory is unmapped when the last holder lets go, so a worker in
//! the middle of a burst (or a DMA engine with copies in flight) never touches unmapped memory.

use crate::region::Region;
use crate::ring::Ring;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One ring of a connection and the eventfd its sender signals.
#[derive(Debug)]
pub struct RingHandle {
    pub ring: Ring,
    pub region: u16,
    pub offset: u32,
    pub eventfd: OwnedFd,
}

impl RingHandle {
    /// Signals the ring's receiver, if it asked to be signalled (its mask flag is clear).
    pub fn notify(&self) {
        if self.ring.flags() & crate::ring::RING_FLAG_MASK_INT == 0 {
            let one: u64 = 1;
            // SAFETY: an 8-byte write from a local to an eventfd we own (checked to be an
            // eventfd and non-blocking when it was received); a failure is harmless.
            unsafe { libc::write(self.eventfd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    /// Clears the eventfd's counter (a receiver about to poll its ring).
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: an 8-byte read into a local from a non-blocking eventfd.
        unsafe { libc::read(self.eventfd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

/// A connected interface's shared memory.
#[derive(Debug)]
pub struct Connection {
    /// Declared before the regions: the rings point into them.
    pub c2s: Vec<RingHandle>,
    pub s2c: Vec<RingHandle>,
    pub regions: Vec<Region>,
    /// The peer's name (from INIT or HELLO), for logs and the API.
    pub peer: String,
    /// Buffer size the client uses (client side only; the server reads lengths from
    /// descriptors).
    pub buffer_size: u32,
}

impl Connection {
    /// The address of `len` bytes at `offset` in region `region`, if they lie inside it.
    #[inline(always)]
    pub fn span(&self, region: u16, offset: u32, len: u32) -> Option<*mut u8> {
        self.regions.get(region as usize)?.span(offset as u64, len as u64)
    }
}

/// What a queue counter counts, for the places that group them (a port's DPDK-style totals,
/// `/metrics`' error and copy families).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterKind {
    /// Frames and bytes moved.
    Traffic,
    /// A frame from the peer refused (DPDK's `ierrors`).
    RxError,
    /// A frame that found no local buffer (DPDK's `rx_nombuf`).
    NoBuffer,
    /// Transmits that found the peer's ring full.
    TxFull,
    /// A copy, by the engine that did it (the name after `copies_`).
    Copy,
}

/// The queue counters, declared once: the atomic [`QueueStats`] the worker writes, the
/// [`QueueCounters`] snapshot, and [`QueueCounters::fields`] (names and kinds) from which the
/// API, `/metrics` and the port totals are made.
macro_rules! queue_counters {
    ($( $(#[doc = $doc:literal])* $name:ident: $kind:ident, )*) => {
        /// Counters of one queue pair, written by its worker, read by anyone.
        #[derive(Debug, Default)]
        pub struct QueueStats {
            $( $(#[doc = $doc])* pub $name: AtomicU64, )*
        }

        /// A snapshot of [`QueueStats`].
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct QueueCounters {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        impl QueueStats {
            pub fn snapshot(&self) -> QueueCounters {
                QueueCounters { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }

        impl QueueCounters {
            /// Every counter: its name (the API's and `/metrics`' too), what it counts, its value.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, CounterKind, u64)> {
                [$( (stringify!($name), CounterKind::$kind, self.$name), )*].into_iter()
            }

            /// The sum of the counters of one kind.
            pub fn sum(&self, kind: CounterKind) -> u64 {
                self.fields().filter(|f| f.1 == kind).map(|f| f.2).sum()
            }
        }
    };
}

queue_counters! {
    rx_packets: Traffic,
    rx_bytes: Traffic,
    tx_packets: Traffic,
    tx_bytes: Traffic,
    /// Descriptors that pointed outside the peer's regions, or had impossible lengths.
    bad_desc: RxError,
    /// Ring indexes the peer moved to impossible values (the connection is then dropped).
    bad_ring: RxError,
    /// Frames longer than a local buffer or the largest frame.
    too_long: RxError,
    /// Frames that found no local buffer.
    no_buffer: NoBuffer,
    /// Transmit attempts that found the peer's ring full (frames left to the caller).
    tx_ring_full: TxFull,
    /// IP mode: frames that were not IPv4 or IPv6 (from the peer, or for it), dropped.
    not_ip: RxError,
    /// Copies done by the CPU (the cpu engine, or below the DMA threshold).
    copies_cpu: Copy,
    /// Copies done by the DMA engine.
    copies_dma: Copy,
    /// Copies the CPU did because the DMA ring was full.
    copies_cpu_fallback: Copy,
}

impl QueueStats {
    #[inline(always)]
    pub fn add(c: &AtomicU64, n: u64) {
        // One writer (the queue's worker): a load and a store, not a locked add.
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

/// The published state of one interface.
#[derive(Debug)]
pub struct Link {
    conn: Mutex<Option<Arc<Connection>>>,
    generation: AtomicU64,
    up: AtomicBool,
    /// Set by a queue that found the peer breaking the ring protocol; the control side
    /// disconnects it.
    fault: Mutex<Option<String>>,
    faulted: AtomicBool,
    pub queues: Vec<QueueStats>,
    state: Mutex<LinkState>,
}

/// What the API shows about an interface.
#[derive(Debug, Clone, Default)]
pub struct LinkState {
    pub peer: String,
    pub peer_pid: Option<i32>,
    pub connects: u64,
    pub disconnects: u64,
    /// Why the last connection ended (or the last handshake was refused).
    pub last_reason: String,
    pub rings: (usize, usize),
    pub log2_ring: u8,
}

impl Link {
    pub fn new(queues: usize) -> Arc<Link> {
        Arc::new(Link {
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            up: AtomicBool::new(false),
            fault: Mutex::new(None),
            faulted: AtomicBool::new(false),
            queues: (0..queues).map(|_| QueueStats::default()).collect(),
            state: Mutex::new(LinkState::default()),
        })
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Changes whenever a connection is published or withdrawn.
    #[inline(always)]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current connection, if any.
    pub fn connection(&self) -> Option<Arc<Connection>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn publish(&self, c: Arc<Connection>, peer_pid: Option<i32>) {
        {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.peer = c.peer.clone();
            s.peer_pid = peer_pid;
            s.connects += 1;
            s.rings = (c.c2s.len(), c.s2c.len());
            s.log2_ring = c.c2s.first().or(c.s2c.first()).map_or(0, |r| r.ring.log2());
        }
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.faulted.store(false, Ordering::Release);
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
        self.up.store(true, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Withdraws the connection (the memory stays mapped until every queue let go).
    pub fn withdraw(&self, reason: &str) {
        let had = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take().is_some();
        self.up.store(false, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if had {
            s.disconnects += 1;
        }
        s.last_reason = reason.to_string();
    }

    /// Records a refused handshake.
    pub fn note(&self, reason: &str) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).last_reason = reason.to_string();
    }

    pub fn state(&self) -> LinkState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A queue reports that the peer broke the ring protocol.
    pub fn report_fault(&self, why: String) {
        if !self.faulted.swap(true, Ordering::AcqRel) {
            *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        }
    }

    /// The fault a queue reported, taken (the control side then disconnects the peer).
    pub fn take_fault(&self) -> Option<String> {
        if self.faulted.load(Ordering::Acquire) {
            self.fault.lock().unwrap_or_else(|e| e.into_inner()).take()
        } else {
            None
        }
    }
}

/// A queue's cached view of its link: the connection it uses and the generation it saw.
#[derive(Debug)]
pub struct LinkView {
    pub link: Arc<Link>,
    seen: u64,
    pub conn: Option<Arc<Connection>>,
}

impl LinkView {
    pub fn new(link: Arc<Link>) -> LinkView {
        LinkView { link, seen: u64::MAX, conn: None }
    }

    /// Picks up a newly published or withdrawn connection; true when it changed (the
    /// queue then resets its ring positions).
    #[inline(always)]
    pub fn refresh(&mut self) -> bool {
        let g = self.link.generation();
        if g == self.seen {
            return false;
        }
        self.seen = g;
        self.conn = self.link.connection();
        true
    }
}
