"""Tests for imagegen.publish.pypi_upload against a recording PyPI-compatible index on 127.0.0.1
(tests/publish_servers.FakeIndex: the legacy upload API and PEP 503 pages): what twine sends, the
skip / refuse / race rules read from the index page, credentials from the environment or a netrc and
nowhere else, and every failure as one line. The same against the real pypiserver, with pip installing
what was uploaded, is tests/integration/test_publish.py."""

from __future__ import annotations

import hashlib
import sys

import pytest

from imagegen.errors import PublishError
from imagegen.publish import pypi_upload
from imagegen.publish.upload import parse_destination, publish
from tests.publish_servers import FakeIndex, Reply, multipart_fields, rebuilt, sha256, wheelhouse
from tests.unit.executor_fixtures import WHEEL, pure_wheel, tiny_cell

USER, PASSWORD = "uploader", "pw-9f8e7d6c"
ENV = {"TWINE_USERNAME": USER, "TWINE_PASSWORD": PASSWORD}


@pytest.fixture
def index():
    with FakeIndex(USER, PASSWORD) as server:
        yield server


@pytest.fixture(autouse=True)
def no_netrc(tmp_path, monkeypatch):
    """The user's own ~/.netrc is never read here: NETRC points at an empty file unless a test writes one."""
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def dest(index: FakeIndex) -> str:
    return f"pypi:{index.base}/legacy/"


def test_the_upload_is_twines_multipart_post_with_basic_auth_then_a_second_run_skips(tmp_path, index, capsys):
    wheel = wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert (outcome.status, outcome.detail) == ("uploaded", f"{index.base}/simple/tiny-kernel/")
    (post,) = index.seen("POST", "/legacy/")
    assert post.headers["authorization"] == index.auth
    fields = multipart_fields(post)
    assert fields[":action"][1] == b"file_upload" and fields["filetype"][1] == b"bdist_wheel"
    assert fields["name"][1] == b"tiny-kernel" and fields["version"][1] == b"0.1.0+cu130torch2.11"
    assert fields["sha256_digest"][1].decode() == sha256(wheel.read_bytes())
    assert fields["content"] == (wheel.name, wheel.read_bytes())
    assert capsys.readouterr().out == ""  # twine's console lines stay off imagegen's stdout

    (again,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert again.status == "skipped" and len(index.seen("POST", "/legacy/")) == 1
    (page,) = index.seen("GET", "/simple/tiny-kernel/")[-1:]
    assert page.headers["authorization"] == index.auth  # the page is on the upload host: same credentials


def test_a_different_file_under_the_name_is_refused_without_an_upload(tmp_path, index):
    wheel = wheelhouse(tmp_path / "out")
    index.files["tiny-kernel"] = {wheel.name: b"another build"}
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert outcome.status == "refused" and f"sha256:{sha256(b'another build')}" in outcome.detail
    assert index.seen("POST", "/legacy/") == [] and index.files["tiny-kernel"][wheel.name] == b"another build"


@pytest.mark.parametrize("answer", [Reply(409, b"Conflict"), Reply(400, b"File already exists. See /help")])
@pytest.mark.parametrize("same", [True, False])
def test_an_index_that_refuses_a_name_it_got_meanwhile_is_checked_again(tmp_path, index, answer, same):
    wheel = wheelhouse(tmp_path / "out")
    theirs = wheel.read_bytes() if same else b"theirs"
    index.race = (theirs, answer)
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert outcome.status == ("skipped" if same else "refused")
    assert index.files["tiny-kernel"][wheel.name] == theirs


def test_wrong_credentials_fail_every_wheel_of_the_index_after_one_try(tmp_path, index):
    out = tmp_path / "out"
    wheelhouse(out)
    wheelhouse(out, pure_wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""}),
               tiny_cell(python="3.12"))
    outcomes = publish(out, [dest(index)], env={**ENV, "TWINE_PASSWORD": "wrong-password"}).outcomes
    assert [o.status for o in outcomes] == ["failed", "failed"] and len(index.seen("POST", "/legacy/")) == 1
    assert outcomes[0].detail == outcomes[1].detail == (
        f"{index.base}/legacy/ refused the credentials (HTTP 403 Forbidden): check TWINE_USERNAME and TWINE_PASSWORD"
        " (or the netrc entry)")


def test_a_server_error_fails_the_wheel(tmp_path, index):
    wheelhouse(tmp_path / "out")
    index.upload_answer = Reply(500, b"boom")
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert (outcome.status, outcome.detail) == ("failed", f"{index.base}/legacy/ refused it (HTTP 500 Internal Server"
                                                          " Error)")


def test_a_redirected_upload_is_not_followed(tmp_path, index):
    wheelhouse(tmp_path / "out")
    index.upload_answer = Reply(301, b"", {"Location": "https://elsewhere.example/legacy/"})
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert outcome.status == "failed" and "redirected the upload to https://elsewhere.example/legacy/" in outcome.detail


def test_without_credentials_nothing_is_uploaded_but_a_dry_run_reads_anonymously(tmp_path, index):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [dest(index)], env={}).outcomes
    assert outcome.status == "failed" and outcome.detail.startswith("no credentials for 127.0.0.1: set TWINE_USERNAME")
    assert index.requests == []
    (dry,) = publish(tmp_path / "out", [dest(index)], env={}, dry_run=True).outcomes
    assert dry.status == "would-upload" and index.seen("POST", "/") == []
    assert "authorization" not in index.requests[-1].headers


def test_a_password_alone_is_a_pypi_token(tmp_path, index):
    assert pypi_upload.credentials("https://upload.pypi.org/legacy/", {"TWINE_PASSWORD": "pypi-abc"}) == (
        "__token__", "pypi-abc", ())


def test_credentials_from_a_netrc_entry_and_its_password_is_a_secret(tmp_path, index, no_netrc):
    no_netrc.write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n")
    no_netrc.chmod(0o600)
    wheelhouse(tmp_path / "out")
    assert pypi_upload.credentials(f"{index.base}/legacy/", {}) == (USER, PASSWORD, (PASSWORD,))
    (outcome,) = publish(tmp_path / "out", [dest(index)], env={}).outcomes
    assert outcome.status == "uploaded" and index.seen("POST", "/legacy/")[0].headers["authorization"] == index.auth


def test_a_private_index_page_gets_the_credentials_only_on_the_upload_host(tmp_path, index):
    wheelhouse(tmp_path / "out")
    index.private = True
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert outcome.status == "uploaded"
    with FakeIndex(USER, PASSWORD) as elsewhere:
        elsewhere.private = True
        target = f"{dest(index)},simple={elsewhere.base}/simple/"
        (outcome,) = publish(tmp_path / "out", [target], env=ENV).outcomes
        assert "authorization" not in elsewhere.requests[0].headers
        assert outcome.status == "failed" and "refused to list tiny-kernel (HTTP 401)" in outcome.detail


def test_the_pages_hash_algorithm_is_used_and_a_page_without_one_is_no_guess(tmp_path, index):
    wheel = wheelhouse(tmp_path / "out")
    index.files["tiny-kernel"] = {wheel.name: wheel.read_bytes()}
    index.hash_fragment = "md5"
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert outcome.status == "skipped"
    index.files["tiny-kernel"] = {wheel.name: rebuilt(WHEEL, tmp_path / "other").read_bytes()}
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    md5 = hashlib.md5(index.files["tiny-kernel"][wheel.name]).hexdigest()
    assert outcome.status == "refused" and f"md5:{md5}" in outcome.detail
    index.hash_fragment = ""
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert outcome.status == "failed" and "without a hash: cannot tell whether it is this wheel" in outcome.detail
    assert index.seen("POST", "/legacy/") == []


def test_a_page_redirected_to_another_index_means_not_here_and_one_on_the_same_host_is_followed(tmp_path, index):
    wheel = wheelhouse(tmp_path / "out")
    index.redirects["/simple/tiny-kernel/"] = "https://pypi.org/simple/tiny-kernel/"  # pypiserver's fallback
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV, dry_run=True).outcomes
    assert outcome.status == "would-upload"
    index.redirects["/simple/tiny-kernel/"] = "/simple/tiny-kernel-moved/"
    index.files["tiny-kernel-moved"] = {wheel.name: b"another build"}
    (outcome,) = publish(tmp_path / "out", [dest(index)], env=ENV).outcomes
    assert outcome.status == "refused" and index.seen("GET", "/simple/tiny-kernel-moved/")
    assert index.seen("POST", "/legacy/") == []


def test_an_unreachable_index_fails_the_destination(tmp_path):
    wheelhouse(tmp_path / "out")
    with FakeIndex(USER, PASSWORD) as gone:
        url = gone.base
    (outcome,) = publish(tmp_path / "out", [f"pypi:{url}/legacy/"], env=ENV).outcomes
    assert outcome.status == "failed" and outcome.detail.startswith(f"{url}/simple/tiny-kernel/ cannot be read")


def test_index_files_reads_pep_503_links():
    page = ('<a href="../../packages/x-1.0%2Bcu128-py3-none-any.whl#SHA256=AB12">x</a>'
            '<a href="https://files.example/p/y-2.0.tar.gz#md5=ff">y</a><a href="z-1.whl">z</a><a name="n">n</a>')
    assert pypi_upload.index_files(page) == {"x-1.0+cu128-py3-none-any.whl": ("sha256", "AB12"),
                                             "y-2.0.tar.gz": ("md5", "ff"), "z-1.whl": None}


def test_a_missing_twine_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "twine.settings", None)
    with pytest.raises(PublishError, match=r"^twine is not installed: pip install 'imagegen-wheels\[publish\]'$"):
        pypi_upload.connect(parse_destination("pypi:https://upload.pypi.org/legacy/"), ENV, write=True)
