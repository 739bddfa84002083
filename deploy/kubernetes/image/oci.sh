#!/usr/bin/env bash
# Writes a root file system as a one-layer OCI image layout (oci-layout, index.json,
# blobs/sha256/...) in one tar, which `ctr images import`, `podman load` or `skopeo copy
# oci-archive:` take. Reproducible: sorted entries, zero times, root owner, gzip without a name.
#   deploy/kubernetes/image/oci.sh ROOTFS OUT_TAR NAME:TAG ENTRYPOINT_JSON [ENV_ITEMS]
#   ENTRYPOINT_JSON: a JSON array, e.g. '["/pause"]'; ENV_ITEMS: JSON strings joined by commas,
#   e.g. '"PATH=/usr/bin","A=b"' (PATH=/usr/local/bin:/usr/bin:/bin when left out).
#   OCI_CMD (environment): the image's default arguments, a JSON array (none when unset).
set -euo pipefail
root=${1:?usage: oci.sh ROOTFS OUT_TAR NAME:TAG ENTRYPOINT_JSON [ENV_ITEMS]}
out=${2:?missing OUT_TAR}
ref=${3:?missing NAME:TAG}
entry=${4:?missing ENTRYPOINT_JSON}
env=${5:-'"PATH=/usr/local/bin:/usr/bin:/bin"'}
[ -d "$root" ] || { echo "oci: $root is not a directory" >&2; exit 1; }
case $entry in \[*\]) ;; *) echo "oci: the entrypoint must be a JSON array: $entry" >&2; exit 1 ;; esac
cmd=
if [ -n "${OCI_CMD:-}" ]; then
    case $OCI_CMD in \[*\]) cmd="\"Cmd\":$OCI_CMD," ;; *) echo "oci: OCI_CMD must be a JSON array: $OCI_CMD" >&2; exit 1 ;; esac
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
blobs=$work/layout/blobs/sha256
mkdir -p "$blobs"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix --pax-option=delete=atime,delete=ctime -C "$root" -cf "$work/layer.tar" .
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -6 "$work/layer.tar"
layer=$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)
layer_size=$(stat -c %s "$work/layer.tar.gz")
mv "$work/layer.tar.gz" "$blobs/$layer"
blob() { # file -> digest (moved into the blobs)
    local d
    d=$(sha256sum "$1" | cut -d' ' -f1)
    mv "$1" "$blobs/$d"
    echo "$d"
}
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,%s"Env":[%s],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"deploy/kubernetes/image/oci.sh"}]}' \
    "$entry" "$cmd" "$env" "$diff_id" > "$work/config.json"
config_size=$(stat -c %s "$work/config.json")
config=$(blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" > "$work/manifest.json"
manifest_size=$(stat -c %s "$work/manifest.json")
manifest=$(blob "$work/manifest.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s","io.containerd.image.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$ref" "$ref" > "$work/layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$work/layout/oci-layout"
mkdir -p "$(dirname "$out")"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/layout" -cf "$out" oci-layout index.json blobs
echo "image: $ref -> $out ($(du -h "$out" | cut -f1), layer sha256:${layer:0:12}, $(find "$root" -type f | wc -l) files)" >&2
