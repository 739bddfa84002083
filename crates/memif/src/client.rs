//! The client role: create the shared memory, connect, and move frames through it. This is the
//! library a pod's application uses (the examples: an L3 forwarder and a UDP echo server), and
//! what the data plane uses when its memif port is the client.
//!
//! Memory: one region holds every ring (client-to-server rings first, then server-to-client,
//! as DPDK lays them out) and then `2 * 2^log2` buffers per queue pair. Each queue owns its
//! buffers as a pool: it posts free ones on its server-to-client ring for the server to fill,
//! hands received ones to the application, and takes buffers the application filled (or
//! received and rewrote, without copying: the zero-copy mode) onto its client-to-server ring.
//! A buffer comes back to the pool when the server has consumed it.
//!
//! The client writes every descriptor it posts from its own bookkeeping and reads only the
//! length and flags the server wrote (bounded by the buffer's size), so a misbehaving server
//! cannot steer it outside its region either.

use crate::conn::{Connection, RingHandle};
use crate::proto::{self, AddRegion, AddRing, Init, Mode, Msg, MSG_LEN};
use crate::region::Region;
use crate::ring::{self, Desc, Ring, DESC_FLAG_NEXT, RING_FLAG_MASK_INT};
use crate::sock::{self, Recv, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub id: u32,
    pub name: String,
    pub secret: Option<Vec<u8>>,
    pub mode: Mode,
    /// Queue pairs (one ring each way per pair).
    pub queues: u16,
    /// log2 of the slots per ring.
    pub log2_ring: u8,
    /// Bytes per buffer; larger frames are chained over several.
    pub buffer_size: u32,
    /// Put the region on huge pages when there are free ones.
    pub hugepages: bool,
    /// How long to wait for each step of the handshake.
    pub timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            id: 0,
            name: "vectorlb-client".into(),
            secret: None,
            mode: Mode::Ethernet,
            queues: 1,
            log2_ring: 10,
            buffer_size: 2048,
            hugepages: false,
            timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("{0}")]
    Config(String),
    #[error("the server refused: {0}")]
    Refused(String),
    #[error("handshake: {0}")]
    Protocol(String),
    #[error("shared memory: {0}")]
    Region(#[from] crate::region::RegionError),
    #[error("ring: {0}")]
    Ring(#[from] crate::ring::RingError),
    #[error("{what}: {source}")]
    Os { what: &'static str, source: std::io::Error },
}

/// A buffer of a queue's pool: its index and the bytes it holds; `more` chains it to the
/// next buffer of the same frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    pub index: u32,
    pub len: u32,
    pub more: bool,
}

/// The layout of the region a client creates.
#[derive(Debug, Clone, Copy)]
struct Layout {
    queues: u16,
    log2: u8,
    bsize: u32,
}

impl Layout {
    fn ring_len(&self) -> usize {
        ring::ring_len(self.log2)
    }
    /// Ring offsets: C2S ring i at i, S2C ring i at queues + i.
    fn ring_offset(&self, c2s: bool, i: u16) -> usize {
        (i as usize + if c2s { 0 } else { self.queues as usize }) * self.ring_len()
    }
    fn buffers_offset(&self) -> usize {
        2 * self.queues as usize * self.ring_len()
    }
    fn buffers_per_queue(&self) -> u32 {
        2 << self.log2
    }
    fn size(&self) -> usize {
        self.buffers_offset() + self.queues as usize * self.buffers_per_queue() as usize * self.bsize as usize
    }
}

/// A connected client: its control socket and its queues.
pub struct Client {
    ctl: OwnedFd,
    conn: Arc<Connection>,
    pub queues: Vec<ClientQueue>,
    pub server_name: String,
}

fn new_eventfd() -> Result<OwnedFd, ClientError> {
    // SAFETY: creating an eventfd; a fresh descriptor.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(ClientError::Os { what: "eventfd", source: std::io::Error::last_os_error() });
    }
    // SAFETY: fresh and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits for the next message (within `timeout`); a DISCONNECT is the server's refusal.
fn expect(fd: &OwnedFd, timeout: Duration) -> Result<Msg, ClientError> {
    let deadline = Instant::now() + timeout;
    loop {
        match sock::recv(fd).map_err(|e| ClientError::Protocol(e.to_string()))? {
            Recv::Msg { buf, len, .. } => {
                if len != MSG_LEN {
                    return Err(ClientError::Protocol(format!("a message of {len} bytes")));
                }
                return match Msg::decode(&buf).map_err(|e| ClientError::Protocol(e.to_string()))? {
                    Msg::Disconnect { reason, .. } => Err(ClientError::Refused(reason)),
                    m => Ok(m),
                };
            }
            Recv::Closed => return Err(ClientError::Refused("the server closed the connection".into())),
            Recv::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ClientError::Protocol("no answer from the server".into()));
                }
                sock::wait_readable(fd.as_raw_fd(), left.as_millis().max(1) as i32);
            }
        }
    }
}

fn send(fd: &OwnedFd, m: &Msg, attach: Option<&OwnedFd>) -> Result<(), ClientError> {
    sock::send(fd, &m.encode(), attach.map(|f| f.as_raw_fd())).map_err(|e| ClientError::Protocol(format!("sending {}: {e}", m.name())))
}

fn expect_ack(fd: &OwnedFd, after: &str, timeout: Duration) -> Result<(), ClientError> {
    match expect(fd, timeout)? {
        Msg::Ack => Ok(()),
        m => Err(ClientError::Protocol(format!("{} instead of ACK after {after}", m.name()))),
    }
}

impl Client {
    /// Connects to the server at `addr` and completes the handshake.
    pub fn connect(addr: &SocketAddr, cfg: &ClientConfig) -> Result<Client, ClientError> {
        if cfg.queues == 0 || cfg.queues > 256 {
            return Err(ClientError::Config(format!("queues {} is outside 1..=256", cfg.queues)));
        }
        if !(1..=proto::MAX_LOG2_RING).contains(&cfg.log2_ring) {
            return Err(ClientError::Config(format!("ring size 2^{} is outside 2^1..=2^14", cfg.log2_ring)));
        }
        if !(64..=65535).contains(&cfg.buffer_size) || !cfg.buffer_size.is_multiple_of(64) {
            return Err(ClientError::Config(format!("buffer size {} is not a multiple of 64 in 64..=65472", cfg.buffer_size)));
        }
        let ctl = sock::connect(addr).map_err(|source| ClientError::Connect { addr: addr.to_string(), source })?;
        let hello = match expect(&ctl, cfg.timeout)? {
            Msg::Hello(h) => h,
            m => return Err(ClientError::Protocol(format!("{} instead of HELLO", m.name()))),
        };
        if hello.min_version > proto::VERSION || hello.max_version < proto::VERSION {
            return Err(ClientError::Protocol(format!("the server speaks versions {:#x}..={:#x}, not 2.0", hello.min_version, hello.max_version)));
        }
        let queues = cfg.queues.min(hello.max_c2s_ring.saturating_add(1)).min(hello.max_s2c_ring.saturating_add(1));
        let log2 = cfg.log2_ring.min(hello.max_log2_ring_size).max(1);
        let layout = Layout { queues, log2, bsize: cfg.buffer_size };
        let region = Region::create("memif region 0", layout.size() as u64, cfg.hugepages)?;
        let mut c2s = Vec::new();
        let mut s2c = Vec::new();
        for dir in [true, false] {
            for i in 0..queues {
                let off = layout.ring_offset(dir, i);
                let r = Ring::new(&region, off as u64, log2)?;
                r.init();
                let h = RingHandle { ring: r, region: 0, offset: off as u32, eventfd: new_eventfd()? };
                if dir {
                    c2s.push(h)
                } else {
                    s2c.push(h)
                }
            }
        }
        let t = cfg.timeout;
        let secret = cfg.secret.clone().unwrap_or_default();
        send(&ctl, &Msg::Init(Init { version: proto::VERSION, id: cfg.id, mode: cfg.mode as u8, secret, name: cfg.name.clone() }), None)?;
        expect_ack(&ctl, "INIT", t)?;
        // SAFETY: dup of the region's descriptor, to lend to the message.
        let rfd = unsafe { OwnedFd::from_raw_fd(libc::dup(region.fd())) };
        send(&ctl, &Msg::AddRegion(AddRegion { index: 0, size: region.len() as u64 }), Some(&rfd))?;
        drop(rfd);
        expect_ack(&ctl, "ADD_REGION", t)?;
        for (list, flags) in [(&c2s, proto::RING_FLAG_C2S), (&s2c, 0)] {
            for (i, h) in list.iter().enumerate() {
                let m = Msg::AddRing(AddRing { flags, index: i as u16, region: 0, offset: h.offset, log2_size: log2, private_hdr_size: 0 });
                send(&ctl, &m, Some(&h.eventfd))?;
                expect_ack(&ctl, "ADD_RING", t)?;
            }
        }
        send(&ctl, &Msg::Connect { if_name: cfg.name.clone() }, None)?;
        match expect(&ctl, t)? {
            Msg::Connected { .. } => {}
            m => return Err(ClientError::Protocol(format!("{} instead of CONNECTED", m.name()))),
        }
        for h in c2s.iter().chain(&s2c) {
            h.ring.set_head(0);
            h.ring.set_tail(0);
        }
        for h in &s2c {
            h.ring.set_flags(RING_FLAG_MASK_INT);
        }
        let conn = Arc::new(Connection { c2s, s2c, regions: vec![region], peer: hello.name.clone(), buffer_size: cfg.buffer_size });
        let queues = (0..queues).map(|q| ClientQueue::new(conn.clone(), layout, q)).collect();
        Ok(Client { ctl, conn, queues, server_name: hello.name })
    }

    /// Whether the server is still there: false once it closed the socket or sent DISCONNECT
    /// (with the reason).
    pub fn check(&self) -> Result<(), String> {
        match sock::recv(&self.ctl) {
            Ok(Recv::WouldBlock) => Ok(()),
            Ok(Recv::Closed) => Err("the server closed the connection".into()),
            Ok(Recv::Msg { buf, .. }) => match Msg::decode(&buf) {
                Ok(Msg::Disconnect { reason, .. }) => Err(format!("the server disconnected: {reason}")),
                _ => Err("unexpected message from the server".into()),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    /// Leaves with a reason.
    pub fn disconnect(self, reason: &str) {
        let _ = sock::send(&self.ctl, &Msg::Disconnect { code: 0, reason: reason.into() }.encode(), None);
    }

    pub fn connection(&self) -> &Arc<Connection> {
        &self.conn
    }

    pub fn control_fd(&self) -> i32 {
        self.ctl.as_raw_fd()
    }
}

/// One queue pair of a client, with its buffer pool.
pub struct ClientQueue {
    conn: Arc<Connection>,
    q: u16,
    base: *mut u8,
    bsize: u32,
    /// Offset of buffer 0 of this queue in the region.
    first: u64,
    free: Vec<u32>,
    /// Which buffer each slot of the rings holds (by slot & mask).
    c2s_slot: Vec<u32>,
    s2c_slot: Vec<u32>,
    /// Our positions: C2S slots below `c2s_head` are posted; below `c2s_done` given back.
    c2s_head: u16,
    c2s_done: u16,
    s2c_head: u16,
    s2c_read: u16,
    mask: u16,
    nbufs: u32,
    /// Frames or lengths the server got wrong.
    pub bad: u64,
    /// Why the server broke a ring (moved its index past what we posted): the queue is
    /// unusable and the connection should be dropped.
    broken: Option<String>,
    /// The data plane's client port reported `broken` (once).
    pub(crate) reported: bool,
}

// SAFETY: `base` points into the connection's region, which the queue keeps alive through its
// Arc; the queue moves between threads as a whole and is used by one at a time (&mut).
unsafe impl Send for ClientQueue {}

impl ClientQueue {
    fn new(conn: Arc<Connection>, layout: Layout, q: u16) -> ClientQueue {
        let n = layout.buffers_per_queue();
        let first = layout.buffers_offset() as u64 + q as u64 * n as u64 * layout.bsize as u64;
        let base = conn.regions[0].base();
        let size = 1usize << layout.log2;
        let mut cq = ClientQueue {
            conn,
            q,
            base,
            bsize: layout.bsize,
            first,
            free: (0..n).rev().collect(),
            c2s_slot: vec![0; size],
            s2c_slot: vec![0; size],
            c2s_head: 0,
            c2s_done: 0,
            s2c_head: 0,
            s2c_read: 0,
            mask: (size - 1) as u16,
            nbufs: n,
            bad: 0,
            broken: None,
            reported: false,
        };
        cq.refill();
        cq
    }

    pub fn buffer_size(&self) -> u32 {
        self.bsize
    }

    fn c2s(&self) -> &RingHandle {
        &self.conn.c2s[self.q as usize]
    }

    fn s2c(&self) -> &RingHandle {
        &self.conn.s2c[self.q as usize]
    }

    pub(crate) fn buf_ptr(&self, index: u32) -> *mut u8 {
        // A Buf the application made up points at buffer 0 (its fields are public).
        let index = if index < self.nbufs { index } else { 0 };
        // SAFETY: index < nbufs, so the buffer lies inside the region (Layout::size).
        unsafe { self.base.add((self.first + index as u64 * self.bsize as u64) as usize) }
    }

    /// The bytes of a buffer the application holds.
    pub fn data(&self, b: Buf) -> &[u8] {
        // SAFETY: the buffer is the application's (received or allocated, not posted), so a
        // server that follows the protocol does not write it; at most bsize bytes.
        unsafe { std::slice::from_raw_parts(self.buf_ptr(b.index), b.len.min(self.bsize) as usize) }
    }

    /// The whole buffer, to write a frame into (then set `Buf::len`).
    pub fn data_mut(&mut self, b: Buf) -> &mut [u8] {
        // SAFETY: as data(); &mut self keeps it exclusive on our side.
        unsafe { std::slice::from_raw_parts_mut(self.buf_ptr(b.index), self.bsize as usize) }
    }

    /// Takes back buffers the server consumed from the client-to-server ring.
    fn reclaim(&mut self) {
        let tail = self.c2s().ring.tail();
        let n = tail.wrapping_sub(self.c2s_done);
        if n > self.c2s_head.wrapping_sub(self.c2s_done) {
            self.bad += 1;
            self.break_ring(format!("client-to-server ring {}: tail {tail} is {n} slots past {} with {} sent", self.q, self.c2s_done, self.c2s_head.wrapping_sub(self.c2s_done)));
            return;
        }
        for i in 0..n {
            let slot = self.c2s_done.wrapping_add(i) & self.mask;
            self.free.push(self.c2s_slot[slot as usize]);
        }
        self.c2s_done = tail;
    }

    /// Posts free buffers on the server-to-client ring.
    fn refill(&mut self) {
        let r = self.s2c().ring;
        let room = r.size() - self.s2c_head.wrapping_sub(self.s2c_read);
        let n = room.min(self.free.len() as u16);
        if n == 0 {
            return;
        }
        for i in 0..n {
            let b = self.free.pop().expect("counted");
            let slot = self.s2c_head.wrapping_add(i);
            self.s2c_slot[(slot & self.mask) as usize] = b;
            r.set_desc(slot, Desc { flags: 0, region: 0, length: self.bsize, offset: (self.first + b as u64 * self.bsize as u64) as u32, metadata: 0 });
        }
        self.s2c_head = self.s2c_head.wrapping_add(n);
        r.set_head(self.s2c_head);
    }

    fn break_ring(&mut self, why: String) {
        if self.broken.is_none() {
            self.broken = Some(why);
        }
    }

    /// Why the server broke one of this queue's rings, if it did: nothing more will be
    /// received or reclaimed on it; drop the connection and connect again.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Receives up to `max` buffers (whole frames; a frame's buffers are chained with
    /// `more`) into `out`; the application owns them until it sends or frees them.
    pub fn recv(&mut self, out: &mut Vec<Buf>, max: usize) -> usize {
        let r = self.s2c().ring;
        let tail = r.tail();
        let avail = tail.wrapping_sub(self.s2c_read);
        if avail > self.s2c_head.wrapping_sub(self.s2c_read) {
            self.bad += 1;
            self.break_ring(format!(
                "server-to-client ring {}: tail {tail} is {avail} slots past {} with {} posted",
                self.q,
                self.s2c_read,
                self.s2c_head.wrapping_sub(self.s2c_read)
            ));
            return 0;
        }
        let start = out.len();
        let mut i: u16 = 0;
        let mut frame_start = out.len();
        while i < avail && out.len() - start < max {
            let slot = self.s2c_read.wrapping_add(i);
            let d = r.desc(slot);
            let len = d.length.min(self.bsize);
            if d.length > self.bsize {
                self.bad += 1;
            }
            let more = d.flags & DESC_FLAG_NEXT != 0;
            out.push(Buf { index: self.s2c_slot[(slot & self.mask) as usize], len, more });
            i += 1;
            if !more {
                frame_start = out.len();
            }
        }
        // An unfinished chain stays in the ring for the next call.
        let keep = out.len() - frame_start;
        out.truncate(frame_start);
        let taken = i - keep as u16;
        self.s2c_read = self.s2c_read.wrapping_add(taken);
        self.refill_after_recv();
        out.len() - start
    }

    fn refill_after_recv(&mut self) {
        self.reclaim();
        self.refill();
    }

    /// Gives buffers back to the pool.
    pub fn free(&mut self, bufs: &mut Vec<Buf>) {
        self.free.extend(bufs.drain(..).map(|b| b.index));
    }

    /// Allocates the buffers for a frame of `len` bytes (chained when longer than one).
    pub fn alloc(&mut self, len: usize, out: &mut Vec<Buf>) -> bool {
        let n = len.div_ceil(self.bsize as usize).max(1);
        if self.free.len() < n {
            self.reclaim();
            if self.free.len() < n {
                return false;
            }
        }
        let mut left = len;
        for k in 0..n {
            let take = left.min(self.bsize as usize);
            left -= take;
            out.push(Buf { index: self.free.pop().expect("counted"), len: take as u32, more: k + 1 < n });
        }
        true
    }

    /// Sends whole frames from the front of `bufs` (zero-copy: the buffers themselves);
    /// returns how many buffers went. The rest stay with the caller.
    pub fn send(&mut self, bufs: &mut Vec<Buf>) -> usize {
        self.reclaim();
        let r = self.c2s().ring;
        let room = r.size() - self.c2s_head.wrapping_sub(self.c2s_done);
        let mut n = 0usize;
        let mut frame_end = 0usize;
        while n < bufs.len() && n < room as usize {
            let mut b = bufs[n];
            b.len = b.len.min(self.bsize);
            if b.index >= self.nbufs {
                b.index = 0;
            }
            let slot = self.c2s_head.wrapping_add(n as u16);
            self.c2s_slot[(slot & self.mask) as usize] = b.index;
            let flags = if b.more { DESC_FLAG_NEXT } else { 0 };
            r.set_desc(slot, Desc { flags, region: 0, length: b.len, offset: (self.first + b.index as u64 * self.bsize as u64) as u32, metadata: 0 });
            n += 1;
            if !b.more {
                frame_end = n;
            }
        }
        if frame_end > 0 {
            self.c2s_head = self.c2s_head.wrapping_add(frame_end as u16);
            r.set_head(self.c2s_head);
            self.c2s().notify();
            bufs.drain(..frame_end);
        }
        frame_end
    }

    /// Copies `frame` into buffers and sends it; false when the pool or the ring is full.
    pub fn send_copy(&mut self, frame: &[u8]) -> bool {
        let mut bufs = Vec::with_capacity(2);
        if !self.alloc(frame.len(), &mut bufs) {
            return false;
        }
        let mut off = 0;
        for b in &bufs {
            let dst = self.buf_ptr(b.index);
            // SAFETY: the buffer is ours (just allocated) and has bsize >= b.len bytes.
            unsafe { std::ptr::copy_nonoverlapping(frame[off..].as_ptr(), dst, b.len as usize) };
            off += b.len as usize;
        }
        if self.send(&mut bufs) == 0 {
            self.free(&mut bufs);
            return false;
        }
        true
    }

    /// Receives whole frames, each copied into `frame` and passed to `f`; returns how many.
    pub fn recv_copy(&mut self, max_frames: usize, frame: &mut Vec<u8>, mut f: impl FnMut(&[u8])) -> usize {
        let mut bufs = Vec::with_capacity(64);
        self.recv(&mut bufs, max_frames);
        let mut n = 0;
        frame.clear();
        for b in &bufs {
            frame.extend_from_slice(self.data(*b));
            if !b.more {
                f(frame);
                frame.clear();
                n += 1;
            }
        }
        self.free(&mut bufs);
        n
    }

    /// Interrupt mode: asks the server to signal this queue's eventfd and waits up to
    /// `timeout_ms` for frames; then back to polling.
    pub fn wait(&mut self, timeout_ms: i32) -> bool {
        let h = self.s2c();
        if h.ring.tail() != self.s2c_read {
            return true;
        }
        h.ring.set_flags(0);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let ready = h.ring.tail() != self.s2c_read || sock::wait_readable(h.eventfd.as_raw_fd(), timeout_ms);
        h.drain();
        h.ring.set_flags(RING_FLAG_MASK_INT);
        ready
    }

    /// Slots free on the client-to-server ring (after taking back what the server consumed).
    pub fn tx_room(&mut self) -> u16 {
        self.reclaim();
        self.c2s().ring.size() - self.c2s_head.wrapping_sub(self.c2s_done)
    }

    pub fn connection(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// Buffers in the pool (free), for tests.
    pub fn free_buffers(&self) -> usize {
        self.free.len()
    }
}
