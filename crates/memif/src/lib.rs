//! memif: the shared-memory packet interface between the data plane and a pod (version 2.0,
//! as DPDK's `net_memif`, VPP and libmemif speak it), for a peer that is not trusted.
//!
//! - [`proto`]: the 128-byte control messages.
//! - [`sock`]: the `SOCK_SEQPACKET` control socket with descriptor passing.
//! - [`region`]: memfd regions, checked (size, seals) before the server maps a peer's.
//! - [`ring`]: rings and descriptors in shared memory, read once into local copies.
//! - [`server`]: the server's handshake; [`serverq`]: its queues, over a copy engine.
//! - [`client`]: the client's handshake and its queues with a buffer pool (copy or
//!   zero-copy use).
//!
//! The client creates all shared memory; the server (normally the data plane) maps it. The
//! server never trusts what the client wrote: see docs/memif.md, "Security model".

pub mod client;
pub mod clientport;
pub mod conn;
pub mod ipmode;
pub mod proto;
pub mod region;
pub mod ring;
pub mod server;
pub mod serverq;
pub mod sock;

pub use client::{Buf, Client, ClientConfig, ClientError, ClientQueue};
pub use clientport::{ClientRx, ClientTx, QueueSlot};
pub use conn::{Connection, CounterKind, Link, LinkState, QueueCounters};
pub use ipmode::{IpRx, IpTx};
pub use proto::Mode;
pub use server::{InterfaceConfig, Server, ServerError};
pub use serverq::{ServerRx, ServerTx, SharedCopier};
pub use sock::SocketAddr;
