//! The controller's configuration file (TOML).

use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// `vectorlb kube run --config FILE`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeConfig {
    /// The `loadBalancerClass` this controller implements.
    #[serde(default = "default_class")]
    pub class: String,
    /// Also take Services of type LoadBalancer that name no class (as the cluster's default
    /// load balancer implementation; leave false when another one runs).
    #[serde(default)]
    pub classless: bool,
    /// Where the controller's Lease lives (leader election) and its own Events go.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The Lease's name.
    #[serde(default = "default_lease")]
    pub lease: String,
    /// Seconds a Lease holds without renewal.
    #[serde(default = "default_lease_seconds")]
    pub lease_seconds: u32,
    /// The controller's metrics (Prometheus text on /metrics) and health (/healthz):
    /// ADDRESS:PORT, or none.
    #[serde(default)]
    pub metrics: Option<String>,
    /// Seconds between full comparisons with each daemon's services (changes are pushed at
    /// once; this catches a daemon that restarted or was changed by hand).
    #[serde(default = "default_resync")]
    pub resync_seconds: u32,
    /// The data-plane daemons this controller programs: every Service on every daemon.
    #[serde(default)]
    pub daemons: Vec<DaemonRef>,
    /// The Gateway API (GatewayClasses naming `controller_name`) on `vectorlb proxy`.
    #[serde(default)]
    pub gateway: Option<GatewayConfig>,
    /// Every Service's cluster IPs and NodePorts on the daemons (a node's pod network,
    /// docs/pod-network.md), as kube-proxy serves them.
    #[serde(default)]
    pub cluster_ips: Option<ClusterIpConfig>,
    /// NetworkPolicy enforced by the daemons for this node's Pods (docs/network-policy.md).
    #[serde(default)]
    pub network_policy: Option<NetworkPolicyConfig>,
}

/// `[network_policy]`: the cluster's NetworkPolicies compiled for this node's Pods and pushed
/// to the daemons (`POST /v1/policy`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicyConfig {
    /// This node's name (its Pods are the daemons' endpoints); default: `cluster_ips.node_name`.
    #[serde(default)]
    pub node_name: Option<String>,
    /// The node's own addresses, whose traffic to its Pods is allowed whatever the policies say
    /// (the kubelet's probes); default: `cluster_ips.node_addresses` and `masquerade`.
    #[serde(default)]
    pub node_addresses: Option<Vec<IpAddr>>,
}

impl KubeConfig {
    /// `[network_policy]`'s node and node addresses, with their defaults; None without it.
    pub fn policy_node(&self) -> Option<(String, Vec<IpAddr>)> {
        let n = self.network_policy.as_ref()?;
        let c = self.cluster_ips.as_ref();
        let node = n.node_name.clone().or_else(|| c.and_then(|c| c.node_name.clone()))?;
        let addrs = n.node_addresses.clone().unwrap_or_else(|| c.map(|c| c.node_addresses.iter().chain(&c.masquerade).copied().collect()).unwrap_or_default());
        Some((node, addrs))
    }
}

/// `[cluster_ips]`: Services east-west. Each of a Service's cluster IPs (inside
/// `service_cidrs`) becomes a `nat` service of the daemons, Maglev unless annotated; each
/// NodePort a service on every `node_addresses` address of the Service's families.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterIpConfig {
    /// The API server's `--service-cluster-ip-range` (a prefix per family): cluster IPs inside
    /// them are served, and every daemon service on them is the controller's.
    pub service_cidrs: Vec<String>,
    /// The node's data-plane addresses that NodePorts are served on (none: no NodePorts).
    #[serde(default)]
    pub node_addresses: Vec<IpAddr>,
    /// The source address (one per family) that NodePort traffic of `externalTrafficPolicy:
    /// Cluster` Services is translated to, as kube-proxy masquerades it: an address of this
    /// node's data plane that the other nodes route here (its pods port's own address), so
    /// that an endpoint on another node answers through this node. None: NodePorts keep the
    /// client's address and should have their endpoints on this node.
    #[serde(default)]
    pub masquerade: Vec<IpAddr>,
    /// The cluster's pod networks (kube-proxy's `--cluster-cidr`, a prefix per family): with
    /// `masquerade`, a client of a cluster IP from outside them (the node itself, a
    /// `hostNetwork` Pod) is translated to the masquerade address of its family, so that an
    /// endpoint on another node answers through this node; Pods keep their address.
    #[serde(default)]
    pub cluster_cidrs: Vec<String>,
    /// This node's name (its Node object): with it, Services of `internalTrafficPolicy: Local`
    /// (cluster IPs) and `externalTrafficPolicy: Local` (NodePorts, which then keep the
    /// client's address) get only the endpoints on this node. Without it, every endpoint.
    #[serde(default)]
    pub node_name: Option<String>,
}

/// `[gateway]`: Gateways are served by these proxies, reached through the daemons at the
/// Gateway's address.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The GatewayClasses' `spec.controllerName` this controller serves.
    #[serde(default = "default_gateway_controller")]
    pub controller_name: String,
    /// The proxies' settings that are not the Gateways' (`workers`, `[admin]`, `access_log`):
    /// a proxy configuration file without listeners, routes or clusters.
    pub base_file: PathBuf,
    /// The address the proxies' Gateway listeners bind.
    #[serde(default = "default_listen")]
    pub listen: IpAddr,
    /// The proxies' ports for Gateway listeners, `FIRST-LAST`.
    #[serde(default = "default_ports")]
    pub ports: String,
    /// The most of them the Gateways of one namespace hold (the routed ports of its Services
    /// count too).
    #[serde(default = "default_ports_per_namespace")]
    pub ports_per_namespace: usize,
    /// The Gateway API for meshes: HTTPRoutes whose parent is a Service are served by these
    /// proxies, each routed port of the Service's cluster IPs (and NodePorts) sent to them
    /// (docs/mesh.md, "Routes").
    #[serde(default)]
    pub mesh: bool,
    #[serde(default)]
    pub proxies: Vec<ProxyRef>,
}

/// One `vectorlb proxy`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyRef {
    pub name: String,
    /// Its admin API: `unix:PATH` or `ADDRESS:PORT`.
    pub admin: String,
    /// A file with its admin token (ADDRESS:PORT).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Where the daemons send a Gateway's connections (the proxy's address).
    pub address: IpAddr,
}

impl GatewayConfig {
    /// The port range as numbers.
    pub fn port_range(&self) -> Result<(u16, u16), String> {
        let (a, b) = self.ports.split_once('-').ok_or_else(|| format!("gateway.ports '{}': FIRST-LAST", self.ports))?;
        let (a, b): (u16, u16) = (
            a.trim().parse().map_err(|_| format!("gateway.ports '{}': FIRST-LAST", self.ports))?,
            b.trim().parse().map_err(|_| format!("gateway.ports '{}': FIRST-LAST", self.ports))?,
        );
        if a == 0 || a > b {
            return Err(format!("gateway.ports '{}': FIRST-LAST with 0 < FIRST <= LAST", self.ports));
        }
        Ok((a, b))
    }
}

fn default_gateway_controller() -> String {
    "vectorlb.io/gateway".into()
}
fn default_listen() -> IpAddr {
    IpAddr::from([0, 0, 0, 0])
}
fn default_ports() -> String {
    "30000-30999".into()
}

fn default_ports_per_namespace() -> usize {
    64
}

/// One vectorlb daemon.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonRef {
    pub name: String,
    /// Its control API: `unix:PATH` or `ADDRESS:PORT`.
    pub api: String,
    /// A file with its API token (the daemon's `runtime.api_token_file`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Its local addresses for full-NAT services (the source of connections to Pods).
    #[serde(default)]
    pub local_addrs: Vec<IpAddr>,
    /// Its group peers' local addresses (scale-out: `peer_local_addrs`).
    #[serde(default)]
    pub peer_local_addrs: Vec<IpAddr>,
}

fn default_class() -> String {
    "vectorlb.io/lb".into()
}
fn default_namespace() -> String {
    "vectorlb-system".into()
}
fn default_lease() -> String {
    "vectorlb-controller".into()
}
fn default_lease_seconds() -> u32 {
    15
}
fn default_resync() -> u32 {
    10
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Parse(PathBuf, String),
    #[error("{0}: {1}")]
    Invalid(PathBuf, String),
}

impl KubeConfig {
    pub fn load(path: &Path) -> Result<KubeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.into(), e))?;
        let c: KubeConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse(path.into(), e.to_string()))?;
        c.validate().map_err(|e| ConfigError::Invalid(path.into(), e))?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.class.is_empty() || self.class.len() > 63 + 254 || !self.class.contains('/') {
            return Err(format!("class '{}': a loadBalancerClass is a domain-prefixed name such as vectorlb.io/lb", self.class));
        }
        if !(5..=3600).contains(&self.lease_seconds) {
            return Err(format!("lease_seconds {}: from 5 to 3600", self.lease_seconds));
        }
        if !(1..=3600).contains(&self.resync_seconds) {
            return Err(format!("resync_seconds {}: from 1 to 3600", self.resync_seconds));
        }
        let mut names = std::collections::BTreeSet::new();
        for d in &self.daemons {
            if !names.insert(d.name.as_str()) {
                return Err(format!("daemon '{}' is named twice", d.name));
            }
            d.api.parse::<vectorlb_wire::call::Target>().map_err(|e| format!("daemon '{}': {e}", d.name))?;
        }
        if let Some(c) = &self.cluster_ips {
            if c.service_cidrs.is_empty() {
                return Err("cluster_ips.service_cidrs: the API server's service ranges (at least one)".into());
            }
            for r in &c.service_cidrs {
                if !r.contains('/') {
                    return Err(format!("cluster_ips.service_cidrs '{r}': a prefix, ADDRESS/LENGTH"));
                }
                crate::ipam::parse_range(r).map_err(|e| format!("cluster_ips.service_cidrs {e}"))?;
            }
            for a in &c.node_addresses {
                if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
                    return Err(format!("cluster_ips.node_addresses {a}: not a unicast address of the node"));
                }
            }
            for r in &c.cluster_cidrs {
                if !r.contains('/') {
                    return Err(format!("cluster_ips.cluster_cidrs '{r}': a prefix, ADDRESS/LENGTH"));
                }
                crate::ipam::parse_range(r).map_err(|e| format!("cluster_ips.cluster_cidrs {e}"))?;
            }
            for a in &c.masquerade {
                if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
                    return Err(format!("cluster_ips.masquerade {a}: not a unicast address of the node"));
                }
                if c.masquerade.iter().filter(|b| b.is_ipv4() == a.is_ipv4()).count() > 1 {
                    return Err(format!("cluster_ips.masquerade: one address per family ({a} has another of its family)"));
                }
            }
        }
        if self.network_policy.is_some() && self.policy_node().is_none() {
            return Err("network_policy: node_name (or cluster_ips.node_name): the node whose Pods the daemons hold".into());
        }
        if let Some(g) = &self.gateway {
            if g.controller_name.is_empty() || !g.controller_name.contains('/') {
                return Err(format!("gateway.controller_name '{}': a domain-prefixed name such as vectorlb.io/gateway", g.controller_name));
            }
            g.port_range()?;
            let mut names = std::collections::BTreeSet::new();
            for p in &g.proxies {
                if !names.insert(p.name.as_str()) {
                    return Err(format!("gateway proxy '{}' is named twice", p.name));
                }
                p.admin.parse::<vectorlb_wire::call::Target>().map_err(|e| format!("gateway proxy '{}': {e}", p.name))?;
            }
        }
        if let Some(m) = &self.metrics {
            m.parse::<std::net::SocketAddr>().map_err(|_| format!("metrics '{m}': ADDRESS:PORT"))?;
        }
        Ok(())
    }
}
