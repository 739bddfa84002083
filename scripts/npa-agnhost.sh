#!/usr/bin/env bash
# The agnhost image the network-policy-api conformance suite's Pods name, made from the one
# scripts/k8s-e2e.sh built: the same files, with one difference. The suite's base manifests give
# every Pod SCTP servers (`agnhost porter` with only SERVE_SCTP_PORT_* set), and on a kernel
# without SCTP porter exits at once, so no Pod of the suite would ever be Ready. Here such a
# porter stays up serving nothing (the suite's SCTP tests are skipped on such a machine);
# everything else is agnhost itself.
#   scripts/npa-agnhost.sh E2E_DIR NAME:TAG OUT_TAR
set -euo pipefail
cd "$(dirname "$0")/.."
e2e=$1 ref=$2 out=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/oci" "$tmp/rootfs"
tar -xf "$e2e/images/agnhost.tar" -C "$tmp/oci"
layer=$(python3 - "$tmp/oci" <<'PY'
import json, sys
d = sys.argv[1]
blob = lambda digest: f"{d}/blobs/sha256/{digest.split(':')[1]}"
index = json.load(open(f"{d}/index.json"))
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
print(blob(manifest["layers"][0]["digest"]))
PY
)
tar -xzf "$layer" -C "$tmp/rootfs"
mv "$tmp/rootfs/agnhost" "$tmp/rootfs/agnhost.real"
cat > "$tmp/rootfs/agnhost" <<'SH'
#!/bin/bash
# porter asked for SCTP servers only, on a kernel without SCTP: stay up, serve nothing.
if [ "${1:-}" = porter ] && [ ! -e /proc/net/sctp ] && env | grep -q '^SERVE_SCTP_PORT_' && ! env | grep -qE '^SERVE_(PORT|TLS_PORT)_'; then
    echo "agnhost porter: no SCTP in this kernel; serving nothing" >&2
    while :; do sleep 3600; done
fi
exec /agnhost.real "$@"
SH
chmod 755 "$tmp/rootfs/agnhost"
touch -d @0 "$tmp/rootfs/agnhost" "$tmp/rootfs/agnhost.real"
OCI_CMD='["pause"]' bash deploy/kubernetes/image/oci.sh "$tmp/rootfs" "$out" "$ref" '["/agnhost"]' '"PATH=/usr/local/bin:/usr/bin:/bin"'
