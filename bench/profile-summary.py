#!/usr/bin/env python3
"""Summarises a callgrind_annotate listing (--inclusive=no) of the timed work: instructions
per packet (pipeline) or per connection (cps), grouped by the source file the instructions
come from, since the stages are inlined into a few functions. One JSON line on stdout.
    profile-summary.py NAME BENCH.json ANNOTATE.txt"""
import json, re, sys

GROUPS = [  # (substring of the source path, what it is)
    ("packet/src/parse.rs", "parse headers"),
    ("packet/src/checksum.rs", "checksums"),
    ("packet/src/", "packet views"),
    ("lb/src/session.rs", "session table"),
    ("lb/src/service.rs", "service lookup"),
    ("sched/src/", "scheduler"),
    ("lb/src/rewrite.rs", "header rewrite"),
    ("lb/src/tcpstate.rs", "TCP state"),
    ("lb/src/pipeline.rs", "pipeline control"),
    ("bench/src/", "benchmark harness"),
    ("library/core/", "Rust core (bounds checks, byte order, integer ops)"),
    ("library/alloc/", "Rust alloc"),
]

name, bench_path, ann_path = sys.argv[1:4]
bench = json.loads(open(bench_path).read().strip().splitlines()[-1])
total = 0
groups, funcs = {}, {}
line = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*?):(\S+)")
for l in open(ann_path):
    if "PROGRAM TOTALS" in l:
        total = int(l.split()[0].replace(",", ""))
        continue
    m = line.match(l)
    if not m:
        continue
    ir, path, func = int(m.group(1).replace(",", "")), m.group(2), m.group(3)
    g = next((label for key, label in GROUPS if key in path), "other (libc, no line information)")
    groups[g] = groups.get(g, 0) + ir
    funcs[func] = funcs.get(func, 0) + ir
if bench["bench"] == "cps":
    units, unit = bench["connections"] + bench["sessions_left"] * 0.5, "connection"
elif bench["bench"] in ("synflood", "ackflood"):
    units, unit = bench["syns"], "packet"
else:
    units, unit = bench["packets"], "packet"
per = lambda x: round(x / units, 1) if units else None
print(json.dumps({
    "bench": "profile", "workload": name, "mode": bench["mode"], "unit": unit, "units": units,
    "instructions_per_unit": per(total),
    "by_source": {k: per(v) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
    "by_function": {k: per(v) for k, v in sorted(funcs.items(), key=lambda kv: -kv[1])[:8]},
    "command": "valgrind --tool=callgrind (instruction counts, this build)",
}))
