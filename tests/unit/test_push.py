"""Tests for imagegen.publish.push: every buildable cell's builder stage baked with push=true under its
deterministic reference, the digests from bake's metadata (or the engine's RepoDigests) pinned in the lock
file, and the failures (credentials, a broken build) as one typed error with no lock written. The docker
on PATH is a stand-in that records its calls and answers as buildx and the engine would."""

from __future__ import annotations

import hashlib
import json
import stat
import sys
from pathlib import Path

import pytest

from imagegen import engine
from imagegen.errors import BuildError, RegistryError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import Plan
from imagegen.plan.matrix import choose_cell, make_cell
from imagegen.publish import push
from imagegen.plan.registry import LOCK_SCHEMA, Lock, image_ref

REGISTRY = "127.0.0.1:5000/ml"
CATALOGUE = load_catalogue()

# The stand-in docker. Its behaviour comes from STANDIN_MODE; every call is appended to STANDIN_CALLS as
# JSON (argv, and for a bake the bake file it was given).
STANDIN = """\
import hashlib, json, os, sys

args = sys.argv[1:]
mode = os.environ["STANDIN_MODE"]
record = {"argv": args}
if args[:2] == ["buildx", "bake"]:
    record["bake"] = json.load(open(args[args.index("--file") + 1]))
with open(os.environ["STANDIN_CALLS"], "a") as fh:
    fh.write(json.dumps(record) + "\\n")
if args[:2] == ["buildx", "bake"]:
    print("#1 [internal] load build definition", flush=True)
    if mode == "unauthorized":
        print("ERROR: failed to push: unexpected status from HEAD request: 401 Unauthorized", file=sys.stderr)
        sys.exit(1)
    if mode == "broken":
        print('ERROR: target "x" failed: process "/bin/sh -c make" did not complete successfully', file=sys.stderr)
        sys.exit(1)
    meta = {}
    if mode == "metadata":
        for name in record["bake"]["target"]:
            meta[name] = {"containerimage.digest": "sha256:" + hashlib.sha256(name.encode()).hexdigest()}
    with open(args[args.index("--metadata-file") + 1], "w") as fh:
        json.dump(meta, fh)
    sys.exit(0)
if args[:2] == ["image", "inspect"]:
    if mode == "inspect":
        ref = args[-1]
        repo = ref.rsplit(":", 1)[0]
        digest = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
        print(json.dumps(["other/repo@sha256:" + "0" * 64, repo + "@" + digest]))
        sys.exit(0)
    print("Error: No such image: " + args[-1], file=sys.stderr)
    sys.exit(1)
print("unexpected call", args, file=sys.stderr)
sys.exit(2)
"""


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class StandIn:
    def __init__(self, calls: Path, monkeypatch) -> None:
        self._calls, self._monkeypatch = calls, monkeypatch

    def mode(self, mode: str) -> None:
        self._monkeypatch.setenv("STANDIN_MODE", mode)

    def calls(self) -> list[dict]:
        return [json.loads(line) for line in self._calls.read_text().splitlines()]


@pytest.fixture
def docker(tmp_path, monkeypatch):
    """The stand-in docker first on PATH (no real one after it), answering with bake metadata."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "docker"
    exe.write_text(f"#!{sys.executable}\n" + STANDIN)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.jsonl"
    calls.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("STANDIN_CALLS", str(calls))
    stand_in = StandIn(calls, monkeypatch)
    stand_in.mode("metadata")
    engine.contexts.cache_clear()
    yield stand_in
    engine.contexts.cache_clear()


def _cell(torch: str = "2.8", arch: str = "9.0"):
    recipe = CATALOGUE.get("sage")
    return choose_cell(recipe, recipe.version(None), parse_arch_list(arch), torch=torch, cuda=None, python="3.12",
                       flavor="runpod")


def test_push_pins_the_digests_from_bakes_metadata_in_the_lock_file(tmp_path, docker):
    cells = [_cell("2.8"), _cell("2.9")]
    lock = Lock(tmp_path / "imagegen.lock", base_images={"runpod/pytorch:x": "runpod/pytorch:x@" + _sha("base")})
    said = []
    results = push.push(Plan(cells=cells), REGISTRY, work=tmp_path / "work", lock=lock, say=said.append)
    refs = [image_ref(c, REGISTRY) for c in cells]
    assert [(r.cell, r.ref, r.digest, r.pushed) for r in results] == [
        (c, ref, _sha(c.name), True) for c, ref in zip(cells, refs)]
    saved = json.loads(lock.path.read_text())
    assert saved == {"schema": LOCK_SCHEMA, "base_images": {"runpod/pytorch:x": "runpod/pytorch:x@" + _sha("base")},
                     "builder_images": {ref: f"{ref}@{_sha(c.name)}" for c, ref in zip(cells, refs)}}
    assert Lock.load(lock.path) == lock  # what was saved reads back
    assert said[-2:] == [f"[{c.name}] pushed {ref} ({_sha(c.name)})" for c, ref in zip(cells, refs)]
    # one bake, of the builder stage only, tagged with the deterministic reference, pushed
    [bake] = docker.calls()
    assert bake["argv"][-2:] == [c.name for c in cells]
    for cell, ref in zip(cells, refs):
        target = bake["bake"]["target"][cell.name]
        assert target["target"] == "builder" and target["tags"] == [ref]
        assert target["output"] == ["type=image,push=true"]
        assert target["labels"]["io.imagegen.inputs"] and target["labels"]["org.opencontainers.image.version"]
    # the run's files stay under --work
    assert len(list((tmp_path / "work" / "runs").iterdir())) == 1


def test_without_metadata_the_digest_comes_from_the_engines_repo_digests(tmp_path, docker):
    docker.mode("inspect")
    cell = _cell()
    ref = image_ref(cell, REGISTRY)
    lock = Lock(tmp_path / "imagegen.lock")
    [result] = push.push(Plan(cells=[cell]), REGISTRY, work=tmp_path, lock=lock, say=lambda m: None)
    assert result.digest == _sha(ref)  # the entry for this repository, not the other one listed
    assert lock.builder_images == {ref: f"{ref}@{_sha(ref)}"}
    assert [c["argv"][:2] for c in docker.calls()] == [["buildx", "bake"], ["image", "inspect"]]


def test_a_push_with_no_digest_anywhere_is_reported_but_not_pinned(tmp_path, docker):
    docker.mode("none")
    cell = _cell()
    lock = Lock(tmp_path / "imagegen.lock", builder_images={"old/ref:1": "old/ref:1@" + _sha("old")})
    said = []
    [result] = push.push(Plan(cells=[cell]), REGISTRY, work=tmp_path, lock=lock, say=said.append)
    assert result.digest is None and result.pushed
    assert said[-1] == f"[{cell.name}] pushed {image_ref(cell, REGISTRY)}"
    assert json.loads(lock.path.read_text())["builder_images"] == {"old/ref:1": "old/ref:1@" + _sha("old")}


def test_only_buildable_cells_are_pushed(tmp_path, docker):
    recipe = CATALOGUE.get("sage")
    rejected = make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("5.0"), "runpod")
    assert not rejected.buildable
    good = _cell()
    results = push.push(Plan(cells=[rejected, good]), REGISTRY, work=tmp_path, lock=Lock(tmp_path / "l"),
                        say=lambda m: None)
    assert [r.cell for r in results] == [good]
    [bake] = docker.calls()
    assert list(bake["bake"]["target"]) == [good.name]


def test_a_registry_refusing_the_credentials_is_a_registry_error_and_no_lock(tmp_path, docker):
    docker.mode("unauthorized")
    lock = Lock(tmp_path / "imagegen.lock")
    with pytest.raises(RegistryError) as info:
        push.push(Plan(cells=[_cell()]), REGISTRY, work=tmp_path, lock=lock, say=lambda m: None)
    assert info.value.exit_code == 7 and "refused the credentials" in str(info.value)
    assert "docker login 127.0.0.1:5000" in str(info.value) and "\n" not in str(info.value)
    assert not lock.path.exists()


def test_a_failed_build_is_a_build_error_naming_the_log(tmp_path, docker):
    docker.mode("broken")
    lock = Lock(tmp_path / "imagegen.lock")
    with pytest.raises(BuildError) as info:
        push.push(Plan(cells=[_cell()]), REGISTRY, work=tmp_path, lock=lock, say=lambda m: None)
    message = str(info.value)
    assert info.value.exit_code == 5 and 'target "x" failed' in message
    log = Path(message.rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.is_file() and log.is_relative_to(tmp_path) and 'target "x" failed' in log.read_text()
    assert not lock.path.exists()


def test_an_invalid_registry_is_refused_before_any_bake(tmp_path, docker):
    with pytest.raises(RegistryError, match="is not HOST"):
        push.push(Plan(cells=[_cell()]), "Not A Registry", work=tmp_path, lock=Lock(tmp_path / "l"),
                  say=lambda m: None)
    assert docker.calls() == []
