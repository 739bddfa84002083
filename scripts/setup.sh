#!/usr/bin/env bash
# Installs what vectorlb needs to build and test on Debian. Idempotent: re-running it changes
# nothing once everything is present. Run as root (CI and `make demo` call it).
#   scripts/setup.sh            build, test, demo
#   scripts/setup.sh --bench    also what `make bench` uses: valgrind (the pipeline's profile),
#                               perf (the daemon's), matplotlib (the charts) and iperf3 (the
#                               pod network's throughput, `make bench-pods`)
set -euo pipefail

# Build: a C compiler, DPDK 22.11 (its PMDs come with libdpdk-dev's dependencies), libbpf and
# clang for the XDP program. Run time and tests: iproute2 (ip netns), ethtool, nginx, wrk,
# curl, tcpdump, ping, keepalived (VRRP for the HA tests), chromium (the status page's test
# loads the page in headless Chromium; the demo takes its screenshot), nghttp2-client (the
# proxy's HTTP/2 tests: curl 7.88 cannot reuse an h2c connection); the peers the benchmarks compare
# with: nftables, HAProxy, nginx's stream module, dpdk-testpmd (dpdk-dev); memcached (the
# queue-set experiment's server, and memcache-load's tests); bird2 (the BGP speaker the daemon
# runs for scale-out); frr (the router of the scale-out test and demo: another BGP
# implementation than the nodes', with BFD and multipath); containerd, runc and
# containernetworking-plugins (the real kubelet's runtime and its Pods' CNI bridge and host-local
# IPAM in the Kubernetes tests; the tests start their own containerd, none is left running);
# busybox-static, wget, bind9-dnsutils (dig) and netcat-openbsd: the tools inside the images the
# Kubernetes e2e suite runs (scripts/k8s-e2e.sh builds them from these binaries);
# python3-h2 (another HTTP/2 implementation, the mesh tunnels' interop test); python3-pip where
# Python has no pip (crypto_mb below).
PKGS=(build-essential pkg-config ca-certificates openssl python3 libdpdk-dev dpdk libbpf-dev clang
      iproute2 ethtool nginx-light wrk curl tcpdump iputils-ping procps keepalived
      nftables haproxy libnginx-mod-stream dpdk-dev chromium fonts-dejavu-core nghttp2-client python3-h2 memcached bird2 frr
      containerd runc containernetworking-plugins busybox-static wget bind9-dnsutils netcat-openbsd)
[ "${1:-}" = --bench ] && PKGS+=(valgrind python3-matplotlib linux-perf iperf3)
need_apt=()
for pkg in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing packages: ${need_apt[*]} (run as root to install them)" >&2
        exit 1
    fi
    echo "setup: installing ${need_apt[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # Do not let package installation start nginx or FRR in the host's namespace.
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    [ "$created_policy" = 1 ] && rm -f "$policy"
fi

# Huge pages for DPDK: reserve 512 x 2 MiB (1 GiB) unless enough are reserved, and mount
# hugetlbfs. Both are idempotent.
if [ "$(id -u)" -eq 0 ]; then
    want=${VECTORLB_HUGEPAGES:-512}
    hp=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
    if [ -w "$hp" ] && [ "$(cat "$hp")" -lt "$want" ]; then
        echo "$want" > "$hp" || true
    fi
    if ! grep -qs "hugetlbfs" /proc/mounts; then
        mkdir -p /dev/hugepages
        mount -t hugetlbfs nodev /dev/hugepages 2>/dev/null || true
    fi
    free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
    if [ "${free:-0}" -lt 64 ]; then
        echo "setup: warning: only ${free:-0} free huge pages; vectorlb run needs some (echo 512 > $hp)" >&2
    fi
    # bpffs for BPF tools (the XDP program itself needs none).
    grep -qs " /sys/fs/bpf " /proc/mounts || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
fi

# Intel's crypto_mb for the proxy's `cryptomb` provider: the static library and headers from
# the ipp-crypto Python packages, installed under /opt/vectorlb/crypto_mb (crates/proxy/build.rs
# links it from there; without it the build goes on and the provider says crypto_mb is
# unavailable). Pinned so that builds are repeatable; skipped where it is already there.
CRYPTO_MB_VERSION=2026.2.0
CRYPTO_MB_DIR=/opt/vectorlb/crypto_mb
if [ "$(uname -m)" = x86_64 ] && [ ! -f "$CRYPTO_MB_DIR/lib/libcrypto_mb.a" ]; then
    py=$(command -v python3 || true)
    if [ -n "$py" ] && ! "$py" -m pip --version >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null || true
    fi
    if [ -n "$py" ] && "$py" -m pip --version >/dev/null 2>&1; then
        extra=()
        "$py" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages && extra+=(--break-system-packages)
        echo "setup: installing crypto_mb (ipp-crypto $CRYPTO_MB_VERSION) under $CRYPTO_MB_DIR"
        "$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "${extra[@]}" --prefix "$CRYPTO_MB_DIR" \
            "ipp-crypto==$CRYPTO_MB_VERSION" "ipp-crypto-include==$CRYPTO_MB_VERSION" "ipp-crypto-static==$CRYPTO_MB_VERSION" \
            || echo "setup: warning: could not install crypto_mb; the cryptomb provider will run only its portable backend" >&2
    else
        echo "setup: warning: no pip; the cryptomb provider will run only its portable backend" >&2
    fi
fi

# Peers of the proxy's tests that Debian does not package: the gRPC client and servers of the
# `grpcio` Python package (in /opt/vectorlb/pylib, used with PYTHONPATH), and h2spec, the
# HTTP/2 conformance suite, a Go module (in /opt/vectorlb/bin). Pinned, installed once.
GRPCIO_VERSION=1.85.3
H2SPEC_VERSION=v2.2.1+incompatible
if [ ! -d /opt/vectorlb/pylib/grpc ] && command -v python3 >/dev/null 2>&1; then
    echo "setup: installing grpcio $GRPCIO_VERSION under /opt/vectorlb/pylib"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target /opt/vectorlb/pylib "grpcio==$GRPCIO_VERSION" \
        || echo "setup: warning: could not install grpcio; the proxy's gRPC test will fail" >&2
fi
if [ ! -x /opt/vectorlb/bin/h2spec ]; then
    if command -v go >/dev/null 2>&1; then
        echo "setup: installing h2spec $H2SPEC_VERSION under /opt/vectorlb/bin"
        GOBIN=/opt/vectorlb/bin GOFLAGS=-mod=mod go install "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC_VERSION" \
            || echo "setup: warning: could not install h2spec; the proxy's HTTP/2 conformance test will fail" >&2
    else
        echo "setup: warning: no Go toolchain; the proxy's HTTP/2 conformance test needs h2spec (go install github.com/summerwind/h2spec/cmd/h2spec)" >&2
    fi
fi

# The gRPC backend of the proxy's benchmark (bench/peers/grpc-health-server: grpc-go's health
# service), for `make bench` / `make bench-tls` only.
if [ "${1:-}" = --bench ] && [ ! -x /opt/vectorlb/bin/grpc-health-server ] && command -v go >/dev/null 2>&1; then
    echo "setup: building bench/peers/grpc-health-server into /opt/vectorlb/bin"
    (cd "$(dirname "$0")/../bench/peers/grpc-health-server" && go build -o /opt/vectorlb/bin/grpc-health-server .) \
        || echo "setup: warning: could not build grpc-health-server; the gRPC benchmark is skipped" >&2
fi

# Rust: use the toolchain on PATH (rustup's in ~/.cargo/bin included); Debian's own cargo as a
# last resort. The workspace needs Rust >= 1.80.
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: no cargo on PATH; installing Debian's rustc and cargo"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustc cargo >/dev/null
fi
ver=$(rustc --version | awk '{print $2}')
major=${ver%%.*}
rest=${ver#*.}
minor=${rest%%.*}
if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 80 ]; }; then
    echo "setup: rustc $ver is too old; vectorlb needs 1.80 or newer (rustup.rs)" >&2
    exit 1
fi
# clippy (the lints CI runs): rustup's component where rustup manages the toolchain.
if ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup component add clippy
    else
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rust-clippy >/dev/null || echo "setup: warning: no clippy (cargo clippy)" >&2
    fi
fi
# rustfmt (CI checks the format, rustfmt.toml).
if ! cargo fmt --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup component add rustfmt
    else
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustfmt >/dev/null || echo "setup: warning: no rustfmt (cargo fmt)" >&2
    fi
fi
echo "setup: ok (rustc $ver, $(cargo --version | awk '{print $2}'))"
