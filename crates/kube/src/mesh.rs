//! `vectorlb kube mesh`: the mesh's Kubernetes side (docs/mesh.md). Two roles, each a section of
//! one configuration file, run by whichever process has the section:
//!
//! * **The authority** (`[authority]`, one in the cluster): the mesh's certificate authority. Its
//!   key is an operator's (`cert_file`, `key_file`) or lives in a Secret it creates once; its
//!   certificate is published as the trust bundle (a ConfigMap). It signs the
//!   CertificateSigningRequests of its signer name, each for the identity its annotation names,
//!   only when the requesting node runs a meshed pod of that service account: who asked is what
//!   kube-apiserver recorded in the request (a node's user name, or a service account token's
//!   node claim), which the requester cannot choose. A compromised node gets no certificate for
//!   a workload it does not run.
//! * **A node** (`[node]`, one on every node): writes its node proxy's state file (every meshed
//!   pod of the cluster, the AuthorizationPolicy objects), keeps a certificate for each service
//!   account with a meshed pod on the node (a fresh key each time, generated here and never
//!   sent; renewed at half its life), the trust bundle beside them, and (optionally) the
//!   daemon's steering (`PUT /v1/mesh`).
//!
//! A namespace is meshed when it carries `namespace_label`. The pure parts (what is meshed, who
//! asked, what to sign) are functions of the objects and tested alone.

use crate::metrics::Metrics;
use crate::watch::spawn_reflector;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{reflector, watcher};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;
use vectorlb_proxy::mesh::ca::{self, Authority, Bundle, Placement, Svid};
use vectorlb_proxy::mesh::identity::SpiffeId;
use vectorlb_proxy::mesh::run::{PolicyEntry, StateFile, WorkloadEntry};

/// The annotation on a signing request naming the identity asked for (`NAMESPACE/ACCOUNT`).
pub const IDENTITY_ANNOTATION: &str = "vectorlb.io/mesh-identity";
/// The label on a signing request naming the node that made it (informational: the authority
/// trusts only what kube-apiserver recorded).
pub const NODE_LABEL: &str = "vectorlb.io/mesh-node";
/// The claim kube-apiserver records for a service account token bound to a Pod: its node.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The shortest lifetime a CertificateSigningRequest may ask for (kube-apiserver refuses less);
/// the authority may still give less (`max_ttl_seconds`).
pub const MIN_REQUEST_TTL: Duration = Duration::from_secs(600);

/// An API error's own message (the client's rendering repeats the whole status).
fn api_error(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        e => e.to_string(),
    }
}

/// Istio's AuthorizationPolicy (`security.istio.io/v1`): its spec is taken as the API server
/// holds it and compiled by the node proxy (the L4 subset, docs/mesh.md).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "security.istio.io", version = "v1", kind = "AuthorizationPolicy", plural = "authorizationpolicies", namespaced)]
pub struct AuthorizationPolicySpec {
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// `vectorlb kube mesh --config FILE` (TOML).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshConfig {
    /// The SPIFFE trust domain (`spiffe://<trust_domain>/ns/<namespace>/sa/<account>`).
    #[serde(default = "default_trust_domain")]
    pub trust_domain: String,
    /// `KEY=VALUE`: namespaces with this label are meshed.
    #[serde(default = "default_label")]
    pub namespace_label: String,
    /// The signing requests' `signerName`.
    #[serde(default = "default_signer")]
    pub signer: String,
    /// Where the authority's Secret and the trust bundle's ConfigMap live.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The trust bundle's ConfigMap (key `bundle.pem`).
    #[serde(default = "default_trust_configmap")]
    pub trust_configmap: String,
    #[serde(default)]
    pub authority: Option<AuthorityConfig>,
    #[serde(default)]
    pub node: Option<NodeConfig>,
}

/// `[authority]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityConfig {
    /// The Secret (in `namespace`) holding the key (`tls.key`) and certificate (`tls.crt`),
    /// created with a new authority when missing. Unused with `cert_file` and `key_file`.
    #[serde(default = "default_secret")]
    pub secret: String,
    /// An operator's authority instead (PEM files; both or neither).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// More anchors for the trust bundle (the next or the previous authority while keys change).
    #[serde(default)]
    pub also_trust: Vec<PathBuf>,
    /// The longest certificate signed (a request asking for less gets less).
    #[serde(default = "default_ttl")]
    pub max_ttl_seconds: u32,
    /// Requesters named `<prefix><node>` (and in `node_group` when set) ask for `<node>`.
    #[serde(default = "default_node_prefix")]
    pub node_user_prefix: String,
    #[serde(default = "default_node_group")]
    pub node_group: Option<String>,
    /// Service accounts (`system:serviceaccount:NS:NAME`) whose Pod-bound tokens ask for the
    /// node kube-apiserver records in them (`authentication.kubernetes.io/node-name`): the node
    /// agents run as a DaemonSet.
    #[serde(default)]
    pub node_accounts: Vec<String>,
}

/// `[node]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's name (its Node object); default: the environment's `NODE_NAME` (a
    /// DaemonSet's Pod sets it from `spec.nodeName`).
    #[serde(default)]
    pub name: String,
    /// The node proxy's state file (`vectorlb mesh --state`).
    pub state_file: PathBuf,
    /// The node proxy's certificates directory (`vectorlb mesh --certs`).
    pub certs_dir: PathBuf,
    /// The lifetime asked for (the authority may give less).
    #[serde(default = "default_ttl")]
    pub ttl_seconds: u32,
    /// Policies in this namespace apply to every namespace.
    #[serde(default = "default_root_namespace")]
    pub root_namespace: String,
    /// The daemon's steering (`PUT /v1/mesh`); none: set by other means.
    #[serde(default)]
    pub steering: Option<SteeringConfig>,
}

/// `[node.steering]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SteeringConfig {
    /// The daemon's control API (`unix:PATH` or `ADDRESS:PORT`).
    pub api: String,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The node proxy's pod attachment on the pods port.
    pub proxy_container_id: String,
    #[serde(default = "default_ifname")]
    pub proxy_ifname: String,
    #[serde(default = "default_tunnel_port")]
    pub tunnel_port: u16,
}

fn default_trust_domain() -> String {
    "cluster.local".into()
}
fn default_label() -> String {
    "vectorlb.io/mesh=enabled".into()
}
fn default_signer() -> String {
    "vectorlb.io/mesh-workload".into()
}
fn default_namespace() -> String {
    "vectorlb-system".into()
}
fn default_trust_configmap() -> String {
    "vectorlb-mesh-trust".into()
}
fn default_secret() -> String {
    "vectorlb-mesh-ca".into()
}
fn default_ttl() -> u32 {
    86_400
}
fn default_node_prefix() -> String {
    "system:node:".into()
}
fn default_node_group() -> Option<String> {
    Some("system:nodes".into())
}
fn default_root_namespace() -> String {
    "istio-system".into()
}
fn default_ifname() -> String {
    "eth0".into()
}
fn default_tunnel_port() -> u16 {
    15008
}

impl MeshConfig {
    pub fn load(path: &Path) -> Result<MeshConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut c: MeshConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        c.node_name_from(std::env::var("NODE_NAME").ok());
        c.check().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(c)
    }

    /// `[node] name` from the environment's `NODE_NAME` when the file leaves it out.
    pub fn node_name_from(&mut self, env: Option<String>) {
        if let (Some(n), Some(e)) = (self.node.as_mut(), env) {
            if n.name.is_empty() {
                n.name = e.trim().to_string();
            }
        }
    }

    pub fn check(&self) -> Result<(), String> {
        self.label()?;
        SpiffeId::new(&self.trust_domain, "a", "b").map_err(|e| format!("trust_domain: {e}"))?;
        if !self.signer.contains('/') {
            return Err(format!("signer '{}': DOMAIN/NAME", self.signer));
        }
        if self.authority.is_none() && self.node.is_none() {
            return Err("neither [authority] nor [node]: nothing to run".into());
        }
        if let Some(a) = &self.authority {
            if a.cert_file.is_some() != a.key_file.is_some() {
                return Err("authority: cert_file and key_file go together".into());
            }
            let ttl = Duration::from_secs(a.max_ttl_seconds.into());
            if ttl < ca::MIN_TTL || ttl > ca::MAX_TTL {
                return Err(format!("authority.max_ttl_seconds {}: from {} to {}", a.max_ttl_seconds, ca::MIN_TTL.as_secs(), ca::MAX_TTL.as_secs()));
            }
            if a.node_user_prefix.is_empty() && a.node_accounts.is_empty() {
                return Err("authority: node_user_prefix is empty and no node_accounts: no node could ask".into());
            }
        }
        if let Some(n) = &self.node {
            if n.name.is_empty() {
                return Err("node.name is empty (and no NODE_NAME in the environment)".into());
            }
            let ttl = Duration::from_secs(n.ttl_seconds.into());
            if ttl < MIN_REQUEST_TTL || ttl > ca::MAX_TTL {
                return Err(format!("node.ttl_seconds {}: from {} (the API's least) to {}", n.ttl_seconds, MIN_REQUEST_TTL.as_secs(), ca::MAX_TTL.as_secs()));
            }
        }
        Ok(())
    }

    /// The namespace label as (key, value).
    pub fn label(&self) -> Result<(String, String), String> {
        match self.namespace_label.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().into(), v.trim().into())),
            _ => Err(format!("namespace_label '{}': KEY=VALUE", self.namespace_label)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The pure parts.

/// The meshed namespaces' names.
pub fn meshed_namespaces<'a>(namespaces: impl IntoIterator<Item = &'a Namespace>, label: &(String, String)) -> BTreeSet<String> {
    namespaces.into_iter().filter(|n| n.metadata.labels.as_ref().and_then(|l| l.get(&label.0)).is_some_and(|v| *v == label.1)).filter_map(|n| n.metadata.name.clone()).collect()
}

/// A pod that takes part in the mesh: in a meshed namespace, on a node, with its own network
/// (not the host's) and not finished.
fn meshed_pod<'a>(p: &'a Pod, meshed: &BTreeSet<String>) -> Option<(&'a str, &'a str, &'a str)> {
    let ns = p.metadata.namespace.as_deref()?;
    if !meshed.contains(ns) {
        return None;
    }
    let spec = p.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let node = spec.node_name.as_deref()?;
    if matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")) {
        return None;
    }
    let account = spec.service_account_name.as_deref().filter(|a| !a.is_empty()).unwrap_or("default");
    Some((ns, account, node))
}

/// The node proxies' workload list: every address of every meshed pod, by address.
pub fn workloads<'a>(pods: impl IntoIterator<Item = &'a Pod>, meshed: &BTreeSet<String>) -> Vec<WorkloadEntry> {
    let mut by_ip: BTreeMap<IpAddr, WorkloadEntry> = BTreeMap::new();
    for p in pods {
        let Some((ns, account, node)) = meshed_pod(p, meshed) else { continue };
        let Some(st) = p.status.as_ref() else { continue };
        let mut ips: Vec<&str> = st.pod_ips.iter().flatten().map(|i| i.ip.as_str()).collect();
        if ips.is_empty() {
            ips.extend(st.pod_ip.as_deref());
        }
        for ip in ips {
            let Ok(ip) = ip.parse::<IpAddr>() else { continue };
            let w = WorkloadEntry { ip, namespace: ns.into(), account: account.into(), labels: p.metadata.labels.clone().unwrap_or_default(), node: node.into(), hbone: None };
            // An address reused by a newer pod while the old one is going: the newer wins.
            by_ip.insert(ip, w);
        }
    }
    by_ip.into_values().collect()
}

/// Which node runs meshed pods of which accounts.
pub fn placement<'a>(pods: impl IntoIterator<Item = &'a Pod>, meshed: &BTreeSet<String>) -> Placement {
    let mut p = Placement::default();
    for pod in pods {
        if let Some((ns, account, node)) = meshed_pod(pod, meshed) {
            p.insert(node, ns, account);
        }
    }
    p
}

/// The node a signing request speaks for, from what kube-apiserver recorded of its requester.
pub fn requester_node(spec: &CertificateSigningRequestSpec, a: &AuthorityConfig) -> Result<String, String> {
    let user = spec.username.as_deref().unwrap_or("");
    if a.node_accounts.iter().any(|s| s == user) {
        let nodes = spec.extra.as_ref().and_then(|e| e.get(NODE_NAME_EXTRA)).cloned().unwrap_or_default();
        return match nodes.as_slice() {
            [n] if !n.is_empty() => Ok(n.clone()),
            _ => Err(format!("{user} asked without a token bound to a Pod on a node ({NODE_NAME_EXTRA})")),
        };
    }
    if !a.node_user_prefix.is_empty() {
        if let Some(node) = user.strip_prefix(a.node_user_prefix.as_str()).filter(|n| !n.is_empty()) {
            if let Some(g) = &a.node_group {
                if !spec.groups.iter().flatten().any(|x| x == g) {
                    return Err(format!("{user} is not in the group {g}"));
                }
            }
            return Ok(node.to_string());
        }
    }
    Err(format!("'{user}' is not a node of the mesh"))
}

/// What the authority does with one signing request of its signer.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Already decided (approved and signed, denied, failed): nothing.
    Done,
    Sign {
        id: SpiffeId,
        ttl: Duration,
    },
    Deny(String),
}

fn condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
}

pub fn decide(csr: &CertificateSigningRequest, cfg: &MeshConfig, a: &AuthorityConfig, placement: &Placement) -> Decision {
    if csr.spec.signer_name != cfg.signer {
        return Decision::Done;
    }
    if condition(csr, "Denied") || condition(csr, "Failed") || csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty()) {
        return Decision::Done;
    }
    let node = match requester_node(&csr.spec, a) {
        Ok(n) => n,
        Err(e) => return Decision::Deny(e),
    };
    let asked = csr.metadata.annotations.as_ref().and_then(|a| a.get(IDENTITY_ANNOTATION)).cloned().unwrap_or_default();
    let Some((ns, account)) = asked.split_once('/') else {
        return Decision::Deny(format!("no identity asked for: the annotation {IDENTITY_ANNOTATION} is NAMESPACE/ACCOUNT"));
    };
    let id = match SpiffeId::new(&cfg.trust_domain, ns, account) {
        Ok(id) => id,
        Err(e) => return Decision::Deny(format!("{IDENTITY_ANNOTATION} '{asked}': {e}")),
    };
    if let Err(e) = placement.authorize(&node, &id) {
        return Decision::Deny(e.to_string());
    }
    let max = Duration::from_secs(a.max_ttl_seconds.into());
    let ttl = csr.spec.expiration_seconds.map(|s| Duration::from_secs(s.max(0) as u64)).unwrap_or(max).clamp(ca::MIN_TTL, max);
    Decision::Sign { id, ttl }
}

/// Whether the certificate in `dir` for (ns, account) is still good: present, for that
/// identity, verified by `bundle`, and not past half its life.
pub fn still_good(dir: &Path, ns: &str, account: &str, bundle: &Bundle, now: SystemTime) -> bool {
    let (kp, cp) = cert_paths(dir, ns, account);
    let (Ok(key), Ok(chain)) = (std::fs::read(kp), std::fs::read(cp)) else {
        return false;
    };
    let (Ok(key), Ok(chain)) = (boring::pkey::PKey::private_key_from_pem(&key), boring::x509::X509::stack_from_pem(&chain)) else {
        return false;
    };
    let Ok(svid) = Svid::new(key, chain) else { return false };
    if svid.id.namespace() != ns || svid.id.account() != account || svid.refresh_at() <= now {
        return false;
    }
    bundle.verify(&svid.chain[0], &svid.chain[1..]).is_ok()
}

fn cert_paths(dir: &Path, ns: &str, account: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{ns}.{account}.key")), dir.join(format!("{ns}.{account}.pem")))
}

/// Writes `bytes` to `path` (replaced whole) unless it already holds them.
fn write_if_changed(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    if std::fs::read(path).is_ok_and(|b| b == bytes) {
        return Ok(false);
    }
    ca::write_private(path, bytes)?;
    Ok(true)
}

// ---------------------------------------------------------------------------------------------
// The authority.

/// The authority from the operator's files, or from its Secret (created when missing; a
/// second replica that loses the race reads the winner's).
async fn authority(client: &kube::Client, cfg: &MeshConfig, a: &AuthorityConfig) -> Result<Authority, String> {
    if let (Some(c), Some(k)) = (&a.cert_file, &a.key_file) {
        let cert = std::fs::read(c).map_err(|e| format!("{}: {e}", c.display()))?;
        let key = std::fs::read(k).map_err(|e| format!("{}: {e}", k.display()))?;
        return Authority::load(&cfg.trust_domain, &cert, &key).map_err(|e| format!("authority: {e}"));
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    for _ in 0..3 {
        if let Some(s) = secrets.get_opt(&a.secret).await.map_err(|e| format!("secret {}/{}: {e}", cfg.namespace, a.secret))? {
            let d = s.data.unwrap_or_default();
            let (Some(c), Some(k)) = (d.get("tls.crt"), d.get("tls.key")) else {
                return Err(format!("secret {}/{}: no tls.crt and tls.key", cfg.namespace, a.secret));
            };
            return Authority::load(&cfg.trust_domain, &c.0, &k.0).map_err(|e| format!("secret {}/{}: {e}", cfg.namespace, a.secret));
        }
        let new = Authority::generate(&cfg.trust_domain, Duration::from_secs(10 * 365 * 86_400)).map_err(|e| e.to_string())?;
        let data = BTreeMap::from([
            ("tls.crt".to_string(), ByteString(new.cert_pem().map_err(|e| e.to_string())?.into_bytes())),
            ("tls.key".to_string(), ByteString(new.key_pem().map_err(|e| e.to_string())?.into_bytes())),
        ]);
        let s = Secret {
            metadata: kube::api::ObjectMeta { name: Some(a.secret.clone()), namespace: Some(cfg.namespace.clone()), ..Default::default() },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(data),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &s).await {
            Ok(_) => {
                tracing::info!(secret = %format!("{}/{}", cfg.namespace, a.secret), "mesh: a new authority");
                return Ok(new);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("secret {}/{}: {e}", cfg.namespace, a.secret)),
        }
    }
    Err(format!("secret {}/{}: created and deleted under us three times", cfg.namespace, a.secret))
}

/// The trust bundle: the authority's certificate and the other anchors.
fn bundle_pem(cfg: &MeshConfig, a: &AuthorityConfig, auth: &Authority) -> Result<String, String> {
    let mut roots = vec![auth.certificate().clone()];
    for f in &a.also_trust {
        let pem = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        roots.extend(boring::x509::X509::stack_from_pem(&pem).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    Bundle::new(&cfg.trust_domain, roots).and_then(|b| b.to_pem()).map_err(|e| e.to_string())
}

async fn publish_bundle(client: &kube::Client, cfg: &MeshConfig, pem: &str) -> Result<(), String> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &cfg.namespace);
    let want = BTreeMap::from([("bundle.pem".to_string(), pem.to_string())]);
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some(cfg.trust_configmap.clone()), namespace: Some(cfg.namespace.clone()), ..Default::default() },
        data: Some(want.clone()),
        ..Default::default()
    };
    let what = format!("configmap {}/{}", cfg.namespace, cfg.trust_configmap);
    match cms.get_opt(&cfg.trust_configmap).await.map_err(|e| format!("{what}: {e}"))? {
        Some(have) if have.data.as_ref() == Some(&want) => Ok(()),
        Some(_) => cms.patch(&cfg.trust_configmap, &PatchParams::default(), &Patch::Merge(&cm)).await.map(|_| ()).map_err(|e| format!("{what}: {e}")),
        None => cms.create(&PostParams::default(), &cm).await.map(|_| ()).map_err(|e| format!("{what}: {e}")),
    }
}

fn csr_condition(kind: &str, reason: &str, message: &str) -> CertificateSigningRequestCondition {
    CertificateSigningRequestCondition {
        type_: kind.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_update_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    }
}

async fn run_authority(client: kube::Client, cfg: MeshConfig, metrics: Arc<Metrics>, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<(), String> {
    let a = cfg.authority.clone().expect("checked by the caller");
    let label = cfg.label()?;
    let auth = authority(&client, &cfg, &a).await?;
    let bundle = bundle_pem(&cfg, &a, &auth)?;
    let notify = Arc::new(Notify::new());
    let (pods, w) = reflector::store();
    spawn_reflector(w, Api::<Pod>::all(client.clone()), watcher::Config::default().timeout(crate::watch::WATCH_SECONDS), notify.clone(), metrics.clone());
    let (namespaces, w) = reflector::store();
    spawn_reflector(w, Api::<Namespace>::all(client.clone()), watcher::Config::default().timeout(crate::watch::WATCH_SECONDS), notify.clone(), metrics.clone());
    let (csrs, w) = reflector::store();
    spawn_reflector(
        w,
        Api::<CertificateSigningRequest>::all(client.clone()),
        watcher::Config::default().timeout(crate::watch::WATCH_SECONDS).fields(&format!("spec.signerName={}", cfg.signer)),
        notify.clone(),
        metrics.clone(),
    );
    let csr_api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut published = false;
    tracing::info!(signer = %cfg.signer, trust_domain = %cfg.trust_domain, "mesh: the authority is running");
    loop {
        if !published {
            match publish_bundle(&client, &cfg, &bundle).await {
                Ok(()) => published = true,
                Err(e) => tracing::warn!("mesh: the trust bundle: {e}"),
            }
        }
        if pods.wait_until_ready().await.is_ok() && namespaces.wait_until_ready().await.is_ok() {
            let meshed = meshed_namespaces(namespaces.state().iter().map(|n| n.as_ref()), &label);
            let place = placement(pods.state().iter().map(|p| p.as_ref()), &meshed);
            for csr in csrs.state() {
                let name = csr.metadata.name.clone().unwrap_or_default();
                match decide(&csr, &cfg, &a, &place) {
                    Decision::Done => {}
                    Decision::Deny(why) => {
                        tracing::warn!(request = %name, "mesh: denied: {why}");
                        let body = serde_json::json!({"status": {"conditions": [csr_condition("Denied", "NotAuthorized", &why)]}});
                        if let Err(e) = csr_api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&body)).await {
                            tracing::warn!(request = %name, "mesh: cannot deny: {}", api_error(e));
                        }
                    }
                    Decision::Sign { id, ttl } => {
                        if let Err(e) = sign(&csr_api, &auth, &csr, &name, &id, ttl).await {
                            tracing::warn!(request = %name, "mesh: cannot sign: {e}");
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
}

async fn sign(api: &Api<CertificateSigningRequest>, auth: &Authority, csr: &CertificateSigningRequest, name: &str, id: &SpiffeId, ttl: Duration) -> Result<(), String> {
    let cert = match auth.sign_request(id, &csr.spec.request.0, ttl, SystemTime::now()) {
        Ok(c) => c,
        Err(e) => {
            let body = serde_json::json!({"status": {"conditions": [csr_condition("Failed", "BadRequest", &e.to_string())]}});
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body)).await.map_err(|e| e.to_string())?;
            return Err(e.to_string());
        }
    };
    if !condition(csr, "Approved") {
        let body = serde_json::json!({"status": {"conditions": [csr_condition("Approved", "OnNode", &format!("the node runs a pod as {id}"))]}});
        api.patch_approval(name, &PatchParams::default(), &Patch::Merge(&body)).await.map_err(|e| format!("approve: {}", api_error(e)))?;
    }
    let pem = cert.to_pem().map_err(|e| e.to_string())?;
    let body = serde_json::json!({"status": {"certificate": ByteString(pem)}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body)).await.map_err(|e| format!("sign: {}", api_error(e)))?;
    tracing::info!(request = %name, identity = %id, ttl_s = ttl.as_secs(), "mesh: signed");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A node.

/// A signing request in flight: its object's name, the key it is for, when it was made.
struct Pending {
    name: String,
    key: boring::pkey::PKey<boring::pkey::Private>,
    since: Instant,
}

/// How long a request may wait for the authority before it is made again.
const REQUEST_PATIENCE: Duration = Duration::from_secs(60);
/// After a denial, how long before the same identity is asked for again.
const AFTER_DENIAL: Duration = Duration::from_secs(30);

async fn run_node(client: kube::Client, cfg: MeshConfig, metrics: Arc<Metrics>, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<(), String> {
    let n = cfg.node.clone().expect("checked by the caller");
    let label = cfg.label()?;
    std::fs::create_dir_all(&n.certs_dir).map_err(|e| format!("{}: {e}", n.certs_dir.display()))?;
    if let Some(d) = n.state_file.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let notify = Arc::new(Notify::new());
    let (pods, w) = reflector::store();
    spawn_reflector(w, Api::<Pod>::all(client.clone()), watcher::Config::default().timeout(crate::watch::WATCH_SECONDS), notify.clone(), metrics.clone());
    let (namespaces, w) = reflector::store();
    spawn_reflector(w, Api::<Namespace>::all(client.clone()), watcher::Config::default().timeout(crate::watch::WATCH_SECONDS), notify.clone(), metrics.clone());
    let (policies, w) = reflector::store();
    spawn_reflector(w, Api::<AuthorizationPolicy>::all(client.clone()), watcher::Config::default().timeout(crate::watch::WATCH_SECONDS), notify.clone(), metrics.clone());
    let (trust, w) = reflector::store();
    spawn_reflector(
        w,
        Api::<ConfigMap>::namespaced(client.clone(), &cfg.namespace),
        watcher::Config::default().timeout(crate::watch::WATCH_SECONDS).fields(&format!("metadata.name={}", cfg.trust_configmap)),
        notify.clone(),
        metrics.clone(),
    );
    let csr_api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut steering = match &n.steering {
        Some(s) => Some(Steering::new(s)?),
        None => None,
    };
    let mut pending: BTreeMap<(String, String), Pending> = BTreeMap::new();
    let mut refused: BTreeMap<(String, String), Instant> = BTreeMap::new();
    tracing::info!(node = %n.name, "mesh: the node agent is running");
    loop {
        // Nothing is written before every kind is listed: a state without the policies not
        // yet read would let through what they deny.
        let ready = tokio::time::timeout(Duration::from_secs(2), async {
            pods.wait_until_ready().await.is_ok() && namespaces.wait_until_ready().await.is_ok() && policies.wait_until_ready().await.is_ok()
        })
        .await
        .unwrap_or(false);
        if !ready {
            tracing::info!("mesh: waiting for Pods, Namespaces and AuthorizationPolicies to be listed (is the AuthorizationPolicy definition installed? docs/mesh.md)");
        } else {
            let meshed = meshed_namespaces(namespaces.state().iter().map(|n| n.as_ref()), &label);
            let pod_list = pods.state();
            let work = workloads(pod_list.iter().map(|p| p.as_ref()), &meshed);
            let mut pol: Vec<PolicyEntry> = policies
                .state()
                .iter()
                .map(|p| PolicyEntry {
                    namespace: p.metadata.namespace.clone().unwrap_or_default(),
                    name: p.metadata.name.clone().unwrap_or_default(),
                    spec: serde_json::Value::Object(p.spec.fields.clone()),
                })
                .collect();
            pol.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            let members: Vec<IpAddr> = work.iter().map(|w| w.ip).collect();
            let state = StateFile { workloads: work, policies: pol, root_namespace: Some(n.root_namespace.clone()) };
            match serde_json::to_vec_pretty(&state)
                .map_err(|e| e.to_string())
                .and_then(|b| write_if_changed(&n.state_file, &b).map_err(|e| format!("{}: {e}", n.state_file.display())))
            {
                Ok(true) => tracing::info!(workloads = state.workloads.len(), policies = state.policies.len(), "mesh: state written"),
                Ok(false) => {}
                Err(e) => tracing::warn!("mesh: {e}"),
            }
            if let Some(s) = &mut steering {
                if let Err(e) = s.push(members).await {
                    tracing::warn!("mesh: steering: {e}");
                }
            }
            let local: BTreeSet<(String, String)> = placement(pod_list.iter().map(|p| p.as_ref()), &meshed).accounts(&n.name).cloned().collect();
            let bundle = trust.state().iter().find_map(|c| c.data.as_ref().and_then(|d| d.get("bundle.pem")).cloned());
            match bundle {
                None => tracing::info!("mesh: no trust bundle yet ({}/{})", cfg.namespace, cfg.trust_configmap),
                Some(pem) => {
                    if let Err(e) = certificates(&cfg, &n, &csr_api, &pem, &local, &mut pending, &mut refused).await {
                        tracing::warn!("mesh: certificates: {e}");
                    }
                }
            }
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(if pending.is_empty() { 5 } else { 1 })) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
}

/// Brings the certificates directory to `local`'s identities: the bundle, a good certificate
/// for each (asked for when missing or half-way through its life), none for any other.
async fn certificates(
    cfg: &MeshConfig,
    n: &NodeConfig,
    api: &Api<CertificateSigningRequest>,
    bundle_pem: &str,
    local: &BTreeSet<(String, String)>,
    pending: &mut BTreeMap<(String, String), Pending>,
    refused: &mut BTreeMap<(String, String), Instant>,
) -> Result<(), String> {
    let bundle = Bundle::from_pem(&cfg.trust_domain, bundle_pem.as_bytes()).map_err(|e| format!("the trust bundle: {e}"))?;
    let dir = &n.certs_dir;
    if write_if_changed(&dir.join("bundle.pem"), bundle_pem.as_bytes()).map_err(|e| format!("{}: {e}", dir.display()))? {
        tracing::info!("mesh: trust bundle written");
    }
    // Identities no pod here runs any more: their keys go.
    for e in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(base) = name.strip_suffix(".key").or_else(|| name.strip_suffix(".pem")) else { continue };
        if base == "bundle" {
            continue;
        }
        let keep = base.split_once('.').is_some_and(|(ns, sa)| local.contains(&(ns.to_string(), sa.to_string())));
        if !keep {
            let _ = std::fs::remove_file(e.path());
            tracing::info!(file = %name, "mesh: removed (no pod of its account on this node)");
        }
    }
    pending.retain(|k, _| local.contains(k));
    let now = SystemTime::now();
    let mut errors = Vec::new();
    for (ns, sa) in local {
        if let Err(e) = one_certificate(cfg, n, api, &bundle, ns, sa, now, pending, refused).await {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// One identity's certificate: the answer to its request in flight, or a new request when it
/// has none good.
#[allow(clippy::too_many_arguments)]
async fn one_certificate(
    cfg: &MeshConfig,
    n: &NodeConfig,
    api: &Api<CertificateSigningRequest>,
    bundle: &Bundle,
    ns: &str,
    sa: &str,
    now: SystemTime,
    pending: &mut BTreeMap<(String, String), Pending>,
    refused: &mut BTreeMap<(String, String), Instant>,
) -> Result<(), String> {
    let dir = &n.certs_dir;
    let key = (ns.to_string(), sa.to_string());
    if let Some(p) = pending.get(&key) {
        let csr = match api.get_opt(&p.name).await {
            Ok(c) => c,
            Err(e) => return Err(format!("request {}: {}", p.name, api_error(e))),
        };
        let Some(csr) = csr else {
            pending.remove(&key);
            return Ok(());
        };
        if condition(&csr, "Denied") || condition(&csr, "Failed") {
            let why = csr.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find_map(|c| c.message.clone())).unwrap_or_default();
            tracing::warn!(identity = %format!("{ns}/{sa}"), "mesh: the authority refused: {why}");
            let _ = api.delete(&p.name, &DeleteParams::default()).await;
            pending.remove(&key);
            refused.insert(key, Instant::now());
            return Ok(());
        }
        if let Some(cert) = csr.status.as_ref().and_then(|s| s.certificate.as_ref()).filter(|c| !c.0.is_empty()) {
            // Taken or not, the request is done: a certificate that does not fit (not PEM, not
            // for this key or identity, not the bundle's) is asked for again, not read forever.
            let took = take_certificate(dir, bundle, ns, sa, &p.key, &cert.0);
            let name = p.name.clone();
            let _ = api.delete(&name, &DeleteParams::default()).await;
            pending.remove(&key);
            return took.map_err(|e| format!("request {name}: {e}"));
        }
        if p.since.elapsed() > REQUEST_PATIENCE {
            tracing::warn!(request = %p.name, "mesh: no answer from the authority; asking again");
            let _ = api.delete(&p.name, &DeleteParams::default()).await;
            pending.remove(&key);
        }
        return Ok(());
    }
    if still_good(dir, ns, sa, bundle, now) {
        return Ok(());
    }
    if refused.get(&key).is_some_and(|t| t.elapsed() < AFTER_DENIAL) {
        return Ok(());
    }
    let id = SpiffeId::new(&cfg.trust_domain, ns, sa).map_err(|e| e.to_string())?;
    let k = ca::new_key().map_err(|e| e.to_string())?;
    let req = ca::request(&id, &k).map_err(|e| e.to_string())?;
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("vectorlb-mesh-".into()),
            annotations: Some(BTreeMap::from([(IDENTITY_ANNOTATION.to_string(), format!("{ns}/{sa}"))])),
            labels: Some(BTreeMap::from([(NODE_LABEL.to_string(), n.name.clone())])),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(req.into_bytes()),
            signer_name: cfg.signer.clone(),
            expiration_seconds: Some(n.ttl_seconds as i32),
            usages: Some(vec!["digital signature".into(), "client auth".into(), "server auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let made = api.create(&PostParams::default(), &csr).await.map_err(|e| format!("asking for {id}: {}", api_error(e)))?;
    let name = made.metadata.name.unwrap_or_default();
    tracing::info!(identity = %id, request = %name, "mesh: certificate asked for");
    pending.insert(key, Pending { name, key: k, since: Instant::now() });
    Ok(())
}

/// Writes an answered request's certificate (PEM chain) and its key for (ns, sa), once the
/// certificate is for that key and identity and the bundle verifies it.
fn take_certificate(dir: &Path, bundle: &Bundle, ns: &str, sa: &str, key: &boring::pkey::PKey<boring::pkey::Private>, pem: &[u8]) -> Result<(), String> {
    let chain = boring::x509::X509::stack_from_pem(pem).map_err(|e| format!("the certificate: {e}"))?;
    let svid = Svid::new(key.clone(), chain).map_err(|e| e.to_string())?;
    bundle.verify(&svid.chain[0], &svid.chain[1..]).map_err(|e| format!("the certificate does not verify with the bundle: {e}"))?;
    if svid.id.namespace() != ns || svid.id.account() != sa {
        return Err(format!("a certificate for {}, not {ns}/{sa}", svid.id));
    }
    let (kp, cp) = cert_paths(dir, ns, sa);
    ca::write_private(&kp, &key.private_key_to_pem_pkcs8().map_err(|e| e.to_string())?).map_err(|e| format!("{}: {e}", kp.display()))?;
    ca::write_private(&cp, pem).map_err(|e| format!("{}: {e}", cp.display()))?;
    tracing::info!(identity = %svid.id, serial = %svid.serial(), "mesh: certificate written");
    Ok(())
}

/// The daemon's steering, pushed when the members change or the daemon forgot it.
struct Steering {
    api: vectorlb_wire::Api,
    cfg: SteeringConfig,
    pushed: Option<Vec<IpAddr>>,
}

impl Steering {
    fn new(cfg: &SteeringConfig) -> Result<Steering, String> {
        let token = match &cfg.token_file {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?.trim().to_string()),
            None => None,
        };
        let api = vectorlb_wire::Api::new(&cfg.api, token).map_err(|e| format!("{}: {e}", cfg.api))?;
        Ok(Steering { api, cfg: cfg.clone(), pushed: None })
    }

    async fn push(&mut self, members: Vec<IpAddr>) -> Result<(), String> {
        if self.pushed.as_ref() == Some(&members) {
            // The daemon keeps no steering across a restart: look.
            let st: vectorlb_api::model::MeshStatus = self.api.get("/v1/mesh").await.map_err(|e| e.to_string())?;
            if st.enabled && st.members == members.len() as u64 {
                return Ok(());
            }
        }
        let body = vectorlb_api::model::MeshSteering {
            proxy_container_id: self.cfg.proxy_container_id.clone(),
            proxy_ifname: self.cfg.proxy_ifname.clone(),
            members: members.clone(),
            tunnel_port: Some(self.cfg.tunnel_port),
        };
        let _: vectorlb_api::model::MeshStatus = self.api.call(vectorlb_wire::call::Method::PUT, "/v1/mesh", Some(&body)).await.map_err(|e| e.to_string())?;
        tracing::info!(members = members.len(), "mesh: steering pushed");
        self.pushed = Some(members);
        Ok(())
    }
}

/// Runs the configured roles until SIGTERM or SIGINT.
pub async fn run(client: kube::Client, cfg: MeshConfig, metrics: Arc<Metrics>, stop: tokio::sync::watch::Receiver<bool>) -> Result<(), String> {
    let mut tasks = Vec::new();
    if cfg.authority.is_some() {
        tasks.push(tokio::spawn(run_authority(client.clone(), cfg.clone(), metrics.clone(), stop.clone())));
    }
    if cfg.node.is_some() {
        tasks.push(tokio::spawn(run_node(client.clone(), cfg.clone(), metrics.clone(), stop.clone())));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(extra: &str) -> MeshConfig {
        let c: MeshConfig = toml::from_str(&format!("[authority]\n{extra}")).unwrap();
        c.check().unwrap();
        c
    }

    fn ns(name: &str, labels: serde_json::Value) -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn pod(ns: &str, sa: Option<&str>, node: &str, ips: &[&str], extra: serde_json::Value) -> Pod {
        let mut p = json!({"metadata": {"name": format!("p-{}", ips.first().unwrap_or(&"x")), "namespace": ns, "labels": {"app": "a"}},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "podIP": ips.first(), "podIPs": ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>()}});
        if let Some(sa) = sa {
            p["spec"]["serviceAccountName"] = json!(sa);
        }
        merge(&mut p, &extra);
        serde_json::from_value(p).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: &serde_json::Value) {
        if let (Some(a), Some(b)) = (a.as_object_mut(), b.as_object()) {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        } else if !b.is_null() {
            *a = b.clone();
        }
    }

    fn label() -> (String, String) {
        cfg("").label().unwrap()
    }

    #[test]
    fn configuration_is_checked() {
        for (text, want) in [
            ("", "neither [authority] nor [node]"),
            ("namespace_label = \"x\"\n[authority]\n", "KEY=VALUE"),
            ("signer = \"nodomain\"\n[authority]\n", "DOMAIN/NAME"),
            ("[authority]\nmax_ttl_seconds = 5\n", "max_ttl_seconds 5"),
            ("[authority]\ncert_file = \"/x\"\n", "go together"),
            ("[authority]\nnode_user_prefix = \"\"\n", "no node could ask"),
            ("[node]\nname = \"\"\nstate_file = \"/s\"\ncerts_dir = \"/c\"\n", "node.name is empty"),
            ("trust_domain = \"bad domain!\"\n[authority]\n", "trust_domain"),
            ("[node]\nname = \"n\"\nstate_file = \"/s\"\ncerts_dir = \"/c\"\nttl_seconds = 60\n", "the API's least"),
        ] {
            let e = toml::from_str::<MeshConfig>(text).map_err(|e| e.to_string()).and_then(|c| c.check()).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert!(toml::from_str::<MeshConfig>("[authority]\nsecrett = \"x\"\n").is_err(), "unknown fields are refused");
        let mut c: MeshConfig = toml::from_str("[node]\nstate_file = \"/s\"\ncerts_dir = \"/c\"\n").unwrap();
        assert!(c.check().unwrap_err().contains("NODE_NAME"));
        c.node_name_from(Some("node-7".into()));
        assert_eq!(c.node.as_ref().unwrap().name, "node-7");
        c.check().unwrap();
        c.node_name_from(Some("other".into()));
        assert_eq!(c.node.as_ref().unwrap().name, "node-7", "the file's name wins");
    }

    #[test]
    fn meshed_pods_are_those_of_labelled_namespaces_with_their_own_network() {
        let nss = [ns("shop", json!({"vectorlb.io/mesh": "enabled"})), ns("jobs", json!({"vectorlb.io/mesh": "disabled"})), ns("other", json!({}))];
        let meshed = meshed_namespaces(&nss, &label());
        assert_eq!(meshed, BTreeSet::from(["shop".to_string()]));
        let pods = [
            pod("shop", Some("web"), "n1", &["10.0.0.1", "fd00::1"], json!({})),
            pod("shop", None, "n2", &["10.0.0.2"], json!({})),
            pod("shop", Some("x"), "n1", &["10.0.0.3"], json!({"spec": {"hostNetwork": true}})),
            pod("shop", Some("x"), "n1", &["10.0.0.4"], json!({"status": {"phase": "Succeeded"}})),
            pod("jobs", Some("batch"), "n1", &["10.0.0.5"], json!({})),
            pod("shop", Some("y"), "n1", &[], json!({"status": {"phase": "Pending"}})),
        ];
        let w = workloads(&pods, &meshed);
        let got: Vec<(String, &str, &str, &str)> = w.iter().map(|w| (w.ip.to_string(), w.namespace.as_str(), w.account.as_str(), w.node.as_str())).collect();
        assert_eq!(
            got,
            vec![("10.0.0.1".into(), "shop", "web", "n1"), ("10.0.0.2".into(), "shop", "default", "n2"), ("fd00::1".into(), "shop", "web", "n1")],
            "both families, the default account, not the host's network, not finished pods, not other namespaces"
        );
        assert_eq!(w[0].labels.get("app").map(String::as_str), Some("a"));
        let p = placement(&pods, &meshed);
        assert_eq!(
            p.accounts("n1").cloned().collect::<Vec<_>>(),
            vec![("shop".into(), "web".into()), ("shop".into(), "y".into())],
            "a pending pod's account too: it gets its certificate before it runs"
        );
        assert_eq!(p.accounts("n2").cloned().collect::<Vec<_>>(), vec![("shop".into(), "default".into())]);
    }

    fn spec(user: &str, groups: &[&str], extra: serde_json::Value) -> CertificateSigningRequestSpec {
        serde_json::from_value(json!({"request": "", "signerName": "vectorlb.io/mesh-workload", "username": user, "groups": groups, "extra": extra})).unwrap()
    }

    #[test]
    fn the_node_is_what_the_api_server_recorded_of_the_requester() {
        let c = cfg("node_accounts = [\"system:serviceaccount:vectorlb-system:vectorlb-mesh-node\"]\n");
        let a = c.authority.as_ref().unwrap();
        assert_eq!(requester_node(&spec("system:node:n1", &["system:nodes", "system:authenticated"], json!({})), a).unwrap(), "n1");
        assert!(requester_node(&spec("system:node:n1", &["system:authenticated"], json!({})), a).unwrap_err().contains("not in the group system:nodes"));
        assert!(requester_node(&spec("system:node:", &["system:nodes"], json!({})), a).is_err());
        assert!(requester_node(&spec("alice", &["system:masters"], json!({})), a).unwrap_err().contains("not a node"));
        let sa = "system:serviceaccount:vectorlb-system:vectorlb-mesh-node";
        assert_eq!(requester_node(&spec(sa, &[], json!({NODE_NAME_EXTRA: ["n2"]})), a).unwrap(), "n2");
        assert!(requester_node(&spec(sa, &[], json!({})), a).unwrap_err().contains("without a token bound"));
        assert!(requester_node(&spec(sa, &[], json!({NODE_NAME_EXTRA: ["n1", "n2"]})), a).is_err());
        assert!(requester_node(&spec("system:serviceaccount:other:x", &[], json!({NODE_NAME_EXTRA: ["n2"]})), a).is_err(), "only the configured accounts' claims count");
    }

    fn csr(user: &str, identity: Option<&str>, status: serde_json::Value) -> CertificateSigningRequest {
        let mut v = json!({"metadata": {"name": "r"}, "spec": {"request": "", "signerName": "vectorlb.io/mesh-workload", "username": user, "groups": ["system:nodes"], "expirationSeconds": 7200}, "status": status});
        if let Some(i) = identity {
            v["metadata"]["annotations"] = json!({IDENTITY_ANNOTATION: i});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_authority_signs_only_for_accounts_the_node_runs() {
        let c = cfg("max_ttl_seconds = 3600\n");
        let a = c.authority.as_ref().unwrap();
        let mut place = Placement::default();
        place.insert("n1", "shop", "web");
        place.insert("n2", "shop", "db");
        match decide(&csr("system:node:n1", Some("shop/web"), json!({})), &c, a, &place) {
            Decision::Sign { id, ttl } => {
                assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/web");
                assert_eq!(ttl, Duration::from_secs(3600), "capped at max_ttl_seconds");
            }
            d => panic!("{d:?}"),
        }
        let d = decide(&csr("system:node:n1", Some("shop/db"), json!({})), &c, a, &place);
        assert!(matches!(&d, Decision::Deny(m) if m.contains("node n1 has no pod running as db")), "{d:?}");
        assert!(matches!(decide(&csr("system:node:n1", None, json!({})), &c, a, &place), Decision::Deny(m) if m.contains(IDENTITY_ANNOTATION)));
        assert!(matches!(decide(&csr("system:node:n1", Some("shop/../x"), json!({})), &c, a, &place), Decision::Deny(_)));
        assert!(matches!(decide(&csr("mallory", Some("shop/web"), json!({})), &c, a, &place), Decision::Deny(_)));
        assert_eq!(decide(&csr("system:node:n1", Some("shop/web"), json!({"conditions": [{"type": "Denied", "status": "True"}]})), &c, a, &place), Decision::Done);
        assert_eq!(decide(&csr("system:node:n1", Some("shop/web"), json!({"certificate": "eA=="})), &c, a, &place), Decision::Done);
        let mut other = csr("system:node:n1", Some("shop/web"), json!({}));
        other.spec.signer_name = "kubernetes.io/kube-apiserver-client".into();
        assert_eq!(decide(&other, &c, a, &place), Decision::Done, "another signer's requests are not ours");
    }

    #[test]
    fn an_answer_is_written_only_when_it_fits_the_key_the_identity_and_the_bundle() {
        let dir = std::env::temp_dir().join(format!("vectorlb-mesh-take-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let auth = Authority::generate("cluster.local", Duration::from_secs(3600)).unwrap();
        let bundle = Bundle::new("cluster.local", vec![auth.certificate().clone()]).unwrap();
        let key = ca::new_key().unwrap();
        let web = SpiffeId::new("cluster.local", "shop", "web").unwrap();
        let signed = |id: &SpiffeId, k: &boring::pkey::PKey<boring::pkey::Private>| auth.issue(id, k, Duration::from_secs(600), SystemTime::now()).unwrap().to_pem().unwrap();
        let other_key = ca::new_key().unwrap();
        let stranger = Authority::generate("cluster.local", Duration::from_secs(3600)).unwrap();
        for (pem, why) in [
            (b"not a certificate".to_vec(), "empty certificate chain"),
            (signed(&web, &other_key), "does not belong"),
            (signed(&SpiffeId::new("cluster.local", "shop", "db").unwrap(), &key), "not shop/web"),
            (stranger.issue(&web, &key, Duration::from_secs(600), SystemTime::now()).unwrap().to_pem().unwrap(), "does not verify"),
        ] {
            let e = take_certificate(&dir, &bundle, "shop", "web", &key, &pem).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
            assert!(!dir.join("shop.web.key").exists() && !dir.join("shop.web.pem").exists());
        }
        take_certificate(&dir, &bundle, "shop", "web", &key, &signed(&web, &key)).unwrap();
        assert!(still_good(&dir, "shop", "web", &bundle, SystemTime::now()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_certificate_is_good_until_half_its_life_with_the_bundle_that_signed_it() {
        let dir = std::env::temp_dir().join(format!("vectorlb-mesh-good-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let auth = Authority::generate("cluster.local", Duration::from_secs(3600)).unwrap();
        let bundle = Bundle::new("cluster.local", vec![auth.certificate().clone()]).unwrap();
        let id = SpiffeId::new("cluster.local", "shop", "web").unwrap();
        assert!(!still_good(&dir, "shop", "web", &bundle, SystemTime::now()), "none yet");
        auth.issue_to_dir(std::slice::from_ref(&id), &bundle, Duration::from_secs(600), &dir).unwrap();
        let now = SystemTime::now();
        assert!(still_good(&dir, "shop", "web", &bundle, now));
        assert!(!still_good(&dir, "shop", "web", &bundle, now + Duration::from_secs(301)), "renewed at half its life");
        assert!(!still_good(&dir, "shop", "db", &bundle, now), "another account's file is not this one's");
        let other = Authority::generate("cluster.local", Duration::from_secs(3600)).unwrap();
        let other_bundle = Bundle::new("cluster.local", vec![other.certificate().clone()]).unwrap();
        assert!(!still_good(&dir, "shop", "web", &other_bundle, now), "a new authority alone: asked for again");
        std::fs::write(dir.join("shop.web.key"), "not a key").unwrap();
        assert!(!still_good(&dir, "shop", "web", &bundle, now));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
