"""plan --resolve, the parts that need no index: what the builder installs per cell (one resolution per
pip install, as it runs them), uv's output read back (which torch is a CUDA build), uv's failures in one
line, and an index that cannot be reached kept apart from one that answers "no".

The resolutions against real PyPI (torch 2.11 a CUDA build on aarch64, 2.10 CPU-only there) are in
tests/integration/test_resolve_pypi.py.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from imagegen.plan import resolve
from imagegen.errors import UsageError
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import MatrixRequest, Plan
from imagegen.plan.matrix import expand
from imagegen.plan.platforms import with_platforms
from imagegen.model.arch_parse import parse_arch_list

# `uv pip compile --annotation-style split` output for torch 2.11.0 on aarch64 (cut): torch's CUDA
# packages name it as their dependent.
CUDA_TORCH = """\
cuda-bindings==13.5.0
    # via torch
cuda-toolkit==13.0.2
    # via torch
filelock==4.3.1
    # via torch
nvidia-cublas==13.1.0.3
    # via
    #   cuda-toolkit
    #   nvidia-cudnn-cu13
nvidia-cudnn-cu13==9.19.0.56
    # via torch
torch==2.11.0
"""
# torch 2.10.0 on aarch64 from PyPI: no CUDA package at all.
CPU_TORCH = """\
filelock==4.3.1
    # via torch
sympy==1.14.0
    # via torch
torch==2.10.0
typing-extensions==4.16.0
    # via torch
"""


def cells(recipe="sageattention", torch="2.11", cuda="13.0", python="3.12", flavor="pypi", platforms=("linux/arm64",)):
    cat = load_catalogue()
    r = cat.recipes[recipe]
    plan = expand(MatrixRequest(recipes=[(r, r.version(None))], torch=[torch], cuda=[cuda], python=[python],
                                archs=[parse_arch_list("9.0")], flavor=flavor))
    return with_platforms(plan, platforms).cells


def test_a_cuda_torch_is_told_from_its_nvidia_dependencies():
    res = resolve.parse_compile_output(CUDA_TORCH, "aarch64-manylinux_2_36")
    assert res.pins["torch"] == "2.11.0" and res.pins["nvidia-cudnn-cu13"] == "9.19.0.56"
    assert res.via["nvidia-cublas"] == {"cuda-toolkit", "nvidia-cudnn-cu13"}
    assert res.torch_is_cuda() is True


def test_a_cpu_only_torch_is_one_without_them():
    res = resolve.parse_compile_output(CPU_TORCH, "aarch64-manylinux_2_36")
    assert res.torch_is_cuda() is False
    assert resolve.parse_compile_output("ninja==1.13.0\n", "x").torch_is_cuda() is None  # no torch: not judged


def test_a_pytorch_index_build_is_a_cuda_build_by_its_local_label():
    assert resolve.parse_compile_output("torch==2.8.0+cu126\n", "x").torch_is_cuda() is True
    assert resolve.parse_compile_output("torch==2.8.0+cpu\n", "x").torch_is_cuda() is False


def test_the_pypi_flavor_installs_torch_then_the_toolkit_then_the_build_requirements():
    cell = cells()[0]
    steps = resolve.install_steps(cell)
    assert [s.what for s in steps] == ["torch", "the CUDA toolkit", "the build requirements"]
    assert steps[0].requirements == ("torch==2.11.0",) and steps[0].extra_index is None  # PyPI's default variant
    assert steps[1].requirements == (f"cuda-toolkit[{','.join(cell.cuda.pypi_extras)}]=={cell.cuda.pypi_toolkit}",)
    assert steps[2].requirements[-1] == "torch==2.11.0" and "ninja" in steps[2].requirements
    assert resolve.python_platform(cell) == "aarch64-manylinux_2_36"  # Debian 12's glibc, as the image has


def test_an_image_toolkit_flavor_installs_no_toolkit_and_a_non_default_variant_reads_its_index():
    cell = cells(torch="2.8", cuda="12.6", flavor="manylinux", platforms=("linux/amd64",))[0]
    steps = resolve.install_steps(cell)
    assert [s.what for s in steps] == ["torch", "the build requirements"]
    assert steps[0].extra_index == "https://download.pytorch.org/whl/cu126"
    assert resolve.python_platform(cell) == "x86_64-manylinux_2_28"  # AlmaLinux 8


def fake_uv(tmp_path: Path, stdout: str, stderr: str = "", rc: int = 0) -> str:
    """A stand-in uv printing canned output and recording its arguments and stdin."""
    exe = tmp_path / "uv"
    (tmp_path / "out.txt").write_text(stdout)
    (tmp_path / "err.txt").write_text(stderr)
    exe.write_text(f"""#!/bin/sh
printf '%s\\n' "$@" > {tmp_path}/args.txt
cat > {tmp_path}/stdin.txt
cat {tmp_path}/out.txt
cat {tmp_path}/err.txt >&2
exit {rc}
""")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_uv_is_asked_for_the_cells_platform_and_python_building_nothing(tmp_path):
    cell = cells()[0]
    step = resolve.install_steps(cell)[0]
    res = resolve.resolve(step, "aarch64-manylinux_2_36", "3.12", uv=fake_uv(tmp_path, CUDA_TORCH))
    args = (tmp_path / "args.txt").read_text().split("\n")
    assert args[args.index("--python-platform") + 1] == "aarch64-manylinux_2_36"
    assert args[args.index("--python-version") + 1] == "3.12"
    assert "--no-build" in args  # a stranger's sdist never runs here
    assert (tmp_path / "stdin.txt").read_text() == "torch==2.11.0\n"
    assert res.torch_is_cuda() and not res.error


def test_a_failed_resolution_is_uvs_cause_in_one_line(tmp_path):
    err = ("error: No solution found when resolving dependencies\n  cause: Because torch==2.5.1 has no wheels with a"
           " matching Python ABI tag (e.g., `cp314`) and you require torch==2.5.1, we can conclude that your\n"
           "\nhint: You require CPython 3.14 (`cp314`), but we only found wheels for `torch` (v2.5.1) with cp39\n")
    step = resolve.Step("torch", ("torch==2.5.1",))
    res = resolve.resolve(step, "x86_64-manylinux_2_28", "3.14", uv=fake_uv(tmp_path, "", err, rc=1))
    assert not res.unreachable
    assert res.error.startswith("Because torch==2.5.1 has no wheels with a matching Python ABI tag")
    assert "You require CPython 3.14" in res.error and "\n" not in res.error


def test_an_unreachable_index_is_not_an_answer(tmp_path):
    err = ("error: Request failed after 3 retries\n  Caused by: error sending request for url"
           " (https://download.pytorch.org/whl/cu126/torch/)\n  Caused by: dns error: failed to lookup address information\n")
    res = resolve.resolve(resolve.Step("torch", ("torch==2.8.0",), "https://download.pytorch.org/whl/cu126"),
                          "x86_64-manylinux_2_28", "3.12", uv=fake_uv(tmp_path, "", err, rc=2))
    assert res.unreachable and res.error


def test_with_resolution_rejects_a_cpu_torch_and_notes_an_unchecked_cell(tmp_path, monkeypatch):
    arm = cells()[0]
    monkeypatch.setattr(resolve, "uv_binary", lambda: fake_uv(tmp_path, CPU_TORCH))
    plan = resolve.with_resolution(Plan(cells=[arm]), say=lambda m: None)
    (cell,) = plan.cells
    assert cell.status == "rejected"
    assert cell.problems[-1].startswith("--resolve: torch 2.11.0 from PyPI is a CPU-only build for linux/arm64")
    err = "error: dns error: failed to lookup address information\n"
    monkeypatch.setattr(resolve, "uv_binary", lambda: fake_uv(tmp_path, "", err, rc=2))
    (cell,) = resolve.with_resolution(Plan(cells=[arm]), say=lambda m: None).cells
    assert cell.status == "buildable" and any("not checked: an index could not be reached" in n for n in cell.notes)


def test_without_uv_the_error_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    import builtins

    real_import = builtins.__import__

    def no_uv(name, *args, **kwargs):
        if name == "uv":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uv)
    with pytest.raises(UsageError, match="pip install uv"):
        resolve.uv_binary()


def test_resolve_does_not_go_with_audit():
    from tests.unit.command_helpers import call
    from imagegen.commands.planning import cmd_plan

    with pytest.raises(UsageError, match="--resolve goes with a plain plan"):
        call(cmd_plan, "plan", "sage", "--audit", "--resolve")


def test_an_offline_cell_installs_nothing_from_an_index(tmp_path, monkeypatch):
    from dataclasses import replace

    cell = replace(cells()[0], offline=True)
    assert resolve.install_steps(cell) == []
    monkeypatch.setattr(resolve, "uv_binary", lambda: fake_uv(tmp_path, CPU_TORCH))
    (got,) = resolve.with_resolution(Plan(cells=[cell]), say=lambda m: None).cells
    assert got.status == "buildable" and not (tmp_path / "args.txt").exists()  # uv was not asked
    assert got.notes[-1] == "--resolve: nothing to resolve: this cell's builder installs nothing from an index"
