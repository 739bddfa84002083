#!/usr/bin/env bash
# Prints the directory holding the Gateway API's standard-channel resource definitions at the
# release pinned in tools/gateway-api/go.mod (downloaded into Go's module cache, checked
# against go.sum). They are the project's own files: read from its module, never copied here.
#   kubectl create -f "$(scripts/gateway-crds.sh)"/gateway.networking.k8s.io_gateways.yaml
set -euo pipefail
cd "$(dirname "$0")/../tools/gateway-api"
command -v go >/dev/null 2>&1 || { echo "gateway-crds: no Go toolchain on PATH" >&2; exit 1; }
version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/gateway-api" {print $3} $1 == "sigs.k8s.io/gateway-api" {print $2}' go.mod | head -1)
[ -n "$version" ] || { echo "gateway-crds: no sigs.k8s.io/gateway-api requirement in tools/gateway-api/go.mod" >&2; exit 1; }
dir=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[ -d "$dir/config/crd/standard" ] || { echo "gateway-crds: $dir/config/crd/standard is missing" >&2; exit 1; }
echo "$dir/config/crd/standard"
