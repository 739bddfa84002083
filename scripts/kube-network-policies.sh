#!/usr/bin/env bash
# Builds kube-network-policies (the SIG's reference NetworkPolicy agent: nftables sends a new
# connection's first packet to an NFQUEUE, the agent decides it in Go from its informers'
# caches) from its Go module, for `make bench-policy`'s side-by-side run. Cached like
# scripts/network-policy-api.sh: built once per version and hash of this script. Prints the
# binary's path.
#
# One change to its source, made here at build time: this kernel has no nftables `queue`
# expression (CONFIG_NFT_QUEUE is not set) but has the xtables NFQUEUE target through
# nft_compat, so the agent's rules send packets to the same queue number with the compat target
# (revision 3; fail-open's bypass flag kept) instead of the native expression. The queue, the
# packets it carries and the agent's verdicts are the same; nothing else is touched.
#   scripts/kube-network-policies.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
version=v0.8.0
cache=${VECTORLB_K8S_CACHE:-/var/cache/vectorlb/k8s}
key=$(sha256sum "$0" | cut -c1-16)
dir=$cache/kube-network-policies-$version-$key
if [ -x "$dir/kube-network-policies" ]; then
    echo "$dir/kube-network-policies"
    exit 0
fi
[ "${1:-}" = --check ] && exit 1
command -v go >/dev/null 2>&1 || { echo "kube-network-policies: no Go toolchain on PATH" >&2; exit 1; }
tmp=$cache/.building-knp-$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
echo "kube-network-policies: building $version into $dir" >&2
start=$(date +%s)
[ -n "${GOCACHE:-}" ] || export GOCACHE=$tmp/.gocache
export GOFLAGS="-buildvcs=false -modcacherw"
src=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kube-network-policies@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "kube-network-policies: $version not in the module cache after download" >&2; exit 1; }
cp -r "$src" "$tmp/src"
chmod -R u+w "$tmp/src"
f=$tmp/src/pkg/networkpolicy/controller.go
grep -q 'queue := &expr.Queue{Num: uint16(c.config.QueueID)}' "$f" || { echo "kube-network-policies: the queue expression is not where $version had it" >&2; exit 1; }
python3 - "$f" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = """	queue := &expr.Queue{Num: uint16(c.config.QueueID)}
	if c.config.FailOpen {
		queue.Flag = expr.QueueFlagBypass
	}
"""
new = """	// Built for vectorlb's bench: the xtables NFQUEUE target (xt_NFQ_info_v3: queue number,
	// queues in total, flags; 1 = bypass) in place of the nft queue expression.
	qflags := uint16(0)
	if c.config.FailOpen {
		qflags = 1
	}
	qinfo := xt.Unknown{byte(c.config.QueueID), byte(c.config.QueueID >> 8), 1, 0, byte(qflags), 0}
	queue := &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &qinfo}
"""
assert s.count(old) >= 1, "queue expression"
s = s.replace(old, new)
s = s.replace('"github.com/google/nftables/expr"', '"github.com/google/nftables/expr"\n\t"github.com/google/nftables/xt"', 1)
open(p, "w").write(s)
EOF
(cd "$tmp/src" && go build -trimpath -o "$tmp/kube-network-policies" ./cmd)
rm -rf "$tmp/.gocache" "$tmp/src"
mkdir -p "$cache"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "kube-network-policies: built in $(( $(date +%s) - start )) s" >&2
echo "$dir/kube-network-policies"
