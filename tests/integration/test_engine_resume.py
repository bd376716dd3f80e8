"""Issue 36 item 1 on a real Docker engine: `imagegen build --budget` stops a compile partway and keeps
its build tree in the builder's resume cache mount; the same build again compiles only what is left,
and its extension is the one a build from scratch makes.

tests/fixtures/resumable_kernel: eight C++ sources of ~2.5 s each (constexpr work), a module and a
small kernel, one job at a time.
Needs what tests/integration/test_engine_build.py needs (the engine, the base image; torch 2.11 and its
CUDA toolkit come from PyPI into a cached layer)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "resumable_kernel"
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "9.0", "--flavor", "pypi",
        "--base-image", BASE_IMAGE, "--max-jobs", "1"]
PARTS = 10  # ninja steps of a whole build: eight parts, the module and the kernel

pytestmark = pytest.mark.integration


def build(tree: Path, root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([IMAGEGEN, "build", "--source", str(tree), *CELL, "--out", str(root / "out"),
                           "--work", str(root / "work"), "--json", *extra], cwd=root, capture_output=True, text=True,
                          timeout=3600)


def build_log(result: dict) -> str:
    return Path(result["log"]).read_text(errors="replace")


def member_digests(wheel: str) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        return {n: hashlib.sha256(zf.read(n)).hexdigest() for n in zf.namelist()}


def test_a_build_stopped_at_its_budget_resumes_and_compiles_only_what_was_left(tmp_path):
    if shutil.which("docker") is None or subprocess.run(["docker", "image", "inspect", BASE_IMAGE],
                                                        capture_output=True).returncode != 0:
        pytest.fail(f"a running engine and {BASE_IMAGE} are required: run scripts/test.sh as root")
    tree = tmp_path / "resumable_kernel"
    shutil.copytree(FIXTURE, tree)
    # Parts of their own for this run (another seed for the constexpr work): a fresh inputs hash, so no
    # state or layer of an earlier run is reused, and no object from the shared ccache mount either (a
    # ccache hit takes no time, and the budget would not stop anything). The torch layer is reused.
    nonce = random.randrange(1000, 10**6)
    for part in sorted((tree / "csrc").glob("part_*.cpp")):
        text = part.read_text()
        assert "spin(12, " in text
        part.write_text(text.replace("spin(12, ", f"spin(12, {nonce} + "))
    root = tmp_path / "first"
    root.mkdir()

    # 1. Stopped: the budget ends the compile partway; no wheel, and the cell says what is kept.
    # (The first time on a machine, the budget also covers nothing but the compile: the torch layer and
    # the audit come before the build step's clock starts.)
    stopped = build(tree, root, "--budget", "16s")
    assert stopped.returncode == 5, stopped.stderr[-3000:]
    (row,) = json.loads(stopped.stdout)
    assert row["status"] == "failed" and not row.get("wheel")
    m = re.search(r"budget of 16 s is spent: stopped after (\d+) ninja step\(s\), its state \(\d+ MB\) is kept in "
                  r"(/imagegen/resume/[0-9a-f]+\.tar); the same build again resumes from it", row["error"])
    assert m, row["error"]
    done = int(m.group(1))
    assert 1 <= done < PARTS, f"the budget should stop the build partway, it stopped after {done} of {PARTS}"
    assert not list((root / "out").rglob("*.whl"))

    # 2. The same build again (no budget): it restores the tree and ninja runs only the rest.
    resumed = build(tree, root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (row,) = json.loads(resumed.stdout)
    log = build_log(row)
    assert f"resuming from {m.group(2)}: " in log, log[-3000:]
    ran = re.search(r"resumed build: (\d+) step\(s\) run now, (\d+) done by the stopped build", log)
    assert ran and int(ran.group(2)) == done and int(ran.group(1)) == PARTS - done, log[-3000:]

    # 3. From scratch: the same tree with a comment added to its __init__.py, so that the compile step runs
    # again (a new inputs hash: no state, no cached layer) while every C++ and CUDA input stays the same.
    # Its objects come from the shared ccache mount, which holds what steps 1 and 2 compiled, byte for
    # byte. The extension is the same bytes, and so is every other member but the edited file and RECORD
    # (its hash); the zip's entry times differ (the resumed tree keeps the stopped build's).
    cold_tree = tmp_path / "cold_tree"
    shutil.copytree(tree, cold_tree)
    init = cold_tree / "resumable_kernel" / "__init__.py"
    init.write_text(init.read_text() + "# built from scratch\n")
    cold_root = tmp_path / "cold"
    cold_root.mkdir()
    cold = build(cold_tree, cold_root)
    assert cold.returncode == 0, cold.stderr[-3000:]
    (cold_row,) = json.loads(cold.stdout)
    assert "resuming from" not in build_log(cold_row)
    resumed_members, cold_members = member_digests(row["wheel"]), member_digests(cold_row["wheel"])
    changed = {n for n in resumed_members if resumed_members[n] != cold_members.get(n)}
    assert changed == {"resumable_kernel/__init__.py"} | {n for n in resumed_members if n.endswith("/RECORD")}, changed
    assert any(n.endswith(".so") for n in resumed_members)
    assert row["smoke"] == {"resumable_kernel": "ok"}  # installed and imported in a fresh copy of the image
