#!/usr/bin/env python3
"""Summarises a `perf record -e cpu-clock` sample of a device under test (bench/profile-io.sh).

    profile-io-summary.py DUT PERF_DATA GEN_JSON HZ SECONDS

The data-plane thread is the one with the most samples (the worker or testpmd's forwarding
lcore). Its samples are grouped into parts (the pipeline, the worker loop, the DPDK driver, the
kernel's AF_XDP, veth, socket-buffer and copy work, ...) and turned into nanoseconds per packet
received by the generator. Prints one JSON line.
"""
import json
import subprocess
import sys

# (part, test) in order: the first test that matches names the part.
USER_PARTS = [
    ("session expiry sweep", lambda d, s: "SessionTable::sweep" in s),
    ("pipeline: parse", lambda d, s: s.startswith("vectorlb_packet::")),
    ("pipeline: sessions, services, rewrite", lambda d, s: s.startswith("vectorlb_lb::")),
    ("worker loop and mbufs (vectorlb)", lambda d, s: s.startswith("vectorlb::") or d == "vectorlb"),
    ("testpmd forwarding loop", lambda d, s: "testpmd" in d),
    ("DPDK af_xdp driver", lambda d, s: "librte_net_af_xdp" in d or "libxdp" in d or "libbpf" in d),
    ("DPDK mempool and ethdev", lambda d, s: d.startswith("librte_")),
    ("libc (system-call wrappers, memcpy)", lambda d, s: d.startswith("libc") or d == "[vdso]"),
    ("XDP program (redirect to the socket)", lambda d, s: d.startswith("bpf_prog")),
]
KERNEL_PARTS = [
    ("kernel: copies", ("memcpy", "__memcpy", "__pi_memcpy", "memmove", "__memmove", "copy_", "_copy_")),
    ("kernel: AF_XDP rings and UMEM", ("xsk_", "__xsk", "xp_", "xdp_", "bpf_")),
    ("kernel: veth, NAPI, softirq", ("veth_", "napi", "__napi", "net_rx_action", "handle_softirqs", "do_softirq",
                                     "__do_softirq", "netif_", "__netif", "dev_", "__dev_", "validate_xmit")),
    ("kernel: socket buffers and allocator", ("skb", "__skb", "kmem_cache", "kfree", "__kfree", "kmalloc", "__kmalloc",
                                              "__slab", "slab_", "page_frag", "__page_frag", "sock_wfree", "__alloc_skb",
                                              "__build_skb", "build_skb", "___slab", "free_", "__free", "put_page",
                                              "skb_", "sock_def", "__napi_build")),
    ("kernel: system-call entry and exit", ("do_syscall", "entry_", "syscall", "__x64_sys", "__sys_", "fdget", "fput",
                                            "__fget", "sockfd", "__sock_sendmsg", "sock_sendmsg", "__sys",
                                            "exit_to_user", "syscall_exit", "__rcu_read", "rcu_")),
    ("kernel: locks and interrupts", ("_raw_spin", "__raw_callee_save", "queued_spin", "native_queued", "__pv_",
                                      "_raw_read", "_raw_write")),
]


def part(dso, sym):
    if dso == "[kernel.kallsyms]" or dso.startswith("[kernel"):
        name = sym[4:] if sym.startswith("[k] ") else sym
        for p, prefixes in KERNEL_PARTS:
            if name.startswith(prefixes):
                return p
        return "kernel: other"
    name = sym[4:] if sym.startswith("[.] ") else sym
    for p, test in USER_PARTS:
        if test(dso, name):
            return p
    return "other user space"


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    dut, data, gen_json, hz, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
    gen = None
    with open(gen_json) as f:
        for line in f:
            if line.startswith("{"):
                gen = json.loads(line)
    if gen is None:
        sys.exit(f"{gen_json}: no generator result")
    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "-q", "--no-children", "-g", "none",
                          "--percent-limit", "0", "-F", "sample,comm,dso,sym", "--field-separator=\t"],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("\t")]
        if len(f) != 4 or not f[0].isdigit():
            continue
        rows.append((int(f[0]), f[1], f[2], f[3]))
    if not rows:
        sys.exit(f"{data}: no samples")
    threads = {}
    for n, comm, _, _ in rows:
        threads[comm] = threads.get(comm, 0) + n
    main_thread = max(threads, key=threads.get)
    mine = [r for r in rows if r[1] == main_thread]
    total = sum(r[0] for r in mine)
    parts = {}
    for n, _, dso, sym in mine:
        p = part(dso, sym)
        parts[p] = parts.get(p, 0) + n
    rx_pps = gen["received"] / gen["seconds"] if gen.get("seconds") else 0
    cores = total / (hz * seconds)
    ns = cores * 1e9 / rx_pps if rx_pps else 0
    user = sum(n for p, n in parts.items() if not p.startswith("kernel"))
    print(json.dumps({
        "bench": "profile_io", "dut": dut, "frame_bytes": gen.get("size", 60) + 4,
        "offered_mpps": round(gen["sent"] / gen["seconds"] / 1e6, 3), "rx_mpps": round(rx_pps / 1e6, 3),
        "loss_ratio": gen.get("loss_ratio"), "thread": main_thread, "thread_cores": round(cores, 3),
        "other_threads_cores": round(sum(v for k, v in threads.items() if k != main_thread) / (hz * seconds), 3),
        "samples": total, "hz": hz, "seconds": seconds,
        "ns_per_packet": round(ns, 1), "user_share": round(user / total, 3),
        "parts_ns_per_packet": {p: round(ns * n / total, 1) for p, n in sorted(parts.items(), key=lambda x: -x[1])},
        "top": [[sym, dso, round(n / total, 4)] for n, _, dso, sym in sorted(mine, reverse=True)[:25]],
    }))


if __name__ == "__main__":
    main()
