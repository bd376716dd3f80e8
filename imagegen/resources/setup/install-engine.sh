#!/usr/bin/env bash
# Install and start a Docker engine plus the buildx plugin on a Debian or Ubuntu machine (`imagegen setup
# engine` runs this file, shipped in imagegen; in a clone, scripts/install-engine.sh). On Debian:
#   - runc, containerd, iptables, tini, pigz from the machine's own release (plain apt-get);
#   - dockerd, docker-proxy (docker.io), the buildx plugin (docker-buildx) and, where there is no docker
#     client, docker-cli from Debian 13 "trixie" (Debian 12 has no docker-buildx), fetched through a
#     private apt sources list that points at the mirror this machine already uses (read at run time from
#     /etc/apt/sources.list.d/debian.sources), installed below /usr/local;
#   - the docker group (the socket's, as docker.io's own postinst makes it);
#   - dockerd started in the background, logging to /var/log/imagegen-dockerd.log (not a service: after a
#     reboot, run this again).
# On Ubuntu (and ID_LIKE=ubuntu): docker.io and docker-buildx from its own archive (universe), dockerd
# started as above unless the package's service runs it.
# Idempotent: exits at once when `docker info` and `docker buildx version` both answer. Needs root.
# Runs without a TTY or stdin (CI: `bash scripts/install-engine.sh` in a clone).
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
command -v apt-get >/dev/null || die "not a Debian or Ubuntu (apt) machine"
mkdir -p "$CACHE" "$BIN_DIR" "$PLUGIN_DIR" "$(dirname "$LOG")"

# shellcheck source=lib/debian-mirror.sh
. "$(dirname "$0")/lib/debian-mirror.sh"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
# Ubuntu and its derivatives (ID_LIKE=ubuntu) take both from their own archive; Debian 12's lacks docker-buildx.
DISTRO=" $(. /etc/os-release && echo "${ID:-debian} ${ID_LIKE:-}") "
DOCKERD=$BIN_DIR/dockerd

if [[ $DISTRO == *" ubuntu "* ]]; then
# 1-3 on Ubuntu: its own archive has docker.io (dockerd, containerd, runc and the docker client) and
# docker-buildx (universe); pigz as below.
need=()
for p in docker.io docker-buildx pigz; do installed "$p" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]}"
    quiet apt-get update -q || die "apt-get update failed"
    quiet apt-get install -y -q --no-install-recommends "${need[@]}" || die "apt-get install ${need[*]} failed" \
        "(docker-buildx is in Ubuntu's universe component: add-apt-repository universe, then run this again)"
fi
DOCKERD=$(PATH="/usr/sbin:/usr/bin:$PATH" command -v dockerd) || die "docker.io installed no dockerd"
else
# 1. runc, containerd, iptables, tini from the machine's own release (trixie's runc needs GLIBC 2.38);
# pigz, whose unpigz dockerd uses to decompress pulled layers when it is on PATH (moby's pkg/archive),
# in a process of its own instead of Go's gzip on the daemon's thread: a builder image is ~8 GB.
need=()
for p in runc containerd iptables tini pigz; do installed "$p" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]}"
    quiet apt-get update -q || die "apt-get update failed"
    quiet apt-get install -y -q --no-install-recommends "${need[@]}" || die "apt-get install ${need[*]} failed"
fi

# 2. docker.io and docker-buildx .debs (and docker-cli, the docker client, where there is none) from $SUITE
# through a private sources list (cached).
pkgs=(docker.io docker-buildx)
command -v docker >/dev/null || pkgs+=(docker-cli)
DEBS=$CACHE/debs
mkdir -p "$DEBS"
have_debs() { local p; for p in "${pkgs[@]}"; do compgen -G "$DEBS/${p}_*.deb" >/dev/null || return 1; done; }
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
    say "fetching ${pkgs[*]} from $SUITE ($uri)"
    quiet "${apt_private[@]}" update || die "apt-get update of $SUITE failed"
    # download into a scratch dir first so that a half-finished download is never taken as cached
    rm -rf "$DEBS.part" && mkdir -p "$DEBS.part"
    (cd "$DEBS.part" && quiet "${apt_private[@]}" download "${pkgs[@]}") \
        || die "apt-get download ${pkgs[*]} from $SUITE failed"
    mv "$DEBS.part"/*.deb "$DEBS"/ && rm -rf "$DEBS.part"
    have_debs || die "${pkgs[*]} .debs missing after download"
fi

# 3. Extract and install dockerd, docker-proxy, docker-init, the buildx plugin (and the docker client).
ROOT=$CACHE/root
if [ ! -x "$ROOT/usr/sbin/dockerd" ] || [ ! -x "$ROOT/usr/libexec/docker/cli-plugins/docker-buildx" ] \
        || { ! command -v docker >/dev/null && [ ! -x "$ROOT/usr/bin/docker" ]; }; then
    rm -rf "$ROOT" && mkdir -p "$ROOT"
    for p in "${pkgs[@]}"; do
        for d in "$DEBS/${p}"_*.deb; do
            dpkg -x "$d" "$ROOT" || die "dpkg -x $d failed"
        done
    done
fi
install -m 0755 "$ROOT/usr/sbin/dockerd" "$ROOT/usr/sbin/docker-proxy" "$BIN_DIR/" || die "installing dockerd failed"
install -m 0755 "$ROOT/usr/libexec/docker/cli-plugins/docker-buildx" "$PLUGIN_DIR/" || die "installing buildx failed"
if ! command -v docker >/dev/null; then
    install -m 0755 "$ROOT/usr/bin/docker" /usr/local/bin/ || die "installing the docker client failed"
fi
# `docker run --init` looks for docker-init on PATH; Debian's docker.io points it at tini-static.
tini_bin=$(command -v tini-static || command -v tini || true)
[ -z "$tini_bin" ] || [ -e "$BIN_DIR/docker-init" ] || ln -s "$tini_bin" "$BIN_DIR/docker-init"
# dockerd gives its socket to the docker group when there is one (docker.io's postinst makes it).
getent group docker >/dev/null || groupadd --system docker || die "groupadd docker failed"
fi
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
    setsid "$DOCKERD" >>"$LOG" 2>&1 </dev/null &
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
if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] && ! id -nG "$SUDO_USER" 2>/dev/null | grep -qw docker; then
    say "$SUDO_USER is not in the docker group: run docker (and imagegen build) with sudo, or add them with" \
        "usermod -aG docker $SUDO_USER and log in again (the group's members are root on this machine)"
fi
say "ready in $((SECONDS - START))s"
