//go:build tools

// The packages of agnhost (the suite's test image, built by scripts/k8s-e2e.sh from its main
// package): imported here only so that go.mod and go.sum list the modules they need.
package k8se2e

import (
	_ "k8s.io/kubernetes/test/images/agnhost/audit-proxy"
	_ "k8s.io/kubernetes/test/images/agnhost/connect"
	_ "k8s.io/kubernetes/test/images/agnhost/crd-conversion-webhook"
	_ "k8s.io/kubernetes/test/images/agnhost/dns"
	_ "k8s.io/kubernetes/test/images/agnhost/entrypoint-tester"
	_ "k8s.io/kubernetes/test/images/agnhost/fakegitserver"
	_ "k8s.io/kubernetes/test/images/agnhost/grpc-health-checking"
	_ "k8s.io/kubernetes/test/images/agnhost/guestbook"
	_ "k8s.io/kubernetes/test/images/agnhost/inclusterclient"
	_ "k8s.io/kubernetes/test/images/agnhost/liveness"
	_ "k8s.io/kubernetes/test/images/agnhost/logs-generator"
	_ "k8s.io/kubernetes/test/images/agnhost/mounttest"
	_ "k8s.io/kubernetes/test/images/agnhost/net"
	_ "k8s.io/kubernetes/test/images/agnhost/netexec"
	_ "k8s.io/kubernetes/test/images/agnhost/nettest"
	_ "k8s.io/kubernetes/test/images/agnhost/no-snat-test"
	_ "k8s.io/kubernetes/test/images/agnhost/no-snat-test-proxy"
	_ "k8s.io/kubernetes/test/images/agnhost/openidmetadata"
	_ "k8s.io/kubernetes/test/images/agnhost/pause"
	_ "k8s.io/kubernetes/test/images/agnhost/podcertificatesigner"
	_ "k8s.io/kubernetes/test/images/agnhost/port-forward-tester"
	_ "k8s.io/kubernetes/test/images/agnhost/porter"
	_ "k8s.io/kubernetes/test/images/agnhost/resource-consumer-controller"
	_ "k8s.io/kubernetes/test/images/agnhost/serve-hostname"
	_ "k8s.io/kubernetes/test/images/agnhost/tcp-reset"
	_ "k8s.io/kubernetes/test/images/agnhost/test-webserver"
	_ "k8s.io/kubernetes/test/images/agnhost/webhook"
)
