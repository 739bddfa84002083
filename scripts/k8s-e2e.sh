#!/usr/bin/env bash
# Builds what the Kubernetes network conformance run needs (docs/kubernetes.md, "Kubernetes' own
# network tests"), from the release pinned in tools/k8s-e2e/go.mod (the control plane's, see
# scripts/k8s-bins.sh) and CoreDNS pinned in tools/coredns/go.mod; nothing is pulled from a
# registry. Cached like scripts/k8s-bins.sh: built once per hash of the pins, the sources here
# and this script. Prints the directory holding
#   e2e.test          the suite's network packages (tools/k8s-e2e/e2e_test.go)
#   images/*.tar      OCI images named as the suite names them (ctr -n k8s.io images import):
#                     agnhost (the suite's test server and client, with busybox's shell and
#                     tools, curl, wget, dig and getent), busybox, jessie-dnsutils (dig), pause,
#                     regression-issue-74839 (the Conntrack test's server), and
#                     CoreDNS (the cluster's DNS, vectorlb.local/coredns)
#   images.txt        the images' names, one per line
#   scripts/k8s-e2e.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${VECTORLB_K8S_CACHE:-/var/cache/vectorlb/k8s}
mod=tools/k8s-e2e
release=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3} $1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' $mod/go.mod | head -1)
[ -n "$release" ] || { echo "k8s-e2e: no k8s.io/kubernetes requirement in $mod/go.mod" >&2; exit 1; }
key=$(cat $mod/go.mod $mod/go.sum $mod/e2e_test.go $mod/agnhost_tools.go tools/coredns/go.mod tools/coredns/go.sum tools/coredns/main.go \
    deploy/kubernetes/image/oci.sh deploy/kubernetes/image/pause.c deploy/kubernetes/image/pause.sh "$0" | sha256sum | cut -c1-16)
dir=$cache/e2e-$release-$key
if [ -x "$dir/e2e.test" ] && [ -s "$dir/images.txt" ]; then
    echo "$dir"
    exit 0
fi
[ "${1:-}" = --check ] && exit 1
command -v go >/dev/null 2>&1 || { echo "k8s-e2e: no Go toolchain on PATH" >&2; exit 1; }
for tool in busybox curl wget dig getent nc.openbsd ip bash; do
    command -v $tool >/dev/null 2>&1 || { echo "k8s-e2e: no $tool (scripts/setup.sh installs busybox-static, curl, wget, bind9-dnsutils, netcat-openbsd, iproute2)" >&2; exit 1; }
done
tmp=$cache/.building-e2e-$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/images" "$tmp/bin"
echo "k8s-e2e: building the Kubernetes $release network e2e suite, agnhost and CoreDNS into $dir (several minutes, once)" >&2
start=$(date +%s)
[ -n "${GOCACHE:-}" ] || export GOCACHE=$tmp/.gocache
export GOFLAGS="-buildvcs=false -modcacherw"
(
    cd "$root/$mod"
    go test -c -trimpath -o "$tmp/e2e.test" .
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/bin/agnhost" k8s.io/kubernetes/test/images/agnhost
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/bin/regression-issue-74839" k8s.io/kubernetes/test/images/regression-issue-74839
    go list -m -f '{{.Dir}}' k8s.io/kubernetes > "$tmp/kdir"
    cat "$(cat "$tmp/kdir")/test/images/agnhost/VERSION" > "$tmp/agnhost.version"
)
kdir=$(cat "$tmp/kdir")
(
    cd "$root/tools/coredns"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/bin/coredns" .
)
coredns_version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' tools/coredns/go.mod)

# The tools the suite's commands run inside its containers: busybox's applets (nslookup, seq,
# ...) and Debian's curl, GNU wget (static busybox's wget dies of SIGSEGV when given `-T`, the
# suite's timeout), dig, getent, OpenBSD's nc (the suite's `nc -v -t -w` and `-u`), ip and
# bash with the shared libraries they load; those in /usr/bin come first in PATH, before
# busybox's applets of the same name in /bin.
userland() {
    local r=$1 b lib
    mkdir -p "$r/bin" "$r/usr/bin" "$r/etc" "$r/tmp" "$r/root"
    chmod 1777 "$r/tmp"
    cp "$(command -v busybox)" "$r/bin/busybox"
    for b in curl wget dig getent nc.openbsd:nc ip bash; do
        local src=${b%%:*} dst=${b##*:}
        cp "$(command -v "$src")" "$r/usr/bin/$dst"
        for lib in $(ldd "$(command -v "$src")" | grep -oE '/[^ ]+\.so[^ ]*' | sort -u); do
            mkdir -p "$r$(dirname "$lib")"
            [ -e "$r$lib" ] || cp -L "$lib" "$r$lib"
        done
    done
    # /bin/sh is bash: busybox's shell runs its own applets before anything in PATH (its nc
    # has none of the options the suite gives).
    ln -s /usr/bin/bash "$r/bin/sh"
    # and /bin/bash, where the upstream images have it (the network-policy-api suite's Pods
    # run `/bin/bash -c ...`).
    ln -s /usr/bin/bash "$r/bin/bash"
    for b in $("$r/bin/busybox" --list); do
        [ -e "$r/bin/$b" ] || [ -e "$r/usr/bin/$b" ] || ln -s busybox "$r/bin/$b"
    done
    # libc's name service modules getent and curl load at run time.
    for lib in /lib/x86_64-linux-gnu/libnss_dns.so.2 /lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libresolv.so.2; do
        [ -e "$lib" ] && mkdir -p "$r$(dirname "$lib")" && cp -L "$lib" "$r$lib"
    done
    printf 'hosts: files dns\n' > "$r/etc/nsswitch.conf"
    printf 'passwd: files\ngroup: files\n' >> "$r/etc/nsswitch.conf"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$r/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' > "$r/etc/group"
}
image() { # NAME REF ENTRYPOINT CMD [SRC DEST]...: files added to the root file system
    local name=$1 ref=$2 entry=$3 cmd=$4 r=$tmp/rootfs-$1
    shift 4
    userland "$r"
    while [ $# -ge 2 ]; do
        mkdir -p "$r$(dirname "$2")"
        cp "$1" "$r$2"
        touch -d @0 "$r$2"
        shift 2
    done
    find "$r" -exec touch -h -d @0 {} +
    OCI_CMD=$cmd bash deploy/kubernetes/image/oci.sh "$r" "$tmp/images/$name.tar" "$ref" "$entry" '"PATH=/usr/local/bin:/usr/bin:/bin"'
    echo "$ref" >> "$tmp/images.txt"
    rm -rf "$r"
}
e2e=registry.k8s.io/e2e-test-images
# agnhost as the suite's image has it: the porter's TLS certificate and key at the root, CoreDNS
# at /coredns (its dns tests run it), /uploads, the agnhost-2 name, and user 1000.
agnhost_extra=$tmp/agnhost-extra
mkdir -p "$agnhost_extra"
printf 'root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$agnhost_extra/passwd"
printf 'root:x:0:\nuser-defined-in-image:x:1000:\nnogroup:x:65534:\n' > "$agnhost_extra/group"
: > "$agnhost_extra/keep"
image agnhost "$e2e/agnhost:$(cat "$tmp/agnhost.version")" '["/agnhost"]' '["pause"]' \
    "$tmp/bin/agnhost" /agnhost "$tmp/bin/agnhost" /agnhost-2 "$tmp/bin/coredns" /coredns \
    "$kdir/test/images/agnhost/porter/localhost.crt" /localhost.crt "$kdir/test/images/agnhost/porter/localhost.key" /localhost.key \
    "$agnhost_extra/passwd" /etc/passwd "$agnhost_extra/group" /etc/group "$agnhost_extra/keep" /uploads/.keep \
    "$agnhost_extra/keep" /home/user-defined-in-image/.keep
image busybox "$e2e/busybox:1.37.0-1" '[]' '["sh"]'
# The Conntrack test's server that sends an out-of-window segment (its tag as the suite's
# image manifest names it).
boom_tag=$(grep -o '"regression-issue-74839", "[^"]*"' "$kdir/test/utils/image/manifest.go" | cut -d'"' -f4)
[ -n "$boom_tag" ] || { echo "k8s-e2e: no regression-issue-74839 tag in the suite's image manifest" >&2; exit 1; }
image regression-issue-74839 "$e2e/regression-issue-74839:$boom_tag" '["/regression-issue-74839"]' '[]' \
    "$tmp/bin/regression-issue-74839" /regression-issue-74839
image jessie-dnsutils "$e2e/jessie-dnsutils:1.7" '[]' '["sh"]'
image coredns "vectorlb.local/coredns:$coredns_version" '["/coredns"]' '[]' "$tmp/bin/coredns" /coredns
bash deploy/kubernetes/image/pause.sh "$tmp/images/pause.tar" registry.k8s.io/pause:3.10.1
echo registry.k8s.io/pause:3.10.1 >> "$tmp/images.txt"
rm -rf "$tmp/.gocache" "$tmp/bin" "$tmp/kdir" "$agnhost_extra"
mkdir -p "$cache"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "k8s-e2e: built in $(( $(date +%s) - start )) s" >&2
echo "$dir"
