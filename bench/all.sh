#!/usr/bin/env bash
# `make bench`: the whole benchmark kit (each step prints its elapsed time; memif, the longest,
# took 19.5 minutes on 2026-11-26), then
# docs/benchmarks.md and its charts regenerated from bench/results/.
#   1 core        pipeline per mode/family/protocol, 10 M sessions with the memory curve, CPS
#   2 scaling     pipeline with 1..N worker threads (N = the machine's cores)
#   3 profile     callgrind: instructions per packet and per connection, by stage
#   4 profile-io  perf samples of the daemon's worker and of testpmd at full load, I/O included
#   5 rfc2544     MAX / NDR / PDR per frame size through vectorlb, then dpdk-testpmd io-forward
#   6 cps peers   real TCP connections/s: vectorlb, nftables, HAProxy, nginx stream
#   7 wrk         20 s of HTTP through the demo topology
#   8 idle        CPU with no traffic, ping wake-up
#   9 memif       the memif server against DPDK's net_memif, by frame size and engine, then
#                 25 rounds head to head at 64 and 1500 B (19.5 min on 2026-11-26)
#  10 report      docs/benchmarks.md, docs/img/*.png
# BENCH_STEPS="core rfc2544" runs a subset (the report always runs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
RES=bench/results
mkdir -p "$RES"
STEPS=${BENCH_STEPS:-core scaling profile profile-io rfc2544 cps wrk idle memif}
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
ALL=(core synflood scaling profile profile-io rfc2544 cps wrk idle memif report)
T0=$(date +%s)
# What was measured, for the report (which may be regenerated later, at another commit).
# A whole run dates the page; a single step (BENCH_STEPS=profile, ...) dates its own section
# (bench/results/STEP-measured-at.txt, STEP-machine.txt), so the rest of the page keeps its date.
stamp() { # [PREFIX]
    echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(date -u +%Y-%m-%d)" > "$RES/${1:-}measured-at.txt"
    $PY bench/report.py --machine > "$RES/${1:-}machine.txt"
}
want() { [[ " $STEPS " == *" $1 "* ]]; }
if want core; then
    stamp
fi
step() { # NAME DESCRIPTION
    local i=0 n=${#ALL[@]} k
    for k in "${!ALL[@]}"; do [ "${ALL[$k]}" = "$1" ] && i=$((k + 1)); done
    local w=24 f=$(( i * 24 / n ))
    printf '\n[%s%s] %d/%d %s (%ds elapsed)\n' "$(printf '#%.0s' $(seq 1 $f))" "$(printf '.%.0s' $(seq 1 $((w - f))))" \
        "$i" "$n" "$2" $(( $(date +%s) - T0 )) >&2
}

if want core; then
    step core "pipeline and CPS in memory (bench/results/core.jsonl)"
    bash bench/core.sh
fi
if want synflood; then
    # Only the SYN floods of the core step, in a file of their own (make bench-synflood).
    step synflood "SYN floods in memory (bench/results/synflood.jsonl)"
    : > "$RES/synflood.jsonl"
    for fam in 4 6; do
        for sp in on off; do
            "$BIN" bench synflood --mode fnat --family $fam --synproxy $sp --seconds 3 --json | tee -a "$RES/synflood.jsonl"
        done
    done
    stamp synflood-
fi
if want scaling; then
    step scaling "worker threads 1..$(nproc) (bench/results/scaling.jsonl)"
    : > "$RES/scaling.jsonl"
    for t in $(seq 1 "$(nproc)"); do
        echo "+ vectorlb bench pipeline --threads $t --sessions 4000000" >&2
        "$BIN" bench pipeline --mode fnat --sessions 4000000 --threads "$t" --memory-points 0 --json | tee -a "$RES/scaling.jsonl"
    done
fi
if want profile; then
    step profile "callgrind per packet and per connection (bench/results/profile.json)"
    bash bench/profile.sh
    stamp profile-
fi
if want profile-io; then
    step profile-io "perf: the worker's time per packet, I/O included (bench/results/profile-io.jsonl)"
    bash bench/profile-io.sh 3 | cut -c1-160
fi
if want rfc2544; then
    step rfc2544 "RFC 2544 through vectorlb, then dpdk-testpmd (bench/results/rfc2544.jsonl)"
    : > "$RES/rfc2544.jsonl"
    for dut in vectorlb testpmd; do
        bash bench/rfc2544.sh "$dut" 64,128,256,512,1024,1280,1518 1.5 1 0.05 1 | tee -a "$RES/rfc2544.jsonl" | cut -c1-160
    done
fi
if want cps; then
    step cps "real TCP connections/s through the peers (bench/results/cps-peers.jsonl)"
    bash bench/cps-peers.sh 5 16 | tee "$RES/cps-peers.jsonl"
fi
if want wrk; then
    step wrk "wrk 20 s through the full-NAT VIP (bench/results/wrk-fnat.txt)"
    DEMO_WRK=20 WRK_OUT="$RES/wrk-fnat.txt" bash demo/demo.sh > /dev/null
    tail -3 "$RES/wrk-fnat.txt" >&2
fi
if want idle; then
    step idle "idle CPU and wake-up (bench/results/idle.jsonl)"
    bash bench/idle.sh | tee "$RES/idle.jsonl"
fi
if want memif; then
    step memif "memif against DPDK's net_memif (bench/results/memif.jsonl)"
    "$TOOLS" bench-memif --reps "${MEMIF_REPS:-3}" --json | tee "$RES/memif.jsonl" | grep -v '"rep"' | cut -c1-160
    "$TOOLS" bench-memif --focus --sizes 64,1500 --reps "${MEMIF_FOCUS_REPS:-25}" --seconds 2 --json | tee "$RES/memif-focus.jsonl" | grep -v '"rep"' | cut -c1-160
    stamp memif-
fi
step report "docs/benchmarks.md and docs/img/*.png"
$PY bench/report.py
echo "bench: done in $(( $(date +%s) - T0 )) s" >&2
