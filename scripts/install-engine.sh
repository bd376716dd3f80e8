#!/usr/bin/env bash
# Install and start a Docker engine plus the buildx plugin on a Debian 12 (bookworm) machine that
# has only the docker client and no container registry (see shared/reference/docker-engine.md):
#   - runc, containerd, iptables, tini from bookworm (plain apt-get);
#   - dockerd, docker-proxy (docker.io) and the buildx plugin (docker-buildx) from Debian 13
#     "trixie", fetched through a private apt sources list that points at the mirror this machine
#     already uses (read at run time from /etc/apt/sources.list.d/debian.sources);
#   - dockerd started in the background, logging to /var/log/imagegen-dockerd.log.
# Idempotent: exits at once when `docker info` and `docker buildx version` both answer. Needs root.
# Runs without a TTY or stdin (CI: `bash scripts/install-engine.sh`).
#
# Environment (all optional):
#   IMAGEGEN_ENGINE_CACHE   where .debs and extracted files are kept (/var/cache/imagegen-engine)
#   IMAGEGEN_DOCKERD_LOG    dockerd's log file (/var/log/imagegen-dockerd.log)
#   IMAGEGEN_ENGINE_SUITE   Debian suite to take docker.io/docker-buildx from (trixie)
set -euo pipefail
exec </dev/null

CACHE=${IMAGEGEN_ENGINE_CACHE:-/var/cache/imagegen-engine}
LOG=${IMAGEGEN_DOCKERD_LOG:-/var/log/imagegen-dockerd.log}
SUITE=${IMAGEGEN_ENGINE_SUITE:-trixie}
SOURCES=/etc/apt/sources.list.d/debian.sources
BIN_DIR=/usr/local/sbin
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
WAIT_S=60
START=$SECONDS
export DEBIAN_FRONTEND=noninteractive

say() { echo "install-engine: $*"; }

# die REASON: print the tail of the failing step's log (apt, or dockerd's), then one line of reason, then one line of reason, exit 1.
STEP_LOG=""
DOCKERD_STAGE=""   # set once dockerd is being started: die then shows its log
die() {
    if [ -n "$STEP_LOG" ] && [ -s "$STEP_LOG" ]; then
        echo "--- tail of $STEP_LOG ---" >&2
        tail -n 20 "$STEP_LOG" >&2
    fi
    if [ -n "$DOCKERD_STAGE" ] && [ -s "$LOG" ]; then
        echo "--- tail of $LOG ---" >&2
        tail -n 20 "$LOG" >&2
    fi
    echo "install-engine: FAILED: $*" >&2
    exit 1
}

engine_ok() { docker info >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1; }

# quiet CMD...: run CMD with its output in $CACHE/step.log (shown by die on failure).
quiet() { STEP_LOG=$CACHE/step.log; "$@" >"$STEP_LOG" 2>&1 || return; STEP_LOG=""; }

if engine_ok; then
    say "engine already running: $(docker version --format 'engine {{.Server.Version}}'), $(docker buildx version)"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages and starts dockerd)"
command -v docker >/dev/null || die "no docker client on PATH"
command -v apt-get >/dev/null || die "not a Debian/apt machine"
mkdir -p "$CACHE" "$BIN_DIR" "$PLUGIN_DIR" "$(dirname "$LOG")"

# shellcheck source=lib/debian-mirror.sh
. "$(dirname "$0")/lib/debian-mirror.sh"

# 1. runc, containerd, iptables, tini from the machine's own release (trixie's runc needs GLIBC 2.38);
# pigz, whose unpigz dockerd uses to decompress pulled layers when it is on PATH (moby's pkg/archive),
# in a process of its own instead of Go's gzip on the daemon's thread: a builder image is ~8 GB.
need=()
for p in runc containerd iptables tini pigz; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]}"
    quiet apt-get update -q || die "apt-get update failed"
    quiet apt-get install -y -q --no-install-recommends "${need[@]}" || die "apt-get install ${need[*]} failed"
fi

# 2. docker.io and docker-buildx .debs from $SUITE through a private sources list (cached).
DEBS=$CACHE/debs
mkdir -p "$DEBS"
have_debs() { compgen -G "$DEBS/docker.io_*.deb" >/dev/null && compgen -G "$DEBS/docker-buildx_*.deb" >/dev/null; }
if ! have_debs; then
    uri=$(mirror_uri) || die "no Debian mirror URI found in $SOURCES"
    APT=$CACHE/apt
    mkdir -p "$APT/lists/partial"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    if [ -r "$keyring" ]; then
        echo "deb [signed-by=$keyring] $uri $SUITE main" >"$APT/sources.list"
    else
        echo "deb $uri $SUITE main" >"$APT/sources.list"
    fi
    apt_private=(apt-get -q -o "Dir::State::Lists=$APT/lists" -o "Dir::Etc::SourceList=$APT/sources.list"
                 -o Dir::Etc::SourceParts=/nonexistent -o APT::Sandbox::User=root)
    say "fetching docker.io docker-buildx from $SUITE ($uri)"
    quiet "${apt_private[@]}" update || die "apt-get update of $SUITE failed"
    # download into a scratch dir first so that a half-finished download is never taken as cached
    rm -rf "$DEBS.part" && mkdir -p "$DEBS.part"
    (cd "$DEBS.part" && quiet "${apt_private[@]}" download docker.io docker-buildx) \
        || die "apt-get download docker.io docker-buildx from $SUITE failed"
    mv "$DEBS.part"/*.deb "$DEBS"/ && rm -rf "$DEBS.part"
    have_debs || die "docker.io / docker-buildx .debs missing after download"
fi

# 3. Extract and install dockerd, docker-proxy, docker-init and the buildx plugin.
ROOT=$CACHE/root
if [ ! -x "$ROOT/usr/sbin/dockerd" ] || [ ! -x "$ROOT/usr/libexec/docker/cli-plugins/docker-buildx" ]; then
    rm -rf "$ROOT" && mkdir -p "$ROOT"
    for d in "$DEBS"/docker.io_*.deb "$DEBS"/docker-buildx_*.deb; do
        dpkg -x "$d" "$ROOT" || die "dpkg -x $d failed"
    done
fi
install -m 0755 "$ROOT/usr/sbin/dockerd" "$ROOT/usr/sbin/docker-proxy" "$BIN_DIR/" || die "installing dockerd failed"
install -m 0755 "$ROOT/usr/libexec/docker/cli-plugins/docker-buildx" "$PLUGIN_DIR/" || die "installing buildx failed"
# `docker run --init` looks for docker-init on PATH; Debian's docker.io points it at tini-static.
tini_bin=$(command -v tini-static || command -v tini || true)
[ -z "$tini_bin" ] || [ -e "$BIN_DIR/docker-init" ] || ln -s "$tini_bin" "$BIN_DIR/docker-init"
docker buildx version >/dev/null 2>&1 || die "docker buildx does not run (plugin in $PLUGIN_DIR)"

# 4. Start dockerd (unless one is already running, e.g. still starting up) and wait for it.
export PATH="$BIN_DIR:$PATH"
running_pid=""
if [ -r /var/run/docker.pid ]; then
    pid=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
        running_pid=$pid
    fi
fi
if [ -n "$running_pid" ]; then
    say "dockerd already running (pid $running_pid), waiting for it"
    dpid=$running_pid
else
    say "starting dockerd (log: $LOG)"
    : >"$LOG"
    setsid "$BIN_DIR/dockerd" >>"$LOG" 2>&1 </dev/null &
    dpid=$!
fi
STEP_LOG=""
DOCKERD_STAGE=1
for _ in $(seq "$WAIT_S"); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$dpid" 2>/dev/null || die "dockerd exited during start-up"
    sleep 1
done
docker info >/dev/null 2>&1 || die "dockerd did not answer within ${WAIT_S}s"

docker version --format 'client {{.Client.Version}}, engine {{.Server.Version}} (API {{.Server.APIVersion}})'
docker buildx version
say "ready in $((SECONDS - START))s"
