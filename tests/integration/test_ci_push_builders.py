"""A team's prebuilt builder images, from the CI workflow to a teammate's `imagegen pull`, against a real
registry on 127.0.0.1 (tests/integration/registry.py, htpasswd auth): the workflow `imagegen ci github
--push-builders` writes takes its registry from the project's one config line; its "Push the builder image"
step, run as a runner runs it (its bash from the workflow, the real buildx and engine), pushes the target's
builder stage under the reference `imagegen push` gives, with the Dockerfile's and the bake file's labels,
and records the digest the registry serves; the lock job's script merges it into imagegen.lock. Then, with
no --registry anywhere, `imagegen lock` pins the same digest from the config and `imagegen pull` fetches that
image by it. No credential reaches the step's output, its files or the lock file.

The pushed image is a stand-in builder stage of a few bytes (the step is what is tested: the real builder of
the tiny fixture is ~9 GB, and its push, pull and compile from the config's registry are
tests/integration/test_prebuilt.py), so `pull` stops at the gencode audit the stand-in cannot run.

Needs the engine with buildx and scripts/install-registry.sh (a failure, never a skip, without them)."""

from __future__ import annotations

import calendar
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from imagegen.plan.registry import Lock

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
TINY = ROOT / "tests" / "fixtures" / "tiny_kernel"
CELL = ["--source", str(TINY), "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0",
        "--flavor", "pypi"]
TARGET = "tiny-kernel-0_1_0-torch2_11-cu130-py311"
NAME = "imagegen-tiny-kernel:0.1.0-torch2.11-cu130-py311-pypi"  # what `imagegen push` names the cell's image
# The stand-in builder stage: labels as the real Dockerfile's builder stage has them (from its base stage).
DOCKERFILE = """\
FROM scratch AS base
LABEL org.opencontainers.image.title="imagegen builder for tiny-kernel 0.1.0" \\
      org.opencontainers.image.version="0.1.0" \\
      io.imagegen.recipe="tiny-kernel"
COPY marker /imagegen/marker

FROM base AS builder
COPY marker /imagegen/src/marker

FROM scratch AS wheels
COPY --from=builder /imagegen/marker /
"""


def run(*cmd: str, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def project(registry, tmp_path_factory):
    """A checkout whose pyproject has the team's registry line, its bake file and the workflow written from
    them; a base image of one file in the registry (what `imagegen lock` pins first)."""
    root = tmp_path_factory.mktemp("team")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    ns = f"{registry.host}/ml"
    (root / "pyproject.toml").write_text(f'[project]\nname = "kernels"\n\n[tool.imagegen]\nregistry = "{ns}"\n')
    base = registry.ref("imagegen-test/push-builders-base", "1")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("etc/imagegen-base")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"ok\n"))
    env = registry.env()
    proc = subprocess.run(["docker", "import", "-", base], input=data.getvalue(), capture_output=True,
                          env={**os.environ, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert registry.docker("push", base, timeout=300).returncode == 0
    for argv in (["bake", *CELL, "--base-image", base, "-f", "bake.json"],
                 ["ci", "github", "--bake-file", "bake.json", "--registry", registry.host, "--push-builders",
                  "-o", "wf.yml"]):
        proc = run(IMAGEGEN, *argv, cwd=root, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load((root / "wf.yml").read_text())
    yield {"root": root, "ns": ns, "ref": f"{ns}/{NAME}", "base": base, "env": env, "doc": doc}
    for image in (base, f"{ns}/{NAME}"):
        registry.docker("rmi", image)
    listed = registry.docker("images", "--digests", "--format", "{{.Repository}}@{{.Digest}}").stdout.split()
    for image in listed:
        if image.startswith(f"{ns}/") and not image.endswith("@<none>"):
            registry.docker("rmi", image)


def steps(doc: dict, job: str) -> dict[str, dict]:
    return {s["name"]: s for s in doc["jobs"][job]["steps"]}


def run_script(step: dict, env: dict, tmp: Path) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """A `run:` step as the runner runs it (bash --noprofile --norc -eo pipefail), with its env as given."""
    output = tmp / "github_output"
    output.write_text("")
    full = {**os.environ, **env, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"),
            "RUNNER_TEMP": str(tmp)}
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], env=full,
                          capture_output=True, text=True, timeout=600, cwd=tmp)
    return proc, dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)


def test_the_workflow_pushes_what_the_config_names_and_a_teammate_pulls_it_with_no_registry_flag(
        project, registry, tmp_path):
    root, ns, ref, env = project["root"], project["ns"], project["ref"], project["env"]
    doc = project["doc"]
    (row,) = doc["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert row["target"] == TARGET and row["builder"] == NAME
    push = steps(doc, "build")["Push the builder image"]
    assert push["env"]["BUILDERS"] == ns  # the config's line, not --registry/--namespace

    # Before anything is pushed: lock pins the base image and says the builder image is not there yet.
    locked = run(IMAGEGEN, "lock", *CELL, "--base-image", project["base"], cwd=root, env=env)
    assert locked.returncode == 0, locked.stderr
    assert f"{ref} is not in the registry yet: not pinned" in locked.stderr
    assert json.loads((root / "imagegen.lock").read_text())["builder_images"] == {}

    # The push step, on a stand-in bake file of the same target (a builder stage of a few bytes).
    work = tmp_path / "runner"
    (work / "ctx").mkdir(parents=True)
    (work / "ctx" / "Dockerfile").write_text(DOCKERFILE)
    (work / "ctx" / "marker").write_text("builder\n")
    real = json.loads((root / "bake.json").read_text())["target"][TARGET]
    (work / "bake.json").write_text(json.dumps({"target": {TARGET: {
        "context": "ctx", "dockerfile": "Dockerfile", "target": "wheels", "labels": real["labels"],
        "output": ["type=local,dest=out"]}}}))
    step_env = {**env, **{k: v for k, v in push["env"].items() if "${{" not in v}, "TARGET": TARGET,
                "BUILDER": row["builder"], "BAKE_FILE": "bake.json"}
    started = time.time()
    proc, outputs = run_script(push, step_env, work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    repo, tag = ref[len(registry.host) + 1:].split(":")
    digest = registry.manifest_digest(repo, tag)
    assert digest and outputs == {"ref": ref, "digest": digest}
    assert f"::notice::{TARGET}: pushed the builder image {ref}@{digest}" in proc.stdout
    assert (work / "summary.md").read_text() == f"- builder image `{ref}@{digest}`\n"
    # its labels: the Dockerfile's builder stage's, the bake target's, and when it was made
    assert registry.docker("pull", f"{ref}@{digest}").returncode == 0
    labels = json.loads(registry.docker("image", "inspect", "--format", "{{json .Config.Labels}}",
                                        f"{ref}@{digest}").stdout)
    assert {k: labels[k] for k in ("org.opencontainers.image.title", "org.opencontainers.image.version",
                                   "io.imagegen.recipe", "io.imagegen.cell", "io.imagegen.builder")} == {
        "org.opencontainers.image.title": "imagegen builder for tiny-kernel 0.1.0",
        "org.opencontainers.image.version": "0.1.0", "io.imagegen.recipe": "tiny-kernel",
        "io.imagegen.cell": TARGET, "io.imagegen.builder": NAME}
    created = calendar.timegm(time.strptime(labels["org.opencontainers.image.created"], "%Y-%m-%dT%H:%M:%SZ"))
    assert started - 120 < created < time.time() + 120
    registry.docker("rmi", f"{ref}@{digest}")

    # The lock job's script over what the build jobs uploaded (here: this one job's file).
    lock_step = steps(doc, "lock")["Write imagegen.lock"]
    merged = tmp_path / "lock-job"
    (merged / "builder-lock").mkdir(parents=True)
    (merged / "builder-lock" / f"{TARGET}.json").write_bytes((work / "builder-lock" / f"{TARGET}.json").read_bytes())
    proc, _ = run_script(lock_step, {}, merged)
    assert proc.returncode == 0 and proc.stdout == f"{ref}@{digest}\n", proc.stdout + proc.stderr
    artifact = Lock.load(merged / "lock" / "imagegen.lock")
    assert artifact.builder_images == {ref: f"{ref}@{digest}"} and artifact.base_images == {}
    # an empty run (every push failed): a warning and no file, not a broken lock
    empty = tmp_path / "lock-none"
    empty.mkdir()
    proc, _ = run_script(lock_step, {}, empty)
    assert proc.returncode == 0 and "::warning::no build job pushed its builder image" in proc.stdout
    assert not (empty / "lock" / "imagegen.lock").exists()

    # A teammate, the same config line and no --registry: lock pins what the workflow pushed ...
    locked = run(IMAGEGEN, "lock", *CELL, "--base-image", project["base"], cwd=root, env=env)
    assert locked.returncode == 0, locked.stderr
    assert f"{ref} -> {digest}" in locked.stderr
    lock = json.loads((root / "imagegen.lock").read_text())
    assert lock["builder_images"] == {ref: f"{ref}@{digest}"}  # the workflow's artifact says the same
    assert list(lock["base_images"]) == [project["base"]]
    # ... and pull fetches that image by it. The stand-in cannot run the audit: the cell fails there, after the pull.
    pulled = run(IMAGEGEN, "pull", *CELL, "--base-image", project["base"], "--gpus", "none", "--out",
                 str(tmp_path / "wheels"), "--work", str(tmp_path / "work"), cwd=root, env=env)
    assert f"pulled {ref}@{digest} ({digest})" in pulled.stderr, pulled.stderr
    assert "building it locally" not in pulled.stderr and pulled.returncode != 0
    assert "the gencode audit could not run in" in pulled.stdout + pulled.stderr
    # A flag still wins over the config.
    other = run(IMAGEGEN, "pull", *CELL, "--base-image", project["base"], "--gpus", "none", "--no-fallback",
                "--registry", f"{registry.host}/elsewhere", "--out", str(tmp_path / "wheels"),
                "--work", str(tmp_path / "work"), cwd=root, env=env)
    assert other.returncode != 0
    assert f"{registry.host}/elsewhere/{NAME} is not in the registry" in other.stderr, other.stderr

    # No credential anywhere the workflow's steps wrote.
    written = [p for d in (work, merged) for p in d.rglob("*") if p.is_file()]
    assert written and not [p for p in written if registry.password in p.read_text(errors="replace")]
    assert registry.password not in proc.stdout + proc.stderr
