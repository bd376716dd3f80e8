#!/usr/bin/env bash
# Build a minimal Debian bookworm base image without any container registry:
#   debootstrap --variant=minbase bookworm <tmpdir> <this machine's Debian mirror>
#   tar -C <tmpdir> -c . | docker import - NAME:TAG
# The image has what is needed to `python3 -m venv`, pip-install torch and compile a torch
# C++/CUDA extension (python3, python3-venv, python3-dev, ca-certificates, git, g++, make).
# Usage: bash scripts/make-base-image.sh [NAME:TAG] [amd64|arm64] [bookworm|noble]   (default
# imagegen-test/python:3.11-bookworm, this machine's architecture, bookworm). arm64 on an x86_64 machine
# runs debootstrap's second stage under QEMU (scripts/install-qemu.sh first) and imports the image as
# linux/arm64. noble is Ubuntu 24.04 (Python 3.12, which no Debian suite has), from Ubuntu's own archive
# (http://archive.ubuntu.com/ubuntu, checked with Debian's ubuntu-keyring), e.g.
#   bash scripts/make-base-image.sh imagegen-test/python:3.12-noble amd64 noble
# Skips the work if the image already exists. Needs root and a running engine
# (scripts/install-engine.sh). The mirror is read from /etc/apt/sources.list.d/debian.sources.
set -euo pipefail
exec </dev/null

IMAGE=${1:-imagegen-test/python:3.11-bookworm}
ARCH=${2:-$(dpkg --print-architecture)}
case $ARCH in amd64|arm64) ;; *) echo "make-base-image: architecture $ARCH: use amd64 or arm64" >&2; exit 2 ;; esac
SUITE=${3:-bookworm}
case $SUITE in bookworm|noble) ;; *) echo "make-base-image: suite $SUITE: use bookworm or noble" >&2; exit 2 ;; esac
PACKAGES=python3,python3-venv,python3-dev,ca-certificates,git,g++,make
SOURCES=/etc/apt/sources.list.d/debian.sources
START=$SECONDS
export DEBIAN_FRONTEND=noninteractive

STEP_LOG=""
die() {
    if [ -n "$STEP_LOG" ] && [ -s "$STEP_LOG" ]; then
        echo "--- tail of $STEP_LOG ---" >&2
        tail -n 20 "$STEP_LOG" >&2
    fi
    echo "make-base-image: FAILED: $*" >&2
    exit 1
}
say() { echo "make-base-image: $*"; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    have=$(docker image inspect -f '{{.Architecture}}' "$IMAGE")
    [ "$have" = "$ARCH" ] || die "$IMAGE exists for $have, not $ARCH: remove it or name another tag"
    say "$IMAGE already exists"
    exit 0
fi
if [ "$ARCH" != "$(dpkg --print-architecture)" ] && ! grep -qs '^enabled' "/proc/sys/fs/binfmt_misc/qemu-${ARCH/arm64/aarch64}"; then
    die "$ARCH needs QEMU user emulation here: run scripts/install-qemu.sh first"
fi
docker info >/dev/null 2>&1 || die "no Docker engine answers (run scripts/install-engine.sh first)"
[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap)"

# shellcheck source=../imagegen/resources/setup/lib/debian-mirror.sh
. "$(dirname "$0")/../imagegen/resources/setup/lib/debian-mirror.sh"
KEYRING=()
# Ubuntu's archive key, from its own keyring package (Debian bookworm has none), fetched over HTTPS at a
# pinned sha256 (noble's ubuntu-keyring 2023.11.28.1): debootstrap checks every Release file against it.
UBUNTU_KEYRING_DEB=https://archive.ubuntu.com/ubuntu/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb
UBUNTU_KEYRING_SHA256=36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8
if [ "$SUITE" = noble ]; then
    [ "$ARCH" = amd64 ] || die "noble: amd64 only (arm64 lives on ports.ubuntu.com)"
    MIRROR=http://archive.ubuntu.com/ubuntu
else
    MIRROR=$(mirror_uri "$SUITE") || die "no Debian mirror URI found in $SOURCES"
fi

TMP=$(mktemp -d /var/tmp/imagegen-base.XXXXXX)
STEP_LOG=$TMP.log
cleanup() {
    # debootstrap mounts proc/sys inside the target; never rm -rf through a mount point.
    local m
    for m in $(awk -v t="$TMP/" 'index($2, t) == 1 { print $2 }' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf --one-file-system "$TMP" "$TMP.log"
}
trap cleanup EXIT

if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    apt-get install -y -q --no-install-recommends debootstrap >"$STEP_LOG" 2>&1 \
        || { apt-get update -q >"$STEP_LOG" 2>&1 && apt-get install -y -q --no-install-recommends debootstrap >"$STEP_LOG" 2>&1; } \
        || die "apt-get install debootstrap failed"
fi
if [ "$SUITE" = noble ]; then
    curl -fsS --proto '=https' --max-time 120 -o "$TMP/keyring.deb" "$UBUNTU_KEYRING_DEB" 2>"$STEP_LOG" \
        || die "cannot download $UBUNTU_KEYRING_DEB"
    echo "$UBUNTU_KEYRING_SHA256  $TMP/keyring.deb" | sha256sum -c --quiet - >"$STEP_LOG" 2>&1 \
        || die "$UBUNTU_KEYRING_DEB: not the pinned sha256"
    dpkg-deb -x "$TMP/keyring.deb" "$TMP/keyring" && [ -s "$TMP/keyring/usr/share/keyrings/ubuntu-archive-keyring.gpg" ] \
        || die "no ubuntu-archive-keyring.gpg in $UBUNTU_KEYRING_DEB"
    # python3-venv's ensurepip wheels are in universe
    KEYRING=(--keyring="$TMP/keyring/usr/share/keyrings/ubuntu-archive-keyring.gpg" --components=main,universe)
fi
# Debian's debootstrap may predate the suite: Ubuntu's releases all use the gutsy script.
if [ ! -e "/usr/share/debootstrap/scripts/$SUITE" ] && [ -e /usr/share/debootstrap/scripts/gutsy ]; then
    ln -s gutsy "/usr/share/debootstrap/scripts/$SUITE"
fi

say "debootstrap $SUITE ($ARCH) from $MIRROR"
t0=$SECONDS
debootstrap --arch="$ARCH" --variant=minbase "${KEYRING[@]}" --include="$PACKAGES" "$SUITE" "$TMP/rootfs" "$MIRROR" >"$STEP_LOG" 2>&1 \
    || die "debootstrap failed (see above)"
R=$TMP/rootfs
# Slim the tree: downloaded .debs and apt lists are not needed in the image (containers run
# apt-get update themselves); device nodes come from the runtime.
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/* "$R"/dev/* "$R"/var/log/*.log \
       "$R"/var/log/apt/* "$R"/debootstrap 2>/dev/null || true
say "debootstrap done in $((SECONDS - t0))s ($(du -sh --one-file-system "$R" | cut -f1))"

t0=$SECONDS
tar --numeric-owner -C "$R" -c . | docker import --platform "linux/$ARCH" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "imagegen base: debootstrap --arch=$ARCH --variant=minbase $SUITE + $PACKAGES" \
    - "$IMAGE" >/dev/null || die "docker import failed"
say "imported $IMAGE in $((SECONDS - t0))s; total $((SECONDS - START))s"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' "$IMAGE"
