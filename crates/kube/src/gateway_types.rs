//! The Gateway API objects this controller reads (gateway.networking.k8s.io/v1): the fields it
//! acts on, typed; everything else is kept as JSON so that what it does not support is seen
//! and reported rather than dropped. The resource definitions themselves are the project's
//! (`sigs.k8s.io/gateway-api`, installed from its module: `scripts/gateway-crds.sh`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

pub const GROUP: &str = "gateway.networking.k8s.io";
pub const VERSION: &str = "v1";

/// `kube::Resource` for a Gateway API kind (static type information: group, version, plural).
macro_rules! gateway_kind {
    ($t:ident, $kind:literal, $plural:literal, $scope:ty) => {
        gateway_kind!($t, $kind, $plural, $scope, VERSION);
    };
    ($t:ident, $kind:literal, $plural:literal, $scope:ty, $version:expr) => {
        impl kube::Resource for $t {
            type DynamicType = ();
            type Scope = $scope;
            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct GatewayClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GatewayClassSpec,
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}
gateway_kind!(GatewayClass, "GatewayClass", "gatewayclasses", k8s_openapi::ClusterResourceScope);

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    #[serde(default)]
    pub controller_name: String,
    #[serde(default)]
    pub parameters_ref: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct Gateway {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GatewaySpec,
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}
gateway_kind!(Gateway, "Gateway", "gateways", k8s_openapi::NamespaceResourceScope);

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    #[serde(default)]
    pub gateway_class_name: String,
    #[serde(default)]
    pub listeners: Vec<Listener>,
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct GatewayAddress {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    pub name: String,
    #[serde(default)]
    pub hostname: Option<String>,
    pub port: i32,
    pub protocol: String,
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    #[serde(default)]
    pub allowed_routes: Option<AllowedRoutes>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub certificate_refs: Vec<ObjectRef>,
}

/// A reference to an object by group, kind, name and namespace (SecretObjectReference,
/// BackendObjectReference, ParentReference share these fields).
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    /// ParentReference: the listener's name.
    #[serde(default)]
    pub section_name: Option<String>,
    /// ParentReference: the listener's port; BackendObjectReference: the Service's port.
    #[serde(default)]
    pub port: Option<i32>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    #[serde(default)]
    pub namespaces: Option<RouteNamespaces>,
    #[serde(default)]
    pub kinds: Vec<RouteGroupKind>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub selector: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq)]
pub struct RouteGroupKind {
    #[serde(default)]
    pub group: Option<String>,
    pub kind: String,
}

/// HTTPRoute and GRPCRoute: the same shape, their rules differ.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct HttpRoute {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: RouteSpec<HttpRule>,
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}
gateway_kind!(HttpRoute, "HTTPRoute", "httproutes", k8s_openapi::NamespaceResourceScope);

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct GrpcRoute {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: RouteSpec<GrpcRule>,
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}
gateway_kind!(GrpcRoute, "GRPCRoute", "grpcroutes", k8s_openapi::NamespaceResourceScope);

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec<R> {
    #[serde(default)]
    pub parent_refs: Vec<ObjectRef>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    #[serde(default = "Vec::new")]
    pub rules: Vec<R>,
}

impl<R> Default for RouteSpec<R> {
    fn default() -> Self {
        RouteSpec { parent_refs: Vec::new(), hostnames: Vec::new(), rules: Vec::new() }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRule {
    #[serde(default)]
    pub matches: Vec<HttpMatch>,
    #[serde(default)]
    pub filters: Vec<Filter>,
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
    #[serde(default)]
    pub timeouts: Option<Timeouts>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatch {
    #[serde(default)]
    pub path: Option<PathMatch>,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
    #[serde(default)]
    pub query_params: Vec<serde_json::Value>,
    #[serde(default)]
    pub method: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct PathMatch {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct HeaderMatch {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Filter {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub request_redirect: Option<RequestRedirect>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RequestRedirect {
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub path: Option<PathModifier>,
    #[serde(default)]
    pub port: Option<i32>,
    #[serde(default)]
    pub status_code: Option<i32>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub replace_full_path: Option<String>,
    #[serde(default)]
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct HeaderModifier {
    #[serde(default)]
    pub set: Vec<HeaderValue>,
    #[serde(default)]
    pub add: Vec<HeaderValue>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct HeaderValue {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    #[serde(flatten)]
    pub to: ObjectRef,
    #[serde(default)]
    pub weight: Option<i32>,
    #[serde(default)]
    pub filters: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    #[serde(default)]
    pub request: Option<String>,
    #[serde(default)]
    pub backend_request: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRule {
    #[serde(default)]
    pub matches: Vec<GrpcMatch>,
    #[serde(default)]
    pub filters: Vec<Filter>,
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct GrpcMatch {
    #[serde(default)]
    pub method: Option<GrpcMethod>,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct GrpcMethod {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
}

/// ReferenceGrant (served as v1beta1 by the release this controller implements): objects of the
/// `from` kinds in the `from` namespaces may refer to objects of the `to` kinds (by name, or
/// all of them) in the grant's own namespace.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct ReferenceGrant {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}
gateway_kind!(ReferenceGrant, "ReferenceGrant", "referencegrants", k8s_openapi::NamespaceResourceScope, "v1beta1");

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
}
