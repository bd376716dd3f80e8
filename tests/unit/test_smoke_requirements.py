"""The smoke step installs the built wheel alone (--no-deps, no index: the same offline step in every
builder image and natively) and imports the recipe's modules. A package whose top-level import needs
its runtime requirements (mamba-ssm 2.3.2.post1: `import mamba_ssm` needs einops, transformers, ...)
failed there on the engine (found by the torch 2.14 frontier build, issue 37), although the wheel was
right. Now an import that fails only for a module the wheel itself declares in Requires-Dist is
skipped with that reason; a module it does not declare still fails the step. Real wheels, a real venv,
real pip."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.builder_script import CHECK, builder_module

B = builder_module("imagegen_check_smoke_requirements", CHECK)
DIST = "needs_deps"


def _wheel(folder: Path) -> Path:
    """needs_deps-1.0: `needs_deps` imports a module the wheel declares (Requires-Dist: Declared-Dep-Xyz,
    as import name declared_dep_xyz), `needs_deps_other` one it does not, `needs_deps_core` nothing."""
    files = {
        "needs_deps/__init__.py": "import declared_dep_xyz  # noqa\n",
        "needs_deps_other/__init__.py": "import undeclared_dep_xyz  # noqa\n",
        "needs_deps_core/__init__.py": "VALUE = 1\n",
        f"{DIST}-1.0.dist-info/METADATA": ("Metadata-Version: 2.1\nName: needs-deps\nVersion: 1.0\n"
                                           "Requires-Dist: Declared-Dep-Xyz>=1.0\n"
                                           "Requires-Dist: only-for-tests-xyz ; extra == \"test\"\n"),
        f"{DIST}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    path = folder / f"{DIST}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            data = text.encode()
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{DIST}-1.0.dist-info/RECORD,,")
        zf.writestr(f"{DIST}-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("smoke-venv") / "venv"
    assert subprocess.run([sys.executable, "-m", "venv", str(folder)]).returncode == 0
    return folder


def _smoke(tmp_path: Path, venv: Path, imports: list[str]) -> tuple[int, dict]:
    wheel = _wheel(tmp_path)
    cell = {"venv": str(venv), "base_python": sys.executable, "distribution": DIST, "smoke_imports": imports,
            "log_dir": str(tmp_path / "logs")}
    try:
        B.smoke_test(cell, [str(wheel)])
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, json.loads((tmp_path / "logs" / "smoke.json").read_text())


def test_an_import_that_needs_a_declared_requirement_is_skipped_with_why(tmp_path, venv):
    code, smoke = _smoke(tmp_path, venv, ["needs_deps_core", "needs_deps"])
    assert code == 0 and smoke["ok"] is True
    assert smoke["imports"]["needs_deps_core"] == "ok"
    assert smoke["imports"]["needs_deps"] == ("skipped: needs declared_dep_xyz, a runtime requirement of the wheel"
                                              " (the smoke test installs the wheel alone)")


def test_an_import_that_needs_an_undeclared_module_still_fails(tmp_path, venv):
    code, smoke = _smoke(tmp_path, venv, ["needs_deps_core", "needs_deps_other"])
    assert code == 1 and smoke["ok"] is False
    assert smoke["imports"]["needs_deps_other"].startswith("error: ModuleNotFoundError: No module named 'undeclared_dep_xyz'")


def test_a_requirement_of_an_extra_alone_is_not_the_wheels(tmp_path, venv):
    # only-for-tests-xyz is needed only with the `test` extra: an import that needs it is the package's fault
    (tmp_path / "w").mkdir()
    code, _ = _smoke(tmp_path / "w", venv, ["needs_deps_core"])
    assert code == 0
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", B.wheeltools.SMOKE_PROGRAM, str(tmp_path / "out.json"), DIST,
                            "needs_deps_core"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert json.loads((tmp_path / "out.json").read_text())["requires"] == ["Declared-Dep-Xyz"]
