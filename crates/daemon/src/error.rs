//! The daemon's errors. Each says what failed and, where there is one, what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] vectorlb_config::Error),
    #[error("ports[{index}] ({name}): {source}")]
    Port { index: usize, name: String, source: vectorlb_dpdk::Error },
    #[error("ports[{index}].mac: {source}")]
    PortMac { index: usize, source: vectorlb_dpdk::Error },
    #[error(transparent)]
    Dpdk(#[from] vectorlb_dpdk::Error),
    #[error("worker {worker}: session table: {source}")]
    SessionTable { worker: usize, source: std::io::Error },
    #[error("runtime.api: {0}")]
    Api(#[from] vectorlb_api::server::ServerError),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("cannot start {what}: {source}")]
    Spawn { what: String, source: std::io::Error },
    #[error("ports changed: adding, removing or re-pointing a port needs a restart")]
    PortsChanged,
    #[error("[runtime] or [global] changed: these need a restart")]
    RuntimeChanged,
    /// The service model refused the configuration (families, routes, tables).
    #[error("{0}")]
    Model(#[from] vectorlb_lb::ConfigError),
    #[error("worker: {worker} does not exist (0..{workers})")]
    NoSuchWorker { worker: usize, workers: usize },
    #[error("worker {0} stopped")]
    WorkerStopped(usize),
    #[error("worker {0} did not answer in 2 s")]
    WorkerSilent(usize),
    #[error("saving to {path}: {source}")]
    Save { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source} (the instance locks need a writable /run/lock)")]
    Lock { path: PathBuf, source: std::io::Error },
    #[error("{what} is in use by another vectorlb (pid {pid}); stop it first, or give this one other interfaces and another API endpoint")]
    InUse { what: String, pid: String },
    #[error("ports[{index}]: {iface} has an XDP program that is not vectorlb's ('{name}', id {id}); remove it (ip link set dev {iface} xdp off) or use another interface")]
    ForeignXdp { index: usize, iface: String, id: u32, name: String },
    #[error("runtime.api_token_file: {path}: {problem}")]
    Token { path: String, problem: String },
    #[error("ports[{index}].memif: {why}")]
    Memif { index: usize, why: String },
    #[error("pods port: {0}")]
    Pods(String),
    #[error("worker {worker}: runtime.dma_devices: {why}")]
    Dma { worker: usize, why: String },
}

impl From<DaemonError> for vectorlb_api::ApiError {
    fn from(e: DaemonError) -> Self {
        use vectorlb_api::ApiError as A;
        let m = e.to_string();
        match e {
            DaemonError::PortsChanged | DaemonError::RuntimeChanged => A::Conflict(m),
            DaemonError::NoSuchWorker { .. } => A::NotFound(m),
            DaemonError::WorkerStopped(_) | DaemonError::WorkerSilent(_) => A::Unavailable(m),
            DaemonError::Save { .. } | DaemonError::Spawn { .. } => A::Internal(m),
            _ => A::Unprocessable(m),
        }
    }
}

/// Why session sync could not start.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("ha.sync_listen {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("ha.sync_peers: joining {group}: {source}")]
    Join { group: std::net::IpAddr, source: std::io::Error },
    #[error("ha.sync_listen: sending to {group} from {me}: {source}")]
    MulticastInterface { group: std::net::IpAddr, me: std::net::IpAddr, source: std::io::Error },
    #[error("session sync: the system gave no random bytes for this node's key salt")]
    Random,
}
