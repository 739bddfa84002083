#!/usr/bin/env bash
# RFC 2544 through vectorlb (full NAT, one worker) on the generator topology: MAX, NDR and PDR
# per frame size (`vectorlb bench rfc2544`). One JSON line per size on stdout.
#   scripts/bench-rfc2544.sh [SIZES] [TRIAL_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-64,128,256,512,1024,1280,1518}
TRIAL=${2:-1}
BIN=target/release/vectorlb
P=vlbr
DIR=$(mktemp -d /tmp/vectorlb-rfc.XXXXXX)
cleanup() { bash scripts/gen-topo.sh down "$P"; rm -rf "$DIR"; }
trap cleanup EXIT
read -r G1 E0 < <(bash scripts/gen-topo.sh up "$P")
cat > "$DIR/lb.toml" <<CONF
[runtime]
api = "unix:$DIR/api.sock"
run_dir = "$DIR"
idle_sleep_us = 0
cpus = [1]

[[ports]]
name = "ext"
device = "net_af_xdp0,iface=ext0"
addrs = ["10.0.0.1/24"]

[[ports]]
name = "int"
device = "net_af_xdp1,iface=int0"
addrs = ["10.1.0.1/24"]

[[neighbors]]
ip = "10.1.0.11"
mac = "$G1"

[[services]]
vip = "10.0.0.100"
port = 9
proto = "udp"
mode = "fnat"
local_addrs = ["10.1.0.200"]
backends = [{ addr = "10.1.0.11", port = 9 }]
CONF
ip netns exec "$P-lb" "$BIN" run --config "$DIR/lb.toml" > "$DIR/lb.log" 2>&1 &
for _ in $(seq 100); do "$BIN" ctl --api "unix:$DIR/api.sock" --raw GET /v1/health >/dev/null 2>&1 && break; sleep 0.1; done
sleep 1
ip netns exec "$P-gen" "$BIN" bench rfc2544 --tx net_af_xdp0,iface=g0 --rx net_af_xdp1,iface=g1 \
    --dst-mac "$E0" --sizes "$SIZES" --trial-seconds "$TRIAL" 2>/dev/null
