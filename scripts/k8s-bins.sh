#!/usr/bin/env bash
# Builds the Kubernetes control plane the tests and `make demo-kubernetes` run: kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, the kubelet and kube-proxy (the reference of
# `make bench-pods`) from the Kubernetes Go module at the release
# pinned in tools/k8s/go.mod (its staging modules replaced by their matching v0 releases), and
# the etcd server that release was tested with. One `go build` of all seven, so the packages they
# share compile once. Cached: the binaries go to $VECTORLB_K8S_CACHE/<hash of the pins and this
# script>/bin and are not built again while that directory exists. Prints that directory.
#   scripts/k8s-bins.sh            build if needed, print the bin directory
#   scripts/k8s-bins.sh --check    print the bin directory if it is built, else exit 1
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${VECTORLB_K8S_CACHE:-/var/cache/vectorlb/k8s}
release=$(grep -oE '^\s*(require )?k8s.io/kubernetes v[0-9.]+' tools/k8s/go.mod | awk '{print $NF}' | head -1)
[ -n "$release" ] || { echo "k8s-bins: no k8s.io/kubernetes requirement in tools/k8s/go.mod" >&2; exit 1; }
key=$(cat tools/k8s/go.mod tools/k8s/go.sum "$0" | sha256sum | cut -c1-16)
dir=$cache/$release-$key/bin
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd)
built() {
    local b
    for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done
}
if built; then
    echo "$dir"
    exit 0
fi
[ "${1:-}" = --check ] && exit 1
command -v go >/dev/null 2>&1 || { echo "k8s-bins: no Go toolchain on PATH (go 1.24 or newer)" >&2; exit 1; }
minor=${release#v1.}
minor=${minor%%.*}
tmp=$cache/.building-$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
echo "k8s-bins: building Kubernetes $release and etcd into $dir (several minutes, once)" >&2
start=$(date +%s)
# Go's build and module caches for this build live in the temporary directory unless the caller
# chose its own: they grow to about 3.5 GB and are not needed once the binaries exist.
[ -n "${GOCACHE:-}" ] || export GOCACHE=$tmp/.gocache
[ -n "${GOMODCACHE:-}" ] || export GOMODCACHE=$tmp/.gomod
(
    cd "$root/tools/k8s"
    # -mod=mod: go.sum is committed; nothing is tidied or upgraded here.
    GOFLAGS="-buildvcs=false -modcacherw" go build -trimpath \
        -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$release -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
        -o "$tmp/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
        k8s.io/kubernetes/cmd/kube-proxy \
        go.etcd.io/etcd/server/v3
)
# The etcd server's main package is the module's server/ directory: its binary is named after it.
[ -x "$tmp/server" ] && mv "$tmp/server" "$tmp/etcd"
for b in "${bins[@]}"; do
    [ -x "$tmp/$b" ] || { echo "k8s-bins: $b was not built" >&2; exit 1; }
done
rm -rf "$tmp/.gocache" "$tmp/.gomod"
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "k8s-bins: built in $(( $(date +%s) - start )) s" >&2
echo "$dir"
