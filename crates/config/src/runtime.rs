//! `[global]` (the engine: sessions, batch, local ports) and `[runtime]` (threads, DPDK, the API).

use crate::error::{bail, Error};
use crate::file::{OneOrMany, RawGlobal, RawRuntime};

/// Settings that size and tune each worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub max_sessions: u32,
    pub index_entries: u32,
    pub batch: usize,
    pub local_port_min: u16,
    pub local_port_max: u16,
    pub sweep_budget: u32,
    /// The share of a core's sessions and local ports that half-open TCP sessions may hold,
    /// in thousandths (`half_open_share` in the file).
    pub half_open_permille: u16,
    /// The share of a core's sessions that sessions opened by continuation and not confirmed
    /// yet may hold, in thousandths (`continuation_share`).
    pub continued_permille: u16,
    /// The secret shared by the nodes of a cluster that keys the flow hashes and Maglev
    /// tables (`cluster_key`: at least 16 characters); None: unkeyed, which every node also
    /// agrees on, but which lets a client aim flows at a backend.
    pub cluster_key: Option<String>,
}

/// Settings of the daemon (`vectorlb run`): threads, DPDK, the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// Worker threads; each owns one rx/tx queue on every port and its own session table.
    pub workers: u16,
    /// CPUs to pin the workers to, in order (empty: not pinned).
    pub cpus: Vec<usize>,
    /// EAL arguments (devices are added from the ports).
    pub eal: Vec<String>,
    /// Packet buffers in the pool shared by all ports.
    pub mbufs: u32,
    /// Descriptors per rx and per tx queue.
    pub queue_desc: u16,
    /// Where the control API (and its status page) listens: "unix:/run/vectorlb/api.sock" (the
    /// default), or "ADDRESS:PORT", which needs `api_token_file`; or several of them (a unix
    /// socket for `ctl` and an address for browsers and Prometheus). Never empty.
    pub api: Vec<String>,
    /// A file holding the bearer token every request on a TCP API must carry. Only its owner
    /// may read it.
    pub api_token_file: Option<String>,
    /// The group that may use the unix socket (mode 0660); without it, root only (0600).
    pub api_group: Option<String>,
    /// Memory the session tables of all workers may take at most, MiB; `None`: half of the
    /// machine's memory.
    pub memory_budget_mb: Option<u64>,
    /// Longest sleep of an idle worker, microseconds (its wake-up latency bound). 0: busy-poll.
    pub idle_sleep_us: u32,
    /// Learned neighbours not confirmed for this long are forgotten (seconds).
    pub neighbor_timeout: u32,
    /// Directory for run-time files (the XDP object).
    pub run_dir: String,
    /// HA state at start: "standalone" (no HA), "master" or "backup" (keepalived's notify
    /// scripts change it through the API).
    pub ha_state: String,
    /// The dmadev of each worker (memif ports with `copy = "dma"`); `dma_skeleton*` names are
    /// DPDK's software device, created as needed.
    pub dma_devices: Vec<String>,
    /// Copies shorter than this go to the CPU even with `copy = "dma"`, bytes.
    pub dma_threshold: u32,
}

/// Copies below this many bytes stay on the CPU with a DMA engine (docs/memif.md says where the
/// figure comes from).
pub const DEFAULT_DMA_THRESHOLD: u32 = 256;

/// Where the control API listens unless configured.
pub const DEFAULT_API: &str = "unix:/run/vectorlb/api.sock";

pub const DEFAULT_EAL: &[&str] = &["-l", "0", "--in-memory", "--log-level", "*:warning"];

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            workers: 1,
            cpus: Vec::new(),
            eal: DEFAULT_EAL.iter().map(|s| s.to_string()).collect(),
            mbufs: 16383,
            queue_desc: 1024,
            api: vec![DEFAULT_API.into()],
            api_token_file: None,
            api_group: None,
            memory_budget_mb: None,
            idle_sleep_us: 200,
            neighbor_timeout: 300,
            run_dir: "/run/vectorlb".into(),
            ha_state: "standalone".into(),
            dma_devices: Vec::new(),
            dma_threshold: DEFAULT_DMA_THRESHOLD,
        }
    }
}

pub(crate) fn runtime(r: &RawRuntime) -> Result<Runtime, Error> {
    let d = Runtime::default();
    let workers = r.workers.unwrap_or(d.workers);
    if !(1..=64).contains(&workers) {
        bail!("runtime.workers: {workers} is out of range 1..=64");
    }
    let cpus = r.cpus.clone().unwrap_or_default();
    if !cpus.is_empty() && cpus.len() < workers as usize {
        bail!("runtime.cpus: {} CPUs for {workers} workers (give one per worker, or none)", cpus.len());
    }
    let mbufs = r.mbufs.unwrap_or(d.mbufs);
    if !(1024..=16_777_215).contains(&mbufs) {
        bail!("runtime.mbufs: {mbufs} is out of range 1024..=16777215");
    }
    let queue_desc = r.queue_desc.unwrap_or(d.queue_desc);
    if !(64..=16384).contains(&queue_desc) || !queue_desc.is_power_of_two() {
        bail!("runtime.queue_desc: {queue_desc} must be a power of two in 64..=16384");
    }
    let api = match &r.api {
        None => d.api,
        Some(OneOrMany::One(a)) => vec![a.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    if api.is_empty() {
        bail!("runtime.api: give at least one endpoint (unix:PATH or ADDRESS:PORT)");
    }
    for (i, a) in api.iter().enumerate() {
        if api[..i].contains(a) {
            bail!("runtime.api: '{a}' is listed twice");
        }
        if let Some(path) = a.strip_prefix("unix:") {
            if path.is_empty() {
                bail!("runtime.api: 'unix:' needs a socket path");
            }
        } else if a.parse::<std::net::SocketAddr>().is_err() {
            bail!("runtime.api: '{a}' is not ADDRESS:PORT or unix:PATH");
        }
    }
    let any_tcp = api.iter().any(|a| !a.starts_with("unix:"));
    if any_tcp && r.api_token_file.as_deref().is_none_or(str::is_empty) {
        bail!("runtime.api: a TCP API needs runtime.api_token_file (a file only root can read, holding the token); or listen on unix:PATH");
    }
    if !any_tcp && r.api_token_file.is_some() {
        bail!("runtime.api_token_file: a unix socket is guarded by its permissions (runtime.api_group); the token is for a TCP API");
    }
    if r.api_group.is_some() && api.iter().all(|a| !a.starts_with("unix:")) {
        bail!("runtime.api_group: only for a unix socket API");
    }
    let idle_sleep_us = r.idle_sleep_us.unwrap_or(d.idle_sleep_us);
    if idle_sleep_us > 100_000 {
        bail!("runtime.idle_sleep_us: {idle_sleep_us} is above 100000");
    }
    let neighbor_timeout = r.neighbor_timeout.unwrap_or(d.neighbor_timeout);
    if neighbor_timeout < 10 {
        bail!("runtime.neighbor_timeout: {neighbor_timeout} is below 10 seconds");
    }
    let ha_state = r.ha_state.clone().unwrap_or(d.ha_state);
    if !matches!(ha_state.as_str(), "standalone" | "master" | "backup") {
        bail!("runtime.ha_state: '{ha_state}' is not standalone, master or backup");
    }
    Ok(Runtime {
        ha_state,
        workers,
        cpus,
        eal: r.eal.clone().unwrap_or(d.eal),
        mbufs,
        queue_desc,
        api,
        api_token_file: r.api_token_file.clone(),
        api_group: r.api_group.clone(),
        memory_budget_mb: match r.memory_budget_mb {
            Some(0) => bail!("runtime.memory_budget_mb: must be above 0"),
            m => m,
        },
        idle_sleep_us,
        neighbor_timeout,
        run_dir: r.run_dir.clone().unwrap_or(d.run_dir),
        dma_devices: match &r.dma_devices {
            Some(v) if v.iter().any(|d| d.is_empty() || d.contains(char::is_whitespace) || d.contains(',')) => {
                bail!("runtime.dma_devices: device names without spaces or commas (dma_skeleton0, or a dmadev name such as 0000:6a:01.0-wq0.0)")
            }
            Some(v) if !v.is_empty() && v.len() < workers as usize => bail!("runtime.dma_devices: {} device(s) for {workers} workers (one per worker)", v.len()),
            v => v.clone().unwrap_or_default(),
        },
        dma_threshold: match r.dma_threshold {
            Some(t) if t > 65536 => bail!("runtime.dma_threshold: {t} is above 65536"),
            t => t.unwrap_or(DEFAULT_DMA_THRESHOLD),
        },
    })
}

/// `[global]`: the engine's settings (`has_nat`: NAT services need twice the index entries).
pub(crate) fn engine(g: &RawGlobal, has_nat: bool) -> Result<Engine, Error> {
    let max_sessions = g.max_sessions.unwrap_or(1_000_000);
    if max_sessions == 0 {
        bail!("global.max_sessions: must be above 0");
    }
    let index_entries = g.index_entries.unwrap_or(if has_nat { max_sessions.saturating_mul(2) } else { max_sessions });
    if index_entries < max_sessions {
        bail!("global.index_entries: {index_entries} is below max_sessions ({max_sessions})");
    }
    let batch = g.batch.unwrap_or(256);
    if !(1..=4096).contains(&batch) {
        bail!("global.batch: {batch} is out of range 1..=4096");
    }
    let local_port_min = g.local_port_min.unwrap_or(1024);
    let local_port_max = g.local_port_max.unwrap_or(65535);
    if local_port_min == 0 || local_port_min > local_port_max {
        bail!("global.local_port_min/local_port_max: need 1 <= min <= max");
    }
    Ok(Engine {
        max_sessions,
        index_entries,
        batch,
        local_port_min,
        local_port_max,
        sweep_budget: g.sweep_budget.unwrap_or(64).max(1),
        half_open_permille: match g.half_open_share {
            None => vectorlb_lb::pipeline::DEFAULT_HALF_OPEN_PERMILLE,
            Some(x) if (0.001..=1.0).contains(&x) => (x * 1000.0).round() as u16,
            Some(x) => bail!("global.half_open_share: {x} is not between 0.001 and 1"),
        },
        continued_permille: match g.continuation_share {
            None => vectorlb_lb::pipeline::DEFAULT_CONTINUED_PERMILLE,
            Some(x) if (0.001..=1.0).contains(&x) => (x * 1000.0).round() as u16,
            Some(x) => bail!("global.continuation_share: {x} is not between 0.001 and 1"),
        },
        cluster_key: match &g.cluster_key {
            None => None,
            Some(k) if k.chars().count() >= 16 && !k.chars().any(char::is_control) => Some(k.clone()),
            Some(_) => bail!("global.cluster_key: at least 16 characters, none of them control characters (the same secret on every node of the cluster)"),
        },
    })
}
