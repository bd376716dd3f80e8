"""Tests for imagegen.commands.rendering: `imagegen render` and `imagegen bake` without --print.

render: the flags a Dockerfile or a --shell script refuses, the Windows script's values and checks, the
lock's pinned base, -o with the scripts folder beside it; bake: the files written, rejected cells, the
output folder, --repo."""

from __future__ import annotations

import fnmatch
import json
import os
import re

import pytest

from imagegen.commands import rendering
from imagegen.errors import CompatError, NothingToDoError, UsageError
from imagegen.render.dockerfile import SCRIPTS_CONTEXT
from tests.unit.command_helpers import CELL, call

SAGE_NAME = "sage-2_2_0-torch2_8-cu128-py312"
SAGE_BASE = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def render(*argv) -> int:
    return call(rendering.cmd_render, "render", *argv)


def bake(*argv) -> int:
    return call(rendering.cmd_bake, "bake", *argv)


# ----------------------------------------------------------------------------------------- render


@pytest.mark.parametrize("argv, says", [
    (["--shell", "cmd", "--lock", "imagegen.lock"], "--lock does not apply to --shell (a native script uses the"
                                                    " host's toolchain, no image)"),
    (["--shell", "powershell", "--offline"], "--offline does not apply to --shell"),
    (["--shell", "cmd", "--torch", "2.8,2.9", "--python-exe", "python"], "--python-exe builds with that"
                                                                         " interpreter's torch as it is: one cell only"),
    (["--src-dir", "src"], "--src-dir goes with --shell cmd|powershell"),
    (["--python-exe", "python"], "--python-exe goes with --shell cmd|powershell"),
    (["--nvcc-threads", "2"], "--nvcc-threads goes with --shell cmd|powershell"),
])
def test_render_refuses_a_flag_the_chosen_output_would_ignore(argv, says, capsys):
    with pytest.raises(UsageError) as info:
        render("sage", "--arch", "9.0", *argv)
    assert str(info.value).startswith(says)
    assert capsys.readouterr().out == ""


def test_the_windows_script_carries_every_value_given(capsys):
    assert render("fa2", "--arch", "9.0", "--shell", "cmd", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12",
                  "--python-exe",
                  "C:\\py\\python.exe", "--src-dir", "fa", "--vcvars", "D:\\vc.bat", "--max-jobs", "4",
                  "--nvcc-threads", "2", "--out", "D:\\wh") == 0
    lines = capsys.readouterr().out.splitlines()
    for line in ('set "MAX_JOBS=4"', 'set "NVCC_THREADS=2"', 'set "FLASH_ATTN_CUDA_ARCHS=90"',
                 'set "FLASH_ATTN_LOCAL_VERSION=cu128torch2.8"', 'call "D:\\vc.bat" x64 >nul',
                 'for %%I in ("fa") do set "IG_SRC=%%~fI"', 'set "IG_PYTHON_EXE=C:\\py\\python.exe"',
                 'set "IG_WHEELHOUSE=D:\\wh"', 'set "IG_TORCH=2.8.0"', 'set "IG_INDEX_URL=https://download.pytorch.org/whl/cu128"'):
        assert line in lines, line
    assert any('-m pip wheel --no-build-isolation --no-deps -w "%IG_DIST%" .' in line for line in lines)
    # The command line that made it, as a comment, quoted the way a shell reads it back.
    assert "rem Re-render with: imagegen render fa2 --arch 9.0 --shell cmd --torch 2.8 --cuda 12.8 --python 3.12" \
           " --python-exe 'C:\\py\\python.exe'" in "\n".join(lines)


def test_the_windows_script_defaults_are_the_safe_ones(capsys):
    assert render("sage", "--arch", "9.0", "--shell", "powershell") == 0
    out = capsys.readouterr().out
    assert "'MAX_JOBS' = '1'" in out and "'NVCC_THREADS' = '1'" in out  # no OOM on a small machine
    assert "'TORCH_CUDA_ARCH_LIST' = '9.0'" in out and "GetUnresolvedProviderPathFromPSPath('sageattention')" in out
    assert "\\2022\\Community\\VC\\Auxiliary\\Build\\vcvarsall.bat" in out
    assert "$PythonExe = ''" in out and "'py' @(\"-$($Cell.Python)\", '-m', 'venv', $venv)" in out  # a venv per cell
    assert "[string]$Wheelhouse = 'wheelhouse'," in out


def test_render_lists_make_one_script_of_many_cells(capsys):
    assert render("sage", "--arch", "9.0", "--shell", "cmd", "--torch", "2.8,2.9", "--cuda", "12.8", "--python",
                  "3.11,3.12", "-o", "build.cmd") == 0
    err = capsys.readouterr().err
    assert "wrote build.cmd: 4 cell(s) of sageattention 2.2.0" in err
    text = open("build.cmd", newline="").read()
    assert text.count("\r\n:cell_") == 4 and "sage-2_2_0-torch2_9-cu128-py311" in text


@pytest.mark.parametrize("argv, error, says", [
    (["sage", "--arch", "7.0", "--cuda", "12.8"], CompatError, "cannot build sageattention 2.2.0 torch 2.11.0 cu128"
     " py3.12 arch 7.0 [native]: sageattention 2.2.0 does not support sm_70 (it supports "),
    (["sage", "--arch", "9.0", "--max-jobs", "0"], UsageError, "--max-jobs must be between 1 and 1024"),
    (["sage", "--arch", "9.0", "--nvcc-threads", "1025"], UsageError, "--nvcc-threads must be between 1 and 1024"),
])
def test_the_windows_script_refuses_archs_the_recipe_cannot_build_and_bad_job_counts(argv, error, says):
    with pytest.raises(error, match="^" + re.escape(says)):
        render(*argv, "--shell", "cmd")


def test_the_windows_script_maps_archs_as_the_linux_plan_does(capsys):
    """Issue 34: flash-attn's 8.6 and 8.9 run its sm_80 cubin on Linux; the Windows script plans them alike."""
    assert render("fa2", "--arch", "80;86;89;90", "--torch", "2.8", "--cuda", "12.8", "--shell", "cmd") == 0
    text = capsys.readouterr().out
    assert 'set "FLASH_ATTN_CUDA_ARCHS=80;90"' in text and 'set "TORCH_CUDA_ARCH_LIST=8.0;9.0"' in text


def test_a_recipe_with_a_fixed_arch_list_renders_what_it_compiles(capsys):
    # flash-attn-3 compiles its own list whatever is asked: the knob is not set, the plan judges the request.
    assert render("fa3", "--arch", "9.0", "--shell", "cmd", "--torch", "2.8", "--cuda", "12.8") == 0
    out = capsys.readouterr().out
    assert out.startswith("@echo off\r\n") and "TORCH_CUDA_ARCH_LIST" not in out  # cmd.exe's line ends
    with pytest.raises(CompatError, match="does not compile sm_70 with CUDA 12.8"):
        render("fa3", "--arch", "7.0", "--shell", "cmd", "--torch", "2.8", "--cuda", "12.8")


def test_render_pins_the_base_image_the_lock_file_names(tmp_path, capsys):
    pinned = f"{SAGE_BASE}@sha256:" + "cd" * 32
    (tmp_path / "imagegen.lock").write_text(json.dumps({"schema": 1, "base_images": {SAGE_BASE: pinned}}))
    assert render("sage", *CELL) == 0
    out = capsys.readouterr().out
    assert f"ARG BASE_IMAGE={pinned}\n" in out and f"ARG BASE_IMAGE={SAGE_BASE}\n" not in out
    with pytest.raises(UsageError, match="--lock other.lock: no such file"):
        render("sage", *CELL, "--lock", "other.lock")


def test_render_to_a_file_writes_the_build_scripts_beside_it(tmp_path, capsys):
    target = tmp_path / "out" / "Dockerfile"
    assert render("sage", *CELL, "-o", target) == 0
    scripts = tmp_path / "out" / SCRIPTS_CONTEXT
    assert sorted(p.name for p in scripts.iterdir()) == ["imagegen_audit.py", "imagegen_audit_includes.py",
                                                         "imagegen_audit_links.py", "imagegen_audit_probe.py",
                                                         "imagegen_audit_records.py", "imagegen_build.py", "imagegen_buildenv.py",
                                                         "imagegen_ccache.py", "imagegen_check.py", "imagegen_fetch.py",
                                                         "imagegen_records.py", "imagegen_resume.py", "imagegen_rules.py",
                                                         "imagegen_sdist.py", "imagegen_supervise.py", "imagegen_toolchain.py",
                                                         "imagegen_wheeltools.py"]
    # Exactly what the Dockerfile copies from that build context (imagegen_*.py, the toolchain script first).
    copied = {name for line in target.read_text().splitlines() if line.startswith(f"COPY --from={SCRIPTS_CONTEXT} ")
              for name in line.split()[2:-1]}
    assert copied == {"imagegen_*.py", "imagegen_toolchain.py"}
    assert all(fnmatch.fnmatch(p.name, "imagegen_*.py") for p in scripts.iterdir())
    captured = capsys.readouterr()
    assert captured.out == ""
    cell_files = tmp_path / "out" / SAGE_NAME
    assert json.loads((cell_files / "cell.json").read_text())["recipe"] == "sageattention"
    assert captured.err == (f"wrote {target}, {scripts}/ and {cell_files}/: sageattention 2.2.0 torch 2.8.0 cu128 py3.12 arch 9.0"
                            f" [runpod] on {SAGE_BASE}\n")
    assert render("sage", *CELL, "-o", "-") == 0  # '-' is stdout: no scripts folder for it
    assert capsys.readouterr().out.startswith("# sageattention 2.2.0 for torch 2.8.0 (cu128), Python 3.12, archs 9.0\n")
    assert not (tmp_path / SCRIPTS_CONTEXT).exists()


# ------------------------------------------------------------------------------------------- bake


@pytest.fixture
def no_buildx(tmp_path, monkeypatch):
    """A docker CLI without the buildx plugin, first on PATH: bake writes its files and says they were not
    checked (with --print it would insist)."""
    folder = tmp_path / "no-buildx"
    folder.mkdir()
    docker = folder / "docker"
    docker.write_text("#!/bin/sh\necho \"docker: 'buildx' is not a docker command.\" >&2\nexit 1\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def wrote(err: str) -> list[str]:
    """The files bake says it wrote (its stderr, less the warning that buildx did not check them)."""
    lines = err.splitlines()
    assert all(line.startswith(("wrote ", "imagegen: warning: ")) for line in lines), err
    return [line.removeprefix("wrote ") for line in lines if line.startswith("wrote ")]


def test_bake_writes_one_dockerfile_per_cell_and_the_bake_file(tmp_path, no_buildx, capsys):
    assert bake("sage", "fa2", *CELL[:6], "--arch", "9.0", "-f", "matrix.json", "--dockerfiles", "df") == 0
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert sorted(data["target"]) == ["fa2-2_8_3-torch2_8-cu128-py312", SAGE_NAME]
    sage = data["target"][SAGE_NAME]
    assert sage["context"] == "df" and sage["dockerfile"] == f"{SAGE_NAME}.Dockerfile"
    assert sage["output"] == ["type=local,dest=wheelhouse/sageattention-2.2.0/torch2.8/cu128"]
    assert (tmp_path / "df" / f"{SAGE_NAME}.Dockerfile").read_text().startswith("# sageattention 2.2.0 for torch")
    assert json.loads((tmp_path / "df" / SAGE_NAME / "cell.json").read_text())["recipe"] == "sageattention"
    assert (tmp_path / "df" / SCRIPTS_CONTEXT / "imagegen_build.py").is_file()
    err = capsys.readouterr().err
    assert wrote(err)[-1] == str(tmp_path / "matrix.json")
    assert str(tmp_path / "df" / f"{SAGE_NAME}.Dockerfile") in wrote(err)
    assert f"imagegen: warning: {tmp_path / 'matrix.json'} not checked with buildx" in err
    assert capsys.readouterr().out == ""  # without --print nothing is shown


def test_bake_skips_rejected_cells_and_refuses_a_matrix_with_none_buildable(tmp_path, no_buildx, capsys):
    assert bake("sage", "--torch", "2.8", "--cuda", "12.6", "--cuda", "12.8", "--python", "3.12", "--arch",
                "12.0") == 0
    err = capsys.readouterr().err
    assert err.startswith("skipping sage-2_2_0-torch2_8-cu126-py312: sm_120 needs CUDA >= 12.8")
    hcl = (tmp_path / "docker-bake.hcl").read_text()
    assert f'target "{SAGE_NAME}"' in hcl and 'target "sage-2_2_0-torch2_8-cu126-py312"' not in hcl
    assert [p.name for p in tmp_path.glob("dockerfiles/*.Dockerfile")] == [f"{SAGE_NAME}.Dockerfile"]
    for f in (tmp_path / "docker-bake.hcl", *tmp_path.glob("dockerfiles/*.Dockerfile")):
        f.unlink()
    with pytest.raises(NothingToDoError, match="no cell of this matrix can build"):
        bake("sage", *CELL[:6], "--arch", "7.0")
    assert not (tmp_path / "docker-bake.hcl").exists() and not list(tmp_path.glob("dockerfiles/*.Dockerfile"))


def test_bake_output_folder_comes_from_out_or_the_config_relative_to_here(tmp_path, no_buildx, monkeypatch):
    (tmp_path / "imagegen.toml").write_text('out = "project/wh"\n')
    here = tmp_path / "project"
    here.mkdir()
    monkeypatch.chdir(here)  # the config is found in the folder above
    assert bake("sage", *CELL, "-f", "b.json") == 0
    output = json.loads((here / "b.json").read_text())["target"][SAGE_NAME]["output"]
    assert output == ["type=local,dest=wh/sageattention-2.2.0/torch2.8/cu128"]  # the config's, from here
    assert bake("sage", *CELL, "-f", "b.json", "--out", "elsewhere") == 0
    assert json.loads((here / "b.json").read_text())["target"][SAGE_NAME]["output"] == [
        "type=local,dest=elsewhere/sageattention-2.2.0/torch2.8/cu128"]
    (here / "a-file").write_text("")
    with pytest.raises(UsageError, match="^--out a-file: exists and is not a folder"):
        bake("sage", *CELL, "--out", "a-file")


def test_bake_repo_regenerates_the_repositorys_files_and_removes_stale_ones(tmp_path, capsys):
    assert bake("--repo") == 0
    written = {line.removeprefix("wrote ") for line in capsys.readouterr().err.splitlines()}
    assert str(tmp_path / "docker-bake.hcl") in written
    assert any(p.endswith(".Dockerfile") for p in written)
    assert any(p.startswith(str(tmp_path / "bake")) for p in written)
    # Up to date: nothing rewritten.
    assert bake("--repo") == 0 and capsys.readouterr().err == ""
    # A Dockerfile of a cell that left the matrix goes; a file of the user's stays.
    stale = tmp_path / "dockerfiles" / "gone-cell.Dockerfile"
    stale.write_text("FROM scratch\n")
    keep = tmp_path / "dockerfiles" / "notes.txt"
    keep.write_text("mine\n")
    assert bake("--repo") == 0
    assert capsys.readouterr().err == f"wrote {stale}\n" and not stale.exists() and keep.read_text() == "mine\n"


# ----------------------------------------------------- render --shell from the user's venv (issue 34 item 3)


def test_the_windows_cell_is_the_python_exes_torch_cuda_and_python(tmp_path, capsys):
    from tests.unit.command_helpers import fake_host
    venv = fake_host(tmp_path, python="3.11", torch="2.8.0", torch_cuda="12.9")
    assert render("fa2", "--arch", "8.0;12.0", "--shell", "cmd", "--python-exe", venv) == 0
    out = capsys.readouterr().out
    assert 'set "IG_CELL=fa2-2_8_3-torch2_8-cu129-py311"' in out and 'set "IG_TORCH=2.8.0"' in out
    assert "if defined IG_PYTHON_EXE goto :have_python" in out  # its torch is checked, not installed


@pytest.mark.parametrize("facts, argv, says", [
    ({"torch": None}, [], "has no torch (none): install the torch you build for into it, or give --torch and --cuda"
                          " with --install-torch"),
    ({"torch_cuda": None}, [], "has torch 2.8.0, a CPU-only build: install a CUDA build of torch into it"),
    ({}, ["--torch", "2.9"], "--torch 2.9 asked, but --python-exe"),
    ({}, ["--cuda", "12.8"], "--cuda 12.8 asked, but --python-exe"),
    ({}, ["--python", "3.10"], "--python 3.10 asked, but --python-exe"),
    ({}, ["--torch", "2.8,2.9"], "--python-exe builds with that interpreter's torch as it is: one cell only, and"
                                 " --torch 2.8 2.9 asks for several"),
])
def test_a_python_exe_that_cannot_be_the_cell_is_one_line(tmp_path, facts, argv, says):
    from tests.unit.command_helpers import fake_host
    venv = fake_host(tmp_path, **{"python": "3.12", "torch": "2.8.0", "torch_cuda": "12.9", **facts})
    with pytest.raises(UsageError) as info:
        render("fa2", "--arch", "8.0", "--shell", "cmd", "--python-exe", venv, *argv)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_python_exe_that_is_not_here_needs_the_flags(capsys):
    exe = "D:\\omni\\.venv\\Scripts\\python.exe"
    with pytest.raises(UsageError, match="not found: render where the script runs, or give --torch, --cuda and"
                                         " --python"):
        render("fa2", "--arch", "8.0", "--shell", "cmd", "--python-exe", exe, "--torch", "2.8")
    # all three given: nothing is run here, the script checks them against the interpreter when it runs
    assert render("fa2", "--arch", "8.0", "--shell", "cmd", "--python-exe", exe, "--torch", "2.8", "--cuda", "12.9",
                  "--python", "3.12") == 0


@pytest.mark.parametrize("shell, line", [
    ("cmd", "if defined IG_PYTHON_EXE goto :have_venv"),
    ("powershell", "Invoke-Checked \"install torch $($Cell.Torch) from $($Cell.IndexUrl) into $py (--install-torch)\""),
])
def test_install_torch_puts_the_cells_torch_into_the_python_exe(tmp_path, capsys, shell, line):
    from tests.unit.command_helpers import fake_host
    venv = fake_host(tmp_path, torch=None)  # no torch yet: --install-torch with the torch asked for
    assert render("fa2", "--arch", "8.0", "--shell", shell, "--python-exe", venv, "--install-torch", "--torch", "2.8",
                  "--cuda", "12.8") == 0
    assert line in capsys.readouterr().out


def test_install_torch_goes_with_python_exe():
    with pytest.raises(UsageError, match="^--install-torch goes with --python-exe"):
        render("fa2", "--arch", "8.0", "--shell", "cmd", "--install-torch")
    with pytest.raises(UsageError, match="^--install-torch goes with --shell cmd|powershell \\(a native Windows"):
        render("fa2", "--arch", "8.0", "--install-torch")
