"""The generated workflow's "Pick the base image" step (issue 34), run as a runner runs it: its bash, taken
from the workflow `imagegen ci github` wrote, with the real `docker buildx imagetools inspect` against a
real registry on 127.0.0.1 (tests/integration/registry.py) and a primary on a port nothing answers. The
step must pick the first base image that can be pulled and hand its target to the Bake step
($GITHUB_OUTPUT), say when that is a fallback, and fail the job when none can be pulled.

Needs the engine with buildx and scripts/install-registry.sh (a failure, never a skip, without them)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
MISSING = "127.0.0.1:9/imagegen-missing/base:1"  # port 9 (discard): nothing answers there
TARGET = "fa2-2_8_3-torch2_8-cu128-py312"


@pytest.fixture(scope="module")
def pick_step(tmp_path_factory) -> str:
    """The step's script, from a workflow written for a cell whose base image has a fallback."""
    root = tmp_path_factory.mktemp("workflow")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for argv in (["bake", "fa2", "--torch", "2.8", "--cuda", "12.8", "--arch", "8.0", "--flavor", "manylinux",
                  "-f", "bake.json"], ["ci", "github", "-o", "wf.yml", "--bake-file", "bake.json"]):
        proc = subprocess.run([IMAGEGEN, *argv], cwd=root, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    steps = {s["name"]: s for s in yaml.safe_load((root / "wf.yml").read_text())["jobs"]["build"]["steps"]}
    return steps["Pick the base image"]["run"]


@pytest.fixture(scope="module")
def pullable(registry):
    """A base image that can be pulled: a one-file image pushed to the registry (its manifest is what the
    step asks for); removed from the engine afterwards."""
    ref = registry.ref("imagegen-test/pick-fallback", "1")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("etc/imagegen-pick")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"ok\n"))
    proc = subprocess.run(["docker", "import", "-", ref], input=data.getvalue(), capture_output=True,
                          env={**os.environ, **registry.env()}, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    try:
        assert registry.docker("push", ref, timeout=300).returncode == 0
        yield ref
    finally:
        registry.docker("rmi", ref)


def run_step(script: str, bases: str, registry, tmp_path: Path) -> tuple[subprocess.CompletedProcess, str]:
    output = tmp_path / "github_output"
    output.write_text("")
    env = {**os.environ, **registry.env(), "TARGET": TARGET, "BASES": bases, "GITHUB_OUTPUT": str(output),
           "RUNNER_TEMP": str(tmp_path)}
    proc = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    return proc, output.read_text()


def test_the_step_picks_the_fallback_when_the_primary_cannot_be_pulled(pick_step, pullable, registry, tmp_path):
    proc, output = run_step(pick_step, f"{MISSING} {TARGET}\n{pullable} {TARGET}-fallback", registry, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert output == f"target={TARGET}-fallback\n"
    assert proc.stdout.startswith(f"{MISSING} cannot be pulled: ")
    assert f"::notice::{TARGET}: building on the fallback base image {pullable} ({TARGET}-fallback)" in proc.stdout


def test_the_step_keeps_the_primary_that_can_be_pulled(pick_step, pullable, registry, tmp_path):
    proc, output = run_step(pick_step, f"{pullable} {TARGET}\n{MISSING} {TARGET}-fallback", registry, tmp_path)
    assert proc.returncode == 0 and output == f"target={TARGET}\n" and "::notice::" not in proc.stdout, proc.stdout


def test_the_step_fails_the_job_when_no_base_image_can_be_pulled(pick_step, registry, tmp_path):
    gone = registry.ref("imagegen-test/never-pushed", "1")
    proc, output = run_step(pick_step, f"{MISSING} {TARGET}\n{gone} {TARGET}-fallback", registry, tmp_path)
    assert proc.returncode == 1 and output == ""
    assert f"::error::{TARGET}: none of its base images can be pulled" in proc.stdout
    assert f"{gone} cannot be pulled: " in proc.stdout
