//! Neighbours learned at run time (from ARP and ND exchanges addressed to us, and answers to
//! our own requests). The configuration's static neighbours win over learned ones.

use crate::lock;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vectorlb_packet::ethernet::Mac;

#[derive(Debug, Clone, Copy)]
pub struct Neighbour {
    pub mac: Mac,
    pub port: u16,
    /// When it was last confirmed.
    pub seen: Instant,
}

#[derive(Default)]
pub struct Neighbours {
    learned: Mutex<BTreeMap<IpAddr, Neighbour>>,
}

impl Neighbours {
    /// Records a neighbour; true when it is new or its MAC changed (publish again).
    pub fn learn(&self, ip: IpAddr, mac: Mac, port: u16) -> bool {
        let prev = lock(&self.learned).insert(ip, Neighbour { mac, port, seen: Instant::now() });
        prev.is_none_or(|p| p.mac != mac)
    }

    /// Updates a neighbour only if it is known (a gratuitous ARP); true when its MAC changed.
    pub fn update(&self, ip: IpAddr, mac: Mac, port: u16) -> bool {
        match lock(&self.learned).get_mut(&ip) {
            Some(n) => {
                let changed = n.mac != mac || n.port != port;
                *n = Neighbour { mac, port, seen: Instant::now() };
                changed
            }
            None => false,
        }
    }

    /// Forgets neighbours not confirmed for `timeout`; true when any went.
    pub fn expire(&self, timeout: Duration) -> bool {
        let now = Instant::now();
        let mut l = lock(&self.learned);
        let before = l.len();
        l.retain(|_, n| now.duration_since(n.seen) < timeout);
        l.len() != before
    }

    /// How long ago `ip` was last confirmed, if it is known.
    pub fn age(&self, ip: &IpAddr) -> Option<Duration> {
        lock(&self.learned).get(ip).map(|n| n.seen.elapsed())
    }

    pub fn all(&self) -> Vec<(IpAddr, Neighbour)> {
        lock(&self.learned).iter().map(|(a, n)| (*a, *n)).collect()
    }
}
