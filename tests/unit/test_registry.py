"""Unit tests for prebuilt builder images: references, labels, the lock file and how it pins
render's FROM, error wording, and the CLI's one-line refusals. The registry round trip against a
real registry server is in tests/integration/test_prebuilt.py."""

from __future__ import annotations

import json
import re

import dockerfile
import pytest

from imagegen import cli
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import Plan
from imagegen.plan.matrix import make_cell
from imagegen.errors import NoPlatformImage
from imagegen.plan.registry import (
    IMAGE_NAME,
    ImageMissing,
    Lock,
    RegistryError,
    explain,
    image_labels,
    image_name,
    image_ref,
    lock_builders,
    pinned,
    validate_registry,
)
from imagegen.render.dockerfile import render_dockerfile

CAT = load_catalogue()
DIGEST = "sha256:" + "ab" * 32


def cell(recipe="sageattention", flavor="runpod", torch="2.8", cuda="12.8", python="3.12", arch="8.0;9.0"):
    r = CAT.get(recipe)
    return make_cell(r, r.version(None), torch, cuda, python, parse_arch_list(arch), flavor)


def test_reference_is_deterministic_and_follows_the_scheme():
    ref = image_ref(cell(), "127.0.0.1:5000/ml")
    assert ref == "127.0.0.1:5000/ml/imagegen-sageattention:2.2.0-torch2.8-cu128-py312"
    # The default flavor has no suffix; others do. Archs are not in the tag: one image serves all.
    assert image_ref(cell(flavor="cuda"), "ghcr.io/me").endswith(":2.2.0-torch2.8-cu128-py312-cuda")
    assert image_ref(cell(arch="12.0"), "ghcr.io/me") == image_ref(cell(arch="8.0"), "ghcr.io/me")
    assert image_ref(cell("block-sparse-attn"), "r.example:443/a/b") == \
        "r.example:443/a/b/imagegen-block-sparse-attn:0.0.2.post1-torch2.8-cu128-py312"


@pytest.mark.parametrize("bad", ["", "ghcr.io", "Ghcr.io/Me", "x; rm -rf /", "host/ns:tag", "host//ns", "$(id)/x"])
def test_bad_registry_values_are_refused(bad):
    with pytest.raises(RegistryError):
        validate_registry(bad)


def test_labels_carry_source_revision_created_version_and_inputs():
    labels = image_labels(cell(), "0123456789abcdef", "2026-11-22T10:00:00Z", "0.1.0")
    assert labels["org.opencontainers.image.revision"] == "eb615cf6cf4d221338033340ee2de1c37fbdba4a"
    assert labels["org.opencontainers.image.source"] == "https://github.com/thu-ml/SageAttention"
    assert labels["org.opencontainers.image.created"] == "2026-11-22T10:00:00Z"
    assert labels["io.imagegen.inputs"] == "0123456789abcdef" and labels["io.imagegen.version"] == "0.1.0"


def test_lock_round_trip_and_pinned_from(tmp_path):
    c = cell()
    lock = Lock(tmp_path / "imagegen.lock")
    lock.base_images[c.base.ref] = pinned(c.base.ref, DIGEST)
    lock.save()
    again = Lock.load(tmp_path / "imagegen.lock")
    assert again.base_images == lock.base_images
    pinned_cell = again.pin_bases(Plan(cells=[c])).cells[0]
    text = render_dockerfile(pinned_cell).dockerfile
    args = [cmd for cmd in dockerfile.parse_string(text) if cmd.cmd.upper() == "ARG" and cmd.value[0].startswith("BASE_IMAGE=")]
    assert args[0].value[0] == f"BASE_IMAGE={c.base.ref}@{DIGEST}"


@pytest.mark.parametrize("content", ["{", '{"schema": 9}', '{"schema": 1, "base_images": {"a:1": "a:1"}}',
                                     '{"schema": 1, "base_images": {"a:1": "a@sha256:' + "0" * 64 + '; rm"}}'])
def test_broken_lock_files_are_one_line_errors(tmp_path, content):
    path = tmp_path / "imagegen.lock"
    path.write_text(content)
    with pytest.raises(RegistryError) as e:
        Lock.load(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize(("stderr", "kind", "words"), [
    ("Error response from daemon: manifest for 127.0.0.1:5/x:y not found: manifest unknown: manifest unknown",
     ImageMissing, "not in the registry"),
    ('Error response from daemon: Head "http://127.0.0.1:5/v2/x/manifests/y": no basic auth credentials',
     RegistryError, "docker login"),
    ("Error response from daemon: login attempt to http://127.0.0.1:5/v2/ failed with status: 401 Unauthorized",
     RegistryError, "docker login"),
    ('Error response from daemon: Get "http://127.0.0.1:5/v2/": dial tcp 127.0.0.1:5: connect: connection refused',
     RegistryError, "not reachable"),
    # a port or an address with 401 in it is not an HTTP 401
    ('Error response from daemon: Get "http://127.0.0.1:60401/v2/": dial tcp 127.0.0.1:60401: connect: connection'
     ' refused', RegistryError, "not reachable"),
    ('Get "http://10.0.401.7:5/v2/": dial tcp: lookup 10.0.401.7: no such host', RegistryError, "not reachable"),
    ("unexpected status from HEAD request: 401", RegistryError, "docker login"),
])
def test_docker_errors_become_one_actionable_line(stderr, kind, words):
    err = explain(stderr, "127.0.0.1:5/x:y", "127.0.0.1:5")
    assert type(err) is kind and words in str(err) and "\n" not in str(err)


def test_cli_refuses_bad_registry_cache_and_lock_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["push", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--registry", "x;y"]) == 7
    assert cli.main(["pull", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12"]) == 2  # no registry
    assert cli.main(["build", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12",
                     "--cache-to", "type=registry,ref=$(id)"]) == 2
    assert cli.main(["render", "sage", "--lock", str(tmp_path / "missing.lock")]) == 2
    (tmp_path / "imagegen.lock").write_text("not json")
    assert cli.main(["render", "sage"]) == 7
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("imagegen: error: ") for line in err), err
    assert re.search(r"registry 'x;y' is not HOST\[:PORT\]/NAMESPACE", err[0])


def test_render_uses_the_lock_file_found_in_the_current_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "sage", "--arch", "12.0+PTX"]) == 0
    plain = capsys.readouterr().out
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", plain, re.M).group(1)
    (tmp_path / "imagegen.lock").write_text(json.dumps({"schema": 1, "base_images": {base: f"{base}@{DIGEST}"}}))
    assert cli.main(["render", "sage", "--arch", "12.0+PTX"]) == 0
    assert f"ARG BASE_IMAGE={base}@{DIGEST}\n" in capsys.readouterr().out


def _fake_tools(folder, **rc):
    """Executables named after the keys, exiting with the given code (nvidia-smi -L, the toolkit)."""
    folder.mkdir(exist_ok=True)
    for name, code in rc.items():
        exe = folder / name.replace("_", "-")
        exe.write_text(f"#!/bin/sh\nexit {code}\n")
        exe.chmod(0o755)
    return str(folder)


@pytest.mark.parametrize("tools, asked, want, note", [
    ({}, "auto", [], False),  # no driver: nothing to give
    ({"nvidia_smi": 9}, "auto", [], False),  # nvidia-smi present but no working driver
    ({"nvidia_smi": 0}, "auto", [], True),  # GPUs, but Docker could not pass them on: say so, build for --arch
    ({"nvidia_smi": 0, "nvidia_container_runtime_hook": 0}, "auto", ["--gpus", "all"], False),
    ({"nvidia_smi": 0, "nvidia_ctk": 0}, "auto", ["--gpus", "all"], False),
    ({}, "all", ["--gpus", "all"], False),  # asked for: docker's own error says what is missing
    ({"nvidia_smi": 0, "nvidia_ctk": 0}, "none", [], False),
])
def test_gpu_flags_follow_the_driver_and_the_container_toolkit(tmp_path, monkeypatch, tools, asked, want, note):
    from imagegen.executors.prebuilt import gpu_flags

    monkeypatch.setenv("PATH", _fake_tools(tmp_path / "bin", **tools) + ":/usr/bin:/bin")
    said = []
    assert gpu_flags(asked, said.append) == want
    assert bool(said) == note and all("NVIDIA Container Toolkit" in s for s in said)


def test_an_arm64_builder_image_has_a_tag_of_its_own():
    from imagegen.plan.platforms import with_platforms

    amd, arm = with_platforms(Plan(cells=[cell(flavor="pypi", torch="2.11", cuda="13.0")]),
                              ("linux/amd64", "linux/arm64")).cells
    assert image_ref(amd, "ghcr.io/me") == "ghcr.io/me/imagegen-sageattention:2.2.0-torch2.11-cu130-py312-pypi"
    assert image_ref(arm, "ghcr.io/me") == "ghcr.io/me/imagegen-sageattention:2.2.0-torch2.11-cu130-py312-pypi-arm64"


@pytest.mark.parametrize("said", [
    "image with reference r:5000/x/base:1 was found but does not match the specified platform: wanted linux/arm64,"
    " actual: linux/amd64",
    "no matching manifest for linux/arm64/v8 in the manifest list entries",
])
def test_an_image_without_the_platform_is_one_line_naming_it(said):
    err = explain(said, "r:5000/x/base:1", "r:5000", "linux/arm64")
    assert type(err) is NoPlatformImage and err.exit_code == RegistryError.exit_code and str(err).startswith("r:5000/x/base:1 has no linux/arm64 image (")


# --------------------------------------------------------------------------------------------
# The builder image's name below a registry, and `imagegen lock`'s builder digests


def test_the_name_below_the_registry_is_what_the_reference_ends_with():
    for c in (cell(), cell(flavor="cuda"), cell("block-sparse-attn", python="3.11")):
        assert image_ref(c, "ghcr.io/myteam") == f"ghcr.io/myteam/{image_name(c)}"
    assert image_name(cell()) == "imagegen-sageattention:2.2.0-torch2.8-cu128-py312"
    assert IMAGE_NAME.fullmatch(image_name(cell())) and not IMAGE_NAME.fullmatch("imagegen-x:1\nevil: 1")


class FakeDocker:
    """`docker buildx imagetools inspect REF --format {{json .Manifest}}` as buildx 0.13 answers, per reference."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]):
        self.answers, self.calls = answers, []

    def __call__(self, *args, timeout=None):
        import subprocess

        self.calls.append(args)
        assert args[:3] == ("buildx", "imagetools", "inspect") and args[4:] == ("--format", "{{json .Manifest}}")
        code, out, err = self.answers[args[3]]
        return subprocess.CompletedProcess(["docker", *args], code, out, err)


MANIFEST = json.dumps({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": DIGEST, "size": 856})


def test_lock_pins_each_pushed_builder_image_and_says_which_are_not_pushed(monkeypatch, tmp_path):
    from imagegen.plan import registry as reg

    pushed, missing = cell(), cell(python="3.11")
    refs = [image_ref(c, "127.0.0.1:5000/ml") for c in (pushed, missing)]
    fake = FakeDocker({refs[0]: (0, MANIFEST, ""), refs[1]: (1, "", f"ERROR: {refs[1]}: not found\n")})
    monkeypatch.setattr(reg, "docker", fake)
    lock, said = Lock(tmp_path / "imagegen.lock"), []
    lock_builders(Plan(cells=[pushed, missing, pushed]), "127.0.0.1:5000/ml", lock, say=said.append)
    assert lock.builder_images == {refs[0]: f"{refs[0]}@{DIGEST}"}
    assert said == [f"{refs[0]} -> {DIGEST}", f"{refs[1]} is not in the registry yet: not pinned (imagegen push, or the"
                    " CI workflow's --push-builders, publishes it)"]
    assert len(fake.calls) == 2  # one question per image, nothing pulled


@pytest.mark.parametrize("code, out, err, kind, words", [
    (1, "", "ERROR: pull access denied, repository does not exist or may require authorization: authorization failed:"
     " no basic auth credentials\n", RegistryError, "refused the credentials for"),
    (1, "", "ERROR: failed to do request: Head \"https://r.example/v2/ml/x/manifests/1\": dial tcp: lookup r.example:"
     " no such host\n", RegistryError, "is not reachable"),
    (1, "", "ERROR: r.example/ml/x:1: not found\n", ImageMissing, "is not in the registry"),
    (0, "{}", "", RegistryError, "names no sha256 digest"),
    (0, "not json", "", RegistryError, "names no sha256 digest"),
])
def test_the_registry_digest_without_a_pull_and_its_failures_in_one_line(monkeypatch, code, out, err, kind, words):
    from imagegen.plan import registry as reg

    monkeypatch.setattr(reg, "docker", FakeDocker({"r.example/ml/x:1": (code, out, err)}))
    with pytest.raises(kind) as info:
        reg.remote_digest("r.example/ml/x:1")
    assert words in str(info.value) and "\n" not in str(info.value)
    if kind is not ImageMissing:
        assert not isinstance(info.value, ImageMissing)
