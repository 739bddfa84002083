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
//! * [`call`]: one request with a typed body and a typed answer or [`call::CallError`].

pub mod call;
pub mod error;
pub mod model;

pub use call::{Api, CallError};
pub use error::{ErrorBody, ErrorKind, OpError};
