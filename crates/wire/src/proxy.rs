//! The proxy's admin API bodies (`vectorlb proxy`, docs/proxy.md): what `GET /v1/stats`,
//! `GET`/`PUT /v1/config`, `POST /v1/reload` and `GET /v1/health` answer. The proxy writes
//! them, the controller's Gateway programming and the tests read them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistogramOut {
    pub count: u64,
    pub sum: f64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    /// (upper bound, cumulative count); the last bound is +Inf, written as null.
    pub buckets: Vec<(Option<f64>, u64)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TlsOut {
    pub provider: String,
    pub fallback_reason: Option<String>,
    pub handshakes: u64,
    pub handshake_failures: u64,
    pub handshake_timeouts: u64,
    pub handshake_seconds: HistogramOut,
    pub offloaded: u64,
    pub offload_failures: u64,
    pub rsa_queue_sizes: HistogramOut,
    pub ecdsa_queue_sizes: HistogramOut,
    pub key_op_fallbacks: u64,
    pub failed_checks: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerOut {
    pub name: String,
    pub address: String,
    pub requests: u64,
    /// Connections accepted; closed by a limit or a deadline, by cause.
    pub connections: u64,
    pub refused: u64,
    pub evicted: u64,
    pub header_timeouts: u64,
    pub idle_closed: u64,
    pub body_timeouts: u64,
    pub send_timeouts: u64,
    pub reset_budget_exceeded: u64,
    /// Requests answered 400 or 408 for the client's own fault.
    pub client_errors: u64,
    pub tls: Option<TlsOut>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EndpointOut {
    pub address: String,
    pub weight: u32,
    pub healthy: bool,
    pub health_checks: u64,
    pub health_failures: u64,
    pub requests: u64,
    pub connect_failures: u64,
    pub errors: u64,
    pub queue_timeouts: u64,
    /// Of those, requests whose own client connection held its `client_share`.
    pub share_timeouts: u64,
    pub send_timeouts: u64,
    pub read_timeouts: u64,
    /// Connections open to it now (idle ones included) and requests in flight; its cap
    /// (one per address, whichever clusters and reloads name it).
    pub connections: usize,
    pub in_flight: usize,
    pub max_connections: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterOut {
    pub name: String,
    pub endpoints: Vec<EndpointOut>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DispatchClassOut {
    pub name: String,
    pub share: u32,
    pub depth: usize,
    pub submitted: u64,
    pub served: u64,
    pub rejected_full: u64,
    pub expired: u64,
    pub panicked: u64,
    pub wait_seconds: HistogramOut,
    pub run_seconds: HistogramOut,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DispatchWorkerOut {
    pub items: u64,
    pub busy_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DispatchOut {
    pub mode: String,
    /// `software`, or `eventdev` (then `eventdev` names the device).
    pub backend: String,
    pub eventdev: Option<String>,
    pub classes: Vec<DispatchClassOut>,
    pub workers: Vec<DispatchWorkerOut>,
    /// Items the eventdev backend handed to an idle thread without the device (nothing else
    /// was pending); 0 with the software queue.
    pub handoffs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsOut {
    pub uptime_seconds: f64,
    pub reloads: u64,
    pub reload_failures: u64,
    pub last_reload_error: Option<String>,
    pub workers: usize,
    /// Client connections open now, and their limit over all listeners.
    pub client_connections: usize,
    pub max_client_connections: usize,
    /// Request bodies buffered now (`request_buffer`), in bytes, and their limit.
    pub buffered_bytes: usize,
    pub buffer_memory: usize,
    pub listeners: Vec<ListenerOut>,
    pub clusters: Vec<ClusterOut>,
    /// The dispatch pool (with `static` routes or a `[dispatch]` section).
    pub dispatch: Option<DispatchOut>,
    /// Ephemeral X25519 key pairs of the process's TLS key exchanges.
    pub x25519_keypairs: KeyPairsOut,
    /// Their shared secrets.
    pub x25519_secrets: SecretsOut,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecretsOut {
    /// Computed ahead, up to eight in one crypto_mb call (crate::kexstream).
    pub batched: u64,
    /// Computed by BoringSSL.
    pub single: u64,
    /// crypto_mb calls that computed the batched ones.
    pub batches: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyPairsOut {
    /// Made eight at a time with crypto_mb (`cryptomb` provider; crate::keyshare).
    pub batches_on: bool,
    /// Why they are off where the `cryptomb` provider asked for them.
    pub batches_off_reason: Option<String>,
    pub batched: u64,
    /// Made one at a time (BoringSSL's way).
    pub single: u64,
}

/// `GET /v1/config`: the digest of the configuration in force (not its text: it may hold keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigDigest {
    pub digest: String,
}

/// `PUT /v1/config`: applied, and the new configuration's digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigApplied {
    pub applied: bool,
    pub digest: String,
}

/// `POST /v1/reload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reloaded {
    pub reloaded: bool,
}

/// `GET /v1/health`: `ok` while the proxy serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyHealth {
    pub status: String,
}
