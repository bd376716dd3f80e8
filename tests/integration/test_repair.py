"""imagegen repair against a real torch: the fixture wheel (torch 2.11 / CUDA 13.0, sm_80, sm_90,
compute_90) repaired with torch's libraries excluded installs with pip into a venv with torch 2.11.0
from PyPI, next to torch's own libraries, and its extension imports: nothing of torch or CUDA was
bundled, and the RPATHs auditwheel wrote still find what `import torch` loaded."""

from __future__ import annotations

import re
import subprocess
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

from imagegen.publish.repair import TORCH_PROVIDED, repair_wheel

WHEEL = next((Path(__file__).resolve().parents[1] / "fixtures" / "wheels").glob("tiny_kernel-*.whl"))

pytestmark = pytest.mark.integration


def run(*cmd, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=900)


def test_the_repaired_wheel_installs_with_pip_beside_torch_and_imports(torch_venv, tmp_path):
    python = torch_venv / "bin" / "python"
    # The import test of the repair itself, with that torch: the unpacked wheel's modules import.
    result = repair_wheel(WHEEL, tmp_path / "out", python_exe=str(python))
    assert re.fullmatch(r"manylinux_2_\d+_x86_64", result.tag), result.tag
    assert result.imports == {"tiny_kernel": "ok", "tiny_kernel._C": "ok"}
    with zipfile.ZipFile(result.wheel) as zf:
        assert not [n for n in zf.namelist() if ".libs/" in n]
    installed = run(python, "-m", "pip", "install", "--no-deps", "--no-index", result.wheel)
    assert installed.returncode == 0, installed.stderr[-2000:]
    try:
        empty = tmp_path / "elsewhere"  # not beside any copy of the package
        empty.mkdir()
        imported = run(python, "-c", "import torch, tiny_kernel, tiny_kernel._C; print(tiny_kernel._C.__file__)",
                       cwd=empty)
        assert imported.returncode == 0, imported.stderr[-2000:]
        assert "site-packages/tiny_kernel/_C." in imported.stdout
        files = run(python, "-m", "pip", "show", "-f", "tiny_kernel")
        assert files.returncode == 0, files.stderr[-2000:]
        assert not [line for line in files.stdout.splitlines() if ".libs/" in line], files.stdout
        tag = run(python, "-c", "import importlib.metadata as m; print(m.distribution('tiny_kernel')"
                  ".read_text('WHEEL'))")
        assert f"Tag: cp311-cp311-{result.tag}" in tag.stdout, tag.stdout + tag.stderr
    finally:
        # The session's torch venv is shared with the native-build tests: leave it as it was.
        removed = run(python, "-m", "pip", "uninstall", "-y", "tiny_kernel")
        assert removed.returncode == 0, removed.stderr[-2000:]


# cupti's checkpoint library: no extension links it, and its name is too plain to exclude.
NOT_LINKED = {"libcheckpoint.so"}


def test_every_shared_library_torch_and_its_nvidia_wheels_install_is_excluded(torch_venv):
    # A new torch that ships a new library fails here, before a wheel linking it bundles a copy.
    site = next((torch_venv / "lib").glob("python3.*/site-packages"))
    libraries = {p.name for folder in (site / "torch" / "lib", *site.glob("nvidia/**/lib"))
                 for p in folder.glob("lib*.so*")} - NOT_LINKED
    assert {"libtorch_cpu.so", "libc10.so", "libcudart.so.13", "libgomp.so.1"} <= libraries
    assert sorted(n for n in libraries if not any(fnmatch(n, pattern) for pattern in TORCH_PROVIDED)) == []
