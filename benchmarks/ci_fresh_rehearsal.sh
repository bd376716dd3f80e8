#!/usr/bin/env bash
# Rehearse CI on a fresh machine (issue 31): put this machine back to what a fresh one of the dev kind
# has (a docker client and nothing else: no engine, no registry, no QEMU, no caches), then run
# `.ci/run` on a clean clone of main and keep its log. What it removes is exactly what scripts/test.sh
# and the suite install or leave: the engine's binaries, packages and data (/var/lib/docker: every
# image and the build cache), the registry and tool packages, debootstrap, apt's downloaded .debs, and
# the pip and uv caches. Destructive: it asks for --yes.
#
#   bash benchmarks/ci_fresh_rehearsal.sh --yes [REPO (default: this checkout)] [BRANCH (default: main)]
#
# Prints the set-up split (test.sh's lines), pytest's run budget and the wall time; the whole log is
# in /tmp/ci-fresh-rehearsal.log. Results go to benchmarks/RESULTS.md by hand.
set -euo pipefail
[ "${1:-}" = "--yes" ] || { echo "ci_fresh_rehearsal: removes the Docker engine and all its data; run with --yes" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "ci_fresh_rehearsal: must run as root" >&2; exit 2; }
REPO=${2:-$(cd "$(dirname "$0")/.." && pwd)}
BRANCH=${3:-main}
LOG=/tmp/ci-fresh-rehearsal.log
export DEBIAN_FRONTEND=noninteractive

say() { echo "ci_fresh_rehearsal: $*" >&2; }

# 1. The engine (and any second dockerd a killed test left), its data and binaries.
for pidfile in /var/run/docker.pid /run/imagegen-dockerd2/docker.pid; do
    if [ -s "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
done
for _ in $(seq 30); do pgrep -x dockerd > /dev/null || break; sleep 1; done
pkill -x containerd 2>/dev/null || true
pkill -f docker-registry 2>/dev/null || true
sleep 2
for m in $(awk '$2 ~ "^/var/lib/docker|^/run/docker|^/var/lib/imagegen-dockerd2" {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
done
rm -rf /var/lib/docker /var/lib/containerd /var/lib/imagegen-dockerd2 /run/docker /run/imagegen-dockerd2 \
       /var/cache/imagegen-engine /var/cache/imagegen-registry /var/cache/imagegen-tests /var/log/imagegen-dockerd.log \
       /usr/local/sbin/dockerd /usr/local/sbin/docker-proxy /usr/local/lib/docker/cli-plugins/docker-buildx \
       "$HOME/.docker/contexts" "$HOME/.docker/buildx"
# 2. The packages the scripts install (none of them is on a fresh machine), apt's .debs, QEMU handlers.
apt-get purge -y -q runc containerd iptables tini pigz docker-registry apache2-utils ccache debootstrap qemu-user-static \
    > /dev/null 2>&1 || true
apt-get autoremove -y -q > /dev/null 2>&1 || true
rm -f /var/cache/apt/archives/*.deb
for f in /proc/sys/fs/binfmt_misc/qemu-*; do [ -e "$f" ] && echo -1 > "$f"; done
# 3. Download caches.
rm -rf "$HOME/.cache/pip" "$HOME/.cache/uv"
say "machine reset: docker $(docker --version 2>/dev/null | cut -d, -f1 || echo missing) (client only), no engine"

# 4. A clean clone, then CI's own command.
clone=$(mktemp -d /tmp/ci-fresh.XXXXXX)
chmod 755 "$clone"  # as a CI checkout is: a test runs the CLI as `nobody` (mktemp -d makes it 0700)
git clone -q --branch "$BRANCH" "$REPO" "$clone/repo"
say "running .ci/run in $clone/repo (log: $LOG)"
start=$SECONDS
rc=0
(cd "$clone/repo" && bash .ci/run) > "$LOG" 2>&1 || rc=$?
wall=$((SECONDS - start))
grep -E "^(test\.sh|install-engine|install-registry|make-base-image|\.ci/run):" "$LOG" || true
sed -n '/= run budget =/,/^[0-9]* passed\|failed\|error/p' "$LOG" | head -20
tail -3 "$LOG"
say "exit $rc, wall $wall s ($((wall / 60)) min)"
rm -rf "$clone"
exit $rc
