//! Connections per second: complete TCP lifecycles through the pipeline.
//!
//! Each of `concurrency` connection slots walks the HTTP/1.0 pattern of seed 003 Figure 14 —
//! SYN, SYN-ACK, ACK, request, 1-byte response, server FIN/ACK, client ACK, client FIN/ACK,
//! server's last ACK — one packet per batch, then starts a new connection from the next client
//! port. Server packets are addressed from what the LB actually sent (backend chosen, full-NAT
//! local address and port), so every packet must be translated correctly to go on. Sessions are
//! deleted at the last ACK (TIME-WAIT timeout 0, as HDSLB does in that test).

use crate::pipeline::{round3, sock};
use crate::BenchError;
use crate::{median, topo};
use serde::Serialize;
use std::net::IpAddr;
use std::time::{Duration, Instant};
use vectorlb_lb::{Control, HeapBuf, Mode, PacketBuf, Timeouts, Verdict, Worker, WorkerConfig};
use vectorlb_packet::builder::Builder;
use vectorlb_packet::checksum::adjust;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags::*;

#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub v6: bool,
    pub seconds: f64,
    pub rounds: usize,
    pub concurrency: usize,
    pub fill: Fill,
}

/// What the session table holds before the measurement ([`FILL_TABLE`] sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// A table just large enough; TIME_WAIT 0 (sessions end at the last ACK, as HDSLB's test).
    None,
    /// Half full of established sessions.
    Half,
    /// Full of TIME_WAIT sessions, and the measured connections keep theirs (2 s): each new
    /// connection evicts the oldest closed one.
    Closed,
    /// Full of established sessions: each new connection is refused.
    Established,
}

impl Fill {
    fn name(self) -> &'static str {
        match self {
            Fill::None => "none",
            Fill::Half => "half",
            Fill::Closed => "closed",
            Fill::Established => "established",
        }
    }
}

/// The table's size when it is filled first.
pub const FILL_TABLE: u32 = 1 << 18;

impl Default for Options {
    fn default() -> Self {
        Options { mode: Mode::Fnat, v6: false, seconds: 5.0, rounds: 5, concurrency: 256, fill: Fill::None }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub bench: &'static str,
    pub mode: &'static str,
    pub family: u8,
    pub packets_per_connection: u32,
    /// Median over rounds, pipeline time only.
    pub connections_per_second: f64,
    pub cps_rounds: Vec<f64>,
    /// Including the generator's time (building every frame).
    pub wall_connections_per_second: f64,
    pub ns_per_packet: f64,
    pub connections: u64,
    pub sessions_created: u64,
    pub sessions_removed: u64,
    pub sessions_left: u32,
    /// Connections that did not complete: SYNs refused by a full table (`fill` established).
    pub errors: u64,
    pub fill: &'static str,
    /// The table's size and the sessions put in it before measuring.
    pub table_sessions: u32,
    pub filled: u32,
    pub closed_evicted: u64,
    pub refused_table_full: u64,
    /// Time in the pipeline per SYN of a new connection (the first packet of each), whether it
    /// opened a session, evicted one or was refused.
    pub ns_per_syn: f64,
}

const STEPS: usize = 9;
/// (from the client?, TCP flags, payload bytes)
const PATTERN: [(bool, u8, usize); STEPS] = [
    (true, SYN, 0),
    (false, SYN | ACK, 0),
    (true, ACK, 0),
    (true, PSH | ACK, 18),
    (false, PSH | ACK, 1),
    (false, FIN | ACK, 0),
    (true, ACK, 0),
    (true, FIN | ACK, 0),
    (false, ACK, 0),
];

struct Slot {
    client: IpAddr,
    port: u16,
    step: usize,
    backend: Vec<u8>,
    bport: u16,
    /// Where the server's packets go: the local address and port (full NAT) or the client.
    peer: Vec<u8>,
    pport: u16,
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(x) => x.octets().to_vec(),
        IpAddr::V6(x) => x.octets().to_vec(),
    }
}

/// Rewrites the source (`src`) or destination address and port of a TCP frame.
fn patch(f: &mut [u8], v6: bool, src: bool, addr: &[u8], port: u16) {
    let l3 = 14;
    let l4 = l3 + if v6 { 40 } else { 20 };
    let at = l3
        + if v6 {
            if src {
                8
            } else {
                24
            }
        } else if src {
            12
        } else {
            16
        };
    let pat = l4 + if src { 0 } else { 2 };
    let old = f[at..at + addr.len()].to_vec();
    f[at..at + addr.len()].copy_from_slice(addr);
    let mut c = u16::from_be_bytes([f[l4 + 16], f[l4 + 17]]);
    c = adjust(c, &old, addr);
    if !v6 {
        let h = u16::from_be_bytes([f[l3 + 10], f[l3 + 11]]);
        f[l3 + 10..l3 + 12].copy_from_slice(&adjust(h, &old, addr).to_be_bytes());
    }
    let oldp = [f[pat], f[pat + 1]];
    f[pat..pat + 2].copy_from_slice(&port.to_be_bytes());
    c = adjust(c, &oldp, &port.to_be_bytes());
    f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
}

pub fn run(o: &Options) -> Result<Report, BenchError> {
    if !matches!(o.mode, Mode::Nat | Mode::Fnat) {
        return Err(BenchError::Option("cps measures nat or fnat (the modes whose replies cross the LB)".into()));
    }
    let v6 = o.v6;
    let conc = o.concurrency.clamp(1, 4096);
    let filling = o.fill != Fill::None;
    // Sessions end at the last ACK (TIME_WAIT 0), but with a table full of closed sessions:
    // there every connection keeps its TIME_WAIT (2 s), so that the table stays full and every
    // new connection evicts one.
    let timeouts = if o.fill == Fill::Closed { Timeouts::default() } else { Timeouts { time_wait: 0, close: 0, ..Timeouts::default() } };
    let table = if filling { FILL_TABLE } else { (conc * 4) as u32 };
    // Local ports for the filled sessions and as many again for the measured ones.
    let spec = topo::spec(o.mode, v6, proto::TCP, conc as u64 * 64 + if filling { 2 * table as u64 } else { 0 }, timeouts);
    let control = Control::new(&spec)?;
    let mut cfg = WorkerConfig::new(table);
    cfg.batch = conc;
    cfg.table.index_entries = table * 2;
    let mut w = Worker::new(control, cfg)?;
    let filled = fill(&mut w, o, &spec, table)?;

    // Templates: client packets from client 0 to the VIP; server packets from backend 0.
    let (c0, p0) = topo::client(v6, 0);
    let vip = sock(topo::vip(v6), 80);
    let be0 = sock(topo::backend(v6, 0), 8080);
    let tpl: Vec<Vec<u8>> = PATTERN
        .iter()
        .map(|&(from_client, fl, len)| {
            let payload = vec![b'x'; len];
            let b = if from_client {
                Builder::tcp(&sock(c0, p0), &vip, fl).macs(topo::ROUTER_MAC, topo::EXT_MAC)
            } else {
                Builder::tcp(&be0, &sock(c0, p0), fl).macs([2, 0, 0, 0, 2, 0], topo::INT_MAC)
            };
            b.seq(1).ack(1).payload(&payload).build()
        })
        .collect();
    let mut slots: Vec<Slot> = (0..conc)
        .map(|j| {
            let (a, p) = topo::client(v6, j as u64 * 50_000);
            Slot { client: a, port: p, step: 0, backend: vec![], bport: 0, peer: vec![], pport: 0 }
        })
        .collect();
    let mut bufs: Vec<HeapBuf> = (0..conc).map(|_| HeapBuf::new(128, 256)).collect();
    let mut verdicts = vec![Verdict::Kernel; conc];
    let l3 = 14;
    let l4 = l3 + if v6 { 40 } else { 20 };
    let (src_at, dst_at, alen) = if v6 { (l3 + 8, l3 + 24, 16) } else { (l3 + 12, l3 + 16, 4) };

    let rounds = o.rounds.max(1);
    let per_round = Duration::from_secs_f64((o.seconds / rounds as f64).max(0.05));
    let mut now = 1u32;
    let mut connections = 0u64;
    let mut errors = 0u64;
    let mut packets = 0u64;
    let mut cps = Vec::new();
    let mut wall_cps = Vec::new();
    let mut pipe_total = Duration::ZERO;
    // The time of batches of SYNs only (every slot at its first step), and their number.
    let (mut syn_time, mut syns) = (Duration::ZERO, 0u64);
    for _ in 0..rounds {
        let start = Instant::now();
        let mut pipe = Duration::ZERO;
        let mut done = 0u64;
        let mut batches = 0u64;
        loop {
            for (s, b) in slots.iter().zip(bufs.iter_mut()) {
                let (from_client, _, _) = PATTERN[s.step];
                b.load(&tpl[s.step]);
                let f = b.data_mut();
                let caddr = addr_bytes(s.client);
                if from_client {
                    patch(f, v6, true, &caddr, s.port);
                } else {
                    patch(f, v6, true, &s.backend, s.bport);
                    patch(f, v6, false, &s.peer, s.pport);
                }
            }
            let all_syns = slots.iter().all(|s| s.step == 0);
            let t = Instant::now();
            crate::timed_process(&mut w, &mut bufs, &mut verdicts, now);
            let took = t.elapsed();
            pipe += took;
            if all_syns {
                syn_time += took;
                syns += conc as u64;
            }
            now = now.wrapping_add(1);
            for ((s, b), v) in slots.iter_mut().zip(bufs.iter()).zip(verdicts.iter()) {
                if !matches!(v, Verdict::Tx(_)) {
                    // Start over with a fresh connection.
                    errors += 1;
                    s.step = 0;
                    s.port = if s.port >= 59_999 { 10_000 } else { s.port + 1 };
                    continue;
                }
                if s.step == 0 {
                    let d = b.data();
                    s.backend = d[dst_at..dst_at + alen].to_vec();
                    s.bport = u16::from_be_bytes([d[l4 + 2], d[l4 + 3]]);
                    s.peer = d[src_at..src_at + alen].to_vec();
                    s.pport = u16::from_be_bytes([d[l4], d[l4 + 1]]);
                }
                s.step += 1;
                if s.step == STEPS {
                    done += 1;
                    s.step = 0;
                    s.port = if s.port >= 59_999 { 10_000 } else { s.port + 1 };
                }
            }
            batches += 1;
            if batches.is_multiple_of(64) && start.elapsed() >= per_round {
                break;
            }
        }
        packets += batches * conc as u64;
        connections += done;
        pipe_total += pipe;
        cps.push(done as f64 / pipe.as_secs_f64());
        wall_cps.push(done as f64 / start.elapsed().as_secs_f64());
    }
    Ok(Report {
        bench: "cps",
        mode: o.mode.name(),
        family: if v6 { 6 } else { 4 },
        packets_per_connection: STEPS as u32,
        connections_per_second: median(&cps).round(),
        cps_rounds: cps.iter().map(|x| x.round()).collect(),
        wall_connections_per_second: median(&wall_cps).round(),
        ns_per_packet: round3(pipe_total.as_secs_f64() * 1e9 / packets as f64),
        connections,
        sessions_created: w.flows.counters.events.sessions_created,
        sessions_removed: w.flows.table.stats.removed,
        sessions_left: w.flows.table.len(),
        errors,
        fill: o.fill.name(),
        table_sessions: table,
        filled,
        closed_evicted: w.flows.counters.events.closed_evicted,
        refused_table_full: w.flows.counters.dropped(vectorlb_lb::DropReason::TableFull),
        ns_per_syn: if syns > 0 { round3(syn_time.as_secs_f64() * 1e9 / syns as f64) } else { 0.0 },
    })
}

/// Fills the table as `o.fill` says (full-NAT sessions of clients the measurement never
/// uses, each with its own local port); how many went in.
fn fill(w: &mut Worker, o: &Options, spec: &vectorlb_lb::LbSpec, table: u32) -> Result<u32, BenchError> {
    use vectorlb_lb::session::state;
    let (n, st) = match o.fill {
        Fill::None => return Ok(0),
        Fill::Half => (table / 2, state::ESTABLISHED),
        Fill::Closed => (table, state::TIME_WAIT),
        Fill::Established => (table, state::ESTABLISHED),
    };
    let laddrs = &spec.services[0].local_addrs;
    let mut put = 0;
    for i in 0..n as u64 {
        // Clients from host 8,192 on: the measured slots use hosts below 4,096.
        let (client, cport) = topo::client(o.v6, (8192 * 50_000) + i);
        let local = (o.mode == Mode::Fnat).then(|| (laddrs[(i / topo::PORTS_PER_LADDR) as usize], 1024 + (i % topo::PORTS_PER_LADDR) as u16));
        let r = vectorlb_lb::sync::SyncRecord {
            proto: proto::TCP,
            vip: topo::vip(o.v6),
            vport: 80,
            client,
            cport,
            backend: topo::backend(o.v6, (i % topo::BACKENDS as u64) as u32),
            bport: 8080,
            local,
            state: st,
            flags: 0,
            expire_in: 600_000,
            adj: Default::default(),
        };
        put += w.install(&r, 1).is_ok() as u32;
    }
    if put < n {
        return Err(BenchError::Fill { filled: put as u64, wanted: n as u64, drops: "the table refused sessions".into() });
    }
    Ok(put)
}
