#!/usr/bin/env bash
# Where the pipeline spends its instructions, per packet and per connection: callgrind counts
# only the timed work (the out-of-line function vectorlb_bench::timed_process), and
# bench/profile-summary.py groups the counts by the source file they come from (parse,
# session table, services, rewrite, checksums, ...).
# Writes bench/results/profile.json (one JSON line per workload).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/vectorlb}
command -v valgrind >/dev/null || { echo "valgrind is missing: run scripts/setup.sh --bench" >&2; exit 1; }
DIR=$(mktemp -d /tmp/vectorlb-profile.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
mkdir -p bench/results
prof() { # NAME SYMBOL ARGS...
    local name=$1 sym=$2
    shift 2
    valgrind --tool=callgrind --callgrind-out-file="$DIR/$name.out" --collect-atstart=no \
        --toggle-collect="$sym" "$BIN" "$@" --json 2>/dev/null > "$DIR/$name.json"
    callgrind_annotate --inclusive=no --threshold=100 --auto=no "$DIR/$name.out" > "$DIR/$name.txt" 2>/dev/null
    python3 bench/profile-summary.py "$name" "$DIR/$name.json" "$DIR/$name.txt"
}
{
    prof packet 'vectorlb_bench::timed_process' bench pipeline --mode fnat --sessions 100000 --seconds 0.5 --rounds 1 --memory-points 0
    prof packet_nat 'vectorlb_bench::timed_process' bench pipeline --mode nat --sessions 100000 --seconds 0.5 --rounds 1 --memory-points 0
    # A segment without a session continued (scale-out): DR, maglev, within the budget.
    prof continued 'vectorlb_bench::timed_process' bench synflood --ack --mode dr --seconds 0.5 --rounds 1
    prof connection 'vectorlb_bench::timed_process' bench cps --mode fnat --seconds 0.5 --rounds 1
} | tee bench/results/profile.json
