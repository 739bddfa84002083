//! `vectorlb proxy`: an L7 reverse proxy on tokio and hyper.
//!
//! * [`config`]: listeners, routes and clusters from a TOML file, checked whole;
//! * [`route`]: which cluster a request goes to (host, path prefix, header);
//! * [`forward`]: balancing per request over a cluster's endpoints (the streams of one
//!   HTTP/2 client connection spread over every endpoint), keep-alive pools, HTTP/1.1 or
//!   HTTP/2 upstreams, timeouts, one retry on another endpoint when a connection fails;
//! * [`serve`]: the listeners (HTTP/1.1 and HTTP/2 with prior knowledge on one port, or TLS
//!   with ALPN);
//! * [`tls`]: TLS termination through BoringSSL, certificates by SNI, private-key providers
//!   (inline, a crypto thread pool behind the asynchronous private-key method).
//!
//! Being built (issue 11): the 8-lane multi-buffer provider, health checks, the admin API,
//! access log and metrics, reload.

pub mod access_log;
pub mod admin;
pub mod config;
pub mod cryptomb;
pub mod forward;
pub mod health;
#[cfg(ippcp)]
pub mod ippcp;
pub mod route;
pub mod serve;
pub mod tls;

pub use config::{Config, ConfigError};
