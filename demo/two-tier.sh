#!/usr/bin/env bash
# `make demo-two-tier`: the deployment ingress gateways run. A client speaks HTTPS to a VIP;
# the L4 load balancer (full NAT, Maglev, AF_XDP) spreads the TCP connections over two proxy
# instances, which terminate TLS (the cryptomb provider where the CPU has AVX-512 IFMA, its
# fallback otherwise) and balance every request over three nginx backends. The proxies also
# serve static objects under /o/ themselves, read by their dispatch pools in priority classes
# taken from the URI (?prio=high / ?prio=low): proxy 1's in the software queue, proxy 2's in a
# DPDK event device (event_sw).
#
#   client 10.0.0.2 --> VIP 10.0.0.100:443 (vectorlb run: fnat, maglev)
#                         --> proxy 10.1.0.11:8443 (be1) --\
#                         --> proxy 10.1.0.12:8443 (be2) ---+--> nginx 10.1.0.13:8081..8083 (be3)
#
# Everything it creates is removed on exit. Last line:
#   TWO-TIER OK requests=<n> errors=<n> proxies=<n serving> backends=<n serving> provider=<p> objects=<n served>
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
P=vlb2t
DIR=$(mktemp -d /tmp/vectorlb-two-tier.XXXXXX)
REQUESTS=${TWO_TIER_REQUESTS:-2000}
LB_PID=
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    [ -n "$LB_PID" ] && kill -TERM "$LB_PID" 2>/dev/null || true
    sleep 0.5
    bash scripts/netns.sh down "$P" >/dev/null 2>&1 || true
    if [ $rc -ne 0 ]; then
        echo "two-tier demo failed (exit $rc); logs:" >&2
        tail -5 "$DIR"/*.log >&2 2>/dev/null || true
    fi
    rm -rf "$DIR"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say() { printf '\n== %s\n' "$*"; }

say "topology: client | L4 LB (AF_XDP) | switch | proxy be1, proxy be2, nginx x3 on be3"
bash scripts/netns.sh up "$P" two-arm
for i in 1 2 3; do
    start_nginx "$P-be3" "$DIR/nginx$i" "listen 10.1.0.13:808$i; location / { return 200 \"nginx-$i via \$http_x_forwarded_for\\n\"; }"
done

mkdir -p "$DIR/objects"
head -c 1024 /dev/urandom > "$DIR/objects/1k.bin"
head -c 1048576 /dev/urandom > "$DIR/objects/1m.bin"
openssl req -x509 -nodes -days 2 -subj /CN=demo.test -addext subjectAltName=DNS:demo.test \
    -newkey rsa:2048 -keyout "$DIR/demo.key" -out "$DIR/demo.crt" 2>/dev/null
for i in 1 2; do
    cat > "$DIR/proxy$i.toml" <<CONF
workers = 1
access_log = "$DIR/proxy$i.access.log"

[admin]
address = "unix:$DIR/proxy$i.sock"

[[listeners]]
name = "https"
address = "10.1.0.1$i:8443"
tls = { certificates = [{ cert = "$DIR/demo.crt", key = "$DIR/demo.key" }], provider = "cryptomb", cryptomb_fallback = "inline" }

[dispatch]
workers = 2
classes = [{ name = "high" }, { name = "low", share = 5 }]
backend = "$([ "$i" = 2 ] && echo eventdev || echo software)"

[[routes]]
path_prefix = "/o/"
static = { root = "$DIR/objects" }
priority = { query = "prio" }

[[routes]]
cluster = "web"

[[clusters]]
name = "web"
endpoints = ["10.1.0.13:8081", "10.1.0.13:8082", "10.1.0.13:8083"]
health = { kind = "http", path = "/", interval = 1, timeout = 0.5 }
CONF
    say "proxy $i: ip netns exec $P-be$i vectorlb proxy --config proxy$i.toml"
    ip netns exec "$P-be$i" "$BIN" proxy --config "$DIR/proxy$i.toml" > "$DIR/proxy$i.log" 2>&1 &
    PIDS+=($!)
done
for i in 1 2; do
    for _ in $(seq 100); do
        curl -fsS --unix-socket "$DIR/proxy$i.sock" http://admin/v1/health >/dev/null 2>&1 && break
        sleep 0.1
    done
    grep -h "private keys\|cryptomb" "$DIR/proxy$i.log" | head -2 || true
done

{ lb_base_config "$DIR"; cat <<CONF
[[services]]
vip = "10.0.0.100"
port = 443
proto = "tcp"
mode = "fnat"
scheduler = "maglev"
local_addrs = ["10.1.0.200"]
health = { kind = "tcp", interval = 1, timeout = 0.5 }
backends = [
    { addr = "10.1.0.11", port = 8443 },
    { addr = "10.1.0.12", port = 8443 },
]
CONF
} > "$DIR/lb.toml"
say "the L4 tier: ip netns exec $P-lb vectorlb run --config lb.toml (full NAT, Maglev)"
start_lb "$P-lb" "$DIR/lb.toml" "$DIR"
export VECTORLB_API="unix:$DIR/api.sock"
for _ in $(seq 100); do
    [ "$("$BIN" ctl --raw GET /v1/services | grep -c '"resolved": true')" -ge 2 ] && break
    sleep 0.1
done
"$BIN" ctl -Ln

say "curl verifies the certificate: https://demo.test/ (resolved to the VIP), 6 requests"
for _ in $(seq 6); do
    ip netns exec "$P-cl" curl -sS --max-time 5 --cacert "$DIR/demo.crt" --resolve demo.test:443:10.0.0.100 https://demo.test/
done

say "h2load: $REQUESTS HTTPS requests, a new TLS connection each (16 at a time), then HTTP/2 keep-alive"
ip netns exec "$P-cl" h2load --h1 -n "$REQUESTS" -c 16 -H "Connection: close" https://10.0.0.100/ > "$DIR/h2load.txt"
grep -E "^(finished|requests|status codes)" "$DIR/h2load.txt"
ip netns exec "$P-cl" h2load -n "$REQUESTS" -c 4 -m 8 https://10.0.0.100/ > "$DIR/h2load-h2.txt"
grep -E "^(finished|requests|status codes)" "$DIR/h2load-h2.txt"

say "static objects from the proxies, by priority class: /o/1k.bin?prio=high and /o/1m.bin?prio=low, 10 each"
objects_ok=0
for _ in $(seq 10); do
    for o in "1k.bin?prio=high:1024" "1m.bin?prio=low:1048576"; do
        size=$(ip netns exec "$P-cl" curl -sS --max-time 5 --cacert "$DIR/demo.crt" --resolve demo.test:443:10.0.0.100 -o /dev/null -w '%{http_code} %{size_download}' "https://demo.test/o/${o%%:*}")
        [ "$size" = "200 ${o##*:}" ] && objects_ok=$((objects_ok + 1))
    done
done
echo "objects served whole: $objects_ok of 20"

say "the L4 tier's view: connections per proxy"
"$BIN" ctl -Ln --stats

say "the proxies' view (GET /v1/stats on their admin sockets)"
for i in 1 2; do curl -fsS --unix-socket "$DIR/proxy$i.sock" http://admin/v1/stats > "$DIR/stats$i.json"; done
summary=$(python3 - "$DIR/stats1.json" "$DIR/stats2.json" <<'PY'
import json, sys
proxies, backends, provider = 0, {}, set()
for i, f in enumerate(sys.argv[1:], 1):
    s = json.load(open(f))
    l = s["listeners"][0]
    t = l["tls"]
    provider.add(t["provider"])
    hs = t["handshake_seconds"]
    print(f"proxy {i}: {l['requests']} requests, {t['handshakes']} TLS handshakes ({t['provider']}; p50 {hs['p50'] * 1e3:.1f} ms, p99 {hs['p99'] * 1e3:.1f} ms), failed checks {t['failed_checks']}", file=sys.stderr)
    k, x = s["x25519_keypairs"], s["x25519_secrets"]
    print(f"  X25519 key exchange: key pairs {k['batched']} made eight at a time, {k['single']} singly; shared secrets {x['batched']} computed ahead in {x['batches']} calls, {x['single']} by BoringSSL", file=sys.stderr)
    d = s.get("dispatch") or {"classes": []}
    print("  dispatch (" + d.get("mode", "-") + ", " + d.get("backend", "-") + "): " + ", ".join(f"{c['name']} {c['served']} served, wait p99 {(c['wait_seconds']['p99'] or 0) * 1e3:.2f} ms" for c in d["classes"]), file=sys.stderr)
    if l["requests"] > 0:
        proxies += 1
    for e in s["clusters"][0]["endpoints"]:
        backends[e["address"]] = backends.get(e["address"], 0) + e["requests"]
for a, n in sorted(backends.items()):
    print(f"  nginx {a}: {n} requests", file=sys.stderr)
print(proxies, sum(1 for n in backends.values() if n > 0), "+".join(sorted(provider)))
PY
)
read -r proxies served provider <<<"$summary"
errors=0
for f in "$DIR/h2load.txt" "$DIR/h2load-h2.txt"; do
    ok=$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' "$f")
    [ "${ok:-0}" = "$REQUESTS" ] || errors=$((errors + REQUESTS - ${ok:-0}))
done
say "an access log line: $(tail -1 "$DIR/proxy1.access.log")"
if [ "$errors" = 0 ] && [ "$proxies" = 2 ] && [ "$served" = 3 ] && [ "$objects_ok" = 20 ]; then
    echo "TWO-TIER OK requests=$((2 * REQUESTS)) errors=0 proxies=$proxies backends=$served provider=$provider objects=$objects_ok"
else
    echo "TWO-TIER FAILED requests=$((2 * REQUESTS)) errors=$errors proxies=$proxies backends=$served provider=$provider objects=$objects_ok"
    exit 1
fi
