//! vectorlb's control APIs: HTTP/JSON on tokio and axum, typed bodies, and an OpenAPI document
//! generated from the code (utoipa), so what is served and what is documented cannot drift.
//!
//! * [`lb`]: the load balancer's API over [`lb::LbControl`], which the daemon implements;
//! * [`model`]: request and response bodies (`vectorlb-wire`'s, shared with every caller);
//! * [`error`]: [`ApiError`] (one variant per status) and the JSON body extractor;
//! * [`page`]: the status page at `/`, its files built in;
//! * [`server`]: serving on TCP or a unix socket with connection, time and size limits.
//!
//! This crate knows nothing of DPDK or the daemon's threads: the daemon depends on it, not the
//! other way round.

pub mod error;
pub mod lb;
/// The bodies live in the wire crate, which every caller shares.
pub use vectorlb_wire::model;
pub mod page;
/// The serving itself lives in the shared HTTP crate.
pub use vectorlb_http::server;

pub use error::ApiError;
pub use lb::{openapi_json, router, LbControl};
pub use server::{serve, Access, Endpoint, Listener};
