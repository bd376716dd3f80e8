"""The gencode audit inside the builder image, on a real Docker engine: `imagegen build` audits every
cell before any compile target runs and refuses what the package's own build would get wrong;
`imagegen plan --audit` (without --native) shows the same table from the builder image.

Needs what test_engine_build needs (scripts/test.sh provides it): a running engine with buildx and
the registry-free base image. torch 2.11 (cu130) and the CUDA 13.0 toolkit come from PyPI inside
the build (the pip cache mount is shared with the other engine tests).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--flavor", "pypi", "--base-image", BASE_IMAGE]
HARDCODED = "hardcoded-gencode-0_3_0-torch2_11-cu130-py311"

pytestmark = pytest.mark.integration


def imagegen(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([IMAGEGEN, *map(str, argv)], capture_output=True, text=True, cwd=cwd, timeout=3600)


@pytest.fixture(scope="module")
def engine():
    info = subprocess.run(["docker", "info"], capture_output=True) if shutil.which("docker") else None
    if info is None or info.returncode != 0:
        pytest.fail("a running Docker engine is required: run scripts/install-engine.sh (scripts/test.sh does)")
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"base image {BASE_IMAGE} missing: run scripts/make-base-image.sh {BASE_IMAGE}")


def test_build_refuses_a_hard_coded_list_in_the_builder_image_before_compiling(engine, tmp_path):
    # Seed 003's pattern: setup.py hands nvcc compute_70/80/86 whatever --arch says; CUDA 13 has no sm_70.
    proc = imagegen("build", "--source", FIXTURES / "hardcoded_gencode", *CELL, "--arch", "9.0",
                    "--out", tmp_path / "out", "--work", tmp_path / "work", "--json", cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr[-3000:]
    (result,) = json.loads(proc.stdout)
    assert result["status"] == "failed" and result["cell"] == HARDCODED
    assert result["error"].startswith("cannot build hardcoded-gencode 0.3.0 torch 2.11.0 cu130 py3.11 arch 9.0")
    assert "the gencode audit refuses it" in result["error"] and "sm_70 was dropped in CUDA 13.0" in result["error"]
    assert "no extension would carry sm_90" in result["error"]
    ext = result["audit"]["extensions"][0]
    assert ext["module"] == "hardcoded_gencode._C" and ext["sass"] == ["sm_70", "sm_80", "sm_86"]
    # The table was said per cell, and nothing was compiled: no compile step ran, no wheel exists.
    assert f"[{HARDCODED}] audit (" in proc.stderr and "REFUSED" in proc.stderr
    assert f"[{HARDCODED}]   hardcoded_gencode._C" in proc.stderr
    log = Path(result["log"]).read_text()
    assert "imagegen_build.py audit" in log and "imagegen_build.py build" not in log
    assert not list((tmp_path / "out").rglob("*.whl"))


def test_plan_audit_runs_in_the_builder_image(engine, tmp_path):
    common = ["routed-kernels", "--recipe-dir", FIXTURES / "routed_kernels", *CELL, "--arch", "8.0 8.6 9.0 12.0+PTX",
              "--audit", "--work", tmp_path / "work"]
    routed = imagegen("plan", *common, "--version", "routed", "--json", cwd=tmp_path)
    assert routed.returncode == 0, routed.stderr[-3000:]
    (record,) = json.loads(routed.stdout)
    assert record["audit"]["verdict"] == "ok", record
    exts = {e["module"]: e for e in record["audit"]["extensions"]}
    assert exts["routed_kernels._portable"]["sass"] == ["sm_80", "sm_86", "sm_90a", "sm_120"]
    assert exts["routed_kernels._portable"]["ptx"] == ["compute_120"]
    assert exts["routed_kernels._hopper"]["sass"] == ["sm_90a"] and exts["routed_kernels._hopper"]["ptx"] == []
    # Upstream's layout: every extension gets every -gencode pair; refused, with the table printed.
    unrouted = imagegen("plan", *common, "--version", "unrouted", cwd=tmp_path)
    assert unrouted.returncode == 3, unrouted.stderr[-3000:]
    assert "REFUSED" in unrouted.stdout
    assert "routed_kernels._hopper would be compiled for sm_80, sm_86, sm_120, compute_120" in unrouted.stdout
    assert unrouted.stderr.strip().splitlines()[-1].startswith("imagegen: error: cannot build routed-kernels unrouted")


def test_plan_audit_native_flags_need_native(tmp_path):
    proc = imagegen("plan", "--source", FIXTURES / "tiny_kernel", "--audit", "--src-dir", tmp_path, cwd=tmp_path)
    assert proc.returncode == 2 and "--src-dir goes with --native" in proc.stderr


def test_a_catalogue_recipe_from_its_pypi_sdist_is_audited_in_its_builder_image(engine, tmp_path):
    # The catalogue's causal-conv1d recipe, not a fixture: 1.7.0 is pinned by its PyPI sdist alone (no tag
    # in the git mirror; GitHub is not reachable here), fetched inside the build and checked against its
    # sha256, the recipe's arch-list patch applied (upstream compiles nine archs whatever --arch says),
    # and its own setup.py audited: exactly what was asked, +PTX included.
    proc = imagegen("plan", "causal-conv1d", "--version", "1.7.0", *CELL, "--arch", "8.0;9.0+PTX", "--audit",
                    "--work", tmp_path / "work", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = json.loads(proc.stdout)
    got = record["audit"]
    assert got["verdict"] == "ok", got
    (ext,) = got["extensions"]
    assert ext["module"] == "causal_conv1d_cuda" and ext["sass"] == ["sm_80", "sm_90"] and ext["ptx"] == ["compute_90"]
    assert not any("hard-coded arch list" in w for w in got["warnings"]), got["warnings"]
