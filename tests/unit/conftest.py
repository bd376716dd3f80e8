"""The unit suite is pure: no Docker engine, no buildx. A `docker` first on PATH for the whole session
refuses and records every call; a test that reaches it fails, naming the command. Tests that need a
docker CLI write their own stand-in into their tmp_path and put it before this one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _docker_guard(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("no-docker")
    calls = folder / "calls"
    guard = folder / "docker"
    guard.write_text(f'#!/bin/sh\nprintf "%s\\n" "docker $*" >> "{calls}"\n'
                     'echo "unit tests run no docker: this test belongs in tests/integration" >&2\nexit 97\n')
    guard.chmod(0o755)
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{folder}{os.pathsep}{saved}"
    yield calls
    os.environ["PATH"] = saved


@pytest.fixture(autouse=True)
def no_docker_in_unit_tests(_docker_guard: Path):
    before = _docker_guard.read_text() if _docker_guard.exists() else ""
    yield
    after = _docker_guard.read_text() if _docker_guard.exists() else ""
    if after != before:
        pytest.fail(f"a unit test ran the docker CLI: {after[len(before):].splitlines()[0]}")


@pytest.fixture
def without_cuobjdump(monkeypatch):
    """imagegen, and the `python -m imagegen` processes a test starts, read fatbins without cuobjdump
    (the test extra installs one; hand-written containers carry no real cubins for it to read)."""
    monkeypatch.setenv("IMAGEGEN_CUOBJDUMP", "none")
