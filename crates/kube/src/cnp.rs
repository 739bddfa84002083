//! `ClusterNetworkPolicy` (`policy.networking.k8s.io/v1beta1`, the SIG's network-policy-api
//! v0.3.0): the admin policies, read by the controller. Its two tiers are the data plane's
//! admin and baseline tiers (docs/network-policy.md). Read only: the controller writes no
//! status. The CRD is the SIG's (installed from its module, scripts/network-policy-api.sh).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(group = "policy.networking.k8s.io", version = "v1beta1", kind = "ClusterNetworkPolicy", plural = "clusternetworkpolicies")]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicySpec {
    /// `Admin` (before NetworkPolicy) or `Baseline` (after it).
    pub tier: String,
    /// Lower first within a tier.
    pub priority: i32,
    pub subject: Subject,
    #[serde(default)]
    pub ingress: Vec<IngressRule>,
    #[serde(default)]
    pub egress: Vec<EgressRule>,
}

/// The Pods a policy is about: those of namespaces, or Pods by namespace and labels.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    #[serde(default)]
    pub namespaces: Option<LabelSelector>,
    #[serde(default)]
    pub pods: Option<NamespacedPod>,
}

/// Pods by the labels of their namespace and their own; a selector left out selects all.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    #[serde(default)]
    pub pod_selector: LabelSelector,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressRule {
    #[serde(default)]
    pub name: Option<String>,
    /// `Accept`, `Deny` or `Pass` (Admin tier only).
    pub action: String,
    #[serde(default)]
    pub from: Vec<Peer>,
    #[serde(default)]
    pub protocols: Vec<Protocol>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressRule {
    #[serde(default)]
    pub name: Option<String>,
    pub action: String,
    #[serde(default)]
    pub to: Vec<Peer>,
    #[serde(default)]
    pub protocols: Vec<Protocol>,
}

/// A peer: namespaces, Pods, and (egress only) nodes and networks. Domain names (an
/// experimental feature) are not supported: a rule naming only them matches nothing.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    #[serde(default)]
    pub namespaces: Option<LabelSelector>,
    #[serde(default)]
    pub pods: Option<NamespacedPod>,
    #[serde(default)]
    pub nodes: Option<LabelSelector>,
    #[serde(default)]
    pub networks: Vec<String>,
    #[serde(default)]
    pub domain_names: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Protocol {
    #[serde(default)]
    pub tcp: Option<Ports>,
    #[serde(default)]
    pub udp: Option<Ports>,
    #[serde(default)]
    pub sctp: Option<Ports>,
    #[serde(default)]
    pub destination_named_port: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ports {
    /// None: every port of the protocol.
    #[serde(default)]
    pub destination_port: Option<Port>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default)]
    pub number: Option<i32>,
    #[serde(default)]
    pub range: Option<PortRange>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortRange {
    pub start: i32,
    pub end: i32,
}
