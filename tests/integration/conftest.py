"""Fixtures shared by the integration tests."""

from __future__ import annotations

import subprocess
import sys

import pytest
from registry import INSTALL_HINT, LocalRegistry, missing_tools


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real registry (docker-registry, htpasswd auth) on 127.0.0.1:<free port>, started and logged
    in through a private DOCKER_CONFIG (merge `registry.env()` into docker's environment); stopped
    after the module. Fails, never skips, when docker-registry or htpasswd is missing."""
    missing = missing_tools()
    if missing:
        pytest.fail(f"a real registry is required but {', '.join(missing)} missing: {INSTALL_HINT}")
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        reg.login()
        yield reg


@pytest.fixture(scope="session")
def torch_venv(tmp_path_factory):
    """A venv with torch 2.11.0 (CUDA 13.0, PyPI's default) and the build tools: what the native
    build, fail-fast and audit tests build against with the host's nvcc. One per session: installing
    torch costs minutes."""
    venv = tmp_path_factory.mktemp("torch") / "venv"
    assert subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "torch==2.11.0", "setuptools", "wheel", "ninja",
                           "packaging"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return venv


@pytest.fixture(scope="session")
def torch_image(tmp_path_factory):
    """An image whose system Python has torch 2.11.0 (cu130), the build requirements and the CUDA 13.0
    toolkit (tests/integration/torch_image.py): test_engine_bases' fallback, test_engine_offline's
    offline base. Removed after the session, being several GB."""
    from torch_image import BASE_IMAGE
    from torch_image import torch_image as made

    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"the Docker engine and {BASE_IMAGE} are required: run scripts/test.sh as root")
    with made(tmp_path_factory.mktemp("torch-image")) as tag:
        yield tag


# ------------------------------------------------------------------ xdist: whole modules, heaviest first
# scripts/test.sh runs the suite on two xdist workers with --dist loadgroup --no-loadscope-reorder.
# Each integration module goes to one worker whole (its module-scoped build runs once); the modules
# that share the session's torch venv, or its torch image, go together (each is made once). The heaviest go first, so that
# the long push/pull of test_prebuilt (network and gzip: one core) overlaps the compiles of the
# others, and the unit tests fill in at the end.
SHARED_GROUPS = {"test_audit": "torch-venv", "test_failfast": "torch-venv", "test_native": "torch-venv",
                 "test_repair": "torch-venv", "test_engine_bases": "torch-image", "test_engine_offline": "torch-image"}
HEAVIEST_FIRST = ["test_prebuilt", "test_builders", "torch-venv", "torch-image", "test_engine_build",
                  "test_engine_catalogue", "test_engine_signals", "test_engine_audit", "test_prebuilt_arm64",
                  "test_gpu_access_engine"]


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of an integration test (None for the others)."""
    path = item.path
    if path.parent.name != "integration" or path.parent.parent.name != "tests":
        return None
    return SHARED_GROUPS.get(path.stem, path.stem)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(HEAVIEST_FIRST)}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # stable: within a group and among the unit tests, collection order is kept
    items.sort(key=lambda item: (0, rank.get(group_of(item), len(rank))) if group_of(item) else (1, 0))
