//! Why the proxy cannot start (or a reload is refused), naming the field or the address.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    #[error("listeners[{index}] ({name}): cannot listen on {address}: {source}")]
    Bind { index: usize, name: String, address: SocketAddr, source: std::io::Error },
    #[error("clusters[{index}] ({name}): {source}")]
    Scheduler { index: usize, name: String, source: vectorlb_sched::SchedError },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("admin: {0}")]
    Admin(String),
    #[error("access_log: {0}")]
    AccessLog(String),
    #[error("dispatch: cannot start its threads: {0}")]
    Dispatch(std::io::Error),
}
