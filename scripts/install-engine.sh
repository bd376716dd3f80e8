#!/usr/bin/env bash
# The engine set-up ships in imagegen (`imagegen setup engine` runs it): this clone runs the same file,
# imagegen/resources/setup/install-engine.sh, before any venv exists (scripts/test.sh as root).
exec bash "$(dirname "$0")/../imagegen/resources/setup/install-engine.sh" "$@"
