#!/usr/bin/env bash
# Builds (or removes) the test topology in network namespaces. Used by `make demo`, the
# end-to-end tests and the benchmarks. Everything it creates is named after PREFIX.
#
#   scripts/netns.sh up PREFIX [two-arm|one-arm|ha] [BACKEND_MTU]
#   scripts/netns.sh down PREFIX
#
# two-arm:  PREFIX-cl [cl0] ---- [ext0] PREFIX-lb [int0] ---- PREFIX-sw (bridge) ---- PREFIX-be1..3 [eth0]
#           client 10.0.0.2 / 2001:db8::2, LB ext 10.0.0.1 / 2001:db8::1 (VIP 10.0.0.100, 2001:db8::100)
#           LB int 10.1.0.1 / 2001:db8:1::1, backends 10.1.0.11-13 / 2001:db8:1::11-13 (default via the LB)
#           The LB host's kernel holds 10.1.0.250 / 2001:db8:1::250 on int0 (health checks).
# one-arm:  the client sits on the bridge too (10.1.0.2 / 2001:db8:1::2); the LB uses int0 only
#           (VIP 10.1.0.100 / 2001:db8:1::100). DR and TUN need this shape.
# The LB's interfaces carry no kernel addresses: vectorlb owns them through AF_XDP.
set -euo pipefail
cmd=${1:?usage: netns.sh up|down PREFIX [two-arm|one-arm] [BACKEND_MTU]}
P=${2:?prefix}
shape=${3:-two-arm}
bmtu=${4:-1500}
# Queues on the LB's veth ports (one per worker): VLB_QUEUES=2 scripts/netns.sh up ...
q=${VLB_QUEUES:-1}
qa="numtxqueues $q numrxqueues $q"

ns() { ip netns exec "$@"; }
# Kernel-originated frames on veth carry partial checksums and may be GSO-sized; the LB sees
# raw frames through AF_XDP, so the hosts must send complete, MTU-sized frames.
nooffload() { ns "$1" ethtool -K "$2" tx off tso off gso off gro off >/dev/null 2>&1 || true; }

down() {
    for n in cl lb lb1 lb2 sx sw be1 be2 be3; do
        if ip netns list | grep -qw "$P-$n"; then
            # Kill what runs inside (servers, the LB) before removing the namespace.
            for pid in $(ip netns pids "$P-$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
            ip netns del "$P-$n" 2>/dev/null || true
        fi
    done
}

if [ "$cmd" = down ]; then
    down
    exit 0
fi

# ha: two LB nodes (lb1, lb2) on an outside bridge (sx, with the client) and the backend
# bridge (sw). Kernel addresses for VRRP and health checks: lb1 10.0.0.251 / 10.1.0.251,
# lb2 10.0.0.252 / 10.1.0.252. The data plane's own interface addresses are in the LB configs.
ha_up() {
    for n in cl lb1 lb2 sx sw be1 be2 be3; do
        ip netns add "$P-$n"
        ns "$P-$n" ip link set lo up
        ns "$P-$n" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
            net.ipv6.conf.all.accept_ra=0 net.ipv6.conf.default.accept_ra=0 >/dev/null
    done
    for b in sx sw; do
        ns "$P-$b" ip link add br0 type bridge
        ns "$P-$b" ip link set br0 up
    done
    local k
    for k in 1 2; do
        for side in ext:sx:0 int:sw:1; do
            IFS=: read -r dev br net <<<"$side"
            ip link add "$P-$dev$k" type veth peer name "$P-q$dev$k"
            ip link set "$P-$dev$k" netns "$P-lb$k" name "${dev}0"
            ip link set "$P-q$dev$k" netns "$P-$br" name "q$dev$k"
            ns "$P-lb$k" ip link set "${dev}0" up
            ns "$P-$br" ip link set "q$dev$k" master br0 up
            ns "$P-lb$k" ip addr add "10.$net.0.25$k/24" dev "${dev}0"
            nooffload "$P-$br" "q$dev$k"
        done
    done
    ip link add "$P-pc" type veth peer name "$P-cl0"
    ip link set "$P-pc" netns "$P-sx" name pc
    ip link set "$P-cl0" netns "$P-cl" name cl0
    ns "$P-sx" ip link set pc master br0 up
    ns "$P-cl" ip link set cl0 up
    ns "$P-cl" ip addr add 10.0.0.2/24 dev cl0
    ns "$P-cl" ip -6 addr add 2001:db8::2/64 dev cl0 nodad
    nooffload "$P-cl" cl0
    nooffload "$P-sx" pc
    for i in 1 2 3; do
        ip link add "$P-p$i" type veth peer name "$P-b$i"
        ip link set "$P-p$i" netns "$P-sw" name "p$i"
        ip link set "$P-b$i" netns "$P-be$i" name eth0
        ns "$P-sw" ip link set "p$i" master br0 up
        ns "$P-be$i" ip link set eth0 up
        ns "$P-be$i" ip addr add "10.1.0.1$i/24" dev eth0
        ns "$P-be$i" ip -6 addr add "2001:db8:1::1$i/64" dev eth0 nodad
        nooffload "$P-be$i" eth0
        nooffload "$P-sw" "p$i"
    done
}
[ "$cmd" = up ] || { echo "netns.sh: unknown command '$cmd'" >&2; exit 2; }
down
if [ "$shape" = ha ]; then
    ha_up
    exit 0
fi
for n in cl lb sw be1 be2 be3; do
    ip netns add "$P-$n"
    ns "$P-$n" ip link set lo up
    ns "$P-$n" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
        net.ipv6.conf.all.accept_ra=0 net.ipv6.conf.default.accept_ra=0 >/dev/null
done
ns "$P-sw" ip link add br0 type bridge
ns "$P-sw" ip link set br0 mtu "$bmtu"
ns "$P-sw" ip link set br0 up
# LB inside arm <-> switch
ip link add "$P-int0" $qa type veth peer name "$P-p0" $qa
ip link set "$P-int0" netns "$P-lb" name int0
ip link set "$P-p0" netns "$P-sw" name p0
ns "$P-lb" ip link set int0 mtu "$bmtu" up
# The LB host's own (kernel) address on the backend network, beside the data plane's: health
# checks and management use it; the XDP flow director passes its traffic to the kernel.
ns "$P-lb" ip addr add 10.1.0.250/24 dev int0
ns "$P-lb" ip -6 addr add 2001:db8:1::250/64 dev int0 nodad
ns "$P-sw" ip link set p0 mtu "$bmtu" master br0 up
nooffload "$P-sw" p0
for i in 1 2 3; do
    ip link add "$P-p$i" type veth peer name "$P-b$i"
    ip link set "$P-p$i" netns "$P-sw" name "p$i"
    ip link set "$P-b$i" netns "$P-be$i" name eth0
    ns "$P-sw" ip link set "p$i" mtu "$bmtu" master br0 up
    ns "$P-be$i" ip link set eth0 mtu "$bmtu" up
    ns "$P-be$i" ip addr add "10.1.0.1$i/24" dev eth0
    ns "$P-be$i" ip -6 addr add "2001:db8:1::1$i/64" dev eth0 nodad
    nooffload "$P-be$i" eth0
    nooffload "$P-sw" "p$i"
done
if [ "$shape" = one-arm ]; then
    ip link add "$P-pc" type veth peer name "$P-cl0"
    ip link set "$P-pc" netns "$P-sw" name pc
    ip link set "$P-cl0" netns "$P-cl" name cl0
    ns "$P-sw" ip link set pc mtu "$bmtu" master br0 up
    ns "$P-cl" ip link set cl0 mtu "$bmtu" up
    ns "$P-cl" ip addr add 10.1.0.2/24 dev cl0
    ns "$P-cl" ip -6 addr add 2001:db8:1::2/64 dev cl0 nodad
    nooffload "$P-sw" pc
else
    ip link add "$P-ext0" $qa type veth peer name "$P-cl0" $qa
    ip link set "$P-ext0" netns "$P-lb" name ext0
    ip link set "$P-cl0" netns "$P-cl" name cl0
    ns "$P-lb" ip link set ext0 up
    ns "$P-cl" ip link set cl0 up
    ns "$P-cl" ip addr add 10.0.0.2/24 dev cl0
    ns "$P-cl" ip -6 addr add 2001:db8::2/64 dev cl0 nodad
    for i in 1 2 3; do
        ns "$P-be$i" ip route add default via 10.1.0.1
        ns "$P-be$i" ip -6 route add default via 2001:db8:1::1
    done
fi
nooffload "$P-cl" cl0
