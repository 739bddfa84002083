#!/usr/bin/env python3
"""Writes docs/benchmarks.md and docs/img/*.png from bench/results/ (made by `make bench`).
Every section is optional: a result file that is missing leaves its section out. The charts
need matplotlib (scripts/setup.sh --bench installs it); without it the tables still come."""
import datetime, json, os, platform, subprocess, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
res = lambda name: os.path.join(root, "bench/results", name)
img_dir = os.path.join(root, "docs", "img")


def lines(name):
    p = res(name)
    if not os.path.exists(p):
        return []
    return [json.loads(l) for l in open(p) if l.strip().startswith("{")]


def machine_line():
    """This machine, as one line (the CPU, cores, memory, kernel, compiler, DPDK)."""
    cpu = sh("lscpu | sed -n 's/^Model name: *//p'")
    mem = sh("free -g | awk '/Mem:/ {print $2}'")
    return (f"{cpu}, {sh('nproc')} cores (a shared VM), {mem} GiB, Linux {platform.release()}, "
            f"{sh('rustc --version')}, DPDK {sh('pkg-config --modversion libdpdk')}")


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception:
        return "?"


# --out FILE: write the page there instead; --no-charts: leave docs/img alone (the tests).
OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.path.join(root, "docs/benchmarks.md")
try:
    if "--no-charts" in sys.argv:
        raise ImportError
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(img_dir, exist_ok=True)
except ImportError:
    plt = None

charts = []
notes_used = []


def dated(prefix):
    """'Measured DAY at commit `C` on MACHINE.' for a step run on its own (bench/all.sh's
    PREFIX-measured-at.txt and PREFIX-machine.txt); '' without them."""
    at, mach = res(prefix + "-measured-at.txt"), res(prefix + "-machine.txt")
    if not os.path.exists(at):
        return ""
    c, d = (open(at).read().split() + ["?", "?"])[:2]
    on = f" on {open(mach).read().strip()}" if os.path.exists(mach) else ""
    return f"Measured {d} at commit `{c}`{on}.\n"


def note(name):
    """The hand-written part `bench/notes/NAME.md` (figures from runs of their own, analysis), as
    lines; [] when there is none. Every file there must be used somewhere (checked at the end),
    so regenerating the page cannot drop one."""
    p = os.path.join(root, "bench", "notes", name + ".md")
    if not os.path.exists(p):
        return []
    notes_used.append(name)
    return [open(p).read().rstrip("\n"), ""]


def chart(name, draw, title):
    """Draws into docs/img/NAME.png and returns the markdown for it ('' without matplotlib)."""
    if plt is None:
        # No drawing here: the chart already drawn, if there is one.
        return f"![{title}](img/{name}.png)\n" if os.path.exists(os.path.join(img_dir, name + ".png")) else ""
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    draw(ax)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(img_dir, name + ".png"))
    plt.close(fig)
    charts.append(name)
    return f"![{title}](img/{name}.png)\n"


core = lines("core.jsonl")
pipe = [r for r in core if r["bench"] == "pipeline"]
cps = [r for r in core if r["bench"] == "cps"]
# SYN floods: from the last full run, or from a later run of their own (synflood.jsonl).
synflood = lines("synflood.jsonl") or [r for r in core if r["bench"] == "synflood"]
big = [r for r in pipe if r["sessions"] >= 10_000_000]
mid = [r for r in pipe if r["sessions"] < 10_000_000]
scaling = lines("scaling.jsonl")
profile = lines("profile.json")
profile_io = lines("profile-io.jsonl")
rfc = lines("rfc2544.jsonl")
peers = lines("cps-peers.jsonl")
idle = lines("idle.jsonl")
memif = lines("memif.jsonl")
memif_focus = lines("memif-focus.jsonl")
tls = lines("tls.jsonl")


def tls_section():
    """The proxy's TLS benchmark (bench/results/tls.jsonl, `make bench-tls`): markdown lines."""
    o = []
    hs = [r for r in tls if r["bench"] == "tls_handshakes"]
    if not hs:
        return o
    m = hs[0]
    at = res("tls-measured-at.txt")
    tcommit, tday = (open(at).read().split() + ["?", "?"])[:2] if os.path.exists(at) else ("?", "?")
    o.append("## TLS: full handshakes per second, the proxy's providers against nginx and HAProxy\n")
    o.append(f"Measured {tday} at commit `{tcommit}` on {m['cpu']} ({m['nproc']} CPUs, AVX-512 IFMA: "
             f"{'yes' if m['avx512ifma'] else 'no'}): `make bench-tls` (`bench/tls.py`; raw lines in "
             "`bench/results/tls.jsonl`). Every server has one worker pinned to CPU 0 (`vectorlb proxy` with "
             "`workers = 1`, its crypto thread too; nginx `worker_processes 1` with OpenSSL 3; HAProxy "
             "`nbthread 1` with OpenSSL 3), the same RSA-2048 key and certificate, no session resumption, one "
             "small HTTP/1.1 GET per connection answered by the server itself (`Connection: close`); h2load "
             f"(nghttp2 1.52, OpenSSL 3) on CPU 1 with {m['concurrency']} connections at a time, "
             f"{m['connections_per_round']} per round, rounds rotating the order of the servers; medians. "
             "One h2load core is the limit before the fastest servers are (their `server_cpu_busy` stays "
             "below 1), so the comparison that counts is **handshakes per core-second**: handshakes divided by "
             "the server's CPU time (user + system, all its threads) over the same run.\n")
    for version in sorted({r["tls"] for r in hs}, reverse=True):
        rs = [r for r in hs if r["tls"] == version]
        o.append(f"### TLS {version}\n")
        o.append("| server | provider | handshakes/s | per core-second | vs nginx (per core) | vs HAProxy (per core) | server CPU busy | handshake p50 / p99 (ms, server side) | mean batch |")
        o.append("|---|---|---|---|---|---|---|---|---|")
        for r in rs:
            lat = r.get("handshake_ms") or {}
            lt = f"{lat.get('p50')} / {lat.get('p99')}" if lat else "-"
            o.append(f"| {r['server']} | {r.get('provider') or 'OpenSSL 3'} | {r['handshakes_per_s']:,.0f} | {r['handshakes_per_core_s']:,.0f} | "
                     f"{r['per_core_vs_nginx']:.2f} | {r['per_core_vs_haproxy']:.2f} | {r['server_cpu_busy']:.2f} | {lt} | {r.get('mean_batch', '-')} |")
        o.append("")
        qs = [r for r in rs if r.get("rsa_queue_sizes")]
        if qs:
            o.append("Operations per multi-buffer run (`rsa_queue_sizes`, counts of runs of 1 to 8):\n")
            o.append("| server | " + " | ".join(str(i) for i in range(1, 9)) + " |")
            o.append("|---|" + "---|" * 8)
            for r in qs:
                o.append(f"| {r['server']} | " + " | ".join(str(r["rsa_queue_sizes"].get(str(i), 0)) for i in range(1, 9)) + " |")
            o.append("")

        def draw(ax, rs=rs):
            names = [r["server"].replace("vectorlb-", "") for r in rs]
            x = range(len(rs))
            ax.bar([i - 0.2 for i in x], [r["handshakes_per_s"] for r in rs], 0.4, label="handshakes/s")
            ax.bar([i + 0.2 for i in x], [r["handshakes_per_core_s"] for r in rs], 0.4, label="per core-second")
            ax.set_xticks(list(x))
            ax.set_xticklabels(names, rotation=20, fontsize=8)
            ax.set_ylabel("full handshakes")
            ax.legend(fontsize=8)
        o.append(chart(f"tls-handshakes-{version.replace('.', '')}", draw, f"Full TLS {version} handshakes, RSA-2048, one server core"))
    ka = [r for r in tls if r["bench"] == "keepalive_requests"]
    if ka:
        o.append("### Keep-alive requests per second (TLS 1.3, the same servers)\n")
        o.append("h2load on CPU 1: HTTP/1.1 with 32 connections, and HTTP/2 with 32 connections of 10 streams; "
                 "the TLS handshakes happen once, so this measures the HTTP path.\n")
        o.append("| server | protocol | requests/s | vs nginx | vs HAProxy |")
        o.append("|---|---|---|---|---|")
        for r in ka:
            o.append(f"| {r['server']} | {r['protocol']} | {r['requests_per_s']:,.0f} | {r['vs_nginx']:.2f} | {r['vs_haproxy']:.2f} |")
        o.append("")
    o.extend(note("tls-deadlines"))
    o.extend(note("tls-round2"))
    gr = [r for r in tls if r["bench"] == "grpc_unary" and "requests_per_s" in r]
    if gr:
        o.append("### gRPC unary calls per second: vectorlb proxy against nginx `grpc_pass`\n")
        o.append("`grpc.health.v1.Health/Check` on grpc-go's server (`bench/peers/grpc-health-server`), h2c on both sides, "
                 f"one server core (CPU 0); h2load on CPU 1 with {gr[0]['streams']} streams (8 connections x 16), sharing it with "
                 "the backend; each path first checked with a real gRPC call (grpcio). Every round measures both.\n")
        o.append("| server | calls/s (median) | rounds | vs nginx |")
        o.append("|---|---|---|---|")
        for r in gr:
            o.append(f"| {r['server']} | {r['requests_per_s']:,.0f} | {', '.join(f'{x:,.0f}' for x in r['rounds'])} | {r['vs_nginx']:.2f} |")
        o.append("")
    ref = [r for r in tls if r["bench"] == "tls_provider_refusal"]
    if ref:
        o.append(f"Without crypto_mb ({ref[0].get('condition', '')}), `cryptomb_fallback = \"refuse\"` stops the start: "
                 f"`{ref[0].get('message', '')}`\n")
    so = [r for r in tls if r["bench"] == "rsa2048_private_ops"]
    if so:
        o.append("RSA-2048 private-key operations per second on one core (`sign_speed` example): " +
                 ", ".join(f"{r['backend']} {r['ops_per_s']:,}" for r in so if "ops_per_s" in r) + ".\n")
    kp = [r for r in tls if r["bench"] == "x25519_keypairs" and "per_s" in r]
    if kp:
        o.append("X25519 key pairs per second on one core, as the key exchange gets them (`sign_speed`): " +
                 ", ".join(f"{r['backend']} {r['per_s']:,} ({r['us_each']} µs each)" for r in kp) +
                 "; the `cryptomb` provider makes them eight at a time with crypto_mb (docs/proxy.md).\n")
    return o


if "--machine" in sys.argv:
    print(machine_line())
    sys.exit(0)
if "--section" in sys.argv and sys.argv[sys.argv.index("--section") + 1] == "tls":
    print("\n".join(tls_section()))
    sys.exit(0)

out = []
w = out.append
w("# Benchmarks\n")
w("<!-- Written by bench/report.py from bench/results/ and bench/notes/: edit those, not this page. -->\n")
measured_at = res("measured-at.txt")
commit, day = (open(measured_at).read().split() + ["?", "?"])[:2] if os.path.exists(measured_at) else \
    (sh(f"git -C {root} rev-parse --short HEAD"), datetime.date.today().isoformat())
# The machine as the run recorded it (bench/all.sh writes machine.txt); this one's otherwise.
machine_txt = res("machine.txt")
machine = open(machine_txt).read().strip() if os.path.exists(machine_txt) else machine_line()
w(f"Measured {day} at commit `{commit}` on: {machine}. "
  "The machine is shared with other tenants and has two cores for everything (generator, "
  "device under test, clients, servers, the kernel's veth work), so figures vary from run to "
  "run: in-memory figures are medians of rounds with every round listed, and each table says "
  "what shared the cores.\n")
w("Regenerate everything: `make bench` (`bench/all.sh`, each step with its elapsed time; then "
  "`bench/report.py`). Reduced suite, one JSON line: `make bench-quick` (50 s "
  "after the build). Raw results: `bench/results/`. The hand-written analysis (where the time goes, "
  "how vectorlb compares with the peers and the seeds' published figures) follows the "
  "tables.\n")

# ---- At a glance ---------------------------------------------------------------------------
glance = []
b4 = next((r for r in big if r["family"] == 4), None)
if b4:
    glance.append(("pipeline, full NAT, 64 B, 10 M sessions, one core (in memory)", f"{b4['mpps']} Mpps, {b4['bytes_per_session']} B/session"))
c4 = next((r for r in cps if r["mode"] == "fnat" and r["family"] == 4), None)
if c4:
    glance.append(("TCP lifecycles, full NAT, one core (in memory)", f"{int(c4['connections_per_second']):,} connections/s"))
if len(scaling) > 1:
    glance.append((f"core scaling, 1 to {scaling[-1]['threads']} threads (in memory)", f"{scaling[-1]['mpps'] / scaling[0]['mpps']:.2f}x"))
if profile:
    glance.append(("instructions per packet / per connection (callgrind)", f"{profile[0]['instructions_per_unit']:,} / {profile[-1]['instructions_per_unit']:,}"))
lb64 = next((r for r in rfc if r["dut"] == "vectorlb" and r["frame_bytes"] == 64), None)
tp64 = next((r for r in rfc if r["dut"] == "testpmd" and r["frame_bytes"] == 64), None)
if lb64 and tp64:
    glance.append(("RFC 2544 MAX, 64 B, AF_XDP veth, one worker: vectorlb / testpmd", f"{lb64['max_mpps']:.3f} / {tp64['max_mpps']:.3f} Mpps ({lb64['max_mpps'] / tp64['max_mpps']:.2f})"))
if peers:
    glance.append(("real-TCP connections/s: " + " / ".join(r["peer"] for r in peers), " / ".join(f"{int(r['result'].get('requests_per_second', 0)):,}" for r in peers)))
mvs = [r for r in (memif_focus or memif) if r["bench"] == "memif_vs_testpmd" and r["client"] == "zero-copy" and r["queues"] == 1 and r["mtu"] == 1500]
if mvs:
    glance.append(("memif, one core per side, median Mpps: vectorlb (cpu) / DPDK net_memif (testpmd)",
                   ", ".join(f"{r['frame_bytes']} B {r['vectorlb_cpu_mpps']:.2f} / {r['testpmd_mpps']:.2f} ({r['cpu_vs_testpmd']:.2f})" for r in mvs if r["frame_bytes"] in (64, 1500))))
def tls_glance():
    """Per version: cryptomb / inline / nginx / HAProxy handshakes per core-second, and the ratio."""
    parts = []
    for version in ("1.3", "1.2"):
        by = {r["server"]: r for r in tls if r["bench"] == "tls_handshakes" and r["tls"] == version}
        if "vectorlb-cryptomb" in by and "nginx" in by:
            parts.append(" / ".join(f"{by[n]['handshakes_per_core_s']:,.0f}" for n in ("vectorlb-cryptomb", "vectorlb-inline", "nginx", "haproxy") if n in by)
                         + f" ({by['vectorlb-cryptomb']['per_core_vs_nginx']:.2f}x nginx)")
    return parts


if tls_glance():
    tday = (open(res("tls-measured-at.txt")).read().split() + ["?", "?"])[1] if os.path.exists(res("tls-measured-at.txt")) else "?"
    glance.append((f"TLS full handshakes (RSA-2048) per core-second, TLS 1.3 / 1.2 ({tday}): cryptomb / inline (default backend) / nginx / HAProxy", "; ".join(tls_glance())))
if glance:
    w("## At a glance\n")
    w("| measure | measured |")
    w("|---|---|")
    for k, v in glance:
        w(f"| {k} | {v} |")
    # Rows from later runs of their own, dated (bench/notes/glance.md).
    for line in note("glance"):
        w(line)
    w("")

# ---- RFC 2544 through the daemon and the I/O ceiling --------------------------------------
if rfc:
    by = {}
    for r in rfc:
        by.setdefault(r["dut"], {})[r["frame_bytes"]] = r
    sizes = sorted({r["frame_bytes"] for r in rfc})
    lb, tp = by.get("vectorlb", {}), by.get("testpmd", {})
    w("## RFC 2544: vectorlb against dpdk-testpmd on the same AF_XDP ports\n")
    w("`bench/rfc2544.sh DUT` (`vectorlb-tools rfc2544`): the generator (`vectorlb-tools "
      "gen`, DPDK on two AF_XDP veth ports in its own namespace, one core) sends UDP over 1,024 "
      "flows into the device under test's two AF_XDP ports and receives what comes out. "
      "**vectorlb**: full NAT to one backend (the generator's second port), one busy-polling "
      "worker pinned to CPU 1, `queue_desc = 2048`. **testpmd**: `dpdk-testpmd "
      "--forward-mode=io --nb-cores=1 --rxd=2048 --txd=2048` on the same two ports (the I/O "
      "ceiling: it forwards without looking at the packets). Per frame size: MAX is the highest "
      f"received rate of any trial; NDR the highest offered rate with no loss and PDR with at "
      f"most 0.001 % loss, each by binary search ({rfc[0]['trial_seconds']:g} s trials, resolution "
      f"{rfc[0]['resolution'] * 100:g} % of the offered rate) and confirmed by another trial at the result. "
      + (f"A rate that fails a trial is tried up to {rfc[0].get('retries', 0)} more time(s) and passes if one "
         "of them passes (this host's scheduling stalls lose packets at any rate now and then; a rate above "
         "capacity fails every time); RFC 2544's single trial is `--retries 0`. " if rfc[0].get("retries") else "")
      + "The generator does not catch up in bursts: packets more than 200 µs late are skipped. "
      "Latency is the generator's, send to receive, at NDR (HDR histogram, every packet).\n")
    w("| frame B | vectorlb MAX Mpps | testpmd MAX Mpps | MAX ratio | vectorlb NDR Mpps | testpmd NDR Mpps | NDR ratio | vectorlb PDR | testpmd PDR | vectorlb NDR Gbps | p50 / p99 / p99.9 µs at NDR (vectorlb) | (testpmd) |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
    for s in sizes:
        a, b = lb.get(s, {}), tp.get(s, {})
        lat = lambda r: "/".join(str(round(r.get("ndr_latency_us", {}).get(k, 0), 1)) for k in ("p50", "p99", "p99_9")) if r else "-"
        w(f"| {s} | **{a.get('max_mpps', 0):.3f}** | {b.get('max_mpps', 0):.3f} | {ratio(a.get('max_mpps', 0), b.get('max_mpps', 0))} | "
          f"**{a.get('ndr_mpps', 0):.3f}** | {b.get('ndr_mpps', 0):.3f} | {ratio(a.get('ndr_mpps', 0), b.get('ndr_mpps', 0))} | "
          f"{a.get('pdr_mpps', 0):.3f} | {b.get('pdr_mpps', 0):.3f} | {a.get('ndr_gbps', 0):.2f} | {lat(a)} | {lat(b)} |")
    w("")

    def draw(ax):
        for dut, r, st in (("vectorlb", lb, "-"), ("testpmd", tp, "--")):
            if r:
                ax.plot(sizes, [r[s]["max_mpps"] for s in sizes], st, marker="o", label=f"{dut} MAX")
                ax.plot(sizes, [r[s]["ndr_mpps"] for s in sizes], st, marker="s", label=f"{dut} NDR")
        ax.set_xticks([64, 256, 512, 1024, 1280, 1518])
        ax.set_xlabel("frame size (bytes)")
        ax.set_ylabel("Mpps")
        ax.legend(fontsize=8)
    w(chart("rfc2544-throughput", draw, "RFC 2544 throughput by frame size (1 worker, AF_XDP veth, 2 shared cores)"))
    w("Trials of every search are in `bench/results/rfc2544.jsonl`.\n")

# ---- Connections per second with real TCP ------------------------------------------------
if peers:
    w("## Connections per second with real TCP, against the peers (same topology, same run)\n")
    w("`bench/cps-peers.sh 5 16`: the client opens a new TCP connection per HTTP/1.0 "
      "GET of a one-line page (seed 003 Figure 14's pattern), 16 at a time for 5 s, through the "
      "VIP to three nginx backends. Each peer in turn gets the same topology, built afresh (so "
      "that no peer inherits the TIME_WAIT sockets and conntrack entries of the one before): "
      "vectorlb (full NAT, AF_XDP, one worker), the kernel's nftables DNAT + SNAT with `numgen inc "
      "mod 3` (as kube-proxy's nftables mode), HAProxy in TCP mode, nginx `stream`. Client, "
      "balancer and servers share the two cores. Latency is per request, connect to close. "
      "`busy cores` is the whole machine's CPU use over the measurement (softirq included); "
      "`balancer cores` is the balancer's processes' own (for vectorlb this includes the kernel "
      "work its AF_XDP transmit calls do on the receivers' behalf; the kernel peer has no "
      "process).\n")
    w("| peer | connections/s | errors | p50 ms | p90 ms | p99 ms | p99.9 ms | busy cores | balancer cores |")
    w("|---|---|---|---|---|---|---|---|---|")
    for r in peers:
        x = r["result"]
        l = x.get("latency_ms", {})
        c = r.get("cpu", {})
        own = c.get("balancer_cores")
        w(f"| {r['peer']} | **{int(x.get('requests_per_second', 0)):,}** | {x.get('errors')} | {l.get('p50')} | {l.get('p90')} | {l.get('p99')} | {l.get('p99_9')} | {c.get('machine_busy_cores', '-')} of {c.get('cores', '-')} | {'-' if own is None else own} |")
    w("")
    names = [r["peer"] for r in peers]

    def draw_cps(ax):
        ax.bar(names, [r["result"].get("requests_per_second", 0) for r in peers], color=["C0", "C1", "C2", "C3"][: len(peers)])
        ax.set_ylabel("connections / s")
    w(chart("cps-peers", draw_cps, "Real-TCP connections per second by peer (HTTP/1.0, 16 in flight)"))

    def draw_lat(ax):
        ks = ["p50", "p90", "p99", "p99_9"]
        width = 0.8 / max(1, len(peers))
        for i, r in enumerate(peers):
            l = r["result"].get("latency_ms", {})
            ax.bar([k + i * width for k in range(len(ks))], [l.get(k, 0) for k in ks], width, label=r["peer"])
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(ks))])
        ax.set_xticklabels(["p50", "p90", "p99", "p99.9"])
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.legend(fontsize=8)
    w(chart("latency-peers", draw_lat, "Request latency percentiles by peer (connect to close)"))

# ---- In-memory pipeline ------------------------------------------------------------------
w("## The pipeline alone (in memory, one core)\n")
w("`vectorlb bench pipeline` fills a session table with N flows (the first packet of each "
  "creates its session), then replays a pool of 1 M frames drawn uniformly at random from "
  "those flows through `Worker::process` in batches of 256: no NIC, no I/O, the cache's worst "
  "case. Frames are 64 bytes on the wire for IPv4 and 80 for IPv6 (seed 003's UDP64 / UDP80). "
  "`Mpps` counts pipeline time only; `with copy` also counts copying each frame into its "
  "buffer (the NIC's DMA in a real system). Every packet must be forwarded. `bytes/session` "
  "is the growth of resident memory while the table fills, divided by N.\n")


def table(rs, title):
    if not rs:
        return
    w(f"### {title}\n")
    w("| mode | family | proto | sessions | Mpps (median) | ns/packet | Mpps with copy | bytes/session | rounds (Mpps) |")
    w("|---|---|---|---|---|---|---|---|---|")
    for r in rs:
        w(f"| {r['mode']} | IPv{r['family']} | {r['proto']} | {r['sessions']:,} | **{r['mpps']}** | "
          f"{r['ns_per_packet']} | {r['mpps_with_copy']} | {r['bytes_per_session']} | "
          f"{', '.join(str(x) for x in r['mpps_rounds'])} |")
    w("")


table(big, "At 10 M sessions (full NAT, UDP)")
w("Command: `vectorlb bench pipeline --mode fnat --family {4,6} --proto udp --sessions 10000000 --memory-points 20 --json`\n")
for line in note("pipeline-10m"):
    w(line)
table(mid, "Every mode, family and protocol (1 M sessions)")
w("Command: `vectorlb bench pipeline --mode M --family F --proto P --sessions 1000000 --seconds 3 --json`\n")
if cps:
    w("### Connections per second (complete TCP lifecycles, in memory)\n")
    w("`vectorlb bench cps`: SYN, SYN-ACK, ACK, request, 1-byte response, FIN/ACK both ways, "
      "last ACK (9 packets), 256 connections in flight, server packets addressed from what the "
      "LB actually sent; sessions created at the SYN and deleted at the last ACK (TIME-WAIT 0, "
      "as in seed 003's test). `wall` includes building the frames.\n")
    w("| mode | family | connections/s (median) | wall connections/s | ns/packet | rounds | errors |")
    w("|---|---|---|---|---|---|---|")
    for r in cps:
        w(f"| {r['mode']} | IPv{r['family']} | **{int(r['connections_per_second']):,}** | "
          f"{int(r['wall_connections_per_second']):,} | {r['ns_per_packet']} | "
          f"{', '.join(f'{int(x):,}' for x in r['cps_rounds'])} | {r['errors']} |")
    w("\nCommand: `vectorlb bench cps --mode M --family F --json`\n")

if synflood:
    w("### SYN floods\n")
    sat = res("synflood-measured-at.txt")
    if os.path.exists(sat) and lines("synflood.jsonl"):
        w(dated("synflood").rstrip("\n") + " Raw lines: `bench/results/synflood.jsonl`.\n")
    w("`vectorlb bench synflood`: spoofed SYNs (random sources in 198.18.0.0/15 or 2001:db8:f::/48, "
      "random ports and sequence numbers, a Linux SYN's options) at a full-NAT TCP service, 256 "
      "per batch. With the SYN proxy on, every SYN is answered with a SYN cookie and nothing is "
      "stored; off, every SYN opens a session (scheduling, local port) within the half-open budget "
      "(a quarter of the 1 M-session table or of the 64,512 local ports, whichever is smaller), "
      "the oldest waiting one evicted. Every verdict is checked (`errors`).\n")
    w("| family | SYN proxy | SYNs/s (median) | ns/SYN | rounds | sessions left | evicted | errors |")
    w("|---|---|---|---|---|---|---|---|")
    for r in synflood:
        w(f"| IPv{r['family']} | {r['synproxy']} | **{int(r['syns_per_second']):,}** | {r['ns_per_syn']} | "
          f"{', '.join(f'{int(x):,}' for x in r['rounds'])} | {r['sessions_left']:,} | {r['half_open_evicted']:,} | {r['errors']} |")
    w("\nCommand: `vectorlb bench synflood --mode fnat --family F --synproxy on|off --seconds 3 --json`. "
      "Through the daemon (real kernels, AF_XDP ports, one worker sharing two cores with the generator, "
      "nginx and the clients), `crates/testkit/tests/hardening.rs` sends 1,000,000 spoofed SYNs while "
      "wrk keep-alive connections and 2,000 new connections run; see the test for its figures.\n")
    for line in note("synflood"):
        w(line)

for line in note("sync"):
    w(line)

for line in note("table-full"):
    w(line)

if scaling:
    w("### Core scaling\n")
    w("`vectorlb bench pipeline --mode fnat --sessions 4000000 --threads T`: T worker threads, "
      "each with its own session table of 4 M / T flows (share-nothing, as the daemon's "
      "workers), rounds started together; the total is the sum of the threads' medians. The "
      "machine has "
      f"{len(scaling)} cores; the kit takes any count.\n")
    w("| threads | total Mpps | per thread | speed-up |")
    w("|---|---|---|---|")
    base = scaling[0]["mpps"]
    for r in scaling:
        w(f"| {r['threads']} | **{r['mpps']}** | {', '.join(str(x) for x in r['mpps_per_thread'])} | {r['mpps'] / base:.2f}x |")
    w("")

    def draw_sc(ax):
        t = [r["threads"] for r in scaling]
        ax.plot(t, [r["mpps"] for r in scaling], marker="o", label="vectorlb pipeline (full NAT, UDP 64 B)")
        ax.plot(t, [base * x for x in t], "--", color="gray", label="linear")
        ax.set_xticks(t)
        ax.set_xlabel("worker threads (cores)")
        ax.set_ylabel("Mpps")
        ax.legend(fontsize=8)
    w(chart("scaling", draw_sc, "Throughput by worker cores (in memory, 4 M sessions)"))

curves = [r for r in big if r.get("memory_curve")]
if curves:
    w("### Memory by live sessions\n")
    w("Resident memory above the empty process while the 10 M-session tables above fill "
      "(the shape of seed 003 Figure 13). The table's index is allocated for the configured "
      "capacity and its pages are touched as flows hash into them; records grow with the "
      "sessions.\n")
    w("| sessions | " + " | ".join(f"IPv{r['family']} MB" for r in curves) + " |")
    w("|---|" + "---|" * len(curves))
    for i, (n, _) in enumerate(curves[0]["memory_curve"]):
        if i % 2 == 0 or i == len(curves[0]["memory_curve"]) - 1:
            w(f"| {n:,} | " + " | ".join(f"{r['memory_curve'][i][1] / 1e6:.0f}" for r in curves if i < len(r["memory_curve"])) + " |")
    w("")

    def draw_mem(ax):
        for r in curves:
            ax.plot([p[0] / 1e6 for p in r["memory_curve"]], [p[1] / 1e6 for p in r["memory_curve"]], marker=".", label=f"IPv{r['family']} full NAT")
        ax.set_xlabel("live sessions (millions)")
        ax.set_ylabel("resident MB")
        ax.legend(fontsize=8)
    w(chart("memory", draw_mem, "Resident memory by live sessions (table sized for 10 M)"))

if profile:
    w("### Profile: instructions per packet and per connection\n")
    if dated("profile"):
        w(dated("profile"))
    w("`bench/profile.sh` (`make bench-profile`): callgrind counts the instructions of the "
      "timed work only (`--toggle-collect` on the out-of-line function "
      "`vectorlb_bench::timed_process`), grouped by "
      "the source file they come from: the stages are inlined into `Worker::process` and "
      "`Worker::act`, and the line tables still say which file each instruction came from. "
      "Instruction counts repeat exactly on a shared machine, where timings do not; the cost "
      "of cache misses (the 10 M-session case) is not in them (this VM has no PMU for perf).\n")
    groups = []
    for r in profile:
        for k in r["by_source"]:
            if k not in groups:
                groups.append(k)
    w("| part | " + " | ".join(f"{r['workload']} ({r['mode']}, per {r['unit']})" for r in profile) + " |")
    w("|---|" + "---|" * len(profile))
    w("| **total instructions** | " + " | ".join(f"**{r['instructions_per_unit']:,}**" for r in profile) + " |")
    for g in groups:
        w(f"| {g} | " + " | ".join(str(r["by_source"].get(g, 0)) for r in profile) + " |")
    w("")
    conn = [r for r in profile if r["unit"] == "connection"]
    if conn:
        w("Per connection, by function (instructions): " + ", ".join(f"`{k}` {v:,}" for k, v in conn[0]["by_function"].items()) + ".\n")

for line in note("profile") if profile else []:
    w(line)

if profile_io:
    w("### Profile through the daemon: time per packet, I/O included\n")
    w("`bench/profile-io.sh` (`make bench-profile-io`): the generator sends 64-byte UDP at "
      "its full rate through the device under test on the RFC 2544 topology, and `perf record -e "
      "cpu-clock` (a timer, not a hardware counter) samples the device's process for "
      f"{profile_io[0]['seconds']:g} s at {profile_io[0]['hz']:g} Hz. The data-plane thread's "
      "samples, grouped by part, are converted to nanoseconds per packet received by the "
      "generator (its core's time divided by the packets it forwarded). Both devices busy-poll, "
      "so where a device is not saturated (no loss) its figure includes empty polls.\n")
    w("| | " + " | ".join(r["dut"] for r in profile_io) + " |")
    w("|---|" + "---|" * len(profile_io))
    w("| offered / forwarded Mpps (loss) | " + " | ".join(f"{r['offered_mpps']} / {r['rx_mpps']} ({r['loss_ratio'] * 100:.1f} %)" for r in profile_io) + " |")
    w("| data-plane thread, cores busy | " + " | ".join(f"{r['thread']}, {r['thread_cores']}" for r in profile_io) + " |")
    w("| **ns per packet** | " + " | ".join(f"**{r['ns_per_packet']}**" for r in profile_io) + " |")
    w("| of which in user space | " + " | ".join(f"{r['user_share'] * 100:.1f} %" for r in profile_io) + " |")
    pio_parts = []
    for r in profile_io:
        for k in r["parts_ns_per_packet"]:
            if k not in pio_parts:
                pio_parts.append(k)
    for k in pio_parts:
        w(f"| {k} | " + " | ".join(str(r["parts_ns_per_packet"].get(k, "-")) for r in profile_io) + " |")
    w("")
    w("Hottest functions of the data-plane thread (share of its samples): " + "; ".join(
        f"**{r['dut']}**: " + ", ".join(f"`{t[0][4:] if t[0][:2] in ('[k', '[.') else t[0]}` {t[2] * 100:.1f} %" for t in r["top"][:8])
        for r in profile_io) + ".\n")

# ---- memif ---------------------------------------------------------------------------------
if memif:
    at = res("memif-measured-at.txt")
    mcommit, mday = (open(at).read().split() + ["?", "?"])[:2] if os.path.exists(at) else ("?", "?")
    med = [r for r in memif if r["bench"] == "memif_median"]
    reps = max((r.get("rep", 0) for r in memif if r["bench"] == "memif"), default=0) + 1
    w("## memif: the pod interface against DPDK's net_memif (same run)\n")
    w(f"Measured {mday} at commit `{mcommit}`: `vectorlb-tools bench-memif --reps {reps} --json` "
      "(`make bench-memif`; raw lines in `bench/results/memif.jsonl`). One core per side, as in "
      "seed 001: the server under test forwards on CPU 1 in io mode (every frame received on queue "
      "*q* goes back out of queue *q*), the L3 forwarder example (`crates/memif/examples/l3fwd.rs`, "
      "a zero-copy memif client unless marked `copy`) on CPU 0 swaps addresses and returns what it "
      "receives, with 512 frames in flight per queue pair (for chained frames, as many as fill three quarters of the ring). The server is vectorlb's memif queues "
      "over DPDK mbufs (`vectorlb-tools memif-fwd`, copy engine `cpu`, or `dma` on this machine's "
      "dmadev) or DPDK 22.11's `net_memif` in `dpdk-testpmd --forward-mode=io`. 2,048-byte "
      "buffers, so a 4,400 or 9,000-byte frame is a chain of 3 or 5. Every point runs "
      f"{reps} times, the points interleaved, so that a slow minute of this shared host falls on "
      "both servers alike; the tables give medians. Mpps are frames returned to the client per "
      "second; Gbps count frame bytes (no preamble or gap).\n")
    if memif_focus:
        fr = [r for r in memif_focus if r["bench"] == "memif" and "mpps" in r]
        fv = [r for r in memif_focus if r["bench"] == "memif_vs_testpmd"]
        nrep = max((r.get("rep", 0) for r in fr), default=0) + 1
        w(f"### Head to head, {nrep} rounds: vectorlb (cpu) against DPDK's net_memif\n")
        w(f"`vectorlb-tools bench-memif --focus --sizes 64,1500 --reps {nrep} --seconds 2 --json` "
          "(`bench/results/memif-focus.jsonl`): only these two servers, one queue pair, the zero-copy "
          "client, alternating run by run. This host has two speeds: the same point runs at about "
          "half its best now and then, for either server (the other tenants' load and where the "
          "host places the two virtual CPUs), so the rounds are listed in the order they ran.\n")
        w("| frame B | vectorlb median Mpps | testpmd median Mpps | vectorlb / testpmd | vectorlb rounds | testpmd rounds |")
        w("|---|---|---|---|---|---|")
        for v in fv:
            rounds = lambda srv: ", ".join(f"{r['mpps']:.2f}" for r in fr if r["server"] == srv and r["frame_bytes"] == v["frame_bytes"])
            w(f"| {v['frame_bytes']} | {v['vectorlb_cpu_mpps']:.3f} | {v['testpmd_mpps']:.3f} | **{v['cpu_vs_testpmd']:.2f}** | {rounds('vectorlb')} | {rounds('testpmd')} |")
        w("")
    def m(server, copy, client, q, mtu, size, thr=None, timed=False):
        for r in med:
            if (r["server"], r["copy"], r["client"], r["queues"], r["mtu"], r["frame_bytes"]) == (server, copy, client, q, mtu, size) \
                    and bool(r.get("timed")) == timed and (thr is None or r.get("threshold") == thr):
                return r
        return None
    fmt = lambda r, k="mpps": "-" if r is None or k not in r else f"{r[k]:.3f}" if k == "mpps" else f"{r[k]:.2f}"
    thr = next((r.get("threshold") for r in med if r["copy"] == "dma" and r.get("threshold", 0) > 0), None)
    for mtu in (1500, 9000):
        sizes = sorted({r["frame_bytes"] for r in med if r["mtu"] == mtu and r["client"] == "zero-copy" and r["queues"] == 1 and not r.get("timed") and r["server"] == "testpmd"})
        if not sizes:
            continue
        w(f"### MTU {mtu}, one queue pair, zero-copy client\n")
        w(f"| frame B | vectorlb cpu Mpps | testpmd Mpps | vectorlb / testpmd | vectorlb cpu Gbps | testpmd Gbps | vectorlb dma (threshold {thr}) Mpps | dma / cpu | vectorlb cycles/frame |")
        w("|---|---|---|---|---|---|---|---|---|")
        for size in sizes:
            c, t, d = m("vectorlb", "cpu", "zero-copy", 1, mtu, size), m("testpmd", "cpu", "zero-copy", 1, mtu, size), m("vectorlb", "dma", "zero-copy", 1, mtu, size, thr)
            ratio = f"**{c['mpps'] / t['mpps']:.2f}**" if c and t and t.get("mpps") else "-"
            dvc = f"{d['mpps'] / c['mpps']:.2f}" if c and d and c.get("mpps") and d.get("mpps") else "-"
            w(f"| {size} | {fmt(c)} | {fmt(t)} | {ratio} | {fmt(c, 'gbps')} | {fmt(t, 'gbps')} | {fmt(d)} | {dvc} | {c.get('cycles_per_frame', '-') if c else '-'} |")
        w("")
        def draw(ax, mtu=mtu, sizes=sizes):
            for server, copy, label in (("vectorlb", "cpu", "vectorlb, cpu copy"), ("testpmd", "cpu", "DPDK net_memif (testpmd)"), ("vectorlb", "dma", "vectorlb, dma (dma_skeleton)")):
                ys = [(m(server, copy, "zero-copy", 1, mtu, s, thr if copy == "dma" else None) or {}).get("gbps") for s in sizes]
                pts = [(s, y) for s, y in zip(sizes, ys) if y is not None]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            ax.set_xlabel("frame bytes")
            ax.set_ylabel("Gbps (frame bytes)")
            ax.legend(fontsize=8)
        w(chart(f"memif-mtu{mtu}", draw, f"memif forwarding by frame size, MTU {mtu}, one core per side"))
    other = []
    for client, q in (("copy", 1), ("zero-copy", 2)):
        for size in (64, 1500):
            c, t = m("vectorlb", "cpu", client, q, 1500, size), m("testpmd", "cpu", client, q, 1500, size)
            if c or t:
                other.append((client, q, size, c, t))
    if other:
        w("### A copying client, and two queue pairs\n")
        rounds = lambda srv: ", ".join(f"{r['mpps']:.2f}" for r in memif if r["bench"] == "memif" and r.get("client") == "copy" and r.get("server") == srv
                                       and r.get("copy") == "cpu" and r.get("frame_bytes") == 1500 and r.get("mtu") == 1500 and r.get("queues") == 1 and "mpps" in r)
        w("With the copying client (it copies each frame out of and into the shared buffers, as DPDK's "
          "memif does without zero-copy) the client's core is the limit for both servers (the server "
          "spends most of its polls finding nothing), and its rounds swing with the host "
          f"(1,500 B here: vectorlb {rounds('vectorlb')}; testpmd {rounds('testpmd')} Mpps), so "
          "three rounds say little. With two queue pairs each side still has one core.\n")
        w("| client | queue pairs | frame B | vectorlb Mpps | testpmd Mpps | vectorlb / testpmd |")
        w("|---|---|---|---|---|---|")
        for client, q, size, c, t in other:
            ratio = f"{c['mpps'] / t['mpps']:.2f}" if c and t and t.get("mpps") else "-"
            w(f"| {client} | {q} | {size} | {fmt(c)} | {fmt(t)} | {ratio} |")
        w("")
    cross = [r for r in memif if r["bench"] == "memif_crossover"]
    if cross:
        w("### The DMA threshold: every copy on the dmadev against the CPU\n")
        w("`dma_threshold = 0` sends every copy to the dmadev; the CPU engine copies all. Where the "
          "dmadev wins, copies of that size should go to it; the default threshold is the smallest "
          "size where it does. This machine has no DSA or IOAT device, so the dmadev is DPDK's "
          "software `dma_skeleton`, whose copies run on a thread of their own (on the other core, "
          "shared with the client): it measures the engine's overhead, not an accelerator.\n")
        w("| frame B | cpu Mpps | all on dma Mpps | dma / cpu |")
        w("|---|---|---|---|")
        for r in cross:
            w(f"| {r['frame_bytes']} | {r['cpu_mpps']:.3f} | {r['dma_all_mpps']:.3f} | {r['dma_vs_cpu']:.2f} |")
        w("")
    ct = [r for r in memif if r["bench"] == "memif_copy_time"]
    if ct:
        w("### Where the time goes: copying against the rest (seed 001's Table 6)\n")
        w("`memif-fwd --time-copies` reads the clock around the copies of one burst in 32 and "
          "subtracts the clock's own cost; the rest of the forwarding loop's cycles are descriptor "
          "checks, buffer allocation and freeing, ring updates and waiting for the peer. With `dma` "
          "the copy time is the engine's submit and completion calls plus the copies below the "
          "threshold. At 64 B a copy is shorter than the clock's resolution.\n")
        w("| engine | MTU | frame B | cycles/frame | copying | the rest | copy share |")
        w("|---|---|---|---|---|---|---|")
        for r in ct:
            w(f"| {r['copy']} | {r['mtu']} | {r['frame_bytes']} | {r['cycles_per_frame']:.0f} | {r['copy_cycles_per_frame']:.0f} | {r['other_cycles_per_frame']:.0f} | {r['copy_share'] * 100:.1f} % |")
        w("")

else:
    # No results of a memif run in the repository: the last one's tables, kept by hand.
    for line in note("memif-2026-11-23"):
        w(line)

# ---- wrk and idle --------------------------------------------------------------------------
if os.path.exists(res("wrk-fnat.txt")):
    text = open(res("wrk-fnat.txt")).read()
    head = [l[2:] for l in text.splitlines() if l.startswith("# ")]
    body = [l for l in text.splitlines() if not l.startswith("# ")]
    pct = {p[0]: p[1] for p in (l.split() for l in body) if len(p) == 2 and p[0].endswith("%")}
    rps = next((l.split(":", 1)[1].strip() for l in body if l.startswith("Requests/sec")), "?")
    errors = next((l.strip() for l in body if "Socket errors" in l), "Socket errors: none")
    w("## Real TCP through the daemon: wrk, 20 s, full NAT to three nginx\n")
    w("`make bench-wrk` (the `make demo` topology: client, LB on two AF_XDP veth ports with one "
      "worker, three nginx backends; wrk, the LB and nginx share the two cores). Measured "
      + (head[0].split(" ")[0] if head else "?") + ".\n")
    w("| requests/s | p50 | p75 | p90 | p99 | socket errors |")
    w("|---|---|---|---|---|---|")
    w(f"| {rps} | {pct.get('50%', '?')} | {pct.get('75%', '?')} | {pct.get('90%', '?')} | {pct.get('99%', '?')} | {errors.replace('Socket errors:', '').strip()} |\n")
if idle:
    w("## Polling that fits the host: idle CPU and wake-up\n")
    w("`bench/idle.sh`: the daemon with one worker, no traffic for 5 s (its CPU time over "
      "that window, all threads), then 50 pings to the VIP at 20 per second (the LB answers them "
      "itself, so each ping wakes an idle worker).\n")
    w("| idle_sleep_us | idle CPU (% of one core) | ping RTT min / avg / max (ms) |")
    w("|---|---|---|")
    for r in idle:
        mode = "busy poll (0)" if r["idle_sleep_us"] == 0 else f"back-off ({r['idle_sleep_us']})"
        w(f"| {mode} | {r['idle_cpu_percent']} | {r['ping_rtt_ms_min']} / {r['ping_rtt_ms_avg']} / {r['ping_rtt_ms_max']} |")
    w("")

for line in tls_section():
    w(line)

# ---- Priority dispatch in the proxy ---------------------------------------------------------
def dispatch_section():
    """`make bench-dispatch` (bench/results/dispatch.jsonl): per run and load, FIFO's 1 KB p99
    over each priority backend's, median of the paired rounds and their spread; then the last
    run's p99 by object size."""
    rs = lines("dispatch.jsonl")
    verdicts = [r for r in rs if r["bench"] == "dispatch_ratio"]
    if not verdicts:
        return
    loads = sorted({r["load"] for r in verdicts})
    runs = [verdicts[i:i + len(loads)] for i in range(0, len(verdicts), len(loads))]
    at = dated("dispatch")
    w("## Priority dispatch in the proxy: latency by object size\n")
    if at:
        w(at)
    v0 = verdicts[0]
    w(f"`make bench-dispatch` (`bench/dispatch.py`: {v0['rounds']} paired rounds of {v0['seconds']:g} s per load and proxy, "
      "the capacity measured again in every round and each load taken from that round's capacity; "
      f"raw lines in `bench/results/dispatch.jsonl`), {len(runs)} run(s) in a row on {v0['cpu']}. "
      "The ratio is FIFO's 1 KB (high class) p99 over the priority backend's, per round; "
      "the table gives its median over the rounds and, in brackets, the lowest and highest round.\n")
    w("| run | load | FIFO / priority (software queue) | FIFO / priority (event_sw) | throughput against FIFO, lowest round (software; event_sw) | errors |")
    w("|---|---|---|---|---|---|")
    span = lambda s: f"[{s[0]:.2f}, {s[1]:.2f}]" if s else "-"
    for k, run in enumerate(runs, 1):
        for v in run:
            tp = lambda m: min(v.get(f"throughput_{m}_over_fifo_rounds") or [0])
            w(f"| {k} | {int(v['load'] * 100)} % | **{v.get('p99_1k_fifo_over_priority_median')}x** {span(v.get('p99_1k_fifo_over_priority_spread'))} "
              f"| **{v.get('p99_1k_fifo_over_eventdev_median')}x** {span(v.get('p99_1k_fifo_over_eventdev_spread'))} | {tp('priority'):.3f}; {tp('eventdev'):.3f} | {v['errors']} |")
    w("")
    rows = [r for r in rs if r["bench"] == "dispatch"]
    last = rows[-len(loads) * len({r["mode"] for r in rows[-len(loads) * 4:]}):] if rows else []
    if last:
        w("The last run's p99 by object size (ms, medians of the rounds; priority / event_sw / FIFO / SO_REUSEPORT workers):\n")
        w("| load | 1 KB (high) | 10 KB (high) | 100 KB (low) | 1 MB (low) |")
        w("|---|---|---|---|---|")
        for ld in loads:
            by = {r["mode"]: r for r in last if r["load"] == ld}
            cells = []
            for obj in ("1k", "10k", "100k", "1m"):
                cells.append(" / ".join(f"{by[m]['types'][obj]['p99_ms']:.2f}" if m in by else "-" for m in ("priority", "eventdev", "fifo", "reuseport")))
            w(f"| {int(ld * 100)} % | " + " | ".join(cells) + " |")
        w("")
    if os.path.exists(os.path.join(img_dir, "dispatch.png")):
        w("![p99 by object size: priority dispatch (software queue and event_sw), FIFO, SO_REUSEPORT workers; bars from the lowest to the highest round](img/dispatch.png)\n")


dispatch_section()


def step_head(title, prefix, text):
    """A step's section title, then when and where it was measured (`dated`) and `text`."""
    w(f"## {title}\n")
    w(dated(prefix).rstrip("\n") + " " + text + "\n")


def kubernetes_section():
    """`make bench-kubernetes` (bench/results/kubernetes.jsonl): apply to first request over 100
    Services, 1,000 Services and 20,000 endpoints programmed at once."""
    rs = lines("kubernetes.jsonl")
    if not rs:
        return
    step_head("Kubernetes: `vectorlb kube`", "kubernetes", "`make bench-kubernetes`, raw lines in `bench/results/kubernetes.jsonl`; a real control plane "
              "(kube-apiserver, kube-controller-manager, kube-scheduler v1.34.0, etcd 3.6.4) on the same 2 vCPUs as the daemon, the controller, "
              "the test's fake kubelet and its Pods (nginx in network namespaces); see [kubernetes.md](kubernetes.md).")
    for r in rs:
        if r["bench"] == "kubernetes_apply_to_first_request":
            w(f"- **Apply to first request**, {r['services']} Services (each with a one-Pod Deployment) applied at once: "
              f"p50 {r['p50_s']:.1f} s, p99 {r['p99_s']:.1f} s; from the endpoint's readiness to the first success: "
              f"p50 {r['after_endpoint_ready_p50_s']:.2f} s, p99 {r['after_endpoint_ready_p99_s']:.2f} s.")
        elif r["bench"] == "kubernetes_programming":
            w(f"- **Programming**, {r['services']:,} Services and {r['endpoints']:,} endpoints created at once (kubectl took {r['created_s']:.0f} s to create them): "
              f"all on the daemon after {r['programmed_s']:.1f} s ({r['services_per_second']:.0f} Services, {r['endpoints_per_second']:.0f} endpoints a second), "
              f"every status written after {r['statuses_written_s']:.1f} s; the controller's memory {r['controller_rss_mb_before']:.0f} MB before, "
              f"{r['controller_hwm_mb']:.0f} MB at its peak; the daemon's {r['daemon_rss_mb']:.0f} MB with them.")
    w("")
    for line in note("kubernetes"):
        w(line)


def pods_section():
    """`make bench-pods` (bench/results/pods.jsonl): the pod network against kube-proxy
    (nftables) with the bridge plugin, side by side in one run."""
    rs = lines("pods.jsonl")
    if not rs:
        return
    step_head("Pod network: vectorlb-cni against kube-proxy (nftables) and the bridge plugin", "pods",
              "`make bench-pods`, raw lines in `bench/results/pods.jsonl`. Two nodes in network "
              "namespaces on the same machine, measured alternately in one run: vectorlb's (pods on tun interfaces and memifs by "
              "`vectorlb-cni`, the ClusterIP in the daemon's L4 core, release build) and the reference one (pods on a Linux bridge by "
              "Debian's bridge plugin with br_netfilter, the ClusterIP by kube-proxy v1.34.0 in nftables mode from a real API "
              "server). Medians of the rounds; see [pod-network.md](pod-network.md).")
    by = {}
    for r in rs:
        by.setdefault(r["bench"], []).append(r)
    if by.get("pods_service_cps"):
        w("| pod to ClusterIP (HTTP/1.1, a connection per request) | connections/s | p50 ms | p99 ms | machine CPU per request (µs) | errors |")
        w("|---|---|---|---|---|---|")
        for r in by["pods_service_cps"]:
            w(f"| {r['system']} | **{r['cps']:,.0f}** | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['cpu_us_per_request']:.0f} | {r['errors']} |")
        w("")
    if by.get("pods_pod_to_pod_udp"):
        w("| pod to pod, UDP (iperf3; the most received over offered loads) | frame bytes | received packets/s | Gbit/s |")
        w("|---|---|---|---|")
        for r in by["pods_pod_to_pod_udp"]:
            w(f"| {r['system']} | {r['frame_bytes']} | **{r['received_pps']:,.0f}** | {r['gbps']:.3f} |")
        w("")
    if by.get("pods_tcp_bulk"):
        w("| TCP bulk (iperf3) | path | streams | Gbit/s | machine CPU s per Gbit | retransmits |")
        w("|---|---|---|---|---|---|")
        for r in sorted(by["pods_tcp_bulk"], key=lambda r: (r.get("path", ""), r["streams"], r["system"])):
            w(f"| {r['system']} | {r.get('path', 'pod to pod, one node')} | {r['streams']} | **{r['gbps']:.3f}** | {r['cpu_s_per_gbit']:.3f} | {r['retransmits']:,} |")
        w("")
    for r in by.get("pods_memif", []):
        w(f"- **memif pod vs interface pod**, 64-byte frames through vectorlb, the most received over offered loads: memif "
          f"(`vectorlb-tools pod-memif send` to `sink`) {r['memif_pps']:,.0f} packets/s, interface (iperf3) {r['interface_pps']:,.0f}.")
    for r in by.get("pods_summary", []):
        w(f"- **Summary**: cps_vs_kube_proxy **{r['cps_vs_kube_proxy']}** (goal at least 1.2 in every round), p99_vs_kube_proxy **{r['p99_vs_kube_proxy']}** "
          f"(goal below 1.0), CPU per request {r['cpu_per_request_vs_kube_proxy']}x kube-proxy's, memif_vs_interface **{r['memif_vs_interface']}** "
          f"(goal at least 5.0)"
          + (f", tcp_bulk_vs_bridge {json.dumps(r['tcp_bulk_vs_bridge'])} (goal at least 1.5 on a node, 1.0 across nodes)" if r.get("tcp_bulk_vs_bridge") else "")
          + (f", tcp_ceiling_vs_bridge {json.dumps(r['tcp_ceiling_vs_bridge'])} (loopback in one namespace against the bridge's pod to pod)" if r.get("tcp_ceiling_vs_bridge") else "")
          + (f", udp64_vs_bridge **{r['udp64_vs_bridge']}**, udp1500_vs_bridge **{r['udp1500_vs_bridge']}**" if r.get("udp1500_vs_bridge") is not None else "")
          + (f", udp_tun_ceiling_vs_bridge {json.dumps(r['udp_tun_ceiling_vs_bridge'])} (a bare tun forwarder against the bridge), "
             f"udp_vs_tun_ceiling {json.dumps(r['udp_vs_tun_ceiling'])}" if r.get("udp_tun_ceiling_vs_bridge") else "")
          + (f", cps_lowest_round_vs_kube_proxy **{r['cps_lowest_round_vs_kube_proxy']}**" if r.get("cps_lowest_round_vs_kube_proxy") is not None else "")
          + ".")
    w("")
    for line in note("pods"):
        w(line)


def policy_section():
    """`make bench-policy` (bench/results/policy.jsonl): NetworkPolicy at 0, 100 and 10,000
    policies, vectorlb against kube-network-policies, side by side in one run; callgrind."""
    rs = lines("policy.jsonl")
    if not rs:
        return
    step_head("Network policy: vectorlb against kube-network-policies", "policy",
              "`make bench-policy`, raw lines in `bench/results/policy.jsonl`. The two nodes of the pod network benchmark (vectorlb's; "
              "the bridge plugin with kube-proxy in nftables mode), one control plane holding both nodes' Pods, and on it N "
              "NetworkPolicies in the Pods' namespace, every one selecting every bench Pod for ingress and egress (N - 1 that each let "
              "in one absent label on one TCP port and out to one /32 on one UDP port, and one that lets the bench Pods reach each "
              "other), enforced by vectorlb's controller and daemon and by kube-network-policies v0.8.0 (built from its Go module; "
              "its queue rule as the xtables NFQUEUE target, scripts/kube-network-policies.sh). Measured alternately, medians of the "
              "rounds; see [network-policy.md](network-policy.md).")
    by = {}
    for r in rs:
        by.setdefault(r["bench"], []).append(r)
    if by.get("policy_service_cps"):
        w("| pod to ClusterIP (a connection per request) | policies | connections/s | p50 ms | p99 ms | machine CPU per request (µs) | errors |")
        w("|---|---|---|---|---|---|---|")
        for r in by["policy_service_cps"]:
            w(f"| {r['system']} | {r['policies']:,} | **{r['cps']:,.0f}** | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['cpu_us_per_request']:.0f} | {r['errors']} |")
        w("")
    pps = by.get("policy_pod_to_pod_udp", []) + by.get("policy_pod_to_pod_memif", [])
    if pps:
        w("| pod to pod, 64-byte UDP (the most received over offered loads) | policies | received packets/s |")
        w("|---|---|---|")
        for r in pps:
            name = r["system"] + (" (memif pods)" if r["bench"] == "policy_pod_to_pod_memif" else " (interface pods)")
            w(f"| {name} | {r['policies']:,} | **{r['received_pps']:,.0f}** |")
        w("")
    for r in by.get("policy_profile", []):
        w(f"- **callgrind**, {r['mode']} {r['proto']}, established {r['path']} ({r['flows']:,} flows), {r['policies']:,} policies: {r['instructions_per_packet']:,} instructions per packet.")
    for r in by.get("policy_summary", []):
        w(f"- **Summary**: policy10k_vs_none **{r['policy10k_vs_none']}** (goal at least 0.95; connections {r['cps_10k_vs_none']}, interface pods' packets "
          f"{r['pps_10k_vs_none']}, memif pods' packets {r.get('memif_pps_10k_vs_none')}), policy10k_vs_peer **{r['policy10k_vs_peer']}** (goal at least 1.5; "
          f"connections {r['cps_10k_vs_peer']}, interface pods' packets {r['pps_10k_vs_peer']}); the peer's own connections at 10,000 against none: "
          f"{r['peer_cps_10k_vs_none']}.")
    w("")
    for line in note("policy"):
        w(line)


def mesh_section():
    """`make bench-mesh` (bench/results/mesh.jsonl): no mesh, vectorlb's mesh and HAProxy
    sidecars, pod to pod across two nodes, side by side in one run."""
    rs = lines("mesh.jsonl")
    if not rs:
        return
    step_head("Mesh: vectorlb's node proxies against no mesh and sidecars", "mesh",
              "`make bench-mesh`, raw lines in `bench/results/mesh.jsonl`. The two nodes of the mesh test (one-arm topologies joined by "
              "a link), web's pod on node a to db's on node b (HTTP/1.1, a connection per request, `vectorlb-tools probe http`): "
              "straight through the data plane (no mesh); steered to each node's `vectorlb mesh` and carried in a mutual-TLS tunnel "
              "(vectorlb mesh, handshakes on the cryptomb provider); through HAProxy sidecars in both pods originating and terminating "
              "mutual TLS with the same certificates (the sidecar model). Measured alternately, medians of the rounds; see [mesh.md](mesh.md).")
    by = {}
    for r in rs:
        by.setdefault(r["bench"], []).append(r)
    def load_table(kind, intro, unit, at_saturation):
        """One table of a load: per system, load and round, the rate and latencies."""
        if not by.get(kind):
            return
        if intro:
            w(intro)
            w("")
        w(f"| system | load | {unit}/s | p50 ms | p99 ms | errors | round |")
        w("|---|---|---|---|---|---|---|")
        for r in by[kind]:
            load = f"fixed, {r['rate']:,}/s" if r["load"] == "fixed" else f"saturation, {at_saturation(r)}"
            w(f"| {r['system']} | {load} | **{r['rps']:,.0f}** | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['errors']:.0f} | {r['round']} |")
        w("")
    load_table("mesh", None, "requests", lambda r: f"{r['concurrency']} at once")
    load_table("mesh_keepalive", "Keep-alive HTTP/1.1 (8 connections each carrying request after request, `vectorlb-tools http-load`; open loop at the fixed load, closed loop at saturation):",
               "requests", lambda r: f"{r['connections']} connections")
    load_table("mesh_grpc", "gRPC (unary calls on HTTP/2 to Istio's echo server, 8 connections, one call at a time on each, `h2load`; at a fixed rate and at saturation):",
               "calls", lambda r: f"{r['connections']} connections")
    if by.get("mesh_handshakes"):
        w("| full handshakes (a new mutual-TLS connection per request) | round | handshakes/s | CPU s of the proxies | handshakes per CPU second |")
        w("|---|---|---|---|---|")
        for r in by["mesh_handshakes"]:
            w(f"| {r['system']} | {r.get('round', 0)} | {r['handshakes_per_s']:,.0f} | {r['cpu_s']:.2f} | **{r['handshakes_per_cpu_s']:,.0f}** |")
        w("")
    for r in by.get("mesh_summary", []):
        w(f"- **Summary** ({r['rounds']} rounds; AVX-512 IFMA {'present' if r['avx512ifma'] else 'absent'}): rps_vs_no_mesh **{r['rps_vs_no_mesh']}** (goal at least 0.9), "
          f"p99_vs_no_mesh **{r['p99_vs_no_mesh']}** at the fixed load (goal at most 1.2; at saturation {r['p99_saturation_vs_no_mesh']}), "
          f"rps_vs_sidecars **{r['rps_vs_sidecars']}** (goal at least 1.5), p99_vs_sidecars {r['p99_vs_sidecars']}, "
          f"handshakes_vs_sidecars **{r['handshakes_vs_sidecars']}** (goal at least 2 with AVX-512 IFMA)."
          + (f" Keep-alive: rps_vs_no_mesh **{r['keepalive_rps_vs_no_mesh']}**, p99_vs_no_mesh **{r['keepalive_p99_vs_no_mesh']}** at {r['keepalive_fixed_rate']:,}/s, "
             f"rps_vs_sidecars **{r['keepalive_rps_vs_sidecars']}**, p99_vs_sidecars {r['keepalive_p99_vs_sidecars']}." if "keepalive_rps_vs_no_mesh" in r else "")
          + (f" gRPC: rps_vs_no_mesh **{r['grpc_rps_vs_no_mesh']}**, p99_vs_no_mesh **{r['grpc_p99_vs_no_mesh']}** at {r['grpc_fixed_rate']:,}/s, "
             f"rps_vs_sidecars **{r['grpc_rps_vs_sidecars']}**, p99_vs_sidecars {r['grpc_p99_vs_sidecars']}." if "grpc_rps_vs_no_mesh" in r else ""))
    w("")
    for line in note("mesh"):
        w(line)


# Sections written by hand (the dispatch analysis; queue sets from their own result file,
# bench/results/queue-sets.jsonl), then the analysis of the whole page.
for name in ("dispatch", "queue-sets"):
    for line in note(name):
        w(line)
kubernetes_section()
pods_section()
policy_section()
mesh_section()
for line in note("analysis"):
    w(line)
w("## JSON lines of this run\n")
w("```")
for r in core + scaling + profile + [dict(r, top=f"{len(r['top'])} functions, see bench/results/profile-io.jsonl") for r in profile_io] + [dict(r, trials=f"{len(r.get('trials', []))} trials, see bench/results/rfc2544.jsonl") for r in rfc] + peers + idle + [r for r in memif + memif_focus if r["bench"] != "memif"] + tls + lines("kubernetes.jsonl") + [{k: v for k, v in r.items() if k != "runs"} for r in lines("pods.jsonl") + lines("policy.jsonl") + lines("mesh.jsonl")]:
    w(json.dumps(r, separators=(",", ":")))
w("```")
unused = sorted(f[:-3] for f in os.listdir(os.path.join(root, "bench", "notes")) if f.endswith(".md") and f[:-3] not in notes_used)
if unused:
    # A note with no place on the page would be lost by regenerating it: refuse instead.
    sys.exit(f"bench/report.py: bench/notes/{{{','.join(unused)}}}.md have no place on the page (give them one in bench/report.py)")
open(OUT, "w").write("\n".join(out) + "\n")
print(f"wrote {os.path.relpath(OUT, root)} ({len(charts)} charts in docs/img)" + ("" if plt else "; matplotlib is missing: no charts (scripts/setup.sh --bench)"))
