"""Tests for imagegen.publish.index_wheels: a wheel as the index reads it, its METADATA read within bounds
(the central directory, ZIP64's too, the member, the bytes decompressed), by name, never through a symlink
or from a FIFO. (What the index makes of a wheel it cannot read: tests/unit/test_index.py.)"""

from __future__ import annotations

import os
import struct
import zipfile
from pathlib import Path

import pytest

from imagegen.errors import Unreadable
from imagegen.publish import index_wheels
from tests.unit.executor_fixtures import WHEEL
from tests.unit.test_index import TINY, metadata_wheel


def test_wheel_names_and_url_paths():
    assert index_wheels.is_wheel_name(WHEEL.name) and not index_wheels.is_wheel_name("demo-1.0.tar.gz")
    assert index_wheels.url_path(Path("/o"), Path("/o/a b/x+1.whl")) == "a%20b/x%2B1.whl"


def test_core_metadata_is_the_wheels_own_and_the_wheels_size(tmp_path):
    with zipfile.ZipFile(WHEEL) as zf:
        expected = zf.read("tiny_kernel-0.1.0+cu130torch2.11.dist-info/METADATA")
    assert index_wheels.core_metadata(WHEEL, TINY) == (expected, WHEEL.stat().st_size)


def test_a_zip_directory_over_the_bound_is_not_read(tmp_path, monkeypatch):
    members = {f"demo/{n}.py": "" for n in range(100)}
    wheel = metadata_wheel(tmp_path / "demo-1.0-py3-none-any.whl", "Name: demo\n", members=members)
    with zipfile.ZipFile(wheel) as zf:
        directory = sum(46 + len(info.filename) + len(info.extra) + len(info.comment) for info in zf.infolist())
    monkeypatch.setattr(index_wheels, "MAX_CENTRAL_DIRECTORY_BYTES", directory - 1)
    with pytest.raises(Unreadable, match=f"a zip directory of {directory} bytes"):
        index_wheels.core_metadata(wheel, "demo")
    monkeypatch.setattr(index_wheels, "MAX_CENTRAL_DIRECTORY_BYTES", directory)
    assert index_wheels.core_metadata(wheel, "demo")[0] == b"Name: demo\n"


def as_zip64(wheel: Path) -> tuple[Path, int]:
    """``wheel`` rewritten with ZIP64 end records (what a zip of 65535 members or 4 GiB has): the end record's
    fields say 'see ZIP64', the ZIP64 record holds the sizes. Returns it and its central directory's size."""
    data = wheel.read_bytes()
    _, _, _, _, count, size, offset, _ = struct.unpack("<4s4H2LH", data[-22:])
    body = data[:-22]
    zip64_end = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(body), 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    wheel.write_bytes(body + zip64_end + locator + end)
    return wheel, size


def test_a_zip64_directory_is_measured_from_its_zip64_record(tmp_path, monkeypatch):
    wheel, size = as_zip64(metadata_wheel(tmp_path / "demo-1.0-py3-none-any.whl", "Name: demo\n",
                                          members={f"demo/{n}.py": "" for n in range(50)}))
    assert len(zipfile.ZipFile(wheel).infolist()) == 51  # zipfile reads it through the ZIP64 record too
    assert index_wheels.core_metadata(wheel, "demo")[0] == b"Name: demo\n"
    monkeypatch.setattr(index_wheels, "MAX_CENTRAL_DIRECTORY_BYTES", size - 1)
    with pytest.raises(Unreadable, match=f"a zip directory of {size} bytes"):
        index_wheels.core_metadata(wheel, "demo")


def test_metadata_that_decompresses_past_the_bound_is_not_read(tmp_path, monkeypatch):
    wheel = metadata_wheel(tmp_path / "demo-1.0-py3-none-any.whl", "Name: demo\n" + "x" * 5000)
    monkeypatch.setattr(index_wheels, "MAX_METADATA_BYTES", 100)
    with pytest.raises(Unreadable, match="METADATA of 5011 bytes; at most 100 are read"):
        index_wheels.core_metadata(wheel, "demo")


def test_a_wheel_is_read_without_following_a_symlink_or_blocking_on_a_fifo(tmp_path):
    link = tmp_path / "demo-1.0-py3-none-any.whl"
    link.symlink_to(metadata_wheel(tmp_path / "real" / "demo-1.0-py3-none-any.whl", "Name: demo\n"))
    with pytest.raises(Unreadable, match="symbolic links"):
        index_wheels.core_metadata(link, "demo")
    fifo = tmp_path / "fifo-1.0-py3-none-any.whl"
    os.mkfifo(fifo)
    with pytest.raises(Unreadable, match="not a regular file"):
        index_wheels.core_metadata(fifo, "fifo")


def test_a_reused_wheel_is_said_so_with_versions_only():
    # imagegen reuse's manifest entry; anything but a version (a page's markup, a script) is shown as "?"
    entry = {"reused_from": {"torch": "2.11", "checked_against": "2.14.1", "symbols": "ok"}}
    assert index_wheels.reused_text(entry) == "built for torch 2.11, checked against torch 2.14.1"
    hostile = {"reused_from": {"torch": "<script>", "checked_against": "2.14.1\" onclick=\"x"}}
    assert index_wheels.reused_text(hostile) == "built for torch ?, checked against torch ?"
    assert index_wheels.reused_text({"reused_from": "2.11"}) is None and index_wheels.reused_text({}) is None
