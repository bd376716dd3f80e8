"""Base images on a real Docker engine: the fallback when the primary cannot be pulled, and the torch
an image ships reused instead of downloaded again (issue 18 items 5 and 6).

One `imagegen build` of the tiny_kernel fixture with ``--base-image 13.0=PRIMARY,FALLBACK``: the
primary is an image on a registry port nothing listens on (so its pull fails at once); the fallback is
a test image whose system Python already has torch 2.11.0 (cu130), as runpod's images have theirs
(the session's `torch_image`, tests/integration/torch_image.py, which test_engine_offline builds on too).
The build must pass over the primary, build on the fallback, record it in the manifest, and reuse that
image's torch (a venv with the system site packages, no torch install in the build log).

Needs: a running Docker engine with buildx and the base image made by scripts/make-base-image.sh.
The torch image installs torch from PyPI through the same pip cache mount the builders use.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from image_scan import find_in_layers_made_since, overlay2_layers

from imagegen.finish.verify import verify_wheel

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
MISSING = "127.0.0.1:9/imagegen-missing/python:3.11"  # port 9 (discard): nothing answers there
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "9.0", "--flavor", "pypi"]
NAME = "tiny-kernel-0_1_0-torch2_11-cu130-py311"

pytestmark = pytest.mark.integration

def sh(*cmd: str, cwd: Path | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def build(torch_image, tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    plan = sh(IMAGEGEN, "plan", "--source", str(FIXTURES / "tiny_kernel"), *CELL,
              "--base-image", f"13.0={MISSING},{torch_image}", "--json", cwd=root)
    # With a --netrc of its own (issue 32): on this run's torch image every step runs afresh, the toolchain
    # step too (its pip, reading NETRC, checks the PyPI toolkit), so the secret is mounted where no
    # cached layer can hide what a step did with it.
    token = f"imagegen-bases-netrc-{uuid.uuid4().hex}"
    netrc = root / "netrc"
    netrc.write_text(f"machine private.example login x-access-token password {token}\n")
    netrc.chmod(0o600)
    before = overlay2_layers()
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), *CELL,
              "--base-image", f"13.0={MISSING},{torch_image}", "--out", str(root / "out"), "--work", str(root / "work"),
              "--ca-bundle", SYSTEM_CA, "--netrc", str(netrc), cwd=root)
    return {"plan": plan, "proc": proc, "out": root / "out", "work": root / "work", "image": torch_image,
            "netrc": netrc, "token": token, "layers_before": before}


def manifest_entry(build) -> tuple[Path, dict]:
    (wheel,) = sorted((build["out"] / "tiny-kernel-0.1.0" / "torch2.11" / "cu130").glob("*.whl"))
    return wheel, json.loads((wheel.parent / "manifest.json").read_text())["cells"][NAME]


def test_the_plan_names_the_fallback_and_cannot_know_the_custom_images_torch(build):
    assert build["plan"].returncode == 0, build["plan"].stderr
    (cell,) = json.loads(build["plan"].stdout)["cells"]
    assert cell["base_image"] == MISSING and cell["torch_from"] == "image-or-venv"
    assert f"fallback base image: {build['image']} (if {MISSING} cannot be pulled)" in cell["notes"]


def test_the_cell_builds_on_the_fallback_and_the_manifest_says_so(build):
    proc = build["proc"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"[{NAME}] base image {MISSING}: " in proc.stderr and f"building on the fallback {build['image']}" in proc.stderr
    wheel, entry = manifest_entry(build)
    assert entry["base_image"] == build["image"]
    (note,) = [n for n in entry["notes"] if n.startswith("built on the fallback base image")]
    assert note.startswith(f"built on the fallback base image {build['image']}: {MISSING}: ")
    assert entry["smoke"] == {"tiny_kernel": "ok"}
    (so,) = verify_wheel(wheel, None).extensions
    assert sorted(map(str, so.entries)) == ["sm_90"]


def test_the_images_own_torch_is_reused_not_downloaded(build):
    assert build["proc"].returncode == 0, build["proc"].stderr[-4000:]
    # The bake log of the cell (the whole build: toolchain and deps steps included).
    (log,) = build["work"].glob(f"runs/*/logs/{NAME}.log")
    text = log.read_text(errors="replace")
    assert "torch 2.11.0 (cu130) is the base image's own: reused, not downloaded" in text
    assert "-m venv --system-site-packages /opt/imagegen/venv" in text
    # deps pins torch beside the build requirements: satisfied by the image's, nothing fetched
    assert "Requirement already satisfied: torch==2.11.0 in ./usr/local/lib/python3.11/dist-packages" in text
    assert "Collecting torch" not in text and "Downloading torch-" not in text


def test_the_netrc_secret_was_mounted_in_the_toolchain_step_and_no_layer_holds_it(build):
    # Issue 32: the toolchain step runs with the netrc secret mounted (never from the cache here: this
    # run's torch image is new), and no layer the build made holds the token or the file's path; nor
    # does any file the build wrote outside the engine.
    assert build["proc"].returncode == 0, build["proc"].stderr[-4000:]
    (run,) = (build["work"] / "runs").iterdir()
    bake = (run / "docker-bake.json").read_text()
    assert f"id=netrc,src={build['netrc']}" in bake and build["token"] not in bake
    (log,) = run.glob(f"logs/{NAME}.log")
    text = log.read_text(errors="replace")
    # The log holds each bake of the build (the audit's, then the wheel's): every toolchain RUN mounts the
    # secret, and at least one of them ran (DONE, not CACHED).
    runs = [(m.group(1), m.group(0)) for m in re.finditer(r"^(#\d+) \[[^]]*\] RUN .*imagegen_toolchain\.py --cell.*$",
                                                           text, re.M)]
    assert runs and all("--mount=type=secret,id=netrc" in line for _, line in runs), runs
    assert any(re.search(rf"^{step} DONE ", text, re.M) for step, _ in runs), runs
    assert build["layers_before"] is not None, "the layer scan reads overlay2's layer folders"
    needles = [build["token"].encode(), str(build["netrc"]).encode()]
    # what the build did put in a layer (the source step's copy of the tree): the scan must see it, so an
    # empty result is a clean build, not a scan that read nothing (other workers' builds add and remove
    # layers meanwhile: image_scan rescans or drops what vanished, and shows any other grep error)
    seen = b'CUDAExtension("tiny_kernel._C"'
    assert seen in (FIXTURES / "tiny_kernel" / "setup.py").read_bytes()
    found, layers = find_in_layers_made_since(build["layers_before"], [*needles, seen])
    assert seen in found, (layers, found)
    found.discard(seen)
    assert layers >= 4 and not found, (layers, found)  # toolchain, deps, source, compile, smoke at least
    for path in [*build["work"].rglob("*"), *build["out"].rglob("*")]:
        if path.is_file():
            assert build["token"].encode() not in path.read_bytes(), path
    assert build["token"] not in build["proc"].stdout + build["proc"].stderr


def test_a_plain_bake_of_the_fallback_target_builds_where_the_primary_cannot(build, tmp_path):
    # Issue 34: what a CI job's pick step runs when the primary cannot be had, `docker buildx bake
    # <target>-fallback` on a bake file `imagegen bake` wrote, with no imagegen in the loop. The primary
    # target fails at its FROM; the fallback target builds on the fallback image (its layers are the
    # fixture's build above: the same Dockerfile, base and inputs) and exports the wheel with its record.
    assert build["proc"].returncode == 0, build["proc"].stderr[-4000:]
    shutil.copytree(FIXTURES / "tiny_kernel", tmp_path / "tiny_kernel")
    proc = sh(IMAGEGEN, "bake", "--source", "tiny_kernel", *CELL, "--base-image", f"13.0={MISSING},{build['image']}",
              "-f", "docker-bake.hcl", "--out", "wheels", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "IMAGEGEN_PIP_CERT": SYSTEM_CA}
    primary = subprocess.run(["docker", "buildx", "bake", "--progress", "plain", NAME], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
    assert primary.returncode != 0 and MISSING in primary.stderr, primary.stderr[-2000:]
    fallback = subprocess.run(["docker", "buildx", "bake", "--progress", "plain", f"{NAME}-fallback"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=3600)
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert "CACHED" in fallback.stderr
    (wheel,) = (tmp_path / "wheels" / "tiny-kernel-0.1.0" / "torch2.11" / "cu130").glob("*.whl")
    record = json.loads(wheel.with_name(wheel.name + ".imagegen.json").read_text())
    assert record["cell"] == NAME and record["base_image"] == build["image"] and record["smoke"]["ok"] is True
    (so,) = verify_wheel(wheel, None).extensions
    assert sorted(map(str, so.entries)) == ["sm_90"]
