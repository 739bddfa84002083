#!/usr/bin/env bash
# `make demo` (its mesh act) and `make demo-mesh`: the mesh without sidecars (docs/mesh.md). Two
# nodes (a daemon with a pods port each, in namespaces of their own, joined by a link), pods by
# vectorlb-cni: on node a web and batch, on node b db (HTTP on 8080), and on each node a pod for
# its mesh proxy (`vectorlb mesh`). An authority (`vectorlb mesh-ca`) issues each node the
# certificates of the pods it runs; db takes web only (an AuthorizationPolicy). The daemons steer
# the meshed pods' TCP to their proxies (PUT /v1/mesh): web's requests cross the link inside
# mutual TLS, db sees web's own address, batch is refused, no rule is in nftables.
#
#   node a: web, batch --> data plane --> proxy a ==(mTLS, HTTP/2 CONNECT, :15008)==> proxy b --> data plane --> db :node b
#
# Everything it creates is removed on exit. Last line:
#   MESH OK requests=<n> errors=0 server_saw_client=1 tls_only=1 denied=1 nft_rules=0
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
DIR=$(mktemp -d /tmp/vectorlb-mesh.XXXXXX)
CNITOOL=$(bash scripts/cni-bins.sh)/cnitool
PLUGIN=${PLUGIN:-$(dirname "$BIN")/vectorlb-cni}
PIDS=()
PODS=()
LBS=()
NODES=(vlbmsa vlbmsb)

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for p in "${LBS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${LBS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for n in "${PODS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    for n in "${NODES[@]}"; do bash scripts/netns.sh down "$n" >/dev/null 2>&1 || true; done
    if [ $rc -ne 0 ]; then
        echo "mesh demo failed (exit $rc); the logs:" >&2
        tail -5 "$DIR"/*/lb.log "$DIR"/*/mesh.log >&2 2>/dev/null || true
    fi
    rm -rf "$DIR"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say() { printf '\n== %s\n' "$*"; }
api() { local k=$1; shift; curl -sS --unix-socket "$DIR/$k/api.sock" -H 'content-type: application/json' "$@"; }
cni() { local k=$1; shift; NETCONFPATH="$DIR/$k/net.d" CNI_PATH="$DIR/cni-bin:/usr/lib/cni" "$CNITOOL" "$@"; }

mkdir -p "$DIR/cni-bin"
ln -s "$(realpath "$PLUGIN")" "$DIR/cni-bin/vectorlb-cni"
say "two nodes: a daemon with a pods port each (10.244.1.0/24, 10.244.2.0/24), joined by a link (192.168.79.0/24)"
for k in 1 2; do
    P=${NODES[$((k - 1))]}
    bash scripts/netns.sh up "$P" one-arm >/dev/null
    mkdir -p "$DIR/$k/net.d"
    cat > "$DIR/$k/lb.toml" <<CONF
[runtime]
api = "unix:$DIR/$k/api.sock"
run_dir = "$DIR/$k"

[[ports]]
name = "int"
device = "net_af_xdp1,iface=int0"
addrs = ["10.1.0.1/24"]

[[ports]]
name = "pods"
addrs = ["10.244.$k.1/24"]
[ports.pods]
state_dir = "$DIR/$k/pods"
service_cidrs = ["10.96.0.0/16"]
CONF
    start_lb "$P-lb" "$DIR/$k/lb.toml" "$DIR/$k"
    LBS+=("$LB_PID")
    cat > "$DIR/$k/net.d/10-pods.conf" <<CONF
{ "cniVersion": "1.1.0", "name": "pods", "type": "vectorlb-cni", "api": "unix:$DIR/$k/api.sock",
  "ipam": { "type": "host-local", "dataDir": "$DIR/$k/ipam", "ranges": [[{ "subnet": "10.244.$k.0/24" }]] } }
CONF
done
ip link add vlbms-a type veth peer name vlbms-b
for k in 1 2; do
    P=${NODES[$((k - 1))]}
    dev=vlbms-$([ $k = 1 ] && echo a || echo b)
    ip link set "$dev" netns "$P-lb" name node0
    ip netns exec "$P-lb" ip addr add "192.168.79.$k/24" dev node0
    ip netns exec "$P-lb" ip link set node0 up
    ip netns exec "$P-lb" sysctl -qw net.ipv4.ip_forward=1
    other=$((3 - k))
    ip netns exec "$P-lb" ip route replace "10.244.$other.0/24" via "192.168.79.$other"
done

declare -A IP CID
pod() { # pod NODE NAME
    local k=$1 name=$2 n="${NODES[$(($1 - 1))]}-$2"
    ip netns add "$n"
    PODS+=("$n")
    ip netns exec "$n" ip link set lo up
    cni "$k" add pods "/var/run/netns/$n" > "$DIR/$k/$name.json"
    IP[$name]=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ips"][0]["address"].split("/")[0])' "$DIR/$k/$name.json")
    CID[$name]=$(api "$k" http://vectorlb/v1/pods | python3 -c 'import json,sys; print(next(p["container_id"] for p in json.load(sys.stdin) if p["netns"] == sys.argv[1]))' "/var/run/netns/$n")
    echo "node $k: $name ${IP[$name]}"
}
say "pods by cnitool: web, batch and proxy on node a; db and proxy on node b"
pod 1 web; pod 1 batch; pod 1 proxy
pod 2 db; pod 2 proxyb
ip netns exec "${NODES[1]}-db" "$TOOLS" probe serve-http --listen "0.0.0.0:8080" --name db >/dev/null 2>&1 &
PIDS+=($!)
disown

say "the authority and each node's certificates (vectorlb mesh-ca): node a holds web's and batch's, node b db's"
"$BIN" mesh-ca init --dir "$DIR/ca"
"$BIN" mesh-ca issue --ca "$DIR/ca" --out "$DIR/1/certs" --identity shop/web --identity jobs/batch
"$BIN" mesh-ca issue --ca "$DIR/ca" --out "$DIR/2/certs" --identity shop/db
cat > "$DIR/state.json" <<JSON
{"workloads": [
  {"ip": "${IP[web]}", "namespace": "shop", "account": "web", "node": "node-a"},
  {"ip": "${IP[batch]}", "namespace": "jobs", "account": "batch", "node": "node-a"},
  {"ip": "${IP[db]}", "namespace": "shop", "account": "db", "node": "node-b", "labels": {"app": "db"}}],
 "policies": [{"namespace": "shop", "name": "db-from-web", "spec": {"selector": {"matchLabels": {"app": "db"}},
   "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/web"]}}]}]}}]}
JSON
echo "db takes connections from spiffe://cluster.local/ns/shop/sa/web only"

say "the node proxies (vectorlb mesh --steer eth0) and the daemons' steering (PUT /v1/mesh)"
for k in 1 2; do
    name=$([ $k = 1 ] && echo proxy || echo proxyb)
    node=$([ $k = 1 ] && echo node-a || echo node-b)
    ip netns exec "${NODES[$((k - 1))]}-$name" "$BIN" mesh --node "$node" --state "$DIR/state.json" --certs "$DIR/$k/certs" \
        --steer eth0 --metrics 127.0.0.1:15020 --cryptomb 2> "$DIR/$k/mesh.log" &
    PIDS+=($!)
    disown
    for _ in $(seq 50); do
        ip netns exec "${NODES[$((k - 1))]}-$name" curl -sf http://127.0.0.1:15020/metrics >/dev/null 2>&1 && break
        sleep 0.1
    done
    api "$k" -X PUT http://vectorlb/v1/mesh -d "{\"proxy_container_id\": \"${CID[$name]}\", \"proxy_ifname\": \"eth0\",
      \"members\": [\"${IP[web]}\", \"${IP[batch]}\", \"${IP[db]}\"]}"
    echo
done

say "web asks db through the mesh, a capture on the link between the nodes running"
ip netns exec "${NODES[0]}-lb" tcpdump -i node0 -w "$DIR/link.pcap" -U tcp 2>/dev/null &
DUMP=$!
PIDS+=("$DUMP")
sleep 0.5
seen=$(ip netns exec "${NODES[0]}-web" curl -s -i -m 5 "http://${IP[db]}:8080/" | tr -d '\r' | sed -n 's/^x-client: //p')
echo "db saw the client as $seen (web is ${IP[web]})"
load=$(ip netns exec "${NODES[0]}-web" "$TOOLS" probe http --url "http://${IP[db]}:8080/" --requests 500 --concurrency 4 --json | tail -1)
echo "web: $load"
sleep 0.5
kill "$DUMP" 2>/dev/null || true
wait "$DUMP" 2>/dev/null || true
echo "on the link: $(tcpdump -nr "$DIR/link.pcap" 2>/dev/null | grep -c '\.15008') packets of the tunnel port, $(tcpdump -nr "$DIR/link.pcap" 2>/dev/null | grep -c '\.8080') of db's port"
tls_only=0
if [ "$(tcpdump -nr "$DIR/link.pcap" 2>/dev/null | grep -c '\.15008')" -gt 0 ] && [ "$(tcpdump -nr "$DIR/link.pcap" 2>/dev/null | grep -c '\.8080')" = 0 ] \
    && ! grep -aq "HTTP/1.1" "$DIR/link.pcap"; then
    tls_only=1
fi

say "batch asks db: refused by db's policy at node b"
denied=0
ip netns exec "${NODES[0]}-batch" curl -s -m 3 "http://${IP[db]}:8080/" >/dev/null 2>&1 || denied=1
echo "batch: $([ $denied = 1 ] && echo refused || echo ANSWERED)"

say "node b's proxy: GET /metrics (per identity pair)"
ip netns exec "${NODES[1]}-proxyb" curl -s http://127.0.0.1:15020/metrics | grep -E '^vectorlb_mesh_(inbound_(streams|denied)|handshakes)_total' | grep -v ' 0$'

say "the rule sets (nftables) of the nodes and the proxies"
rules=0
for n in "${NODES[0]}-lb" "${NODES[1]}-lb" "${NODES[0]}-proxy" "${NODES[1]}-proxyb"; do
    c=$(ip netns exec "$n" nft list ruleset 2>/dev/null | grep -c . || true)
    echo "$n: $c lines"
    rules=$((rules + c))
done

read -r requests errors < <(python3 -c 'import json,sys; a = json.loads(sys.argv[1]); print(a["requests"], a["errors"])' "$load")
saw=0
case "$seen" in "${IP[web]}:"*) saw=1 ;; esac
if [ "$errors" != 0 ] || [ "$saw" != 1 ] || [ "$tls_only" != 1 ] || [ "$denied" != 1 ] || [ "$rules" != 0 ]; then
    echo "MESH FAILED requests=$requests errors=$errors server_saw_client=$saw tls_only=$tls_only denied=$denied nft_rules=$rules"
    exit 1
fi
echo "MESH OK requests=$requests errors=0 server_saw_client=1 tls_only=1 denied=1 nft_rules=0"
