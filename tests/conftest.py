"""Shared by every test: imagegen reads no compatibility overlay of the machine it runs on (a user's
`imagegen refresh` in ~/.config must not change what the tests see); tests that need one set
IMAGEGEN_COMPAT_DIR themselves."""

from __future__ import annotations

import os
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def no_host_compat_overlay():
    saved = os.environ.get("IMAGEGEN_COMPAT_DIR")
    with tempfile.TemporaryDirectory(prefix="imagegen-no-overlay-") as empty:
        os.environ["IMAGEGEN_COMPAT_DIR"] = empty
        from imagegen.model import compat

        compat.reload()
        yield
    if saved is None:
        os.environ.pop("IMAGEGEN_COMPAT_DIR", None)
    else:
        os.environ["IMAGEGEN_COMPAT_DIR"] = saved
