//! The per-core session table.
//!
//! One table per worker core, touched by that core only: no locks, no atomics. It has three
//! parts:
//!
//! * **Records**, in two arenas (IPv4 records are 24 bytes, IPv6 records 36): client address and
//!   port, service, backend, local address and port (full NAT / SNAT), TCP state and expiry.
//!   A record stores only what cannot be derived: the VIP and virtual port come from the
//!   service, the backend address from the configuration snapshot.
//! * **The index**: 64-byte buckets of seven (32-bit signature, 32-bit record reference) slots,
//!   bucket chosen by the low half of a keyed 64-bit hash, signature the high half, sized for a
//!   load of 0.7 at the configured capacity. A key that finds its home bucket full goes to one of
//!   the next [`MAX_PROBE`] buckets (the next cache lines) and the home bucket counts it in `ovf`
//!   and remembers how far it went, so a miss in a bucket with `ovf == 0` is final after one
//!   cache line. At full load about 5% of keys live outside their home bucket. Forward keys are (service, client address, client port); NAT sessions add a reverse
//!   key (backend id, client address, client port) for replies. Both hashes are computable from
//!   the record alone, so removal never needs the configuration.
//! * **Port maps** for full NAT and SNAT: per local address, a direct array indexed by local
//!   port giving the record, so reply traffic finds its session without hashing. Each core owns
//!   the ports whose low bits equal its core number (`port & mask == core`), which a NIC can
//!   steer to with one masked flow rule.
//!
//! Expiry is lazy and bounded: a session past its expiry is treated as absent when looked up,
//! and a sweep walks a bounded number of records per batch (and when idle), so the packet path
//! never stalls on a timer storm.
//!
//! When the table is full, the worker ends the oldest closed session (TIME_WAIT or CLOSE) to
//! make room (`closed_evicted`); with none, new sessions are refused (counted as
//! `session_table_full`) and established ones keep forwarding; expired records met in a full
//! bucket are reclaimed first.

use crate::mem::{MmapArray, Zeroable};
use std::io;

/// Buckets probed past the home bucket.
pub const MAX_PROBE: usize = 32;
const SLOTS: usize = 7;
const NONE: u32 = u32::MAX;
/// Largest number of records per family (references keep 30 bits).
pub const MAX_RECORDS: u32 = (1 << 30) - 2;
/// Local-port slots scanned per local address before trying the next one.
const PORT_SCAN: u32 = 256;

pub mod state {
    pub const FREE: u8 = 0;
    pub const SYN_SENT: u8 = 1;
    pub const SYN_RECV: u8 = 2;
    pub const ESTABLISHED: u8 = 3;
    pub const FIN_WAIT: u8 = 4;
    pub const LAST_ACK: u8 = 5;
    pub const TIME_WAIT: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const UDP: u8 = 8;
    /// Opened by continuation (a mid-flow segment that matched no session) and not confirmed
    /// yet: a reply from the backend (NAT) or a second segment from the client (DR, TUN, whose
    /// replies bypass the LB) confirms it. Bounded like the half-open sessions.
    pub const CONTINUED: u8 = 9;

    pub fn name(s: u8) -> &'static str {
        match s {
            FREE => "free",
            SYN_SENT => "syn_sent",
            SYN_RECV => "syn_recv",
            ESTABLISHED => "established",
            FIN_WAIT => "fin_wait",
            LAST_ACK => "last_ack",
            TIME_WAIT => "time_wait",
            CLOSE => "close",
            UDP => "udp",
            CONTINUED => "continued",
            _ => "unknown",
        }
    }
}

pub mod flag {
    /// A NAT session: it has a reverse index entry.
    pub const REVERSE: u8 = 0x01;
    /// The client sent a FIN.
    pub const FIN_IN: u8 = 0x02;
    /// The backend sent a FIN.
    pub const FIN_OUT: u8 = 0x04;
    /// The TOA option has been inserted (or could not be).
    pub const TOA_DONE: u8 = 0x08;
    /// An SNAT mapping, not a load-balanced session.
    pub const SNAT: u8 = 0x10;
    /// The session's local address and port are bound in a port map.
    pub const PORT: u8 = 0x20;
    /// Opened by the SYN proxy: its sequence numbers (and timestamps, window) are translated
    /// by the session's [`SeqAdj`](super::SeqAdj).
    pub const SYNPROXY: u8 = 0x40;
    /// A continued session that has seen only the segment that opened it.
    pub const UNSEEN: u8 = 0x80;
}

/// Whether a TCP state is a half-open one (a handshake the backend has not completed).
#[inline(always)]
pub fn half_open(st: u8) -> bool {
    matches!(st, state::SYN_SENT | state::SYN_RECV)
}

/// Whether a state is a continuation: unconfirmed, or one way for good ([`state::CONTINUED`]).
#[inline(always)]
pub fn continued(st: u8) -> bool {
    st == state::CONTINUED
}

/// What a connection the SYN proxy opened needs besides its record: kept in an array beside
/// the records, touched only for such sessions (so sessions without it cost nothing more).
///
/// Until the backend's SYN-ACK arrives, `seq` is the proxy's initial sequence number (the
/// cookie) and `ts` the timestamp value the proxy sent; afterwards they are the differences
/// backend minus proxy, which client-bound segments subtract and backend-bound segments add.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeqAdj {
    pub seq: u32,
    pub ts: u32,
    /// The client's last timestamp value seen (echoed in the ACK the proxy sends the backend).
    pub client_ts: u32,
    /// The client's window (as it sent it, unscaled) in its handshake ACK.
    pub client_win: u16,
    /// Window scale the proxy announced to the client (low nibble) and the backend's (high
    /// nibble); 0xf: none.
    pub wscale: u8,
    /// [`adj_opt`] bits.
    pub opts: u8,
}

/// [`SeqAdj::opts`] bits.
pub mod adj_opt {
    /// Timestamps were negotiated with the client.
    pub const TS: u8 = 0x01;
    /// The backend's SYN-ACK arrived: `seq` / `ts` are differences.
    pub const SPLICED: u8 = 0x02;
    /// Client-bound windows need rescaling (the backend's scale differs from the announced one).
    pub const RESCALE: u8 = 0x04;
}

// SAFETY: integers only.
unsafe impl Zeroable for SeqAdj {}

pub const NO_LADDR: u16 = u16::MAX;

/// One session. `client`/`cport` are the flow's originator (for SNAT, the inside host).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session<A> {
    pub client: A,
    pub cport: u16,
    /// Service id (or SNAT rule id).
    pub svc: u16,
    /// Backend id (slot | generation << 24); the free-list link while the record is free.
    pub backend: u32,
    pub laddr: u16,
    pub lport: u16,
    /// Expiry, in milliseconds of the worker clock (wrapping).
    pub expire: u32,
    pub state: u8,
    pub flags: u8,
}

// SAFETY: repr(C) structs of integers and byte arrays: all zeroes is a valid value.
unsafe impl Zeroable for Session<[u8; 4]> {}
// SAFETY: as above.
unsafe impl Zeroable for Session<[u8; 16]> {}

pub type SessionV4 = Session<[u8; 4]>;
pub type SessionV6 = Session<[u8; 16]>;

/// Whether `expire` has passed at `now` (both wrapping milliseconds; valid for spans < 24 days).
#[inline(always)]
pub fn expired(now: u32, expire: u32) -> bool {
    (now.wrapping_sub(expire) as i32) >= 0
}

use crate::hash::fold_mul;

/// An address family's record type and key hashing.
pub trait Addr: Copy + Eq + std::fmt::Debug + 'static
where
    Session<Self>: Zeroable,
{
    const V6: bool;
    fn key_word(&self, seed: u64) -> u64;
    fn arena(t: &SessionTable) -> &Arena<Self>;
    fn arena_mut(t: &mut SessionTable) -> &mut Arena<Self>;
}

impl Addr for [u8; 4] {
    const V6: bool = false;
    #[inline(always)]
    fn key_word(&self, seed: u64) -> u64 {
        u32::from_ne_bytes(*self) as u64 ^ seed
    }
    #[inline(always)]
    fn arena(t: &SessionTable) -> &Arena<Self> {
        &t.v4
    }
    #[inline(always)]
    fn arena_mut(t: &mut SessionTable) -> &mut Arena<Self> {
        &mut t.v4
    }
}

impl Addr for [u8; 16] {
    const V6: bool = true;
    #[inline(always)]
    fn key_word(&self, seed: u64) -> u64 {
        let hi = u64::from_ne_bytes(self[..8].try_into().unwrap());
        let lo = u64::from_ne_bytes(self[8..].try_into().unwrap());
        fold_mul(hi ^ seed, lo ^ 0x9e37_79b9_7f4a_7c15)
    }
    #[inline(always)]
    fn arena(t: &SessionTable) -> &Arena<Self> {
        &t.v6
    }
    #[inline(always)]
    fn arena_mut(t: &mut SessionTable) -> &mut Arena<Self> {
        &mut t.v6
    }
}

/// A reference to a record from the index: family, direction of the key, record index.
/// Never zero: `Option<Ref>` is a plain `u32` with 0 for none, like the index's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct Ref(std::num::NonZeroU32);

impl Ref {
    const V6: u32 = 1 << 31;
    const REV: u32 = 1 << 30;

    #[inline(always)]
    fn new(idx: u32, v6: bool, rev: bool) -> Ref {
        Ref(std::num::NonZeroU32::MIN.saturating_add(idx) | if v6 { Self::V6 } else { 0 } | if rev { Self::REV } else { 0 })
    }
    #[inline(always)]
    pub fn idx(self) -> usize {
        ((self.0.get() & !(Self::V6 | Self::REV)) - 1) as usize
    }
    #[inline(always)]
    pub fn is_v6(self) -> bool {
        self.0.get() & Self::V6 != 0
    }
    /// Whether this reference came from a NAT reverse key.
    #[inline(always)]
    pub fn is_reverse(self) -> bool {
        self.0.get() & Self::REV != 0
    }
    #[inline(always)]
    fn raw(self) -> u32 {
        self.0.get()
    }
    /// The reference as a number, for side tables keyed by session (the forward reference's:
    /// the same for either key of one record).
    #[inline(always)]
    pub fn raw_key(self) -> u32 {
        self.0.get() & !Self::REV
    }
    /// The reference [`Ref::raw_key`] gave.
    #[inline(always)]
    pub fn from_key(k: u32) -> Option<Ref> {
        Ref::from_raw(k & !Self::REV)
    }
    #[inline(always)]
    fn from_raw(v: u32) -> Option<Ref> {
        std::num::NonZeroU32::new(v).map(Ref)
    }
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Bucket {
    sig: [u32; SLOTS],
    /// Keys whose home is this bucket but that live in a later one.
    ovf: u32,
    refs: [u32; SLOTS],
    /// How far past this bucket such keys have ever been placed (never shrinks).
    reach: u32,
}

// SAFETY: integers only.
unsafe impl Zeroable for Bucket {}

/// Bit k set where slot k's signature equals `sig` (SSE2 on x86_64: two compares of four).
#[inline(always)]
fn sig_matches(b: &Bucket, sig: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of the x86_64 baseline; the loads read the 32 bytes of `sig` and
        // `ovf` inside the bucket (unaligned loads, no alignment requirement).
        unsafe {
            let p = b.sig.as_ptr() as *const __m128i;
            let want = _mm_set1_epi32(sig as i32);
            let lo = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_loadu_si128(p), want))) as u32;
            let hi = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_loadu_si128(p.add(1)), want))) as u32;
            (lo | hi << 4) & ((1 << SLOTS) - 1)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut m = 0;
        for k in 0..SLOTS {
            if b.sig[k] == sig {
                m |= 1 << k;
            }
        }
        m
    }
}

/// Result of looking at the home bucket only (the staged, prefetched path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A slot with the right signature (the caller verifies the key).
    Candidate(Ref),
    /// Definitely absent.
    Miss,
    /// Not in the home bucket but it has overflowed: use the full lookup.
    Deep,
}

pub struct Arena<A>
where
    Session<A>: Zeroable,
{
    recs: MmapArray<Session<A>>,
    /// Beside `recs`, same index: reserved address space, resident only where touched.
    adj: MmapArray<SeqAdj>,
    next_unused: u32,
    free_head: u32,
    sweep: u32,
}

impl<A> Arena<A>
where
    Session<A>: Zeroable,
{
    fn new(cap: u32) -> io::Result<Self> {
        Ok(Arena { recs: MmapArray::new(cap as usize)?, adj: MmapArray::new(cap as usize)?, next_unused: 0, free_head: NONE, sweep: 0 })
    }

    fn alloc(&mut self) -> Option<u32> {
        if self.free_head != NONE {
            let i = self.free_head;
            self.free_head = self.recs.as_slice()[i as usize].backend;
            Some(i)
        } else if (self.next_unused as usize) < self.recs.len() {
            self.next_unused += 1;
            Some(self.next_unused - 1)
        } else {
            None
        }
    }

    fn release(&mut self, i: u32) {
        let r = &mut self.recs.as_mut_slice()[i as usize];
        r.state = state::FREE;
        r.backend = self.free_head;
        self.free_head = i;
    }
}

/// A local address's port map: slot `port >> shift` holds the record bound to that port.
struct PortMap {
    slots: MmapArray<u32>,
    cursor: u32,
}

#[derive(Debug, Clone)]
pub struct TableConfig {
    /// Records per family (IPv4 and IPv6 each; memory is only used as they fill).
    pub max_sessions: u32,
    /// Index entries (a NAT session takes two). Defaults to `max_sessions`.
    pub index_entries: u32,
    /// This core's number, the number of cores, and log2 of the number of port partitions
    /// (cores rounded up to a power of two).
    pub core: u16,
    pub cores: u16,
    pub core_shift: u8,
    /// Local ports handed out for full NAT and SNAT.
    pub port_min: u16,
    pub port_max: u16,
    /// Records examined per sweep call.
    pub sweep_budget: u32,
    /// Key for the index hash ([`crate::hash::random_seed`] in the daemon; fixed for reproducible tests,
    /// replays and benchmarks).
    pub seed: u64,
    /// Where the local-port search starts, as an offset into the port range (0: at
    /// `port_min`). The daemon draws it at random so that a restart does not hand out its
    /// previous run's ports, which the backends may still hold in TIME_WAIT.
    pub port_offset: u32,
}

impl TableConfig {
    pub fn new(max_sessions: u32) -> Self {
        TableConfig {
            max_sessions,
            index_entries: max_sessions,
            core: 0,
            cores: 1,
            core_shift: 0,
            port_min: 1024,
            port_max: 65535,
            sweep_budget: 64,
            seed: 0x005e_ed0f_5e55_10f5,
            port_offset: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    pub inserted: u64,
    pub removed: u64,
    pub expired: u64,
    pub full: u64,
    pub no_port: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// No record or index slot left.
    Full,
    /// Every local address's ports owned by this core are in use.
    NoPort,
}

pub struct SessionTable {
    buckets: MmapArray<Bucket>,
    nbuckets: u32,
    v4: Arena<[u8; 4]>,
    v6: Arena<[u8; 16]>,
    entries: u32,
    max_entries: u32,
    live: u32,
    /// Live sessions in a half-open state.
    half_open: u32,
    /// Live sessions in state CONTINUED.
    continued: u32,
    ports: Vec<Option<PortMap>>,
    /// Active sessions per backend slot (what `wlc` reads).
    active: Vec<u32>,
    seeds: [u64; 3],
    cfg: TableConfig,
    pub stats: TableStats,
}

/// Index load factor the bucket count is sized for.
const LOAD: f64 = 0.7;

/// What one table costs in memory, by the numbers its configuration gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// The index: made resident before the first packet (`prefault_index`).
    pub index_bytes: u64,
    /// The records when the table is full (IPv6 records, the larger): reserved up front,
    /// resident only as sessions arrive.
    pub records_bytes: u64,
}

impl Footprint {
    pub fn of(cfg: &TableConfig) -> Footprint {
        let entries = cfg.index_entries.max(1);
        let nbuckets = ((entries as f64 / (SLOTS as f64 * LOAD)).ceil() as u64).max(2);
        let max = cfg.max_sessions.clamp(1, MAX_RECORDS) as u64;
        Footprint { index_bytes: (nbuckets + MAX_PROBE as u64) * std::mem::size_of::<Bucket>() as u64, records_bytes: max * std::mem::size_of::<Session<[u8; 16]>>() as u64 }
    }

    /// The most the table can hold resident.
    pub fn total(&self) -> u64 {
        self.index_bytes + self.records_bytes
    }
}

impl SessionTable {
    pub fn new(cfg: TableConfig) -> io::Result<Self> {
        let max = cfg.max_sessions.clamp(1, MAX_RECORDS);
        let entries = cfg.index_entries.max(1);
        let nbuckets = ((entries as f64 / (SLOTS as f64 * LOAD)).ceil() as u32).max(2);
        let s = cfg.seed;
        Ok(SessionTable {
            buckets: MmapArray::new(nbuckets as usize + MAX_PROBE)?,
            nbuckets,
            v4: Arena::new(max)?,
            v6: Arena::new(max)?,
            entries: 0,
            max_entries: (nbuckets as f64 * SLOTS as f64 * 0.97) as u32,
            live: 0,
            half_open: 0,
            continued: 0,
            ports: Vec::new(),
            active: Vec::new(),
            seeds: [crate::hash::mix64(s ^ 1) | 1, crate::hash::mix64(s ^ 2) | 1, crate::hash::mix64(s ^ 3) | 1],
            cfg: TableConfig { max_sessions: max, ..cfg },
            stats: TableStats::default(),
        })
    }

    pub fn config(&self) -> &TableConfig {
        &self.cfg
    }

    /// Makes the index resident (it is mapped for the configured capacity and touched at random
    /// by the first flows; the records fill in order and need no such help). The daemon calls
    /// it on the worker's own thread before the first packet.
    pub fn prefault_index(&mut self) {
        self.buckets.prefault();
    }

    /// Live sessions (both families).
    pub fn len(&self) -> u32 {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Live sessions whose handshake the backend has not completed (SYN_SENT, SYN_RECV).
    pub fn half_open(&self) -> u32 {
        self.half_open
    }

    /// Live sessions opened by continuation and not confirmed yet (CONTINUED).
    pub fn continued(&self) -> u32 {
        self.continued
    }

    /// Moves a live session to state `st`, keeping the half-open and continued counts.
    #[inline(always)]
    pub fn set_state<A: Addr>(&mut self, r: Ref, st: u8)
    where
        Session<A>: Zeroable,
    {
        let s = self.get_mut::<A>(r);
        let old = s.state;
        s.state = st;
        self.count_state(old, -1);
        self.count_state(st, 1);
    }

    #[inline(always)]
    fn count_state(&mut self, st: u8, n: i32) {
        if half_open(st) {
            self.half_open = self.half_open.wrapping_add_signed(n);
        } else if continued(st) {
            self.continued = self.continued.wrapping_add_signed(n);
        }
    }

    /// The SYN proxy's record of a session (meaningful only with [`flag::SYNPROXY`]).
    #[inline(always)]
    pub fn adj<A: Addr>(&self, r: Ref) -> &SeqAdj
    where
        Session<A>: Zeroable,
    {
        &A::arena(self).adj.as_slice()[r.idx()]
    }

    /// [`SessionTable::adj`] by record index (as [`SessionTable::for_each`] gives it).
    pub fn adj_at<A: Addr>(&self, i: usize) -> &SeqAdj
    where
        Session<A>: Zeroable,
    {
        &A::arena(self).adj.as_slice()[i]
    }

    #[inline(always)]
    pub fn adj_mut<A: Addr>(&mut self, r: Ref) -> &mut SeqAdj
    where
        Session<A>: Zeroable,
    {
        &mut A::arena_mut(self).adj.as_mut_slice()[r.idx()]
    }

    pub fn capacity(&self) -> u32 {
        self.cfg.max_sessions
    }

    /// Active sessions per backend slot.
    pub fn active(&self) -> &[u32] {
        &self.active
    }

    #[inline(always)]
    pub fn hash_fwd<A: Addr>(&self, svc: u16, client: &A, cport: u16) -> u64
    where
        Session<A>: Zeroable,
    {
        let h = fold_mul(client.key_word(self.seeds[0]), ((cport as u64) << 16 | svc as u64) ^ self.seeds[1]);
        // A second round: structured keys (consecutive addresses and ports) otherwise cluster.
        fold_mul(h ^ self.seeds[2], 0x9e37_79b9_7f4a_7c15)
    }

    #[inline(always)]
    pub fn hash_rev<A: Addr>(&self, backend: u32, client: &A, cport: u16) -> u64
    where
        Session<A>: Zeroable,
    {
        let h = fold_mul(client.key_word(self.seeds[2]), ((backend as u64) << 16 | cport as u64) ^ self.seeds[1]);
        fold_mul(h ^ self.seeds[0], 0x9e37_79b9_7f4a_7c15)
    }

    #[inline(always)]
    fn home(&self, h: u64) -> usize {
        ((h as u32 as u64 * self.nbuckets as u64) >> 32) as usize
    }

    #[inline(always)]
    pub fn prefetch_bucket(&self, h: u64) {
        self.buckets.prefetch(self.home(h));
    }

    /// Looks at the home bucket only.
    #[inline(always)]
    pub fn probe(&self, h: u64) -> Probe {
        let (buckets, home) = (self.buckets.as_slice(), self.home(h));
        debug_assert!(home < buckets.len());
        // SAFETY: `home` maps a hash to [0, nbuckets) (a 32-bit fraction of nbuckets), and the
        // index holds nbuckets + MAX_PROBE buckets (`new`; neither changes afterwards).
        let b = unsafe { buckets.get_unchecked(home) };
        let sig = (h >> 32) as u32;
        let mut hits = sig_matches(b, sig);
        while hits != 0 {
            let k = hits.trailing_zeros() as usize;
            if let Some(r) = Ref::from_raw(b.refs[k]) {
                return Probe::Candidate(r);
            }
            hits &= hits - 1;
        }
        if b.ovf == 0 {
            Probe::Miss
        } else {
            // The full lookup will walk the probe window: fetch its first buckets now.
            for k in 1..=(b.reach as usize).min(2) {
                self.buckets.prefetch(home + k);
            }
            Probe::Deep
        }
    }

    /// For a key [`probe`](Self::probe) found `Deep`: the first slot with its signature in the
    /// probe window after the home bucket (whose first buckets `probe` prefetched), unverified,
    /// so that its record can be prefetched before the key is checked. (`find` with a
    /// yes-closure gives the same answer, but rescans the home bucket: 6 instructions a packet
    /// more under callgrind, past the 500 the pipeline keeps to.)
    #[inline]
    pub fn probe_window(&self, h: u64) -> Option<Ref> {
        let home = self.home(h);
        let sig = (h >> 32) as u32;
        let buckets = self.buckets.as_slice();
        let reach = buckets[home].reach as usize;
        for b in &buckets[home + 1..home + 1 + reach] {
            let mut hits = sig_matches(b, sig);
            while hits != 0 {
                let k = hits.trailing_zeros() as usize;
                if let Some(r) = Ref::from_raw(b.refs[k]) {
                    return Some(r);
                }
                hits &= hits - 1;
            }
        }
        None
    }

    /// Full lookup: every slot with the signature in the home bucket and, if it overflowed, the
    /// probe window; `hit` verifies the key.
    #[inline]
    fn find(&self, h: u64, mut hit: impl FnMut(Ref) -> bool) -> Option<Ref> {
        let home = self.home(h);
        let sig = (h >> 32) as u32;
        let buckets = self.buckets.as_slice();
        let window = if buckets[home].ovf == 0 { 1 } else { buckets[home].reach as usize + 1 };
        for b in &buckets[home..home + window] {
            let mut hits = sig_matches(b, sig);
            while hits != 0 {
                let k = hits.trailing_zeros() as usize;
                if let Some(r) = Ref::from_raw(b.refs[k]) {
                    if hit(r) {
                        return Some(r);
                    }
                }
                hits &= hits - 1;
            }
        }
        None
    }

    /// Finds the live session with this forward key.
    #[inline]
    pub fn find_fwd<A: Addr>(&self, h: u64, svc: u16, client: &A, cport: u16) -> Option<Ref>
    where
        Session<A>: Zeroable,
    {
        self.find(h, |r| {
            !r.is_reverse() && r.is_v6() == A::V6 && {
                let s = self.get::<A>(r);
                s.state != state::FREE && s.svc == svc && s.cport == cport && s.client == *client
            }
        })
    }

    /// Finds the live NAT session with this reverse key.
    #[inline]
    pub fn find_rev<A: Addr>(&self, h: u64, backend: u32, client: &A, cport: u16) -> Option<Ref>
    where
        Session<A>: Zeroable,
    {
        self.find(h, |r| {
            r.is_reverse() && r.is_v6() == A::V6 && {
                let s = self.get::<A>(r);
                s.state != state::FREE && s.backend == backend && s.cport == cport && s.client == *client
            }
        })
    }

    #[inline(always)]
    pub fn get<A: Addr>(&self, r: Ref) -> &Session<A>
    where
        Session<A>: Zeroable,
    {
        &A::arena(self).recs.as_slice()[r.idx()]
    }

    #[inline(always)]
    pub fn get_mut<A: Addr>(&mut self, r: Ref) -> &mut Session<A>
    where
        Session<A>: Zeroable,
    {
        &mut A::arena_mut(self).recs.as_mut_slice()[r.idx()]
    }

    #[inline(always)]
    pub fn prefetch_record(&self, r: Ref) {
        // Records are 24 or 36 bytes: the first and the last byte cover a record that straddles
        // two lines (a second prefetch of the same line costs less than the test).
        fn fetch<A>(a: &Arena<A>, i: usize)
        where
            Session<A>: Zeroable,
        {
            // No bounds check: a prefetch never faults (see `MmapArray::prefetch`).
            let p = a.recs.as_slice().as_ptr().wrapping_add(i) as *const u8;
            vectorlb_io::prefetch(p);
            vectorlb_io::prefetch(p.wrapping_add(std::mem::size_of::<Session<A>>() - 1));
        }
        if r.is_v6() {
            fetch(&self.v6, r.idx());
        } else {
            fetch(&self.v4, r.idx());
        }
    }

    /// Port map slot for (local address, port), or `None` when this core does not own the port.
    #[inline(always)]
    fn port_slot(&self, laddr: u16, lport: u16) -> Option<(usize, usize)> {
        let mask = (1u16 << self.cfg.core_shift) - 1;
        if lport & mask != self.cfg.core {
            return None;
        }
        Some((laddr as usize, (lport >> self.cfg.core_shift) as usize))
    }

    /// Whether this core owns `lport` (replies to other cores' ports are misdirected).
    pub fn owns_port(&self, lport: u16) -> bool {
        let mask = (1u16 << self.cfg.core_shift) - 1;
        lport & mask == self.cfg.core
    }

    /// The core that owns `lport`, when that core exists.
    pub fn port_owner(&self, lport: u16) -> Option<u16> {
        let w = lport & ((1u16 << self.cfg.core_shift) - 1);
        (w < self.cfg.cores).then_some(w)
    }

    /// The session bound to a local address and port (reply traffic of full NAT and SNAT).
    #[inline(always)]
    pub fn port_lookup(&self, laddr: u16, lport: u16) -> Option<Ref> {
        let (l, i) = self.port_slot(laddr, lport)?;
        let map = self.ports.get(l)?.as_ref()?;
        Ref::from_raw(*map.slots.as_slice().get(i)?)
    }

    #[inline(always)]
    pub fn prefetch_port(&self, laddr: u16, lport: u16) {
        if let Some((l, i)) = self.port_slot(laddr, lport) {
            if let Some(Some(map)) = self.ports.get(l) {
                map.slots.prefetch(i);
            }
        }
    }

    /// Slot indices of this core's ports within [port_min, port_max].
    fn port_range(&self) -> (u32, u32) {
        let shift = self.cfg.core_shift as u32;
        let core = self.cfg.core as u32;
        let (pmin, pmax) = (self.cfg.port_min as u32, self.cfg.port_max as u32);
        let lo = (pmin.max(core) - core).div_ceil(1 << shift);
        let hi = if pmax < core { 0 } else { (pmax - core) >> shift };
        (lo, hi)
    }

    /// Where the search for a free port of a local address starts (`port_offset` into the
    /// range).
    fn first_port(&self, lo: u32, hi: u32) -> u32 {
        if hi < lo {
            return lo;
        }
        lo + self.cfg.port_offset % (hi - lo + 1)
    }

    fn alloc_port(&mut self, laddr: u16, r: Ref) -> io::Result<Option<u16>> {
        let shift = self.cfg.core_shift;
        let core = self.cfg.core as u32;
        let (lo, hi) = self.port_range();
        if lo > hi {
            return Ok(None);
        }
        let l = laddr as usize;
        if self.ports.len() <= l {
            self.ports.resize_with(l + 1, || None);
        }
        if self.ports[l].is_none() {
            let cursor = self.first_port(lo, hi);
            self.ports[l] = Some(PortMap { slots: MmapArray::new(1usize << (16 - shift))?, cursor });
        }
        let map = self.ports[l].as_mut().unwrap();
        let slots = map.slots.as_mut_slice();
        for _ in 0..PORT_SCAN.min(hi - lo + 1) {
            let i = map.cursor.clamp(lo, hi);
            map.cursor = if i >= hi { lo } else { i + 1 };
            if slots[i as usize] == 0 {
                slots[i as usize] = r.raw();
                return Ok(Some(((i << shift) | core) as u16));
            }
        }
        Ok(None)
    }

    fn free_port(&mut self, laddr: u16, lport: u16) {
        if let Some((l, i)) = self.port_slot(laddr, lport) {
            if let Some(Some(map)) = self.ports.get_mut(l) {
                map.slots.as_mut_slice()[i] = 0;
            }
        }
    }

    fn index_insert(&mut self, h: u64, r: Ref) -> bool {
        let home = self.home(h);
        let sig = (h >> 32) as u32;
        let buckets = self.buckets.as_mut_slice();
        for d in 0..=MAX_PROBE {
            let b = &mut buckets[home + d];
            if let Some(k) = b.refs.iter().position(|&x| x == 0) {
                b.refs[k] = r.raw();
                b.sig[k] = sig;
                if d > 0 {
                    buckets[home].ovf += 1;
                    buckets[home].reach = buckets[home].reach.max(d as u32);
                }
                return true;
            }
        }
        false
    }

    fn index_remove(&mut self, h: u64, r: Ref) {
        let home = self.home(h);
        let buckets = self.buckets.as_mut_slice();
        let window = if buckets[home].ovf == 0 { 1 } else { buckets[home].reach as usize + 1 };
        for d in 0..window {
            let b = &mut buckets[home + d];
            if let Some(k) = b.refs.iter().position(|&x| x == r.raw()) {
                b.refs[k] = 0;
                if d > 0 {
                    buckets[home].ovf -= 1;
                }
                return;
            }
        }
        debug_assert!(false, "index entry not found");
    }

    fn track_backend(&mut self, backend: u32, delta: i32) {
        let slot = crate::service::backend_slot(backend) as usize;
        if self.active.len() <= slot {
            self.active.resize(slot + 1, 0);
        }
        self.active[slot] = self.active[slot].saturating_add_signed(delta);
    }

    /// Claims local port `lport` of `laddr` for `r`. False when this core does not own the
    /// port or it is taken.
    fn claim_port(&mut self, laddr: u16, lport: u16, r: Ref) -> io::Result<bool> {
        let shift = self.cfg.core_shift;
        let l = laddr as usize;
        if self.ports.len() <= l {
            self.ports.resize_with(l + 1, || None);
        }
        if self.ports[l].is_none() {
            let (lo, hi) = self.port_range();
            let cursor = self.first_port(lo, hi);
            self.ports[l] = Some(PortMap { slots: MmapArray::new(1usize << (16 - shift))?, cursor });
        }
        let Some((_, i)) = self.port_slot(laddr, lport) else { return Ok(false) };
        let slots = self.ports[l].as_mut().unwrap().slots.as_mut_slice();
        match slots.get_mut(i) {
            Some(v) if *v == 0 => {
                *v = r.raw();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Inserts a session whose local address and port are already chosen (`s.laddr`,
    /// `s.lport`; `NO_LADDR` for none): a session synchronised from another node.
    pub fn insert_bound<A: Addr>(&mut self, s: Session<A>) -> Result<Ref, InsertError>
    where
        Session<A>: Zeroable,
    {
        self.insert_inner(s, None)
    }

    /// Inserts a session. With `laddrs` non-empty a local port is bound on the first of them
    /// (starting at `*cursor`, which advances) that has one free, and written to the record.
    pub fn insert<A: Addr>(&mut self, s: Session<A>, laddrs: &[u16], cursor: &mut usize) -> Result<Ref, InsertError>
    where
        Session<A>: Zeroable,
    {
        self.insert_inner(s, Some((laddrs, cursor)))
    }

    fn insert_inner<A: Addr>(&mut self, mut s: Session<A>, alloc: Option<(&[u16], &mut usize)>) -> Result<Ref, InsertError>
    where
        Session<A>: Zeroable,
    {
        let need = if s.flags & flag::REVERSE != 0 { 2 } else { 1 };
        if self.entries + need > self.max_entries {
            self.stats.full += 1;
            return Err(InsertError::Full);
        }
        let Some(idx) = A::arena_mut(self).alloc() else {
            self.stats.full += 1;
            return Err(InsertError::Full);
        };
        let r = Ref::new(idx, A::V6, false);
        if alloc.is_none() && s.laddr != NO_LADDR {
            if !self.claim_port(s.laddr, s.lport, r).unwrap_or(false) {
                A::arena_mut(self).release(idx);
                self.stats.no_port += 1;
                return Err(InsertError::NoPort);
            }
            s.flags |= flag::PORT;
        }
        if let Some((laddrs, cursor)) = alloc.filter(|(l, _)| !l.is_empty()) {
            let mut bound = None;
            for k in 0..laddrs.len() {
                let l = laddrs[(*cursor + k) % laddrs.len()];
                if let Ok(Some(p)) = self.alloc_port(l, r) {
                    bound = Some((l, p));
                    *cursor = (*cursor + k + 1) % laddrs.len();
                    break;
                }
            }
            let Some((l, p)) = bound else {
                A::arena_mut(self).release(idx);
                self.stats.no_port += 1;
                return Err(InsertError::NoPort);
            };
            s.laddr = l;
            s.lport = p;
            s.flags |= flag::PORT;
        }
        let hf = self.hash_fwd(s.svc, &s.client, s.cport);
        let ok = self.index_insert(hf, r) && {
            s.flags & flag::REVERSE == 0 || {
                let hr = self.hash_rev(s.backend, &s.client, s.cport);
                self.index_insert(hr, Ref::new(idx, A::V6, true)) || {
                    self.index_remove(hf, r);
                    false
                }
            }
        };
        if !ok {
            if s.flags & flag::PORT != 0 {
                self.free_port(s.laddr, s.lport);
            }
            A::arena_mut(self).release(idx);
            self.stats.full += 1;
            return Err(InsertError::Full);
        }
        *self.get_mut::<A>(r) = s;
        self.entries += need;
        self.live += 1;
        self.count_state(s.state, 1);
        self.stats.inserted += 1;
        if s.flags & flag::SNAT == 0 {
            self.track_backend(s.backend, 1);
        }
        Ok(r)
    }

    /// Removes a live session (any reference to it).
    pub fn remove<A: Addr>(&mut self, r: Ref)
    where
        Session<A>: Zeroable,
    {
        let s = *self.get::<A>(r);
        if s.state == state::FREE {
            return;
        }
        let fwd = Ref::new(r.idx() as u32, A::V6, false);
        self.index_remove(self.hash_fwd(s.svc, &s.client, s.cport), fwd);
        let mut n = 1;
        if s.flags & flag::REVERSE != 0 {
            self.index_remove(self.hash_rev(s.backend, &s.client, s.cport), Ref::new(r.idx() as u32, A::V6, true));
            n = 2;
        }
        if s.flags & flag::PORT != 0 {
            self.free_port(s.laddr, s.lport);
        }
        if s.flags & flag::SNAT == 0 {
            self.track_backend(s.backend, -1);
        }
        A::arena_mut(self).release(r.idx() as u32);
        self.entries -= n;
        self.live -= 1;
        self.count_state(s.state, -1);
        self.stats.removed += 1;
    }

    fn sweep_family<A: Addr>(&mut self, now: u32, budget: u32) -> u32
    where
        Session<A>: Zeroable,
    {
        let mut removed = 0;
        let used = A::arena(self).next_unused;
        if used == 0 {
            return 0;
        }
        for _ in 0..budget.min(used) {
            let arena = A::arena_mut(self);
            let i = arena.sweep;
            arena.sweep = if i + 1 >= used { 0 } else { i + 1 };
            let s = &arena.recs.as_slice()[i as usize];
            if s.state != state::FREE && expired(now, s.expire) {
                self.remove::<A>(Ref::new(i, A::V6, false));
                self.stats.expired += 1;
                removed += 1;
            }
        }
        removed
    }

    /// A live session among the next `scan` records of each family after the sweep's position
    /// whose state and flags pass `ok` (the cursor moves on, so repeated calls spread).
    pub fn find_state(&mut self, scan: u32, ok: impl Fn(u8, u8) -> bool) -> Option<Ref> {
        fn fam<A: Addr>(t: &mut SessionTable, scan: u32, ok: &impl Fn(u8, u8) -> bool) -> Option<Ref>
        where
            Session<A>: Zeroable,
        {
            let arena = A::arena_mut(t);
            let used = arena.next_unused;
            for _ in 0..scan.min(used) {
                let i = arena.sweep;
                arena.sweep = if i + 1 >= used { 0 } else { i + 1 };
                let s = &arena.recs.as_slice()[i as usize];
                if s.state != state::FREE && ok(s.state, s.flags) {
                    return Some(Ref::new(i, A::V6, false));
                }
            }
            None
        }
        fam::<[u8; 4]>(self, scan, &ok).or_else(|| fam::<[u8; 16]>(self, scan, &ok))
    }

    /// Removes expired sessions among the next `budget` records of each family.
    pub fn sweep(&mut self, now: u32, budget: u32) -> u32 {
        self.sweep_family::<[u8; 4]>(now, budget) + self.sweep_family::<[u8; 16]>(now, budget)
    }

    /// Visits live sessions of one family in record order, from `start`, until `f` returns
    /// false: `f` declines that session (a page is full), and the index returned, to continue
    /// from, is that session's, so the next page starts with it (paged listings, bulk sync).
    pub fn for_each<A: Addr>(&self, start: usize, mut f: impl FnMut(usize, &Session<A>) -> bool) -> Option<usize>
    where
        Session<A>: Zeroable,
    {
        let arena = A::arena(self);
        let used = arena.next_unused as usize;
        for (i, s) in arena.recs.as_slice()[..used].iter().enumerate().skip(start) {
            if s.state != state::FREE && !f(i, s) {
                return Some(i);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sess(ip: u32, port: u16, svc: u16, backend: u32) -> SessionV4 {
        Session { client: ip.to_be_bytes(), cport: port, svc, backend, laddr: NO_LADDR, lport: 0, expire: 1000, state: state::ESTABLISHED, flags: 0 }
    }

    #[test]
    fn record_sizes() {
        assert_eq!(std::mem::size_of::<SessionV4>(), 24);
        assert_eq!(std::mem::size_of::<SessionV6>(), 36);
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
    }

    #[test]
    fn insert_find_remove() {
        let mut t = SessionTable::new(TableConfig::new(1000)).unwrap();
        let mut refs = Vec::new();
        for i in 0..1000u32 {
            let s = sess(0x0a00_0000 + i, (i % 60000) as u16, 1, 7);
            refs.push(t.insert(s, &[], &mut 0).unwrap());
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(t.active()[7], 1000);
        for i in 0..1000u32 {
            let c = (0x0a00_0000 + i).to_be_bytes();
            let h = t.hash_fwd(1, &c, (i % 60000) as u16);
            assert_eq!(t.find_fwd(h, 1, &c, (i % 60000) as u16), Some(refs[i as usize]));
            assert_eq!(t.find_fwd(h, 2, &c, (i % 60000) as u16), None);
        }
        // The table is full: one more is refused and counted.
        assert_eq!(t.insert(sess(1, 1, 1, 7), &[], &mut 0), Err(InsertError::Full));
        for r in &refs {
            t.remove::<[u8; 4]>(*r);
        }
        assert_eq!(t.len(), 0);
        assert_eq!(t.active()[7], 0);
        assert!(t.insert(sess(1, 1, 1, 7), &[], &mut 0).is_ok());
    }

    #[test]
    fn keys_outside_their_home_bucket_are_found_by_the_window_probe() {
        // A full table: some keys overflow their home bucket. For each, the home probe says
        // Deep and the window probe names its record (what stage 2b prefetches).
        let n = 20_000u32;
        let mut t = SessionTable::new(TableConfig::new(n)).unwrap();
        let mut refs = Vec::new();
        for i in 0..n {
            refs.push(t.insert(sess(0x0a00_0000 + i, 7, 1, 7), &[], &mut 0).unwrap());
        }
        let (mut home, mut deep) = (0, 0);
        for i in 0..n {
            let c = (0x0a00_0000 + i).to_be_bytes();
            let h = t.hash_fwd(1, &c, 7);
            match t.probe(h) {
                Probe::Candidate(r) => {
                    assert_eq!(r, refs[i as usize]);
                    home += 1;
                }
                Probe::Deep => {
                    assert_eq!(t.probe_window(h), Some(refs[i as usize]));
                    deep += 1;
                }
                Probe::Miss => panic!("key {i} missed"),
            }
        }
        assert_eq!(home + deep, n);
        assert!(deep > n / 100, "a full table overflows some buckets ({deep} of {n})");
        // An absent key in an overflowed bucket: the window has no candidate for it.
        let absent =
            (0..100_000u32).map(|i| t.hash_fwd(2, &i.to_be_bytes(), 9)).find(|h| matches!(t.probe(*h), Probe::Deep)).expect("some absent key lands in an overflowed bucket");
        assert_eq!(t.probe_window(absent), None);
    }

    #[test]
    fn pages_of_sessions_miss_none() {
        // Pages of 7, each declining the session that would make an eighth: every session is
        // on exactly one page (the resume index is the declined session's own).
        let mut t = SessionTable::new(TableConfig::new(200)).unwrap();
        for i in 0..100u32 {
            t.insert(sess(0x0a00_0000 + i, 1000 + i as u16, 1, 7), &[], &mut 0).unwrap();
        }
        let (mut seen, mut start) = (Vec::new(), Some(0));
        while let Some(s) = start {
            let mut page = Vec::new();
            start = t.for_each::<[u8; 4]>(s, |_, x| {
                if page.len() >= 7 {
                    return false;
                }
                page.push(x.cport);
                true
            });
            assert!(page.len() == 7 || start.is_none(), "{page:?}");
            seen.extend(page);
        }
        seen.sort_unstable();
        assert_eq!(seen, (1000..1100).collect::<Vec<u16>>());
    }

    #[test]
    fn nat_sessions_have_reverse_keys() {
        let mut t = SessionTable::new(TableConfig { index_entries: 20, ..TableConfig::new(10) }).unwrap();
        let mut s = sess(0x0102_0304, 5555, 3, 9);
        s.flags = flag::REVERSE;
        let r = t.insert(s, &[], &mut 0).unwrap();
        let h = t.hash_rev(9, &s.client, 5555);
        let rr = t.find_rev(h, 9, &s.client, 5555).unwrap();
        assert!(rr.is_reverse());
        assert_eq!(rr.idx(), r.idx());
        t.remove::<[u8; 4]>(rr);
        assert_eq!(t.find_rev(h, 9, &s.client, 5555), None);
    }

    #[test]
    fn ports_are_per_core_and_freed() {
        let cfg = TableConfig { core: 1, cores: 2, core_shift: 1, port_min: 1024, port_max: 1040, ..TableConfig::new(100) };
        let mut t = SessionTable::new(cfg).unwrap();
        let mut cur = 0;
        let mut got = Vec::new();
        for i in 0..8u32 {
            let r = t.insert(sess(i, 1, 1, 1), &[0], &mut cur).unwrap();
            let s = *t.get::<[u8; 4]>(r);
            assert_eq!(s.lport & 1, 1, "odd ports belong to core 1");
            assert_eq!(t.port_lookup(0, s.lport), Some(r));
            got.push((r, s.lport));
        }
        // Ports 1025..=1039 odd: 8 of them. The ninth is refused.
        assert_eq!(t.insert(sess(99, 1, 1, 1), &[0], &mut cur), Err(InsertError::NoPort));
        assert_eq!(t.len(), 8);
        t.remove::<[u8; 4]>(got[3].0);
        assert_eq!(t.port_lookup(0, got[3].1), None);
        assert!(t.insert(sess(99, 1, 1, 1), &[0], &mut cur).is_ok());
        assert_eq!(t.port_lookup(0, 1024), None, "even port is not ours");
        assert_eq!((t.port_owner(1024), t.port_owner(1025)), (Some(0), Some(1)));
        // Three cores make four partitions: the fourth has no owner (a misdirected reply).
        let t3 = SessionTable::new(TableConfig { core: 0, cores: 3, core_shift: 2, ..TableConfig::new(10) }).unwrap();
        assert_eq!((t3.port_owner(1026), t3.port_owner(1027)), (Some(2), None));
    }

    #[test]
    fn the_port_search_starts_at_the_offset() {
        let mut cur = 0;
        for (offset, first) in [(0, 1024), (5, 1029), (16 + 3, 1027)] {
            let cfg = TableConfig { port_min: 1024, port_max: 1039, port_offset: offset, ..TableConfig::new(100) };
            let mut t = SessionTable::new(cfg).unwrap();
            let r = t.insert(sess(1, 1, 1, 1), &[0], &mut cur).unwrap();
            assert_eq!(t.get::<[u8; 4]>(r).lport, first, "offset {offset} (modulo the 16 ports)");
        }
    }

    #[test]
    fn sweep_removes_expired_only() {
        let mut t = SessionTable::new(TableConfig::new(100)).unwrap();
        for i in 0..50u32 {
            let mut s = sess(i, 1, 1, 1);
            s.expire = if i % 2 == 0 { 100 } else { 5000 };
            t.insert(s, &[], &mut 0).unwrap();
        }
        assert_eq!(t.sweep(200, 1000), 25);
        assert_eq!(t.len(), 25);
        assert!(expired(0, 0) && !expired(0, 1) && expired(5, u32::MAX - 3));
    }

    #[test]
    fn v6_records() {
        let mut t = SessionTable::new(TableConfig::new(10)).unwrap();
        let s = SessionV6 { client: [7; 16], cport: 80, svc: 2, backend: 1, laddr: NO_LADDR, lport: 0, expire: 10, state: state::UDP, flags: 0 };
        let r = t.insert(s, &[], &mut 0).unwrap();
        assert!(r.is_v6());
        let h = t.hash_fwd(2, &[7u8; 16], 80);
        assert_eq!(t.find_fwd(h, 2, &[7u8; 16], 80), Some(r));
        assert_eq!(*t.get::<[u8; 16]>(r), s);
    }
}
