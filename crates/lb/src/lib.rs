//! The layer-4 load-balancer core of vectorlb, independent of how packets arrive.
//!
//! * [`service`]: the service model ([`LbSpec`]) and the immutable [`Snapshot`] the packet path
//!   reads; [`Control`] publishes new snapshots without stopping traffic.
//! * [`session`]: the per-core session table (index, records, full-NAT port maps).
//! * [`pipeline`]: the per-core [`Worker`] that runs batches of [`PacketBuf`]s through
//!   classification, session lookup and rewriting, and returns a [`Verdict`] per packet.
//! * [`flows`]: what the features of one core share ([`flows::Flows`]: the session table, the
//!   counters, changed sessions, next hops to resolve); each feature's own state is its own
//!   struct: [`frag::FragTable`], [`icmp::IcmpLimiter`], [`synproxy::SynProxyState`].
//! * [`icmp`]: echo, generated errors, and error translation for sessions.
//! * [`affinity`]: client affinity entries (`sessionAffinity: ClientIP`), shared by the workers.
//!
//! Ownership: a `Worker` and its `SessionTable` belong to one core; the `Control` and its
//! snapshots are shared read-only. The DPDK runtime, `vectorlb replay` and the benchmarks all
//! drive `Worker::process`.

pub mod addr;
pub mod affinity;
pub mod flows;
pub mod frag;
pub mod hash;
pub mod icmp;
pub mod mem;
pub mod mesh;
pub mod meta;
pub mod neigh;
pub mod pipeline;
pub mod policy;
pub mod quic;
pub mod rewrite;
pub mod route;
pub mod service;
pub mod session;
pub mod sync;
pub mod synproxy;
pub mod tcpstate;
pub mod verdict;

pub use pipeline::{ForwardFlow, Worker, WorkerConfig, DEFAULT_BATCH};
pub use service::{BackendSpec, ConfigError, Control, LbSpec, Mode, PortSpec, RouteSpec, ServiceSpec, Snapshot, SnatSpec, SynProxy, Timeouts};
pub use vectorlb_io::{HeapBuf, PacketBuf};
pub use verdict::{Counters, DropReason, Verdict};
