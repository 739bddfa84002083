//! The node's network policy set: what the controller pushes (`POST /v1/policy`, by
//! difference) kept by address and name, checked, compiled ([`vectorlb_lb::policy`]) and
//! published to the workers as a whole on each edit; nothing is half-applied. Not part of the
//! configuration file: the controller pushes it again when it (or the daemon) starts.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use vectorlb_api::model::{PolicyChanges, PolicyDeniedFlow, PolicyDeniedLog, PolicyDirection, PolicyEndpoint, PolicyStatus, MAX_POLICY_ITEMS};
use vectorlb_lb::policy::{Action, DirectionSpec, EndpointSpec, PolicySpec, Ports, Rule};
use vectorlb_lb::Control;
use vectorlb_packet::proto;

/// The longest endpoint or policy name.
const MAX_NAME: usize = 512;

#[derive(Debug, Clone, Default)]
struct State {
    identities: BTreeMap<IpAddr, u32>,
    prefixes: BTreeMap<(IpAddr, u8), u32>,
    endpoints: BTreeMap<String, PolicyEndpoint>,
    generation: u64,
}

pub struct Store {
    control: Arc<Control>,
    state: Mutex<State>,
}

/// `ADDR/LEN` with no host bits set.
pub fn parse_prefix(s: &str) -> Result<(IpAddr, u8), String> {
    let bad = || format!("'{}' is not ADDR/LEN", s.escape_debug());
    let (a, l) = s.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = a.parse().map_err(|_| bad())?;
    let len: u8 = l.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(format!("'{}': the length is at most {max}", s.escape_debug()));
    }
    let host_bits = match addr {
        IpAddr::V4(v) => len < 32 && u32::from(v) & (u32::MAX >> len) != 0,
        IpAddr::V6(v) => len < 128 && u128::from(v) & (u128::MAX >> len) != 0,
    };
    if host_bits {
        return Err(format!("'{}' has host bits set", s.escape_debug()));
    }
    Ok((addr, len))
}

fn check_name(what: &str, n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > MAX_NAME || n.chars().any(char::is_control) {
        return Err(format!("{what}: '{}' is not a name of 1..={MAX_NAME} printable bytes", n.escape_debug()));
    }
    Ok(())
}

/// Turns the kept state into the data plane's spec, naming the field at fault.
fn spec(st: &State) -> Result<PolicySpec, String> {
    let mut names: Vec<String> = Vec::new();
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut intern = |n: &str| -> Result<u32, String> {
        if let Some(&i) = index.get(n) {
            return Ok(i);
        }
        check_name("policy", n)?;
        let i = names.len() as u32;
        names.push(n.to_string());
        index.insert(n.to_string(), i);
        Ok(i)
    };
    let mut endpoints = Vec::with_capacity(st.endpoints.len());
    for (name, e) in &st.endpoints {
        let mut dir = |d: &PolicyDirection, which: &str| -> Result<DirectionSpec, String> {
            let mut rules = |rs: &[vectorlb_api::model::PolicyRule], tier: &str, actions: &[&str]| -> Result<Vec<Rule>, String> {
                let mut out = Vec::with_capacity(rs.len());
                for (i, r) in rs.iter().enumerate() {
                    let at = || format!("endpoint {name}: {which}.{tier}[{i}]");
                    let action = match r.action.as_str() {
                        a if !actions.contains(&a) => return Err(format!("{}: action '{}' is not one of {}", at(), r.action.escape_debug(), actions.join(", "))),
                        "allow" => Action::Allow,
                        "deny" => Action::Deny,
                        _ => Action::Pass,
                    };
                    let mut ports = Vec::with_capacity(r.ports.len());
                    for p in &r.ports {
                        let proto = match p.protocol.as_str() {
                            "tcp" => proto::TCP,
                            "udp" => proto::UDP,
                            "sctp" => 132,
                            other => return Err(format!("{}: protocol '{}' is not tcp, udp or sctp", at(), other.escape_debug())),
                        };
                        let hi = p.end_port.unwrap_or(p.port);
                        if hi < p.port {
                            return Err(format!("{}: end_port {hi} is below port {}", at(), p.port));
                        }
                        ports.push(Ports { proto, lo: p.port, hi });
                    }
                    out.push(Rule { peers: r.peers.clone(), ports, action, policy: intern(&r.policy).map_err(|e| format!("{}: {e}", at()))? });
                }
                Ok(out)
            };
            Ok(DirectionSpec {
                admin: rules(&d.admin, "admin", &["allow", "deny", "pass"])?,
                allow: rules(&d.allow, "allow", &["allow"])?,
                baseline: rules(&d.baseline, "baseline", &["allow", "deny"])?,
                isolated_by: d.isolated_by.as_deref().map(&mut intern).transpose().map_err(|e| format!("endpoint {name}: {which}.isolated_by: {e}"))?,
            })
        };
        let ingress = dir(&e.ingress, "ingress")?;
        let egress = dir(&e.egress, "egress")?;
        endpoints.push(EndpointSpec { name: name.clone(), addrs: e.addrs.clone(), ingress, egress });
    }
    Ok(PolicySpec {
        policies: names,
        identities: st.identities.iter().map(|(a, i)| (*a, *i)).collect(),
        prefixes: st.prefixes.iter().map(|((a, l), i)| (*a, *l, *i)).collect(),
        endpoints,
    })
}

impl Store {
    pub fn new(control: Arc<Control>) -> Store {
        Store { control, state: Mutex::new(State::default()) }
    }

    /// Applies a set of changes as one edit; the message names what is wrong (a 400).
    pub fn apply(&self, c: PolicyChanges) -> Result<PolicyStatus, String> {
        let mut cur = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = if c.reset { State { generation: cur.generation, ..State::default() } } else { cur.clone() };
        for a in &c.identities_removed {
            st.identities.remove(a);
        }
        for p in &c.prefixes_removed {
            st.prefixes.remove(&parse_prefix(p).map_err(|e| format!("prefixes_removed: {e}"))?);
        }
        for n in &c.endpoints_removed {
            st.endpoints.remove(n);
        }
        for i in &c.identities {
            st.identities.insert(i.addr, i.identity);
        }
        for p in &c.prefixes {
            st.prefixes.insert(parse_prefix(&p.prefix).map_err(|e| format!("prefixes: {e}"))?, p.identity);
        }
        for e in c.endpoints {
            check_name("endpoints: name", &e.name)?;
            if e.addrs.is_empty() || e.addrs.len() > 2 || (e.addrs.len() == 2 && e.addrs[0].is_ipv4() == e.addrs[1].is_ipv4()) {
                return Err(format!("endpoint {}: addrs: one or two addresses, a family each", e.name));
            }
            st.endpoints.insert(e.name.clone(), e);
        }
        if st.identities.len() > MAX_POLICY_ITEMS || st.prefixes.len() > MAX_POLICY_ITEMS || st.endpoints.len() > MAX_POLICY_ITEMS {
            return Err(format!("a policy set holds at most {MAX_POLICY_ITEMS} identities, prefixes and endpoints each"));
        }
        let s = spec(&st)?;
        st.generation = self.control.apply_policy(&s).map_err(|e| e.to_string())?;
        *cur = st;
        drop(cur);
        Ok(self.status())
    }

    /// The denied flows logged after `after`.
    pub fn denied(&self, after: u64) -> PolicyDeniedLog {
        let (entries, suppressed) = self.control.policy_counters.log.since(after);
        let next = entries.last().map_or(after, |e| e.seq);
        let protocol = |p: u8| match p {
            proto::TCP => "tcp".to_string(),
            proto::UDP => "udp".into(),
            132 => "sctp".into(),
            proto::ICMP => "icmp".into(),
            proto::ICMPV6 => "icmpv6".into(),
            n => n.to_string(),
        };
        PolicyDeniedLog {
            entries: entries
                .into_iter()
                .map(|e| PolicyDeniedFlow {
                    seq: e.seq,
                    unix_ms: e.unix_ms,
                    src: e.src,
                    dst: e.dst,
                    protocol: protocol(e.proto),
                    port: e.port,
                    direction: e.direction.into(),
                    endpoint: e.endpoint.map(|n| n.to_string()),
                    policy: e.policy.map(|n| n.to_string()),
                })
                .collect(),
            next,
            suppressed,
        }
    }

    pub fn status(&self) -> PolicyStatus {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let set = self.control.policy();
        let d = self.control.policy_counters.snapshot();
        PolicyStatus {
            generation: st.generation,
            identities: st.identities.len(),
            prefixes: st.prefixes.len(),
            endpoints: st.endpoints.len(),
            enforced: set.enforced(),
            flows: self.control.policy_flows.len(),
            denied_by_policy: d.policies.into_iter().collect(),
            denied_by_endpoint: d.endpoints.into_iter().map(|(n, i, o)| (n, [i, o])).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectorlb_api::model::{PolicyIdentity, PolicyPorts, PolicyPrefix, PolicyRule};

    fn store() -> Store {
        let spec = vectorlb_lb::service::two_arm::spec(24);
        Store::new(Control::new(&spec).unwrap())
    }

    fn ep(name: &str, addr: &str, ingress: PolicyDirection) -> PolicyEndpoint {
        PolicyEndpoint { name: name.into(), addrs: vec![addr.parse().unwrap()], ingress, ..Default::default() }
    }

    fn isolated(rules: Vec<PolicyRule>) -> PolicyDirection {
        PolicyDirection { isolated_by: Some("NetworkPolicy/ns/p".into()), allow: rules, ..Default::default() }
    }

    fn allow(peers: Option<Vec<u32>>, ports: Vec<PolicyPorts>) -> PolicyRule {
        PolicyRule { peers, ports, action: "allow".into(), policy: "NetworkPolicy/ns/p".into() }
    }

    #[test]
    fn prefixes_parse_strictly() {
        assert_eq!(parse_prefix("10.0.0.0/8").unwrap(), ("10.0.0.0".parse().unwrap(), 8));
        assert_eq!(parse_prefix("0.0.0.0/0").unwrap().1, 0);
        assert_eq!(parse_prefix("::/0").unwrap().1, 0);
        assert_eq!(parse_prefix("10.1.2.3/32").unwrap().1, 32);
        assert!(parse_prefix("10.0.0.1/8").unwrap_err().contains("host bits"));
        assert!(parse_prefix("10.0.0.0/33").unwrap_err().contains("at most 32"));
        assert!(parse_prefix("fd00::1/64").unwrap_err().contains("host bits"));
        for bad in ["10.0.0.0", "10.0.0.0/", "/8", "10.0.0.0/-1", "10.0.0.0/300", "nonsense/8", "10.0.0.0/8/8"] {
            assert!(parse_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn changes_apply_as_a_whole_or_not_at_all() {
        let s = store();
        let c = PolicyChanges {
            identities: vec![PolicyIdentity { addr: "10.1.0.11".parse().unwrap(), identity: 1 }],
            prefixes: vec![PolicyPrefix { prefix: "192.168.0.0/16".into(), identity: 9 }],
            endpoints: vec![ep("ns/b", "10.1.0.12", isolated(vec![allow(Some(vec![1]), vec![PolicyPorts { protocol: "tcp".into(), port: 80, end_port: Some(90) }])]))],
            ..Default::default()
        };
        let st = s.apply(c).unwrap();
        assert_eq!((st.generation, st.identities, st.prefixes, st.endpoints, st.enforced), (1, 1, 1, 1, 1));
        assert_eq!(st.denied_by_policy.get("NetworkPolicy/ns/p"), Some(&0));
        // One bad rule refuses the whole edit: the first endpoint stays as it was.
        let bad = PolicyChanges {
            endpoints_removed: vec!["ns/b".into()],
            endpoints: vec![ep("ns/c", "10.1.0.13", isolated(vec![allow(None, vec![PolicyPorts { protocol: "icmp".into(), port: 1, end_port: None }])]))],
            ..Default::default()
        };
        assert!(s.apply(bad).unwrap_err().contains("protocol 'icmp'"));
        assert_eq!(s.status().endpoints, 1);
        assert_eq!(s.status().generation, 1);
        // Removal by difference, then a reset.
        let st = s.apply(PolicyChanges { endpoints_removed: vec!["ns/b".into()], ..Default::default() }).unwrap();
        assert_eq!((st.generation, st.endpoints, st.enforced, st.identities), (2, 0, 0, 1));
        let st = s.apply(PolicyChanges { reset: true, ..Default::default() }).unwrap();
        assert_eq!((st.generation, st.identities, st.prefixes), (3, 0, 0));
    }

    #[test]
    fn hostile_sets_are_refused_with_a_reason() {
        let s = store();
        let one = |e: PolicyEndpoint| s.apply(PolicyChanges { endpoints: vec![e], ..Default::default() }).unwrap_err();
        assert!(one(ep("", "10.1.0.12", PolicyDirection::default())).contains("name"));
        assert!(one(ep(&"x".repeat(600), "10.1.0.12", PolicyDirection::default())).contains("name"));
        let mut two_v4 = ep("ns/a", "10.1.0.12", PolicyDirection::default());
        two_v4.addrs.push("10.1.0.13".parse().unwrap());
        assert!(one(two_v4).contains("a family each"));
        let backwards = isolated(vec![allow(None, vec![PolicyPorts { protocol: "udp".into(), port: 9, end_port: Some(8) }])]);
        assert!(one(ep("ns/a", "10.1.0.12", backwards)).contains("below port"));
        let pass_in_np = PolicyDirection { isolated_by: Some("np".into()), allow: vec![PolicyRule { action: "pass".into(), ..allow(None, vec![]) }], ..Default::default() };
        assert!(one(ep("ns/a", "10.1.0.12", pass_in_np)).contains("action 'pass'"));
        let absurd = PolicyChanges { prefixes: vec![PolicyPrefix { prefix: "10.0.0.0/99".into(), identity: 1 }], ..Default::default() };
        assert!(s.apply(absurd).unwrap_err().contains("at most 32"));
        // A hundred thousand ports in one rule: taken (they compile in one pass) and enforced.
        let many: Vec<PolicyPorts> = (0..100_000u32).map(|i| PolicyPorts { protocol: "tcp".into(), port: (i % 65_535) as u16 + 1, end_port: None }).collect();
        let st = s.apply(PolicyChanges { endpoints: vec![ep("ns/a", "10.1.0.12", isolated(vec![allow(None, many)]))], ..Default::default() }).unwrap();
        assert_eq!(st.enforced, 1);
        // Unknown fields are refused by the body's type.
        assert!(serde_json::from_str::<PolicyChanges>(r#"{"endpoints": [], "selectors": 1}"#).is_err());
        assert!(serde_json::from_str::<PolicyRule>(r#"{"action": "allow", "policy": "p", "cidr": "0.0.0.0/0"}"#).is_err());
    }

    #[test]
    fn a_thousand_policies_applied_and_removed_leave_nothing_behind() {
        let s = store();
        let eps: Vec<PolicyEndpoint> = (0..1000u32)
            .map(|i| {
                let mut e = ep(&format!("ns/p{i}"), &format!("10.2.{}.{}", i / 250, i % 250 + 1), isolated(vec![allow(Some(vec![i]), vec![])]));
                e.ingress.isolated_by = Some(format!("NetworkPolicy/ns/np{i}"));
                e.ingress.allow[0].policy = format!("NetworkPolicy/ns/np{i}");
                e
            })
            .collect();
        let names: Vec<String> = eps.iter().map(|e| e.name.clone()).collect();
        let st = s.apply(PolicyChanges { endpoints: eps, ..Default::default() }).unwrap();
        assert_eq!((st.endpoints, st.enforced, st.denied_by_policy.len()), (1000, 1000, 1000));
        let st = s.apply(PolicyChanges { endpoints_removed: names, ..Default::default() }).unwrap();
        assert_eq!((st.endpoints, st.enforced), (0, 0));
        assert!(st.denied_by_policy.is_empty() && st.denied_by_endpoint.is_empty(), "counters of what is gone go too");
        assert!(!s.control.policy().active);
    }
}
