#!/usr/bin/env bash
# Install what the tests need into .venv and run them. README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest "$@"
