"""Tests for imagegen.publish.github_upload against a recording GitHub REST API on 127.0.0.1
(tests/publish_servers.FakeGitHub, in GitHub Enterprise Server's /api/v3 layout; no GitHub server can
run here): the release found by tag or created, the asset's name and bytes, the Authorization header
carrying GITHUB_TOKEN, skip and refuse by the asset's digest (or by its bytes where GitHub recorded
none), a duplicate name refused by GitHub checked again, and the errors as one line."""

from __future__ import annotations

import json
import sys

import pytest

from imagegen.errors import PublishError
from imagegen.publish import github_upload
from imagegen.publish.upload import parse_destination, publish
from tests.publish_servers import FakeGitHub, rebuilt, sha256, wheelhouse
from tests.unit.executor_fixtures import WHEEL

TOKEN = "ghp_unitTOKEN0123456789"
REPO, TAG = "octo/wheels", "v0.1.0+cu130"
DEST = f"github:{REPO}@{TAG}"


@pytest.fixture
def github():
    with FakeGitHub(TOKEN, repos=(REPO,)) as server:
        yield server


def env(github: FakeGitHub, token: str | None = TOKEN) -> dict[str, str]:
    return {"GITHUB_API_URL": github.api, **({"GITHUB_TOKEN": token} if token else {})}


def test_the_release_is_created_and_the_asset_uploaded_then_a_second_run_skips(tmp_path, github):
    wheel = wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [DEST], env=env(github)).outcomes
    assert outcome.status == "uploaded"
    assert outcome.detail == f"{github.base}/{REPO}/releases/download/{TAG}/{wheel.name}"
    assert github.asset_bytes(REPO, TAG, wheel.name) == wheel.read_bytes()
    calls = [(r.method, r.path) for r in github.requests]
    assert calls == [("GET", f"/api/v3/repos/{REPO}/releases/tags/{TAG}"), ("POST", f"/api/v3/repos/{REPO}/releases"),
                     ("POST", f"/api/uploads/repos/{REPO}/releases/1/assets")]
    assert all(r.headers["authorization"] == f"token {TOKEN}" for r in github.requests)
    created = json.loads(github.requests[1].body)
    assert created["tag_name"] == TAG and created["name"] == TAG and created["draft"] is False
    upload = github.requests[2]
    assert upload.query["name"] == [wheel.name] and upload.body == wheel.read_bytes()
    assert upload.headers["content-type"] == "application/zip"

    (again,) = publish(tmp_path / "out", [DEST], env=env(github)).outcomes
    assert again.status == "skipped" and len(github.seen("POST", "/")) == 2


def test_an_existing_release_gets_the_asset(tmp_path, github):
    wheel = wheelhouse(tmp_path / "out")
    github.add_release(REPO, TAG, {"README.txt": b"notes"})
    (outcome,) = publish(tmp_path / "out", [DEST], env=env(github)).outcomes
    assert outcome.status == "uploaded" and github.seen("POST", f"/api/v3/repos/{REPO}/releases") == []
    assert github.asset_bytes(REPO, TAG, wheel.name) == wheel.read_bytes()


def test_a_different_asset_under_the_name_is_refused_and_kept(tmp_path, github):
    wheel = wheelhouse(tmp_path / "out")
    github.add_release(REPO, TAG, {wheel.name: b"another build"})
    (outcome,) = publish(tmp_path / "out", [DEST], env=env(github)).outcomes
    assert outcome.status == "refused" and f"sha256:{sha256(b'another build')}" in outcome.detail
    assert github.asset_bytes(REPO, TAG, wheel.name) == b"another build" and github.seen("POST", "/") == []


@pytest.mark.parametrize("there, status", [("same", "skipped"), ("same size", "refused"), ("other size", "refused")])
def test_without_a_recorded_digest_the_asset_is_compared_by_its_bytes(tmp_path, github, there, status):
    wheel = wheelhouse(tmp_path / "out")
    data = {"same": wheel.read_bytes(), "same size": bytes(len(wheel.read_bytes())), "other size": b"x"}[there]
    github.digests = False  # an asset uploaded before GitHub recorded digests
    github.add_release(REPO, TAG, {wheel.name: data})
    (outcome,) = publish(tmp_path / "out", [DEST], env=env(github)).outcomes
    assert outcome.status == status and github.asset_bytes(REPO, TAG, wheel.name) == data
    downloads = [r for r in github.seen("GET", f"/api/v3/repos/{REPO}/releases/assets/")
                 if r.headers.get("accept") == "application/octet-stream"]
    assert len(downloads) == (0 if there == "other size" else 1)
    assert there != "other size" or outcome.detail.startswith("a different file of that name is there (1 bytes")


@pytest.mark.parametrize("same", [True, False])
def test_a_name_github_refuses_as_taken_is_checked_again(tmp_path, github, monkeypatch, same):
    wheel = wheelhouse(tmp_path / "out")
    github.add_release(REPO, TAG)
    theirs = wheel.read_bytes() if same else rebuilt(WHEEL, tmp_path / "theirs").read_bytes()
    real_find = github_upload.GithubRelease.find

    def find_then_race(self, w):  # the asset appears right after our find, before our upload
        found = real_find(self, w)
        github.releases[(REPO, TAG)]["assets"].setdefault(w.path.name, {"id": 99, "name": w.path.name, "data": theirs})
        return found

    monkeypatch.setattr(github_upload.GithubRelease, "find", find_then_race)
    (outcome,) = publish(tmp_path / "out", [DEST], env=env(github)).outcomes
    assert outcome.status == ("skipped" if same else "refused")
    assert github.asset_bytes(REPO, TAG, wheel.name) == theirs
    assert len(github.seen("POST", "/api/uploads/")) == 1  # tried once, refused by GitHub with 422


@pytest.mark.parametrize("target, token, detail", [
    (DEST, "ghp_wrong", "GitHub refused GITHUB_TOKEN (HTTP 401 Bad credentials)"),
    (DEST, None, f"GITHUB_TOKEN is not set: a token that may write the releases of {REPO} (contents: write)"),
    ("github:octo/missing@v1", TOKEN, "GitHub answered HTTP 404 (Not Found): no repository octo/missing, or"
                                      " GITHUB_TOKEN may not write its releases (contents: write)"),
])
def test_errors_are_one_line_and_show_no_token(tmp_path, github, target, token, detail):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [target], env=env(github, token)).outcomes
    assert (outcome.status, outcome.detail) == ("failed", detail)
    assert TOKEN not in outcome.detail and "ghp_wrong" not in outcome.detail


def test_a_dry_run_creates_no_release(tmp_path, github):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [DEST], env=env(github), dry_run=True).outcomes
    assert outcome.status == "would-upload" and github.seen("POST", "/") == [] and github.releases == {}


def test_a_missing_pygithub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "github", None)
    with pytest.raises(PublishError, match=r"^PyGithub is not installed: pip install 'imagegen-wheels\[publish\]'$"):
        github_upload.connect(parse_destination(DEST), {"GITHUB_TOKEN": TOKEN}, write=True)
