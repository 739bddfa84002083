//! `[ports.memif]`: a memif port towards a pod.

use crate::error::{bail, Error};
use serde::{Deserialize, Serialize};

/// A memif port (`[ports.memif]`): the data plane's end of a shared-memory interface to a pod.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemifSpec {
    /// `server` (the data plane listens; pods connect) or `client`.
    #[serde(default = "MemifSpec::default_role")]
    pub role: String,
    /// The control socket: a path, or `@NAME` in the abstract namespace.
    #[serde(default = "MemifSpec::default_socket")]
    pub socket: String,
    /// The interface id on that socket.
    #[serde(default)]
    pub id: u32,
    /// The shared secret the client presents (1..=23 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Who copies frames between the shared memory and the data plane's buffers: `cpu`, or
    /// `dma` (the worker's dmadev, `runtime.dma_devices`).
    #[serde(default = "MemifSpec::default_copy")]
    pub copy: String,
    /// `ethernet` (frames with an Ethernet header), or `ip` (bare IPv4 / IPv6 packets: the
    /// port adds and removes the header, and every next hop on it is the peer).
    #[serde(default = "MemifSpec::default_mode")]
    pub mode: String,
    /// Client role: log2 of the slots per ring.
    #[serde(default = "MemifSpec::default_log2_ring")]
    pub log2_ring: u8,
    /// Client role: bytes per shared buffer (frames longer than one are chained).
    #[serde(default = "MemifSpec::default_buffer_size")]
    pub buffer_size: u32,
    /// Map regions that are not sealed against shrinking (DPDK's zero-copy client shares its
    /// huge pages that way). Only for a peer you trust: it could crash the data plane.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trust_peer: bool,
}

impl MemifSpec {
    fn default_role() -> String {
        "server".into()
    }
    fn default_socket() -> String {
        "/run/vectorlb/memif.sock".into()
    }
    fn default_copy() -> String {
        "cpu".into()
    }
    fn default_mode() -> String {
        "ethernet".into()
    }
    pub fn ip_mode(&self) -> bool {
        self.mode == "ip"
    }
    fn default_log2_ring() -> u8 {
        10
    }
    fn default_buffer_size() -> u32 {
        2048
    }
    pub fn is_server(&self) -> bool {
        self.role == "server"
    }
    pub fn uses_dma(&self) -> bool {
        self.copy == "dma"
    }

    pub(crate) fn check(&self, f: &str) -> Result<(), Error> {
        if !matches!(self.role.as_str(), "server" | "client") {
            bail!("{f}.role: '{}' is not one of server, client", self.role);
        }
        if !matches!(self.copy.as_str(), "cpu" | "dma") {
            bail!("{f}.copy: '{}' is not one of cpu, dma", self.copy);
        }
        if !matches!(self.mode.as_str(), "ethernet" | "ip") {
            bail!("{f}.mode: '{}' is not one of ethernet, ip", self.mode);
        }
        let name = self.socket.strip_prefix('@').unwrap_or(&self.socket);
        if name.is_empty() || self.socket.len() > 106 || self.socket.contains('\0') || !(self.socket.starts_with('@') || self.socket.starts_with('/')) {
            bail!("{f}.socket: '{}' is not an absolute path or @name of at most 106 bytes", self.socket);
        }
        if let Some(s) = &self.secret {
            if s.is_empty() || s.len() > 23 || s.contains('\0') {
                bail!("{f}.secret: must be 1..=23 bytes");
            }
        }
        if !(1..=14).contains(&self.log2_ring) {
            bail!("{f}.log2_ring: {} is out of range 1..=14", self.log2_ring);
        }
        if !(64..=65472).contains(&self.buffer_size) || !self.buffer_size.is_multiple_of(64) {
            bail!("{f}.buffer_size: {} is not a multiple of 64 in 64..=65472", self.buffer_size);
        }
        Ok(())
    }
}
