#!/usr/bin/env bash
# Builds what the Gateway API conformance run needs, from the release pinned in
# tools/gateway-api/go.mod: the suite as a test binary (tools/gateway-api/conformance_test.go)
# and the suite's echo server as an OCI image tagged with the name the suite's manifests use
# (so a kubelet finds it imported and pulls nothing). Cached like scripts/k8s-bins.sh: built once
# per hash of the pins and this script. Prints the directory holding
#   conformance.test     the suite (run with the suite's flags, -gateway-class=...)
#   echo-basic.tar       the echo server's image (ctr -n k8s.io images import)
#   echo-basic.ref       that image's name
#   scripts/gateway-conformance.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${VECTORLB_K8S_CACHE:-/var/cache/vectorlb/k8s}
mod=tools/gateway-api
version=$(awk '$1 == "sigs.k8s.io/gateway-api" {print $2} $1 == "require" && $2 == "sigs.k8s.io/gateway-api" {print $3}' $mod/go.mod | head -1)
[ -n "$version" ] || { echo "gateway-conformance: no sigs.k8s.io/gateway-api requirement in $mod/go.mod" >&2; exit 1; }
key=$(cat $mod/go.mod $mod/go.sum $mod/conformance_test.go deploy/kubernetes/image/oci.sh "$0" | sha256sum | cut -c1-16)
dir=$cache/gateway-api-$version-$key
if [ -x "$dir/conformance.test" ] && [ -s "$dir/echo-basic.tar" ] && [ -s "$dir/echo-basic.ref" ]; then
    echo "$dir"
    exit 0
fi
[ "${1:-}" = --check ] && exit 1
command -v go >/dev/null 2>&1 || { echo "gateway-conformance: no Go toolchain on PATH" >&2; exit 1; }
tmp=$cache/.building-gw-$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/rootfs"
echo "gateway-conformance: building the Gateway API $version conformance suite and echo server into $dir" >&2
start=$(date +%s)
[ -n "${GOCACHE:-}" ] || export GOCACHE=$tmp/.gocache
(
    cd "$root/$mod"
    export GOFLAGS="-buildvcs=false -modcacherw"
    go test -c -trimpath -o "$tmp/conformance.test" .
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/rootfs/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic
    # The image name the suite's base manifests give the echo server.
    moddir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
    grep -oE 'image: [^ ]*/echo-basic:[^ ]+' "$moddir/conformance/base/manifests.yaml" | head -1 | cut -d' ' -f2 > "$tmp/echo-basic.ref"
)
ref=$(cat "$tmp/echo-basic.ref")
[ -n "$ref" ] || { echo "gateway-conformance: no echo-basic image named in the suite's manifests" >&2; exit 1; }
touch -d @0 "$tmp/rootfs/echo-basic"
bash deploy/kubernetes/image/oci.sh "$tmp/rootfs" "$tmp/echo-basic.tar" "$ref" '["/echo-basic"]'
rm -rf "$tmp/.gocache" "$tmp/rootfs"
mkdir -p "$cache"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "gateway-conformance: built in $(( $(date +%s) - start )) s" >&2
echo "$dir"
