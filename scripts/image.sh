#!/bin/bash
# Assembles an OCI image of snag without a container engine or a registry: the
# release binary, and from this machine's Debian packages only the files of those it
# needs at run time (libc6, libgcc-s1, ca-certificates), as one reproducible layer.
#
#   scripts/image.sh [OUT]          # default OUT: target/image
#   SNAG_BIN=PATH scripts/image.sh  # another build of snag than target/release/snag
#
# OUT/ is an OCI image layout and OUT.tar the same as an OCI archive, which
# `podman load -i`, `docker load -i` (Docker 25+) and `skopeo copy oci-archive:OUT.tar
# docker://REGISTRY/snag:VERSION` take. The image runs as nobody (65534), snag is
# its entrypoint, and /results is a directory for shard results.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/image}
bin=${SNAG_BIN:-target/release/snag}
for tool in dpkg tar gzip python3; do
  command -v "$tool" >/dev/null || { echo "image.sh: needs $tool" >&2; exit 1; }
done
if [ ! -x "$bin" ]; then
  [ -z "${SNAG_BIN:-}" ] || { echo "image.sh: SNAG_BIN=$bin is not an executable" >&2; exit 1; }
  cargo build --release
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"

# What the binary loads, from the packages that ship it; nothing else of them.
packages=(libc6 libgcc-s1 ca-certificates)
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || { echo "image.sh: Debian package $p is not installed" >&2; exit 1; }
done
# Each file at its real place: on a merged-/usr system /lib is a link to usr/lib, so
# the packages' /lib/… paths are stored under usr/lib/… and the links added after.
dpkg -L "${packages[@]}" | while read -r path; do
  # Files and links only (directories come with them), no documentation.
  [ -d "$path" ] && [ ! -L "$path" ] && continue
  case $path in /usr/share/doc/* | /usr/share/lintian/* | /usr/share/man/* | /usr/sbin/* | /etc/ca-certificates/*) continue ;; esac
  [ -e "$path" ] || [ -L "$path" ] || continue
  dir=$(cd "$(dirname "$path")" && pwd -P)
  echo "${dir#/}/$(basename "$path")"
done | sort -u > "$work/files"
tar -C / --no-recursion -cf - -T "$work/files" 2> >(grep -v "Removing leading" >&2) | tar -C "$root" -xf -
for top in bin sbin lib lib64; do
  if [ -L "/$top" ]; then ln -s "$(readlink "/$top")" "$root/$top"; fi
done
# ca-certificates builds its bundle when installed; the image takes this machine's.
mkdir -p "$root/etc/ssl/certs" "$root/usr/local/bin" "$root/tmp" "$root/results"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
install -m 0755 "$bin" "$root/usr/local/bin/snag"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
chmod 1777 "$root/tmp"
chmod 0777 "$root/results"

# Sorted names, fixed times and owners: the same inputs give the same digests.
tar -C "$root" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" .
gzip -n < "$work/layer.tar" > "$work/layer.tar.gz"

version=$("$bin" --version | awk '{print $2}')
versions=$(dpkg-query -W -f '${Package}=${Version} ' "${packages[@]}")
rm -rf "$out" "$out.tar"
mkdir -p "$out/blobs/sha256"
python3 - "$work" "$out" "$version" "$versions" <<'PY'
import hashlib, json, os, shutil, sys
work, out, version, versions = sys.argv[1:5]

def blob(data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(out, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}

with open(os.path.join(work, "layer.tar"), "rb") as f:
    diff_id = "sha256:" + hashlib.sha256(f.read()).hexdigest()
with open(os.path.join(work, "layer.tar.gz"), "rb") as f:
    layer = blob(f.read())
labels = {
    "org.opencontainers.image.title": "snag",
    "org.opencontainers.image.version": version,
    "org.opencontainers.image.description": "fault-injection interposer and load-balancer test bench",
    "org.debian.packages": versions.strip(),
}
config = {
    "architecture": "amd64",
    "os": "linux",
    "created": "1970-01-01T00:00:00Z",
    "config": {
        "User": "65534:65534",
        "Entrypoint": ["/usr/local/bin/snag"],
        "Cmd": ["--help"],
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
        "WorkingDir": "/tmp",
        "Labels": labels,
    },
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "scripts/image.sh"}],
}
config_blob = blob(json.dumps(config, sort_keys=True).encode())
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_blob},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    "annotations": labels,
}
manifest_blob = blob(json.dumps(manifest, sort_keys=True).encode())
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **manifest_blob,
        "annotations": {"org.opencontainers.image.ref.name": "snag:" + version},
    }],
}
with open(os.path.join(out, "index.json"), "w") as f:
    json.dump(index, f, sort_keys=True)
with open(os.path.join(out, "oci-layout"), "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
print(f"snag:{version} {manifest_blob['digest']} layer {layer['size'] / 1e6:.1f} MB ({versions.strip()})")
PY
tar -C "$out" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out.tar" .
echo "image: $out/ (OCI layout) and $out.tar (OCI archive)"
