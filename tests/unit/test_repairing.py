"""Tests for imagegen.commands.repairing: `imagegen repair` on the real fixture wheel with the real
auditwheel: in place in its wheelhouse (manifest updated), beside a loose wheel, into --out, text and
--json output, the import test (--python-exe, or skipped with a note), and every refusal as one
typed line: a missing file or a bad --plat before anything runs, a wheel that cannot be repaired
after the others were tried (exit 9)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from imagegen.wheelhouse import collect
from imagegen.commands import repairing
from imagegen.errors import PublishError, UsageError
from imagegen.wheelhouse.manifest import MANIFEST, read_manifest, sha256
from tests.unit.command_helpers import WHEEL, call
from tests.unit.executor_fixtures import pure_wheel, python_stand_in, temp_files_under, tiny_cell

SO = "tiny_kernel/_C.cpython-311-x86_64-linux-gnu.so"
REPAIRED = WHEEL.name.replace("linux_x86_64", "manylinux_2_34_x86_64")
NO_IMPORT_TEST = "imagegen: the import test is skipped: this Python has no torch (give --python-exe)\n"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    temp_files_under(tmp_path, monkeypatch)
    # Whether the Python running the tests has torch must not change what they see.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch"
                        else real_find_spec(name, *a))


def repair(*argv) -> int:
    return call(repairing.cmd_repair, "repair", *argv)


def _loose(tmp_path, folder: str = "loose"):
    wheel = tmp_path / folder / WHEEL.name
    wheel.parent.mkdir()
    shutil.copy(WHEEL, wheel)
    return wheel


def test_a_wheel_of_a_wheelhouse_is_repaired_in_place_and_its_manifest_updated(tmp_path, capsys):
    wheel = collect.place(tmp_path / "house", tiny_cell(), WHEEL, inputs="in", record={})
    assert repair(wheel) == 0
    folder = wheel.parent
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, REPAIRED]
    entry = read_manifest(folder)["cells"][tiny_cell().name]
    assert entry["wheel"] == REPAIRED and entry["sha256"] == sha256(folder / REPAIRED)
    assert entry["repaired"]["tag"] == "manylinux_2_34_x86_64" and entry["repaired"]["glibc_ceiling"] == "2.32"
    captured = capsys.readouterr()
    assert captured.out == (
        f"repaired {WHEEL.name} -> {folder / REPAIRED}\n"
        "     tag manylinux_2_34_x86_64: glibc ceiling 2.32\n"
        "     excluded (torch provides them): libc10.so, libcudart.so.13, libtorch_cpu.so, libtorch_python.so\n"
        "     bundled: nothing\n"
        f"     {SO}: sm_80, sm_90, compute_90 (unchanged)\n"
        "     the tag's glibc 2.34 is within the base image's glibc 2.36 (python:3.11-slim-bookworm)\n"
        f"     manifest updated: {folder / MANIFEST}\n")
    assert captured.err.startswith(NO_IMPORT_TEST)


def test_a_loose_wheel_is_repaired_beside_it_and_kept(tmp_path, capsys):
    wheel = _loose(tmp_path)
    assert repair(wheel) == 0
    assert sorted(p.name for p in wheel.parent.iterdir()) == sorted([WHEEL.name, REPAIRED])
    assert sha256(wheel) == sha256(WHEEL)
    out = capsys.readouterr().out
    assert out.startswith(f"repaired {WHEEL.name} -> {wheel.parent / REPAIRED}\n") and "manifest" not in out


def test_out_takes_the_repaired_wheel_and_leaves_the_wheelhouse_alone(tmp_path, capsys):
    wheel = collect.place(tmp_path / "house", tiny_cell(), WHEEL, inputs="in", record={})
    manifest = (wheel.parent / MANIFEST).read_text()
    assert repair(wheel, "--out", tmp_path / "dist", "--json") == 0
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [REPAIRED]
    assert sorted(p.name for p in wheel.parent.iterdir()) == [MANIFEST, WHEEL.name]
    assert (wheel.parent / MANIFEST).read_text() == manifest
    (result,) = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["wheel"] == str(tmp_path / "dist" / REPAIRED) and result["manifest"] is None
    # What the manifest says of the wheel is still used: its base image's glibc.
    assert result["base_image"] == "python:3.11-slim-bookworm" and result["base_glibc"] == "2.36"
    assert result["extensions"] == {SO: ["sm_80", "sm_90", "compute_90"]}
    assert result["excluded"] == ["libc10.so", "libcudart.so.13", "libtorch_cpu.so", "libtorch_python.so"]


def test_every_wheel_is_tried_and_the_failures_end_it_in_one_line(tmp_path, capsys):
    good = _loose(tmp_path)
    pure = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""})
    with pytest.raises(PublishError) as info:
        repair(pure, good, "--json")
    assert str(info.value) == ("1 of 2 wheels could not be repaired: demo-1.0-py3-none-any.whl: a pure-Python wheel"
                               " has no shared library to repair (it installs anywhere as it is); a CUDA-extension"
                               " wheel was expected")
    assert info.value.exit_code == 9
    repaired, failed = json.loads(capsys.readouterr().out)
    assert repaired["ok"] and repaired["wheel"] == str(good.parent / REPAIRED)
    assert failed == {"ok": False, "source": str(pure), "error": str(info.value).split(": ", 1)[1]}
    with pytest.raises(PublishError):
        repair(pure)
    assert capsys.readouterr().out == f"FAIL {pure.name}\n     problem: {failed['error']}\n"


def test_the_import_test_runs_with_python_exe(tmp_path, capsys):
    python = python_stand_in(tmp_path / "torch-env" / "python", """
        import json, sys
        request = json.loads(sys.stdin.readline())
        print(json.dumps({m: "ok" for m in request["modules"]}))
    """)
    assert repair(_loose(tmp_path), "--python-exe", python) == 0
    captured = capsys.readouterr()
    assert "     import tiny_kernel: ok\n     import tiny_kernel._C: ok\n" in captured.out
    assert NO_IMPORT_TEST not in captured.err


def test_bad_input_is_refused_before_anything_is_repaired(tmp_path):
    good = _loose(tmp_path)
    with pytest.raises(UsageError, match=r"missing\.whl: no such wheel file$") as info:
        repair(good, tmp_path / "missing.whl")
    assert info.value.exit_code == 2
    with pytest.raises(UsageError, match=r"^--plat manylinux_2_34: expected a manylinux tag such as"):
        repair(good, "--plat", "manylinux_2_34")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UsageError, match=r"^--out .*a-file: not a folder$"):
        repair(good, "--out", tmp_path / "a-file")
    with pytest.raises(UsageError, match=r"^--out a+\.\.\.a+: File name too long$"):  # found by the fuzz test
        repair(good, "--out", "a" * 5000)
    with pytest.raises(UsageError, match=r"^--python-exe .*: no such file$"):
        repair(good, "--python-exe", tmp_path / "no" / "python")
    assert [p.name for p in good.parent.iterdir()] == [WHEEL.name]
