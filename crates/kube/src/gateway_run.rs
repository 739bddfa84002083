//! The Gateway API at run time: reflectors for GatewayClasses, Gateways, HTTPRoutes,
//! GRPCRoutes, TLS Secrets and Namespaces; each round gives every Gateway of this controller's
//! classes an address (the same pools as Services), a proxy port per listener port (kept as
//! long as the Gateway keeps the port, recovered from the proxies after a restart), pushes the
//! translated configuration to every proxy whose digest differs, writes the conditions, and
//! hands the controller each Gateway's L4 service: its address and ports → the proxies.

use crate::config::{GatewayConfig, ProxyRef};
use crate::desired::{EndpointIn, PortIn, SliceIn, SvcSpec};
use crate::gateway::{self as translate, Cond, GatewayIn, Out, RouteIn, World};
use crate::gateway_types::{Gateway, GatewayClass, GrpcRoute, HttpRoute, Listener, ObjectRef, ReferenceGrant, GROUP};
use crate::ipam::{Allocation, Family, Outcome, SvcIn};
use crate::metrics::Metrics;
use crate::watch::{created, spawn_reflector, WATCH_SECONDS};
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use vectorlb_wire::call::Method;
use vectorlb_wire::proxy::{ConfigApplied, ConfigDigest, StatsOut};
use vectorlb_wire::{Api as WireApi, CallError};

/// The address allocator's key of a Gateway (Services are `namespace/name`).
pub fn ipam_key(ns_name: &str) -> String {
    format!("gateway:{ns_name}")
}

/// Why the Gateway programming could not start, or a proxy could not be programmed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("gateway.base_file {path}: {error}")]
    BaseFile { path: String, error: std::io::Error },
    #[error("gateway proxy {proxy}: token_file {path}: {error}")]
    Token { proxy: String, path: String, error: std::io::Error },
    #[error("gateway proxy {proxy}: {error}")]
    Proxy { proxy: String, error: CallError },
    #[error("the {0} watch ended before its first list (are the Gateway API's resource definitions installed?)")]
    Watch(&'static str),
}

struct Proxy {
    cfg: ProxyRef,
    api: WireApi,
}

impl Proxy {
    fn failed(&self, error: CallError) -> GatewayError {
        GatewayError::Proxy { proxy: self.cfg.name.clone(), error }
    }

    /// Makes it serve `text` unless it already does. Its digest is asked every round (a small
    /// request): a proxy replaced or restarted without its file is programmed again at once.
    async fn converge(&self, text: &str) -> Result<bool, GatewayError> {
        let want = vectorlb_http::text_digest(text);
        let have: ConfigDigest = self.api.get("/v1/config").await.map_err(|e| self.failed(e))?;
        if have.digest == want {
            return Ok(false);
        }
        let _: ConfigApplied = self.api.send_text(Method::PUT, "/v1/config", text.as_bytes().to_vec(), "application/toml").await.map_err(|e| self.failed(e))?;
        Ok(true)
    }

    /// Its Gateway listeners' proxy ports: (Gateway, listener port) → port.
    async fn ports(&self) -> Result<BTreeMap<(String, u16), u16>, GatewayError> {
        let stats: StatsOut = self.api.get("/v1/stats").await.map_err(|e| self.failed(e))?;
        let mut out = BTreeMap::new();
        for l in &stats.listeners {
            let Ok(addr) = l.address.parse::<SocketAddr>() else { continue };
            if let Some((gw, port)) = l.name.strip_prefix("gw:").and_then(|n| n.rsplit_once(':')) {
                if let Ok(p) = port.parse::<u16>() {
                    out.insert((gw.to_string(), p), addr.port());
                }
            }
        }
        Ok(out)
    }
}

/// The Service ports routed by the proxies (the Gateway API for meshes): their cluster IPs'
/// traffic on those ports goes to the proxies.
#[derive(Debug, Clone, Default)]
pub struct MeshRoutes {
    /// namespace/name → (Service port → proxy port).
    pub ports: BTreeMap<String, BTreeMap<u16, u16>>,
    pub proxies: Vec<IpAddr>,
}

pub struct GatewayCtl {
    cfg: GatewayConfig,
    client: Client,
    base: String,
    classes: reflector::Store<GatewayClass>,
    gateways: reflector::Store<Gateway>,
    http: reflector::Store<HttpRoute>,
    grpc: reflector::Store<GrpcRoute>,
    secrets: reflector::Store<Secret>,
    namespaces: reflector::Store<Namespace>,
    grants: reflector::Store<ReferenceGrant>,
    proxies: Vec<Proxy>,
    /// (Gateway, listener port) → proxy port.
    ports: BTreeMap<(String, u16), u16>,
    /// Whether the proxies' ports were read (after a start).
    recovered: bool,
}

impl GatewayCtl {
    pub async fn start(cfg: GatewayConfig, client: Client, notify: Arc<Notify>, metrics: Arc<Metrics>) -> Result<GatewayCtl, GatewayError> {
        let base = std::fs::read_to_string(&cfg.base_file).map_err(|error| GatewayError::BaseFile { path: cfg.base_file.display().to_string(), error })?;
        let mut proxies = Vec::new();
        for p in &cfg.proxies {
            let token = match &p.token_file {
                Some(f) => {
                    Some(std::fs::read_to_string(f).map_err(|error| GatewayError::Token { proxy: p.name.clone(), path: f.display().to_string(), error })?.trim().to_string())
                }
                None => None,
            };
            let mut api = WireApi::new(&p.admin, token).map_err(|error| GatewayError::Proxy { proxy: p.name.clone(), error })?;
            api.options.connect_timeout = Duration::from_secs(2);
            api.options.max_body = 64 << 20;
            proxies.push(Proxy { cfg: p.clone(), api });
        }
        let wc = watcher::Config::default().timeout(WATCH_SECONDS);
        let (classes, w1) = reflector::store();
        let (gateways, w2) = reflector::store();
        let (http, w3) = reflector::store();
        let (grpc, w4) = reflector::store();
        let (secrets, w5) = reflector::store();
        let (namespaces, w6) = reflector::store();
        let (grants, w7) = reflector::store();
        let r = |n: &Arc<Notify>| (n.clone(), metrics.clone());
        let (n, m) = r(&notify);
        spawn_reflector(w1, Api::<GatewayClass>::all(client.clone()), wc.clone(), n, m);
        let (n, m) = r(&notify);
        spawn_reflector(w2, Api::<Gateway>::all(client.clone()), wc.clone(), n, m);
        let (n, m) = r(&notify);
        spawn_reflector(w3, Api::<HttpRoute>::all(client.clone()), wc.clone(), n, m);
        let (n, m) = r(&notify);
        spawn_reflector(w4, Api::<GrpcRoute>::all(client.clone()), wc.clone(), n, m);
        let (n, m) = r(&notify);
        spawn_reflector(w5, Api::<Secret>::all(client.clone()), wc.clone().fields("type=kubernetes.io/tls"), n, m);
        let (n, m) = r(&notify);
        spawn_reflector(w6, Api::<Namespace>::all(client.clone()), wc.clone(), n, m);
        let (n, m) = r(&notify);
        spawn_reflector(w7, Api::<ReferenceGrant>::all(client.clone()), wc, n, m);
        for (what, ready) in [
            ("gatewayclasses", classes.wait_until_ready().await.is_ok()),
            ("gateways", gateways.wait_until_ready().await.is_ok()),
            ("httproutes", http.wait_until_ready().await.is_ok()),
            ("grpcroutes", grpc.wait_until_ready().await.is_ok()),
            ("secrets", secrets.wait_until_ready().await.is_ok()),
            ("namespaces", namespaces.wait_until_ready().await.is_ok()),
            ("referencegrants", grants.wait_until_ready().await.is_ok()),
        ] {
            if !ready {
                return Err(GatewayError::Watch(what));
            }
        }
        Ok(GatewayCtl { cfg, client, base, classes, gateways, http, grpc, secrets, namespaces, grants, proxies, ports: BTreeMap::new(), recovered: false })
    }

    fn our_classes(&self) -> BTreeMap<String, Arc<GatewayClass>> {
        self.classes.state().into_iter().filter(|c| c.spec.controller_name == self.cfg.controller_name).map(|c| (c.name_any(), c)).collect()
    }

    fn our_gateways(&self) -> Vec<Arc<Gateway>> {
        let classes = self.our_classes();
        let mut v: Vec<Arc<Gateway>> = self.gateways.state().into_iter().filter(|g| classes.contains_key(&g.spec.gateway_class_name)).collect();
        v.sort_by_key(|g| key(g.as_ref()));
        v
    }

    /// The Gateways as the address allocator's inputs.
    pub fn ipam_inputs(&self) -> Vec<SvcIn> {
        self.our_gateways()
            .iter()
            .map(|g| {
                let current = g.status.as_ref().and_then(|s| s["addresses"][0]["value"].as_str()).and_then(|a| a.parse().ok());
                let asked = g.spec.addresses.first();
                let (requested, invalid_request) = match asked {
                    Some(a) if a.type_.as_deref().is_none_or(|t| t == "IPAddress") => match a.value.parse::<IpAddr>() {
                        Ok(ip) => (Some(ip), None),
                        Err(_) => (None, Some(a.value.clone())),
                    },
                    Some(a) => (None, Some(format!("{} (only IPAddress addresses are supported)", a.value))),
                    None => (None, None),
                };
                SvcIn {
                    key: ipam_key(&key(g.as_ref())),
                    namespace: g.namespace().unwrap_or_default(),
                    labels: g.labels().clone(),
                    created: created(g.meta()),
                    family: requested.as_ref().map(Family::of),
                    current,
                    requested,
                    invalid_request,
                    pool: g.annotations().get(crate::annotation::ADDRESS_POOL).cloned(),
                    sharing: None,
                    ports: listeners_served(&g.spec.listeners).into_iter().map(|p| ("TCP".to_string(), p)).collect(),
                }
            })
            .collect()
    }

    /// One round: translation, proxies, conditions; returns each Gateway's L4 service, the
    /// routed Service ports, and whether every proxy converged.
    pub async fn round(
        &mut self,
        alloc: &Allocation,
        services: &[Arc<Service>],
        slices_by_svc: &BTreeMap<String, Vec<Arc<EndpointSlice>>>,
    ) -> (Vec<(SvcSpec, Vec<SliceIn>)>, MeshRoutes, bool) {
        let gateways = self.our_gateways();
        if !self.recovered {
            // Once, after a start or a change of leader: the ports the proxies serve now (every
            // proxy gets the same configuration, so any that answers has them; one that does
            // not gets the configuration made here when it is back).
            for p in &self.proxies {
                match p.ports().await {
                    Ok(m) => {
                        for (k, port) in m {
                            self.ports.entry(k).or_insert(port);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read a proxy's listeners"),
                }
            }
            self.recovered = true;
        }
        let addressed: BTreeSet<String> = gateways.iter().map(|g| key(g.as_ref())).filter(|k| matches!(alloc.services.get(&ipam_key(k)), Some(Outcome::Assigned { .. }))).collect();
        let mut world = self.world(services, slices_by_svc);
        let ins: Vec<GatewayIn> = gateways
            .iter()
            .map(|g| {
                let k = key(g.as_ref());
                let address = match alloc.services.get(&ipam_key(&k)) {
                    Some(Outcome::Assigned { ip, .. }) => Ok(*ip),
                    Some(Outcome::Failed { reason, message }) => Err(format!("{reason}: {message}")),
                    None => Err("no address yet".into()),
                };
                GatewayIn { gw: g.as_ref(), key: k, address }
            })
            .collect();
        let http = self.http.state();
        let grpc = self.grpc.state();
        fn route_in<'a>(kind: &'static str, m: &ObjectMeta, parent_refs: &'a [ObjectRef], hostnames: &'a [String], rules: Result<Vec<translate::Rule>, String>) -> RouteIn<'a> {
            RouteIn { kind, namespace: m.namespace.clone().unwrap_or_default(), name: m.name.clone().unwrap_or_default(), created: created(m), parent_refs, hostnames, rules }
        }
        let mut routes: Vec<RouteIn> = Vec::new();
        for r in &http {
            routes.push(route_in(translate::HTTP_ROUTE, &r.metadata, &r.spec.parent_refs, &r.spec.hostnames, translate::http_rules(&r.spec.rules)));
        }
        for r in &grpc {
            routes.push(route_in(translate::GRPC_ROUTE, &r.metadata, &r.spec.parent_refs, &r.spec.hostnames, translate::grpc_rules(&r.spec.rules)));
        }
        // The routed Service ports (the Gateway API for meshes) take proxy ports as Gateways do.
        let mesh_ports: BTreeSet<(String, u16)> = if self.cfg.mesh {
            routes.iter().filter_map(|r| translate::mesh_targets(r, &world).ok()).flatten().map(|(svc, p)| (translate::mesh_port_key(&svc), p)).collect()
        } else {
            BTreeSet::new()
        };
        self.assign_ports(&gateways, &addressed, mesh_ports);
        world.proxy_ports = self.ports.clone();
        let out = translate::translate(&ins, &routes, &world);
        let text = out.proxy_toml(&self.base, self.cfg.listen);
        let mut ok = true;
        let results = futures::future::join_all(self.proxies.iter().map(|p| {
            let text = &text;
            async move { (p.cfg.name.clone(), p.converge(text).await) }
        }))
        .await;
        for (name, r) in results {
            match r {
                Ok(true) => tracing::info!(proxy = %name, "configuration pushed"),
                Ok(false) => {}
                Err(e) => {
                    ok = false;
                    tracing::warn!(proxy = %name, error = %e, "cannot program the proxy; retrying");
                }
            }
        }
        // Conditions: classes, Gateways, routes.
        for c in self.our_classes().values() {
            self.class_status(c).await;
        }
        for g in &gateways {
            if let Some(st) = out.gateways.get(&key(g.as_ref())) {
                self.gateway_status(g, st).await;
            }
        }
        for r in &http {
            self.route_status::<HttpRoute>(r.as_ref(), r.status.as_ref(), r.metadata.generation, out.route_status.get(&(translate::HTTP_ROUTE, key(r.as_ref())))).await;
        }
        for r in &grpc {
            self.route_status::<GrpcRoute>(r.as_ref(), r.status.as_ref(), r.metadata.generation, out.route_status.get(&(translate::GRPC_ROUTE, key(r.as_ref())))).await;
        }
        let mesh = MeshRoutes { ports: out.mesh.clone(), proxies: self.proxies.iter().map(|p| p.cfg.address).collect() };
        (self.l4(&gateways, &out, alloc), mesh, ok)
    }

    /// A proxy port for every served listener port of a Gateway that has an address
    /// ([`assign_ports`]).
    fn assign_ports(&mut self, gateways: &[Arc<Gateway>], addressed: &BTreeSet<String>, mesh: BTreeSet<(String, u16)>) {
        let mut want: BTreeSet<(String, u16)> = gateways
            .iter()
            .filter(|g| addressed.contains(&key(g.as_ref())))
            .flat_map(|g| listeners_served(&g.spec.listeners).into_iter().map(move |p| (key(g.as_ref()), p)))
            .collect();
        want.extend(mesh);
        assign_ports(&mut self.ports, want, self.cfg.port_range().unwrap_or((30000, 30999)), self.cfg.ports_per_namespace);
    }

    fn world(&self, services: &[Arc<Service>], slices_by_svc: &BTreeMap<String, Vec<Arc<EndpointSlice>>>) -> World {
        let mut w = World { proxy_ports: self.ports.clone(), mesh: self.cfg.mesh, ..World::default() };
        for s in services {
            let k = key(s.as_ref());
            let ports = s.spec.as_ref().and_then(|sp| sp.ports.clone()).unwrap_or_default();
            let tcp: Vec<_> = ports.iter().filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP").collect();
            w.services.insert(k.clone(), tcp.iter().filter_map(|p| u16::try_from(p.port).ok()).collect());
            w.http_ports.insert(
                k.clone(),
                tcp.iter().filter(|p| translate::carries_http(p.app_protocol.as_deref(), p.name.as_deref())).filter_map(|p| u16::try_from(p.port).ok()).collect(),
            );
            for p in tcp {
                let Ok(port) = u16::try_from(p.port) else { continue };
                let name = p.name.clone().unwrap_or_default();
                let mut eps = Vec::new();
                for sl in slices_by_svc.get(&k).into_iter().flatten() {
                    let Some(target) = sl.ports.iter().flatten().find(|sp| sp.name.clone().unwrap_or_default() == name).and_then(|sp| sp.port).and_then(|p| u16::try_from(p).ok())
                    else {
                        continue;
                    };
                    for e in &sl.endpoints {
                        if e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
                            eps.extend(e.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()).map(|a| SocketAddr::new(a, target)));
                        }
                    }
                }
                eps.sort();
                eps.dedup();
                w.endpoints.insert((k.clone(), port), eps);
            }
        }
        for s in self.secrets.state() {
            w.secrets.insert(key(s.as_ref()), tls_pair(&s));
        }
        for n in self.namespaces.state() {
            w.namespace_labels.insert(n.name_any(), n.labels().clone());
        }
        w.grants = self.grants.state().iter().map(|g| (g.namespace().unwrap_or_default(), g.spec.clone())).collect();
        w
    }

    /// Each Gateway's L4 service: its address and served ports → every proxy at its port.
    fn l4(&self, gateways: &[Arc<Gateway>], out: &Out, alloc: &Allocation) -> Vec<(SvcSpec, Vec<SliceIn>)> {
        let mut v = Vec::new();
        for g in gateways {
            let k = key(g.as_ref());
            let Some(Outcome::Assigned { ip, .. }) = alloc.services.get(&ipam_key(&k)) else { continue };
            let Some(ports) = out.l4.get(&k).filter(|p| !p.is_empty()) else { continue };
            let spec = SvcSpec {
                key: ipam_key(&k),
                ip: Some(*ip),
                ports: ports.iter().map(|(lp, _)| PortIn { name: lp.to_string(), protocol: "TCP".into(), port: *lp }).collect(),
                annotations: g.annotations().clone(),
                affinity_timeout_s: None,
                local_addrs: Vec::new(),
                keep_source: Vec::new(),
                local_node: None,
            };
            let fam = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
            let slice = SliceIn {
                address_type: fam.into(),
                ports: ports.iter().map(|(lp, pp)| (lp.to_string(), "TCP".to_string(), *pp)).collect(),
                endpoints: self
                    .proxies
                    .iter()
                    .filter(|p| p.cfg.address.is_ipv4() == ip.is_ipv4())
                    .map(|p| EndpointIn { addrs: vec![p.cfg.address], node: None, ready: true, serving: true, terminating: false })
                    .collect(),
            };
            v.push((spec, vec![slice]));
        }
        v
    }

    /// After leadership changed hands: read the proxies' ports again.
    pub fn invalidate(&mut self) {
        self.recovered = false;
    }

    async fn class_status(&self, c: &GatewayClass) {
        let accepted = if c.spec.parameters_ref.is_some() {
            Cond { type_: "Accepted", status: false, reason: "InvalidParameters".into(), message: "this controller takes no parameters".into() }
        } else {
            Cond { type_: "Accepted", status: true, reason: "Accepted".into(), message: String::new() }
        };
        let api: Api<GatewayClass> = Api::all(self.client.clone());
        let old_conds = c.status.as_ref().map(|v| v["conditions"].clone()).unwrap_or_default();
        let conds = conditions(&[accepted], c.metadata.generation, &old_conds);
        if old_conds != conds {
            let patch = json!({"status": {"conditions": conds}});
            if let Err(e) = api.patch_status(&c.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                tracing::warn!(class = %c.name_any(), error = %e, "cannot write the status");
            }
        }
    }

    async fn gateway_status(&self, g: &Gateway, st: &translate::GatewayStatus) {
        let old = g.status.clone().unwrap_or_default();
        let gen = g.metadata.generation;
        let listeners: Vec<serde_json::Value> = st
            .listeners
            .iter()
            .map(|l| {
                let old_l = old["listeners"].as_array().and_then(|a| a.iter().find(|x| x["name"] == l.name.as_str())).map(|x| x["conditions"].clone()).unwrap_or_default();
                json!({
                    "name": l.name,
                    "supportedKinds": l.supported_kinds.iter().map(|k| json!({"group": GROUP, "kind": k})).collect::<Vec<_>>(),
                    "attachedRoutes": l.attached_routes,
                    "conditions": conditions(&l.conditions, gen, &old_l),
                })
            })
            .collect();
        let addresses: Vec<serde_json::Value> = st.address.iter().map(|a| json!({"type": "IPAddress", "value": a.to_string()})).collect();
        let want = json!({"addresses": addresses, "conditions": conditions(&st.conditions, gen, &old["conditions"]), "listeners": listeners});
        // (Transition times are kept by `conditions`, so an unchanged status compares equal.)
        if old == want {
            return;
        }
        let api: Api<Gateway> = Api::namespaced(self.client.clone(), &g.namespace().unwrap_or_default());
        if let Err(e) = api.patch_status(&g.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": want}))).await {
            tracing::warn!(gateway = %key(g), error = %e, "cannot write the status");
        }
    }

    async fn route_status<K>(&self, r: &K, status: Option<&serde_json::Value>, gen: Option<i64>, ours: Option<&Vec<translate::ParentStatus>>)
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    {
        let old = status.cloned().unwrap_or_default();
        let old_parents = old["parents"].as_array().cloned().unwrap_or_default();
        // Other controllers' entries stay; ours are replaced.
        let mut parents: Vec<serde_json::Value> = old_parents.iter().filter(|p| p["controllerName"] != self.cfg.controller_name.as_str()).cloned().collect();
        for (pr, conds) in ours.into_iter().flatten() {
            let old_c = old_parents
                .iter()
                .find(|p| p["controllerName"] == self.cfg.controller_name.as_str() && parent_ref_json(pr, r.meta().namespace.as_deref()) == p["parentRef"])
                .map(|p| p["conditions"].clone())
                .unwrap_or_default();
            parents.push(json!({
                "parentRef": parent_ref_json(pr, r.meta().namespace.as_deref()),
                "controllerName": self.cfg.controller_name,
                "conditions": conditions(conds, gen, &old_c),
            }));
        }
        if ours.is_none() && parents.len() == old_parents.len() {
            return;
        }
        let want = json!({"parents": parents});
        if json!({"parents": old_parents}) == want {
            return;
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), r.meta().namespace.as_deref().unwrap_or_default());
        let name = r.meta().name.clone().unwrap_or_default();
        if let Err(e) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": want}))).await {
            tracing::warn!(route = %name, error = %e, "cannot write the status");
        }
    }
}

/// Listener ports this controller serves (HTTP, HTTPS; others are refused in the conditions).
fn listeners_served(ls: &[Listener]) -> Vec<u16> {
    let mut v: Vec<u16> = ls.iter().filter(|l| l.protocol == "HTTP" || l.protocol == "HTTPS").filter_map(|l| u16::try_from(l.port).ok()).filter(|p| *p > 0).collect();
    v.sort();
    v.dedup();
    v
}

fn key(o: &impl ResourceExt) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

fn parent_ref_json(p: &ObjectRef, route_ns: Option<&str>) -> serde_json::Value {
    let mut v = json!({"group": p.group.clone().unwrap_or_else(|| GROUP.into()), "kind": p.kind.clone().unwrap_or_else(|| "Gateway".into()), "name": p.name,
        "namespace": p.namespace.clone().unwrap_or_else(|| route_ns.unwrap_or_default().to_string())});
    if let Some(s) = &p.section_name {
        v["sectionName"] = json!(s);
    }
    if let Some(port) = p.port {
        v["port"] = json!(port);
    }
    v
}

/// Conditions as the API stores them: a transition time kept while status and reason stay.
fn conditions(cs: &[Cond], gen: Option<i64>, old: &serde_json::Value) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second).unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now()).to_string();
    serde_json::Value::Array(
        cs.iter()
            .map(|c| {
                let status = if c.status { "True" } else { "False" };
                let prev = old.as_array().and_then(|a| a.iter().find(|o| o["type"] == c.type_));
                let time = match prev {
                    Some(p) if p["status"] == status && p["reason"] == c.reason.as_str() => p["lastTransitionTime"].as_str().unwrap_or(&now).to_string(),
                    _ => now.clone(),
                };
                json!({"type": c.type_, "status": status, "reason": c.reason, "message": c.message, "observedGeneration": gen.unwrap_or(0), "lastTransitionTime": time})
            })
            .collect(),
    )
}

/// A TLS Secret's chain and key, checked: both PEM, the key one the proxy can use, and the
/// key the certificate's.
fn tls_pair(s: &Secret) -> Result<(String, String), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let data = s.data.as_ref().ok_or("no data")?;
    let crt = data.get("tls.crt").ok_or("no tls.crt")?;
    let key = data.get("tls.key").ok_or("no tls.key")?;
    let crt = String::from_utf8(crt.0.clone()).map_err(|_| "tls.crt is not PEM text")?;
    let key = String::from_utf8(key.0.clone()).map_err(|_| "tls.key is not PEM text")?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt.as_bytes()).collect::<Result<_, _>>().map_err(|e| format!("tls.crt: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt: no certificate".into());
    }
    let k = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| format!("tls.key: {e}"))?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, k, &provider).map_err(|e| format!("tls.crt and tls.key: {e}"))?;
    Ok((crt, key))
}

/// Gives each wanted (Gateway `NS/NAME`, listener port) a proxy port from `range` and keeps the
/// ones it has; frees those no longer wanted (the Gateway, its address or its port went). At
/// most `per_namespace` per namespace: the range is every tenant's, and one must not take it
/// all (those past it are left without, with a line in the log).
fn assign_ports(ports: &mut BTreeMap<(String, u16), u16>, want: BTreeSet<(String, u16)>, (first, last): (u16, u16), per_namespace: usize) {
    ports.retain(|k, _| want.contains(k));
    let mut used: BTreeSet<u16> = ports.values().copied().collect();
    // A Gateway's key is `namespace/name`, a routed Service's `svc:namespace/name`.
    let namespace = |k: &(String, u16)| k.0.trim_start_matches("svc:").split_once('/').map_or(String::new(), |(ns, _)| ns.to_string());
    let mut per_ns: BTreeMap<String, usize> = BTreeMap::new();
    for k in ports.keys() {
        *per_ns.entry(namespace(k)).or_default() += 1;
    }
    for k in want {
        if ports.contains_key(&k) {
            continue;
        }
        let n = per_ns.entry(namespace(&k)).or_default();
        if *n >= per_namespace {
            tracing::warn!(gateway = %k.0, port = k.1, "the namespace holds {per_namespace} proxy ports (gateway.ports_per_namespace); not served");
            continue;
        }
        match (first..=last).find(|p| !used.contains(p)) {
            Some(p) => {
                *n += 1;
                used.insert(p);
                ports.insert(k, p);
            }
            None => tracing::warn!(gateway = %k.0, port = k.1, "no proxy port left in gateway.ports"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_namespace_cannot_take_every_proxy_port() {
        let want = |v: &[(&str, u16)]| v.iter().map(|(g, p)| (g.to_string(), *p)).collect::<BTreeSet<_>>();
        let mut ports = BTreeMap::new();
        // A tenant asks for 10 listener ports; its namespace gets 3, another tenant still gets its own.
        let mut w: Vec<(&str, u16)> = (0..10).map(|i| ("greedy/gw", 8000 + i)).collect();
        w.push(("other/gw", 80));
        assign_ports(&mut ports, want(&w), (30000, 30009), 3);
        assert_eq!(ports.keys().filter(|(g, _)| g == "greedy/gw").count(), 3);
        assert!(ports.contains_key(&("other/gw".to_string(), 80)), "{ports:?}");
        // Kept while wanted, freed when not.
        let before = ports.clone();
        assign_ports(&mut ports, want(&w), (30000, 30009), 3);
        assert_eq!(ports, before);
        assign_ports(&mut ports, want(&[("other/gw", 80)]), (30000, 30009), 3);
        assert_eq!(ports.len(), 1);
    }
}
