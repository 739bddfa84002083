#!/usr/bin/env bash
# Builds the Pod sandbox image containerd's CRI starts for every Pod (its `sandbox_image`),
# from pause.c compiled static: nothing pulled from a registry.
#   deploy/kubernetes/image/pause.sh [OUT_TAR] [NAME:TAG]   (defaults: target/pause-image.tar,
#   vectorlb.local/pause:1)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../../target/pause-image.tar}
ref=${2:-vectorlb.local/pause:1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs"
cc -static -O2 -Wall -Werror -o "$work/rootfs/pause" "$here/pause.c"
strip "$work/rootfs/pause"
touch -d @0 "$work/rootfs/pause"
bash "$here/oci.sh" "$work/rootfs" "$out" "$ref" '["/pause"]'
