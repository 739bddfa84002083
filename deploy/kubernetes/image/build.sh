#!/usr/bin/env bash
# Builds vectorlb's container image from this machine's binaries, without a base image: an OCI
# image layout (oci-layout, index.json, blobs/sha256/...) in one tar, which `ctr images import`,
# `podman load` or `skopeo copy oci-archive:` take. One layer holds the binaries, every shared
# library they and DPDK's driver plugins load (as ldd lists them, with the dynamic loader), the
# plugins themselves, BIRD when it is installed (the daemon's BGP speaker), and empty /tmp,
# /run/vectorlb and /var/lib/vectorlb. Reproducible: sorted entries, zero times, root owner.
#   deploy/kubernetes/image/build.sh [BIN_DIR] [OUT_TAR] [NAME:TAG]
#   (defaults: target/release, target/vectorlb-image.tar, vectorlb.local/vectorlb:dev)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
bins=${1:-$repo/target/release}
out=${2:-$repo/target/vectorlb-image.tar}
ref=${3:-vectorlb.local/vectorlb:dev}
for b in vectorlb vectorlb-tools; do
    [ -x "$bins/$b" ] || { echo "image: $bins/$b is missing (cargo build --release --bins)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/run/vectorlb" "$root/var/lib/vectorlb" "$root/etc"
chmod 1777 "$root/tmp"
cp "$bins/vectorlb" "$bins/vectorlb-tools" "$root/usr/local/bin/"
files=("$root/usr/local/bin/vectorlb" "$root/usr/local/bin/vectorlb-tools")
pmd=$(ls -d /usr/lib/x86_64-linux-gnu/dpdk/pmds-* 2>/dev/null | head -1 || true)
if [ -n "$pmd" ]; then
    mkdir -p "$root$(dirname "$pmd")"
    cp -a "$pmd" "$root$(dirname "$pmd")/"
    while IFS= read -r f; do files+=("$f"); done < <(find "$root$pmd" -name '*.so*' -type f)
fi
for b in /usr/sbin/bird /usr/sbin/birdc; do
    if [ -x "$b" ]; then
        mkdir -p "$root/usr/sbin"
        cp "$b" "$root/usr/sbin/"
        files+=("$root$b")
    fi
done
# Every library each file loads, at the path the loader finds it (symlinks followed).
for f in "${files[@]}"; do
    ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^\s*\/[^ ]+ \(/ {print $1}' || true
done | sort -u | while IFS= read -r lib; do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
# The loader's usual name on x86-64 (binaries name /lib64/ld-linux-x86-64.so.2).
if [ -e /lib64/ld-linux-x86-64.so.2 ] && [ ! -e "$root/lib64/ld-linux-x86-64.so.2" ]; then
    mkdir -p "$root/lib64"
    cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
fi
printf 'root:x:0:0:root:/:/usr/local/bin/vectorlb\nnobody:x:65534:65534:nobody:/:/usr/local/bin/vectorlb\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"

pmd_env=""
[ -n "$pmd" ] && pmd_env=", \"RTE_EAL_PMD_PATH=$pmd\""
bash "$(dirname "$0")/oci.sh" "$root" "$out" "$ref" '["/usr/local/bin/vectorlb"]' "\"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/bin\"$pmd_env"
