#!/usr/bin/env bash
# The registry set-up ships in imagegen (`imagegen setup registry` runs it): this clone runs the same file,
# imagegen/resources/setup/install-registry.sh, before any venv exists (scripts/test.sh as root).
exec bash "$(dirname "$0")/../imagegen/resources/setup/install-registry.sh" "$@"
