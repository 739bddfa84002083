//! `vectorlb run`: the load-balancer daemon.
//!
//! Threads: the main thread is the control core ([`control`]: signals, neighbour resolution,
//! publishing configurations); one thread per worker ([`worker`]) owns queue *i* of every port,
//! its hand-off ring and its session table; a tokio runtime (one thread, `vlb-api`) serves the
//! control API and runs the health checks; session sync ([`sync`]) has a sender and a receiver
//! thread when configured; the BGP speaker ([`announce`], over BIRD: [`bgp`]) a thread of its
//! own.
//!
//! The rest of the daemon reaches the workers only through narrow handles: the configuration
//! store ([`config_store`]), the worker registry ([`workers`]), the neighbour table
//! ([`neighbours`]), the HA state ([`ha`]) and the health checks ([`health`]). [`Daemon`] holds
//! them and implements the control API's `LbControl` ([`control_api`]).

pub mod announce;
pub mod bgp;
pub mod config_store;
pub mod control;
pub mod control_api;
pub mod error;
pub mod ha;
pub mod handoff;
pub mod health;
pub mod host_ports;
pub mod instance;
pub mod memif_ports;
pub mod metrics;
pub mod neighbours;
pub mod offload;
pub mod pod_memif;
pub mod pods;
pub mod policy;
pub mod queue_sets;
pub mod rates;
pub mod sessions;
pub mod start;
pub mod steer;
pub mod sync;
pub mod tun;
pub mod worker;
pub mod workers;

pub use error::DaemonError;
pub use start::run;

use config_store::ConfigStore;
use std::sync::{Arc, Mutex, MutexGuard};
use vectorlb_dpdk::{xdp, EthPort, Mempool};
use workers::Workers;

/// Locks a mutex, recovering the data if a thread panicked while holding it (the data are
/// counters and copies of configuration, always left consistent).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port of the running daemon.
pub struct PortRt {
    pub name: String,
    /// The DPDK device string, or `memif:SOCKET#ID` for a memif port.
    pub device: String,
    pub kind: PortKind,
    /// The kernel interface of an AF_XDP port (its XDP program holds our addresses).
    pub xdp_iface: Option<String>,
}

pub enum PortKind {
    Eth(Arc<EthPort>),
    Memif(memif_ports::MemifPort),
    /// The pods port: tun interfaces attached at run time.
    Pods(Arc<pods::PodSet>),
}

impl PortRt {
    pub fn stats(&self) -> vectorlb_dpdk::PortStats {
        match &self.kind {
            PortKind::Eth(p) => p.stats(),
            PortKind::Memif(m) => m.stats(),
            PortKind::Pods(s) => {
                let mut st = vectorlb_dpdk::PortStats::default();
                for t in s.all() {
                    st.ipackets += t.rx.load(std::sync::atomic::Ordering::Relaxed);
                    st.opackets += t.tx.load(std::sync::atomic::Ordering::Relaxed);
                    st.ierrors += t.spoofed.load(std::sync::atomic::Ordering::Relaxed) + t.bad_offload.load(std::sync::atomic::Ordering::Relaxed);
                    st.oerrors += t.tx_dropped.load(std::sync::atomic::Ordering::Relaxed);
                }
                st.oerrors += s.no_pod.load(std::sync::atomic::Ordering::Relaxed);
                st
            }
        }
    }

    pub fn xstats(&self) -> Vec<(String, u64)> {
        match &self.kind {
            PortKind::Eth(p) => p.xstats(),
            // Its counters are metrics of their own (vectorlb_memif_*).
            PortKind::Memif(_) | PortKind::Pods(_) => Vec::new(),
        }
    }

    /// Link state: a memif port is up while a peer is connected.
    pub fn link(&self) -> vectorlb_dpdk::Link {
        match &self.kind {
            PortKind::Eth(p) => p.link(),
            PortKind::Memif(m) => vectorlb_dpdk::Link { up: m.link.is_up(), speed_mbps: 0 },
            PortKind::Pods(_) => vectorlb_dpdk::Link { up: true, speed_mbps: 0 },
        }
    }

    /// The DPDK port id (65535 for a memif port, which is not a DPDK port).
    pub fn port_id(&self) -> u16 {
        match &self.kind {
            PortKind::Eth(p) => p.id(),
            PortKind::Memif(_) | PortKind::Pods(_) => u16::MAX,
        }
    }
}

/// The running daemon, as the control API and the metrics see it.
pub struct Daemon {
    pub config: Arc<ConfigStore>,
    pub workers: Arc<Workers>,
    pub neighbours: Arc<neighbours::Neighbours>,
    pub health: Arc<health::Health>,
    pub ha: Arc<ha::Ha>,
    pub sync: Option<Arc<sync::Sync>>,
    /// The BGP speaker (`[bgp]`).
    pub bgp: Option<Arc<announce::Announcer>>,
    pub ports: Vec<PortRt>,
    pub pool: Arc<Mempool>,
    /// Per-second rates over the last ten seconds (sampled by the control thread).
    pub rates: rates::Rates,
    /// The network policy set (`POST /v1/policy`).
    pub policy: Arc<policy::Store>,
    /// The mesh's steering (`PUT /v1/mesh`), as last set.
    pub mesh: std::sync::Mutex<Option<vectorlb_api::model::MeshSteering>>,
}

impl Daemon {
    /// What keeps the data plane from working: a port whose XDP program is gone or replaced,
    /// a link down, a worker that stopped publishing (stuck or dead). Empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, p) in self.ports.iter().enumerate() {
            if let Some(iface) = &p.xdp_iface {
                match xdp::attached(iface) {
                    Ok(Some(a)) if a.is_ours() => {}
                    Ok(Some(a)) => out.push(format!("ports[{i}] ({}): {iface} runs XDP program '{}' (id {}), not vectorlb's", p.name, a.name, a.id)),
                    Ok(None) => out.push(format!("ports[{i}] ({}): {iface} has no XDP program: the data plane receives nothing", p.name)),
                    Err(e) => out.push(format!("ports[{i}] ({}): {e}", p.name)),
                }
            }
            // A memif port without its pod is not a broken data plane: only device links.
            if matches!(p.kind, PortKind::Eth(_)) && !p.link().up {
                out.push(format!("ports[{i}] ({}): link down", p.name));
            }
        }
        for (w, since) in self.workers.stalled(std::time::Duration::from_secs(1)) {
            out.push(match since {
                Some(d) => format!("worker {w}: no progress for {} ms", d.as_millis()),
                None => format!("worker {w}: never started"),
            });
        }
        out
    }
}
