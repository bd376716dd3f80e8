"""Tests for imagegen.commands.images: `imagegen push`, `pull` and `lock` up to the registry.

The registry value, the plan (arch-free for builder images, one target per cell for pull), every user
value checked before the registry is asked, and `lock` writing base images already pinned by digest."""

from __future__ import annotations

import json

import pytest

from imagegen import engine
from imagegen.plan import registry
from imagegen.commands import images
from imagegen.errors import LockFileError, NothingToDoError, RegistryError, UsageError
from imagegen.executors import prebuilt
from imagegen.publish import push
from tests.unit.command_helpers import CELL, call, never

REG = ["--registry", "127.0.0.1:5000/ml"]
DIGEST = "sha256:" + "ab" * 32
PINNED_BASE = ["--flavor", "cuda", "--base-image", f"nvidia/cuda:12.8.1-devel-ubuntu24.04@{DIGEST}"]


@pytest.fixture(autouse=True)
def _no_registry(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "probe", never("the registry probe"))
    monkeypatch.setattr(registry, "pull", never("docker pull"))
    monkeypatch.setattr(push, "push", never("the builder image bake"))
    monkeypatch.setattr(prebuilt, "pull", never("the prebuilt image run"))
    monkeypatch.setattr(engine, "docker", never("docker"))


# ------------------------------------------------------------------------------------------- push


def test_push_needs_a_registry_from_the_flag_or_the_config(tmp_path):
    with pytest.raises(UsageError, match="^no registry: pass --registry"):
        call(images.cmd_push, "push", "sage", *CELL)
    with pytest.raises(RegistryError, match="registry 'Not/A/Registry' is not HOST"):
        call(images.cmd_push, "push", "sage", *CELL, "--registry", "Not/A/Registry")
    (tmp_path / "imagegen.toml").write_text('registry = "127.0.0.1:5000/ml"\n')
    with pytest.raises(UsageError, match="--builder 'x y'"):  # the config's registry was taken: on to the builder
        call(images.cmd_push, "push", "sage", *CELL, "--builder", "x y")


@pytest.mark.parametrize("argv, error, says", [
    (["--builder", "two words"], UsageError, "--builder 'two words': not a buildx builder name"),
    (["--cache-from", "nonsense"], UsageError, "cache spec 'nonsense'"),
    (["--cache-to", "type=registry,ref=a b"], UsageError, "cache spec 'type=registry,ref=a b'"),
    (["--ca-bundle", "missing.pem"], UsageError, "--ca-bundle missing.pem: no such file"),
    (["--lock", "a\x1bb.lock"], UsageError, "lock file a\\\\x1bb.lock: a file name with control characters"),
])
def test_push_checks_every_value_before_asking_the_registry(argv, error, says):
    with pytest.raises(error, match="^" + says.replace("(", "\\(").replace(".", "\\.")):
        call(images.cmd_push, "push", "sage", *CELL, *REG, *argv)


def test_push_refuses_a_lock_that_is_a_folder(tmp_path):
    (tmp_path / "pins").mkdir()
    with pytest.raises(LockFileError, match="not a regular file"):
        call(images.cmd_push, "push", "sage", *CELL, *REG, "--lock", "pins")


def test_push_plans_one_builder_image_per_cell_whatever_the_arch_lists(capsys):
    # A builder image has no arch: two lists are one image (bake and build would refuse them).
    with pytest.raises(UsageError, match="--builder 'b a d'"):
        call(images.cmd_push, "push", "sage", *CELL[:6], "--arch", "8.0", "--arch", "9.0", *REG, "--builder", "b a d")
    with pytest.raises(NothingToDoError, match="no cell of this matrix can build"):
        call(images.cmd_push, "push", "sage", *CELL[:6], "--arch", "7.0", *REG)
    assert "rejected: sageattention 2.2.0 does not support sm_70" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- pull


@pytest.mark.parametrize("argv, says", [
    ([], "no registry: pass --registry"),
    ([*REG, "--max-jobs", "0"], "--max-jobs must be between 1 and 1024"),
    ([*REG, "--nvcc-threads", "2000"], "--nvcc-threads must be between 1 and 1024"),
    ([*REG, "--ca-bundle", "missing.pem"], "--ca-bundle missing.pem: no such file"),
    ([*REG, "--lock", "missing.lock"], "--lock missing.lock: no such file \\(imagegen lock writes it\\)"),
])
def test_pull_checks_its_values_before_running_an_image(argv, says):
    with pytest.raises(UsageError, match="^" + says):
        call(images.cmd_pull, "pull", "sage", *CELL, *argv)


def test_pull_makes_one_target_per_cell_and_needs_a_buildable_one():
    with pytest.raises(UsageError, match="asked for two arch lists"):
        call(images.cmd_pull, "pull", "sage", *CELL[:6], "--arch", "8.0", "--arch", "9.0", *REG)
    with pytest.raises(NothingToDoError):
        call(images.cmd_pull, "pull", "sage", *CELL[:6], "--arch", "7.0", *REG, "--max-jobs", "0")


# ------------------------------------------------------------------------------------------- lock


def test_lock_writes_a_base_image_already_pinned_by_digest_without_the_registry(tmp_path, capsys):
    assert call(images.cmd_lock, "lock", "sage", *CELL, *PINNED_BASE) == 0
    assert capsys.readouterr().out == "wrote imagegen.lock: 1 base image(s), 0 builder image(s)\n"
    data = json.loads((tmp_path / "imagegen.lock").read_text())
    assert data == {"schema": 1, "builder_images": {}, "base_images": {
        "nvidia/cuda:12.8.1-devel-ubuntu24.04": f"nvidia/cuda:12.8.1-devel-ubuntu24.04@{DIGEST}"}}


def test_lock_keeps_what_the_lock_file_had_and_writes_where_it_is_told(tmp_path, capsys):
    builder = "127.0.0.1:5000/ml/imagegen-sage:2.2.0-torch2.8-cu128-py312"
    target = tmp_path / "pins.lock"
    target.write_text(json.dumps({"schema": 1, "builder_images": {builder: f"{builder}@{DIGEST}"}}))
    assert call(images.cmd_lock, "lock", "sage", *CELL, *PINNED_BASE, "--lock", target) == 0
    assert capsys.readouterr().out == f"wrote {target}: 1 base image(s), 1 builder image(s)\n"
    data = json.loads(target.read_text())
    assert data["builder_images"] == {builder: f"{builder}@{DIGEST}"} and len(data["base_images"]) == 1
    assert not (tmp_path / "imagegen.lock").exists()


def test_lock_writes_nothing_for_a_matrix_that_cannot_build_or_an_unwritable_target(tmp_path, capsys):
    with pytest.raises(NothingToDoError, match="no cell of this matrix can build"):
        call(images.cmd_lock, "lock", "sage", *CELL[:6], "--arch", "7.0", *PINNED_BASE)
    (tmp_path / "folder.lock").mkdir()
    with pytest.raises(LockFileError, match="not a regular file"):
        call(images.cmd_lock, "lock", "sage", *CELL, *PINNED_BASE, "--lock", "folder.lock")
    with pytest.raises(UsageError, match="control characters"):
        call(images.cmd_lock, "lock", "sage", *CELL, *PINNED_BASE, "--lock", "bad\x07.lock")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.lock"]
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------------------------------------- both


@pytest.mark.parametrize("command", ["push", "pull"])
def test_push_and_pull_read_the_lock_file_once_and_name_a_bad_one_before_a_bad_arch(command, tmp_path, monkeypatch):
    cmd = {"push": images.cmd_push, "pull": images.cmd_pull}[command]
    loads = []
    real_load = registry.Lock.load.__func__
    monkeypatch.setattr(registry.Lock, "load", classmethod(lambda cls, path: loads.append(path) or real_load(cls, path)))
    given = []

    def reached(plan, registry, *, lock, **kwargs):
        given.append(lock)
        raise UsageError("reached the run")
    monkeypatch.setattr(push if command == "push" else prebuilt, command, reached)
    monkeypatch.setattr(registry, "probe", lambda registry: None)
    (tmp_path / "pins.lock").write_text(json.dumps({"schema": 1, "builder_images": {}, "base_images": {}}))
    with pytest.raises(UsageError, match="^reached the run$"):
        call(cmd, command, "sage", *CELL, *REG, "--lock", "pins.lock")
    assert [str(p) for p in loads] == ["pins.lock"]  # one read pins the plan and serves the command
    assert [str(lock.path) for lock in given] == ["pins.lock"]
    # the lock file is named before the matrix is planned, as it was when it was read twice
    (tmp_path / "broken.lock").write_text("{not json")
    with pytest.raises(LockFileError):
        call(cmd, command, "sage", *CELL[:6], "--arch", "bogus-arch", *REG, "--lock", "broken.lock")
