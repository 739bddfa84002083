#!/usr/bin/env bash
# `make demo` (its fifth act) and `make demo-pods`: the pod network (docs/pod-network.md). The
# CNI project's cnitool runs vectorlb-cni (with Debian's host-local for the addresses) for three
# pods; each gets a tun interface from the running daemon in its own namespace. Two serve HTTP
# behind a ClusterIP in the daemon's L4 core; the third is annotated for a memif
# (vectorlb.io/memif-ports: udp:5000) and runs the memif example application. The host and a
# pod ask the ClusterIP, a pod sends UDP to the memif pod's port, and every pod is deleted.
#
#   host (vlb0) --+-- vectorlb (pods port: router, L4 core) --+-- pod1, pod2 (HTTP), pod3 (memif)
#
# Everything it creates is removed on exit. Last line:
#   PODS OK pods=3 requests=<n> errors=0 backends=2 memif_answered=<n> bulk_same=1 super_packets=<n>
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
P=vlbpod
DIR=$(mktemp -d /tmp/vectorlb-pods.XXXXXX)
CNITOOL=$(bash scripts/cni-bins.sh)/cnitool
PLUGIN=${PLUGIN:-$(dirname "$BIN")/vectorlb-cni}
PIDS=()
PODS=()
LB_PID=

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for n in "${PODS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    stop_lb
    bash scripts/netns.sh down "$P" >/dev/null 2>&1 || true
    if [ $rc -ne 0 ]; then
        echo "pods demo failed (exit $rc); the daemon's log:" >&2
        tail -20 "$DIR/lb.log" >&2 2>/dev/null || true
    fi
    rm -rf "$DIR"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say() { printf '\n== %s\n' "$*"; }
api() { curl -sS --unix-socket "$DIR/api.sock" -H 'content-type: application/json' "$@"; }
cni() { NETCONFPATH="$DIR/net.d" CNI_PATH="$DIR/cni-bin:/usr/lib/cni" CAP_ARGS="${CAPS:-}" "$CNITOOL" "$@"; }

say "topology: the daemon's namespace (the node's host) with a pods port; pods are namespaces of their own"
bash scripts/netns.sh up "$P" one-arm
cat > "$DIR/lb.toml" <<CONF
[runtime]
api = "unix:$DIR/api.sock"
run_dir = "$DIR"

[[ports]]
name = "int"
device = "net_af_xdp1,iface=int0"
addrs = ["10.1.0.1/24", "2001:db8:1::1/64"]

[[ports]]
name = "pods"
addrs = ["10.244.1.1/24", "fd00:244:1::1/64"]
[ports.pods]
state_dir = "$DIR/pods"
service_cidrs = ["10.96.0.0/16", "fd00:96::/112"]
CONF
start_lb "$P-lb" "$DIR/lb.toml" "$DIR"
mkdir -p "$DIR/net.d" "$DIR/cni-bin"
ln -s "$(realpath "$PLUGIN")" "$DIR/cni-bin/vectorlb-cni"
cat > "$DIR/net.d/10-pods.conf" <<CONF
{ "cniVersion": "1.1.0", "name": "pods", "type": "vectorlb-cni", "api": "unix:$DIR/api.sock",
  "capabilities": { "io.kubernetes.cri.pod-annotations": true },
  "ipam": { "type": "host-local", "dataDir": "$DIR/ipam",
            "ranges": [[{ "subnet": "10.244.1.0/24" }], [{ "subnet": "fd00:244:1::/64" }]] } }
CONF
cat "$DIR/net.d/10-pods.conf"

declare -A IP
for i in 1 2 3; do
    n="$P-pod$i"
    ip netns add "$n"
    PODS+=("$n")
    ip netns exec "$n" ip link set lo up
    CAPS=
    [ "$i" = 3 ] && CAPS='{"io.kubernetes.cri.pod-annotations": {"vectorlb.io/memif-ports": "udp:5000"}}'
    say "cnitool add pods /var/run/netns/$n${CAPS:+ (annotated vectorlb.io/memif-ports: udp:5000)}"
    CAPS=$CAPS cni add pods "/var/run/netns/$n" > "$DIR/pod$i.json"
    IP[$i]=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ips"][0]["address"].split("/")[0])' "$DIR/pod$i.json")
    echo "pod$i: $(python3 -c 'import json,sys; print(", ".join(i["address"] for i in json.load(open(sys.argv[1]))["ips"]))' "$DIR/pod$i.json")"
    ip netns exec "$n" ip -br addr show eth0
done
CAPS= cni check pods "/var/run/netns/$P-pod1" && echo "cnitool check: pod1 is as the plugin left it"

for i in 1 2; do
    ip netns exec "$P-pod$i" "$TOOLS" probe serve-http --listen "[::]:8080" --name "pod$i" >/dev/null 2>&1 &
    PIDS+=($!)
    disown
done
ip netns exec "$P-pod3" "$TOOLS" pod-memif echo --duration-s 30 > "$DIR/echo.json" 2>/dev/null &
PIDS+=($!)
disown

say "a ClusterIP (10.96.0.10:80, Maglev, NAT) over pod1 and pod2, through the API (vectorlb kube [cluster_ips] does it from Services)"
api -X POST http://vectorlb/v1/services -d "{\"vip\": \"10.96.0.10\", \"port\": 80, \"proto\": \"tcp\", \"mode\": \"nat\", \"scheduler\": \"maglev\",
  \"backends\": [{\"addr\": \"${IP[1]}\", \"port\": 8080}, {\"addr\": \"${IP[2]}\", \"port\": 8080}]}" > /dev/null
for _ in $(seq 50); do
    api http://vectorlb/v1/pods | grep -q '"connected": *true' && break
    sleep 0.1
done
sleep 0.5

say "the host asks the ClusterIP through vlb0; pod3 asks it through its interface"
host=$(ip netns exec "$P-lb" "$TOOLS" probe http --url http://10.96.0.10:80/ --requests 300 --concurrency 4 --json | tail -1)
echo "host: $host"
pod=$(ip netns exec "$P-pod3" "$TOOLS" probe http --url http://10.96.0.10:80/ --requests 300 --concurrency 4 --json | tail -1)
echo "pod3: $pod"

say "pod1 sends UDP to pod3:5000: its memif takes the port, the example application answers"
udp=$(ip netns exec "$P-pod1" "$TOOLS" probe udp --target "${IP[3]}:5000" --flows 10 --per-flow 5 | tail -1)
echo "$udp"

say "pod1 sends 64 MiB over TCP to pod2: its kernel hands over 64 KB super-packets (offloads), checked by hash"
ip netns exec "$P-pod2" python3 -c '
import socket, hashlib
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 7100)); s.listen(1); s.settimeout(30)
c, _ = s.accept(); h = hashlib.sha256()
while True:
    b = c.recv(1 << 20)
    if not b: break
    h.update(b)
print(h.hexdigest())' > "$DIR/bulk-recv.txt" 2>&1 &
recv=$!
sleep 0.5
sent=$(ip netns exec "$P-pod1" python3 -c '
import socket, hashlib, os, sys, time
d = os.urandom(64 << 20); t = time.time()
s = socket.create_connection((sys.argv[1], 7100), timeout=30); s.sendall(d); s.shutdown(socket.SHUT_WR); s.recv(1)
print(hashlib.sha256(d).hexdigest(), "%.2f" % (len(d) * 8 / (time.time() - t) / 1e9))' "${IP[2]%%,*}")
wait $recv || true
bulk_ok=0
[ "${sent%% *}" = "$(cat "$DIR/bulk-recv.txt")" ] && bulk_ok=1
echo "sent sha256 ${sent%% *}, received $(cat "$DIR/bulk-recv.txt"): $([ $bulk_ok = 1 ] && echo same || echo DIFFERENT), ${sent##* } Gbit/s"

say "GET /v1/pods"
api http://vectorlb/v1/pods > "$DIR/pods.json"
python3 - "$DIR/pods.json" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1])):
    m = p.get("memif")
    line = "%-6s slot %3d %-34s rx %6d tx %6d offloads=%s super-packets read %d" % (p["ifname"], p["slot"], ",".join(p["ips"]), p["rx_packets"], p["tx_packets"], p.get("offloads"), p.get("rx_super", 0))
    if m:
        line += "  memif %s connected=%s" % (m["socket"], m["connected"])
    print(line)
PY

supers=$(python3 -c 'import json,sys; print(sum(p.get("rx_super", 0) for p in json.load(open(sys.argv[1]))))' "$DIR/pods.json")

say "cnitool del: every pod"
for i in 1 2 3; do CAPS= cni del pods "/var/run/netns/$P-pod$i"; done
left=$(api http://vectorlb/v1/pods | python3 -c 'import json,sys; print(sum(1 for p in json.load(sys.stdin) if p["container_id"] != "host"))')
echo "attachments left: $left"

read -r requests errors backends < <(python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(a["requests"] + b["requests"], a["errors"] + b["errors"], len(set(a["backends"]) | set(b["backends"])))' "$host" "$pod")
answered=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["backends"].get("flow", 0))' "$udp")
if [ "$errors" != 0 ] || [ "$backends" != 2 ] || [ "$answered" = 0 ] || [ "$left" != 0 ] || [ "$bulk_ok" != 1 ] || [ "$supers" = 0 ]; then
    echo "PODS FAILED requests=$requests errors=$errors backends=$backends memif_answered=$answered left=$left bulk_same=$bulk_ok super_packets=$supers"
    exit 1
fi
echo "PODS OK pods=3 requests=$requests errors=0 backends=2 memif_answered=$answered bulk_same=1 super_packets=$supers"
