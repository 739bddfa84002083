//! Active/standby: the node's HA state, set by keepalived's notify scripts through the API
//! (`vectorlb ctl --ha-state master|backup`). A BACKUP node does not answer ARP / ND for the
//! floating addresses (VIPs, full-NAT and SNAT local addresses), so traffic goes to the
//! MASTER; a node becoming MASTER announces them (gratuitous ARP, unsolicited neighbour
//! advertisements) so that clients and backends move to it at once. STANDALONE (no HA) answers
//! for everything.

use crate::config_store::ConfigStore;
use crate::lock;
use crate::workers::Workers;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vectorlb_config::Config;
use vectorlb_lb::neigh;
use vectorlb_lb::service::key;

pub const STANDALONE: u8 = 0;
pub const MASTER: u8 = 1;
pub const BACKUP: u8 = 2;

pub fn name(s: u8) -> &'static str {
    match s {
        MASTER => "master",
        BACKUP => "backup",
        _ => "standalone",
    }
}

pub fn parse(s: &str) -> Option<u8> {
    match s {
        "standalone" => Some(STANDALONE),
        "master" => Some(MASTER),
        "backup" => Some(BACKUP),
        _ => None,
    }
}

pub struct Ha {
    state: AtomicU8,
    since: Mutex<Instant>,
    pub transitions: AtomicU64,
    pub announcements: AtomicU64,
}

impl Ha {
    pub fn new(initial: u8) -> Ha {
        Ha { state: AtomicU8::new(initial), since: Mutex::new(Instant::now()), transitions: AtomicU64::new(0), announcements: AtomicU64::new(0) }
    }

    #[inline]
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Relaxed)
    }

    /// Whether this node answers for floating addresses.
    #[inline]
    pub fn answers_floating(&self) -> bool {
        self.state() != BACKUP
    }

    pub fn since(&self) -> Duration {
        lock(&self.since).elapsed()
    }
}

/// VIPs and local addresses: what moves between nodes.
pub fn floating(c: &Config) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = Vec::new();
    for s in &c.spec.services {
        v.push(s.vip);
        v.extend(s.local_addrs.iter().copied());
    }
    for r in &c.spec.snat {
        v.extend(r.addrs.iter().copied());
    }
    v.sort();
    v.dedup();
    v
}

impl Ha {
    /// Changes the HA state; becoming MASTER announces the floating addresses (now, after
    /// 200 ms and after 1 s, for switches and hosts that missed the first). Returns the
    /// previous state.
    pub fn set(self: &Arc<Self>, new: u8, config: &Arc<ConfigStore>, workers: &Arc<Workers>) -> u8 {
        let old = self.state.swap(new, Ordering::SeqCst);
        if old != new {
            self.transitions.fetch_add(1, Ordering::Relaxed);
            *lock(&self.since) = Instant::now();
            tracing::warn!("ha: {} -> {}", name(old), name(new));
        }
        if new == MASTER && old != MASTER {
            let (me, config, workers) = (self.clone(), config.clone(), workers.clone());
            let spawned = std::thread::Builder::new().name("vlb-announce".into()).spawn(move || {
                for wait in [0, 200, 800] {
                    std::thread::sleep(Duration::from_millis(wait));
                    if me.state() != MASTER {
                        return;
                    }
                    me.announce(&config, &workers);
                }
            });
            if let Err(e) = spawned {
                tracing::error!("ha: cannot start the announcements: {e}");
            }
        }
        old
    }

    /// Gratuitous ARP / unsolicited NA for every floating address, on the port of its network.
    pub fn announce(&self, config: &ConfigStore, workers: &Workers) {
        let addrs = config.with(floating);
        let snap = config.control.snapshot();
        for a in addrs {
            let v4 = a.is_ipv4();
            let Some(port) = snap.route_port(key(a), v4) else { continue };
            let frame = match a {
                IpAddr::V4(x) => neigh::gratuitous_arp(&snap, port, x),
                IpAddr::V6(x) => neigh::unsolicited_na(&snap, port, x),
            };
            if let Some(f) = frame {
                workers.send(port, f);
                self.announcements.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
