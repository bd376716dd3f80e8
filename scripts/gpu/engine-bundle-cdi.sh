#!/usr/bin/env bash
# The engine bundle for the GPU check inside a build (docs/records/verification.md, "GPU in containers", item 3):
# BuildKit hands a build step a CDI device (`RUN --device=nvidia.com/gpu=all`) from Docker 27+ with
# buildx 0.22+, and the Dockerfile instruction is in the frontend's labs channel only, whose image
# (docker/dockerfile:1.x-labs) comes from a registry the device cannot reach. So:
#   - dockerd, docker and docker-buildx from Debian sid (28.5.2, 0.29.1; Debian trixie's are 26.1.5
#     and 0.13.1, too old); containerd, its shim and runc stay those of .src/engine-b;
#   - the labs Dockerfile frontend built here from moby/buildkit's tag dockerfile/1.19.0-labs with
#     Debian trixie's Go 1.24 and the build tags of that channel (frontend/dockerfile/release/labs/tags).
#   scripts/gpu/engine-bundle-cdi.sh BUILDKIT_CLONE    ->  .src/engine-c (about 51 MiB: one call's carry)
# On the device: `engine.sh unpack .src/engine-b`, then `engine.sh unpack .src/engine-c` and
# `container_proof_bg.sh start SRC OUT bakegpu` (which makes the frontend image and the CDI spec).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
clone=${1:?usage: engine-bundle-cdi.sh BUILDKIT_CLONE (a clone of github.com/moby/buildkit)}
tag=${IMAGEGEN_FRONTEND_TAG:-dockerfile/1.19.0-labs}
mirror=${IMAGEGEN_DEBIAN_MIRROR:-https://deb.debian.org/debian}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
get() {  # get SUITE PACKAGE...: each package's .deb from SUITE's index, unpacked under $work/root
    local suite=$1; shift
    [ -f "$work/$suite.Packages" ] || curl -fsSL "$mirror/dists/$suite/main/binary-amd64/Packages.xz" | xz -dc > "$work/$suite.Packages"
    for pkg in "$@"; do
        local file
        file=$(awk -v p="$pkg" '$1 == "Package:" {hit = ($2 == p)} hit && $1 == "Filename:" {print $2; exit}' "$work/$suite.Packages")
        [ -n "$file" ] || { echo "engine-bundle-cdi: no $pkg in $suite" >&2; exit 1; }
        curl -fsSL -o "$work/$pkg.deb" "$mirror/$file"
        dpkg -x "$work/$pkg.deb" "$work/root"
        echo "engine-bundle-cdi: $(basename "$file")"
    done
}
get sid docker.io docker-cli docker-buildx
get trixie golang-1.24-go golang-1.24-src
mkdir -p "$work/buildkit"
git -C "$clone" archive "$tag" | tar -x -C "$work/buildkit"
tags=$(tr '\n' ' ' < "$work/buildkit/frontend/dockerfile/release/labs/tags")
( cd "$work/buildkit" && GOROOT=$work/root/usr/lib/go-1.24 GOFLAGS=-mod=vendor CGO_ENABLED=0 GOTOOLCHAIN=local \
    GOCACHE=$work/gocache "$work/root/usr/lib/go-1.24/bin/go" build -tags "$tags" -o "$work/dockerfile-frontend" \
    ./frontend/dockerfile/cmd/dockerfile-frontend )
echo "engine-bundle-cdi: dockerfile-frontend ($tag, tags: $tags)"
dest=$here/.src/engine-c
mkdir -p "$dest"
for bin in "$work/root/usr/sbin/dockerd" "$work/root/usr/bin/docker" \
           "$work/root/usr/libexec/docker/cli-plugins/docker-buildx" "$work/dockerfile-frontend"; do
    xz -6 -T0 -c "$bin" > "$dest/$(basename "$bin").xz"
done
du -sh "$dest"
