"""The in-build script (imagegen/resources/builder/imagegen_build.py) as a module, for the unit tests
that call its steps and rules directly."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "imagegen" / "resources" / "builder" / "imagegen_build.py"


def builder_module(name: str) -> ModuleType:
    """A fresh copy of the script under ``name`` (each test module its own, so what one patches on it
    stays there)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
