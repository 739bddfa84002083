#!/usr/bin/env bash
# RFC 2544 through vectorlb (full NAT, one worker) on the generator topology: MAX, NDR and PDR
# per frame size (`vectorlb bench rfc2544`). One JSON line per size on stdout.
#   scripts/bench-rfc2544.sh [SIZES] [TRIAL_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SIZES=${1:-64,128,256,512,1024,1280,1518}
TRIAL=${2:-1}
P=vlbr
DIR=$(mktemp -d /tmp/vectorlb-rfc.XXXXXX)
cleanup() { bash scripts/gen-topo.sh down "$P"; rm -rf "$DIR"; }
trap cleanup EXIT
read -r G1 E0 < <(bash scripts/gen-topo.sh up "$P")
gen_lb_config "$DIR" "$G1" > "$DIR/lb.toml"
start_lb "$P-lb" "$DIR/lb.toml" "$DIR"
sleep 1
ip netns exec "$P-gen" "$BIN" bench rfc2544 --tx net_af_xdp0,iface=g0 --rx net_af_xdp1,iface=g1 \
    --dst-mac "$E0" --sizes "$SIZES" --trial-seconds "$TRIAL" 2>/dev/null
