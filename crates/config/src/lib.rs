//! The configuration file: TOML, documented in `docs/configuration.md`.
//!
//! Unknown keys are errors (a misspelt key must not silently fall back to a default), and every
//! error names the field it is about. [`Config::parse`] returns the service model
//! ([`vectorlb_lb::LbSpec`]) plus the engine settings that size each worker.

mod bgp;
mod error;
mod file;
mod ha;
mod health;
mod memif;
mod pods;
mod ports;
mod queue_sets;
mod runtime;
mod services;
mod values;

pub use bgp::{BgpNeighbor, BgpSpec};
pub use error::Error;
pub use file::RawHealth;
pub use ha::SyncSpec;
pub use health::{health_spec, raw_health, CheckKind, HealthSpec, OnDown};
pub use memif::MemifSpec;
pub use pods::{PodsSpec, MAX_PODS};
pub use queue_sets::{service_name, QueueSetSpec, RateSpec, MAX_BURST_MS};
pub use runtime::{Engine, Runtime, DEFAULT_API, DEFAULT_DMA_THRESHOLD, DEFAULT_EAL};
pub use values::{masked, prefix};

use error::{bail, number_terms};
use file::*;
use std::path::Path;
use vectorlb_lb::{LbSpec, Mode, SynProxy, Timeouts};
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

/// The machine's memory in bytes (MemTotal), or a generous guess when it cannot be read.
pub fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()))
        .map_or(u64::MAX, |kb| kb * 1024)
}

/// Largest configuration file read.
pub const MAX_FILE: u64 = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub engine: Engine,
    pub spec: LbSpec,
    pub runtime: Runtime,
    /// Per port (same order as `spec.ports`): the DPDK device string, if any.
    pub devices: Vec<Option<String>>,
    /// Per port: whether the MAC address was left to the device.
    pub mac_from_device: Vec<bool>,
    /// Per port: its memif settings, for a memif port.
    pub memif: Vec<Option<MemifSpec>>,
    /// Per port: its pods settings, for the port of this node's pods.
    pub pods: Vec<Option<PodsSpec>>,
    /// Per port: `trust_peer` (a net_memif device is accepted only with it).
    pub trust_peer: Vec<bool>,
    /// Per port: the MTU given in the file (None: the default).
    pub mtu_given: Vec<bool>,
    /// Per service (same order as `spec.services`): its health check, if any.
    pub health: Vec<Option<HealthSpec>>,
    pub sync: Option<SyncSpec>,
    /// `[bgp]`: the VIPs announced to the routers through BIRD.
    pub bgp: Option<BgpSpec>,
    /// The file's `[timeouts]`: services and SNAT rules without their own use these, and so
    /// do services added through the API.
    pub timeouts: Timeouts,
    /// Application queue sets (`[[queue_sets]]`): services whose packets only dedicated
    /// workers handle.
    pub queue_sets: Vec<QueueSetSpec>,
    /// `[default_set] ingress`: on AF_XDP ports, the XDP program drops packets of the default
    /// set (everything outside the queue sets) above this rate before they reach the data
    /// plane's shared receive ring.
    pub default_ingress: Option<RateSpec>,
}

pub use vectorlb_packet::ethernet::{format_mac, parse_mac};

impl Config {
    pub fn load(path: &Path) -> Result<Config, Error> {
        let name = path.display().to_string();
        let read = |message: String| Error::Read { path: name.clone(), message };
        // Looked at before opening: a FIFO or a device would block or never end.
        let meta = std::fs::metadata(path).map_err(|e| read(e.to_string()))?;
        if !meta.is_file() {
            return Err(read("not a regular file".into()));
        }
        if meta.len() > MAX_FILE {
            return Err(read(format!("{} bytes; a configuration file is at most {MAX_FILE}", meta.len())));
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(path).map_err(|e| read(e.to_string()))?, MAX_FILE + 1), &mut bytes)
            .map_err(|e| read(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let before = &e.as_bytes()[..at];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
            read(format!("line {line}, column {column}: not UTF-8 text"))
        })?;
        Config::parse(&text).map_err(|e| Error::InFile { path: name, source: Box::new(e) })
    }

    pub fn parse(text: &str) -> Result<Config, Error> {
        let raw: Raw = toml::from_str(text).map_err(|e| Error::Syntax(number_terms(e.to_string().trim_end())))?;
        let g = &raw.global;
        let base = values::timeouts("timeouts", &raw.timeouts, &Timeouts::default())?;

        let p = ports::ports(&raw.ports)?;
        let routes = ports::routes(&raw.routes, &p.ids)?;
        let neighbors = ports::neighbors(&raw.neighbors)?;
        let (services, health) = services::services(&raw.services, &base)?;
        let snat = services::snat(&raw.snat, &base)?;
        let engine = runtime::engine(g, services.iter().any(|s| s.mode == Mode::Nat))?;
        let cluster_key = engine.cluster_key.as_deref().map_or(0, vectorlb_lb::hash::cluster_key);
        let spec = LbSpec { ports: p.specs, routes, neighbors, services, snat, icmp_rate: g.icmp_rate.unwrap_or(1000), cluster_key, host_addrs: Vec::new() };
        let runtime = runtime::runtime(&raw.runtime)?;
        let sync = ha::sync(&raw.ha)?;
        let mut bgp = bgp::bgp(&raw.bgp)?;
        if let Some(b) = &mut bgp {
            // This node's pod networks are never taken from a neighbour.
            b.own_pods = spec
                .ports
                .iter()
                .zip(&p.pods)
                .filter(|(_, pods)| pods.is_some())
                .flat_map(|(port, _)| port.addrs.iter().map(|(a, l)| (crate::values::masked(*a, *l), *l)))
                .collect();
        }
        // Build once to report semantic errors (families, routes, tables) at load time.
        vectorlb_lb::Control::new(&spec)?;
        let queue_sets = queue_sets::queue_sets(&raw.queue_sets, &spec, runtime.workers)?;
        Ok(Config {
            engine,
            spec,
            runtime,
            devices: p.devices,
            memif: p.memifs,
            pods: p.pods,
            trust_peer: p.trust_peer,
            mac_from_device: p.mac_from_device,
            mtu_given: p.mtu_given,
            health,
            sync,
            bgp,
            timeouts: base,
            queue_sets,
            default_ingress: raw.default_set.as_ref().and_then(|d| d.ingress.as_ref()).map(|r| queue_sets::rate_spec("default_set.ingress", r)).transpose()?,
        })
    }

    /// The configuration as a TOML file that [`Config::parse`] reads back to the same value
    /// (the API's "save" writes this). Comments of the original file are not kept.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(&self.to_raw()).expect("the file model serialises to TOML");
        format!("# The running configuration, written by vectorlb.\n\n{body}")
    }

    /// The file model of this configuration: what [`Config::parse`] reads.
    fn to_raw(&self) -> Raw {
        let secs = |ms: u32| Some(ms as f64 / 1000.0);
        let raw_timeouts = |t: &Timeouts| RawTimeouts {
            syn: secs(t.syn),
            established: secs(t.established),
            fin: secs(t.fin),
            time_wait: secs(t.time_wait),
            close: secs(t.close),
            udp: secs(t.udp),
        };
        let e = &self.engine;
        let r = &self.runtime;
        let port_name = |i: u16| self.spec.ports.get(i as usize).map(|p| p.name.clone()).unwrap_or_default();
        Raw {
            global: RawGlobal {
                max_sessions: Some(e.max_sessions),
                index_entries: Some(e.index_entries),
                batch: Some(e.batch),
                icmp_rate: Some(self.spec.icmp_rate),
                local_port_min: Some(e.local_port_min),
                local_port_max: Some(e.local_port_max),
                sweep_budget: Some(e.sweep_budget),
                half_open_share: Some(e.half_open_permille as f64 / 1000.0),
                continuation_share: Some(e.continued_permille as f64 / 1000.0),
                cluster_key: e.cluster_key.clone(),
            },
            runtime: RawRuntime {
                workers: Some(r.workers),
                cpus: Some(r.cpus.clone()),
                eal: Some(r.eal.clone()),
                mbufs: Some(r.mbufs),
                queue_desc: Some(r.queue_desc),
                api: Some(match r.api.as_slice() {
                    [one] => OneOrMany::One(one.clone()),
                    many => OneOrMany::Many(many.to_vec()),
                }),
                api_token_file: r.api_token_file.clone(),
                api_group: r.api_group.clone(),
                memory_budget_mb: r.memory_budget_mb,
                idle_sleep_us: Some(r.idle_sleep_us),
                neighbor_timeout: Some(r.neighbor_timeout),
                run_dir: Some(r.run_dir.clone()),
                ha_state: Some(r.ha_state.clone()),
                dma_devices: (!r.dma_devices.is_empty()).then(|| r.dma_devices.clone()),
                dma_threshold: (r.dma_threshold != DEFAULT_DMA_THRESHOLD).then_some(r.dma_threshold),
            },
            ha: self.sync.as_ref().map(|h| RawHa {
                sync_listen: h.listen.to_string(),
                sync_peers: h.peers.iter().map(|p| p.to_string()).collect(),
                sync_sources: if h.sources == crate::ha::unicast_sources(&h.peers) { Vec::new() } else { h.sources.iter().map(|a| a.to_string()).collect() },
                sync_key: String::from_utf8_lossy(&h.key).into_owned(),
                group: h.group,
                max_rate: (h.max_rate != SyncSpec::DEFAULT_MAX_RATE).then_some(h.max_rate),
            }),
            bgp: self.bgp.as_ref().map(bgp::raw),
            timeouts: raw_timeouts(&self.timeouts),
            ports: self
                .spec
                .ports
                .iter()
                .enumerate()
                .map(|(i, p)| RawPort {
                    name: p.name.clone(),
                    device: self.devices.get(i).cloned().flatten(),
                    mac: (!self.mac_from_device.get(i).copied().unwrap_or(false)).then(|| format_mac(&p.mac)),
                    addrs: p.addrs.iter().map(|(a, l)| format!("{a}/{l}")).collect(),
                    vlan: p.vlan,
                    mtu: self.mtu_given.get(i).copied().unwrap_or(true).then_some(p.mtu),
                    memif: self.memif.get(i).cloned().flatten(),
                    pods: self.pods.get(i).cloned().flatten(),
                    trust_peer: self.memif.get(i).is_some_and(Option::is_none) && self.trust_peer.get(i).copied().unwrap_or(false),
                })
                .collect(),
            routes: self.spec.routes.iter().map(|r| RawRoute { prefix: format!("{}/{}", r.prefix, r.len), via: r.via.to_string(), port: port_name(r.port) }).collect(),
            neighbors: self.spec.neighbors.iter().map(|(a, m)| RawNeighbor { ip: a.to_string(), mac: format_mac(m) }).collect(),
            services: self
                .spec
                .services
                .iter()
                .enumerate()
                .map(|(i, s)| RawService {
                    vip: s.vip.to_string(),
                    port: s.port,
                    proto: if s.proto == proto::TCP { "tcp" } else { "udp" }.into(),
                    mode: s.mode.name().into(),
                    scheduler: Some(s.scheduler.name().into()),
                    table_size: match s.scheduler {
                        Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => Some(table_size),
                        _ => None,
                    },
                    local_addrs: s.local_addrs.iter().map(|a| a.to_string()).collect(),
                    keep_source: s.keep_source.iter().map(|(a, l)| format!("{a}/{l}")).collect(),
                    peer_local_addrs: s.peer_local_addrs.iter().map(|a| a.to_string()).collect(),
                    toa: s.toa,
                    synproxy: (s.synproxy != SynProxy::Off).then(|| s.synproxy.name().into()),
                    synproxy_half_open: s.synproxy.half_open(),
                    continuation: Some(s.continuation),
                    quic: s.quic,
                    affinity_timeout_s: (s.affinity_ms > 0).then_some(s.affinity_ms / 1000),
                    timeouts: Some(raw_timeouts(&s.timeouts)),
                    backends: s.backends.iter().map(|b| RawBackend { addr: b.addr.to_string(), port: b.port, weight: Some(b.weight), quic_id: b.quic_id }).collect(),
                    health: self.health.get(i).cloned().flatten().map(|h| raw_health(&h)),
                })
                .collect(),
            snat: self
                .spec
                .snat
                .iter()
                .map(|r| RawSnat {
                    source: format!("{}/{}", r.source, r.prefix_len),
                    addrs: r.addrs.iter().map(|a| a.to_string()).collect(),
                    except: r.except.iter().map(|(a, l)| format!("{a}/{l}")).collect(),
                    outbound_only: r.outbound_only,
                    timeouts: Some(raw_timeouts(&r.timeouts)),
                })
                .collect(),
            queue_sets: self
                .queue_sets
                .iter()
                .map(|q| RawQueueSet {
                    name: q.name.clone(),
                    // (A service the API removed since is left out: the file must load.)
                    services: q
                        .services
                        .iter()
                        .filter(|k| self.spec.services.iter().any(|s| (s.vip, s.port, s.proto) == **k))
                        .map(|(vip, port, p)| service_name(*vip, *port, *p))
                        .collect(),
                    workers: q.workers.clone(),
                    rate: q.rate.map(|r| RawRate { bps: r.bps, pps: r.pps, burst_ms: Some(r.burst_ms) }),
                    busy_poll: (!q.busy_poll).then_some(false),
                })
                .collect(),
            default_set: self.default_ingress.map(|r| RawDefaultSet { ingress: Some(RawRate { bps: r.bps, pps: r.pps, burst_ms: Some(r.burst_ms) }) }),
        }
    }

    /// Memory the session tables of every worker need at most, bytes, and the part of it made
    /// resident at start (the indexes).
    pub fn session_memory(&self) -> (u64, u64) {
        let f = vectorlb_lb::session::Footprint::of(&self.worker_config(0, self.runtime.workers).table);
        let w = self.runtime.workers as u64;
        (f.total() * w, f.index_bytes * w)
    }

    /// The memory budget of `runtime.memory_budget_mb`, or half of `mem_total` bytes.
    pub fn memory_budget(&self, mem_total: u64) -> u64 {
        self.runtime.memory_budget_mb.map_or(mem_total / 2, |m| m << 20)
    }

    /// What `vectorlb run` needs beyond a valid file: a port at least, a DPDK device for every
    /// port, enough packet buffers for every queue, and session tables within the memory
    /// budget. `check` runs the same test.
    pub fn check_for_run(&self) -> Result<(), Error> {
        self.check_for_run_with(mem_total())
    }

    /// [`Config::check_for_run`] for a machine with `mem_total` bytes of memory.
    pub fn check_for_run_with(&self, mem_total: u64) -> Result<(), Error> {
        self.check_memory_with(mem_total)?;
        self.check_ports_for_run()
    }

    /// The session tables' memory against the budget (`replay` builds the same tables).
    pub fn check_memory(&self) -> Result<(), Error> {
        self.check_memory_with(mem_total())
    }

    /// [`Config::check_memory`] for a machine with `mem_total` bytes of memory.
    pub fn check_memory_with(&self, mem_total: u64) -> Result<(), Error> {
        let (need, resident) = self.session_memory();
        let budget = self.memory_budget(mem_total);
        if need > budget {
            bail!(
                "global.max_sessions: {} sessions per worker x {} worker(s) need up to {} MiB ({} MiB of index made resident at start, the rest as sessions arrive); the budget is {} MiB (runtime.memory_budget_mb; by default half of this machine's memory)",
                self.engine.max_sessions,
                self.runtime.workers,
                need >> 20,
                resident >> 20,
                budget >> 20
            );
        }
        Ok(())
    }

    fn check_ports_for_run(&self) -> Result<(), Error> {
        if self.spec.ports.is_empty() {
            bail!("ports: `vectorlb run` needs at least one port");
        }
        if let Some(i) =
            (0..self.devices.len()).find(|&i| self.devices[i].is_none() && self.memif.get(i).is_none_or(Option::is_none) && self.pods.get(i).is_none_or(Option::is_none))
        {
            bail!("ports[{i}].device: `vectorlb run` needs a DPDK device (net_af_xdp0,iface=eth0, a PCI address, ...), a memif interface ([ports.memif]) or [ports.pods] for every port");
        }
        for (i, p) in self.pods.iter().enumerate() {
            if let Some(p) = p {
                p.check(&format!("ports[{i}].pods"), self.runtime.workers)?;
            }
        }
        let dma = self.memif.iter().flatten().any(MemifSpec::uses_dma);
        if dma && !self.runtime.eal.iter().any(|a| a == "--iova-mode=va") && !self.runtime.eal.windows(2).any(|w| w[0] == "--iova-mode" && w[1] == "va") {
            // The daemon adds it; an explicit other mode is a contradiction.
            if self.runtime.eal.iter().any(|a| a.starts_with("--iova-mode")) {
                bail!("runtime.eal: memif ports with copy = \"dma\" need --iova-mode=va");
            }
        }
        let r = &self.runtime;
        // Every rx and tx ring of every queue can hold a descriptor's worth of buffers, plus
        // the per-thread caches and what is in flight.
        let need = self.spec.ports.len() as u64 * r.workers as u64 * 2 * r.queue_desc as u64 + 256 * (r.workers as u64 + 1) + 1024;
        if (r.mbufs as u64) < need {
            bail!(
                "runtime.mbufs: {} is too few for {} port(s) x {} worker(s) x 2 rings x {} descriptors; give at least {need} (or lower runtime.queue_desc)",
                r.mbufs,
                self.spec.ports.len(),
                r.workers,
                r.queue_desc
            );
        }
        Ok(())
    }

    /// Worker settings for core `core` of `cores`.
    pub fn worker_config(&self, core: u16, cores: u16) -> vectorlb_lb::WorkerConfig {
        let shift = (cores.max(1) as u32).next_power_of_two().trailing_zeros() as u8;
        let mut w = vectorlb_lb::WorkerConfig::new(self.engine.max_sessions);
        w.batch = self.engine.batch;
        w.table.index_entries = self.engine.index_entries;
        w.table.core = core;
        w.table.core_shift = shift;
        w.table.cores = cores.max(1);
        w.table.port_min = self.engine.local_port_min;
        w.table.port_max = self.engine.local_port_max;
        w.table.sweep_budget = self.engine.sweep_budget;
        w.half_open_permille = self.engine.half_open_permille;
        w.continued_permille = self.engine.continued_permille;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small valid file; the tests edit it to make each error.
    const GOOD: &str = include_str!("../testdata/good.toml");

    #[test]
    fn parses_a_good_file() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.engine.max_sessions, 1000);
        assert_eq!(c.spec.services[0].backends[0].weight, 2);
        assert_eq!(c.spec.services[0].mode, Mode::Fnat);
    }

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn queue_sets_are_checked_and_written_back() {
        let base = format!("{GOOD}\n[runtime]\nworkers = 3\n");
        let good = format!("{base}\n[[queue_sets]]\nname = \"web\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [2]\nrate = {{ bps = 1000000000, pps = 100000 }}\n");
        let c = Config::parse(&good).unwrap();
        let q = &c.queue_sets[0];
        assert_eq!((q.name.as_str(), q.services.clone(), q.workers.clone()), ("web", vec![("10.0.0.100".parse().unwrap(), 80, proto::TCP)], vec![2]));
        assert_eq!(q.rate, Some(RateSpec { bps: Some(1_000_000_000), pps: Some(100_000), burst_ms: 10 }));
        assert!(q.busy_poll);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        let napping = Config::parse(&good.replace("workers = [2]\n", "workers = [2]\nbusy_poll = false\n")).unwrap();
        assert!(!napping.queue_sets[0].busy_poll);
        assert_eq!(Config::parse(&napping.to_toml()).unwrap(), napping);
        let set = |body: &str| format!("{base}\n[[queue_sets]]\n{body}\n");
        for (body, want) in [
            ("name = \"default\"\nservices = []\nworkers = [1]", "queue_sets[0].name"),
            ("name = \"w\"\nservices = [\"10.0.0.100:81/tcp\"]\nworkers = [1]", "queue_sets[0].services[0]: '10.0.0.100:81/tcp' is not a service of this file"),
            ("name = \"w\"\nservices = [\"10.0.0.100:80/udp\"]\nworkers = [1]", "is not a service"),
            ("name = \"w\"\nservices = []\nworkers = []", "queue_sets[0].workers: a set needs at least one worker"),
            ("name = \"w\"\nservices = []\nworkers = [3]", "queue_sets[0].workers[0]: worker 3 does not exist"),
            ("name = \"w\"\nservices = []\nworkers = [0, 1, 2]", "leave at least one"),
            ("name = \"w\"\nservices = []\nworkers = [1]\nrate = {}", "queue_sets[0].rate: give bps, pps or both"),
            ("name = \"w\"\nservices = []\nworkers = [1]\nrate = { pps = 0 }", "a rate of 0"),
            ("name = \"w\"\nservices = []\nworkers = [1]\nrate = { pps = 5, burst_ms = 0 }", "queue_sets[0].rate.burst_ms"),
            ("name = \"w\"\nservices = []\nworkers = [1]\ncpus = [1]", "unknown field `cpus`"),
        ] {
            let e = err(&set(body));
            assert!(e.contains(want), "{body}: {e}");
        }
        let two = format!("{base}\n[[queue_sets]]\nname = \"a\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [1]\n[[queue_sets]]\nname = \"b\"\nservices = [\"10.0.0.100:80/tcp\"]\nworkers = [1]\n");
        assert!(err(&two).contains("queue_sets[1].services[0]: '10.0.0.100:80/tcp' is already in a set"), "{}", err(&two));
        let two = two.replacen("services = [\"10.0.0.100:80/tcp\"]\nworkers = [1]\n[[", "services = []\nworkers = [1]\n[[", 1);
        assert!(err(&two).contains("queue_sets[1].workers[0]: worker 1 is already dedicated"), "{}", err(&two));
        // A service the API removed leaves its set; the file written back still loads.
        let mut c = Config::parse(&good).unwrap();
        c.spec.services.clear();
        c.health.clear();
        let back = Config::parse(&c.to_toml()).unwrap();
        assert!(back.queue_sets[0].services.is_empty());
        // The default set's ingress limit (the XDP program polices it).
        let policed = Config::parse(&format!(
            "{good}
[default_set]
ingress = {{ pps = 20000, burst_ms = 5 }}
"
        ))
        .unwrap();
        assert_eq!(policed.default_ingress, Some(RateSpec { bps: None, pps: Some(20_000), burst_ms: 5 }));
        assert_eq!(Config::parse(&policed.to_toml()).unwrap(), policed);
        assert_eq!(Config::parse(&good).unwrap().default_ingress, None);
        for (body, want) in [
            ("ingress = {}", "default_set.ingress: give bps, pps or both"),
            ("ingress = { bps = 0 }", "default_set.ingress: a rate of 0"),
            ("ingress = { pps = 1, burst_ms = 10001 }", "default_set.ingress.burst_ms"),
            ("egress = { pps = 1 }", "unknown field `egress`"),
        ] {
            let e = err(&format!(
                "{base}
[default_set]
{body}
"
            ));
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn quic_routing_is_checked_and_written_back() {
        let dr = GOOD.replace("mode = \"fnat\"", "mode = \"dr\"").replace("local_addrs = [\"10.0.0.200\"]\n", "").replace("port = 8080, ", "");
        let udp = dr.replace("proto = \"tcp\"", "proto = \"udp\"");
        let quic = udp.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\nquic = true").replace("weight = 2 }", "weight = 2, quic_id = 4660 }");
        let c = Config::parse(&quic).unwrap();
        assert!(c.spec.services[0].quic);
        assert_eq!(c.spec.services[0].backends[0].quic_id, Some(4660));
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c, "written back");
        assert!(!Config::parse(&udp).unwrap().spec.services[0].quic, "off by default");
        for (text, want) in [
            (dr.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\nquic = true"), "services[0].quic: only udp"),
            (udp.replace("weight = 2 }", "weight = 2, quic_id = 7 }"), "services[0].backends[0].quic_id: the service's quic is off"),
            (quic.replace("quic_id = 4660", "quic_id = 0"), "services[0].backends[0].quic_id: 0 is no server id"),
        ] {
            let e = err(&text);
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn a_sync_group_and_peer_local_addresses() {
        let ha = "\n[ha]\nsync_listen = \"10.9.9.1:7946\"\nsync_peers = [\"10.9.9.2:7946\", \"10.9.9.3:7946\"]\nsync_key = \"sixteen characters\"\n";
        let g = GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = [\"10.0.0.200\"]\npeer_local_addrs = [\"10.0.0.201\", \"10.0.0.202\"]")
            + ha
            + "group = true\nmax_rate = 20000\n";
        let c = Config::parse(&g).unwrap();
        let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
        assert_eq!(c.spec.services[0].peer_local_addrs, [ip("10.0.0.201"), ip("10.0.0.202")]);
        let sy = c.sync.as_ref().unwrap();
        assert!(sy.group);
        assert_eq!((sy.peers.len(), sy.max_rate), (2, 20000));
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c, "written back");
        let pair = Config::parse(&(GOOD.to_string() + ha)).unwrap();
        let sy = pair.sync.unwrap();
        assert!(!sy.group && sy.max_rate == SyncSpec::DEFAULT_MAX_RATE, "a pair by default");
        let dr = GOOD.replace("mode = \"fnat\"", "mode = \"dr\"").replace("local_addrs = [\"10.0.0.200\"]\n", "").replace("port = 8080, ", "");
        for (text, want) in [
            (
                GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = [\"10.0.0.200\"]\npeer_local_addrs = [\"10.0.0.200\"]"),
                "services[0].peer_local_addrs[0]: '10.0.0.200' is listed twice",
            ),
            (GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = [\"10.0.0.200\"]\npeer_local_addrs = [\"224.0.0.1\"]"), "services[0].peer_local_addrs[0]"),
            (GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = [\"10.0.0.200\"]\npeer_local_addrs = [\"nope\"]"), "services[0].peer_local_addrs[0]"),
            (dr.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\npeer_local_addrs = [\"10.0.0.201\"]"), "services[0].peer_local_addrs: only fnat services"),
            (GOOD.to_string() + ha + "max_rate = 5\n", "ha.max_rate: 5 records a second is out of range"),
            (GOOD.to_string() + ha + "group = \"yes\"\n", "group"),
        ] {
            let e = err(&text);
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn cluster_key_and_continuation() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!((c.spec.cluster_key, c.spec.services[0].continuation), (0, false), "unkeyed; fnat does not continue");
        assert_eq!(c.engine.continued_permille, vectorlb_lb::pipeline::DEFAULT_CONTINUED_PERMILLE);
        let dr = GOOD.replace("mode = \"fnat\"", "mode = \"dr\"").replace("local_addrs = [\"10.0.0.200\"]\n", "").replace("port = 8080, ", "");
        let keyed = dr.replace("max_sessions = 1000", "max_sessions = 1000\ncluster_key = \"sixteen chars ok\"\ncontinuation_share = 0.05");
        let c = Config::parse(&keyed).unwrap();
        assert_eq!(c.spec.cluster_key, vectorlb_lb::hash::cluster_key("sixteen chars ok"));
        assert_ne!(c.spec.cluster_key, 0);
        assert!(c.spec.services[0].continuation, "on by default for dr with maglev");
        assert_eq!(c.engine.continued_permille, 50);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c, "the key and the switch are written back");
        let off = Config::parse(&dr.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\ncontinuation = false")).unwrap();
        assert!(!off.spec.services[0].continuation);
        assert!(!Config::parse(&dr.replace("scheduler = \"maglev\"", "scheduler = \"wrr\"")).unwrap().spec.services[0].continuation);
        for (text, want) in [
            (dr.replace("max_sessions = 1000", "max_sessions = 1000\ncluster_key = \"short\""), "global.cluster_key: at least 16 characters"),
            (dr.replace("max_sessions = 1000", "max_sessions = 1000\ncontinuation_share = 0"), "global.continuation_share: 0 is not between"),
            (dr.replace("scheduler = \"maglev\"", "scheduler = \"rr\"\ncontinuation = true"), "services[0].continuation: the rr scheduler picks differently on every node"),
            (GOOD.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\ncontinuation = true"), "services[0].continuation: not with fnat"),
            (
                dr.replace("proto = \"tcp\"", "proto = \"udp\"").replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\ncontinuation = true"),
                "services[0].continuation: only tcp",
            ),
        ] {
            let e = err(&text);
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn bgp_is_checked_and_written_back() {
        let bgp =
            "\n[bgp]\nasn = 65001\nrouter_id = \"10.0.0.1\"\ncommunities = [\"65001:100\"]\nimport = [\"10.244.0.0/16\", \"fd00:244::/48\"]\n[[bgp.neighbors]]\naddress = \"10.0.0.254\"\nasn = 65000\npassword = \"s3cret\"\n";
        let c = Config::parse(&format!("{GOOD}{bgp}")).unwrap();
        let b = c.bgp.as_ref().unwrap();
        assert_eq!((b.asn, b.hold_time, b.bfd, b.bfd_interval_ms, b.bfd_multiplier), (65001, 9, true, 100, 3));
        assert_eq!(b.communities, vec![(65001, 100)]);
        assert_eq!(b.import, vec![("10.244.0.0".parse().unwrap(), 16), ("fd00:244::".parse().unwrap(), 48)]);
        assert_eq!(b.neighbors[0].password.as_deref(), Some("s3cret"));
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        assert!(Config::parse(GOOD).unwrap().bgp.is_none());
        for (from, to, want) in [
            ("asn = 65001", "asn = 0", "bgp.asn: AS 0 is reserved"),
            ("asn = 65001", "asn = 4294967296", "bgp.asn: 4294967296 is not a 32-bit AS number"),
            ("router_id = \"10.0.0.1\"", "router_id = \"::1\"", "bgp.router_id: '::1' is not an IPv4 address"),
            ("[\"65001:100\"]", "[\"65001\"]", "bgp.communities[0]: '65001' is not ASN:VALUE"),
            ("address = \"10.0.0.254\"", "address = \"224.0.0.5\"", "bgp.neighbors[0].address: 224.0.0.5 is not a unicast address"),
            ("password = \"s3cret\"", "password = \"a\\\"; protocol x\"", "bgp.neighbors[0].password: 1 to 80 printable characters, without quotes"),
            ("asn = 65000", "asn = 65000\nport = 179", "unknown field `port`"),
            ("router_id = \"10.0.0.1\"", "router_id = \"10.0.0.1\"\nhold_time = 2", "bgp.hold_time: 2 s; 0 (no keepalives) or at least 3"),
            ("router_id = \"10.0.0.1\"", "router_id = \"10.0.0.1\"\nbird = \"bird\"", "bgp.bird: 'bird' is not an absolute path"),
            ("\"10.244.0.0/16\"", "\"10.244.1.1/16\"", "bgp.import[0]: '10.244.1.1/16' has bits set past its length (the network is 10.244.0.0/16)"),
            ("\"10.244.0.0/16\"", "\"0.0.0.0/0\"", "bgp.import[0]: a default route is not taken"),
            ("\"10.244.0.0/16\"", "\"10.244.0.0/33\"", "bgp.import[0]: '10.244.0.0/33' has an invalid prefix length"),
            ("\"fd00:244::/48\"", "\"10.244.0.0/16\"", "bgp.import[1]: '10.244.0.0/16' is listed twice"),
        ] {
            let text = format!("{GOOD}{}", bgp.replacen(from, to, 1));
            let e = err(&text);
            assert!(e.contains(want), "{want}: {e}");
        }
        let none = format!("{GOOD}\n[bgp]\nasn = 65001\nrouter_id = \"10.0.0.1\"\n");
        assert!(err(&none).contains("bgp.neighbors: give at least one router"), "{}", err(&none));
    }

    #[test]
    fn writes_back_what_it_reads() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/fnat-demo.toml")).unwrap();
        let c = Config::parse(&text).unwrap();
        let again = Config::parse(&c.to_toml()).unwrap();
        assert_eq!(c, again);
        let dev = GOOD.replace("mac = \"02:00:00:00:00:01\"", "device = \"net_af_xdp0,iface=v\\\"x\"\nmtu = 1400") + "\n[runtime]\nworkers = 2\napi = \"unix:/tmp/x.sock\"\n";
        let c = Config::parse(&dev).unwrap();
        assert_eq!(c.devices[0].as_deref(), Some("net_af_xdp0,iface=v\"x"));
        assert!(c.mac_from_device[0]);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn health_checks_parse_write_back_and_name_their_errors() {
        let with = |h: &str| GOOD.replace("backends = [{", &format!("health = {h}\nbackends = [{{"));
        let c = Config::parse(&with("{ kind = \"http\", path = \"/healthz\", interval = 0.5, rise = 1, fall = 2, on_down = \"reset\" }")).unwrap();
        let h = c.health[0].as_ref().unwrap();
        assert_eq!((h.interval, h.timeout, h.rise, h.fall, h.on_down), (500, 500, 1, 2, OnDown::Reset));
        assert_eq!(h.kind, CheckKind::Http { path: "/healthz".into(), host: None, expect_status: 200, tls: false });
        let c = Config::parse(&with("{ kind = \"https\", host = \"be.example\", expect_status = 204 }")).unwrap();
        assert_eq!(c.health[0].as_ref().unwrap().kind, CheckKind::Http { path: "/".into(), host: Some("be.example".into()), expect_status: 204, tls: true });
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        let c = Config::parse(&with("{ kind = \"exec\", command = \"/bin/true\" }")).unwrap();
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
        assert!(err(&with("{ kind = \"icmp\" }")).contains("services[0].health.kind"));
        assert!(err(&with("{ kind = \"tcp\", path = \"/\" }")).contains("services[0].health.path: only for kind http"));
        assert!(err(&with("{ kind = \"udp\" }")).contains("services[0].health.send"));
        assert!(err(&with("{ kind = \"tcp\", interval = 1, timeout = 2 }")).contains("services[0].health.timeout"));
        assert!(err(&with("{ kind = \"tcp\", on_down = \"end\" }")).contains("services[0].health.on_down"));
        assert!(err(&with("{ kind = \"tcp\", rise = 0 }")).contains("rise/fall"));
    }

    #[test]
    fn runtime_errors_name_the_field() {
        assert!(err(&format!("{GOOD}\n[runtime]\nworkers = 0\n")).contains("runtime.workers"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = \"nowhere\"\n")).contains("runtime.api"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = \"127.0.0.1:9180\"\n")).starts_with("runtime.api: a TCP API needs runtime.api_token_file"));
        let tcp = Config::parse(&format!("{GOOD}\n[runtime]\napi = \"127.0.0.1:9180\"\napi_token_file = \"/etc/vectorlb/api.token\"\n")).unwrap();
        assert_eq!(Config::parse(&tcp.to_toml()).unwrap(), tcp);
        assert!(err(&format!("{GOOD}\n[runtime]\napi_token_file = \"/x\"\n")).starts_with("runtime.api_token_file:"));
        // Several listeners: a unix socket for ctl and an address for browsers.
        let both = Config::parse(&format!("{GOOD}\n[runtime]\napi = [\"unix:/tmp/a.sock\", \"127.0.0.1:9180\"]\napi_token_file = \"/t\"\n")).unwrap();
        assert_eq!(both.runtime.api, ["unix:/tmp/a.sock", "127.0.0.1:9180"]);
        assert_eq!(Config::parse(&both.to_toml()).unwrap(), both);
        assert_eq!(tcp.runtime.api, ["127.0.0.1:9180"]);
        assert!(tcp.to_toml().contains("api = \"127.0.0.1:9180\""), "one endpoint is written as a string");
        assert!(err(&format!("{GOOD}\n[runtime]\napi = [\"unix:/tmp/a.sock\", \"127.0.0.1:9180\"]\n")).starts_with("runtime.api: a TCP API needs runtime.api_token_file"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = []\n")).starts_with("runtime.api: give at least one endpoint"));
        assert!(err(&format!("{GOOD}\n[runtime]\napi = [\"unix:/a\", \"unix:/a\"]\n")).contains("listed twice"));
        let e = err(&format!("{GOOD}\n[runtime]\napi = 7\n"));
        assert!(e.contains("api = 7") && e.contains("or a list of them"), "{e}");
        assert!(err(&format!("{GOOD}\n[runtime]\napi = [\"127.0.0.1:1\"]\napi_group = \"adm\"\napi_token_file = \"/t\"\n")).starts_with("runtime.api_group"));
        assert!(err(&format!("{GOOD}\n[runtime]\nqueue_desc = 1000\n")).contains("runtime.queue_desc"));
        assert!(err(&GOOD.replace("mac = \"02:00:00:00:00:01\"", "")).contains("ports[0].mac"));
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err(&GOOD.replace("\"fnat\"", "\"xnat\"")).contains("services[0].mode"));
        assert!(err(&GOOD.replace("10.0.0.11\", port", "10.0.0.311\", port")).contains("services[0].backends[0].addr"));
        assert!(err(&GOOD.replace("max_sessions", "max_sesions")).contains("unknown field"));
        assert!(err(&GOOD.replace("02:00:00:00:00:01", "02:00:00:00:01")).contains("ports[0].mac"));
        assert!(err(&GOOD.replace("scheduler = \"maglev\"", "scheduler = \"maglev\"\ntable_size = 65536")).contains("not prime"));
        assert!(err(&GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = []")).contains("local address"));
        assert!(err(&GOOD.replace("port = 8080", "port = 8080000")).contains("port"));
    }

    #[test]
    fn nonsense_is_refused_with_the_field_named() {
        for (vip, why) in [("0.0.0.0", "unspecified"), ("255.255.255.255", "broadcast"), ("224.0.0.1", "multicast"), ("127.0.0.1", "loopback")] {
            let e = err(&GOOD.replace("vip = \"10.0.0.100\"", &format!("vip = \"{vip}\"")));
            assert!(e.starts_with("services[0].vip:") && e.contains(why), "{vip}: {e}");
        }
        let v6 = GOOD.replace("10.0.0.1/24", "2001:db8::1/64").replace("10.0.0.11", "2001:db8::11").replace("10.0.0.200", "2001:db8::200");
        for vip in ["::", "::ffff:10.0.0.100", "ff02::1", "::1"] {
            let e = err(&v6.replace("vip = \"10.0.0.100\"", &format!("vip = \"{vip}\"")));
            assert!(e.starts_with("services[0].vip:"), "{vip}: {e}");
        }
        // A VIP's port a service has: refused (it would forward to itself); another port of
        // a VIP: a backend like any (a hostNetwork endpoint on a node address with NodePorts).
        let e = err(&GOOD.replace("{ addr = \"10.0.0.11\", port = 8080", "{ addr = \"10.0.0.100\", port = 80"));
        assert!(e.starts_with("services[0].backends[0].addr:") && e.contains("a VIP with a service on that port"), "{e}");
        Config::parse(&GOOD.replace("{ addr = \"10.0.0.11\"", "{ addr = \"10.0.0.100\"")).expect("another port of a VIP");
        let e = err(&GOOD.replace("{ addr = \"10.0.0.11\"", "{ addr = \"10.0.0.200\""));
        assert!(e.starts_with("services[0].backends[0].addr:"), "{e}");
        let e = err(&GOOD.replace("local_addrs = [\"10.0.0.200\"]", "local_addrs = [\"10.0.0.200\", \"10.0.0.200\"]"));
        assert!(e.starts_with("services[0].local_addrs[1]:") && e.contains("twice"), "{e}");
        let e = err(&GOOD.replace("mac = \"02:00:00:00:00:11\"", "mac = \"ff:ff:ff:ff:ff:ff\""));
        assert!(e.starts_with("neighbors[0].mac:") && e.contains("group"), "{e}");
        let e = err(&GOOD.replace("mac = \"02:00:00:00:00:11\"", "mac = \"01:00:5e:00:00:01\""));
        assert!(e.starts_with("neighbors[0].mac:"), "{e}");
        let e = err(&GOOD.replace("port = 8080", "port = 70000"));
        assert!(e.contains("expected an integer in 0..=65535"), "numbers in the field's terms: {e}");
    }

    #[test]
    fn what_run_refuses_check_refuses() {
        let c = Config::parse(GOOD).unwrap();
        assert!(c.check_for_run().unwrap_err().to_string().starts_with("ports[0].device:"));
        let with_dev = GOOD.replace("mac = \"02:00:00:00:00:01\"", "device = \"net_null0\"");
        Config::parse(&with_dev).unwrap().check_for_run().unwrap();
        let few = format!("{with_dev}\n[runtime]\nmbufs = 1024\n");
        assert!(Config::parse(&few).unwrap().check_for_run().unwrap_err().to_string().starts_with("runtime.mbufs:"));
        let none = "[global]\nmax_sessions = 10\n";
        assert!(Config::parse(none).unwrap().check_for_run().unwrap_err().to_string().starts_with("ports:"));
        // Memory: 4 billion sessions is refused with the figures; a budget can be given.
        let huge = with_dev.replace("max_sessions = 1000", "max_sessions = 4000000000");
        let e = Config::parse(&huge).unwrap().check_for_run_with(24 << 30).unwrap_err().to_string();
        assert!(e.starts_with("global.max_sessions:") && e.contains("MiB") && e.contains("budget is 12288 MiB"), "{e}");
        let ten_m = with_dev.replace("max_sessions = 1000", "max_sessions = 10000000");
        let c = Config::parse(&ten_m).unwrap();
        let (need, resident) = c.session_memory();
        assert!(need > 300 << 20 && need < 700 << 20 && resident < need, "10 M sessions: {need} bytes, {resident} resident at start");
        c.check_for_run_with(24 << 30).unwrap();
        let tight = Config::parse(&format!("{ten_m}\n[runtime]\nmemory_budget_mb = 100\n")).unwrap();
        assert!(tight.check_for_run_with(24 << 30).unwrap_err().to_string().contains("budget is 100 MiB"));
    }

    #[test]
    fn only_regular_text_files_are_read() {
        let dir = std::env::temp_dir().join(format!("vectorlb-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Config::load(Path::new("/dev/urandom")).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } == 0 {
            assert!(Config::load(&fifo).unwrap_err().to_string().contains("not a regular file"), "a FIFO is refused, not read (it would block)");
        }
        let bin = dir.join("bin.toml");
        std::fs::write(&bin, b"[global]\nmax_sessions = 1\n# caf\xe9\n").unwrap();
        let e = Config::load(&bin).unwrap_err().to_string();
        assert!(e.contains("line 3, column 6: not UTF-8"), "{e}");
        let big = dir.join("big.toml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_FILE + 1).unwrap();
        assert!(Config::load(&big).unwrap_err().to_string().contains("at most"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
