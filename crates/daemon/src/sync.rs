//! Session synchronisation between HA nodes, over UDP through the host's network stack.
//!
//! The active node (MASTER, or STANDALONE) streams the sessions its workers create or move to
//! another TCP state; the standby (BACKUP) installs each on the worker that will see its
//! packets after a failover: for full NAT the worker owning the local port (`port % 2^k`, the
//! same partition on both nodes when they run the same number of workers), otherwise the
//! worker that had it on the active node (same RSS on both nodes). A standby that starts asks
//! for a bulk transfer of the whole table, and asks again until one completes.
//!
//! Message (vectorlb-sync): a 64-byte header in the clear (`VLBS`, version, kind, record
//! count, sender epoch, sequence, ack, request, the sender's clock, its salt) and up to 16
//! records of 98 bytes, sealed with AES-256-GCM under a key each sender derives from
//! `ha.sync_key` with a salt of its own (the header authenticated, the records encrypted: a
//! listener learns no session). A message from an address that is not a configured peer
//! (`ha.sync_peers`, or a multicast group's `ha.sync_sources`; checked before any
//! cryptography), whose tag fails, that is cut short or malformed, whose (epoch, sequence) was
//! already seen (a 64-message window per sender address, whatever its port), or that its
//! sender sealed more than [`MAX_AGE`] ago by its clock (a captured message replayed to a node
//! that restarted and has no window yet) changes nothing and is counted. A bulk transfer
//! answers one request: its records and its BULK_DONE carry the random number of the
//! BULK_REQUEST, and the asking node counts only those of the request it last sent (a
//! BULK_DONE captured and replayed cannot make a starting node ready). Bulk transfers and
//! refreshes are sent by one thread, one at a time, from a queue of at most
//! [`BULK_QUEUE`]. Batching adapts: a
//! datagram leaves when 16 records are waiting or when the period has passed since the
//! oldest; the period grows while the standby's acknowledgements fall behind and shrinks back
//! when they catch up. Every 60 s the active node re-sends its whole table (paced), so the
//! standby's expiry times follow sessions that stay in one state.
//!
//! A group (`ha.group`, scale-out: docs/scale-out.md) has no standby: every node is active,
//! sends the sessions its workers create or move to every peer and installs every peer's, so
//! each node knows every session of the group. A node that starts asks its peers for their
//! tables and is *ready* (its BGP speaker announces, [`Sync::ready`]) once one peer has sent
//! the whole of it, or when none answered within [`JOIN_ALONE`] (the first node, or the whole
//! group starting at once). Only ready nodes answer such requests, so the table a node takes
//! is complete. The periodic refresh sends only the full-NAT sessions on the node's own local
//! addresses: their replies come back to it, so its copies' expiry times are the current ones.

use crate::error::SyncError;
use crate::ha::Ha;
use crate::handoff::now_ms;
use crate::lock;
use crate::workers::Workers;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vectorlb_api::model::{SyncBulk, SyncRefused, SyncRejected, SyncStatus};
use vectorlb_config::SyncSpec;
use vectorlb_lb::sync::{Export, InstallError, SyncRecord};
pub use vectorlb_sync::{
    decode, encode, Message, Refused, Sealer, Secret, HEADER, KIND_ACK, KIND_BULK_DONE, KIND_BULK_REQUEST, KIND_RECORDS, MAGIC, MAX_MESSAGE, MAX_RECORDS, RECORD, TAG, VERSION,
};

/// Replay protection per sender: its epoch (boot time) and a 64-message window.
#[derive(Debug, Default, Clone)]
pub struct Window {
    epoch: u64,
    top: u64,
    bits: u64,
}

impl Window {
    /// Whether (epoch, seq) is new; records it if so.
    pub fn accept(&mut self, epoch: u64, seq: u64) -> bool {
        if epoch < self.epoch {
            return false;
        }
        if epoch > self.epoch {
            *self = Window { epoch, top: seq, bits: 1 };
            return true;
        }
        if seq > self.top {
            let shift = seq - self.top;
            self.bits = if shift >= 64 { 1 } else { (self.bits << shift) | 1 };
            self.top = seq;
            return true;
        }
        let back = self.top - seq;
        if back >= 64 || self.bits & (1 << back) != 0 {
            return false;
        }
        self.bits |= 1 << back;
        true
    }
}

#[derive(Default)]
pub struct Stats {
    pub records_sent: AtomicU64,
    /// Changes not sent: above `ha.max_rate` for longer than the queue holds.
    pub records_dropped: AtomicU64,
    pub datagrams_sent: AtomicU64,
    pub records_received: AtomicU64,
    pub installed: AtomicU64,
    pub rejected_unknown: AtomicU64,
    pub rejected_stale: AtomicU64,
    pub rejected_port: AtomicU64,
    pub rejected_full: AtomicU64,
    pub refused_foreign: AtomicU64,
    pub refused_mac: AtomicU64,
    pub refused_truncated: AtomicU64,
    pub refused_malformed: AtomicU64,
    pub refused_replayed: AtomicU64,
    pub refused_outdated: AtomicU64,
    pub acked_seq: AtomicU64,
    pub sent_seq: AtomicU64,
    pub period_us: AtomicU64,
    pub bulk_sent: AtomicU64,
    pub bulk_received: AtomicU64,
    pub bulk_requests: AtomicU64,
    pub bulk_completed: AtomicU64,
    pub bulk_incomplete: AtomicU64,
    /// BULK_DONE messages that answered no request of this node's (an old transfer's, or a
    /// replay).
    pub bulk_unrequested: AtomicU64,
    pub last_received: Mutex<Option<Instant>>,
}

impl Stats {
    pub fn count_install(&self, r: Result<(), InstallError>) {
        let c = match r {
            Ok(()) => &self.installed,
            Err(InstallError::Unknown) => &self.rejected_unknown,
            Err(InstallError::Stale) => &self.rejected_stale,
            Err(InstallError::PortTaken) => &self.rejected_port,
            Err(InstallError::Full) => &self.rejected_full,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters as the API shows them.
    pub fn status(&self) -> SyncStatus {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SyncStatus {
            configured: true,
            group: false,
            ready: true,
            records_sent: g(&self.records_sent),
            records_dropped: g(&self.records_dropped),
            datagrams_sent: g(&self.datagrams_sent),
            unacked_datagrams: g(&self.sent_seq).saturating_sub(g(&self.acked_seq)),
            batch_period_ms: g(&self.period_us) as f64 / 1000.0,
            records_received: g(&self.records_received),
            installed: g(&self.installed),
            rejected: SyncRejected { unknown: g(&self.rejected_unknown), stale: g(&self.rejected_stale), port_taken: g(&self.rejected_port), table_full: g(&self.rejected_full) },
            refused: SyncRefused {
                foreign: g(&self.refused_foreign),
                bad_hmac: g(&self.refused_mac),
                truncated: g(&self.refused_truncated),
                malformed: g(&self.refused_malformed),
                replayed: g(&self.refused_replayed),
                outdated: g(&self.refused_outdated),
            },
            bulk: SyncBulk {
                records_sent: g(&self.bulk_sent),
                records_received: g(&self.bulk_received),
                requests: g(&self.bulk_requests),
                completed: g(&self.bulk_completed),
                incomplete: g(&self.bulk_incomplete),
                unrequested: g(&self.bulk_unrequested),
            },
            last_received_seconds_ago: lock(&self.last_received).map(|t| t.elapsed().as_secs_f64()),
        }
    }
}

/// What the sync threads need of the daemon.
#[derive(Clone)]
pub struct SyncCtx {
    pub workers: Arc<Workers>,
    pub ha: Arc<Ha>,
    pub stop: Arc<AtomicBool>,
}

impl SyncCtx {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// A whole-table transfer or a refresh for one peer: where, what, and the request it answers
/// (none for a refresh).
struct BulkJob {
    to: SocketAddr,
    which: Export,
    request: Option<u64>,
}

pub struct Sync {
    pub spec: SyncSpec,
    pub socket: UdpSocket,
    secret: Secret,
    sealer: Sealer,
    pub epoch: u64,
    seq: AtomicU64,
    pub stats: Stats,
    /// A group's node has the group's sessions (always true in a pair).
    ready: AtomicBool,
    started: Instant,
    /// Peers a bulk transfer or refresh is queued for or being sent to (one at a time each),
    /// by address, and when the last bulk transfer to each was queued (at most one a second).
    bulk_to: Mutex<HashSet<IpAddr>>,
    bulk_jobs: SyncSender<BulkJob>,
    bulk_queue: Mutex<Option<Receiver<BulkJob>>>,
    bulk_began: Mutex<HashMap<IpAddr, Instant>>,
    /// The highest sequence number each peer acknowledged (a bulk transfer's flow control).
    acked: Mutex<HashMap<SocketAddr, u64>>,
}

impl Sync {
    pub fn bind(spec: &SyncSpec) -> Result<Arc<Sync>, SyncError> {
        // A socket bound to a unicast address does not see multicast: with a group, bind the
        // port on every address and use the listen address as the group's interface.
        let multicast = spec.peers.iter().any(|p| p.ip().is_multicast());
        let bind_to = if multicast {
            SocketAddr::new(if spec.listen.is_ipv6() { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) }, spec.listen.port())
        } else {
            spec.listen
        };
        let socket = UdpSocket::bind(bind_to).map_err(|source| SyncError::Bind { addr: bind_to, source })?;
        for p in &spec.peers {
            match (p.ip(), spec.listen.ip()) {
                (IpAddr::V4(g), IpAddr::V4(me)) if g.is_multicast() => {
                    socket.join_multicast_v4(&g, &me).map_err(|source| SyncError::Join { group: g.into(), source })?;
                    socket.set_multicast_loop_v4(false).ok();
                    use std::os::fd::AsRawFd;
                    let addr = libc::in_addr { s_addr: u32::from_ne_bytes(me.octets()) };
                    // SAFETY: a valid socket and an in_addr option value.
                    let r = unsafe {
                        libc::setsockopt(
                            socket.as_raw_fd(),
                            libc::IPPROTO_IP,
                            libc::IP_MULTICAST_IF,
                            &addr as *const _ as *const libc::c_void,
                            std::mem::size_of::<libc::in_addr>() as u32,
                        )
                    };
                    if r != 0 {
                        return Err(SyncError::MulticastInterface { group: g.into(), me: me.into(), source: std::io::Error::last_os_error() });
                    }
                }
                (IpAddr::V6(g), IpAddr::V6(_)) if g.is_multicast() => {
                    socket.join_multicast_v6(&g, 0).map_err(|source| SyncError::Join { group: g.into(), source })?;
                    socket.set_multicast_loop_v6(false).ok();
                }
                _ => {}
            }
        }
        socket.set_read_timeout(Some(Duration::from_millis(100))).ok();
        grow_receive_buffer(&socket);
        let epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(1);
        let secret = Secret::new(&spec.key);
        let sealer = Sealer::new(&secret).map_err(|_| SyncError::Random)?;
        let (bulk_jobs, queue) = sync_channel(BULK_QUEUE);
        Ok(Arc::new(Sync {
            spec: spec.clone(),
            socket,
            secret,
            sealer,
            bulk_jobs,
            bulk_queue: Mutex::new(Some(queue)),
            epoch,
            seq: AtomicU64::new(0),
            stats: Stats::default(),
            ready: AtomicBool::new(!spec.group),
            started: Instant::now(),
            bulk_to: Mutex::new(HashSet::new()),
            bulk_began: Mutex::new(HashMap::new()),
            acked: Mutex::new(HashMap::new()),
        }))
    }

    /// Whether this node has its group's sessions (what its BGP speaker waits for); always true
    /// for a pair.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn set_ready(&self, why: &str) {
        if !self.ready.swap(true, Ordering::Relaxed) {
            tracing::info!("session sync: ready after {:?}: {why}", self.started.elapsed());
        }
    }

    /// The API's view: the counters, the mode and readiness.
    pub fn status(&self) -> SyncStatus {
        SyncStatus { group: self.spec.group, ready: self.ready(), ..self.stats.status() }
    }

    /// Sends one message to each of `to`; its sequence number.
    fn send_to(&self, to: &[SocketAddr], kind: u8, ack: u64, request: u64, records: Vec<(u8, SyncRecord)>) -> u64 {
        // Never the same sequence twice under this node's salt: the AEAD's nonce.
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let n = records.len() as u64;
        let msg = encode(&Message { kind, epoch: self.epoch, seq, ack, request, time_ms: now_ms(), records }, &self.sealer);
        for p in to {
            let _ = self.socket.send_to(&msg, p);
        }
        if kind == KIND_RECORDS {
            self.stats.sent_seq.store(seq, Ordering::Relaxed);
            self.stats.records_sent.fetch_add(n, Ordering::Relaxed);
            self.stats.datagrams_sent.fetch_add(1, Ordering::Relaxed);
        }
        seq
    }

    fn acked_by(&self, peer: SocketAddr) -> u64 {
        lock(&self.acked).get(&peer).copied().unwrap_or(0)
    }

    /// Queues a transfer to `to` unless one is queued or running for it (or, for a bulk
    /// transfer, one was queued less than a second ago); whether it was queued.
    fn queue_bulk(&self, to: SocketAddr, which: Export, request: Option<u64>) -> bool {
        let bulk = request.is_some();
        if bulk && lock(&self.bulk_began).get(&to.ip()).is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return false;
        }
        if !lock(&self.bulk_to).insert(to.ip()) {
            return false;
        }
        match self.bulk_jobs.try_send(BulkJob { to, which, request }) {
            Ok(()) => {
                if bulk {
                    lock(&self.bulk_began).insert(to.ip(), Instant::now());
                }
                true
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                lock(&self.bulk_to).remove(&to.ip());
                false
            }
        }
    }
}

/// A message its sender sealed longer ago than this (or this far in the future), by the two
/// nodes' clocks, is refused as outdated: the nodes' clocks must agree within it (NTP).
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// Bulk transfers and refreshes waiting for the one sender thread.
pub const BULK_QUEUE: usize = 8;

const BASE_PERIOD: Duration = Duration::from_millis(2);
/// How often the active node re-sends its whole table (expiry refresh on the standby).
const REFRESH: Duration = Duration::from_secs(60);
const MAX_PERIOD: Duration = Duration::from_millis(100);
/// A group's starting node that no peer answered for this long takes itself as the first of
/// the group (or the whole group started together) and is ready with its own table.
pub const JOIN_ALONE: Duration = Duration::from_secs(3);
/// The longest a group's starting node waits for a bulk transfer that has begun.
pub const JOIN_LIMIT: Duration = Duration::from_secs(60);
/// A bulk transfer's window: datagrams sent to a peer and not yet acknowledged by it. A
/// transfer is a burst a peer's socket buffer could not hold; it goes at the pace of the
/// receiver's acknowledgements.
const BULK_WINDOW: u64 = 32;
/// A bulk transfer whose receiver acknowledges nothing for this long is abandoned (without its
/// BULK_DONE: the receiver asks again).
const BULK_STALL: Duration = Duration::from_secs(2);
/// `ack` of a record message: 0 a change, [`ACK_BULK`] part of a bulk transfer (counted against
/// the BULK_DONE's total), [`ACK_REFRESH`] a group's refresh.
const ACK_BULK: u64 = 1;
const ACK_REFRESH: u64 = 2;
/// The receive buffer asked for (a bulk transfer's window of datagrams, and bursts of changes).
const RECEIVE_BUFFER: usize = 4 << 20;

/// Asks for a [`RECEIVE_BUFFER`] (above `net.core.rmem_max` when the daemon may, as root).
fn grow_receive_buffer(socket: &UdpSocket) {
    use std::os::fd::AsRawFd;
    let size = RECEIVE_BUFFER as libc::c_int;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: a valid socket and an int option value of the size given.
        let r = unsafe { libc::setsockopt(socket.as_raw_fd(), libc::SOL_SOCKET, opt, &size as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32) };
        if r == 0 {
            return;
        }
    }
}

/// The sending side: batches what the workers report and, while this node is active, sends it.
pub fn sender(shared: SyncCtx, sync: Arc<Sync>, changes: Receiver<Vec<(u8, SyncRecord)>>) {
    let mut pending: Vec<(u8, SyncRecord)> = Vec::new();
    let mut oldest: Option<Instant> = None;
    let mut period = BASE_PERIOD;
    let mut last_refresh = Instant::now();
    // The stream's bound (`ha.max_rate` records a second): a token bucket holding a tenth of a
    // second, and at most two seconds' worth waiting (the oldest dropped beyond, counted: a
    // later change of the same session carries all of it).
    let rate = sync.spec.max_rate as f64;
    let (burst, max_pending) = ((rate / 10.0).max(MAX_RECORDS as f64), (sync.spec.max_rate as usize).saturating_mul(2).max(MAX_RECORDS));
    let (mut tokens, mut filled) = (burst, Instant::now());
    while !shared.stopping() {
        // Sessions whose state does not change are sent once; re-send the whole table now and
        // then so that the standby's expiry times follow the active node's.
        let active = sync.spec.group || shared.ha.answers_floating();
        if last_refresh.elapsed() >= REFRESH && active {
            last_refresh = Instant::now();
            let which = if sync.spec.group { Export::OwnFullNat } else { Export::All };
            for &p in &sync.spec.peers {
                sync.queue_bulk(p, which, None);
            }
        }
        match changes.recv_timeout(period.max(Duration::from_millis(1))) {
            Ok(v) => {
                if oldest.is_none() && !v.is_empty() {
                    oldest = Some(Instant::now());
                }
                pending.extend(v);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if !active {
            // A BACKUP sends nothing: its sessions come from the MASTER.
            pending.clear();
            oldest = None;
            continue;
        }
        // Adapt: back off while the standby's acknowledgements lag, come back when they
        // catch up.
        let lag = sync.stats.sent_seq.load(Ordering::Relaxed).saturating_sub(sync.stats.acked_seq.load(Ordering::Relaxed));
        period = if lag > 256 {
            (period * 2).min(MAX_PERIOD)
        } else if lag < 32 {
            (period / 2).max(BASE_PERIOD)
        } else {
            period
        };
        sync.stats.period_us.store(period.as_micros() as u64, Ordering::Relaxed);
        if pending.len() > max_pending {
            let excess = pending.len() - max_pending;
            pending.drain(..excess);
            sync.stats.records_dropped.fetch_add(excess as u64, Ordering::Relaxed);
        }
        tokens = (tokens + filled.elapsed().as_secs_f64() * rate).min(burst);
        filled = Instant::now();
        while pending.len() >= MAX_RECORDS || (!pending.is_empty() && oldest.is_some_and(|t| t.elapsed() >= period)) {
            let n = pending.len().min(MAX_RECORDS);
            if tokens < n as f64 {
                break;
            }
            tokens -= n as f64;
            let batch: Vec<_> = pending.drain(..n).collect();
            sync.send_to(&sync.spec.peers, KIND_RECORDS, 0, 0, batch);
            oldest = if pending.is_empty() { None } else { Some(Instant::now()) };
        }
    }
}

/// The receiving side: checks every message, installs records while this node is standby,
/// answers acknowledgements and bulk requests.
pub fn receiver(shared: SyncCtx, sync: Arc<Sync>) {
    // Replay windows by the sender's address, not its socket: a captured message sent again
    // from another port is the same sender's old message (it once started a window of its own).
    let mut windows: HashMap<IpAddr, Window> = HashMap::new();
    let mut buf = vec![0u8; 65536];
    let mut last_bulk_request = Instant::now() - Duration::from_secs(3600);
    let mut bulk_done = false;
    let mut was_backup = false;
    let group = sync.spec.group;
    // A group's node: when the last bulk record arrived.
    let mut last_bulk_record: Option<Instant> = None;
    // Bulk records received from each peer for the current request, and that request (a
    // random number, new each time this node asks; 0 before the first).
    let mut bulk_from: HashMap<SocketAddr, u64> = HashMap::new();
    let mut request = 0u64;
    while !shared.stopping() {
        let backup = !group && !shared.ha.answers_floating();
        if backup && !was_backup {
            bulk_done = false;
        }
        was_backup = backup;
        if group && !sync.ready() {
            let started = sync.started.elapsed();
            if last_bulk_record.is_none() && started >= JOIN_ALONE {
                sync.set_ready("no peer sent its sessions (the first node of the group)");
            } else if started >= JOIN_LIMIT {
                sync.set_ready("the peers' bulk transfers did not complete in time");
            }
        }
        // A standby (a group's starting node) asks for the whole table until it has had it.
        let asking = if group { !sync.ready() } else { backup && !bulk_done };
        let every = if group { Duration::from_secs(1) } else { Duration::from_secs(2) };
        // (Not while a transfer is arriving: the peers send one at a time.)
        if asking && last_bulk_request.elapsed() >= every && last_bulk_record.is_none_or(|t| t.elapsed() >= every) {
            last_bulk_request = Instant::now();
            // What a transfer abandoned before this request delivered does not count.
            bulk_from.clear();
            request = random_request();
            sync.stats.bulk_requests.fetch_add(1, Ordering::Relaxed);
            sync.send_to(&sync.spec.peers, KIND_BULK_REQUEST, 0, request, Vec::new());
        }
        let Ok((n, from)) = sync.socket.recv_from(&mut buf) else { continue };
        // Only the configured peers, checked before anything costs a key expansion or a tag
        // (anyone who reaches this address, pods through the host's interface included, could
        // otherwise make the node do cryptography for every datagram).
        if !sync.spec.sources.contains(&from.ip()) {
            sync.stats.refused_foreign.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let msg = match decode(&buf[..n], &sync.secret) {
            Ok(m) => m,
            Err(e) => {
                let c = match e {
                    Refused::Truncated => &sync.stats.refused_truncated,
                    Refused::BadMac => &sync.stats.refused_mac,
                    Refused::Malformed => &sync.stats.refused_malformed,
                    Refused::Replayed => &sync.stats.refused_replayed,
                    Refused::Outdated => &sync.stats.refused_outdated,
                };
                c.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        if msg.epoch == sync.epoch {
            continue; // our own (multicast loop)
        }
        if now_ms().abs_diff(msg.time_ms) > MAX_AGE.as_millis() as u64 {
            sync.stats.refused_outdated.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if !windows.entry(from.ip()).or_default().accept(msg.epoch, msg.seq) {
            sync.stats.refused_replayed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        *lock(&sync.stats.last_received) = Some(Instant::now());
        match msg.kind {
            KIND_RECORDS => {
                let n = msg.records.len() as u64;
                sync.stats.records_received.fetch_add(n, Ordering::Relaxed);
                // Part of the transfer this node asked for last (one for an older request is
                // still installed, its records being as good, but not counted towards it).
                if msg.ack == ACK_BULK && msg.request == request && request != 0 {
                    sync.stats.bulk_received.fetch_add(n, Ordering::Relaxed);
                    *bulk_from.entry(from).or_default() += n;
                    last_bulk_record = Some(Instant::now());
                }
                if backup || group {
                    dispatch(&shared, msg.records);
                }
                sync.send_to(&[from], KIND_ACK, msg.seq, 0, Vec::new());
            }
            KIND_ACK => {
                sync.stats.acked_seq.fetch_max(msg.ack, Ordering::Relaxed);
                let mut a = lock(&sync.acked);
                let e = a.entry(from).or_default();
                *e = (*e).max(msg.ack);
            }
            // A group's node answers once it has the group's sessions itself; one transfer
            // at a time to each peer, at most one a second, and to the peer's configured
            // address (a unicast peer's; a group member's own), never to where the request
            // seemed to come from.
            KIND_BULK_REQUEST if (if group { sync.ready() } else { !backup }) => {
                let to = sync.spec.peers.iter().copied().find(|p| p.ip() == from.ip()).unwrap_or(from);
                sync.queue_bulk(to, Export::All, Some(msg.request));
            }
            // Only the answer to this node's last request.
            KIND_BULK_DONE if msg.request != request || request == 0 => {
                sync.stats.bulk_unrequested.fetch_add(1, Ordering::Relaxed);
            }
            KIND_BULK_DONE => {
                // Complete only if every record it announces arrived (a datagram lost on the
                // way makes it incomplete: asked for again).
                let got = bulk_from.remove(&from).unwrap_or(0);
                if got < msg.ack {
                    sync.stats.bulk_incomplete.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("session sync: a bulk transfer from {from} arrived incomplete ({got} of {} records); asking again", msg.ack);
                    continue;
                }
                bulk_done = true;
                request = 0;
                sync.stats.bulk_completed.fetch_add(1, Ordering::Relaxed);
                if group {
                    sync.set_ready(&format!("{from} sent the group's sessions ({got} records)"));
                }
            }
            _ => {}
        }
    }
}

/// Hands records to the workers that will see their packets.
fn dispatch(shared: &SyncCtx, records: Vec<(u8, SyncRecord)>) {
    let workers = shared.workers.len();
    let mask = workers.next_power_of_two() - 1;
    let mut per: Vec<Vec<SyncRecord>> = vec![Vec::new(); workers];
    for (w, r) in records {
        let target = match r.local {
            Some((_, lport)) => lport as usize & mask,
            None => w as usize,
        };
        per[if target < workers { target } else { 0 }].push(r);
    }
    for (w, v) in per.into_iter().enumerate() {
        if !v.is_empty() {
            shared.workers.install(w, v);
        }
    }
}

/// A random bulk request number (never 0); from the clock if the system has no randomness
/// (a number only has to differ from the last one: the messages themselves are sealed).
fn random_request() -> u64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    let r = match ring::rand::SystemRandom::new().fill(&mut b) {
        Ok(()) => u64::from_ne_bytes(b),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
    };
    r.max(1)
}

/// The one thread that sends bulk transfers and refreshes, one at a time, from the queue.
pub fn bulk_sender(shared: SyncCtx, sync: Arc<Sync>) {
    let Some(queue) = lock(&sync.bulk_queue).take() else { return };
    while !shared.stopping() {
        let job = match queue.recv_timeout(Duration::from_millis(100)) {
            Ok(j) => j,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        bulk(&shared, &sync, job.to, job.which, job.request);
        lock(&sync.bulk_to).remove(&job.to.ip());
    }
}

/// Sends sessions to `to` at the pace of its acknowledgements ([`BULK_WINDOW`]): for a
/// request, every session of every worker and then BULK_DONE with their number, each message
/// carrying the request's number; without one, a refresh (`Export::All` for a standby, a
/// group's `Export::OwnFullNat`).
fn bulk(shared: &SyncCtx, sync: &Sync, to: SocketAddr, which: Export, request: Option<u64>) {
    let mark = if request.is_some() { ACK_BULK } else { ACK_REFRESH };
    let number = request.unwrap_or(0);
    let mut sent = 0u64;
    for w in 0..shared.workers.len() {
        for v6 in [false, true] {
            let mut cursor = Some(0);
            while let Some(c) = cursor {
                let Ok((records, next)) = shared.workers.export(w, v6, which, c, MAX_RECORDS * 8) else { break };
                for chunk in records.chunks(MAX_RECORDS) {
                    sync.stats.bulk_sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    sent += chunk.len() as u64;
                    let seq = sync.send_to(&[to], KIND_RECORDS, mark, number, chunk.iter().map(|r| (w as u8, *r)).collect());
                    // Wait for the receiver; give up on one that stopped answering. (A
                    // multicast group's members answer each for itself: paced only.)
                    let (mut acked, mut since) = (sync.acked_by(to), Instant::now());
                    while !to.ip().is_multicast() && seq.saturating_sub(acked) > BULK_WINDOW {
                        if shared.stopping() || since.elapsed() > BULK_STALL {
                            tracing::warn!("session sync: {to} stopped acknowledging a bulk transfer; abandoned");
                            return;
                        }
                        std::thread::sleep(Duration::from_micros(100));
                        let now = sync.acked_by(to);
                        if now != acked {
                            (acked, since) = (now, Instant::now());
                        }
                    }
                }
                cursor = next;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
    if let Some(r) = request {
        sync.send_to(&[to], KIND_BULK_DONE, sent, r, Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_refuses_replays() {
        let mut w = Window::default();
        assert!(w.accept(10, 1));
        assert!(w.accept(10, 3));
        assert!(!w.accept(10, 3), "the same message twice");
        assert!(w.accept(10, 2), "late but new");
        assert!(!w.accept(10, 2));
        assert!(w.accept(10, 100));
        assert!(!w.accept(10, 30), "older than the window");
        assert!(!w.accept(9, 500), "a previous epoch (an old boot of the sender)");
        assert!(w.accept(11, 1), "a new epoch starts over");
        assert!(!w.accept(10, 101));
    }
}
