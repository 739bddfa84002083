#!/usr/bin/env bash
# Installs what vectorlb needs to build and test on Debian. Idempotent: re-running it changes
# nothing once everything is present. Run as root (CI and `make demo` call it).
set -euo pipefail

need_apt=()
for pkg in build-essential pkg-config ca-certificates; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing packages: ${need_apt[*]} (run as root to install them)" >&2
        exit 1
    fi
    echo "setup: installing ${need_apt[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
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
echo "setup: ok (rustc $ver, $(cargo --version | awk '{print $2}'))"
