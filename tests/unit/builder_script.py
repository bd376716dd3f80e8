"""The in-build script (imagegen/shipped/builder/imagegen_build.py) as a module, for the unit tests
that call its steps and rules directly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BUILDER = Path(__file__).resolve().parents[2] / "imagegen" / "shipped" / "builder"
SCRIPT = BUILDER / "imagegen_build.py"
SUPERVISE = BUILDER / "imagegen_supervise.py"  # the nvcc guard and the build's supervisor, beside SCRIPT
# The modules beside SCRIPT, one per concern (imagegen_build.py's docstring)
BUILDENV = BUILDER / "imagegen_buildenv.py"  # the build's variables: arch knob, jobs, nvcc and ninja on PATH
CCACHE = BUILDER / "imagegen_ccache.py"  # ccache and the shared compile cache
RECORDS = BUILDER / "imagegen_records.py"  # the build record beside each wheel
CHECK = BUILDER / "imagegen_check.py"  # the smoke and GPU checks


def builder_module(name: str, script: Path = SCRIPT) -> ModuleType:
    """A fresh copy of the script (or another shipped beside it) under ``name`` (each test module its
    own, so what one patches on it stays there)."""
    if str(BUILDER) not in sys.path:  # what the scripts import lies beside them (imagegen_build.py adds it too)
        sys.path.insert(0, str(BUILDER))
    spec = importlib.util.spec_from_file_location(name, script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
