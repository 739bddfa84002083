//! The daemon's start and stop (`vectorlb run`), step by step in the order that lets a failed
//! start leave nothing behind: the locks, the API's listeners and the memif sockets (a second
//! instance stops there), the EAL and the ports, the handles the rest of the daemon uses, the
//! workers and the sync threads; then the control loop until SIGTERM, and the stop.

use crate::config_store::ConfigStore;
use crate::memif_ports::{self, MemifPort};
use crate::worker::{PortQueues, WorkerIo, WorkerLoop, WorkerShared};
use crate::workers::{Event, WorkerMsg, Workers};
use crate::{control, ha, health, instance, neighbours, sync, Daemon, DaemonError, PortKind, PortRt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use vectorlb_config::Config;
use vectorlb_dpdk::{xdp, Eal, EthPort, EthRx, EthTx, Mbuf, Mempool};
use vectorlb_io::{PacketPool, RxQueue, TxQueue};
use vectorlb_lb::{Control, Worker};

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
    let devices = device_strings(&cfg, &xdp_obj);
    let result = start(path, &mut cfg, &devices, token);
    let _ = std::fs::remove_file(&xdp_obj);
    result
}

/// The DPDK device strings: AF_XDP ones get our XDP program and a queue per worker.
fn device_strings(cfg: &Config, xdp_obj: &Path) -> Vec<Option<String>> {
    cfg.devices
        .iter()
        .map(|d| {
            let mut d = d.clone()?;
            if xdp::af_xdp_iface(&d).is_some() {
                if !d.contains("xdp_prog=") {
                    d.push_str(&format!(",xdp_prog={}", xdp_obj.display()));
                }
                if cfg.runtime.workers > 1 && !d.contains("queue_count=") {
                    d.push_str(&format!(",queue_count={}", cfg.runtime.workers));
                }
            }
            Some(d)
        })
        .collect()
}

/// The API token: the file must be a regular file that only its owner can read.
fn read_token(path: &str) -> Result<String, DaemonError> {
    vectorlb_api::server::read_token(path).map_err(|problem| DaemonError::Token { path: path.to_string(), problem })
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, DaemonError> {
    std::thread::Builder::new().name(name.clone()).spawn(f).map_err(|source| DaemonError::Spawn { what: name, source })
}

type ApiListeners = Vec<(vectorlb_api::Listener, Option<String>)>;
type EthQueues = Vec<Vec<(EthRx, EthTx)>>;

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
    let listeners = bind_api(&runtime, cfg, &token)?;
    // memif sockets too, before the EAL: a socket another process serves stops the start here.
    let (mut memifs, memif_threads) = memif_ports::start(cfg)?;
    let eal = match init_eal(cfg, devices) {
        Ok(e) => e,
        Err(e) => {
            memif_threads.stop();
            return Err(e);
        }
    };
    let pool = Arc::new(Mempool::new(&eal, "vectorlb", rt.mbufs, 256, 2048 + 128)?);
    let (ports, queues) = open_ports(&eal, cfg, devices, &pool, &mut memifs)?;

    // The handles the rest of the daemon reaches the workers and the configuration through.
    let control = Control::new(&cfg.spec)?;
    let (ev_tx, ev_rx) = mpsc::channel();
    let (senders, worker_rx): (Vec<_>, Vec<_>) = (0..nworkers).map(|_| mpsc::channel()).unzip();
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
    config.pods = ports.iter().find_map(|p| match &p.kind {
        PortKind::Pods(s) => Some(s.clone()),
        _ => None,
    });
    let config = Arc::new(config);
    let ha = Arc::new(ha::Ha::new(ha::parse(&rt.ha_state).unwrap_or(ha::STANDALONE)));
    let stop = Arc::new(AtomicBool::new(false));
    // BIRD before the workers: a node that cannot announce does not start.
    let bird = match &cfg.bgp {
        Some(spec) => Some((
            Arc::new(crate::announce::Announcer::new(spec)),
            crate::bgp::Bird::start(spec, &PathBuf::from(&rt.run_dir).join("bird")).map_err(|source| DaemonError::Spawn { what: "BIRD ([bgp])".into(), source })?,
        )),
        None => None,
    };
    let daemon = Arc::new(Daemon {
        config: config.clone(),
        workers: workers.clone(),
        neighbours,
        health: health.clone(),
        ha: ha.clone(),
        sync: sync.clone(),
        bgp: bird.as_ref().map(|(a, _)| a.clone()),
        ports,
        pool: pool.clone(),
        rates: Default::default(),
        policy: Arc::new(crate::policy::Store::new(config.control.clone())),
        mesh: std::sync::Mutex::new(None),
    });
    config.start();
    if config.pods.is_some() {
        // The pods taken back (and the host's routes) are neighbours and routes of their own.
        config.republish();
    }

    let (changes_tx, changes_rx) = mpsc::channel();
    let hold = Arc::new(AtomicBool::new(false));
    let shared = WorkerShared {
        workers: workers.clone(),
        ha: ha.clone(),
        stop: stop.clone(),
        hold: hold.clone(),
        idle_sleep_us: rt.idle_sleep_us,
        changes: sync.as_ref().map(|_| changes_tx.clone()),
        sync: sync.clone(),
        queue_sets: Some(config.queue_sets.clone()),
    };
    let handles = spawn_workers(&eal, cfg, &daemon, &control, queues, worker_rx, &shared, &ev_tx)?;
    drop(shared);
    // The sessions the previous run wrote when it stopped (a planned restart).
    crate::handoff::restore(&workers, &rt.run_dir);
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
        let (c, s) = (ctx.clone(), sy.clone());
        sync_threads.push(spawn("vlb-sync-rx".into(), move || sync::receiver(c, s))?);
        let (c, s) = (ctx, sy.clone());
        sync_threads.push(spawn("vlb-sync-bulk".into(), move || sync::bulk_sender(c, s))?);
        tracing::info!("session sync: listening on {}, peers {:?}", sy.spec.listen, sy.spec.peers);
    } else {
        drop(changes_rx);
    }
    drop(changes_tx);
    drop(ev_tx);
    let bgp_thread = match bird {
        Some((a, bird)) => {
            let d = daemon.clone();
            Some(spawn("vlb-bgp".into(), move || a.run(&d, bird))?)
        }
        None => None,
    };
    tracing::info!("running: {} port(s), {} worker(s), {} service(s), API on {}", daemon.ports.len(), rt.workers, cfg.spec.services.len(), rt.api.join(", "));
    control::run(&daemon, ev_rx, &stop);

    // Withdraw first, and serve while the routers hear it; then stop the data plane.
    if let (Some(a), Some(t)) = (&daemon.bgp, bgp_thread) {
        tracing::info!("stopping: withdrawing the VIPs from BGP");
        a.stop();
        let _ = t.join();
    }

    // The sessions for the next run: the workers stop taking packets first (a connection
    // opened while they were written would have no session after the restart), and still
    // answer the export. What the pods send meanwhile their kernels send again.
    hold.store(true, Ordering::SeqCst);
    match crate::handoff::save(&workers, &rt.run_dir) {
        Ok(n) => tracing::info!("stopping: {n} sessions written for the next start ({})", crate::handoff::path(&rt.run_dir).display()),
        Err(e) => tracing::warn!("stopping: the sessions could not be written for the next start: {e}"),
    }
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

/// The API's endpoints, bound (the token guards TCP listeners; a unix socket is guarded by its
/// mode and group).
fn bind_api(runtime: &tokio::runtime::Runtime, cfg: &Config, token: &Option<String>) -> Result<ApiListeners, DaemonError> {
    let access = vectorlb_api::Access { group: cfg.runtime.api_group.clone() };
    let mut listeners = Vec::new();
    for a in &cfg.runtime.api {
        let endpoint: vectorlb_api::Endpoint = a.parse().map_err(vectorlb_api::server::ServerError::from)?;
        let token = matches!(endpoint, vectorlb_api::Endpoint::Tcp(_)).then(|| token.clone()).flatten();
        listeners.push((runtime.block_on(vectorlb_api::Listener::bind(&endpoint, &access))?, token));
    }
    Ok(listeners)
}

/// The EAL with the configured devices, plus what memif ports that copy by DMA need (IOVA as
/// VA, the software DMA devices).
fn init_eal(cfg: &Config, devices: &[Option<String>]) -> Result<Arc<Eal>, DaemonError> {
    let mut eal_args = cfg.runtime.eal.clone();
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
    Ok(Eal::init(&eal_args, &eal_devices)?)
}

/// Every port in file order: a memif port as [`memif_ports::start`] made it, or a DPDK device
/// set up with a queue per worker, started and given its MAC; and each device's queues.
fn open_ports(
    eal: &Arc<Eal>,
    cfg: &mut Config,
    devices: &[Option<String>],
    pool: &Arc<Mempool>,
    memifs: &mut [Option<MemifPort>],
) -> Result<(Vec<PortRt>, EthQueues), DaemonError> {
    let rt = &cfg.runtime;
    let mut ports = Vec::new();
    let mut queues = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let name = cfg.spec.ports[i].name.clone();
        if let Some(spec) = cfg.pods.get(i).cloned().flatten() {
            let p = &cfg.spec.ports[i];
            let set = Arc::new(crate::pods::PodSet::new(i as u16, p.mac, p.mtu, p.addrs.clone(), spec).map_err(|e| DaemonError::Pods(e.to_string()))?);
            // The pods' memifs: buffers from the daemon's pool, copies by the CPU. The thread
            // that runs their handshakes ends when the set goes.
            let io = crate::pod_memif::MemifIo { pool: pool.clone(), copier: Arc::new(std::sync::Mutex::new(vectorlb_io::Copier::cpu())) };
            set.enable_memif(io).map_err(|source| DaemonError::Spawn { what: "the pods' memif thread".into(), source })?;
            if set.spec.offloads {
                // Buffers for the pods' super-packets; without them, plain interfaces.
                match Mempool::new(eal, &format!("vectorlb-pods{i}"), crate::pods::BIG_BUFFERS, 16, u16::MAX) {
                    Ok(big) => set.enable_offloads(Arc::new(big)),
                    Err(e) => tracing::warn!("ports[{i}] ({name}): no buffers for super-packets ({e}): the pods' interfaces get no offloads"),
                }
            }
            set.attach_host().map_err(|e| DaemonError::Pods(e.to_string()))?;
            set.refresh_host_addrs(crate::instance::host_addresses());
            let (ok, gone) = set.restore();
            tracing::info!("ports[{i}] ({name}): pods port, {ok} pod interface(s) taken back, {gone} forgotten (their namespace is gone)");
            if !set.spec.host_interface.is_empty() {
                // The pods reach other nodes and the outside through the host's kernel; the
                // daemon does not turn forwarding on (that changes how the host treats router
                // advertisements): the operator does, as docs/pod-network.md says.
                for (f, what) in [("/proc/sys/net/ipv4/ip_forward", "net.ipv4.ip_forward"), ("/proc/sys/net/ipv6/conf/all/forwarding", "net.ipv6.conf.all.forwarding")] {
                    if std::fs::read_to_string(f).is_ok_and(|v| v.trim() == "0") {
                        tracing::warn!("ports[{i}] ({name}): {what} is 0: the pods reach nothing beyond this node's data plane and host until it is 1");
                    }
                }
            }
            queues.push(Vec::new());
            ports.push(PortRt { name, device: "pods".into(), kind: PortKind::Pods(set), xdp_iface: None });
            continue;
        }
        let Some(dev) = dev else {
            let m = memifs[i].take().expect("a port without a device is a memif port (checked)");
            let device = format!("memif:{}#{}", m.spec.socket, m.spec.id);
            queues.push(Vec::new());
            ports.push(PortRt { name, device, kind: PortKind::Memif(m), xdp_iface: None });
            continue;
        };
        let perr = |source| DaemonError::Port { index: i, name: name.clone(), source };
        let port = Arc::new(EthPort::find(eal, dev).map_err(perr)?);
        let mtu = if cfg.mtu_given[i] { cfg.spec.ports[i].mtu } else { 0 };
        port.setup(rt.workers, rt.queue_desc, pool, mtu).map_err(perr)?;
        port.start().map_err(perr)?;
        if cfg.mac_from_device[i] {
            cfg.spec.ports[i].mac = port.mac().map_err(perr)?;
        } else if port.use_mac(cfg.spec.ports[i].mac).map_err(|source| DaemonError::PortMac { index: i, source })? {
            tracing::warn!("ports[{i}] ({name}): the device cannot take the configured MAC; promiscuous mode is on");
        }
        queues.push(port.queues().map_err(perr)?);
        ports.push(PortRt { name, device: dev.clone(), kind: PortKind::Eth(port), xdp_iface: xdp::af_xdp_iface(dev).map(str::to_string) });
    }
    Ok((ports, queues))
}

/// One thread per worker, each with queue `w` of every port, the consuming end of its hand-off
/// ring and the producing ends of the others', its own session table, pinned to its CPU.
#[allow(clippy::too_many_arguments)]
fn spawn_workers(
    eal: &Arc<Eal>,
    cfg: &Config,
    daemon: &Daemon,
    control: &Arc<Control>,
    queues: EthQueues,
    worker_rx: Vec<Receiver<WorkerMsg>>,
    shared: &WorkerShared,
    ev_tx: &mpsc::Sender<Event>,
) -> Result<Vec<JoinHandle<()>>, DaemonError> {
    let rt = &cfg.runtime;
    let nworkers = worker_rx.len();
    // Hand-off rings: worker w consumes ring w; every other worker produces into it.
    let mut inboxes = Vec::new();
    let mut outboxes = Vec::new();
    if nworkers > 1 {
        for w in 0..nworkers {
            let (tx, rx) = vectorlb_dpdk::ring(eal, &format!("vl_handoff{w}"), 4096)?;
            outboxes.push(tx);
            inboxes.push(Some(rx));
        }
    }
    let mut handles = Vec::new();
    let mut port_queues: Vec<std::vec::IntoIter<(EthRx, EthTx)>> = queues.into_iter().map(Vec::into_iter).collect();
    for (w, msgs) in worker_rx.into_iter().enumerate() {
        let mut wc = cfg.worker_config(w as u16, rt.workers);
        // A key attackers cannot guess, and local ports that do not start where the previous
        // run's did (the backends may still hold those connections in TIME_WAIT).
        wc.table.seed = vectorlb_lb::hash::random_seed();
        wc.table.port_offset = vectorlb_lb::hash::random_seed() as u32;
        let worker = Worker::new(control.clone(), wc).map_err(|source| DaemonError::SessionTable { worker: w, source })?;
        let copiers = memif_ports::copiers(eal, cfg, w)?;
        let io = WorkerIo::<Mbuf> {
            ports: port_queues
                .iter_mut()
                .zip(&daemon.ports)
                .enumerate()
                .map(|(i, (q, p))| match &p.kind {
                    PortKind::Memif(m) => {
                        let (rx, tx) = memif_ports::queues(m, i, w as u16, &daemon.pool, copiers.for_port(&m.spec));
                        PortQueues { rx, tx, forward: false }
                    }
                    PortKind::Eth(_) => {
                        let (rx, tx) = q.next().expect("a queue per worker on every port (set up above)");
                        PortQueues { rx: Box::new(rx) as Box<dyn RxQueue<Mbuf>>, tx: Box::new(tx) as Box<dyn TxQueue<Mbuf>>, forward: false }
                    }
                    PortKind::Pods(set) => {
                        let rx: Box<dyn RxQueue<Mbuf>> = if set.spec.worker as usize == w {
                            Box::new(crate::pods::PodRx::new(set.clone(), daemon.pool.clone() as Arc<dyn PacketPool<Mbuf>>))
                        } else {
                            Box::new(crate::pods::NoRx)
                        };
                        PortQueues { rx, tx: Box::new(crate::pods::PodTx::new(set.clone(), daemon.pool.clone() as Arc<dyn PacketPool<Mbuf>>)), forward: true }
                    }
                })
                .collect(),
            inbox: inboxes.get_mut(w).and_then(Option::take).map(|r| Box::new(r) as Box<dyn RxQueue<Mbuf>>),
            peers: outboxes.iter().enumerate().map(|(v, tx)| (v != w).then(|| Box::new(tx.clone()) as Box<dyn TxQueue<Mbuf>>)).collect(),
            pool: daemon.pool.clone() as Arc<dyn PacketPool<Mbuf>>,
        };
        let lp = WorkerLoop::new(w as u16, io, worker, shared.clone(), msgs, ev_tx.clone());
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
    Ok(handles)
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
