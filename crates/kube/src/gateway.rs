//! Gateway API objects → the proxy's routes, listeners and clusters, and the status conditions
//! the specification asks for: pure (objects in, text and conditions out), so it is tested
//! without a cluster.
//!
//! The proxy matches the first route in order, so the routes are sorted as the specification
//! ranks them: the most specific host first (exact, then longer wildcards), then exact paths,
//! longer path prefixes, more header matches, the older route, its name, the rule's order.
//! Each host ends with a 404 of its own, so that a request for a host with routes never falls
//! through to a less specific host's (a virtual host, as other implementations make one).

use crate::gateway_types::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

pub const HTTP_ROUTE: &str = "HTTPRoute";
pub const GRPC_ROUTE: &str = "GRPCRoute";

/// A condition (the writer adds `lastTransitionTime` and `observedGeneration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

fn cond(type_: &'static str, status: bool, reason: &str, message: impl Into<String>) -> Cond {
    Cond { type_, status, reason: reason.into(), message: message.into() }
}

/// A Gateway of one of this controller's classes, with the address the L4 tier gave it.
pub struct GatewayIn<'a> {
    pub gw: &'a Gateway,
    /// namespace/name.
    pub key: String,
    /// Its address (from the address pools), or why it has none.
    pub address: Result<IpAddr, String>,
}

/// An HTTPRoute or a GRPCRoute.
pub struct RouteIn<'a> {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// creationTimestamp (RFC 3339 sorts as text).
    pub created: String,
    pub parent_refs: &'a [ObjectRef],
    pub hostnames: &'a [String],
    /// Its rules in the proxy's terms, or why they cannot be served.
    pub rules: Result<Vec<Rule>, String>,
}

/// A rule in the proxy's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub request_headers: Option<HeaderModifier>,
    pub response_headers: Option<HeaderModifier>,
    pub backends: Vec<BackendRef>,
    /// Seconds to the response's head.
    pub timeout: Option<f64>,
    /// A RequestRedirect filter: the rule answers with a redirect instead of forwarding.
    pub redirect: Option<RedirectSpec>,
}

/// A RequestRedirect filter as checked; its scheme and port are settled per listener.
#[derive(Debug, Clone, PartialEq)]
pub struct RedirectSpec {
    pub status: u16,
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// (true: the whole path, false: the matched prefix) → replacement.
    pub path: Option<(bool, String)>,
}

/// A redirect as the proxy takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyRedirect {
    pub status: u16,
    pub scheme: String,
    pub host: Option<String>,
    pub port: u16,
    pub path: Option<(bool, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub path: PathKind,
    /// (lower-case name, value)
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathKind {
    Exact(String),
    Segments(String),
}

/// What the routes reach: Services, their ready endpoints, Secrets, namespaces.
#[derive(Default)]
pub struct World {
    /// namespace/name → the Service's ports (TCP).
    pub services: BTreeMap<String, Vec<u16>>,
    /// (namespace/name, Service port) → ready endpoints (address and target port).
    pub endpoints: BTreeMap<(String, u16), Vec<SocketAddr>>,
    /// namespace/name → the Secret's certificate chain and key (PEM), or why it cannot serve.
    pub secrets: BTreeMap<String, Result<(String, String), String>>,
    /// namespace → its labels (listeners' `allowedRoutes.namespaces.from: Selector`).
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// (Gateway namespace/name, listener port) → the proxy's port for it.
    pub proxy_ports: BTreeMap<(String, u16), u16>,
    /// ReferenceGrants: (their namespace, what they allow).
    pub grants: Vec<(String, ReferenceGrantSpec)>,
    /// namespace/name → the Service's ports that carry HTTP (by `appProtocol`, else by name, as
    /// Istio selects them): the ports a route with the Service as parent applies to.
    pub http_ports: BTreeMap<String, BTreeSet<u16>>,
    /// Whether routes with a Service as parent (the Gateway API for meshes) are ours.
    pub mesh: bool,
}

impl World {
    /// Whether a ReferenceGrant in `to_ns` lets a `from_kind` (of the Gateway API's group) in
    /// `from_ns` refer to the core-group `to_kind` named `to_name` there. A reference within one
    /// namespace needs none.
    pub fn granted(&self, from_kind: &str, from_ns: &str, to_kind: &str, to_ns: &str, to_name: &str) -> bool {
        from_ns == to_ns
            || self.grants.iter().any(|(ns, g)| {
                ns == to_ns
                    && g.from.iter().any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns)
                    && g.to.iter().any(|t| t.group.is_empty() && t.kind == to_kind && t.name.as_deref().is_none_or(|n| n == to_name))
            })
    }
}

/// A proxy listener: one per Gateway and port.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyListener {
    pub name: String,
    pub port: u16,
    /// HTTPS: (certificate chain, key) of each listener on the port; the first is the default.
    pub certificates: Vec<(String, String)>,
}

/// A route's conditions for one of its parent references.
pub type ParentStatus = (ObjectRef, Vec<Cond>);

/// A weighted split: (cluster name, or the status its share answers; weight).
pub type Split = Vec<(Result<String, u16>, u32)>;

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Split(Split),
    Respond(u16),
    Redirect(ProxyRedirect),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProxyRoute {
    pub listener: String,
    pub host: Option<String>,
    pub path: PathKind,
    pub headers: Vec<(String, String)>,
    pub action: Action,
    pub request_headers: Option<HeaderModifier>,
    pub response_headers: Option<HeaderModifier>,
    pub timeout: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerStatus {
    pub name: String,
    pub supported_kinds: Vec<&'static str>,
    pub attached_routes: i32,
    pub conditions: Vec<Cond>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GatewayStatus {
    pub address: Option<IpAddr>,
    pub conditions: Vec<Cond>,
    pub listeners: Vec<ListenerStatus>,
}

/// Everything a round produces.
#[derive(Debug, Default)]
pub struct Out {
    pub listeners: Vec<ProxyListener>,
    pub routes: Vec<ProxyRoute>,
    /// name → (endpoints, HTTP/2 to them)
    pub clusters: BTreeMap<String, (Vec<SocketAddr>, bool)>,
    pub gateways: BTreeMap<String, GatewayStatus>,
    /// (kind, namespace/name) → per parent reference: its conditions.
    pub route_status: BTreeMap<(&'static str, String), Vec<ParentStatus>>,
    /// Gateway → (listener port, proxy port) the L4 tier forwards.
    pub l4: BTreeMap<String, Vec<(u16, u16)>>,
    /// Service (namespace/name) with routes → (its port, the proxy port): the cluster IP's
    /// port goes to the proxies instead of the endpoints.
    pub mesh: BTreeMap<String, BTreeMap<u16, u16>>,
}

/// One Gateway listener as checked.
struct Checked {
    name: String,
    port: u16,
    hostname: Option<String>,
    https: bool,
    kinds: Vec<&'static str>,
    from: From,
    /// Routes attach to it (and count in its `attachedRoutes`): Accepted, not Conflicted, with
    /// a route kind it takes, even while a reference of its own is unresolved.
    attachable: bool,
    /// It is served: attachable, its references resolved, programmed on the proxies.
    usable: bool,
}

enum From {
    Same,
    All,
    Labels(BTreeMap<String, String>),
    Nothing,
}

/// The key of a Service's ports among the proxy ports (beside the Gateways' `namespace/name`).
pub fn mesh_port_key(svc: &str) -> String {
    format!("svc:{svc}")
}

/// Whether a parent reference is a Service (the Gateway API for meshes, GAMMA).
pub fn is_service_parent(pr: &ObjectRef) -> bool {
    pr.group.as_deref() == Some("") && pr.kind.as_deref() == Some("Service")
}

/// The Service ports a route with Service parents applies to: (namespace/name, port) for each
/// of its producer parents (in its own namespace) that exist; a parent's port if it names one,
/// else every HTTP port of the Service.
pub fn mesh_targets(r: &RouteIn<'_>, w: &World) -> Result<BTreeSet<(String, u16)>, (&'static str, String)> {
    let mut out = BTreeSet::new();
    for pr in r.parent_refs.iter().filter(|p| is_service_parent(p)) {
        out.extend(mesh_parent(r, pr, w)?);
    }
    Ok(out)
}

fn mesh_parent(r: &RouteIn<'_>, pr: &ObjectRef, w: &World) -> Result<Vec<(String, u16)>, (&'static str, String)> {
    let ns = pr.namespace.as_deref().unwrap_or(&r.namespace);
    if ns != r.namespace {
        return Err(("UnsupportedValue", format!("Service {ns}/{} is in another namespace: routes for a mesh's consumers are not supported", pr.name)));
    }
    let key = format!("{ns}/{}", pr.name);
    let Some(ports) = w.services.get(&key) else {
        return Err(("NoMatchingParent", format!("Service {key} does not exist")));
    };
    match pr.port.map(|p| u16::try_from(p).unwrap_or(0)) {
        Some(p) if ports.contains(&p) => Ok(vec![(key, p)]),
        Some(p) => Err(("NoMatchingParent", format!("Service {key} has no port {p}"))),
        None => Ok(w.http_ports.get(&key).into_iter().flatten().map(|p| (key.clone(), *p)).collect()),
    }
}

/// Whether a Service port carries HTTP: its `appProtocol`, else its name's prefix (Istio's
/// protocol selection: `http`, `http2`, `grpc`, `h2c`).
pub fn carries_http(app_protocol: Option<&str>, name: Option<&str>) -> bool {
    match app_protocol {
        Some(a) => matches!(a.to_ascii_lowercase().as_str(), "http" | "http2" | "h2c" | "grpc" | "grpc-web" | "kubernetes.io/h2c" | "kubernetes.io/ws"),
        None => {
            let n = name.unwrap_or("").to_ascii_lowercase();
            let prefix = n.split('-').next().unwrap_or("");
            matches!(prefix, "http" | "http2" | "grpc" | "h2c")
        }
    }
}

/// The proxy listener's name for a routed Service port (the Gateway API for meshes): named by
/// its proxy port, so that a port given to another Service's port in the same round keeps its
/// name (the proxy refuses a listener renamed or moved in one reload).
pub fn mesh_listener_name(proxy_port: u16) -> String {
    format!("mesh:{proxy_port}")
}

/// The proxy listener's name for a Gateway's port.
pub fn listener_name(gw: &str, port: u16) -> String {
    format!("gw:{gw}:{port}")
}

pub fn translate(gateways: &[GatewayIn<'_>], routes: &[RouteIn<'_>], w: &World) -> Out {
    let mut out = Out::default();
    let mut checked: BTreeMap<String, Vec<Checked>> = BTreeMap::new();
    for g in gateways {
        let (status, ls, proxy_listeners) = check_gateway(g, w);
        out.l4.insert(g.key.clone(), proxy_listeners.iter().map(|(lp, pl)| (*lp, pl.port)).collect());
        out.listeners.extend(proxy_listeners.into_iter().map(|(_, pl)| pl));
        out.gateways.insert(g.key.clone(), status);
        checked.insert(g.key.clone(), ls);
    }
    // (sort key, route) for every proxy route.
    let mut placed: Vec<(SortKey, ProxyRoute)> = Vec::new();
    for r in routes {
        let route_key = format!("{}/{}", r.namespace, r.name);
        let mut parents = Vec::new();
        for pr in r.parent_refs {
            if w.mesh && is_service_parent(pr) {
                let conds = attach_mesh(r, pr, w, &route_key, &mut out, &mut placed);
                parents.push((pr.clone(), conds));
                continue;
            }
            if pr.group.as_deref().is_some_and(|g| g != GROUP) || pr.kind.as_deref().is_some_and(|k| k != "Gateway") {
                continue;
            }
            let gw_key = format!("{}/{}", pr.namespace.as_deref().unwrap_or(&r.namespace), pr.name);
            let Some(ls) = checked.get(&gw_key) else { continue };
            let gw_ns = gw_key.split('/').next().unwrap_or_default();
            let conds = attach(r, pr, gw_ns, ls, w, &route_key, &mut out, &mut placed, &gw_key);
            parents.push((pr.clone(), conds));
        }
        if !parents.is_empty() {
            out.route_status.insert((r.kind, route_key), parents);
        }
    }
    // The specification's precedence, then a 404 closing each host.
    placed.sort_by(|a, b| a.0.cmp(&b.0));
    let mut routes_out = Vec::new();
    let mut last: Option<(String, Option<String>)> = None;
    for (_, r) in placed {
        let here = (r.listener.clone(), r.host.clone());
        if last.as_ref().is_some_and(|l| l != &here) {
            close_host(last.take().unwrap_or_default(), &mut routes_out);
        }
        last = Some(here);
        routes_out.push(r);
    }
    if let Some(l) = last {
        close_host(l, &mut routes_out);
    }
    out.routes = routes_out;
    out
}

fn close_host((listener, host): (String, Option<String>), out: &mut Vec<ProxyRoute>) {
    if host.is_some() {
        out.push(ProxyRoute {
            listener,
            host,
            path: PathKind::Segments("/".into()),
            headers: Vec::new(),
            action: Action::Respond(404),
            request_headers: None,
            response_headers: None,
            timeout: None,
        });
    }
}

/// (listener, host rank, path rank, longer path first, more headers first, created, route,
/// rule, match)
type SortKey = (String, (u8, i64, String), u8, i64, i64, String, String, usize, usize);

fn host_rank(h: &Option<String>) -> (u8, i64, String) {
    match h {
        Some(h) if h.starts_with("*.") => (1, -(h.len() as i64), h.clone()),
        Some(h) => (0, -(h.len() as i64), h.clone()),
        None => (2, 0, String::new()),
    }
}

fn check_gateway(g: &GatewayIn<'_>, w: &World) -> (GatewayStatus, Vec<Checked>, Vec<(u16, ProxyListener)>) {
    let gw = g.gw;
    let ns = gw.metadata.namespace.clone().unwrap_or_default();
    let mut statuses = Vec::new();
    let mut checked = Vec::new();
    // Protocols and hostnames per port, for conflicts.
    let mut by_port: BTreeMap<i32, Vec<&Listener>> = BTreeMap::new();
    for l in &gw.spec.listeners {
        by_port.entry(l.port).or_default().push(l);
    }
    let mut certs_by_port: BTreeMap<u16, Vec<(String, String)>> = BTreeMap::new();
    for l in &gw.spec.listeners {
        let mut conds = Vec::new();
        let port = u16::try_from(l.port).ok().filter(|p| *p > 0);
        let https = l.protocol == "HTTPS";
        let accepted = match (l.protocol.as_str(), port) {
            (_, None) => Err(("PortUnavailable", format!("port {} is not a TCP port", l.port))),
            ("HTTP" | "HTTPS", _) if https && l.tls.as_ref().and_then(|t| t.mode.as_deref()).is_some_and(|m| m != "Terminate") => {
                Err(("UnsupportedProtocol", "HTTPS listeners terminate TLS (mode Terminate)".to_string()))
            }
            ("HTTP" | "HTTPS", _) => Ok(()),
            (p, _) => Err(("UnsupportedProtocol", format!("protocol {p} is not served (HTTP and HTTPS are)"))),
        };
        // Conflicts on the port: another protocol, or the same hostname twice.
        let same_port = by_port.get(&l.port).map(|v| v.as_slice()).unwrap_or_default();
        let conflict = if same_port.iter().any(|o| o.protocol != l.protocol) {
            Some(("ProtocolConflict", format!("port {} carries several protocols", l.port)))
        } else if same_port.iter().take_while(|o| o.name != l.name).any(|o| o.hostname == l.hostname) {
            Some(("HostnameConflict", format!("an earlier listener on port {} has the same hostname", l.port)))
        } else {
            None
        };
        // Kinds of route it takes.
        let mut kinds = Vec::new();
        let mut bad_kind = None;
        match l.allowed_routes.as_ref().map(|a| a.kinds.as_slice()).filter(|k| !k.is_empty()) {
            None => kinds = vec![HTTP_ROUTE, GRPC_ROUTE],
            Some(ks) => {
                for k in ks {
                    match (k.group.as_deref().unwrap_or(GROUP), k.kind.as_str()) {
                        (GROUP, HTTP_ROUTE) => kinds.push(HTTP_ROUTE),
                        (GROUP, GRPC_ROUTE) => kinds.push(GRPC_ROUTE),
                        (g, k) => bad_kind = Some(format!("{g}/{k} is not a route kind this listener can take")),
                    }
                }
            }
        }
        // Certificates.
        let mut cert_problem: Option<(&str, String)> = None;
        let mut certs = Vec::new();
        if https && accepted.is_ok() {
            let refs = l.tls.as_ref().map(|t| t.certificate_refs.as_slice()).unwrap_or_default();
            if refs.is_empty() {
                cert_problem = Some(("InvalidCertificateRef", "an HTTPS listener needs a certificateRef".into()));
            }
            for r in refs {
                let r_ns = r.namespace.clone().unwrap_or_else(|| ns.clone());
                if r.group.as_deref().is_some_and(|g| !g.is_empty()) || r.kind.as_deref().is_some_and(|k| k != "Secret") {
                    cert_problem = Some(("InvalidCertificateRef", format!("{} is not a Secret", r.name)));
                } else if !w.granted("Gateway", &ns, "Secret", &r_ns, &r.name) {
                    cert_problem = Some(("RefNotPermitted", format!("Secret {r_ns}/{} is in another namespace and no ReferenceGrant there allows it", r.name)));
                } else {
                    match w.secrets.get(&format!("{r_ns}/{}", r.name)) {
                        None => cert_problem = Some(("InvalidCertificateRef", format!("Secret {r_ns}/{} does not exist", r.name))),
                        Some(Err(e)) => cert_problem = Some(("InvalidCertificateRef", format!("Secret {r_ns}/{}: {e}", r.name))),
                        Some(Ok(pair)) => certs.push(pair.clone()),
                    }
                }
            }
        }
        let from = match l.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref()) {
            None => From::Same,
            Some(n) => match n.from.as_deref().unwrap_or("Same") {
                "All" => From::All,
                "Selector" => match n.selector.as_ref().map(label_selector) {
                    Some(Some(m)) => From::Labels(m),
                    _ => From::Nothing,
                },
                _ => From::Same,
            },
        };
        match &accepted {
            Ok(()) => conds.push(cond("Accepted", true, "Accepted", "")),
            Err((r, m)) => conds.push(cond("Accepted", false, r, m.clone())),
        }
        match (&cert_problem, &bad_kind) {
            (Some((r, m)), _) => conds.push(cond("ResolvedRefs", false, r, m.clone())),
            (None, Some(m)) => conds.push(cond("ResolvedRefs", false, "InvalidRouteKinds", m.clone())),
            (None, None) => conds.push(cond("ResolvedRefs", true, "ResolvedRefs", "")),
        }
        match &conflict {
            Some((r, m)) => conds.push(cond("Conflicted", true, r, m.clone())),
            None => conds.push(cond("Conflicted", false, "NoConflicts", "")),
        }
        let attachable = accepted.is_ok() && conflict.is_none() && !kinds.is_empty();
        let usable = attachable && cert_problem.is_none();
        let proxy_port = port.and_then(|p| w.proxy_ports.get(&(g.key.clone(), p)).copied());
        let programmed = match (usable, &g.address, proxy_port) {
            (false, _, _) => cond("Programmed", false, "Invalid", "the listener is not valid (see its other conditions)"),
            (true, Err(e), _) => cond("Programmed", false, "Pending", format!("no address: {e}")),
            (true, Ok(_), None) => cond("Programmed", false, "Pending", "no proxy port yet"),
            (true, Ok(_), Some(_)) => cond("Programmed", true, "Programmed", ""),
        };
        let programmed_ok = programmed.status;
        conds.push(programmed);
        if let (true, Some(p)) = (usable, port) {
            certs_by_port.entry(p).or_default().extend(certs);
        }
        statuses.push(ListenerStatus { name: l.name.clone(), supported_kinds: kinds.clone(), attached_routes: 0, conditions: conds });
        checked.push(Checked {
            name: l.name.clone(),
            port: port.unwrap_or(0),
            hostname: l.hostname.clone().map(|h| h.to_ascii_lowercase()),
            https,
            kinds,
            from,
            attachable,
            usable: usable && programmed_ok,
        });
    }
    let mut proxy_listeners = Vec::new();
    let mut seen = BTreeSet::new();
    for c in checked.iter().filter(|c| c.usable) {
        if !seen.insert(c.port) {
            continue;
        }
        if let Some(pp) = w.proxy_ports.get(&(g.key.clone(), c.port)) {
            let certificates = if c.https { certs_by_port.get(&c.port).cloned().unwrap_or_default() } else { Vec::new() };
            proxy_listeners.push((c.port, ProxyListener { name: listener_name(&g.key, c.port), port: *pp, certificates }));
        }
    }
    let any_valid = statuses.iter().any(|s| {
        s.conditions.iter().all(|c| match c.type_ {
            "Accepted" | "ResolvedRefs" => c.status,
            "Conflicted" => !c.status,
            _ => true,
        })
    });
    let mut conds = Vec::new();
    if any_valid || gw.spec.listeners.is_empty() {
        conds.push(cond("Accepted", true, "Accepted", ""));
    } else {
        conds.push(cond("Accepted", false, "ListenersNotValid", "no listener is valid"));
    }
    conds.push(match (&g.address, proxy_listeners.is_empty()) {
        (Err(e), _) => cond("Programmed", false, "AddressNotAssigned", e.clone()),
        (Ok(_), true) => cond("Programmed", false, "Invalid", "no listener can be served"),
        (Ok(_), false) => cond("Programmed", true, "Programmed", ""),
    });
    (GatewayStatus { address: g.address.as_ref().ok().copied(), conditions: conds, listeners: statuses }, checked, proxy_listeners)
}

/// A label selector with `matchLabels` only (`matchExpressions`: None, matched by nothing).
fn label_selector(v: &serde_json::Value) -> Option<BTreeMap<String, String>> {
    if v.get("matchExpressions").and_then(|e| e.as_array()).is_some_and(|a| !a.is_empty()) {
        return None;
    }
    let m = v.get("matchLabels").and_then(|m| m.as_object());
    Some(m.map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect()).unwrap_or_default())
}

/// The hosts a route serves on a listener: the intersection of the listener's hostname and the
/// route's (None: any host); empty when they have none in common.
pub fn hosts(listener: Option<&str>, route: &[String]) -> Vec<Option<String>> {
    let route: Vec<String> = route.iter().map(|h| h.to_ascii_lowercase()).collect();
    match (listener, route.is_empty()) {
        (None, true) => vec![None],
        (None, false) => route.into_iter().map(Some).collect(),
        (Some(l), true) => vec![Some(l.to_string())],
        (Some(l), false) => {
            let mut out = Vec::new();
            for r in route {
                let h = if r == l || wildcard_covers(l, &r) {
                    Some(r)
                } else if wildcard_covers(&r, l) {
                    Some(l.to_string())
                } else {
                    None
                };
                if let Some(h) = h {
                    if !out.contains(&Some(h.clone())) {
                        out.push(Some(h));
                    }
                }
            }
            out
        }
    }
}

/// Whether wildcard `w` (`*.example.com`) covers `h` (a host or a narrower wildcard).
fn wildcard_covers(w: &str, h: &str) -> bool {
    let Some(suffix) = w.strip_prefix("*.") else { return false };
    let h = h.strip_prefix("*.").map(|s| format!("x.{s}")).unwrap_or_else(|| h.to_string());
    h.len() > suffix.len() + 1 && h.ends_with(suffix) && h.as_bytes()[h.len() - suffix.len() - 1] == b'.'
}

#[allow(clippy::too_many_arguments)]
fn attach(
    r: &RouteIn<'_>,
    pr: &ObjectRef,
    gw_ns: &str,
    ls: &[Checked],
    w: &World,
    route_key: &str,
    out: &mut Out,
    placed: &mut Vec<(SortKey, ProxyRoute)>,
    gw_key: &str,
) -> Vec<Cond> {
    let candidates: Vec<(usize, &Checked)> =
        ls.iter().enumerate().filter(|(_, l)| pr.section_name.as_ref().is_none_or(|s| s == &l.name) && pr.port.is_none_or(|p| i32::from(l.port) == p)).collect();
    if candidates.is_empty() {
        return vec![cond("Accepted", false, "NoMatchingParent", "no listener of the Gateway matches the parentRef's sectionName and port"), resolved(r, w).1];
    }
    let allowed: Vec<(usize, &Checked)> = candidates
        .into_iter()
        .filter(|(_, l)| {
            l.kinds.contains(&r.kind)
                && match &l.from {
                    From::Same => r.namespace == gw_ns,
                    From::All => true,
                    From::Labels(m) => w.namespace_labels.get(&r.namespace).is_some_and(|have| m.iter().all(|(k, v)| have.get(k) == Some(v))),
                    From::Nothing => false,
                }
        })
        .collect();
    if allowed.is_empty() {
        return vec![cond("Accepted", false, "NotAllowedByListeners", "no listener of the Gateway allows this route (namespace or kind)"), resolved(r, w).1];
    }
    let with_hosts: Vec<(usize, &Checked, Vec<Option<String>>)> =
        allowed.into_iter().map(|(i, l)| (i, l, hosts(l.hostname.as_deref(), r.hostnames))).filter(|(_, _, h)| !h.is_empty()).collect();
    if with_hosts.is_empty() {
        return vec![cond("Accepted", false, "NoMatchingListenerHostname", "the route's hostnames and the listeners' have none in common"), resolved(r, w).1];
    }
    let rules = match &r.rules {
        Ok(rules) => rules,
        Err(why) => return vec![cond("Accepted", false, "UnsupportedValue", why.clone()), resolved(r, w).1],
    };
    let (targets, resolved_cond) = resolved(r, w);
    for (i, l, hs) in with_hosts {
        if !l.attachable {
            continue;
        }
        if let Some(st) = out.gateways.get_mut(gw_key).and_then(|g| g.listeners.get_mut(i)) {
            st.attached_routes += 1;
        }
        if !l.usable {
            continue;
        }
        let listener = listener_name(gw_key, l.port);
        for host in &hs {
            place_rules(r, rules, &targets, &listener, host, l.https, l.port, w, route_key, out, placed);
        }
    }
    vec![cond("Accepted", true, "Accepted", ""), resolved_cond]
}

/// A route's rules as proxy routes on one listener and host (and the clusters they name).
#[allow(clippy::too_many_arguments)]
fn place_rules(
    r: &RouteIn<'_>,
    rules: &[Rule],
    targets: &[Split],
    listener: &str,
    host: &Option<String>,
    https: bool,
    listener_port: u16,
    w: &World,
    route_key: &str,
    out: &mut Out,
    placed: &mut Vec<(SortKey, ProxyRoute)>,
) {
    for (ri, rule) in rules.iter().enumerate() {
        let action = match (&rule.redirect, &targets[ri]) {
            (Some(rd), _) => {
                // The specification: no scheme → the listener's; no port → the
                // scheme's own port when the scheme is given, else the listener's.
                let scheme = rd.scheme.clone().unwrap_or_else(|| if https { "https".into() } else { "http".into() });
                let port = rd.port.unwrap_or(match rd.scheme.as_deref() {
                    Some("https") => 443,
                    Some(_) => 80,
                    None => listener_port,
                });
                Action::Redirect(ProxyRedirect { status: rd.status, scheme, host: rd.host.clone(), port, path: rd.path.clone() })
            }
            (None, t) if t.is_empty() => Action::Respond(500),
            (None, t) => Action::Split(t.clone()),
        };
        for (cl, (_, eps, h2)) in targets[ri].iter().filter_map(|(t, _)| t.as_ref().ok()).filter_map(|n| w_cluster(w, n, r.kind).map(|c| (n.clone(), c))) {
            out.clusters.insert(cl, (eps, h2));
        }
        let matches = if rule.matches.is_empty() { vec![Match { path: PathKind::Segments("/".into()), headers: Vec::new() }] } else { rule.matches.clone() };
        for (mi, m) in matches.into_iter().enumerate() {
            let (path_rank, path_len) = match &m.path {
                PathKind::Exact(p) => (0u8, p.len() as i64),
                PathKind::Segments(p) => (1u8, p.trim_end_matches('/').len() as i64),
            };
            let key: SortKey = (listener.to_string(), host_rank(host), path_rank, -path_len, -(m.headers.len() as i64), r.created.clone(), route_key.to_string(), ri, mi);
            placed.push((
                key,
                ProxyRoute {
                    listener: listener.to_string(),
                    host: host.clone(),
                    path: m.path,
                    headers: m.headers,
                    action: action.clone(),
                    request_headers: rule.request_headers.clone(),
                    response_headers: rule.response_headers.clone(),
                    timeout: rule.timeout,
                },
            ));
        }
    }
}

/// A route with a Service as parent: a proxy listener per port of the Service it applies to
/// (no host: a Service's clients name it as they like), its rules there, and the port recorded
/// for the L4 tier.
fn attach_mesh(r: &RouteIn<'_>, pr: &ObjectRef, w: &World, route_key: &str, out: &mut Out, placed: &mut Vec<(SortKey, ProxyRoute)>) -> Vec<Cond> {
    let targets = match mesh_parent(r, pr, w) {
        Ok(t) => t,
        Err((reason, why)) => return vec![cond("Accepted", false, reason, why), resolved(r, w).1],
    };
    let rules = match &r.rules {
        Ok(rules) => rules,
        Err(why) => return vec![cond("Accepted", false, "UnsupportedValue", why.clone()), resolved(r, w).1],
    };
    let (splits, resolved_cond) = resolved(r, w);
    for (svc, port) in targets {
        let Some(proxy_port) = w.proxy_ports.get(&(mesh_port_key(&svc), port)).copied() else { continue };
        let listener = mesh_listener_name(proxy_port);
        if !out.listeners.iter().any(|l| l.name == listener) {
            out.listeners.push(ProxyListener { name: listener.clone(), port: proxy_port, certificates: Vec::new() });
        }
        out.mesh.entry(svc.clone()).or_default().insert(port, proxy_port);
        place_rules(r, rules, &splits, &listener, &None, false, port, w, route_key, out, placed);
    }
    vec![cond("Accepted", true, "Accepted", ""), resolved_cond]
}

/// A cluster's endpoints and protocol from its name (`namespace/name:port`, `+h2` for gRPC).
fn w_cluster(w: &World, name: &str, _kind: &str) -> Option<(String, Vec<SocketAddr>, bool)> {
    let (base, h2) = match name.strip_suffix("+h2") {
        Some(b) => (b, true),
        None => (name, false),
    };
    let (svc, port) = base.rsplit_once(':')?;
    let eps = w.endpoints.get(&(svc.to_string(), port.parse().ok()?)).cloned().unwrap_or_default();
    Some((name.to_string(), eps, h2))
}

/// Per rule: its split (cluster name, or a status: 500 unresolved, 503 no endpoint); and the
/// route's ResolvedRefs condition.
fn resolved(r: &RouteIn<'_>, w: &World) -> (Vec<Split>, Cond) {
    let mut problem: Option<(&str, String)> = None;
    let mut per_rule = Vec::new();
    for rule in r.rules.as_deref().unwrap_or_default() {
        let mut split = Vec::new();
        for b in &rule.backends {
            let weight = b.weight.unwrap_or(1).clamp(0, 1_000_000) as u32;
            let t = &b.to;
            let ns = t.namespace.clone().unwrap_or_else(|| r.namespace.clone());
            let target = if t.group.as_deref().is_some_and(|g| !g.is_empty()) || t.kind.as_deref().is_some_and(|k| k != "Service") {
                problem.get_or_insert(("InvalidKind", format!("{} is not a Service", t.name)));
                Err(500)
            } else if !w.granted(r.kind, &r.namespace, "Service", &ns, &t.name) {
                problem.get_or_insert(("RefNotPermitted", format!("Service {ns}/{} is in another namespace and no ReferenceGrant there allows it", t.name)));
                Err(500)
            } else {
                let key = format!("{ns}/{}", t.name);
                match (w.services.get(&key), t.port.and_then(|p| u16::try_from(p).ok())) {
                    (None, _) => {
                        problem.get_or_insert(("BackendNotFound", format!("Service {key} does not exist")));
                        Err(500)
                    }
                    (Some(_), None) => {
                        problem.get_or_insert(("BackendNotFound", format!("the reference to Service {key} has no port")));
                        Err(500)
                    }
                    (Some(ports), Some(p)) if !ports.contains(&p) => {
                        problem.get_or_insert(("BackendNotFound", format!("Service {key} has no port {p}")));
                        Err(500)
                    }
                    (Some(_), Some(p)) => {
                        if w.endpoints.get(&(key.clone(), p)).is_none_or(|e| e.is_empty()) {
                            Err(503)
                        } else {
                            Ok(format!("{key}:{p}{}", if r.kind == GRPC_ROUTE { "+h2" } else { "" }))
                        }
                    }
                }
            };
            split.push((target, weight));
        }
        per_rule.push(split);
    }
    let c = match problem {
        Some((reason, m)) => cond("ResolvedRefs", false, reason, m),
        None => cond("ResolvedRefs", true, "ResolvedRefs", ""),
    };
    (per_rule, c)
}

/// HTTPRoute rules in the proxy's terms, or what it does not support.
pub fn http_rules(rules: &[HttpRule]) -> Result<Vec<Rule>, String> {
    let mut out = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let mut matches = Vec::new();
        for (j, m) in r.matches.iter().enumerate() {
            let at = format!("rules[{i}].matches[{j}]");
            if !m.query_params.is_empty() {
                return Err(format!("{at}.queryParams: query parameter matches are not supported"));
            }
            if m.method.is_some() {
                return Err(format!("{at}.method: method matches are not supported"));
            }
            let (ty, value) = m.path.as_ref().map(|p| (p.type_.as_deref().unwrap_or("PathPrefix"), p.value.as_deref().unwrap_or("/"))).unwrap_or(("PathPrefix", "/"));
            check_path(&format!("{at}.path"), value)?;
            let path = match ty {
                "Exact" => PathKind::Exact(value.to_string()),
                "PathPrefix" => PathKind::Segments(value.to_string()),
                t => return Err(format!("{at}.path: type {t} is not supported")),
            };
            matches.push(Match { path, headers: header_matches(&at, &m.headers)? });
        }
        let (request_headers, response_headers, redirect) = filters(&format!("rules[{i}]"), &r.filters)?;
        if redirect.is_some() && !r.backend_refs.is_empty() {
            return Err(format!("rules[{i}]: a RequestRedirect rule cannot also have backendRefs"));
        }
        if let Some((false, _)) = redirect.as_ref().and_then(|r| r.path.as_ref()) {
            if r.matches.iter().any(|m| m.path.as_ref().is_some_and(|p| p.type_.as_deref() == Some("Exact"))) {
                return Err(format!("rules[{i}]: ReplacePrefixMatch needs PathPrefix matches"));
            }
        }
        let timeout = match &r.timeouts {
            None => None,
            Some(t) => match t.request.as_deref().or(t.backend_request.as_deref()) {
                None => None,
                Some(d) => duration(d).map_err(|e| format!("rules[{i}].timeouts: {e}"))?,
            },
        };
        backend_filters(&format!("rules[{i}]"), &r.backend_refs)?;
        out.push(Rule { matches, request_headers, response_headers, backends: r.backend_refs.clone(), timeout, redirect });
    }
    Ok(out)
}

/// GRPCRoute rules in the proxy's terms (a method is the path `/service/method`).
pub fn grpc_rules(rules: &[GrpcRule]) -> Result<Vec<Rule>, String> {
    let mut out = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let mut matches = Vec::new();
        for (j, m) in r.matches.iter().enumerate() {
            let at = format!("rules[{i}].matches[{j}]");
            let path = match &m.method {
                None => PathKind::Segments("/".into()),
                Some(me) => {
                    if me.type_.as_deref().is_some_and(|t| t != "Exact") {
                        return Err(format!("{at}.method: type {} is not supported", me.type_.as_deref().unwrap_or_default()));
                    }
                    let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_');
                    match (me.service.as_deref(), me.method.as_deref()) {
                        (Some(s), Some(m)) if ok(s) && ok(m) => PathKind::Exact(format!("/{s}/{m}")),
                        (Some(s), None) if ok(s) => PathKind::Segments(format!("/{s}")),
                        (None, Some(_)) => return Err(format!("{at}.method: a method without its service is not supported")),
                        (None, None) => PathKind::Segments("/".into()),
                        _ => return Err(format!("{at}.method: not a gRPC service or method name")),
                    }
                }
            };
            matches.push(Match { path, headers: header_matches(&at, &m.headers)? });
        }
        let (request_headers, response_headers, redirect) = filters(&format!("rules[{i}]"), &r.filters)?;
        if redirect.is_some() {
            return Err(format!("rules[{i}]: RequestRedirect is not a GRPCRoute filter"));
        }
        backend_filters(&format!("rules[{i}]"), &r.backend_refs)?;
        out.push(Rule { matches, request_headers, response_headers, backends: r.backend_refs.clone(), timeout: None, redirect: None });
    }
    Ok(out)
}

fn check_path(at: &str, p: &str) -> Result<(), String> {
    if !p.starts_with('/') || p.len() > 1024 || p.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#') {
        return Err(format!("{at}: '{p}' is not a path the proxy can match"));
    }
    Ok(())
}

fn token(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn value_ok(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

fn header_matches(at: &str, hs: &[HeaderMatch]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (k, h) in hs.iter().enumerate() {
        if h.type_.as_deref().is_some_and(|t| t != "Exact") {
            return Err(format!("{at}.headers[{k}]: type {} is not supported", h.type_.as_deref().unwrap_or_default()));
        }
        if !token(&h.name) || !value_ok(&h.value) {
            return Err(format!("{at}.headers[{k}]: not a header name and value"));
        }
        out.push((h.name.to_ascii_lowercase(), h.value.clone()));
    }
    Ok(out)
}

/// Headers a route may not touch (the proxy's own: hop-by-hop, Host, Content-Length).
const RESERVED: [&str; 10] = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "proxy-authenticate", "host", "content-length"];

fn modifier(at: &str, m: &HeaderModifier) -> Result<HeaderModifier, String> {
    for (k, h) in m.set.iter().chain(&m.add).enumerate() {
        if !token(&h.name) || !value_ok(&h.value) || RESERVED.contains(&h.name.to_ascii_lowercase().as_str()) {
            return Err(format!("{at}: header {k} ('{}') cannot be set by a route", h.name));
        }
    }
    for n in &m.remove {
        if !token(n) || RESERVED.contains(&n.to_ascii_lowercase().as_str()) {
            return Err(format!("{at}: '{n}' cannot be removed by a route"));
        }
    }
    Ok(m.clone())
}

type Filters = (Option<HeaderModifier>, Option<HeaderModifier>, Option<RedirectSpec>);

fn filters(at: &str, fs: &[Filter]) -> Result<Filters, String> {
    let (mut req, mut resp, mut redirect) = (None, None, None);
    for (k, f) in fs.iter().enumerate() {
        let here = format!("{at}.filters[{k}]");
        if f.type_ == "RequestRedirect" {
            match (&f.request_redirect, &redirect) {
                (Some(r), None) => redirect = Some(redirect_spec(&here, r)?),
                _ => return Err(format!("{here}: one RequestRedirect per rule, with its settings")),
            }
            continue;
        }
        match (f.type_.as_str(), &f.request_header_modifier, &f.response_header_modifier) {
            ("RequestHeaderModifier", Some(m), _) if req.is_none() => req = Some(modifier(&here, m)?),
            ("ResponseHeaderModifier", _, Some(m)) if resp.is_none() => resp = Some(modifier(&here, m)?),
            (t @ ("RequestHeaderModifier" | "ResponseHeaderModifier"), _, _) => return Err(format!("{here}: one {t} per rule, with its settings")),
            (t, _, _) => return Err(format!("{here}: filter {t} is not supported")),
        }
    }
    Ok((req, resp, redirect))
}

fn redirect_spec(at: &str, r: &RequestRedirect) -> Result<RedirectSpec, String> {
    let status = match r.status_code.unwrap_or(302) {
        s @ (301 | 302) => s as u16,
        s => return Err(format!("{at}.requestRedirect.statusCode: {s} is not 301 or 302")),
    };
    let scheme = match r.scheme.as_deref() {
        None => None,
        Some(s @ ("http" | "https")) => Some(s.to_string()),
        Some(s) => return Err(format!("{at}.requestRedirect.scheme: '{s}' is not http or https")),
    };
    let host = match r.hostname.as_deref() {
        None => None,
        Some(h) if !h.is_empty() && h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') => Some(h.to_ascii_lowercase()),
        Some(h) => return Err(format!("{at}.requestRedirect.hostname: '{h}' is not a host name")),
    };
    let port = match r.port {
        None => None,
        Some(p) => Some(u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| format!("{at}.requestRedirect.port: {p} is not a port"))?),
    };
    let path = match &r.path {
        None => None,
        Some(p) => {
            let (full, value) = match (p.type_.as_str(), &p.replace_full_path, &p.replace_prefix_match) {
                ("ReplaceFullPath", Some(v), _) => (true, v.clone()),
                ("ReplacePrefixMatch", _, Some(v)) => (false, v.clone()),
                (t, _, _) => return Err(format!("{at}.requestRedirect.path: type {t} without its value")),
            };
            check_path(&format!("{at}.requestRedirect.path"), &value)?;
            Some((full, value))
        }
    };
    Ok(RedirectSpec { status, scheme, host, port, path })
}

fn backend_filters(at: &str, bs: &[BackendRef]) -> Result<(), String> {
    match bs.iter().position(|b| !b.filters.is_empty()) {
        Some(k) => Err(format!("{at}.backendRefs[{k}].filters: filters on a backend are not supported")),
        None => Ok(()),
    }
}

/// A Gateway API duration (`1h2m3s500ms`, up to four parts): seconds, None for `0s`
/// (no timeout); longer than an hour is an hour (the proxy's bound).
pub fn duration(d: &str) -> Result<Option<f64>, String> {
    let mut rest = d;
    let mut total = 0f64;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(format!("'{d}' is not a duration (1h2m3s500ms)"));
        }
        let n: f64 = rest[..digits].parse().map_err(|_| format!("'{d}' is not a duration"))?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else {
            return Err(format!("'{d}' is not a duration (units h, m, s, ms)"));
        };
        rest = &rest[len..];
        total += n * unit;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(format!("'{d}' is not a duration (1h2m3s500ms)"));
    }
    Ok((total > 0.0).then_some(total.min(3600.0)))
}

impl Out {
    /// The proxy's configuration: `base` (workers, admin API, access log: the deployment's),
    /// then the listeners (on `listen`), routes and clusters made here. Deterministic: the
    /// same objects give the same text (the proxy's digest says whether to push it).
    pub fn proxy_toml(&self, base: &str, listen: IpAddr) -> String {
        use toml::Value as V;
        let s = |x: &str| V::String(x.to_string());
        let mut doc = toml::map::Map::new();
        let mut listeners = Vec::new();
        for l in &self.listeners {
            let mut t = toml::map::Map::new();
            t.insert("name".into(), s(&l.name));
            t.insert("address".into(), s(&SocketAddr::new(listen, l.port).to_string()));
            if !l.certificates.is_empty() {
                let certs: Vec<V> = l
                    .certificates
                    .iter()
                    .map(|(c, k)| {
                        let mut m = toml::map::Map::new();
                        m.insert("cert_pem".into(), s(c));
                        m.insert("key_pem".into(), s(k));
                        V::Table(m)
                    })
                    .collect();
                let mut tls = toml::map::Map::new();
                tls.insert("certificates".into(), V::Array(certs));
                t.insert("tls".into(), V::Table(tls));
            }
            listeners.push(V::Table(t));
        }
        let mut routes = Vec::new();
        for r in &self.routes {
            let mut t = toml::map::Map::new();
            t.insert("listeners".into(), V::Array(vec![s(&r.listener)]));
            if let Some(h) = &r.host {
                t.insert("host".into(), s(h));
            }
            match &r.path {
                PathKind::Exact(p) => t.insert("path_exact".into(), s(p)),
                PathKind::Segments(p) => t.insert("path_segments".into(), s(p)),
            };
            if !r.headers.is_empty() {
                let hs = r.headers.iter().map(|(n, v)| header_table(n, v)).collect();
                t.insert("headers".into(), V::Array(hs));
            }
            match &r.action {
                Action::Respond(st) => {
                    let mut m = toml::map::Map::new();
                    m.insert("status".into(), V::Integer((*st).into()));
                    t.insert("respond".into(), V::Table(m));
                }
                Action::Redirect(rd) => {
                    let mut m = toml::map::Map::new();
                    m.insert("status".into(), V::Integer(rd.status.into()));
                    m.insert("scheme".into(), s(&rd.scheme));
                    m.insert("port".into(), V::Integer(rd.port.into()));
                    if let Some(h) = &rd.host {
                        m.insert("host".into(), s(h));
                    }
                    match &rd.path {
                        Some((true, p)) => {
                            m.insert("path".into(), s(p));
                        }
                        Some((false, p)) => {
                            m.insert("prefix".into(), s(p));
                        }
                        None => {}
                    }
                    t.insert("redirect".into(), V::Table(m));
                }
                Action::Split(split) => {
                    let entries = split
                        .iter()
                        .map(|(to, w)| {
                            let mut m = toml::map::Map::new();
                            match to {
                                Ok(c) if self.clusters.get(c).is_some_and(|(e, _)| !e.is_empty()) => m.insert("name".into(), s(c)),
                                Ok(_) => m.insert("status".into(), V::Integer(503)),
                                Err(st) => m.insert("status".into(), V::Integer((*st).into())),
                            };
                            m.insert("weight".into(), V::Integer((*w).into()));
                            V::Table(m)
                        })
                        .collect();
                    t.insert("clusters".into(), V::Array(entries));
                }
            }
            if let Some(m) = &r.request_headers {
                t.insert("request_headers".into(), edit_table(m));
            }
            if let Some(m) = &r.response_headers {
                t.insert("response_headers".into(), edit_table(m));
            }
            if let Some(x) = r.timeout {
                t.insert("timeout".into(), V::Float(x));
            }
            routes.push(V::Table(t));
        }
        let mut clusters = Vec::new();
        for (name, (eps, h2)) in self.clusters.iter().filter(|(_, (e, _))| !e.is_empty()) {
            let mut t = toml::map::Map::new();
            t.insert("name".into(), s(name));
            t.insert("endpoints".into(), V::Array(eps.iter().map(|e| s(&e.to_string())).collect()));
            if *h2 {
                t.insert("protocol".into(), s("http2"));
            }
            clusters.push(V::Table(t));
        }
        // Arrays of tables only when not empty: they are written as `[[...]]` sections, which may
        // follow the base's own tables; an empty one would be a bare key and land inside the
        // base's last table (`[admin]`).
        for (k, v) in [("listeners", listeners), ("routes", routes), ("clusters", clusters)] {
            if !v.is_empty() {
                doc.insert(k.into(), V::Array(v));
            }
        }
        let made = toml::to_string(&V::Table(doc)).unwrap_or_default();
        format!("{}\n# Made by vectorlb kube from the Gateway API objects: do not edit.\n{made}", base.trim_end())
    }
}

fn header_table(n: &str, v: &str) -> toml::Value {
    let mut m = toml::map::Map::new();
    m.insert("name".into(), toml::Value::String(n.to_string()));
    m.insert("value".into(), toml::Value::String(v.to_string()));
    toml::Value::Table(m)
}

fn edit_table(h: &HeaderModifier) -> toml::Value {
    let mut m = toml::map::Map::new();
    m.insert("set".into(), toml::Value::Array(h.set.iter().map(|x| header_table(&x.name, &x.value)).collect()));
    m.insert("add".into(), toml::Value::Array(h.add.iter().map(|x| header_table(&x.name, &x.value)).collect()));
    m.insert("remove".into(), toml::Value::Array(h.remove.iter().map(|x| toml::Value::String(x.clone())).collect()));
    toml::Value::Table(m)
}
