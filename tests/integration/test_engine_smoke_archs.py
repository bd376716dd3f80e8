"""A builder smoke-imports only the extensions its arch list builds, on a real Docker engine.

The routed fixture (tests/fixtures/routed_kernels, SageAttention's layout in miniature) builds `_hopper`
only for a list with 9.0, and its recipe's smoke test names `_hopper`. Built for 8.0 (one small compile),
the wheel has no `_hopper`, and the smoke step imports the modules that list built and passes: until the
plan resolved the smoke list from the routing, it imported `_hopper` and failed, as an RTX 5090 user's
`imagegen build sage --arch 12.0+PTX` did on `sageattention._qattn_sm90` after a 15-minute compile.

Needs what test_engine_build needs (scripts/test.sh provides it): a running engine with buildx and the
registry-free base image; torch 2.11 (cu130) and the CUDA 13.0 toolkit from PyPI inside the build (the
pip cache mount is shared with the other engine tests).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "routed_kernels"
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--flavor", "pypi", "--base-image", BASE_IMAGE]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    info = subprocess.run(["docker", "info"], capture_output=True) if shutil.which("docker") else None
    if info is None or info.returncode != 0:
        pytest.fail("a running Docker engine is required: run scripts/install-engine.sh (scripts/test.sh does)")
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"base image {BASE_IMAGE} missing: run scripts/make-base-image.sh {BASE_IMAGE}")


def test_a_list_that_leaves_an_extension_out_builds_and_passes_smoke(engine, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([IMAGEGEN, "build", "routed-kernels", "--recipe-dir", str(FIXTURE), "--version", "routed",
                           *CELL, "--arch", "8.0", "--out", str(out), "--work", str(tmp_path / "work"), "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = json.loads(proc.stdout)
    assert result["status"] == "built", result
    # The smoke step imported what 8.0 built, and not the Hopper-only extension the recipe's test names.
    assert result["smoke"] == {"routed_kernels": "ok", "routed_kernels._portable": "ok"}, result["smoke"]
    (wheel,) = out.rglob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("routed_kernels/_portable.") and n.endswith(".so") for n in names), names
    assert not [n for n in names if "_hopper" in n], names
