"""`imagegen reuse` as a user runs it (imagegen.commands.reusing), on ELF objects compiled here
(tests/unit/elf_fixtures.py): exit 0 and the verdict for a reusable wheel, exit 11 and the missing
symbol for one that is not, --json, --into (the wheel placed marked reused_from; never a wheel that is
not reusable), and one-line errors with exit 2 for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from imagegen.commands import reusing
from imagegen.errors import NotReusableError
from tests.unit import elf_fixtures as fx
from tests.unit.command_helpers import ROOT, call


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("reusing")
    old = fx.torch_lib(root / "old", version="2.11.0")
    new = fx.torch_lib(root / "new", alpha=False, version="2.13.0")
    ext = fx.extension(root / "ext", old, calls=("alpha", "beta"))
    return {"old": old, "new": new, "ext": ext, "new_wheel": fx.torch_wheel(root, new, "2.13.0")}


def imagegen(*argv, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "imagegen", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_reusable_exits_0_with_the_verdict(made, tmp_path):
    proc = imagegen("reuse", made["ext"].wheel, "--torch", "2.11.0", "--torch-wheel", made["old"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"symbols pkg/_ext{fx.EXT_SUFFIX}: ok (2 symbols torch's libraries provide)" in proc.stdout
    assert "  import: skipped (no --python-exe: nothing imported)" in proc.stdout
    assert proc.stdout.splitlines()[-1] == f"reusable: {made['ext'].wheel.name} with torch 2.11.0"


def test_not_reusable_exits_11_naming_the_symbol(made, tmp_path):
    proc = imagegen("reuse", made["ext"].wheel, "--torch-wheel", made["new_wheel"], "--built-with", made["old"],
                    cwd=tmp_path)
    assert proc.returncode == 11, proc.stderr
    assert "    missing c10::alpha() (expected from libc10.so (torch 2.11.0))" in proc.stdout
    [error] = proc.stderr.splitlines()
    assert error.startswith(f"imagegen: error: {made['ext'].wheel.name} is not reusable with torch 2.13.0: ")
    assert "Traceback" not in proc.stderr


def test_json_is_one_document(made, tmp_path, capsys):
    with pytest.raises(NotReusableError):
        call(reusing.cmd_reuse, "reuse", made["ext"].wheel, "--torch-wheel", made["new"], "--json")
    doc = json.loads(capsys.readouterr().out)
    assert doc["reusable"] is False and doc["symbols"] == "failed" and doc["built_for"] == "2.11"
    [ext] = doc["extensions"]
    assert ext["missing"] == [{"symbol": "_ZN3c105alphaEv", "demangled": "c10::alpha()",
                               "expected_from": "libc10.so, by its namespace"}]
    assert doc["import"]["status"] == "skipped" and doc["gpu_check"]["status"] == "skipped"


def test_into_places_only_a_reusable_wheel(made, tmp_path):
    out = tmp_path / "wheelhouse"
    proc = imagegen("reuse", made["ext"].wheel, "--torch-wheel", made["new"], "--into", out, cwd=tmp_path)
    assert proc.returncode == 11 and "not placed in" in proc.stderr
    assert not out.exists() or not any(out.rglob("*.whl"))
    python = fx.venv_with(tmp_path / "venv", made["old"])
    proc = imagegen("reuse", made["ext"].wheel, "--python-exe", python, "--into", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "    import pkg._ext: ok" in proc.stdout
    assert "  gpu_check: skipped (no GPU here" in proc.stdout
    [manifest] = out.rglob("manifest.json")
    [entry] = json.loads(manifest.read_text())["cells"].values()
    assert entry["reused_from"] == {"torch": "2.11", "checked_against": "2.11.0", "symbols": "ok", "import": "ok",
                                    "gpu_check": "skipped"}
    proc = imagegen("index", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "(reused: built for torch 2.11, checked against torch 2.11.0)" in (out / "index.html").read_text()


@pytest.mark.parametrize("argv, message", [
    (["reuse", "{wheel}"], "give the torch to check against: --python-exe"),
    (["reuse", "{wheel}", "--torch-wheel", "{old}", "--torch", "2.14.1"], "--torch 2.14.1, but --torch-wheel"),
    (["reuse", "missing.whl", "--torch-wheel", "{old}"], "missing.whl: no such wheel file"),
    (["reuse", "{wheel}", "--torch-wheel", "nowhere"], "--torch-wheel nowhere: no such file or folder"),
    (["reuse", "{wheel}", "--python-exe", "no-such-python-here"], "no such interpreter on PATH"),
    (["reuse", "{wheel}", "--torch-wheel", "{old}", "--timeout", "-1"], "--timeout must be a positive number"),
])
def test_bad_input_is_one_line_and_exit_2(made, tmp_path, argv, message):
    argv = [a.format(wheel=made["ext"].wheel, old=made["old"]) for a in argv]
    proc = imagegen(*argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("imagegen: error: ") and message in line, line


def test_into_asks_for_the_wheels_cuda_before_checking(made, tmp_path):
    plain = fx.extension(tmp_path / "plain", made["old"], calls=("alpha",), local="")  # pkg-0.1.0: no cuXYZ
    proc = imagegen("reuse", plain.wheel, "--torch-wheel", made["old"], "--into", tmp_path / "wh", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "does not say its CUDA" in proc.stderr and len(proc.stderr.splitlines()) == 1
