#!/usr/bin/env python3
"""Priority dispatch against FIFO dispatch in the proxy (seed 000: NGINX's thread pool with a
priority queue): a CDN origin serving objects of 1 KB, 10 KB, 100 KB and 1 MB (40/30/20/10 % of
requests), the small two marked high priority in the URI (`?prio=high`), the large two low.

Three proxies with the same configuration but the dispatch queue (priority and fifo in the
software queue; priority in a DPDK event device, `event_sw`, as `eventdev`), one worker and a
dispatch pool of 2 threads, and (`--modes ...,reuseport`) a fourth setup without a pool: two proxy processes sharing the
port with SO_REUSEPORT, each reading objects on its connections' own thread (`mode = "inline"`,
the kernel spreading the connections, as NGINX's workers without thread pools); all pinned to
CPU 0; the open-loop client (`vectorlb-tools http-load`:
fixed arrival rate, latency from the intended send time; each object size its own connections,
as its own population of users) on CPU 1.

A round measures each proxy's capacity (closed loop, 256 connections, `--capacity-seconds`),
takes the median of the dispatch pools' as this round's capacity, and runs every proxy at 50, 80 and 95 % of it, open
loop: so each load is defined from a capacity measured minutes, not a whole run, before it.
Rounds alternate the order of the proxies (paired rounds: each round compares the modes under
the same minute of this shared host). For each load the ratio of the 1 KB (high class) p99,
FIFO over priority and FIFO over eventdev, is computed per round; its median over the rounds
and its spread (lowest, highest) are printed and written (`dispatch_ratio`), with each round's
throughput against FIFO's and the errors. JSON lines on stdout and in --out; a chart of p99 by
object size at each load, medians with the rounds' spread as error bars (docs/img/dispatch.png),
when matplotlib is there.

    bench/dispatch.py [--tools target/release/vectorlb-tools] [--bin target/release/vectorlb]
                      [--seconds 6] [--capacity-seconds 3] [--rounds 5] [--out bench/results/dispatch.jsonl]
"""
import argparse, functools, json, os, statistics, subprocess, sys, tempfile

import benchutil
from benchutil import CLIENT_CPU, SERVER_CPU, cpu_name, free_port

wait_port = functools.partial(benchutil.wait_port, tool="bench-dispatch")

OBJECTS = [("1k", 1024, "high", 40), ("10k", 10240, "high", 30), ("100k", 102400, "low", 20), ("1m", 1048576, "low", 10)]


def load(args, port, rate, connections, seconds=None):
    seconds = seconds or args.seconds
    cmd = ["taskset", "-c", CLIENT_CPU, args.tools, "http-load", "--target", f"127.0.0.1:{port}", "--rate", str(rate),
           "--seconds", str(seconds), "--warmup", str(min(2.0, seconds / 4)), "--connections", str(connections), "--json"]
    for name, _, prio, weight in OBJECTS:
        cmd += ["--request", f"{name}=/o/{name}.bin?prio={prio}:{weight}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 120)
    if out.returncode != 0:
        raise SystemExit(f"bench-dispatch: http-load failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def chart(rows, path):
    """p99 by object size at each load: the median of the rounds, error bars to the lowest and
    highest round."""
    plt = benchutil.pyplot("bench-dispatch")
    if plt is None:
        return
    loads = sorted({r["load"] for r in rows})
    fig, axes = plt.subplots(1, len(loads), figsize=(4.2 * len(loads), 3.6), sharey=False)
    for ax, ld in zip(axes, loads):
        xs = range(len(OBJECTS))
        for k, (mode, color) in enumerate((("priority", "#1f77b4"), ("eventdev", "#2ca02c"), ("fifo", "#d62728"), ("reuseport", "#7f7f7f"))):
            r = next((r for r in rows if r["load"] == ld and r["mode"] == mode), None)
            if r is None:
                continue
            ys = [r["types"][o[0]]["p99_ms"] or 0 for o in OBJECTS]
            lo = [max(0, y - min(r["types"][o[0]]["p99_ms_rounds"])) for y, o in zip(ys, OBJECTS)]
            hi = [max(0, max(r["types"][o[0]]["p99_ms_rounds"]) - y) for y, o in zip(ys, OBJECTS)]
            ax.bar([x + (k - 1.5) * 0.2 for x in xs], ys, 0.2, label=mode, color=color, yerr=[lo, hi], capsize=2, error_kw={"elinewidth": 0.8})
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{o[0]}\n({o[2]})" for o in OBJECTS])
        ax.set_title(f"{int(ld * 100)} % load")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle("Proxy: p99 by object size, median of rounds (bars: lowest to highest round): priority (software queue; eventdev: event_sw), FIFO, SO_REUSEPORT", fontsize=9)
    benchutil.save_chart(fig, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/vectorlb")
    ap.add_argument("--tools", default="target/release/vectorlb-tools")
    ap.add_argument("--seconds", type=float, default=8.0, help="each open-loop run (the first quarter, at most 2 s, is warm-up)")
    ap.add_argument("--capacity-seconds", type=float, default=3.0, help="each closed-loop capacity run")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="priority,eventdev,fifo", help="the setups compared (add reuseport for SO_REUSEPORT workers without a pool)")
    ap.add_argument("--loads", default="0.5,0.8,0.95")
    ap.add_argument("--connections", type=int, default=128, help="client connections per object size in the open-loop runs")
    ap.add_argument("--pool", type=int, default=2, help="dispatch threads of each proxy")
    ap.add_argument("--cached", dest="direct_io", action="store_false", help="read objects through the page cache (default: direct_io, from the disk)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--chart", default="docs/img/dispatch.png")
    args = ap.parse_args()
    if os.cpu_count() < 2:
        raise SystemExit("bench-dispatch: needs two CPUs (proxy on one, client on the other)")
    for tool in (args.bin, args.tools):
        if not os.access(tool, os.X_OK):
            raise SystemExit(f"bench-dispatch: {tool} is missing (cargo build --release)")
    if "fifo" not in args.modes.split(",") or not set(args.modes.split(",")) <= {"priority", "eventdev", "fifo", "reuseport"}:
        raise SystemExit("bench-dispatch: --modes is a list of priority, eventdev, fifo, reuseport, and has fifo (the reference)")
    emit = benchutil.emitter(args.out)

    machine = {"cpu": cpu_name(), "nproc": os.cpu_count()}
    procs = {}
    with tempfile.TemporaryDirectory(prefix="vectorlb-dispatch-", dir="/var/tmp") as d:
        os.makedirs(f"{d}/o")
        # (On the disk, not tmpfs: direct_io needs a filesystem that has O_DIRECT.)
        for name, size, _, _ in OBJECTS:
            with open(f"{d}/o/{name}.bin", "wb") as f:
                f.write(os.urandom(size))
        try:
            for mode in args.modes.split(","):
                port = free_port()
                # reuseport: two processes on one port, each reading on its connections'
                # thread (no pool), the kernel spreading the connections.
                dmode, reuse, copies = ("inline", "true", 2) if mode == "reuseport" else ("priority" if mode == "eventdev" else mode, "false", 1)
                backend = "eventdev" if mode == "eventdev" else "software"
                with open(f"{d}/{mode}.toml", "w") as f:
                    # (queue_limit: never reached, as the client has 4 x --connections
                    # requests in flight at most; 1024 x 2 classes is what event_sw holds.)
                    f.write(f"""workers = 1
[dispatch]
backend = "{backend}"
workers = {args.pool}
mode = "{dmode}"
queue_limit = 1024
max_wait = 30.0
classes = [{{ name = "high" }}, {{ name = "low", share = 5 }}]
[[listeners]]
name = "web"
address = "127.0.0.1:{port}"
reuseport = {reuse}
[[routes]]
path_prefix = "/o/"
static = {{ root = "{d}/o", direct_io = {"true" if args.direct_io else "false"} }}
priority = {{ query = "prio" }}
""")
                ps = [subprocess.Popen(["taskset", "-c", SERVER_CPU, args.bin, "proxy", "--config", f"{d}/{mode}.toml"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(copies)]
                procs[mode] = (ps, port)
                for p in ps:
                    wait_port(port, p, f"proxy ({mode})")
            loads = [float(x) for x in args.loads.split(",")]
            modes = list(procs)
            runs = {(ld, m): [] for ld in loads for m in modes}
            for rnd in range(args.rounds):
                order = modes if rnd % 2 == 0 else list(reversed(modes))
                # This round's capacity, closed loop: the median of the dispatch pools' (they
                # do the same work, so their figures differ by this shared host's noise; the
                # lowest of three would put the loads below what they say whenever one run
                # was unlucky. The SO_REUSEPORT workers, when there, have a capacity of their
                # own and take the same rates).
                cap = {}
                for mode in order:
                    r = load(args, procs[mode][1], 0, 64, args.capacity_seconds)
                    cap[mode] = r["achieved_rps"]
                    emit({"bench": "dispatch_capacity", "round": rnd, "mode": mode, "rps": r["achieved_rps"], "connections": 64 * len(OBJECTS), "seconds": args.capacity_seconds, **machine})
                capacity = statistics.median(v for m, v in cap.items() if m != "reuseport")
                for ld in loads:
                    rate = round(capacity * ld)
                    for mode in order:
                        r = load(args, procs[mode][1], rate, args.connections)
                        r["offered_rps"], r["capacity_rps"] = rate, capacity
                        runs[(ld, mode)].append(r)
            rows = []
            p99 = lambda r, name: (r["types"][name]["p99_us"] or 0) / 1000.0
            for ld in loads:
                for mode in modes:
                    rs = runs[(ld, mode)]
                    types = {}
                    for name, _, prio, _ in OBJECTS:
                        med = lambda key: statistics.median(r["types"][name][key] or 0 for r in rs) / 1000.0
                        types[name] = {"class": prio, "p50_ms": med("p50_us"), "p99_ms": med("p99_us"), "p999_ms": med("p999_us"),
                                       "p99_ms_rounds": [p99(r, name) for r in rs],
                                       "errors": sum(r["types"][name]["errors"] + r["types"][name]["non_2xx"] for r in rs)}
                    rows.append({"bench": "dispatch", "mode": mode, "load": ld, "offered_rps_rounds": [r["offered_rps"] for r in rs],
                                 "achieved_rps": statistics.median(r["achieved_rps"] for r in rs), "achieved_rps_rounds": [r["achieved_rps"] for r in rs],
                                 "rounds": len(rs), "seconds": args.seconds, "types": types, **machine})
                    emit(rows[-1])
                # The verdict, per load: the 1 KB (high class) p99 of FIFO over each priority
                # backend, per round (paired: the same round's runs), its median and spread.
                verdict = {"bench": "dispatch_ratio", "load": ld, "rounds": args.rounds, "seconds": args.seconds, **machine}
                for mode in ("priority", "eventdev", "reuseport"):
                    if (ld, mode) not in runs:
                        continue
                    pairs = list(zip(runs[(ld, "fifo")], runs[(ld, mode)]))
                    ratios = [round(p99(f, "1k") / p99(m, "1k"), 2) for f, m in pairs if p99(m, "1k")]
                    tput = [round(m["achieved_rps"] / f["achieved_rps"], 3) for f, m in pairs if f["achieved_rps"]]
                    key = "p99_1k_fifo_over_" + mode
                    verdict[key + "_median"] = round(statistics.median(ratios), 2) if ratios else None
                    verdict[key + "_spread"] = [min(ratios), max(ratios)] if ratios else None
                    verdict[key + "_rounds"] = ratios
                    verdict[f"throughput_{mode}_over_fifo_rounds"] = tput
                verdict["errors"] = sum(t["errors"] for r in rows if r["load"] == ld for t in r["types"].values())
                emit(verdict)
                print(f"load {int(ld * 100)} %: 1 KB p99 FIFO / priority {verdict.get('p99_1k_fifo_over_priority_median')}x "
                      f"(rounds {verdict.get('p99_1k_fifo_over_priority_spread')}), FIFO / eventdev {verdict.get('p99_1k_fifo_over_eventdev_median')}x "
                      f"(rounds {verdict.get('p99_1k_fifo_over_eventdev_spread')}), errors {verdict['errors']}", file=sys.stderr)
            if args.chart:
                chart(rows, args.chart)
        finally:
            benchutil.stop([p for ps, _ in procs.values() for p in ps])


if __name__ == "__main__":
    main()
