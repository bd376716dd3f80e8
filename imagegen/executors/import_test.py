"""The import test of a built wheel: installed into a throwaway folder and each module imported by
a child Python (a module that needs a GPU driver is reported as skipped, not as passed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from imagegen import untrusted
from imagegen.errors import BuildError, Unreadable
from imagegen.model.cell import HostToolchain
from imagegen.model.cell import Cell

if TYPE_CHECKING:
    pass


def smoke_test(wheel: Path, cell: Cell, host: HostToolchain, importer: "Importer | None" = None) -> dict:
    """Import the recipe's modules that the cell's arch list builds (Cell.smoke) from the unpacked wheel
    (see import_test)."""
    return import_test(wheel, [*cell.smoke.imports, *cell.smoke.driver_imports], host.python_exe,
                       importer=importer)


# An extension module's file: name.so, name.abi3.so, name.cpython-311-x86_64-linux-gnu.so.
_EXTENSION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)?\.so")


def wheel_modules(wheel: Path) -> list[str]:
    """The top-level packages and extension modules a wheel installs (what `verify` imports)."""
    import zipfile

    names = set()
    with zipfile.ZipFile(wheel) as zf:
        for n in zf.namelist():
            top = n.split("/", 1)[0]
            if ".dist-info" in top or ".data" in top:
                continue
            folder, _, file = n.rpartition("/")
            # Only what Python can import: packages and modules along identifier folders (auditwheel's
            # <dist>.libs/libfoo-<hash>.so.12 is a bundled library, not a module).
            if folder and not all(part.isidentifier() for part in folder.split("/")):
                continue
            if file == "__init__.py" and folder.count("/") == 0 and folder:
                names.add(folder)
            elif not folder and file.endswith(".py") and file[:-3].isidentifier():
                names.add(file[:-3])
            elif _EXTENSION.fullmatch(file):
                # tiny_kernel/_C.cpython-311-x86_64-linux-gnu.so -> tiny_kernel._C
                module = file.split(".", 1)[0]
                names.add(f"{folder.replace('/', '.')}.{module}" if folder else module)
    return sorted(names)


# The import test's interpreter: torch first (an extension links against libc10/libtorch, which only
# `import torch` loads), then one line on stdin naming the unpacked wheel, then the modules. Reading the
# wheel's path from stdin lets it start (and pay for `import torch`, seconds) while the wheel compiles.
_IMPORTER = r"""
import importlib, json, sys
try:
    import torch
except ImportError:
    pass
request = sys.stdin.readline()
if not request.strip():
    sys.exit(0)
request = json.loads(request)
sys.path.insert(0, request["site"])
res = {}
for m in request["modules"]:
    try:
        importlib.import_module(m); res[m] = "ok"
    except Exception as e:
        res[m] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(res))
"""


class Importer:
    """A fresh interpreter of the host's Python, started before it is needed, that imports one
    unpacked wheel's modules when asked. Its working directory is an empty folder, so nothing from a
    source tree shadows the wheel; nothing is installed into the environment."""

    def __init__(self, python_exe: str):
        self.tmp = Path(tempfile.mkdtemp(prefix="imagegen-smoke-"))
        try:
            self.proc = subprocess.Popen([python_exe, "-c", _IMPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, cwd=self.tmp)
        except OSError:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def run(self, wheel: Path, modules: list[str]) -> dict:
        site = self.tmp / "site"
        try:  # bounded: per member, in all, by compression ratio and by the free space there
            untrusted.extract_zip(wheel, site)
        except Unreadable as exc:
            raise BuildError(f"{wheel.name}: not unpacked for the import test: {exc}") from None
        request = json.dumps({"site": str(site), "modules": modules}) + "\n"
        try:
            out, err = self.proc.communicate(request)
        except BrokenPipeError:  # the interpreter died while starting (a broken torch): report why
            out, err = self.proc.communicate()
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise BuildError(f"{wheel.name}: the import test did not run: {err.strip()[-300:]}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "Importer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def import_test(wheel: Path, modules: list[str], python_exe: str, importer: Importer | None = None) -> dict:
    """Import ``modules`` from the unpacked wheel, outside any source tree, with ``python_exe`` and
    its torch (nothing is installed into that environment). A module that needs the GPU driver on a
    machine without one is reported as skipped, not as passed. ``importer``: one started earlier
    (a native build starts it when the compile starts); it is used up."""
    if importer is None:
        with Importer(python_exe) as fresh:
            raw = fresh.run(wheel, modules)
    else:
        raw = importer.run(wheel, modules)
    results = {}
    for module, got in raw.items():
        if got == "ok":
            results[module] = "ok"
        elif re.search(r"libcuda\.so|CUDA driver|NVIDIA driver", got):
            results[module] = f"skipped: needs a GPU driver ({got[:160]})"
        else:
            raise BuildError(f"{wheel.name}: `import {module}` failed: {got[:300]}")
    return results
