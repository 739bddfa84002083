#!/usr/bin/env bash
# Connections per second with real TCP, vectorlb against what a user would pick instead, on the
# same topology in the same run (issue 4's peers; part of the benchmark kit):
#   vectorlb  full NAT on two AF_XDP veth ports, one worker
#   nftables  DNAT with conntrack, backends chosen by `numgen inc mod 3` (kube-proxy's nftables
#             mode), source NAT to the LB's inner address (full NAT, like vectorlb's)
#   haproxy   TCP mode, roundrobin
#   nginx     stream module, round robin
# The client opens a new connection per HTTP/1.0 GET (`vectorlb probe http`, the page is one
# line) for SECONDS, CONCURRENCY at a time. One JSON line per peer on stdout.
#   scripts/bench-cps-peers.sh [SECONDS] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECONDS_=${1:-5}
CONC=${2:-16}
P=vlbcps
DIR=$(mktemp -d /tmp/vectorlb-cps.XXXXXX)
cleanup() {
    pkill -f "$DIR/" 2>/dev/null || true
    bash scripts/netns.sh down "$P" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
lbns() { ip netns exec "$P-lb" "$@"; }

bash scripts/netns.sh up "$P" two-arm >/dev/null
# The kernel's own address on the LB's inner port (netns.sh) would answer for nothing here.
lbns ip addr flush dev int0
for i in 1 2 3; do
    ip netns exec "$P-be$i" sysctl -qw net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096
    start_nginx "$P-be$i" "$DIR/be$i" "listen 80 backlog=4096; location / { return 200 \"be$i\\n\"; }"
done
ip netns exec "$P-cl" sysctl -qw net.ipv4.ip_local_port_range="1024 65000" net.ipv4.tcp_tw_reuse=1

measure() {
    local peer=$1
    sleep 0.5
    local r
    r=$(ip netns exec "$P-cl" "$BIN" probe http --url http://10.0.0.100/ --duration-s "$SECONDS_" --concurrency "$CONC" --timeout-ms 2000 --json || true)
    local line
    line=$(tail -1 <<<"$r")
    echo "{\"bench\":\"cps_peer\",\"peer\":\"$peer\",\"seconds\":$SECONDS_,\"concurrency\":$CONC,\"result\":$line}"
}

# 1. vectorlb: full NAT, four local addresses (1,000+ connections per second each; see
#    docs/operations.md).
{ lb_base_config "$DIR"; cat <<CONF
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
measure vectorlb
kill -TERM $LB; wait $LB || true

# The kernel peers: the LB namespace routes with its own stack.
lbns ip addr add 10.0.0.1/24 dev ext0
lbns ip addr add 10.0.0.100/32 dev ext0
lbns ip addr add 10.1.0.1/24 dev int0
lbns sysctl -qw net.ipv4.ip_forward=1 net.ipv4.ip_local_port_range="1024 65000" net.ipv4.tcp_tw_reuse=1 net.netfilter.nf_conntrack_tcp_timeout_time_wait=2 2>/dev/null || lbns sysctl -qw net.ipv4.ip_forward=1
lbns ethtool -K ext0 tx off tso off gso off gro off >/dev/null 2>&1 || true
lbns ethtool -K int0 tx off tso off gso off gro off >/dev/null 2>&1 || true

# 2. nftables DNAT + SNAT, numgen spreading.
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
measure nftables
lbns nft delete table ip vlbpeer

# 3. HAProxy, TCP mode.
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
measure haproxy
kill $HP 2>/dev/null || true; wait $HP 2>/dev/null || true
for _ in $(seq 50); do lbns ss -Hltn 'sport = :80' | grep -q . || break; sleep 0.1; done

# 4. nginx stream.
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
measure nginx_stream
kill "$(cat "$DIR/ngx/nginx.pid")" 2>/dev/null || true
