"""`imagegen build --offline` on a real Docker engine: every build step without a network (issue 20's
device has none), the source a local tree, and torch, nvcc and the build requirements from the base image.

The base image is made online, the way a user's air-gapped image is (the session's `torch_image`,
tests/integration/torch_image.py, which test_engine_bases builds on too): the test base image (Debian's
python3.11 with g++, git, make, its -dev and -venv packages; no ccache) plus torch 2.11.0 (cu130) and the
build requirements in the system Python, and the CUDA 13.0 toolkit from PyPI assembled under /usr/local/cuda
by the toolchain step's own code. Then the fixture kernel is built with --offline: every RUN has
--network=none (a step that reached for PyPI or apt would fail, not wait), the OS step finds its packages
there (ccache alone missing: a warning), the image's torch is reused, and the wheel is verified.

Needs: a running Docker engine with buildx and the base image made by scripts/make-base-image.sh. Downloads
torch and the CUDA toolkit from PyPI while making the base image, through the pip cache mount.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from imagegen.model.arch_parse import parse_arch_list
from imagegen.finish.verify import verify_wheel

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0"]
NAME = "tiny-kernel-0_1_0-torch2_11-cu130-py311"

pytestmark = pytest.mark.integration


def sh(*cmd: str, cwd: Path | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def build(torch_image, tmp_path_factory):
    root = tmp_path_factory.mktemp("offline")
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), *CELL, "--base-image", torch_image,
              "--offline", "--out", str(root / "out"), "--work", str(root / "work"), cwd=root)
    return {"proc": proc, "out": root / "out", "work": root / "work"}


def test_the_offline_build_makes_a_verified_wheel(build):
    assert build["proc"].returncode == 0, build["proc"].stderr[-4000:]
    (wheel,) = sorted(build["out"].rglob("*.whl"))
    report = verify_wheel(wheel, parse_arch_list("8.0"))
    assert report.ok, report.problems


def test_no_step_reached_for_a_network_and_the_images_parts_were_used(build):
    assert build["proc"].returncode == 0, build["proc"].stderr[-4000:]
    (log,) = build["work"].glob(f"runs/*/logs/{NAME}.log")
    text = log.read_text(errors="replace")
    # Every step ran with --network=none: each RUN the log shows carries it.
    runs = [line for line in text.splitlines() if " RUN " in line and line.lstrip("#0123456789 ").startswith("[")]
    assert runs and all("--network=none" in line for line in runs), runs[:3]
    # The OS packages were there, but ccache, which could not be installed: the build went on without it.
    assert "imagegen: warning: ccache cannot be installed: building without it" in text
    # The image's torch, reused; pip never looked for an index.
    assert "torch 2.11.0 (cu130) is the base image's own: reused, not downloaded" in text
    assert "offline: the venv's own pip, the image's torch" in text
    assert "Downloading" not in text and "Collecting torch" not in text


def test_a_cell_that_would_download_is_refused_before_building(tmp_path):
    proc = sh(IMAGEGEN, "build", "sage", "--torch", "2.9", "--cuda", "13.0", "--python", "3.12", "--arch", "9.0",
              "--offline", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "--offline: the git source would be downloaded" in proc.stderr
    assert not (tmp_path / "out").exists()
