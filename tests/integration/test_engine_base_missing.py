"""A base image that cannot be pulled, on a real Docker engine: the build needs that image whatever is
skipped, so the cell's error says the image cannot be pulled and names what applies (another --flavor,
--base-image, a registry mirror, `imagegen lock`), not "--no-audit skips it", with or without the audit.

The base image is on a registry port nothing listens on (127.0.0.1:9, discard), so its pull fails at
once. Needs: a running Docker engine with buildx.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "tiny_kernel"
MISSING = "127.0.0.1:9/imagegen-missing/python:3.11"
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "9.0", "--flavor", "pypi"]

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("audit", [[], ["--no-audit"]], ids=["audited", "no-audit"])
def test_a_base_image_that_cannot_be_pulled_says_so_and_what_applies(tmp_path, audit):
    proc = subprocess.run([IMAGEGEN, "build", "--source", str(TINY), *CELL, "--base-image", f"13.0={MISSING}",
                           *audit, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode != 0, proc.stderr[-3000:]
    told = proc.stdout + proc.stderr  # the results table (stdout) and the failures' summary (stderr)
    said = [line for line in told.splitlines() if f"the base image {MISSING} cannot be pulled" in line]
    assert said, told[-3000:]
    assert all(w in said[0] for w in ("connection refused", "--flavor", "--base-image 13.0=IMAGE", "registry",
                                      "imagegen lock"))
    assert "--no-audit skips" not in told and "Traceback" not in told
