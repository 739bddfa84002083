//! `[ha]`: session sync with the peer(s).

use crate::error::{bail, Error};
use crate::file::RawHa;

/// Session synchronisation between HA nodes (`[ha]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSpec {
    /// Where this node receives sync messages (a host address, not a data-plane one).
    pub listen: std::net::SocketAddr,
    /// Where it sends them: the peers, or one multicast group.
    pub peers: Vec<std::net::SocketAddr>,
    /// The only addresses a message is taken from (checked before its tag): the unicast
    /// peers' addresses, or a multicast group's members (`sync_sources`).
    pub sources: Vec<std::net::IpAddr>,
    /// The group secret every message is sealed under (AES-256-GCM, a key per sender derived
    /// from it: vectorlb-sync).
    pub key: Vec<u8>,
    /// A group of active nodes (scale-out) instead of an active/standby pair: every node sends
    /// the sessions it creates to every peer and installs theirs, and a node that starts takes
    /// the group's sessions before it announces anything (docs/scale-out.md).
    pub group: bool,
    /// The most records a second the sender streams to each peer (`max_rate`).
    pub max_rate: u32,
}

impl SyncSpec {
    /// `max_rate`'s default: 500,000 records (about 51 MB) a second per peer.
    pub const DEFAULT_MAX_RATE: u32 = 500_000;
}

/// The unicast peers' addresses: whom messages are taken from when `sync_sources` is not given.
pub(crate) fn unicast_sources(peers: &[std::net::SocketAddr]) -> Vec<std::net::IpAddr> {
    let mut v: Vec<std::net::IpAddr> = peers.iter().map(|p| p.ip()).filter(|a| !a.is_multicast()).collect();
    v.dedup();
    v
}

/// `[ha]`, if there is one.
pub(crate) fn sync(raw: &Option<RawHa>) -> Result<Option<SyncSpec>, Error> {
    Ok(match raw {
        None => None,
        Some(h) => {
            let listen = h.sync_listen.parse().map_err(|_| Error::invalid(format!("ha.sync_listen: '{}' is not ADDRESS:PORT", h.sync_listen)))?;
            let mut peers = Vec::new();
            for (i, p) in h.sync_peers.iter().enumerate() {
                peers.push(p.parse().map_err(|_| Error::invalid(format!("ha.sync_peers[{i}]: '{p}' is not ADDRESS:PORT")))?);
            }
            if peers.is_empty() {
                bail!("ha.sync_peers: give the peer(s), or one multicast group");
            }
            if h.sync_key.len() < 16 {
                bail!("ha.sync_key: at least 16 characters (every sync message is sealed under it)");
            }
            let mut sources = Vec::new();
            for (i, s) in h.sync_sources.iter().enumerate() {
                let a: std::net::IpAddr = s.parse().map_err(|_| Error::invalid(format!("ha.sync_sources[{i}]: '{s}' is not an address")))?;
                if a.is_multicast() || a.is_unspecified() {
                    bail!("ha.sync_sources[{i}]: {a} is not a node's address");
                }
                sources.push(a);
            }
            let multicast = peers.iter().any(|p: &std::net::SocketAddr| p.ip().is_multicast());
            if sources.is_empty() {
                if multicast {
                    bail!("ha.sync_sources: a multicast group needs its members' addresses: only they may send (anyone on the link could otherwise)");
                }
                sources = unicast_sources(&peers);
            }
            let max_rate = h.max_rate.unwrap_or(SyncSpec::DEFAULT_MAX_RATE);
            if !(1_000..=100_000_000).contains(&max_rate) {
                bail!("ha.max_rate: {max_rate} records a second is out of range 1000..=100000000");
            }
            Some(SyncSpec { listen, peers, sources, key: h.sync_key.clone().into_bytes(), group: h.group, max_rate })
        }
    })
}
