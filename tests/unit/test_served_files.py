"""Tests for imagegen.publish.served_files: what a wheelhouse is served with beside its wheels, in upload
order (what a page links to first, the project lists after their pages, the find-links page last), the
served manifest in place of the folder's own when `imagegen index --merge` wrote one, only regular files the
index wrote, and a wheelhouse without an index refused."""

from __future__ import annotations

import pytest

from imagegen.errors import PublishError
from imagegen.publish.index import SERVED_MANIFEST, write_index
from imagegen.publish.served_files import served_files
from imagegen.wheelhouse.manifest import verified_wheels
from tests.publish_servers import wheelhouse


def test_the_files_in_upload_order(tmp_path):
    out = tmp_path / "out"
    wheel = wheelhouse(out)
    write_index(out, say=lambda m: None)
    (out / "simple" / "tiny-kernel" / ".index.html.x.partial").write_text("half")  # a killed run's: not served
    (out / "simple" / "notes.txt").symlink_to("/etc/passwd")
    files = served_files(out, verified_wheels(out))
    folder = wheel.parent.relative_to(out).as_posix()
    assert [f.key for f in files] == [
        f"{folder}/{wheel.name}.metadata", f"{folder}/manifest.json",
        "simple/tiny-kernel/index.json", "simple/tiny-kernel/index.html", "simple/index.json", "simple/index.html",
        "cu130/simple/tiny-kernel/index.json", "cu130/simple/tiny-kernel/index.html", "cu130/simple/index.json",
        "cu130/simple/index.html", "index.html"]
    assert files[1].path == wheel.parent / "manifest.json"
    assert {f.content_type for f in files[2:]} == {"application/json", "text/html; charset=utf-8"}
    (wheel.parent / SERVED_MANIFEST).write_text("{}")
    assert served_files(out, verified_wheels(out))[1].path == wheel.parent / SERVED_MANIFEST


def test_a_wheelhouse_without_an_index_is_refused(tmp_path):
    out = tmp_path / "out"
    wheelhouse(out)
    with pytest.raises(PublishError, match=r"has no index: run imagegen index .* \(with --merge URL"):
        served_files(out, verified_wheels(out))
