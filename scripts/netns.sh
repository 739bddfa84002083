#!/usr/bin/env bash
# Builds (or removes) the test topology in network namespaces. Used by `make demo`, the
# end-to-end tests and the benchmarks. Everything it creates is named after PREFIX.
#
#   scripts/netns.sh up PREFIX [two-arm|one-arm|ha|scale] [BACKEND_MTU]
#   scripts/netns.sh down PREFIX
#
# two-arm:  PREFIX-cl [cl0] ---- [ext0] PREFIX-lb [int0] ---- PREFIX-sw (bridge) ---- PREFIX-be1..3 [eth0]
#           client 10.0.0.2 / 2001:db8::2, LB ext 10.0.0.1 / 2001:db8::1 (VIP 10.0.0.100, 2001:db8::100)
#           LB int 10.1.0.1 / 2001:db8:1::1, backends 10.1.0.11-13 / 2001:db8:1::11-13 (default via the LB)
#           The LB host's kernel holds 10.1.0.250 / 2001:db8:1::250 on int0 (health checks).
# one-arm:  the client sits on the bridge too (10.1.0.2 / 2001:db8:1::2); the LB uses int0 only
#           (VIP 10.1.0.100 / 2001:db8:1::100). DR and TUN need this shape.
# scale:    PREFIX-cl [cl0] ---- [rc0] PREFIX-rt [rs0] ---- PREFIX-sw (bridge) ---- PREFIX-lb1..3 [int0], PREFIX-be1..3 [eth0]
#           A router running FRR (zebra, bgpd, bfdd; files in /tmp/vectorlb-frr-PREFIX) between the
#           client (10.9.0.2 / 2001:db8:9::2, default via the router 10.9.0.1 / 2001:db8:9::1) and
#           the bridge (router 10.1.0.254 / 2001:db8:1::254, AS 65000). It takes the VIPs by BGP
#           from the LB nodes (AS 65001, kernel addresses 10.1.0.25k / 2001:db8:1::25k, BFD at
#           100 ms x 5: 0.5 s, with room for the stalls of shared cores), installs them with multipath and balances by L4 hash
#           (fib_multipath_hash_policy=1). Backends 10.1.0.11-13 / 2001:db8:1::11-13 (default via
#           the router; the VIPs 10.100.0.1-3 and 2001:db8:100::1, ::2 on their loopback for DR
#           and TUN (10.100.0.3: IPv4 over IPv6 tunnels); a TUN backend opens the tunnels with `vectorlb decap attach eth0`).
#           Data-plane addresses of the nodes (10.1.0.k / 2001:db8:1::k) are in their configs.
# The LB's interfaces carry no kernel addresses: vectorlb owns them through AF_XDP.
set -euo pipefail
cmd=${1:?usage: netns.sh up|down PREFIX [two-arm|one-arm|ha|scale] [BACKEND_MTU]}
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
# A namespace PREFIX-NAME with its loopback up, no DAD and no router advertisements.
mkns() {
    ip netns add "$P-$1"
    ns "$P-$1" ip link set lo up
    ns "$P-$1" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
        net.ipv6.conf.all.accept_ra=0 net.ipv6.conf.default.accept_ra=0 >/dev/null
}

down() {
    # Every namespace of this topology, those a test added (pods: $P-pod1, ...) too.
    local n
    for n in $(ip netns list | awk '{print $1}' | grep "^$P-"); do
        # Kill what runs inside (servers, the LB) before removing the namespace: a process in
        # a deleted namespace runs on, unreachable.
        for pid in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$n" 2>/dev/null || true
    done
    rm -rf "/tmp/vectorlb-frr-$P"
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
        mkns "$n"
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
# scale: see the header. FRR's configuration: one peer group per family, BFD, multipath.
scale_up() {
    for n in cl rt sw lb1 lb2 lb3 be1 be2 be3; do
        mkns "$n"
    done
    ns "$P-sw" ip link add br0 type bridge
    ns "$P-sw" ip link set br0 up
    local k
    for k in 1 2 3; do
        ip link add "$P-n$k" $qa type veth peer name "$P-q$k" $qa
        ip link set "$P-n$k" netns "$P-lb$k" name int0
        ip link set "$P-q$k" netns "$P-sw" name "q$k"
        ns "$P-lb$k" ip link set int0 up
        ns "$P-sw" ip link set "q$k" master br0 up
        # The node's kernel addresses: BGP, BFD and health checks (the data plane has others).
        ns "$P-lb$k" ip addr add "10.1.0.25$k/24" dev int0
        ns "$P-lb$k" ip -6 addr add "2001:db8:1::25$k/64" dev int0 nodad
        nooffload "$P-sw" "q$k"
    done
    ip link add "$P-rs" type veth peer name "$P-qr"
    ip link set "$P-rs" netns "$P-rt" name rs0
    ip link set "$P-qr" netns "$P-sw" name qr
    ns "$P-sw" ip link set qr master br0 up
    ns "$P-rt" ip link set rs0 up
    ns "$P-rt" ip addr add 10.1.0.254/24 dev rs0
    ns "$P-rt" ip -6 addr add 2001:db8:1::254/64 dev rs0 nodad
    ip link add "$P-rc" type veth peer name "$P-cl0"
    ip link set "$P-rc" netns "$P-rt" name rc0
    ip link set "$P-cl0" netns "$P-cl" name cl0
    ns "$P-rt" ip link set rc0 up
    ns "$P-rt" ip addr add 10.9.0.1/24 dev rc0
    ns "$P-rt" ip -6 addr add 2001:db8:9::1/64 dev rc0 nodad
    ns "$P-cl" ip link set cl0 up
    ns "$P-cl" ip addr add 10.9.0.2/24 dev cl0
    ns "$P-cl" ip -6 addr add 2001:db8:9::2/64 dev cl0 nodad
    ns "$P-cl" ip route add default via 10.9.0.1
    ns "$P-cl" ip -6 route add default via 2001:db8:9::1
    for x in rt:rs0 rt:rc0 cl:cl0 sw:qr; do nooffload "$P-${x%%:*}" "${x#*:}"; done
    ns "$P-rt" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
        net.ipv4.fib_multipath_hash_policy=1 net.ipv6.fib_multipath_hash_policy=1 \
        net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.rs0.send_redirects=0 >/dev/null
    for i in 1 2 3; do
        ip link add "$P-p$i" type veth peer name "$P-b$i"
        ip link set "$P-p$i" netns "$P-sw" name "p$i"
        ip link set "$P-b$i" netns "$P-be$i" name eth0
        ns "$P-sw" ip link set "p$i" master br0 up
        ns "$P-be$i" ip link set eth0 up
        ns "$P-be$i" ip addr add "10.1.0.1$i/24" dev eth0
        ns "$P-be$i" ip -6 addr add "2001:db8:1::1$i/64" dev eth0 nodad
        ns "$P-be$i" ip route add default via 10.1.0.254
        ns "$P-be$i" ip -6 route add default via 2001:db8:1::254
        # No ICMP redirects: the router shares the backends' segment with the nodes, so it
        # redirects a backend's replies for a node's local address straight to that node, and
        # the backend keeps that route after the node has gone (its backups never see them).
        ns "$P-be$i" sysctl -qw net.ipv6.conf.all.accept_redirects=0 net.ipv6.conf.eth0.accept_redirects=0 \
            net.ipv4.conf.all.accept_redirects=0 net.ipv4.conf.eth0.accept_redirects=0 >/dev/null
        # The VIPs (DR: .1, TUN: .2) on the loopback: the backend accepts what is sent to them.
        ns "$P-be$i" ip addr add 10.100.0.1/32 dev lo
        ns "$P-be$i" ip addr add 10.100.0.2/32 dev lo
        ns "$P-be$i" ip addr add 10.100.0.3/32 dev lo
        ns "$P-be$i" ip -6 addr add 2001:db8:100::1/128 dev lo
        ns "$P-be$i" ip -6 addr add 2001:db8:100::2/128 dev lo
        nooffload "$P-be$i" eth0
        nooffload "$P-sw" "p$i"
    done
    frr_up
}

# FRR in PREFIX-rt: zebra (multipath into the kernel), bfdd, bgpd.
frr_up() {
    local d="/tmp/vectorlb-frr-$P" f=/usr/lib/frr
    [ -x "$f/bgpd" ] || { echo "netns.sh: FRR is not installed ($f/bgpd); scripts/setup.sh installs it" >&2; exit 1; }
    rm -rf "$d"
    mkdir -p "$d"
    chown frr:frr "$d" 2>/dev/null || true
    cat >"$d/zebra.conf" <<EOT
hostname $P-rt
log file $d/zebra.log
EOT
    cat >"$d/bfdd.conf" <<EOT
log file $d/bfdd.log
bfd
 profile fast
  receive-interval 100
  transmit-interval 100
  detect-multiplier 20
 exit
exit
EOT
    local peers="" peers6="" k
    for k in 1 2 3; do
        peers+=" neighbor 10.1.0.25$k peer-group LB4"$'\n'
        peers6+=" neighbor 2001:db8:1::25$k peer-group LB6"$'\n'
    done
    cat >"$d/bgpd.conf" <<EOT
log file $d/bgpd.log
router bgp 65000
 bgp router-id 10.1.0.254
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 bgp bestpath as-path multipath-relax
 neighbor LB4 peer-group
 neighbor LB4 remote-as 65001
 neighbor LB4 bfd profile fast
 neighbor LB4 timers 3 9
 neighbor LB4 timers connect 1
 neighbor LB6 peer-group
 neighbor LB6 remote-as 65001
 neighbor LB6 bfd profile fast
 neighbor LB6 timers 3 9
 neighbor LB6 timers connect 1
$peers$peers6 address-family ipv4 unicast
  neighbor LB4 activate
  maximum-paths 8
 exit-address-family
 address-family ipv6 unicast
  neighbor LB6 activate
  maximum-paths 8
 exit-address-family
exit
EOT
    local common=(-d -u frr -g frr -z "$d/zserv.api" --vty_socket "$d")
    ns "$P-rt" "$f/zebra" "${common[@]}" -f "$d/zebra.conf" -i "$d/zebra.pid"
    for _ in $(seq 50); do [ -S "$d/zserv.api" ] && break; sleep 0.1; done
    ns "$P-rt" "$f/bfdd" "${common[@]}" -f "$d/bfdd.conf" -i "$d/bfdd.pid" --bfdctl "$d/bfdd.sock"
    ns "$P-rt" "$f/bgpd" "${common[@]}" -f "$d/bgpd.conf" -i "$d/bgpd.pid"
}

[ "$cmd" = up ] || { echo "netns.sh: unknown command '$cmd'" >&2; exit 2; }
down
if [ "$shape" = ha ]; then
    ha_up
    exit 0
fi
if [ "$shape" = scale ]; then
    scale_up
    exit 0
fi
for n in cl lb sw be1 be2 be3; do
    mkns "$n"
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
