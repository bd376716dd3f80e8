"""imagegen.publish.index_files: how the index writes (whole files in one rename, unchanged ones left
alone, never through a symlink). The index as a whole under concurrent writers and killed runs is
tests/unit/test_index.py's."""

from __future__ import annotations

import os

import pytest

from imagegen.errors import PublishError
from imagegen.publish import index_files as disk


def test_a_file_is_replaced_whole_and_an_unchanged_one_is_left_alone(tmp_path):
    page, written = tmp_path / "index.html", []
    disk.write(page, b"one", written)
    first = os.stat(page).st_ino
    disk.write(page, b"one", written)
    assert written == [page] and os.stat(page).st_ino == first  # same content: not rewritten
    disk.write(page, b"two", written)
    assert page.read_bytes() == b"two" and written == [page, page] and os.stat(page).st_ino != first
    assert [p.name for p in tmp_path.iterdir()] == ["index.html"]  # no temporary file left
    assert oct(page.stat().st_mode & 0o777) != oct(0o600)  # served: not mkstemp's private mode


def test_a_failed_fill_leaves_the_old_file_and_no_temporary_one(tmp_path):
    page, written = tmp_path / "index.html", []
    disk.write(page, b"old", written)

    def broken(fh):
        fh.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        disk.replace_file(page, broken, written)
    assert page.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["index.html"]


def test_a_folder_is_made_real_a_symlink_is_refused_or_replaced(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "simple").symlink_to(outside)
    with pytest.raises(PublishError, match="is not a directory"):
        disk.real_folder(tmp_path / "simple", refuse=True)
    (tmp_path / "project").symlink_to(outside)
    disk.real_folder(tmp_path / "project", refuse=False)
    assert (tmp_path / "project").is_dir() and not (tmp_path / "project").is_symlink()
    assert disk.is_partial(".index.html.abc123.partial", "index.html") and not disk.is_partial("index.html", "index.html")
