"""imagegen.untrusted: the bounded readers themselves (JSON depth, http(s)-only GETs within a size, zip
members and unpacking within their limits). What each command does with them, against hostile servers,
files and wheels, is tests/unit/test_hostile_reads.py (issue 32, items 5-8)."""

from __future__ import annotations

import pytest

from imagegen import untrusted
from imagegen.errors import Unreadable
from tests.unit.test_hostile_reads import Server, _deflated, _zip, zeros_member


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def test_http_get_refuses_other_schemes_and_large_answers(server):
    server.routes["/big"] = b"x" * 5000
    deadline = untrusted.Deadline(10)
    assert untrusted.http_get(server.base + "/big", deadline=deadline, limit=5000)[0] == b"x" * 5000
    with pytest.raises(Unreadable, match="larger than"):
        untrusted.http_get(server.base + "/big", deadline=deadline, limit=4999)
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/", "data:,x", "/relative"):
        with pytest.raises(Unreadable, match="only those"):
            untrusted.http_get(url, deadline=deadline, limit=10)
    with pytest.raises(untrusted.HTTPStatusError) as got:
        untrusted.http_get(server.base + "/missing", deadline=deadline, limit=10)
    assert got.value.code == 404


def test_extract_zip_bounds_each_member_the_total_and_a_lying_header(tmp_path):
    blob = _zip([("a/x.bin", *_deflated(b"1" * 3000)), ("a/y.bin", *_deflated(b"2" * 3000))])
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(blob)
    untrusted.extract_zip(wheel, tmp_path / "ok")
    assert (tmp_path / "ok" / "a" / "y.bin").read_bytes() == b"2" * 3000
    with pytest.raises(Unreadable, match="over the 2.93e\\+03 bytes|member 'a/x.bin'"):
        untrusted.extract_zip(wheel, tmp_path / "m", member_limit=2999)
    with pytest.raises(Unreadable, match="a wheel may have"):
        untrusted.extract_zip(wheel, tmp_path / "t", total_limit=5999)
    # a header that says 10 bytes over a member that inflates to 8 MiB: nothing past the 10 bytes
    data, method, crc, _ = zeros_member(8)
    wheel.write_bytes(_zip([("a/z.bin", data, method, crc, 10)]))
    with pytest.raises(Unreadable, match="inflates past|cannot be inflated"):
        untrusted.extract_zip(wheel, tmp_path / "l")
    assert (tmp_path / "l" / "a" / "z.bin").stat().st_size <= 10
    # names that would leave the folder
    for name in ("../evil", "/abs", "a/../../evil", "C:/x"):
        wheel.write_bytes(_zip([(name, *_deflated(b"x"))]))
        with pytest.raises(Unreadable, match="outside"):
            untrusted.extract_zip(wheel, tmp_path / "n")
    assert not (tmp_path / "evil").exists()


def test_json_depth_counts_brackets_outside_strings_only():
    untrusted.json_depth('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', 3)
    untrusted.json_depth(b'{"a\\"[[[[": [[1]]}', 3)
    with pytest.raises(Unreadable, match="deeper than 3"):
        untrusted.json_depth(b'{"a": [[[1]]]}', 3)
    assert untrusted.loads_json(b'{"a": [[1]]}', max_depth=3) == {"a": [[1]]}
