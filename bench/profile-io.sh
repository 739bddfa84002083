#!/usr/bin/env bash
# Where the daemon's worker spends its time per packet, I/O included, beside testpmd on the same
# ports: the generator sends 64-byte UDP at its full rate through the device under test (the
# RFC 2544 topology, bench/rfc2544.sh), and `perf record -e cpu-clock` samples the
# device's process for SECONDS (a timer, not a hardware counter: this VM has no PMU).
# bench/profile-io-summary.py groups the data-plane thread's samples into parts and converts
# them to nanoseconds per received packet. Writes bench/results/profile-io.jsonl.
#   bench/profile-io.sh [SECONDS] [HZ]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}
HZ=${2:-2999}
command -v perf >/dev/null || { echo "perf is missing: run scripts/setup.sh --bench" >&2; exit 1; }
DIR=$(mktemp -d /tmp/vectorlb-profile-io.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
mkdir -p bench/results
for dut in vectorlb testpmd; do
    GEN_ARGS="--seconds $((SECS + 3))" PERF_OUT="$DIR/$dut.data" PERF_SECONDS=$SECS PERF_HZ=$HZ \
        bash bench/rfc2544.sh "$dut" > "$DIR/$dut.json"
    python3 bench/profile-io-summary.py "$dut" "$DIR/$dut.data" "$DIR/$dut.json" "$HZ" "$SECS"
done | tee bench/results/profile-io.jsonl
