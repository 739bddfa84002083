//! `vectorlb run`: the daemon. The main thread is the control core (signals, timers, neighbour
//! resolution, publishing configurations); one thread per worker owns a queue on every port
//! and its own session table; the API runs on its own thread (see `crate::api`).

pub mod ha;
pub mod health;
pub mod sessions;
pub mod sync;
pub mod worker;

use sessions::Page;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use vectorlb_config::{Config, OnDown};
use vectorlb_dpdk::{xdp, Eal, Mempool, Port, Ring};
use vectorlb_lb::{neigh, Control, Counters, Mode, Worker};
use vectorlb_packet::ethernet::Mac;
use worker::{IoCounters, WorkerCtx};

/// Requests from the control thread and the API to one worker.
pub enum WorkerMsg {
    /// Transmit this frame on a port (ARP / ND requests, announcements).
    Send { port: u16, frame: Vec<u8> },
    /// A page of this worker's sessions.
    Sessions { start: usize, limit: usize, v6: bool, reply: SyncSender<Page> },
    /// Sessions from the active node, to install (standby).
    Install(Vec<vectorlb_lb::sync::SyncRecord>),
    /// A page of sessions as sync records (bulk transfer).
    Export { v6: bool, start: usize, limit: usize, reply: SyncSender<(Vec<vectorlb_lb::sync::SyncRecord>, Option<usize>)> },
}

/// What workers report to the control thread.
pub enum Event {
    /// A neighbour seen in ARP / ND; `reply` is our answer, to send once it is published.
    Learned { ip: IpAddr, mac: Mac, port: u16, reply: Option<Vec<u8>> },
    /// A packet needed this next hop and its MAC is unknown: ask for it.
    Resolve { ip: IpAddr, port: u16 },
    /// A backend went up or down: publish again.
    HealthChanged,
}

#[derive(Default)]
pub struct Published {
    pub counters: Counters,
    pub io: IoCounters,
    /// Active sessions per backend slot.
    pub active: Vec<u32>,
    pub sessions: u32,
}

pub struct WorkerShared {
    pub published: Mutex<Published>,
    pub tx: Mutex<Sender<WorkerMsg>>,
}

impl WorkerShared {
    pub fn publish(&self, w: &Worker, io: &IoCounters) {
        let mut p = lock(&self.published);
        p.counters.clone_from(&w.counters);
        p.io = *io;
        p.active.clear();
        p.active.extend_from_slice(w.table.active());
        p.sessions = w.table.len();
    }
}

pub struct PortRt {
    pub name: String,
    pub device: String,
    pub port: Port,
    /// The kernel interface of an AF_XDP port (its XDP program holds our addresses).
    pub xdp_iface: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub struct Neighbour {
    pub mac: Mac,
    pub port: u16,
    pub seen: Instant,
}

pub struct Shared {
    pub started: Instant,
    pub control: Arc<Control>,
    pub config: Mutex<Config>,
    pub path: PathBuf,
    pub pool: Mempool,
    pub ports: Vec<PortRt>,
    pub workers: Vec<WorkerShared>,
    pub learned: Mutex<BTreeMap<IpAddr, Neighbour>>,
    pub idle_sleep_us: u32,
    pub reloads: AtomicU64,
    pub reload_failures: AtomicU64,
    /// New sessions per second per service id, over the last second.
    pub rates: Mutex<Vec<f64>>,
    /// What the flow director's maps hold now.
    xdp_synced: Mutex<Option<XdpTables>>,
    pub health: Arc<health::Health>,
    pub ha: ha::Ha,
    pub sync: Option<Arc<sync::Sync>>,
    stop: AtomicBool,
}

type XdpTables = (Vec<(IpAddr, u32)>, Vec<(IpAddr, u8)>);

/// Locks a mutex, recovering the data if a thread panicked while holding it (the data are
/// counters and copies of configuration, always left consistent).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static SIG_STOP: AtomicBool = AtomicBool::new(false);
static SIG_RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomic stores: async-signal-safe.
    if sig == libc::SIGHUP {
        SIG_RELOAD.store(true, Ordering::SeqCst);
    } else {
        SIG_STOP.store(true, Ordering::SeqCst);
    }
}

fn install_signals() {
    // SAFETY: the handler only stores to atomics.
    unsafe {
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(s, on_signal as *const () as libc::sighandler_t);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Publishes `new` as the running configuration, all or nothing: ports and runtime
    /// settings must be unchanged (they need a restart), the services must build.
    pub fn apply(&self, mut new: Config) -> Result<u64, String> {
        let mut cur = lock(&self.config);
        self.apply_locked(&mut cur, &mut new)
    }

    /// Runs `edit` on a copy of the running configuration and applies the result.
    pub fn edit<T>(&self, edit: impl FnOnce(&mut Config) -> Result<T, String>) -> Result<T, String> {
        let mut cur = lock(&self.config);
        let mut new = cur.clone();
        let t = edit(&mut new)?;
        self.apply_locked(&mut cur, &mut new)?;
        Ok(t)
    }

    fn apply_locked(&self, cur: &mut Config, new: &mut Config) -> Result<u64, String> {
        if new.devices != cur.devices || new.spec.ports.len() != cur.spec.ports.len() {
            return Err("ports changed: adding, removing or re-pointing a port needs a restart".into());
        }
        if new.runtime != cur.runtime || new.engine != cur.engine {
            return Err("[runtime] or [global] changed: these need a restart".into());
        }
        for (i, p) in new.spec.ports.iter_mut().enumerate() {
            if new.mac_from_device[i] {
                p.mac = cur.spec.ports[i].mac;
            }
        }
        let spec = self.published(new);
        let g = self.control.apply(&spec).map_err(|e| e.to_string())?;
        *cur = new.clone();
        self.sync_xdp(cur);
        self.health.reconcile(cur);
        Ok(g)
    }

    /// What the workers run: the configuration's service model, plus the neighbours learned at
    /// run time (entries in the file win), minus what health checks took down (weight 0, or
    /// left out when its sessions must end).
    fn published(&self, c: &Config) -> vectorlb_lb::LbSpec {
        let mut spec = c.spec.clone();
        let learned = lock(&self.learned);
        for (ip, n) in learned.iter() {
            if !spec.neighbors.iter().any(|(a, _)| a == ip) {
                spec.neighbors.push((*ip, n.mac));
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

    /// Re-publishes the running configuration (after neighbours changed).
    fn republish(&self) {
        let cur = lock(&self.config);
        let spec = self.published(&cur);
        if let Err(e) = self.control.apply(&spec) {
            eprintln!("vectorlb: neighbour update not applied: {e}");
        }
    }

    /// Writes our addresses into every AF_XDP port's flow director, when they changed.
    fn sync_xdp(&self, c: &Config) {
        let tables = xdp_tables(c);
        {
            let mut last = lock(&self.xdp_synced);
            if last.as_ref() == Some(&tables) {
                return;
            }
            *last = Some(tables.clone());
        }
        let (addrs, nets) = tables;
        for p in &self.ports {
            if let Some(ifname) = &p.xdp_iface {
                if let Err(e) = xdp::set_addrs(ifname, &addrs).and_then(|_| xdp::set_source_nets(ifname, &nets)) {
                    eprintln!("vectorlb: {e}");
                }
            }
        }
    }

    /// Every worker's counters, summed.
    pub fn totals(&self) -> Published {
        let mut t = Published::default();
        for w in &self.workers {
            let p = lock(&w.published);
            t.counters.add(&p.counters);
            t.io.tx_full += p.io.tx_full;
            t.io.multi_segment += p.io.multi_segment;
            t.io.handed_off += p.io.handed_off;
            t.io.neighbour_replies += p.io.neighbour_replies;
            t.io.not_ours += p.io.not_ours;
            t.io.polls += p.io.polls;
            t.io.idle_sleeps += p.io.idle_sleeps;
            if t.active.len() < p.active.len() {
                t.active.resize(p.active.len(), 0);
            }
            for (a, b) in t.active.iter_mut().zip(&p.active) {
                *a += b;
            }
            t.sessions += p.sessions;
        }
        t
    }

    /// A page of worker `w`'s sessions as sync records.
    pub fn export(&self, w: usize, v6: bool, start: usize, limit: usize) -> Result<(Vec<vectorlb_lb::sync::SyncRecord>, Option<usize>), String> {
        let ws = self.workers.get(w).ok_or("no such worker")?;
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&ws.tx).send(WorkerMsg::Export { v6, start, limit, reply: tx }).map_err(|_| "worker stopped".to_string())?;
        rx.recv_timeout(Duration::from_secs(2)).map_err(|_| "worker did not answer in 2 s".to_string())
    }

    /// A page of worker `w`'s sessions (the worker answers between bursts).
    pub fn sessions(&self, w: usize, start: usize, limit: usize, v6: bool) -> Result<Page, String> {
        let ws = self.workers.get(w).ok_or_else(|| format!("worker: {w} does not exist (0..{})", self.workers.len()))?;
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&ws.tx).send(WorkerMsg::Sessions { start, limit, v6, reply: tx }).map_err(|_| "worker stopped".to_string())?;
        rx.recv_timeout(Duration::from_secs(2)).map_err(|_| "worker did not answer in 2 s".to_string())
    }

    pub fn send(&self, port: u16, frame: Vec<u8>) {
        if let Some(w) = self.workers.first() {
            let _ = lock(&w.tx).send(WorkerMsg::Send { port, frame });
        }
    }
}

/// The flow director's tables: our addresses (to: VIPs, local and interface addresses; from:
/// NAT backends, whose replies cross us) and the SNAT source prefixes.
pub fn xdp_tables(c: &Config) -> XdpTables {
    let mut m: BTreeMap<IpAddr, u32> = BTreeMap::new();
    for p in &c.spec.ports {
        for (a, _) in &p.addrs {
            *m.entry(*a).or_default() |= xdp::FLAG_DST;
        }
    }
    for s in &c.spec.services {
        *m.entry(s.vip).or_default() |= xdp::FLAG_DST;
        for a in &s.local_addrs {
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
    (m.into_iter().collect(), nets)
}

fn log(msg: impl AsRef<str>) {
    eprintln!("vectorlb: {}", msg.as_ref());
}

/// Starts the daemon and runs until SIGTERM / SIGINT (or an API stop).
pub fn run(path: &Path) -> Result<(), String> {
    let mut cfg = Config::load(path).map_err(|e| e.to_string())?;
    let rt = cfg.runtime.clone();
    for (i, d) in cfg.devices.iter().enumerate() {
        if d.is_none() {
            return Err(format!("ports[{i}].device: `vectorlb run` needs a DPDK device for every port (net_af_xdp0,iface=eth0, a PCI address, ...)"));
        }
    }
    // Every rx and tx ring of every queue can hold a descriptor's worth of buffers, plus the
    // per-thread caches and what is in flight.
    let need = cfg.spec.ports.len() as u64 * rt.workers as u64 * 2 * rt.queue_desc as u64 + 256 * (rt.workers as u64 + 1) + 1024;
    if (rt.mbufs as u64) < need {
        return Err(format!(
            "runtime.mbufs: {} is too few for {} port(s) x {} worker(s) x 2 rings x {} descriptors; give at least {need} (or lower runtime.queue_desc)",
            rt.mbufs,
            cfg.spec.ports.len(),
            rt.workers,
            rt.queue_desc
        ));
    }
    install_signals();
    let run_dir = PathBuf::from(&rt.run_dir);
    let xdp_obj = xdp::write_object(&run_dir).map_err(|e| e.to_string())?;
    let mut devices = Vec::new();
    for d in cfg.devices.iter().flatten() {
        let mut d = d.clone();
        if xdp::af_xdp_iface(&d).is_some() {
            if !d.contains("xdp_prog=") {
                d.push_str(&format!(",xdp_prog={}", xdp_obj.display()));
            }
            if rt.workers > 1 && !d.contains("queue_count=") {
                d.push_str(&format!(",queue_count={}", rt.workers));
            }
        }
        devices.push(d);
    }
    let result = start(path, &mut cfg, &devices);
    let _ = std::fs::remove_file(&xdp_obj);
    result
}

fn start(path: &Path, cfg: &mut Config, devices: &[String]) -> Result<(), String> {
    let rt = cfg.runtime.clone();
    let eal = Eal::init(&rt.eal, devices).map_err(|e| e.to_string())?;
    let pool = Mempool::new(&eal, "vectorlb", rt.mbufs, 256, 2048 + 128).map_err(|e| e.to_string())?;
    let mut ports = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let port = Port::find(&eal, dev).map_err(|e| format!("ports[{i}] ({}): {e}", cfg.spec.ports[i].name))?;
        let mtu = if cfg.mtu_given[i] { cfg.spec.ports[i].mtu } else { 0 };
        port.setup(rt.workers, rt.queue_desc, &pool, mtu).map_err(|e| format!("ports[{i}] ({}): {e}", cfg.spec.ports[i].name))?;
        port.start().map_err(|e| format!("ports[{i}] ({}): {e}", cfg.spec.ports[i].name))?;
        if cfg.mac_from_device[i] {
            cfg.spec.ports[i].mac = port.mac().map_err(|e| e.to_string())?;
        } else if port.use_mac(cfg.spec.ports[i].mac).map_err(|e| format!("ports[{i}].mac: {e}"))? {
            log(format!("ports[{i}] ({}): the device cannot take the configured MAC; promiscuous mode is on", cfg.spec.ports[i].name));
        }
        ports.push(PortRt {
            name: cfg.spec.ports[i].name.clone(),
            device: dev.clone(),
            port,
            xdp_iface: xdp::af_xdp_iface(dev).map(str::to_string),
        });
    }
    let control = Control::new(&cfg.spec).map_err(|e| e.to_string())?;
    let (ev_tx, ev_rx) = mpsc::channel();
    let mut worker_rx = Vec::new();
    let mut workers_shared = Vec::new();
    for _ in 0..rt.workers {
        let (tx, rx) = mpsc::channel();
        worker_rx.push(rx);
        workers_shared.push(WorkerShared { published: Mutex::new(Published::default()), tx: Mutex::new(tx) });
    }
    let sync = match &cfg.sync {
        Some(spec) => Some(sync::Sync::bind(spec)?),
        None => None,
    };
    let (changes_tx, changes_rx) = mpsc::channel();
    let mut rings = Vec::new();
    if rt.workers > 1 {
        for w in 0..rt.workers {
            rings.push(Ring::new(&eal, &format!("vl_handoff{w}"), 4096).map_err(|e| e.to_string())?);
        }
    }
    let rings = Arc::new(rings);
    let shared = Arc::new(Shared {
        started: Instant::now(),
        control: control.clone(),
        config: Mutex::new(cfg.clone()),
        path: path.to_path_buf(),
        pool,
        ports,
        workers: workers_shared,
        learned: Mutex::new(BTreeMap::new()),
        idle_sleep_us: rt.idle_sleep_us,
        reloads: AtomicU64::new(0),
        reload_failures: AtomicU64::new(0),
        rates: Mutex::new(Vec::new()),
        xdp_synced: Mutex::new(None),
        health: health::Health::new(ev_tx.clone()),
        ha: ha::Ha::new(ha::parse(&rt.ha_state).unwrap_or(ha::STANDALONE)),
        sync: sync.clone(),
        stop: AtomicBool::new(false),
    });
    shared.sync_xdp(cfg);
    shared.health.reconcile(cfg);
    let api = crate::api::Server::bind(&rt.api, shared.clone())?;
    let eal = Arc::new(eal);
    let mut handles = Vec::new();
    for (w, msgs) in worker_rx.into_iter().enumerate() {
        let wc = cfg.worker_config(w as u16, rt.workers);
        let shift = wc.table.core_shift;
        let worker = Worker::new(control.clone(), wc).map_err(|e| format!("worker {w}: session table: {e}"))?;
        let ctx = WorkerCtx {
            id: w as u16,
            ports: shared.ports.iter().map(|p| p.port).collect(),
            worker,
            shared: shared.clone(),
            msgs,
            events: ev_tx.clone(),
            rings: rings.clone(),
            core_shift: shift,
            changes: sync.as_ref().map(|_| changes_tx.clone()),
        };
        let cpu = rt.cpus.get(w).copied();
        let eal = eal.clone();
        let h = std::thread::Builder::new()
            .name(format!("vlb-worker{w}"))
            .spawn(move || {
                if let Err(e) = eal.register_thread() {
                    log(format!("worker {w}: {e}"));
                }
                pin(cpu);
                ctx.run();
                eal.unregister_thread();
            })
            .map_err(|e| e.to_string())?;
        handles.push(h);
    }
    let api_handle = std::thread::Builder::new().name("vlb-api".into()).spawn(move || api.run()).map_err(|e| e.to_string())?;
    let mut sync_threads = Vec::new();
    if let Some(sy) = &sync {
        let (a, b) = (shared.clone(), sy.clone());
        sync_threads.push(std::thread::Builder::new().name("vlb-sync-tx".into()).spawn(move || sync::sender(a, b, changes_rx)).map_err(|e| e.to_string())?);
        let (a, b) = (shared.clone(), sy.clone());
        sync_threads.push(std::thread::Builder::new().name("vlb-sync-rx".into()).spawn(move || sync::receiver(a, b)).map_err(|e| e.to_string())?);
        log(format!("session sync: listening on {}, peers {:?}", sy.spec.listen, sy.spec.peers));
    } else {
        drop(changes_rx);
    }
    drop(changes_tx);
    log(format!(
        "running: {} port(s), {} worker(s), {} service(s), API on {}",
        shared.ports.len(),
        rt.workers,
        cfg.spec.services.len(),
        rt.api
    ));
    control_loop(&shared, ev_rx);
    log("stopping: draining workers");
    shared.request_stop();
    shared.health.stop_all();
    for h in handles {
        let _ = h.join();
    }
    for h in sync_threads {
        let _ = h.join();
    }
    drop(api_handle); // the API thread ends with the process (it may sit in accept()).
    for p in &shared.ports {
        p.port.stop();
    }
    if let Some(path) = rt.api.strip_prefix("unix:") {
        let _ = std::fs::remove_file(path);
    }
    let t = shared.totals();
    log(format!("stopped: rx {} tx {} drops {} sessions created {}", t.counters.rx, t.counters.tx, t.counters.total_drops(), t.counters.sessions_created));
    Ok(())
}

/// Pins the calling thread to `cpu`, or lets it run on every CPU (EAL pins the main thread,
/// and threads inherit that).
fn pin(cpu: Option<usize>) {
    // SAFETY: a zeroed cpu_set_t is valid; the calls only read it.
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

/// The control core: signals, neighbour learning and resolution, rates.
fn control_loop(shared: &Arc<Shared>, events: Receiver<Event>) {
    let timeout = Duration::from_secs(lock(&shared.config).runtime.neighbor_timeout as u64);
    let mut last_resolve = Instant::now() - Duration::from_secs(3600);
    let mut last_rate = Instant::now();
    let mut last_created: Vec<u64> = Vec::new();
    let mut dirty = false;
    let mut asked: BTreeMap<IpAddr, Instant> = BTreeMap::new();
    loop {
        if SIG_STOP.load(Ordering::SeqCst) || shared.stopping() {
            return;
        }
        if SIG_RELOAD.swap(false, Ordering::SeqCst) {
            match reload(shared) {
                Ok(g) => log(format!("SIGHUP: reloaded {} (generation {g})", shared.path.display())),
                Err(e) => log(format!("SIGHUP: reload failed, running configuration kept: {e}")),
            }
        }
        match events.recv_timeout(Duration::from_millis(20)) {
            Ok(first) => {
                // Take every pending event, publish once, then send the held answers.
                let mut replies = Vec::new();
                let mut ev = Some(first);
                while let Some(e) = ev.take() {
                    match e {
                        Event::Learned { ip, mac, port, reply } => {
                            let prev = lock(&shared.learned).insert(ip, Neighbour { mac, port, seen: Instant::now() });
                            dirty |= prev.is_none_or(|p| p.mac != mac);
                            asked.remove(&ip);
                            if let Some(r) = reply {
                                replies.push((port, r));
                            }
                        }
                        Event::HealthChanged => dirty = true,
                        Event::Resolve { ip, port } => {
                            // At most one request per address per second.
                            let now = Instant::now();
                            if asked.get(&ip).is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(1)) {
                                let snap = shared.control.snapshot();
                                let frame = match ip {
                                    IpAddr::V4(a) => neigh::arp_request(&snap, port, a),
                                    IpAddr::V6(a) => neigh::solicit(&snap, port, a),
                                };
                                if let Some(f) = frame {
                                    replies.push((port, f));
                                    asked.insert(ip, now);
                                }
                            }
                        }
                    }
                    ev = events.try_recv().ok();
                }
                if dirty {
                    shared.republish();
                    dirty = false;
                }
                for (port, r) in replies {
                    shared.send(port, r);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        // Resolve next hops: unknown ones every second, known ones when a third of their
        // lifetime has passed (a reply refreshes them); forget the silent ones.
        if last_resolve.elapsed() >= Duration::from_secs(1) {
            last_resolve = Instant::now();
            let snap = shared.control.snapshot();
            let hops = neigh::next_hops(&snap);
            let now = Instant::now();
            let mut expired = false;
            {
                let mut l = lock(&shared.learned);
                let before = l.len();
                l.retain(|_, n| now.duration_since(n.seen) < timeout);
                expired |= l.len() != before;
            }
            if expired {
                shared.republish();
            }
            let statics: Vec<IpAddr> = lock(&shared.config).spec.neighbors.iter().map(|(a, _)| *a).collect();
            for (ip, port) in hops {
                if statics.contains(&ip) {
                    continue;
                }
                let age = lock(&shared.learned).get(&ip).map(|n| now.duration_since(n.seen));
                let due = match age {
                    None => true,
                    Some(a) => a > timeout / 3 && asked.get(&ip).is_none_or(|t| now.duration_since(*t) > Duration::from_secs(5)),
                };
                if !due {
                    continue;
                }
                let frame = match ip {
                    IpAddr::V4(a) => neigh::arp_request(&snap, port, a),
                    IpAddr::V6(a) => neigh::solicit(&snap, port, a),
                };
                if let Some(f) = frame {
                    shared.send(port, f);
                    asked.insert(ip, now);
                }
            }
        }
        if last_rate.elapsed() >= Duration::from_secs(1) {
            let secs = last_rate.elapsed().as_secs_f64();
            last_rate = Instant::now();
            let t = shared.totals();
            let created: Vec<u64> = t.counters.services.iter().map(|s| s.new_sessions).collect();
            let rates: Vec<f64> = created
                .iter()
                .enumerate()
                .map(|(i, c)| c.saturating_sub(last_created.get(i).copied().unwrap_or(*c)) as f64 / secs)
                .collect();
            *lock(&shared.rates) = rates;
            last_created = created;
        }
    }
}

/// Re-reads the configuration file and applies it (all or nothing).
pub fn reload(shared: &Shared) -> Result<u64, String> {
    let r = Config::load(&shared.path).map_err(|e| e.to_string()).and_then(|c| shared.apply(c));
    match &r {
        Ok(_) => shared.reloads.fetch_add(1, Ordering::Relaxed),
        Err(_) => shared.reload_failures.fetch_add(1, Ordering::Relaxed),
    };
    r
}
