#!/usr/bin/env python3
"""Full TLS handshakes per second: the proxy's private-key providers against nginx (OpenSSL 3)
and HAProxy (OpenSSL), the same RSA-2048 key and certificate, one server core, h2load on the
other, one small HTTP/1.1 GET per connection (the client asks to close), no resumption; TLS 1.3
and 1.2. Then keep-alive requests per second over HTTP/1.1 and HTTP/2 on the same servers.

Every server gets one worker pinned to CPU 0 (the proxy: `workers = 1`, its pool thread too);
h2load runs pinned to CPU 1. Servers are measured in turn, the order rotating each round; rates
are medians of the rounds, ratios medians of the per-round ratios (the machine's speed drifts).
Besides the rate, each server's CPU time over the run gives handshakes per core-second: one
h2load core saturates before the fastest servers do. JSON lines on stdout (and appended to --out).

    bench/tls.py [--bin target/release/vectorlb] [--conns 4000] [--rounds 7] [--out F]
"""
import argparse, functools, json, os, re, signal, statistics, subprocess, tempfile, time

import benchutil
from benchutil import CLIENT_CPU, SERVER_CPU, cpu_flags, cpu_name, free_port

wait_port = functools.partial(benchutil.wait_port, tool="bench-tls")


class Server:
    def __init__(self, name, kind, provider=None, binary=None):
        self.name, self.kind, self.provider, self.binary = name, kind, provider, binary
        self.proc = None
        self.port = None
        self.admin = None

    def start(self, w, version, env=None):
        self.port = free_port()
        d = os.path.join(w, f"{self.name}-{version}")
        os.makedirs(d, exist_ok=True)
        if self.kind == "nginx":
            conf = f"""daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{ access_log off; client_body_temp_path {d}/b; proxy_temp_path {d}/p; fastcgi_temp_path {d}/f;
 uwsgi_temp_path {d}/u; scgi_temp_path {d}/s; keepalive_requests 1000000;
 ssl_session_cache off; ssl_session_tickets off;
 server {{ listen 127.0.0.1:{self.port} ssl http2 backlog=4096;
  ssl_certificate {w}/cert.pem; ssl_certificate_key {w}/key.pem; ssl_protocols TLSv{version};
  location / {{ return 200 "ok\\n"; }} }} }}
"""
            open(f"{d}/nginx.conf", "w").write(conf)
            cmd = ["nginx", "-c", f"{d}/nginx.conf", "-p", d]
        elif self.kind == "haproxy":
            conf = f"""global
  nbthread 1
  maxconn 8000
  tune.ssl.cachesize 0
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend f
  bind 127.0.0.1:{self.port} ssl crt {w}/combined.pem alpn h2,http/1.1 ssl-min-ver TLSv{version} ssl-max-ver TLSv{version} no-tls-tickets
  http-request return status 200 content-type text/plain string "ok"
"""
            open(f"{d}/haproxy.cfg", "w").write(conf)
            cmd = ["haproxy", "-f", f"{d}/haproxy.cfg"]
        else:
            self.admin = f"{d}/admin.sock"
            conf = f"""workers = 1
[admin]
address = "unix:{self.admin}"
[[listeners]]
name = "tls"
address = "127.0.0.1:{self.port}"
tls = {{ certificates = [{{ cert = "{w}/cert.pem", key = "{w}/key.pem" }}], {self.provider}, resumption = false, min_version = "{version}", max_version = "{version}" }}
[[routes]]
respond = {{ status = 200, body = "ok\\n" }}
"""
            open(f"{d}/proxy.toml", "w").write(conf)
            cmd = [self.binary or ARGS.bin, "proxy", "--config", f"{d}/proxy.toml"]
        self.proc = subprocess.Popen(["taskset", "-c", SERVER_CPU] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        wait_port(self.port, self.proc, self.name)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cpu_seconds(self):
        """CPU time (user + system) of the server's processes and threads so far."""
        if not self.proc:
            return 0.0
        pids = [str(self.proc.pid)] + subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        total = 0
        for pid in pids:
            try:
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                total += int(f[11]) + int(f[12])
            except (OSError, IndexError, ValueError):
                pass
        return total / os.sysconf("SC_CLK_TCK")

    def stats(self):
        if not self.admin:
            return None
        out = subprocess.run(["curl", "-sS", "--max-time", "5", "--unix-socket", self.admin, "http://admin/v1/stats"], capture_output=True, text=True)
        if out.returncode != 0:
            return None
        d = json.loads(out.stdout)
        tls = d["listeners"][0]["tls"]
        tls["x25519_secrets"] = d.get("x25519_secrets")
        return tls


def h2load(port, args):
    cmd = ["taskset", "-c", CLIENT_CPU, "h2load"] + args + [f"https://127.0.0.1:{port}/"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    m = re.search(r"finished in ([\d.]+)(ms|s), ([\d.]+) req/s", out)
    r = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", out)
    c = re.search(r"time for connect:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", out)
    if not m or not r:
        raise SystemExit(f"bench-tls: h2load said:\n{out}")
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    conn = None
    if c:
        conn = {"min_ms": float(c.group(1)) * unit[c.group(2)], "max_ms": float(c.group(3)) * unit[c.group(4)], "mean_ms": float(c.group(5)) * unit[c.group(6)]}
    return {"rate": float(m.group(3)), "seconds": float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1.0), "succeeded": int(r.group(4)), "failed": int(r.group(5)) + int(r.group(6)) + int(r.group(7)), "connect": conn}


def emit(rec):
    line = json.dumps(rec, sort_keys=False)
    print(line, flush=True)
    if ARGS.out:
        with open(ARGS.out, "a") as f:
            f.write(line + "\n")


GRPC_SERVER = "/opt/vectorlb/bin/grpc-health-server"


def grpc_unary(w, machine):
    """gRPC unary calls per second (grpc.health.v1.Health/Check on grpc-go's server) through
    vectorlb proxy and through nginx grpc_pass, h2c both ways, one core each; h2load as the
    client (POST with the 5-byte empty gRPC message), the backend and h2load sharing CPU 1."""
    if not os.path.exists(GRPC_SERVER):
        emit({"bench": "grpc_unary", "skipped": f"{GRPC_SERVER} is missing (scripts/setup.sh --bench builds it)", **machine})
        return
    be = free_port()
    procs = []
    try:
        b = subprocess.Popen(["taskset", "-c", CLIENT_CPU, GRPC_SERVER, "-listen", f"127.0.0.1:{be}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(b)
        wait_port(be, b, "grpc-health-server")
        d = os.path.join(w, "grpc")
        os.makedirs(d, exist_ok=True)
        ng, px = free_port(), free_port()
        open(f"{d}/nginx.conf", "w").write(f"""daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{ access_log off; client_body_temp_path {d}/b; proxy_temp_path {d}/p; fastcgi_temp_path {d}/f;
 uwsgi_temp_path {d}/u; scgi_temp_path {d}/s; keepalive_requests 1000000; http2_max_requests 1000000;
 upstream be {{ server 127.0.0.1:{be}; keepalive 32; }}
 server {{ listen 127.0.0.1:{ng} http2; location / {{ grpc_pass grpc://be; }} }} }}
""")
        open(f"{d}/proxy.toml", "w").write(f"""workers = 1
[[listeners]]
name = "grpc"
address = "127.0.0.1:{px}"
protocols = "http2"
[[routes]]
cluster = "be"
[[clusters]]
name = "be"
protocol = "http2"
endpoints = ["127.0.0.1:{be}"]
""")
        for cmd, port, name in ((["nginx", "-c", f"{d}/nginx.conf", "-p", d], ng, "nginx"), ([ARGS.bin, "proxy", "--config", f"{d}/proxy.toml"], px, "vectorlb")):
            p = subprocess.Popen(["taskset", "-c", SERVER_CPU] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            procs.append(p)
            wait_port(port, p, name)
        body = f"{d}/check.bin"
        open(body, "wb").write(b"\0\0\0\0\0")
        # Each path must answer a real gRPC call: SERVING (field 1 = 1).
        check = "import grpc,sys; c=grpc.insecure_channel(sys.argv[1]); r=c.unary_unary('/grpc.health.v1.Health/Check')(b'', timeout=5); assert r == b'\\x08\\x01', r"
        for port in (ng, px):
            r = subprocess.run(["python3", "-c", check, f"127.0.0.1:{port}"], env=dict(os.environ, PYTHONPATH="/opt/vectorlb/pylib"), capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"bench-tls: a gRPC call through port {port} failed: {r.stderr.strip()[-300:]}")
        rates = {"nginx": [], "vectorlb": []}
        args = ["-c", "8", "-m", "16", "-n", str(ARGS.requests), "-d", body, "-H", "content-type: application/grpc", "-H", "te: trailers"]
        for r in range(ARGS.rounds):
            for name, port in ((("nginx", ng), ("vectorlb", px)) if r % 2 == 0 else (("vectorlb", px), ("nginx", ng))):
                cmd = ["taskset", "-c", CLIENT_CPU, "h2load"] + args + [f"http://127.0.0.1:{port}/grpc.health.v1.Health/Check"]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
                m = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
                ok = re.search(r"status codes: (\d+) 2xx", out)
                if not m or not ok or int(ok.group(1)) != ARGS.requests:
                    raise SystemExit(f"bench-tls: h2load gRPC said:\n{out}")
                rates[name].append(float(m.group(1)))
        ratio = statistics.median(a / b for a, b in zip(rates["vectorlb"], rates["nginx"]))
        for name in ("nginx", "vectorlb"):
            emit({"bench": "grpc_unary", "server": name, "call": "grpc.health.v1.Health/Check", "requests_per_s": round(statistics.median(rates[name]), 1),
                  "rounds": [round(x, 1) for x in rates[name]], "vs_nginx": round(ratio, 3) if name == "vectorlb" else 1.0, "streams": 8 * 16, **machine})
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/vectorlb")
    ap.add_argument("--conns", type=int, default=4000, help="connections per handshake run")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=100000, help="requests per keep-alive run")
    ap.add_argument("--poll-delay", default="0.003", help="cryptomb poll_delay, seconds (docs/proxy.md: choosing it); more values, comma-separated, add servers")
    ap.add_argument("--versions", default="1.3,1.2")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="comma-separated proxy servers to run (nginx and HAProxy always run), e.g. vectorlb-cryptomb")
    ap.add_argument("--compare-bin", action="append", default=[], metavar="NAME=PATH", help="also run the cryptomb provider of another build (A/B of a change)")
    ap.add_argument("--handshakes-only", action="store_true", help="skip the signature speeds, keep-alive and gRPC parts")
    ARGS = ap.parse_args()
    for tool in ["h2load", "nginx", "haproxy", "taskset", "openssl", "curl"]:
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            raise SystemExit(f"bench-tls: {tool} is missing (scripts/setup.sh --bench)")
    if os.cpu_count() < 2:
        raise SystemExit("bench-tls: needs two CPUs (server on one, h2load on the other)")
    flags = cpu_flags()
    machine = {"cpu": cpu_name(), "avx512ifma": "avx512ifma" in flags, "nproc": os.cpu_count()}
    w = tempfile.mkdtemp(prefix="vectorlb-bench-tls-")
    subprocess.run(["openssl", "req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=bench.test", "-newkey", "rsa:2048", "-keyout", f"{w}/key.pem", "-out", f"{w}/cert.pem"], check=True, capture_output=True)
    open(f"{w}/combined.pem", "w").write(open(f"{w}/cert.pem").read() + open(f"{w}/key.pem").read())

    if ARGS.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
        open(os.path.join(os.path.dirname(ARGS.out) or ".", "tls-measured-at.txt"), "w").write(f"{commit} {time.strftime('%Y-%m-%d', time.gmtime())}\n")
    # The signature alone, per backend, on the server's core.
    speed = os.path.join(os.path.dirname(ARGS.bin), "examples", "sign_speed")
    if os.path.exists(speed) and not ARGS.handshakes_only:
        for line in subprocess.run(["taskset", "-c", SERVER_CPU, speed, "2"], capture_output=True, text=True).stdout.splitlines():
            emit({**json.loads(line), **machine})
    # Without crypto_mb the provider refuses or falls back; shown on every machine.
    refusal = Server("cryptomb-refuse", "proxy", 'provider = "cryptomb", cryptomb_fallback = "refuse"')
    try:
        refusal.start(w, "1.3", env=dict(os.environ, VECTORLB_CRYPTO_MB="off"))
        refusal.stop()
        emit({"bench": "tls_provider_refusal", "refused": False, **machine})
    except SystemExit as e:
        emit({"bench": "tls_provider_refusal", "refused": True, "message": str(e).strip().splitlines()[-1], "condition": "VECTORLB_CRYPTO_MB=off (as on a CPU without AVX-512 IFMA)", **machine})

    pd, *more_pd = ARGS.poll_delay.split(",")
    servers = [
        Server("nginx", "nginx"),
        Server("haproxy", "haproxy"),
        # The default inline backend: IPP's RSA where the CPU has AVX-512 IFMA, else BoringSSL.
        Server("vectorlb-inline", "proxy", 'provider = "inline"'),
        Server("vectorlb-inline-boringssl", "proxy", 'provider = "inline", inline_backend = "boringssl"'),
        Server("vectorlb-pool", "proxy", 'provider = "pool", pool_threads = 1'),
        Server("vectorlb-cryptomb", "proxy", f'provider = "cryptomb", poll_delay = {pd}, cryptomb_fallback = "inline"'),
        Server("vectorlb-cryptomb-portable", "proxy", f'provider = "cryptomb", cryptomb_backend = "portable", poll_delay = {pd}'),
    ]
    # Further poll_delay values side by side (exploring; the report shows the first).
    servers += [Server(f"vectorlb-cryptomb-pd{float(d) * 1e3:g}ms", "proxy", f'provider = "cryptomb", poll_delay = {d}, cryptomb_fallback = "inline"') for d in more_pd]
    for nb in ARGS.compare_bin:
        n, _, b = nb.partition("=")
        servers.append(Server(f"vectorlb-cryptomb-{n}", "proxy", f'provider = "cryptomb", poll_delay = {pd}, cryptomb_fallback = "inline"', binary=b))
    if ARGS.only:
        keep = set(ARGS.only.split(",")) | {"nginx", "haproxy"}
        unknown = keep - {s.name for s in servers}
        if unknown:
            raise SystemExit(f"bench-tls: --only: no server named {', '.join(sorted(unknown))}")
        servers = [s for s in servers if s.name in keep]
    try:
        for version in ARGS.versions.split(","):
            for s in servers:
                s.start(w, version)
            # Warm up every server (page faults, first allocations).
            for s in servers:
                h2load(s.port, ["--h1", "-c", "16", "-n", "500", "-H", "Connection: close"])
            rates = {s.name: [] for s in servers}
            conn = {s.name: [] for s in servers}
            failed = {s.name: 0 for s in servers}
            per_core = {s.name: [] for s in servers}
            busy = {s.name: [] for s in servers}
            for r in range(ARGS.rounds):
                order = servers[r % len(servers):] + servers[: r % len(servers)]
                for s in order:
                    before = s.cpu_seconds()
                    res = h2load(s.port, ["--h1", "-c", str(ARGS.concurrency), "-n", str(ARGS.conns), "-H", "Connection: close"])
                    cpu = s.cpu_seconds() - before
                    rates[s.name].append(res["rate"])
                    per_core[s.name].append(res["succeeded"] / cpu if cpu > 0 else 0.0)
                    busy[s.name].append(cpu / res["seconds"] if res["seconds"] > 0 else 0.0)
                    conn[s.name].append(res["connect"])
                    failed[s.name] += res["failed"]
            med = {n: statistics.median(v) for n, v in rates.items()}
            pc = {n: statistics.median(v) for n, v in per_core.items()}
            # Ratios within each round (the servers measured minutes apart at most), then the
            # median: steadier than a ratio of medians on a machine whose speed drifts.
            ratio = lambda n, peer: statistics.median(a / b for a, b in zip(per_core[n], per_core[peer]) if b > 0)
            for s in servers:
                st = s.stats()
                rec = {
                    "bench": "tls_handshakes",
                    "server": s.name,
                    "provider": st["provider"] if st else None,
                    "tls": version,
                    "key": "rsa2048",
                    "handshakes_per_s": round(med[s.name], 1),
                    "rounds": [round(x, 1) for x in rates[s.name]],
                    "vs_nginx": round(med[s.name] / med["nginx"], 3),
                    "vs_haproxy": round(med[s.name] / med["haproxy"], 3),
                    "handshakes_per_core_s": round(pc[s.name], 1),
                    "per_core_vs_nginx": round(ratio(s.name, "nginx"), 3),
                    "per_core_vs_haproxy": round(ratio(s.name, "haproxy"), 3),
                    "per_core_rounds": [round(x, 1) for x in per_core[s.name]],
                    "server_cpu_busy": round(statistics.median(busy[s.name]), 3),
                    "failed": failed[s.name],
                    "client_connect_ms": {"mean": round(statistics.median(c["mean_ms"] for c in conn[s.name] if c), 2)} if all(conn[s.name]) else None,
                    "concurrency": ARGS.concurrency,
                    "connections_per_round": ARGS.conns,
                }
                if st:
                    hs = st["handshake_seconds"]
                    rec["handshake_ms"] = {q: round(hs[q] * 1e3, 2) if hs[q] is not None else None for q in ["p50", "p90", "p99"]}
                    if st["rsa_queue_sizes"]["count"]:
                        b = st["rsa_queue_sizes"]["buckets"]
                        rec["rsa_queue_sizes"] = {str(int(le)) if le else "+Inf": c - (b[i - 1][1] if i else 0) for i, (le, c) in enumerate(b)}
                        rec["mean_batch"] = round(st["rsa_queue_sizes"]["sum"] / st["rsa_queue_sizes"]["count"], 2)
                    rec["failed_checks"] = st["failed_checks"]
                    x = st.get("x25519_secrets")
                    if x and x["batches"]:
                        rec["x25519_secrets"] = {"batched": x["batched"], "single": x["single"], "mean_batch": round(x["batched"] / x["batches"], 2)}
                    if st["fallback_reason"]:
                        rec["fallback_reason"] = st["fallback_reason"]
                emit({**rec, **machine})
            # Keep-alive: many requests per connection, HTTP/1.1 and HTTP/2.
            if version == "1.3" and not ARGS.handshakes_only:
                for proto, extra in [("http/1.1", ["--h1", "-c", "32"]), ("h2", ["-c", "32", "-m", "10"])]:
                    ka = {}
                    for s in servers:
                        if s.name in ("vectorlb-pool", "vectorlb-cryptomb-portable", "vectorlb-inline-boringssl"):
                            continue  # the provider only matters at handshakes
                        vals = [h2load(s.port, extra + ["-n", str(ARGS.requests)])["rate"] for _ in range(3)]
                        ka[s.name] = statistics.median(vals)
                    for n, v in ka.items():
                        emit({"bench": "keepalive_requests", "server": n, "protocol": proto, "tls": version, "requests_per_s": round(v, 1), "vs_nginx": round(v / ka["nginx"], 3), "vs_haproxy": round(v / ka["haproxy"], 3), **machine})
            for s in servers:
                s.stop()
        if not ARGS.handshakes_only:
            grpc_unary(w, machine)
    finally:
        for s in servers:
            s.stop()
        subprocess.run(["rm", "-rf", w])


if __name__ == "__main__":
    main()
