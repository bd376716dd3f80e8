#!/usr/bin/env bash
# Make the Docker engine bundle the GPU device needs (scripts/gpu/engine.sh unpacks it there), from the
# .debs scripts/install-engine.sh fetched on this machine and its docker client:
#   .src/engine-a: dockerd, docker            (one call's carry: at most 64 MiB with the repository)
#   .src/engine-b: containerd, containerd-shim-runc-v2, runc, docker-buildx
# Each binary xz -9e compressed (about a quarter of its size). .src/ is git-ignored: name the folders in
# the device call's `carry`.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
debs=${IMAGEGEN_ENGINE_CACHE:-/var/cache/imagegen-engine}/debs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for deb in "$debs"/docker.io_*.deb "$debs"/docker-buildx_*.deb /var/cache/apt/archives/containerd_*.deb \
           /var/cache/apt/archives/runc_*.deb; do
    [ -f "$deb" ] || { echo "engine-bundle: missing $deb: run scripts/install-engine.sh first" >&2; exit 1; }
    dpkg -x "$deb" "$work/root"
done
pack() {  # pack FOLDER BINARY...
    local dest=$here/.src/$1; shift
    mkdir -p "$dest"
    for bin in "$@"; do xz -9e -T0 -c "$bin" > "$dest/$(basename "$bin").xz"; done
    du -sh "$dest"
}
pack engine-a "$work/root/usr/sbin/dockerd" "$(command -v docker)"
pack engine-b "$work/root/usr/bin/containerd" "$work/root/usr/bin/containerd-shim-runc-v2" \
    "$work/root/usr/sbin/runc" "$work/root/usr/libexec/docker/cli-plugins/docker-buildx"
