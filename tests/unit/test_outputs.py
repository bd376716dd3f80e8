"""Tests for imagegen.outputs: shown() for messages, the mode a new file gets, resolve_target()'s checks
before anything is written, write_text_atomic() (content, parents, modes, no temporary left) and
write_output() to a file or stdout."""

from __future__ import annotations

import os
import stat

import pytest

from imagegen import outputs
from imagegen.errors import UsageError


def _temporaries(folder) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_shown_escapes_control_characters_and_bounds_the_length():
    assert outputs.shown("plain/path.txt") == "plain/path.txt"
    assert outputs.shown("a\x1b[2Jb\nc") == "a\\x1b[2Jb\\nc"
    assert outputs.shown(os.path.join("dir", "é.txt")) == "dir/é.txt"  # printable non-ASCII stays
    long = outputs.shown("p" * 250 + "q" * 250)
    assert len(long) == 120 and long == "p" * 39 + "..." + "q" * 78  # the middle goes, the end stays
    assert outputs.shown("abcdef", limit=5) == "...ef"
    assert outputs.shown(12) == "12"


def test_new_file_mode_follows_the_umask_and_leaves_it_alone():
    old = os.umask(0o077)
    try:
        assert outputs.new_file_mode() == 0o600
        assert os.umask(0o027) == 0o077  # still the caller's umask
        assert outputs.new_file_mode() == 0o640
    finally:
        os.umask(old)


def test_resolve_target_names_the_regular_file_written(tmp_path):
    assert outputs.resolve_target(tmp_path / "new.Dockerfile") == tmp_path / "new.Dockerfile"
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to("real")  # relative link: resolved against its own folder
    assert outputs.resolve_target(tmp_path / "link") == (tmp_path / "real").resolve()
    (tmp_path / "hop").symlink_to(tmp_path / "link")
    assert outputs.resolve_target(str(tmp_path / "hop")) == (tmp_path / "real").resolve()


@pytest.mark.parametrize("name, needle", [
    ("   ", r"give a file name \(got an empty one\)"),
    ("out\x1b[31m.txt", "a file name with control characters is refused"),
    ("line\nbreak", "a file name with control characters is refused"),
])
def test_resolve_target_refuses_unusable_names(tmp_path, monkeypatch, name, needle):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=needle) as info:
        outputs.resolve_target(name, what="lock file")
    assert str(info.value).startswith("lock file") and "\x1b" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_resolve_target_reports_os_failures_in_a_few_words(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="Not a directory"):
        outputs.resolve_target(tmp_path / "file" / "below")
    with pytest.raises(UsageError, match="the name is too long") as info:
        outputs.resolve_target(tmp_path / ("n" * 5000))
    assert len(str(info.value)) < 200  # the 5000-character name is shown cut


def test_write_text_atomic_writes_utf8_creates_parents_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a" / "b" / "Dockerfile"
    text = "FROM scratch\n# é → 日本\n"
    assert outputs.write_text_atomic(target, text) == target
    assert target.read_bytes() == text.encode("utf-8")
    outputs.write_text_atomic(target, "second\n")
    assert target.read_text() == "second\n" and _temporaries(tmp_path) == []


def test_a_replaced_file_keeps_its_mode(tmp_path):
    target = tmp_path / "build.sh"
    target.write_text("old")
    target.chmod(0o751)
    outputs.write_text_atomic(target, "new")
    assert stat.S_IMODE(target.stat().st_mode) == 0o751 and target.read_text() == "new"


def test_a_new_file_gets_the_umask_mode_not_mkstemps_0600(tmp_path):
    old = os.umask(0o002)
    try:
        outputs.write_text_atomic(tmp_path / "shared.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared.txt").stat().st_mode) == 0o664


def test_the_file_is_replaced_not_rewritten_in_place(tmp_path):
    # A reader holding the old file keeps the old content: the new one is a new inode renamed over it.
    target = tmp_path / "docker-bake.json"
    target.write_text("old")
    with open(target) as reader:
        before = os.fstat(reader.fileno()).st_ino
        outputs.write_text_atomic(target, "new")
        assert reader.read() == "old"
    assert target.stat().st_ino != before and target.read_text() == "new"


def test_a_hard_link_elsewhere_keeps_the_old_content(tmp_path):
    target = tmp_path / "lock"
    target.write_text("old")
    os.link(target, tmp_path / "backup")
    outputs.write_text_atomic(target, "new")
    assert (tmp_path / "backup").read_text() == "old" and target.read_text() == "new"


def test_a_parent_that_cannot_be_made_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder should be")
    with pytest.raises(UsageError) as info:
        outputs.write_text_atomic(tmp_path / "blocker" / "sub" / "out.txt", "x", what="bake file")
    assert str(info.value).startswith("bake file ") and "\n" not in str(info.value)
    assert (tmp_path / "blocker").read_text() == "a file where a folder should be"
    assert _temporaries(tmp_path) == []


def test_write_output_goes_to_stdout_for_none_or_dash(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outputs.write_output("to stdout\n", None)
    outputs.write_output("dash too\n", "-")
    assert capsys.readouterr().out == "to stdout\ndash too\n"
    assert list(tmp_path.iterdir()) == []  # no file named '-'
    outputs.write_output("to a file\n", "out.hcl")
    assert (tmp_path / "out.hcl").read_text() == "to a file\n" and capsys.readouterr().out == ""
    with pytest.raises(UsageError, match="^Dockerfile .* is a directory"):
        outputs.write_output("x", str(tmp_path), what="Dockerfile")


def test_replace_file_renames_over_the_name_itself_with_the_mode_given(tmp_path):
    # The manifest writer (wheelhouse.collect) and write_text_atomic share it: a symlink at the name is
    # replaced, not followed, and nothing half-written or temporary is left when the write fails.
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("theirs")
    link = tmp_path / "wh" / "manifest.json"
    link.parent.mkdir()
    link.symlink_to(elsewhere)
    outputs.replace_file(link, b'{"cells": {}}\n', mode=0o640, suffix=".partial")
    assert not link.is_symlink() and link.read_text() == '{"cells": {}}\n' and elsewhere.read_text() == "theirs"
    assert stat.S_IMODE(link.stat().st_mode) == 0o640
    (tmp_path / "wh" / "folder").mkdir()
    with pytest.raises(OSError):
        outputs.replace_file(tmp_path / "wh" / "folder", b"x", mode=0o644, suffix=".partial")
    assert sorted(p.name for p in (tmp_path / "wh").iterdir()) == ["folder", "manifest.json"]
