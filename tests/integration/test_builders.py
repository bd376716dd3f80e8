"""Scale-out and cache options on the real engine: `--builder` repeated deals the matrix out between
two real buildx builders on two BuildKit nodes (the default builder of the machine's engine, and a
docker context for a second dockerd the test starts itself, which buildx lists as a builder with the
docker driver), and `--cache-to` is checked against the builder's driver before anything builds (the
docker driver exports inline cache only).

The second dockerd (tests/integration/second_dockerd.py) has its own data-root, exec-root, pidfile,
unix socket, containerd and bridge (br-imagegen2, 172.31.250.0/24, NATed by iptables rules of its own
so that RUN steps reach PyPI); the base image is copied into it with docker save / load. The test
checks that each builder ran its share and that the second share really ran on the second engine
(its compiler's error, and build-cache records of its own used during the build, the torch layer's
among them). It is always stopped and removed afterwards, bridge and iptables rules included, except
its data-root (/var/lib/imagegen-dockerd2, several GB, bounded: its cache mounts are pruned): the next
run on this machine finds the torch + CUDA layer there instead of installing it from PyPI again (a
fresh machine installs it, 100-160 s). When it cannot start, the test fails with the tail of its log.

Needs root, the engine and base image of test_engine_build.py (scripts/test.sh provides both as
root), iproute2 and iptables.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from second_dockerd import DockerdError, SecondDockerd

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0;9.0+PTX", "--flavor", "pypi",
        "--base-image", BASE_IMAGE]
SECOND = "imagegen-second"

pytestmark = pytest.mark.integration


def sh(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=3600)


@pytest.fixture
def second_builder(tmp_path_factory):
    """A second real dockerd with BASE_IMAGE loaded, as the docker context SECOND; removed after the test
    but for its data-root (the build cache a later run reuses)."""
    if sh("docker", "image", "inspect", BASE_IMAGE).returncode != 0:
        pytest.fail(f"the Docker engine and {BASE_IMAGE} are required: run scripts/test.sh as root")
    engine = SecondDockerd(tmp_path_factory.mktemp("dockerd2"), keep_data=True)
    try:
        try:
            engine.start()
            engine.load_image(BASE_IMAGE)
            engine.create_context(SECOND)
        except DockerdError as exc:
            pytest.fail(str(exc), pytrace=False)
        listed = sh("docker", "buildx", "ls")
        assert SECOND in listed.stdout, listed.stdout
        yield engine
        # What is kept stays bounded: BuildKit's cache mounts (pip's downloads) go, the layers stay.
        engine.docker("builder", "prune", "-f", "--filter", "type=exec.cachemount", timeout=300)
    finally:
        engine.stop()


def used_since(record: dict, since: datetime) -> bool:
    """A build-cache record of the engine API (LastUsedAt: RFC 3339, UTC, nanoseconds) used at or after ``since``."""
    stamp = record.get("LastUsedAt") or record.get("CreatedAt") or ""
    try:
        when = datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return False
    return stamp.endswith("Z") and when >= since


def test_matrix_is_split_across_two_builders(second_builder, tmp_path):
    engine = second_builder
    # Two engines: the context imagegen is given reaches the second dockerd, not the first one.
    first_id = sh("docker", "info", "--format", "{{.ID}}").stdout.strip()
    via_context = sh("docker", "--context", SECOND, "info", "--format", "{{.ID}}").stdout.strip()
    assert first_id and via_context == engine.engine_id() != first_id, (first_id, via_context)
    before = {record["ID"] for record in engine.build_cache()}
    started = datetime.now(timezone.utc).replace(microsecond=0)
    time.sleep(1)  # the API's stamps are compared to the second
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), "--source", str(FIXTURES / "broken_kernel"),
              *CELL, "--builder", "default", "--builder", SECOND, "--out", str(tmp_path / "out"),
              "--work", str(tmp_path / "work"), cwd=tmp_path)
    # broken_kernel fails to compile by design; tiny_kernel's wheel must still be there.
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "splitting 2 cell(s) over 2 builders: default (1), imagegen-second (1)" in proc.stderr
    assert f"on builder {SECOND}" in proc.stderr and "on builder default" in proc.stderr
    # Each builder really built its cell: the broken kernel failed in its compiler on the second one
    # (a docker context as --builder is run as `docker --context X buildx bake`), not in bake.
    assert "broken.cu(4): error: expected a declaration" in proc.stdout, proc.stdout[-3000:]
    assert "[broken-kernel-0_1_0-torch2_11-cu130-py311] audit (" in proc.stderr
    logs = {p.parent.name for p in (tmp_path / "work" / "runs").glob("*/logs/*/*.log")}
    assert logs == {"default", SECOND}
    assert len(list((tmp_path / "out" / "tiny-kernel-0.1.0").rglob("*.whl"))) == 1
    # The second share ran on the second engine: its BuildKit used build-cache records of that cell during
    # the build (the build context and the scripts it was sent, the compile step's ccache mount), and it
    # holds the cell's torch + CUDA toolkit layer (several GB: made in this build on a fresh machine,
    # installed from PyPI through its own bridge; kept by the last run on a warm one).
    cache = engine.build_cache()
    used = [record for record in cache if used_since(record, started)]
    assert any(record.get("Type") == "source.local" for record in used), (sorted(before), cache)
    assert any("imagegen-ccache" in (record.get("Description") or "") for record in used), used
    assert max(max(record.get("Size") or 0, 0) for record in cache) > 1_000_000_000, cache


def test_registry_cache_export_on_the_docker_driver_is_refused_before_building(tmp_path):
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), *CELL, "--out", str(tmp_path / "out"),
              "--cache-to", "type=registry,ref=127.0.0.1:9/ml/cache:tiny,mode=max", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "imagegen: error: builder (current) uses the docker driver, which exports only inline cache: use --cache-to"
        " type=inline, or a docker-container / remote / kubernetes builder (--builder)"]
    assert not (tmp_path / "out").exists()


def test_inline_cache_is_accepted_on_the_docker_driver(tmp_path):
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), *CELL, "--out", str(tmp_path / "out"),
              "--work", str(tmp_path / "work"), "--cache-to", "type=inline", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bake = next((tmp_path / "work" / "runs").glob("*/docker-bake.json")).read_text()
    assert '"cache-to": [\n        "type=inline"\n      ]' in bake
