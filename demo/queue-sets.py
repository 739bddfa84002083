#!/usr/bin/env python3
"""The demo's queue-set act (`make demo`): memcached behind the LB with bulk UDP through it, one
short point with and one without a queue set for memcached (bench/queue_sets.py's harness), checked.
Ends with QUEUE-SETS OK or FAILED (exit status 1). Root; run from the repository's top."""
import os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import benchutil  # noqa: E402
import queue_sets  # noqa: E402


def main():
    rows = queue_sets.run(queue_sets.parse(["--rates", "2000", "--seconds", "2", "--chart", ""]), benchutil.emitter(None))
    # Every request answered in both variants; with the set, its worker served memcached and
    # dropped nothing, and the bulk traffic that reached its queue went on to the default worker.
    qs = next(r for r in rows if r["variant"] == "queue_set")
    sets = {q["name"]: q for q in qs["lb_queue_sets"]}
    mc, df = sets.get("memcached", {}), sets.get("default", {})
    ok = (all(r["errors"] == 0 and r["lost"] == 0 for r in rows) and mc.get("rx", 0) > 0 and mc.get("dropped", 1) == 0
          and mc.get("steered", 0) > 0 and df.get("rx", 0) > 0)
    print(f"QUEUE-SETS {'OK' if ok else 'FAILED'} requests={sum(r['total']['requests'] for r in rows)} "
          f"set_rx={mc.get('rx')} set_steered_out={mc.get('steered')} default_steered_out={df.get('steered')} "
          f"p9999_us_set={qs['total']['p9999_us']}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
