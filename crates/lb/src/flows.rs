//! What a core's features share: its session table and counters, the sessions changed since
//! the sync thread last asked, the next hops packets needed whose MAC is unknown, and the IPv4
//! identification of the packets the LB originates (ICMP errors, tunnel headers).
//!
//! Each feature keeps its own state in a struct of its own ([`crate::frag::FragTable`],
//! [`crate::icmp::IcmpLimiter`], [`crate::synproxy::SynProxyState`]) and reaches the rest only
//! through a [`Flows`] and the configuration snapshot it is handed, so no feature can touch
//! another's state. The [`crate::Worker`] holds one of each and runs the stages.

use crate::mem::Zeroable;
use crate::rewrite::Fam;
use crate::service::{Hop, Snapshot};
use crate::session::{expired, Ref, Session, SessionTable};
use crate::verdict::{Counters, DropReason, Verdict};

pub struct Flows {
    pub table: SessionTable,
    pub counters: Counters,
    /// Next hops (address key, IPv4?) a packet needed but whose MAC is unknown, for the
    /// runtime to resolve; bounded, drained by [`Flows::take_unresolved`].
    unresolved: Vec<(u128, bool)>,
    /// Session synchronisation: whether to remember changed sessions, and which.
    sync_on: bool,
    changed: Vec<Ref>,
    /// The identification of the next IPv4 header the LB writes itself.
    ip_ident: u16,
}

impl Flows {
    pub(crate) fn new(table: SessionTable) -> Flows {
        Flows { table, counters: Counters::default(), unresolved: Vec::new(), sync_on: false, changed: Vec::new(), ip_ident: 0 }
    }

    /// Like [`Snapshot::route`]; a next hop without a known MAC is remembered for
    /// [`Flows::take_unresolved`] (so that the runtime can ask for it, as a host's stack would).
    #[inline]
    pub(crate) fn route_to(&mut self, snap: &Snapshot, dst: u128, v4: bool) -> Option<Hop> {
        let hop = snap.route(dst, v4);
        if hop.is_none() && self.unresolved.len() < 64 {
            if let Some((nh, _)) = snap.next_hop(dst, v4) {
                if !self.unresolved.contains(&(nh, v4)) {
                    self.unresolved.push((nh, v4));
                }
            }
        }
        hop
    }

    #[inline(always)]
    pub fn has_unresolved(&self) -> bool {
        !self.unresolved.is_empty()
    }

    /// Next hops packets needed since the last call whose MAC was unknown, with the port each
    /// is reached through in `snap`.
    pub fn take_unresolved(&mut self, snap: &Snapshot) -> Vec<(std::net::IpAddr, u16)> {
        self.unresolved
            .drain(..)
            .filter_map(|(k, v4)| {
                let port = snap.next_hop(k, v4)?.1;
                let ip = if v4 { std::net::IpAddr::V4(std::net::Ipv4Addr::from(k as u32)) } else { std::net::IpAddr::V6(std::net::Ipv6Addr::from(k)) };
                Some((ip, port))
            })
            .collect()
    }

    /// The session `r` if it has not expired; an expired one is removed.
    #[inline(always)]
    pub(crate) fn live<A: Fam>(&mut self, r: Ref, now: u32) -> Option<Ref>
    where
        Session<A>: Zeroable,
    {
        if expired(now, self.table.get::<A>(r).expire) {
            self.table.remove::<A>(r);
            self.table.stats.expired += 1;
            return None;
        }
        Some(r)
    }

    /// What becomes of a packet for a local port this core does not own: it goes to the
    /// core that does, or is dropped when no core owns it.
    #[cold]
    pub(crate) fn elsewhere(&self, lport: u16) -> Verdict {
        match self.table.port_owner(lport) {
            Some(w) => Verdict::Handoff(w),
            None => Verdict::Drop(DropReason::Misdirected),
        }
    }

    /// Session `r` was created or changed state: remembered for the sync thread when it asks.
    #[inline(always)]
    pub(crate) fn changed(&mut self, r: Ref) {
        if self.sync_on {
            self.changed.push(r);
        }
    }

    /// Starts (or stops) remembering which sessions change.
    pub(crate) fn track_changes(&mut self, on: bool) {
        self.sync_on = on;
        if !on {
            self.changed.clear();
        }
    }

    #[inline(always)]
    pub(crate) fn has_changes(&self) -> bool {
        !self.changed.is_empty()
    }

    /// The sessions changed since the last call.
    pub(crate) fn take_changed(&mut self) -> Vec<Ref> {
        std::mem::take(&mut self.changed)
    }

    /// The identification for the next IPv4 header the LB writes.
    #[inline(always)]
    pub(crate) fn next_ident(&mut self) -> u16 {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.ip_ident
    }
}
