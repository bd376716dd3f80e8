"""The toolchain step's question "does the base image already have exactly this torch?" asked of real
interpreters: stand-ins that answer as an image's Python with torch X, another torch, or none would."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "imagegen" / "shipped" / "builder" / "imagegen_toolchain.py"


@pytest.fixture(scope="module")
def toolchain():
    spec = importlib.util.spec_from_file_location("toolchain_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def interpreter(tmp_path: Path, torch: tuple[str, str | None] | None) -> str:
    """A Python whose `import torch` gives ``torch`` (version, CUDA) or fails."""
    site = tmp_path / "site"
    if torch is not None:
        (site / "torch" / "version").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text(f"__version__ = {torch[0]!r}\nfrom torch import version\n")
        (site / "torch" / "version" / "__init__.py").write_text(f"cuda = {torch[1]!r}\n")
    exe = tmp_path / "python3"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def cell(python: str, reuse: str | None = "image") -> dict:
    return {"base_python": python, "torch": {"version": "2.9.1", "cuda": "cu128", "cuda_dotted": "12.8", "reuse": reuse}}


def test_the_images_own_torch_when_it_is_exactly_the_one_asked_for(toolchain, tmp_path, capsys):
    assert toolchain.image_torch_matches(cell(interpreter(tmp_path, ("2.9.1+cu128", "12.8")))) is True
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("torch", "found"), [
    (("2.9.0+cu128", "12.8"), "torch 2.9.0+cu128 (CUDA 12.8)"),
    (("2.9.1+cu130", "13.0"), "torch 2.9.1+cu130 (CUDA 13.0)"),
    (("2.9.1+cpu", None), "torch 2.9.1+cpu (CUDA None)"),
    (None, "no torch"),
])
def test_any_other_torch_or_none_means_a_venv_of_its_own(toolchain, tmp_path, capsys, torch, found):
    python = interpreter(tmp_path, torch)
    assert toolchain.image_torch_matches(cell(python)) is False
    out = capsys.readouterr().out
    assert f"warning: the plan expected torch 2.9.1 (cu128) in the base image's {python}, which has {found}" in out
    assert toolchain.image_torch_matches(cell(python, reuse="if-present")) is False
    assert f"the base image's {python} has {found}, not torch 2.9.1 (cu128): installing it into the venv" in capsys.readouterr().out


def test_an_interpreter_that_is_not_there(toolchain, tmp_path):
    assert toolchain.image_torch_matches(cell(str(tmp_path / "no-such-python"))) is False


def test_the_pypi_toolkit_is_assembled_from_every_nvidia_folder_the_venv_sees(toolchain, tmp_path):
    """With the image's torch reused, pip leaves the CUDA runtime torch brought in the image's site
    packages and puts nvcc into the venv: CUDA_HOME needs both (cuda_runtime.h was missing once)."""
    venv_site, image_site = tmp_path / "venv-site", tmp_path / "image-site"
    nvcc = venv_site / "nvidia" / "cu13" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0'\n")
    nvcc.chmod(0o755)
    (venv_site / "nvidia" / "cu13" / "include").mkdir()
    (venv_site / "nvidia" / "cu13" / "include" / "both.h").write_text("venv\n")
    (image_site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (image_site / "nvidia" / "cu13" / "include" / "cuda_runtime.h").write_text("runtime\n")
    (image_site / "nvidia" / "cu13" / "include" / "both.h").write_text("image\n")
    (image_site / "nvidia" / "cu13" / "lib").mkdir()
    (image_site / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_text("")
    py = tmp_path / "python3"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={venv_site}:{image_site} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    home = tmp_path / "cuda"
    toolchain.assemble_cuda_home(str(py), str(home))
    assert (home / "include" / "cuda_runtime.h").read_text() == "runtime\n"  # from the image
    assert (home / "include" / "both.h").read_text() == "venv\n"  # the venv's copy wins
    assert (home / "bin" / "nvcc").is_file()
    assert (home / "lib" / "libcudart.so").is_symlink() and (home / "lib64").is_symlink()
    # Hard links, not copies: the layer stores each library once (CUDA 13's CUDA_HOME is ~3 GB of them).
    assert (home / "lib" / "libcudart.so.13").samefile(image_site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    assert (home / "include" / "both.h").samefile(venv_site / "nvidia" / "cu13" / "include" / "both.h")
    assert (image_site / "nvidia" / "cu13" / "include" / "both.h").read_text() == "image\n"  # replaced, not written through
    assert (home / "bin" / "nvcc").stat().st_nlink == 2


def test_where_no_hard_link_can_be_made_the_file_is_copied(toolchain, tmp_path, monkeypatch):
    src, dst = tmp_path / "libcublas.so.13", tmp_path / "home" / "libcublas.so.13"
    src.write_bytes(b"\x7fELF cublas")
    dst.parent.mkdir()
    dst.write_bytes(b"older")
    toolchain.link_or_copy(str(src), str(dst))
    assert dst.samefile(src)

    def cross_device(a, b):
        raise OSError(18, "Invalid cross-device link")

    other = tmp_path / "home" / "other.so"
    other.write_bytes(b"older")
    monkeypatch.setattr(toolchain.os, "link", cross_device)
    toolchain.link_or_copy(str(src), str(other))
    assert other.read_bytes() == b"\x7fELF cublas" and not other.samefile(src)


def test_the_pypi_toolkit_gets_a_libcuda_stub_that_a_link_keeps(toolchain, tmp_path):
    """The PyPI wheels ship no lib/stubs/libcuda.so; SageAttention's _qattn_sm90 links -lcuda (the pypi
    flavor's first SageAttention build failed: `cannot find -lcuda`). The stub defines the driver
    functions under the names cuda.h's macros give them, so a real link records NEEDED libcuda.so.1
    (with --as-needed too) and leaves the functions to the driver."""
    import shutil
    import subprocess

    if shutil.which("cc") is None or shutil.which("readelf") is None:
        pytest.fail("a C compiler and readelf (binutils) are needed: apt-get install gcc binutils")
    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda.h").write_text("typedef int CUresult; typedef unsigned long long CUdeviceptr;\n"
                                   "#define cuMemAlloc cuMemAlloc_v2\n"
                                   "CUresult cuInit(unsigned int flags);\n"
                                   "CUresult cuMemAlloc(CUdeviceptr *p, unsigned long n);\n")
    stubs = tmp_path / "lib" / "stubs"
    toolchain.make_libcuda_stub(str(stubs), str(include))
    assert [p.name for p in stubs.iterdir()] == ["libcuda.so"]
    ext = tmp_path / "ext.c"
    ext.write_text('#include <cuda.h>\nint f(void) { CUdeviceptr p; cuMemAlloc(&p, 4); return cuInit(0); }\n')
    so = tmp_path / "ext.so"
    link = subprocess.run(["cc", "-shared", "-fPIC", "-Wl,--as-needed", f"-I{include}", "-o", str(so), str(ext),
                           f"-L{stubs}", "-lcuda"], capture_output=True, text=True)
    assert link.returncode == 0, link.stderr
    dynamic = subprocess.run(["readelf", "-d", "--dyn-syms", str(so)], capture_output=True, text=True).stdout
    assert "Shared library: [libcuda.so.1]" in dynamic
    assert "UND cuMemAlloc_v2" in dynamic and "UND cuInit" in dynamic  # left to the driver
    # Once made it stays; without cuda.h there is nothing to make it from (said, not fatal).
    toolchain.make_libcuda_stub(str(tmp_path / "other"), str(tmp_path / "no-include"))
    assert not (tmp_path / "other").exists()


def test_offline_without_the_images_torch_stops_with_one_line_and_no_download(toolchain, tmp_path, capsys):
    python = interpreter(tmp_path, ("2.8.0+cu128", "12.8"))  # another torch than the one asked for
    doc = dict(cell(python, reuse="if-present"), venv=str(tmp_path / "venv"), toolkit={"kind": "image"}, offline=True)
    with pytest.raises(SystemExit) as stopped:
        toolchain.cmd_toolchain(doc, None)
    assert stopped.value.code != 0
    err = capsys.readouterr()
    text = err.out + err.err
    assert "--offline: the base image's" in text and "has no torch 2.9.1 (cu128)" in text
    assert "pip install" not in text and "--upgrade" not in text  # nothing tried to reach an index
