#!/usr/bin/env bash
# Builds Istio's echo application (server and client, tools/istio-echo pins the commit) into the
# image the Gateway API conformance suite's mesh tests run, tagged with the name its mesh
# manifests give it (so a kubelet finds it imported and pulls nothing): /usr/local/bin/server
# (the entry point), /usr/local/bin/client (the suite runs `client URL` in the Pod), and the
# /cert.crt and /cert.key the manifests' TLS port reads (a self-signed pair made here). Cached
# like scripts/gateway-conformance.sh. Prints the directory holding
#   echo-advanced.tar   the image (ctr -n k8s.io images import)
#   echo-advanced.ref   its name
#   echo-server         the server alone (a gRPC and HTTP server for benchmarks)
#   scripts/istio-echo.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${VECTORLB_K8S_CACHE:-/var/cache/vectorlb/k8s}
mod=tools/istio-echo
key=$(cat $mod/go.mod $mod/go.sum $mod/tools.go tools/gateway-api/go.mod deploy/kubernetes/image/oci.sh "$0" | sha256sum | cut -c1-16)
dir=$cache/istio-echo-$key
if [ -s "$dir/echo-advanced.tar" ] && [ -s "$dir/echo-advanced.ref" ] && [ -x "$dir/echo-server" ]; then
    echo "$dir"
    exit 0
fi
[ "${1:-}" = --check ] && exit 1
command -v go >/dev/null 2>&1 || { echo "istio-echo: no Go toolchain on PATH" >&2; exit 1; }
tmp=$cache/.building-echo-$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/rootfs/usr/local/bin" "$tmp/rootfs/tmp"
echo "istio-echo: building Istio's echo server and client into $dir" >&2
start=$(date +%s)
[ -n "${GOCACHE:-}" ] || export GOCACHE=$tmp/.gocache
export GOFLAGS="-buildvcs=false -modcacherw"
(
    cd "$root/$mod"
    for c in server client; do
        CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/rootfs/usr/local/bin/$c" "istio.io/istio/pkg/test/echo/cmd/$c"
    done
)
# The image name the suite's mesh manifests give the echo application.
moddir=$(cd "$root/tools/gateway-api" && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
grep -oE 'image: [^ ]*/echo-advanced:[^ ]+' "$moddir/conformance/mesh/manifests.yaml" | head -1 | cut -d' ' -f2 > "$tmp/echo-advanced.ref"
ref=$(cat "$tmp/echo-advanced.ref")
[ -n "$ref" ] || { echo "istio-echo: no echo-advanced image named in the suite's mesh manifests" >&2; exit 1; }
openssl req -x509 -nodes -days 3650 -subj /CN=echo -addext subjectAltName=DNS:echo \
    -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$tmp/rootfs/cert.key" -out "$tmp/rootfs/cert.crt" 2>/dev/null
chmod 0644 "$tmp/rootfs/cert.key"
chmod 1777 "$tmp/rootfs/tmp"
find "$tmp/rootfs" -exec touch -h -d @0 {} +
bash deploy/kubernetes/image/oci.sh "$tmp/rootfs" "$tmp/echo-advanced.tar" "$ref" '["/usr/local/bin/server"]'
cp "$tmp/rootfs/usr/local/bin/server" "$tmp/echo-server"
rm -rf "$tmp/.gocache" "$tmp/rootfs"
mkdir -p "$cache"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "istio-echo: built in $(( $(date +%s) - start )) s" >&2
echo "$dir"
