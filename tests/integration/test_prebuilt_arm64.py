"""linux/arm64 builder images and base images against a real registry (Debian's docker-registry on
127.0.0.1, registry.py): `imagegen lock` pulls each base image for every platform its cells build for
and pins a multi-platform image to its manifest list (one digest serves both), an image without an
arm64 variant is refused by name, and `imagegen pull` looks for an arm64 cell's builder image under a
tag of its own (-arm64) with `--platform linux/arm64`.

The base images here are tiny (one file, made with `docker import --platform`), and the multi-platform
one is assembled by `docker buildx imagetools create` in the registry itself: no QEMU needed. Building
and running an arm64 builder image runs nvcc under QEMU (about an hour for the fixture here:
docs/records/verification.md "linux/arm64 under QEMU"), which CI cannot afford.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "tiny_kernel"
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--source", str(TINY), "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "9.0",
        "--flavor", "pypi"]

pytestmark = pytest.mark.integration


def run(*cmd: str, cwd: Path, env: dict, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, env={**os.environ, **env}, capture_output=True, timeout=600,
                          input=input)


@pytest.fixture(scope="module")
def bases(registry, tmp_path_factory):
    """REG/igtest/base-amd64:1 and REG/igtest/base-arm64:1 (one platform each), and REG/igtest/base:multi,
    a manifest list of the two."""
    root = tmp_path_factory.mktemp("arm64-bases")
    tree = root / "rootfs"
    tree.mkdir()
    (tree / "hello").write_text("a base image of one file\n")
    tar = subprocess.run(["tar", "-C", str(tree), "-c", "."], capture_output=True, check=True).stdout
    env = registry.env()
    refs = {}
    for arch in ("amd64", "arm64"):
        ref = registry.ref(f"igtest/base-{arch}", "1")
        made = run("docker", "import", "--platform", f"linux/{arch}", "-", ref, cwd=root, env=env, input=tar)
        assert made.returncode == 0, made.stderr
        pushed = run("docker", "push", ref, cwd=root, env=env)
        assert pushed.returncode == 0, pushed.stderr
        refs[arch] = ref
    multi = registry.ref("igtest/base", "multi")
    made = run("docker", "buildx", "imagetools", "create", "-t", multi, refs["amd64"], refs["arm64"], cwd=root, env=env)
    assert made.returncode == 0, made.stderr
    refs["multi"] = multi
    yield {"root": root, "env": env, **refs}
    # Every image of the registry's, by tag and by digest (a pulled list's other variant keeps a
    # digest reference that `rmi TAG` leaves behind).
    listed = run("docker", "images", "--digests", "--format", "{{.Repository}} {{.Tag}} {{.Digest}}", cwd=root,
                 env=env).stdout.decode()
    for line in listed.splitlines():
        repo, tag, digest = (line.split() + ["", "", ""])[:3]
        if repo.startswith(registry.host + "/"):
            if tag and tag != "<none>":
                run("docker", "rmi", f"{repo}:{tag}", cwd=root, env=env)
            if digest and digest != "<none>":
                run("docker", "rmi", f"{repo}@{digest}", cwd=root, env=env)
    left = run("docker", "images", "--format", "{{.Repository}}", cwd=root, env=env).stdout.decode().split()
    assert not [r for r in left if r.startswith(registry.host + "/")], "the test left images behind"


def test_lock_pins_a_multi_platform_base_to_its_manifest_list_for_both_platforms(bases, registry, tmp_path):
    proc = run(IMAGEGEN, "lock", *CELL, "--platform", "linux/amd64,linux/arm64", "--base-image", bases["multi"],
               cwd=tmp_path, env=bases["env"])
    assert proc.returncode == 0, proc.stderr
    index = registry.manifest_digest("igtest/base", "multi")
    lock = json.loads((tmp_path / "imagegen.lock").read_text())
    assert lock["base_images"] == {bases["multi"]: f"{bases['multi']}@{index}"}
    # the engine's tag ends on the default platform's image (pulled last), which an amd64 build finds
    arch = run("docker", "image", "inspect", "--format", "{{.Architecture}}", bases["multi"], cwd=tmp_path,
               env=bases["env"])
    assert arch.stdout.decode().strip() == "amd64"
    # and both platforms' Dockerfiles start FROM the pinned list
    for platform in ("linux/amd64", "linux/arm64"):
        shown = run(IMAGEGEN, "render", *CELL, "--platform", platform, "--base-image", bases["multi"], cwd=tmp_path,
                    env=bases["env"])
        assert shown.returncode == 0, shown.stderr
        assert f"ARG BASE_IMAGE={bases['multi']}@{index}\n" in shown.stdout.decode()


def test_an_arm64_cell_on_a_base_without_an_arm64_variant_is_refused_by_name(bases, tmp_path):
    proc = run(IMAGEGEN, "lock", *CELL, "--platform", "arm64", "--base-image", bases["amd64"], cwd=tmp_path,
               env=bases["env"])
    assert proc.returncode == 7
    err = proc.stderr.decode()
    assert err.count("\n") == 1
    assert f"{bases['amd64']} has no linux/arm64 image" in err and "wanted linux/arm64, actual: linux/amd64" in err
    assert not (tmp_path / "imagegen.lock").exists()
    # the arm64-only image pins for an arm64 cell
    proc = run(IMAGEGEN, "lock", *CELL, "--platform", "arm64", "--base-image", bases["arm64"], cwd=tmp_path,
               env=bases["env"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "imagegen.lock").read_text())["base_images"][bases["arm64"]].startswith(
        bases["arm64"] + "@sha256:")


def test_pull_asks_for_the_arm64_builder_under_its_own_tag(bases, registry, tmp_path):
    ns = f"{registry.host}/ml"
    proc = run(IMAGEGEN, "pull", *CELL, "--platform", "arm64", "--base-image", bases["multi"], "--registry", ns,
               "--no-fallback", "--out", str(tmp_path / "wh"), "--work", str(tmp_path / "work"), cwd=tmp_path,
               env=bases["env"])
    assert proc.returncode == 7, proc.stderr
    err = proc.stderr.decode()
    assert f"{ns}/imagegen-tiny-kernel:0.1.0-torch2.11-cu130-py311-pypi-arm64 is not in the registry" in err
