"""Tests for imagegen.publish.hub_upload against a recording Hugging Face Hub API on 127.0.0.1
(tests/publish_servers.FakeHub; no Hub server can run here): what huggingface_hub sends for one wheel
(paths-info, the branch head, preupload, the LFS batch, the PUT of the bytes, verify, the commit with
its parent), the Authorization header carrying HF_TOKEN, skip and refuse by the LFS sha256 or the git
blob id, a commit that loses a race checked again, and the errors as one line."""

from __future__ import annotations

import json
import sys

import pytest

from imagegen.errors import PublishError
from imagegen.publish import hub_upload
from imagegen.publish.upload import parse_destination, publish
from tests.publish_servers import FakeHub, sha256, wheelhouse

TOKEN = "hf_unitTOKEN0123456789"
REPO = "octo/sage-wheels"


@pytest.fixture(autouse=True)
def no_telemetry(monkeypatch):
    """huggingface_hub fetches an "agent harness" list from its import-time endpoint (huggingface.co) for its
    user agent unless telemetry is off: off here, so that these tests reach no server but their own."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)


@pytest.fixture
def hub():
    with FakeHub(TOKEN) as server:
        server.add_repo(REPO)
        yield server


def env(hub: FakeHub, token: str | None = TOKEN) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.base, **({"HF_TOKEN": token} if token else {})}


def test_one_commit_per_wheel_through_the_lfs_api_then_a_second_run_skips(tmp_path, hub, caplog):
    caplog.set_level("WARNING")
    wheel = wheelhouse(tmp_path / "out")
    data, path = wheel.read_bytes(), f"cu130/{wheel.name}"
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}:cu130"], env=env(hub)).outcomes
    assert (outcome.status, outcome.detail) == ("uploaded", f"{hub.base}/{REPO}/blob/main/{path}")
    assert hub.file(REPO, path) == data

    calls = [(r.method, r.path) for r in hub.requests]
    head = hub.commits[0]["header"]["parentCommit"]
    oid = sha256(data)
    assert calls == [("POST", f"/api/models/{REPO}/paths-info/main"), ("GET", f"/api/models/{REPO}/revision/main"),
                     ("POST", f"/api/models/{REPO}/paths-info/{head}"), ("POST", f"/api/models/{REPO}/preupload/main"),
                     ("POST", f"/{REPO}.git/info/lfs/objects/batch"), ("PUT", f"/lfs-upload/{oid}"),
                     ("POST", f"/{REPO}.git/info/lfs/objects/verify"), ("POST", f"/api/models/{REPO}/commit/main")]
    for request in hub.requests:  # the token goes to the Hub, not to the storage URL it hands out
        assert request.headers.get("authorization") == (None if request.method == "PUT" else f"Bearer {TOKEN}")
    assert hub.seen("PUT", "/lfs-upload/")[0].body == data
    batch = json.loads(hub.seen("POST", f"/{REPO}.git/info/lfs/objects/batch")[0].body)
    assert batch["objects"] == [{"oid": oid, "size": len(data)}] and batch["ref"] == {"name": "main"}
    assert json.loads(hub.seen("POST", f"/api/models/{REPO}/preupload/")[0].body)["files"][0]["path"] == path
    (commit,) = hub.commits
    assert commit["header"]["summary"] == f"Upload {wheel.name}" and f"sha256 {oid}" in commit["header"]["description"]
    assert commit["operations"] == [{"key": "lfsFile", "value": {"path": path, "algo": "sha256", "oid": oid,
                                                                  "size": len(data)}}]
    assert not any("xet" in r.path for r in hub.requests)  # the file object keeps hf_xet out of it
    assert not [r for r in caplog.records if "Xet" in r.getMessage()]  # nor its notice about that

    before = len(hub.requests)
    (again,) = publish(tmp_path / "out", [f"hf:{REPO}:cu130"], env=env(hub)).outcomes
    assert again.status == "skipped" and [r.path for r in hub.requests[before:]] == [
        f"/api/models/{REPO}/paths-info/main"]


def test_a_different_lfs_file_under_the_name_is_refused_and_kept(tmp_path, hub):
    wheel = wheelhouse(tmp_path / "out")
    hub.add_repo(REPO, {wheel.name: b"another build"})
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=env(hub)).outcomes
    assert outcome.status == "refused" and f"sha256:{sha256(b'another build')}" in outcome.detail
    assert hub.commits == [] and hub.file(REPO, wheel.name) == b"another build"


@pytest.mark.parametrize("same", [True, False])
def test_a_file_kept_in_git_is_compared_by_its_blob_id(tmp_path, hub, same):
    wheel = wheelhouse(tmp_path / "out")
    hub.add_repo(REPO, in_git={wheel.name: wheel.read_bytes() if same else b"small"})
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=env(hub)).outcomes
    assert outcome.status == ("skipped" if same else "refused") and hub.commits == []
    assert same or "git-sha1:" in outcome.detail


def test_a_commit_that_lands_first_makes_ours_retry_on_the_new_head(tmp_path, hub):
    wheel = wheelhouse(tmp_path / "out")
    hub.race = ("README.md", b"someone else's commit")
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=env(hub)).outcomes
    assert outcome.status == "uploaded" and hub.file(REPO, wheel.name) == wheel.read_bytes()
    assert hub.file(REPO, "README.md") == b"someone else's commit"
    assert len(hub.seen("POST", f"/api/models/{REPO}/commit/")) == 2  # refused (stale parent), then made


@pytest.mark.parametrize("same", [True, False])
def test_the_same_name_landing_first_is_never_overwritten(tmp_path, hub, same):
    wheel = wheelhouse(tmp_path / "out")
    theirs = wheel.read_bytes() if same else b"their build"
    hub.race = (wheel.name, theirs)
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=env(hub)).outcomes
    assert outcome.status == ("skipped" if same else "refused")
    assert hub.file(REPO, wheel.name) == theirs and hub.commits == []


@pytest.mark.parametrize("target, token, detail", [
    ("hf:octo/missing", TOKEN, "no model repository octo/missing, or HF_TOKEN may not read it (create it with"
                               " `hf repo create octo/missing`)"),
    (f"hf:{REPO}@dev", TOKEN, f"{REPO} has no branch dev (create it, or name another after @)"),
    (f"hf:{REPO}", "hf_wrong", f"the Hub refused HF_TOKEN (HTTP 401): it needs write access to {REPO}"),
    (f"hf:{REPO}", None, f"HF_TOKEN is not set: a Hugging Face token with write access to {REPO}"),
])
def test_errors_are_one_line_and_show_no_token(tmp_path, hub, target, token, detail):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [target], env=env(hub, token)).outcomes
    assert (outcome.status, outcome.detail) == ("failed", detail) and hub.commits == []
    assert TOKEN not in outcome.detail and "hf_wrong" not in outcome.detail


def test_a_dry_run_reads_anonymously_without_a_token(tmp_path, hub):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=env(hub, None), dry_run=True).outcomes
    assert outcome.status == "would-upload"
    assert [(r.method, "authorization" in r.headers) for r in hub.requests] == [("POST", False)]


def test_a_missing_huggingface_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(PublishError, match=r"^huggingface_hub is not installed: pip install 'imagegen\[publish\]'"):
        hub_upload.connect(parse_destination(f"hf:{REPO}"), {"HF_TOKEN": TOKEN}, write=True)
