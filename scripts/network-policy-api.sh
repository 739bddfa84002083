#!/usr/bin/env bash
# Builds what the network-policy-api conformance run needs, from the release pinned in
# tools/network-policy-api/go.mod: the module's own conformance package as a test binary, and
# the ClusterNetworkPolicy resource definition read from the module (never copied into this
# repository). Cached like scripts/gateway-conformance.sh: built once per hash of the pins and
# this script. Prints the directory holding
#   conformance.test     the suite (-test.run TestConformanceProfiles --conformance-profiles=...)
#   crd.yaml             policy.networking.k8s.io_clusternetworkpolicies.yaml (standard channel)
#   agnhost.ref          the image name the suite's manifests give their Pods
#   scripts/network-policy-api.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${VECTORLB_K8S_CACHE:-/var/cache/vectorlb/k8s}
mod=tools/network-policy-api
version=$(awk '$1 == "sigs.k8s.io/network-policy-api" {print $2} $1 == "require" && $2 == "sigs.k8s.io/network-policy-api" {print $3}' $mod/go.mod | head -1)
[ -n "$version" ] || { echo "network-policy-api: no sigs.k8s.io/network-policy-api requirement in $mod/go.mod" >&2; exit 1; }
key=$(cat $mod/go.mod $mod/go.sum $mod/tools.go "$0" | sha256sum | cut -c1-16)
dir=$cache/network-policy-api-$version-$key
if [ -x "$dir/conformance.test" ] && [ -s "$dir/crd.yaml" ] && [ -s "$dir/agnhost.ref" ]; then
    echo "$dir"
    exit 0
fi
[ "${1:-}" = --check ] && exit 1
command -v go >/dev/null 2>&1 || { echo "network-policy-api: no Go toolchain on PATH" >&2; exit 1; }
tmp=$cache/.building-npa-$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
echo "network-policy-api: building the $version conformance suite into $dir" >&2
start=$(date +%s)
[ -n "${GOCACHE:-}" ] || export GOCACHE=$tmp/.gocache
(
    cd "$root/$mod"
    export GOFLAGS="-buildvcs=false -modcacherw"
    go test -c -trimpath -o "$tmp/conformance.test" sigs.k8s.io/network-policy-api/conformance
    moddir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/network-policy-api)
    cp "$moddir/config/crd/standard/policy.networking.k8s.io_clusternetworkpolicies.yaml" "$tmp/crd.yaml"
    grep -oE 'image: [^ ]*/agnhost:[^ ]+' "$moddir/conformance/base/manifests.yaml" | head -1 | cut -d' ' -f2 > "$tmp/agnhost.ref"
)
[ -s "$tmp/agnhost.ref" ] || { echo "network-policy-api: no agnhost image named in the suite's manifests" >&2; exit 1; }
rm -rf "$tmp/.gocache"
mkdir -p "$cache"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "network-policy-api: built in $(( $(date +%s) - start )) s" >&2
echo "$dir"
