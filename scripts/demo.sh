#!/usr/bin/env bash
# `make demo`: a client, the load balancer and three nginx backends in network namespaces;
# real HTTP requests through a full-NAT VIP; the spread across backends and the latency. Then
# a pod on a memif port (the UDP echo example) behind a UDP service of the same VIP.
# Everything it creates is removed on exit, Ctrl-C or failure. Last lines:
#   MEMIF OK datagrams=<n> lost=<n>
#   DEMO OK requests=<n> errors=<n> backends=<n served>
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
P=vlbdemo
DIR=$(mktemp -d /tmp/vectorlb-demo.XXXXXX)
REQUESTS=${DEMO_REQUESTS:-3000}
LB_PID=
POD_PID=

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "$POD_PID" ] && kill "$POD_PID" 2>/dev/null || true
    if [ -n "$LB_PID" ] && kill -0 "$LB_PID" 2>/dev/null; then
        kill -TERM "$LB_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$LB_PID" 2>/dev/null || break; sleep 0.1; done
    fi
    bash scripts/netns.sh down "$P" >/dev/null 2>&1 || true
    if [ $rc -ne 0 ]; then
        echo "demo failed (exit $rc); the LB's log:" >&2
        tail -20 "$DIR/lb.log" >&2 2>/dev/null || true
    fi
    rm -rf "$DIR"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }

say "topology: client | LB (AF_XDP on two veth ports) | switch | 3 nginx backends"
bash scripts/netns.sh up "$P" two-arm
for i in 1 2 3; do
    start_nginx "$P-be$i" "$DIR/be$i" "listen 8080; listen [::]:8080; location / { return 200 \"backend-$i (10.1.0.1$i)\\n\"; }"
done

# The embedded default configuration: full NAT, Maglev, one VIP; a third port is a memif
# server for a pod, behind UDP port 7 of the VIP.
{ lb_base_config "$DIR" "mbufs = 8191"; cat <<CONF
[[ports]]
name = "pod"
mac = "02:00:00:00:02:01"
addrs = ["10.2.0.1/24"]
memif = { socket = "$DIR/memif.sock", id = 1, secret = "demo-pod" }

[[services]]
vip = "10.0.0.100"
port = 7
proto = "udp"
mode = "fnat"
local_addrs = ["10.2.0.200"]
backends = [{ addr = "10.2.0.11", port = 7 }]

[global]
max_sessions = 100000

[[services]]
vip = "10.0.0.100"
port = 80
proto = "tcp"
mode = "fnat"
scheduler = "maglev"
local_addrs = ["10.1.0.200"]
backends = [
    { addr = "10.1.0.11", port = 8080 },
    { addr = "10.1.0.12", port = 8080 },
    { addr = "10.1.0.13", port = 8080 },
]
CONF
} > "$DIR/lb.toml"
export VECTORLB_API="unix:$DIR/api.sock"

say "starting: ip netns exec $P-lb vectorlb run --config lb.toml"
start_lb "$P-lb" "$DIR/lb.toml" "$DIR"
LB_PID=$LB_PID
# Wait until the LB has resolved its backends (ARP).
for _ in $(seq 100); do
    if [ "$("$BIN" ctl --raw GET /v1/services | grep -c '"resolved": true')" -ge 3 ]; then break; fi
    sleep 0.1
done
grep -h "running" "$DIR/lb.log" || true

say "vectorlb ctl -Ln"
"$BIN" ctl -Ln

say "$REQUESTS HTTP requests from the client to http://10.0.0.100/ (a new connection each)"
ip netns exec "$P-cl" "$TOOLS" probe http --url http://10.0.0.100/ --requests "$REQUESTS" --concurrency 8 --progress \
    | tee "$DIR/result.txt" || true

if [ "${DEMO_WRK:-0}" -gt 0 ]; then
    say "wrk for ${DEMO_WRK} s through the VIP (keep-alive connections)"
    ip netns exec "$P-cl" wrk -t2 -c32 -d"${DEMO_WRK}s" --latency http://10.0.0.100/ | tee "$DIR/wrk.txt"
    if [ -n "${WRK_OUT:-}" ]; then
        { echo "# $(date -u +%FT%TZ) wrk -t2 -c32 -d${DEMO_WRK}s --latency http://10.0.0.100/ (FNAT, maglev, 3 nginx backends, AF_XDP, 1 worker)";
          echo "# $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)";
          cat "$DIR/wrk.txt";
          echo "# vectorlb ctl -Ln --stats after the run (every backend served):";
          "$BIN" ctl -Ln --stats | sed 's/^/# /'; } > "$WRK_OUT"
    fi
    grep -q "Socket errors" "$DIR/wrk.txt" && { echo "wrk reported socket errors" >&2; exit 1; }
fi

say "a pod on memif: the UDP echo example connects to $DIR/memif.sock (id 1) as 10.2.0.11"
target/release/examples/udp_echo --socket "$DIR/memif.sock" --id 1 --secret demo-pod \
    --mac 02:00:00:00:02:11 --ip 10.2.0.11 --port 7 > "$DIR/pod.log" 2>&1 &
POD_PID=$!
for _ in $(seq 100); do
    "$BIN" ctl --raw GET /v1/ports | grep -q '"connected": true' && break
    sleep 0.1
done
say "200 UDP datagrams from the client to 10.0.0.100:7, through the LB and memif to the pod and back"
ip netns exec "$P-cl" "$TOOLS" probe udp --target 10.0.0.100:7 --flows 50 --per-flow 4 --size 200 | tee "$DIR/udp.json"
say "the memif port (GET /v1/ports)"
"$BIN" ctl --raw GET /v1/ports > "$DIR/ports.json"
python3 - "$DIR/ports.json" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1])):
    m = p.get("memif")
    if m:
        q = m["queues"][0]
        print(f"port {p['name']}: memif {m['role']} on {m['socket']}, connected={m['connected']}, peer={m['peer']!r}, "
              f"rx={q['rx_packets']} tx={q['tx_packets']} copies cpu={q['copies_cpu']} dma={q['copies_dma']} bad_desc={q['bad_desc']}")
PY

say "vectorlb ctl -Ln --stats"
"$BIN" ctl -Ln --stats

say "a few Prometheus metrics (GET /metrics)"
"$BIN" ctl --raw GET /metrics | grep -E '^vectorlb_(sessions_created_total|backend_packets_total|drops_total\{reason="no_session"\}|port_packets_total)' | head -12

line=$(grep '^result ' "$DIR/result.txt" | tail -1)
errors=$(sed -n 's/.*errors=\([0-9]*\).*/\1/p' <<<"$line")
served=$(sed -n 's/.*backends=\([0-9]*\).*/\1/p' <<<"$line")
requests=$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$line")
received=$(sed -n 's/.*"received": *\([0-9]*\).*/\1/p' "$DIR/udp.json")
sent=$(sed -n 's/.*"sent": *\([0-9]*\).*/\1/p' "$DIR/udp.json")
if [ -n "$sent" ] && [ "$sent" -gt 0 ] && [ "$received" = "$sent" ]; then
    echo "MEMIF OK datagrams=$received lost=0"
else
    echo "MEMIF FAILED sent=${sent:-?} received=${received:-?}; the pod's log:"
    tail -5 "$DIR/pod.log"
    exit 1
fi
if [ "$errors" = 0 ] && [ "$served" = 3 ]; then
    echo "DEMO OK requests=$requests errors=$errors backends=$served"
else
    echo "DEMO FAILED requests=$requests errors=$errors backends=$served"
    exit 1
fi
