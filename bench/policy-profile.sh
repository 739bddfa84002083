#!/usr/bin/env bash
# Instructions per packet of established flows with 0, 100 and 10,000 NetworkPolicies
# isolating the backends (`vectorlb bench pipeline --policies N`): a Service's sessions (nat,
# TCP; the verdict is kept with the session) and routed pod-to-pod flows (`--routed`; the
# verdict is kept in the shared flow table). callgrind counts only the timed work, as
# bench/profile.sh does for the L4 core. One JSON line per path and count, then a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/vectorlb}
command -v valgrind >/dev/null || { echo "valgrind is missing: run scripts/setup.sh --bench" >&2; exit 1; }
DIR=$(mktemp -d /tmp/vectorlb-policy-profile.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
# routed-cached: 16 flows, which a worker's flow cache holds (routed: 100,000 in turn, which
# it cannot, so most packets also pay the endpoint lookups and the shared table).
for path in service routed routed-cached; do
    sym=timed_process extra= flows=100000
    [ $path = routed ] && sym=timed_route extra=--routed
    [ $path = routed-cached ] && sym=timed_route extra=--routed flows=16
    for n in 0 100 10000; do
        valgrind --tool=callgrind --callgrind-out-file="$DIR/$path-$n.out" --collect-atstart=no \
            --toggle-collect="vectorlb_bench::$sym" "$BIN" bench pipeline --mode nat --proto tcp \
            --sessions "$flows" --seconds 0.5 --rounds 1 --memory-points 0 --policies "$n" $extra --json 2>/dev/null > "$DIR/$path-$n.json"
    done
done
python3 - "$DIR" <<'PY'
import json, re, sys
d = sys.argv[1]
per = {}
for path in ("service", "routed", "routed-cached"):
    for n in (0, 100, 10000):
        r = json.loads(open(f"{d}/{path}-{n}.json").read().strip().splitlines()[-1])
        total = 0
        for line in open(f"{d}/{path}-{n}.out"):
            m = re.match(r"^(summary|totals): (\d+)", line)
            if m:
                total = int(m.group(2))
        per.setdefault(path, {})[n] = round(total / max(r["packets"], 1), 1)
        print(json.dumps({"bench": "policy_profile", "path": path, "policies": n, "mode": "nat", "proto": "tcp", "flows": r["sessions"], "packets": r["packets"],
                          "not_forwarded": r["not_forwarded"], "instructions_per_packet": per[path][n], "command": "valgrind --tool=callgrind (this build)"}))
print(json.dumps({"bench": "policy_profile_summary", "instructions_per_packet": per,
                  "service_10k_vs_none": round(per["service"][10000] / per["service"][0], 3), "routed_10k_vs_none": round(per["routed"][10000] / per["routed"][0], 3),
                  "routed_cached_10k_vs_none": round(per["routed-cached"][10000] / per["routed-cached"][0], 3),
                  "routed_10k_vs_100": round(per["routed"][10000] / per["routed"][100], 3)}))
PY
