//! Throughput over many established sessions, packets drawn uniformly at random.

use crate::topo;
use crate::BenchError;
use crate::{median, Rng};
use serde::Serialize;
use std::net::IpAddr;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use vectorlb_lb::mem::resident_bytes;
use vectorlb_lb::{Control, HeapBuf, Mode, PacketBuf, Timeouts, Verdict, Worker, WorkerConfig};
use vectorlb_packet::builder::Builder;
use vectorlb_packet::checksum::adjust;
use vectorlb_packet::proto;
use vectorlb_packet::tcp::flags;

#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub v6: bool,
    pub protocol: u8,
    pub sessions: u64,
    pub seconds: f64,
    pub rounds: usize,
    pub batch: usize,
    /// Distinct packets in the pre-built pool the timed loop cycles through.
    pub pool: usize,
    /// Worker threads, each with its own session table holding sessions / threads flows
    /// (share-nothing, as the daemon's workers); their rounds start together.
    pub threads: usize,
    /// Points of the resident-memory curve sampled while the table fills (one thread only).
    pub memory_points: usize,
    /// NetworkPolicies isolating every backend for ingress (0: none): one lets the clients in,
    /// the others each allow another /32 on another port. Sessions are decided when they are
    /// created (the fill); the timed packets are those of established sessions.
    pub policies: usize,
    /// Flows routed to a backend's address (pod to pod: `Worker::route`, no service, no
    /// session) instead of sent to the VIP; under policy their verdict is remembered in the
    /// shared flow table (at most 262,144 flows).
    pub routed: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Fnat,
            v6: false,
            protocol: proto::UDP,
            sessions: 1_000_000,
            seconds: 5.0,
            rounds: 5,
            batch: 256,
            pool: 1 << 20,
            threads: 1,
            memory_points: 10,
            policies: 0,
            routed: false,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub bench: &'static str,
    pub mode: &'static str,
    pub family: u8,
    pub proto: &'static str,
    pub sessions: u64,
    pub frame_bytes: usize,
    pub batch: usize,
    /// Median over rounds, pipeline time only.
    pub mpps: f64,
    pub ns_per_packet: f64,
    pub mpps_rounds: Vec<f64>,
    /// Including the copy of each frame into its buffer (the NIC's work in a real system).
    pub mpps_with_copy: f64,
    pub packets: u64,
    /// Packets not forwarded during the timed rounds (must be 0).
    pub not_forwarded: u64,
    pub bytes_per_session: f64,
    pub resident_bytes: u64,
    pub fill_seconds: f64,
    pub fill_sessions_per_second: f64,
    pub threads: usize,
    /// Each thread's median (the total `mpps` is their sum).
    pub mpps_per_thread: Vec<f64>,
    /// (live sessions, resident bytes above the empty process) while the table fills.
    pub memory_curve: Vec<(u64, u64)>,
    /// Policies selecting the backends (`--policies`).
    pub policies: usize,
}

/// Frame size (without FCS): 60 bytes (64 on the wire) for IPv4, 76 (80 on the wire) for
/// IPv6, as in seed 003's UDP64 / UDP80 tests.
pub fn template(v6: bool, protocol: u8, tcp_flags: u8) -> Vec<u8> {
    template_to(v6, protocol, tcp_flags, &sock(topo::vip(v6), if protocol == proto::TCP { 80 } else { 53 }))
}

/// As [`template`], to `dst` (`ADDR:PORT`).
fn template_to(v6: bool, protocol: u8, tcp_flags: u8, dst: &str) -> Vec<u8> {
    let (a, p) = topo::client(v6, 0);
    let src = sock(a, p);
    let hdr = 14 + if v6 { 40 } else { 20 } + if protocol == proto::TCP { 20 } else { 8 };
    let want = if v6 { 76 } else { 60 };
    let payload = vec![0x42u8; want - hdr];
    let b = if protocol == proto::TCP { Builder::tcp(&src, dst, tcp_flags).seq(1).ack(1) } else { Builder::udp(&src, dst) };
    b.payload(&payload).macs(topo::ROUTER_MAC, topo::EXT_MAC).build()
}

/// The frames the timed loop replays: `o.pool` copies of `tpl`, each from a flow drawn at
/// random; (how many, the frames back to back).
fn frame_pool(o: &Options, tpl: &[u8]) -> (usize, Vec<u8>) {
    let (n, flen) = (o.pool.clamp(1, 1 << 24), tpl.len());
    let mut pool = vec![0u8; n * flen];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for k in 0..n {
        let (a, p) = topo::client(o.v6, rng.below(o.sessions));
        let f = &mut pool[k * flen..(k + 1) * flen];
        f.copy_from_slice(tpl);
        patch_client(f, o.v6, o.protocol, a, p);
    }
    (n, pool)
}

pub fn sock(a: IpAddr, p: u16) -> String {
    match a {
        IpAddr::V4(x) => format!("{x}:{p}"),
        IpAddr::V6(x) => format!("[{x}]:{p}"),
    }
}

/// Rewrites the client address and port of a template frame, patching checksums.
pub fn patch_client(f: &mut [u8], v6: bool, protocol: u8, a: IpAddr, port: u16) {
    let l3 = 14;
    let l4 = l3 + if v6 { 40 } else { 20 };
    let csum = l4 + if protocol == proto::TCP { 16 } else { 6 };
    let (at, new): (usize, Vec<u8>) = match a {
        IpAddr::V4(x) => (l3 + 12, x.octets().to_vec()),
        IpAddr::V6(x) => (l3 + 8, x.octets().to_vec()),
    };
    let old = f[at..at + new.len()].to_vec();
    f[at..at + new.len()].copy_from_slice(&new);
    let mut c = u16::from_be_bytes([f[csum], f[csum + 1]]);
    c = adjust(c, &old, &new);
    if !v6 {
        let h = u16::from_be_bytes([f[l3 + 10], f[l3 + 11]]);
        f[l3 + 10..l3 + 12].copy_from_slice(&adjust(h, &old, &new).to_be_bytes());
    }
    let oldp = [f[l4], f[l4 + 1]];
    f[l4..l4 + 2].copy_from_slice(&port.to_be_bytes());
    c = adjust(c, &oldp, &port.to_be_bytes());
    if c == 0 && protocol == proto::UDP {
        c = 0xffff;
    }
    f[csum..csum + 2].copy_from_slice(&c.to_be_bytes());
}

fn long_timeouts() -> Timeouts {
    let hour = 3_600_000;
    Timeouts { syn: hour, established: hour, fin: hour, time_wait: hour, close: hour, udp: hour }
}

pub fn run(o: &Options) -> Result<Report, BenchError> {
    if o.sessions == 0 || o.sessions > vectorlb_lb::session::MAX_RECORDS as u64 {
        return Err(BenchError::Option(format!("--sessions must be in 1..={}", vectorlb_lb::session::MAX_RECORDS)));
    }
    let n = o.threads;
    if n == 0 || n > 256 || o.sessions < n as u64 {
        return Err(BenchError::Option(format!("--threads must be in 1..=256 and at most --sessions ({})", o.sessions)));
    }
    if o.routed {
        return run_routed(o);
    }
    if n == 1 {
        return run_one(o, None);
    }
    let each = Options { sessions: o.sessions / n as u64, ..o.clone() };
    let barrier = Barrier::new(n);
    let reports: Vec<Result<Report, BenchError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n).map(|_| sc.spawn(|| run_one(&each, Some(&barrier)))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or(Err(BenchError::Panicked))).collect()
    });
    let reports = reports.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut r = reports[0].clone();
    r.threads = n;
    r.mpps_per_thread = reports.iter().map(|x| x.mpps).collect();
    r.mpps = round3(r.mpps_per_thread.iter().sum());
    r.ns_per_packet = round3(1e3 / r.mpps * n as f64);
    r.mpps_with_copy = round3(reports.iter().map(|x| x.mpps_with_copy).sum());
    r.mpps_rounds = (0..r.mpps_rounds.len()).map(|k| round3(reports.iter().map(|x| x.mpps_rounds[k]).sum())).collect();
    r.sessions = each.sessions * n as u64;
    r.packets = reports.iter().map(|x| x.packets).sum();
    r.not_forwarded = reports.iter().map(|x| x.not_forwarded).sum();
    // Each thread measured the whole process after every table was full (the tables grow as
    // their pages are touched): the largest reading over the smallest baseline.
    r.resident_bytes = reports.iter().map(|x| x.resident_bytes).max().unwrap_or(0);
    let base = reports.iter().map(|x| x.resident_bytes - (x.bytes_per_session * x.sessions as f64) as u64).min().unwrap_or(0);
    r.bytes_per_session = round3(r.resident_bytes.saturating_sub(base) as f64 / r.sessions as f64);
    r.fill_seconds = reports.iter().map(|x| x.fill_seconds).fold(0.0, f64::max);
    r.fill_sessions_per_second = (r.sessions as f64 / r.fill_seconds).round();
    Ok(r)
}

/// One thread's run; with a barrier, the threads measure their baseline together, wait for
/// every table to be full, and start their rounds together.
fn run_one(o: &Options, barrier: Option<&Barrier>) -> Result<Report, BenchError> {
    let first_flags = flags::SYN;
    let fill_tpl = template(o.v6, o.protocol, first_flags);
    let run_tpl = template(o.v6, o.protocol, flags::ACK | flags::PSH);
    let flen = run_tpl.len();
    // The pool of frames the timed loop replays: built before the memory baseline.
    let (pool_n, pool) = frame_pool(o, &run_tpl);
    let batch = o.batch.clamp(1, 4096);
    let mut bufs: Vec<HeapBuf> = (0..batch).map(|_| HeapBuf::new(128, 2048)).collect();
    let mut verdicts = vec![Verdict::Kernel; batch];

    let spec = topo::spec(o.mode, o.v6, o.protocol, o.sessions, long_timeouts());
    let control = Control::new(&spec)?;
    if o.policies > 0 {
        control.apply_policy(&policy_spec(o.v6, o.policies)).map_err(|e| BenchError::Option(format!("--policies: {e}")))?;
    }
    if let Some(b) = barrier {
        b.wait();
    }
    let rss0 = resident_bytes().unwrap_or(0);
    let mut cfg = WorkerConfig::new(o.sessions as u32);
    // TCP sessions are opened with SYNs alone: no half-open budget.
    cfg.half_open_permille = 0;
    cfg.batch = batch;
    cfg.table.index_entries = (o.sessions as u32).saturating_mul(if o.mode == Mode::Nat { 2 } else { 1 });
    let mut w = Worker::new(control, cfg)?;

    // The worker clock runs in real milliseconds, as the daemon's does.
    let clock = Instant::now();
    let now = || 1 + clock.elapsed().as_millis() as u32;
    // Fill: the first packet of every flow creates its session.
    let t0 = Instant::now();
    let mut i = 0u64;
    let points = if barrier.is_some() { 0 } else { o.memory_points.min(1000) as u64 };
    let mut curve = vec![(0, resident_bytes().unwrap_or(0).saturating_sub(rss0))];
    let mut mark = 1;
    while i < o.sessions {
        let n = ((o.sessions - i) as usize).min(batch);
        for (k, b) in bufs[..n].iter_mut().enumerate() {
            b.load(&fill_tpl);
            let (a, p) = topo::client(o.v6, i + k as u64);
            patch_client(b.data_mut(), o.v6, o.protocol, a, p);
        }
        w.process(&mut bufs[..n], &mut verdicts[..n], now());
        i += n as u64;
        while points > 0 && mark <= points && i >= o.sessions * mark / points {
            curve.push((w.flows.table.len() as u64, resident_bytes().unwrap_or(0).saturating_sub(rss0)));
            mark += 1;
        }
    }
    let fill = t0.elapsed().as_secs_f64();
    if let Some(b) = barrier {
        b.wait();
    }
    let rss1 = resident_bytes().unwrap_or(0);
    if w.flows.table.len() as u64 != o.sessions {
        let drops: Vec<String> =
            vectorlb_lb::DropReason::ALL.iter().filter(|r| w.flows.counters.dropped(**r) > 0).map(|r| format!("{}={}", r.name(), w.flows.counters.dropped(*r))).collect();
        return Err(BenchError::Fill { filled: w.flows.table.len() as u64, wanted: o.sessions, drops: drops.join(" ") });
    }

    // Timed rounds.
    let rounds = o.rounds.max(1);
    let per_round = Duration::from_secs_f64((o.seconds / rounds as f64).max(0.05));
    let mut mpps = Vec::new();
    let mut with_copy = Vec::new();
    let mut packets = 0u64;
    let tx_before = w.flows.counters.events.tx;
    let mut k = 0usize;
    for _ in 0..rounds {
        let mut pipe = Duration::ZERO;
        let start = Instant::now();
        let mut n = 0u64;
        loop {
            for b in bufs.iter_mut() {
                b.load(&pool[k * flen..(k + 1) * flen]);
                k += 1;
                if k == pool_n {
                    k = 0;
                }
            }
            let ms = now();
            let t = Instant::now();
            crate::timed_process(&mut w, &mut bufs, &mut verdicts, ms);
            pipe += t.elapsed();
            n += batch as u64;
            if n.is_multiple_of(batch as u64 * 64) && start.elapsed() >= per_round {
                break;
            }
        }
        let wall = start.elapsed();
        packets += n;
        mpps.push(n as f64 / pipe.as_secs_f64() / 1e6);
        with_copy.push(n as f64 / wall.as_secs_f64() / 1e6);
    }
    let forwarded = w.flows.counters.events.tx - tx_before;
    let m = median(&mpps);
    Ok(Report {
        bench: "pipeline",
        mode: o.mode.name(),
        family: if o.v6 { 6 } else { 4 },
        proto: if o.protocol == proto::TCP { "tcp" } else { "udp" },
        sessions: o.sessions,
        frame_bytes: flen + 4,
        batch,
        mpps: round3(m),
        ns_per_packet: round3(1e3 / m),
        mpps_rounds: mpps.iter().map(|x| round3(*x)).collect(),
        mpps_with_copy: round3(median(&with_copy)),
        packets,
        not_forwarded: packets - forwarded,
        bytes_per_session: round3(rss1.saturating_sub(rss0) as f64 / o.sessions as f64),
        resident_bytes: rss1,
        fill_seconds: round3(fill),
        fill_sessions_per_second: (o.sessions as f64 / fill).round(),
        threads: 1,
        mpps_per_thread: vec![round3(m)],
        memory_curve: if points > 0 { curve } else { Vec::new() },
        policies: o.policies,
    })
}

/// Routed flows (`--routed`): each flow's first packet routed once (decided and, under
/// policy, remembered), then packets drawn at random from the flows, timed.
fn run_routed(o: &Options) -> Result<Report, BenchError> {
    let cap = vectorlb_lb::policy::FLOWS as u64;
    if o.threads != 1 || o.sessions > cap {
        return Err(BenchError::Option(format!("--routed runs one thread and at most {cap} flows")));
    }
    let dst = sock(topo::backend(o.v6, 0), 8080);
    let (fill_tpl, run_tpl) = (template_to(o.v6, o.protocol, flags::SYN, &dst), template_to(o.v6, o.protocol, flags::ACK | flags::PSH, &dst));
    let flen = run_tpl.len();
    let (pool_n, pool) = frame_pool(o, &run_tpl);
    let batch = o.batch.clamp(1, 4096);
    let mut bufs: Vec<HeapBuf> = (0..batch).map(|_| HeapBuf::new(128, 2048)).collect();
    let mut verdicts = vec![Verdict::Kernel; batch];
    let control = Control::new(&topo::spec(o.mode, o.v6, o.protocol, 1, long_timeouts()))?;
    if o.policies > 0 {
        control.apply_policy(&policy_spec(o.v6, o.policies)).map_err(|e| BenchError::Option(format!("--policies: {e}")))?;
    }
    let mut cfg = WorkerConfig::new(1024);
    cfg.batch = batch;
    let mut w = Worker::new(control, cfg)?;
    let clock = Instant::now();
    let now = || 1 + clock.elapsed().as_millis() as u32;
    let t0 = Instant::now();
    let mut routed = 0u64;
    for i in 0..o.sessions {
        let b = &mut bufs[0];
        b.load(&fill_tpl);
        let (a, p) = topo::client(o.v6, i);
        patch_client(b.data_mut(), o.v6, o.protocol, a, p);
        routed += matches!(w.route(b, now()), Verdict::Tx(_)) as u64;
    }
    let fill = t0.elapsed().as_secs_f64();
    if routed != o.sessions {
        return Err(BenchError::Fill { filled: routed, wanted: o.sessions, drops: "first packets not routed".into() });
    }
    let rounds = o.rounds.max(1);
    let per_round = Duration::from_secs_f64((o.seconds / rounds as f64).max(0.05));
    let (mut mpps, mut with_copy, mut packets, mut forwarded, mut k) = (Vec::new(), Vec::new(), 0u64, 0u64, 0usize);
    for _ in 0..rounds {
        let (mut pipe, start, mut n) = (Duration::ZERO, Instant::now(), 0u64);
        loop {
            for b in bufs.iter_mut() {
                b.load(&pool[k * flen..(k + 1) * flen]);
                k = if k + 1 == pool_n { 0 } else { k + 1 };
            }
            let ms = now();
            let t = Instant::now();
            crate::timed_route(&mut w, &mut bufs, &mut verdicts, ms);
            pipe += t.elapsed();
            forwarded += verdicts.iter().filter(|v| matches!(v, Verdict::Tx(_))).count() as u64;
            n += batch as u64;
            if n.is_multiple_of(batch as u64 * 64) && start.elapsed() >= per_round {
                break;
            }
        }
        packets += n;
        mpps.push(n as f64 / pipe.as_secs_f64() / 1e6);
        with_copy.push(n as f64 / start.elapsed().as_secs_f64() / 1e6);
    }
    let m = median(&mpps);
    Ok(Report {
        bench: "pipeline_routed",
        mode: "routed",
        family: if o.v6 { 6 } else { 4 },
        proto: if o.protocol == proto::TCP { "tcp" } else { "udp" },
        sessions: o.sessions,
        frame_bytes: flen + 4,
        batch,
        mpps: round3(m),
        ns_per_packet: round3(1e3 / m),
        mpps_rounds: mpps.iter().map(|x| round3(*x)).collect(),
        mpps_with_copy: round3(median(&with_copy)),
        packets,
        not_forwarded: packets - forwarded,
        bytes_per_session: 0.0,
        resident_bytes: resident_bytes().unwrap_or(0),
        fill_seconds: round3(fill),
        fill_sessions_per_second: (o.sessions as f64 / fill).round(),
        threads: 1,
        mpps_per_thread: vec![round3(m)],
        memory_curve: Vec::new(),
        policies: o.policies,
    })
}

/// `n` NetworkPolicies over the backends, as the controller would compile them: the clients'
/// range (and the full-NAT local addresses) is identity 1 and policy 0 lets it in on every port; policy k (1..n) lets identity
/// 1 + k (one /32 of 172.16.0.0/12, or of fd00:172::/32) in on port 10,000 + k % 50,000.
pub fn policy_spec(v6: bool, n: usize) -> vectorlb_lb::policy::PolicySpec {
    use vectorlb_lb::policy::{Action, DirectionSpec, EndpointSpec, PolicySpec, Ports, Rule};
    // The clients, and the full-NAT local addresses (what a backend sees of them in fnat).
    let clients: [(IpAddr, u8); 2] =
        if v6 { [("2001:db8:c::".parse().unwrap(), 48), ("2001:db8:2::".parse().unwrap(), 48)] } else { [("100.64.0.0".parse().unwrap(), 10), ("10.2.0.0".parse().unwrap(), 16)] };
    let filler = |k: usize| -> IpAddr {
        let k = k as u32;
        if v6 {
            IpAddr::from(std::net::Ipv6Addr::new(0xfd00, 0x172, 0, 0, 0, 0, (k >> 16) as u16, k as u16))
        } else {
            IpAddr::from((0xac10_0000u32 + k).to_be_bytes())
        }
    };
    let mut prefixes = vec![(clients[0].0, clients[0].1, 1), (clients[1].0, clients[1].1, 1)];
    let mut allow = vec![Rule { peers: Some(vec![1]), ports: Vec::new(), action: Action::Allow, policy: 0 }];
    for k in 1..n {
        prefixes.push((filler(k), if v6 { 128 } else { 32 }, 1 + k as u32));
        let port = 10_000 + (k % 50_000) as u16;
        allow.push(Rule { peers: Some(vec![1 + k as u32]), ports: vec![Ports { proto: proto::TCP, lo: port, hi: port }], action: Action::Allow, policy: k as u32 });
    }
    let ingress = DirectionSpec { isolated_by: Some(0), allow, ..Default::default() };
    PolicySpec {
        policies: (0..n).map(|k| format!("NetworkPolicy/bench/p{k}")).collect(),
        identities: Vec::new(),
        prefixes,
        endpoints: (0..topo::BACKENDS)
            .map(|i| EndpointSpec { name: format!("bench/backend-{i}"), addrs: vec![topo::backend(v6, i)], ingress: ingress.clone(), egress: DirectionSpec::default() })
            .collect(),
    }
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(threads: usize) -> Options {
        Options { sessions: 20_000, seconds: 0.1, rounds: 2, pool: 4096, threads, memory_points: 4, ..Default::default() }
    }

    #[test]
    fn one_thread_forwards_everything_and_samples_memory() {
        let _serial = crate::MEMORY_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let r = run(&small(1)).unwrap();
        assert_eq!((r.threads, r.sessions, r.not_forwarded), (1, 20_000, 0));
        assert!(r.packets > 0 && r.mpps > 0.0);
        // Sampled at the first batch boundary past each quarter of the fill.
        assert_eq!(r.memory_curve.len(), 5, "{:?}", r.memory_curve);
        for (k, p) in r.memory_curve.iter().enumerate() {
            let mark = 5_000 * k as u64;
            assert!(p.0 >= mark && p.0 < mark + 256, "{:?}", r.memory_curve);
        }
        assert!(r.memory_curve.windows(2).all(|w| w[1].1 >= w[0].1), "{:?}", r.memory_curve);
    }

    #[test]
    fn threads_each_own_a_table_and_add_up() {
        let _serial = crate::MEMORY_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let r = run(&small(2)).unwrap();
        assert_eq!((r.threads, r.sessions, r.not_forwarded), (2, 20_000, 0));
        assert_eq!(r.mpps_per_thread.len(), 2);
        assert!((r.mpps - r.mpps_per_thread.iter().sum::<f64>()).abs() < 0.01);
        assert!(r.memory_curve.is_empty());
        assert!(run(&Options { threads: 0, ..small(1) }).is_err());
        assert!(run(&Options { threads: 3, sessions: 2, ..small(1) }).is_err());
    }

    #[test]
    fn sessions_under_policy_are_allowed_once_and_forward_like_the_rest() {
        let _serial = crate::MEMORY_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for v6 in [false, true] {
            let r = run(&Options { policies: 1000, v6, protocol: proto::TCP, mode: Mode::Nat, ..small(1) }).unwrap();
            assert_eq!((r.sessions, r.not_forwarded, r.policies), (20_000, 0, 1000));
        }
        // The set is what it says: the clients reach every backend on any port, a filler's /32
        // only its port, and without the clients' rule a client is denied.
        let key = vectorlb_lb::addr::key;
        let spec = policy_spec(false, 10);
        assert_eq!(spec.prefixes.len(), 11);
        let control = Control::new(&topo::spec(Mode::Fnat, false, proto::UDP, 10, long_timeouts())).unwrap();
        control.apply_policy(&spec).unwrap();
        let (client, backend) = (key(topo::client(false, 7).0), key(topo::backend(false, 3)));
        let filler = key("172.16.0.4".parse().unwrap());
        let set = control.policy();
        assert_eq!(set.enforced(), 16);
        assert_eq!(set.decide(client, backend, proto::UDP, 8080), vectorlb_lb::policy::Decision::Allowed);
        assert_eq!(set.decide(filler, backend, proto::TCP, 10_004), vectorlb_lb::policy::Decision::Allowed);
        assert!(matches!(set.decide(filler, backend, proto::TCP, 10_005), vectorlb_lb::policy::Decision::Denied { .. }));
        // Routed flows (pod to pod) too, remembered once under policy.
        for policies in [0, 100] {
            let r = run(&Options { routed: true, policies, sessions: 5_000, protocol: proto::TCP, ..small(1) }).unwrap();
            assert_eq!((r.bench, r.sessions, r.not_forwarded), ("pipeline_routed", 5_000, 0));
            assert!(r.packets > 0);
        }
        assert!(run(&Options { routed: true, sessions: 1 << 20, ..small(1) }).is_err());
        let mut denying = spec.clone();
        denying.endpoints[3].ingress.allow.remove(0);
        control.apply_policy(&denying).unwrap();
        assert!(matches!(control.policy().decide(client, backend, proto::UDP, 8080), vectorlb_lb::policy::Decision::Denied { .. }));
    }
}
