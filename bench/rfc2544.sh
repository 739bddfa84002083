#!/usr/bin/env bash
# RFC 2544 on the generator topology (`vectorlb-tools rfc2544`: MAX, NDR and PDR per frame size)
# through a device under test on the same two AF_XDP ports:
#   vectorlb  full NAT of UDP, one busy-polling worker pinned to CPU 1
#   testpmd   dpdk-testpmd --forward-mode=io (the I/O ceiling)
# One JSON line per size on stdout, with "dut" added; progress on stderr.
#   bench/rfc2544.sh DUT [SIZES] [TRIAL_SECONDS] [REPEAT] [RESOLUTION] [RETRIES]
# With GEN_ARGS set (e.g. "--rate 20000 --seconds 1 --proto tcp"), one `vectorlb-tools gen`
# trial with those arguments instead of the search; with PERF_OUT=FILE also, `perf record`
# samples the device under test's process (cpu-clock, PERF_HZ per second, default 2999) for
# PERF_SECONDS (default 3) from 1 s into the trial (bench/profile-io.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
DUT=${1:?vectorlb|testpmd}
SIZES=${2:-64,128,256,512,1024,1280,1518}
TRIAL=${3:-1}
REPEAT=${4:-1}
RES=${5:-0.05}
RETRIES=${6:-0}
P=vlbr
DIR=$(mktemp -d /tmp/vectorlb-rfc.XXXXXX)
TP_PID=
LB_PID=
cleanup() {
    [ -n "$TP_PID" ] && stop_testpmd
    [ -n "$LB_PID" ] && { kill -TERM "$LB_PID" 2>/dev/null; wait "$LB_PID" 2>/dev/null || true; }
    bash scripts/gen-topo.sh down "$P"
    rm -rf "$DIR"
}
trap cleanup EXIT
read -r G1 E0 < <(bash scripts/gen-topo.sh up "$P")
case $DUT in
    vectorlb)
        gen_lb_config "$DIR" "$G1" > "$DIR/lb.toml"
        start_lb "$P-lb" "$DIR/lb.toml" "$DIR"
        sleep 1 ;;
    testpmd) start_testpmd "$P-lb" "$DIR" ;;
    *) echo "unknown device under test '$DUT' (vectorlb|testpmd)" >&2; exit 2 ;;
esac
if [ -n "${GEN_ARGS:-}" ]; then
    if [ -n "${PERF_OUT:-}" ]; then
        command -v perf >/dev/null || { echo "perf is missing: run scripts/setup.sh --bench" >&2; exit 1; }
        DUT_PID=${LB_PID:-$TP_PID}
        (sleep 1; exec perf record -q -e cpu-clock -F "${PERF_HZ:-2999}" -p "$DUT_PID" -o "$PERF_OUT" -- sleep "${PERF_SECONDS:-3}") >/dev/null 2>&1 &
        PERF_PID=$!
    fi
    # shellcheck disable=SC2086
    ip netns exec "$P-gen" "$TOOLS" gen --tx net_af_xdp0,iface=g0 --rx net_af_xdp1,iface=g1 \
        --dst-mac "$E0" $GEN_ARGS --json 2> >(grep -v "^EAL\|^TELEMETRY\|^lib" >&2) | sed -u "s/^{/{\"dut\":\"$DUT\",/"
    [ -z "${PERF_PID:-}" ] || wait "$PERF_PID" || { echo "perf record failed" >&2; exit 1; }
    exit 0
fi
ip netns exec "$P-gen" "$TOOLS" rfc2544 --tx net_af_xdp0,iface=g0 --rx net_af_xdp1,iface=g1 \
    --dst-mac "$E0" --sizes "$SIZES" --trial-seconds "$TRIAL" --repeat "$REPEAT" --resolution "$RES" --retries "$RETRIES" \
    2> >(grep -v "^EAL\|^TELEMETRY" >&2) | sed -u "s/^{/{\"dut\":\"$DUT\",/"
