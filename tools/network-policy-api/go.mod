// The network-policy-api release vectorlb kube implements (ClusterNetworkPolicy,
// policy.networking.k8s.io/v1beta1): scripts/network-policy-api.sh installs its resource
// definition from this module in the tests and builds its conformance suite (the module's own
// conformance package, as a test binary).
module vectorlb.local/network-policy-api-tools

go 1.26.6

require sigs.k8s.io/network-policy-api v0.3.0
