#!/usr/bin/env bash
# A Docker engine on the GPU device, which has no Docker and no network (docs/records/verification.md, "GPU in
# containers"; shared/reference/gpu-containers.md). The binaries travel with the call, compressed
# (scripts/gpu/engine-bundle.sh makes them here from the .debs scripts/install-engine.sh fetched):
# dockerd and docker in one folder, containerd, its runc shim, runc and the buildx plugin in another,
# because one call carries at most 64 MiB. Each step is one call of this script:
#   scripts/gpu/engine.sh unpack DIR...   xz -d every DIR/*.xz into /opt/imagegen-engine/bin
#   scripts/gpu/engine.sh start           containerd + dockerd (no iptables, no bridge), then wait
#   scripts/gpu/engine.sh host-image TAG  the host's own root filesystem as an image (no registry)
# The machine keeps what a call leaves in /opt and /var while it is held (30 minutes at most).
set -euo pipefail
BIN=/opt/imagegen-engine/bin
PLUGINS=$HOME/.docker/cli-plugins
LOG=/var/log/imagegen-dockerd.log
export PATH=$BIN:$PATH

case ${1:-} in
unpack)
    shift
    mkdir -p "$BIN" "$PLUGINS"
    for dir in "$@"; do
        for f in "$dir"/*.xz; do
            name=$(basename "$f" .xz)
            xz -dc "$f" > "$BIN/$name.partial" && chmod 0755 "$BIN/$name.partial" && mv "$BIN/$name.partial" "$BIN/$name"
            echo "engine: $name $(du -h "$BIN/$name" | cut -f1)"
        done
    done
    if [ -x "$BIN/docker-buildx" ]; then ln -sf "$BIN/docker-buildx" "$PLUGINS/docker-buildx"; fi
    ;;
start)
    if docker info >/dev/null 2>&1; then echo "engine: already running"; exit 0; fi
    # No iptables and no bridge: the device has neither the tools nor a network to reach; containers
    # run with --network none, build steps need no network (everything is in the base image).
    # No docker-proxy either: no port is published.
    # CDI on (Docker 25+; a build step's RUN --device reads the specs in /etc/cdi and /var/run/cdi).
    mkdir -p /etc/docker /etc/cdi
    [ -f /etc/docker/daemon.json ] || echo '{"features": {"cdi": true}}' > /etc/docker/daemon.json
    setsid dockerd --iptables=false --ip-masq=false --bridge=none --userland-proxy=false \
        --data-root /var/lib/docker >>"$LOG" 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 60); do
        kill -0 "$pid" 2>/dev/null || break
        if docker info >/dev/null 2>&1; then
            docker version --format 'engine: client {{.Client.Version}}, server {{.Server.Version}}'
            docker buildx version
            exit 0
        fi
        sleep 1
    done
    echo "engine: dockerd exited or did not answer in 60 s; its log:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
    ;;
host-image)
    tag=${2:?host-image TAG}
    # usr whole (on merged-/usr systems the loader lives in usr/lib64), the dpkg database (so a build
    # sees which OS packages are there), /opt (torch's venv, the compiler wrapper); no docs or sources.
    started=$(date +%s)
    tar -C / -c --exclude=usr/share/doc --exclude=usr/share/man --exclude=usr/src --exclude='*/__pycache__' \
        usr lib lib64 bin sbin etc opt var/lib/dpkg 2>/dev/null | docker import - "$tag" >/dev/null
    echo "engine: $tag imported in $(( $(date +%s) - started )) s: $(docker image inspect -f '{{.Size}}' "$tag") bytes"
    ;;
*)
    echo "usage: $0 unpack DIR... | start | host-image TAG" >&2
    exit 2
    ;;
esac
