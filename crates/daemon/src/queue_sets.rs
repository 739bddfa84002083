//! Application queue sets in the data plane (seed 002, ADQ; docs/queue-sets.md).
//!
//! A set's services are served by its dedicated workers only, and those workers serve nothing
//! else: a worker that receives a packet toward a service (the forward direction: client to
//! VIP) of another group hands it to that group's worker for the flow (a hash of the client's
//! address and port, the same on every worker) before the pipeline runs on anything, unless it
//! holds the flow's session already (so a reload that moves a service between groups loses no
//! connection; new flows go to the new group). Replies need no steering: full NAT replies come
//! back to the worker that owns their local port (the pipeline hands them on), and NAT replies
//! are handled where their session is. A set's workers always busy-poll, and what they send may
//! be rate limited (a token bucket in bits and packets per second, the set's rate shared evenly
//! among its workers).
//!
//! On AF_XDP ports the kernel puts a packet on the queue it arrived on (an AF_XDP socket only
//! takes its own queue's packets), so the hand-off happens in the receiving worker; on NICs
//! with flow rules, `vectorlb adq` puts a set's traffic on its own queues before that.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use vectorlb_api::model::{Quantiles, QueueSetQueues};
use vectorlb_config::{QueueSetSpec, RateSpec};
use vectorlb_lb::Worker;

/// The sets and who serves what. Groups are numbered: set `i` is group `i`, the default set
/// (everything outside the sets) is group `sets.len()`.
#[derive(Debug)]
pub struct QueueSets {
    pub specs: Vec<QueueSetSpec>,
    /// Per worker: its group.
    pub worker_group: Vec<usize>,
    /// Per group: its workers.
    pub members: Vec<Vec<u16>>,
    by_service: HashMap<(IpAddr, u16, u8), usize>,
}

impl QueueSets {
    /// The sets of a checked configuration (workers exist, each in one set, at least one left
    /// for the default group) for `workers` workers.
    pub fn new(specs: &[QueueSetSpec], workers: u16) -> Arc<QueueSets> {
        let default = specs.len();
        let mut worker_group = vec![default; workers as usize];
        let mut members = vec![Vec::new(); specs.len() + 1];
        let mut by_service = HashMap::new();
        for (i, s) in specs.iter().enumerate() {
            for &w in &s.workers {
                if let Some(g) = worker_group.get_mut(w as usize) {
                    *g = i;
                }
            }
            for &svc in &s.services {
                by_service.insert(svc, i);
            }
        }
        for (w, g) in worker_group.iter().enumerate() {
            members[*g].push(w as u16);
        }
        Arc::new(QueueSets { specs: specs.to_vec(), worker_group, members, by_service })
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub fn default_group(&self) -> usize {
        self.specs.len()
    }

    /// The group of the service (VIP, port, protocol).
    pub fn group_of(&self, vip: IpAddr, port: u16, proto: u8) -> usize {
        self.by_service.get(&(vip, port, proto)).copied().unwrap_or(self.specs.len())
    }

    /// Name of a group ("default" for the default set).
    pub fn name(&self, group: usize) -> &str {
        self.specs.get(group).map_or("default", |s| s.name.as_str())
    }
}

/// Upper bounds of the time histograms' buckets, microseconds (a last bucket holds the rest).
pub const TIME_BOUNDS_US: [u64; 13] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000];
/// Upper bounds of the queue-depth histogram's buckets, packets (a last bucket holds the rest).
pub const DEPTH_BOUNDS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// A histogram with fixed buckets: counts per bucket (`N` bounds and the rest), their sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Histogram<const N: usize> {
    pub counts: [u64; N],
    pub over: u64,
    pub sum: u64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Histogram { counts: [0; N], over: 0, sum: 0 }
    }
}

impl<const N: usize> Histogram<N> {
    /// Counts `n` samples of `value` (bounds in the same unit as `value`).
    #[inline]
    pub fn add(&mut self, bounds: &[u64; N], value: u64, n: u64) {
        match bounds.iter().position(|&b| value <= b) {
            Some(i) => self.counts[i] += n,
            None => self.over += n,
        }
        self.sum = self.sum.wrapping_add(value.saturating_mul(n));
    }

    pub fn merge(&mut self, o: &Self) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.over += o.over;
        self.sum = self.sum.wrapping_add(o.sum);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.over
    }

    /// The upper bound of the bucket holding quantile `q` (0-1); `None` when empty or when
    /// it falls past the last bound.
    pub fn quantile_bound(&self, bounds: &[u64; N], q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(bounds[i]);
            }
        }
        None
    }

    /// Prometheus buckets: `(le, cumulative count)`, ending with `+Inf`.
    pub fn cumulative<'a>(&'a self, bounds: &'a [u64; N], divisor: f64) -> impl Iterator<Item = (f64, u64)> + 'a {
        let mut acc = 0;
        bounds
            .iter()
            .zip(&self.counts)
            .map(move |(b, c)| {
                acc += c;
                (*b as f64 / divisor, acc)
            })
            .chain(std::iter::once((f64::INFINITY, self.count())))
    }
}

/// What a worker of a queue set measures of its queues (kept only while there are sets):
/// - `wait`: per packet received, the time since the worker's previous polling round began:
///   how long the packet may have waited on its queue before its worker looked (an upper
///   bound, unless the previous round left packets behind, which `depth` shows);
/// - `residence`: per packet received, from its round's start to the end of the round's
///   transmit (the pipeline, the hand-offs and the send);
/// - `depth`: per receive that found packets, those taken plus those still waiting where the
///   queue can tell (a hand-off ring can; AF_XDP and AF_PACKET ports cannot, and count what
///   was taken, at most a burst).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Nanoseconds, in buckets of [`TIME_BOUNDS_US`] (compared in ns).
    pub wait: Histogram<13>,
    pub residence: Histogram<13>,
    pub depth: Histogram<11>,
}

/// [`TIME_BOUNDS_US`] in nanoseconds.
pub const TIME_BOUNDS_NS: [u64; 13] = {
    let mut b = TIME_BOUNDS_US;
    let mut i = 0;
    while i < b.len() {
        b[i] *= 1000;
        i += 1;
    }
    b
};

impl QueueStats {
    pub fn merge(&mut self, o: &QueueStats) {
        self.wait.merge(&o.wait);
        self.residence.merge(&o.residence);
        self.depth.merge(&o.depth);
    }

    /// The API's view: quantiles as bucket bounds (µs, packets).
    pub fn summary(&self) -> QueueSetQueues {
        fn q<const N: usize>(h: &Histogram<N>, bounds: &[u64; N], div: u64) -> Quantiles {
            let n = h.count();
            Quantiles {
                p50: h.quantile_bound(bounds, 0.5).map(|b| b / div),
                p99: h.quantile_bound(bounds, 0.99).map(|b| b / div),
                p999: h.quantile_bound(bounds, 0.999).map(|b| b / div),
                mean: if n == 0 { 0.0 } else { h.sum as f64 / n as f64 / div as f64 },
            }
        }
        QueueSetQueues {
            packets: self.wait.count(),
            wait_us: q(&self.wait, &TIME_BOUNDS_NS, 1000),
            residence_us: q(&self.residence, &TIME_BOUNDS_NS, 1000),
            receives: self.depth.count(),
            depth: q(&self.depth, &DEPTH_BOUNDS, 1),
        }
    }
}

/// The XDP program's index of a group (the default set's is its own).
pub fn xdp_index(sets: &QueueSets, group: usize) -> u32 {
    if group >= sets.default_group() {
        vectorlb_dpdk::xdp::QS_DEFAULT
    } else {
        group as u32
    }
}

/// The queue sets' flow rules: on ports with `rte_flow` (NICs), each set's services go to the
/// queues of its workers (worker `w` owns queue `w`) and, at a lower priority, everything else
/// to the default set's workers, so the NIC itself keeps the groups apart. A port whose
/// driver refuses a rule gets none (all or nothing; said once in the log): there the
/// receiving worker hands packets on, as without rules.
#[derive(Default)]
pub struct Flows {
    ports: Vec<(usize, String, Arc<vectorlb_dpdk::EthPort>)>,
    state: std::sync::Mutex<FlowState>,
}

#[derive(Default)]
struct FlowState {
    rules: Vec<vectorlb_dpdk::FlowRule>,
    /// Rules installed per group (the default set's last).
    per_group: Vec<u32>,
    /// Ports whose driver refused (said once in the log; tried again at each sync).
    refused: Vec<usize>,
}

impl Flows {
    pub fn new(ports: Vec<(usize, String, Arc<vectorlb_dpdk::EthPort>)>) -> Flows {
        Flows { ports, state: Default::default() }
    }

    /// Replaces the rules with those of `sets` (at start and when a reload changes them).
    pub fn sync(&self, sets: &QueueSets) {
        if self.ports.is_empty() {
            return;
        }
        let mut st = crate::lock(&self.state);
        st.rules.clear();
        st.per_group = vec![0; sets.members.len()];
        if sets.is_empty() {
            return;
        }
        for (i, name, port) in &self.ports {
            let mut rules = Vec::new();
            let mut counts = vec![0u32; sets.members.len()];
            // (priority, destination, group)
            type Rule = (u32, Option<(IpAddr, u8, u16)>, usize);
            let mut wanted: Vec<Rule> = Vec::new();
            for (g, spec) in sets.specs.iter().enumerate() {
                for &(vip, p, proto) in &spec.services {
                    wanted.push((0, Some((vip, proto, p)), g));
                }
            }
            wanted.push((1, None, sets.default_group()));
            let mut failed = None;
            for (prio, dst, g) in wanted {
                match port.flow_to_queues(prio, dst, &sets.members[g]) {
                    Ok(r) => {
                        rules.push(r);
                        counts[g] += 1;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            match failed {
                None => {
                    st.refused.retain(|p| p != i);
                    tracing::info!("ports[{i}] ({name}): {} flow rules put the queue sets' traffic on their workers' queues", rules.len());
                    st.rules.extend(rules);
                    for (a, b) in st.per_group.iter_mut().zip(counts) {
                        *a += b;
                    }
                }
                Some(e) => {
                    // The rules made so far go (all or nothing per port).
                    drop(rules);
                    if !st.refused.contains(i) {
                        tracing::info!("ports[{i}] ({name}): no flow rules for the queue sets ({e}); the receiving worker hands their packets on");
                        st.refused.push(*i);
                    }
                }
            }
        }
    }

    /// Flow rules installed for `group`, summed over the ports.
    pub fn rules_of(&self, group: usize) -> u32 {
        crate::lock(&self.state).per_group.get(group).copied().unwrap_or(0)
    }
}

/// Where a received packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    /// This worker handles it (its group's, or not a forward packet).
    Keep,
    /// Another group's, but this worker holds its session.
    KeepForSession,
    /// Hand it to this worker.
    To(u16),
}

/// One worker's view: its group, and the group of every service of the snapshot it last saw.
pub struct Steering {
    pub sets: Arc<QueueSets>,
    pub group: usize,
    /// Snapshot generation `svc_group` was computed for.
    generation: u64,
    /// Per service id: its group.
    svc_group: Vec<usize>,
    pub bucket: Option<Bucket>,
}

impl Steering {
    pub fn new(sets: Arc<QueueSets>, worker: u16) -> Steering {
        let group = sets.worker_group.get(worker as usize).copied().unwrap_or(sets.default_group());
        let bucket = sets.specs.get(group).and_then(|s| s.rate.map(|r| Bucket::new(r, s.workers.len().max(1) as u64)));
        Steering { sets, group, generation: u64::MAX, svc_group: Vec::new(), bucket }
    }

    /// Whether this worker belongs to a set that busy-polls.
    pub fn busy_polls(&self) -> bool {
        self.sets.specs.get(self.group).is_some_and(|s| s.busy_poll)
    }

    /// Where a packet received from a port goes.
    pub fn steer(&mut self, worker: &Worker, frame: &[u8]) -> Steer {
        let Some(flow) = worker.forward_flow(frame) else { return Steer::Keep };
        let snap = worker.snapshot();
        if snap.generation != self.generation {
            self.generation = snap.generation;
            self.svc_group.clear();
            for s in snap.services() {
                let i = s.id as usize;
                if self.svc_group.len() <= i {
                    self.svc_group.resize(i + 1, self.sets.default_group());
                }
                self.svc_group[i] = self.sets.group_of(s.spec.vip, s.spec.port, s.spec.proto);
            }
        }
        let group = self.svc_group.get(flow.svc as usize).copied().unwrap_or(self.sets.default_group());
        if group == self.group {
            return Steer::Keep;
        }
        if flow.local_session {
            return Steer::KeepForSession;
        }
        let members = &self.sets.members[group];
        if members.is_empty() {
            return Steer::Keep;
        }
        Steer::To(members[(flow.flow_hash % members.len() as u64) as usize])
    }
}

/// A token bucket over bytes and packets (either may be unlimited).
pub struct Bucket {
    /// Per second (this worker's share), and the most tokens held (the burst).
    bytes_rate: f64,
    pkts_rate: f64,
    bytes_max: f64,
    pkts_max: f64,
    bytes: f64,
    pkts: f64,
    last: Instant,
}

impl Bucket {
    /// `rate` shared among `ways` workers.
    pub fn new(rate: RateSpec, ways: u64) -> Bucket {
        let burst = rate.burst_ms as f64 / 1000.0;
        let bytes_rate = rate.bps.map_or(f64::INFINITY, |b| b as f64 / 8.0 / ways as f64);
        let pkts_rate = rate.pps.map_or(f64::INFINITY, |p| p as f64 / ways as f64);
        // At least one full-size frame and one packet of burst, or nothing could pass.
        let bytes_max = (bytes_rate * burst).max(1600.0);
        let pkts_max = (pkts_rate * burst).max(1.0);
        Bucket { bytes_rate, pkts_rate, bytes_max, pkts_max, bytes: bytes_max, pkts: pkts_max, last: Instant::now() }
    }

    /// Adds what the time since the last refill earned (call once per burst).
    pub fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.bytes = (self.bytes + dt * self.bytes_rate).min(self.bytes_max);
        self.pkts = (self.pkts + dt * self.pkts_rate).min(self.pkts_max);
    }

    /// Takes a packet of `len` bytes if the bucket holds enough.
    pub fn take(&mut self, len: usize) -> bool {
        let len = len as f64;
        if self.bytes >= len && self.pkts >= 1.0 {
            self.bytes -= len;
            self.pkts -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(name: &str, workers: &[u16], svc: (&str, u16)) -> QueueSetSpec {
        QueueSetSpec { name: name.into(), services: vec![(svc.0.parse().unwrap(), svc.1, 6)], workers: workers.to_vec(), rate: None, busy_poll: true }
    }

    #[test]
    fn groups_and_members() {
        let q = QueueSets::new(&[spec("mc", &[2], ("10.0.0.100", 11211)), spec("api", &[1, 3], ("10.0.0.100", 443))], 5);
        assert_eq!(q.worker_group, vec![2, 1, 0, 1, 2]);
        assert_eq!(q.members, vec![vec![2], vec![1, 3], vec![0, 4]]);
        assert_eq!(q.group_of("10.0.0.100".parse().unwrap(), 11211, 6), 0);
        assert_eq!(q.group_of("10.0.0.100".parse().unwrap(), 11211, 17), 2);
        assert_eq!((q.name(1), q.name(2)), ("api", "default"));
    }

    #[test]
    fn histograms_bucket_quantiles_and_prometheus_lines() {
        let mut h = Histogram::<13>::default();
        assert_eq!(h.quantile_bound(&TIME_BOUNDS_US, 0.5), None);
        h.add(&TIME_BOUNDS_US, 1, 90); // bucket <= 1
        h.add(&TIME_BOUNDS_US, 150, 9); // bucket <= 200
        h.add(&TIME_BOUNDS_US, 20_000, 1); // past the last bound
        assert_eq!(h.count(), 100);
        assert_eq!(h.sum, 90 + 1350 + 20_000);
        assert_eq!(h.quantile_bound(&TIME_BOUNDS_US, 0.5), Some(1));
        assert_eq!(h.quantile_bound(&TIME_BOUNDS_US, 0.99), Some(200));
        assert_eq!(h.quantile_bound(&TIME_BOUNDS_US, 0.999), None, "in the open bucket");
        let lines: Vec<(f64, u64)> = h.cumulative(&TIME_BOUNDS_US, 1e6).collect();
        assert_eq!(lines[0], (0.000001, 90));
        assert_eq!(lines[7], (0.0002, 99));
        assert_eq!(lines.last().unwrap(), &(f64::INFINITY, 100));
        let m = QueueStats { wait: h, ..Default::default() };
        let mut sum = m;
        sum.merge(&m);
        assert_eq!(sum.wait.count(), 200);
        let s = sum.summary();
        assert_eq!((s.packets, s.receives, s.wait_us.p50, s.wait_us.p99), (200, 0, Some(1), Some(200)), "bounds read in ns, given in µs");
    }

    #[test]
    fn the_bucket_holds_its_rate_and_burst() {
        let mut b = Bucket::new(RateSpec { bps: Some(8_000_000), pps: None, burst_ms: 10 }, 1);
        // 1 MB/s with a 10 ms burst: 10,000 bytes at once, then 1,000 bytes per millisecond.
        let t0 = b.last;
        let mut sent = 0;
        while b.take(100) {
            sent += 100;
        }
        assert_eq!(sent, 10_000);
        b.refill(t0 + Duration::from_millis(5));
        let mut more = 0;
        while b.take(100) {
            more += 100;
        }
        assert_eq!(more, 5_000);
        // Packets per second: 1,000 pps, 10 ms: 10 packets at once.
        let mut p = Bucket::new(RateSpec { bps: None, pps: Some(2_000), burst_ms: 10 }, 2);
        assert_eq!((0..100).filter(|_| p.take(1500)).count(), 10);
    }

    #[test]
    fn the_rate_holds_within_5_percent_over_2_seconds() {
        // 100 Mb/s (12,500 frames of 1000 B a second) and 20,000 packets/s; offered: 40
        // frames a millisecond (320 Mb/s), for 2 s of the bucket's time, in 1 ms steps.
        let mut b = Bucket::new(RateSpec { bps: Some(100_000_000), pps: Some(20_000), burst_ms: 10 }, 1);
        let t0 = b.last;
        let mut bytes = 0u64;
        for ms in 1..=2000 {
            b.refill(t0 + Duration::from_millis(ms));
            bytes += (0..40).filter(|_| b.take(1000)).count() as u64 * 1000;
        }
        let want = 100_000_000.0 / 8.0 * 2.0;
        let ratio = bytes as f64 / want;
        assert!((0.95..=1.05).contains(&ratio), "{bytes} bytes in 2 s: {ratio:.4} of the rate");
        // The packet rate binds when frames are small: 100 B frames at 40 a millisecond.
        let mut b = Bucket::new(RateSpec { bps: Some(100_000_000), pps: Some(20_000), burst_ms: 10 }, 1);
        let t0 = b.last;
        let mut pkts = 0u64;
        for ms in 1..=2000 {
            b.refill(t0 + Duration::from_millis(ms));
            pkts += (0..40).filter(|_| b.take(100)).count() as u64;
        }
        let ratio = pkts as f64 / 40_000.0;
        assert!((0.95..=1.05).contains(&ratio), "{pkts} packets in 2 s: {ratio:.4} of the rate");
    }
}
