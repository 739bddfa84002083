#!/usr/bin/env bash
# `make demo`: a client, the load balancer and three nginx backends in network namespaces;
# real HTTP requests through a full-NAT VIP; the spread across backends and the latency. Then
# a pod on a memif port (the UDP echo example) behind a UDP service of the same VIP.
# The status page (the API's GET /) is screenshotted in headless Chromium during the run.
# A SYN flood at a SYN-proxied port with HTTP requests through it.
# Everything it creates is removed on exit, Ctrl-C or failure (DEMO_HOLD=<seconds> keeps it up
# that long at the end, to look around). Last lines:
#   SYNPROXY OK cookies=<n> requests=<n> errors=0 sessions=<n>
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
    stop_lb
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
# server for a pod, behind UDP port 7 of the VIP. The API listens on its unix socket (for ctl)
# and, behind a token, on 127.0.0.1:9180 in the LB's namespace (for the status page).
TOKEN=$(openssl rand -hex 16)
printf '%s' "$TOKEN" > "$DIR/api.token"
chmod 600 "$DIR/api.token"
{ lb_base_config "$DIR" "mbufs = 8191" | sed "s|^api = .*|api = [\"unix:$DIR/api.sock\", \"127.0.0.1:9180\"]\napi_token_file = \"$DIR/api.token\"|"; cat <<CONF
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
health = { kind = "http", path = "/", interval = 1, timeout = 0.5 }
backends = [
    { addr = "10.1.0.11", port = 8080 },
    { addr = "10.1.0.12", port = 8080 },
    { addr = "10.1.0.13", port = 8080 },
]

# The same backends behind the SYN proxy: SYNs are answered with cookies, and a backend
# connection opens only for a client that returns one.
[[services]]
vip = "10.0.0.100"
port = 81
proto = "tcp"
mode = "fnat"
scheduler = "maglev"
synproxy = "on"
local_addrs = ["10.1.0.200"]
backends = [
    { addr = "10.1.0.11", port = 8080 },
    { addr = "10.1.0.12", port = 8080 },
    { addr = "10.1.0.13", port = 8080 },
]

# Answers to the flood's spoofed sources leave toward the client's link (and die there).
[[routes]]
prefix = "198.18.0.0/15"
via = "10.0.0.2"
port = "ext"
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

say "a SYN flood: 200,000 spoofed SYNs from 198.18.0.0/15 at the SYN-proxied port 81 while 500 HTTP requests go through it"
ext_mac=$(ip netns exec "$P-lb" cat /sys/class/net/ext0/address)
before=$("$BIN" ctl --raw GET /v1/stats | grep -o '"syncookies_sent": *[0-9]*' | grep -o '[0-9]*$')
ip netns exec "$P-cl" "$TOOLS" gen --tx net_af_packet0,iface=cl0 --dst-mac "$ext_mac" --dst-ip 10.0.0.100 --dst-port 81 \
    --syn-flood --count 200000 --seconds 20 --json > "$DIR/flood.json" 2>"$DIR/flood.err" &
flood_pid=$!
ip netns exec "$P-cl" "$TOOLS" probe http --url http://10.0.0.100:81/ --requests 500 --concurrency 8 --json > "$DIR/synproxy.json" || true
wait "$flood_pid" || { echo "the generator failed:" >&2; cat "$DIR/flood.err" >&2; exit 1; }
sleep 0.3
after=$("$BIN" ctl --raw GET /v1/stats | grep -o '"syncookies_sent": *[0-9]*' | grep -o '[0-9]*$')
sp_errors=$(grep -o '"errors":[0-9]*' "$DIR/synproxy.json" | head -1 | cut -d: -f2)
sp_ok=$(grep -o '"ok":[0-9]*' "$DIR/synproxy.json" | head -1 | cut -d: -f2)
sessions=$("$BIN" ctl --raw GET /v1/stats | grep -o '"sessions": *[0-9]*' | head -1 | grep -o '[0-9]*$')
cookies=$((after - before))
if [ "${sp_errors:-1}" = 0 ] && [ "${sp_ok:-0}" = 500 ] && [ "$cookies" -gt 100000 ]; then
    echo "SYNPROXY OK cookies=$cookies requests=$sp_ok errors=0 sessions=$sessions (the flood stored none)"
else
    echo "SYNPROXY FAILED cookies=$cookies requests=${sp_ok:-?} errors=${sp_errors:-?}"; cat "$DIR/flood.json" "$DIR/synproxy.json"
    exit 1
fi

say "vectorlb ctl -Ln --rate (per second over the last 10 s)"
"$BIN" ctl -Ln --rate

say "the status page: http://127.0.0.1:9180/ in namespace $P-lb (log in with any name and the token in the API's token file)"
mkdir -p out
page_ok=0
ip netns exec "$P-lb" curl -fsS -u "demo:$TOKEN" http://127.0.0.1:9180/ | grep -q '/ui/status.js' && page_ok=1
if command -v chromium >/dev/null; then
    rm -f out/status-page.png
    ip netns exec "$P-lb" chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
        --disable-background-networking --user-data-dir="$DIR/chromium" --window-size=1300,760 \
        --virtual-time-budget=5000 --screenshot="$PWD/out/status-page.png" "http://demo:$TOKEN@127.0.0.1:9180/" >/dev/null 2>&1 || true
    if [ -s out/status-page.png ]; then
        echo "screenshot of the page during this run: out/status-page.png ($(stat -c %s out/status-page.png) bytes)"
    else
        echo "chromium took no screenshot" >&2
        page_ok=0
    fi
else
    echo "(no chromium: no screenshot; scripts/setup.sh installs it)"
fi
[ "$page_ok" = 1 ] || { echo "STATUS PAGE FAILED" >&2; exit 1; }

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
if [ "${DEMO_HOLD:-0}" -gt 0 ]; then
    say "holding ${DEMO_HOLD} s: try ip netns exec $P-lb curl -u demo:$TOKEN http://127.0.0.1:9180/v1/services, or VECTORLB_API=unix:$DIR/api.sock $BIN ctl -Ln --rate"
    sleep "$DEMO_HOLD"
fi
if [ "$errors" = 0 ] && [ "$served" = 3 ]; then
    echo "DEMO OK requests=$requests errors=$errors backends=$served"
else
    echo "DEMO FAILED requests=$requests errors=$errors backends=$served"
    exit 1
fi
