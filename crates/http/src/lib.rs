//! The small HTTP server crate that the daemon's control API and the proxy's admin API share:
//!
//! * [`server`]: serving an axum router on a TCP address (with a bearer token) or a unix socket
//!   (guarded by its mode), with bounded connections, deadlines and bodies; the socket path
//!   rules (a live socket is never taken over, a file that is not a socket never removed);
//! * [`error`]: errors as `{"error": "..."}` with one status per kind;
//! * [`prom`]: Prometheus's text format, for every `/metrics`.

pub mod error;
pub mod prom;
pub mod server;

pub use error::ApiError;
pub use server::{serve, Access, Endpoint, Listener};
