#!/usr/bin/env bash
# `make bench-quick`: a reduced benchmark run (50 s after the build on 2026-11-26) whose last line is one JSON
# object: 64-byte UDP through full NAT with one worker against dpdk-testpmd io-forward on the
# same AF_XDP ports (both driven by `vectorlb-tools gen`), and real-TCP connections per second
# through vectorlb, nftables, HAProxy and nginx stream (bench/cps-peers.sh, 3 s each).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${QUICK_SECONDS:-4}

# 1. vectorlb (full NAT, one busy-polling worker), then 2. dpdk-testpmd io-forward between the
# same two ports (the I/O ceiling): one generator trial each at its full rate
# (bench/rfc2544.sh builds the topology and starts the device).
gen() { GEN_ARGS="--rate 0 --seconds $SECS" bash bench/rfc2544.sh "$1" | tail -1; }
LBR=$(gen vectorlb)
echo "$LBR" >&2
TPR=$(gen testpmd)
echo "$TPR" >&2

# 3. Connections per second with real TCP.
CPS=$(bash bench/cps-peers.sh 3 16 2>/dev/null || true)
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
