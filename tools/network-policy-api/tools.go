//go:build tools

// Package tools pins the conformance suite's module (built by scripts/network-policy-api.sh).
package tools

import _ "sigs.k8s.io/network-policy-api/conformance"
