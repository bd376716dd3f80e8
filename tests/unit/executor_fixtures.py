"""Shared by the executor and finish tests (test_bake_run, test_buildx, test_buildx_audit, test_host,
test_native, test_prebuilt, test_results, test_import_test, test_finish): the tiny_kernel fixture's
recipe, cells and real wheel (sm_80, sm_90, compute_90), small pure-Python wheels, stand-in
executables, and a stand-in for engine.bake that exports what a build of each target would (docker
itself is never run here: the engine module has its own tests)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

from imagegen import engine
from imagegen.executors.bake_log import AUDIT_SUFFIX, LOG_SUFFIX, cell_of
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.source_tree import recipe_from_source_tree
from imagegen.model.cell import Cell
from imagegen.plan.matrix import make_cell

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# A real built wheel: tiny_kernel/_C...so carries sm_80, sm_90 and compute_90; tiny_kernel/__init__.py
# imports nothing at import time (so an import test passes without torch).
WHEEL = next((FIXTURES / "wheels").glob("tiny_kernel-*.whl"))


def temp_files_under(tmp_path: Path, monkeypatch) -> Path:
    """Python's temporary files (the import test's folder, verify's extracted .so files) go under
    ``tmp_path`` for the test, its child processes' too."""
    folder = tmp_path / "tmpfiles"
    folder.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def tiny_recipe():
    """The tiny_kernel fixture as a local-source recipe (smoke import: tiny_kernel)."""
    return recipe_from_source_tree(FIXTURES / "tiny_kernel")


def tiny_cell(archs: str = "8.0;9.0+PTX", python: str = "3.11", flavor: str = "pypi") -> Cell:
    """A buildable cell of the fixture; with the default archs the fixture wheel passes verification."""
    recipe = tiny_recipe()
    cell = make_cell(recipe, recipe.version(None), "2.11", "13.0", python, parse_arch_list(archs), flavor)
    assert cell.buildable, cell.problems
    return cell


def executable(path: Path, text: str) -> Path:
    """Write ``text`` (with its #! line) to ``path`` and make it executable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def python_stand_in(path: Path, body: str) -> Path:
    """An executable that runs ``body`` with this test run's own Python."""
    return executable(path, f"#!{sys.executable}\n" + textwrap.dedent(body))


def pure_wheel(path: Path, files: dict[str, str], *, name: str = "demo", version: str = "1.0") -> Path:
    """A real pure-Python wheel at ``path`` holding ``files`` (name in the wheel -> text), with
    METADATA, WHEEL and a RECORD that lists every file with its hash."""
    dist_info = f"{name}-{version}.dist-info"
    entries = dict(files)
    entries[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    entries[f"{dist_info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: h4-tests\nRoot-Is-Purelib: true\n"
                                     "Tag: py3-none-any\n")
    record = []
    for arcname, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{arcname},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    entries[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, text in entries.items():
            zf.writestr(arcname, text)
    return path


def audit_report(sass: list[str], ptx: list[str] = (), *, module: str = "tiny_kernel._C", seconds: float = 1.5) -> dict:
    """An audit.json as the in-build script's audit step writes it: one extension and its targets."""
    return {"ok": True, "exit": 0, "seconds": seconds, "env": {"TORCH_CUDA_ARCH_LIST": "8.0;9.0+PTX"},
            "error_lines": [],
            "extensions": [{"module": module, "sass": list(sass), "ptx": list(ptx), "other_targets": [],
                            "sources": ["csrc/add_one.cu"],
                            "cuda_sources": [{"source": "csrc/add_one.cu",
                                              "targets": [f"sass:{t}" for t in sass] + [f"ptx:{t}" for t in ptx]}],
                            "nvcc_flags": ["-O3"]}]}


def output_dest(target: dict) -> Path:
    """The folder a bake target's ``type=local,dest=...`` output names."""
    (out,) = target["output"]
    kind, dest = out.split(",", 1)
    assert kind == "type=local" and dest.startswith("dest="), out
    return Path(dest[len("dest="):])


class FakeBake:
    """Stands in for ``engine.bake``: reads the bake file it is given and, per target, exports what
    the build would (the cell's wheel, the log companion's build.log / smoke.json / ccache.json,
    the audit companion's audit.json), printing BuildKit-style lines for each. Targets of cells in
    ``fail`` fail with the compiler error ``errors[cell]``; then, as bake does, the other targets of
    that bake are cancelled (nothing of theirs is exported) and BakeFailed is raised."""

    def __init__(self, *, wheels: dict[str, Path | None] | None = None, audits: dict[str, dict | None] | None = None,
                 fail: set[str] = frozenset(), errors: dict[str, str] | None = None,
                 smoke: dict | None = None, ccache: dict | None = None, bake_error: str = "") -> None:
        self.wheels = wheels or {}
        self.audits = audits or {}
        self.fail = set(fail)
        self.errors = errors or {}
        self.smoke = smoke
        self.ccache = ccache
        self.bake_error = bake_error  # a bad definition: bake fails before any target runs
        self.calls: list[dict] = []

    def __call__(self, file: Path, targets: list[str], *, on_line, builder: str | None = None,
                 variables: dict | None = None, metadata_file: Path | None = None) -> None:
        self.calls.append({"file": file, "targets": list(targets), "builder": builder,
                           "variables": dict(variables or {})})
        if self.bake_error:
            raise engine.BakeFailed(f"#0 building with \"default\" instance\n{self.bake_error}\n")
        data = json.loads(Path(file).read_text())
        failing = [t for t in targets if cell_of(t) in self.fail]
        stderr = []
        for vertex, name in enumerate(targets, start=1):
            cell = cell_of(name)
            if name in failing:
                on_line(f"#{vertex} [{name} wheels 1/1] RUN python /imagegen/imagegen_build.py build")
                error = self.errors.get(cell, "")
                if error:
                    on_line(f"#{vertex} 3.20 [imagegen] error: {error}")
                on_line(f"#{vertex} ERROR: process \"/bin/sh -c python /imagegen/imagegen_build.py build\" did not"
                        " complete successfully: exit code: 1")
                stderr.append(f"ERROR: target {name}: failed to solve: process did not complete successfully")
                continue
            if failing:
                on_line(f"#{vertex} [{name} wheels 1/1] RUN python /imagegen/imagegen_build.py build")
                on_line(f"#{vertex} CANCELED")
                continue
            stage = "audit" if name.endswith(AUDIT_SUFFIX) else "buildlog" if name.endswith(LOG_SUFFIX) else "wheels"
            on_line(f"#{vertex} [{name} {stage} 1/1] RUN python /imagegen/imagegen_build.py {stage}")
            on_line(f"#{vertex} 0.50 compiled {name}")
            on_line(f"#{vertex} DONE 1.0s")
            dest = output_dest(data["target"][name])
            dest.mkdir(parents=True, exist_ok=True)
            if name.endswith(AUDIT_SUFFIX):
                report = self.audits.get(cell)
                if report is not None:
                    (dest / "audit.json").write_text(json.dumps(report))
            elif name.endswith(LOG_SUFFIX):
                (dest / "build.log").write_text(f"compile log of {cell}\n")
                if self.smoke is not None:
                    (dest / "smoke.json").write_text(json.dumps({"imports": self.smoke}))
                if self.ccache is not None:
                    (dest / "ccache.json").write_text(json.dumps(self.ccache))
            else:
                wheel = self.wheels.get(cell, WHEEL)
                if wheel is not None:
                    shutil.copy(wheel, dest / wheel.name)
        if failing:
            raise engine.BakeFailed("\n".join(stderr) + "\n")
