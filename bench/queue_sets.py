#!/usr/bin/env python3
"""Seed 002's experiment on this project's data plane: memcached's tail latency behind the load
balancer while bulk traffic crosses the same load balancer, with and without a queue set for
memcached (`make bench-queue-sets`; root).

Topology (`scripts/netns.sh two-arm`; the LB's ports on AF_PACKET with two queues each, which
the kernel fills by flow hash: DPDK 22.11's AF_XDP driver takes one queue on veth): the client
namespace runs
`vectorlb-tools memcache-load` (open loop, 4 clients x 2 connections, 8-byte keys, 64-byte
values, get:set 4:1, latency from the intended send time, HDR to P99.99) against
10.0.0.100:11211/tcp (full NAT to Debian's memcached in be1) and `vectorlb-tools gen` on an
AF_PACKET socket of the same interface sending UDP to 10.0.0.100:9 (full NAT to be2, which
drops it) at `--bg-pps` of `--bg-size`-byte frames. The LB has two workers. Without sets both
serve everything; with the set `memcached` (worker 1) the memcached service is worker 1's
alone, and worker 0 the rest. The two variants alternate on one running LB through a reload
(which is also what queue sets promise: a reload adds and removes a set).

For each request rate of the sweep, each variant: achieved rate, P99, P99.9, P99.99, and the
highest rate whose P99.99 stays within the SLA (`--sla-us`, 1000 µs) with every request
answered. JSON lines on stdout and in --out; a chart like the seed's Figure 4 (P99.99 by rate)
in --chart when matplotlib is there.

    bench/queue_sets.py [--rates 1000,2000,5000,10000,20000] [--seconds 4]
                                [--bg-pps 50000] [--bg-size 1400] [--sla-us 1000] [--out FILE] [--chart PNG]
"""
import argparse, json, os, subprocess, sys, tempfile, time

import benchutil

P = "vlqs"
BIN = "target/release/vectorlb"
TOOLS = "target/release/vectorlb-tools"


def sh(*cmd, check=True, **kw):
    return subprocess.run(list(cmd), check=check, **kw)


def ns(name, *cmd, **kw):
    return sh("ip", "netns", "exec", f"{P}-{name}", *cmd, **kw)


def lb_config(d, sets, busy_poll=True, pin=False):
    """The LB's file: scripts/lib.sh's ports, on AF_PACKET with two queues (one per worker);
    memcached (to be1) and the bulk UDP sink (to be2); the set when `sets`; with `pin`,
    worker 0 on CPU 0 and worker 1 (the set's) on CPU 1."""
    extra = ["workers = 2"] + (["cpus = [0, 1]"] if pin else [])
    base = subprocess.run(["bash", "-c", '. scripts/lib.sh && lb_base_config "$@"', "_", d, *extra],
                          capture_output=True, text=True, check=True).stdout
    text = base.replace("net_af_xdp0,iface=ext0", "net_af_packet0,iface=ext0,qpairs=2").replace("net_af_xdp1,iface=int0", "net_af_packet1,iface=int0,qpairs=2")
    for port, proto, laddr, backend in ((11211, "tcp", "10.1.0.200", "10.1.0.11"), (9, "udp", "10.1.0.201", "10.1.0.12")):
        text += f"""
[[services]]
vip = "10.0.0.100"
port = {port}
proto = "{proto}"
mode = "fnat"
local_addrs = ["{laddr}"]
backends = [{{ addr = "{backend}", port = {port} }}]
"""
    if sets:
        text += """
[[queue_sets]]
name = "memcached"
services = ["10.0.0.100:11211/tcp"]
workers = [1]
""" + ("" if busy_poll else "busy_poll = false\n")
    with open(f"{d}/lb.toml", "w") as f:
        f.write(text)


def scrape(api):
    """The queue sets' time histograms from /metrics: {(metric, set): {le: cumulative count}}."""
    text = subprocess.run([BIN, "ctl", "--api", api, "--raw", "GET", "/metrics"], capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        for m in ("vectorlb_queue_set_wait_seconds_bucket", "vectorlb_queue_set_residence_seconds_bucket"):
            if line.startswith(m + "{"):
                labels, value = line[len(m) + 1:].rsplit("} ", 1)
                kv = dict(x.split("=", 1) for x in labels.split(","))
                out.setdefault((m.split("_seconds")[0].rsplit("_", 1)[1], kv["set"].strip('"')), {})[kv["le"].strip('"')] = int(value)
    return out


def quantiles(before, after, key):
    """p50 / p99 / p99.99 of one run (bucket upper bounds, µs) from two scrapes."""
    a, b = after.get(key, {}), before.get(key, {})
    les = sorted((le for le in a if le != "+Inf"), key=float)
    total = a.get("+Inf", 0) - b.get("+Inf", 0)
    res = {"packets": total}
    for name, q in (("p50", 0.5), ("p99", 0.99), ("p9999", 0.9999)):
        want = total * q
        res[f"{name}_us"] = next((round(float(le) * 1e6) for le in les if a[le] - b.get(le, 0) >= want), None) if total else None
    return res


def chart(rows, sla, path):
    plt = benchutil.pyplot("bench-queue-sets")
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for variant, color in (("queue_set", "#1f77b4"), ("no_set", "#d62728")):
        rs = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["rate"])
        ax.plot([r["achieved_rps"] / 1000 for r in rs], [(r["total"]["p9999_us"] or 0) for r in rs], "o-", color=color, label=variant.replace("_", " "))
    ax.axhline(sla, color="#555", ls="--", lw=1, label=f"SLA {sla} µs")
    ax.set_xlabel("memcached requests/s (thousands)")
    ax.set_ylabel("P99.99 latency (µs)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("memcached behind the LB, with bulk UDP through it: P99.99 by rate", fontsize=9)
    benchutil.save_chart(fig, path)


def parse(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1000,2000,5000,10000,20000")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--bg-pps", type=int, default=50_000)
    ap.add_argument("--bg-size", type=int, default=1400)
    ap.add_argument("--sla-us", type=int, default=1000)
    ap.add_argument("--nap", action="store_true", help="the set's worker naps when idle (busy_poll = false) instead of polling without rest")
    ap.add_argument("--pin", action="store_true", help="the LB's worker 1 (the set's) alone on CPU 1; worker 0, memcached, the load client and the generator on CPU 0")
    ap.add_argument("--out", default=None)
    ap.add_argument("--chart", default="docs/img/queue-sets.png")
    return ap.parse_args(argv)


def run(args, emit):
    """The sweep: for each rate, each variant (alternating order), one row to emit. Returns the rows."""
    if os.geteuid() != 0:
        raise SystemExit("bench-queue-sets: run as root (network namespaces)")
    for b in (BIN, TOOLS):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"bench-queue-sets: {b} is missing (cargo build --release)")
    if not os.path.exists("/usr/bin/memcached"):
        raise SystemExit("bench-queue-sets: memcached is missing (scripts/setup.sh)")

    machine = {"cpu": benchutil.cpu_name(), "nproc": os.cpu_count()}
    env = dict(os.environ, VLB_QUEUES="2")
    sh("bash", "scripts/netns.sh", "up", P, "two-arm", env=env, stdout=subprocess.DEVNULL)
    procs = []
    d = tempfile.mkdtemp(prefix="vectorlb-qs-")
    try:
        on0 = ["taskset", "-c", "0"] if args.pin else []
        procs.append(subprocess.Popen(["ip", "netns", "exec", f"{P}-be1", *on0, "memcached", "-l", "10.1.0.11", "-p", "11211", "-U", "0", "-t", "1", "-m", "256", "-c", "4096", "-u", "nobody"]))
        lb_config(d, sets=False, pin=args.pin)
        lb = subprocess.Popen(["ip", "netns", "exec", f"{P}-lb", BIN, "run", "--config", f"{d}/lb.toml"], stdout=open(f"{d}/lb.log", "w"), stderr=subprocess.STDOUT)
        procs.append(lb)
        api = f"unix:{d}/api.sock"
        for _ in range(100):
            if sh(BIN, "ctl", "--api", api, "--raw", "GET", "/v1/health", check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                break
            if lb.poll() is not None:
                raise SystemExit("bench-queue-sets: vectorlb run exited:\n" + open(f"{d}/lb.log").read())
            time.sleep(0.1)
        ext_mac = subprocess.run(["ip", "netns", "exec", f"{P}-lb", "cat", "/sys/class/net/ext0/address"], capture_output=True, text=True, check=True).stdout.strip()
        rows = []
        for rate in [int(x) for x in args.rates.split(",")]:
            for variant in (("queue_set", "no_set") if rate % 2 == 0 else ("no_set", "queue_set")):
                lb_config(d, sets=variant == "queue_set", busy_poll=not args.nap, pin=args.pin)
                sh(BIN, "ctl", "--api", api, "--reload", stdout=subprocess.DEVNULL)
                bg = subprocess.Popen(["ip", "netns", "exec", f"{P}-cl", *on0, TOOLS, "gen", "--tx", "net_af_packet0,iface=cl0", "--dst-mac", ext_mac,
                                       "--src-ip", "10.0.0.2", "--dst-ip", "10.0.0.100", "--dst-port", "9", "--proto", "udp", "--flows", "256",
                                       "--size", str(args.bg_size), "--rate", str(args.bg_pps), "--seconds", str(args.seconds + 2.5), "--json"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                time.sleep(0.5)
                before = scrape(api)
                r = subprocess.run(["ip", "netns", "exec", f"{P}-cl", *on0, TOOLS, "memcache-load", "--target", "10.0.0.100:11211", "--rate", str(rate),
                                    "--seconds", str(args.seconds + 1), "--warmup", "1", "--connections", "8", "--json"], capture_output=True, text=True)
                bg_out, bg_err = bg.communicate(timeout=60)
                if r.returncode != 0:
                    raise SystemExit(f"bench-queue-sets: memcache-load: {r.stderr.strip()}")
                m = json.loads(r.stdout.strip().splitlines()[-1])
                try:
                    g = json.loads(bg_out.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    raise SystemExit(f"bench-queue-sets: gen: {bg_err.strip()}")
                stats = json.loads(subprocess.run([BIN, "ctl", "--api", api, "--raw", "GET", "/v1/stats"], capture_output=True, text=True).stdout or "{}")
                after = scrape(api)
                # The LB's own share of the latency, this run: per packet the set's workers
                # received, the wait on its queue (since the worker's previous round) and the
                # time to its transmit (queue sets only: without them nothing is timed).
                lb_time = {f"{kind}_{name}": quantiles(before, after, (kind, name)) for (kind, name) in sorted(after)} if variant == "queue_set" else {}
                row = {"bench": "queue_sets", "variant": variant, "busy_poll": not args.nap, "pinned": args.pin, "rate": rate, "achieved_rps": m["achieved_rps"], "total": m["total"],
                       "errors": m["errors"], "lost": m["lost"], "bg_pps": round(g.get("tx_mpps", 0) * 1e6), "bg_size": args.bg_size,
                       "lb_drops": sum((stats.get("drops") or {}).values()) if isinstance(stats.get("drops"), dict) else None,
                       # Cumulative since the LB started (both variants alternate on it).
                       "lb_queue_sets": [{"name": q["name"], "workers": q["workers"], **q["packets"]} for q in stats.get("queue_sets") or []],
                       "lb_time": lb_time, **machine}
                rows.append(row)
                emit(row)
        return rows
    finally:
        benchutil.stop(procs)
        sh("bash", "scripts/netns.sh", "down", P, check=False)


def main():
    args = parse()
    emit = benchutil.emitter(args.out)
    rows = run(args, emit)
    machine = {"cpu": benchutil.cpu_name(), "nproc": os.cpu_count()}
    # The seed's SLA, and ten times it (this machine's own floor is above the seed's SLA:
    # see docs/queue-sets.md).
    for sla in (args.sla_us, 10 * args.sla_us):
        verdict = {"bench": "queue_sets_sla", "sla_us": sla, "bg_pps": args.bg_pps, "bg_size": args.bg_size, **machine}
        for variant in ("queue_set", "no_set"):
            ok = [r["rate"] for r in rows if r["variant"] == variant and r["total"]["p9999_us"] is not None
                  and r["total"]["p9999_us"] <= sla and r["errors"] == 0 and r["lost"] == 0 and r["achieved_rps"] >= 0.98 * r["rate"]]
            verdict[f"max_rate_in_sla_{variant}"] = max(ok) if ok else 0
        a, b = verdict["max_rate_in_sla_queue_set"], verdict["max_rate_in_sla_no_set"]
        verdict["ratio"] = round(a / b, 2) if b else None
        emit(verdict)
    if args.chart:
        chart(rows, args.sla_us, args.chart)


if __name__ == "__main__":
    main()
