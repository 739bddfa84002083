#!/usr/bin/env bash
# The generator topology: namespace PREFIX-gen with ports g0, g1 wired straight to the device
# under test's ports ext0, int0 in PREFIX-lb (veth pairs).
#   scripts/gen-topo.sh up PREFIX      (prints: G1_MAC EXT0_MAC)
#   scripts/gen-topo.sh down PREFIX
set -euo pipefail
cmd=${1:?up|down}
P=${2:?prefix}
down() {
    for n in gen lb; do
        for pid in $(ip netns pids "$P-$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$P-$n" 2>/dev/null || true
    done
}
down
[ "$cmd" = down ] && exit 0
for n in gen lb; do ip netns add "$P-$n"; ip netns exec "$P-$n" ip link set lo up; done
ip link add "$P-g0" type veth peer name "$P-e0"
ip link add "$P-g1" type veth peer name "$P-i0"
ip link set "$P-g0" netns "$P-gen" name g0
ip link set "$P-g1" netns "$P-gen" name g1
ip link set "$P-e0" netns "$P-lb" name ext0
ip link set "$P-i0" netns "$P-lb" name int0
for d in g0 g1; do ip netns exec "$P-gen" ip link set "$d" up; done
for d in ext0 int0; do ip netns exec "$P-lb" ip link set "$d" up; done
echo "$(ip netns exec "$P-gen" cat /sys/class/net/g1/address) $(ip netns exec "$P-lb" cat /sys/class/net/ext0/address)"
