//! `vectorlb proxy`: an L7 reverse proxy on tokio and hyper.
//!
//! * [`config`]: listeners, routes and clusters from a TOML file, checked whole;
//! * [`route`]: which cluster a request goes to (host, path prefix, header);
//! * [`forward`]: balancing per request over a cluster's endpoints (the streams of one
//!   HTTP/2 client connection spread over every endpoint), keep-alive pools, HTTP/1.1 or
//!   HTTP/2 upstreams, timeouts, one retry on another endpoint when a connection fails;
//! * [`client`]: what a client may take (deadlines, connections, stream resets) and what
//!   happens past it;
//! * [`serve`]: the listeners (HTTP/1.1 and HTTP/2 with prior knowledge on one port, or TLS
//!   with ALPN);
//! * [`tls`]: TLS termination through BoringSSL, certificates by SNI, private-key providers
//!   (inline, a crypto thread pool, the 8-lane multi-buffer [`cryptomb`] provider) behind the
//!   asynchronous private-key method; [`keyshare`]: the key exchange's X25519 key pairs made
//!   eight at a time under that provider, and their shared secrets too ([`kexstream`] reads the
//!   client's key ahead of BoringSSL); [`sslmem`]: BoringSSL's memory through the Rust
//!   allocator;
//! * [`dispatch`], [`objects`]: static objects read on a thread pool by priority class;
//! * [`health`], [`admin`], [`access_log`]: active health checks, the admin API with stats and
//!   Prometheus metrics, one JSON line per request.

pub mod access_log;
pub mod admin;
pub mod batch;
pub mod body;
pub mod client;
pub mod config;
pub mod cryptomb;
pub mod dispatch;
pub mod error;
pub mod forward;
pub mod health;
#[cfg(ippcp)]
pub mod ippcp;
pub mod kexstream;
pub mod keyshare;
pub mod mesh;
pub mod objects;
pub mod proxy;
pub mod route;
pub mod run;
pub mod serve;
pub mod sslmem;
pub mod stats;
pub mod tls;

pub use config::{Config, ConfigError};
