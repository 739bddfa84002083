//! Network policy in the data plane: what a pod may send and receive, decided once per flow.
//!
//! The controller (`vectorlb kube`) evaluates label selectors; the data plane sees only what
//! they compile to:
//!
//! - **Identities**: a small number for each distinct set of labels a policy could select on
//!   (a pod's labels, its namespace's, and which of the policies' CIDRs hold its address), and
//!   one for each CIDR a policy names. A peer's address maps to its identity by one exact
//!   lookup (pods) or a longest-prefix match (everything else, [`WORLD`] when nothing holds it).
//! - **Endpoints**: the node's own pods, each with a table per direction (ingress, egress) that
//!   gives, for a peer identity, a protocol and a port, allow or deny and the policy that
//!   decided. The tiers of the admin policies (AdminNetworkPolicy first, in priority order:
//!   Allow, Deny or Pass; then NetworkPolicy: allow what a rule names once the pod is
//!   isolated; then BaselineAdminNetworkPolicy) are folded into the table when it is built, so
//!   a decision costs at most four hash probes and a binary search over the port spans of one
//!   key, whatever the number of policies.
//! - **Flows**: a routed flow is remembered ([`Flows`], shared by the workers: the two
//!   directions of a flow between nodes arrive on different cores), allowed by policy or open
//!   (neither end under policy), so its later packets and its replies are one lookup; a
//!   service's flow is decided when its session is created and the session is the memory. A
//!   flow allowed at its start is not cut when a policy changes (docs/network-policy.md says
//!   where the bounded table makes an exception).

use crate::addr::{key, key4, key6};
use crate::hash::FxHashMap;
use crate::hash::{fold_mul, PreHashed};
use crate::verdict::DropReason;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vectorlb_packet::{parse_frame, proto, Family, Frag};

/// A peer's identity: a number the controller gives each set of labels (and CIDRs).
pub type Identity = u32;
/// The identity of an address no identity or prefix holds.
pub const WORLD: Identity = 0;
/// The key of a table's entries that hold for every peer the table names no entry of.
const ANY_PEER: u64 = u32::MAX as u64 + 1;
/// The protocol key of the spans for a protocol no rule names (ICMP, for instance).
const ANY_PROTO: u64 = 0;
/// No policy decided: an endpoint's direction no policy isolates, or the default after the tiers.
pub const NO_POLICY: u32 = u32::MAX;
/// At most this many identities, prefixes, endpoints, rules or port ranges in one set.
pub const MAX_ITEMS: usize = 1 << 20;

/// What a rule does with what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    Deny,
    /// AdminNetworkPolicy's Pass: skip the admin tier; NetworkPolicy and the baseline decide.
    Pass,
}

/// Ports of one protocol, `lo..=hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ports {
    pub proto: u8,
    pub lo: u16,
    pub hi: u16,
}

/// One rule of one direction: the peers it matches (None: every peer, addresses outside the
/// cluster included), the ports (empty: every protocol and port), what it does and the policy
/// it comes from (an index into [`PolicySpec::policies`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub peers: Option<Vec<Identity>>,
    pub ports: Vec<Ports>,
    pub action: Action,
    pub policy: u32,
}

/// One direction of one endpoint, by tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DirectionSpec {
    /// AdminNetworkPolicy rules, highest priority first: the first that matches decides (a
    /// Pass hands over to the next tiers).
    pub admin: Vec<Rule>,
    /// The first NetworkPolicy that isolates the endpoint in this direction (None: not
    /// isolated): what no rule of `allow` matches is denied, and counted against it.
    pub isolated_by: Option<u32>,
    /// NetworkPolicy rules (their action is Allow).
    pub allow: Vec<Rule>,
    /// BaselineAdminNetworkPolicy rules in order: the first that matches decides, for an
    /// endpoint no NetworkPolicy isolates.
    pub baseline: Vec<Rule>,
}

impl DirectionSpec {
    /// Whether any policy has a say in this direction.
    pub fn enforced(&self) -> bool {
        !self.admin.is_empty() || self.isolated_by.is_some() || !self.baseline.is_empty()
    }
}

/// A pod of this node with its addresses and its two directions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointSpec {
    /// `namespace/name`, for counters and the log.
    pub name: String,
    pub addrs: Vec<IpAddr>,
    pub ingress: DirectionSpec,
    pub egress: DirectionSpec,
}

/// Everything the data plane needs to decide.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySpec {
    /// Names of the policies rules come from (`kind/namespace/name`), indexed by `Rule::policy`.
    pub policies: Vec<String>,
    /// Addresses with their identity (the cluster's pods, on every node).
    pub identities: Vec<(IpAddr, Identity)>,
    /// Prefixes with their identity, for addresses `identities` does not hold.
    pub prefixes: Vec<(IpAddr, u8, Identity)>,
    pub endpoints: Vec<EndpointSpec>,
}

/// Why a policy set was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{0}")]
    Invalid(String),
}

fn invalid<T>(s: impl Into<String>) -> Result<T, PolicyError> {
    Err(PolicyError::Invalid(s.into()))
}

/// A run of ports with one decision: ports from the previous span's `hi + 1` to `hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Span {
    hi: u16,
    allow: bool,
    policy: u32,
}

/// A decision for one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub allow: bool,
    /// The policy that decided, or [`NO_POLICY`].
    pub policy: u32,
}

/// One direction of one endpoint, compiled.
#[derive(Debug, Clone, Default)]
pub struct Table {
    spans: FxHashMap<u64, Arc<[Span]>>,
}

fn table_key(peer: u64, proto: u64) -> u64 {
    (peer << 8) | proto
}

impl Table {
    /// The decision for a peer, a protocol and a port (0 for protocols without ports).
    #[inline]
    pub fn lookup(&self, peer: Identity, proto: u8, port: u16) -> Hit {
        let p = peer as u64;
        let spans = self
            .spans
            .get(&table_key(p, proto as u64))
            .or_else(|| self.spans.get(&table_key(p, ANY_PROTO)))
            .or_else(|| self.spans.get(&table_key(ANY_PEER, proto as u64)))
            .or_else(|| self.spans.get(&table_key(ANY_PEER, ANY_PROTO)))
            .expect("every table has its (any peer, any protocol) spans");
        // The spans cover 0..=65535 in order: the first whose end is at or past the port.
        let s = spans[spans.partition_point(|s| s.hi < port)];
        Hit { allow: s.allow, policy: s.policy }
    }

    /// How many (peer, protocol) keys the table holds: its size, for the status.
    pub fn keys(&self) -> usize {
        self.spans.len()
    }

    /// Compiles a direction (None when no policy has a say in it). Each (peer, protocol) key
    /// is decided over the rules that can match it only (those naming the peer and those for
    /// every peer, in their order), so N rules for N peers cost O(N), not O(N^2).
    pub fn compile(d: &DirectionSpec) -> Option<Table> {
        if !d.enforced() {
            return None;
        }
        let tiers: [&[Rule]; 3] = [&d.admin, &d.allow, &d.baseline];
        // Per tier: the rules for every peer, and those naming each peer (indices, in order).
        let mut wild: [Vec<u32>; 3] = Default::default();
        let mut by_peer: FxHashMap<Identity, [Vec<u32>; 3]> = FxHashMap::default();
        for (t, rules) in tiers.iter().enumerate() {
            for (i, r) in rules.iter().enumerate() {
                match &r.peers {
                    None => wild[t].push(i as u32),
                    Some(ps) => {
                        for &id in ps {
                            let v = &mut by_peer.entry(id).or_default()[t];
                            if v.last() != Some(&(i as u32)) {
                                v.push(i as u32);
                            }
                        }
                    }
                }
            }
        }
        let select = |named: Option<&[Vec<u32>; 3]>| -> [Vec<&Rule>; 3] {
            std::array::from_fn(|t| {
                let (w, n) = (&wild[t], named.map_or(&[][..], |x| &x[t][..]));
                let (mut a, mut b, mut out) = (0, 0, Vec::with_capacity(w.len() + n.len()));
                while a < w.len() || b < n.len() {
                    let i = if b == n.len() || (a < w.len() && w[a] < n[b]) {
                        a += 1;
                        w[a - 1]
                    } else {
                        b += 1;
                        n[b - 1]
                    };
                    out.push(&tiers[t][i as usize]);
                }
                out
            })
        };
        let protos_of = |sel: &[Vec<&Rule>; 3]| {
            let mut v: Vec<u64> = sel.iter().flatten().flat_map(|r| r.ports.iter().map(|p| p.proto as u64)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let mut spans = FxHashMap::default();
        // Tables repeat themselves (every peer of a rule gets the same spans): one copy each.
        let mut seen: HashMap<Vec<Span>, Arc<[Span]>> = HashMap::new();
        let mut put = |k: u64, v: Vec<Span>| {
            let b = seen.entry(v).or_insert_with_key(|v| Arc::from(v.as_slice())).clone();
            spans.insert(k, b);
        };
        let any = select(None);
        put(table_key(ANY_PEER, ANY_PROTO), decide_spans(d.isolated_by, &any, None));
        for p in protos_of(&any) {
            put(table_key(ANY_PEER, p), decide_spans(d.isolated_by, &any, Some(p as u8)));
        }
        let mut peers: Vec<_> = by_peer.iter().collect();
        peers.sort_unstable_by_key(|(id, _)| **id);
        for (&id, named) in peers {
            let sel = select(Some(named));
            put(table_key(id as u64, ANY_PROTO), decide_spans(d.isolated_by, &sel, None));
            for p in protos_of(&sel) {
                put(table_key(id as u64, p), decide_spans(d.isolated_by, &sel, Some(p as u8)));
            }
        }
        Some(Table { spans })
    }
}

/// Port ranges of a rule that matches the peer, for a protocol (None: one no rule names).
fn ranges(r: &Rule, proto: Option<u8>, out: &mut Vec<(u32, u32)>) {
    out.clear();
    if r.ports.is_empty() {
        out.push((0, 65535));
        return;
    }
    if let Some(p) = proto {
        out.extend(r.ports.iter().filter(|x| x.proto == p).map(|x| (x.lo as u32, x.hi as u32)));
    }
}

/// Marks runs of elementary intervals once each: `take` yields the indices in a range not
/// taken before (a union-find of the next untaken index), so painting R ranges over E
/// intervals costs O((R + E) α) however the ranges overlap.
struct Painter {
    next: Vec<u32>,
}

impl Painter {
    fn new(n: usize) -> Painter {
        Painter { next: (0..=n as u32).collect() }
    }

    fn find(&mut self, mut i: u32) -> u32 {
        let mut root = i;
        while self.next[root as usize] != root {
            root = self.next[root as usize];
        }
        while self.next[i as usize] != root {
            let n = self.next[i as usize];
            self.next[i as usize] = root;
            i = n;
        }
        root
    }

    fn take(&mut self, lo: u32, hi: u32, mut f: impl FnMut(usize)) {
        let mut i = self.find(lo);
        while i <= hi {
            f(i as usize);
            self.next[i as usize] = i + 1;
            i = self.find(i + 1);
        }
    }
}

/// The spans of one (peer, protocol) key: the tiers (`sel`: admin, NetworkPolicy, baseline;
/// only rules that match the peer, in order) evaluated on each elementary interval of the
/// ports they name.
fn decide_spans(isolated_by: Option<u32>, sel: &[Vec<&Rule>; 3], proto: Option<u8>) -> Vec<Span> {
    let [admin_rules, allow_rules, baseline_rules] = sel;
    let mut buf = Vec::new();
    let mut bounds: Vec<u32> = vec![0, 65536];
    for r in sel.iter().flatten() {
        ranges(r, proto, &mut buf);
        for &(lo, hi) in &buf {
            bounds.push(lo);
            bounds.push(hi + 1);
        }
    }
    bounds.sort_unstable();
    bounds.dedup();
    let n = bounds.len() - 1;
    // Elementary interval i is bounds[i]..bounds[i + 1].
    let idx = |port: u32| bounds.partition_point(|&b| b <= port) - 1;
    let mut verdict: Vec<Option<(bool, u32)>> = vec![None; n];
    // Tier 1: the admin policies, first match (a Pass leaves the interval to the next tiers).
    let mut admin = Painter::new(n);
    for r in admin_rules {
        ranges(r, proto, &mut buf);
        for &(lo, hi) in &buf {
            admin.take(idx(lo) as u32, idx(hi) as u32, |i| {
                if r.action != Action::Pass {
                    verdict[i] = Some((r.action == Action::Allow, r.policy));
                }
            });
        }
    }
    if let Some(by) = isolated_by {
        // Tier 2: an isolated endpoint takes what a NetworkPolicy rule allows, nothing else.
        let mut np = Painter::new(n);
        for r in allow_rules {
            ranges(r, proto, &mut buf);
            for &(lo, hi) in &buf {
                np.take(idx(lo) as u32, idx(hi) as u32, |i| {
                    verdict[i].get_or_insert((true, r.policy));
                });
            }
        }
        for v in &mut verdict {
            v.get_or_insert((false, by));
        }
    } else {
        // Tier 3: the baseline, first match; then allowed.
        let mut base = Painter::new(n);
        for r in baseline_rules {
            ranges(r, proto, &mut buf);
            for &(lo, hi) in &buf {
                base.take(idx(lo) as u32, idx(hi) as u32, |i| {
                    verdict[i].get_or_insert((r.action == Action::Allow, r.policy));
                });
            }
        }
    }
    let mut out: Vec<Span> = Vec::new();
    for (i, v) in verdict.into_iter().enumerate() {
        let (allow, policy) = v.unwrap_or((true, NO_POLICY));
        let hi = (bounds[i + 1] - 1) as u16;
        match out.last_mut() {
            Some(l) if l.allow == allow && l.policy == policy => l.hi = hi,
            _ => out.push(Span { hi, allow, policy }),
        }
    }
    out
}

/// A node's pod, compiled.
#[derive(Debug)]
pub struct Endpoint {
    pub name: Arc<str>,
    /// Shared by the endpoints whose direction has the same rules (pods selected by the same
    /// policies): compiled once.
    pub ingress: Option<Arc<Table>>,
    pub egress: Option<Arc<Table>>,
    /// Flows denied coming in and going out (kept across policy sets).
    pub denied: Arc<[AtomicU64; 2]>,
}

/// Counters that outlive a policy set: per policy name and per endpoint name.
#[derive(Debug, Default)]
pub struct Counters {
    policies: Mutex<HashMap<Arc<str>, Arc<AtomicU64>>>,
    endpoints: Mutex<HashMap<Arc<str>, Arc<[AtomicU64; 2]>>>,
    /// The denied-flow log.
    pub log: Arc<DeniedLog>,
}

impl Counters {
    /// Denied flows by policy name, then by endpoint (in, out), in name order.
    pub fn snapshot(&self) -> Denied {
        let mut p: Vec<_> = self.policies.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.to_string(), v.load(Ordering::Relaxed))).collect();
        let mut e: Vec<_> =
            self.endpoints.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.to_string(), v[0].load(Ordering::Relaxed), v[1].load(Ordering::Relaxed))).collect();
        p.sort();
        e.sort();
        Denied { policies: p, endpoints: e }
    }
}

/// Denied flows: by policy name, and by endpoint name (coming in, going out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Denied {
    pub policies: Vec<(String, u64)>,
    pub endpoints: Vec<(String, u64, u64)>,
}

/// A compiled policy set: what the workers read per flow.
#[derive(Debug, Default)]
pub struct PolicySet {
    pub generation: u64,
    /// Whether any endpoint has a direction under policy (when not, packets pay nothing).
    pub active: bool,
    /// How many endpoints have a direction under policy.
    enforced: usize,
    exact: FxHashMap<u128, Identity>,
    /// Prefix lengths (as bits of the 128-bit key) longest first, each with its prefixes.
    prefixes: Vec<(u32, FxHashMap<u128, Identity>)>,
    endpoints: FxHashMap<u128, Arc<Endpoint>>,
    /// Denied-flow counters of the policies, indexed by `Rule::policy`.
    policy_denied: Vec<Arc<AtomicU64>>,
    pub names: Vec<Arc<str>>,
    /// Where denied flows are logged (the [`Counters`]' log).
    log: Option<Arc<DeniedLog>>,
}

fn mask(bits: u32) -> u128 {
    if bits == 0 {
        0
    } else {
        u128::MAX << (128 - bits)
    }
}

/// Which direction of an endpoint a decision was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

/// A flow's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Neither end is an endpoint any policy has a say in: nothing to remember.
    Open,
    /// Allowed by the policies: remember the flow.
    Allowed,
    Denied {
        dir: Direction,
        policy: u32,
    },
}

impl PolicySet {
    /// Compiles a spec, checking it; `counters` keeps the counts of names seen before.
    pub fn build<'a>(spec: &'a PolicySpec, counters: &Counters, generation: u64) -> Result<PolicySet, PolicyError> {
        if spec.policies.len() > MAX_ITEMS || spec.identities.len() > MAX_ITEMS || spec.prefixes.len() > MAX_ITEMS || spec.endpoints.len() > MAX_ITEMS {
            return invalid(format!("a policy set holds at most {MAX_ITEMS} policies, identities, prefixes and endpoints each"));
        }
        let npol = spec.policies.len() as u32;
        let mut exact = FxHashMap::default();
        for (ip, id) in &spec.identities {
            if exact.insert(key(*ip), *id).is_some_and(|old| old != *id) {
                return invalid(format!("address {ip} has two identities"));
            }
        }
        let mut by_len: FxHashMap<u32, FxHashMap<u128, Identity>> = FxHashMap::default();
        for &(ip, len, id) in &spec.prefixes {
            let (max, bits) = match ip {
                IpAddr::V4(_) => (32, 96 + len as u32),
                IpAddr::V6(_) => (128, len as u32),
            };
            if len > max {
                return invalid(format!("prefix {ip}/{len}: the length is at most {max}"));
            }
            let k = key(ip);
            if k & !mask(bits) != 0 {
                return invalid(format!("prefix {ip}/{len} has host bits set"));
            }
            if by_len.entry(bits).or_default().insert(k, id).is_some_and(|old| old != id) {
                return invalid(format!("prefix {ip}/{len} has two identities"));
            }
        }
        let mut prefixes: Vec<_> = by_len.into_iter().collect();
        prefixes.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
        let mut names = Vec::with_capacity(spec.policies.len());
        let mut policy_denied = Vec::with_capacity(spec.policies.len());
        {
            let mut reg = counters.policies.lock().unwrap_or_else(|e| e.into_inner());
            for n in &spec.policies {
                let name: Arc<str> = Arc::from(n.as_str());
                policy_denied.push(reg.entry(name.clone()).or_default().clone());
                names.push(name);
            }
            let keep: std::collections::HashSet<&str> = spec.policies.iter().map(String::as_str).collect();
            reg.retain(|k, _| keep.contains(&**k));
        }
        let mut endpoints = FxHashMap::default();
        let mut compiled: HashMap<&DirectionSpec, Option<Arc<Table>>> = HashMap::new();
        let mut reg = counters.endpoints.lock().unwrap_or_else(|e| e.into_inner());
        let mut items = 0usize;
        for e in &spec.endpoints {
            for d in [&e.ingress, &e.egress] {
                if d.isolated_by.is_some_and(|p| p >= npol) {
                    return invalid(format!("endpoint {}: isolated by policy {} of {npol}", e.name, d.isolated_by.unwrap_or(0)));
                }
                for r in d.admin.iter().chain(&d.allow).chain(&d.baseline) {
                    if r.policy >= npol {
                        return invalid(format!("endpoint {}: a rule of policy {} of {npol}", e.name, r.policy));
                    }
                    items += 1 + r.ports.len() + r.peers.as_ref().map_or(0, Vec::len);
                    if items > MAX_ITEMS {
                        return invalid(format!("the endpoints' rules, peers and ports add up to more than {MAX_ITEMS}"));
                    }
                    for p in &r.ports {
                        if p.lo > p.hi {
                            return invalid(format!("endpoint {}: port range {}-{} ends before it starts", e.name, p.lo, p.hi));
                        }
                        if p.proto == 0 {
                            return invalid(format!("endpoint {}: a port range without a protocol", e.name));
                        }
                    }
                }
                if d.allow.iter().any(|r| r.action != Action::Allow) || d.baseline.iter().any(|r| r.action == Action::Pass) {
                    return invalid(format!("endpoint {}: NetworkPolicy rules only allow, baseline rules allow or deny", e.name));
                }
            }
            let name: Arc<str> = Arc::from(e.name.as_str());
            let denied = reg.entry(name.clone()).or_default().clone();
            let mut table = |d: &'a DirectionSpec| compiled.entry(d).or_insert_with(|| Table::compile(d).map(Arc::new)).clone();
            let ep = Arc::new(Endpoint { name, ingress: table(&e.ingress), egress: table(&e.egress), denied });
            for a in &e.addrs {
                if endpoints.insert(key(*a), ep.clone()).is_some() {
                    return invalid(format!("address {a} belongs to two endpoints"));
                }
            }
        }
        let keep: std::collections::HashSet<&str> = spec.endpoints.iter().map(|e| e.name.as_str()).collect();
        reg.retain(|k, _| keep.contains(&**k));
        let enforced = spec.endpoints.iter().filter(|e| e.ingress.enforced() || e.egress.enforced()).count();
        Ok(PolicySet { generation, active: enforced > 0, enforced, exact, prefixes, endpoints, policy_denied, names, log: Some(counters.log.clone()) })
    }

    /// How many endpoints have a direction under policy.
    pub fn enforced(&self) -> usize {
        self.enforced
    }

    /// The identity of an address.
    #[inline]
    pub fn identify(&self, a: u128) -> Identity {
        if let Some(&id) = self.exact.get(&a) {
            return id;
        }
        for (bits, m) in &self.prefixes {
            if let Some(&id) = m.get(&(a & mask(*bits))) {
                return id;
            }
        }
        WORLD
    }

    pub fn endpoint(&self, a: u128) -> Option<&Arc<Endpoint>> {
        self.endpoints.get(&a)
    }

    /// Decides a new flow from `src` to `dst` to `port` of `proto` (0 for protocols without
    /// ports): the source's egress, then the destination's ingress, each when it is an
    /// endpoint of this node with policies.
    #[inline]
    pub fn decide(&self, src: u128, dst: u128, proto: u8, port: u16) -> Decision {
        self.decide_as(src, src, dst, proto, port)
    }

    /// As [`PolicySet::decide`] for a flow whose source is translated on the way (a service
    /// that masquerades its client): the egress is the client's, `seen` is the source the
    /// destination's ingress sees.
    #[inline]
    pub fn decide_as(&self, src: u128, seen: u128, dst: u128, proto: u8, port: u16) -> Decision {
        let se = self.endpoints.get(&src).and_then(|e| e.egress.as_ref());
        let de = self.endpoints.get(&dst).and_then(|e| e.ingress.as_ref());
        if se.is_none() && de.is_none() {
            return Decision::Open;
        }
        if let Some(t) = se {
            let h = t.lookup(self.identify(dst), proto, port);
            if !h.allow {
                return Decision::Denied { dir: Direction::Egress, policy: h.policy };
            }
        }
        if let Some(t) = de {
            let h = t.lookup(self.identify(seen), proto, port);
            if !h.allow {
                return Decision::Denied { dir: Direction::Ingress, policy: h.policy };
            }
        }
        Decision::Allowed
    }

    /// Whether either address is an endpoint with a direction under policy (a flow between
    /// them is decided and remembered).
    #[inline]
    pub fn enforces(&self, src: u128, dst: u128) -> bool {
        self.is_enforced(src) || self.is_enforced(dst)
    }

    /// Whether `a` is an endpoint with a direction under policy.
    #[inline]
    pub fn is_enforced(&self, a: u128) -> bool {
        self.endpoints.get(&a).is_some_and(|e| e.egress.is_some() || e.ingress.is_some())
    }

    /// Counts a denied flow against its endpoint and its policy, and logs it (rate-limited;
    /// cold: once per denied packet).
    #[cold]
    pub fn count_denied(&self, d: Denial) {
        let (a, i) = match d.dir {
            Direction::Ingress => (d.dst, 0),
            Direction::Egress => (d.src, 1),
        };
        let ep = self.endpoints.get(&a);
        if let Some(e) = ep {
            e.denied[i].fetch_add(1, Ordering::Relaxed);
        }
        if let Some(c) = self.policy_denied.get(d.policy as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(log) = &self.log {
            let addr = |k: u128| std::net::Ipv6Addr::from(k).to_canonical();
            log.record(DeniedFlow {
                seq: 0,
                unix_ms: 0,
                src: addr(d.src),
                dst: addr(d.dst),
                proto: d.proto,
                port: d.port,
                direction: if d.dir == Direction::Ingress { "ingress" } else { "egress" },
                endpoint: ep.map(|e| e.name.clone()),
                policy: self.names.get(d.policy as usize).cloned(),
            });
        }
    }
}

/// A denied flow, as the decision saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    pub src: u128,
    pub dst: u128,
    pub proto: u8,
    pub port: u16,
    pub dir: Direction,
    pub policy: u32,
}

/// One entry of the denied-flow log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedFlow {
    /// Grows by one per entry logged (gaps: entries the rate limit left out).
    pub seq: u64,
    pub unix_ms: u64,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    /// The destination port (0: a protocol without ports).
    pub port: u16,
    pub direction: &'static str,
    /// The endpoint (`namespace/name`) whose direction denied it.
    pub endpoint: Option<Arc<str>>,
    /// The policy that decided (`Kind/namespace/name`).
    pub policy: Option<Arc<str>>,
}

/// The last [`LOG_ENTRIES`] denied flows, at most [`LOG_RATE`] a second (the rest counted as
/// suppressed): what an operator follows (`GET /v1/policy/denied?after=SEQ`).
#[derive(Debug, Default)]
pub struct DeniedLog {
    inner: Mutex<LogInner>,
}

#[derive(Debug, Default)]
struct LogInner {
    entries: std::collections::VecDeque<DeniedFlow>,
    next: u64,
    /// The second the rate counts, and how many were logged in it.
    second: u64,
    in_second: u32,
    suppressed: u64,
}

/// Entries kept.
pub const LOG_ENTRIES: usize = 1024;
/// Entries logged per second at most.
pub const LOG_RATE: u32 = 100;

impl DeniedLog {
    fn record(&self, mut f: DeniedFlow) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut l = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if now / 1000 != l.second {
            l.second = now / 1000;
            l.in_second = 0;
        }
        if l.in_second >= LOG_RATE {
            l.suppressed += 1;
            return;
        }
        l.in_second += 1;
        l.next += 1;
        f.seq = l.next;
        f.unix_ms = now;
        if l.entries.len() == LOG_ENTRIES {
            l.entries.pop_front();
        }
        l.entries.push_back(f);
    }

    /// Entries after `after` (0: all kept), oldest first, and how many the rate limit left out
    /// since the start.
    pub fn since(&self, after: u64) -> (Vec<DeniedFlow>, u64) {
        let l = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (l.entries.iter().filter(|e| e.seq > after).cloned().collect(), l.suppressed)
    }
}

/// A flow as both directions name it: the lower (address, port) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    a: u128,
    b: u128,
    ap: u16,
    bp: u16,
    proto: u8,
}

impl FlowKey {
    pub fn new(proto: u8, src: u128, sport: u16, dst: u128, dport: u16) -> FlowKey {
        if (src, sport) <= (dst, dport) {
            FlowKey { a: src, b: dst, ap: sport, bp: dport, proto }
        } else {
            FlowKey { a: dst, b: src, ap: dport, bp: sport, proto }
        }
    }
}

/// Idle timeouts of remembered flows, in milliseconds.
pub const TCP_IDLE_MS: u32 = 3_600_000;
pub const UDP_IDLE_MS: u32 = 180_000;
pub const OTHER_IDLE_MS: u32 = 60_000;
const SHARDS: usize = 64;
/// How many flows [`crate::service::Control`] remembers for policy.
pub const FLOWS: usize = 1 << 18;

fn idle(proto: u8) -> u32 {
    match proto {
        proto::TCP => TCP_IDLE_MS,
        proto::UDP => UDP_IDLE_MS,
        _ => OTHER_IDLE_MS,
    }
}

/// Flows allowed by policy, shared by the workers (in shards, each behind its own lock). Keyed
/// by a keyed hash (the keys are packet contents: the session table's folded multiply with
/// seeds of the kernel's random source), computed once per packet: it picks the shard and is
/// the shard map's hash. Bounded: when a shard is full, its expired flows go; if none has, the
/// new flow is refused (a counted drop, `policy_flows_full`).
#[derive(Debug)]
pub struct Flows {
    shards: Box<[Mutex<Shard>]>,
    seeds: [u64; 4],
    per_shard: usize,
    /// Bumped when flows are forgotten other than by expiring (`clear`): the workers' caches
    /// of flows seen lately ([`FlowCache`]) hold nothing from before.
    epoch: AtomicU64,
}

/// One shard of [`Flows`]: flows with the time they expire.
type Shard = HashMap<Hashed, u32, BuildHasherDefault<PreHashed>>;

/// A flow with its keyed hash: hashed as the hash alone, equal when the flows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hashed {
    h: u64,
    k: FlowKey,
}

impl std::hash::Hash for Hashed {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.h);
    }
}

impl Flows {
    pub fn new(capacity: usize) -> Flows {
        let per_shard = capacity.div_ceil(SHARDS).max(16);
        let seeds = [0u64; 4].map(|_| crate::hash::random_seed() | 1);
        Flows { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::default())).collect(), seeds, per_shard, epoch: AtomicU64::new(1) }
    }

    #[inline]
    fn hashed(&self, k: &FlowKey) -> Hashed {
        let s = &self.seeds;
        let a = fold_mul(k.a as u64 ^ s[0], (k.a >> 64) as u64 ^ s[1]);
        let b = fold_mul(k.b as u64 ^ s[2], (k.b >> 64) as u64 ^ s[3]);
        let p = ((k.ap as u64) << 24 | (k.bp as u64) << 8 | k.proto as u64) ^ s[1];
        let h = fold_mul(a ^ b.rotate_left(29) ^ s[2], p | 1 << 63);
        Hashed { h: fold_mul(h ^ s[0], 0x9e37_79b9_7f4a_7c15), k: *k }
    }

    /// The shard of a hash: bits the shard map uses for neither its bucket (the low ones) nor
    /// its tags (the top seven).
    fn shard(&self, h: &Hashed) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[(h.h >> 40) as usize % SHARDS].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the flow is remembered and live (and, if so, keeps it alive).
    pub fn hit(&self, k: &FlowKey, now: u32) -> bool {
        let h = self.hashed(k);
        let mut s = self.shard(&h);
        match s.get_mut(&h) {
            Some(exp) if (exp.wrapping_sub(now) as i32) > 0 => {
                *exp = now.wrapping_add(idle(k.proto));
                true
            }
            Some(_) => {
                s.remove(&h);
                false
            }
            None => false,
        }
    }

    /// Remembers an allowed flow; false when its shard is full of live flows.
    pub fn insert(&self, k: FlowKey, now: u32) -> bool {
        self.insert_below(k, now, self.per_shard)
    }

    /// Remembers a flow no policy decided (neither end under policy when it started), so a
    /// policy that later selects an end does not cut it; best effort: it takes at most three
    /// quarters of a shard, the rest is kept for flows policy allowed. False when not kept.
    pub fn remember(&self, k: FlowKey, now: u32) -> bool {
        self.insert_below(k, now, self.per_shard - self.per_shard / 4)
    }

    /// Inserts (or refreshes) a flow unless its shard holds `limit` live flows.
    fn insert_below(&self, k: FlowKey, now: u32, limit: usize) -> bool {
        let h = self.hashed(&k);
        let mut s = self.shard(&h);
        if s.len() >= limit && !s.contains_key(&h) {
            s.retain(|_, exp| (exp.wrapping_sub(now) as i32) > 0);
            if s.len() >= limit {
                return false;
            }
        }
        s.insert(h, now.wrapping_add(idle(k.proto)));
        true
    }

    /// Flows remembered (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every flow (a test's reset, or an operator's after tightening policy).
    pub fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
        for s in self.shards.iter() {
            s.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

/// A worker's memory of the flows it forwarded lately, in front of the policy set and the
/// shared [`Flows`]: a direct-mapped array by a keyed hash of the packet's own (directional)
/// addresses, ports and protocol, asked first. A hit costs one hash and one slot's compare:
/// no endpoint lookups, no lock. It holds flows remembered in the shared table, allowed or
/// open (whose entry a pass through it at least every [`CACHE_REFRESH_MS`] keeps alive: idle
/// timeouts are a minute and more), and open flows the shared table had no room for (valid
/// while the policy set's generation is the one they were decided under). A new policy set
/// or `Flows::clear` (its epoch) empties it. Denied flows are never cached: each of their
/// packets is decided and counted.
pub struct FlowCache {
    slots: Box<[CacheSlot]>,
    seeds: [u64; 2],
    /// The policy set's generation and the shared table's epoch the slots were filled under.
    generation: u64,
    epoch: u64,
    /// Slots whose stamp is not this are empty (it moves when the generation or epoch does).
    stamp: u32,
}

#[derive(Clone, Copy, Default)]
struct CacheSlot {
    src: u128,
    dst: u128,
    /// Source port above, destination port below.
    ports: u32,
    proto: u8,
    /// Whether the flow is remembered in the shared table (refreshed through it; the others,
    /// open flows the full table did not take, are valid for their policy set only).
    shared: bool,
    stamp: u32,
    at: u32,
}

/// Slots of a worker's [`FlowCache`] (a power of two; 48 bytes each).
pub const CACHE_SLOTS: usize = 1 << 14;
/// How long a cached flow under policy is trusted before the shared table is passed through
/// again.
pub const CACHE_REFRESH_MS: u32 = 1000;

impl Default for FlowCache {
    fn default() -> Self {
        // The slots are allocated on the first check (a worker on a node without policy
        // never makes one): epoch 0 is never the shared table's (it starts at 1 and only
        // grows), so that check forgets, which allocates.
        FlowCache { slots: Box::default(), seeds: [0u64; 2].map(|_| crate::hash::random_seed() | 1), generation: 0, epoch: 0, stamp: 1 }
    }
}

impl std::fmt::Debug for FlowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowCache").field("slots", &self.slots.len()).finish()
    }
}

impl FlowCache {
    /// Decides a flow's packet as [`check_parsed`] does without a cache, through this cache.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn check(&mut self, set: &PolicySet, flows: &Flows, proto: u8, src: u128, sport: u16, dst: u128, dport: u16, now: u32) -> Result<(), DropReason> {
        let epoch = flows.epoch.load(Ordering::Relaxed);
        if epoch != self.epoch || set.generation != self.generation {
            self.forget(set.generation, epoch);
        }
        let ports = (sport as u32) << 16 | dport as u32;
        let s = &self.seeds;
        let h = fold_mul(src as u64 ^ ((src >> 64) as u64).rotate_left(23) ^ s[0], dst as u64 ^ ((dst >> 64) as u64).rotate_left(41) ^ ((ports as u64) << 8 | proto as u64) ^ s[1]);
        let stamp = self.stamp;
        let i = h as usize & (CACHE_SLOTS - 1);
        let slot = &self.slots[i];
        if slot.stamp == stamp && slot.src == src && slot.dst == dst && slot.ports == ports && slot.proto == proto && (!slot.shared || now.wrapping_sub(slot.at) < CACHE_REFRESH_MS)
        {
            return Ok(());
        }
        self.miss(i, set, flows, proto, src, sport, dst, dport, now)
    }

    /// Decides a flow the cache does not answer for, and caches it unless it is denied.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn miss(&mut self, i: usize, set: &PolicySet, flows: &Flows, proto: u8, src: u128, sport: u16, dst: u128, dport: u16, now: u32) -> Result<(), DropReason> {
        let shared = if set.enforces(src, dst) {
            check_flow(set, flows, proto, src, sport, dst, dport, now)?;
            true
        } else {
            flows.remember(FlowKey::new(proto, src, sport, dst, dport), now)
        };
        let ports = (sport as u32) << 16 | dport as u32;
        self.slots[i] = CacheSlot { src, dst, ports, proto, shared, stamp: self.stamp, at: now };
        Ok(())
    }

    /// Empties the cache for a new policy set or shared-table epoch.
    #[cold]
    fn forget(&mut self, generation: u64, epoch: u64) {
        (self.generation, self.epoch) = (generation, epoch);
        self.stamp = self.stamp.wrapping_add(1);
        if self.slots.is_empty() {
            self.slots = vec![CacheSlot::default(); CACHE_SLOTS].into_boxed_slice();
        } else if self.stamp == 0 {
            // Every stamp was used: old slots could match again, so clear them.
            self.slots.fill(CacheSlot::default());
            self.stamp = 1;
        }
    }
}

/// A flow's addresses, protocol and ports as a routed packet names them (ICMP echo: the
/// identifier as both ports; other protocols and later fragments: 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flow {
    src: u128,
    dst: u128,
    proto: u8,
    sport: u16,
    dport: u16,
}

/// SCTP, whose ports sit where TCP's and UDP's do.
const SCTP: u8 = 132;

/// The flow of an IP packet at `l3` (its upper header at `l4`, its end at `end`), and for an
/// ICMP error the flow of the packet it quotes.
fn flow_of(d: &[u8], v6: bool, l3: usize, l4: usize, end: usize, p: u8, later_fragment: bool) -> Option<(Flow, Option<Flow>)> {
    let (src, dst) = addrs(d, v6, l3)?;
    let mut f = Flow { src, dst, proto: p, sport: 0, dport: 0 };
    if later_fragment {
        return Some((f, None));
    }
    let l4b = d.get(l4..end)?;
    match p {
        proto::TCP | proto::UDP | SCTP => {
            let b = l4b.get(..4)?;
            (f.sport, f.dport) = (u16::from_be_bytes([b[0], b[1]]), u16::from_be_bytes([b[2], b[3]]));
            Some((f, None))
        }
        proto::ICMP | proto::ICMPV6 if (p == proto::ICMPV6) == v6 => {
            let t = *l4b.first()?;
            let (echo, error) = if v6 { (t == 128 || t == 129, (1..=4).contains(&t)) } else { (t == 8 || t == 0, t == 3 || t == 11 || t == 12) };
            if echo {
                let id = u16::from_be_bytes(l4b.get(4..6)?.try_into().ok()?);
                (f.sport, f.dport) = (id, id);
                return Some((f, None));
            }
            if !error {
                return Some((f, None));
            }
            // The quoted packet: its own IP header, then at least its ports.
            let q = l4 + 8;
            let inner = if v6 {
                let ip = d.get(q..q + 40)?;
                (ip[0] >> 4 == 6).then_some(())?;
                flow_of(d, true, q, q + 40, end, ip[6], false)
            } else {
                let ip = d.get(q..q + 20)?;
                let ihl = (ip[0] & 0x0f) as usize * 4;
                (ip[0] >> 4 == 4 && ihl >= 20).then_some(())?;
                flow_of(d, false, q, q + ihl, end, ip[9], false)
            };
            Some((f, inner.map(|(i, _)| i)))
        }
        _ => Some((f, None)),
    }
}

/// The addresses and ports of a packet whose ports sit where TCP's do (None when it is cut
/// short: [`flow_of`] then says why).
#[inline]
fn ports_tuple(d: &[u8], v6: bool, l3: usize, l4: usize, end: usize) -> Option<(u128, u128, u16, u16)> {
    let p: [u8; 4] = d.get(l4..end)?.get(..4)?.try_into().ok()?;
    let (src, dst) = addrs(d, v6, l3)?;
    Some((src, dst, u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])))
}

/// The source and destination addresses of the IP header at `l3`.
#[inline(always)]
fn addrs(d: &[u8], v6: bool, l3: usize) -> Option<(u128, u128)> {
    if v6 {
        let a: &[u8; 32] = d.get(l3 + 8..l3 + 40)?.try_into().ok()?;
        Some((key6(a[..16].try_into().ok()?), key6(a[16..].try_into().ok()?)))
    } else {
        let a: [u8; 8] = d.get(l3 + 12..l3 + 20)?.try_into().ok()?;
        Some((key4(a[..4].try_into().ok()?), key4(a[4..].try_into().ok()?)))
    }
}

/// Decides a routed frame for the policies of `set`, remembering allowed flows in `flows`:
/// Ok to forward it, or why it is dropped. A flow neither end of which is under policy is
/// remembered as open (best effort), so a policy that later selects an end does not cut it;
/// one under policy is decided unless remembered. An ICMP error passes when it
/// quotes a remembered flow (its reply direction), otherwise it is decided as ICMP.
pub fn check_frame(set: &PolicySet, flows: &Flows, d: &[u8], now: u32) -> Result<(), DropReason> {
    let info = parse_frame(d).map_err(DropReason::from)?;
    check_parsed(set, flows, None, d, &info, now)
}

/// As [`check_frame`] for a frame parsed already (`info` is `parse_frame(d)`), through a
/// worker's cache of its recent flows if it has one (asked first: a packet of a cached flow
/// costs a hash and a compare; ICMP errors go past it).
pub fn check_parsed(set: &PolicySet, flows: &Flows, mut cache: Option<&mut FlowCache>, d: &[u8], info: &vectorlb_packet::FrameInfo, now: u32) -> Result<(), DropReason> {
    let Some(family) = info.family else {
        return Ok(());
    };
    let v6 = family == Family::V6;
    let later = matches!(info.frag, Frag::Later);
    // The common case first: a whole or first-fragment TCP, UDP or SCTP packet through the
    // cache, its addresses and ports read where they are.
    if let (Some(c), false, proto::TCP | proto::UDP | SCTP) = (cache.as_deref_mut(), later, info.proto) {
        if let Some((src, dst, sport, dport)) = ports_tuple(d, v6, info.l3, info.l4, info.end) {
            return c.check(set, flows, info.proto, src, sport, dst, dport, now);
        }
    }
    let Some((f, inner)) = flow_of(d, v6, info.l3, info.l4, info.end, info.proto, later) else {
        return Err(DropReason::Truncated);
    };
    if let (Some(c), None) = (cache, inner) {
        return c.check(set, flows, f.proto, f.src, f.sport, f.dst, f.dport, now);
    }
    if !set.enforces(f.src, f.dst) {
        if inner.is_none() {
            flows.remember(FlowKey::new(f.proto, f.src, f.sport, f.dst, f.dport), now);
        }
        return Ok(());
    }
    if let Some(i) = inner {
        if flows.hit(&FlowKey::new(i.proto, i.src, i.sport, i.dst, i.dport), now) {
            return Ok(());
        }
    }
    check_flow(set, flows, f.proto, f.src, f.sport, f.dst, f.dport, now)
}

/// Decides a flow's packet as [`check_frame`] does, for a path that has parsed it already (a
/// pod's traffic leaving through SNAT, and its replies: the SNAT session is the source's, not
/// the flow's, so the flow is remembered here too).
#[allow(clippy::too_many_arguments)]
pub fn check_flow(set: &PolicySet, flows: &Flows, proto: u8, src: u128, sport: u16, dst: u128, dport: u16, now: u32) -> Result<(), DropReason> {
    let k = FlowKey::new(proto, src, sport, dst, dport);
    if flows.hit(&k, now) {
        return Ok(());
    }
    let port = if matches!(proto, proto::TCP | proto::UDP | SCTP) { dport } else { 0 };
    match set.decide(src, dst, proto, port) {
        Decision::Denied { dir, policy } => {
            set.count_denied(Denial { src, dst, proto, port, dir, policy });
            Err(DropReason::PolicyDenied)
        }
        Decision::Allowed | Decision::Open => {
            if flows.insert(k, now) {
                Ok(())
            } else {
                Err(DropReason::PolicyFlowsFull)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn tcp(lo: u16, hi: u16) -> Ports {
        Ports { proto: proto::TCP, lo, hi }
    }

    fn rule(peers: Option<Vec<Identity>>, ports: Vec<Ports>, action: Action, policy: u32) -> Rule {
        Rule { peers, ports, action, policy }
    }

    /// A naive evaluation of the tiers for one peer, protocol and port: what the compiled table
    /// must agree with.
    fn naive(d: &DirectionSpec, peer: Identity, proto: u8, port: u16) -> Hit {
        let m = |r: &Rule| r.peers.as_ref().is_none_or(|p| p.contains(&peer)) && (r.ports.is_empty() || r.ports.iter().any(|p| p.proto == proto && p.lo <= port && port <= p.hi));
        for r in &d.admin {
            if m(r) {
                match r.action {
                    Action::Allow => return Hit { allow: true, policy: r.policy },
                    Action::Deny => return Hit { allow: false, policy: r.policy },
                    Action::Pass => break,
                }
            }
        }
        if let Some(by) = d.isolated_by {
            return d.allow.iter().find(|r| m(r)).map_or(Hit { allow: false, policy: by }, |r| Hit { allow: true, policy: r.policy });
        }
        d.baseline.iter().find(|r| m(r)).map_or(Hit { allow: true, policy: NO_POLICY }, |r| Hit { allow: r.action == Action::Allow, policy: r.policy })
    }

    #[test]
    fn a_direction_without_policies_is_not_compiled() {
        assert!(Table::compile(&DirectionSpec::default()).is_none());
    }

    #[test]
    fn isolation_allows_what_rules_name_and_denies_the_rest() {
        let d = DirectionSpec {
            isolated_by: Some(0),
            allow: vec![rule(Some(vec![7]), vec![tcp(80, 80), tcp(8000, 8100)], Action::Allow, 1), rule(None, vec![Ports { proto: proto::UDP, lo: 53, hi: 53 }], Action::Allow, 2)],
            ..Default::default()
        };
        let t = Table::compile(&d).unwrap();
        assert_eq!(t.lookup(7, proto::TCP, 80), Hit { allow: true, policy: 1 });
        assert_eq!(t.lookup(7, proto::TCP, 8050), Hit { allow: true, policy: 1 });
        assert_eq!(t.lookup(7, proto::TCP, 8101), Hit { allow: false, policy: 0 });
        assert_eq!(t.lookup(8, proto::TCP, 80), Hit { allow: false, policy: 0 });
        assert_eq!(t.lookup(8, proto::UDP, 53), Hit { allow: true, policy: 2 });
        assert_eq!(t.lookup(7, proto::UDP, 53), Hit { allow: true, policy: 2 });
        assert_eq!(t.lookup(7, proto::ICMP, 0), Hit { allow: false, policy: 0 });
        assert_eq!(t.lookup(WORLD, proto::UDP, 54), Hit { allow: false, policy: 0 });
    }

    #[test]
    fn admin_tiers_fold_in_priority_order() {
        // ANP: deny 9 on 80 (prio 1), pass 7 everywhere (prio 2), allow everyone on 443;
        // NetworkPolicy does not isolate; the baseline denies 7.
        let d = DirectionSpec {
            admin: vec![rule(Some(vec![9]), vec![tcp(80, 80)], Action::Deny, 0), rule(Some(vec![7]), vec![], Action::Pass, 1), rule(None, vec![tcp(443, 443)], Action::Allow, 2)],
            baseline: vec![rule(Some(vec![7]), vec![], Action::Deny, 3)],
            ..Default::default()
        };
        let t = Table::compile(&d).unwrap();
        assert_eq!(t.lookup(9, proto::TCP, 80), Hit { allow: false, policy: 0 });
        assert_eq!(t.lookup(9, proto::TCP, 443), Hit { allow: true, policy: 2 });
        assert_eq!(t.lookup(7, proto::TCP, 443), Hit { allow: false, policy: 3 }, "a pass skips the allow below it");
        assert_eq!(t.lookup(1, proto::TCP, 22), Hit { allow: true, policy: NO_POLICY });
    }

    #[test]
    fn compiled_tables_agree_with_a_naive_evaluation() {
        // A small pseudo-random generator: the same cases every run.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..300 {
            let mut gen_rules = |n: u64, actions: &[Action]| -> Vec<Rule> {
                (0..next(n))
                    .map(|i| {
                        let peers = if next(3) == 0 { None } else { Some((0..1 + next(3)).map(|_| next(4) as u32).collect()) };
                        let ports = (0..next(3))
                            .map(|_| {
                                let lo = next(12) as u16 * 8;
                                Ports { proto: [proto::TCP, proto::UDP][next(2) as usize], lo, hi: lo + next(20) as u16 }
                            })
                            .collect();
                        rule(peers, ports, actions[next(actions.len() as u64) as usize], i as u32)
                    })
                    .collect()
            };
            let admin = gen_rules(4, &[Action::Allow, Action::Deny, Action::Pass]);
            let allow = gen_rules(4, &[Action::Allow]);
            let baseline = gen_rules(3, &[Action::Allow, Action::Deny]);
            let isolated_by = (next(2) == 0).then_some(99);
            let d = DirectionSpec { admin, isolated_by, allow, baseline };
            let Some(t) = Table::compile(&d) else {
                assert!(!d.enforced());
                continue;
            };
            for peer in 0..6 {
                for p in [proto::TCP, proto::UDP, proto::ICMP] {
                    for port in (0..130).chain([65535]) {
                        assert_eq!(t.lookup(peer, p, port), naive(&d, peer, p, port), "{d:?} peer {peer} proto {p} port {port}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_hundred_thousand_ports_compile_quickly() {
        let ports: Vec<Ports> = (0..100_000u32).map(|i| tcp((i % 65536) as u16, (i % 65536) as u16)).collect();
        let d = DirectionSpec { isolated_by: Some(0), allow: vec![rule(None, ports, Action::Allow, 0)], ..Default::default() };
        let t = Table::compile(&d).unwrap();
        assert!(t.lookup(3, proto::TCP, 65535).allow);
        assert!(!t.lookup(3, proto::UDP, 1).allow);
    }

    fn set(spec: &PolicySpec) -> PolicySet {
        PolicySet::build(spec, &Counters::default(), 1).unwrap()
    }

    #[test]
    fn identities_by_address_then_longest_prefix() {
        let s = set(&PolicySpec {
            identities: vec![(ip("10.0.0.5"), 5)],
            prefixes: vec![(ip("10.0.0.0"), 8, 100), (ip("10.0.0.0"), 24, 101), (ip("fd00::"), 16, 102)],
            ..Default::default()
        });
        assert_eq!(s.identify(key(ip("10.0.0.5"))), 5);
        assert_eq!(s.identify(key(ip("10.0.0.6"))), 101);
        assert_eq!(s.identify(key(ip("10.9.0.6"))), 100);
        assert_eq!(s.identify(key(ip("11.0.0.1"))), WORLD);
        assert_eq!(s.identify(key(ip("fd00:1::1"))), 102);
        assert_eq!(s.identify(key(ip("::ffff:10.0.0.6"))), 101, "a v4-mapped v6 address is its v4 address here");
    }

    #[test]
    fn bad_sets_are_refused_with_a_reason() {
        let c = Counters::default();
        let bad = |s: PolicySpec| PolicySet::build(&s, &c, 1).unwrap_err().to_string();
        assert!(bad(PolicySpec { prefixes: vec![(ip("10.0.0.1"), 8, 1)], ..Default::default() }).contains("host bits"));
        assert!(bad(PolicySpec { prefixes: vec![(ip("10.0.0.0"), 33, 1)], ..Default::default() }).contains("at most 32"));
        let ep = |d: DirectionSpec| PolicySpec {
            policies: vec!["np/a/b".into()],
            endpoints: vec![EndpointSpec { name: "a/p".into(), addrs: vec![ip("10.0.0.1")], ingress: d, ..Default::default() }],
            ..Default::default()
        };
        assert!(bad(ep(DirectionSpec { isolated_by: Some(3), ..Default::default() })).contains("isolated by policy 3"));
        assert!(bad(ep(DirectionSpec { isolated_by: Some(0), allow: vec![rule(None, vec![tcp(9, 8)], Action::Allow, 0)], ..Default::default() })).contains("ends before"));
        assert!(bad(ep(DirectionSpec { isolated_by: Some(0), allow: vec![rule(None, vec![], Action::Deny, 0)], ..Default::default() })).contains("only allow"));
        let two = PolicySpec {
            endpoints: vec![
                EndpointSpec { name: "a/p".into(), addrs: vec![ip("10.0.0.1")], ..Default::default() },
                EndpointSpec { name: "a/q".into(), addrs: vec![ip("10.0.0.1")], ..Default::default() },
            ],
            ..Default::default()
        };
        assert!(bad(two).contains("two endpoints"));
    }

    #[test]
    fn flows_are_decided_by_both_ends_and_denials_counted() {
        let c = Counters::default();
        let iso = |allow: Vec<Rule>| DirectionSpec { isolated_by: Some(0), allow, ..Default::default() };
        let spec = PolicySpec {
            policies: vec!["NetworkPolicy/ns/deny".into(), "NetworkPolicy/ns/web".into()],
            identities: vec![(ip("10.0.0.1"), 1), (ip("10.0.0.2"), 2), (ip("10.0.1.3"), 3)],
            endpoints: vec![
                EndpointSpec {
                    name: "ns/a".into(),
                    addrs: vec![ip("10.0.0.1")],
                    egress: iso(vec![rule(Some(vec![2]), vec![tcp(80, 80)], Action::Allow, 1)]),
                    ..Default::default()
                },
                EndpointSpec { name: "ns/b".into(), addrs: vec![ip("10.0.0.2")], ingress: iso(vec![rule(Some(vec![1]), vec![], Action::Allow, 1)]), ..Default::default() },
                EndpointSpec { name: "ns/c".into(), addrs: vec![ip("10.0.0.9")], ..Default::default() },
            ],
            ..Default::default()
        };
        let s = PolicySet::build(&spec, &c, 1).unwrap();
        let k = |a: &str| key(ip(a));
        assert_eq!(s.decide(k("10.0.0.1"), k("10.0.0.2"), proto::TCP, 80), Decision::Allowed);
        assert_eq!(s.decide(k("10.0.0.1"), k("10.0.0.2"), proto::TCP, 81), Decision::Denied { dir: Direction::Egress, policy: 0 });
        assert_eq!(s.decide(k("10.0.1.3"), k("10.0.0.2"), proto::TCP, 80), Decision::Denied { dir: Direction::Ingress, policy: 0 });
        assert_eq!(s.decide(k("10.0.0.9"), k("10.0.1.3"), proto::UDP, 1), Decision::Open);
        assert!(!s.enforces(k("10.0.0.9"), k("10.0.1.3")));
        assert!(s.enforces(k("10.0.1.3"), k("10.0.0.2")));
        s.count_denied(Denial { src: k("10.0.1.3"), dst: k("10.0.0.2"), proto: proto::TCP, port: 80, dir: Direction::Ingress, policy: 0 });
        let d = c.snapshot();
        assert_eq!(d.policies[0], ("NetworkPolicy/ns/deny".to_string(), 1));
        assert!(d.endpoints.contains(&("ns/b".to_string(), 1, 0)));
        // Counts survive a new set that keeps the names, and go with names that leave.
        let s2 = PolicySet::build(&spec, &c, 2).unwrap();
        s2.count_denied(Denial { src: k("10.0.0.1"), dst: k("10.0.0.2"), proto: proto::UDP, port: 53, dir: Direction::Egress, policy: 0 });
        // Both in the log, with their endpoints and policy, in order.
        let (log, suppressed) = c.log.since(0);
        assert_eq!((log.len(), suppressed), (2, 0));
        assert_eq!((log[0].src, log[0].dst, log[0].port, log[0].direction), (ip("10.0.1.3"), ip("10.0.0.2"), 80, "ingress"));
        assert_eq!((log[1].endpoint.as_deref(), log[1].policy.as_deref(), log[1].seq), (Some("ns/a"), Some("NetworkPolicy/ns/deny"), log[0].seq + 1));
        assert!(c.log.since(log[1].seq).0.is_empty());
        // A flood is logged at most LOG_RATE a second; the rest are counted.
        for _ in 0..3 * LOG_RATE {
            s2.count_denied(Denial { src: k("10.0.0.1"), dst: k("10.0.0.2"), proto: proto::UDP, port: 53, dir: Direction::Egress, policy: 0 });
        }
        let (log, suppressed) = c.log.since(0);
        assert!(log.len() <= 2 * LOG_RATE as usize + 2 && suppressed >= LOG_RATE as u64, "{} logged, {suppressed} suppressed", log.len());
        assert!(c.snapshot().policies[0].1 >= 2);
        PolicySet::build(&PolicySpec::default(), &c, 3).unwrap();
        assert_eq!(c.snapshot(), Denied::default());
    }

    #[test]
    fn remembered_flows_match_both_directions_expire_and_are_bounded() {
        let f = Flows::new(16 * SHARDS);
        let k = FlowKey::new(proto::UDP, 1, 1000, 2, 53);
        assert_eq!(k, FlowKey::new(proto::UDP, 2, 53, 1, 1000));
        assert!(!f.hit(&k, 0));
        assert!(f.insert(k, 0));
        assert!(f.hit(&FlowKey::new(proto::UDP, 2, 53, 1, 1000), 10));
        assert!(f.hit(&k, UDP_IDLE_MS), "a hit keeps the flow alive");
        assert!(!f.hit(&k, 3 * UDP_IDLE_MS), "idle past its timeout");
        assert!(f.is_empty());
        // Fill the table: new flows are refused until old ones expire.
        let mut refused = 0;
        for i in 0..(64 * SHARDS) as u128 {
            if !f.insert(FlowKey::new(proto::TCP, i, 1, 1 << 100, 2), 0) {
                refused += 1;
            }
        }
        assert!(refused > 0 && f.len() <= 16 * SHARDS);
        assert!(f.insert(FlowKey::new(proto::TCP, 1 << 90, 1, 1 << 100, 2), TCP_IDLE_MS + 1), "expired flows make room");
    }

    #[test]
    fn a_workers_cache_answers_for_the_shared_table_until_it_is_cleared() {
        let c = Counters::default();
        let b_from = |peer: u32| PolicySpec {
            policies: vec!["NetworkPolicy/ns/b".into()],
            identities: vec![(ip("10.0.0.1"), 1), (ip("10.0.0.3"), 3)],
            endpoints: vec![EndpointSpec {
                name: "ns/b".into(),
                addrs: vec![ip("10.0.0.2")],
                ingress: DirectionSpec { isolated_by: Some(0), allow: vec![rule(Some(vec![peer]), vec![], Action::Allow, 0)], ..Default::default() },
                ..Default::default()
            }],
            ..Default::default()
        };
        let (a, b, d) = (key(ip("10.0.0.1")), key(ip("10.0.0.2")), key(ip("10.0.0.3")));
        let flows = Flows::new(FLOWS);
        let mut cache = FlowCache::default();
        let allow_a = PolicySet::build(&b_from(1), &c, 1).unwrap();
        assert_eq!(cache.check(&allow_a, &flows, proto::UDP, a, 1000, b, 53, 10), Ok(()));
        assert_eq!(cache.check(&allow_a, &flows, proto::UDP, d, 1000, b, 53, 10), Err(DropReason::PolicyDenied), "denials are never cached");
        assert_eq!(flows.len(), 1);
        // A policy that no longer allows a: the flow goes on (cached, and remembered behind
        // the cache), its reply too; a new flow of a's does not.
        let allow_d = PolicySet::build(&b_from(3), &c, 2).unwrap();
        assert_eq!(cache.check(&allow_d, &flows, proto::UDP, a, 1000, b, 53, 20), Ok(()));
        assert_eq!(cache.check(&allow_d, &flows, proto::UDP, b, 53, a, 1000, 20), Ok(()));
        assert_eq!(cache.check(&allow_d, &flows, proto::UDP, a, 1001, b, 53, 20), Err(DropReason::PolicyDenied));
        // Past the refresh (from 20: a new policy set empties the cache) the shared table is
        // asked again, and keeps the flow alive.
        let t = 20 + CACHE_REFRESH_MS;
        assert_eq!(cache.check(&allow_d, &flows, proto::UDP, a, 1000, b, 53, t), Ok(()));
        assert_eq!(cache.check(&allow_d, &flows, proto::UDP, a, 1000, b, 53, t + UDP_IDLE_MS - 1), Ok(()));
        // Idle past its timeout: gone behind the cache too.
        let t = t + 3 * UDP_IDLE_MS;
        assert_eq!(cache.check(&allow_d, &flows, proto::UDP, a, 1000, b, 53, t), Err(DropReason::PolicyDenied));
        // Flows forgotten: the cache forgets them too.
        assert_eq!(cache.check(&allow_a, &flows, proto::UDP, a, 1000, b, 53, t), Ok(()));
        flows.clear();
        assert_eq!(cache.check(&allow_d, &flows, proto::UDP, a, 1000, b, 53, t + 1), Err(DropReason::PolicyDenied));
        // A flow neither end of which is under policy is remembered as open: a policy that
        // then isolates one of its ends does not cut it (either direction); a new flow is
        // decided by that policy.
        let (e, g) = (key(ip("10.0.0.5")), key(ip("10.0.0.6")));
        let before = flows.len();
        assert_eq!(cache.check(&allow_d, &flows, proto::TCP, e, 40000, g, 80, t + 2), Ok(()));
        assert_eq!(cache.check(&allow_d, &flows, proto::TCP, e, 40000, g, 80, t + 3), Ok(()));
        assert_eq!(flows.len(), before + 1, "an open flow is remembered in the shared table");
        let mut isolate_g = b_from(1);
        isolate_g.endpoints[0].addrs = vec![ip("10.0.0.6")];
        let isolate_g = PolicySet::build(&isolate_g, &c, 3).unwrap();
        assert_eq!(cache.check(&isolate_g, &flows, proto::TCP, e, 40000, g, 80, t + 4), Ok(()));
        assert_eq!(cache.check(&isolate_g, &flows, proto::TCP, g, 80, e, 40000, t + 4), Ok(()));
        assert_eq!(cache.check(&isolate_g, &flows, proto::TCP, e, 40001, g, 80, t + 5), Err(DropReason::PolicyDenied));
        // Without a cache (check_frame's path) the same.
        assert_eq!(check_flow(&isolate_g, &flows, proto::TCP, e, 40000, g, 80, t + 6), Ok(()));
    }

    #[test]
    fn open_flows_take_at_most_three_quarters_of_the_shared_table() {
        let flows = Flows::new(16 * SHARDS);
        let mut kept = 0;
        for i in 0..64 * SHARDS as u32 {
            kept += flows.remember(FlowKey::new(proto::UDP, 1 << 90 | i as u128, 1, 1 << 100, 2), 5) as usize;
        }
        assert!(kept <= 12 * SHARDS && kept > 8 * SHARDS, "kept {kept}");
        // Room is left for flows policy allows.
        let mut allowed = 0;
        for i in 0..64 * SHARDS as u32 {
            allowed += flows.insert(FlowKey::new(proto::TCP, 1 << 91 | i as u128, 1, 1 << 100, 2), 5) as usize;
        }
        assert!(allowed >= 4 * SHARDS, "allowed {allowed}");
        // Expired open flows make room again.
        assert!(flows.remember(FlowKey::new(proto::UDP, 1 << 92, 1, 1 << 100, 2), 5 + UDP_IDLE_MS + 1) || flows.len() == 16 * SHARDS);
    }

    #[test]
    fn a_full_cache_of_colliding_flows_stays_exact() {
        // More flows than slots: every answer is still the shared table's and the policy's.
        let c = Counters::default();
        let spec = PolicySpec {
            policies: vec!["NetworkPolicy/ns/b".into()],
            identities: vec![(ip("10.0.0.1"), 1)],
            endpoints: vec![EndpointSpec {
                name: "ns/b".into(),
                addrs: vec![ip("10.0.0.2")],
                ingress: DirectionSpec { isolated_by: Some(0), allow: vec![rule(Some(vec![1]), vec![tcp(80, 80)], Action::Allow, 0)], ..Default::default() },
                ..Default::default()
            }],
            ..Default::default()
        };
        let set = PolicySet::build(&spec, &c, 1).unwrap();
        let flows = Flows::new(FLOWS);
        let mut cache = FlowCache::default();
        let (a, b) = (key(ip("10.0.0.1")), key(ip("10.0.0.2")));
        for round in 0..2 {
            for i in 0..2 * CACHE_SLOTS as u16 {
                let (sport, dport) = (1024 + i, if i % 3 == 0 { 81 } else { 80 });
                let want = if dport == 80 { Ok(()) } else { Err(DropReason::PolicyDenied) };
                assert_eq!(cache.check(&set, &flows, proto::TCP, a, sport, b, dport, 5), want, "flow {i} round {round}");
                if round == 1 {
                    // b's egress is not under policy: its packets to a pass (replies or not).
                    assert_eq!(cache.check(&set, &flows, proto::TCP, b, dport, a, sport, 5), Ok(()), "reply {i}");
                }
            }
        }
    }
}
