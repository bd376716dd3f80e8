"""The registry test infrastructure against the real parts: docker-registry (distribution 2.8) with
htpasswd auth on loopback, the Docker engine pushing to and pulling from it over plain HTTP, and the
helper's view of it through the registry HTTP API (tests/integration/registry.py, fixture `registry`).

Needs: a running Docker engine, the base image made by scripts/make-base-image.sh and the registry
from scripts/install-registry.sh (scripts/test.sh provides all three when run as root). Fails, never
skips, when one is missing. ~35 s, most of it dockerd compressing the 560 MB base layer for the push.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid

import pytest
from registry import LocalRegistry

BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
REPO, TAG = BASE_IMAGE.rsplit(":", 1)

pytestmark = pytest.mark.integration


def inspect(ref: str, fmt: str) -> str | None:
    out = subprocess.run(["docker", "image", "inspect", "--format", fmt, ref], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def rmi(registry: LocalRegistry, *refs: str) -> None:
    """Remove local references (never -f: an image that still has other tags only loses these)."""
    for ref in refs:
        if inspect(ref, "{{.Id}}") is not None:
            registry.docker("rmi", ref, timeout=120)


@pytest.fixture(scope="module")
def pushed(registry):
    """BASE_IMAGE tagged as HOST/REPO:TAG and pushed with the fixture's DOCKER_CONFIG."""
    if inspect(BASE_IMAGE, "{{.Id}}") is None:
        pytest.fail(f"base image {BASE_IMAGE} missing: run scripts/make-base-image.sh {BASE_IMAGE}")
    ref = registry.ref(REPO, TAG)
    tagged = registry.docker("tag", BASE_IMAGE, ref)
    assert tagged.returncode == 0, tagged.stderr
    try:
        push = registry.docker("push", ref)
        assert push.returncode == 0, f"docker push {ref} failed:\n{push.stdout}{push.stderr}"
        yield ref, push.stdout
    finally:
        rmi(registry, ref)


def test_push_lists_tag_and_digest(registry, pushed):
    ref, push_log = pushed
    assert TAG in registry.tags(REPO)
    digest = registry.manifest_digest(REPO, TAG)
    assert digest and digest.startswith("sha256:")
    # what docker recorded for the push: RepoDigests of the image, and the push's own last line
    repo_digests = inspect(ref, "{{range .RepoDigests}}{{println .}}{{end}}").split()
    assert f"{registry.host}/{REPO}@{digest}" in repo_digests, repo_digests
    assert f"{TAG}: digest: {digest} " in push_log
    media_type, manifest = registry.manifest(REPO, digest)
    assert media_type == "application/vnd.docker.distribution.manifest.v2+json"
    assert manifest["config"]["digest"] == inspect(BASE_IMAGE, "{{.Id}}")
    assert registry.tags("imagegen-test/not-pushed") == []
    assert registry.manifest_digest(REPO, "not-pushed") is None


def test_pull_brings_back_removed_tag(registry, pushed):
    ref, _ = pushed
    image_id = inspect(ref, "{{.Id}}")
    removed = registry.docker("rmi", ref)
    assert removed.returncode == 0, removed.stderr
    assert inspect(ref, "{{.Id}}") is None
    pull = registry.docker("pull", ref)
    assert pull.returncode == 0, f"docker pull {ref} failed:\n{pull.stdout}{pull.stderr}"
    assert inspect(ref, "{{.Id}}") == image_id

    # The base layer stayed local above (BASE_IMAGE holds it): a tiny image of its own proves that
    # blobs really come down from the registry.
    marker = uuid.uuid4().hex
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = marker.encode()
        info = tarfile.TarInfo("marker.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tiny = registry.ref("imagegen-test/tiny", marker[:12])
    try:
        imported = subprocess.run(["docker", "import", "-", tiny], input=buf.getvalue(), capture_output=True,
                                  env={**os.environ, **registry.env()})
        assert imported.returncode == 0, imported.stderr
        tiny_id = inspect(tiny, "{{.Id}}")
        push = registry.docker("push", tiny)
        assert push.returncode == 0, push.stderr
        assert registry.docker("rmi", tiny).returncode == 0
        assert inspect(tiny, "{{.Id}}") is None
        pull = registry.docker("pull", tiny)
        assert pull.returncode == 0, f"{pull.stdout}{pull.stderr}"
        assert "Pull complete" in pull.stdout, pull.stdout
        assert inspect(tiny, "{{.Id}}") == tiny_id
    finally:
        rmi(registry, tiny)


def test_wrong_or_missing_credentials_fail(registry, pushed, tmp_path):
    ref, _ = pushed
    wrong = registry.login_with("not-" + registry.password)
    assert wrong.returncode != 0
    assert f"login attempt to http://{registry.host}/v2/ failed with status: 401 Unauthorized" in wrong.stderr
    wrong_user = registry.login_with(registry.password, user="nobody", docker_config=str(tmp_path / "other"))
    assert wrong_user.returncode != 0 and "401 Unauthorized" in wrong_user.stderr

    empty = tmp_path / "empty-docker-config"
    empty.mkdir()
    pull = registry.docker("pull", ref, docker_config=str(empty))
    assert pull.returncode != 0
    assert "no basic auth credentials" in pull.stderr, pull.stderr
    assert not list(empty.iterdir()), "a failed pull must not write the config"

    # the failed login above did not clobber the fixture's stored credentials
    again = registry.docker("pull", ref)
    assert again.returncode == 0, f"{again.stdout}{again.stderr}"


def test_missing_tag_fails(registry, pushed):
    ref = registry.ref(REPO, "no-such-tag")
    pull = registry.docker("pull", ref)
    assert pull.returncode != 0
    assert f"manifest for {ref} not found: manifest unknown" in pull.stderr, pull.stderr
    other = registry.docker("pull", registry.ref("imagegen-test/no-such-repo", "1"))
    assert other.returncode != 0 and "manifest unknown" in other.stderr, other.stderr


def test_context_manager_stops_and_cleans_up(tmp_path):
    with LocalRegistry(user="ctx") as reg:
        assert reg.login_with(reg.password).returncode == 0
        config = os.path.join(reg.docker_config, "config.json")
        assert reg.host in open(config).read()
        reg.logout()
        assert reg.host not in open(config).read()
        proc, port, workdir = reg.proc, reg.port, reg.workdir
        assert proc.poll() is None
    assert proc.poll() is not None
    assert not workdir.exists()
    pull = subprocess.run(["docker", "pull", f"127.0.0.1:{port}/imagegen-test/gone:1"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "DOCKER_CONFIG": str(tmp_path)})
    assert pull.returncode != 0
    assert f"dial tcp 127.0.0.1:{port}: connect: connection refused" in pull.stderr, pull.stderr
