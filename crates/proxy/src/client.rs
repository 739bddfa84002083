//! What a client may take, and what happens past it.
//!
//! * [`Admission`]: client connections per listener and in all. At a limit one connection is
//!   closed to make room: first one that owes the proxy progress (a request head or TLS
//!   handshake still coming, or a request in flight that has fallen behind `min_rate`: a slow
//!   body, a slow reader), the one that fell behind longest ago; else the keep-alive connection
//!   idle longest, as nginx reuses its idle connections. A connection whose requests move at
//!   `min_rate` or faster, or whose last response is not yet written and acknowledged, is never
//!   closed for another; with none to close, the new one is closed at once.
//! * [`Conn`]: one connection's state, shared by its task, its I/O ([`Watched`]) and its
//!   requests ([`StreamGuard`]). Its task runs a [`Watchdog`] that enforces the deadlines
//!   (header, idle, send and its minimum rate), ranks it for eviction, and carries out orders
//!   from elsewhere (evicted, over its reset budget).
//! * [`ClientBody`]: a request body with its deadline (a gap and a minimum rate), telling a
//!   client's framing error or silence (the client's fault: 400, 408) from an upstream's;
//!   [`Budget`]: the memory request bodies may be buffered in, per connection and in all.
//!
//! Times here are milliseconds on one process-wide clock ([`now_ms`]), so that connections
//! compare and atomics hold them.

use crate::body::{BodyError, ProxyBody};
use crate::config::ClientLimits;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Milliseconds since the first call in this process (a monotonic clock).
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The default of `max_connections` (all listeners): what the descriptor limit in force
/// serves ([`crate::config::connections_for`]).
pub fn default_max_connections() -> usize {
    crate::config::connections_for(nofile_limit())
}

/// The soft descriptor limit in force (1,024 if it cannot be read).
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limits into `r`, a valid struct owned by this frame.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur
    } else {
        1024
    }
}

/// Raises the soft descriptor limit to the hard one; the limit in force. A proxy with
/// thousands of clients needs more than the usual 1,024, and the hard limit is what the
/// operator allowed (systemd's LimitNOFILE, ulimit -Hn).
pub fn raise_nofile_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit with a valid struct owned by this frame; raising the soft
    // limit up to the hard one needs no privilege.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return r.rlim_max;
            }
        }
    }
    r.rlim_cur
}

/// Counters of one listener's clients (the admin API shows them).
#[derive(Debug, Default)]
pub struct ClientStats {
    pub connections: AtomicU64,
    /// Closed at once: a limit was reached and no connection could make room.
    pub refused: AtomicU64,
    /// Closed to make room for a new one.
    pub evicted: AtomicU64,
    pub header_timeouts: AtomicU64,
    pub idle_closed: AtomicU64,
    pub body_timeouts: AtomicU64,
    /// Responses the client did not take within `send_timeout` (released upstream).
    pub send_timeouts: AtomicU64,
    /// Connections sent GOAWAY for resetting more streams than their budget.
    pub reset_budget_exceeded: AtomicU64,
    /// Requests answered 400 or 408 for the client's own fault (a bad head, authority or
    /// body framing, a body deadline).
    pub client_errors: AtomicU64,
}

fn inc(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// What a connection's task is told to do by others.
const ORDER_NONE: u8 = 0;
/// Close now (evicted to make room).
const ORDER_CLOSE: u8 = 1;
/// Send GOAWAY and close soon (over the reset budget).
const ORDER_GOAWAY: u8 = 2;

/// Eviction ranks ([`Conn::evict_key`]): a class in the top bits, a time (ms) below; the
/// lowest key is closed first.
/// A connection that owes progress: no request served yet (handshake, first head), a next head
/// coming in, or a request in flight behind `min_rate`. The time: since when it owes.
const OWING: u64 = 0;
/// An idle keep-alive connection that has served requests. The time: since when it is idle.
const IDLE: u64 = 1 << 62;
/// Not to be closed for another: requests moving at `min_rate`, or a response not yet
/// written and acknowledged.
const KEEP: u64 = u64::MAX;
/// How long a connection that has sent nothing yet is not closed for another (unless nothing
/// else can be): a client whose request head is there but not yet read must not go before one
/// that sent half a head.
const FRESH_MS: u64 = 1000;
/// The same from its first bytes: a whole request head makes it busy within microseconds, but
/// the thread reading it may be preempted in between.
const SPOKE_MS: u64 = 20;

/// One client connection.
pub struct Conn {
    pub accepted_ms: u64,
    stats: Arc<ClientStats>,
    limits: ClientLimits,
    /// The client's socket, for the bytes it has not yet acknowledged (TIOCOUTQ); -1: none
    /// (tests). Only the [`Watchdog`] uses it, which lives while the socket is open.
    fd: std::os::fd::RawFd,
    /// Bytes read from and written to the client (after TLS), by [`Watched`].
    read: AtomicU64,
    written: AtomicU64,
    /// A write is waiting for the client to take what was sent.
    write_blocked: AtomicBool,
    /// The connection speaks HTTP/2.
    h2: AtomicBool,
    requests: AtomicU64,
    streams: Mutex<Streams>,
    /// (window start ms, resets in it).
    resets: Mutex<(u64, u32)>,
    order: AtomicU8,
    /// The connection's task, woken by an order (one task polls it: an atomic slot, no lock).
    wake: futures_util::task::AtomicWaker,
    /// Its rank for eviction (OWING, IDLE, KEEP above), kept by the watchdog and by requests
    /// starting.
    evict_key: AtomicU64,
    /// Request bodies waiting for the client's next bytes now ([`ClientBody`]).
    bodies_waiting: AtomicU32,
    /// Request bodies buffered for this connection, in bytes ([`Budget`]).
    buffered: AtomicUsize,
    /// The memory of all buffered request bodies.
    memory: Arc<Budget>,
    /// Per endpoint: this connection's share of the endpoint's connections.
    shares: Mutex<Vec<(SocketAddr, Arc<tokio::sync::Semaphore>)>>,
}

struct Streams {
    live: Vec<Arc<Stream>>,
    /// When the last stream ended (or the connection was accepted), and the bytes read then.
    /// u64::MAX: it ended, and the watchdog dates it once the response is written and
    /// acknowledged (so that the end of a request reads no clock and makes no system call).
    idle_since: u64,
    read_at_idle: u64,
}

/// One request on a connection, from its head to the end of its response.
pub struct Stream {
    /// The request went to an upstream (a reset of it then costs the client's budget).
    forwarded: AtomicBool,
    /// The response body, once there: taken away when it stalls.
    body: Mutex<Option<ProxyBody>>,
    /// Frames the response body has given, and whether it now waits for its source: a body
    /// that gave a frame and is not asked for the next one waits for the client. Counters, not
    /// times, so that the path of every frame reads no clock; the watchdog times them.
    frames: AtomicU64,
    waiting: AtomicBool,
    /// The watchdog's own: the frame count at its last look, and since when (ms) it has not
    /// moved while the body was ready (u64::MAX: it moved).
    seen: AtomicU64,
    still_since: AtomicU64,
    ended: AtomicBool,
    /// Its body was taken away after the client stalled for `send_timeout`.
    released: AtomicBool,
}

impl Conn {
    /// A connection on socket `fd` (-1: none), its request bodies buffered within `memory`.
    pub fn new(limits: ClientLimits, stats: Arc<ClientStats>, fd: std::os::fd::RawFd, memory: Arc<Budget>) -> Arc<Conn> {
        let now = now_ms();
        inc(&stats.connections);
        Arc::new(Conn {
            accepted_ms: now,
            stats,
            limits,
            fd,
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
            write_blocked: AtomicBool::new(false),
            h2: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            streams: Mutex::new(Streams { live: Vec::new(), idle_since: now, read_at_idle: 0 }),
            resets: Mutex::new((now, 0)),
            order: AtomicU8::new(ORDER_NONE),
            wake: futures_util::task::AtomicWaker::new(),
            evict_key: AtomicU64::new(OWING + now + FRESH_MS),
            bodies_waiting: AtomicU32::new(0),
            buffered: AtomicUsize::new(0),
            memory,
            shares: Mutex::new(Vec::new()),
        })
    }

    /// The TLS handshake is done: the first request head is due from now.
    pub fn handshake_done(&self) {
        let now = now_ms();
        let mut st = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if st.live.is_empty() {
            st.idle_since = now;
            self.evict_key.store(OWING + now + FRESH_MS, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    pub fn limits(&self) -> &ClientLimits {
        &self.limits
    }

    /// `n` bytes read from the client.
    fn got(&self, n: u64) {
        if self.read.fetch_add(n, Ordering::Relaxed) == 0 && self.requests.load(Ordering::Relaxed) == 0 {
            // Its first bytes. A whole request head makes it busy at once (Conn::start); half of
            // one leaves it first in line to be closed for another, SPOKE_MS from now.
            self.evict_key.store(OWING + now_ms() + SPOKE_MS, Ordering::Relaxed);
        }
    }

    /// Told to go (evicted, or over its reset budget): nothing more of it goes upstream.
    pub fn going(&self) -> bool {
        self.order.load(Ordering::Relaxed) != ORDER_NONE
    }

    /// This connection's share of the connections of endpoint `addr` (`max` of them):
    /// `share` of them, at least one. The same semaphore for every request of the connection.
    pub fn share(&self, addr: SocketAddr, max: usize, share: f64) -> Arc<tokio::sync::Semaphore> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = shares.iter().find(|(a, _)| *a == addr) {
            return s.clone();
        }
        let n = ((max as f64 * share).ceil() as usize).clamp(1, max.max(1));
        let s = Arc::new(tokio::sync::Semaphore::new(n));
        shares.push((addr, s.clone()));
        s
    }

    /// Memory for `n` more bytes of buffered request body, within this connection's budget
    /// (`connection_buffer`) and the process's; false (nothing taken) when either is spent.
    pub fn take_buffer(&self, n: usize) -> bool {
        let before = self.buffered.fetch_add(n, Ordering::Relaxed);
        if before + n > self.limits.connection_buffer || !self.memory.take(n) {
            self.buffered.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Gives back what [`Conn::take_buffer`] took.
    pub fn give_buffer(&self, n: usize) {
        self.buffered.fetch_sub(n, Ordering::Relaxed);
        self.memory.give(n);
    }

    /// A request arrived: its stream, in flight until the guard (or the response body it
    /// becomes part of) is dropped.
    pub fn start(self: &Arc<Self>, version: hyper::Version) -> StreamGuard {
        if version == hyper::Version::HTTP_2 {
            self.h2.store(true, Ordering::Relaxed);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let s = Arc::new(Stream {
            forwarded: AtomicBool::new(false),
            body: Mutex::new(None),
            frames: AtomicU64::new(0),
            waiting: AtomicBool::new(true),
            seen: AtomicU64::new(0),
            still_since: AtomicU64::new(u64::MAX),
            ended: AtomicBool::new(false),
            released: AtomicBool::new(false),
        });
        let mut st = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        st.live.push(s.clone());
        self.evict_key.store(KEEP, Ordering::Relaxed);
        StreamGuard { conn: self.clone(), stream: s }
    }

    fn end(&self, s: &Arc<Stream>) {
        let ended = s.ended.load(Ordering::Relaxed) || s.body.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|b| b.is_end_stream());
        {
            let mut st = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = st.live.iter().position(|x| Arc::ptr_eq(x, s)) {
                st.live.swap_remove(i);
            }
            if st.live.is_empty() {
                // Not idle yet: the response may still be on its way to the client (hyper's
                // buffer, the socket's). The watchdog dates the idle time once it is not.
                st.idle_since = u64::MAX;
                st.read_at_idle = self.read.load(Ordering::Relaxed);
            }
        }
        if s.forwarded.load(Ordering::Relaxed) && !ended && !s.released.load(Ordering::Relaxed) {
            self.count_reset();
        }
    }

    /// A stream ended before its response did, after its request went upstream: the client
    /// reset it (or closed). Past the budget in the window, the connection is told to go, and
    /// from then on none of its requests goes upstream ([`Conn::going`]).
    fn count_reset(&self) {
        let now = now_ms();
        let over = {
            let mut r = self.resets.lock().unwrap_or_else(|e| e.into_inner());
            if now.saturating_sub(r.0) >= self.limits.reset_window.as_millis() as u64 {
                *r = (now, 0);
            }
            r.1 += 1;
            r.1 == self.limits.reset_budget + 1
        };
        if over {
            inc(&self.stats.reset_budget_exceeded);
            tracing::warn!("a client reset more than {} streams in {:?} after their requests went upstream: GOAWAY", self.limits.reset_budget, self.limits.reset_window);
            self.order(ORDER_GOAWAY);
        }
    }

    fn order(&self, o: u8) {
        if self.order.fetch_max(o, Ordering::Relaxed) < o {
            self.wake.wake();
        }
    }

    /// Resolves when another part of the proxy orders this connection to close.
    pub async fn ordered(&self) {
        std::future::poll_fn(|cx| {
            if self.order.load(Ordering::Relaxed) != ORDER_NONE {
                return Poll::Ready(());
            }
            self.wake.register(cx.waker());
            if self.order.load(Ordering::Relaxed) != ORDER_NONE {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// Memory that buffered request bodies may take in all (`buffer_memory`); a body that would
/// go over it is streamed instead.
#[derive(Debug)]
pub struct Budget {
    limit: AtomicUsize,
    used: AtomicUsize,
}

impl Budget {
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget { limit: AtomicUsize::new(limit), used: AtomicUsize::new(0) })
    }

    /// A reload's new limit (what is held stays held).
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: usize) -> bool {
        let before = self.used.fetch_add(n, Ordering::Relaxed);
        if before + n > self.limit.load(Ordering::Relaxed) {
            self.used.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A request in flight; dropped when its response has gone (or the client gave up on it).
pub struct StreamGuard {
    conn: Arc<Conn>,
    stream: Arc<Stream>,
}

impl StreamGuard {
    /// The request goes to an upstream: from now on a reset of it costs the client's budget.
    pub fn forwarded(&self) {
        self.stream.forwarded.store(true, Ordering::Relaxed);
    }

    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The response body, watched: the connection sees its progress and may release it.
    pub fn body(self, body: ProxyBody) -> ProxyBody {
        *self.stream.body.lock().unwrap_or_else(|e| e.into_inner()) = Some(body);
        http_body_util::BodyExt::boxed(Tracked { guard: self })
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.conn.end(&self.stream);
    }
}

/// A response body in flight on a watched connection.
struct Tracked {
    guard: StreamGuard,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let s = &self.guard.stream;
        let mut slot = s.body.lock().unwrap_or_else(|e| e.into_inner());
        let Some(body) = slot.as_mut() else {
            return Poll::Ready(if s.released.load(Ordering::Relaxed) { Some(Err("the client did not take the response within send_timeout".into())) } else { None });
        };
        let r = Pin::new(body).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(_))) => {
                // Only this body writes these: no read-modify-write needed.
                s.frames.store(s.frames.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                s.waiting.store(false, Ordering::Relaxed);
            }
            Poll::Pending => s.waiting.store(true, Ordering::Relaxed),
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                s.ended.store(true, Ordering::Relaxed);
                s.waiting.store(true, Ordering::Relaxed);
                // Let go of the source at once (an upstream connection back to its pool).
                *slot = None;
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        let s = &self.guard.stream;
        s.body.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(!s.released.load(Ordering::Relaxed), |b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.guard.stream.body.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|b| b.size_hint()).unwrap_or_default()
    }
}

/// A client's stream (after TLS) that counts what moves and notes writes that wait.
pub struct Watched<S> {
    inner: S,
    conn: Arc<Conn>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, conn: Arc<Conn>) -> Watched<S> {
        Watched { inner, conn }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.conn.got(n as u64);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> Watched<S> {
    fn wrote(&self, r: &Poll<std::io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) => {
                self.conn.written.fetch_add(*n as u64, Ordering::Relaxed);
                self.conn.write_blocked.store(false, Ordering::Relaxed);
            }
            Poll::Pending => self.conn.write_blocked.store(true, Ordering::Relaxed),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&r);
        r
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if r.is_pending() {
            self.conn.write_blocked.store(true, Ordering::Relaxed);
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the watchdog decides at a check.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do; look again at this time (ms).
    Until(u64),
    /// Close the connection now.
    Close(&'static str),
    /// Send GOAWAY (HTTP/2) and close once the streams left are done or `grace` has passed.
    GoAway(&'static str),
}

/// The deadlines of one connection, checked by its task, and its rank for eviction.
pub struct Watchdog {
    conn: Arc<Conn>,
    /// When bytes of a next request head were first seen on an idle HTTP/1.1 connection.
    head_since: Option<u64>,
    /// When it last looked, and the bytes read and written then.
    last_look: u64,
    last_read: u64,
    last_written: u64,
    /// Bytes of an ended response the client had not acknowledged at the last look.
    last_unacked: u64,
    /// How far (ms) the client is behind `min_rate` in taking responses, and in sending request
    /// bodies (the second only ranks the connection: a body's deadline is its [`ClientBody`]'s).
    send_lag: u64,
    recv_lag: u64,
}

/// How often a connection with requests in flight looks at them, at most.
const TICK_MS: u64 = 1000;

/// How soon a connection looks again while a response that ended is still on its way.
const SETTLE_MS: u64 = 50;

/// Bytes written to socket `fd` that its peer has not acknowledged yet (0 without a socket).
fn unacked(fd: std::os::fd::RawFd) -> u64 {
    if fd < 0 {
        return 0;
    }
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is the connection's socket, open while its watchdog (the only caller) lives:
    // the watchdog runs inside the task that owns the socket. TIOCOUTQ writes one c_int.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    if r == 0 {
        n.max(0) as u64
    } else {
        0
    }
}

/// A minimum-rate account (a leaky bucket): `lag` ms behind, after `elapsed` ms in which the
/// proxy waited for the client (`waiting`) and `moved` bytes moved; every byte pays back
/// 1000 / `min_rate` ms (min_rate 0: any byte pays it all, a plain gap deadline).
fn pay(lag: u64, waiting: bool, elapsed: u64, moved: u64, min_rate: u64) -> u64 {
    let lag = if waiting { lag + elapsed } else { lag };
    match (moved, min_rate) {
        (0, _) => lag,
        (_, 0) => 0,
        (m, r) => lag.saturating_sub(m.saturating_mul(1000) / r),
    }
}

impl Watchdog {
    pub fn new(conn: Arc<Conn>) -> Watchdog {
        let (read, written) = (conn.read.load(Ordering::Relaxed), conn.written.load(Ordering::Relaxed));
        Watchdog { conn, head_since: None, last_look: now_ms(), last_read: read, last_written: written, last_unacked: 0, send_lag: 0, recv_lag: 0 }
    }

    /// Looks at the connection at `now` (ms).
    pub fn check(&mut self, now: u64) -> Verdict {
        let c = &self.conn;
        match c.order.load(Ordering::Relaxed) {
            // An HTTP/2 connection ends its streams' data first (HTTP/2's own buffers hold what
            // the proxy cannot see).
            ORDER_CLOSE if c.h2.load(Ordering::Relaxed) => return Verdict::GoAway("evicted"),
            ORDER_CLOSE => return Verdict::Close("evicted"),
            ORDER_GOAWAY => return Verdict::GoAway("over its reset budget"),
            _ => {}
        }
        let l = &c.limits;
        let ms = |d: Duration| d.as_millis() as u64;
        let tick = ms(l.send_timeout).min(ms(l.body_timeout)).min(ms(l.header_timeout)).div_ceil(2).clamp(50, TICK_MS);
        let elapsed = now.saturating_sub(self.last_look);
        self.last_look = now;
        let (read, written) = (c.read.load(Ordering::Relaxed), c.written.load(Ordering::Relaxed));
        let (got, sent) = (read.saturating_sub(self.last_read), written.saturating_sub(self.last_written));
        (self.last_read, self.last_written) = (read, written);
        let blocked = c.write_blocked.load(Ordering::Relaxed);
        let send = ms(l.send_timeout);
        let mut st = c.streams.lock().unwrap_or_else(|e| e.into_inner());
        if st.live.is_empty() {
            self.recv_lag = 0;
            if st.idle_since == u64::MAX {
                // A response ended. The connection is idle once hyper has written it all and
                // the client has acknowledged it; until then closing it would cut it short.
                let unacked = if blocked { None } else { Some(unacked(c.fd)) };
                if unacked != Some(0) {
                    let acked = unacked.map_or(0, |u| self.last_unacked.saturating_sub(u));
                    self.last_unacked = unacked.unwrap_or(self.last_unacked);
                    self.send_lag = pay(self.send_lag, true, elapsed, sent + acked, l.min_rate);
                    if self.send_lag >= send {
                        inc(&c.stats.send_timeouts);
                        return Verdict::Close("the client took its response slower than min_rate for send_timeout");
                    }
                    c.evict_key.store(if self.send_lag > 0 { OWING + now.saturating_sub(self.send_lag) } else { KEEP }, Ordering::Relaxed);
                    return Verdict::Until(now + SETTLE_MS.min(tick));
                }
                self.last_unacked = 0;
                st.idle_since = now;
            }
            self.send_lag = 0;
            let h2 = c.h2.load(Ordering::Relaxed);
            let deadline = if c.requests.load(Ordering::Relaxed) == 0 {
                // The first request: its head within header_timeout of the connection.
                self.head_since = None;
                st.idle_since + ms(l.header_timeout)
            } else if !h2 && read > st.read_at_idle {
                // A next request head is coming in.
                let since = *self.head_since.get_or_insert(now);
                since + ms(l.header_timeout)
            } else {
                self.head_since = None;
                st.idle_since + ms(l.idle_timeout)
            };
            let rank = match self.head_since {
                _ if c.requests.load(Ordering::Relaxed) == 0 => OWING + st.idle_since + if read == 0 { FRESH_MS } else { SPOKE_MS },
                Some(h) => OWING + h,
                None => IDLE + st.idle_since,
            };
            c.evict_key.store(rank, Ordering::Relaxed);
            if now >= deadline {
                let header = c.requests.load(Ordering::Relaxed) == 0 || self.head_since.is_some();
                return if header {
                    inc(&c.stats.header_timeouts);
                    Verdict::Close("no whole request head within header_timeout")
                } else {
                    inc(&c.stats.idle_closed);
                    if h2 {
                        Verdict::GoAway("idle for idle_timeout")
                    } else {
                        Verdict::Close("idle for idle_timeout")
                    }
                };
            }
            return Verdict::Until(deadline.min(now + tick));
        }
        self.head_since = None;
        self.last_unacked = 0;
        // Behind min_rate: in taking responses (a write waits for the client), and in sending
        // request bodies (a body waits for the client's bytes).
        self.send_lag = pay(self.send_lag, blocked, elapsed, sent, l.min_rate);
        self.recv_lag = pay(self.recv_lag, c.bodies_waiting.load(Ordering::Relaxed) > 0, elapsed, got, l.min_rate);
        if self.send_lag >= send {
            inc(&c.stats.send_timeouts);
            return Verdict::Close("the client took its responses slower than min_rate for send_timeout");
        }
        let lag = self.send_lag.max(self.recv_lag);
        let mut rank = if lag > 0 { OWING + now.saturating_sub(lag) } else { KEEP };
        // Responses whose next frame the client has not come back for in send_timeout: their
        // sources (upstream connections, files) are released. Until then such a stream makes
        // its connection owe progress (an HTTP/2 client with closed windows writes nothing, so
        // no write waits).
        let mut released = 0;
        for s in &st.live {
            let frames = s.frames.load(Ordering::Relaxed);
            let ready = frames > 0 && !s.waiting.load(Ordering::Relaxed) && !s.ended.load(Ordering::Relaxed);
            if !ready || frames != s.seen.swap(frames, Ordering::Relaxed) {
                s.still_since.store(u64::MAX, Ordering::Relaxed);
                continue;
            }
            let since = match s.still_since.load(Ordering::Relaxed) {
                u64::MAX => {
                    s.still_since.store(now, Ordering::Relaxed);
                    now
                }
                t => t,
            };
            if now > since {
                rank = rank.min(OWING + since);
            }
            if now.saturating_sub(since) >= send && !s.released.swap(true, Ordering::Relaxed) {
                s.waiting.store(true, Ordering::Relaxed);
                drop(s.body.lock().unwrap_or_else(|e| e.into_inner()).take());
                inc(&c.stats.send_timeouts);
                released += 1;
            }
        }
        c.evict_key.store(rank, Ordering::Relaxed);
        if released > 0 {
            tracing::info!("released {released} response(s) a client did not take within send_timeout");
        }
        if released > 0 && st.live.iter().all(|s| s.released.load(Ordering::Relaxed)) {
            return if c.h2.load(Ordering::Relaxed) {
                Verdict::GoAway("stalled: took no response within send_timeout")
            } else {
                Verdict::Close("stalled: took no response within send_timeout")
            };
        }
        Verdict::Until(now + tick)
    }
}

/// Client connections per listener and in all, with room made by closing the one that owes
/// progress longest, else the one idle longest (the module's docs); and the memory their
/// request bodies may be buffered in.
pub struct Admission {
    max: std::sync::atomic::AtomicUsize,
    inner: Mutex<Registry>,
    /// Buffered request bodies of every connection (`buffer_memory`).
    pub memory: Arc<Budget>,
}

#[derive(Default)]
struct Registry {
    slots: Vec<Option<(usize, Weak<Conn>)>>,
    free: Vec<usize>,
    /// Connections per listener (by index into `names`), and those of them told to close.
    per_listener: Vec<(String, usize, usize)>,
    total: usize,
    closing: usize,
    cursor: usize,
}

/// How many registered connections a search for one to close looks at (an approximation of
/// "the oldest", as Redis's LRU: a sample from a rotating cursor).
const SAMPLE: usize = 128;

/// What [`Admission::admit`] decided.
pub enum Admit {
    In(Ticket),
    /// No room now; ask again shortly (a connection not read yet may turn out to owe progress).
    Wait,
    Refused,
}

/// A connection counted by [`Admission`]; uncounted when dropped.
pub struct Ticket {
    admission: Arc<Admission>,
    slot: usize,
    pub conn: Arc<Conn>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.release(self.slot, &self.conn);
    }
}

impl Admission {
    pub fn new(max: usize, memory: usize) -> Arc<Admission> {
        Arc::new(Admission { max: max.into(), inner: Mutex::new(Registry::default()), memory: Budget::new(memory) })
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// A reload's new limit (connections over it stay; new ones make room or are refused).
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Client connections open now.
    pub fn open(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Counts a new connection of `listener`, making room if a limit is reached: by closing a
    /// connection that owes progress; or, when the only others are connections not read from
    /// yet, [`Admit::Wait`] (they may soon show what they are), unless this is the `last` try:
    /// then the oldest of them, or else the keep-alive connection idle longest. No room:
    /// [`Admit::Refused`] (the caller closes it).
    pub fn admit(self: &Arc<Self>, listener: &str, listener_max: Option<usize>, conn: Arc<Conn>, last: bool) -> Admit {
        let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let li = match r.per_listener.iter().position(|(n, _, _)| n == listener) {
            Some(i) => i,
            None => {
                r.per_listener.push((listener.to_string(), 0, 0));
                r.per_listener.len() - 1
            }
        };
        let (_, count, closing) = r.per_listener[li];
        let full_listener = listener_max.is_some_and(|m| count - closing >= m);
        let full_total = r.total - r.closing >= self.max();
        if full_listener || full_total {
            let only = full_listener.then_some(li);
            match r.pick(only, now_ms()).choose(!last) {
                Ok(Some((victim, vl))) => {
                    r.closing += 1;
                    r.per_listener[vl].2 += 1;
                    inc(&victim.stats.evicted);
                    victim.order(ORDER_CLOSE);
                }
                Err(()) => return Admit::Wait,
                Ok(None) => {
                    inc(&conn.stats.refused);
                    return Admit::Refused;
                }
            }
        }
        let slot = match r.free.pop() {
            Some(s) => s,
            None => {
                r.slots.push(None);
                r.slots.len() - 1
            }
        };
        r.slots[slot] = Some((li, Arc::downgrade(&conn)));
        r.total += 1;
        r.per_listener[li].1 += 1;
        Admit::In(Ticket { admission: self.clone(), slot, conn })
    }

    fn release(&self, slot: usize, conn: &Conn) {
        let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some((li, _)) = r.slots[slot].take() else { return };
        r.free.push(slot);
        r.total -= 1;
        r.per_listener[li].1 -= 1;
        if conn.order.load(Ordering::Relaxed) == ORDER_CLOSE {
            r.closing = r.closing.saturating_sub(1);
            r.per_listener[li].2 = r.per_listener[li].2.saturating_sub(1);
        }
    }

    /// Closes one connection as a limit would (when descriptors run short). Whether there was
    /// one to close.
    pub fn evict_one(&self) -> bool {
        let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match r.pick(None, now_ms()).choose(false).ok().flatten() {
            Some((victim, vl)) => {
                r.closing += 1;
                r.per_listener[vl].2 += 1;
                inc(&victim.stats.evicted);
                victim.order(ORDER_CLOSE);
                true
            }
            None => false,
        }
    }
}

/// The connections a limit may close, best first within each kind (see [`Registry::pick`]).
#[derive(Default)]
struct Candidates {
    /// Owing progress (half a head, a handshake or a request behind `min_rate`), the one that
    /// owes longest.
    owing: Option<(u64, Arc<Conn>, usize)>,
    /// Not read from yet (for FRESH_MS): what they are is not known; the oldest.
    fresh: Option<(u64, Arc<Conn>, usize)>,
    /// Idle keep-alive connections, the longest idle.
    idle: Option<(u64, Arc<Conn>, usize)>,
}

impl Candidates {
    /// The one to close now: one that owes progress; else, while fresh ones may still show
    /// what they are (`wait`), none; else the oldest fresh one, then the longest idle.
    fn choose(self, wait: bool) -> Result<Option<(Arc<Conn>, usize)>, ()> {
        let pick = |c: Option<(u64, Arc<Conn>, usize)>| c.map(|(_, c, l)| (c, l));
        match (self.owing, self.fresh, self.idle) {
            (Some(o), _, _) => Ok(pick(Some(o))),
            (None, Some(_), _) if wait => Err(()),
            (None, f, i) => Ok(pick(f.or(i))),
        }
    }
}

impl Registry {
    /// The connections (of listener `only`, or any) a limit may close at `now`, among a sample:
    /// by their [`Conn::evict_key`], leaving out those not to be closed.
    fn pick(&mut self, only: Option<usize>, now: u64) -> Candidates {
        let mut out = Candidates::default();
        let n = self.slots.len();
        if n == 0 {
            return out;
        }
        let start = self.cursor % n;
        let mut seen = 0;
        for k in 0..n {
            let i = (start + k) % n;
            let Some((li, w)) = &self.slots[i] else { continue };
            if only.is_some_and(|o| o != *li) {
                continue;
            }
            seen += 1;
            if let Some(c) = w.upgrade() {
                let key = c.evict_key.load(Ordering::Relaxed);
                if key != KEEP && c.order.load(Ordering::Relaxed) == ORDER_NONE {
                    let kind = match key {
                        k if k >= IDLE => &mut out.idle,
                        k if k > now => &mut out.fresh,
                        _ => &mut out.owing,
                    };
                    if kind.as_ref().is_none_or(|(b, _, _)| key < *b) {
                        *kind = Some((key, c, *li));
                    }
                }
            }
            if seen >= SAMPLE {
                self.cursor = i + 1;
                break;
            }
        }
        if seen < SAMPLE {
            self.cursor = start;
        }
        out
    }
}

/// Why a client's request body failed, for the answer and the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFault {
    /// Its framing was broken (a bad chunk, a cut body): 400.
    Framing,
    /// Nothing came for `body_timeout`: 408.
    Timeout,
}

/// A request body read from a client, with its deadline: no wait for its next piece longer
/// than `body_timeout`, and never further behind `min_rate` than `body_timeout` (a leaky
/// bucket: each wait for the client adds to the lag, each byte pays back 1000 / `min_rate`
/// ms). Only the time the proxy waits for the client counts, not an upstream that reads
/// slowly. A failure is noted in `fault` so that the answer blames the client, not the
/// upstream.
pub struct ClientBody {
    inner: hyper::body::Incoming,
    timeout: Duration,
    /// Bytes a second (0: the gap deadline alone).
    min_rate: u64,
    lag: Duration,
    /// Since when it has waited for the client's next bytes.
    waiting: Option<tokio::time::Instant>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    fault: Arc<AtomicU8>,
    /// The connection, which counts the bodies waiting for its client.
    conn: Option<Arc<Conn>>,
}

const FAULT_NONE: u8 = 0;
const FAULT_FRAMING: u8 = 1;
const FAULT_TIMEOUT: u8 = 2;

impl ClientBody {
    pub fn new(inner: hyper::body::Incoming, timeout: Duration, min_rate: u64, conn: Option<Arc<Conn>>) -> (ClientBody, FaultCell) {
        let fault = Arc::new(AtomicU8::new(FAULT_NONE));
        (ClientBody { inner, timeout, min_rate, lag: Duration::ZERO, waiting: None, timer: None, fault: fault.clone(), conn }, FaultCell(fault))
    }

    fn wait_ends(&mut self) {
        if let Some(since) = self.waiting.take() {
            self.lag += since.elapsed();
            if let Some(c) = &self.conn {
                c.bodies_waiting.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for ClientBody {
    fn drop(&mut self) {
        self.wait_ends();
    }
}

/// Where a [`ClientBody`] notes its failure.
#[derive(Clone)]
pub struct FaultCell(Arc<AtomicU8>);

impl FaultCell {
    pub fn get(&self) -> Option<BodyFault> {
        match self.0.load(Ordering::Relaxed) {
            FAULT_FRAMING => Some(BodyFault::Framing),
            FAULT_TIMEOUT => Some(BodyFault::Timeout),
            _ => None,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                self.wait_ends();
                self.timer = None;
                let n = f.data_ref().map_or(0, |d| d.len() as u64);
                if n > 0 {
                    self.lag = match self.min_rate {
                        0 => Duration::ZERO,
                        r => self.lag.saturating_sub(Duration::from_micros(n.saturating_mul(1_000_000) / r)),
                    };
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(None) => {
                self.wait_ends();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                self.wait_ends();
                self.fault.store(FAULT_FRAMING, Ordering::Relaxed);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => {
                if self.waiting.is_none() {
                    let now = tokio::time::Instant::now();
                    self.waiting = Some(now);
                    if let Some(c) = &self.conn {
                        c.bodies_waiting.fetch_add(1, Ordering::Relaxed);
                    }
                    // The lag is below the timeout here: the last wait ended before it.
                    let left = self.timeout.saturating_sub(self.lag);
                    self.timer = Some(Box::pin(tokio::time::sleep_until(now + left)));
                }
                if self.timer.as_mut().is_some_and(|t| t.as_mut().poll(cx).is_ready()) {
                    self.wait_ends();
                    self.fault.store(FAULT_TIMEOUT, Ordering::Relaxed);
                    let (t, r) = (self.timeout, self.min_rate);
                    return Poll::Ready(Some(Err(format!("the request body stopped, or came slower than {r} bytes/s (min_rate), for {t:?} (body_timeout)").into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ClientLimits {
        ClientLimits {
            header_timeout: Duration::from_millis(1000),
            idle_timeout: Duration::from_millis(5000),
            send_timeout: Duration::from_millis(2000),
            reset_budget: 3,
            ..ClientLimits::default()
        }
    }

    #[test]
    fn header_idle_and_send_deadlines() {
        let stats = Arc::new(ClientStats::default());
        let c = Conn::new(limits(), stats.clone(), -1, Budget::new(1 << 20));
        let t0 = c.accepted_ms;
        let mut w = Watchdog::new(c.clone());
        // The first request head is due header_timeout after the connection.
        assert!(matches!(w.check(t0 + 500), Verdict::Until(t) if t <= t0 + 1000));
        assert_eq!(w.check(t0 + 1000), Verdict::Close("no whole request head within header_timeout"));
        // A request, then idle: idle_timeout after its end.
        let c = Conn::new(limits(), stats.clone(), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        let g = c.start(hyper::Version::HTTP_11);
        assert!(matches!(w.check(now_ms() + 100_000), Verdict::Until(_)), "in flight: no idle deadline");
        drop(g);
        // The end of a request reads no clock: the watchdog's next look dates it.
        assert_eq!(c.streams.lock().unwrap().idle_since, u64::MAX);
        let idle = now_ms();
        assert!(matches!(w.check(idle), Verdict::Until(_)));
        assert!(matches!(w.check(idle + 4000), Verdict::Until(_)));
        assert_eq!(w.check(idle + 5000), Verdict::Close("idle for idle_timeout"));
        // Bytes of a next head after the idle start: header_timeout from when they were seen.
        let c = Conn::new(limits(), stats.clone(), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        drop(c.start(hyper::Version::HTTP_11));
        c.read.fetch_add(3, Ordering::Relaxed);
        let idle = now_ms();
        assert!(matches!(w.check(idle), Verdict::Until(_)));
        assert!(matches!(w.check(idle + 100), Verdict::Until(_)));
        assert_eq!(w.check(idle + 1100), Verdict::Close("no whole request head within header_timeout"));
        // HTTP/2 idle: GOAWAY.
        let c = Conn::new(limits(), stats.clone(), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        drop(c.start(hyper::Version::HTTP_2));
        c.read.fetch_add(9, Ordering::Relaxed); // a PING is not a request head
        let idle = now_ms();
        assert!(matches!(w.check(idle), Verdict::Until(_)));
        assert!(matches!(w.check(idle + 4000), Verdict::Until(_)));
        assert_eq!(w.check(idle + 5000), Verdict::GoAway("idle for idle_timeout"));
        // A blocked write that moves nothing for send_timeout.
        let c = Conn::new(limits(), stats.clone(), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        let _g = c.start(hyper::Version::HTTP_11);
        let t = now_ms();
        assert!(matches!(w.check(t), Verdict::Until(_)));
        c.write_blocked.store(true, Ordering::Relaxed);
        assert!(matches!(w.check(t + 1999), Verdict::Until(_)));
        assert_eq!(w.check(t + 2000), Verdict::Close("the client took its responses slower than min_rate for send_timeout"));
        assert_eq!(stats.header_timeouts.load(Ordering::Relaxed), 2);
        assert_eq!(stats.idle_closed.load(Ordering::Relaxed), 2);
        assert_eq!(stats.send_timeouts.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_response_the_client_does_not_take_is_released() {
        use http_body_util::BodyExt;
        let c = Conn::new(limits(), Arc::new(ClientStats::default()), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        let (g1, g2) = (c.start(hyper::Version::HTTP_2), c.start(hyper::Version::HTTP_2));
        let full = |s: &'static str| http_body_util::Full::new(Bytes::from(s)).map_err(|never| match never {}).boxed();
        let mut b1 = g1.body(Frames(3).boxed());
        let _b2 = g2.body(full("x"));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        // b1 gives a frame and is not asked again; b2 was never polled (not ready either).
        assert!(matches!(Pin::new(&mut b1).poll_frame(&mut cx), Poll::Ready(Some(Ok(_)))));
        let t = now_ms();
        // The watchdog's first look sees the frame; from its second the stream stands still.
        assert!(matches!(w.check(t), Verdict::Until(_)));
        assert!(matches!(w.check(t + 1000), Verdict::Until(_)));
        assert!(matches!(w.check(t + 2900), Verdict::Until(_)));
        assert_eq!(c.stats.send_timeouts.load(Ordering::Relaxed), 0, "not yet: 1.9 s of 2");
        // One of two streams stalled: released, the connection stays.
        assert!(matches!(w.check(t + 3000), Verdict::Until(_)));
        match Pin::new(&mut b1).poll_frame(&mut cx) {
            Poll::Ready(Some(Err(e))) => assert!(e.to_string().contains("send_timeout")),
            _ => panic!("a released body must end in an error"),
        }
        drop(b1);
        assert_eq!(c.stats.send_timeouts.load(Ordering::Relaxed), 1);
        // A released stream is not a client's reset.
        assert_eq!(c.resets.lock().unwrap().1, 0);
    }

    /// A body of a few frames, always ready.
    struct Frames(usize);

    impl Body for Frames {
        type Data = Bytes;
        type Error = BodyError;
        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            if self.0 == 0 {
                return Poll::Ready(None);
            }
            self.0 -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"frame")))))
        }
    }

    #[test]
    fn resets_after_forwarding_cost_the_budget_and_then_goaway() {
        let c = Conn::new(limits(), Arc::new(ClientStats::default()), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        // Not forwarded (answered here): free.
        for _ in 0..10 {
            drop(c.start(hyper::Version::HTTP_2));
        }
        assert!(matches!(w.check(now_ms()), Verdict::Until(_)));
        for _ in 0..3 {
            let g = c.start(hyper::Version::HTTP_2);
            g.forwarded();
            drop(g);
        }
        assert!(matches!(w.check(now_ms()), Verdict::Until(_)), "within the budget of 3");
        let g = c.start(hyper::Version::HTTP_2);
        g.forwarded();
        drop(g);
        assert_eq!(w.check(now_ms()), Verdict::GoAway("over its reset budget"));
        assert_eq!(c.stats.reset_budget_exceeded.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_minimum_rate_is_a_leaky_bucket() {
        // Waits add, bytes pay back 1000 / min_rate ms each, never below zero.
        assert_eq!(pay(0, true, 1000, 0, 500), 1000);
        assert_eq!(pay(1000, true, 1000, 500, 500), 1000, "at min_rate exactly it holds");
        assert_eq!(pay(1000, true, 1000, 250, 500), 1500, "at half of it, it falls behind");
        assert_eq!(pay(1000, false, 1000, 0, 500), 1000, "not waiting for the client: nothing added");
        assert_eq!(pay(1000, true, 1000, 1 << 40, 500), 0);
        assert_eq!(pay(1000, true, 1000, 1, 0), 0, "min_rate 0: any byte ends the wait (a gap deadline)");
        assert_eq!(pay(u64::MAX / 2, true, 10, u64::MAX, 1), 0, "no overflow");
    }

    #[test]
    fn a_client_slower_than_min_rate_meets_send_timeout_though_it_takes_bytes() {
        let stats = Arc::new(ClientStats::default());
        let c = Conn::new(ClientLimits { min_rate: 1000, ..limits() }, stats.clone(), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        let _g = c.start(hyper::Version::HTTP_11);
        let t = now_ms();
        assert!(matches!(w.check(t), Verdict::Until(_)));
        c.write_blocked.store(true, Ordering::Relaxed);
        // 100 bytes a second where 1,000 are due: 0.9 s behind each second.
        for k in 1..=2 {
            c.written.fetch_add(100, Ordering::Relaxed);
            assert!(matches!(w.check(t + k * 1000), Verdict::Until(_)), "second {k}");
            assert_eq!(c.evict_key.load(Ordering::Relaxed) >> 62, OWING >> 62, "behind: first to close for another");
        }
        c.written.fetch_add(100, Ordering::Relaxed);
        assert_eq!(w.check(t + 3000), Verdict::Close("the client took its responses slower than min_rate for send_timeout"));
        // At the rate, it never does, and it is not closed for another either.
        let c = Conn::new(ClientLimits { min_rate: 1000, ..limits() }, stats.clone(), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        let _g = c.start(hyper::Version::HTTP_11);
        let t = now_ms();
        assert!(matches!(w.check(t), Verdict::Until(_)));
        c.write_blocked.store(true, Ordering::Relaxed);
        for k in 1..=20 {
            c.written.fetch_add(1000, Ordering::Relaxed);
            assert!(matches!(w.check(t + k * 1000), Verdict::Until(_)), "second {k}");
        }
        assert_eq!(c.evict_key.load(Ordering::Relaxed), KEEP);
    }

    #[test]
    fn a_response_not_yet_acknowledged_keeps_its_connection_in_flight() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        // A socket whose peer reads nothing: once both buffers are full, bytes stay unsent.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let chunk = [0u8; 65536];
        while s.write(&chunk).is_ok() {}
        let stats = Arc::new(ClientStats::default());
        let c = Conn::new(limits(), stats.clone(), s.as_raw_fd(), Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        drop(c.start(hyper::Version::HTTP_11));
        let t = now_ms();
        assert_eq!(w.check(t), Verdict::Until(t + SETTLE_MS), "the response is on its way: looked at again soon");
        assert_eq!(c.streams.lock().unwrap().idle_since, u64::MAX, "not idle while the client has not acknowledged it");
        // It takes nothing: behind (first to close for another), then send_timeout (2 s).
        assert!(matches!(w.check(t + 1000), Verdict::Until(_)));
        assert_eq!(c.evict_key.load(Ordering::Relaxed) >> 62, OWING >> 62, "behind while it takes nothing");
        assert_eq!(w.check(t + 2100), Verdict::Close("the client took its response slower than min_rate for send_timeout"));
        // Without a socket (or once acknowledged), the end of a response is the start of idle.
        let c = Conn::new(limits(), stats.clone(), -1, Budget::new(1 << 20));
        let mut w = Watchdog::new(c.clone());
        drop(c.start(hyper::Version::HTTP_11));
        let t = now_ms();
        assert!(matches!(w.check(t), Verdict::Until(_)));
        assert_eq!(c.streams.lock().unwrap().idle_since, t);
        assert_eq!(c.evict_key.load(Ordering::Relaxed), IDLE + t);
    }

    #[test]
    fn buffered_bodies_stay_within_the_connection_and_process_budgets() {
        let memory = Budget::new(3000);
        let stats = Arc::new(ClientStats::default());
        let a = Conn::new(ClientLimits { connection_buffer: 2000, ..limits() }, stats.clone(), -1, memory.clone());
        let b = Conn::new(ClientLimits { connection_buffer: 2000, ..limits() }, stats.clone(), -1, memory.clone());
        assert!(a.take_buffer(1500));
        assert!(!a.take_buffer(600), "over the connection's 2,000");
        assert!(a.take_buffer(500));
        assert!(!b.take_buffer(1500), "over the process's 3,000");
        assert!(b.take_buffer(1000));
        assert_eq!(memory.used(), 3000);
        a.give_buffer(2000);
        assert!(b.take_buffer(1000));
        assert_eq!((memory.used(), a.buffered.load(Ordering::Relaxed), b.buffered.load(Ordering::Relaxed)), (2000, 0, 2000));
    }

    #[test]
    fn a_connections_share_of_an_endpoint_is_a_fraction_at_least_one() {
        let c = Conn::new(limits(), Arc::new(ClientStats::default()), -1, Budget::new(1 << 20));
        let ep: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(c.share(ep, 512, 0.125).available_permits(), 64);
        assert!(Arc::ptr_eq(&c.share(ep, 512, 0.125), &c.share(ep, 512, 0.125)), "one per endpoint and connection");
        assert_eq!(c.share("127.0.0.1:10".parse().unwrap(), 3, 0.1).available_permits(), 1);
        assert_eq!(c.share("127.0.0.1:11".parse().unwrap(), 10, 1.0).available_permits(), 10);
    }

    #[test]
    fn admission_makes_room_by_closing_who_owes_progress_then_the_longest_idle() {
        let stats = Arc::new(ClientStats::default());
        let a = Admission::new(3, 1 << 20);
        let admit = |l: &str, max: Option<usize>, c: &Arc<Conn>| match a.admit(l, max, c.clone(), true) {
            Admit::In(t) => Some(t),
            _ => None,
        };
        let conn = || Conn::new(limits(), stats.clone(), -1, Budget::new(1 << 20));
        let (c1, c2, c3, o1, o2, o3) = (conn(), conn(), conn(), conn(), conn(), conn());
        let _t1 = admit("web", Some(2), &c1).unwrap();
        let t2 = admit("web", Some(2), &c2).unwrap();
        // c1 busy, c2 not read from yet: nobody to close for a third connection of "web" (its
        // limit is 2) but wait for c2 to show what it is.
        let _b1 = c1.start(hyper::Version::HTTP_11);
        assert!(matches!(a.admit("web", Some(2), c3.clone(), false), Admit::Wait));
        // c2 sends half a request head: it makes room (SPOKE_MS later).
        c2.got(10);
        assert!(matches!(a.admit("web", Some(2), c3.clone(), false), Admit::Wait));
        std::thread::sleep(Duration::from_millis(SPOKE_MS + 1));
        let _t3 = admit("web", Some(2), &c3).unwrap();
        assert_eq!((c1.order.load(Ordering::Relaxed), c2.order.load(Ordering::Relaxed)), (ORDER_NONE, ORDER_CLOSE));
        // A connection being closed does not count against the limit of all (3).
        let _to1 = admit("other", None, &o1).unwrap();
        assert_eq!(c3.order.load(Ordering::Relaxed), ORDER_NONE);
        // Everyone busy (and not behind) or closing: no room, no waiting.
        let (_b3, _bo1) = (c3.start(hyper::Version::HTTP_11), o1.start(hyper::Version::HTTP_11));
        assert!(matches!(a.admit("other", None, o2.clone(), false), Admit::Refused));
        drop(t2);
        assert_eq!(a.open(), 3);
        assert!(admit("other", None, &o3).is_none());
        assert_eq!((stats.evicted.load(Ordering::Relaxed), stats.refused.load(Ordering::Relaxed)), (1, 2));
        // Done, and dated idle by their watchdogs: the longest idle goes first...
        let (mut w1, mut w3) = (Watchdog::new(c1.clone()), Watchdog::new(c3.clone()));
        drop(_b1);
        assert!(matches!(w1.check(now_ms()), Verdict::Until(_)));
        std::thread::sleep(Duration::from_millis(5));
        drop(_b3);
        assert!(matches!(w3.check(now_ms()), Verdict::Until(_)));
        // ...but after any connection that owes progress, however young: a busy one fallen
        // behind (o1, its client not taking its response).
        let mut wo1 = Watchdog::new(o1.clone());
        let t = now_ms();
        assert!(matches!(wo1.check(t), Verdict::Until(_)));
        o1.write_blocked.store(true, Ordering::Relaxed);
        assert!(matches!(wo1.check(t + 500), Verdict::Until(_)));
        let c4 = conn();
        let _t4 = admit("other", None, &c4).unwrap();
        let _b4 = c4.start(hyper::Version::HTTP_11);
        assert_eq!(o1.order.load(Ordering::Relaxed), ORDER_CLOSE, "behind its min_rate: closed first");
        assert_eq!((c1.order.load(Ordering::Relaxed), c3.order.load(Ordering::Relaxed)), (ORDER_NONE, ORDER_NONE));
        // With none that owes, the longest idle (c1).
        let c5 = conn();
        let _t5 = admit("other", None, &c5).unwrap();
        assert_eq!((c1.order.load(Ordering::Relaxed), c3.order.load(Ordering::Relaxed)), (ORDER_CLOSE, ORDER_NONE), "then the longest idle");
        // c5, not read from yet: waited for while it may still speak; on the last try it goes
        // before the idle ones.
        assert!(matches!(a.admit("other", None, conn(), false), Admit::Wait));
        let c6 = conn();
        let _t6 = admit("other", None, &c6).unwrap();
        let _b6 = c6.start(hyper::Version::HTTP_11);
        assert_eq!((c5.order.load(Ordering::Relaxed), c3.order.load(Ordering::Relaxed)), (ORDER_CLOSE, ORDER_NONE));
    }
}
