//! Address allocation for Services of type LoadBalancer: pure, so it is tested without a
//! cluster. Every round allocates the whole cluster again from what the objects say, keeping
//! each Service's address from its status, so a restarted controller changes no address.

use crate::reason::Reason;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(a: &IpAddr) -> Family {
        if a.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub family: Family,
    pub start: u128,
    pub end: u128,
}

impl Range {
    fn addr(&self, n: u128) -> IpAddr {
        match self.family {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
        }
    }

    pub fn contains(&self, a: &IpAddr) -> bool {
        Family::of(a) == self.family && (self.start..=self.end).contains(&num(a))
    }

    fn overlaps(&self, o: &Range) -> bool {
        self.family == o.family && self.start <= o.end && o.start <= self.end
    }

    fn len(&self) -> u128 {
        (self.end - self.start).saturating_add(1)
    }
}

fn num(a: &IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u32::from(*a) as u128,
        IpAddr::V6(a) => u128::from(*a),
    }
}

/// Parses "CIDR" or "FIRST-LAST". In an IPv4 CIDR of /30 or shorter the network and broadcast
/// addresses are left out (clients and routers treat them specially).
pub fn parse_range(s: &str) -> Result<Range, String> {
    let s = s.trim();
    if let Some((a, b)) = s.split_once('-') {
        let a: IpAddr = a.trim().parse().map_err(|_| format!("'{s}': '{a}' is not an address"))?;
        let b: IpAddr = b.trim().parse().map_err(|_| format!("'{s}': '{b}' is not an address"))?;
        if Family::of(&a) != Family::of(&b) {
            return Err(format!("'{s}': the two ends are of different families"));
        }
        if num(&a) > num(&b) {
            return Err(format!("'{s}': the first address is after the last"));
        }
        return Ok(Range { family: Family::of(&a), start: num(&a), end: num(&b) });
    }
    let (a, len) = s.split_once('/').ok_or_else(|| format!("'{s}': neither a CIDR (ADDRESS/LENGTH) nor a range (FIRST-LAST)"))?;
    let a: IpAddr = a.parse().map_err(|_| format!("'{s}': '{a}' is not an address"))?;
    let bits = if a.is_ipv4() { 32 } else { 128 };
    let len: u32 = len.parse().ok().filter(|l| *l <= bits).ok_or_else(|| format!("'{s}': the prefix length is not 0 to {bits}"))?;
    let host_bits = bits - len;
    let mask: u128 = if host_bits == 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
    let n = num(&a);
    if n & mask != 0 {
        return Err(format!("'{s}': host bits are set (the network is {})", Range { family: Family::of(&a), start: n & !mask, end: 0 }.addr(n & !mask)));
    }
    let (mut start, mut end) = (n, n | mask);
    if a.is_ipv4() && len <= 30 {
        start += 1;
        end -= 1;
    }
    Ok(Range { family: Family::of(&a), start, end })
}

/// A pool as its object says.
#[derive(Debug, Clone, Default)]
pub struct PoolIn {
    pub name: String,
    /// Creation time (RFC 3339) then name order decides which of two overlapping pools wins.
    pub created: String,
    pub addresses: Vec<String>,
    pub auto_assign: bool,
    pub namespaces: Vec<String>,
    pub service_labels: BTreeMap<String, String>,
}

/// A Service of type LoadBalancer as its object says.
#[derive(Debug, Clone, Default)]
pub struct SvcIn {
    /// "namespace/name".
    pub key: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub created: String,
    pub family: Option<Family>,
    /// The address in its status now.
    pub current: Option<IpAddr>,
    /// The address it asks for (annotation or `spec.loadBalancerIP`).
    pub requested: Option<IpAddr>,
    /// A requested address that is not an address (the text as given).
    pub invalid_request: Option<String>,
    /// The pool it names.
    pub pool: Option<String>,
    /// Services with the same sharing key may share an address when their ports differ.
    pub sharing: Option<String>,
    /// (protocol name, port) of its ports.
    pub ports: Vec<(String, u16)>,
}

/// What became of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReport {
    /// None: valid; else (reason, message).
    pub problem: Option<(Reason, String)>,
    pub assigned: u64,
    pub available: u64,
}

/// What became of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Assigned {
        ip: IpAddr,
        pool: String,
    },
    /// (reason, message), for an Event.
    Failed {
        reason: Reason,
        message: String,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Allocation {
    pub pools: BTreeMap<String, PoolReport>,
    pub services: BTreeMap<String, Outcome>,
}

struct Pool<'a> {
    input: &'a PoolIn,
    ranges: Vec<Range>,
    valid: bool,
}

impl Pool<'_> {
    fn allows(&self, s: &SvcIn) -> bool {
        (self.input.namespaces.is_empty() || self.input.namespaces.contains(&s.namespace)) && self.input.service_labels.iter().all(|(k, v)| s.labels.get(k) == Some(v))
    }

    fn contains(&self, a: &IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(a))
    }
}

/// Who uses an address: (sharing key, ports, service).
type Users = Vec<(Option<String>, BTreeSet<(String, u16)>, String)>;

fn fits(users: Option<&Users>, s: &SvcIn) -> Result<(), (Reason, String)> {
    let Some(users) = users else { return Ok(()) };
    let mine: BTreeSet<(String, u16)> = s.ports.iter().cloned().collect();
    for (key, ports, other) in users {
        if s.sharing.is_none() || key != &s.sharing {
            return Err((Reason::AddressInUse, format!("the address is used by {other} (share it by giving both the same vectorlb.io/allow-shared-ip)")));
        }
        if let Some((p, n)) = ports.intersection(&mine).next() {
            return Err((Reason::PortClash, format!("{p} port {n} on this address is already {other}'s")));
        }
    }
    Ok(())
}

/// Allocates every Service an address: first those keeping the one in their status (oldest
/// first), then the others by age; a requested address is honoured when a pool that allows
/// the Service holds it and it is free (or shared without a port clash).
pub fn allocate(pools_in: &[PoolIn], svcs: &[SvcIn]) -> Allocation {
    let mut out = Allocation::default();
    // Pools, oldest first; a pool overlapping an older valid one is not used.
    let mut order: Vec<&PoolIn> = pools_in.iter().collect();
    order.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
    let mut pools: Vec<Pool> = Vec::new();
    for p in order {
        let mut problem = None;
        let mut ranges = Vec::new();
        for a in &p.addresses {
            match parse_range(a) {
                Ok(r) => ranges.push(r),
                Err(e) => problem = Some((Reason::InvalidAddresses, e)),
            }
        }
        if problem.is_none() && ranges.is_empty() {
            problem = Some((Reason::InvalidAddresses, "the pool has no addresses".into()));
        }
        if problem.is_none() {
            'outer: for (i, r) in ranges.iter().enumerate() {
                if ranges[..i].iter().any(|o| o.overlaps(r)) {
                    problem = Some((Reason::InvalidAddresses, format!("'{}' overlaps another range of the pool", p.addresses[i])));
                    break;
                }
                for other in pools.iter().filter(|o| o.valid) {
                    if other.ranges.iter().any(|o| o.overlaps(r)) {
                        problem = Some((Reason::Overlap, format!("'{}' overlaps pool {}, which is older; this pool is not used", p.addresses[i], other.input.name)));
                        break 'outer;
                    }
                }
            }
        }
        let valid = problem.is_none();
        out.pools.insert(p.name.clone(), PoolReport { problem, assigned: 0, available: 0 });
        pools.push(Pool { input: p, ranges, valid });
    }
    pools.sort_by(|a, b| a.input.name.cmp(&b.input.name));

    let mut svc_order: Vec<&SvcIn> = svcs.iter().collect();
    svc_order.sort_by(|a, b| (&a.created, &a.key).cmp(&(&b.created, &b.key)));
    let mut used: BTreeMap<IpAddr, Users> = BTreeMap::new();
    let mut pending = Vec::new();
    let take = |used: &mut BTreeMap<IpAddr, Users>, s: &SvcIn, ip: IpAddr| {
        used.entry(ip).or_default().push((s.sharing.clone(), s.ports.iter().cloned().collect(), s.key.clone()));
    };
    // 1. Keep current addresses that are still right.
    for s in &svc_order {
        if s.invalid_request.is_some() {
            pending.push(*s);
            continue;
        }
        let keep = s.current.filter(|c| s.requested.is_none_or(|r| r == *c) && s.family.is_none_or(|f| f == Family::of(c)));
        match keep.and_then(|c| pool_of(&pools, s, &c).map(|p| (c, p))) {
            Some((ip, pool)) if fits(used.get(&ip), s).is_ok() => {
                take(&mut used, s, ip);
                out.services.insert(s.key.clone(), Outcome::Assigned { ip, pool });
            }
            _ => pending.push(*s),
        }
    }
    // 2. The others, oldest first.
    for s in pending {
        let outcome = assign(&pools, &mut used, s);
        if let Outcome::Assigned { ip, .. } = &outcome {
            take(&mut used, s, *ip);
        }
        out.services.insert(s.key.clone(), outcome);
    }
    for p in &pools {
        let assigned = used.keys().filter(|a| p.contains(a)).count() as u64;
        let total: u128 = p.ranges.iter().fold(0u128, |t, r| t.saturating_add(r.len()));
        let r = out.pools.get_mut(&p.input.name).unwrap();
        if p.valid {
            r.assigned = assigned;
            r.available = total.saturating_sub(assigned as u128).min(u32::MAX as u128) as u64;
        }
    }
    out
}

/// The valid pool that holds `ip` and allows `s` (and is the one it names, if it names one).
fn pool_of(pools: &[Pool], s: &SvcIn, ip: &IpAddr) -> Option<String> {
    pools.iter().find(|p| p.valid && p.contains(ip) && p.allows(s) && s.pool.as_ref().is_none_or(|n| n == &p.input.name)).map(|p| p.input.name.clone())
}

fn assign(pools: &[Pool], used: &mut BTreeMap<IpAddr, Users>, s: &SvcIn) -> Outcome {
    let fail = |reason: Reason, message: String| Outcome::Failed { reason, message };
    if let Some(v) = &s.invalid_request {
        return fail(Reason::InvalidAddress, format!("requested address '{v}' is not an IP address"));
    }
    if let Some(ip) = s.requested {
        let Some(pool) = pool_of(pools, s, &ip) else {
            let why = match pools.iter().find(|p| p.contains(&ip)) {
                None => "no address pool holds it".to_string(),
                Some(p) if !p.valid => format!("pool {} holds it but is not valid", p.input.name),
                Some(p) => format!("pool {} holds it but does not allow this Service (its namespaces, labels or the vectorlb.io/address-pool annotation)", p.input.name),
            };
            return fail(Reason::AddressNotInPool, format!("requested address {ip}: {why}"));
        };
        return match fits(used.get(&ip), s) {
            Ok(()) => Outcome::Assigned { ip, pool },
            Err((reason, m)) => fail(reason, format!("requested address {ip}: {m}")),
        };
    }
    if let Some(name) = &s.pool {
        match pools.iter().find(|p| &p.input.name == name) {
            None => return fail(Reason::NoSuchPool, format!("address pool {name} (vectorlb.io/address-pool) does not exist")),
            Some(p) if !p.valid => return fail(Reason::PoolNotValid, format!("address pool {name} is not valid")),
            Some(p) if !p.allows(s) => return fail(Reason::PoolNotAllowed, format!("address pool {name} does not allow this Service (its namespaces or labels)")),
            _ => {}
        }
    }
    let candidates: Vec<&Pool> = pools
        .iter()
        .filter(|p| p.valid && p.allows(s))
        .filter(|p| match &s.pool {
            Some(n) => &p.input.name == n,
            None => p.input.auto_assign,
        })
        .collect();
    let family_ok = |r: &Range| s.family.is_none_or(|f| f == r.family);
    // A shared address first: one its sharing key already uses, without a port clash.
    if s.sharing.is_some() {
        for (ip, _) in used.iter().filter(|(_, users)| users.iter().all(|u| u.0 == s.sharing)) {
            if let Some(p) = candidates.iter().find(|p| p.ranges.iter().any(|r| r.contains(ip) && family_ok(r))) {
                if fits(used.get(ip), s).is_ok() {
                    return Outcome::Assigned { ip: *ip, pool: p.input.name.clone() };
                }
            }
        }
    }
    for p in &candidates {
        for r in p.ranges.iter().filter(|r| family_ok(r)) {
            // At most used.len() + 1 steps find a free address if the range has one.
            let steps = (used.len() as u128 + 1).min(r.len());
            for i in 0..steps {
                let ip = r.addr(r.start + i);
                if !used.contains_key(&ip) {
                    return Outcome::Assigned { ip, pool: p.input.name.clone() };
                }
            }
        }
    }
    if candidates.is_empty() {
        fail(Reason::NoPool, "no valid address pool allows this Service (auto-assign pools, their namespaces and labels)".into())
    } else {
        fail(Reason::PoolExhausted, format!("no free address in {}", candidates.iter().map(|p| p.input.name.as_str()).collect::<Vec<_>>().join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, created: &str, addrs: &[&str]) -> PoolIn {
        PoolIn { name: name.into(), created: created.into(), addresses: addrs.iter().map(|s| s.to_string()).collect(), auto_assign: true, ..Default::default() }
    }

    fn svc(key: &str, created: &str, ports: &[u16]) -> SvcIn {
        let ns = key.split('/').next().unwrap().to_string();
        SvcIn { key: key.into(), namespace: ns, created: created.into(), ports: ports.iter().map(|p| ("TCP".to_string(), *p)).collect(), ..Default::default() }
    }

    fn ip(o: &Outcome) -> String {
        match o {
            Outcome::Assigned { ip, .. } => ip.to_string(),
            Outcome::Failed { reason, .. } => reason.to_string(),
        }
    }

    #[test]
    fn ranges_parse_and_refuse_nonsense() {
        let r = parse_range("10.0.0.0/24").unwrap();
        assert_eq!((r.start as u32, r.end as u32), (u32::from(Ipv4Addr::new(10, 0, 0, 1)), u32::from(Ipv4Addr::new(10, 0, 0, 254))));
        assert_eq!(parse_range("10.0.0.7/32").unwrap().len(), 1);
        assert_eq!(parse_range("2001:db8::/120").unwrap().len(), 256);
        assert_eq!(parse_range("10.0.0.5 - 10.0.0.9").unwrap().len(), 5);
        for bad in ["10.0.0.1/24", "10.0.0.0/33", "10.0.0.9-10.0.0.5", "10.0.0.1-2001:db8::1", "nonsense", "", "10.0.0.0/x", "::/129"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_range("::/0").unwrap().len(), u128::MAX);
    }

    #[test]
    fn keeps_current_honours_requested_and_fills_in_age_order() {
        let pools = [pool("a", "1", &["10.0.0.10-10.0.0.12"])];
        let mut old = svc("x/old", "2", &[80]);
        old.current = Some("10.0.0.12".parse().unwrap());
        let mut req = svc("x/req", "3", &[80]);
        req.requested = Some("10.0.0.11".parse().unwrap());
        let new = svc("x/new", "1", &[80]);
        let late = svc("x/late", "9", &[80]);
        let a = allocate(&pools, &[late, new, req, old]);
        assert_eq!(ip(&a.services["x/old"]), "10.0.0.12");
        assert_eq!(ip(&a.services["x/new"]), "10.0.0.10");
        assert_eq!(ip(&a.services["x/req"]), "10.0.0.11");
        assert_eq!(ip(&a.services["x/late"]), "PoolExhausted");
        assert_eq!(a.pools["a"].assigned, 3);
        assert_eq!(a.pools["a"].available, 0);
    }

    #[test]
    fn requested_outside_every_pool_and_in_use_are_refused() {
        let pools = [pool("a", "1", &["10.0.0.10/32"])];
        let mut out = svc("x/out", "1", &[80]);
        out.requested = Some("192.0.2.1".parse().unwrap());
        let first = svc("x/first", "2", &[80]);
        let mut clash = svc("x/clash", "3", &[80]);
        clash.requested = Some("10.0.0.10".parse().unwrap());
        let a = allocate(&pools, &[out, first, clash]);
        assert_eq!(ip(&a.services["x/out"]), "AddressNotInPool");
        assert_eq!(ip(&a.services["x/first"]), "10.0.0.10");
        assert_eq!(ip(&a.services["x/clash"]), "AddressInUse");
    }

    #[test]
    fn sharing_needs_the_same_key_and_different_ports() {
        let pools = [pool("a", "1", &["10.0.0.10-10.0.0.11"])];
        let mut s1 = svc("x/web", "1", &[80]);
        s1.sharing = Some("k".into());
        let mut s2 = svc("x/dns", "2", &[53]);
        s2.sharing = Some("k".into());
        let mut s3 = svc("x/web2", "3", &[80]);
        s3.sharing = Some("k".into());
        s3.requested = Some("10.0.0.10".parse().unwrap());
        let a = allocate(&pools, &[s1, s2, s3]);
        assert_eq!(ip(&a.services["x/web"]), "10.0.0.10");
        assert_eq!(ip(&a.services["x/dns"]), "10.0.0.10");
        assert_eq!(ip(&a.services["x/web2"]), "PortClash");
    }

    #[test]
    fn the_younger_of_two_overlapping_pools_is_not_used() {
        let pools = [pool("new", "5", &["10.0.0.0/30"]), pool("old", "1", &["10.0.0.2-10.0.0.9"]), pool("bad", "1", &["10.0.0.300/32"])];
        let a = allocate(&pools, &[svc("x/s", "1", &[80])]);
        assert_eq!(a.pools["new"].problem.as_ref().unwrap().0, Reason::Overlap);
        assert!(a.pools["old"].problem.is_none());
        assert_eq!(a.pools["bad"].problem.as_ref().unwrap().0, Reason::InvalidAddresses);
        assert_eq!(ip(&a.services["x/s"]), "10.0.0.2");
    }

    #[test]
    fn namespaces_labels_families_and_named_pools() {
        let mut p4 = pool("p4", "1", &["10.0.0.10/32"]);
        p4.namespaces = vec!["prod".into()];
        let mut p6 = pool("p6", "1", &["2001:db8::10/128"]);
        p6.auto_assign = false;
        let mut lab = pool("lab", "1", &["10.0.0.20/32"]);
        lab.service_labels.insert("tier".into(), "edge".into());
        let pools = [p4, p6, lab];
        let dev = svc("dev/s", "1", &[80]);
        let prod = svc("prod/s", "1", &[80]);
        let mut v6 = svc("dev/v6", "1", &[80]);
        v6.family = Some(Family::V6);
        v6.pool = Some("p6".into());
        let mut edge = svc("dev/edge", "1", &[80]);
        edge.labels.insert("tier".into(), "edge".into());
        let mut missing = svc("dev/missing", "1", &[80]);
        missing.pool = Some("nope".into());
        let a = allocate(&pools, &[dev, prod, v6, edge, missing]);
        assert_eq!(ip(&a.services["dev/s"]), "NoPool");
        assert_eq!(ip(&a.services["prod/s"]), "10.0.0.10");
        assert_eq!(ip(&a.services["dev/v6"]), "2001:db8::10");
        assert_eq!(ip(&a.services["dev/edge"]), "10.0.0.20");
        assert_eq!(ip(&a.services["dev/missing"]), "NoSuchPool");
    }

    proptest::proptest! {
        /// Whatever the order and the current addresses: no address is given twice without a
        /// sharing key, every address is in a pool, and allocating again from the result
        /// changes nothing (a restarted controller keeps every address).
        #[test]
        fn allocation_is_consistent_and_stable(n in 1usize..40, cur in proptest::collection::vec(0u8..24, 40), order in proptest::collection::vec(0u32..1000, 40)) {
            let pools = [pool("a", "1", &["10.0.0.0/28"]), pool("b", "2", &["10.0.1.0-10.0.1.3"])];
            let mut svcs: Vec<SvcIn> = (0..n).map(|i| {
                let mut s = svc(&format!("x/s{i}"), &format!("{:04}", order[i]), &[80]);
                if cur[i] < 20 { s.current = Some(IpAddr::V4(Ipv4Addr::new(10, 0, cur[i] / 16, cur[i] % 16))); }
                s
            }).collect();
            let a = allocate(&pools, &svcs);
            let mut seen = BTreeSet::new();
            for o in a.services.values() {
                if let Outcome::Assigned { ip, .. } = o {
                    proptest::prop_assert!(seen.insert(*ip), "{ip} twice");
                    proptest::prop_assert!(parse_range("10.0.0.0/28").unwrap().contains(ip) || parse_range("10.0.1.0-10.0.1.3").unwrap().contains(ip));
                }
            }
            proptest::prop_assert_eq!(seen.len(), n.min(14 + 4));
            for s in svcs.iter_mut() {
                s.current = match &a.services[&s.key] { Outcome::Assigned { ip, .. } => Some(*ip), _ => None };
            }
            let b = allocate(&pools, &svcs);
            for (k, o) in &a.services {
                if let Outcome::Assigned { .. } = o { proptest::prop_assert_eq!(o, &b.services[k]); }
            }
        }
    }
}
