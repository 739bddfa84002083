//! `vectorlb run`: the load-balancer daemon.
//!
//! Threads: the main thread is the control core ([`control`]: signals, neighbour resolution,
//! publishing configurations); one thread per worker ([`worker`]) owns queue *i* of every port,
//! its hand-off ring and its session table; a tokio runtime (one thread, `vlb-api`) serves the
//! control API and runs the health checks; session sync ([`sync`]) has a sender and a receiver
//! thread when configured.
//!
//! The rest of the daemon reaches the workers only through narrow handles: the configuration
//! store ([`config_store`]), the worker registry ([`workers`]), the neighbour table
//! ([`neighbours`]), the HA state ([`ha`]) and the health checks ([`health`]). [`Daemon`] holds
//! them and implements the control API's `LbControl` ([`control_api`]).

pub mod config_store;
pub mod control;
pub mod control_api;
pub mod error;
pub mod ha;
pub mod health;
pub mod instance;
pub mod memif_ports;
pub mod metrics;
pub mod neighbours;
pub mod queue_sets;
pub mod rates;
pub mod sessions;
pub mod sync;
pub mod worker;
pub mod workers;

pub use error::DaemonError;

use config_store::ConfigStore;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use vectorlb_config::Config;
use vectorlb_dpdk::{xdp, Eal, EthPort, Mbuf, Mempool};
use vectorlb_io::{PacketPool, RxQueue, TxQueue};
use vectorlb_lb::{Control, Worker};
use worker::{PortQueues, WorkerIo, WorkerLoop, WorkerShared};
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
}

impl PortRt {
    pub fn stats(&self) -> vectorlb_dpdk::PortStats {
        match &self.kind {
            PortKind::Eth(p) => p.stats(),
            PortKind::Memif(m) => m.stats(),
        }
    }

    pub fn xstats(&self) -> Vec<(String, u64)> {
        match &self.kind {
            PortKind::Eth(p) => p.xstats(),
            // Its counters are metrics of their own (vectorlb_memif_*).
            PortKind::Memif(_) => Vec::new(),
        }
    }

    /// Link state: a memif port is up while a peer is connected.
    pub fn link(&self) -> vectorlb_dpdk::Link {
        match &self.kind {
            PortKind::Eth(p) => p.link(),
            PortKind::Memif(m) => vectorlb_dpdk::Link { up: m.link.is_up(), speed_mbps: 0 },
        }
    }

    /// The DPDK port id (65535 for a memif port, which is not a DPDK port).
    pub fn port_id(&self) -> u16 {
        match &self.kind {
            PortKind::Eth(p) => p.id(),
            PortKind::Memif(_) => u16::MAX,
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
    pub ports: Vec<PortRt>,
    pub pool: Arc<Mempool>,
    /// Per-second rates over the last ten seconds (sampled by the control thread).
    pub rates: rates::Rates,
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

/// Starts the daemon and runs until SIGTERM / SIGINT.
pub fn run(path: &Path) -> Result<(), DaemonError> {
    let mut cfg = Config::load(path)?;
    cfg.check_for_run()?;
    let rt = cfg.runtime.clone();
    // The locks come first: while another instance holds one of our interfaces or our API
    // endpoint, nothing of its (XDP programs, sockets, files) is touched.
    let devices_given: Vec<&str> = cfg.devices.iter().flatten().map(String::as_str).collect();
    let mut guarded: Vec<instance::Guarded> = devices_given.iter().enumerate().map(|(index, d)| instance::Guarded::Device { index, name: instance::device_key(d) }).collect();
    guarded.extend(rt.api.iter().map(|a| instance::Guarded::Api(a)));
    let _locks = instance::lock(&guarded, Path::new(instance::LOCK_DIR))?;
    let token = rt.api_token_file.as_deref().map(read_token).transpose()?;
    for (i, d) in devices_given.iter().enumerate() {
        if let Some(iface) = xdp::af_xdp_iface(d) {
            instance::clear_stale_xdp(i, iface)?;
        }
    }
    control::install_signals();
    let run_dir = PathBuf::from(&rt.run_dir);
    instance::clear_stale_files(&run_dir);
    let xdp_obj = xdp::write_object(&run_dir)?;
    let mut devices = Vec::new();
    for d in cfg.devices.iter() {
        let Some(d) = d else {
            devices.push(None);
            continue;
        };
        let mut d = d.clone();
        if xdp::af_xdp_iface(&d).is_some() {
            if !d.contains("xdp_prog=") {
                d.push_str(&format!(",xdp_prog={}", xdp_obj.display()));
            }
            if rt.workers > 1 && !d.contains("queue_count=") {
                d.push_str(&format!(",queue_count={}", rt.workers));
            }
        }
        devices.push(Some(d));
    }
    let result = start(path, &mut cfg, &devices, token);
    let _ = std::fs::remove_file(&xdp_obj);
    result
}

/// The API token: the file must be a regular file that only its owner can read.
fn read_token(path: &str) -> Result<String, DaemonError> {
    vectorlb_api::server::read_token(path).map_err(|problem| DaemonError::Token { path: path.to_string(), problem })
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<std::thread::JoinHandle<()>, DaemonError> {
    std::thread::Builder::new().name(name.clone()).spawn(f).map_err(|source| DaemonError::Spawn { what: name, source })
}

fn start(path: &Path, cfg: &mut Config, devices: &[Option<String>], token: Option<String>) -> Result<(), DaemonError> {
    let rt = cfg.runtime.clone();
    let nworkers = rt.workers as usize;
    // The API's endpoint before the ports: a start that cannot serve its API touches no port.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("vlb-api")
        .enable_all()
        .build()
        .map_err(|source| DaemonError::Spawn { what: "the API runtime".into(), source })?;
    let access = vectorlb_api::Access { group: rt.api_group.clone() };
    let mut listeners = Vec::new();
    for a in &rt.api {
        let endpoint: vectorlb_api::Endpoint = a.parse().map_err(vectorlb_api::server::ServerError::from)?;
        // The token guards TCP listeners; a unix socket is guarded by its mode.
        let token = matches!(endpoint, vectorlb_api::Endpoint::Tcp(_)).then(|| token.clone()).flatten();
        listeners.push((runtime.block_on(vectorlb_api::Listener::bind(&endpoint, &access))?, token));
    }
    // memif sockets too, before the EAL: a socket another process serves stops the start here.
    let (mut memifs, memif_threads) = memif_ports::start(cfg)?;
    let mut eal_args = rt.eal.clone();
    let mut eal_devices: Vec<String> = devices.iter().flatten().cloned().collect();
    if cfg.memif.iter().flatten().any(vectorlb_config::MemifSpec::uses_dma) {
        if !eal_args.iter().any(|a| a.starts_with("--iova-mode")) {
            eal_args.push("--iova-mode=va".into());
        }
        for d in memif_ports::dma_devices(cfg) {
            if d.starts_with("dma_skeleton") && !eal_devices.contains(&d) {
                eal_devices.push(d);
            }
        }
    }
    let eal = match Eal::init(&eal_args, &eal_devices) {
        Ok(e) => e,
        Err(e) => {
            memif_threads.stop();
            return Err(e.into());
        }
    };
    let pool = Arc::new(Mempool::new(&eal, "vectorlb", rt.mbufs, 256, 2048 + 128)?);
    let mut ports = Vec::new();
    let mut queues: Vec<Vec<(vectorlb_dpdk::EthRx, vectorlb_dpdk::EthTx)>> = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let name = cfg.spec.ports[i].name.clone();
        let Some(dev) = dev else {
            let m = memifs[i].take().expect("a port without a device is a memif port (checked)");
            let device = format!("memif:{}#{}", m.spec.socket, m.spec.id);
            queues.push(Vec::new());
            ports.push(PortRt { name, device, kind: PortKind::Memif(m), xdp_iface: None });
            continue;
        };
        let perr = |source| DaemonError::Port { index: i, name: name.clone(), source };
        let port = Arc::new(EthPort::find(&eal, dev).map_err(perr)?);
        let mtu = if cfg.mtu_given[i] { cfg.spec.ports[i].mtu } else { 0 };
        port.setup(rt.workers, rt.queue_desc, &pool, mtu).map_err(perr)?;
        port.start().map_err(perr)?;
        if cfg.mac_from_device[i] {
            cfg.spec.ports[i].mac = port.mac().map_err(perr)?;
        } else if port.use_mac(cfg.spec.ports[i].mac).map_err(|source| DaemonError::PortMac { index: i, source })? {
            tracing::warn!("ports[{i}] ({name}): the device cannot take the configured MAC; promiscuous mode is on");
        }
        queues.push(port.queues().map_err(perr)?);
        ports.push(PortRt { name, device: dev.clone(), kind: PortKind::Eth(port), xdp_iface: xdp::af_xdp_iface(dev).map(str::to_string) });
    }
    let control = Control::new(&cfg.spec)?;
    let (ev_tx, ev_rx) = mpsc::channel();
    let mut worker_rx = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..nworkers {
        let (tx, rx) = mpsc::channel();
        worker_rx.push(rx);
        senders.push(tx);
    }
    let sync = cfg.sync.as_ref().map(sync::Sync::bind).transpose()?;
    let workers = Arc::new(Workers::new(senders));
    let neighbours = Arc::new(neighbours::Neighbours::default());
    let health = health::Health::new(ev_tx.clone(), runtime.handle().clone());
    let xdp_ifaces = ports.iter().filter_map(|p| p.xdp_iface.clone()).collect();
    // Queue sets: flow rules on the ports that are not AF_XDP (those have the XDP program).
    let flow_ports = ports
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.kind {
            PortKind::Eth(e) if p.xdp_iface.is_none() => Some((i, p.name.clone(), e.clone())),
            _ => None,
        })
        .collect();
    let mut config = ConfigStore::new(cfg.clone(), path, control.clone(), neighbours.clone(), health.clone(), xdp_ifaces);
    config.flows = crate::queue_sets::Flows::new(flow_ports);
    let config = Arc::new(config);
    let ha = Arc::new(ha::Ha::new(ha::parse(&rt.ha_state).unwrap_or(ha::STANDALONE)));
    let stop = Arc::new(AtomicBool::new(false));
    let daemon = Arc::new(Daemon {
        config: config.clone(),
        workers: workers.clone(),
        neighbours,
        health: health.clone(),
        ha: ha.clone(),
        sync: sync.clone(),
        ports,
        pool: pool.clone(),
        rates: Default::default(),
    });
    config.start();

    // Hand-off rings: worker w consumes ring w; every other worker produces into it.
    let mut inboxes = Vec::new();
    let mut outboxes = Vec::new();
    if nworkers > 1 {
        for w in 0..nworkers {
            let (tx, rx) = vectorlb_dpdk::ring(&eal, &format!("vl_handoff{w}"), 4096)?;
            outboxes.push(tx);
            inboxes.push(Some(rx));
        }
    }
    let (changes_tx, changes_rx) = mpsc::channel();
    let mut handles = Vec::new();
    let mut port_queues: Vec<std::vec::IntoIter<(vectorlb_dpdk::EthRx, vectorlb_dpdk::EthTx)>> = queues.into_iter().map(Vec::into_iter).collect();
    for (w, msgs) in worker_rx.into_iter().enumerate() {
        let mut wc = cfg.worker_config(w as u16, rt.workers);
        // A key attackers cannot guess, and local ports that do not start where the previous
        // run's did (the backends may still hold those connections in TIME_WAIT).
        wc.table.seed = vectorlb_lb::hash::random_seed();
        wc.table.port_offset = vectorlb_lb::hash::random_seed() as u32;
        let worker = Worker::new(control.clone(), wc).map_err(|source| DaemonError::SessionTable { worker: w, source })?;
        let copiers = memif_ports::copiers(&eal, cfg, w)?;
        let io = WorkerIo::<Mbuf> {
            ports: port_queues
                .iter_mut()
                .zip(&daemon.ports)
                .enumerate()
                .map(|(i, (q, p))| match &p.kind {
                    PortKind::Memif(m) => {
                        let (rx, tx) = memif_ports::queues(m, i, w as u16, &pool, copiers.for_port(&m.spec));
                        PortQueues { rx, tx }
                    }
                    PortKind::Eth(_) => {
                        let (rx, tx) = q.next().expect("a queue per worker on every port (set up above)");
                        PortQueues { rx: Box::new(rx) as Box<dyn RxQueue<Mbuf>>, tx: Box::new(tx) as Box<dyn TxQueue<Mbuf>> }
                    }
                })
                .collect(),
            inbox: inboxes.get_mut(w).and_then(Option::take).map(|r| Box::new(r) as Box<dyn RxQueue<Mbuf>>),
            peers: outboxes.iter().enumerate().map(|(v, tx)| (v != w).then(|| Box::new(tx.clone()) as Box<dyn TxQueue<Mbuf>>)).collect(),
            pool: pool.clone() as Arc<dyn PacketPool<Mbuf>>,
        };
        let shared = WorkerShared {
            workers: workers.clone(),
            ha: ha.clone(),
            stop: stop.clone(),
            idle_sleep_us: rt.idle_sleep_us,
            changes: sync.as_ref().map(|_| changes_tx.clone()),
            sync: sync.clone(),
            queue_sets: Some(config.queue_sets.clone()),
        };
        let lp = WorkerLoop::new(w as u16, io, worker, shared, msgs, ev_tx.clone());
        let cpu = rt.cpus.get(w).copied();
        let eal = eal.clone();
        handles.push(spawn(format!("vlb-worker{w}"), move || {
            if let Err(e) = eal.register_thread() {
                tracing::error!("worker {w}: {e}");
            }
            pin(cpu);
            lp.run();
            eal.unregister_thread();
        })?);
    }
    drop(outboxes);
    let router = vectorlb_api::router(daemon.clone());
    // One stop signal per listener: Notify::notify_one stores a permit for a task not yet
    // waiting, so no server misses it.
    let servers: Vec<_> = listeners
        .into_iter()
        .map(|(listener, token)| {
            let stop = Arc::new(tokio::sync::Notify::new());
            let s = stop.clone();
            (stop, runtime.spawn(vectorlb_api::serve(listener, router.clone(), token, async move { s.notified().await })))
        })
        .collect();
    let mut sync_threads = Vec::new();
    if let Some(sy) = &sync {
        let ctx = sync::SyncCtx { workers: workers.clone(), ha: ha.clone(), stop: stop.clone() };
        let (c, s) = (ctx.clone(), sy.clone());
        sync_threads.push(spawn("vlb-sync-tx".into(), move || sync::sender(c, s, changes_rx))?);
        let (c, s) = (ctx, sy.clone());
        sync_threads.push(spawn("vlb-sync-rx".into(), move || sync::receiver(c, s))?);
        tracing::info!("session sync: listening on {}, peers {:?}", sy.spec.listen, sy.spec.peers);
    } else {
        drop(changes_rx);
    }
    drop(changes_tx);
    drop(ev_tx);
    tracing::info!("running: {} port(s), {} worker(s), {} service(s), API on {}", daemon.ports.len(), rt.workers, cfg.spec.services.len(), rt.api.join(", "));
    control::run(&daemon, ev_rx, &stop);
    tracing::info!("stopping: draining workers");
    stop.store(true, Ordering::SeqCst);
    health.stop_all();
    for h in handles.into_iter().chain(sync_threads) {
        let _ = h.join();
    }
    memif_threads.stop();
    for (stop, server) in servers {
        stop.notify_one();
        let _ = runtime.block_on(server);
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    let t = workers.totals();
    tracing::info!("stopped: rx {} tx {} drops {} sessions created {}", t.counters.events.rx, t.counters.events.tx, t.counters.total_drops(), t.counters.events.sessions_created);
    Ok(())
}

/// Pins the calling thread to `cpu`, or lets it run on every CPU (EAL pins the main thread,
/// and threads inherit that).
fn pin(cpu: Option<usize>) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; sched_setaffinity reads
    // exactly size_of::<cpu_set_t>() bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).max(1);
        match cpu {
            Some(c) => libc::CPU_SET(c, &mut set),
            None => (0..n.max(64)).for_each(|c| libc::CPU_SET(c, &mut set)),
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
