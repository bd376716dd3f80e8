"""Prebuilt builder images against a real registry (Debian's docker-registry with htpasswd auth on
127.0.0.1, see registry.py; its storage kept across runs, its manifests deleted first, so a warm
machine's push finds the unchanged layers as a user's second push does): lock a base image to its digest, push a builder image, remove it
locally, pull it back and run it to get the wheel, which compiles to the same .so bytes as a bake
build of the same cell; a wrong password, a missing image and an unreachable registry each give one
clear line; the lock file pins what was pushed. The registry comes from the project's config line
(`registry = "HOST/ml"` under [tool.imagegen]): push, lock and pull are given no --registry.

Needs the engine and base image of test_engine_build.py, plus scripts/install-registry.sh (all
provided by scripts/test.sh as root). Fails, never skips, when a part is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from imagegen.finish.fatbin import reproducible_digest
from registry import INSTALL_HINT, LocalRegistry, RegistryError, kept_storage, missing_tools

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "tiny_kernel"
LOCAL_BASE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--source", str(TINY), "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0;9.0+PTX",
        "--flavor", "pypi"]
NAME = "tiny-kernel-0_1_0-torch2_11-cu130-py311"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """The conftest's registry, but its storage kept across test runs (registry.kept_storage): the
    builder image's ~9 GB of layers are pushed once per machine, later runs find them there ("Layer
    already exists") as a user's second push does. Every manifest is deleted first, so whatever this
    module reads from the registry is what it pushed itself; the storage is garbage-collected after."""
    missing = missing_tools()
    if missing:
        pytest.fail(f"a real registry is required but {', '.join(missing)} missing: {INSTALL_HINT}")
    storage = kept_storage("prebuilt")
    reg = LocalRegistry(tmp_path_factory.mktemp("registry"), storage=storage)
    with reg:
        reg.login()
        try:
            reg.delete_manifests()
        except (RegistryError, OSError):  # a storage an interrupted run broke: start it afresh
            reg.stop()
            shutil.rmtree(storage, ignore_errors=True)
            reg.start()
            reg.login()
        assert not [repo for repo in reg.repositories() if reg.tags(repo)]
        yield reg
    reg.garbage_collect()


def run(*cmd: str, cwd: Path, env: dict | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def so_digests(wheel: Path, digest=lambda b: hashlib.sha256(b).hexdigest()) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: digest(zf.read(n)) for n in zf.namelist() if ".so" in n}


def one_wheel(folder: Path) -> Path:
    wheels = sorted(folder.rglob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def project(registry, tmp_path_factory):
    """A project folder whose base image lives in the registry: tagged and pushed from the local
    test base image (made by scripts/make-base-image.sh)."""
    if shutil.which("docker") is None or run("docker", "image", "inspect", LOCAL_BASE, cwd=ROOT).returncode != 0:
        pytest.fail(f"the Docker engine and {LOCAL_BASE} are required: run scripts/test.sh as root")
    root = tmp_path_factory.mktemp("prebuilt")
    # The team's one line of config: push, pull and lock below take the registry from it (no --registry),
    # and a --registry flag still wins (test_missing_image_fails_clearly_or_falls_back_to_a_local_build).
    (root / "pyproject.toml").write_text(f'[project]\nname = "team-kernels"\n\n[tool.imagegen]\n'
                                         f'registry = "{registry.host}/ml"\n')
    base = registry.ref("imagegen-test/python", "3.11-bookworm")
    assert registry.docker("tag", LOCAL_BASE, base).returncode == 0
    pushed = registry.docker("push", base, timeout=900)
    assert pushed.returncode == 0, pushed.stderr
    # A ccache volume of its own, removed afterwards (users keep theirs: imagegen-ccache).
    volume = f"imagegen-test-ccache-{uuid.uuid4().hex[:8]}"
    env = {**registry.env(), "IMAGEGEN_PIP_CERT": "/etc/ssl/certs/ca-certificates.crt", "IMAGEGEN_CCACHE_VOLUME": volume}
    yield {"root": root, "base": base, "env": env, "ns": f"{registry.host}/ml"}
    registry.docker("rmi", base)
    # Every image this module pulled or built from the registry, tags and digests (a pull by digest
    # leaves an untagged 9 GB image that `rmi TAG` does not remove). By reference, never by ID: the
    # base image shares its ID with the local test base image.
    listed = run("docker", "images", "--digests", "--format", "{{.Repository}} {{.Tag}} {{.Digest}}", cwd=ROOT).stdout
    for line in listed.splitlines():
        repo, tag, digest = (line.split() + ["", "", ""])[:3]
        if repo.startswith(registry.host + "/"):
            if tag and tag != "<none>":
                run("docker", "rmi", f"{repo}:{tag}", cwd=ROOT)
            if digest and digest != "<none>":
                run("docker", "rmi", f"{repo}@{digest}", cwd=ROOT)
    run("docker", "volume", "rm", "-f", volume, cwd=ROOT)
    left = run("docker", "images", "--format", "{{.Repository}}", cwd=ROOT).stdout.split()
    assert not [r for r in left if r.startswith(registry.host + "/")], "the test left images behind"


@pytest.fixture(scope="module")
def locked(project, registry):
    proc = run(IMAGEGEN, "lock", *CELL, "--base-image", project["base"], cwd=project["root"], env=project["env"])
    assert proc.returncode == 0, proc.stderr
    return json.loads((project["root"] / "imagegen.lock").read_text())


@pytest.fixture(scope="module")
def pushed(project, locked, registry):
    proc = run(IMAGEGEN, "push", *CELL, "--base-image", project["base"], cwd=project["root"], env=project["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ref = f"{project['ns']}/imagegen-tiny-kernel:0.1.0-torch2.11-cu130-py311-pypi"
    yield {"proc": proc, "ref": ref, "lock": json.loads((project["root"] / "imagegen.lock").read_text())}
    registry.docker("rmi", ref)


def test_lock_pins_the_base_image_to_the_registry_digest(project, locked, registry):
    repo, tag = "imagegen-test/python", "3.11-bookworm"
    assert locked["base_images"] == {project["base"]: f"{project['base']}@{registry.manifest_digest(repo, tag)}"}
    assert locked["builder_images"] == {}  # the config's registry has no builder image yet: nothing to pin
    # render (and bake/build/pull) read the lock file from the current folder: FROM image@sha256.
    proc = run(IMAGEGEN, "render", *CELL, "--base-image", project["base"], cwd=project["root"])
    assert proc.returncode == 0, proc.stderr
    assert f"ARG BASE_IMAGE={locked['base_images'][project['base']]}\n" in proc.stdout


def test_push_writes_a_deterministic_reference_labels_and_the_pushed_digest(project, pushed, registry):
    ref = pushed["ref"]
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    digest = registry.manifest_digest(repo, tag)
    assert digest, registry.tags(repo)
    assert pushed["lock"]["builder_images"] == {ref: f"{ref}@{digest}"}  # the lock pins what was pushed
    assert pushed["proc"].stdout.strip() == f"{ref}@{digest}"
    inspect = registry.docker("image", "inspect", "--format", "{{json .Config.Labels}}", ref)
    labels = json.loads(inspect.stdout)
    assert labels["io.imagegen.recipe"] == "tiny-kernel" and labels["io.imagegen.torch"] == "2.11.0"
    assert labels["org.opencontainers.image.created"].endswith("Z") and len(labels["io.imagegen.inputs"]) == 16
    assert "io.imagegen.archs" not in labels  # the builder image is arch-neutral


def test_lock_with_only_the_config_line_pins_the_pushed_builder_image(project, pushed, registry):
    # A teammate's `imagegen lock`: no --registry, the builder image's digest read from the registry (not pulled).
    ref = pushed["ref"]
    proc = run(IMAGEGEN, "lock", *CELL, "--base-image", project["base"], cwd=project["root"], env=project["env"])
    assert proc.returncode == 0, proc.stderr
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    digest = registry.manifest_digest(repo, tag)
    assert f"{ref} -> {digest}" in proc.stderr
    lock = json.loads((project["root"] / "imagegen.lock").read_text())
    assert lock["builder_images"] == pushed["lock"]["builder_images"] == {ref: f"{ref}@{digest}"}
    assert lock["base_images"] == pushed["lock"]["base_images"]


def test_pull_of_the_pushed_image_gives_the_same_so_as_a_bake_build(project, pushed, registry):
    root, env = project["root"], project["env"]
    # Not in the local engine any more: pull must fetch it (by the digest in the lock file).
    assert registry.docker("rmi", pushed["ref"]).returncode == 0
    pulled = run(IMAGEGEN, "pull", *CELL, "--base-image", project["base"],
                 "--out", str(root / "pulled"), "--work", str(root / "work-pull"), "--gpus", "none", cwd=root, env=env)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert f"pulled {pushed['lock']['builder_images'][pushed['ref']]}" in pulled.stderr
    wheel = one_wheel(root / "pulled")
    assert wheel.parent == root / "pulled" / "tiny-kernel-0.1.0" / "torch2.11" / "cu130"
    manifest = json.loads((wheel.parent / "manifest.json").read_text())
    assert manifest["cells"][NAME]["image"] == pushed["lock"]["builder_images"][pushed["ref"]]
    # The image's gencode audit ran before the compile, and its verdict is in the manifest.
    assert f"[{NAME}] auditing in" in pulled.stderr and f"[{NAME}] audit (" in pulled.stderr
    audit = manifest["cells"][NAME]["audit"]
    assert audit["verdict"] == "ok", audit
    assert [e["module"] for e in audit["extensions"]] == ["tiny_kernel._C"]
    assert audit["extensions"][0]["sass"] == ["sm_80", "sm_90"] and audit["extensions"][0]["ptx"] == ["compute_90"]

    built = run(IMAGEGEN, "build", *CELL, "--base-image", project["base"], "--out", str(root / "baked"),
                "--work", str(root / "work-bake"), cwd=root, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    baked = one_wheel(root / "baked")
    assert baked.name == wheel.name
    # Same .so bytes, except nvcc's temporary-file names (tmpxft_<pid>_<n>): nvcc names them after its
    # process id, which depends on how many processes ran before it in the container
    # (imagegen.finish.fatbin.reproducible_digest; documented in README).
    assert so_digests(wheel)
    assert so_digests(baked, reproducible_digest) == so_digests(wheel, reproducible_digest)


def test_seed_004_docker_run_of_the_pulled_image_then_collect(project, pushed, registry):
    # Seed 004's own command, with the image's default CMD (no GPU here, so the archs come as -e):
    # the container compiles, smoke-tests the wheel in itself and leaves it in /out with its build
    # record; `imagegen collect` verifies it and records it, so `imagegen index` serves it.
    root = project["root"]
    digest_ref = pushed["lock"]["builder_images"][pushed["ref"]]
    assert registry.docker("pull", digest_ref, timeout=900).returncode == 0
    # The pypi flavor's CUDA_HOME is hard links into the wheels (each library stored once: ~3 GB less to
    # push and pull), and the registry's round trip kept them: no lone file but the libcuda stub.
    lone = registry.docker("run", "--rm", "--entrypoint", "find", digest_ref, "/opt/imagegen/cuda", "-type", "f",
                           "-links", "1", "-not", "-path", "*/stubs/*")
    assert lone.returncode == 0 and lone.stdout == "", lone.stdout[-2000:] + lone.stderr
    linked = registry.docker("run", "--rm", "--entrypoint", "stat", digest_ref, "-c", "%i",
                             "/opt/imagegen/cuda/lib/libcublas.so.13",
                             "/opt/imagegen/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcublas.so.13")
    assert linked.returncode == 0 and len(set(linked.stdout.split())) == 1, linked.stdout + linked.stderr
    out = root / "seed004-out"
    out.mkdir()
    ran = registry.docker("run", "--rm", "-e", "TORCH_CUDA_ARCH_LIST=8.0", "-v", f"{out}:/out", digest_ref, timeout=1800)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "smoke: import tiny_kernel: ok" in ran.stdout + ran.stderr
    wheel = one_wheel(out)
    record = json.loads((out / (wheel.name + ".imagegen.json")).read_text())
    assert record["requested_archs"] == "8.0" and record["smoke"]["ok"] is True and record["inputs"] is None
    assert record["base_image"].startswith(project["base"].rsplit(":", 1)[0])  # the tag, or the locked digest
    collected = run(IMAGEGEN, "collect", str(out), cwd=root)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert f"ok   {wheel}: recorded ({NAME}, SASS/PTX for 8.0)" in collected.stdout
    indexed = run(IMAGEGEN, "index", str(out), cwd=root)
    assert indexed.returncode == 0 and "indexed 1 wheel" in indexed.stdout, indexed.stdout + indexed.stderr


def test_wrong_credentials_are_one_clear_line(project, pushed, registry, tmp_path):
    # Not in the local engine (a digest already present would be used without asking the registry).
    for ref in (pushed["ref"], pushed["lock"]["builder_images"][pushed["ref"]]):
        registry.docker("rmi", ref)
    assert registry.docker("image", "inspect", pushed["ref"]).returncode != 0
    config = tmp_path / "docker-config"
    bad = registry.login_with("not-the-password", docker_config=str(config))
    assert bad.returncode != 0
    proc = run(IMAGEGEN, "pull", *CELL, "--base-image", project["base"], "--registry", project["ns"],
               "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--gpus", "none",
               cwd=project["root"], env={"DOCKER_CONFIG": str(config)})
    assert proc.returncode == 7, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{registry.host} refused the credentials" in lines[0] and "docker login" in lines[0]


def test_missing_image_fails_clearly_or_falls_back_to_a_local_build(project, pushed, registry, tmp_path):
    ns = f"{registry.host}/nothing-here"
    args = [*CELL, "--base-image", project["base"], "--registry", ns, "--gpus", "none"]
    strict = run(IMAGEGEN, "pull", *args, "--no-fallback", "--out", str(tmp_path / "strict"),
                 "--work", str(tmp_path / "w1"), cwd=project["root"], env=project["env"])
    assert strict.returncode == 7
    assert strict.stderr.strip().splitlines()[-1] == (
        f"imagegen: error: {ns}/imagegen-tiny-kernel:0.1.0-torch2.11-cu130-py311-pypi is not in the registry"
        " (push it with imagegen push)")
    fallback = run(IMAGEGEN, "pull", *args, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w2"),
                   cwd=project["root"], env=project["env"])
    assert fallback.returncode == 0, fallback.stdout + fallback.stderr
    assert "no prebuilt image" in fallback.stderr and "building it locally" in fallback.stderr
    assert one_wheel(tmp_path / "out").name.startswith("tiny_kernel-0.1.0+cu130torch2.11-")
    registry.docker("rmi", f"{ns}/imagegen-tiny-kernel:0.1.0-torch2.11-cu130-py311-pypi")


def test_unreachable_registry_is_one_clear_line(project, tmp_path):
    proc = run(IMAGEGEN, "pull", *CELL, "--base-image", project["base"], "--registry", "127.0.0.1:9/ml",
               "--out", str(tmp_path / "out"), "--gpus", "none", cwd=project["root"], env=project["env"])
    assert proc.returncode == 7
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "registry 127.0.0.1:9 is not reachable" in lines[0]


def test_gpus_all_on_an_engine_without_the_nvidia_toolkit_is_one_clear_line(project, pushed, registry, tmp_path):
    # This engine has no NVIDIA Container Toolkit (no GPU here): `docker run --gpus all` itself fails
    # ('could not select device driver'); imagegen says what to install, once, instead of failing
    # every cell.
    assert subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True,
                          text=True).stdout.find("nvidia") == -1
    proc = run(IMAGEGEN, "pull", *CELL, "--base-image", project["base"], "--registry", project["ns"], "--no-fallback",
               "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--gpus", "all",
               cwd=project["root"], env=project["env"])
    assert proc.returncode == 4, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("imagegen: error: docker cannot give containers the GPUs (--gpus all)")
    assert "NVIDIA Container Toolkit" in last and "--gpus none" in last
    assert not list((tmp_path / "out").rglob("*.whl"))


class _NotARegistry:
    """A plain HTTP server on loopback that answers 404 everywhere (a web server, not a registry)."""

    def __enter__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _push_refused(project, registry_ns: str, tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    """`imagegen push` to ``registry_ns``; asserts it failed before building anything: one error line,
    no bake file in its work folder, no builder image tagged for that registry."""
    work = tmp_path / "work"
    proc = run(IMAGEGEN, "push", *CELL, "--base-image", project["base"], "--registry", registry_ns,
               "--work", str(work), cwd=project["root"], env=env)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imagegen: error: "), proc.stderr
    written = [p for p in work.rglob("*") if p.is_file()] if work.exists() else []
    assert not written, written
    ref = f"{registry_ns}/imagegen-tiny-kernel:0.1.0-torch2.11-cu130-py311-pypi"
    assert run("docker", "image", "inspect", ref, cwd=ROOT).returncode != 0, f"{ref} was built"
    return proc


def test_push_to_an_unreachable_registry_fails_before_building(project, tmp_path):
    proc = _push_refused(project, "127.0.0.1:9/ml", tmp_path, project["env"])
    assert "registry 127.0.0.1:9 is not reachable" in proc.stderr and "check the address" in proc.stderr


def test_push_to_a_server_that_is_not_a_registry_fails_before_building(project, tmp_path):
    with _NotARegistry() as host:
        proc = _push_refused(project, f"{host}/ml", tmp_path, project["env"])
    assert f"{host} does not serve the registry API" in proc.stderr and "answered 404" in proc.stderr


def test_push_with_a_wrong_password_fails_before_building(project, registry, tmp_path):
    # The real registry (htpasswd auth) sees a stored user with the wrong password; `docker login`
    # would refuse to store it, so the docker config is written as a stale login leaves it.
    import base64
    config = tmp_path / "docker-config"
    config.mkdir()
    auth = base64.b64encode(f"{registry.user}:not-the-password".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    proc = _push_refused(project, f"{registry.host}/ml", tmp_path, {**project["env"], "DOCKER_CONFIG": str(config)})
    assert f"{registry.host} refused the credentials" in proc.stderr and "docker login" in proc.stderr


def test_push_without_a_login_fails_before_building(project, registry, tmp_path):
    config = tmp_path / "docker-config"
    config.mkdir()
    proc = _push_refused(project, f"{registry.host}/ml", tmp_path, {**project["env"], "DOCKER_CONFIG": str(config)})
    assert f"{registry.host} refused the credentials" in proc.stderr and "docker login" in proc.stderr
