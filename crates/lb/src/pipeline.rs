//! The vector pipeline: one [`Worker`] per core processes batches of packets in three stages
//! so that the cache misses of a batch overlap (the VPP / HDSLB technique):
//!
//! 1. **classify**: parse, find the service / local address / NAT backend the packet belongs
//!    to, hash its session key and prefetch the index bucket (or the port-map slot);
//! 2. **probe**: read the bucket, pick the candidate record and prefetch it;
//! 3. **act**: verify the key (falling back to a full lookup), create the session if needed,
//!    rewrite the packet and decide its [`Verdict`]. A packet of an existing NAT or full-NAT
//!    flow that changes nothing but its session's expiry takes [`Worker::forward_fast`], one
//!    pass over what the general path checks in several; everything else the general path.
//!
//! The stages run over groups of [`GROUP`] packets, software-pipelined: while stage 3 works on
//! one group, stage 2 works on a later one and stage 1 on a later one still ([`PROBE_LAG`],
//! [`ACT_LAG`]; see `Worker::batch`).
//! The worker owns its session table and counters; it shares only the configuration snapshot,
//! which it re-reads between batches when the control plane publishes a new one.

use crate::flows::Flows;
use crate::frag::{FragKey, FragTable};
use crate::hash::{addr_hash, flow_hash};
use crate::icmp::{ErrorKind, IcmpLimiter};
use crate::mem::Zeroable;
use crate::meta::{Kind, Meta};
use crate::quic;
use crate::rewrite::{egress, encapsulate, fill_l4_checksum, Fam, Hdr};
use crate::service::{backend_slot, Control, DstMemo, Mode, Service, Snapshot, SynProxy, Timeouts};
use crate::session::{expired, flag, state, InsertError, Probe, Ref, Session, SessionTable, TableConfig, NO_LADDR};
use crate::sync::{InstallError, SyncRecord};
use crate::synproxy::{build_segment, Segment, SynProxyState};
use crate::tcpstate;
use crate::verdict::{DropReason, Verdict};
use std::net::IpAddr;
use std::sync::Arc;
use vectorlb_io::PacketBuf;
use vectorlb_packet::{parse_frame, proto, tcp, Family, Frag};
use vectorlb_sched::PickState;

/// Packets per batch by default (the DPDK burst the runtime uses).
pub const DEFAULT_BATCH: usize = 256;
/// Packets that go through a stage together (see `Worker::batch`). Smaller groups spread the
/// prefetches: a group's misses are requested together, and a burst of 32 (16 packets, two
/// lines each) waits for the CPU's miss buffers. Measured on a 2-vCPU EPYC VM at 10 M sessions
/// (`bench/results/dram-ratio.jsonl`, `bench/experiments/dram-floor.rs`): 8 packets with lags 2 and 4 ran
/// 20.1 Mpps against 17.9 for 16 with lags 1 and 2, and 4 / 2 packets with longer lags no better.
pub const GROUP: usize = 8;
/// Steps (groups) between a group's first stage (bucket prefetch) and its second.
pub const PROBE_LAG: usize = 2;
/// Steps between a group's first stage and the search of the probe window for the few keys
/// not in their home bucket (its buckets, prefetched by the second stage, have one step to
/// land; without this their records were read unprefetched in the third stage, a full memory
/// latency for about 5 % of the packets of a full table).
pub const DEEP_LAG: usize = PROBE_LAG + 1;
/// Steps between a group's first stage and its third (the record prefetched in the second has
/// `ACT_LAG - PROBE_LAG` steps to land).
pub const ACT_LAG: usize = 4;

/// A half-open session's timeout under the budget's pressure (`n` half-open sessions of a
/// budget of `lim`): the configured one while they fill at most half the budget, then shrinking
/// in proportion to the room left, to [`MIN_SYN_TIMEOUT`] (IPVS's defense modes shorten
/// timeouts the same way).
#[inline(always)]
fn syn_timeout(to: u32, n: u32, lim: u32) -> u32 {
    let (n, lim) = (n as u64, lim as u64);
    if 2 * n <= lim {
        return to;
    }
    let room = lim.saturating_sub(n);
    ((to as u64 * 2 * room / lim) as u32).clamp(MIN_SYN_TIMEOUT.min(to), to)
}

/// What tells a record's session from a later one in the same record (client port, local port).
#[inline(always)]
fn fifo_stamp<A>(s: &Session<A>) -> u32 {
    (s.cport as u32) << 16 | s.lport as u32
}

/// Appends session `r` to `fifo`, dropping the oldest entry past `limit`.
fn remember(fifo: &mut std::collections::VecDeque<(u32, u32)>, limit: usize, table: &SessionTable, r: Ref) {
    if fifo.len() >= limit {
        fifo.pop_front();
    }
    let stamp = if r.is_v6() { fifo_stamp(table.get::<[u8; 16]>(r)) } else { fifo_stamp(table.get::<[u8; 4]>(r)) };
    fifo.push_back((r.raw_key(), stamp));
}

/// Ends the oldest session of `fifo` (the order sessions were opened or closed in) whose state
/// and flags still pass `ok`, looking at most [`EVICT_SCAN`] entries into it, then, with
/// `sweep`, as many records of the sweep (sessions the order does not hold: synchronised ones).
/// An entry whose record ended and was reused since (another stamp) is skipped. Whether one
/// was ended.
fn evict_oldest(fifo: &mut std::collections::VecDeque<(u32, u32)>, table: &mut SessionTable, sweep: bool, ok: impl Fn(u8, u8) -> bool) -> bool {
    let mut found = None;
    for _ in 0..EVICT_SCAN {
        let Some((k, stamp)) = fifo.pop_front() else { break };
        let Some(r) = Ref::from_key(k) else { continue };
        let (st, fl, now_stamp) = if r.is_v6() {
            let s = table.get::<[u8; 16]>(r);
            (s.state, s.flags, fifo_stamp(s))
        } else {
            let s = table.get::<[u8; 4]>(r);
            (s.state, s.flags, fifo_stamp(s))
        };
        if ok(st, fl) && now_stamp == stamp {
            found = Some(r);
            break;
        }
    }
    let Some(r) = found.or_else(|| if sweep { table.find_state(EVICT_SCAN, &ok) } else { None }) else { return false };
    if r.is_v6() {
        table.remove::<[u8; 16]>(r);
    } else {
        table.remove::<[u8; 4]>(r);
    }
    true
}

/// Whether a packet may create a session: any UDP datagram, a TCP SYN without ACK or RST.
#[inline(always)]
fn opens_flow(m: &Meta) -> bool {
    m.proto != proto::TCP || m.tcp_flags & (tcp::flags::SYN | tcp::flags::ACK | tcp::flags::RST) == tcp::flags::SYN
}

/// Whether a TCP segment without a session continues its flow on `svc`: an ACK (with data,
/// FIN, PSH) without SYN or RST, to a service with continuation on. A reset without a session
/// is dropped as before (it would open a session only to close it).
#[inline(always)]
fn continues(svc: &Service, m: &Meta) -> bool {
    svc.spec.continuation && m.proto == proto::TCP && m.tcp_flags & (tcp::flags::SYN | tcp::flags::ACK | tcp::flags::RST) == tcp::flags::ACK
}

/// The combinations of FIN, SYN, RST, PSH, ACK and URG a TCP endpoint sends (bit `flags & 0x3f`
/// set), as Linux's conntrack lists them: SYN (with URG), SYN+ACK, RST (with ACK, and PSH),
/// ACK with any of FIN, PSH and URG. ECE and CWR are not looked at.
const VALID_TCP_FLAGS: u64 = {
    let (f, s, r, p, a, u) = (0x01, 0x02, 0x04, 0x08, 0x10, 0x20);
    let ok = [s, s | u, s | a, r, r | a, r | a | p, a, a | u, a | p, a | p | u, f | a, f | a | u, f | a | p, f | a | p | u];
    let mut m = 0u64;
    let mut i = 0;
    while i < ok.len() {
        m |= 1 << ok[i];
        i += 1;
    }
    m
};

/// Whether a TCP segment's flags are a combination an endpoint sends.
#[inline(always)]
pub fn tcp_flags_valid(flags: u8) -> bool {
    VALID_TCP_FLAGS >> (flags & 0x3f) & 1 != 0
}

/// Verifies the checksum of the IPv4 header at `l3`; the common 20-byte header is summed in
/// five words.
#[inline(always)]
fn ipv4_header_ok(d: &[u8], l3: usize) -> bool {
    if let Some(h) = d.get(l3..l3 + 20).filter(|h| h[0] == 0x45) {
        // Summed in the machine's byte order: a ones'-complement sum of byte-swapped words is
        // the byte-swapped sum, and the all-ones result a valid header gives is its own swap.
        let w = |i: usize| u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as u64;
        vectorlb_packet::checksum::fold(w(0) + w(4) + w(8) + w(12) + w(16)) == 0xffff
    } else {
        // Options (the parser saw the whole header at `l3`).
        vectorlb_packet::ipv4::Ipv4Packet::new_unchecked(&d[l3..]).verify_checksum()
    }
}

/// The share of a core's sessions and local ports half-open TCP sessions may hold by default,
/// in thousandths.
pub const DEFAULT_HALF_OPEN_PERMILLE: u16 = 250;
/// The default continuation budget: a tenth of the session table.
pub const DEFAULT_CONTINUED_PERMILLE: u16 = 100;
/// Records examined for a half-open session to evict when the budget is spent.
const EVICT_SCAN: u32 = 64;
/// The most closed sessions remembered in the order they closed (8 bytes each).
const CLOSED_ORDER: usize = 1 << 20;
/// The shortest a half-open session's timeout becomes under pressure (ms).
const MIN_SYN_TIMEOUT: u32 = 1_000;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub table: TableConfig,
    /// Largest batch `process` accepts in one call.
    pub batch: usize,
    /// The half-open budget: the share (thousandths) of the table and of this core's local
    /// ports that sessions still in their handshake may hold (0: no budget).
    pub half_open_permille: u16,
    /// The continuation budget: the share (thousandths) of the table that sessions opened by
    /// continuation and not confirmed yet may hold (at least one session).
    pub continued_permille: u16,
}

impl WorkerConfig {
    pub fn new(max_sessions: u32) -> Self {
        WorkerConfig { table: TableConfig::new(max_sessions), batch: DEFAULT_BATCH, half_open_permille: DEFAULT_HALF_OPEN_PERMILLE, continued_permille: DEFAULT_CONTINUED_PERMILLE }
    }

    /// The most continued sessions (state CONTINUED) one core holds.
    pub fn continued_limit(&self) -> u32 {
        ((self.table.max_sessions as u64 * self.continued_permille as u64 / 1000) as u32).max(1)
    }

    /// The most half-open sessions one core holds: the share of its table or of its local
    /// ports (per local address), whichever is smaller; no bound with a share of 0 (the
    /// benchmarks, which open their sessions with SYNs alone).
    pub fn half_open_limit(&self) -> u32 {
        if self.half_open_permille == 0 {
            return u32::MAX;
        }
        let t = &self.table;
        let ports = ((t.port_max as u32 + 1).saturating_sub(t.port_min as u32)) >> t.core_shift;
        let base = t.max_sessions.min(ports.max(1)) as u64;
        ((base * self.half_open_permille as u64 / 1000) as u32).max(1)
    }
}

pub struct Worker {
    control: Arc<Control>,
    pub(crate) snap: Arc<Snapshot>,
    /// The network policies ([`crate::policy`]), refreshed with the snapshot.
    pol: Arc<crate::policy::PolicySet>,
    /// This worker's recent routed flows under policy, in front of the shared table.
    pol_cache: crate::policy::FlowCache,
    /// What the mesh steers to the node's proxy ([`crate::mesh`]).
    mesh: Arc<crate::mesh::Mesh>,
    /// The session table, the counters and what the features share ([`Flows`]).
    pub flows: Flows,
    /// Each feature's own state.
    frag: FragTable,
    icmp: IcmpLimiter,
    syn: SynProxyState,
    pub(crate) picks: Vec<PickState>,
    pub(crate) cursors: Vec<usize>,
    wlc_scratch: Vec<u32>,
    meta: Vec<Meta>,
    /// The half-open budget ([`WorkerConfig::half_open_limit`]).
    half_open_limit: u32,
    /// A first fragment is being forwarded (no TOA, no held data: the rest of the datagram is
    /// elsewhere).
    in_fragment: bool,
    /// Sessions in the order they were opened in SYN_SENT (at most the budget's size): the
    /// oldest half-open one is the first evicted, so a handshake that completes within the
    /// time the flood takes to send a budget's worth of SYNs survives it.
    half_open_fifo: std::collections::VecDeque<(u32, u32)>,
    /// The continuation budget ([`WorkerConfig::continued_limit`]) and the continued sessions
    /// in the order they were opened: when the budget is spent, the oldest continued one
    /// makes room, so a flood of segments without sessions churns only its own share of the
    /// table and never an established session.
    continued_limit: u32,
    continued_fifo: std::collections::VecDeque<(u32, u32)>,
    /// Sessions in the order they closed (TIME_WAIT or CLOSE, with a timeout still to run), at
    /// most [`CLOSED_ORDER`]: when the table is full, the oldest closed one makes room for a
    /// new connection before anything is refused. Closed sessions installed by sync or the
    /// hand-off join it in the order they arrive.
    closed_fifo: std::collections::VecDeque<(u32, u32)>,
    /// [`Worker::sync_group`].
    sync_group: bool,
    /// Whether packets of existing flows may take [`Worker::forward_fast`] (on by default; the
    /// tests turn it off to compare it with the general path).
    pub fast_path: bool,
}

/// A packet toward a service, as [`Worker::forward_flow`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardFlow {
    /// The service's id in the snapshot.
    pub svc: u16,
    /// A hash of the client's address and port, the same on every core.
    pub flow_hash: u64,
    /// Whether this core holds a session of the flow.
    pub local_session: bool,
}

impl Worker {
    pub fn new(control: Arc<Control>, cfg: WorkerConfig) -> std::io::Result<Worker> {
        let snap = control.snapshot();
        let batch = cfg.batch.max(1);
        let half_open_limit = cfg.half_open_limit();
        let continued_limit = cfg.continued_limit();
        Ok(Worker {
            snap,
            pol: control.policy(),
            pol_cache: Default::default(),
            mesh: control.mesh(),
            syn: SynProxyState::new(control.cookie_key),
            control,
            flows: Flows::new(SessionTable::new(cfg.table)?),
            frag: FragTable::default(),
            icmp: IcmpLimiter::default(),
            picks: Vec::new(),
            cursors: Vec::new(),
            wlc_scratch: Vec::new(),
            meta: vec![Meta::default(); batch],
            half_open_limit,
            half_open_fifo: std::collections::VecDeque::new(),
            continued_limit,
            continued_fifo: std::collections::VecDeque::new(),
            closed_fifo: std::collections::VecDeque::new(),
            sync_group: false,
            in_fragment: false,
            fast_path: true,
        })
    }

    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snap
    }

    /// Routes a frame that is not the load balancer's (a pods port's: [`crate::route`]): the
    /// forwarded frame; or, for an expired TTL or an unreachable route's destination, the ICMP
    /// error to its source that it became (this core's ICMP rate limit applies); or the drop.
    pub fn route<B: PacketBuf>(&mut self, b: &mut B, now: u32) -> Verdict {
        self.refresh_policy();
        // Parsed once, for the policy and the route.
        let info = match vectorlb_packet::parse_frame(b.data()) {
            Ok(i) => i,
            Err(e) => return Verdict::Drop(e.into()),
        };
        // Every routed flow is remembered, policy or not (a policy that later selects an end
        // must not cut it): the worker's cache makes that a hash and a compare a packet.
        if let Err(r) = crate::policy::check_parsed(&self.pol, &self.control.policy_flows, Some(&mut self.pol_cache), b.data(), &info, now) {
            return Verdict::Drop(r);
        }
        let via = self.mesh.steer(b.data(), &info);
        let snap = self.snap.clone();
        match crate::route::route_via(&snap, b, &info, via) {
            Ok(v) => v,
            Err(crate::route::Unrouted { reason, icmp: Some((kind, h)) }) if h.v6 => self.icmp.error_hdr::<[u8; 16], B>(&mut self.flows, &snap, b, h, kind, reason, now),
            Err(crate::route::Unrouted { reason, icmp: Some((kind, h)) }) => self.icmp.error_hdr::<[u8; 4], B>(&mut self.flows, &snap, b, h, kind, reason, now),
            Err(u) => Verdict::Drop(u.reason),
        }
    }

    /// The flow of a packet from a client to one of the services (the forward direction), as
    /// the runtime's queue-set steering needs it; None for anything else (replies, fragments,
    /// other protocols, bad frames: the pipeline decides those where they arrive).
    pub fn forward_flow(&self, d: &[u8]) -> Option<ForwardFlow> {
        let info = parse_frame(d).ok()?;
        if info.frag != Frag::None || !(info.proto == proto::TCP || info.proto == proto::UDP) {
            return None;
        }
        match info.family? {
            Family::V4 => self.forward_flow_fam::<[u8; 4]>(d, info.l3, info.l4, info.proto),
            Family::V6 => self.forward_flow_fam::<[u8; 16]>(d, info.l3, info.l4, info.proto),
        }
    }

    fn forward_flow_fam<A: Fam>(&self, d: &[u8], l3: usize, l4: usize, proto: u8) -> Option<ForwardFlow>
    where
        Session<A>: Zeroable,
    {
        // The parser saw the whole fixed IP header and the TCP / UDP ports.
        let ip = d.get(l3..l3 + A::HEADER)?;
        let (src, dst) = (A::read(ip, A::SRC), A::read(ip, A::DST));
        let mut memo = DstMemo::default();
        let own = self.snap.dst_memo(dst.key(), &mut memo)?;
        let ports = u32::from_be_bytes(d.get(l4..l4 + 4)?.try_into().ok()?);
        let (sport, dport) = ((ports >> 16) as u16, ports as u16);
        let svc = own.service(dport, proto)?;
        let local_session = self.flows.table.find_fwd(self.flows.table.hash_fwd(svc, &src, sport), svc, &src, sport).is_some();
        // The same on every core (the table's hash is keyed per core): which core of a set
        // takes a flow must not depend on where its packets arrive.
        let key = src.key();
        let mut h = (key as u64) ^ ((key >> 64) as u64).rotate_left(29) ^ ((sport as u64) << 16 | svc as u64).rotate_left(47);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        Some(ForwardFlow { svc, flow_hash: h, local_session })
    }

    #[inline(always)]
    pub fn has_unresolved(&self) -> bool {
        self.flows.has_unresolved()
    }

    /// Next hops packets needed since the last call whose MAC was unknown.
    pub fn take_unresolved(&mut self) -> Vec<(std::net::IpAddr, u16)> {
        let snap = self.snap.clone();
        self.flows.take_unresolved(&snap)
    }

    /// Starts (or stops) remembering which sessions change, for [`Worker::take_changes`].
    pub fn track_changes(&mut self, on: bool) {
        self.flows.track_changes(on);
    }

    /// A scale-out sync group's member (off: an HA pair's). In a group, [`Worker::take_changes`]
    /// leaves out sessions of services with stateless continuation (any node re-creates them,
    /// so only what continuation cannot re-create is streamed), and [`Worker::install`] never
    /// replaces a session on one of this node's own local addresses with a peer's different
    /// one for the same flow (ours carries the flow now: the peer's is what is left of an
    /// earlier connection that reused the client's port).
    pub fn sync_group(&mut self, on: bool) {
        self.sync_group = on;
    }

    #[inline(always)]
    pub fn has_changes(&self) -> bool {
        self.flows.has_changes()
    }

    /// The sessions created or moved to another TCP state since the last call (`sync.rs`).
    pub fn take_changes(&mut self, now: u32, out: &mut Vec<SyncRecord>) {
        let snap = self.snap.clone();
        crate::sync::take_changes(&mut self.flows, &snap, now, !self.sync_group, out);
    }

    /// Up to `limit` live sessions of one family from record `start`; the index to continue
    /// from, or `None` at the end (bulk transfer to a standby).
    pub fn export(&self, v6: bool, which: crate::sync::Export, start: usize, limit: usize, now: u32, out: &mut Vec<SyncRecord>) -> Option<usize> {
        crate::sync::export(&self.flows, &self.snap, v6, which, start, limit, now, out)
    }

    /// Installs (or updates) a session received from the active node, under the current
    /// configuration.
    pub fn install(&mut self, rec: &SyncRecord, now: u32) -> Result<(), InstallError> {
        self.refresh();
        let snap = self.snap.clone();
        let r = crate::sync::install(&mut self.flows, &snap, rec, now, self.sync_group)?;
        if rec.state == state::TIME_WAIT || rec.state == state::CLOSE {
            self.closed(r);
        }
        Ok(())
    }

    /// Remembers a session that closed, in order ([`Worker::evict_closed`]).
    fn closed(&mut self, r: Ref) {
        remember(&mut self.closed_fifo, CLOSED_ORDER, &self.flows.table, r);
    }

    /// Picks up a newly published configuration; a service's scheduler state restarts only if
    /// that service changed.
    #[inline]
    fn refresh_policy(&mut self) {
        if self.control.policy_generation() != self.pol.generation {
            self.pol = self.control.policy();
        }
        if self.control.mesh_generation() != self.mesh.generation {
            self.mesh = self.control.mesh();
        }
    }

    fn refresh(&mut self) {
        self.refresh_policy();
        if self.control.generation() != self.snap.generation {
            let new = self.control.snapshot();
            // Scheduler state (rr / wrr positions) survives snapshots that leave the service
            // as it was (a neighbour learnt, another service edited).
            for (i, p) in self.picks.iter_mut().enumerate() {
                let same = match (self.snap.service(i as u16), new.service(i as u16)) {
                    (Some(a), Some(b)) => a.spec == b.spec && a.backends == b.backends,
                    _ => false,
                };
                if !same {
                    *p = PickState::default();
                }
            }
            self.snap = new;
        }
        let (svcs, slots) = self.snap.id_bounds();
        if self.flows.counters.services.len() < svcs {
            self.flows.counters.services.resize(svcs, Default::default());
        }
        if self.flows.counters.backends.len() < slots {
            self.flows.counters.backends.resize(slots, Default::default());
        }
    }

    /// Expires idle sessions when the worker has no packets (bounded work per call).
    pub fn idle(&mut self, now: u32, budget: u32) -> u32 {
        self.refresh();
        self.flows.table.sweep(now, budget)
    }

    /// Processes a batch. `verdicts[i]` receives the decision for `bufs[i]`; buffers marked
    /// `Tx` have been rewritten in place. `now` is the worker clock in milliseconds.
    pub fn process<B: PacketBuf>(&mut self, bufs: &mut [B], verdicts: &mut [Verdict], now: u32) {
        assert!(verdicts.len() >= bufs.len(), "one verdict per buffer");
        self.refresh();
        let snap = self.snap.clone();
        for start in (0..bufs.len()).step_by(self.meta.len()) {
            let end = (start + self.meta.len()).min(bufs.len());
            self.batch(&snap, &mut bufs[start..end], &mut verdicts[start..end], now);
        }
        let budget = self.flows.table.config().sweep_budget;
        self.flows.table.sweep(now, budget);
    }

    /// Stage 2: reads the home bucket (or port map) and prefetches the candidate record.
    #[inline(always)]
    fn probe(&self, m: &mut Meta) {
        m.seen = self.flows.table.stats.inserted as u16;
        match m.kind {
            Kind::Forward | Kind::NatReply | Kind::Snat => match self.flows.table.probe(m.hash) {
                Probe::Candidate(r) => {
                    self.flows.table.prefetch_record(r);
                    m.cand = Some(r);
                }
                Probe::Miss => {}
                Probe::Deep => m.deep = true,
            },
            Kind::PortReply => {
                if let Some(r) = self.flows.table.port_lookup(m.id as u16, m.dport) {
                    self.flows.table.prefetch_record(r);
                    m.cand = Some(r);
                }
            }
            _ => {}
        }
    }

    fn batch<B: PacketBuf>(&mut self, snap: &Snapshot, bufs: &mut [B], verdicts: &mut [Verdict], now: u32) {
        let n = bufs.len();
        self.flows.counters.events.rx += n as u64;
        let mut meta = std::mem::take(&mut self.meta);
        // Software pipelining over groups of packets: in step k the first stage runs on group k,
        // the second on group k - PROBE_LAG and the third on group k - ACT_LAG, so a group's
        // bucket prefetches (stage 1) have PROBE_LAG steps of work to land before stage 2 reads
        // them, and its record prefetches (stage 2) ACT_LAG - PROBE_LAG steps before stage 3;
        // each stage is a plain loop.
        let mut memo = DstMemo::default();
        // Forwarded packets, the common case, are counted in a register.
        let mut tx = 0;
        let mut deep_pending = false;
        let fast_before = self.flows.counters.events.fast_path;
        let groups = n.div_ceil(GROUP);
        let (bufs, verdicts, metas) = (&mut bufs[..n], &mut verdicts[..n], &mut meta[..n]);
        // Index loops over `lo..hi` with `hi <= n`: no bounds check is left in them.
        let span = |g: usize| (g * GROUP, ((g + 1) * GROUP).min(n));
        for step in 0..groups + ACT_LAG {
            if let Some(g) = step.checked_sub(ACT_LAG) {
                let (lo, hi) = span(g);
                for i in lo..hi {
                    let (m, b) = (&metas[i], &mut bufs[i]);
                    // Packets of existing flows first (counted by `fast_path`, added to `tx` below).
                    if m.kind == Kind::Forward && self.fast_path {
                        let v = if m.v6 { self.forward_fast::<[u8; 16], B>(snap, b, m, now) } else { self.forward_fast::<[u8; 4], B>(snap, b, m, now) };
                        if let Some(v) = v {
                            verdicts[i] = v;
                            continue;
                        }
                    }
                    if m.kind != Kind::Done {
                        verdicts[i] = if m.v6 { self.act::<[u8; 16], B>(snap, b, m, now) } else { self.act::<[u8; 4], B>(snap, b, m, now) };
                    }
                    match verdicts[i] {
                        Verdict::Tx(_) => tx += 1,
                        Verdict::Kernel => self.flows.counters.events.to_kernel += 1,
                        Verdict::Drop(r) => self.flows.counters.drop(r),
                        Verdict::Handoff(_) => self.flows.counters.events.handoff += 1,
                    }
                }
            }
            // The group the previous step probed, if any of its keys were not at home.
            if deep_pending {
                deep_pending = false;
                let (lo, hi) = span(step - DEEP_LAG);
                for m in &mut metas[lo..hi] {
                    if m.deep {
                        if let Some(r) = self.flows.table.probe_window(m.hash) {
                            self.flows.table.prefetch_record(r);
                            m.cand = Some(r);
                        }
                    }
                }
            }
            if let Some(g) = step.checked_sub(PROBE_LAG).filter(|g| *g < groups) {
                let (lo, hi) = span(g);
                for m in &mut metas[lo..hi] {
                    self.probe(m);
                    deep_pending |= m.deep;
                }
            }
            if step < groups {
                let (lo, hi) = span(step);
                for b in &bufs[lo..hi] {
                    b.prefetch();
                }
                for i in lo..hi {
                    let m = &mut metas[i];
                    *m = Meta::default();
                    if let Some(v) = self.classify(snap, bufs[i].data(), m, &mut memo) {
                        verdicts[i] = v;
                    }
                }
            }
        }
        self.meta = meta;
        self.flows.counters.events.tx += tx + (self.flows.counters.events.fast_path - fast_before);
    }

    /// Stage 1 for one packet. Returns a verdict when the packet is decided already.
    #[inline(always)]
    fn classify<'a>(&self, snap: &'a Snapshot, d: &[u8], m: &mut Meta, memo: &mut DstMemo<'a>) -> Option<Verdict> {
        let info = match parse_frame(d) {
            Ok(i) => i,
            Err(e) => return Some(Verdict::Drop(e.into())),
        };
        let Some(family) = info.family else {
            return Some(Verdict::Kernel);
        };
        m.l3 = info.l3 as u8;
        m.l4 = info.l4 as u16;
        m.end = info.end as u16;
        m.proto = info.proto;
        m.v6 = family == Family::V6;
        if m.v6 {
            self.classify_fam::<[u8; 16]>(snap, d, info.frag, m, memo)
        } else {
            if !ipv4_header_ok(d, info.l3) {
                return Some(Verdict::Drop(DropReason::BadChecksum));
            }
            self.classify_fam::<[u8; 4]>(snap, d, info.frag, m, memo)
        }
    }

    #[inline(always)]
    pub(crate) fn classify_fam<'a, A: Fam>(&self, snap: &'a Snapshot, d: &[u8], frag: Frag, m: &mut Meta, memo: &mut DstMemo<'a>) -> Option<Verdict>
    where
        Session<A>: Zeroable,
    {
        let l3 = m.l3 as usize;
        let l4 = m.l4 as usize;
        // One bounds check for both addresses (the parser saw the whole fixed header).
        let ip = &d[l3..l3 + A::HEADER];
        let (src, dst) = (A::read(ip, A::SRC), A::read(ip, A::DST));
        let dkey = dst.key();
        let own = snap.dst_memo(dkey, memo);
        if frag != Frag::None {
            // Fragments of the LB's flows (to its addresses, or replies through it) take the
            // slow path; others go to the host unless a first fragment was seen.
            if own.is_some() || frag == Frag::First || !self.frag.is_empty() {
                m.kind = if frag == Frag::First { Kind::Frag } else { Kind::FragLater };
                return None;
            }
            return Some(Verdict::Kernel);
        }
        match m.proto {
            proto::TCP | proto::UDP => {}
            proto::ICMP | proto::ICMPV6 if (m.proto == proto::ICMPV6) == m.v6 => {
                m.kind = Kind::Icmp;
                return None;
            }
            _ => return Some(if own.is_some_and(|d| d.vip) { Verdict::Drop(DropReason::UnsupportedProtocol) } else { Verdict::Kernel }),
        }
        let ports = u32::from_be_bytes(d[l4..l4 + 4].try_into().unwrap());
        (m.sport, m.dport) = ((ports >> 16) as u16, ports as u16);
        if m.proto == proto::TCP {
            m.tcp_flags = d[l4 + 13];
            // Scans and floods with impossible flags (SYN+FIN, null, ...) open no session and
            // reach no backend.
            if own.is_some() && !tcp_flags_valid(m.tcp_flags) {
                return Some(Verdict::Drop(DropReason::InvalidTcpFlags));
            }
        }
        if let Some(own) = own {
            if let Some(svc) = memo.service(own, m.dport, m.proto) {
                m.kind = Kind::Forward;
                m.id = svc as u32;
                m.hash = self.flows.table.hash_fwd(svc, &src, m.sport);
                self.flows.table.prefetch_bucket(m.hash);
                return None;
            }
            if let Some(l) = own.laddr {
                m.kind = Kind::PortReply;
                m.id = l as u32;
                self.flows.table.prefetch_port(l, m.dport);
                return None;
            }
            // A hairpin reply: a NAT backend answering its own connection, whose source the
            // forward path made the VIP; its session is keyed by the client, which is the
            // backend's own address.
            if own.vip {
                if let Some(ids) = snap.nat_backends(src.key(), m.sport, m.proto) {
                    m.kind = Kind::NatReply;
                    m.id = ids[0];
                    m.hash = self.flows.table.hash_rev(ids[0], &src, m.dport);
                    self.flows.table.prefetch_bucket(m.hash);
                    return None;
                }
            }
            // A VIP's port no service has is dropped, unless the address is also the host's
            // (a node's address with NodePorts), whose sockets may listen there.
            return Some(if own.vip && !own.host { Verdict::Drop(DropReason::NoSession) } else { Verdict::Kernel });
        }
        let skey = src.key();
        if let Some(ids) = snap.nat_backends(skey, m.sport, m.proto) {
            m.kind = Kind::NatReply;
            m.id = ids[0];
            m.hash = self.flows.table.hash_rev(ids[0], &dst, m.dport);
            self.flows.table.prefetch_bucket(m.hash);
            return None;
        }
        if let Some(rule) = snap.snat_rule(skey, dkey, !m.v6) {
            m.kind = Kind::Snat;
            m.id = rule.id as u32;
            m.hash = self.flows.table.hash_fwd(rule.id, &src, m.sport);
            self.flows.table.prefetch_bucket(m.hash);
            return None;
        }
        if m.proto == proto::UDP {
            if let Some(rule) = snap.snat_inbound(skey, dkey, !m.v6) {
                m.kind = Kind::SnatIn;
                m.id = rule.id as u32;
                m.hash = self.flows.table.hash_fwd(rule.id, &dst, m.dport);
                m.deep = true;
                return None;
            }
        }
        Some(Verdict::Kernel)
    }

    #[inline(always)]
    pub(crate) fn act<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        match m.kind {
            Kind::Forward => self.forward::<A, B>(snap, b, m, now),
            Kind::PortReply => self.port_reply::<A, B>(snap, b, m, now),
            Kind::NatReply => self.nat_reply::<A, B>(snap, b, m, now),
            Kind::Snat => self.snat_out::<A, B>(snap, b, m, now),
            Kind::SnatIn => self.snat_in::<A, B>(snap, b, m, now),
            Kind::Icmp => self.icmp.packet::<A, B>(&mut self.flows, snap, b, m, now),
            Kind::Frag | Kind::FragLater => self.fragment::<A, B>(snap, b, m, now),
            Kind::Done => Verdict::Kernel,
        }
    }

    /// The live forward-key session, using the stage-2 candidate when it verifies. An expired
    /// session is removed and reported absent.
    #[inline(always)]
    fn lookup_fwd<A: Fam>(&mut self, m: &Meta, svc: u16, client: &A, cport: u16, now: u32) -> Option<Ref>
    where
        Session<A>: Zeroable,
    {
        let hit = |t: &SessionTable, r: Ref| {
            !r.is_reverse() && r.is_v6() == A::V6 && {
                let s = t.get::<A>(r);
                s.state != state::FREE && s.svc == svc && s.cport == cport && s.client == *client
            }
        };
        let r = match m.cand {
            Some(r) if hit(&self.flows.table, r) => Some(r),
            Some(_) => self.flows.table.find_fwd(m.hash, svc, client, cport),
            None if m.deep || self.flows.table.stats.inserted as u16 != m.seen => self.flows.table.find_fwd(m.hash, svc, client, cport),
            None => None,
        }?;
        self.flows.live::<A>(r, now)
    }

    /// Advances the session's state for a packet; returns (old state, remove after forwarding).
    #[inline(always)]
    pub(crate) fn advance<A: Fam>(&mut self, r: Ref, m: &Meta, inbound: bool, one_way: bool, t: &Timeouts, now: u32) -> (u8, bool)
    where
        Session<A>: Zeroable,
    {
        if m.proto != proto::TCP {
            // UDP sessions are created in state UDP and stay there: only the expiry moves.
            let s = self.flows.table.get_mut::<A>(r);
            let e = now.wrapping_add(t.udp);
            if s.expire != e {
                s.expire = e;
            }
            return (s.state, t.udp == 0);
        }
        let (n, lim) = (self.flows.table.half_open(), self.half_open_limit);
        let s = self.flows.table.get_mut::<A>(r);
        let old = s.state;
        let st = tcpstate::transition(old, &mut s.flags, m.tcp_flags, inbound, one_way);
        let mut to = tcpstate::timeout(st, s.flags, t);
        if crate::session::half_open(st) {
            to = syn_timeout(to, n, lim);
        }
        let e = now.wrapping_add(to);
        if s.expire != e {
            s.expire = e;
        }
        if st != old {
            self.flows.table.set_state::<A>(r, st);
            self.flows.changed(r);
            if to != 0 && (st == state::TIME_WAIT || st == state::CLOSE) && old != state::TIME_WAIT && old != state::CLOSE {
                self.closed(r);
            }
        }
        (old, to == 0)
    }

    /// Turns a TCP segment into the reset that answers it (RFC 9293 §3.10.7.1): addresses and
    /// ports swapped, `seq` = its ACK number (or 0 with ACK set and `ack` = its sequence number
    /// plus its length), no options, no payload; sent back toward its sender.
    pub(crate) fn tcp_reset<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let d = b.data();
        if h.end < h.l4 + 20 {
            return Verdict::Drop(DropReason::BackendRemoved);
        }
        let src = A::read(d, h.l3 + A::SRC);
        let dst = A::read(d, h.l3 + A::DST);
        let t = &d[h.l4..h.end];
        let doff = ((t[12] >> 4) as usize * 4).clamp(20, t.len());
        let seq = u32::from_be_bytes(t[4..8].try_into().unwrap());
        let ack = u32::from_be_bytes(t[8..12].try_into().unwrap());
        let flags = t[13];
        let seg_len = (t.len() - doff) as u32 + (flags & tcp::flags::SYN != 0) as u32 + (flags & tcp::flags::FIN != 0) as u32;
        let (rseq, rack, rflags) = if flags & tcp::flags::ACK != 0 { (ack, 0, tcp::flags::RST) } else { (0, seq.wrapping_add(seg_len), tcp::flags::RST | tcp::flags::ACK) };
        let seg =
            Segment { sport: u16::from_be_bytes([t[2], t[3]]), dport: u16::from_be_bytes([t[0], t[1]]), seq: rseq, ack: rack, flags: rflags, win: 0, opts: &[], payload: &[] };
        let Some(hop) = self.flows.route_to(snap, src.key(), !A::V6) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        // A fresh IP header (20 bytes, or 40), right where the old one began.
        let Some(nh) = build_segment::<A, B>(b, h.l3, &dst, &src, &seg) else {
            return Verdict::Drop(DropReason::NoRoom);
        };
        self.flows.counters.events.tcp_resets_sent += 1;
        egress(b, nh.l3, &hop, A::ETHERTYPE)
    }

    /// The session for the first packet `m` of a flow (`opening`: the packet the session is
    /// created for, the SYN a cookie ACK becomes), or the verdict when there can be none. No
    /// backend takes new connections (all weights 0, or all down, or none: a Kubernetes Service
    /// without endpoints): the client is told at once, rather than left to retry into silence:
    /// a TCP client with a reset answering `m`, a UDP one with an ICMP port unreachable from the
    /// service's address (rate-limited with the other ICMP errors).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn open<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, svc: &Service, b: &mut B, m: &Meta, opening: &Meta, src: A, now: u32) -> Result<Ref, Verdict>
    where
        Session<A>: Zeroable,
    {
        let quic = if svc.spec.quic && m.proto == proto::UDP { b.data().get(m.l4 as usize + 8..m.end as usize).map_or(quic::Route::Hash, quic::route) } else { quic::Route::Hash };
        match self.create::<A>(svc, src, opening, quic, now) {
            Ok(r) => Ok(r),
            Err(DropReason::NoBackend) if m.proto == proto::TCP => Err(self.tcp_reset::<A, B>(snap, b, m)),
            Err(DropReason::NoBackend) if m.proto == proto::UDP => {
                Err(self.icmp.error::<A, B>(&mut self.flows, snap, b, m, crate::icmp::ErrorKind::PortUnreachable, DropReason::NoBackend, now))
            }
            Err(e) => Err(Verdict::Drop(e)),
        }
    }

    /// Creates a session for a new flow, or says why not.
    #[inline]
    fn create<A: Fam>(&mut self, svc: &Service, client: A, m: &Meta, quic: quic::Route, now: u32) -> Result<Ref, DropReason>
    where
        Session<A>: Zeroable,
    {
        let st = if opens_flow(m) {
            if m.proto == proto::TCP {
                state::SYN_SENT
            } else {
                state::UDP
            }
        } else if continues(svc, m) {
            state::CONTINUED
        } else {
            return Err(DropReason::NoSession);
        };
        let id = svc.id as usize;
        if self.picks.len() <= id {
            self.picks.resize_with(id + 1, PickState::default);
        }
        if matches!(svc.spec.scheduler, vectorlb_sched::Algorithm::Wlc) {
            let active = self.flows.table.active();
            self.wlc_scratch.clear();
            self.wlc_scratch.extend(svc.backends.iter().map(|&b| active.get(backend_slot(b) as usize).copied().unwrap_or(0)));
        }
        let fh = flow_hash(svc.hash_key, client.key(), svc.vip_key, m.sport, m.dport, m.proto);
        // A QUIC packet carrying a backend's server id goes to that backend (if it takes new
        // flows); the rest by the scheduler.
        let by_id = match quic {
            quic::Route::ServerId(sid) => match svc.quic_ids.get(&sid) {
                Some(&bi) if svc.sched.is_eligible(bi) => {
                    self.flows.counters.events.quic_by_server_id += 1;
                    Some(bi)
                }
                _ => {
                    self.flows.counters.events.quic_unknown_server_id += 1;
                    None
                }
            },
            quic::Route::Hash if svc.spec.quic => {
                self.flows.counters.events.quic_by_hash += 1;
                None
            }
            quic::Route::Hash => None,
        };
        // A client with an affinity entry goes back to its backend while that backend takes
        // new flows; otherwise the scheduler picks, and the choice is remembered.
        let kept = match (&svc.affinity, by_id) {
            (Some(a), None) => a.lookup(client.key(), now).and_then(|b| svc.backends.iter().position(|&x| x == b)).map(|i| i as u32).filter(|&i| svc.sched.is_eligible(i)),
            _ => None,
        };
        let pick = by_id.or(kept).or_else(|| svc.sched.pick(&mut self.picks[id], fh, addr_hash(svc.hash_key, client.key()), &self.wlc_scratch));
        let Some(bi) = pick else {
            return Err(DropReason::NoBackend);
        };
        // A NAT service's client and backend may be pods under network policy: the flow is
        // decided once, here, and the session remembers it.
        let local = svc.translates_client(client.key());
        if self.pol.active {
            self.check_policy(svc, client.key(), local, svc.backends[bi as usize], m)?;
        }
        if let Some(a) = &svc.affinity {
            if kept.is_some() {
                self.flows.counters.events.affinity_kept += 1;
            }
            if !a.record(client.key(), svc.backends[bi as usize], now) {
                self.flows.counters.events.affinity_full += 1;
            }
        }
        // A NAT session keeps the client's address and is found again by the backend's reply
        // (a reverse entry); one with a local address (full NAT, or a NAT service's
        // masquerade) by the local port.
        let flags = if svc.spec.mode == Mode::Nat && !local { flag::REVERSE } else { 0 } | if st == state::CONTINUED { flag::UNSEEN } else { 0 };
        let laddrs: &[u16] = if local { &svc.laddrs } else { &[] };
        let backend = svc.backends[bi as usize];
        let r = match self.insert::<A>(m, st, client, svc.id, backend, flags, &svc.spec.timeouts, laddrs, id, now) {
            // Half-open sessions hold the ports the search met: the oldest makes room.
            Err(DropReason::NoLocalPort) if m.proto == proto::TCP && self.flows.table.half_open() > 0 && self.evict_half_open() => {
                self.insert::<A>(m, st, client, svc.id, backend, flags, &svc.spec.timeouts, laddrs, id, now)?
            }
            r => r?,
        };
        if st == state::CONTINUED {
            self.flows.counters.events.continued += 1;
        }
        self.svc_counters(svc.id).new_sessions += 1;
        if let Some(c) = self.flows.counters.backends.get_mut(backend_slot(backend) as usize) {
            c.new_sessions += 1;
        }
        Ok(r)
    }

    /// The network policies' decision on a new session's flow: from the client to the backend,
    /// the backend's ingress seeing the client, or the service's local address when it
    /// masquerades the client.
    #[cold]
    fn check_policy(&mut self, svc: &Service, client: u128, local: bool, backend: u32, m: &Meta) -> Result<(), DropReason> {
        let Some(b) = self.snap.backend(backend) else {
            return Ok(());
        };
        let seen = if local { svc.laddrs.first().and_then(|&l| self.snap.laddr_key(l)).unwrap_or(client) } else { client };
        let port = if b.port == 0 { m.dport } else { b.port };
        match self.pol.decide_as(client, seen, b.key, m.proto, port) {
            crate::policy::Decision::Denied { dir, policy } => {
                self.pol.count_denied(crate::policy::Denial { src: client, dst: b.key, proto: m.proto, port, dir, policy });
                Err(DropReason::PolicyDenied)
            }
            _ => Ok(()),
        }
    }

    /// Inserts a session in state `st` (SYN_SENT, UDP or CONTINUED) for the flow of `m`,
    /// binding a local port from `laddrs` (cursor `cursor` of this core) when given.
    #[allow(clippy::too_many_arguments)]
    fn insert<A: Fam>(&mut self, m: &Meta, st: u8, client: A, svc: u16, backend: u32, flags: u8, t: &Timeouts, laddrs: &[u16], cursor: usize, now: u32) -> Result<Ref, DropReason>
    where
        Session<A>: Zeroable,
    {
        let mut to = tcpstate::timeout(st, flags, t);
        if st == state::CONTINUED && self.flows.table.continued() >= self.continued_limit && !self.evict_continued() {
            return Err(DropReason::ContinuationLimit);
        }
        if st == state::SYN_SENT {
            if self.flows.table.half_open() >= self.half_open_limit && !self.evict_half_open() {
                return Err(DropReason::HalfOpenLimit);
            }
            to = syn_timeout(to, self.flows.table.half_open(), self.half_open_limit);
        }
        let s = Session { client, cport: m.sport, svc, backend, laddr: NO_LADDR, lport: 0, expire: now.wrapping_add(to), state: st, flags };
        if self.cursors.len() <= cursor {
            self.cursors.resize(cursor + 1, 0);
        }
        let mut placed = self.flows.table.insert(s, laddrs, &mut self.cursors[cursor]);
        // A full table: the oldest closed session makes room (a connection that is over, kept
        // only for its TIME_WAIT), once; then the new one is refused, at the cost of a few
        // looks into the order of closing.
        if matches!(placed, Err(InsertError::Full)) && self.evict_closed() {
            placed = self.flows.table.insert(s, laddrs, &mut self.cursors[cursor]);
        }
        match placed {
            Ok(r) => {
                if st == state::SYN_SENT && self.half_open_limit != u32::MAX {
                    remember(&mut self.half_open_fifo, self.half_open_limit as usize, &self.flows.table, r);
                }
                if st == state::CONTINUED {
                    remember(&mut self.continued_fifo, self.continued_limit as usize, &self.flows.table, r);
                }
                self.flows.counters.events.sessions_created += 1;
                // A continued session is not streamed to the sync peers: any node re-creates
                // it by continuation, and streaming an ACK flood's would carry the flood to
                // every peer. (A NAT one is, once the backend's reply confirms it.)
                if st != state::CONTINUED {
                    self.flows.changed(r);
                }
                Ok(r)
            }
            Err(InsertError::Full) => Err(DropReason::TableFull),
            Err(InsertError::NoPort) => Err(DropReason::NoLocalPort),
        }
    }

    /// Makes room in a spent half-open budget: ends the oldest session still waiting for the
    /// backend's SYN-ACK (SYN_SENT), not opened by the SYN proxy, looking at most
    /// [`EVICT_SCAN`] entries into the order of opening, then as many records of the sweep.
    /// Such a client has had no answer and retransmits its SYN. Sessions the backend answered
    /// (SYN_RECV: the client may already think itself connected) and established ones are
    /// never evicted; they leave by their (shrunken) timeouts.
    #[cold]
    fn evict_half_open(&mut self) -> bool {
        let ok = |st: u8, fl: u8| st == state::SYN_SENT && fl & flag::SYNPROXY == 0;
        if !evict_oldest(&mut self.half_open_fifo, &mut self.flows.table, true, ok) {
            return false;
        }
        self.flows.counters.events.half_open_evicted += 1;
        true
    }

    /// Makes room in a full table: ends the oldest session that closed (TIME_WAIT or CLOSE),
    /// looking at most [`EVICT_SCAN`] entries into the order of closing (and never into the
    /// table itself: a refusal costs the same however full it is).
    #[cold]
    fn evict_closed(&mut self) -> bool {
        if !evict_oldest(&mut self.closed_fifo, &mut self.flows.table, false, |st, _| st == state::TIME_WAIT || st == state::CLOSE) {
            return false;
        }
        self.flows.counters.events.closed_evicted += 1;
        true
    }

    /// Makes room in a spent continuation budget: ends the oldest session still in state
    /// CONTINUED. A real flow's next segment opens it again, to the same backend.
    #[cold]
    fn evict_continued(&mut self) -> bool {
        if !evict_oldest(&mut self.continued_fifo, &mut self.flows.table, true, |st, _| st == state::CONTINUED) {
            return false;
        }
        self.flows.counters.events.continued_evicted += 1;
        true
    }

    #[inline(always)]
    fn svc_counters(&mut self, id: u16) -> &mut crate::verdict::ServiceCounters {
        let i = id as usize;
        if self.flows.counters.services.len() <= i {
            self.flows.counters.services.resize(i + 1, Default::default());
        }
        &mut self.flows.counters.services[i]
    }

    #[inline(always)]
    fn account(&mut self, svc: u16, backend: u32, bytes: usize) {
        // Sized for the snapshot at refresh time.
        if let Some(c) = self.flows.counters.services.get_mut(svc as usize) {
            c.packets += 1;
            c.bytes += bytes as u64;
        }
        if let Some(c) = self.flows.counters.backends.get_mut(backend_slot(backend) as usize) {
            c.packets += 1;
            c.bytes += bytes as u64;
        }
    }

    /// [`Worker::forward`]'s common case in one pass: a packet of an existing NAT or full-NAT
    /// flow that changes nothing in its session but the expiry (a UDP datagram, or a TCP
    /// segment without SYN, FIN or RST on an established, unproxied connection), on an untagged
    /// frame, to a backend whose next hop is untagged and whose MTU it fits. Anything else, and
    /// every doubt, returns `None` before anything has changed, and the general path decides.
    /// The result is the one the general path gives (`fast_path_matches_general_path`).
    #[inline(always)]
    fn forward_fast<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Option<Verdict>
    where
        Session<A>: Zeroable,
    {
        let svc = snap.service(m.id as u16)?;
        let spec = &svc.spec;
        if !matches!(spec.mode, Mode::Fnat | Mode::Nat) {
            return None;
        }
        if m.l3 != 14 {
            return None;
        }
        let (l3, end) = (m.l3 as usize, m.end as usize);
        let d = b.data_mut();
        let src = A::read(d, l3 + A::SRC);
        if d[l3 + if A::V6 { 7 } else { 8 }] <= 1 {
            return None;
        }
        // The home bucket's candidate, or a search of the probe window when the home bucket
        // overflowed (a few percent of flows in a full table).
        let r = match m.cand {
            Some(r) if !r.is_reverse() && r.is_v6() == A::V6 => r,
            None if m.deep => self.flows.table.find_fwd(m.hash, svc.id, &src, m.sport)?,
            _ => return None,
        };
        let s = self.flows.table.get_mut::<A>(r);
        // The only state that stays as it is: UDP's, or TCP's ESTABLISHED without SYN, FIN, RST.
        let (st, to) = if m.proto == proto::TCP {
            if s.flags & flag::SYNPROXY != 0 || m.tcp_flags & (tcp::flags::SYN | tcp::flags::FIN | tcp::flags::RST) != 0 {
                return None;
            }
            (state::ESTABLISHED, spec.timeouts.established)
        } else {
            (state::UDP, spec.timeouts.udp)
        };
        if to == 0 || s.state != st || s.svc != svc.id || s.cport != m.sport || s.client != src || expired(now, s.expire) {
            return None;
        }
        // Full NAT's sessions and a NAT service's masqueraded ones have a local address.
        let fnat = s.laddr != NO_LADDR;
        if spec.mode == Mode::Fnat && !fnat {
            return None;
        }
        let be = snap.backend(s.backend)?;
        // A meshed flow goes to the node's proxy, as on the general path.
        let steered = if !fnat && m.proto == proto::TCP { self.mesh.steer_translated(src.key(), A::from16(&be.bytes).key(), !A::V6, d.get(6..12)) } else { None };
        let proxy_hop = match steered {
            Some(p) => Some(snap.route(p, !A::V6)?),
            None => None,
        };
        let hop = match &proxy_hop {
            Some(h) => h,
            None => be.hop.as_ref()?,
        };
        if hop.vlan.is_some() || end - l3 > hop.mtu as usize || (!fnat && src == A::from16(&be.bytes)) {
            return None;
        }
        let new_src = if fnat { Some((A::from16(snap.laddr_bytes(s.laddr)?), s.lport)) } else { None };
        s.expire = now.wrapping_add(to);
        let backend = s.backend;
        m.hdr().translate::<A>(d, new_src.as_ref().map(|(a, p)| (a, *p)), Some((&A::from16(&be.bytes), be.port)));
        d[..12].copy_from_slice(&hop.macs);
        self.account(svc.id, backend, end - l3);
        self.flows.counters.events.fast_path += 1;
        Some(Verdict::Tx(hop.port))
    }

    /// Client to VIP.
    #[inline(always)]
    fn forward<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let Some(svc) = snap.service(m.id as u16) else {
            return Verdict::Drop(DropReason::NoSession);
        };
        let h = m.hdr();
        let src = A::read(b.data(), h.l3 + A::SRC);
        if h.ttl(b.data()) <= 1 {
            return self.icmp.error::<A, B>(&mut self.flows, snap, b, m, ErrorKind::TimeExceeded, DropReason::TtlExceeded, now);
        }
        let found = match self.lookup_fwd::<A>(m, svc.id, &src, m.sport, now) {
            // A packet that may open a flow, on a session that is over (TCP: a new SYN on a
            // TIME_WAIT / CLOSE session, the client reusing its port) or whose backend was
            // removed: the old session ends and the flow is scheduled afresh (as IPVS's
            // conn_reuse_mode), so a drained or removed backend gets no new connection.
            Some(r)
                if opens_flow(m) && {
                    let s = self.flows.table.get::<A>(r);
                    snap.backend(s.backend).is_none() || (m.proto == proto::TCP && matches!(s.state, state::TIME_WAIT | state::CLOSE))
                } =>
            {
                self.flows.table.remove::<A>(r);
                None
            }
            found => found,
        };
        let r = match found {
            Some(r) => {
                if self.flows.table.get::<A>(r).flags & flag::SYNPROXY != 0 {
                    if let Err(e) = self.syn.client_segment::<A>(&mut self.flows, b.data_mut(), m, r, self.in_fragment, now) {
                        return Verdict::Drop(e);
                    }
                }
                r
            }
            None if m.proto == proto::TCP && svc.spec.synproxy != SynProxy::Off => match self.synproxy_new::<A, B>(snap, svc, b, m, src, now) {
                // The cookie ACK became a SYN: the rest of the path sees that packet.
                Ok((r, Some(syn))) => return self.forward_on::<A, B>(snap, svc, b, &syn, r, &src, now),
                Ok((r, None)) => r,
                Err(v) => return v,
            },
            None => match self.open::<A, B>(snap, svc, b, m, m, src, now) {
                Ok(r) => r,
                Err(v) => return v,
            },
        };
        self.forward_on::<A, B>(snap, svc, b, m, r, &src, now)
    }

    /// A fragment (of any flow): the first one through the usual path and remembered in the
    /// fragment table, a later one rewritten as its first one was (`frag.rs`).
    #[cold]
    fn fragment<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let key: FragKey = match crate::frag::key::<A>(b.data(), &h) {
            Ok(k) => k,
            Err(v) => return v,
        };
        let own = snap.dst(key.1).is_some();
        if m.kind == Kind::FragLater {
            return self.frag.later::<A, B>(&mut self.flows, b, &h, &key, own, now);
        }
        // The first fragment: classified again as a whole packet (it has the ports), without
        // the staged prefetching, and sent down the usual path.
        let mut m2 = Meta { l3: m.l3, l4: m.l4, end: m.end, proto: m.proto, v6: m.v6, ..Meta::default() };
        if let Some(v) = self.classify_fam::<A>(snap, b.data(), Frag::None, &mut m2, &mut Default::default()) {
            return v;
        }
        if !matches!(m2.kind, Kind::Forward | Kind::PortReply | Kind::NatReply | Kind::Snat) {
            return if own { Verdict::Drop(DropReason::Fragment) } else { Verdict::Kernel };
        }
        m2.deep = true;
        m2.cand = None;
        let tun = m2.kind == Kind::Forward && snap.service(m2.id as u16).is_some_and(|s| s.spec.mode == Mode::Tun);
        self.in_fragment = true;
        let v = self.act::<A, B>(snap, b, &m2, now);
        self.in_fragment = false;
        if let Verdict::Tx(port) = v {
            let mtu = snap.ports.get(port as usize).map_or(1500, |p| p.spec.mtu);
            if !self.frag.remember::<A>(b.data(), key, port, mtu, tun, now) {
                self.flows.counters.events.fragments_untracked += 1;
            }
        }
        v
    }

    /// A TCP segment without a session to a service with the SYN proxy: a SYN answered with a
    /// cookie (when the proxy is engaged), an ACK returning a valid cookie turned into the
    /// backend's SYN (with the packet's new layout), anything else as without the proxy.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn synproxy_new<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, svc: &Service, b: &mut B, m: &Meta, src: A, now: u32) -> Result<(Ref, Option<Meta>), Verdict>
    where
        Session<A>: Zeroable,
    {
        let f = m.tcp_flags & (tcp::flags::SYN | tcp::flags::ACK | tcp::flags::RST | tcp::flags::FIN);
        if f == tcp::flags::SYN && crate::synproxy::engaged(svc.spec.synproxy, self.flows.table.half_open()) {
            return Err(self.syn.syn_cookie::<A, B>(&mut self.flows, snap, b, m, now));
        }
        if f != tcp::flags::ACK {
            return Ok((self.open::<A, B>(snap, svc, b, m, m, src, now)?, None));
        }
        // The third packet of a handshake the proxy answered, or a stray.
        let Some(hs) = self.syn.cookie_ack::<A>(b.data(), m, now) else {
            return Err(Verdict::Drop(DropReason::BadSyncookie));
        };
        let syn = Meta { tcp_flags: tcp::flags::SYN, ..*m };
        let r = self.open::<A, B>(snap, svc, b, m, &syn, src, now)?;
        let Some(m2) = self.syn.cookie_to_syn::<A, B>(&mut self.flows, b, m, &hs, r) else {
            self.flows.table.remove::<A>(r);
            return Err(Verdict::Drop(DropReason::NoRoom));
        };
        Ok((r, Some(m2)))
    }

    /// The rest of [`Worker::forward`] once the packet has its session `r`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn forward_on<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, svc: &Service, b: &mut B, m: &Meta, r: Ref, src: &A, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let mode = svc.spec.mode;
        let one_way = matches!(mode, Mode::Dr | Mode::Tun);
        let (old, remove) = self.advance::<A>(r, m, true, one_way, &svc.spec.timeouts, now);
        let s = *self.flows.table.get::<A>(r);
        let Some(be) = snap.backend(s.backend) else {
            self.flows.table.remove::<A>(r);
            // The connection cannot go on: tell the client at once (a TCP reset), rather than
            // leave it to time out.
            if m.proto == proto::TCP && m.tcp_flags & tcp::flags::RST == 0 {
                return self.tcp_reset::<A, B>(snap, b, m);
            }
            return Verdict::Drop(DropReason::BackendRemoved);
        };
        let Some(hop) = be.hop.as_ref() else {
            return Verdict::Drop(DropReason::NoNeighbor);
        };
        // The tunnel's header is of the backend's family (IPv4-in-IPv6 and the reverse too).
        let overhead = match (mode, be.addr) {
            (Mode::Tun, IpAddr::V4(_)) => 20,
            (Mode::Tun, IpAddr::V6(_)) => 40,
            _ => 0,
        };
        if h.ip_len() + overhead > hop.mtu as usize && !crate::rewrite::segments_fit(b, h.l3, h.l4, h.proto, hop.mtu as usize - overhead) {
            let mtu = hop.mtu as usize - overhead;
            return self.icmp.too_big::<A, B>(&mut self.flows, snap, b, m, mtu, now);
        }
        let bytes = h.ip_len();
        let v = match mode {
            Mode::Nat | Mode::Fnat => {
                let baddr = A::from16(&be.bytes);
                let new_src = if mode == Mode::Fnat || s.laddr != NO_LADDR {
                    let Some(laddr) = snap.laddr_bytes(s.laddr) else {
                        // The local address left the configuration: end the session so the
                        // flow's next packet starts a new one on a current address.
                        self.flows.table.remove::<A>(r);
                        return Verdict::Drop(DropReason::NoRoute);
                    };
                    Some((A::from16(laddr), s.lport))
                } else if s.client == baddr {
                    // Hairpin: a client that is its own backend (a pod through its own
                    // Service). Its kernel would take a packet from its own address for a
                    // stranger's, so the source becomes the VIP (the client's port kept); the
                    // reply, to the VIP, is matched by its source ([`Worker::nat_reply`]).
                    Some((A::from_ip(svc.spec.vip).expect("family checked at config"), s.cport))
                } else {
                    None
                };
                h.translate::<A>(b.data_mut(), new_src.as_ref().map(|(a, p)| (a, *p)), Some((&baddr, be.port)));
                if mode == Mode::Fnat
                    && svc.spec.toa
                    && m.proto == proto::TCP
                    && !self.in_fragment
                    && s.flags & flag::TOA_DONE == 0
                    && old == state::SYN_RECV
                    && s.state == state::ESTABLISHED
                {
                    self.flows.table.get_mut::<A>(r).flags |= flag::TOA_DONE;
                    self.insert_toa::<A, B>(b, &h, src, s.cport, hop.mtu as usize);
                }
                // A meshed pod's TCP to a meshed backend, the client's address kept: to the
                // node's mesh proxy ([`crate::mesh`]), the packet as translated.
                let proxy_hop = if new_src.is_none() && m.proto == proto::TCP {
                    self.mesh.steer_translated(s.client.key(), baddr.key(), !A::V6, b.data().get(6..12)).and_then(|p| snap.route(p, !A::V6))
                } else {
                    None
                };
                egress(b, h.l3, proxy_hop.as_ref().unwrap_or(hop), A::ETHERTYPE)
            }
            Mode::Dr => {
                h.dec_ttl(b.data_mut());
                egress(b, h.l3, hop, A::ETHERTYPE)
            }
            Mode::Tun => {
                h.dec_ttl(b.data_mut());
                let ident = || self.flows.next_ident();
                let r = match (be.tun_src, be.addr) {
                    (Some(IpAddr::V4(s)), IpAddr::V4(d)) => encapsulate::<A, [u8; 4], B>(b, &h, &s.octets(), &d.octets(), ident).map(|()| <[u8; 4]>::ETHERTYPE),
                    (Some(IpAddr::V6(s)), IpAddr::V6(d)) => encapsulate::<A, [u8; 16], B>(b, &h, &s.octets(), &d.octets(), ident).map(|()| <[u8; 16]>::ETHERTYPE),
                    _ => Err(DropReason::NoRoute),
                };
                match r {
                    Ok(ethertype) => egress(b, h.l3, hop, ethertype),
                    Err(e) => Verdict::Drop(e),
                }
            }
        };
        if matches!(v, Verdict::Tx(_)) {
            self.account(svc.id, s.backend, bytes);
        }
        if remove {
            self.flows.table.remove::<A>(r);
        }
        v
    }

    /// Inserts the TOA option carrying the client's address. Skipped (and counted) when the
    /// header or MTU has no room.
    fn insert_toa<A: Fam, B: PacketBuf>(&mut self, b: &mut B, h: &Hdr, client: &A, cport: u16, mtu: usize)
    where
        Session<A>: Zeroable,
    {
        let (opt, len) = tcp::toa_option(client.bytes(), cport);
        let add = len.div_ceil(4) * 4;
        let thl = ((b.data()[h.l4 + 12] >> 4) as usize) * 4;
        let old_len = b.data().len();
        if h.ip_len() + add > mtu || thl + add > tcp::MAX_HEADER_LEN || !b.set_len(h.end + add) {
            self.flows.counters.events.toa_skipped += 1;
            return;
        }
        let d = b.data_mut();
        if tcp::insert_option(&mut d[h.l4..], h.end - h.l4, &opt[..len]).is_err() {
            // Cannot happen after the checks above; keep the packet as it was if it does.
            b.set_len(old_len);
            self.flows.counters.events.toa_skipped += 1;
            return;
        }
        let end = h.end + add;
        if A::V6 {
            let pl = (end - h.l3 - 40) as u16;
            d[h.l3 + 4..h.l3 + 6].copy_from_slice(&pl.to_be_bytes());
        } else {
            d[h.l3 + 2..h.l3 + 4].copy_from_slice(&((end - h.l3) as u16).to_be_bytes());
            let mut ip = vectorlb_packet::ipv4::Ipv4Packet::new_unchecked(&mut d[h.l3..]);
            ip.fill_checksum();
        }
        fill_l4_checksum::<A>(d, h.l3, h.l4, end, proto::TCP);
        self.flows.counters.events.toa_inserted += 1;
    }

    /// Backend to a full-NAT local address (reply), or outside host to an SNAT address.
    fn port_reply<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        if !self.flows.table.owns_port(m.dport) {
            return self.flows.elsewhere(m.dport);
        }
        let Some(r) = m.cand.or_else(|| self.flows.table.port_lookup(m.id as u16, m.dport)) else {
            return Verdict::Drop(DropReason::NoSession);
        };
        if r.is_v6() != A::V6 || self.flows.live::<A>(r, now).is_none() {
            return Verdict::Drop(DropReason::NoSession);
        }
        let h = m.hdr();
        let s = *self.flows.table.get::<A>(r);
        if s.flags & flag::SNAT != 0 {
            let Some(rule) = snap.snat_by_id(s.svc) else {
                self.flows.table.remove::<A>(r);
                return Verdict::Drop(DropReason::NoSession);
            };
            // Into a pod under policy: the mapping is its source port's, open to any remote,
            // so the remote's flow must be one the pod opened or one its policy allows.
            if self.pol.active && self.pol.is_enforced(s.client.key()) {
                let remote = A::read(b.data(), h.l3 + A::SRC).key();
                if let Err(e) = crate::policy::check_flow(&self.pol, &self.control.policy_flows, m.proto, remote, m.sport, s.client.key(), s.cport, now) {
                    return Verdict::Drop(e);
                }
            }
            let t = rule.timeouts;
            return self.reply_to_client::<A, B>(snap, b, m, r, &t, None, now);
        }
        let (Some(svc), Some(be)) = (snap.service(s.svc), snap.backend(s.backend)) else {
            self.flows.table.remove::<A>(r);
            return Verdict::Drop(DropReason::BackendRemoved);
        };
        let src = A::read(b.data(), h.l3 + A::SRC);
        if src.key() != be.key || (be.port != 0 && m.sport != be.port) {
            return Verdict::Drop(DropReason::NoSession);
        }
        let t = svc.spec.timeouts;
        let vip = A::from_ip(svc.spec.vip).expect("family checked at config");
        let vport = svc.spec.port;
        let (sid, bid) = (svc.id, s.backend);
        let v = self.reply_to_client::<A, B>(snap, b, m, r, &t, Some((vip, vport)), now);
        if matches!(v, Verdict::Tx(_)) {
            self.account(sid, bid, h.ip_len());
        }
        v
    }

    /// Rewrites a reply toward the session's client: the source becomes the VIP (when given),
    /// the destination the client. Shared by full-NAT replies, NAT replies and SNAT returns.
    #[allow(clippy::too_many_arguments)]
    fn reply_to_client<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, r: Ref, t: &Timeouts, vip: Option<(A, u16)>, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        if h.ttl(b.data()) <= 1 {
            return self.icmp.error::<A, B>(&mut self.flows, snap, b, m, ErrorKind::TimeExceeded, DropReason::TtlExceeded, now);
        }
        let s = *self.flows.table.get::<A>(r);
        if s.flags & flag::SYNPROXY != 0 && m.proto == proto::TCP {
            if let Some(v) = self.syn.backend_segment::<A, B>(&mut self.flows, snap, b, m, r, t.established, now) {
                return v;
            }
        }
        let Some(hop) = self.flows.route_to(snap, s.client.key(), !A::V6) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        if h.ip_len() > hop.mtu as usize && !crate::rewrite::segments_fit(b, h.l3, h.l4, h.proto, hop.mtu as usize) {
            return self.icmp.too_big::<A, B>(&mut self.flows, snap, b, m, hop.mtu as usize, now);
        }
        let (_, remove) = self.advance::<A>(r, m, false, false, t, now);
        h.translate::<A>(b.data_mut(), vip.as_ref().map(|(a, p)| (a, *p)), Some((&s.client, s.cport)));
        let v = egress(b, h.l3, &hop, A::ETHERTYPE);
        if remove {
            self.flows.table.remove::<A>(r);
        }
        v
    }

    /// Backend to client through a NAT service.
    fn nat_reply<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let dst = A::read(b.data(), h.l3 + A::DST);
        // To a VIP: a hairpin reply, whose client is the backend itself.
        let hairpin = snap.is_vip(dst.key());
        let client = if hairpin { A::read(b.data(), h.l3 + A::SRC) } else { dst };
        let mut found = None;
        if let Some(r) = m.cand {
            if r.is_reverse() && r.is_v6() == A::V6 {
                let s = self.flows.table.get::<A>(r);
                if s.state != state::FREE && s.backend == m.id && s.cport == m.dport && s.client == client {
                    found = Some(r);
                }
            }
        }
        if found.is_none() {
            let src = A::read(b.data(), h.l3 + A::SRC);
            let ids = snap.nat_backends(src.key(), m.sport, m.proto).unwrap_or(&[]);
            for &id in ids {
                let hh = self.flows.table.hash_rev(id, &client, m.dport);
                if let Some(r) = self.flows.table.find_rev(hh, id, &client, m.dport) {
                    found = Some(r);
                    break;
                }
            }
        }
        let r = match found.and_then(|r| self.flows.live::<A>(r, now)) {
            Some(r) => r,
            // To a VIP's port that no service has, as from anyone else.
            None if hairpin => return Verdict::Drop(DropReason::NoSession),
            None => {
                // Not a reply: the backend's own outbound traffic may be source-NATed.
                let src = A::read(b.data(), h.l3 + A::SRC);
                if let Some(rule) = snap.snat_rule(src.key(), client.key(), !A::V6) {
                    let mut m2 = *m;
                    m2.kind = Kind::Snat;
                    m2.id = rule.id as u32;
                    m2.hash = self.flows.table.hash_fwd(rule.id, &src, m.sport);
                    m2.cand = None;
                    m2.deep = true;
                    return self.snat_out::<A, B>(snap, b, &m2, now);
                }
                return Verdict::Kernel;
            }
        };
        let s = *self.flows.table.get::<A>(r);
        let (Some(svc), Some(_)) = (snap.service(s.svc), snap.backend(s.backend)) else {
            self.flows.table.remove::<A>(r);
            return Verdict::Drop(DropReason::BackendRemoved);
        };
        let t = svc.spec.timeouts;
        let vip = A::from_ip(svc.spec.vip).expect("family checked at config");
        let (sid, vport) = (svc.id, svc.spec.port);
        let v = self.reply_to_client::<A, B>(snap, b, m, r, &t, Some((vip, vport)), now);
        if matches!(v, Verdict::Tx(_)) {
            self.account(sid, s.backend, h.ip_len());
        }
        v
    }

    /// UDP from the outside to the inside of an `outbound_only` SNAT rule: marks the inside's
    /// address and port (a session without a local address, refreshed by both directions), so
    /// that its replies keep their address; the datagram goes on as it is. A mapping the inside
    /// opened from that port already is left alone (endpoint-independent: the replies leave
    /// through it).
    fn snat_in<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let Some(rule) = snap.snat_by_id(m.id as u16) else {
            return Verdict::Kernel;
        };
        let t = rule.timeouts;
        let dst = A::read(b.data(), m.hdr().l3 + A::DST);
        match self.lookup_fwd::<A>(m, rule.id, &dst, m.dport, now) {
            Some(r) => {
                let s = self.flows.table.get_mut::<A>(r);
                if s.laddr == NO_LADDR {
                    s.expire = now.wrapping_add(t.udp);
                }
            }
            None => {
                let mut inside = *m;
                inside.sport = m.dport;
                // A full table leaves the flow unmarked: its replies are then translated.
                let _ = self.insert::<A>(&inside, state::UDP, dst, rule.id, 0, flag::SNAT, &t, &[], 0, now);
            }
        }
        Verdict::Kernel
    }

    /// Inside host to the outside through an SNAT rule (endpoint-independent mapping).
    fn snat_out<A: Fam, B: PacketBuf>(&mut self, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let Some(rule) = snap.snat_by_id(m.id as u16) else {
            return Verdict::Kernel;
        };
        let h = m.hdr();
        let src = A::read(b.data(), h.l3 + A::SRC);
        let dst = A::read(b.data(), h.l3 + A::DST);
        if h.ttl(b.data()) <= 1 {
            return self.icmp.error::<A, B>(&mut self.flows, snap, b, m, ErrorKind::TimeExceeded, DropReason::TtlExceeded, now);
        }
        let Some(hop) = self.flows.route_to(snap, dst.key(), !A::V6) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        if h.ip_len() > hop.mtu as usize && !crate::rewrite::segments_fit(b, h.l3, h.l4, h.proto, hop.mtu as usize) {
            return self.icmp.too_big::<A, B>(&mut self.flows, snap, b, m, hop.mtu as usize, now);
        }
        // A pod leaving the cluster: its session is its source port's, whatever the
        // destination, so each flow is decided (under policy) and remembered here (open ones
        // too: a policy that later selects the pod does not cut them), through the cache.
        if let Err(e) = self.pol_cache.check(&self.pol, &self.control.policy_flows, m.proto, src.key(), m.sport, dst.key(), m.dport, now) {
            return Verdict::Drop(e);
        }
        let r = match self.lookup_fwd::<A>(m, rule.id, &src, m.sport, now) {
            // A mark of a UDP flow from the outside: the inside's reply keeps its address.
            Some(r) if self.flows.table.get::<A>(r).laddr == NO_LADDR => {
                let s = self.flows.table.get_mut::<A>(r);
                s.expire = now.wrapping_add(rule.timeouts.udp);
                return Verdict::Kernel;
            }
            Some(r) => r,
            None => {
                // A segment of a connection the outside opened: as it is (outbound_only).
                if !opens_flow(m) && rule.outbound_only {
                    return Verdict::Kernel;
                }
                if !opens_flow(m) {
                    return Verdict::Drop(DropReason::NoSession);
                }
                // SNAT rules keep their local-port cursors after the services'.
                let cursor = (rule.id & !crate::service::SNAT_ID_BIT) as usize + crate::service::MAX_SERVICES;
                match self.insert::<A>(m, if m.proto == proto::TCP { state::SYN_SENT } else { state::UDP }, src, rule.id, 0, flag::SNAT, &rule.timeouts, &rule.laddrs, cursor, now)
                {
                    Ok(r) => r,
                    Err(e) => return Verdict::Drop(e),
                }
            }
        };
        let t = rule.timeouts;
        let (_, remove) = self.advance::<A>(r, m, true, false, &t, now);
        let s = *self.flows.table.get::<A>(r);
        let Some(laddr) = snap.laddr_bytes(s.laddr).map(A::from16) else {
            self.flows.table.remove::<A>(r);
            return Verdict::Drop(DropReason::NoRoute);
        };
        h.translate::<A>(b.data_mut(), Some((&laddr, s.lport)), None);
        let v = egress(b, h.l3, &hop, A::ETHERTYPE);
        if remove {
            self.flows.table.remove::<A>(r);
        }
        v
    }
}
