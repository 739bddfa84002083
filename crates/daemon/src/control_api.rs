//! The daemon's side of the control API (`vectorlb_api::LbControl`): reads come from the
//! published counters and the running configuration; every change goes through
//! [`ConfigStore::edit`](crate::config_store::ConfigStore::edit), validated and published as a
//! whole or refused.

use crate::health::Target;
use crate::Daemon;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectorlb_api::model::*;
use vectorlb_api::{ApiError, LbControl};
use vectorlb_config::Config;
use vectorlb_lb::service::{backend_slot, key};
use vectorlb_lb::{BackendSpec, Mode, ServiceSpec, SynProxy};
use vectorlb_packet::proto;
use vectorlb_sched::Algorithm;

fn mode_of(m: Mode) -> ModeName {
    match m {
        Mode::Nat => ModeName::Nat,
        Mode::Fnat => ModeName::Fnat,
        Mode::Dr => ModeName::Dr,
        Mode::Tun => ModeName::Tun,
    }
}

fn mode_num(m: ModeName) -> Mode {
    match m {
        ModeName::Nat => Mode::Nat,
        ModeName::Fnat => Mode::Fnat,
        ModeName::Dr => Mode::Dr,
        ModeName::Tun => Mode::Tun,
    }
}

fn scheduler_of(a: &Algorithm) -> SchedulerName {
    match a {
        Algorithm::Rr => SchedulerName::Rr,
        Algorithm::Wrr => SchedulerName::Wrr,
        Algorithm::Wlc => SchedulerName::Wlc,
        Algorithm::Sh { .. } => SchedulerName::Sh,
        Algorithm::Maglev { .. } => SchedulerName::Maglev,
    }
}

/// The scheduler a request asks for: a name and/or a table size over the current one.
fn scheduler(name: Option<SchedulerName>, size: Option<u32>, cur: Option<Algorithm>) -> Result<Option<Algorithm>, ApiError> {
    let mut a = match (name, cur) {
        (Some(n), _) => match n {
            SchedulerName::Rr => Algorithm::Rr,
            SchedulerName::Wrr => Algorithm::Wrr,
            SchedulerName::Wlc => Algorithm::Wlc,
            SchedulerName::Sh => Algorithm::Sh { table_size: vectorlb_sched::MAGLEV_DEFAULT_SIZE },
            SchedulerName::Maglev => Algorithm::Maglev { table_size: vectorlb_sched::MAGLEV_DEFAULT_SIZE },
        },
        (None, Some(c)) => c,
        (None, None) => Algorithm::Wrr,
    };
    if let Some(n) = size {
        match &mut a {
            Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => *table_size = n,
            _ => return Err(ApiError::Unprocessable("table_size: only sh and maglev have a table".into())),
        }
    }
    Ok((name.is_some() || size.is_some() || cur.is_none()).then_some(a))
}

/// The SYN proxy setting an API call asks for (`auto` keeps a configured threshold).
fn synproxy_of(n: Option<SynProxyName>, old: Option<SynProxy>, mode: Mode, p: u8) -> Result<SynProxy, ApiError> {
    let sp = match n {
        None | Some(SynProxyName::Off) => SynProxy::Off,
        Some(SynProxyName::On) => SynProxy::On,
        Some(SynProxyName::Auto) => match old {
            Some(a @ SynProxy::Auto { .. }) => a,
            _ => SynProxy::Auto { half_open: SynProxy::DEFAULT_AUTO_HALF_OPEN },
        },
    };
    if sp != SynProxy::Off && (p != proto::TCP || !matches!(mode, Mode::Nat | Mode::Fnat)) {
        return Err(ApiError::Unprocessable("synproxy: only tcp nat and fnat services (the proxy must see both directions)".into()));
    }
    Ok(sp)
}

fn check_toa(toa: bool, mode: Mode, p: u8) -> Result<(), ApiError> {
    if toa && (mode != Mode::Fnat || p != proto::TCP) {
        return Err(ApiError::Unprocessable("toa: only tcp fnat services can insert the TOA option".into()));
    }
    Ok(())
}

/// Index of a service in a configuration.
fn service_index(c: &Config, k: &ServiceKey) -> Result<usize, ApiError> {
    let p = Proto::number(k.proto);
    c.spec.services.iter().position(|s| s.proto == p && s.vip == k.vip && s.port == k.port).ok_or_else(|| ApiError::NotFound(format!("no {k}")))
}

/// The API's health check as the file's, checked as the file's is.
fn health_spec_of(h: &HealthCheck, protocol: u8) -> Result<vectorlb_config::HealthSpec, ApiError> {
    let raw = vectorlb_config::RawHealth {
        kind: match h.kind {
            HealthKind::Tcp => "tcp",
            HealthKind::Http => "http",
            HealthKind::Https => "https",
            HealthKind::Udp => "udp",
        }
        .into(),
        interval: h.interval_ms.map(|ms| f64::from(ms) / 1000.0),
        timeout: h.timeout_ms.map(|ms| f64::from(ms) / 1000.0),
        rise: h.rise,
        fall: h.fall,
        port: h.port,
        path: h.path.clone(),
        host: h.host.clone(),
        expect_status: h.expect_status,
        send: h.send.clone(),
        expect: h.expect.clone(),
        command: None,
        on_down: h.on_down.map(|o| if o == OnDownName::Reset { "reset" } else { "keep" }.into()),
    };
    vectorlb_config::health_spec("health", &raw, protocol).map_err(|e| ApiError::Unprocessable(e.to_string()))
}

/// A health check as the API shows it (none for an `exec` check from the file).
fn health_check_of(h: &vectorlb_config::HealthSpec) -> Option<HealthCheck> {
    let r = vectorlb_config::raw_health(h);
    let kind = match r.kind.as_str() {
        "tcp" => HealthKind::Tcp,
        "http" => HealthKind::Http,
        "https" => HealthKind::Https,
        "udp" => HealthKind::Udp,
        _ => return None,
    };
    Some(HealthCheck {
        kind,
        interval_ms: Some(h.interval),
        timeout_ms: Some(h.timeout),
        rise: Some(h.rise),
        fall: Some(h.fall),
        port: (h.port != 0).then_some(h.port),
        path: r.path,
        host: r.host,
        expect_status: r.expect_status,
        send: r.send,
        expect: r.expect,
        on_down: Some(if h.on_down == vectorlb_config::OnDown::Reset { OnDownName::Reset } else { OnDownName::Keep }),
    })
}

/// A service of the API as the configuration holds it (validated as one from the file is when
/// the edit is applied).
fn new_service_spec(c: &Config, s: &NewService) -> Result<ServiceSpec, ApiError> {
    let p = Proto::number(s.proto);
    let mode = mode_num(s.mode);
    let sched = scheduler(s.scheduler, s.table_size, None)?.unwrap_or(Algorithm::Wrr);
    check_toa(s.toa, mode, p)?;
    let synproxy = synproxy_of(s.synproxy, None, mode, p)?;
    if mode != Mode::Fnat && !s.peer_local_addrs.is_empty() {
        return Err(ApiError::Unprocessable("peer_local_addrs: only fnat services use peers' local addresses".into()));
    }
    if !matches!(mode, Mode::Fnat | Mode::Nat) && !s.local_addrs.is_empty() {
        return Err(ApiError::Unprocessable("local_addrs: only fnat services (and nat services masquerading clients outside keep_source) use local addresses".into()));
    }
    let mut keep_source = Vec::with_capacity(s.keep_source.len());
    for (i, p) in s.keep_source.iter().enumerate() {
        let (a, len) = vectorlb_config::prefix(&format!("keep_source[{i}]"), p).map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        if a.is_ipv4() != s.vip.is_ipv4() {
            return Err(ApiError::Unprocessable(format!("keep_source[{i}]: '{p}' is not of the VIP's family")));
        }
        keep_source.push((a, len));
    }
    if !keep_source.is_empty() && (mode != Mode::Nat || s.local_addrs.is_empty()) {
        return Err(ApiError::Unprocessable("keep_source: only nat services with local_addrs (the clients outside it are masqueraded to them)".into()));
    }
    Ok(ServiceSpec {
        vip: s.vip,
        port: s.port,
        proto: p,
        mode,
        scheduler: sched,
        backends: s.backends.iter().map(|b| BackendSpec { addr: b.addr, port: b.port, weight: b.weight, quic_id: None }).collect(),
        local_addrs: s.local_addrs.clone(),
        keep_source,
        peer_local_addrs: s.peer_local_addrs.clone(),
        toa: s.toa,
        synproxy,
        // A new service takes the file's global timeouts, as one defined in the file does.
        timeouts: c.timeouts,
        continuation: ServiceSpec::continuation_default(p, mode, sched, synproxy),
        quic: false,
        affinity_ms: match s.affinity_timeout_s.map(vectorlb_lb::affinity::timeout_ms) {
            Some(Ok(ms)) => ms,
            Some(Err(e)) => return Err(ApiError::Unprocessable(format!("affinity_timeout_s: {e}"))),
            None => 0,
        },
    })
}

fn backend_index(c: &Config, i: usize, be: SocketAddr) -> Result<usize, ApiError> {
    c.spec.services[i].backends.iter().position(|b| b.addr == be.ip() && b.port == be.port()).ok_or_else(|| ApiError::NotFound(format!("no backend {be} in the service")))
}

fn ha_state(s: u8) -> HaState {
    match s {
        crate::ha::MASTER => HaState::Master,
        crate::ha::BACKUP => HaState::Backup,
        _ => HaState::Standalone,
    }
}

fn ha_num(s: HaState) -> u8 {
    match s {
        HaState::Master => crate::ha::MASTER,
        HaState::Backup => crate::ha::BACKUP,
        HaState::Standalone => crate::ha::STANDALONE,
    }
}

fn backend_health(s: &crate::health::State) -> BackendHealth {
    BackendHealth {
        state: if s.up { "up" } else { "down" }.into(),
        since_seconds: s.since.elapsed().as_secs_f64(),
        consecutive_successes: s.successes,
        consecutive_failures: s.failures,
        checks: s.checks,
        failed_checks: s.failed_checks,
        transitions: s.transitions,
        last_check_ms: s.last_duration.as_secs_f64() * 1000.0,
        last_error: s.last_error.clone(),
    }
}

fn series(s: crate::rates::Series) -> RateSeries {
    RateSeries { new_sessions_per_second: s.new_sessions.into(), packets_per_second: s.packets.into(), bytes_per_second: s.bytes.into() }
}

fn rates(r: crate::rates::Rate) -> Rates {
    Rates { new_sessions_per_second: r.new_sessions, packets_per_second: r.packets, bytes_per_second: r.bytes }
}

impl Daemon {
    /// Each queue set and the default set, with its counters (empty without sets).
    fn queue_set_status(&self) -> Vec<QueueSetStatus> {
        let sets = self.config.queue_sets.load();
        // Without sets, the default set alone when its ingress is limited.
        if sets.is_empty() && self.config.with(|c| c.default_ingress.is_none()) {
            return Vec::new();
        }
        let xdp = self.config.xdp_queue_set_stats(&sets);
        (0..sets.members.len())
            .map(|g| {
                let spec = sets.specs.get(g);
                let totals = self.workers.group_totals(&sets, g);
                QueueSetStatus {
                    name: sets.name(g).to_string(),
                    workers: sets.members[g].clone(),
                    services: spec.map(|s| s.services.iter().map(|(v, p, pr)| vectorlb_config::service_name(*v, *p, *pr)).collect()).unwrap_or_default(),
                    busy_poll: spec.is_some_and(|s| s.busy_poll),
                    rate_bps: spec.and_then(|s| s.rate).and_then(|r| r.bps),
                    rate_pps: spec.and_then(|s| s.rate).and_then(|r| r.pps),
                    packets: totals.group_packets().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                    queues: totals.queues.summary(),
                    flow_rules: self.config.flows.rules_of(g),
                    xdp: xdp.as_ref().and_then(|v| v.get(g)).map(|x| QueueSetXdp { packets: x.packets, bytes: x.bytes, policed: x.policed }),
                }
            })
            .collect()
    }
}

impl Daemon {
    fn pod_set(&self) -> Result<&Arc<crate::pods::PodSet>, ApiError> {
        self.ports
            .iter()
            .find_map(|p| match &p.kind {
                crate::PortKind::Pods(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| ApiError::NotFound("no pods port in the configuration ([ports.pods])".into()))
    }
}

fn pod_status(t: &crate::pods::PodTun) -> PodStatus {
    use Ordering::Relaxed;
    PodStatus {
        container_id: t.rec.container_id.clone(),
        ifname: t.rec.ifname.clone(),
        netns: t.rec.netns.clone(),
        ips: t.rec.ips.iter().map(|a| a.to_string()).collect(),
        mtu: t.rec.mtu,
        slot: t.rec.slot,
        pod: t.rec.pod.clone(),
        network: t.rec.network.clone(),
        rx_packets: t.rx.load(Relaxed),
        tx_packets: t.tx.load(Relaxed),
        spoofed: t.spoofed.load(Relaxed),
        tx_dropped: t.tx_dropped.load(Relaxed),
        offloads: t.vnet,
        rx_super: t.rx_super.load(Relaxed),
        rx_bad_offload: t.bad_offload.load(Relaxed),
        memif: t.memif.as_ref().map(|m| vectorlb_api::model::PodMemif {
            socket: m.socket.clone(),
            ports: m
                .ranges
                .iter()
                .map(|r| vectorlb_api::model::MemifPorts { proto: if r.proto == crate::pod_memif::Proto::Tcp { "tcp" } else { "udp" }.into(), first: r.first, last: r.last })
                .collect(),
            connected: m.connected(),
        }),
        host_ports: t.rec.host_ports.clone(),
    }
}

fn pod_error(e: crate::pods::PodError) -> ApiError {
    use crate::pods::PodError as P;
    let m = e.to_string();
    match e {
        P::Invalid(_) => ApiError::BadRequest(m),
        P::NoNamespace(_) => ApiError::NoNamespace(m),
        P::Conflict(_) => ApiError::Conflict(m),
        P::Unprocessable(_) => ApiError::Unprocessable(m),
        P::Io(_) => ApiError::Internal(m),
    }
}

impl LbControl for Daemon {
    fn pods(&self) -> Result<Vec<PodStatus>, ApiError> {
        Ok(self.pod_set()?.all().iter().map(|t| pod_status(t)).collect())
    }

    fn add_pod(&self, p: NewPod) -> Result<PodStatus, ApiError> {
        let set = self.pod_set()?;
        let ips = p.addresses().map_err(ApiError::BadRequest)?;
        let mut memif_ports = Vec::new();
        for (i, r) in p.memif_ports.iter().enumerate() {
            use crate::pod_memif::{PortRange, Proto};
            let proto = match r.proto.as_str() {
                "tcp" => Proto::Tcp,
                "udp" => Proto::Udp,
                other => return Err(ApiError::BadRequest(format!("memif_ports[{i}].proto: '{}' is not tcp or udp", other.escape_debug()))),
            };
            memif_ports.push(PortRange { proto, first: r.first, last: r.last });
        }
        crate::pod_memif::check(&memif_ports).map_err(ApiError::BadRequest)?;
        let rec = crate::pods::PodRecord {
            container_id: p.container_id,
            ifname: p.ifname,
            netns: p.netns,
            ips,
            mtu: p.mtu.unwrap_or(set.mtu),
            slot: 0,
            pod: p.pod,
            network: p.network,
            memif_ports,
            host_ports: p.host_ports,
        };
        let tap = set.attach(rec, None).map_err(pod_error)?;
        self.config.republish();
        Ok(pod_status(&tap))
    }

    fn delete_pod(&self, container_id: &str, ifname: &str) -> Result<bool, ApiError> {
        let gone = self.pod_set()?.detach(container_id, ifname).map_err(pod_error)?;
        if gone {
            self.config.republish();
        }
        Ok(gone)
    }

    fn history(&self) -> History {
        let services = self.config.with(|c| c.spec.services.clone());
        History {
            step_seconds: crate::rates::STEP.as_secs_f64(),
            services: services
                .iter()
                .map(|s| {
                    let sk = (s.proto, s.vip, s.port);
                    ServiceHistory {
                        proto: Proto::of(s.proto),
                        vip: s.vip.to_string(),
                        port: s.port,
                        series: series(self.rates.service_history(&sk)),
                        backends: s
                            .backends
                            .iter()
                            .map(|b| BackendHistory { addr: b.addr.to_string(), port: b.port, series: series(self.rates.backend_history(&(sk, b.addr, b.port))) })
                            .collect(),
                    }
                })
                .collect(),
        }
    }

    fn health(&self) -> Health {
        let mut problems = self.problems();
        if let Some(a) = &self.bgp {
            problems.extend(a.problems());
        }
        Health { status: if problems.is_empty() { "ok" } else { "degraded" }.into(), generation: self.config.control.generation(), problems, bgp: self.bgp() }
    }

    fn services(&self) -> Vec<ServiceStatus> {
        let snap = self.config.control.snapshot();
        let t = self.workers.totals();
        let (services, checks) = self.config.with(|c| (c.spec.services.clone(), c.health.clone()));
        services
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let id = snap.lookup_service(key(s.vip), s.port, s.proto);
                let sk = (s.proto, s.vip, s.port);
                let sc = id.and_then(|i| t.counters.services.get(i as usize)).copied().unwrap_or_default();
                let backends = s
                    .backends
                    .iter()
                    .map(|b| {
                        let found = id.and_then(|i| snap.backends().find(|x| x.svc == i && x.addr == b.addr && x.port == b.port));
                        let slot = found.map(|x| backend_slot(x.id) as usize);
                        let bc = slot.and_then(|k| t.counters.backends.get(k)).copied().unwrap_or_default();
                        let target = Target { proto: s.proto, vip: s.vip, vport: s.port, addr: b.addr, port: b.port };
                        BackendStatus {
                            addr: b.addr.to_string(),
                            port: b.port,
                            weight: b.weight,
                            resolved: found.is_some_and(|x| x.hop.is_some()),
                            active_sessions: slot.and_then(|k| t.active.get(k)).copied().unwrap_or(0) as u64,
                            packets: bc.packets,
                            bytes: bc.bytes,
                            new_sessions: bc.new_sessions,
                            rates: rates(self.rates.backend(&(sk, b.addr, b.port))),
                            health: self.health.state(&target).as_ref().map(backend_health),
                        }
                    })
                    .collect();
                ServiceStatus {
                    vip: s.vip.to_string(),
                    port: s.port,
                    proto: Proto::of(s.proto),
                    mode: mode_of(s.mode),
                    scheduler: scheduler_of(&s.scheduler),
                    table_size: match s.scheduler {
                        Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => Some(table_size),
                        _ => None,
                    },
                    local_addrs: s.local_addrs.iter().map(IpAddr::to_string).collect(),
                    keep_source: s.keep_source.iter().map(|(a, l)| format!("{a}/{l}")).collect(),
                    peer_local_addrs: s.peer_local_addrs.iter().map(IpAddr::to_string).collect(),
                    toa: s.toa,
                    synproxy: match s.synproxy {
                        SynProxy::Off => SynProxyName::Off,
                        SynProxy::On => SynProxyName::On,
                        SynProxy::Auto { .. } => SynProxyName::Auto,
                    },
                    affinity_timeout_s: (s.affinity_ms > 0).then_some(s.affinity_ms / 1000),
                    timeouts: {
                        let t = &s.timeouts;
                        let secs = |ms: u32| ms as f64 / 1000.0;
                        ServiceTimeouts {
                            syn: secs(t.syn),
                            established: secs(t.established),
                            fin: secs(t.fin),
                            time_wait: secs(t.time_wait),
                            close: secs(t.close),
                            udp: secs(t.udp),
                        }
                    },
                    health: checks.get(i).cloned().flatten().and_then(|h| health_check_of(&h)),
                    backends,
                    stats: ServiceStats {
                        packets: sc.packets,
                        bytes: sc.bytes,
                        new_sessions: sc.new_sessions,
                        new_sessions_per_second: self.rates.service(&sk).new_sessions,
                        rates: rates(self.rates.service(&sk)),
                    },
                }
            })
            .collect()
    }

    fn add_service(&self, s: NewService) -> Result<(), ApiError> {
        let key = ServiceKey { proto: s.proto, vip: s.vip, port: s.port };
        self.config.edit(|c| {
            if service_index(c, &key).is_ok() {
                return Err(ApiError::Conflict(format!("exists: {key} is already defined")));
            }
            let spec = new_service_spec(c, &s)?;
            let health = s.health.as_ref().map(|h| health_spec_of(h, Proto::number(s.proto))).transpose()?;
            c.spec.services.push(spec);
            c.health.push(health);
            Ok(())
        })
    }

    fn batch(&self, ops: Vec<BatchOp>) -> Result<u64, ApiError> {
        let ((), generation) = self.config.edit_generation(|c| {
            for (i, op) in ops.iter().enumerate() {
                let at = |e: ApiError| ApiError::Op { index: i, error: Box::new(ApiError::Unprocessable(e.to_string())) };
                match op {
                    BatchOp::Put(s) => {
                        let spec = new_service_spec(c, s).map_err(at)?;
                        let health = s.health.as_ref().map(|h| health_spec_of(h, Proto::number(s.proto))).transpose().map_err(at)?;
                        match service_index(c, &ServiceKey { proto: s.proto, vip: s.vip, port: s.port }) {
                            // Replaced in place, its health check with it (none: no check).
                            Ok(j) => {
                                c.spec.services[j] = spec;
                                if c.health.len() <= j {
                                    c.health.resize(j + 1, None);
                                }
                                c.health[j] = health;
                            }
                            Err(_) => {
                                c.spec.services.push(spec);
                                c.health.push(health);
                            }
                        }
                    }
                    BatchOp::Delete(r) => {
                        if let Ok(j) = service_index(c, &ServiceKey { proto: r.proto, vip: r.vip, port: r.port }) {
                            c.spec.services.remove(j);
                            if j < c.health.len() {
                                c.health.remove(j);
                            }
                        }
                    }
                }
            }
            Ok::<(), ApiError>(())
        })?;
        Ok(generation)
    }

    fn edit_service(&self, k: ServiceKey, patch: ServicePatch) -> Result<(), ApiError> {
        self.config.edit(|c| {
            let i = service_index(c, &k)?;
            let s = &mut c.spec.services[i];
            if let Some(a) = scheduler(patch.scheduler, patch.table_size, Some(s.scheduler))? {
                s.scheduler = a;
            }
            if let Some(t) = patch.toa {
                check_toa(t, s.mode, s.proto)?;
                s.toa = t;
            }
            if let Some(n) = patch.synproxy {
                s.synproxy = synproxy_of(Some(n), Some(s.synproxy), s.mode, s.proto)?;
            }
            Ok(())
        })
    }

    fn delete_service(&self, k: ServiceKey) -> Result<(), ApiError> {
        self.config.edit(|c| {
            let i = service_index(c, &k)?;
            c.spec.services.remove(i);
            if i < c.health.len() {
                c.health.remove(i);
            }
            Ok(())
        })
    }

    fn add_backend(&self, k: ServiceKey, b: NewBackend) -> Result<(), ApiError> {
        self.config.edit(|c| {
            let i = service_index(c, &k)?;
            let s = &mut c.spec.services[i];
            if s.backends.iter().any(|x| x.addr == b.addr && x.port == b.port) {
                return Err(ApiError::Conflict(format!("exists: backend {} is already in the service", SocketAddr::new(b.addr, b.port))));
            }
            s.backends.push(BackendSpec { addr: b.addr, port: b.port, weight: b.weight, quic_id: None });
            Ok(())
        })
    }

    fn set_weight(&self, k: ServiceKey, be: SocketAddr, weight: u32) -> Result<(), ApiError> {
        self.config.edit(|c| {
            let i = service_index(c, &k)?;
            let j = backend_index(c, i, be)?;
            c.spec.services[i].backends[j].weight = weight;
            Ok(())
        })
    }

    fn delete_backend(&self, k: ServiceKey, be: SocketAddr) -> Result<(), ApiError> {
        self.config.edit(|c| {
            let i = service_index(c, &k)?;
            let j = backend_index(c, i, be)?;
            c.spec.services[i].backends.remove(j);
            Ok(())
        })
    }

    fn sessions(&self, q: SessionQuery) -> Result<SessionPage, ApiError> {
        let page = self.workers.sessions(q.worker as usize, q.cursor as usize, q.limit as usize, q.v6)?;
        Ok(SessionPage { worker: q.worker, family: if q.v6 { 6 } else { 4 }, sessions: page.sessions, next_cursor: page.next.map(|n| n as u64) })
    }

    fn stats(&self) -> Stats {
        let t = self.workers.totals();
        let c = &t.counters;
        Stats {
            uptime_seconds: self.workers.started.elapsed().as_secs_f64(),
            generation: self.config.control.generation(),
            workers: self.workers.len() as u16,
            packets: c.events.iter().map(|(n, _, v)| (n.to_string(), v)).collect(),
            drops: c.drop_counts().map(|(n, v)| (n.to_string(), v)).collect(),
            sessions: t.sessions as u64,
            io: t.io.iter().map(|(n, _, v)| (n.to_string(), v)).collect(),
            reloads: self.config.reloads.load(Ordering::Relaxed),
            reload_failures: self.config.reload_failures.load(Ordering::Relaxed),
            mbufs_available: self.pool.available() as u64,
            ha: self.ha(),
            sync: self.sync(),
            bgp: self.bgp(),
            rates: {
                let g = self.rates.global();
                GlobalRates {
                    window_seconds: g.window,
                    rx_packets_per_second: g.rx,
                    tx_packets_per_second: g.tx,
                    drops_per_second: g.drops,
                    new_sessions_per_second: g.new_sessions,
                    drops_by_reason: self.rates.drops().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                }
            },
            queue_sets: self.queue_set_status(),
        }
    }

    fn ports(&self) -> Vec<PortStatus> {
        let macs: Vec<String> = self.config.with(|c| c.spec.ports.iter().map(|p| vectorlb_config::format_mac(&p.mac)).collect());
        self.ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let s = p.stats();
                let l = p.link();
                PortStatus {
                    name: p.name.clone(),
                    device: p.device.clone(),
                    port_id: p.port_id(),
                    mac: macs.get(i).cloned().unwrap_or_default(),
                    link_up: l.up,
                    speed_mbps: l.speed_mbps,
                    xdp_interface: p.xdp_iface.clone(),
                    memif: match &p.kind {
                        crate::PortKind::Memif(m) => Some(m.status()),
                        crate::PortKind::Eth(_) | crate::PortKind::Pods(_) => None,
                    },
                    rates: {
                        let r = self.rates.port(&p.name);
                        PortRates { rx_packets_per_second: r[0], tx_packets_per_second: r[1], rx_bytes_per_second: r[2], tx_bytes_per_second: r[3] }
                    },
                    counters: s.named().iter().map(|(n, v)| (n.to_string(), *v)).collect(),
                }
            })
            .collect()
    }

    fn neighbors(&self) -> Vec<Neighbor> {
        let mut v: Vec<Neighbor> = self.config.with(|c| {
            c.spec.neighbors.iter().map(|(a, m)| Neighbor { ip: a.to_string(), mac: vectorlb_config::format_mac(m), is_static: true, port: None, age_seconds: None }).collect()
        });
        for (a, n) in self.neighbours.all() {
            v.push(Neighbor {
                ip: a.to_string(),
                mac: vectorlb_config::format_mac(&n.mac),
                is_static: false,
                port: Some(n.port),
                age_seconds: Some(n.seen.elapsed().as_secs_f64()),
            });
        }
        v
    }

    fn config_toml(&self) -> String {
        self.config.with(Config::to_toml)
    }

    fn reload(&self) -> Result<u64, ApiError> {
        Ok(self.config.reload()?)
    }

    fn save(&self) -> Result<Saved, ApiError> {
        let (path, bytes) = self.config.save()?;
        Ok(Saved { saved: path.display().to_string(), bytes: bytes as u64 })
    }

    fn ha(&self) -> HaStatus {
        HaStatus {
            state: ha_state(self.ha.state()),
            since_seconds: self.ha.since().as_secs_f64(),
            transitions: self.ha.transitions.load(Ordering::Relaxed),
            announcements: self.ha.announcements.load(Ordering::Relaxed),
        }
    }

    fn set_ha(&self, state: HaState) -> HaState {
        ha_state(self.ha.set(ha_num(state), &self.config, &self.workers))
    }

    fn sync(&self) -> SyncStatus {
        self.sync.as_ref().map(|s| s.status()).unwrap_or_default()
    }

    fn bgp(&self) -> Option<BgpStatus> {
        self.bgp.as_ref().map(|a| a.status())
    }

    fn drain(&self, c: DrainChange) -> Result<BgpStatus, ApiError> {
        let a = self.bgp.as_ref().ok_or_else(|| ApiError::NotFound("no [bgp] in the configuration: there is nothing to drain".into()))?;
        a.drain(c.drain, c.deadline_seconds);
        // Answer once the withdrawal is on its way (or the announcement, on its next tick).
        a.settle(std::time::Duration::from_secs(5));
        Ok(a.status())
    }

    fn policy(&self) -> PolicyStatus {
        self.policy.status()
    }

    fn change_policy(&self, c: PolicyChanges) -> Result<PolicyStatus, ApiError> {
        self.policy.apply(c).map_err(ApiError::BadRequest)
    }

    fn policy_denied(&self, after: u64) -> PolicyDeniedLog {
        self.policy.denied(after)
    }

    fn mesh(&self) -> MeshStatus {
        let cur = self.mesh.lock().unwrap_or_else(|e| e.into_inner());
        mesh_status(cur.as_ref(), self.pod_set().ok().map(|s| s.all()).unwrap_or_default())
    }

    fn set_mesh(&self, m: MeshSteering) -> Result<MeshStatus, ApiError> {
        if m.members.len() > MAX_MESH_MEMBERS {
            return Err(ApiError::BadRequest(format!("members: {} addresses, at most {MAX_MESH_MEMBERS}", m.members.len())));
        }
        if m.tunnel_port == Some(0) {
            return Err(ApiError::BadRequest("tunnel_port: 1 to 65535".into()));
        }
        let set = self.pod_set()?;
        let pods = set.all();
        let proxy = pods.iter().find(|t| t.rec.container_id == m.proxy_container_id && t.rec.ifname == m.proxy_ifname).ok_or_else(|| {
            ApiError::NotFound(format!("proxy_container_id, proxy_ifname: no pod attachment {}/{}", m.proxy_container_id.escape_debug(), m.proxy_ifname.escape_debug()))
        })?;
        let spec = vectorlb_lb::mesh::MeshSpec {
            proxy: proxy.rec.ips.clone(),
            proxy_mac: crate::pods::slot_mac(proxy.rec.slot),
            members: m.members.clone(),
            tunnel_port: m.tunnel_port.unwrap_or(15008),
        };
        let mut cur = self.mesh.lock().unwrap_or_else(|e| e.into_inner());
        // The proxy may send from any address before its packets are steered to it.
        proxy.mesh_proxy.store(true, Ordering::Relaxed);
        if let Err(e) = self.config.control.apply_mesh(&spec) {
            if !cur.as_ref().is_some_and(|c| c.proxy_container_id == m.proxy_container_id && c.proxy_ifname == m.proxy_ifname) {
                proxy.mesh_proxy.store(false, Ordering::Relaxed);
            }
            return Err(ApiError::BadRequest(e));
        }
        for t in &pods {
            if !std::ptr::eq(t.as_ref(), proxy.as_ref()) {
                t.mesh_proxy.store(false, Ordering::Relaxed);
            }
        }
        *cur = Some(m);
        Ok(mesh_status(cur.as_ref(), pods))
    }

    fn clear_mesh(&self) -> MeshStatus {
        let mut cur = self.mesh.lock().unwrap_or_else(|e| e.into_inner());
        self.config.control.clear_mesh();
        let pods = self.pod_set().ok().map(|s| s.all()).unwrap_or_default();
        for t in &pods {
            t.mesh_proxy.store(false, Ordering::Relaxed);
        }
        *cur = None;
        mesh_status(None, pods)
    }

    fn metrics(&self) -> String {
        crate::metrics::render(self)
    }
}

fn mesh_status(m: Option<&MeshSteering>, pods: Vec<Arc<crate::pods::PodTun>>) -> MeshStatus {
    let Some(m) = m else { return MeshStatus::default() };
    let proxy = pods.iter().find(|t| t.rec.container_id == m.proxy_container_id && t.rec.ifname == m.proxy_ifname);
    let members: std::collections::HashSet<&IpAddr> = m.members.iter().collect();
    MeshStatus {
        enabled: !members.is_empty(),
        proxy: Some(format!("{}/{}", m.proxy_container_id, m.proxy_ifname)),
        proxy_ips: proxy.map(|t| t.rec.ips.iter().map(|a| a.to_string()).collect()).unwrap_or_default(),
        members: members.len() as u64,
        tunnel_port: m.tunnel_port.unwrap_or(15008),
    }
}
