"""What the benchmark scripts (bench_tls.py, bench_dispatch.py, bench_queue_sets.py) share: the
CPUs server and client are pinned to, free loopback ports, waiting for a server to listen, the
CPU's name and flags for the JSON lines, JSON-line output, stopping child processes, and
matplotlib for the charts."""
import json, os, socket, subprocess, sys, time

SERVER_CPU, CLIENT_CPU = "0", "1"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, what, tool, timeout=10):
    """Returns once 127.0.0.1:`port` accepts; exits naming `tool` if `proc` ends first or the
    port stays closed for `timeout` seconds."""
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"{tool}: {what} exited at start: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{tool}: {what} did not listen on {port}")


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def emitter(path):
    """A function that prints a record as a JSON line and appends it to `path` (if given)."""
    out = open(path, "a") if path else None

    def emit(d):
        line = json.dumps(d)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    return emit


def stop(procs, timeout=5):
    """Terminates the processes, killing those that do not end within `timeout` seconds."""
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()


def pyplot(tool):
    """matplotlib.pyplot for a chart file, or None (saying so) where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print(f"{tool}: no matplotlib; no chart", file=sys.stderr)
        return None


def save_chart(fig, path):
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
