//! The controller's loop: reflectors keep Services, EndpointSlices and AddressPools in memory;
//! any change (or the resync timer) starts a round that allocates every address again, writes
//! the Services' and pools' status, reports problems as Events, and converges every daemon.
//! A round is level-triggered and idempotent: it works from what the objects say, never from
//! what happened, so a restart of anything converges.

use crate::annotation as ann;
use crate::cnp::ClusterNetworkPolicy;
use crate::config::{ClusterIpConfig, KubeConfig};
use crate::crd::{AddressPool, AddressPoolStatus, PoolCondition};
use crate::desired::{self, DaemonSide, EndpointIn, PortIn, Problem, SliceIn, SvcSpec};
use crate::ipam::{self, Family, Outcome, PoolIn, SvcIn};
use crate::metrics::Metrics;
use crate::program::{key_of, Daemon, Key};
use crate::reason::Reason;
use crate::watch::{spawn_reflector, WATCH_SECONDS};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use vectorlb_api::model::NewService;

/// The label EndpointSlices carry to name their Service.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

pub struct Controller {
    cfg: KubeConfig,
    client: Client,
    recorder: Recorder,
    daemons: Vec<Daemon>,
    services: reflector::Store<Service>,
    slices: reflector::Store<EndpointSlice>,
    pools: reflector::Store<AddressPool>,
    /// Problems reported per object, so an Event goes out once per change.
    reported: BTreeMap<String, BTreeSet<(String, String)>>,
    /// Addresses this controller programmed since it started (owned even if their pool goes).
    programmed: BTreeSet<IpAddr>,
    metrics: Arc<Metrics>,
    last_resync: Instant,
    /// The Gateway API, when `[gateway]` is configured.
    gateway: Option<crate::gateway_run::GatewayCtl>,
    /// The health-check node ports, with `[cluster_ips] node_name` and node addresses.
    health_ports: Option<crate::health_port::HealthPorts>,
    /// NetworkPolicy for this node's Pods, with `[network_policy]`.
    netpol: Option<PolicyCtl>,
}

/// What NetworkPolicy needs watched, and the compiler's identities.
struct PolicyCtl {
    node: String,
    node_addrs: Vec<IpAddr>,
    pods: reflector::Store<Pod>,
    namespaces: reflector::Store<Namespace>,
    policies: reflector::Store<NetworkPolicy>,
    nodes: reflector::Store<Node>,
    /// None when the ClusterNetworkPolicy CRD was not installed when the controller started.
    cluster_policies: Option<reflector::Store<ClusterNetworkPolicy>>,
    compiler: crate::netpol::Compiler,
    /// Problems logged, so each is logged once while it lasts.
    logged: Vec<(String, String)>,
}

impl PolicyCtl {
    async fn start(node: String, node_addrs: Vec<IpAddr>, client: &Client, notify: &Arc<Notify>, metrics: &Arc<Metrics>) -> Result<PolicyCtl, StartError> {
        let (pods, w1) = reflector::store();
        let (namespaces, w2) = reflector::store();
        let (policies, w3) = reflector::store();
        let (nodes, w4) = reflector::store();
        let wc = watcher::Config::default().timeout(WATCH_SECONDS);
        spawn_reflector(w1, Api::<Pod>::all(client.clone()), wc.clone(), notify.clone(), metrics.clone());
        spawn_reflector(w2, Api::<Namespace>::all(client.clone()), wc.clone(), notify.clone(), metrics.clone());
        spawn_reflector(w3, Api::<NetworkPolicy>::all(client.clone()), wc.clone(), notify.clone(), metrics.clone());
        spawn_reflector(w4, Api::<Node>::all(client.clone()), wc.clone(), notify.clone(), metrics.clone());
        // ClusterNetworkPolicy when its CRD is there (the SIG's network-policy-api).
        let cnp_api = Api::<ClusterNetworkPolicy>::all(client.clone());
        let cluster_policies = match cnp_api.list(&kube::api::ListParams::default().limit(1)).await {
            Ok(_) => {
                let (store, w5) = reflector::store();
                spawn_reflector(w5, cnp_api, wc, notify.clone(), metrics.clone());
                Some(store)
            }
            Err(e) => {
                tracing::warn!(error = %e, "ClusterNetworkPolicy not served (its CRD is not installed?): only NetworkPolicy is enforced until the controller restarts");
                None
            }
        };
        for (what, ready) in [
            ("pods", pods.wait_until_ready().await.is_ok()),
            ("namespaces", namespaces.wait_until_ready().await.is_ok()),
            ("networkpolicies", policies.wait_until_ready().await.is_ok()),
            ("nodes", nodes.wait_until_ready().await.is_ok()),
            (
                "clusternetworkpolicies",
                match &cluster_policies {
                    Some(s) => s.wait_until_ready().await.is_ok(),
                    None => true,
                },
            ),
        ] {
            if !ready {
                return Err(StartError::Watch(what));
            }
        }
        Ok(PolicyCtl { node, node_addrs, pods, namespaces, policies, nodes, cluster_policies, compiler: Default::default(), logged: Vec::new() })
    }

    fn compile(&mut self) -> crate::netpol::Compiled {
        let pods: Vec<crate::netpol::PodIn> = self.pods.state().iter().filter_map(|p| crate::netpol::PodIn::from_pod(p)).collect();
        let namespaces = self.namespaces.state().iter().map(|n| crate::netpol::namespace_labels(n)).collect();
        // The stores' objects, borrowed (a round copies no policy).
        let policies = self.policies.state();
        let policies: Vec<&NetworkPolicy> = policies.iter().map(|p| p.as_ref()).collect();
        let cluster_policies = self.cluster_policies.as_ref().map(|s| s.state()).unwrap_or_default();
        let cluster_policies: Vec<&ClusterNetworkPolicy> = cluster_policies.iter().map(|p| p.as_ref()).collect();
        let nodes: Vec<crate::netpol::NodeIn> = self.nodes.state().iter().map(|n| crate::netpol::NodeIn::from_node(n)).collect();
        let inputs = crate::netpol::Inputs {
            node: &self.node,
            node_addrs: &self.node_addrs,
            pods: &pods,
            namespaces: &namespaces,
            policies: &policies,
            cluster_policies: &cluster_policies,
            nodes: &nodes,
        };
        let out = self.compiler.compile_all(&inputs);
        for (p, why) in &out.problems {
            if !self.logged.iter().any(|(q, w)| q == p && w == why) {
                tracing::warn!(policy = %p, problem = %why, "NetworkPolicy not compiled whole");
            }
        }
        self.logged = out.problems.clone();
        out
    }
}

fn ns_name(o: &impl ResourceExt) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

/// Why the controller could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Daemon(#[from] crate::program::ProgramError),
    #[error("the {0} watch ended before its first list")]
    Watch(&'static str),
    #[error(transparent)]
    Gateway(#[from] crate::gateway_run::GatewayError),
}

impl Controller {
    /// Starts the reflectors; returns once each has listed its objects.
    pub async fn start(cfg: KubeConfig, client: Client, identity: &str, metrics: Arc<Metrics>, notify: Arc<Notify>) -> Result<Controller, StartError> {
        let daemons = cfg.daemons.iter().cloned().map(Daemon::new).collect::<Result<Vec<_>, _>>()?;
        let (services, w1) = reflector::store();
        let (slices, w2) = reflector::store();
        let (pools, w3) = reflector::store();
        let wc = watcher::Config::default().timeout(WATCH_SECONDS);
        spawn_reflector(w1, Api::<Service>::all(client.clone()), wc.clone(), notify.clone(), metrics.clone());
        spawn_reflector(w2, Api::<EndpointSlice>::all(client.clone()), wc.clone().labels(SERVICE_NAME), notify.clone(), metrics.clone());
        spawn_reflector(w3, Api::<AddressPool>::all(client.clone()), wc, notify.clone(), metrics.clone());
        for (what, ready) in [
            ("services", services.wait_until_ready().await.is_ok()),
            ("endpointslices", slices.wait_until_ready().await.is_ok()),
            ("addresspools", pools.wait_until_ready().await.is_ok()),
        ] {
            if !ready {
                return Err(StartError::Watch(what));
            }
        }
        let gateway = match cfg.gateway.clone() {
            Some(g) => Some(crate::gateway_run::GatewayCtl::start(g, client.clone(), notify.clone(), metrics.clone()).await?),
            None => None,
        };
        let netpol = match cfg.policy_node() {
            Some((node, addrs)) => Some(PolicyCtl::start(node, addrs, &client, &notify, &metrics).await?),
            None => None,
        };
        let recorder = Recorder::new(client.clone(), Reporter { controller: "vectorlb-controller".into(), instance: Some(identity.to_string()) });
        Ok(Controller {
            client,
            recorder,
            daemons,
            services,
            slices,
            pools,
            reported: BTreeMap::new(),
            programmed: BTreeSet::new(),
            metrics,
            last_resync: Instant::now(),
            health_ports: cfg
                .cluster_ips
                .as_ref()
                .filter(|c| c.node_name.is_some() && !c.node_addresses.is_empty())
                .map(|c| crate::health_port::HealthPorts::new(c.node_addresses.clone())),
            cfg,
            gateway,
            netpol,
        })
    }

    fn ours(&self, s: &Service) -> bool {
        let Some(spec) = &s.spec else { return false };
        spec.type_.as_deref() == Some("LoadBalancer")
            && match &spec.load_balancer_class {
                Some(c) => c == &self.cfg.class,
                None => self.cfg.classless,
            }
    }

    /// One round; returns whether every daemon converged (else the caller retries soon).
    pub async fn round(&mut self) -> bool {
        let t = Instant::now();
        let resync = self.last_resync.elapsed() >= Duration::from_secs(self.cfg.resync_seconds.into());
        if resync {
            self.last_resync = Instant::now();
        }
        let services: Vec<Arc<Service>> = self.services.state().into_iter().filter(|s| self.ours(s)).collect();
        let pools = self.pools.state();
        let mut slices_by_svc: BTreeMap<String, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
        for sl in self.slices.state() {
            if let Some(n) = sl.labels().get(SERVICE_NAME) {
                slices_by_svc.entry(format!("{}/{n}", sl.namespace().unwrap_or_default())).or_default().push(sl);
            }
        }

        // Addresses.
        let pool_in: Vec<PoolIn> = pools.iter().map(|p| pool_in(p)).collect();
        let mut svc_in: Vec<SvcIn> = services.iter().map(|s| svc_in(s)).collect();
        if let Some(g) = &self.gateway {
            svc_in.extend(g.ipam_inputs());
        }
        let alloc = ipam::allocate(&pool_in, &svc_in);
        let ranges: Vec<ipam::Range> = pool_in.iter().flat_map(|p| p.addresses.iter().filter_map(|a| ipam::parse_range(a).ok())).collect();

        // What every daemon should serve, and each Service's problems.
        let mut problems: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
        let mut desired: Vec<BTreeMap<Key, NewService>> = vec![BTreeMap::new(); self.daemons.len()];
        let mut owner: BTreeMap<Key, String> = BTreeMap::new();
        let mut statuses: Vec<(Arc<Service>, Option<IpAddr>)> = Vec::new();
        for s in &services {
            let key = ns_name(s.as_ref());
            let ip = match alloc.services.get(&key) {
                Some(Outcome::Assigned { ip, .. }) => Some(*ip),
                Some(Outcome::Failed { reason, message }) => {
                    problems.entry(key.clone()).or_default().push(Problem { reason: *reason, message: message.clone() });
                    None
                }
                None => None,
            };
            let spec = svc_spec(s, ip);
            let slices: Vec<SliceIn> = slices_by_svc.get(&key).map(|v| v.iter().map(|sl| slice_in(sl)).collect()).unwrap_or_default();
            place(&self.daemons, &key, &spec, &slices, &mut problems, &mut desired, &mut owner);
            statuses.push((s.clone(), ip));
        }
        // The Gateways (and the Services' routes, the Gateway API for meshes): the proxies'
        // configuration and conditions, each Gateway's L4 service, the routed Service ports.
        let mut all_ok = true;
        let (gateway_l4, mesh_routes) = match &mut self.gateway {
            Some(g) => {
                let (l4, mesh, ok) = g.round(&alloc, &self.services.state(), &slices_by_svc).await;
                all_ok &= ok;
                (l4, mesh)
            }
            None => (Vec::new(), crate::gateway_run::MeshRoutes::default()),
        };
        // Cluster IPs and NodePorts of every Service ([cluster_ips]); a Service's routed ports
        // go to the proxies.
        let mut ranges = ranges;
        if let Some(c) = &self.cfg.cluster_ips {
            let cidrs: Vec<ipam::Range> = c.service_cidrs.iter().filter_map(|r| ipam::parse_range(r).ok()).collect();
            for s in self.services.state() {
                let key = ns_name(s.as_ref());
                let mut slices: Vec<SliceIn> = slices_by_svc.get(&key).map(|v| v.iter().map(|sl| slice_in(sl)).collect()).unwrap_or_default();
                if let Some(routed) = mesh_routes.ports.get(&key) {
                    slices = routed_slices(&s, slices, routed, &mesh_routes.proxies);
                }
                for spec in cluster_specs(&s, c, &cidrs) {
                    place(&self.daemons, &key, &spec, &slices, &mut problems, &mut desired, &mut owner);
                }
            }
            // The health-check node ports of this node.
            if let (Some(h), Some(node)) = (&mut self.health_ports, &c.node_name) {
                let mut want = BTreeMap::new();
                for s in self.services.state() {
                    let Some(spec) = &s.spec else { continue };
                    let Some(port) = spec.health_check_node_port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0) else { continue };
                    let slices: Vec<SliceIn> = slices_by_svc.get(&ns_name(s.as_ref())).map(|v| v.iter().map(|sl| slice_in(sl)).collect()).unwrap_or_default();
                    want.insert(port, crate::health_port::Entry { namespace: s.namespace().unwrap_or_default(), name: s.name_any(), local: local_ready(&slices, node) });
                }
                h.update(want);
            }
            // Every daemon service on these is the controller's (a stale one is removed).
            ranges.extend(cidrs);
            ranges.extend(c.node_addresses.iter().filter_map(|a| ipam::parse_range(&format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 })).ok()));
        }
        // The Gateways' L4 services.
        for (spec, slices) in gateway_l4 {
            let key = spec.key.clone();
            place(&self.daemons, &key, &spec, &slices, &mut problems, &mut desired, &mut owner);
        }
        // NetworkPolicy: this node's Pods on every daemon, by difference.
        if let Some(p) = &mut self.netpol {
            let want = p.compile();
            for d in &mut self.daemons {
                if let Err(e) = d.push_policy(&want).await {
                    all_ok = false;
                    tracing::warn!(daemon = %d.cfg.name, error = %e, "network policy not pushed; retrying");
                }
            }
        }
        for d in &desired {
            self.programmed.extend(d.keys().map(|k| k.1));
        }
        self.finish(t, resync, services, pools, alloc, ranges, problems, desired, owner, statuses, all_ok).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &mut self,
        t: Instant,
        resync: bool,
        services: Vec<Arc<Service>>,
        pools: Vec<Arc<AddressPool>>,
        alloc: ipam::Allocation,
        ranges: Vec<ipam::Range>,
        mut problems: BTreeMap<String, Vec<Problem>>,
        desired: Vec<BTreeMap<Key, NewService>>,
        owner: BTreeMap<Key, String>,
        statuses: Vec<(Arc<Service>, Option<IpAddr>)>,
        mut all_ok: bool,
    ) -> bool {
        // The daemons, all at once.
        let programmed = self.programmed.clone();
        let owned = move |a: &IpAddr| ranges.iter().any(|r| r.contains(a)) || programmed.contains(a);
        let results = futures::future::join_all(self.daemons.iter_mut().zip(desired.iter()).map(|(d, want)| {
            let owned = &owned;
            async move { d.converge(want, owned, resync).await }
        }))
        .await;
        for (d, r) in self.daemons.iter().zip(results) {
            match r {
                Ok(rep) => {
                    self.metrics.daemon_ok(&d.cfg.name, rep.put as u64, rep.deleted as u64);
                    for (k, why) in rep.refused {
                        if let Some(svc) = owner.get(&k) {
                            problems
                                .entry(svc.clone())
                                .or_default()
                                .push(Problem { reason: Reason::ProgramFailed, message: format!("daemon {} refused {} port {}: {why}", d.cfg.name, k.0.name(), k.2) });
                        }
                    }
                }
                Err(e) => {
                    all_ok = false;
                    self.metrics.daemon_error(&d.cfg.name);
                    tracing::warn!(daemon = %d.cfg.name, error = %e, "programming failed; retrying");
                }
            }
        }

        // The addresses into the Services' status, once the daemons serve them (16 at a time).
        {
            let this = &*self;
            futures::stream::iter(statuses).for_each_concurrent(16, |(s, ip)| async move { this.write_service_status(&s, ip).await }).await;
        }

        // Events for what changed, and the pools' status.
        for s in &services {
            let key = ns_name(s.as_ref());
            let mut p = problems.remove(&key).unwrap_or_default();
            p.sort();
            p.dedup();
            let refs = s.object_ref(&());
            self.report(&key, &refs, p.into_iter().map(|p| (p.reason.to_string(), p.message)).collect(), "Program").await;
        }
        for p in pools.iter() {
            self.write_pool_status(p, alloc.pools.get(&p.name_any())).await;
        }
        let live: BTreeSet<String> = services.iter().map(|s| ns_name(s.as_ref())).chain(pools.iter().map(|p| format!("pool/{}", p.name_any()))).collect();
        self.reported.retain(|k, _| live.contains(k));
        self.metrics.round(t.elapsed(), services.len() as u64, desired.iter().map(|d| d.values().map(|s| s.backends.len() as u64).sum::<u64>()).max().unwrap_or(0));
        all_ok
    }

    /// Publishes the Warning Events of `now` that were not reported last time.
    async fn report(&mut self, key: &str, r: &ObjectReference, now: BTreeSet<(String, String)>, action: &str) {
        let before = self.reported.get(key).cloned().unwrap_or_default();
        for (reason, message) in now.difference(&before) {
            tracing::info!(object = key, reason = %reason, "{message}");
            let ev = Event { type_: EventType::Warning, reason: reason.clone(), note: Some(message.chars().take(1000).collect()), action: action.into(), secondary: None };
            if let Err(e) = self.recorder.publish(&ev, r).await {
                tracing::warn!(object = key, error = %e, "cannot publish an event");
            }
        }
        self.reported.insert(key.to_string(), now);
    }

    async fn write_service_status(&self, s: &Service, ip: Option<IpAddr>) {
        let current: Vec<String> = s
            .status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .map(|v| v.iter().filter_map(|i| i.ip.clone()).collect())
            .unwrap_or_default();
        let want: Vec<String> = ip.iter().map(|a| a.to_string()).collect();
        if current == want {
            return;
        }
        let ingress: Vec<serde_json::Value> = want.iter().map(|a| json!({"ip": a, "ipMode": "VIP"})).collect();
        let api: Api<Service> = Api::namespaced(self.client.clone(), &s.namespace().unwrap_or_default());
        let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        match api.patch_status(&s.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                self.metrics.status_written();
                if let Some(a) = ip {
                    let ev =
                        Event { type_: EventType::Normal, reason: Reason::AddressAssigned.to_string(), note: Some(format!("{a}")), action: "Allocate".into(), secondary: None };
                    let _ = self.recorder.publish(&ev, &s.object_ref(&())).await;
                }
            }
            Err(e) => tracing::warn!(service = %ns_name(s), error = %e, "cannot write the status"),
        }
    }

    async fn write_pool_status(&mut self, p: &AddressPool, r: Option<&ipam::PoolReport>) {
        let Some(r) = r else { return };
        let cond = match &r.problem {
            None => PoolCondition {
                type_: "Valid".into(),
                status: "True".into(),
                reason: Reason::Valid.to_string(),
                message: String::new(),
                observed_generation: p.metadata.generation,
            },
            Some((reason, message)) => {
                PoolCondition { type_: "Valid".into(), status: "False".into(), reason: reason.to_string(), message: message.clone(), observed_generation: p.metadata.generation }
            }
        };
        let want = AddressPoolStatus { assigned: r.assigned, available: r.available, conditions: vec![cond] };
        if p.status.as_ref() != Some(&want) {
            let api: Api<AddressPool> = Api::all(self.client.clone());
            if let Err(e) = api.patch_status(&p.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": want}))).await {
                tracing::warn!(pool = %p.name_any(), error = %e, "cannot write the status");
            }
        }
        let problems: BTreeSet<(String, String)> = r.problem.iter().map(|(r, m)| (r.to_string(), m.clone())).collect();
        self.report(&format!("pool/{}", p.name_any()), &p.object_ref(&()), problems, "Validate").await;
    }

    /// Whether any daemon's configuration changed behind the controller's back (checked every
    /// second: a restarted daemon is programmed again at once).
    pub async fn daemons_changed(&mut self) -> bool {
        let r = futures::future::join_all(self.daemons.iter_mut().map(|d| d.changed())).await;
        r.into_iter().any(|c| c)
    }

    /// Forget what the daemons serve (after an error): the next round reads them.
    pub fn invalidate(&mut self) {
        for d in &mut self.daemons {
            d.invalidate();
        }
        if let Some(g) = &mut self.gateway {
            g.invalidate();
        }
    }
}

/// What every daemon should serve for one Service (or a Gateway's L4 service), and its
/// problems.
fn place(
    daemons: &[Daemon],
    key: &str,
    spec: &SvcSpec,
    slices: &[SliceIn],
    problems: &mut BTreeMap<String, Vec<Problem>>,
    desired: &mut [BTreeMap<Key, NewService>],
    owner: &mut BTreeMap<Key, String>,
) {
    for (i, d) in daemons.iter().enumerate() {
        let side = DaemonSide { local_addrs: d.cfg.local_addrs.clone(), peer_local_addrs: d.cfg.peer_local_addrs.clone() };
        let (specs, p) = desired::build(spec, slices, &side);
        if i == 0 || !p.is_empty() {
            let e = problems.entry(key.to_string()).or_default();
            for x in p {
                if !e.contains(&x) {
                    e.push(x);
                }
            }
        }
        for n in specs {
            let k = key_of(&n);
            if let Some(other) = owner.get(&k).filter(|o| o.as_str() != key) {
                // Two Services on one address and port: ipam refuses that, so only a race of
                // objects gets here; the older keeps it.
                problems
                    .entry(key.to_string())
                    .or_default()
                    .push(Problem { reason: Reason::PortClash, message: format!("{} port {} on {} is {other}'s", n.proto.name(), n.port, n.vip) });
                continue;
            }
            owner.insert(k, key.to_string());
            desired[i].insert(k, n);
        }
    }
}

fn annotation<'a>(o: &'a impl ResourceExt, k: &str) -> Option<&'a str> {
    o.annotations().get(k).map(|s| s.trim()).filter(|s| !s.is_empty())
}

fn created(o: &impl ResourceExt) -> String {
    crate::watch::created(o.meta())
}

fn pool_in(p: &AddressPool) -> PoolIn {
    let to = p.spec.allocate_to.clone().unwrap_or_default();
    PoolIn {
        name: p.name_any(),
        created: created(p),
        addresses: p.spec.addresses.clone(),
        auto_assign: p.spec.auto_assign.unwrap_or(true),
        namespaces: to.namespaces,
        service_labels: to.service_labels,
    }
}

fn svc_in(s: &Service) -> SvcIn {
    let spec = s.spec.clone().unwrap_or_default();
    let current = s
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|v| v.first())
        .and_then(|i| i.ip.as_ref())
        .and_then(|a| a.parse().ok());
    // The annotation first (a list; its first address is used), then the deprecated field.
    let requested = annotation(s, ann::LOAD_BALANCER_IPS).map(|v| v.split(',').next().unwrap_or("").trim().to_string()).or(spec.load_balancer_ip.clone()).filter(|v| !v.is_empty());
    let (requested, invalid_request) = match requested {
        Some(v) => match v.parse::<IpAddr>() {
            Ok(a) => (Some(a), None),
            Err(_) => (None, Some(v)),
        },
        None => (None, None),
    };
    let family = spec.ip_families.as_ref().and_then(|f| f.first()).map(|f| if f == "IPv6" { Family::V6 } else { Family::V4 });
    SvcIn {
        key: ns_name(s),
        namespace: s.namespace().unwrap_or_default(),
        labels: s.labels().clone(),
        created: created(s),
        family,
        current,
        requested,
        invalid_request,
        pool: annotation(s, ann::ADDRESS_POOL).map(str::to_string),
        // A sharing key is the namespace's own: another tenant's Services never share with
        // it, whatever key they give.
        sharing: annotation(s, ann::ALLOW_SHARED_IP).map(|k| format!("{}/{k}", s.namespace().unwrap_or_default())),
        ports: spec.ports.unwrap_or_default().iter().map(|p| (p.protocol.clone().unwrap_or_else(|| "TCP".into()), p.port.clamp(0, 65535) as u16)).collect(),
    }
}

fn svc_spec(s: &Service, ip: Option<IpAddr>) -> SvcSpec {
    let spec = s.spec.clone().unwrap_or_default();
    SvcSpec {
        key: ns_name(s),
        ip,
        ports: spec
            .ports
            .unwrap_or_default()
            .iter()
            .map(|p| PortIn { name: p.name.clone().unwrap_or_default(), protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()), port: p.port.clamp(0, 65535) as u16 })
            .collect(),
        annotations: s.annotations().clone(),
        affinity_timeout_s: (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            let t = spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref()).and_then(|c| c.timeout_seconds).unwrap_or(10_800);
            t.clamp(1, 86_400) as u32
        }),
        local_addrs: Vec::new(),
        keep_source: Vec::new(),
        local_node: None,
    }
}

/// What a Service's cluster IPs (those inside `cidrs`) and NodePorts (on `nodes` of its
/// families) serve: `nat` (the pods' addresses are kept, as kube-proxy keeps them), the
/// Service's other annotations as they are; NodePorts of `externalTrafficPolicy: Cluster`
/// with full NAT to the `masquerade` address of their family when there is one (an endpoint
/// on another node then answers through this one, as kube-proxy's masquerade makes it). None
/// for ExternalName and headless Services, and for those labelled as another proxy's
/// (`service.kubernetes.io/service-proxy-name`) or headless (`service.kubernetes.io/headless`),
/// which kube-proxy leaves alone too.
fn cluster_specs(s: &Service, c: &ClusterIpConfig, cidrs: &[ipam::Range]) -> Vec<SvcSpec> {
    let (nodes, masquerade) = (&c.node_addresses, &c.masquerade);
    let Some(spec) = &s.spec else { return Vec::new() };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let labels = s.labels();
    if labels.contains_key("service.kubernetes.io/service-proxy-name") || labels.contains_key("service.kubernetes.io/headless") {
        return Vec::new();
    }
    let ips: Vec<IpAddr> = spec
        .cluster_ips
        .clone()
        .unwrap_or_else(|| spec.cluster_ip.iter().cloned().collect())
        .iter()
        .filter_map(|a| a.parse().ok())
        .filter(|a| cidrs.iter().any(|r| r.contains(a)))
        .collect();
    let mut base = svc_spec(s, None);
    base.annotations.insert(ann::MODE.into(), "nat".into());
    // Traffic policies Local: only this node's endpoints (when the node's name is known).
    let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    // Clients outside the pod networks masqueraded (with both the addresses and the networks).
    let (masq, keep) = if masquerade.is_empty() || c.cluster_cidrs.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        (masquerade.clone(), c.cluster_cidrs.iter().filter_map(|p| normal_prefix(p)).collect())
    };
    let mut out: Vec<SvcSpec> = ips
        .iter()
        .map(|ip| SvcSpec { ip: Some(*ip), local_node: c.node_name.clone().filter(|_| internal_local), local_addrs: masq.clone(), keep_source: keep.clone(), ..base.clone() })
        .collect();
    // External IPs (`spec.externalIPs`): served as the cluster IPs are, for whoever routes
    // them here (this node's Pods, at least); `externalTrafficPolicy: Local` applies to them
    // (this node's endpoints, the client's address kept).
    let external_local = spec.external_traffic_policy.as_deref() == Some("Local");
    for a in spec.external_ips.iter().flatten().filter_map(|a| a.parse::<IpAddr>().ok()) {
        let usable = !(a.is_unspecified() || a.is_loopback() || a.is_multicast() || cidrs.iter().any(|r| r.contains(&a))) && ips.iter().any(|ip| ip.is_ipv4() == a.is_ipv4());
        if !usable || out.iter().any(|o| o.ip == Some(a)) {
            continue;
        }
        out.push(if external_local {
            SvcSpec { ip: Some(a), local_node: c.node_name.clone(), ..base.clone() }
        } else {
            SvcSpec { ip: Some(a), local_addrs: masq.clone(), keep_source: keep.clone(), ..base.clone() }
        });
    }
    if matches!(spec.type_.as_deref(), Some("NodePort") | Some("LoadBalancer")) {
        let ports: Vec<PortIn> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let np = u16::try_from(p.node_port?).ok().filter(|n| *n != 0)?;
                Some(PortIn { name: p.name.clone().unwrap_or_default(), protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()), port: np })
            })
            .collect();
        if !ports.is_empty() {
            let local = spec.external_traffic_policy.as_deref() == Some("Local");
            for n in nodes.iter().filter(|n| ips.iter().any(|ip| ip.is_ipv4() == n.is_ipv4())) {
                let mut np = SvcSpec { ip: Some(*n), ports: ports.clone(), local_node: c.node_name.clone().filter(|_| local), ..base.clone() };
                if let Some(m) = masquerade.iter().find(|m| m.is_ipv4() == n.is_ipv4()).filter(|_| !local) {
                    np.annotations.insert(ann::MODE.into(), "fnat".into());
                    np.local_addrs = vec![*m];
                }
                out.push(np);
            }
        }
    }
    out
}

/// A Service's slices with its routed ports (Service port → proxy port) served by the proxies
/// instead of its endpoints: those ports leave the endpoints' slices, and a slice per family of
/// the proxies holds them at the proxy ports.
fn routed_slices(s: &Service, mut slices: Vec<SliceIn>, routed: &BTreeMap<u16, u16>, proxies: &[IpAddr]) -> Vec<SliceIn> {
    let names: BTreeMap<String, u16> = s
        .spec
        .iter()
        .flat_map(|sp| sp.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| routed.get(&u16::try_from(p.port).ok()?).map(|pp| (p.name.clone().unwrap_or_default(), *pp)))
        .collect();
    for sl in &mut slices {
        sl.ports.retain(|(n, _, _)| !names.contains_key(n));
    }
    for (fam, v4) in [("IPv4", true), ("IPv6", false)] {
        let eps: Vec<EndpointIn> =
            proxies.iter().filter(|a| a.is_ipv4() == v4).map(|a| EndpointIn { addrs: vec![*a], node: None, ready: true, serving: true, terminating: false }).collect();
        if !eps.is_empty() {
            slices.push(SliceIn { address_type: fam.into(), ports: names.iter().map(|(n, pp)| (n.clone(), "TCP".to_string(), *pp)).collect(), endpoints: eps });
        }
    }
    slices
}

/// The ready endpoints of a Service on node `node` (of the family that has most; a
/// terminating endpoint is not ready).
fn local_ready(slices: &[SliceIn], node: &str) -> usize {
    let mut by_family: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
    for sl in slices {
        let set = by_family.entry(sl.address_type.as_str()).or_default();
        for e in sl.endpoints.iter().filter(|e| e.ready && !e.terminating && e.node.as_deref() == Some(node)) {
            set.extend(e.addrs.first());
        }
    }
    by_family.values().map(BTreeSet::len).max().unwrap_or(0)
}

/// A prefix as the daemon writes it back ("fd00:244::/32", not "fd00:244:0::/32"), so that
/// what is asked and what is served compare equal.
fn normal_prefix(p: &str) -> Option<String> {
    let (a, len) = p.trim().split_once('/')?;
    Some(format!("{}/{}", a.parse::<IpAddr>().ok()?, len.parse::<u8>().ok()?))
}

fn slice_in(sl: &EndpointSlice) -> SliceIn {
    SliceIn {
        address_type: sl.address_type.clone(),
        ports: sl
            .ports
            .clone()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| Some((p.name.clone().unwrap_or_default(), p.protocol.clone().unwrap_or_else(|| "TCP".into()), u16::try_from(p.port?).ok()?)))
            .collect(),
        endpoints: sl
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.clone().unwrap_or_default();
                EndpointIn {
                    addrs: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                    node: e.node_name.clone(),
                    ready: c.ready.unwrap_or(true),
                    serving: c.serving.unwrap_or(c.ready.unwrap_or(true)),
                    terminating: c.terminating.unwrap_or(false),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_sharing_key_is_its_namespaces_own() {
        let lb = |ns: &str| {
            svc(
                json!({"metadata": {"name": "web", "namespace": ns, "annotations": {"vectorlb.io/allow-shared-ip": "key"}}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            )
        };
        let (a, b) = (svc_in(&lb("tenant-a")), svc_in(&lb("tenant-b")));
        assert_eq!(a.sharing.as_deref(), Some("tenant-a/key"));
        assert_ne!(a.sharing, b.sharing, "a guessed key let another namespace's Service onto this address");
    }

    #[test]
    fn routed_ports_go_to_the_route_proxies_and_the_others_to_the_endpoints() {
        let s = svc(json!({"metadata": {"name": "echo", "namespace": "mesh"},
            "spec": {"clusterIP": "10.96.0.20", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "tcp", "port": 9090, "protocol": "TCP"},
                                                        {"name": "dns", "port": 80, "protocol": "UDP"}]}}));
        let ep = |a: &str| EndpointIn { addrs: vec![a.parse().unwrap()], node: None, ready: true, serving: true, terminating: false };
        let slices = vec![SliceIn {
            address_type: "IPv4".into(),
            ports: vec![("http".into(), "TCP".into(), 8080), ("tcp".into(), "TCP".into(), 9090), ("dns".into(), "UDP".into(), 53)],
            endpoints: vec![ep("10.244.1.10"), ep("10.244.2.10")],
        }];
        let routed = BTreeMap::from([(80u16, 31000u16)]);
        let proxies: Vec<IpAddr> = vec!["10.244.1.6".parse().unwrap()];
        let out = routed_slices(&s, slices, &routed, &proxies);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0].ports.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(), ["tcp", "dns"], "the UDP port of the same number is not routed");
        assert_eq!(out[1].ports, vec![("http".to_string(), "TCP".to_string(), 31000)]);
        assert_eq!(out[1].endpoints.iter().map(|e| e.addrs[0].to_string()).collect::<Vec<_>>(), ["10.244.1.6"]);
        assert_eq!(out[1].address_type, "IPv4", "no IPv6 slice without an IPv6 proxy");
    }

    #[test]
    fn cluster_ips_and_node_ports_become_nat_services() {
        let cidrs = vec![ipam::parse_range("10.96.0.0/16").unwrap(), ipam::parse_range("fd00:96::/112").unwrap()];
        let nodes: Vec<IpAddr> = vec!["10.1.0.1".parse().unwrap(), "2001:db8:1::1".parse().unwrap()];
        let cfg = |masquerade: &[IpAddr], node_name: Option<&str>| ClusterIpConfig {
            service_cidrs: vec!["10.96.0.0/16".into(), "fd00:96::/112".into()],
            node_addresses: nodes.clone(),
            masquerade: masquerade.to_vec(),
            cluster_cidrs: Vec::new(),
            node_name: node_name.map(str::to_string),
        };
        let plain = cfg(&[], None);
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default", "annotations": {"vectorlb.io/mode": "fnat", "vectorlb.io/scheduler": "sh"}},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}}));
        let specs = cluster_specs(&s, &plain, &cidrs);
        let ips: Vec<String> = specs.iter().map(|s| s.ip.unwrap().to_string()).collect();
        assert_eq!(ips, ["10.96.0.10", "fd00:96::10", "10.1.0.1", "2001:db8:1::1"]);
        // Cluster IPs keep the ports; node addresses get the node ports (only those that have one).
        assert_eq!(specs[0].ports.iter().map(|p| p.port).collect::<Vec<_>>(), [80, 53]);
        assert_eq!(specs[2].ports.iter().map(|p| (p.name.as_str(), p.port)).collect::<Vec<_>>(), [("http", 30080)]);
        // Always nat; the other annotations are the Service's.
        assert!(specs.iter().all(|s| s.annotations["vectorlb.io/mode"] == "nat" && s.annotations["vectorlb.io/scheduler"] == "sh"));
        // With masquerade addresses, NodePorts (externalTrafficPolicy Cluster) are full NAT to
        // the address of their family; cluster IPs stay nat, and so do Local NodePorts.
        let masq: Vec<IpAddr> = vec!["10.244.1.1".parse().unwrap(), "fd00:244:1::1".parse().unwrap()];
        let specs = cluster_specs(&s, &cfg(&masq, None), &cidrs);
        let modes: Vec<(&str, Vec<IpAddr>)> = specs.iter().map(|s| (s.annotations["vectorlb.io/mode"].as_str(), s.local_addrs.clone())).collect();
        assert_eq!(modes, [("nat", vec![]), ("nat", vec![]), ("fnat", vec![masq[0]]), ("fnat", vec![masq[1]])]);
        // With the pod networks too, the cluster IPs masquerade clients from outside them (the
        // networks written as the daemon writes them back).
        let pods = ClusterIpConfig { cluster_cidrs: vec!["10.244.0.0/16".into(), "fd00:244:0::/32".into()], ..cfg(&masq, None) };
        let specs = cluster_specs(&s, &pods, &cidrs);
        assert_eq!(specs[0].local_addrs, masq);
        assert_eq!(specs[0].keep_source, ["10.244.0.0/16", "fd00:244::/32"]);
        assert!(specs[2].keep_source.is_empty() && specs[2].local_addrs == [masq[0]], "NodePorts stay full NAT");
        let mut local = s.clone();
        local.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
        assert!(cluster_specs(&local, &cfg(&masq, None), &cidrs).iter().all(|s| s.annotations["vectorlb.io/mode"] == "nat" && s.local_addrs.is_empty()));
        // Traffic policies Local with the node's name: the NodePorts (external) or the cluster
        // IPs (internal) take only this node's endpoints; without the name, every endpoint.
        let on = |specs: &[SvcSpec]| specs.iter().map(|s| s.local_node.as_deref() == Some("node-1")).collect::<Vec<_>>();
        assert_eq!(on(&cluster_specs(&local, &cfg(&masq, Some("node-1")), &cidrs)), [false, false, true, true]);
        assert_eq!(on(&cluster_specs(&local, &cfg(&masq, None), &cidrs)), [false; 4]);
        let mut internal = s.clone();
        internal.spec.as_mut().unwrap().internal_traffic_policy = Some("Local".into());
        assert_eq!(on(&cluster_specs(&internal, &cfg(&masq, Some("node-1")), &cidrs)), [true, true, false, false]);
        // Outside the ranges, headless, ExternalName, a single-family Service: what applies.
        // External IPs: as the cluster IPs (the family's own, never a loopback or a cluster IP).
        let ext = svc(json!({"metadata": {"name": "x", "namespace": "d"},
            "spec": {"clusterIP": "10.96.0.12", "externalIPs": ["203.0.113.250", "127.0.0.1", "10.96.0.99", "2001:db8::1", "nope"], "ports": [{"port": 80}]}}));
        let specs = cluster_specs(&ext, &pods, &cidrs);
        let ips: Vec<String> = specs.iter().map(|s| s.ip.unwrap().to_string()).collect();
        assert_eq!(ips, ["10.96.0.12", "203.0.113.250"]);
        assert_eq!(specs[1].ports.iter().map(|p| p.port).collect::<Vec<_>>(), [80]);
        assert_eq!((specs[1].annotations["vectorlb.io/mode"].as_str(), &specs[1].local_addrs), ("nat", &masq));
        let other = svc(json!({"metadata": {"name": "x", "namespace": "d"}, "spec": {"clusterIP": "172.16.0.1", "ports": [{"port": 80}]}}));
        assert!(cluster_specs(&other, &plain, &cidrs).is_empty());
        let headless = svc(json!({"metadata": {"name": "x", "namespace": "d"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}));
        assert!(cluster_specs(&headless, &plain, &cidrs).is_empty());
        let ext = svc(json!({"metadata": {"name": "x", "namespace": "d"}, "spec": {"type": "ExternalName", "externalName": "example.com"}}));
        assert!(cluster_specs(&ext, &plain, &cidrs).is_empty());
        for label in ["service.kubernetes.io/service-proxy-name", "service.kubernetes.io/headless"] {
            let mut other_proxy = s.clone();
            other_proxy.metadata.labels = Some([(label.to_string(), String::new())].into());
            assert!(cluster_specs(&other_proxy, &plain, &cidrs).is_empty(), "{label}: another proxy's Service was programmed");
        }
        let v4 = svc(json!({"metadata": {"name": "x", "namespace": "d"}, "spec": {"type": "NodePort", "clusterIP": "10.96.0.11", "ports": [{"port": 80, "nodePort": 30081}]}}));
        let ips: Vec<String> = cluster_specs(&v4, &plain, &cidrs).iter().map(|s| s.ip.unwrap().to_string()).collect();
        assert_eq!(ips, ["10.96.0.11", "10.1.0.1"], "an IPv4 Service's NodePort on the IPv4 node address only");
    }
}
