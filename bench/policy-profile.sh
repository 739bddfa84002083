#!/usr/bin/env bash
# Instructions per packet of established sessions with 0, 100 and 10,000 NetworkPolicies
# isolating the backends (`vectorlb bench pipeline --policies N`, nat, TCP): callgrind counts
# only the timed work (vectorlb_bench::timed_process), as bench/profile.sh does for the L4
# core. One JSON line per count of policies, then one comparing them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/vectorlb}
command -v valgrind >/dev/null || { echo "valgrind is missing: run scripts/setup.sh --bench" >&2; exit 1; }
DIR=$(mktemp -d /tmp/vectorlb-policy-profile.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
for n in 0 100 10000; do
    valgrind --tool=callgrind --callgrind-out-file="$DIR/$n.out" --collect-atstart=no \
        --toggle-collect='vectorlb_bench::timed_process' "$BIN" bench pipeline --mode nat --proto tcp \
        --sessions 100000 --seconds 0.5 --rounds 1 --memory-points 0 --policies "$n" --json 2>/dev/null > "$DIR/$n.json"
done
python3 - "$DIR" <<'PY'
import json, re, sys
d = sys.argv[1]
per = {}
for n in (0, 100, 10000):
    r = json.loads(open(f"{d}/{n}.json").read().strip().splitlines()[-1])
    total = 0
    for line in open(f"{d}/{n}.out"):
        m = re.match(r"^(summary|totals): (\d+)", line)
        if m:
            total = int(m.group(2))
    per[n] = round(total / max(r["packets"], 1), 1)
    print(json.dumps({"bench": "policy_profile", "policies": n, "mode": "nat", "proto": "tcp", "sessions": r["sessions"], "packets": r["packets"],
                      "not_forwarded": r["not_forwarded"], "instructions_per_packet": per[n], "command": "valgrind --tool=callgrind (this build)"}))
print(json.dumps({"bench": "policy_profile_summary", "instructions_per_packet": per, "policy10k_vs_none": round(per[10000] / max(per[0], 1e-9), 3)}))
PY
