"""plan --resolve against real PyPI with real uv: the arm64 check CI can afford (an arm64 build under
QEMU takes about an hour here; docs/records/verification.md). uv resolves the builder's installs for
aarch64 on this x86_64 machine, which `pip install --dry-run --platform` cannot do (it evaluates
torch's markers for this machine and asks for x86_64 packages).

What it proves against PyPI, not against imagegen's tables: torch 2.11's aarch64 wheel is a CUDA
build and 2.10's is CPU-only (the plan's `arm64_min_torch: 2.11`), the pypi flavor's CUDA toolkit pin
and the recipe's build requirements install for aarch64, and a pin PyPI does not have is refused with
uv's reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from imagegen.plan import resolve

pytestmark = pytest.mark.integration

PLAN = [sys.executable, "-m", "imagegen", "plan", "sage", "--flavor", "pypi", "--cuda", "13.0", "--python", "3.12",
        "--arch", "9.0", "--resolve", "--json"]


def plan(*extra: str) -> tuple[int, dict, str]:
    proc = subprocess.run([*PLAN, *extra], capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


@pytest.mark.parametrize("torch, cuda_build", [("2.11.0", True), ("2.10.0", False)])
def test_pypi_torch_on_aarch64_is_a_cuda_build_from_2_11_on(torch, cuda_build):
    res = resolve.resolve(resolve.Step("torch", (f"torch=={torch}",)), "aarch64-manylinux_2_36", "3.12")
    assert res.error is None, res.error
    assert res.pins["torch"] == torch
    assert res.torch_is_cuda() is cuda_build, res.pins


def test_an_arm64_cell_resolves_for_aarch64_with_its_toolkit_and_build_requirements():
    code, out, err = plan("--torch", "2.11", "--platform", "linux/amd64,linux/arm64")
    assert code == 0, err
    by_platform = {c["platform"]: c for c in out["cells"]}
    assert set(by_platform) == {"linux/amd64", "linux/arm64"}
    for platform, arch in (("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")):
        cell = by_platform[platform]
        assert cell["status"] == "buildable", cell["reasons"]
        assert f"--resolve: the builder's installs resolve for {arch}-manylinux_2_36 (torch 2.11.0, a CUDA build)" \
            in cell["notes"]
    # each distinct install once per platform: torch, the toolkit, the build requirements
    assert err.count("resolving ") == 6, err


def test_a_torch_release_pypi_does_not_have_is_refused_with_uvs_reason():
    code, out, err = plan("--torch", "2.11.99", "--platform", "linux/arm64")
    assert code == 3
    (cell,) = out["cells"]
    assert cell["status"] == "rejected"
    (reason,) = cell["reasons"]  # the builder stops at torch: the later installs are not repeated
    assert reason.startswith("--resolve: torch (torch==2.11.99) cannot be installed for linux/arm64 (Python 3.12,"
                             " aarch64-manylinux_2_36): Because there is no version of torch==2.11.99"), reason
