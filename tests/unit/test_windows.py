"""Windows scripts (seed 002): golden files for cmd and PowerShell, and hostile values refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imagegen.errors import UnsafeValueError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.render.windows import render_script
from tests.unit.test_cli import run

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SEED_002 = ["render", "flash-attn", "--arch", "8.0;120", "--src-dir", r"D:\omni\flash-attention",
            "--python-exe", r"..\.venv\Scripts\python.exe"]


@pytest.mark.parametrize("shell, suffix", [("cmd", "cmd"), ("powershell", "ps1")])
def test_seed_002_golden(shell, suffix):
    code, out, err = run(*SEED_002, "--shell", shell)
    assert code == 0, err
    path = GOLDEN / f"flash-attn-windows.{suffix}"
    if os.environ.get("IMAGEGEN_UPDATE_GOLDEN"):
        path.write_bytes(out.encode())
    assert out == path.read_bytes().decode(), f"{path.name} differs: review, then IMAGEGEN_UPDATE_GOLDEN=1"


def test_cmd_script_has_what_seed_002_sets():
    code, out, _ = run(*SEED_002, "--shell", "cmd")
    lines = out.split("\r\n")
    for expected in ['set "MAX_JOBS=1"', 'set "NVCC_THREADS=1"', 'set "FLASH_ATTENTION_FORCE_BUILD=TRUE"',
                     'set "BUILD_TARGET=cuda"', 'set "DISTUTILS_USE_SDK=1"', 'set "FLASH_ATTN_CUDA_ARCHS=80;120"']:
        assert expected in lines
    assert any(line.startswith('call "C:\\Program Files\\Microsoft Visual Studio\\2022') and line.endswith("x64 || exit /b 1")
               for line in lines)
    assert all(not line.endswith(" ") or line.startswith("rem") or "pip install" in line for line in lines if line.startswith("set"))
    assert '-m pip wheel --no-build-isolation --no-deps -w dist .' in out


def test_more_jobs_when_asked():
    code, out, _ = run(*SEED_002, "--shell", "powershell", "--max-jobs", "4", "--nvcc-threads", "2")
    assert "$env:MAX_JOBS = '4'" in out and "$env:NVCC_THREADS = '2'" in out


@pytest.mark.parametrize("field, value", [
    ("src", 'D:\\x" & del C:\\ & "'), ("src", "D:\\%PATH%"), ("python", "py.exe & calc"),
])
def test_cmd_refuses_hostile_paths(field, value):
    r = load_catalogue().get("flash-attn")
    kw = {"src": "D:\\src", "python": "python", field: value}
    with pytest.raises(UnsafeValueError):
        render_script("cmd", r, r.version(None), parse_arch_list("8.0"), **kw)


def test_powershell_quotes_and_refuses():
    r = load_catalogue().get("flash-attn")
    out = render_script("powershell", r, r.version(None), parse_arch_list("8.0"), src="D:\\it's", python="python")
    assert "'D:\\it''s'" in out
    with pytest.raises(UnsafeValueError):
        render_script("powershell", r, r.version(None), parse_arch_list("8.0"), src="D:\\$(calc)", python="python")


def test_unsupported_arch_is_one_line():
    code, _, err = run("render", "flash-attn", "--shell", "cmd", "--arch", "7.5")
    assert code == 2 and "flash-attn 2.8.3 does not support sm_75" in err


def test_a_version_that_predates_ext_parallel_gets_the_whole_job_budget():
    from imagegen.render.windows import build_env

    sage = load_catalogue().get("sage")
    archs = parse_arch_list("9.0")
    new = dict(build_env(sage, sage.version("2.2.0"), archs, 8, 2, None))
    old = dict(build_env(sage, sage.version("2.1.1"), archs, 8, 2, None))
    assert "EXT_PARALLEL" in new and int(new["EXT_PARALLEL"]) * int(new["MAX_JOBS"]) <= 8
    assert "EXT_PARALLEL" not in old and old["MAX_JOBS"] == "8"
