"""Tests for imagegen.commands.checking: `imagegen verify`, `check`'s input checks, `doctor --no-engine`.

verify on a real wheel (text, JSON, warnings, --strict, several wheels, an import test that cannot run),
the recipe's view of what a wheel must carry, check's input checks before anything runs, and doctor with
a stand-in host Python."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from imagegen.commands import doctor
from imagegen.commands import checking
from imagegen.errors import ImagegenError, RecipeError, UsageError, VerifyError
from tests.unit.command_helpers import WHEEL, call, fake_host, never

SO = "tiny_kernel/_C.cpython-311-x86_64-linux-gnu.so"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor, "diagnose_engine", never("doctor's Docker checks"))


def verify(*argv) -> int:
    return call(checking.cmd_verify, "verify", *argv)


# ----------------------------------------------------------------------------------------- verify


def test_verify_lists_each_extensions_archs_and_passes_quietly(capsys):
    assert verify(WHEEL, "--arch", "8.0;9.0+PTX") == 0
    captured = capsys.readouterr()
    assert captured.out == f"ok   {WHEEL.name}\n     {SO}: sm_80, sm_90, compute_90\n" and captured.err == ""


def test_archs_not_requested_are_a_warning_and_with_strict_a_failure(capsys):
    assert verify(WHEEL, "--arch", "8.0") == 0
    captured = capsys.readouterr()
    assert f"     warning: {SO} also carries sm_90, compute_90, not requested" in captured.out
    assert captured.err == ("imagegen: warning: 1 of 1 wheels carry archs not requested (--strict makes that a"
                            " failure)\n")
    with pytest.raises(VerifyError, match=f"^1 of 1 wheels failed verification: {SO} also carries sm_90") as info:
        verify(WHEEL, "--arch", "8.0", "--strict")
    assert info.value.exit_code == 6
    assert capsys.readouterr().out.startswith(f"FAIL {WHEEL.name}\n")


def test_a_missing_arch_fails_every_copy_and_says_the_first_problem(tmp_path, capsys):
    copies = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        copies.append(Path(shutil.copy(WHEEL, tmp_path / folder)))
    with pytest.raises(VerifyError) as info:
        verify(*copies, "--arch", "12.0")
    assert str(info.value) == f"2 of 2 wheels failed verification: {SO} lacks sm_120 (has sm_80, sm_90, compute_90)"
    out = capsys.readouterr().out
    assert out.count(f"FAIL {WHEEL.name}") == 2 and out.count("problem: ") == 2


def test_verify_json_is_one_document_with_each_wheels_report(capsys):
    assert verify(WHEEL, "--arch", "8.0", "--json") == 0
    captured = capsys.readouterr()
    (report,) = json.loads(captured.out)
    assert report["wheel"] == WHEEL.name and report["ok"] is True and report["distribution"] == "tiny-kernel"
    assert report["extensions"][0]["archs"] == ["sm_80", "sm_90", "compute_90"]
    assert report["warnings"] and report["imports"] is None
    assert "1 of 1 wheels carry archs not requested" in captured.err  # the warning stays off stdout


def test_a_missing_wheel_stops_verify_before_anything_is_printed(tmp_path, capsys):
    with pytest.raises(UsageError, match="^nothere.whl: no such wheel file$"):
        verify(WHEEL, "nothere.whl", "--arch", "8.0")
    with pytest.raises(UsageError, match="File name too long"):
        verify("w" * 5000 + ".whl", "--arch", "8.0")
    with pytest.raises(UsageError, match=": no such wheel file"):
        verify(tmp_path, "--arch", "8.0")  # a folder is not a wheel
    assert capsys.readouterr().out == ""


def test_an_import_test_that_cannot_run_is_a_problem_of_the_wheel(tmp_path, capsys):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no interpreter here' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(VerifyError, match="the import test did not run: no interpreter here"):
        verify(WHEEL, "--arch", "8.0;9.0+PTX", "--python-exe", broken)
    assert f"     problem: {WHEEL.name}: the import test did not run" in capsys.readouterr().out
    with pytest.raises(UsageError, match="--python-exe .*: no such file"):
        verify(WHEEL, "--arch", "8.0", "--python-exe", tmp_path / "missing-python")


def test_a_broken_recipe_dir_only_matters_with_gpu(tmp_path, capsys):
    (tmp_path / "imagegen.toml").write_text('recipe-dirs = ["no-such-recipes"]\n')
    assert verify(WHEEL, "--arch", "8.0;9.0+PTX") == 0  # plain verify needs no recipe
    with pytest.raises(RecipeError, match="does not exist"):
        verify(WHEEL, "--arch", "8.0;9.0+PTX", "--gpu")


# ------------------------------------------------------------------------------------------ check


def test_check_refuses_unusable_paths_and_a_missing_lock_before_running_anything(tmp_path):
    with pytest.raises(UsageError, match="File name too long"):
        call(checking.cmd_check, "check", "w" * 5000 + ".whl")
    # The lock is checked before the wheel's own problems (check runs no image, but a wrong --lock is a mistake).
    with pytest.raises(UsageError, match="^--lock nolock.lock: no such file"):
        call(checking.cmd_check, "check", "missing.whl", "--lock", "nolock.lock")
    with pytest.raises(UsageError, match="^missing.whl: no such wheel file"):
        call(checking.cmd_check, "check", "missing.whl")
    with pytest.raises(RecipeError, match="unknown recipe 'nope'"):
        call(checking.cmd_check, "check", WHEEL, "--recipe", "nope")


# ----------------------------------------------------------------------------------------- doctor


def test_doctor_without_the_engine_reports_the_hosts_toolchain(tmp_path, capsys):
    py = fake_host(tmp_path)
    assert call(checking.cmd_doctor, "doctor", "--no-engine", "--python-exe", py) == 0
    out = capsys.readouterr().out
    assert re.search("^ok +python +imagegen runs on 3", out, re.M)
    assert re.search(f"^ok +torch +2.8.0 \\(CUDA 12.8\\) in {re.escape(py)}$", out, re.M)
    assert re.search("^ok +nvcc vs torch +nvcc 12.x matches torch's CUDA 12.8$", out, re.M)
    assert "docker" not in out and "buildx" not in out


def test_doctor_json_and_a_failed_check_raise_one_line_after_the_report(tmp_path, capsys):
    py = fake_host(tmp_path, nvcc="13.0")  # torch is a CUDA 12.8 build
    with pytest.raises(ImagegenError) as info:
        call(checking.cmd_doctor, "doctor", "--no-engine", "--python-exe", py, "--json")
    assert str(info.value) == ("1 problem(s): nvcc vs torch: nvcc's major must equal torch's CUDA major: install"
                               " CUDA 12.x (or a torch built for CUDA 13.x) and point CUDA_HOME at it")
    assert info.value.exit_code == 4  # README: Docker, buildx or the host toolchain is missing or refused
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["nvcc vs torch"]["status"] == "FAIL" and checks["nvcc"]["detail"].startswith("13.0 (CUDA_HOME ")
    assert set(checks["torch"]) == {"name", "status", "detail", "fix"}


def test_doctor_refuses_an_unusable_python_exe(tmp_path):
    with pytest.raises(UsageError, match="--python-exe .*: not a file"):
        call(checking.cmd_doctor, "doctor", "--no-engine", "--python-exe", tmp_path)
