//! The SYN proxy: a service's SYNs are answered with SYN cookies, so a flood of spoofed SYNs
//! creates no session and takes no local port. Only a client whose ACK returns a valid cookie
//! (and so proves it receives at its address) gets a session; then the LB opens the backend
//! connection itself and, once the backend answers, splices the two halves:
//!
//! ```text
//! client            LB                       backend
//!   SYN  ---------->   (nothing stored)
//!   <---------- SYN-ACK seq = cookie
//!   ACK  ---------->   cookie valid: session
//!                      SYN seq = client's ISN  ---------->
//!                      <----------  SYN-ACK seq = backend's ISN
//!                      ACK  ---------------------------->  (spliced)
//!   data <========= sequence numbers translated =========> data
//! ```
//!
//! The backend's connection starts at the client's own initial sequence number, so the
//! client-to-backend direction keeps its sequence numbers; the backend's differ from the
//! cookie by a constant (`SeqAdj::seq`), which client-bound segments subtract and backend-bound
//! acknowledgements and SACK blocks add. Timestamps are shifted the same way (`SeqAdj::ts`),
//! and client-bound windows are rescaled when the backend's window scale differs from the one
//! the proxy announced.
//!
//! The cookie (after Linux's): `H1(flow) + client ISN + (minute << 24) + ((H2(flow, minute) +
//! MSS index) & 0xffffff)`, with a keyed SipHash-1-3 for H1 and H2. With timestamps, the low six
//! bits of the proxy's timestamp value carry the client's window scale and SACK permission,
//! which come back in the ACK's echo. A cookie is accepted for two minutes.

use crate::flows::Flows;
use crate::hash::FxHashMap;
use crate::mem::Zeroable;
use crate::meta::Meta;
use crate::rewrite::{egress, Fam, Hdr};
use crate::service::{Hop, Service, Snapshot, SynProxy};
use crate::session::{adj_opt, flag, state, Ref, SeqAdj, Session};
use crate::verdict::{DropReason, Verdict};
use vectorlb_io::PacketBuf;
use vectorlb_packet::checksum::{adjust16, adjust32};
use vectorlb_packet::proto;
use vectorlb_packet::tcp::{flags as tf, option};

/// The MSS values a cookie can carry (two bits): the largest not above the client's is used.
pub const MSS_TABLE: [u16; 4] = [536, 1220, 1440, 1460];
const COOKIE_BITS: u32 = 24;
const COOKIE_MASK: u32 = (1 << COOKIE_BITS) - 1;
/// The cookie clock ticks every 2^16 ms (65.5 s).
const TICK_SHIFT: u32 = 16;
/// Ticks a cookie stays valid after the one it was issued in.
const MAX_AGE: u32 = 2;
/// The window scale the proxy announces to clients that offer scaling.
pub const WSCALE: u8 = 7;
/// "No window scale" in a 4-bit field.
const NO_WS: u8 = 0xf;

#[inline(always)]
fn sipround(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-1-3 of a sequence of 64-bit words under a 128-bit key.
pub fn siphash13(k: [u64; 2], words: &[u64]) -> u64 {
    let mut v = [k[0] ^ 0x736f_6d65_7073_6575, k[1] ^ 0x646f_7261_6e64_6f6d, k[0] ^ 0x6c79_6765_6e65_7261, k[1] ^ 0x7465_6462_7974_6573];
    for &w in words {
        v[3] ^= w;
        sipround(&mut v);
        v[0] ^= w;
    }
    let b = ((words.len() as u64 * 8) & 0xff) << 56;
    v[3] ^= b;
    sipround(&mut v);
    v[0] ^= b;
    v[2] ^= 0xff;
    for _ in 0..3 {
        sipround(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// A flow as the cookie sees it: client address and port, VIP and port.
#[derive(Debug, Clone, Copy)]
pub struct Flow {
    pub client: u128,
    pub vip: u128,
    pub cport: u16,
    pub vport: u16,
}

impl Flow {
    fn hash(&self, key: [u64; 2], salt: u64) -> u32 {
        let ports = (self.cport as u64) << 16 | self.vport as u64;
        siphash13(key, &[self.client as u64, (self.client >> 64) as u64, self.vip as u64, (self.vip >> 64) as u64, ports | salt << 32]) as u32
    }
}

/// The cookie for a client's SYN with initial sequence number `isn`, at `now` (ms), carrying
/// MSS index `mss_idx` (< 4).
pub fn cookie(key: [u64; 2], f: &Flow, isn: u32, now: u32, mss_idx: u32) -> u32 {
    let count = (now >> TICK_SHIFT) & 0xff;
    f.hash(key, 0).wrapping_add(isn).wrapping_add(count << COOKIE_BITS).wrapping_add(f.hash(key, 1 + count as u64).wrapping_add(mss_idx) & COOKIE_MASK)
}

/// The MSS index a cookie carries when it is one this key issued for the flow and `isn` within
/// the last [`MAX_AGE`] ticks.
pub fn check(key: [u64; 2], f: &Flow, isn: u32, cookie: u32, now: u32) -> Option<u32> {
    let c = cookie.wrapping_sub(f.hash(key, 0)).wrapping_sub(isn);
    let count = c >> COOKIE_BITS;
    let age = ((now >> TICK_SHIFT).wrapping_sub(count)) & 0xff;
    if age > MAX_AGE {
        return None;
    }
    let idx = (c.wrapping_sub(f.hash(key, 1 + count as u64))) & COOKIE_MASK;
    (idx < MSS_TABLE.len() as u32).then_some(idx)
}

/// What a segment's options say, and where the ones the proxy rewrites are (offsets from the
/// start of the TCP header).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Opts {
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
    pub sack_ok: bool,
    /// (value, echo, offset of the value).
    pub ts: Option<(u32, u32, usize)>,
    /// Offset of the first SACK block and the number of blocks.
    pub sack: Option<(usize, usize)>,
}

/// Reads the options of a TCP header `t` (at least 20 bytes, `doff` its header length, checked
/// by the caller). A malformed list stops the walk: what was read before it stands.
pub fn scan(t: &[u8], doff: usize) -> Opts {
    let mut o = Opts::default();
    let end = doff.min(t.len());
    let mut i = 20;
    while i < end {
        match t[i] {
            option::END => break,
            option::NOP => i += 1,
            kind => {
                let Some(&len) = t.get(i + 1) else { break };
                let len = len as usize;
                if len < 2 || i + len > end {
                    break;
                }
                match (kind, len) {
                    (option::MSS, 4) => o.mss = Some(u16::from_be_bytes([t[i + 2], t[i + 3]])),
                    (option::WSCALE, 3) => o.wscale = Some(t[i + 2].min(14)),
                    (option::SACK_PERMITTED, 2) => o.sack_ok = true,
                    (option::TIMESTAMP, 10) => {
                        let v = u32::from_be_bytes(t[i + 2..i + 6].try_into().unwrap());
                        let e = u32::from_be_bytes(t[i + 6..i + 10].try_into().unwrap());
                        o.ts = Some((v, e, i + 2));
                    }
                    (option::SACK, l) if l >= 10 && (l - 2) % 8 == 0 => o.sack = Some((i + 2, (l - 2) / 8)),
                    _ => {}
                }
                i += len;
            }
        }
    }
    o
}

/// The handshake a valid cookie ACK stands for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handshake {
    /// The client's initial sequence number.
    isn: u32,
    /// The proxy's (the cookie).
    cookie: u32,
    mss: u16,
    /// The client's window scale, or `NO_WS`.
    wscale: u8,
    sack_ok: bool,
    /// (client's timestamp value, the proxy's) when timestamps were negotiated.
    ts: Option<(u32, u32)>,
    win: u16,
}

/// Client segments held (copied) while their connection's backend handshake is pending, at
/// most this many per core.
pub const MAX_HELD: usize = 1024;
/// A held segment older than this (ms) is discarded when room is needed.
const HELD_TTL: u32 = 10_000;

/// The client's first data segment of a connection whose backend has not answered yet: sent to
/// the backend with the ACK that completes its handshake, so the request does not wait for the
/// client's retransmission timer.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    seq: u32,
    flags: u8,
    tsval: Option<u32>,
    at: u32,
    payload: Vec<u8>,
}

/// Header fields of a segment the proxy builds.
pub(crate) struct Segment<'a> {
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub win: u16,
    /// A multiple of four bytes, at most 40.
    pub opts: &'a [u8],
    pub payload: &'a [u8],
}

/// Writes a TCP segment from `src` to `dst` over the packet in `b` from `l3` on: a fresh IPv4
/// (20 bytes, DF set) or IPv6 (40 bytes) header, the TCP header with `seg.opts`, `seg.payload`,
/// the checksums filled. `seg.payload` must not overlap the buffer. Returns the new header positions, or `None` when the buffer cannot hold it.
pub(crate) fn build_segment<A: Fam, B: PacketBuf>(b: &mut B, l3: usize, src: &A, dst: &A, seg: &Segment) -> Option<Hdr>
where
    Session<A>: Zeroable,
{
    debug_assert!(seg.opts.len().is_multiple_of(4) && seg.opts.len() <= 40);
    let ip_len = A::HEADER;
    let tcp_len = 20 + seg.opts.len() + seg.payload.len();
    let end = l3 + ip_len + tcp_len;
    let doff = 20 + seg.opts.len();
    if !b.set_len(end) {
        return None;
    }
    let d = b.data_mut();
    let ip = &mut d[l3..l3 + ip_len];
    if A::V6 {
        ip[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, proto::TCP, 64]);
        ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
    } else {
        ip.copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto::TCP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ip[2..4].copy_from_slice(&((ip_len + tcp_len) as u16).to_be_bytes());
    }
    ip[A::SRC..A::SRC + A::LEN].copy_from_slice(src.bytes());
    ip[A::DST..A::DST + A::LEN].copy_from_slice(dst.bytes());
    if !A::V6 {
        let c = vectorlb_packet::checksum::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let l4 = l3 + ip_len;
    let t = &mut d[l4..end];
    t[0..2].copy_from_slice(&seg.sport.to_be_bytes());
    t[2..4].copy_from_slice(&seg.dport.to_be_bytes());
    t[4..8].copy_from_slice(&seg.seq.to_be_bytes());
    t[8..12].copy_from_slice(&seg.ack.to_be_bytes());
    t[12] = ((doff / 4) as u8) << 4;
    t[13] = seg.flags;
    t[14..16].copy_from_slice(&seg.win.to_be_bytes());
    t[16..20].fill(0);
    t[20..doff].copy_from_slice(seg.opts);
    t[doff..].copy_from_slice(seg.payload);
    crate::rewrite::fill_l4_checksum::<A>(d, l3, l4, end, proto::TCP);
    Some(Hdr { l3, l4, end, v6: A::V6, proto: proto::TCP })
}

/// Options writer for the segments the proxy sends.
struct OptBuf {
    b: [u8; 40],
    n: usize,
}

impl OptBuf {
    fn new() -> Self {
        OptBuf { b: [0; 40], n: 0 }
    }
    fn put(&mut self, bytes: &[u8]) {
        self.b[self.n..self.n + bytes.len()].copy_from_slice(bytes);
        self.n += bytes.len();
    }
    fn mss(&mut self, mss: u16) {
        let m = mss.to_be_bytes();
        self.put(&[option::MSS, 4, m[0], m[1]]);
    }
    /// SACK-permitted (or two NOPs) and a timestamp: 12 bytes.
    fn ts(&mut self, sack_ok: bool, val: u32, echo: u32) {
        self.put(&if sack_ok { [option::SACK_PERMITTED, 2] } else { [option::NOP, option::NOP] });
        self.put(&[option::TIMESTAMP, 10]);
        self.put(&val.to_be_bytes());
        self.put(&echo.to_be_bytes());
    }
    fn wscale(&mut self, ws: u8) {
        self.put(&[option::NOP, option::WSCALE, 3, ws]);
    }
    fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }
}

/// Adds `delta` to the 32-bit big-endian word at `at`, keeping the checksum at `csum`.
#[inline(always)]
fn shift32(d: &mut [u8], at: usize, csum: usize, delta: u32) {
    let old = u32::from_be_bytes(d[at..at + 4].try_into().unwrap());
    let new = old.wrapping_add(delta);
    d[at..at + 4].copy_from_slice(&new.to_be_bytes());
    let c = u16::from_be_bytes([d[csum], d[csum + 1]]);
    d[csum..csum + 2].copy_from_slice(&adjust32(c, old, new).to_be_bytes());
}

/// Whether a service's SYNs go to the proxy on a core holding `half_open` half-open sessions.
#[inline(always)]
pub fn engaged(p: SynProxy, half_open: u32) -> bool {
    match p {
        SynProxy::Off => false,
        SynProxy::On => true,
        SynProxy::Auto { half_open: at } => half_open >= at,
    }
}

/// The TCP header of the packet, when its data offset is sane: its length.
fn tcp_header(d: &[u8], h: &Hdr) -> Option<usize> {
    let t = d.get(h.l4..h.end)?;
    if t.len() < 20 {
        return None;
    }
    let doff = (t[12] >> 4) as usize * 4;
    (20..=t.len()).contains(&doff).then_some(doff)
}

/// The core's SYN proxy: the cookies' secret (the control plane's) and the client segments held
/// while a backend's handshake is pending, by session.
pub struct SynProxyState {
    cookie_key: [u64; 2],
    held: FxHashMap<u32, Held>,
}

impl SynProxyState {
    pub(crate) fn new(cookie_key: [u64; 2]) -> Self {
        SynProxyState { cookie_key, held: Default::default() }
    }

    /// Answers a client's SYN to service `svc` with a SYN-ACK whose sequence number is a cookie.
    pub(crate) fn syn_cookie<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, snap: &Snapshot, b: &mut B, m: &Meta, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let d = b.data();
        let Some(doff) = tcp_header(d, &h) else {
            return Verdict::Drop(DropReason::Malformed);
        };
        let t = &d[h.l4..h.end];
        let o = scan(t, doff);
        let src = A::read(d, h.l3 + A::SRC);
        let dst = A::read(d, h.l3 + A::DST);
        let isn = u32::from_be_bytes(t[4..8].try_into().unwrap());
        let f = Flow { client: src.key(), vip: dst.key(), cport: m.sport, vport: m.dport };
        let client_mss = o.mss.unwrap_or(536);
        let idx = MSS_TABLE.iter().rposition(|&v| v <= client_mss).unwrap_or(0) as u32;
        let c = cookie(self.cookie_key, &f, isn, now, idx);
        let Some(hop) = flows.route_to(snap, src.key(), !A::V6) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        // What the proxy accepts: what fits the client-facing link.
        let our_mss = hop.mtu.saturating_sub(A::HEADER as u16 + 20).max(536);
        let mut ob = OptBuf::new();
        ob.mss(our_mss);
        if let Some((val, _, _)) = o.ts {
            let bits = o.wscale.unwrap_or(NO_WS) as u32 | (o.sack_ok as u32) << 4;
            ob.ts(o.sack_ok, (now & !0x3f) | bits, val);
            if o.wscale.is_some() {
                ob.wscale(WSCALE);
            }
        }
        let seg = Segment { sport: m.dport, dport: m.sport, seq: c, ack: isn.wrapping_add(1), flags: tf::SYN | tf::ACK, win: u16::MAX, opts: ob.bytes(), payload: &[] };
        let Some(nh) = build_segment::<A, B>(b, h.l3, &dst, &src, &seg) else {
            return Verdict::Drop(DropReason::NoRoom);
        };
        flows.counters.events.syncookies_sent += 1;
        egress(b, nh.l3, &hop, A::ETHERTYPE)
    }

    /// The handshake an ACK without a session completes, when it returns a valid cookie.
    pub(crate) fn cookie_ack<A: Fam>(&self, d: &[u8], m: &Meta, now: u32) -> Option<Handshake>
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let doff = tcp_header(d, &h)?;
        let t = &d[h.l4..h.end];
        let seq = u32::from_be_bytes(t[4..8].try_into().unwrap());
        let ack = u32::from_be_bytes(t[8..12].try_into().unwrap());
        let isn = seq.wrapping_sub(1);
        let c = ack.wrapping_sub(1);
        let src = A::read(d, h.l3 + A::SRC);
        let dst = A::read(d, h.l3 + A::DST);
        let f = Flow { client: src.key(), vip: dst.key(), cport: m.sport, vport: m.dport };
        let idx = check(self.cookie_key, &f, isn, c, now)?;
        let o = scan(t, doff);
        let (wscale, sack_ok, ts) = match o.ts {
            // The echo is the proxy's own value: its low bits are the client's options.
            Some((val, echo, _)) => {
                let ws = (echo & 0xf) as u8;
                (if ws <= 14 { ws } else { NO_WS }, echo & 0x10 != 0, Some((val, echo)))
            }
            None => (NO_WS, false, None),
        };
        Some(Handshake { isn, cookie: c, mss: MSS_TABLE[idx as usize], wscale, sack_ok, ts, win: u16::from_be_bytes([t[14], t[15]]) })
    }

    /// Turns the client's cookie ACK in `b` into the SYN the backend is sent (still addressed
    /// client to VIP: the forwarding path translates it like any first packet), records the
    /// handshake in session `r`, and returns the packet's new layout.
    pub(crate) fn cookie_to_syn<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, b: &mut B, m: &Meta, hs: &Handshake, r: Ref) -> Option<Meta>
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let src = A::read(b.data(), h.l3 + A::SRC);
        let dst = A::read(b.data(), h.l3 + A::DST);
        let mut ob = OptBuf::new();
        ob.mss(hs.mss);
        if let Some((val, _)) = hs.ts {
            ob.ts(hs.sack_ok, val, 0);
        }
        if hs.wscale != NO_WS {
            ob.wscale(hs.wscale);
        }
        let seg = Segment { sport: m.sport, dport: m.dport, seq: hs.isn, ack: 0, flags: tf::SYN, win: hs.win, opts: ob.bytes(), payload: &[] };
        let nh = build_segment::<A, B>(b, h.l3, &src, &dst, &seg)?;
        let s = flows.table.get_mut::<A>(r);
        s.flags |= flag::SYNPROXY;
        *flows.table.adj_mut::<A>(r) = SeqAdj {
            seq: hs.cookie,
            ts: hs.ts.map_or(0, |t| t.1),
            client_ts: hs.ts.map_or(0, |t| t.0),
            client_win: hs.win,
            wscale: if hs.wscale == NO_WS { 0xff } else { NO_WS << 4 | WSCALE },
            opts: if hs.ts.is_some() { adj_opt::TS } else { 0 },
        };
        flows.counters.events.syncookies_valid += 1;
        Some(Meta { l4: nh.l4 as u16, end: nh.end as u16, tcp_flags: tf::SYN, ..*m })
    }

    /// A client segment of a proxied session: translated toward the backend, or dropped while
    /// the backend has not answered (a reset goes through: the backend may have the SYN).
    /// `in_fragment`: the packet is a first fragment (its data is not whole: never held).
    #[cold]
    #[inline(never)]
    pub(crate) fn client_segment<A: Fam>(&mut self, flows: &mut Flows, d: &mut [u8], m: &Meta, r: Ref, in_fragment: bool, now: u32) -> Result<(), DropReason>
    where
        Session<A>: Zeroable,
    {
        let a = *flows.table.adj::<A>(r);
        if a.opts & adj_opt::SPLICED == 0 {
            if m.tcp_flags & tf::RST != 0 {
                return Ok(());
            }
            return Err(self.hold::<A>(flows, d, m, r, in_fragment, now));
        }
        if m.tcp_flags & tf::ACK == 0 {
            return Ok(());
        }
        let h = m.hdr();
        let Some(doff) = tcp_header(d, &h) else {
            return Err(DropReason::Malformed);
        };
        let l4 = h.l4;
        let csum = l4 + 16;
        shift32(d, l4 + 8, csum, a.seq);
        if doff > 20 {
            let o = scan(&d[l4..h.end], doff);
            if let Some((at, n)) = o.sack {
                for k in 0..n * 2 {
                    shift32(d, l4 + at + 4 * k, csum, a.seq);
                }
            }
            if let (Some((_, _, at)), true) = (o.ts, a.opts & adj_opt::TS != 0) {
                shift32(d, l4 + at + 4, csum, a.ts);
            }
        }
        Ok(())
    }

    /// Keeps a copy of a client's first data segment while the backend's handshake is pending
    /// (the first one only, and while there is room); what becomes of the packet itself.
    fn hold<A: Fam>(&mut self, flows: &mut Flows, d: &[u8], m: &Meta, r: Ref, in_fragment: bool, now: u32) -> DropReason
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let Some(doff) = tcp_header(d, &h) else {
            return DropReason::Malformed;
        };
        let t = &d[h.l4..h.end];
        if t.len() == doff || m.tcp_flags & (tf::SYN | tf::FIN) != 0 || in_fragment || self.held.contains_key(&r.raw_key()) {
            return DropReason::SynproxyPending;
        }
        if self.held.len() >= MAX_HELD {
            self.held.retain(|_, v| now.wrapping_sub(v.at) < HELD_TTL);
            if self.held.len() >= MAX_HELD {
                return DropReason::SynproxyPending;
            }
        }
        let held =
            Held { seq: u32::from_be_bytes(t[4..8].try_into().unwrap()), flags: m.tcp_flags & tf::PSH, tsval: scan(t, doff).ts.map(|x| x.0), at: now, payload: t[doff..].to_vec() };
        self.held.insert(r.raw_key(), held);
        flows.counters.events.synproxy_held += 1;
        DropReason::SynproxyHeld
    }

    /// A backend segment of a proxied session, before the usual reply path. `Some`: decided here
    /// (the backend's SYN-ACK, answered with the ACK that completes its handshake); `None`: the
    /// segment was translated for the client and goes on.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    pub(crate) fn backend_segment<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, snap: &Snapshot, b: &mut B, m: &Meta, r: Ref, established: u32, now: u32) -> Option<Verdict>
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let d = b.data();
        let Some(doff) = tcp_header(d, &h) else {
            return Some(Verdict::Drop(DropReason::Malformed));
        };
        let mut a = *flows.table.adj::<A>(r);
        let syn_ack = m.tcp_flags & (tf::SYN | tf::ACK | tf::RST) == tf::SYN | tf::ACK;
        if syn_ack {
            return Some(self.splice::<A, B>(flows, snap, b, m, r, doff, &mut a, established, now));
        }
        let l4 = h.l4;
        let csum = l4 + 16;
        let d = b.data_mut();
        if a.opts & adj_opt::SPLICED == 0 {
            if m.tcp_flags & tf::RST == 0 {
                return Some(Verdict::Drop(DropReason::SynproxyPending));
            }
            // The backend refused: the client gets a reset in its own sequence space.
            self.held.remove(&r.raw_key());
            let seq = u32::from_be_bytes(d[l4 + 4..l4 + 8].try_into().unwrap());
            shift32(d, l4 + 4, csum, a.seq.wrapping_add(1).wrapping_sub(seq));
            return None;
        }
        shift32(d, l4 + 4, csum, a.seq.wrapping_neg());
        if a.opts & adj_opt::TS != 0 && doff > 20 {
            if let Some((_, _, at)) = scan(&d[l4..h.end], doff).ts {
                shift32(d, l4 + at, csum, a.ts.wrapping_neg());
            }
        }
        if a.opts & adj_opt::RESCALE != 0 {
            let w = u16::from_be_bytes([d[l4 + 14], d[l4 + 15]]);
            let bytes = (w as u64) << (a.wscale >> 4);
            let nw = (bytes >> (a.wscale & 0xf)).min(u16::MAX as u64) as u16;
            let c = u16::from_be_bytes([d[csum], d[csum + 1]]);
            d[l4 + 14..l4 + 16].copy_from_slice(&nw.to_be_bytes());
            d[csum..csum + 2].copy_from_slice(&adjust16(c, w, nw).to_be_bytes());
        }
        None
    }

    /// The backend's SYN-ACK: records how its numbers differ from the proxy's and answers with
    /// the ACK that completes its handshake (with the TOA option when the service inserts it).
    #[allow(clippy::too_many_arguments)]
    fn splice<A: Fam, B: PacketBuf>(&mut self, flows: &mut Flows, snap: &Snapshot, b: &mut B, m: &Meta, r: Ref, doff: usize, a: &mut SeqAdj, established: u32, now: u32) -> Verdict
    where
        Session<A>: Zeroable,
    {
        let h = m.hdr();
        let d = b.data();
        let t = &d[h.l4..h.end];
        let o = scan(t, doff);
        let bseq = u32::from_be_bytes(t[4..8].try_into().unwrap());
        let back = u32::from_be_bytes(t[8..12].try_into().unwrap());
        let s = *flows.table.get::<A>(r);
        let Some(be) = snap.backend(s.backend) else {
            return Verdict::Drop(DropReason::BackendRemoved);
        };
        let Some(hop): Option<Hop> = be.hop else {
            return Verdict::Drop(DropReason::NoNeighbor);
        };
        if a.opts & adj_opt::SPLICED == 0 {
            a.seq = bseq.wrapping_sub(a.seq);
            match o.ts {
                Some((val, _, _)) if a.opts & adj_opt::TS != 0 => a.ts = val.wrapping_sub(a.ts),
                _ => a.opts &= !adj_opt::TS,
            }
            if a.wscale != 0xff {
                let bws = o.wscale.unwrap_or(0);
                a.wscale = bws << 4 | WSCALE;
                if bws != WSCALE {
                    a.opts |= adj_opt::RESCALE;
                }
            }
            a.opts |= adj_opt::SPLICED;
            *flows.table.adj_mut::<A>(r) = *a;
            flows.table.get_mut::<A>(r).expire = now.wrapping_add(established);
            flows.table.set_state::<A>(r, state::ESTABLISHED);
            flows.changed(r);
            flows.counters.events.synproxy_spliced += 1;
        }
        // The client's first data, when it came meanwhile and is what the backend expects next
        // (and fits the backend's link with the options below).
        let held = self.held.remove(&r.raw_key()).filter(|x| x.seq == back && h.l3 + A::HEADER + 20 + 32 + x.payload.len() <= h.l3 + hop.mtu as usize);
        // A SYN-ACK retransmitted after the splice (the ACK was lost) is answered again.
        let mut ob = OptBuf::new();
        if a.opts & adj_opt::TS != 0 {
            let tsval = held.as_ref().and_then(|x| x.tsval).unwrap_or(a.client_ts);
            ob.ts(false, tsval, o.ts.map_or(0, |t| t.0));
        }
        let svc = snap.service(s.svc);
        let toa = svc.is_some_and(|v: &Service| v.spec.toa) && s.flags & flag::TOA_DONE == 0;
        if toa {
            let (opt, len) = vectorlb_packet::tcp::toa_option(s.client.bytes(), s.cport);
            ob.put(&opt[..len]);
            while !ob.n.is_multiple_of(4) {
                ob.put(&[option::NOP]);
            }
        }
        let me = A::read(d, h.l3 + A::DST);
        let them = A::read(d, h.l3 + A::SRC);
        let seg = Segment {
            sport: m.dport,
            dport: m.sport,
            seq: back,
            ack: bseq.wrapping_add(1),
            flags: tf::ACK | held.as_ref().map_or(0, |x| x.flags),
            win: a.client_win,
            opts: ob.bytes(),
            payload: held.as_ref().map_or(&[], |x| &x.payload),
        };
        let built = build_segment::<A, B>(b, h.l3, &me, &them, &seg);
        // Without room for the held data, the ACK alone (the client retransmits the data).
        let (built, held) = match built {
            None if held.is_some() => (build_segment::<A, B>(b, h.l3, &me, &them, &Segment { payload: &[], flags: tf::ACK, ..seg }), None),
            b => (b, held),
        };
        let Some(nh) = built else {
            return Verdict::Drop(DropReason::NoRoom);
        };
        if toa {
            flows.table.get_mut::<A>(r).flags |= flag::TOA_DONE;
            flows.counters.events.toa_inserted += 1;
        }
        if held.is_some() {
            flows.counters.events.synproxy_held_sent += 1;
        }
        egress(b, nh.l3, &hop, A::ETHERTYPE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];

    fn flow() -> Flow {
        Flow { client: 0xffff_0a00_0002, vip: 0xffff_0a00_0064, cport: 40000, vport: 80 }
    }

    #[test]
    fn siphash13_of_the_reference_key_and_empty_input() {
        // The reference implementation's SipHash-1-3 of the empty message under key 00..0f.
        let k = [u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]), u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15])];
        assert_eq!(siphash13(k, &[]), 0xabac_0158_050f_c4dc);
    }

    #[test]
    fn a_cookie_checks_for_two_minutes_and_only_for_its_flow() {
        let f = flow();
        for idx in 0..4 {
            let now = 5_000_000;
            let c = cookie(KEY, &f, 1000, now, idx);
            assert_eq!(check(KEY, &f, 1000, c, now), Some(idx));
            assert_eq!(check(KEY, &f, 1000, c, now + 2 * 65_536), Some(idx), "two ticks later");
            assert_eq!(check(KEY, &f, 1000, c, now + 4 * 65_536), None, "too old");
            // (An ISN a few apart only moves the MSS index, as in Linux: harmless, the flow is
            // the same.)
            assert_eq!(check(KEY, &f, 1000 + 0x10000, c, now), None, "another ISN");
            assert_eq!(check(KEY, &Flow { cport: 40001, ..f }, 1000, c, now), None, "another port");
            assert_eq!(check([1, 2], &f, 1000, c, now), None, "another key");
        }
    }

    #[test]
    fn guessed_cookies_rarely_check() {
        let f = flow();
        let mut ok = 0;
        let mut x = 0x9e37_79b9u32;
        for _ in 0..1_000_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ok += check(KEY, &f, 7, x, 1 << 20).is_some() as u32;
        }
        // 4 indices x 3 ages in 2^32: about 3 in a million.
        assert!(ok < 20, "{ok} of a million random cookies checked");
    }

    #[test]
    fn options_are_found_and_a_bad_list_stops_the_walk() {
        let mut t = vec![0u8; 20];
        t.extend_from_slice(&[2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 9, 0, 0, 0, 0, 1, 3, 3, 7]);
        t[12] = ((t.len() / 4) as u8) << 4;
        let o = scan(&t, t.len());
        assert_eq!(o.mss, Some(1460));
        assert_eq!(o.wscale, Some(7));
        assert!(o.sack_ok);
        assert_eq!(o.ts, Some((9, 0, 28)));
        // A length running past the header.
        let mut u = vec![0u8; 20];
        u.extend_from_slice(&[2, 4, 5, 0xb4, 8, 40, 0, 0]);
        let o = scan(&u, u.len());
        assert_eq!((o.mss, o.ts), (Some(1460), None));
        for cut in 0..t.len() {
            let _ = scan(&t[..cut], t.len());
        }
    }
}
