//! memif ports: the data plane's end of shared-memory interfaces to pods.
//!
//! Server ports on one socket share one listener (told apart by interface id) and its control
//! thread; each client port has a connector thread. Worker *w* owns queue pair *w* of every
//! memif port, as it owns queue *w* of every DPDK port; its copies go through the worker's CPU
//! copier or, for `copy = "dma"`, its dmadev (`runtime.dma_devices`).

use crate::error::DaemonError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use vectorlb_config::{Config, MemifSpec};
use vectorlb_dpdk::{Mbuf, Mempool, PortStats};
use vectorlb_io::{Copier, RxQueue, TxQueue};
use vectorlb_memif::{
    clientport, ClientConfig, ClientRx, ClientTx, CounterKind, InterfaceConfig, IpRx, IpTx, Link, Mode, QueueCounters, QueueSlot, Server, ServerRx, ServerTx, SharedCopier,
    SocketAddr,
};

/// The largest frame a memif port moves: what one mbuf holds.
pub const MAX_FRAME: usize = 2048;

/// A running memif port.
pub struct MemifPort {
    pub spec: MemifSpec,
    /// The port's own MAC (IP mode writes it into received frames).
    pub mac: [u8; 6],
    pub link: Arc<Link>,
    /// Client role: each queue pair's buffer pool while connected.
    pub slots: Vec<QueueSlot>,
}

/// The control threads of every memif port.
pub struct MemifThreads {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl MemifThreads {
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles {
            let _ = h.join();
        }
    }
}

fn mode(m: &MemifSpec) -> Mode {
    if m.ip_mode() {
        Mode::Ip
    } else {
        Mode::Ethernet
    }
}

/// The MAC that stands for the peer of port `index` when it is an IP-mode memif port (every
/// next hop on it resolves to it: an IP link has no ARP).
pub fn ip_peer_mac(cfg: &Config, index: usize) -> Option<[u8; 6]> {
    cfg.memif.get(index)?.as_ref().filter(|m| m.ip_mode()).map(|_| vectorlb_memif::ipmode::peer_mac(cfg.spec.ports[index].mac))
}

fn addr(index: usize, s: &str) -> Result<SocketAddr, DaemonError> {
    SocketAddr::parse(s).map_err(|why| DaemonError::Memif { index, why })
}

/// Starts every memif port of `cfg` (listening, or connecting); `None` for the other ports.
pub fn start(cfg: &Config) -> Result<(Vec<Option<MemifPort>>, MemifThreads), DaemonError> {
    let queues = cfg.runtime.workers;
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = MemifThreads { stop: stop.clone(), handles: Vec::new() };
    let mut out: Vec<Option<MemifPort>> = cfg.memif.iter().map(|_| None).collect();
    // Servers: one listener per socket.
    let mut by_socket: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, m) in cfg.memif.iter().enumerate() {
        if let Some(m) = m.as_ref().filter(|m| m.is_server()) {
            by_socket.entry(m.socket.as_str()).or_default().push(i);
        }
    }
    for (socket, ports) in by_socket {
        let a = addr(ports[0], socket)?;
        let ifaces = ports
            .iter()
            .map(|&i| {
                let m = cfg.memif[i].as_ref().expect("a memif port");
                InterfaceConfig {
                    id: m.id,
                    name: cfg.spec.ports[i].name.clone(),
                    secret: m.secret.as_ref().map(|s| s.as_bytes().to_vec()),
                    mode: mode(m),
                    queues,
                    max_log2_ring: vectorlb_memif::proto::MAX_LOG2_RING,
                    max_regions: 64,
                    trust_unsealed: m.trust_peer,
                }
            })
            .collect();
        let (server, links) = Server::bind(&a, 0o600, ifaces).map_err(|e| DaemonError::Memif { index: ports[0], why: e.to_string() })?;
        tracing::info!("memif: listening on {a} for {} interface(s)", ports.len());
        threads.handles.push(server.spawn(stop.clone()).map_err(|source| DaemonError::Spawn { what: "the memif control thread".into(), source })?);
        for (&i, link) in ports.iter().zip(links) {
            out[i] = Some(MemifPort { spec: cfg.memif[i].clone().expect("a memif port"), mac: cfg.spec.ports[i].mac, link, slots: Vec::new() });
        }
    }
    // Clients: a connector each.
    for (i, m) in cfg.memif.iter().enumerate() {
        let Some(m) = m.as_ref().filter(|m| !m.is_server()) else { continue };
        let a = addr(i, &m.socket)?;
        let cc = ClientConfig {
            id: m.id,
            name: format!("vectorlb {}", cfg.spec.ports[i].name),
            secret: m.secret.as_ref().map(|s| s.as_bytes().to_vec()),
            mode: mode(m),
            queues,
            log2_ring: m.log2_ring,
            buffer_size: m.buffer_size,
            hugepages: true,
            timeout: std::time::Duration::from_secs(5),
        };
        let (link, slots, h) = clientport::spawn(a, cc, stop.clone()).map_err(|source| DaemonError::Spawn { what: "a memif client thread".into(), source })?;
        threads.handles.push(h);
        out[i] = Some(MemifPort { spec: m.clone(), mac: cfg.spec.ports[i].mac, link, slots });
    }
    Ok((out, threads))
}

/// A worker's copiers: the CPU, and its dmadev when a port asks for one.
pub struct Copiers {
    pub cpu: SharedCopier,
    pub dma: Option<SharedCopier>,
}

impl Copiers {
    pub fn for_port(&self, spec: &MemifSpec) -> SharedCopier {
        match (&self.dma, spec.uses_dma()) {
            (Some(d), true) => d.clone(),
            _ => self.cpu.clone(),
        }
    }
}

pub fn copiers(eal: &Arc<vectorlb_dpdk::Eal>, cfg: &Config, worker: usize) -> Result<Copiers, DaemonError> {
    let cpu = Arc::new(Mutex::new(Copier::cpu()));
    if !cfg.memif.iter().flatten().any(MemifSpec::uses_dma) {
        return Ok(Copiers { cpu, dma: None });
    }
    let names = dma_devices(cfg);
    let name = &names[worker];
    let engine = vectorlb_dpdk::dma::DmaEngine::open(eal, name, 1024).map_err(|e| DaemonError::Dma { worker, why: e.to_string() })?;
    tracing::info!("worker {worker}: memif copies of {} bytes or more go to dmadev {} ({} descriptors)", cfg.runtime.dma_threshold, engine.device(), engine.ring_size());
    Ok(Copiers { cpu, dma: Some(Arc::new(Mutex::new(Copier::new(Box::new(engine), cfg.runtime.dma_threshold)))) })
}

/// The dmadev of each worker: `runtime.dma_devices`, or DPDK's software device, one instance per
/// worker.
pub fn dma_devices(cfg: &Config) -> Vec<String> {
    if cfg.runtime.dma_devices.is_empty() {
        (0..cfg.runtime.workers).map(|w| format!("dma_skeleton{w}")).collect()
    } else {
        cfg.runtime.dma_devices.clone()
    }
}

/// Worker `w`'s queues of a memif port.
pub fn queues(p: &MemifPort, index: usize, w: u16, pool: &Arc<Mempool>, copier: SharedCopier) -> (Box<dyn RxQueue<Mbuf>>, Box<dyn TxQueue<Mbuf>>) {
    let port = index as u16;
    let (rx, tx): (Box<dyn RxQueue<Mbuf>>, Box<dyn TxQueue<Mbuf>>) = if p.spec.is_server() {
        (Box::new(ServerRx::new(p.link.clone(), w, port, pool.clone(), copier.clone(), MAX_FRAME)), Box::new(ServerTx::new(p.link.clone(), w, copier)))
    } else {
        let slot = p.slots[w as usize].clone();
        (Box::new(ClientRx::new(p.link.clone(), slot.clone(), w, port, pool.clone(), copier.clone(), MAX_FRAME)), Box::new(ClientTx::new(p.link.clone(), slot, w, copier)))
    };
    if p.spec.ip_mode() {
        (Box::new(IpRx::new(rx, p.mac, p.link.clone(), w)), Box::new(IpTx::new(tx, p.link.clone(), w)))
    } else {
        (rx, tx)
    }
}

impl MemifPort {
    /// The port's counters in DPDK's terms (for the API's port list and /metrics).
    pub fn stats(&self) -> PortStats {
        let mut s = PortStats::default();
        for q in &self.link.queues {
            let c = q.snapshot();
            s.ipackets += c.rx_packets;
            s.ibytes += c.rx_bytes;
            s.opackets += c.tx_packets;
            s.obytes += c.tx_bytes;
            s.ierrors += c.sum(CounterKind::RxError);
            s.rx_nombuf += c.sum(CounterKind::NoBuffer);
        }
        s
    }

    /// Each queue pair's counters, in queue order.
    pub fn queue_counters(&self) -> Vec<QueueCounters> {
        self.link.queues.iter().map(|q| q.snapshot()).collect()
    }

    pub fn status(&self) -> vectorlb_api::model::MemifStatus {
        let st = self.link.state();
        vectorlb_api::model::MemifStatus {
            role: self.spec.role.clone(),
            socket: self.spec.socket.clone(),
            id: self.spec.id,
            copy: self.spec.copy.clone(),
            mode: self.spec.mode.clone(),
            connected: self.link.is_up(),
            peer: st.peer,
            peer_pid: st.peer_pid,
            connects: st.connects,
            disconnects: st.disconnects,
            last_reason: st.last_reason,
            rings: st.rings.0 as u16,
            ring_size: if st.log2_ring > 0 { 1u32 << st.log2_ring } else { 0 },
            queues: self.link.queues.iter().enumerate().map(|(q, s)| queue_status(q as u16, &s.snapshot())).collect(),
        }
    }
}

/// The API's view of one queue's counters, by name: the counters are declared once (in
/// `vectorlb-memif`) and the API's type refuses a name it does not know or one it misses
/// (tested below), so the two lists cannot part.
fn queue_status(queue: u16, c: &QueueCounters) -> vectorlb_api::model::MemifQueue {
    let mut m = serde_json::Map::new();
    m.insert("queue".into(), queue.into());
    for (name, _, v) in c.fields() {
        m.insert(name.into(), v.into());
    }
    serde_json::from_value(serde_json::Value::Object(m)).expect("vectorlb_api::model::MemifQueue has exactly the memif queue counters")
}

#[cfg(test)]
mod counter_tests {
    use super::*;

    #[test]
    fn every_memif_counter_reaches_the_api_under_its_name() {
        let c = QueueCounters { bad_desc: 7, copies_cpu_fallback: 3, ..Default::default() };
        let q = queue_status(2, &c);
        let v = serde_json::to_value(&q).unwrap();
        let names: Vec<&str> = c.fields().map(|f| f.0).collect();
        assert_eq!(v.as_object().unwrap().len(), names.len() + 1, "{v}");
        assert_eq!((v["queue"].as_u64(), v["bad_desc"].as_u64(), v["copies_cpu_fallback"].as_u64()), (Some(2), Some(7), Some(3)));
    }
}
