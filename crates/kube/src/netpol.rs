//! NetworkPolicy compiled for one node's data plane ([`vectorlb_wire::model::PolicyChanges`]):
//! the only place that reads selectors. Kept free of the controller's talking, tested alone.
//!
//! - **Identities**: every address of a Pod gets the identity of (its namespace, its labels,
//!   the longest of the policies' CIDRs holding it); every CIDR a policy names gets one of its
//!   own, for addresses that are no Pod's; the node's own addresses get one. Numbers are kept
//!   while the controller runs, so a change moves only what it touches.
//! - **Endpoints**: each Pod of this node (not `hostNetwork`) with, per direction, the policy
//!   that isolates it (the first by namespace and name) and the rules of every policy that
//!   selects it, their peers resolved to identities and their named ports to numbers.
//! - **The node**: traffic from the node's own addresses to its Pods is allowed whatever the
//!   policies say (the kubelet's probes), as Calico and Cilium do by default.

use crate::cnp::ClusterNetworkPolicy;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use vectorlb_wire::model::{PolicyChanges, PolicyEndpoint, PolicyIdentity, PolicyPorts, PolicyPrefix, PolicyRule};

type Labels = BTreeMap<String, String>;

/// What the compiler needs of a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIn {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub ips: Vec<IpAddr>,
    pub node: String,
    pub host_network: bool,
    /// Named container ports: (name, protocol, port).
    pub ports: Vec<(String, String, u16)>,
}

impl PodIn {
    /// None for a Pod without addresses yet, or one that is over.
    pub fn from_pod(p: &Pod) -> Option<PodIn> {
        let spec = p.spec.as_ref()?;
        let status = p.status.as_ref()?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return None;
        }
        let mut ips: Vec<IpAddr> = status.pod_ips.iter().flatten().filter_map(|i| i.ip.parse().ok()).collect();
        if ips.is_empty() {
            ips.extend(status.pod_ip.as_deref().and_then(|i| i.parse::<IpAddr>().ok()));
        }
        if ips.is_empty() {
            return None;
        }
        let ports = spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|cp| Some((cp.name.clone()?, cp.protocol.clone().unwrap_or_else(|| "TCP".into()), u16::try_from(cp.container_port).ok()?)))
            .collect();
        Some(PodIn {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            ips,
            node: spec.node_name.clone().unwrap_or_default(),
            host_network: spec.host_network.unwrap_or(false),
            ports,
        })
    }
}

/// A namespace's labels, with the name label the API server sets (in case it is missing).
pub fn namespace_labels(n: &Namespace) -> (String, Labels) {
    let name = n.metadata.name.clone().unwrap_or_default();
    let mut l = n.metadata.labels.clone().unwrap_or_default();
    l.entry("kubernetes.io/metadata.name".into()).or_insert_with(|| name.clone());
    (name, l)
}

/// Whether `sel` selects `labels` (None for a selector with an operator Kubernetes does not
/// know: it selects nothing, and the policy is reported).
pub fn selects(sel: &LabelSelector, labels: &Labels) -> Option<bool> {
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Some(false);
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let has = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => has.is_some_and(|v| values.contains(v)),
            "NotIn" => has.is_none_or(|v| !values.contains(v)),
            "Exists" => has.is_some(),
            "DoesNotExist" => has.is_none(),
            _ => return None,
        };
        if !ok {
            return Some(false);
        }
    }
    Some(true)
}

/// A CIDR of a policy: the network address and its length.
type Prefix = (IpAddr, u8);

/// `ADDR/LEN`, its host bits cleared (NetworkPolicy's validation allows none, but be lenient on
/// what the API server let through before it checked).
pub fn parse_cidr(s: &str) -> Option<Prefix> {
    let (a, l) = s.split_once('/')?;
    let addr: IpAddr = a.parse().ok()?;
    let len: u8 = l.parse().ok()?;
    match addr {
        IpAddr::V4(v) if len <= 32 => Some((IpAddr::V4((u32::from(v) & if len == 0 { 0 } else { u32::MAX << (32 - len) }).into()), len)),
        IpAddr::V6(v) if len <= 128 => Some((IpAddr::V6((u128::from(v) & if len == 0 { 0 } else { u128::MAX << (128 - len) }).into()), len)),
        _ => None,
    }
}

fn bits(a: IpAddr) -> (bool, u128) {
    match a {
        IpAddr::V4(v) => (true, u32::from(v) as u128),
        IpAddr::V6(v) => (false, u128::from(v)),
    }
}

/// Whether `a` lies in `p`.
fn holds(p: Prefix, a: IpAddr) -> bool {
    let ((v4p, x), (v4a, y)) = (bits(p.0), bits(a));
    let width = if v4p { 32 } else { 128 };
    v4p == v4a && (p.1 == 0 || (x ^ y) >> (width - p.1 as u32) == 0)
}

/// Whether prefix `inner` lies within `outer`.
fn within(inner: Prefix, outer: Prefix) -> bool {
    inner.1 >= outer.1 && holds(outer, inner.0)
}

fn prefix_text(p: Prefix) -> String {
    format!("{}/{}", p.0, p.1)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum IdKey {
    Pod {
        namespace: String,
        labels: Vec<(String, String)>,
        prefix: Option<Prefix>,
    },
    Prefix(Prefix),
    /// A node's address (its Node's, or this node's own).
    Host {
        node: String,
        prefix: Option<Prefix>,
    },
}

/// The compiled set for one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    pub identities: BTreeMap<IpAddr, u32>,
    pub prefixes: BTreeMap<String, u32>,
    pub endpoints: BTreeMap<String, PolicyEndpoint>,
    /// Policies that could not be compiled whole: (`namespace/name`, what is wrong).
    pub problems: Vec<(String, String)>,
}

/// Identity numbers, kept across compilations.
#[derive(Debug, Default)]
pub struct Compiler {
    ids: HashMap<IdKey, u32>,
    next: u32,
}

/// The identity of the node's own addresses, which may reach its Pods whatever the policies.
const NODE_POLICY: &str = "vectorlb/node";

fn policy_name(p: &NetworkPolicy) -> String {
    format!("NetworkPolicy/{}/{}", p.metadata.namespace.as_deref().unwrap_or_default(), p.metadata.name.as_deref().unwrap_or_default())
}

fn cnp_name(c: &ClusterNetworkPolicy) -> String {
    c.metadata.name.clone().unwrap_or_default()
}

/// A ClusterNetworkPolicy rule's protocols as the data plane's ports (empty: every protocol
/// and port); `named` gives a named port's protocol and number. None when the rule names
/// protocols and none of them resolves (it then matches nothing).
fn cnp_ports(protocols: &[crate::cnp::Protocol], named: impl Fn(&str) -> Option<(String, u16)>) -> Option<Vec<PolicyPorts>> {
    if protocols.is_empty() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for p in protocols {
        for (name, ports) in [("tcp", &p.tcp), ("udp", &p.udp), ("sctp", &p.sctp)] {
            let Some(ports) = ports else { continue };
            match &ports.destination_port {
                None => out.push(PolicyPorts { protocol: name.into(), port: 0, end_port: Some(65535) }),
                Some(crate::cnp::Port { number: Some(n), .. }) => {
                    if let Ok(n) = u16::try_from(*n) {
                        out.push(PolicyPorts { protocol: name.into(), port: n, end_port: None });
                    }
                }
                Some(crate::cnp::Port { range: Some(r), .. }) => {
                    if let (Ok(a), Ok(b)) = (u16::try_from(r.start), u16::try_from(r.end)) {
                        if a <= b {
                            out.push(PolicyPorts { protocol: name.into(), port: a, end_port: Some(b) });
                        }
                    }
                }
                Some(_) => {}
            }
        }
        if let Some((proto, port)) = p.destination_named_port.as_deref().and_then(&named) {
            out.push(PolicyPorts { protocol: proto, port, end_port: None });
        }
    }
    (!out.is_empty()).then_some(out)
}

/// A Node: its name, labels and addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIn {
    pub name: String,
    pub labels: Labels,
    pub addrs: Vec<IpAddr>,
}

impl NodeIn {
    pub fn from_node(n: &Node) -> NodeIn {
        NodeIn {
            name: n.metadata.name.clone().unwrap_or_default(),
            labels: n.metadata.labels.clone().unwrap_or_default(),
            addrs: n
                .status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect(),
        }
    }
}

/// What one compilation reads.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    /// This node's name: its Pods are the endpoints.
    pub node: &'a str,
    /// This node's own addresses (they always reach its Pods).
    pub node_addrs: &'a [IpAddr],
    pub pods: &'a [PodIn],
    pub namespaces: &'a BTreeMap<String, Labels>,
    pub policies: &'a [&'a NetworkPolicy],
    pub cluster_policies: &'a [&'a ClusterNetworkPolicy],
    pub nodes: &'a [NodeIn],
}

fn ns_name(p: &NetworkPolicy) -> String {
    format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or_default(), p.metadata.name.as_deref().unwrap_or_default())
}

/// An identity's peers as a selector sees them.
struct PeerId {
    id: u32,
    namespace: Option<String>,
    labels: Labels,
    prefix: Option<Prefix>,
    /// The node whose address this is (an identity of [`IdKey::Host`]).
    node: Option<String>,
    /// Named ports of the Pods of this identity (the first Pod's number for a name).
    ports: BTreeMap<(String, String), u16>,
}

impl Compiler {
    fn id(&mut self, k: IdKey) -> u32 {
        let next = &mut self.next;
        *self.ids.entry(k).or_insert_with(|| {
            // 0 is the data plane's identity of nothing.
            *next += 1;
            *next
        })
    }

    /// Compiles NetworkPolicies alone for the Pods of `node`.
    pub fn compile(&mut self, node: &str, node_addrs: &[IpAddr], pods: &[PodIn], namespaces: &BTreeMap<String, Labels>, policies: &[NetworkPolicy]) -> Compiled {
        let policies: Vec<&NetworkPolicy> = policies.iter().collect();
        self.compile_all(&Inputs { node, node_addrs, pods, namespaces, policies: &policies, cluster_policies: &[], nodes: &[] })
    }

    /// Compiles every policy for the Pods of `inp.node`.
    pub fn compile_all(&mut self, inp: &Inputs) -> Compiled {
        let Inputs { node, node_addrs, pods, namespaces, policies, cluster_policies, nodes } = *inp;
        let mut out = Compiled::default();
        let mut cnps: Vec<&ClusterNetworkPolicy> = cluster_policies.to_vec();
        // Admin before Baseline, then by priority, then by name (the API leaves equal
        // priorities unordered; this order is at least the same on every node).
        cnps.sort_by_key(|c| (c.spec.tier != "Admin", c.spec.priority, c.metadata.name.clone()));
        let mut policies: Vec<&NetworkPolicy> = policies.to_vec();
        policies.sort_by_key(|p| ns_name(p));
        // Every CIDR a policy names, excepts included.
        let mut cidrs: BTreeSet<Prefix> = BTreeSet::new();
        for p in &policies {
            let spec = p.spec.as_ref();
            let peers =
                spec.iter().flat_map(|s| s.ingress.iter().flatten().flat_map(|r| r.from.iter().flatten()).chain(s.egress.iter().flatten().flat_map(|r| r.to.iter().flatten())));
            for peer in peers {
                if let Some(b) = &peer.ip_block {
                    for c in std::iter::once(&b.cidr).chain(b.except.iter().flatten()) {
                        match parse_cidr(c) {
                            Some(x) => {
                                cidrs.insert(x);
                            }
                            None => out.problems.push((ns_name(p), format!("ipBlock '{}' is not a CIDR", c.escape_debug()))),
                        }
                    }
                }
            }
        }
        for c in &cnps {
            for n in c.spec.egress.iter().flat_map(|r| &r.to).flat_map(|p| &p.networks) {
                match parse_cidr(n) {
                    Some(x) => {
                        cidrs.insert(x);
                    }
                    None => out.problems.push((cnp_name(c), format!("networks '{}' is not a CIDR", n.escape_debug()))),
                }
            }
        }
        let lpm = |a: IpAddr| cidrs.iter().filter(|c| holds(**c, a)).max_by_key(|c| c.1).copied();
        // Identities: the Pods' addresses, the CIDRs, the node.
        let mut peers: Vec<PeerId> = Vec::new();
        let mut by_id: HashMap<u32, usize> = HashMap::new();
        for p in pods.iter().filter(|p| !p.host_network) {
            for &ip in &p.ips {
                let prefix = lpm(ip);
                let id = self.id(IdKey::Pod { namespace: p.namespace.clone(), labels: p.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), prefix });
                out.identities.insert(ip, id);
                let i = *by_id.entry(id).or_insert_with(|| {
                    peers.push(PeerId { id, namespace: Some(p.namespace.clone()), labels: p.labels.clone(), prefix, node: None, ports: BTreeMap::new() });
                    peers.len() - 1
                });
                for (name, proto, port) in &p.ports {
                    peers[i].ports.entry((name.clone(), proto.clone())).or_insert(*port);
                }
            }
        }
        for &c in &cidrs {
            let id = self.id(IdKey::Prefix(c));
            out.prefixes.insert(prefix_text(c), id);
            peers.push(PeerId { id, namespace: None, labels: Labels::new(), prefix: Some(c), node: None, ports: BTreeMap::new() });
        }
        // The nodes' addresses, this node's own last (they may add to its Node's).
        let others = nodes.iter().filter(|n| n.name != node).map(|n| (n.name.as_str(), &n.labels, n.addrs.clone()));
        let this_labels = nodes.iter().find(|n| n.name == node).map(|n| n.labels.clone()).unwrap_or_default();
        let this_addrs: Vec<IpAddr> = nodes.iter().filter(|n| n.name == node).flat_map(|n| n.addrs.iter().copied()).chain(node_addrs.iter().copied()).collect();
        let mut node_ids = BTreeSet::new();
        for (name, labels, addrs) in others.chain(std::iter::once((node, &this_labels, this_addrs))) {
            for a in addrs {
                let prefix = lpm(a);
                let id = self.id(IdKey::Host { node: name.to_string(), prefix });
                out.identities.insert(a, id);
                if name == node {
                    node_ids.insert(id);
                }
                if by_id.insert(id, peers.len()).is_none() {
                    peers.push(PeerId { id, namespace: None, labels: labels.clone(), prefix, node: Some(name.to_string()), ports: BTreeMap::new() });
                }
            }
        }
        let node_ids: Vec<u32> = node_ids.into_iter().collect();
        let index = PeerIndex::new(&peers);
        // A rule's peers are the same for every Pod its policy selects: resolved once a round
        // (by policy, direction and rule).
        let mut resolved: HashMap<(usize, bool, usize), Option<Vec<u32>>> = HashMap::new();
        // The node's Pods.
        for pod in pods.iter().filter(|p| p.node == node && !p.host_network) {
            let mut e = PolicyEndpoint { name: format!("{}/{}", pod.namespace, pod.name), addrs: Vec::new(), ..Default::default() };
            for ip in &pod.ips {
                if !e.addrs.iter().any(|a: &IpAddr| a.is_ipv4() == ip.is_ipv4()) {
                    e.addrs.push(*ip);
                }
            }
            for (pi, p) in policies.iter().enumerate() {
                let Some(spec) = &p.spec else { continue };
                if p.metadata.namespace.as_deref() != Some(pod.namespace.as_str()) {
                    continue;
                }
                match spec.pod_selector.as_ref().map_or(Some(true), |s| selects(s, &pod.labels)) {
                    Some(true) => {}
                    Some(false) => continue,
                    None => {
                        out.problems.push((ns_name(p), "podSelector: an unknown operator".into()));
                        continue;
                    }
                }
                let types = spec.policy_types.clone().unwrap_or_else(|| {
                    let mut t = vec!["Ingress".to_string()];
                    if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
                        t.push("Egress".into());
                    }
                    t
                });
                let name = policy_name(p);
                if types.iter().any(|t| t == "Ingress") {
                    e.ingress.isolated_by.get_or_insert_with(|| name.clone());
                    for (ri, r) in spec.ingress.iter().flatten().enumerate() {
                        let ids = resolved.entry((pi, true, ri)).or_insert_with(|| Self::peer_ids(&r.from, p, namespaces, &index, &mut out.problems)).clone();
                        let ports = ports_of(&r.ports, |n, proto| pod.ports.iter().find(|(pn, pp, _)| pn == n && pp == proto).map(|x| x.2));
                        if let Some(ports) = ports {
                            e.ingress.allow.push(PolicyRule { peers: ids, ports, action: "allow".into(), policy: name.clone() });
                        }
                    }
                }
                if types.iter().any(|t| t == "Egress") {
                    e.egress.isolated_by.get_or_insert_with(|| name.clone());
                    for (ri, r) in spec.egress.iter().flatten().enumerate() {
                        let ids = resolved.entry((pi, false, ri)).or_insert_with(|| Self::peer_ids(&r.to, p, namespaces, &index, &mut out.problems)).clone();
                        let named = r.ports.iter().flatten().any(|x| matches!(x.port, Some(IntOrString::String(_))));
                        if !named {
                            if let Some(ports) = ports_of(&r.ports, |_, _| None) {
                                e.egress.allow.push(PolicyRule { peers: ids, ports, action: "allow".into(), policy: name.clone() });
                            }
                            continue;
                        }
                        // A named port is the destination's: one rule per peer identity that
                        // has it, with its number there.
                        for peer in peers.iter().filter(|x| ids.as_ref().is_none_or(|ids| ids.contains(&x.id))) {
                            if let Some(ports) = ports_of(&r.ports, |n, proto| peer.ports.get(&(n.to_string(), proto.to_string())).copied()) {
                                if !ports.is_empty() {
                                    e.egress.allow.push(PolicyRule { peers: Some(vec![peer.id]), ports, action: "allow".into(), policy: name.clone() });
                                }
                            }
                        }
                    }
                }
            }
            let ns_labels = namespaces.get(&pod.namespace).cloned().unwrap_or_default();
            for c in &cnps {
                self.cluster_policy(c, pod, &ns_labels, namespaces, &peers, &mut e, &mut out.problems);
            }
            let d = &e.ingress;
            if d.isolated_by.is_some() || !d.admin.is_empty() || !d.baseline.is_empty() {
                e.ingress.admin.insert(0, PolicyRule { peers: Some(node_ids.clone()), ports: Vec::new(), action: "allow".into(), policy: NODE_POLICY.into() });
            }
            out.endpoints.insert(e.name.clone(), e);
        }
        out.problems.sort();
        out.problems.dedup();
        out
    }

    /// A ClusterNetworkPolicy's rules for `pod`, if it is the policy's subject: into the admin
    /// or the baseline tier of its directions, in order.
    #[allow(clippy::too_many_arguments)]
    fn cluster_policy(
        &self,
        c: &ClusterNetworkPolicy,
        pod: &PodIn,
        ns_labels: &Labels,
        namespaces: &BTreeMap<String, Labels>,
        peers: &[PeerId],
        e: &mut PolicyEndpoint,
        problems: &mut Vec<(String, String)>,
    ) {
        let name = cnp_name(c);
        let mut bad = |why: String| problems.push((name.clone(), why));
        let admin = match c.spec.tier.as_str() {
            "Admin" => true,
            "Baseline" => false,
            t => return bad(format!("tier '{}' is not Admin or Baseline", t.escape_debug())),
        };
        let subject = match (&c.spec.subject.namespaces, &c.spec.subject.pods) {
            (Some(n), None) => selects(n, ns_labels),
            (None, Some(p)) => selects(&p.namespace_selector, ns_labels).and_then(|ok| if ok { selects(&p.pod_selector, &pod.labels) } else { Some(false) }),
            _ => return bad("subject: one of namespaces and pods".into()),
        };
        match subject {
            Some(true) => {}
            Some(false) => return,
            None => return bad("subject: an unknown operator".into()),
        }
        let action = |a: &str| match a {
            "Accept" => Some("allow"),
            "Deny" => Some("deny"),
            "Pass" if admin => Some("pass"),
            _ => None,
        };
        let policy = format!("ClusterNetworkPolicy/{}", c.metadata.name.as_deref().unwrap_or_default());
        let rules = c.spec.ingress.iter().map(|r| (true, &r.action, &r.from, &r.protocols)).chain(c.spec.egress.iter().map(|r| (false, &r.action, &r.to, &r.protocols)));
        for (ingress, act, from, protocols) in rules {
            let Some(act) = action(act) else {
                bad(format!("action '{}' in the {} tier", act.escape_debug(), c.spec.tier));
                continue;
            };
            let ids = self.cnp_peers(from, namespaces, peers, &mut bad);
            let dir = if ingress { &mut e.ingress } else { &mut e.egress };
            let tier = if admin { &mut dir.admin } else { &mut dir.baseline };
            let named = protocols.iter().any(|p| p.destination_named_port.is_some());
            if ingress || !named {
                if let Some(ports) = cnp_ports(protocols, |n| pod.ports.iter().find(|(pn, _, _)| pn == n).map(|(_, proto, port)| (proto.to_ascii_lowercase(), *port))) {
                    tier.push(PolicyRule { peers: Some(ids), ports, action: act.into(), policy: policy.clone() });
                }
                continue;
            }
            // Egress to a named port: the destination's number, per peer identity.
            for peer in peers.iter().filter(|x| ids.contains(&x.id)) {
                let named = |n: &str| peer.ports.iter().find(|((pn, _), _)| pn == n).map(|((_, proto), port)| (proto.to_ascii_lowercase(), *port));
                if let Some(ports) = cnp_ports(protocols, named) {
                    tier.push(PolicyRule { peers: Some(vec![peer.id]), ports, action: act.into(), policy: policy.clone() });
                }
            }
        }
    }

    /// The identities a ClusterNetworkPolicy rule's peers select.
    fn cnp_peers(&self, list: &[crate::cnp::Peer], namespaces: &BTreeMap<String, Labels>, peers: &[PeerId], bad: &mut impl FnMut(String)) -> Vec<u32> {
        let mut ids = BTreeSet::new();
        let sel = |s: &LabelSelector, l: &Labels, bad: &mut dyn FnMut(String)| {
            selects(s, l).unwrap_or_else(|| {
                bad("a selector with an unknown operator".into());
                false
            })
        };
        for p in list {
            let nets: Vec<Prefix> = p.networks.iter().filter_map(|n| parse_cidr(n)).collect();
            for x in peers {
                let hit = match (&x.namespace, &x.node) {
                    (Some(ns), _) => {
                        let nl = namespaces.get(ns).cloned().unwrap_or_default();
                        p.namespaces.as_ref().is_some_and(|s| sel(s, &nl, bad))
                            || p.pods.as_ref().is_some_and(|pp| sel(&pp.namespace_selector, &nl, bad) && sel(&pp.pod_selector, &x.labels, bad))
                    }
                    (None, Some(_)) => p.nodes.as_ref().is_some_and(|s| sel(s, &x.labels, bad)),
                    (None, None) => false,
                };
                let in_nets = x.prefix.is_some_and(|q| nets.iter().any(|n| within(q, *n)));
                if hit || in_nets {
                    ids.insert(x.id);
                }
            }
        }
        ids.into_iter().collect()
    }

    /// The identities a rule's peers select (None: the rule names no peer, so every peer).
    fn peer_ids(
        from: &Option<Vec<NetworkPolicyPeer>>,
        p: &NetworkPolicy,
        namespaces: &BTreeMap<String, Labels>,
        index: &PeerIndex,
        problems: &mut Vec<(String, String)>,
    ) -> Option<Vec<u32>> {
        let from = from.as_ref().filter(|f| !f.is_empty())?;
        let own_ns = p.metadata.namespace.clone().unwrap_or_default();
        let mut ids = BTreeSet::new();
        for peer in from {
            if let Some(b) = &peer.ip_block {
                let Some(c) = parse_cidr(&b.cidr) else { continue };
                let except: Vec<Prefix> = b.except.iter().flatten().filter_map(|x| parse_cidr(x)).collect();
                for x in index.within(c) {
                    if x.prefix.is_some_and(|q| !except.iter().any(|e| within(q, *e))) {
                        ids.insert(x.id);
                    }
                }
                continue;
            }
            for x in index.pods() {
                let Some(ns) = &x.namespace else { continue };
                let ns_ok = match &peer.namespace_selector {
                    None => *ns == own_ns,
                    Some(sel) => match namespaces.get(ns).map(|l| selects(sel, l)) {
                        Some(Some(ok)) => ok,
                        Some(None) => {
                            problems.push((ns_name(p), "namespaceSelector: an unknown operator".into()));
                            false
                        }
                        None => false,
                    },
                };
                let pod_ok = ns_ok
                    && match &peer.pod_selector {
                        None => true,
                        Some(sel) => selects(sel, &x.labels).unwrap_or_else(|| {
                            problems.push((ns_name(p), "podSelector: an unknown operator".into()));
                            false
                        }),
                    };
                if pod_ok {
                    ids.insert(x.id);
                }
            }
        }
        Some(ids.into_iter().collect())
    }
}

/// The identities of a round, indexed for the rules' peers: the Pods' (a selector's), and
/// those with a prefix by its address (an ipBlock's: a range, not a scan of every CIDR).
struct PeerIndex<'a> {
    pods: Vec<&'a PeerId>,
    by_prefix: Vec<((bool, u128), &'a PeerId)>,
}

impl<'a> PeerIndex<'a> {
    fn new(peers: &'a [PeerId]) -> PeerIndex<'a> {
        let pods = peers.iter().filter(|x| x.namespace.is_some()).collect();
        let mut by_prefix: Vec<_> = peers.iter().filter_map(|x| x.prefix.map(|q| (bits(q.0), x))).collect();
        by_prefix.sort_by_key(|(k, _)| *k);
        PeerIndex { pods, by_prefix }
    }

    fn pods(&self) -> impl Iterator<Item = &'a PeerId> + '_ {
        self.pods.iter().copied()
    }

    /// The identities whose prefix lies within `c`.
    fn within(&self, c: Prefix) -> impl Iterator<Item = &'a PeerId> + '_ {
        let (v4, lo) = bits(c.0);
        let host = if v4 { 32 } else { 128 } - c.1.min(if v4 { 32 } else { 128 }) as u32;
        let hi = match host {
            0 => lo,
            128 => u128::MAX,
            h => lo | ((1u128 << h) - 1),
        };
        let start = self.by_prefix.partition_point(|(k, _)| *k < (v4, lo));
        self.by_prefix[start..].iter().take_while(move |(k, _)| *k <= (v4, hi)).map(|(_, x)| *x).filter(move |x| x.prefix.is_some_and(|q| within(q, c)))
    }
}

/// A rule's ports as the data plane takes them; `named` resolves a port name for a protocol.
/// None when the rule names ports and none of them resolves (it then allows nothing).
fn ports_of(ports: &Option<Vec<NetworkPolicyPort>>, named: impl Fn(&str, &str) -> Option<u16>) -> Option<Vec<PolicyPorts>> {
    let Some(ports) = ports.as_ref().filter(|p| !p.is_empty()) else {
        return Some(Vec::new());
    };
    let mut out = Vec::new();
    for p in ports {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let protocol = proto.to_ascii_lowercase();
        match &p.port {
            None => out.push(PolicyPorts { protocol, port: 0, end_port: Some(65535) }),
            Some(IntOrString::Int(n)) => {
                let Ok(lo) = u16::try_from(*n) else { continue };
                let hi = p.end_port.and_then(|e| u16::try_from(e).ok()).filter(|&e| e >= lo);
                out.push(PolicyPorts { protocol, port: lo, end_port: hi });
            }
            Some(IntOrString::String(name)) => {
                if let Some(n) = named(name, &proto) {
                    out.push(PolicyPorts { protocol, port: n, end_port: None });
                }
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// What to send a daemon that holds `old` (None: nothing known, start from empty) for it to
/// hold `new`.
pub fn diff(old: Option<&Compiled>, new: &Compiled) -> PolicyChanges {
    let empty = Compiled::default();
    let o = old.unwrap_or(&empty);
    let mut c = PolicyChanges { reset: old.is_none(), ..Default::default() };
    c.identities_removed = o.identities.keys().filter(|a| !new.identities.contains_key(a)).copied().collect();
    c.identities = new.identities.iter().filter(|(a, id)| o.identities.get(a) != Some(id)).map(|(a, id)| PolicyIdentity { addr: *a, identity: *id }).collect();
    c.prefixes_removed = o.prefixes.keys().filter(|p| !new.prefixes.contains_key(*p)).cloned().collect();
    c.prefixes = new.prefixes.iter().filter(|(p, id)| o.prefixes.get(*p) != Some(id)).map(|(p, id)| PolicyPrefix { prefix: p.clone(), identity: *id }).collect();
    c.endpoints_removed = o.endpoints.keys().filter(|n| !new.endpoints.contains_key(*n)).cloned().collect();
    c.endpoints = new.endpoints.iter().filter(|(n, e)| o.endpoints.get(*n) != Some(e)).map(|(_, e)| e.clone()).collect();
    c
}

/// Splits changes into parts of at most about `max` bytes of JSON each, in an order where no
/// part leaves a Pod less protected than the whole: endpoints removed, identities and prefixes
/// added or replaced, endpoints added or replaced, then identities and prefixes removed. The
/// first part carries `reset`. One endpoint larger than `max` goes alone (and the daemon says
/// whether it takes it).
pub fn parts(c: PolicyChanges, max: usize) -> Vec<PolicyChanges> {
    if size(&c) <= max {
        return vec![c];
    }
    let mut out = vec![PolicyChanges { reset: c.reset, ..Default::default() }];
    let mut used = size(&out[0]);
    let mut add = |n: usize, f: &mut dyn FnMut(&mut PolicyChanges)| {
        if used + n > max && !is_empty(out.last().expect("one part at least")) {
            out.push(PolicyChanges::default());
            used = size(out.last().expect("just pushed"));
        }
        used += n + 1;
        f(out.last_mut().expect("one part at least"));
    };
    for n in c.endpoints_removed {
        add(size(&n), &mut |p| p.endpoints_removed.push(n.clone()));
    }
    for x in c.prefixes {
        add(size(&x), &mut |p| p.prefixes.push(x.clone()));
    }
    for x in c.identities {
        add(size(&x), &mut |p| p.identities.push(x.clone()));
    }
    for x in c.endpoints {
        add(size(&x), &mut |p| p.endpoints.push(x.clone()));
    }
    for x in c.identities_removed {
        add(size(&x), &mut |p| p.identities_removed.push(x));
    }
    for x in c.prefixes_removed {
        add(size(&x), &mut |p| p.prefixes_removed.push(x.clone()));
    }
    out
}

/// A value's length in JSON.
fn size<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(0, |v| v.len())
}

/// Whether a set of changes changes nothing.
pub fn is_empty(c: &PolicyChanges) -> bool {
    !c.reset
        && c.identities.is_empty()
        && c.identities_removed.is_empty()
        && c.prefixes.is_empty()
        && c.prefixes_removed.is_empty()
        && c.endpoints.is_empty()
        && c.endpoints_removed.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], ip: &str, node: &str) -> PodIn {
        PodIn {
            namespace: ns.into(),
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ips: vec![ip.parse().unwrap()],
            node: node.into(),
            host_network: false,
            ports: vec![],
        }
    }

    fn np(v: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(v).unwrap()
    }

    fn namespaces() -> BTreeMap<String, Labels> {
        [("x", "team-a"), ("y", "team-b"), ("z", "team-b")]
            .iter()
            .map(|(n, t)| (n.to_string(), [("kubernetes.io/metadata.name".to_string(), n.to_string()), ("team".to_string(), t.to_string())].into()))
            .collect()
    }

    /// Pods a, b, c in each of x, y and z (x's on node n1, the rest on n2), as the upstream
    /// tests lay them out.
    fn cluster() -> Vec<PodIn> {
        let mut v = Vec::new();
        for (i, ns) in ["x", "y", "z"].iter().enumerate() {
            for (j, p) in ["a", "b", "c"].iter().enumerate() {
                let mut pi = pod(ns, p, &[("pod", p)], &format!("10.244.{i}.{}", j + 10), if *ns == "x" { "n1" } else { "n2" });
                pi.ports = vec![("serve-80-tcp".into(), "TCP".into(), 80), ("serve-81-udp".into(), "UDP".into(), 81)];
                v.push(pi);
            }
        }
        v
    }

    fn ids_of(c: &Compiled, ips: &[&str]) -> Vec<u32> {
        let mut v: Vec<u32> = ips.iter().map(|i| c.identities[&i.parse::<IpAddr>().unwrap()]).collect();
        v.sort();
        v.dedup();
        v
    }

    #[test]
    fn selectors_follow_kubernetes() {
        let l: Labels = [("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())].into();
        let sel = |v: serde_json::Value| serde_json::from_value::<LabelSelector>(v).unwrap();
        assert_eq!(selects(&sel(json!({})), &l), Some(true));
        assert_eq!(selects(&sel(json!({"matchLabels": {"a": "1"}})), &l), Some(true));
        assert_eq!(selects(&sel(json!({"matchLabels": {"a": "2"}})), &l), Some(false));
        assert_eq!(selects(&sel(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]})), &l), Some(true));
        assert_eq!(selects(&sel(json!({"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["1"]}]})), &l), Some(true));
        assert_eq!(selects(&sel(json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]})), &l), Some(false));
        assert_eq!(selects(&sel(json!({"matchExpressions": [{"key": "b", "operator": "Exists"}]})), &l), Some(true));
        assert_eq!(selects(&sel(json!({"matchExpressions": [{"key": "b", "operator": "Near"}]})), &l), None);
    }

    #[test]
    fn cidrs_parse_and_nest() {
        assert_eq!(parse_cidr("10.1.2.3/8"), Some(("10.0.0.0".parse().unwrap(), 8)));
        assert_eq!(parse_cidr("0.0.0.0/0"), Some(("0.0.0.0".parse().unwrap(), 0)));
        assert_eq!(parse_cidr("fd00::1/128"), Some(("fd00::1".parse().unwrap(), 128)));
        assert_eq!(parse_cidr("10.0.0.0/33"), None);
        assert_eq!(parse_cidr("10.0.0.0"), None);
        assert!(within(parse_cidr("10.1.0.0/16").unwrap(), parse_cidr("10.0.0.0/8").unwrap()));
        assert!(!within(parse_cidr("10.0.0.0/8").unwrap(), parse_cidr("10.1.0.0/16").unwrap()));
        assert!(!within(parse_cidr("::/0").unwrap(), parse_cidr("0.0.0.0/0").unwrap()));
    }

    #[test]
    fn default_deny_isolates_and_the_node_still_reaches_its_pods() {
        let mut c = Compiler::default();
        let deny = np(json!({"metadata": {"namespace": "x", "name": "deny-all"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}));
        let out = c.compile("n1", &["192.168.1.1".parse().unwrap()], &cluster(), &namespaces(), &[deny]);
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        assert_eq!(out.endpoints.len(), 3, "x's pods are n1's");
        let a = &out.endpoints["x/a"];
        assert_eq!(a.ingress.isolated_by.as_deref(), Some("NetworkPolicy/x/deny-all"));
        assert_eq!(a.egress.isolated_by.as_deref(), Some("NetworkPolicy/x/deny-all"));
        assert!(a.ingress.allow.is_empty() && a.egress.allow.is_empty());
        let node = ids_of(&out, &["192.168.1.1"]);
        assert_eq!(a.ingress.admin, vec![PolicyRule { peers: Some(node), ports: vec![], action: "allow".into(), policy: "vectorlb/node".into() }]);
        // A policy in another namespace, or one selecting no pod, isolates nothing here.
        let other = np(json!({"metadata": {"namespace": "y", "name": "deny"}, "spec": {"podSelector": {}}}));
        let none = np(json!({"metadata": {"namespace": "x", "name": "nobody"}, "spec": {"podSelector": {"matchLabels": {"pod": "zzz"}}}}));
        let out = c.compile("n1", &[], &cluster(), &namespaces(), &[other, none]);
        assert!(out.endpoints.values().all(|e| e.ingress == Default::default() && e.egress == Default::default()));
    }

    #[test]
    fn peers_by_pod_namespace_and_both() {
        let mut c = Compiler::default();
        let pods = cluster();
        let p = np(json!({"metadata": {"namespace": "x", "name": "allow"}, "spec": {
        "podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"team": "team-b"}}}], "ports": [{"port": 80}, {"protocol": "UDP", "port": "serve-81-udp"}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}, "podSelector": {"matchLabels": {"pod": "c"}}}], "ports": [{"port": 8000, "endPort": 8080}]}
        ]}}));
        let out = c.compile("n1", &[], &pods, &namespaces(), &[p]);
        let a = &out.endpoints["x/a"];
        assert!(out.endpoints["x/b"].ingress.isolated_by.is_none());
        assert_eq!(a.ingress.allow.len(), 3);
        assert_eq!(a.ingress.allow[0].peers, Some(ids_of(&out, &["10.244.0.11"])), "b of x only");
        assert_eq!(a.ingress.allow[0].ports, vec![]);
        assert_eq!(a.ingress.allow[1].peers, Some(ids_of(&out, &["10.244.1.10", "10.244.1.11", "10.244.1.12", "10.244.2.10", "10.244.2.11", "10.244.2.12"])));
        assert_eq!(
            a.ingress.allow[1].ports,
            vec![PolicyPorts { protocol: "tcp".into(), port: 80, end_port: None }, PolicyPorts { protocol: "udp".into(), port: 81, end_port: None }]
        );
        assert_eq!(a.ingress.allow[2].peers, Some(ids_of(&out, &["10.244.1.12"])), "c of y");
        assert_eq!(a.ingress.allow[2].ports, vec![PolicyPorts { protocol: "tcp".into(), port: 8000, end_port: Some(8080) }]);
        // Pods with the same labels in one namespace share an identity; another namespace's do not.
        let mut more = pods.clone();
        more.push(pod("x", "b2", &[("pod", "b")], "10.244.0.99", "n2"));
        let out = c.compile("n1", &[], &more, &namespaces(), &[]);
        assert_eq!(out.identities[&"10.244.0.99".parse().unwrap()], out.identities[&"10.244.0.11".parse().unwrap()]);
        assert_ne!(out.identities[&"10.244.1.11".parse().unwrap()], out.identities[&"10.244.0.11".parse().unwrap()]);
    }

    #[test]
    fn ip_blocks_with_except_select_pods_and_the_outside() {
        let mut c = Compiler::default();
        let p = np(json!({"metadata": {"namespace": "x", "name": "cidr"}, "spec": {
            "podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}}]}]}}));
        let out = c.compile("n1", &[], &cluster(), &namespaces(), &[p]);
        let a = &out.endpoints["x/a"];
        assert!(a.ingress.isolated_by.is_none());
        let peers = a.egress.allow[0].peers.clone().unwrap();
        let inside = ids_of(&out, &["10.244.0.10", "10.244.0.11", "10.244.2.12"]);
        let excepted = ids_of(&out, &["10.244.1.10", "10.244.1.12"]);
        assert!(inside.iter().all(|i| peers.contains(i)), "{peers:?} {inside:?}");
        assert!(excepted.iter().all(|i| !peers.contains(i)));
        assert!(peers.contains(&out.prefixes["10.244.0.0/16"]), "addresses of the block that are no pod's");
        assert!(!peers.contains(&out.prefixes["10.244.1.0/24"]));
    }

    #[test]
    fn egress_named_ports_are_the_destinations() {
        let mut c = Compiler::default();
        let mut pods = cluster();
        pods[4].ports = vec![("serve-80-tcp".into(), "TCP".into(), 8080)]; // y/b
        let p = np(json!({"metadata": {"namespace": "x", "name": "named"}, "spec": {
            "podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}}));
        let out = c.compile("n1", &[], &pods, &namespaces(), &[p]);
        let rules = &out.endpoints["x/a"].egress.allow;
        let yb = ids_of(&out, &["10.244.1.11"])[0];
        let r = rules.iter().find(|r| r.peers == Some(vec![yb])).unwrap();
        assert_eq!(r.ports, vec![PolicyPorts { protocol: "tcp".into(), port: 8080, end_port: None }]);
        let ya = ids_of(&out, &["10.244.1.10"])[0];
        assert_eq!(rules.iter().find(|r| r.peers == Some(vec![ya])).unwrap().ports[0].port, 80);
    }

    #[test]
    fn large_changes_go_in_parts_in_a_safe_order() {
        let mut c = Compiler::default();
        let pods: Vec<PodIn> =
            (0..2000u32).map(|i| pod("x", &format!("p{i}"), &[("i", &i.to_string())], &format!("10.{}.{}.{}", i / 62500, (i / 250) % 250, i % 250 + 1), "n1")).collect();
        let p = np(json!({"metadata": {"namespace": "x", "name": "allow"}, "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}}));
        let want = c.compile("n1", &[], &pods, &namespaces(), &[p]);
        let all = diff(None, &want);
        let whole = size(&all);
        let ps = parts(all.clone(), 64 * 1024);
        assert!(ps.len() > 1 && whole > 64 * 1024);
        assert!(ps[0].reset && ps[1..].iter().all(|p| !p.reset));
        assert!(ps.iter().all(|p| size(p) <= 64 * 1024 + 1024), "{:?}", ps.iter().map(size).collect::<Vec<_>>());
        // Nothing lost, nothing twice, identities before the endpoints that name them.
        let ids: usize = ps.iter().map(|p| p.identities.len()).sum();
        let eps: usize = ps.iter().map(|p| p.endpoints.len()).sum();
        assert_eq!((ids, eps), (all.identities.len(), all.endpoints.len()));
        let last_identity = ps.iter().rposition(|p| !p.identities.is_empty()).unwrap();
        let first_endpoint = ps.iter().position(|p| !p.endpoints.is_empty()).unwrap();
        assert!(last_identity <= first_endpoint);
        // Small changes stay whole.
        assert_eq!(parts(PolicyChanges::default(), 100).len(), 1);
    }

    #[test]
    fn changes_go_by_difference() {
        let mut c = Compiler::default();
        let p = np(json!({"metadata": {"namespace": "x", "name": "allow"}, "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}}));
        let first = c.compile("n1", &[], &cluster(), &namespaces(), std::slice::from_ref(&p));
        let d = diff(None, &first);
        assert!(d.reset && d.endpoints.len() == 3 && d.identities.len() == 9);
        assert!(is_empty(&diff(Some(&first), &first)));
        // c of x takes label pod=b: its identity changes and the endpoints whose rules name b.
        let mut pods = cluster();
        pods[2].labels.insert("pod".into(), "b".into());
        let second = c.compile("n1", &[], &pods, &namespaces(), &[p]);
        let d = diff(Some(&first), &second);
        assert!(!d.reset);
        assert_eq!(d.identities.len(), 1);
        assert_eq!(d.identities[0].addr, "10.244.0.12".parse::<IpAddr>().unwrap());
        assert_eq!(d.identities[0].identity, second.identities[&"10.244.0.11".parse().unwrap()], "c now has b's identity");
        assert!(d.endpoints.is_empty(), "the rules name b's identity already: no endpoint changes");
        assert!(d.identities_removed.is_empty() && d.endpoints_removed.is_empty());
        let third = c.compile("n1", &[], &pods[1..], &namespaces(), &[]);
        let d = diff(Some(&second), &third);
        assert_eq!(d.endpoints_removed, vec!["x/a".to_string()]);
        assert_eq!(d.identities_removed, vec!["10.244.0.10".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn broken_policies_are_reported_not_fatal() {
        let mut c = Compiler::default();
        let p = np(json!({"metadata": {"namespace": "x", "name": "bad"}, "spec": {
            "podSelector": {"matchExpressions": [{"key": "pod", "operator": "Sideways"}]},
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/99"}}]}]}}));
        let out = c.compile("n1", &[], &cluster(), &namespaces(), &[p]);
        assert_eq!(out.problems.len(), 2, "{:?}", out.problems);
        assert!(out.endpoints.values().all(|e| e.ingress.isolated_by.is_none()), "a selector that cannot be read selects nothing");
    }

    fn cnp(v: serde_json::Value) -> ClusterNetworkPolicy {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_pods_peer_without_a_namespace_selector_selects_every_namespace() {
        let p = cnp(json!({"metadata": {"name": "by-label"}, "spec": {"tier": "Admin", "priority": 1,
            "subject": {"pods": {"podSelector": {"matchLabels": {"pod": "a"}}}},
            "egress": [{"action": "Deny", "to": [{"pods": {"podSelector": {"matchLabels": {"pod": "b"}}}}]}]}}));
        let mut c = Compiler::default();
        let out = c.compile_all(&Inputs { node: "n1", node_addrs: &[], pods: &cluster(), namespaces: &namespaces(), policies: &[], cluster_policies: &[&p], nodes: &[] });
        assert_eq!(out.endpoints["x/a"].egress.admin[0].peers, Some(ids_of(&out, &["10.244.0.11", "10.244.1.11", "10.244.2.11"])));
    }

    #[test]
    fn cluster_policies_fill_the_admin_and_baseline_tiers_in_order() {
        let mut c = Compiler::default();
        let pods = cluster();
        let nodes = vec![
            NodeIn { name: "n1".into(), labels: [("zone".to_string(), "a".to_string())].into(), addrs: vec!["192.168.1.1".parse().unwrap()] },
            NodeIn { name: "n2".into(), labels: [("zone".to_string(), "b".to_string())].into(), addrs: vec!["192.168.1.2".parse().unwrap()] },
        ];
        let cnps = [
            cnp(json!({"metadata": {"name": "late"}, "spec": {"tier": "Admin", "priority": 20, "subject": {"namespaces": {"matchLabels": {"team": "team-a"}}},
                "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}})),
            cnp(
                json!({"metadata": {"name": "early"}, "spec": {"tier": "Admin", "priority": 10, "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "a"}}}},
                "ingress": [{"action": "Pass", "from": [{"pods": {"namespaceSelector": {"matchLabels": {"team": "team-b"}}, "podSelector": {"matchLabels": {"pod": "b"}}}}], "protocols": [{"tcp": {"destinationPort": {"range": {"start": 80, "end": 90}}}}, {"destinationNamedPort": "serve-81-udp"}]}],
                "egress": [{"action": "Accept", "to": [{"nodes": {"matchLabels": {"zone": "b"}}}, {"networks": ["203.0.113.0/24"]}]}]}}),
            ),
            cnp(json!({"metadata": {"name": "base"}, "spec": {"tier": "Baseline", "priority": 0, "subject": {"namespaces": {}},
                "egress": [{"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]}, {"action": "Pass", "to": [{"namespaces": {}}]}]}})),
        ];
        let out = c.compile_all(&Inputs {
            node: "n1",
            node_addrs: &["10.244.0.1".parse().unwrap()],
            pods: &pods,
            namespaces: &namespaces(),
            policies: &[],
            cluster_policies: &cnps.iter().collect::<Vec<_>>(),
            nodes: &nodes,
        });
        assert_eq!(out.problems, vec![("base".to_string(), "action 'Pass' in the Baseline tier".to_string())]);
        let a = &out.endpoints["x/a"];
        // The node's own rule first, then "early" (priority 10), then "late".
        let names: Vec<&str> = a.ingress.admin.iter().map(|r| r.policy.as_str()).collect();
        assert_eq!(names, vec!["vectorlb/node", "ClusterNetworkPolicy/early", "ClusterNetworkPolicy/late"]);
        assert_eq!(a.ingress.admin[0].peers, Some(ids_of(&out, &["192.168.1.1", "10.244.0.1"])), "the node's Node address and its own");
        let early = &a.ingress.admin[1];
        assert_eq!(early.action, "pass");
        assert_eq!(early.peers, Some(ids_of(&out, &["10.244.1.11", "10.244.2.11"])));
        assert_eq!(early.ports, vec![PolicyPorts { protocol: "tcp".into(), port: 80, end_port: Some(90) }, PolicyPorts { protocol: "udp".into(), port: 81, end_port: None }]);
        let eg = &a.egress.admin[0];
        let peers = eg.peers.clone().unwrap();
        assert!(peers.contains(&ids_of(&out, &["192.168.1.2"])[0]) && peers.contains(&out.prefixes["203.0.113.0/24"]));
        assert!(!peers.contains(&ids_of(&out, &["192.168.1.1"])[0]), "n1 is zone a");
        // x/b is "late"'s subject, not "early"'s; every Pod gets the baseline's deny.
        let b = &out.endpoints["x/b"];
        assert_eq!(b.ingress.admin.iter().map(|r| r.policy.as_str()).collect::<Vec<_>>(), vec!["vectorlb/node", "ClusterNetworkPolicy/late"]);
        assert_eq!(b.egress.baseline.len(), 1);
        assert_eq!(b.egress.baseline[0].action, "deny");
        let everything = b.egress.baseline[0].peers.clone().unwrap();
        assert!(everything.contains(&ids_of(&out, &["10.244.1.10"])[0]), "0.0.0.0/0 holds the Pods too");
    }

    #[test]
    fn the_peer_index_finds_the_prefixes_within_a_cidr_as_a_scan_would() {
        let pfx = |t: &str| parse_cidr(t).unwrap();
        let texts = ["10.0.0.0/8", "10.1.2.3/32", "10.1.2.0/24", "10.255.255.255/32", "11.0.0.0/32", "0.0.0.0/0", "fd00::/8", "fd00::1/128", "::/0", "9.255.255.255/32"];
        let peers: Vec<PeerId> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| PeerId { id: i as u32, namespace: None, labels: Labels::new(), prefix: Some(pfx(t)), node: None, ports: BTreeMap::new() })
            .chain(std::iter::once(PeerId { id: 99, namespace: Some("ns".into()), labels: Labels::new(), prefix: None, node: None, ports: BTreeMap::new() }))
            .collect();
        let index = PeerIndex::new(&peers);
        assert_eq!(index.pods().map(|x| x.id).collect::<Vec<_>>(), vec![99]);
        for c in ["10.0.0.0/8", "10.1.2.0/24", "10.1.2.3/32", "0.0.0.0/0", "::/0", "fd00::/16", "fd00::1/128", "11.0.0.0/8", "12.0.0.0/8"] {
            let c = pfx(c);
            let mut got: Vec<u32> = index.within(c).map(|x| x.id).collect();
            got.sort();
            let want: Vec<u32> = peers.iter().filter(|x| x.prefix.is_some_and(|q| within(q, c))).map(|x| x.id).collect();
            assert_eq!(got, want, "{c:?}");
        }
    }

    #[test]
    fn ten_thousand_policies_over_the_same_pods_compile_each_rule_to_its_own_peers() {
        let pods: Vec<PodIn> = (0..7).map(|i| pod("default", &format!("p{i}"), &[("bench", "yes")], &format!("10.244.1.{}", i + 10), "n1")).collect();
        let mut policies: Vec<NetworkPolicy> = (0..10_000)
            .map(|k| {
                np(json!({"metadata": {"name": format!("filler-{k}"), "namespace": "default"},
                    "spec": {"podSelector": {"matchLabels": {"bench": "yes"}}, "policyTypes": ["Ingress", "Egress"],
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": format!("r{k}")}}}], "ports": [{"protocol": "TCP", "port": 10_000 + k}]}],
                        "egress": [{"to": [{"ipBlock": {"cidr": format!("172.16.{}.{}/32", k / 256, k % 256)}}], "ports": [{"protocol": "UDP", "port": 10_000 + k}]}]}}))
            })
            .collect();
        policies.push(np(json!({"metadata": {"name": "wide", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "172.16.0.0/16", "except": ["172.16.1.0/24"]}}]}]}})));
        let refs: Vec<&NetworkPolicy> = policies.iter().collect();
        let ns = namespaces();
        let out = Compiler::default().compile_all(&Inputs { node: "n1", node_addrs: &[], pods: &pods, namespaces: &ns, policies: &refs, cluster_policies: &[], nodes: &[] });
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        assert_eq!((out.endpoints.len(), out.prefixes.len()), (7, 10_002));
        let e = &out.endpoints["default/p3"];
        assert_eq!((e.ingress.allow.len(), e.egress.allow.len()), (10_000, 10_001));
        // Policies sort by name: filler-k's rule is wherever its name falls; find it by port.
        let egress_of = |k: usize| e.egress.allow.iter().find(|r| r.ports.first().is_some_and(|p| p.port == 10_000 + k as u16)).unwrap();
        for k in [0, 1, 255, 256, 9_999] {
            let want = out.prefixes[&format!("172.16.{}.{}/32", k / 256, k % 256)];
            assert_eq!(egress_of(k).peers, Some(vec![want]), "filler-{k}");
        }
        // A role no Pod has: no peer. The wide rule: every /32 in 172.16/16 but 172.16.1/24's.
        assert!(e.ingress.allow.iter().all(|r| r.peers.as_ref().is_some_and(|p| p.is_empty())));
        let wide = e.egress.allow.iter().find(|r| r.policy.ends_with("/wide")).unwrap().peers.clone().unwrap();
        assert_eq!(wide.len(), 10_000 - 256 + 1, "the /32s outside the except, and the /16 itself");
    }
}
