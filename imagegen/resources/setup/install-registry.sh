#!/usr/bin/env bash
# Install a real container registry of this machine's own (`imagegen setup registry` runs this file,
# shipped in imagegen; in a clone, scripts/install-registry.sh, for the push/pull/lock tests):
#   - Debian's docker-registry (distribution 2.8.x, /usr/bin/docker-registry) and apache2-utils
#     (htpasswd, for bcrypt password files), with plain apt-get from this machine's own Debian
#     mirror (the one its sources list already names, as for runc/containerd in install-engine.sh);
#   - the packaged service (systemd unit / init script, default config on :5000) is kept from
#     starting during the install and left stopped and disabled: start a registry where you want it
#     (docker-registry serve CONFIG; the tests start theirs on free loopback ports).
# Idempotent: exits at once when both tools are installed and the packaged service is not running.
# Needs root. Runs without a TTY or stdin (CI: `bash scripts/install-registry.sh` in a clone).
#
# Environment (all optional):
#   IMAGEGEN_REGISTRY_CACHE   where the apt step log is kept (/var/cache/imagegen-registry)
set -euo pipefail
exec </dev/null

CACHE=${IMAGEGEN_REGISTRY_CACHE:-/var/cache/imagegen-registry}
SOURCES=/etc/apt/sources.list.d/debian.sources
REGISTRY_BIN=/usr/bin/docker-registry
PACKAGED_CONFIG=/etc/docker/registry/config.yml
POLICY=/usr/sbin/policy-rc.d
START=$SECONDS
export DEBIAN_FRONTEND=noninteractive

say() { echo "install-registry: $*"; }

# die REASON: print the tail of the failing step's log, then one line of reason, exit 1.
STEP_LOG=""
die() {
    if [ -n "$STEP_LOG" ] && [ -s "$STEP_LOG" ]; then
        echo "--- tail of $STEP_LOG ---" >&2
        tail -n 20 "$STEP_LOG" >&2
    fi
    echo "install-registry: FAILED: $*" >&2
    exit 1
}

# quiet CMD...: run CMD with its output in $CACHE/step.log (shown by die on failure).
quiet() { STEP_LOG=$CACHE/step.log; "$@" >"$STEP_LOG" 2>&1 || return; STEP_LOG=""; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
tools_ok() { [ -x "$REGISTRY_BIN" ] && command -v htpasswd >/dev/null && "$REGISTRY_BIN" --version >/dev/null 2>&1; }

# packaged_pids: pids of registries serving the packaged config (what the service would run).
packaged_pids() {
    local p cmd
    for p in /proc/[0-9]*; do
        { cmd=$(tr '\0' ' ' <"$p/cmdline"); } 2>/dev/null || continue
        case "$cmd" in
            "$REGISTRY_BIN serve $PACKAGED_CONFIG "*) echo "${p#/proc/}" ;;
        esac
    done
}

# quiet_service: stop and disable the packaged service, wherever the package may have started it.
quiet_service() {
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
    fi
    if [ -x /etc/init.d/docker-registry ]; then
        if [ -s /var/run/docker-registry.pid ]; then
            /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
            rm -f /var/run/docker-registry.pid
        fi
        command -v update-rc.d >/dev/null && update-rc.d docker-registry disable >/dev/null 2>&1 || true
    fi
    local pids
    pids=$(packaged_pids)
    if [ -n "$pids" ]; then
        say "stopping the packaged registry (pid $pids)"
        # shellcheck disable=SC2086
        kill $pids 2>/dev/null || true
        for _ in $(seq 20); do [ -z "$(packaged_pids)" ] && break; sleep 0.25; done
        [ -z "$(packaged_pids)" ] || die "the packaged docker-registry (pid $(packaged_pids)) does not stop"
    fi
}

if tools_ok && installed docker-registry && installed apache2-utils; then
    quiet_service
    say "$("$REGISTRY_BIN" --version), $(command -v htpasswd)"
    say "ready in $((SECONDS - START))s"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages)"
command -v apt-get >/dev/null || die "not a Debian/apt machine"
mkdir -p "$CACHE"

# shellcheck source=lib/debian-mirror.sh
. "$(dirname "$0")/lib/debian-mirror.sh"
uri=$(mirror_uri || echo "the machine's apt sources")

# Keep the package's postinst from starting its service on :5000 (invoke-rc.d and
# deb-systemd-invoke both ask policy-rc.d; 101 = "action forbidden"). A policy-rc.d that is
# already there (Docker images ship one) is left as it is.
own_policy=""
cleanup() { [ -z "$own_policy" ] || rm -f "$POLICY"; }
trap cleanup EXIT
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# written by imagegen setup registry for the length of one apt-get install\nexit 101\n' >"$POLICY"
    chmod 0755 "$POLICY"
    own_policy=1
fi

need=()
for p in docker-registry apache2-utils; do installed "$p" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]} (mirror: $uri)"
    quiet apt-get update -q || die "apt-get update failed"
    quiet apt-get install -y -q --no-install-recommends "${need[@]}" || die "apt-get install ${need[*]} failed"
fi
cleanup
own_policy=""

tools_ok || die "$REGISTRY_BIN or htpasswd missing or not runnable after the install"
quiet_service

say "$("$REGISTRY_BIN" --version), $(command -v htpasswd)"
say "ready in $((SECONDS - START))s"
