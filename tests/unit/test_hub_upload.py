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


NO_TOKEN_FILE = "/nonexistent/imagegen-tests/hf-token"  # never the token file of whoever runs the tests


def env(hub: FakeHub, token: str | None = TOKEN) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.base, "HF_TOKEN_PATH": NO_TOKEN_FILE, **({"HF_TOKEN": token} if token else {})}


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
                               " `hf repo create octo/missing`, or publish --create)"),
    (f"hf:{REPO}@dev", TOKEN, f"{REPO} has no branch dev (create it, or name another after @)"),
    (f"hf:{REPO}", "hf_wrong", f"the Hub refused HF_TOKEN (HTTP 401): it needs write access to {REPO}"),
    (f"hf:{REPO}", None, "no Hugging Face token: set HF_TOKEN, or run `huggingface-cli login` (it stores one in"
                         f" {NO_TOKEN_FILE}); one with write access to {REPO}"),
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
    with pytest.raises(PublishError, match=r"^huggingface_hub is not installed: pip install 'imagegen-wheels\[publish\]'"):
        hub_upload.connect(parse_destination(f"hf:{REPO}"), {"HF_TOKEN": TOKEN}, write=True)


# --------------------------------------------------------------------------------------------
# The token `huggingface-cli login` stored (seed 004's own step), when HF_TOKEN is not set


@pytest.mark.parametrize("where", ["HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME"])
def test_the_token_huggingface_cli_login_stored_is_used(tmp_path, hub, where, capsys):
    wheelhouse(tmp_path / "out")
    path = {"HF_TOKEN_PATH": tmp_path / "custom" / "tok", "HF_HOME": tmp_path / "hfhome" / "token",
            "XDG_CACHE_HOME": tmp_path / "cache" / "huggingface" / "token"}[where]
    path.parent.mkdir(parents=True)
    path.write_text(TOKEN + "\n")  # as huggingface_hub writes it
    value = str(path if where == "HF_TOKEN_PATH" else path.parent if where == "HF_HOME" else tmp_path / "cache")
    e = {k: v for k, v in env(hub, None).items() if k != "HF_TOKEN_PATH"} | {where: value}
    assert hub_upload.token_file(e) == path
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=e).outcomes
    assert outcome.status == "uploaded"
    assert {r.headers.get("authorization") for r in hub.requests if r.method != "PUT"} == {f"Bearer {TOKEN}"}
    assert TOKEN not in capsys.readouterr().out


def test_hf_token_wins_over_the_login_file(tmp_path, hub):
    wheelhouse(tmp_path / "out")
    (tmp_path / "token").write_text("hf_fromTheLoginFile000")
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env={**env(hub), "HF_TOKEN_PATH": str(tmp_path / "token")}).outcomes
    assert outcome.status == "uploaded" and hub.requests[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_a_refused_login_token_is_named_by_its_file_and_never_shown(tmp_path, hub):
    wheelhouse(tmp_path / "out")
    (tmp_path / "token").write_text("hf_wrongLoginToken123\n")
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env={**env(hub, None), "HF_TOKEN_PATH": str(tmp_path / "token")}).outcomes
    assert outcome.status == "failed" and hub.commits == []
    assert outcome.detail == (f"the Hub refused the token in {tmp_path / 'token'} (HTTP 401): it needs write access"
                              f" to {REPO}")
    repo = hub_upload.connect(parse_destination(f"hf:{REPO}"), {**env(hub, None), "HF_TOKEN_PATH": str(tmp_path / "token")},
                              write=True)
    assert repo.secrets == ("hf_wrongLoginToken123",)  # redacted from every message like HF_TOKEN's value


@pytest.mark.parametrize("kind", ["fifo", "folder", "too big", "not a token", "dangling link"])
def test_a_token_file_that_is_not_one_fails_in_one_line_without_its_content(tmp_path, hub, kind):
    import os

    wheelhouse(tmp_path / "out")
    path = tmp_path / "token"
    secret = "hf_" + "s3cret" * 3
    if kind == "fifo":
        os.mkfifo(path)  # must not block
    elif kind == "folder":
        path.mkdir()
    elif kind == "too big":
        path.write_text(secret + "x" * hub_upload.MAX_TOKEN_FILE)
    elif kind == "not a token":
        path.write_text(f"{secret}\nsecond line {secret}\n")
    else:
        path.symlink_to(tmp_path / "nowhere")
    e = {**env(hub, None), "HF_TOKEN_PATH": str(path)}
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=e).outcomes
    assert outcome.status == "failed" and outcome.detail.startswith(f"{path} (huggingface-cli login's token file)")
    assert secret not in outcome.detail and "\n" not in outcome.detail and hub.requests == []
    (dry,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=e, dry_run=True).outcomes
    assert dry.status == "would-upload"  # a dry run reads anonymously


# --------------------------------------------------------------------------------------------
# publish --create: a repository that does not exist yet (an RTX 5090 user's first upload)


def test_create_makes_the_missing_repository_then_uploads(tmp_path, hub):
    wheel = wheelhouse(tmp_path / "out")
    report = publish(tmp_path / "out", ["hf:octo/new-wheels:cu130"], env=env(hub), create=True)
    (outcome,) = report.outcomes
    assert outcome.status == "uploaded", outcome.detail
    assert hub.created == [{"repo": "octo/new-wheels", "type": "model"}]  # no visibility chosen: the Hub's default
    assert hub.file("octo/new-wheels", f"cu130/{wheel.name}") == wheel.read_bytes()
    create = hub.seen("POST", "/api/repos/create")[0]
    assert create.headers["authorization"] == f"Bearer {TOKEN}"
    assert [(r.method, r.path) for r in hub.requests][:2] == [("POST", "/api/repos/create"),
                                                               ("POST", "/api/models/octo/new-wheels/paths-info/main")]


def test_create_leaves_an_existing_repository_as_it_is(tmp_path, hub):
    wheel = wheelhouse(tmp_path / "out")
    hub.add_repo(REPO, {"README.md": b"mine"})
    (outcome,) = publish(tmp_path / "out", [f"hf:{REPO}"], env=env(hub), create=True).outcomes
    assert outcome.status == "uploaded" and hub.created == []
    assert hub.file(REPO, "README.md") == b"mine" and hub.file(REPO, wheel.name) == wheel.read_bytes()
    assert len(hub.seen("POST", "/api/repos/create")) == 1  # answered 409: there already


def test_without_create_a_missing_repository_is_not_made(tmp_path, hub):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", ["hf:octo/new-wheels"], env=env(hub)).outcomes
    assert outcome.status == "failed" and "publish --create" in outcome.detail
    assert hub.created == [] and not hub.seen("POST", "/api/repos/create")


def test_a_dry_run_creates_nothing(tmp_path, hub):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", ["hf:octo/new-wheels"], env=env(hub), dry_run=True, create=True).outcomes
    assert outcome.status == "failed" and hub.created == [] and not hub.seen("POST", "/api/repos/create")


def test_create_refused_under_another_owner_is_one_line(tmp_path, hub):
    wheelhouse(tmp_path / "out")
    hub.not_yours.add("someone")
    (outcome,) = publish(tmp_path / "out", ["hf:someone/wheels"], env=env(hub), create=True).outcomes
    # create_repo with exist_ok asks whether it exists after a 403: it does not, so the 403 stands.
    assert (outcome.status, outcome.detail) == ("failed", "the Hub refused HF_TOKEN (HTTP 403): it needs write access"
                                                          " to someone/wheels")
    assert hub.created == [] and TOKEN not in outcome.detail


def test_create_needs_a_hub_destination(tmp_path):
    from imagegen.errors import UsageError

    wheelhouse(tmp_path / "out")
    with pytest.raises(UsageError, match=r"^--create makes a Hugging Face Hub repository"):
        publish(tmp_path / "out", ["pypi:http://127.0.0.1:1/legacy/"], create=True)
