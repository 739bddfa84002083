//! The running configuration and how it changes: every change (API, SIGHUP, a learned
//! neighbour, a health check) builds a whole new snapshot for the workers or is refused, and
//! only then becomes the running configuration; the flow director's maps and the health checks
//! follow it.

use crate::error::DaemonError;
use crate::health::Health;
use crate::lock;
use crate::neighbours::Neighbours;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vectorlb_config::{Config, OnDown};
use vectorlb_dpdk::xdp;
use vectorlb_lb::{Control, LbSpec, Mode};

/// The flow director's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpTables {
    /// Our addresses (to: VIPs, local and interface addresses; from: NAT backends, whose
    /// replies cross us) and the host's own.
    pub addrs: Vec<(IpAddr, u32)>,
    /// SNAT source prefixes.
    pub nets: Vec<(IpAddr, u8)>,
    /// Queue sets: each set's services and their backends, and the set's index.
    pub queue_sets: Vec<(xdp::QsMatch, u32)>,
    /// The default set's ingress limit.
    pub police: Option<xdp::Police>,
}

pub struct ConfigStore {
    config: Mutex<Config>,
    path: PathBuf,
    pub control: Arc<Control>,
    neighbours: Arc<Neighbours>,
    health: Arc<Health>,
    /// The kernel interfaces of AF_XDP ports, whose XDP programs hold our addresses.
    xdp_ifaces: Vec<String>,
    /// What the flow director's maps hold now.
    xdp_synced: Mutex<Option<XdpTables>>,
    pub reloads: AtomicU64,
    pub reload_failures: AtomicU64,
    /// The queue sets the workers steer by (swapped when a reload changes them).
    pub queue_sets: Arc<arc_swap::ArcSwap<crate::queue_sets::QueueSets>>,
    /// The queue sets' flow rules on ports that have them.
    pub flows: crate::queue_sets::Flows,
    /// The pods port's interfaces: their addresses are neighbours, the host's interface the
    /// default route of what the configuration does not route.
    pub pods: Option<Arc<crate::pods::PodSet>>,
}

impl ConfigStore {
    pub fn new(config: Config, path: &Path, control: Arc<Control>, neighbours: Arc<Neighbours>, health: Arc<Health>, xdp_ifaces: Vec<String>) -> ConfigStore {
        let sets = crate::queue_sets::QueueSets::new(&config.queue_sets, config.runtime.workers);
        ConfigStore {
            queue_sets: Arc::new(arc_swap::ArcSwap::new(sets)),
            config: Mutex::new(config),
            path: path.to_path_buf(),
            control,
            neighbours,
            health,
            xdp_ifaces,
            xdp_synced: Mutex::new(None),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            flows: crate::queue_sets::Flows::default(),
            pods: None,
        }
    }

    /// The file the configuration came from (and is saved to).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the running configuration.
    pub fn with<T>(&self, f: impl FnOnce(&Config) -> T) -> T {
        f(&lock(&self.config))
    }

    /// Brings the flow director and the health checks in line with the running configuration
    /// (at start).
    pub fn start(&self) {
        let cur = lock(&self.config);
        self.sync_xdp(&cur);
        self.flows.sync(&self.queue_sets.load());
        self.health.reconcile(&cur);
    }

    /// Publishes `new` as the running configuration, all or nothing: ports and runtime
    /// settings must be unchanged (they need a restart), the services must build.
    pub fn apply(&self, mut new: Config) -> Result<u64, DaemonError> {
        let mut cur = lock(&self.config);
        self.apply_locked(&mut cur, &mut new)
    }

    /// Runs `edit` on a copy of the running configuration and applies the result.
    pub fn edit<T, E: From<DaemonError>>(&self, edit: impl FnOnce(&mut Config) -> Result<T, E>) -> Result<T, E> {
        self.edit_generation(edit).map(|(t, _)| t)
    }

    /// [`ConfigStore::edit`], also giving the generation that carries the change.
    pub fn edit_generation<T, E: From<DaemonError>>(&self, edit: impl FnOnce(&mut Config) -> Result<T, E>) -> Result<(T, u64), E> {
        let mut cur = lock(&self.config);
        let mut new = cur.clone();
        let t = edit(&mut new)?;
        let g = self.apply_locked(&mut cur, &mut new)?;
        Ok((t, g))
    }

    fn apply_locked(&self, cur: &mut Config, new: &mut Config) -> Result<u64, DaemonError> {
        if new.devices != cur.devices || new.memif != cur.memif || new.spec.ports.len() != cur.spec.ports.len() {
            return Err(DaemonError::PortsChanged);
        }
        if new.runtime != cur.runtime || new.engine != cur.engine {
            return Err(DaemonError::RuntimeChanged);
        }
        for (i, p) in new.spec.ports.iter_mut().enumerate() {
            if new.mac_from_device[i] {
                p.mac = cur.spec.ports[i].mac;
            }
        }
        let g = self.control.apply(&self.published(new))?;
        let sets_changed = new.queue_sets != cur.queue_sets;
        if sets_changed {
            self.queue_sets.store(crate::queue_sets::QueueSets::new(&new.queue_sets, new.runtime.workers));
        }
        *cur = new.clone();
        if sets_changed {
            self.flows.sync(&self.queue_sets.load());
        }
        self.sync_xdp(cur);
        // A down backend whose check went (or changed: a new check starts up) is up again:
        // published once more, without its weight 0 (the newer generation is returned).
        if self.health.reconcile(cur) {
            return Ok(self.control.apply(&self.published(cur))?);
        }
        Ok(g)
    }

    /// Re-reads the configuration file and applies it (all or nothing).
    pub fn reload(&self) -> Result<u64, DaemonError> {
        let r = Config::load(&self.path).map_err(DaemonError::from).and_then(|c| self.apply(c));
        match &r {
            Ok(_) => self.reloads.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.reload_failures.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    /// Writes the running configuration to its file, atomically, keeping the file's mode and
    /// owner (it may hold `ha.sync_key` and BGP passwords: a new file is 0600).
    pub fn save(&self) -> Result<(PathBuf, usize), DaemonError> {
        let text = lock(&self.config).to_toml();
        vectorlb_http::files::write_atomic(&self.path, text.as_bytes(), vectorlb_http::files::Mode::Keep(0o600))
            .map_err(|source| DaemonError::Save { path: self.path.clone(), source })?;
        Ok((self.path.clone(), text.len()))
    }

    /// What the workers run: the configuration's service model, plus the neighbours learned at
    /// run time (entries in the file win), minus what health checks took down (weight 0, or
    /// left out when its sessions must end).
    fn published(&self, c: &Config) -> LbSpec {
        let mut spec = c.spec.clone();
        if let Some(pods) = &self.pods {
            for (ip, mac) in pods.neighbours() {
                if !spec.neighbors.iter().any(|(a, _)| *a == ip) {
                    spec.neighbors.push((ip, mac));
                }
            }
            // The cluster's service ranges: an address there that no Service has is
            // unreachable. Sent on to the host it would come straight back (the host routes
            // these ranges into the pods port), round and round until its TTL ran out.
            for c in &pods.spec.service_cidrs {
                if let Ok((prefix, len)) = vectorlb_config::prefix("pods.service_cidrs", c) {
                    let via = if prefix.is_ipv4() { std::net::Ipv4Addr::UNSPECIFIED.into() } else { std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) };
                    if !spec.routes.iter().any(|r| r.prefix == prefix && r.len == len) {
                        spec.routes.push(vectorlb_lb::RouteSpec { prefix, len, port: pods.port, via });
                    }
                }
            }
            // The node's addresses with NodePorts are the host's too: what no service has
            // there goes back to the host (which listens on some: health-check node ports).
            if pods.has_host() {
                spec.host_addrs.extend(pods.spec.node_port_addresses.iter().filter_map(|a| a.parse::<std::net::IpAddr>().ok()));
            }
            // The pods' host ports: NAT services of the data plane, never in the file (a
            // service of the configuration on the same address and port wins).
            for (vip, proto, port, addr, bport) in pods.host_port_bindings() {
                if spec.services.iter().any(|s| s.vip == vip && s.port == port && s.proto == proto) {
                    tracing::warn!("host port {vip}:{port}: a configured service has it; the pod's host port is not served");
                    continue;
                }
                spec.services.push(vectorlb_lb::ServiceSpec {
                    vip,
                    port,
                    proto,
                    mode: Mode::Nat,
                    scheduler: vectorlb_sched::Algorithm::Rr,
                    backends: vec![vectorlb_lb::BackendSpec { addr, port: bport, weight: 1, quic_id: None }],
                    local_addrs: Vec::new(),
                    keep_source: Vec::new(),
                    peer_local_addrs: Vec::new(),
                    toa: false,
                    synproxy: vectorlb_lb::SynProxy::Off,
                    timeouts: c.timeouts,
                    continuation: false,
                    quic: false,
                    affinity_ms: 0,
                });
            }
            // The pods' traffic leaving the cluster: source NAT to the egress address of its
            // family, except to the cluster's own networks (after any [[snat]] of the file).
            if pods.has_host() {
                let egress: Vec<std::net::IpAddr> = pods.spec.egress_addresses.iter().filter_map(|a| a.parse().ok()).collect();
                let mut except: Vec<(std::net::IpAddr, u8)> = pods.networks();
                except.extend(pods.spec.cluster_cidrs.iter().chain(&pods.spec.service_cidrs).filter_map(|p| vectorlb_config::prefix("pods", p).ok()));
                for (net, len) in pods.networks() {
                    if let Some(e) = egress.iter().find(|e| e.is_ipv4() == net.is_ipv4()) {
                        spec.snat.push(vectorlb_lb::SnatSpec {
                            source: net,
                            prefix_len: len,
                            addrs: vec![*e],
                            timeouts: c.timeouts,
                            except: except.iter().filter(|(a, _)| a.is_ipv4() == net.is_ipv4()).copied().collect(),
                            outbound_only: true,
                        });
                    }
                }
            }
            if pods.has_host() {
                for a in pods.host_routes() {
                    let (len, via) = if a.is_ipv4() { (32, std::net::IpAddr::V4(crate::pods::HOST_V4)) } else { (128, std::net::IpAddr::V6(crate::pods::HOST_V6)) };
                    if !spec.ports.iter().any(|p| p.addrs.iter().any(|(x, _)| *x == a)) {
                        spec.routes.push(vectorlb_lb::RouteSpec { prefix: a, len, port: pods.port, via });
                    }
                }
                // Other nodes' pod networks (learned by BGP into the host's table) through the host.
                for &(prefix, len) in c.bgp.iter().flat_map(|b| b.import.iter()) {
                    let via = if prefix.is_ipv4() { std::net::IpAddr::V4(crate::pods::HOST_V4) } else { std::net::IpAddr::V6(crate::pods::HOST_V6) };
                    if !spec.routes.iter().any(|r| r.prefix == prefix && r.len == len) {
                        spec.routes.push(vectorlb_lb::RouteSpec { prefix, len, port: pods.port, via });
                    }
                }
                for via in [std::net::IpAddr::V4(crate::pods::HOST_V4), std::net::IpAddr::V6(crate::pods::HOST_V6)] {
                    if !spec.routes.iter().any(|r| r.len == 0 && r.prefix.is_ipv4() == via.is_ipv4()) {
                        let prefix = if via.is_ipv4() { std::net::Ipv4Addr::UNSPECIFIED.into() } else { std::net::Ipv6Addr::UNSPECIFIED.into() };
                        spec.routes.push(vectorlb_lb::RouteSpec { prefix, len: 0, port: pods.port, via });
                    }
                }
            }
        }
        for (ip, n) in self.neighbours.all() {
            if !spec.neighbors.iter().any(|(a, _)| *a == ip) {
                spec.neighbors.push((ip, n.mac));
            }
        }
        for (t, on_down) in self.health.down() {
            for s in spec.services.iter_mut().filter(|s| s.proto == t.proto && s.vip == t.vip && s.port == t.vport) {
                match on_down {
                    OnDown::Keep => s.backends.iter_mut().filter(|b| b.addr == t.addr && b.port == t.port).for_each(|b| b.weight = 0),
                    OnDown::Reset => s.backends.retain(|b| !(b.addr == t.addr && b.port == t.port)),
                }
            }
        }
        spec
    }

    /// Publishes the running configuration again (neighbours or health changed).
    pub fn republish(&self) {
        let cur = lock(&self.config);
        if let Err(e) = self.control.apply(&self.published(&cur)) {
            tracing::warn!("neighbour or health update not applied: {e}");
        }
    }

    /// Writes the flow director's tables again if the host's own addresses changed (the
    /// control thread calls this every few seconds).
    pub fn refresh_host(&self) {
        if let Some(p) = &self.pods {
            if p.has_host() && p.refresh_host_addrs(crate::instance::host_addresses()) {
                self.republish();
            }
        }
        if !self.xdp_ifaces.is_empty() {
            self.sync_xdp(&lock(&self.config));
        }
    }

    /// Writes our addresses into every AF_XDP port's flow director, when they changed; the
    /// queue-set tables only when they changed (rewriting them restarts the policer with a
    /// full burst). What failed is tried again at the next call (every few seconds).
    fn sync_xdp(&self, c: &Config) {
        if self.xdp_ifaces.is_empty() {
            return;
        }
        let tables = xdp_tables(c, &crate::instance::host_addresses());
        let mut last = lock(&self.xdp_synced);
        let addrs_same = last.as_ref().is_some_and(|l| l.addrs == tables.addrs && l.nets == tables.nets);
        let sets_same = last.as_ref().is_some_and(|l| l.queue_sets == tables.queue_sets && l.police == tables.police);
        if addrs_same && sets_same {
            return;
        }
        let mut ok = true;
        for ifname in &self.xdp_ifaces {
            let ifname = ifname.as_str();
            let mut done = Ok(());
            if !addrs_same {
                done = xdp::set_addrs(ifname, &tables.addrs).and_then(|_| xdp::set_source_nets(ifname, &tables.nets));
            }
            if !sets_same {
                done = done.and(xdp::set_queue_sets(ifname, &tables.queue_sets, tables.police));
            }
            if let Err(e) = done {
                ok = false;
                tracing::error!("flow director on {ifname}: {e}");
            }
        }
        // Only what was written is remembered: a failure is written again next time.
        *last = ok.then_some(tables);
    }

    /// What the AF_XDP ports' programs counted of each group of `sets` (the default set's
    /// last), summed over the ports; `None` without AF_XDP ports.
    pub fn xdp_queue_set_stats(&self, sets: &crate::queue_sets::QueueSets) -> Option<Vec<xdp::QsStats>> {
        if self.xdp_ifaces.is_empty() {
            return None;
        }
        let indexes: Vec<u32> = (0..sets.members.len()).map(|g| crate::queue_sets::xdp_index(sets, g)).collect();
        let mut t = vec![xdp::QsStats::default(); indexes.len()];
        for ifname in &self.xdp_ifaces {
            match xdp::queue_set_stats(ifname.as_str(), &indexes) {
                Ok(v) => {
                    for (a, b) in t.iter_mut().zip(v) {
                        a.packets += b.packets;
                        a.bytes += b.bytes;
                        a.policed += b.policed;
                    }
                }
                // A partial sum would look like a counter going back: none this time.
                Err(e) => {
                    tracing::debug!("queue-set counters of {ifname}: {e}");
                    return None;
                }
            }
        }
        Some(t)
    }
}

/// The flow director's tables for a configuration and the host kernel's own addresses (traffic
/// to those stays with the kernel even when it comes from a NAT backend or an SNAT source:
/// the host's health checks and pings get their answers).
pub fn xdp_tables(c: &Config, host: &[IpAddr]) -> XdpTables {
    let mut m: BTreeMap<IpAddr, u32> = BTreeMap::new();
    for a in host {
        *m.entry(*a).or_default() |= xdp::FLAG_HOST;
    }
    for p in &c.spec.ports {
        for (a, _) in &p.addrs {
            *m.entry(*a).or_default() |= xdp::FLAG_DST;
        }
    }
    for s in &c.spec.services {
        *m.entry(s.vip).or_default() |= xdp::FLAG_DST;
        // A peer's local addresses too: after that peer's loss its backends' replies arrive here.
        for a in s.local_addrs.iter().chain(&s.peer_local_addrs) {
            *m.entry(*a).or_default() |= xdp::FLAG_DST;
        }
        if s.mode == Mode::Nat {
            for b in &s.backends {
                *m.entry(b.addr).or_default() |= xdp::FLAG_SRC;
            }
        }
    }
    for r in &c.spec.snat {
        for a in &r.addrs {
            *m.entry(*a).or_default() |= xdp::FLAG_DST;
        }
    }
    let nets = c.spec.snat.iter().map(|r| (r.source, r.prefix_len)).collect();
    // Queue sets: a set's services, and the backends of those services (their replies).
    let mut queue_sets = Vec::new();
    let mut vips = std::collections::HashSet::new();
    for (i, q) in c.queue_sets.iter().enumerate().take(xdp::QS_MAX) {
        for &(vip, port, proto) in &q.services {
            queue_sets.push((xdp::QsMatch::Service { vip, port, proto }, i as u32));
            // Portless packets to a VIP go to the first set with a service on it.
            if vips.insert(vip) {
                queue_sets.push((xdp::QsMatch::Vip { addr: vip }, i as u32));
            }
            let svc = c.spec.services.iter().find(|s| (s.vip, s.port, s.proto) == (vip, port, proto));
            for b in svc.into_iter().flat_map(|s| &s.backends) {
                let port = if b.port == 0 { port } else { b.port };
                queue_sets.push((xdp::QsMatch::Backend { addr: b.addr, port, proto }, i as u32));
            }
        }
    }
    let police = c.default_ingress.map(|r| xdp::Police { pps: r.pps, bps: r.bps, burst_ms: r.burst_ms });
    XdpTables { addrs: m.into_iter().collect(), nets, queue_sets, police }
}
