"""Windows scripts (seeds 001 and 002): one or many cells planned by the real planner, golden files for
cmd and PowerShell (tests/golden/windows/, regenerated with IMAGEGEN_UPDATE_GOLDEN=1), every native
command's exit code checked, the scripts parsed by real parsers, refusals in one line, and hostile values
refused. What the scripts' helper does is tested for real in test_imagegen_windows.py.

The parsers are the tree-sitter grammars from PyPI, tree-sitter-powershell (airbus-cert's grammar) and
tree-sitter-batch: they are not Microsoft's PowerShell or cmd.exe parsers (neither runs on Linux), but they
fail on an unbalanced brace or parenthesis, an unterminated string or here-string, and a stray token."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from imagegen.errors import CompatError, UnsafeValueError, UsageError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.compat import cuda_variant
from imagegen.model.cell import WindowsHost
from imagegen.plan.matrix import choose_cell, windows_plan
from imagegen.render.windows import HELPER_MODULES, build_env, render_script
from tests.unit.test_cli import run

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "windows"
SEED_002 = ["render", "flash-attn", "--arch", "8.0;120", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12",
            "--src-dir", r"D:\omni\flash-attention", "--python-exe", r"..\.venv\Scripts\python.exe"]
SAGE_TWO_TORCHES = ["render", "sage", "--version", "2.2.0", "--torch", "2.8,2.9", "--cuda", "12.8", "--python", "3.12",
                    "--arch", "8.0;9.0;12.0+PTX"]
GOLDENS = {"flash-attn-seed-002": SEED_002, "sage-2.2.0-torch2.8-2.9-cu128": SAGE_TWO_TORCHES}
SUFFIX = {"cmd": "cmd", "powershell": "ps1"}


def windows_cells(recipe, version, archs, *, torch=(), cuda=(), python=()):
    """(buildable, rejected) cells of one Windows script, from the one planner."""
    plan = windows_plan([(recipe, version)], [archs], WindowsHost(), torch=torch, cuda=cuda, python=python)
    return plan.buildable, plan.rejected


def windows_cell(recipe, version, archs, torch, cuda, python):
    """The Windows cell of exactly these values (rejected or not)."""
    return choose_cell(recipe, version, archs, torch=torch, cuda=cuda.name, python=python, flavor="native",
                       strict=False, windows=WindowsHost())


def rendered(argv: list[str], shell: str) -> str:
    code, out, err = run(*argv, "--shell", shell)
    assert code == 0, err
    return out


def parse_errors(text: str, shell: str) -> list[str]:
    """ERROR and MISSING nodes of the script's tree-sitter parse tree, each with its line."""
    ts = pytest.importorskip("tree_sitter")
    grammar = pytest.importorskip("tree_sitter_powershell" if shell == "powershell" else "tree_sitter_batch")
    tree = ts.Parser(ts.Language(grammar.language())).parse(text.encode())
    found, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            found.append(f"{node.type} at line {node.start_point[0] + 1}: {text.splitlines()[node.start_point[0]][:100]}")
        stack.extend(node.children)
    return found


# --------------------------------------------------------------------------------------- goldens


@pytest.mark.parametrize("shell", SUFFIX)
@pytest.mark.parametrize("name", GOLDENS)
def test_golden(name, shell):
    out = rendered(GOLDENS[name], shell)
    path = GOLDEN / f"{name}.{SUFFIX[shell]}"
    if os.environ.get("IMAGEGEN_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(out.encode())
    assert out == path.read_bytes().decode(), f"{path.name} differs: review, then IMAGEGEN_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.*")), ids=lambda p: p.name)
def test_every_golden_parses(path):
    shell = "powershell" if path.suffix == ".ps1" else "cmd"
    assert parse_errors(path.read_bytes().decode(), shell) == []


def test_the_parsers_do_find_broken_scripts():
    # The test above can only fail if the parsers refuse what PowerShell and cmd would refuse.
    assert parse_errors("if ($x -eq 1) {\n    Write-Host 'a'\n", "powershell")
    assert parse_errors("[IO.File]::WriteAllText($p, @'\nprint(1)\n", "powershell")
    assert parse_errors("@echo off\nif x==y (\necho a\n", "cmd")
    assert parse_errors('set "A=1\n', "cmd")


# ------------------------------------------------------------------------------ what each cell does


def test_one_script_builds_every_cell_in_turn_and_goes_on_past_a_failure():
    ps = rendered(SAGE_TWO_TORCHES, "powershell")
    assert "Name = 'sage-2_2_0-torch2_8-cu128-py312'; Torch = '2.8.0'" in ps
    assert "Name = 'sage-2_2_0-torch2_9-cu128-py312'; Torch = '2.9.1'" in ps
    assert "foreach ($cell in $Cells) {" in ps and "$Failed += $cell.Name" in ps
    assert ps.rstrip().endswith("if ($Failed.Count -gt 0) {\n    Write-Step \"FAILED: $($Failed -join ', ')\"\n    exit 1\n}\nexit 0")
    cmd = rendered(SAGE_TWO_TORCHES, "cmd").split("\r\n")
    assert cmd.count("call :cell_1") == 1 and cmd.count("call :cell_2") == 1
    assert 'if errorlevel 1 (set "IG_FAILED=%IG_FAILED% sage-2_2_0-torch2_9-cu128-py312") else' \
           ' (set "IG_BUILT=%IG_BUILT% sage-2_2_0-torch2_9-cu128-py312")' in cmd
    assert cmd[cmd.index(":some_failed") + 2] == "exit /b 1"


@pytest.mark.parametrize("shell", SUFFIX)
def test_each_cell_selects_its_cuda_toolkit_and_python(shell):
    out = rendered(SAGE_TWO_TORCHES, shell)
    if shell == "powershell":
        assert "CudaPathVar = 'CUDA_PATH_V12_8'" in out
        assert "$cudaRoot = [Environment]::GetEnvironmentVariable($Cell.CudaPathVar)" in out
        assert "$env:CUDA_PATH = $cudaRoot" in out and "$env:CUDA_HOME = $cudaRoot" in out
        assert "$env:Path = (Join-Path $cudaRoot 'bin') + ';' + $env:Path" in out
        assert "CUDA $($Cell.Toolkit) is not installed" in out
        assert "'py' @(\"-$($Cell.Python)\", '-m', 'venv', $venv)" in out
        assert "\"torch==$($Cell.Torch)\", '--index-url', $Cell.IndexUrl" in out
        assert "IndexUrl = 'https://download.pytorch.org/whl/cu128'" in out  # never PyPI's CPU-only torch
    else:
        lines = out.split("\r\n")
        for line in ['if not defined CUDA_PATH_V12_8 goto :no_cuda', 'set "CUDA_PATH=%CUDA_PATH_V12_8%"',
                     'set "CUDA_HOME=%CUDA_PATH_V12_8%"', 'set "PATH=%CUDA_PATH_V12_8%\\bin;%PATH%"',
                     'set "IG_PY_VERSION=3.12"', 'set "IG_INDEX_URL=https://download.pytorch.org/whl/cu128"',
                     'py -%IG_PY_VERSION% -m venv "%IG_WORK%\\venv\\%IG_CELL%" >> "%IG_LOG%" 2>&1 || goto :step_failed']:
            assert line in lines, line


@pytest.mark.parametrize("shell", SUFFIX)
def test_the_steps_come_in_order(shell):
    out = rendered(SAGE_TWO_TORCHES, shell)
    body = out[out.index("function Build-Cell" if shell == "powershell" else ":build_cell\r\n"):]
    if shell == "powershell":
        steps = ["'venv', $venv", "torch==", "'check', '--doc'", "+ $Requires +", "'fetch', '--doc'", "$Cell.Env.Keys", "'pip', 'wheel'",
                 "'retag', '--doc'", "'verify', '--doc'", "'smoke', '--doc'", "'place', '--doc'"]
    else:
        steps = ["-m venv", "torch==", " check --doc", '"psutil" "torch==', " fetch --doc", "pip wheel", " retag --doc", " verify --doc",
                 " smoke --doc", " place --doc"]
    at = [body.index(s) for s in steps]
    assert at == sorted(at), dict(zip(steps, at))


def test_powershell_checks_every_native_commands_exit_code():
    ps = rendered(SAGE_TWO_TORCHES, "powershell")
    lines = ps.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*(\$\w+ = )?& ", line):  # a native call
            inside_helper = "& $Exe @Arguments" in line
            checked = inside_helper or "$LASTEXITCODE" in lines[i + 1]
            assert checked, line
    helper = ps[ps.index("function Invoke-Checked"):ps.index("function Get-EnvSnapshot")]
    assert "$code = $LASTEXITCODE" in helper and "if ($code -ne 0) { throw" in helper
    # Every other native program runs through the helper: py, the cell's python, pip.
    assert ps.count("Invoke-Checked '") + ps.count('Invoke-Checked "') >= 10
    assert "$ErrorActionPreference = 'Stop'" in ps


def test_cmd_checks_every_native_commands_exit_code():
    lines = rendered(SAGE_TWO_TORCHES, "cmd").split("\r\n")
    native = [ln for ln in lines if ln.startswith(('"%IG_PY%"', "py ", "pushd", "mkdir", "if not exist \"%IG_"))]
    assert len(native) >= 11
    for line in native:
        assert line.endswith(("|| goto :step_failed", "|| (popd & goto :step_failed)", "|| exit /b 1")), line
    at = lines.index('call "C:\\Program Files\\Microsoft Visual Studio\\2022\\Community\\VC\\Auxiliary\\Build\\vcvarsall.bat" x64 >nul')
    assert lines[at + 1] == "if errorlevel 1 goto :vs_failed"


@pytest.mark.parametrize("shell", SUFFIX)
def test_vcvars_is_loaded_only_where_it_is_not_already(shell):
    out = rendered(SEED_002, shell)
    if shell == "powershell":
        assert "if ($env:VSCMD_ARG_TGT_ARCH -ne 'x64') {" in out
    else:
        assert 'if /i "%VSCMD_ARG_TGT_ARCH%"=="x64" goto :vs_ready' in out


def test_cmd_script_has_what_seed_002_sets():
    lines = rendered(SEED_002, "cmd").split("\r\n")
    for expected in ['set "MAX_JOBS=1"', 'set "NVCC_THREADS=1"', 'set "FLASH_ATTENTION_FORCE_BUILD=TRUE"',
                     'set "BUILD_TARGET=cuda"', 'set "DISTUTILS_USE_SDK=1"', 'set "FLASH_ATTN_CUDA_ARCHS=80;120"',
                     'set "IG_PYTHON_EXE=..\\.venv\\Scripts\\python.exe"']:
        assert expected in lines
    assert all(not line.endswith(" ") for line in lines if line.startswith("set "))
    assert any('-m pip wheel --no-build-isolation --no-deps -w "%IG_DIST%" .' in line for line in lines)
    assert max(len(line) for line in lines) < 8191  # cmd's line limit, base64 chunks included


def test_more_jobs_when_asked():
    out = rendered(SEED_002, "powershell")
    assert "'MAX_JOBS' = '1'" in out
    code, out, _ = run(*SEED_002, "--shell", "powershell", "--max-jobs", "4", "--nvcc-threads", "2")
    assert "'MAX_JOBS' = '4'" in out and "'NVCC_THREADS' = '2'" in out


def test_the_embedded_build_document_carries_patches_local_versions_and_archs():
    import json
    ps = rendered(SAGE_TWO_TORCHES, "powershell")
    start = ps.index("[IO.File]::WriteAllText($Doc, @'\n") + len("[IO.File]::WriteAllText($Doc, @'\n")
    doc = json.loads(ps[start:ps.index("'@)", start)])
    assert [p["name"] for p in doc["patches"]] == ["sageattention-2.2.0-sm90-fake-name.patch",
                                                   "sageattention-2.2.0-per-extension-archs.patch"]
    assert [(c["local_version"], c["wheel_dir"]) for c in doc["cells"]] == [
        ("cu128torch2.8", "sageattention-2.2.0/torch2.8/cu128"), ("cu128torch2.9", "sageattention-2.2.0/torch2.9/cu128")]
    assert [e["sass"] for e in doc["cells"][0]["expected"]] == ["sm_80", "sm_90a", "sm_120"]
    assert [e["ptx"] for e in doc["cells"][0]["expected"]] == [None, None, "compute_120"]
    assert doc["extension_archs"]["sageattention._qattn_sm90"] == ["9.0"]


def test_the_cmd_script_carries_the_same_helper_its_modules_and_document():
    import base64
    cmd = rendered(SAGE_TWO_TORCHES, "cmd").split("\r\n")
    shipped_dir = Path(__file__).resolve().parents[2] / "imagegen" / "shipped"
    start = cmd.index("(", cmd.index("rem imagegen_records.py) and the build document it reads, in base64; each cell's Python decodes them."))
    end = cmd.index(') > "%IG_HELPER%.b64"')
    helper = base64.b64decode("".join(line[5:] for line in cmd[start + 1:end])).decode()
    assert helper == (shipped_dir / "windows" / "imagegen_windows.py").read_text()
    # the modules it imports (its own, and those it shares with the Linux build), written beside it
    for folder, name in HELPER_MODULES:
        start, end = end + 1, cmd.index(f') > "%IG_WORK%\\{name}.b64"')
        module = base64.b64decode("".join(line[5:] for line in cmd[start + 1:end])).decode()
        assert module == (shipped_dir / folder / name).read_text()
        assert f'"%IG_WORK%\\{name}.b64" "%IG_WORK%\\{name}"' in next(line for line in cmd if "b64decode" in line)
    assert {("builder", "imagegen_wheeltools.py"), ("builder", "imagegen_records.py")} <= set(HELPER_MODULES)


def test_the_wheelhouse_is_the_out_flag_or_the_scripts_argument():
    code, out, _ = run(*SEED_002, "--shell", "powershell", "--out", r"D:\wheels")
    assert code == 0 and "[string]$Wheelhouse = 'D:\\wheels'," in out
    code, out, _ = run(*SEED_002, "--shell", "cmd", "--out", r"D:\wheels")
    assert 'set "IG_WHEELHOUSE=D:\\wheels"' in out and 'if not "%~1"=="" set "IG_WHEELHOUSE=%~1"' in out


# ------------------------------------------------------------------------------------------ cells


def test_cells_come_from_the_planner():
    sage = load_catalogue().get("sage")
    version = sage.version("2.2.0")
    cells, rejected = windows_cells(sage, version, parse_arch_list("12.0"), torch=("2.8", "2.9"), cuda=("12.8",),
                                    python=("3.11", "3.12"))
    assert [c.name for c in cells] == ["sage-2_2_0-torch2_8-cu128-py311", "sage-2_2_0-torch2_8-cu128-py312",
                                       "sage-2_2_0-torch2_9-cu128-py311", "sage-2_2_0-torch2_9-cu128-py312"]
    assert not rejected and all(c.flavor == "native" and c.base.nvcc.public == "12.8" for c in cells)
    _, rejected = windows_cells(sage, version, parse_arch_list("12.0"), torch=("2.8",), cuda=("12.6",), python=("3.12",))
    assert rejected[0].problems == ("sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected: use --cuda 12.8 or newer",)


def test_an_axis_not_given_is_the_newest_that_builds():
    sage = load_catalogue().get("sage")
    cells, _ = windows_cells(sage, sage.version("2.2.0"), parse_arch_list("8.0"), cuda=("12.6",), python=("3.12",))
    assert len(cells) == 1 and cells[0].cuda.name == "cu126" and cells[0].python == "3.12"
    cell = windows_cell(sage, sage.version("2.2.0"), parse_arch_list("8.0"), "2.8", cuda_variant("12.8"), "3.12")
    assert cell.torch_version == "2.8.0" and cell.buildable


# --------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("argv, code, message", [
    (["render", "sage", "--shell", "cmd", "--cuda", "12.6", "--arch", "12.0"], 3,
     "sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected"),
    (["render", "sage", "--shell", "powershell", "--torch", "2.8", "--cuda", "13.0"], 3, "torch 2.8 has no cu130 build"),
    (["render", "no-such-recipe", "--shell", "cmd"], 2, "unknown recipe 'no-such-recipe'"),
    (["render", "sage", "--shell", "powershell", "--arch", "sm_999"], 2, "unknown compute capability"),
    (["render", "sage", "--shell", "powershell", "--arch", "8.0;;x'y"], 2, "unknown GPU architecture"),
    (["render", "flash-attn", "--shell", "cmd", "--arch", "7.5"], 3, "flash-attn 2.8.3 does not support sm_75"),
    (["render", "flash-attn", "--shell", "cmd", "--torch", "2.8,2.9", "--python-exe", "py.exe"], 2,
     "--python-exe builds with that interpreter's torch as it is: one cell only"),
    (["render", "flash-attn", "--shell", "cmd", "--flavor", "cuda"], 2, "--flavor does not apply to --shell"),
    (["render", "flash-attn", "--audit"], 2, "--audit goes with --shell"),
    (["render", "flash-attn", "--torch", "2.8,2.9"], 2, "--torch takes one value here"),
])
def test_refusals_are_one_line_and_exit_non_zero(argv, code, message):
    got, out, err = run(*argv)
    assert got == code and message in err and out == "", err
    assert err.strip().count("\n") == 0 and "Traceback" not in err


def test_many_rejected_cells_are_each_named():
    got, _, err = run("render", "sage", "--shell", "cmd", "--torch", "2.8,2.9", "--cuda", "12.6", "--arch", "12.0")
    lines = err.strip().splitlines()
    assert got == 3 and len(lines) == 3 and "and 1 more of the 2 cells: sage-2_2_0-torch2_9-cu126-py312" in lines[-1]
    assert lines[0].startswith("[sage-2_2_0-torch2_8-cu126-py312] rejected: sm_120 needs CUDA >= 12.8")


def test_a_list_with_a_rejected_cell_renders_the_others_and_names_it():
    # torch 2.8 with CUDA 12.6 cannot build sm_120 (rejected); 2.9 with 12.8 can: the script builds that one
    got, out, err = run("render", "sage", "--shell", "cmd", "--torch", "2.8,2.9", "--cuda", "12.6,12.8", "--arch", "12.0")
    assert got == 0 and "rem Generated by imagegen" in out and ", 2 cell(s)." in out, err
    assert "[sage-2_2_0-torch2_8-cu126-py312] rejected: sm_120 needs CUDA >= 12.8" in err
    assert "imagegen: the script leaves out 2 rejected cell(s) of 4 (reasons above)" in err
    assert "cu126" not in out and "sage-2_2_0-torch2_9-cu128-py312" in out


def test_audit_says_in_one_line_why_it_cannot_run_for_a_windows_cell():
    got, out, err = run(*SEED_002, "--shell", "powershell", "--audit")
    assert got == 0 and out.startswith("# Generated by imagegen")
    assert err.count("\n") == 1 and "--audit: the gencode audit" in err and "cannot run a Windows build" in err


def test_render_script_refuses_many_cells_with_one_interpreter():
    fa = load_catalogue().get("flash-attn")
    version = fa.version(None)
    cells, _ = windows_cells(fa, version, parse_arch_list("8.0"), torch=("2.8", "2.9"), cuda=("12.8",), python=("3.12",))
    with pytest.raises(UnsafeValueError, match="one cell only"):
        render_script("cmd", fa, version, cells, src="fa", python_exe="python.exe")
    with pytest.raises(CompatError):
        render_script("cmd", fa, version, [], src="fa")


# ------------------------------------------------------------------------------------ hostile values


def one_cell(name: str = "flash-attn"):
    r = load_catalogue().get(name)
    version = r.version(None)
    return r, version, [windows_cell(r, version, parse_arch_list("8.0"), "2.8", cuda_variant("12.8"), "3.12")]


@pytest.mark.parametrize("field, value", [
    ("src", 'D:\\x" & del C:\\ & "'), ("src", "D:\\%PATH%"), ("python_exe", "py.exe & calc"), ("src", "D:\\a!b"),
    ("out", "D:\\w^x"), ("out", "D:\\w|x"), ("vcvars", 'C:\\v"s.bat'),
])
def test_cmd_refuses_hostile_paths(field, value):
    r, version, cells = one_cell()
    kw = {"src": "D:\\src", "python_exe": None, field: value}
    with pytest.raises(UnsafeValueError):
        render_script("cmd", r, version, cells, **kw)


@pytest.mark.parametrize("field, value", [
    ("src", "D:\\$(calc)"), ("src", "D:\\`ncalc"), ("python_exe", "C:\\py$env:X.exe"), ("out", "D:\\w\nx"),
    ("vcvars", "C:\\v'$(calc).bat"),
])
def test_powershell_refuses_hostile_values(field, value):
    r, version, cells = one_cell()
    kw = {"src": "D:\\src", "python_exe": None, field: value}
    with pytest.raises(UnsafeValueError):
        render_script("powershell", r, version, cells, **kw)


@pytest.mark.parametrize("field, value", [
    ("src", "D:\\it's here"), ("src", "D:\\My Projects (x86)\\flash-attention"), ("python_exe", "C:\\Py 3.12\\python.exe"),
    ("out", "D:\\wheels; and more"), ("src", "D:\\a#b{c}[d]"), ("vcvars", "C:\\Program Files (x86)\\VS\\vcvarsall.bat"),
    ("src", "D:\\caf\u00e9"), ("src", "D:\\it\u2019s"), ("python_exe", "python"),
])
@pytest.mark.parametrize("shell", SUFFIX)
def test_hostile_but_accepted_values_stay_quoted_and_parse(shell, field, value):
    r, version, cells = one_cell()
    kw = {"src": "D:\\src", "python_exe": None, field: value}
    out = render_script(shell, r, version, cells, **kw)
    if shell == "powershell":
        assert "'" + re.sub("(['\u2019])", r"\1\1", value) + "'" in out
    assert parse_errors(out, shell) == []
    baseline = render_script(shell, r, version, cells, src="D:\\src", python_exe="python" if field == "python_exe" else None)
    assert len(out.splitlines()) == len(baseline.splitlines())  # a value never adds or ends a line


def test_powershell_doubles_single_quotes():
    r, version, cells = one_cell()
    out = render_script("powershell", r, version, cells, src="D:\\it's", python_exe=None)
    assert "GetUnresolvedProviderPathFromPSPath('D:\\it''s')" in out


def test_a_hostile_torch_index_override_is_refused():
    r, version, cells = one_cell()
    with pytest.raises(UnsafeValueError):
        render_script("cmd", r, version, cells, src="src", index_override="https://x.example/%PATH%/{cuda}")


def test_a_version_that_predates_ext_parallel_gets_the_whole_job_budget():
    sage = load_catalogue().get("sage")
    archs = parse_arch_list("9.0")
    new = dict(build_env(sage, sage.version("2.2.0"), archs, 8, 2, None))
    old = dict(build_env(sage, sage.version("2.1.1"), archs, 8, 2, None))
    assert "EXT_PARALLEL" in new and int(new["EXT_PARALLEL"]) * int(new["MAX_JOBS"]) <= 8
    assert "EXT_PARALLEL" not in old and old["MAX_JOBS"] == "8"


# --------------------------------------------------------------------------------------------
# Issue 37: MSVC and the C++ standard; a script patches one tree, so its cells share their patches


def test_msvc_refuses_cxx17_from_torch_2_13_where_linux_only_warns():
    xf = load_catalogue().get("xformers")
    version = replace(xf.version(None), by_torch=())  # as it was before its by_torch patch
    ok = windows_cell(xf, version, parse_arch_list("9.0"), "2.12", cuda_variant("13.0"), "3.12")
    assert ok.buildable
    refused = windows_cell(xf, version, parse_arch_list("9.0"), "2.13", cuda_variant("13.0"), "3.12")
    assert not refused.buildable and refused.problems == (
        "xformers 0.0.35 (recipe: cxx_std 17) compiles with /std:c++17 but torch 2.13's headers require C++20 or later"
        " with MSVC: use --torch 2.12 or older, or give the recipe's version a by_torch entry for torch 2.13 with a"
        " patch that raises the standard (and cxx_std: 20)",)
    for name in ("sage", "xformers"):  # their by_torch patch raises the standard (/std: too): MSVC builds them
        r = load_catalogue().get(name)
        assert windows_cell(r, r.version(None), parse_arch_list("9.0"), "2.13", cuda_variant("13.0"), "3.12").buildable


def test_a_script_whose_cells_need_different_patches_is_refused_in_one_line():
    sage = load_catalogue().get("sage")
    version = sage.version("2.2.0")
    cells, _ = windows_cells(sage, version, parse_arch_list("9.0"), torch=("2.11", "2.13"), cuda=("13.0",), python=("3.12",))
    with pytest.raises(UsageError) as info:
        render_script("powershell", sage, version, cells, src="sage")
    assert str(info.value) == (
        "sageattention 2.2.0: the cells need different recipe patches (torch 2.11: none; torch 2.13:"
        " sageattention-2.2.0-cxx-std-from-torch.patch) and one script patches one source tree: render one script"
        " per group of --torch values")
    cells, _ = windows_cells(sage, version, parse_arch_list("9.0"), torch=("2.12", "2.13"), cuda=("13.0",), python=("3.12",))
    text = render_script("powershell", sage, version, cells, src="sage")
    assert "sageattention-2.2.0-cxx-std-from-torch.patch" in text


@pytest.mark.parametrize("shell, comment", [("cmd", "rem"), ("powershell", "#")])
@pytest.mark.parametrize("git", ["https://github.com/me/flash-attention@0123456789abcdef0123456789abcdef01234567",
                                 "git@github.com:me/flash-attention.git@0123456789abcdef0123456789abcdef01234567"])
def test_the_rerender_line_keeps_the_at_of_git_url_at_sha(shell, comment, git):
    text = rendered(["render", "fa2", "--version", "2.8.3", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12",
                     "--arch", "8.0", "--git", git], shell)
    assert f"{comment} Re-render with: imagegen render fa2 --version 2.8.3 --torch 2.8 --cuda 12.8 --python 3.12" \
           f" --arch 8.0 --git {git} --shell {shell}" in text.splitlines()[:3]
