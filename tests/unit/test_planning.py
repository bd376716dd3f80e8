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
    assert data["summary"] == {"buildable": 1, "unchecked": 0, "rejected": 0, "skipped": 0, "total": 1}
    assert cell["status"] == "buildable" and cell["unchecked"] is None  # a catalogue pin: the recipe's facts


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


@pytest.mark.parametrize("flag", [["--python-exe", "python3"], ["--src-dir", "src"], ["--work", "w"]])
def test_plan_refuses_the_host_flags_without_native(flag, capsys):
    with pytest.raises(UsageError, match=f"^{flag[0]} goes with --native \\(plan the host's build with `imagegen plan"
                                         " --native`\\)"):
        plan("sage", *CELL, *flag)
    assert capsys.readouterr().out == ""


def test_plan_native_without_audit_is_the_hosts_cell_and_says_it_is_unaudited(tmp_path, capsys):
    # `plan R --native` was refused unless --audit: the host's cell, planned from facts (nothing fetched or run).
    py = fake_host(tmp_path)
    assert plan("sage", "--native", "--arch", "9.0", "--python-exe", py) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:7] == ["buildable", "sageattention", "2.2.0", "2.8", "cu128", "3.12", "9.0"]
    assert lines[-3] == "1 buildable, 0 rejected, 0 skipped of 1 cells"
    assert lines[-2].startswith("this host: Python 3.12, torch 2.8.0 (CUDA 12.8)")
    assert lines[-1] == planning.NOT_AUDITED_NATIVE
    assert plan("sage", "--native", "--arch", "9.0", "--python-exe", py, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["audited"] is False and data["host"].startswith("Python 3.12, torch 2.8.0")
    (cell,) = data["cells"]
    assert (cell["status"], cell["torch_from"], cell["base_image"]) == ("buildable", "host", "native")
    assert not list(tmp_path.glob(".imagegen*"))  # no work folder: nothing fetched
    # A cell this host cannot build is the same one-line refusal as `build --native` (exit 3).
    with pytest.raises(CompatError, match="^cannot build sageattention 2.2.0 .*: sageattention 2.2.0 does not support"
                                          " sm_70") as info:
        plan("sage", "--native", "--arch", "7.0", "--python-exe", py)
    assert info.value.exit_code == 3
    for flag in (["--work", "w"], ["--resolve"]):
        with pytest.raises(UsageError, match=f"^{flag[0]} goes with|^{flag[0]} plans container cells"):
            plan("sage", "--native", "--arch", "9.0", "--python-exe", py, *flag)


HARDCODED = FIXTURES / "hardcoded_gencode"  # a team's own kernels: -gencode sm_70, sm_80, sm_86 in setup.py


def test_plan_of_a_local_tree_says_its_facts_are_unchecked_and_what_its_setup_py_names(capsys):
    # A team's package that hard-codes compute_70 was called "buildable" without an audit.
    assert plan("--source", HARDCODED, *CELL) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["unchecked", "hardcoded-gencode"]
    why = lines[1][lines[0].index("WHY"):]
    assert why.startswith("unaudited: what this tree compiles is unchecked; its setup.py names -gencode sm_70, sm_80,"
                          " sm_86, read without running it; `imagegen plan --audit` checks it; runpod/pytorch:")
    assert lines[-2] == ("1 buildable (1 of them unchecked: `imagegen plan --audit` checks them), 0 rejected, 0 skipped"
                         " of 1 cells")
    assert plan("--source", HARDCODED, *CELL, "--json") == 0  # exit 0, as for a buildable cell
    data = json.loads(capsys.readouterr().out)
    (cell,) = data["cells"]
    assert cell["status"] == "unchecked" and cell["unchecked"] == why.split("; runpod/")[0]
    assert cell["expected_archs"] is None and cell["archs"] == "9.0"  # what is asked; no claim of what it compiles
    assert data["summary"] == {"buildable": 1, "unchecked": 1, "rejected": 0, "skipped": 0, "total": 1}
    # --only buildable keeps it (it can build); --only unchecked shows only such cells.
    for only, shown in (("buildable", 1), ("unchecked", 1), ("rejected", 0)):
        assert plan("--source", HARDCODED, *CELL, "--only", only) == 0
        assert len(capsys.readouterr().out.splitlines()) == 1 + shown + 3


# A Colab user's fork of Block-Sparse-Attention 0.0.1: the recipe's 0.0.1 compiles a fixed 8.0;9.0, the fork sm_80 only.
FORK_SETUP = """from setuptools import setup
cc_flag = ["-gencode", "arch=compute_80,code=sm_80"]  # the fork dropped sm_90
setup(name="block_sparse_attn", version="0.0.1", ext_modules=[], extra={"nvcc": ["-O3", "-std=c++17", *cc_flag]})
"""


def test_plan_of_a_fork_claims_the_trees_arch_list_not_the_recipes(tmp_path, capsys):
    fork = tmp_path / "Block-Sparse-Attention"
    fork.mkdir()
    (fork / "setup.py").write_text(FORK_SETUP)
    assert plan("--source", fork, *CELL[:6], "--arch", "8.0", "--json") == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["recipe"] == "block-sparse-attn" and cell["version"] == "0.0.1-local" and cell["status"] == "unchecked"
    assert "its setup.py names -gencode sm_80 and -std=c++17, read without running it" in cell["unchecked"]
    assert not any("fixed arch list" in n for n in cell["notes"]) and cell["expected_archs"] is None
    # The catalogue's own 0.0.1 (its pinned source) still says the recipe's list.
    assert plan("bsa", "--version", "0.0.1", *CELL[:6], "--arch", "8.0", "--json") == 0
    (pinned,) = json.loads(capsys.readouterr().out)["cells"]
    assert pinned["status"] == "buildable" and "block-sparse-attn compiles a fixed arch list: 8.0;9.0" in pinned["notes"]
    # natively, on this host, with --src-dir on the fork: the host's cell, unchecked, and unaudited
    py = fake_host(tmp_path)
    assert plan("bsa", "--native", "--src-dir", fork, "--arch", "8.0", "--python-exe", py) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["unchecked", "block-sparse-attn", "0.0.1-local"] and "sm_80 and -std" in lines[1]
    assert lines[-1] == planning.NOT_AUDITED_NATIVE


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


TEAM_SETUP = """from setuptools import setup
nvcc_flags = ["-O3", "-std=c++17", "-gencode=arch=compute_70,code=sm_70", "-gencode=arch=compute_80,code=sm_80"]
setup(name="team-kernels", version="0.2.0", ext_modules=[], extra={"nvcc": nvcc_flags})
"""


@pytest.mark.parametrize("cell, says", [
    # the newest torch: C++20 headers, and CUDA 13's nvcc has no sm_70; 9.0 is not in the list
    (["--torch", "2.15", "--arch", "9.0"], ["-std=c++17 and torch 2.15's headers need C++20",
                                            "-gencode sm_70, which the nvcc of CUDA 13.2 cannot compile",
                                            "whatever --arch asks: sm_90 not among them"]),
    # torch 2.11 on CUDA 12.8 compiles C++17 and sm_70, and 8.0 is in the list: nothing to warn of
    (["--torch", "2.11", "--cuda", "12.8", "--arch", "8.0"], []),
])
def test_plan_of_a_local_tree_judges_what_its_setup_py_states_against_each_cell(tmp_path, capsys, cell, says):
    # A team's own kernels package hard-codes compute_70 and -std=c++17: at torch 2.15 its build fails,
    # and the plan says why before anything compiles (a warning: the flags are read, not run).
    tree = tmp_path / "team-kernels"
    tree.mkdir()
    (tree / "setup.py").write_text(TEAM_SETUP)
    assert plan("--source", tree, "--python", "3.12", "--flavor", "cuda", *cell, "--json") == 0
    (record,) = json.loads(capsys.readouterr().out)["cells"]
    assert record["status"] == "unchecked"
    warnings = [n for n in record["notes"] if n.startswith("warning: its setup.py")]
    assert len(warnings) == len(says) and all(any(s in w for w in warnings) for s in says), warnings
