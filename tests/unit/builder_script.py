"""The in-build script (imagegen/resources/builder/imagegen_build.py) as a module, for the unit tests
that call its steps and rules directly."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BUILDER = Path(__file__).resolve().parents[2] / "imagegen" / "resources" / "builder"
SCRIPT = BUILDER / "imagegen_build.py"
SUPERVISE = BUILDER / "imagegen_supervise.py"  # the nvcc guard and the build's supervisor, beside SCRIPT


def builder_module(name: str, script: Path = SCRIPT) -> ModuleType:
    """A fresh copy of the script (or another shipped beside it) under ``name`` (each test module its
    own, so what one patches on it stays there)."""
    spec = importlib.util.spec_from_file_location(name, script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
