//! Per-second rates over a sliding window, for the API, `/metrics`, `ctl` and the status page.
//!
//! The control thread takes a [`Sample`] of the counters once a second; a rate is the growth
//! of a counter between the newest sample and the oldest one still inside [`WINDOW`], divided by
//! the time between them. A burst of 3,000 connections in one second therefore reads 300/s for
//! the next ten seconds and then 0, instead of vanishing after one second (a one-second rate)
//! or lingering for minutes (an average since start).
//!
//! Services and backends are keyed by what they are (protocol, VIP, port, backend address and
//! port), not by their slot in the published snapshot, so a reload that renumbers them does not
//! mix their counts. A counter that went down (a service deleted and added again) counts as 0.

use crate::lock;
use crate::Daemon;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vectorlb_lb::service::{backend_slot, key};

/// The span rates are averaged over.
pub const WINDOW: Duration = Duration::from_secs(10);
/// How often the control thread samples.
pub const STEP: Duration = Duration::from_secs(1);
/// Points of history kept per service and backend: two minutes.
pub const HISTORY: usize = 120;

/// A service: protocol, VIP, port.
pub type SvcKey = (u8, IpAddr, u16);
/// A backend of a service: the service, the backend's address and port.
pub type BeKey = (SvcKey, IpAddr, u16);

/// Counters of a service or a backend at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub packets: u64,
    pub bytes: u64,
    pub new_sessions: u64,
}

/// Per-second rates of a service or a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rate {
    pub packets: f64,
    pub bytes: f64,
    pub new_sessions: f64,
}

/// The whole data plane's counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Global {
    pub rx: u64,
    pub tx: u64,
    pub drops: u64,
    pub new_sessions: u64,
}

/// The whole data plane's rates.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GlobalRate {
    pub rx: f64,
    pub tx: f64,
    pub drops: f64,
    pub new_sessions: f64,
    /// The span the rates cover, seconds (shorter than [`WINDOW`] just after start).
    pub window: f64,
}

/// A port's packets and bytes received and sent (`rte_eth_stats` order: ipackets, opackets,
/// ibytes, obytes).
pub type PortCount = [u64; 4];
/// The same per second.
pub type PortRate = [f64; 4];

/// Every counter the rates are computed from, at one instant.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub services: HashMap<SvcKey, Count>,
    pub backends: HashMap<BeKey, Count>,
    /// By port name.
    pub ports: HashMap<String, PortCount>,
    /// By drop reason.
    pub drops: HashMap<&'static str, u64>,
    pub global: Global,
}

#[derive(Default)]
struct Current {
    services: HashMap<SvcKey, Rate>,
    backends: HashMap<BeKey, Rate>,
    ports: HashMap<String, PortRate>,
    drops: HashMap<&'static str, f64>,
    global: GlobalRate,
}

/// The last [`HISTORY`] rates of one service or backend, oldest first (f32: a chart's
/// precision, half the memory).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub new_sessions: VecDeque<f32>,
    pub packets: VecDeque<f32>,
    pub bytes: VecDeque<f32>,
}

impl Series {
    fn push(&mut self, r: &Rate) {
        for (q, v) in [(&mut self.new_sessions, r.new_sessions), (&mut self.packets, r.packets), (&mut self.bytes, r.bytes)] {
            if q.len() == HISTORY {
                q.pop_front();
            }
            q.push_back(v as f32);
        }
    }
}

#[derive(Default)]
struct Histories {
    services: HashMap<SvcKey, Series>,
    backends: HashMap<BeKey, Series>,
}

/// Appends the current rates to each key's series; forgets keys that are gone.
fn extend<K: std::hash::Hash + Eq + Copy>(h: &mut HashMap<K, Series>, now: &HashMap<K, Rate>) {
    h.retain(|k, _| now.contains_key(k));
    for (k, r) in now {
        h.entry(*k).or_default().push(r);
    }
}

/// The samples inside the window and the rates computed from them at the last sample.
#[derive(Default)]
pub struct Rates {
    samples: Mutex<VecDeque<Sample>>,
    current: Mutex<Current>,
    history: Mutex<Histories>,
}

fn per_second(new: u64, old: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        0.0
    } else {
        new.saturating_sub(old) as f64 / secs
    }
}

fn rate(new: &Count, old: &Count, secs: f64) -> Rate {
    Rate { packets: per_second(new.packets, old.packets, secs), bytes: per_second(new.bytes, old.bytes, secs), new_sessions: per_second(new.new_sessions, old.new_sessions, secs) }
}

/// The rate of every key of the newest sample, from the oldest sample that has the key (a
/// service added five seconds ago is averaged over those five seconds).
fn rates_of<K: std::hash::Hash + Eq + Clone, C: Copy, R>(
    samples: &VecDeque<Sample>,
    newest: &Sample,
    get: impl Fn(&Sample) -> &HashMap<K, C>,
    rate: impl Fn(&C, &C, f64) -> R,
) -> HashMap<K, R> {
    get(newest)
        .iter()
        .map(|(k, now)| {
            let (at, base) = samples.iter().find_map(|s| get(s).get(k).map(|c| (s.at, *c))).unwrap_or((newest.at, *now));
            (k.clone(), rate(now, &base, newest.at.duration_since(at).as_secs_f64()))
        })
        .collect()
}

fn port_rate(new: &PortCount, old: &PortCount, secs: f64) -> PortRate {
    std::array::from_fn(|i| per_second(new[i], old[i], secs))
}

impl Rates {
    /// Adds a sample (taken after every earlier one) and recomputes the rates.
    pub fn record(&self, s: Sample) {
        let mut q = lock(&self.samples);
        q.push_back(s);
        // Keep the newest sample at or before (newest - WINDOW) as the base, drop older ones.
        let newest_at = q.back().map(|s| s.at).unwrap_or_else(Instant::now);
        while q.len() > 2 && newest_at.duration_since(q[1].at) >= WINDOW {
            q.pop_front();
        }
        let newest = q.back().expect("just pushed");
        let oldest = q.front().expect("just pushed");
        let secs = newest.at.duration_since(oldest.at).as_secs_f64();
        let (g, o) = (&newest.global, &oldest.global);
        let cur = Current {
            services: rates_of(&q, newest, |s| &s.services, rate),
            backends: rates_of(&q, newest, |s| &s.backends, rate),
            ports: rates_of(&q, newest, |s| &s.ports, port_rate),
            drops: rates_of(&q, newest, |s| &s.drops, |n, o, secs| per_second(*n, *o, secs)),
            global: GlobalRate {
                rx: per_second(g.rx, o.rx, secs),
                tx: per_second(g.tx, o.tx, secs),
                drops: per_second(g.drops, o.drops, secs),
                new_sessions: per_second(g.new_sessions, o.new_sessions, secs),
                window: secs,
            },
        };
        drop(q);
        {
            let mut h = lock(&self.history);
            extend(&mut h.services, &cur.services);
            extend(&mut h.backends, &cur.backends);
        }
        *lock(&self.current) = cur;
    }

    /// The recent rates of a service ([`HISTORY`] points at most, one per [`STEP`]).
    pub fn service_history(&self, k: &SvcKey) -> Series {
        lock(&self.history).services.get(k).cloned().unwrap_or_default()
    }

    pub fn backend_history(&self, k: &BeKey) -> Series {
        lock(&self.history).backends.get(k).cloned().unwrap_or_default()
    }

    pub fn service(&self, k: &SvcKey) -> Rate {
        lock(&self.current).services.get(k).copied().unwrap_or_default()
    }

    pub fn backend(&self, k: &BeKey) -> Rate {
        lock(&self.current).backends.get(k).copied().unwrap_or_default()
    }

    pub fn global(&self) -> GlobalRate {
        lock(&self.current).global
    }

    pub fn port(&self, name: &str) -> PortRate {
        lock(&self.current).ports.get(name).copied().unwrap_or_default()
    }

    /// Every drop reason's rate (reasons never sampled are absent).
    pub fn drops(&self) -> HashMap<&'static str, f64> {
        lock(&self.current).drops.clone()
    }
}

/// The daemon's counters now, keyed for [`Rates::record`].
pub fn sample(d: &Daemon) -> Sample {
    let snap = d.config.control.snapshot();
    let t = d.workers.totals();
    let c = &t.counters;
    let mut services = HashMap::new();
    let mut ids = HashMap::new();
    for s in &snap.spec.services {
        let Some(id) = snap.lookup_service(key(s.vip), s.port, s.proto) else { continue };
        let sk = (s.proto, s.vip, s.port);
        let sc = c.services.get(id as usize).copied().unwrap_or_default();
        services.insert(sk, Count { packets: sc.packets, bytes: sc.bytes, new_sessions: sc.new_sessions });
        ids.insert(id, sk);
    }
    // One pass over the backends (not one per service: large configurations stay cheap).
    let mut backends = HashMap::new();
    for b in snap.backends() {
        let Some(sk) = ids.get(&b.svc) else { continue };
        let bc = c.backends.get(backend_slot(b.id) as usize).copied().unwrap_or_default();
        backends.insert((*sk, b.addr, b.port), Count { packets: bc.packets, bytes: bc.bytes, new_sessions: bc.new_sessions });
    }
    let ports = d
        .ports
        .iter()
        .map(|p| {
            let s = p.stats();
            (p.name.clone(), [s.ipackets, s.opackets, s.ibytes, s.obytes])
        })
        .collect();
    // The pipeline's reasons and the worker loops' drops, as /metrics lists them.
    let drops: HashMap<&'static str, u64> = c.drop_counts().chain(t.io.iter().filter(|(n, _, _)| crate::metrics::IO_DROPS.contains(n)).map(|(n, _, v)| (n, v))).collect();
    let total_drops = drops.values().sum();
    Sample {
        at: Instant::now(),
        services,
        backends,
        ports,
        drops,
        global: Global { rx: c.events.rx, tx: c.events.tx, drops: total_drops, new_sessions: c.events.sessions_created },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: SvcKey = (6, IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 100)), 80);

    fn at(base: Instant, secs: u64, new_sessions: u64) -> Sample {
        let mut services = HashMap::new();
        services.insert(SVC, Count { packets: new_sessions * 10, bytes: new_sessions * 1000, new_sessions });
        let mut ports = HashMap::new();
        ports.insert("ext".to_string(), [new_sessions * 10, new_sessions * 9, new_sessions * 1000, new_sessions * 900]);
        let mut drops = HashMap::new();
        drops.insert("no_session", new_sessions / 10);
        Sample { at: base + Duration::from_secs(secs), services, backends: HashMap::new(), ports, drops, global: Global { rx: new_sessions * 10, ..Default::default() } }
    }

    #[test]
    fn a_burst_shows_for_the_window_then_decays_to_zero() {
        let r = Rates::default();
        let t0 = Instant::now();
        r.record(at(t0, 0, 0));
        // 3,000 connections within the first second, then nothing.
        r.record(at(t0, 1, 3000));
        assert_eq!(r.service(&SVC).new_sessions, 3000.0, "one second of history: the burst's own rate");
        for s in 2..=10 {
            r.record(at(t0, s, 3000));
            let got = r.service(&SVC).new_sessions;
            assert!((got - 3000.0 / s as f64).abs() < 1e-9, "after {s} s: {got}");
        }
        // Still inside the 10 s window: averaged over it.
        assert_eq!(r.service(&SVC).new_sessions, 300.0);
        assert_eq!(r.global().window, 10.0);
        assert_eq!(r.global().rx, 3000.0);
        // The sample before the burst leaves the window: the rate falls to zero.
        r.record(at(t0, 11, 3000));
        assert_eq!(r.service(&SVC).new_sessions, 0.0);
        assert_eq!(r.service(&SVC).bytes, 0.0);
        assert_eq!(r.global().window, 10.0);
    }

    #[test]
    fn steady_traffic_reads_its_rate_and_new_keys_start_from_their_first_sample() {
        let r = Rates::default();
        let t0 = Instant::now();
        let other: SvcKey = (17, SVC.1, 53);
        for s in 0..30u64 {
            let mut x = at(t0, s, s * 50);
            if s >= 25 {
                // A service added at 25 s with 7 sessions a second.
                x.services.insert(other, Count { new_sessions: (s - 25) * 7, ..Default::default() });
            }
            r.record(x);
        }
        assert_eq!(r.service(&SVC).new_sessions, 50.0);
        assert_eq!(r.service(&SVC).packets, 500.0);
        assert_eq!(r.port("ext"), [500.0, 450.0, 50_000.0, 45_000.0]);
        assert_eq!(r.drops()["no_session"], 5.0);
        assert_eq!(r.port("int"), [0.0; 4], "an unknown port has no rate");
        assert_eq!(r.service(&other).new_sessions, 7.0);
        assert_eq!(r.service(&(6, SVC.1, 443)).new_sessions, 0.0, "an unknown service has no rate");
    }

    #[test]
    fn history_keeps_two_minutes_of_window_rates_and_forgets_removed_keys() {
        let r = Rates::default();
        let t0 = Instant::now();
        for s in 0..200u64 {
            r.record(at(t0, s, s * 4));
        }
        let h = r.service_history(&SVC);
        assert_eq!(h.new_sessions.len(), HISTORY);
        assert_eq!(h.packets.len(), HISTORY);
        assert!(h.new_sessions.iter().all(|v| *v == 4.0), "{h:?}");
        assert_eq!(*h.packets.back().unwrap(), 40.0);
        // The service is deleted: its history goes with it.
        r.record(Sample {
            at: t0 + Duration::from_secs(200),
            services: HashMap::new(),
            backends: HashMap::new(),
            ports: HashMap::new(),
            drops: HashMap::new(),
            global: Global::default(),
        });
        assert_eq!(r.service_history(&SVC), Series::default());
    }

    #[test]
    fn a_counter_that_went_down_reads_zero_not_a_huge_number() {
        let r = Rates::default();
        let t0 = Instant::now();
        r.record(at(t0, 0, 500));
        r.record(at(t0, 1, 20));
        assert_eq!(r.service(&SVC).new_sessions, 0.0);
    }
}
