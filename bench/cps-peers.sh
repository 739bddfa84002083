#!/usr/bin/env bash
# Connections per second with real TCP, vectorlb against what a user would pick instead, on the
# same topology in the same run (issue 4's peers; part of the benchmark kit):
#   vectorlb  full NAT on two AF_XDP veth ports, one worker
#   nftables  DNAT with conntrack, backends chosen by `numgen inc mod 3` (kube-proxy's nftables
#             mode), source NAT to the LB's inner address (full NAT, like vectorlb's)
#   haproxy   TCP mode, roundrobin
#   nginx     stream module, round robin
# The client opens a new connection per HTTP/1.0 GET (`vectorlb-tools probe http`, the page is one
# line) for SECONDS, CONCURRENCY at a time. One JSON line per peer on stdout.
#   bench/cps-peers.sh [SECONDS] [CONCURRENCY]
# Environment: CPS_PEERS (default "vectorlb nftables haproxy nginx_stream") picks the peers
# (they run in that order); CPS_LB_OPTS adds [runtime] lines, separated by ";", to vectorlb's
# configuration (e.g. "idle_sleep_us = 0;cpus = [1]"); CPS_PERF=FILE samples vectorlb's process
# with `perf record -e cpu-clock` for 3 s of its measurement (read it with `perf report -i FILE`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECONDS_=${1:-5}
CONC=${2:-16}
PEERS=${CPS_PEERS:-vectorlb nftables haproxy nginx_stream}
for p in $PEERS; do
    case $p in vectorlb | nftables | haproxy | nginx_stream) ;; *) echo "unknown peer '$p' in CPS_PEERS" >&2; exit 2 ;; esac
done
wanted() { [[ " $PEERS " == *" $1 "* ]]; }
IFS=";" read -ra LB_OPTS <<<"${CPS_LB_OPTS:-}"
P=vlbcps
DIR=$(mktemp -d /tmp/vectorlb-cps.XXXXXX)
cleanup() {
    pkill -f "$DIR/" 2>/dev/null || true
    bash scripts/netns.sh down "$P" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
lbns() { ip netns exec "$P-lb" "$@"; }

# Every peer gets a topology built afresh: connections leave state behind (TIME_WAIT sockets on
# the backends and conntrack entries for the 4-tuples a peer used), and a peer that reuses a source
# address (nftables' SNAT, HAProxy and nginx all connect from 10.1.0.1) would otherwise inherit
# the previous peer's and be measured slower than it is.
fresh_topology() {
    local i pid
    for i in 1 2 3; do
        # The old master removes its PID file as it exits: wait for it before starting the next.
        pid=$(cat "$DIR/be$i/nginx.pid" 2>/dev/null) || continue
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do [[ -e /proc/$pid ]] || break; sleep 0.1; done
    done
    bash scripts/netns.sh down "$P" >/dev/null 2>&1 || true
    bash scripts/netns.sh up "$P" two-arm >/dev/null
    # The kernel's own address on the LB's inner port (netns.sh) would answer for nothing here.
    lbns ip addr flush dev int0
    for i in 1 2 3; do
        ip netns exec "$P-be$i" sysctl -qw net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096
        start_nginx "$P-be$i" "$DIR/be$i" "listen 80 backlog=4096; location / { return 200 \"be$i\\n\"; }"
    done
    ip netns exec "$P-cl" sysctl -qw net.ipv4.ip_local_port_range="1024 65000" net.ipv4.tcp_tw_reuse=1
}

# The kernel peers: the LB namespace routes with its own stack.
kernel_routing() {
    lbns ip addr add 10.0.0.1/24 dev ext0
    lbns ip addr add 10.0.0.100/32 dev ext0
    lbns ip addr add 10.1.0.1/24 dev int0
    lbns sysctl -qw net.ipv4.ip_forward=1 net.ipv4.ip_local_port_range="1024 65000" net.ipv4.tcp_tw_reuse=1
    lbns ethtool -K ext0 tx off tso off gso off gro off >/dev/null 2>&1 || true
    lbns ethtool -K int0 tx off tso off gso off gro off >/dev/null 2>&1 || true
}

# CPU over the measurement: the machine's busy cores (/proc/stat, all CPUs, softirq included;
# idle, I/O wait and time stolen by the hypervisor are not busy) and the balancer's own processes
# (user + system time of the PIDs given; the kernel peer has none).
cpu_ticks() { awk '/^cpu /{ print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6+$9 }' /proc/stat; }
proc_ticks() {
    local t=0 pid
    for pid in "$@"; do
        # Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
        t=$((t + $(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{ print $12 + $13 }' || echo 0)))
    done
    echo "$t"
}

#   measure PEER [PID...]
measure() {
    local peer=$1
    shift
    sleep 0.5
    local r c0 c1 p0 p1 t0 t1
    read -r c0 i0 < <(cpu_ticks)
    p0=$(proc_ticks "$@")
    t0=$(date +%s.%N)
    r=$(ip netns exec "$P-cl" "$TOOLS" probe http --url http://10.0.0.100/ --duration-s "$SECONDS_" --concurrency "$CONC" --timeout-ms 2000 --json || true)
    t1=$(date +%s.%N)
    read -r c1 i1 < <(cpu_ticks)
    p1=$(proc_ticks "$@")
    local line cpu
    line=$(tail -1 <<<"$r")
    cpu=$(awk -v c="$((c1 - c0))" -v i="$((i1 - i0))" -v p="$((p1 - p0))" -v dt="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        -v n="$(nproc)" -v hz="$(getconf CLK_TCK)" -v own="$#" 'BEGIN {
            printf "{\"machine_busy_cores\":%.2f,\"balancer_cores\":%s,\"cores\":%d}", (c > 0 ? n * (c - i) / c : 0), (own > 0 ? sprintf("%.2f", p / hz / dt) : "null"), n }')
    echo "{\"bench\":\"cps_peer\",\"peer\":\"$peer\",\"seconds\":$SECONDS_,\"concurrency\":$CONC,\"cpu\":$cpu,\"result\":$line}"
}

# 1. vectorlb: full NAT, eight local addresses (1,000+ connections per second each; see
#    docs/operations.md).
run_vectorlb() {
    { lb_base_config "$DIR" "${LB_OPTS[@]}"; cat <<CONF
[[services]]
vip = "10.0.0.100"
port = 80
proto = "tcp"
mode = "fnat"
scheduler = "rr"
local_addrs = ["10.1.0.200", "10.1.0.201", "10.1.0.202", "10.1.0.203", "10.1.0.204", "10.1.0.205", "10.1.0.206", "10.1.0.207"]
backends = [{ addr = "10.1.0.11", port = 80 }, { addr = "10.1.0.12", port = 80 }, { addr = "10.1.0.13", port = 80 }]
CONF
    } > "$DIR/lb.toml"
    start_lb "$P-lb" "$DIR/lb.toml" "$DIR"
    LB=$LB_PID
    sleep 2
    local perf_pid=
    if [ -n "${CPS_PERF:-}" ]; then
        (sleep 1.5; exec perf record -q -e cpu-clock -F 2999 ${CPS_PERF_ARGS:-} -p "$LB" -o "$CPS_PERF" -- sleep 3) >/dev/null 2>&1 &
        perf_pid=$!
    fi
    measure vectorlb "$LB"
    [ -z "$perf_pid" ] || wait "$perf_pid" || echo "perf record failed" >&2
    kill -TERM $LB; wait $LB || true
}
if wanted vectorlb; then
    fresh_topology
    run_vectorlb
fi

if wanted nftables; then
    # 2. nftables DNAT + SNAT, numgen spreading.
    fresh_topology
    kernel_routing
    cat > "$DIR/nat.nft" <<'NFT'
table ip vlbpeer {
    chain pre {
        type nat hook prerouting priority dstnat;
        ip daddr 10.0.0.100 tcp dport 80 dnat to numgen inc mod 3 map { 0 : 10.1.0.11, 1 : 10.1.0.12, 2 : 10.1.0.13 }
    }
    chain post {
        type nat hook postrouting priority srcnat;
        ip daddr 10.1.0.0/24 oifname "int0" snat to 10.1.0.1
    }
}
NFT
    lbns nft -f "$DIR/nat.nft"
    # The table has loaded conntrack into the namespace: its TIME_WAIT entries last 2 s, as the
    # backends' SNAT ports are reused within the run.
    lbns sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_time_wait=2
    measure nftables
fi

if wanted haproxy; then
    # 3. HAProxy, TCP mode.
    fresh_topology
    kernel_routing
    cat > "$DIR/haproxy.cfg" <<CONF
global
    maxconn 8000
    nbthread 1
defaults
    mode tcp
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend vip
    bind 10.0.0.100:80
    default_backend be
backend be
    balance roundrobin
    server be1 10.1.0.11:80
    server be2 10.1.0.12:80
    server be3 10.1.0.13:80
CONF
    ip netns exec "$P-lb" haproxy -f "$DIR/haproxy.cfg" -db > "$DIR/haproxy.log" 2>&1 &
    HP=$!
    measure haproxy "$HP"
    kill $HP 2>/dev/null || true; wait $HP 2>/dev/null || true
fi

if wanted nginx_stream; then
    # 4. nginx stream.
    fresh_topology
    kernel_routing
    mkdir -p "$DIR/ngx"
    cat > "$DIR/ngx/nginx.conf" <<CONF
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
worker_processes 1;
pid $DIR/ngx/nginx.pid;
error_log $DIR/ngx/error.log warn;
events { worker_connections 8000; }
stream {
    upstream be { server 10.1.0.11:80; server 10.1.0.12:80; server 10.1.0.13:80; }
    server { listen 10.0.0.100:80; proxy_pass be; }
}
CONF
    lbns nginx -c "$DIR/ngx/nginx.conf" -p "$DIR/ngx"
    NGX=$(cat "$DIR/ngx/nginx.pid")
    # shellcheck disable=SC2046 # the master and its workers, one PID per word
    measure nginx_stream "$NGX" $(pgrep -P "$NGX")
    kill "$NGX" 2>/dev/null || true
fi

