//! The small HTTP server crate that the daemon's control API and the proxy's admin API share:
//!
//! * [`server`]: serving an axum router on a TCP address (with a bearer token) or a unix socket
//!   (guarded by its mode), with bounded connections, deadlines and bodies; the socket path
//!   rules (a live socket is never taken over, a file that is not a socket never removed);
//! * [`error`]: errors as `{"error": "..."}` with one status per kind;
//! * [`prom`]: Prometheus's text format, for every `/metrics`;
//! * [`files`]: the files both keep (configuration, state), written and read without trusting
//!   their directory.

pub mod error;
pub mod files;
pub mod prom;
pub mod server;

pub use error::ApiError;
pub use server::{serve, Access, Endpoint, Listener};

/// A digest of a configuration's text (FNV-1a, 64 bits): what a controller compares with the
/// text it wants served, to know whether to push it (change detection, not integrity). The
/// proxy's `GET /v1/config` gives it; `vectorlb kube` computes it the same way.
pub fn text_digest(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("fnv1a64:{h:016x}")
}
