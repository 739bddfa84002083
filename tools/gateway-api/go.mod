// The Gateway API release vectorlb kube implements: scripts/gateway-crds.sh installs its
// resource definitions from this module in the tests and the demo.
module vectorlb.local/gateway-api-tools

go 1.26.8

require sigs.k8s.io/gateway-api v1.4.1 // indirect
