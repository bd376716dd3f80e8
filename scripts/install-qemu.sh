#!/usr/bin/env bash
# The qemu set-up ships in imagegen (`imagegen setup qemu` runs it): this clone runs the same file,
# imagegen/resources/setup/install-qemu.sh, before any venv exists (scripts/test.sh as root).
exec bash "$(dirname "$0")/../imagegen/resources/setup/install-qemu.sh" "$@"
