#!/usr/bin/env bash
# `make bench-quick`: a reduced benchmark run (under 3 minutes) whose last line is one JSON
# object: 64-byte UDP through full NAT with one worker against dpdk-testpmd io-forward on the
# same AF_XDP ports (both driven by `vectorlb bench gen`), and real-TCP connections per second
# through vectorlb, nftables, HAProxy and nginx stream (scripts/bench-cps-peers.sh, 3 s each).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
P=vlbq
DIR=$(mktemp -d /tmp/vectorlb-quick.XXXXXX)
SECS=${QUICK_SECONDS:-4}
cleanup() {
    pkill -f "dpdk-testpmd.*$P" 2>/dev/null || true
    bash scripts/gen-topo.sh down "$P"
    rm -rf "$DIR"
}
trap cleanup EXIT
read -r G1 E0 < <(bash scripts/gen-topo.sh up "$P")

gen() {
    ip netns exec "$P-gen" "$BIN" bench gen --tx net_af_xdp0,iface=g0 --rx net_af_xdp1,iface=g1 \
        --dst-mac "$E0" --rate 0 --seconds "$SECS" --json 2>/dev/null | tail -1
}

# 1. vectorlb, full NAT, one worker, busy polling.
gen_lb_config "$DIR" "$G1" > "$DIR/lb.toml"
start_lb "$P-lb" "$DIR/lb.toml" "$DIR"
LB=$LB_PID
sleep 1
LBR=$(gen)
echo "$LBR" >&2
kill -TERM $LB; wait $LB || true
sleep 1

# 2. dpdk-testpmd io-forward between the same two ports (the I/O ceiling).
start_testpmd "$P-lb" "$DIR"
TPR=$(gen)
echo "$TPR" >&2
stop_testpmd

# 3. Connections per second with real TCP.
CPS=$(bash scripts/bench-cps-peers.sh 3 16 2>/dev/null || true)
echo "$CPS" >&2

python3 - "$LBR" "$TPR" "$CPS" <<'PY'
import json, sys
lb = json.loads(sys.argv[1]); tp = json.loads(sys.argv[2])
cps = {}
for l in sys.argv[3].splitlines():
    if l.strip():
        r = json.loads(l)
        cps[r["peer"]] = round(r["result"].get("requests_per_second", 0))
out = {
    "lb_mpps": round(lb["rx_mpps"], 3), "testpmd_mpps": round(tp["rx_mpps"], 3),
    "lb_vs_testpmd": round(lb["rx_mpps"] / tp["rx_mpps"], 3) if tp["rx_mpps"] else None,
    "lb_loss_ratio": round(lb["loss_ratio"], 4), "testpmd_loss_ratio": round(tp["loss_ratio"], 4),
    "lb_cps": cps.get("vectorlb"), "nft_cps": cps.get("nftables"), "haproxy_cps": cps.get("haproxy"),
    "nginx_stream_cps": cps.get("nginx_stream"), "frame_bytes": 64, "seconds": lb["seconds"],
}
print(json.dumps(out))
PY
