//! vectorlb's test and benchmark tools, shipped as their own binary (`vectorlb-tools`) so
//! that none of them is part of the production `vectorlb`:
//!
//! * [`probe`]: the clients and servers that `make demo` and the end-to-end tests run inside
//!   network namespaces (HTTP load, UDP / TCP echo, long-lived connections), a malformed-frame
//!   sender and a session-sync message forger;
//! * [`gen`]: the DPDK traffic generator and the RFC 2544 search;
//! * [`memif`]: a memif forwarder over vectorlb's memif queues, and the memif benchmark.

pub mod gen;
pub mod httpload;
pub mod memcload;
pub mod memif;
pub mod podmemif;
pub mod probe;
pub mod tunfwd;

/// Why a tool failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// An argument that cannot be used; the message names it.
    #[error("{0}")]
    Usage(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error(transparent)]
    Dpdk(#[from] vectorlb_dpdk::Error),
    #[error(transparent)]
    Http(#[from] vectorlb_client::Error),
    /// What the tool checks did not hold (requests failed, an echo differed).
    #[error("{0}")]
    Failed(String),
}

/// Wraps an I/O error with what was being done.
pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ToolError {
    let context = context.into();
    move |source| ToolError::Io { context, source }
}
