"""Tests for imagegen.commands.planning: `imagegen plan` (and --audit), `recipes` and `archs`.

plan: the JSON cell record, the table and its --only filter, the flags that go with --audit, the audit's
refusals before the engine, and a native audit of a local project with a stand-in host Python; recipes:
text and JSON, extra recipe dirs, --lock; archs: every consumer's format, the numeric knobs' mapping,
problems with exit 3."""

from __future__ import annotations

import json
import shutil

import pytest

from imagegen.commands import planning
from imagegen.errors import ArchError, CompatError, NothingToDoError, UsageError
from imagegen.executors import buildx_audit
from imagegen.model.catalogue import load_catalogue
from tests.unit.command_helpers import CELL, FIXTURES, TINY, call, fake_host, never

MATRIX_2 = ["--torch", "2.8", "--cuda", "12.6", "--cuda", "12.8", "--python", "3.12", "--arch", "12.0"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(buildx_audit, "audit", never("the audit in the builder image"))


def plan(*argv) -> int:
    return call(planning.cmd_plan, "plan", *argv)


# ------------------------------------------------------------------------------------------- plan


def test_plan_json_records_what_was_asked_and_what_the_package_compiles(capsys):
    assert plan("fa2", *CELL[:6], "--arch", "8.6;9.0", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    (cell,) = data["cells"]
    assert cell["archs"] == "8.0;9.0" and cell["requested_archs"] == "8.6;9.0" and cell["expected_archs"] == "8.0;9.0"
    assert cell["notes"] == ["8.6 runs the sm_80 cubin"] and cell["reasons"] == []
    assert (cell["recipe"], cell["version"], cell["torch"], cell["cuda"], cell["python"]) == \
        ("flash-attn", "2.8.3", "2.8.0", "cu128", "3.12")
    assert cell["wheel_dir"] == "flash-attn-2.8.3/torch2.8/cu128" and cell["base_image"].startswith("runpod/pytorch:")
    assert cell["torch_from"] == "image"  # runpod's torch 2.8.0 cu128 in its Python 3.12: reused
    assert data["summary"] == {"buildable": 1, "rejected": 0, "skipped": 0, "total": 1}


def test_plan_json_of_a_matrix_that_cannot_build_is_printed_then_refused(capsys):
    with pytest.raises(NothingToDoError, match="the reasons are listed above") as info:
        plan("sage", *CELL[:6], "--arch", "7.0", "--json")
    assert info.value.exit_code == 3
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["status"] == "rejected" and cell["expected_archs"] is None
    assert cell["reasons"] == ["sageattention 2.2.0 does not support sm_70 (it supports 8.0, 8.6, 8.9, 9.0, 12.0)"]


def test_plan_table_is_aligned_and_only_filters_rows_not_the_summary(capsys):
    assert plan("sage", *MATRIX_2) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["STATUS", "RECIPE", "VERSION", "TORCH", "CUDA", "PY", "ARCHS", "WHY"]
    assert {line.index("sageattention") for line in lines[1:3]} == {lines[0].index("RECIPE")}
    assert [line.split()[0] for line in lines[1:3]] == ["rejected", "buildable"]
    assert lines[1].endswith("sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected: use --cuda 12.8 or newer")
    # a buildable row: its base image, and whether the builder reuses that image's torch
    assert lines[2].endswith("runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404: torch 2.8.0 (cu128) of the base image, reused")
    # the summary, then what the default policy filled (no --flavor here)
    assert lines[-2:] == ["1 buildable, 1 rejected, 0 skipped of 2 cells",
                          "flavor not named: flavor runpod (else manylinux or cuda or pypi where runpod has no image for that CUDA)"]
    assert plan("sage", *MATRIX_2, "--only", "buildable") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:-3]] == ["buildable"] and lines[-3] == ""
    assert lines[-2] == "1 buildable, 1 rejected, 0 skipped of 2 cells"


@pytest.mark.parametrize("flag", [["--native"], ["--python-exe", "python3"], ["--src-dir", "src"], ["--work", "w"]])
def test_plan_refuses_the_audit_flags_without_audit(flag, capsys):
    with pytest.raises(UsageError, match=f"^{flag[0]} goes with --audit"):
        plan("sage", *CELL, *flag)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("flag", [["--python-exe", "python3"], ["--src-dir", "src"]])
def test_an_audit_in_the_builder_image_refuses_the_host_flags(flag):
    with pytest.raises(UsageError, match=f"^{flag[0]} goes with --native \\(the builder image has its own"):
        plan("sage", *CELL, "--audit", *flag)


def test_an_audit_of_a_matrix_that_cannot_build_stops_before_the_engine(capsys):
    with pytest.raises(NothingToDoError, match="nothing to audit"):
        plan("sage", *CELL[:6], "--arch", "7.0", "--audit")
    assert capsys.readouterr().err.startswith("[sage-2_2_0-torch2_8-cu128-py312] rejected: ")


def test_an_audit_that_could_not_run_says_why_on_stderr_too(monkeypatch, capsys):
    # One cell whose builder image failed (the frontier sweep met it: a step's traceback in the log):
    # the one-line error names the cell and why, not only how many could not run.
    def failed(plan, **kwargs):
        return [buildx_audit.AuditOutcome(c, None, error="its builder image or the audit step failed", log="/w/x.log")
                for c in plan.buildable]
    monkeypatch.setattr(buildx_audit, "audit", failed)
    with pytest.raises(CompatError) as info:
        plan("sage", *CELL[:6], "--arch", "9.0", "--audit", "--json")
    assert "the gencode audit could not run for sage-" in str(info.value)
    assert str(info.value).endswith(": its builder image or the audit step failed (log: /w/x.log)")
    (record,) = json.loads(capsys.readouterr().out)
    assert record["audit"] is None and record["error"].startswith("its builder image or the audit step failed")


def test_an_audit_on_the_host_takes_one_recipe():
    with pytest.raises(UsageError, match="--native builds one recipe"):
        plan("sage", "fa2", *CELL, "--audit", "--native")


@pytest.fixture
def no_torch_host(tmp_path, monkeypatch):
    """A stand-in host whose torch cannot be imported by the package's build, and a copy of the tiny project."""
    stand_in = tmp_path / "site" / "torch"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise ImportError('stand-in torch: not installed')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return fake_host(tmp_path), shutil.copytree(TINY, tmp_path / "tiny_kernel")


def test_a_native_audit_shows_the_refusal_and_raises_it(tmp_path, no_torch_host, capsys):
    py, project = no_torch_host
    with pytest.raises(CompatError) as info:
        plan("--audit", "--native", "--source", project, "--arch", "8.0", "--python-exe", py)
    assert str(info.value).startswith("cannot build tiny-kernel 0.1.0 torch 2.8.0 cu128 py3.12 arch 8.0 [native]: the"
                                      " gencode audit refuses it: tiny-kernel 0.1.0: its own build stops before"
                                      " compiling anything (exit 1): ImportError: stand-in torch: not installed")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tiny-kernel 0.1.0 torch 2.8.0 cu128 py3.12 arch 8.0 [native]: REFUSED (audit ")
    assert out[1].split() == ["extension", "SASS", "PTX", "nvcc", "flags"]
    assert (tmp_path / ".imagegen" / "cell.json").is_file()  # --work defaults to .imagegen here


def test_a_native_audit_in_json_is_one_record(tmp_path, no_torch_host, capsys):
    py, project = no_torch_host
    with pytest.raises(CompatError):
        plan("--audit", "--native", "--source", project, "--arch", "8.0", "--python-exe", py, "--json",
             "--work", tmp_path / "w")
    record = json.loads(capsys.readouterr().out)
    assert record["cell"]["name"] == "tiny-kernel-0_1_0-torch2_8-cu128-py312" and record["cell"]["flavor"] == "native"
    assert record["audit"]["verdict"] == "refused" and record["audit"]["env"]["TORCH_CUDA_ARCH_LIST"] == "8.0"
    assert (tmp_path / "w" / "cell.json").is_file() and not (tmp_path / ".imagegen").exists()


# ---------------------------------------------------------------------------------------- recipes


def test_recipes_json_describes_every_recipe_and_version(capsys):
    assert call(planning.cmd_recipes, "recipes", "--json") == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(records) == sorted(load_catalogue().names())
    sage = records["sageattention"]
    assert "sage" in sage["aliases"] and sage["default_version"] == "2.2.0" and sage["source"].startswith("https://")
    v = sage["versions"]["2.2.0"]
    assert (v["arch_env"], v["arch_style"], v["ptx"], v["archs"]) == ("TORCH_CUDA_ARCH_LIST", "torch", "honoured",
                                                                      "8.0;8.6;8.9;9.0;12.0")
    assert len(v["commit"]) == 40 and v["ref"] == "v2.2.0"


def test_recipes_text_marks_the_default_and_names_the_knob(capsys):
    assert call(planning.cmd_recipes, "recipes", "--recipe-dir", FIXTURES / "routed_kernels") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[out.index(next(line for line in out if line.startswith("flash-attn (aliases: fa2, flash-attention):")))
               + 1] == "  2.8.3 [default]: archs 8.0;9.0;10.0;12.0; knob FLASH_ATTN_CUDA_ARCHS (numeric); PTX none"
    assert any(line.startswith("routed-kernels") for line in out)  # the extra recipe dir
    assert "  routed [default]: archs 8.0;8.6;8.9;9.0a;12.0; knob TORCH_CUDA_ARCH_LIST (torch); PTX honoured" in out
    assert any(line.endswith("knob fixed list; PTX none") for line in out)  # a recipe without a knob


def test_recipes_checks_a_given_lock_file(tmp_path):
    with pytest.raises(UsageError, match="--lock nolock.lock: no such file"):
        call(planning.cmd_recipes, "recipes", "--lock", "nolock.lock")
    (tmp_path / "ok.lock").write_text('{"schema": 1}')
    assert call(planning.cmd_recipes, "recipes", "--lock", "ok.lock", "--json") == 0


# ------------------------------------------------------------------------------------------ archs


def test_archs_prints_every_consumers_form_and_the_numeric_knobs_mapping(capsys):
    assert call(planning.cmd_archs, "archs", "sm_80 8.6 8.9 sm_90") == 0
    out = capsys.readouterr().out
    assert "normalised               8.0;8.6;8.9;9.0\n" in out
    assert "FLASH_ATTN_CUDA_ARCHS    80;90  (flash-attn 2.8.3: 8.6, 8.9 run the sm_80 cubin)\n" in out
    assert "CMAKE_CUDA_ARCHITECTURES 80-real;86-real;89-real;90-real\n" in out
    assert "NATTEN_CUDA_ARCH         8.0;8.6;8.9;9.0\n" in out and "minimum CUDA             11.8\n" in out


def test_archs_says_what_a_knob_cannot_build_and_what_cannot_be_expressed(capsys):
    assert call(planning.cmd_archs, "archs", "11.0") == 0
    assert "(flash-attn 2.8.3: does not build 11.0: imagegen plan rejects such a cell)" in capsys.readouterr().out
    assert call(planning.cmd_archs, "archs", "10.0f") == 0
    out = capsys.readouterr().out
    assert "TORCH_CUDA_ARCH_LIST     (cannot express: 10.0f: TORCH_CUDA_ARCH_LIST never accepts family (f)" in out
    assert "CMAKE_CUDA_ARCHITECTURES 100f-real" in out


@pytest.mark.parametrize("argv, problem", [
    (["12.0", "--cuda", "12.6.3"], "problem: sm_120 needs CUDA >= 12.8; CUDA 12.6.3 selected\n"),
    (["12.0", "--cuda", "cu126"], "problem: sm_120 needs CUDA >= 12.8"),
    (["12.0", "--torch", "2.6"], "problem: torch 2.6 does not accept 12.0 in TORCH_CUDA_ARCH_LIST"),
])
def test_archs_checked_against_cuda_or_torch_exit_3_with_the_problem_on_stderr(argv, problem, capsys):
    assert call(planning.cmd_archs, "archs", *argv) == 3
    captured = capsys.readouterr()
    assert problem in captured.err and captured.out.startswith("normalised               12.0\n")
    assert call(planning.cmd_archs, "archs", "12.0", "--cuda", "12.8", "--torch", "2.8") == 0


def test_archs_refuses_what_it_cannot_read():
    with pytest.raises(ArchError, match="unknown GPU architecture 'nonsense'"):
        call(planning.cmd_archs, "archs", "nonsense")
    with pytest.raises(UsageError, match="--cuda '12.x' is not a CUDA version"):
        call(planning.cmd_archs, "archs", "8.0", "--cuda", "12.x")
    with pytest.raises(UsageError, match="--torch 'banana' is not a torch version"):
        call(planning.cmd_archs, "archs", "8.0", "--torch", "banana")


def test_plan_says_where_each_cells_torch_comes_from(capsys):
    assert plan("sage", "--torch", "2.9 2.11", "--cuda", "12.8", "--python", "3.11 3.12", "--arch", "9.0", "--json") == 0
    cells = {(c["torch"], c["python"]): c["torch_from"] for c in json.loads(capsys.readouterr().out)["cells"]}
    assert cells == {("2.9.1", "3.11"): "venv", ("2.9.1", "3.12"): "image", ("2.11.0", "3.11"): "venv",
                     ("2.11.0", "3.12"): "venv"}
    assert plan("sage", "--torch", "2.11", "--cuda", "13.0", "--python", "3.12", "--arch", "9.0", "--flavor", "pypi",
                "--base-image", "my/image:1") == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.endswith("my/image:1: torch 2.11.0 (cu130): the image's own if it has exactly that, else into a venv")
