//! Authorization by workload identity: Istio's `security.istio.io/v1` AuthorizationPolicy, the
//! part a node proxy can enforce on a connection (no HTTP): who the client is (principal,
//! namespace, service account, address) and which port it connects to. Enforced on the
//! receiving node.
//!
//! Chosen because it is what mesh users already write (Istio's ambient mode enforces the same
//! subset in its node proxy), and it states both defaults: a namespace with no ALLOW policy for
//! a workload lets every client in (default allow); an ALLOW policy with no rules (`spec: {}`)
//! lets none in (default deny).
//!
//! Evaluation: a matching DENY policy refuses; else, with no ALLOW policy for the workload, the
//! connection is allowed; else it is allowed only if an ALLOW policy matches. A policy's rules
//! are alternatives; within a rule `from`, `to` and `when` must all match; within each,
//! the entries are alternatives; within an entry every field given must match (an `notX` list
//! means none of). Strings match exactly, by prefix (`abc*`), by suffix (`*abc`) or as present
//! (`*`).
//!
//! Fields only HTTP can judge (methods, paths, hosts, request principals, remote addresses,
//! other `when` keys) make a rule stricter, never looser, as in Istio's node proxy: an ALLOW
//! rule using them never matches; a DENY rule ignores them and applies the rest. Each is named
//! in the policy's warnings. CUSTOM and AUDIT policies and policies bound by `targetRef` are
//! not enforced here (warned).

use super::identity::SpiffeId;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::IpAddr;

#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct SpecIn {
    #[serde(default)]
    selector: Option<SelectorIn>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    rules: Option<Vec<RuleIn>>,
    #[serde(default)]
    target_ref: Option<serde_json::Value>,
    #[serde(default)]
    target_refs: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct SelectorIn {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default, Debug)]
struct RuleIn {
    #[serde(default)]
    from: Vec<FromIn>,
    #[serde(default)]
    to: Vec<ToIn>,
    #[serde(default)]
    when: Vec<ConditionIn>,
}

#[derive(Deserialize, Default, Debug)]
struct FromIn {
    #[serde(default)]
    source: SourceIn,
}

#[derive(Deserialize, Default, Debug)]
struct ToIn {
    #[serde(default)]
    operation: OperationIn,
}

#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct SourceIn {
    #[serde(default)]
    principals: Vec<String>,
    #[serde(default)]
    not_principals: Vec<String>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    not_namespaces: Vec<String>,
    #[serde(default)]
    service_accounts: Vec<String>,
    #[serde(default)]
    not_service_accounts: Vec<String>,
    #[serde(default)]
    ip_blocks: Vec<String>,
    #[serde(default)]
    not_ip_blocks: Vec<String>,
    #[serde(default)]
    request_principals: Vec<String>,
    #[serde(default)]
    not_request_principals: Vec<String>,
    #[serde(default)]
    remote_ip_blocks: Vec<String>,
    #[serde(default)]
    not_remote_ip_blocks: Vec<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct OperationIn {
    #[serde(default)]
    ports: Vec<String>,
    #[serde(default)]
    not_ports: Vec<String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    not_hosts: Vec<String>,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    not_methods: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    not_paths: Vec<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct ConditionIn {
    key: String,
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    not_values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// A string pattern: exact, prefix (`abc*`), suffix (`*abc`) or any (`*`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pattern(String);

impl Pattern {
    fn matches(&self, s: &str) -> bool {
        let p = self.0.as_str();
        if p == "*" {
            true
        } else if let Some(prefix) = p.strip_suffix('*') {
            s.starts_with(prefix)
        } else if let Some(suffix) = p.strip_prefix('*') {
            s.ends_with(suffix)
        } else {
            s == p
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    fn parse(s: &str) -> Option<Cidr> {
        let (a, l) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            Some(l) => l.parse::<u8>().ok().filter(|&n| n <= max)?,
            None => max,
        };
        Some(Cidr { addr, len })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => self.len == 0 || (u32::from(n) ^ u32::from(a)) >> (32 - self.len as u32) == 0,
            (IpAddr::V6(n), IpAddr::V6(a)) => self.len == 0 || (u128::from(n) ^ u128::from(a)) >> (128 - self.len as u32) == 0,
            _ => false,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Source {
    principals: Vec<Pattern>,
    not_principals: Vec<Pattern>,
    namespaces: Vec<Pattern>,
    not_namespaces: Vec<Pattern>,
    accounts: Vec<(String, String)>,
    not_accounts: Vec<(String, String)>,
    ip_blocks: Vec<Cidr>,
    not_ip_blocks: Vec<Cidr>,
}

#[derive(Clone, Debug, Default)]
struct Operation {
    ports: Vec<u16>,
    not_ports: Vec<u16>,
}

#[derive(Clone, Debug)]
enum Key {
    SourceIp,
    SourceNamespace,
    SourcePrincipal,
    DestinationIp,
    DestinationPort,
}

#[derive(Clone, Debug)]
struct Condition {
    key: Key,
    values: Vec<String>,
    not_values: Vec<String>,
}

#[derive(Clone, Debug, Default)]
struct Rule {
    from: Vec<Source>,
    to: Vec<Operation>,
    when: Vec<Condition>,
}

/// One AuthorizationPolicy, compiled.
#[derive(Clone, Debug)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub action: Action,
    selector: Option<BTreeMap<String, String>>,
    rules: Vec<Rule>,
    /// What of the policy is not enforced here, and how that makes it stricter.
    pub warnings: Vec<String>,
}

/// A connection as the receiving node sees it.
pub struct Request<'a> {
    /// The client's identity (None: plain text, no certificate).
    pub source: Option<&'a SpiffeId>,
    pub source_ip: IpAddr,
    pub dest_ip: IpAddr,
    pub dest_port: u16,
    pub dest_namespace: &'a str,
    pub dest_labels: &'a BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused, and why (the policy that denied, or that no ALLOW policy matched).
    Deny(String),
}

fn pats(v: &[String]) -> Vec<Pattern> {
    v.iter().map(|s| Pattern(s.strip_prefix("spiffe://").unwrap_or(s).to_string())).collect()
}

impl Policy {
    /// Compiles a policy's `spec` (JSON as the API server holds it). Errors name the field;
    /// `Ok(None)` is a policy this proxy does not enforce (CUSTOM, AUDIT, `targetRef`), with why.
    pub fn compile(namespace: &str, name: &str, spec: &serde_json::Value) -> Result<Result<Policy, String>, String> {
        let s: SpecIn = serde_json::from_value(spec.clone()).map_err(|e| format!("{namespace}/{name}: spec: {e}"))?;
        let action = match s.action.as_deref().unwrap_or("ALLOW") {
            "ALLOW" => Action::Allow,
            "DENY" => Action::Deny,
            a @ ("CUSTOM" | "AUDIT") => return Ok(Err(format!("{namespace}/{name}: action {a} is not enforced by the node proxy"))),
            a => return Err(format!("{namespace}/{name}: spec.action: '{a}' is not ALLOW, DENY, AUDIT or CUSTOM")),
        };
        if s.target_ref.is_some() || s.target_refs.as_ref().is_some_and(|v| !v.is_empty()) {
            return Ok(Err(format!("{namespace}/{name}: policies bound by targetRef apply to waypoints and gateways, not the node proxy")));
        }
        let mut warnings = Vec::new();
        let mut rules = Vec::new();
        for (i, r) in s.rules.unwrap_or_default().into_iter().enumerate() {
            let field = format!("spec.rules[{i}]");
            let mut l7 = Vec::new();
            let mut from = Vec::new();
            for (j, f) in r.from.into_iter().enumerate() {
                let src = f.source;
                for (what, v) in [
                    ("requestPrincipals", &src.request_principals),
                    ("notRequestPrincipals", &src.not_request_principals),
                    ("remoteIpBlocks", &src.remote_ip_blocks),
                    ("notRemoteIpBlocks", &src.not_remote_ip_blocks),
                ] {
                    if !v.is_empty() {
                        l7.push(format!("{field}.from[{j}].source.{what}"));
                    }
                }
                let cidrs = |v: &[String], what: &str| -> Result<Vec<Cidr>, String> {
                    v.iter().map(|c| Cidr::parse(c).ok_or_else(|| format!("{namespace}/{name}: {field}.from[{j}].source.{what}: '{c}' is not an address or CIDR"))).collect()
                };
                let accounts = |v: &[String], what: &str| -> Result<Vec<(String, String)>, String> {
                    v.iter()
                        .map(|a| match a.split_once('/') {
                            Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => Ok((ns.to_string(), sa.to_string())),
                            None if !a.is_empty() => Ok((namespace.to_string(), a.clone())),
                            _ => Err(format!("{namespace}/{name}: {field}.from[{j}].source.{what}: '{a}' is not <account> or <namespace>/<account>")),
                        })
                        .collect()
                };
                from.push(Source {
                    principals: pats(&src.principals),
                    not_principals: pats(&src.not_principals),
                    namespaces: pats(&src.namespaces),
                    not_namespaces: pats(&src.not_namespaces),
                    accounts: accounts(&src.service_accounts, "serviceAccounts")?,
                    not_accounts: accounts(&src.not_service_accounts, "notServiceAccounts")?,
                    ip_blocks: cidrs(&src.ip_blocks, "ipBlocks")?,
                    not_ip_blocks: cidrs(&src.not_ip_blocks, "notIpBlocks")?,
                });
            }
            let mut to = Vec::new();
            for (j, t) in r.to.into_iter().enumerate() {
                let op = t.operation;
                for (what, v) in [
                    ("hosts", &op.hosts),
                    ("notHosts", &op.not_hosts),
                    ("methods", &op.methods),
                    ("notMethods", &op.not_methods),
                    ("paths", &op.paths),
                    ("notPaths", &op.not_paths),
                ] {
                    if !v.is_empty() {
                        l7.push(format!("{field}.to[{j}].operation.{what}"));
                    }
                }
                let ports = |v: &[String], what: &str| -> Result<Vec<u16>, String> {
                    v.iter()
                        .map(|p| {
                            p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("{namespace}/{name}: {field}.to[{j}].operation.{what}: '{p}' is not a port (1-65535)"))
                        })
                        .collect()
                };
                to.push(Operation { ports: ports(&op.ports, "ports")?, not_ports: ports(&op.not_ports, "notPorts")? });
            }
            let mut when = Vec::new();
            for (j, c) in r.when.into_iter().enumerate() {
                let key = match c.key.as_str() {
                    "source.ip" => Key::SourceIp,
                    "source.namespace" => Key::SourceNamespace,
                    "source.principal" => Key::SourcePrincipal,
                    "destination.ip" => Key::DestinationIp,
                    "destination.port" => Key::DestinationPort,
                    _ => {
                        l7.push(format!("{field}.when[{j}] ({})", c.key));
                        continue;
                    }
                };
                if matches!(key, Key::SourceIp | Key::DestinationIp) {
                    if let Some(bad) = c.values.iter().chain(&c.not_values).find(|v| Cidr::parse(v).is_none()) {
                        return Err(format!("{namespace}/{name}: {field}.when[{j}]: '{bad}' is not an address or CIDR"));
                    }
                }
                when.push(Condition { key, values: c.values, not_values: c.not_values });
            }
            if !l7.is_empty() {
                match action {
                    Action::Allow => {
                        warnings.push(format!("{} need HTTP: this ALLOW rule never matches", l7.join(", ")));
                        continue;
                    }
                    Action::Deny => warnings.push(format!("{} need HTTP: ignored, the rest of this DENY rule applies", l7.join(", "))),
                }
            }
            rules.push(Rule { from, to, when });
        }
        let selector = s.selector.map(|s| s.match_labels).filter(|m| !m.is_empty());
        Ok(Ok(Policy { namespace: namespace.into(), name: name.into(), action, selector, rules, warnings }))
    }

    fn applies_to(&self, ns: &str, labels: &BTreeMap<String, String>, root: &str) -> bool {
        (self.namespace == ns || self.namespace == root) && self.selector.as_ref().is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }

    fn matches(&self, r: &Request) -> bool {
        self.rules.iter().any(|rule| rule.matches(r))
    }
}

fn any_or(v: &[Pattern], s: Option<&str>) -> bool {
    v.is_empty() || s.is_some_and(|s| v.iter().any(|p| p.matches(s)))
}

fn none_of(v: &[Pattern], s: Option<&str>) -> bool {
    s.is_none_or(|s| !v.iter().any(|p| p.matches(s)))
}

impl Source {
    fn matches(&self, r: &Request) -> bool {
        let principal = r.source.map(SpiffeId::principal);
        let ns = r.source.map(SpiffeId::namespace);
        let account = r.source.map(|s| (s.namespace().to_string(), s.account().to_string()));
        any_or(&self.principals, principal.as_deref())
            && none_of(&self.not_principals, principal.as_deref())
            && any_or(&self.namespaces, ns)
            && none_of(&self.not_namespaces, ns)
            && (self.accounts.is_empty() || account.as_ref().is_some_and(|a| self.accounts.contains(a)))
            && account.as_ref().is_none_or(|a| !self.not_accounts.contains(a))
            && (self.ip_blocks.is_empty() || self.ip_blocks.iter().any(|c| c.contains(r.source_ip)))
            && !self.not_ip_blocks.iter().any(|c| c.contains(r.source_ip))
    }
}

impl Condition {
    fn matches(&self, r: &Request) -> bool {
        let one = |v: &str| -> bool {
            match self.key {
                Key::SourceIp => Cidr::parse(v).is_some_and(|c| c.contains(r.source_ip)),
                Key::DestinationIp => Cidr::parse(v).is_some_and(|c| c.contains(r.dest_ip)),
                Key::DestinationPort => v.parse::<u16>().ok() == Some(r.dest_port),
                Key::SourceNamespace => r.source.is_some_and(|s| Pattern(v.into()).matches(s.namespace())),
                Key::SourcePrincipal => r.source.is_some_and(|s| Pattern(v.strip_prefix("spiffe://").unwrap_or(v).into()).matches(&s.principal())),
            }
        };
        (self.values.is_empty() || self.values.iter().any(|v| one(v))) && !self.not_values.iter().any(|v| one(v))
    }
}

impl Rule {
    fn matches(&self, r: &Request) -> bool {
        (self.from.is_empty() || self.from.iter().any(|s| s.matches(r)))
            && (self.to.is_empty() || self.to.iter().any(|o| (o.ports.is_empty() || o.ports.contains(&r.dest_port)) && !o.not_ports.contains(&r.dest_port)))
            && self.when.iter().all(|c| c.matches(r))
    }
}

/// Every policy a node enforces.
#[derive(Clone, Debug, Default)]
pub struct Authz {
    /// Policies here apply in every namespace (Istio's root namespace).
    pub root_namespace: String,
    pub policies: Vec<Policy>,
}

impl Authz {
    pub fn new(root_namespace: &str, policies: Vec<Policy>) -> Authz {
        Authz { root_namespace: root_namespace.into(), policies }
    }

    pub fn check(&self, r: &Request) -> Decision {
        let applicable = || self.policies.iter().filter(|p| p.applies_to(r.dest_namespace, r.dest_labels, &self.root_namespace));
        if let Some(p) = applicable().find(|p| p.action == Action::Deny && p.matches(r)) {
            return Decision::Deny(format!("DENY policy {}/{}", p.namespace, p.name));
        }
        let mut allows = applicable().filter(|p| p.action == Action::Allow).peekable();
        if allows.peek().is_none() {
            return Decision::Allow;
        }
        if allows.any(|p| p.matches(r)) {
            Decision::Allow
        } else {
            Decision::Deny("no ALLOW policy matches".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(ns: &str, name: &str, spec: serde_json::Value) -> Policy {
        Policy::compile(ns, name, &spec).unwrap().unwrap()
    }

    fn req<'a>(src: Option<&'a SpiffeId>, port: u16, ns: &'a str, labels: &'a BTreeMap<String, String>) -> Request<'a> {
        Request { source: src, source_ip: "10.244.1.7".parse().unwrap(), dest_ip: "10.244.2.9".parse().unwrap(), dest_port: port, dest_namespace: ns, dest_labels: labels }
    }

    #[test]
    fn deny_first_then_allow_and_no_allow_policy_means_allowed() {
        let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().unwrap();
        let batch: SpiffeId = "spiffe://cluster.local/ns/jobs/sa/batch".parse().unwrap();
        let db = BTreeMap::from([("app".to_string(), "db".to_string())]);
        let other = BTreeMap::new();
        let none = Authz::new("istio-system", vec![]);
        assert_eq!(none.check(&req(Some(&web), 5432, "shop", &db)), Decision::Allow);
        let a = Authz::new(
            "istio-system",
            vec![
                policy(
                    "shop",
                    "db-from-web",
                    json!({"selector": {"matchLabels": {"app": "db"}}, "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/web"]}}], "to": [{"operation": {"ports": ["5432"]}}]}]}),
                ),
                policy("shop", "no-jobs", json!({"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["jobs"]}}]}]})),
            ],
        );
        assert_eq!(a.check(&req(Some(&web), 5432, "shop", &db)), Decision::Allow);
        assert_eq!(a.check(&req(Some(&web), 22, "shop", &db)), Decision::Deny("no ALLOW policy matches".into()));
        assert_eq!(a.check(&req(None, 5432, "shop", &db)), Decision::Deny("no ALLOW policy matches".into()), "plain text has no principal");
        assert_eq!(a.check(&req(Some(&batch), 5432, "shop", &db)), Decision::Deny("DENY policy shop/no-jobs".into()));
        // A workload the ALLOW policy does not select: only the DENY applies.
        assert_eq!(a.check(&req(Some(&web), 22, "shop", &other)), Decision::Allow);
        assert_eq!(a.check(&req(Some(&batch), 22, "shop", &other)), Decision::Deny("DENY policy shop/no-jobs".into()));
        // Another namespace: none of these apply.
        assert_eq!(a.check(&req(Some(&batch), 22, "jobs", &db)), Decision::Allow);
    }

    #[test]
    fn default_deny_per_namespace_and_root_namespace_policies() {
        let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().unwrap();
        let l = BTreeMap::new();
        let a = Authz::new("istio-system", vec![policy("shop", "allow-nothing", json!({}))]);
        assert!(matches!(a.check(&req(Some(&web), 80, "shop", &l)), Decision::Deny(_)));
        assert_eq!(a.check(&req(Some(&web), 80, "blog", &l)), Decision::Allow);
        let a = Authz::new("istio-system", vec![policy("istio-system", "deny-22", json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["22"]}}]}]}))]);
        assert!(matches!(a.check(&req(Some(&web), 22, "blog", &l)), Decision::Deny(_)));
        assert_eq!(a.check(&req(Some(&web), 80, "blog", &l)), Decision::Allow);
        // An empty rule matches every connection (allow-all).
        let a = Authz::new("istio-system", vec![policy("shop", "allow-all", json!({"rules": [{}]}))]);
        assert_eq!(a.check(&req(None, 80, "shop", &l)), Decision::Allow);
    }

    #[test]
    fn every_source_field_and_condition_and_pattern() {
        let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().unwrap();
        let l = BTreeMap::new();
        let allowed = |spec: serde_json::Value, src: Option<&SpiffeId>| Authz::new("root", vec![policy("shop", "p", spec)]).check(&req(src, 8080, "shop", &l)) == Decision::Allow;
        let src = |s: serde_json::Value| json!({"rules": [{"from": [{"source": s}]}]});
        assert!(allowed(src(json!({"principals": ["*/sa/web"]})), Some(&web)));
        assert!(allowed(src(json!({"principals": ["spiffe://cluster.local/ns/shop/*"]})), Some(&web)));
        assert!(allowed(src(json!({"principals": ["*"]})), Some(&web)));
        assert!(!allowed(src(json!({"principals": ["*"]})), None));
        assert!(!allowed(src(json!({"notPrincipals": ["cluster.local/ns/shop/sa/web"]})), Some(&web)));
        assert!(allowed(src(json!({"notPrincipals": ["cluster.local/ns/shop/sa/web"]})), None));
        assert!(allowed(src(json!({"namespaces": ["sh*"]})), Some(&web)));
        assert!(!allowed(src(json!({"notNamespaces": ["shop"]})), Some(&web)));
        assert!(allowed(src(json!({"serviceAccounts": ["web"]})), Some(&web)));
        assert!(allowed(src(json!({"serviceAccounts": ["shop/web"]})), Some(&web)));
        assert!(!allowed(src(json!({"serviceAccounts": ["blog/web"]})), Some(&web)));
        assert!(!allowed(src(json!({"notServiceAccounts": ["web"]})), Some(&web)));
        assert!(allowed(src(json!({"ipBlocks": ["10.244.1.0/24"]})), None));
        assert!(!allowed(src(json!({"ipBlocks": ["10.244.2.0/24"]})), None));
        assert!(!allowed(src(json!({"notIpBlocks": ["10.0.0.0/8"]})), None));
        // Two fields in one source: both must hold.
        assert!(!allowed(src(json!({"namespaces": ["shop"], "ipBlocks": ["192.168.0.0/16"]})), Some(&web)));
        let when = |c: serde_json::Value| json!({"rules": [{"when": [c]}]});
        assert!(allowed(when(json!({"key": "destination.port", "values": ["8080"]})), None));
        assert!(!allowed(when(json!({"key": "destination.port", "notValues": ["8080"]})), None));
        assert!(allowed(when(json!({"key": "source.ip", "values": ["10.244.1.7"]})), None));
        assert!(allowed(when(json!({"key": "destination.ip", "values": ["10.244.0.0/16"]})), None));
        assert!(allowed(when(json!({"key": "source.namespace", "values": ["shop"]})), Some(&web)));
        assert!(!allowed(when(json!({"key": "source.namespace", "values": ["shop"]})), None));
        assert!(allowed(when(json!({"key": "source.principal", "values": ["cluster.local/ns/shop/sa/web"]})), Some(&web)));
        assert!(allowed(json!({"rules": [{"to": [{"operation": {"notPorts": ["22"]}}]}]}), None));
    }

    #[test]
    fn http_only_fields_make_rules_stricter_and_bad_policies_say_where() {
        let l = BTreeMap::new();
        let p = policy("shop", "get-only", json!({"rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}));
        assert!(p.warnings[0].contains("spec.rules[0].to[0].operation.methods") && p.warnings[0].contains("never matches"), "{:?}", p.warnings);
        assert!(matches!(Authz::new("root", vec![p]).check(&req(None, 80, "shop", &l)), Decision::Deny(_)));
        let p = policy(
            "shop",
            "no-delete",
            json!({"action": "DENY", "rules": [{"to": [{"operation": {"methods": ["DELETE"], "ports": ["80"]}}], "when": [{"key": "request.headers[x]", "values": ["1"]}]}]}),
        );
        assert!(p.warnings[0].contains("ignored"), "{:?}", p.warnings);
        let a = Authz::new("root", vec![p]);
        assert!(matches!(a.check(&req(None, 80, "shop", &l)), Decision::Deny(_)));
        assert_eq!(a.check(&req(None, 81, "shop", &l)), Decision::Allow);
        assert!(Policy::compile("shop", "c", &json!({"action": "CUSTOM", "provider": {"name": "x"}})).unwrap().is_err());
        assert!(Policy::compile("shop", "t", &json!({"targetRefs": [{"kind": "Service", "name": "x"}]})).unwrap().is_err());
        for (spec, want) in [
            (json!({"action": "MAYBE"}), "spec.action"),
            (json!({"rules": [{"to": [{"operation": {"ports": ["http"]}}]}]}), "spec.rules[0].to[0].operation.ports: 'http'"),
            (json!({"rules": [{"to": [{"operation": {"ports": ["0"]}}]}]}), "is not a port"),
            (json!({"rules": [{"from": [{"source": {"ipBlocks": ["10.0.0.0/33"]}}]}]}), "ipBlocks: '10.0.0.0/33'"),
            (json!({"rules": [{"from": [{"source": {"serviceAccounts": ["a/b/c"]}}]}]}), "serviceAccounts: 'a/b/c'"),
            (json!({"rules": [{"when": [{"key": "source.ip", "values": ["nope"]}]}]}), "when[0]: 'nope'"),
            (json!({"rules": "all"}), "spec:"),
        ] {
            let e = Policy::compile("shop", "bad", &spec).unwrap_err();
            assert!(e.contains(want) && e.starts_with("shop/bad"), "{e} lacks {want}");
        }
    }
}
