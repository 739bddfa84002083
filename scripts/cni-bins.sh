#!/usr/bin/env bash
# Builds the CNI project's reference tool, cnitool (github.com/containernetworking/cni, the
# release pinned below), which the pod-network tests drive the plugin with (ADD, CHECK, DEL, GC,
# STATUS). Cached in $VECTORLB_CNI_CACHE/<release>/bin; prints that directory.
#   scripts/cni-bins.sh            build if needed, print the bin directory
#   scripts/cni-bins.sh --check    print the bin directory if it is built, else exit 1
set -euo pipefail
release=v1.3.0
cache=${VECTORLB_CNI_CACHE:-/var/cache/vectorlb/cni}
dir=$cache/$release/bin
if [ -x "$dir/cnitool" ]; then
    echo "$dir"
    exit 0
fi
[ "${1:-}" = --check ] && exit 1
command -v go >/dev/null 2>&1 || { echo "cni-bins: no Go toolchain on PATH" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dir"
echo "cni-bins: building cnitool $release into $dir" >&2
[ -n "${GOCACHE:-}" ] || export GOCACHE=$tmp/.gocache
[ -n "${GOMODCACHE:-}" ] || export GOMODCACHE=$tmp/.gomod
GOBIN=$tmp/bin CGO_ENABLED=0 GOFLAGS=-modcacherw go install "github.com/containernetworking/cni/cnitool@$release" >&2
install -m 0755 "$tmp/bin/cnitool" "$dir/cnitool"
echo "$dir"
