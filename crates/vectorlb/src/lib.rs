//! The `vectorlb` binary's parts: the daemon (`run`), its control API and metrics, the
//! ipvsadm-like CLI (`ctl`), and the probes the demo and the end-to-end tests drive.

pub mod api;
pub mod ctl;
pub mod daemon;
pub mod gen;
pub use vectorlb_http as http;
pub mod metrics;
pub mod probe;
