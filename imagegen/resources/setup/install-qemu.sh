#!/usr/bin/env bash
# Run linux/arm64 containers and build steps on this x86_64 machine: Debian's qemu-user-static and
# the kernel's binfmt_misc (the F flag: the interpreter is opened once, here, so it works inside
# containers and chroots that do not have it). Root, idempotent, ~15 s cold. `imagegen setup qemu` runs
# this file, shipped in imagegen (in a clone: bash scripts/install-qemu.sh);
# then `docker buildx inspect --bootstrap` lists linux/arm64.
set -euo pipefail
exec </dev/null
say() { echo "install-qemu: $*"; }
[ "$(id -u)" -eq 0 ] || { echo "install-qemu: must run as root" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
if [ ! -x /usr/libexec/qemu-binfmt/aarch64-binfmt-P ]; then
    say "apt-get install qemu-user-static"
    apt-get install -y -q --no-install-recommends qemu-user-static >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends qemu-user-static >/dev/null; }
fi
binfmt=/proc/sys/fs/binfmt_misc
[ -e $binfmt/register ] || mount -t binfmt_misc binfmt_misc $binfmt
if [ ! -e $binfmt/qemu-aarch64 ]; then
    # The package's own entry (magic, mask, interpreter, flags OPF), as systemd-binfmt would load it.
    cat /usr/lib/binfmt.d/qemu-aarch64.conf > $binfmt/register
fi
grep -q '^flags: .*F' $binfmt/qemu-aarch64 || { echo "install-qemu: qemu-aarch64 is registered without the F flag:" \
    "containers cannot use it (echo -1 > $binfmt/qemu-aarch64, then run this again)" >&2; exit 1; }
say "linux/arm64 through $(sed -n 's/^interpreter //p' $binfmt/qemu-aarch64) ($(dpkg-query -W -f '${Version}' qemu-user-static))"
