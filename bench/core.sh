#!/usr/bin/env bash
# Runs the in-memory benchmarks behind docs/benchmarks.md: every mode x family x protocol at
# 1M sessions, the 10M-session figures, connections per second and SYN floods. JSON lines go to
# bench/results/core.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/vectorlb
mkdir -p bench/results
out=bench/results/core.jsonl
: >"$out"
run() { echo "+ vectorlb $*" >&2; "$bin" "$@" | tee -a "$out"; }
for fam in 4 6; do
    run bench pipeline --mode fnat --family $fam --proto udp --sessions 10000000 --memory-points 20 --json
done
for mode in nat fnat dr tun; do
    for fam in 4 6; do
        for proto in tcp udp; do
            run bench pipeline --mode $mode --family $fam --proto $proto --sessions 1000000 --seconds 3 --json
        done
    done
done
for fam in 4 6; do
    for mode in fnat nat; do
        run bench cps --mode $mode --family $fam --json
    done
done
# SYN floods: cookies answered per second per core (proxy on) against sessions opened within the
# half-open budget (proxy off), in the same run.
for fam in 4 6; do
    for sp in on off; do
        run bench synflood --mode fnat --family $fam --synproxy $sp --seconds 3 --json
    done
done
