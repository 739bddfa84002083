//! The contract between vectorlb's binaries: every body one of them sends another (the
//! daemon's control API as the CLI, the controller and the CNI plugin call it), the error body
//! callers match on, the limits that go with them, and the one typed way to call ([`call`]).
//!
//! Nothing here knows a server framework: the CNI plugin uses these types without pulling in
//! the daemon's HTTP stack. The OpenAPI document (`vectorlb-api`) is generated from them, so
//! what is served, what is documented and what the callers read cannot drift.
//!
//! * [`model`]: request and response bodies, and their limits;
//! * [`error`]: [`ErrorBody`] with its machine-readable [`ErrorKind`] and failing operation;
//! * [`proxy`]: the L7 proxy's admin API bodies;
//! * [`call`]: one request with a typed body and a typed answer or [`call::CallError`].

pub mod call;
pub mod error;
pub mod model;
pub mod proxy;

pub use call::{Api, CallError};
pub use error::{ErrorBody, ErrorKind, OpError};

/// A body of the contract. [`Api`] sends and reads only these: an untyped `serde_json::Value`
/// cannot be the body or the answer of a call between our binaries.
pub trait Wire {}

macro_rules! wire {
    ($($t:ty),* $(,)?) => {
        $(impl Wire for $t {})*
        /// The names of the types above, for the test that every body type is one.
        #[cfg(test)]
        const WIRE: &[&str] = &[$(stringify!($t)),*];
    };
}

use model::*;
use proxy::*;
wire! {
    Proto, ModeName, SchedulerName, NewBackend, NewService, HealthCheck, HealthKind, OnDownName, ServicePatch, BatchOp, ServiceRef, Batch,
    BatchDone, SynProxyName, BackendPatch, BackendHealth, BackendStatus, Rates, History, ServiceHistory, BackendHistory, RateSeries, GlobalRates,
    PortRates, ServiceStats, ServiceTimeouts, ServiceStatus, Health, BgpStatus, BgpNeighborStatus, DrainStatus, DrainChange, Created, Updated,
    Deleted, model::Reloaded, Saved, HaState, HaStatus, HaChange, HaChanged, SyncStatus, SyncRejected, SyncRefused, SyncBulk, Stats, QueueSetStatus,
    QueueSetXdp, QueueSetQueues, Quantiles, PortStatus, MemifStatus, MemifQueue, Neighbor, Session, SessionPage, NewPod, HostPort, MemifPorts, PodMemif,
    PodStatus, PolicyChanges, PolicyIdentity, PolicyPrefix, PolicyEndpoint, PolicyDirection, PolicyRule, PolicyPorts, PolicyStatus, PolicyDeniedLog, PolicyDeniedFlow, MeshSteering, MeshStatus, HistogramOut, TlsOut, ListenerOut, EndpointOut, ClusterOut, DispatchClassOut, DispatchWorkerOut, DispatchOut, StatsOut, SecretsOut,
    KeyPairsOut, ConfigDigest, ConfigApplied, proxy::Reloaded, ProxyHealth, ErrorKind, OpError, ErrorBody,
}
impl<T: Wire> Wire for Vec<T> {}
/// No body.
impl Wire for () {}
/// An answer that is not read (a `DELETE`'s).
impl Wire for serde::de::IgnoredAny {}

#[cfg(test)]
mod tests {
    /// Every serde type of the contract's modules is a [`super::Wire`] type.
    #[test]
    fn every_body_type_is_a_wire_type() {
        let listed: Vec<&str> = super::WIRE.iter().map(|t| t.rsplit("::").next().unwrap().trim()).collect();
        for (file, text) in [("model.rs", include_str!("model.rs")), ("proxy.rs", include_str!("proxy.rs")), ("error.rs", include_str!("error.rs"))] {
            let mut derive = String::new();
            for line in text.lines() {
                let t = line.trim_start();
                if t.starts_with("#[derive(") {
                    derive = t.to_string();
                }
                let Some(rest) = t.strip_prefix("pub struct ").or_else(|| t.strip_prefix("pub enum ")) else { continue };
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if derive.contains("Serialize") || derive.contains("Deserialize") {
                    assert!(listed.contains(&name.as_str()), "{file}: {name} goes over the wire but is not in lib.rs's wire! list");
                }
                derive.clear();
            }
        }
    }
}
