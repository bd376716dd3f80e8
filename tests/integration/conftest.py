"""Fixtures shared by the integration tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    # uv (the resolve extra's) unpacks torch's ~3 GB of wheels in parallel where pip takes minutes
    uv = Path(sys.executable).parent / "uv"
    install = [str(uv), "pip", "install", "--python", str(venv / "bin" / "python")] if uv.exists() else \
        [str(venv / "bin" / "pip"), "install"]
    proc = subprocess.run([*install, "-q", "torch==2.11.0", "setuptools", "wheel", "ninja", "packaging"],
                          capture_output=True, text=True)
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
