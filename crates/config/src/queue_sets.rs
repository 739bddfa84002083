//! `[[queue_sets]]` and `[default_set]`: application queue sets.

use crate::error::{bail, Error};
use crate::file::{RawQueueSet, RawRate};
use std::net::IpAddr;
use vectorlb_lb::LbSpec;
use vectorlb_packet::proto;

/// An application queue set: the packets of its services go to its workers and no other, and
/// its workers take no other traffic; what they send may be rate limited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSetSpec {
    pub name: String,
    /// (VIP, port, protocol) of each service in the set.
    pub services: Vec<(IpAddr, u16, u8)>,
    /// Its dedicated workers (indexes), in order.
    pub workers: Vec<u16>,
    /// The egress limit of what its workers transmit.
    pub rate: Option<RateSpec>,
    /// Whether its workers poll without ever sleeping (the default, as ADQ's pollers do);
    /// false lets them nap when idle like the others (small machines, where a core that
    /// never rests is one the application cannot use).
    pub busy_poll: bool,
}

/// A token bucket: bits and/or packets per second, with a burst of `burst_ms` at that rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSpec {
    pub bps: Option<u64>,
    pub pps: Option<u64>,
    pub burst_ms: u32,
}

/// A service as queue sets name it: `10.0.0.100:11211/tcp`, `[2001:db8::1]:53/udp`.
pub fn service_name(vip: IpAddr, port: u16, p: u8) -> String {
    let proto = if p == proto::TCP { "tcp" } else { "udp" };
    match vip {
        IpAddr::V4(a) => format!("{a}:{port}/{proto}"),
        IpAddr::V6(a) => format!("[{a}]:{port}/{proto}"),
    }
}

/// Longest burst of a queue set's rate limit, milliseconds.
pub const MAX_BURST_MS: u32 = 10_000;

/// `[[queue_sets]]`: names unique, services of this file (each in one set at most), workers
/// that exist, each in one set at most, and at least one worker left for everything else.
pub(crate) fn queue_sets(raw: &[RawQueueSet], spec: &LbSpec, workers: u16) -> Result<Vec<QueueSetSpec>, Error> {
    let mut out: Vec<QueueSetSpec> = Vec::new();
    let mut taken_workers = std::collections::HashSet::new();
    let mut taken_services = std::collections::HashSet::new();
    for (i, q) in raw.iter().enumerate() {
        let f = format!("queue_sets[{i}]");
        let ok = !q.name.is_empty() && q.name.len() <= 32 && q.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok || out.iter().any(|o| o.name == q.name) || q.name == "default" {
            bail!("{f}.name: '{}' is empty, used twice, 'default' or not letters, digits, _ and - (at most 32)", q.name);
        }
        let mut services = Vec::new();
        for (j, name) in q.services.iter().enumerate() {
            let found = spec.services.iter().find(|s| service_name(s.vip, s.port, s.proto) == *name);
            let Some(s) = found else {
                bail!("{f}.services[{j}]: '{name}' is not a service of this file (written VIP:PORT/tcp or /udp, [IPv6]:PORT/udp)");
            };
            if !taken_services.insert((s.vip, s.port, s.proto)) {
                bail!("{f}.services[{j}]: '{name}' is already in a set");
            }
            services.push((s.vip, s.port, s.proto));
        }
        if q.workers.is_empty() {
            bail!("{f}.workers: a set needs at least one worker of its own");
        }
        for (j, w) in q.workers.iter().enumerate() {
            if *w >= workers {
                bail!("{f}.workers[{j}]: worker {w} does not exist (runtime.workers = {workers}: 0 to {})", workers - 1);
            }
            if !taken_workers.insert(*w) {
                bail!("{f}.workers[{j}]: worker {w} is already dedicated to a set");
            }
        }
        let rate = q.rate.as_ref().map(|r| rate_spec(&format!("{f}.rate"), r)).transpose()?;
        out.push(QueueSetSpec { name: q.name.clone(), services, workers: q.workers.clone(), rate, busy_poll: q.busy_poll.unwrap_or(true) });
    }
    if !out.is_empty() && taken_workers.len() >= workers as usize {
        bail!("queue_sets: every worker is dedicated to a set; leave at least one for the rest of the traffic (runtime.workers = {workers})");
    }
    Ok(out)
}

/// A rate limit: bps and/or pps, neither 0, a burst within 1..=MAX_BURST_MS (default 10).
pub(crate) fn rate_spec(f: &str, r: &RawRate) -> Result<RateSpec, Error> {
    if r.bps.is_none() && r.pps.is_none() {
        bail!("{f}: give bps, pps or both");
    }
    if r.bps == Some(0) || r.pps == Some(0) {
        bail!("{f}: a rate of 0 would pass nothing (leave the rate out for none)");
    }
    let burst_ms = r.burst_ms.unwrap_or(10);
    if !(1..=MAX_BURST_MS).contains(&burst_ms) {
        bail!("{f}.burst_ms: {burst_ms} is not in 1..={MAX_BURST_MS}");
    }
    Ok(RateSpec { bps: r.bps, pps: r.pps, burst_ms })
}
