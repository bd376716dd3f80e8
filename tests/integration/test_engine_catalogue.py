"""A real catalogue package built on a real Docker engine from its PyPI sdist (issue 18's done-when):
causal-conv1d 1.6.1, the cheapest package of the catalogue, for one arch.

GitHub cannot be reached here; PyPI can. The recipe pins the sdist by sha256, applies its arch-list
patch (upstream compiles a fixed list of nine archs whatever is asked), sets the package's own
force-build variable (else setup.py downloads a prebuilt wheel from GitHub) and builds through the same
bake path as every cell: audit, compile, smoke import, verify, collect.

Needs: a running Docker engine with buildx and the base image made by scripts/make-base-image.sh.
Shares the torch layer with test_engine_build (same base, torch, CUDA and Python).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagegen.model.catalogue import load_catalogue
from imagegen.finish.verify import verify_wheel

BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
NAME = "causal-conv1d-1_6_1-torch2_11-cu130-py311"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"base image {BASE_IMAGE} missing: run scripts/make-base-image.sh {BASE_IMAGE}")
    root = tmp_path_factory.mktemp("catalogue")
    proc = subprocess.run([IMAGEGEN, "build", "causal-conv1d", "--fetch", "sdist", "--torch", "2.11", "--cuda", "13.0",
                           "--python", "3.11", "--arch", "8.0", "--flavor", "pypi", "--base-image", BASE_IMAGE,
                           "--out", str(root / "out"), "--work", str(root / "work"), "--ca-bundle", SYSTEM_CA],
                          cwd=root, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    (wheel,) = sorted((root / "out" / "causal-conv1d-1.6.1" / "torch2.11" / "cu130").glob("*.whl"))
    entry = json.loads((wheel.parent / "manifest.json").read_text())["cells"][NAME]
    return {"proc": proc, "wheel": wheel, "entry": entry}


def test_the_wheel_is_the_packages_own_version_with_the_cells_local_label(built):
    assert built["wheel"].name == "causal_conv1d-1.6.1+cu130torch2.11-cp311-cp311-linux_x86_64.whl"
    assert built["entry"]["sha256"] == hashlib.sha256(built["wheel"].read_bytes()).hexdigest()


def test_the_source_is_the_pinned_pypi_sdist(built):
    sdist = load_catalogue().get("causal-conv1d").version("1.6.1").sdist
    source = built["entry"]["source"]
    assert source["kind"] == "sdist" and source["url"] == sdist.url and source["sha256"] == sdist.sha256
    assert built["entry"]["patches"] == ["causal-conv1d-arch-list.patch"]


def test_the_arch_knob_is_honoured_one_arch_not_nine(built):
    # Upstream's setup.py would compile sm_75 sm_80 sm_87 sm_90 sm_100 sm_103 sm_110 sm_120 sm_121 here.
    (so,) = verify_wheel(built["wheel"], None).extensions
    assert so.name == "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so"
    assert sorted(set(map(str, so.entries))) == ["sm_80"]  # one cubin per .cu file
    audit = built["entry"]["audit"]
    assert audit["verdict"] == "ok"
    (ext,) = audit["extensions"]
    assert ext["module"] == "causal_conv1d_cuda" and ext["sass"] == ["sm_80"] and ext["ptx"] == []
    proc = subprocess.run([IMAGEGEN, "verify", str(built["wheel"]), "--arch", "8.0"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_wheel_was_installed_and_imported_in_the_builder(built):
    # The smoke stage: installed into a fresh copy of the torch environment; both modules import
    # (causal_conv1d_cuda loads without a GPU: it only needs libcudart from the torch install).
    assert built["entry"]["smoke"] == {"causal_conv1d": "ok", "causal_conv1d_cuda": "ok"}
