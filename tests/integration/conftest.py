"""Fixtures shared by the integration tests."""

from __future__ import annotations

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
