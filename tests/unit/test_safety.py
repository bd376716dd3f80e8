"""Tests for imagegen.safety: the value patterns (nothing that could end a Dockerfile line or open a shell
expansion ever matches), check(), describe(), heredoc_delimiter() and read_regular_file()'s refusals."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagegen import safety
from imagegen.errors import Unreadable, UnsafeValueError, UsageError

PATTERNS = {name: value for name, value in vars(safety).items() if isinstance(value, re.Pattern)}
# What turns a value into an extra Dockerfile instruction or a shell command.
DANGEROUS = ["\n", "\r", '"', "'", "$", "`", "\\", "\x00"]


def test_the_module_defines_the_patterns_this_file_checks():
    assert {"IMAGE_REF", "URL", "ENV_VALUE", "RELATIVE_PATH", "GIT_URL", "SDIST_URL", "IMAGE_PATH"} <= set(PATTERNS)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(PATTERNS)), st.text(max_size=40), st.sampled_from(DANGEROUS), st.text(max_size=40))
def test_no_pattern_matches_a_value_with_a_newline_quote_dollar_or_backtick(name, head, bad, tail):
    value = head + bad + tail
    assert PATTERNS[name].fullmatch(value) is None, (name, value)
    with pytest.raises(UnsafeValueError):
        safety.validate(value, PATTERNS[name], "value")


_PART = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(_PART, min_size=1, max_size=3), st.one_of(st.none(), st.integers(1, 65535)),
       st.one_of(st.none(), st.text("abcXYZ019_.-", min_size=1, max_size=20).filter(lambda t: t[0] not in ".-")),
       st.one_of(st.none(), st.text("0123456789abcdef", min_size=64, max_size=64)))
def test_validate_returns_a_matching_image_reference_unchanged(path, port, tag, digest):
    value = (f"registry.example:{port}/" if port else "") + "/".join(path) + (f":{tag}" if tag else "") \
        + (f"@sha256:{digest}" if digest else "")
    assert safety.validate(value, safety.IMAGE_REF, "image") is value


@pytest.mark.parametrize("value, ok", [
    ("nvidia/cuda:12.8.1-devel-ubuntu24.04", True),
    ("127.0.0.1:5000/ml/imagegen-sage:2.2.0-torch2.8-cu128-py312", True),
    ("runpod/pytorch@sha256:" + "a" * 64, True),
    ("ghcr.io/me/x:tag@sha256:" + "0" * 64, True),
    ("Upper/case", False),  # repositories are lower case
    ("x@sha256:" + "a" * 63, False),  # a digest is 64 hex digits
    ("x:tag with space", False),
    ("x:" + "t" * 129, False),  # a tag is at most 128 characters
    ("", False),
])
def test_image_references(value, ok):
    assert bool(safety.IMAGE_REF.fullmatch(value)) is ok


@pytest.mark.parametrize("pattern, value, ok", [
    (safety.RELATIVE_PATH, "csrc/kernels/x.cu", True),
    (safety.RELATIVE_PATH, "../outside", False),
    (safety.RELATIVE_PATH, "a/../../b", False),
    (safety.RELATIVE_PATH, "/etc/passwd", False),
    (safety.RELATIVE_PATH_OR_EMPTY, "", True),
    (safety.RELATIVE_PATH, "", False),
    (safety.SDIST_URL, "https://files.example.org/p/pkg-1.0.tar.gz", True),
    (safety.SDIST_URL, "https://files.example.org/p/pkg-1.0.zip", True),
    (safety.SDIST_URL, "http://files.example.org/p/pkg-1.0.tar.gz", False),  # https only
    (safety.SDIST_URL, "https://files.example.org/p/pkg-1.0.whl", False),
    (safety.GIT_URL, "https://github.com/thu-ml/SageAttention.git", True),
    (safety.GIT_URL, "git@github.com:me/repo.git", True),
    (safety.GIT_URL, "file:///etc", False),
    (safety.GIT_URL, "ext::sh -c touch% pwned", False),
    (safety.GIT_SHA, "abc1234", True),
    (safety.GIT_SHA, "abc123", False),
    (safety.GIT_SHA, "ABC1234", False),
    (safety.PIP_REQUIREMENT, "ninja>=1.11,<2", True),
    (safety.PIP_REQUIREMENT, "pkg[extra1,extra2]==1.0", True),
    (safety.PIP_REQUIREMENT, "pkg @ https://x/y.whl", False),  # a direct URL is not a requirement here
    (safety.PIP_REQUIREMENT, "-e .", False),  # an option is not a requirement
    (safety.ENV_NAME, "TORCH_CUDA_ARCH_LIST", True),
    (safety.ENV_NAME, "1BAD", False),
    (safety.ENV_NAME, "A" * 129, False),
    (safety.MODULE_NAME, "sageattention._qattn_sm90", True),
    (safety.MODULE_NAME, "a..b", False),
    (safety.IMAGE_PATH, "/opt/venv/bin/python", True),
    (safety.IMAGE_PATH, "python3.12", True),
    (safety.IMAGE_PATH, "bin/python", False),  # absolute, or python itself
])
def test_pattern_examples(pattern, value, ok):
    assert bool(pattern.fullmatch(value)) is ok


def test_validate_refuses_non_strings_and_names_the_value_briefly():
    for value, shown in ((5, "5"), (None, "None"), (["a", "b"], "a list of 2 items"), ({"k": 1}, "a mapping of 1 key"),
                         (b"img", "3 bytes of binary data")):
        with pytest.raises(UnsafeValueError) as info:
            safety.validate(value, safety.ENV_NAME, "--env")  # type: ignore[arg-type]
        assert str(info.value).startswith(f"--env {shown} is not allowed: use a value matching"), str(info.value)
        assert info.value.exit_code == 2


def test_validate_messages_are_one_bounded_line_with_a_hint_where_there_is_one():
    with pytest.raises(UnsafeValueError) as info:
        safety.validate("img\nRUN touch pwned" + "x" * 100_000, safety.IMAGE_REF, "--base-image")
    message = str(info.value)
    assert "\n" not in message and len(message) < 250
    assert message.endswith("use an image reference like registry:5000/name:tag or name@sha256:<digest>")
    assert "\\n" in message  # the newline is shown escaped, not dropped
    with pytest.raises(UnsafeValueError, match=r"use an http\(s\) URL without quotes"):
        safety.validate("https://x/$(id)", safety.URL, "--torch-index-url")


def test_describe_names_every_kind_of_value_without_walking_it():
    assert safety.describe(["one"]) == "a list of 1 item"
    assert safety.describe(("a", "b")) == "a list of 2 items"
    assert safety.describe({"k": "v"}) == "a mapping of 1 key"
    assert safety.describe({1, 2, 3}) == "a set of 3 items"
    assert safety.describe(frozenset()) == "a set of 0 items"
    assert safety.describe(bytearray(b"\x00\x01")) == "2 bytes of binary data"
    assert safety.describe(True) == "True" and safety.describe(None) == "None"
    assert safety.describe(float("inf")) == ".inf" and safety.describe(2.5) == "2.5"
    assert safety.describe(-(2 ** 63)) == str(-(2 ** 63))
    assert safety.describe(object()) == "a object"
    assert safety.describe("a\x1bb") == "'a\\x1bb'"  # repr escapes it, once
    assert safety.describe("abcdef", limit=3) == "'abc'..."


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["IMAGEGEN_EOF", "IMAGEGEN_EOF_1", "IMAGEGEN_EOF_2", "x", "", " IMAGEGEN_EOF"]),
                max_size=8), st.text(max_size=30))
def test_the_heredoc_delimiter_is_never_a_line_of_the_body(lines, extra):
    body = "\n".join([*lines, extra])
    delimiter = safety.heredoc_delimiter(body)
    assert delimiter not in body.split("\n") and delimiter.startswith("IMAGEGEN_EOF")


def test_the_heredoc_delimiter_is_the_stem_unless_the_body_uses_it():
    assert safety.heredoc_delimiter("echo hi\n") == "IMAGEGEN_EOF"
    assert safety.heredoc_delimiter("IMAGEGEN_EOF\nIMAGEGEN_EOF_1\n") == "IMAGEGEN_EOF_2"
    assert safety.heredoc_delimiter("EOF\n", stem="EOF") == "EOF_1"


# ------------------------------------------------------------------------------ read_regular_file


def test_read_regular_file_reads_up_to_the_limit_and_no_further(tmp_path):
    path = tmp_path / "f.toml"
    path.write_bytes(b"x" * 100)
    assert safety.read_regular_file(path, limit=100) == b"x" * 100
    with pytest.raises(Unreadable, match="^100 bytes; at most 99 are read$"):
        safety.read_regular_file(path, limit=99)
    (tmp_path / "empty").write_bytes(b"")
    assert safety.read_regular_file(tmp_path / "empty", limit=0) == b""


def test_a_file_that_grows_past_its_size_is_still_bounded():
    # /proc files report size 0 and then serve more: the limit holds on what is read, not on st_size.
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(Unreadable, match="^more than 50 bytes$"):
        safety.read_regular_file("/proc/self/status", limit=50)


def test_read_regular_file_refuses_what_is_not_a_regular_file_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # opening a FIFO for reading would block until a writer came
    for path in (tmp_path / "fifo", tmp_path, "/dev/zero"):
        with pytest.raises(Unreadable, match="not a regular file"):
            safety.read_regular_file(path, limit=1 << 20)
    with pytest.raises(Unreadable, match="no such file"):
        safety.read_regular_file(tmp_path / "missing", limit=10)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(Unreadable, match="no such file"):
        safety.read_regular_file(tmp_path / "dangling", limit=10)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(Unreadable) as info:
        safety.read_regular_file(tmp_path / "loop", limit=10)
    assert str(info.value) == safety.os_reason(OSError(errno.ELOOP, os.strerror(errno.ELOOP)))


def test_inside_keeps_reads_within_the_tree(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "real.patch").write_text("ok")
    (tmp_path / "secret").write_text("secret")
    (tree / "inner-link.patch").symlink_to(tree / "sub" / "real.patch")
    (tree / "outer-link.patch").symlink_to(tmp_path / "secret")
    assert safety.read_regular_file(tree / "inner-link.patch", limit=10, inside=tree) == b"ok"
    for path in (tree / "outer-link.patch", tree / ".." / "secret"):
        with pytest.raises(Unreadable, match="leads outside its directory"):
            safety.read_regular_file(path, limit=10, inside=tree)
    with pytest.raises(Unreadable, match="its directory cannot be read"):
        safety.read_regular_file(tree / "sub" / "real.patch", limit=10, inside=tmp_path / "gone")
    # without inside, the same link reads (a user's own config may live anywhere)
    assert safety.read_regular_file(tree / "outer-link.patch", limit=10) == b"secret"


def test_os_reason_is_a_few_lowercase_words_without_the_path():
    assert safety.os_reason(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y")) == \
        "no such file or directory"
    assert safety.os_reason(ValueError("embedded null byte")) == "ValueError"
    assert safety.os_reason(OSError("no strerror")) == "OSError"


def test_a_served_folder_url_is_one_check_for_index_and_ci():
    # `index --base-url` and `ci github --skip-published` both name where a wheelhouse is served.
    assert safety.served_folder_url("https://w.example.org/whl/", "--x", "elsewhere") == "https://w.example.org/whl"
    for bad, says in (("https://u:ghp_abcdefghijklmnopqrstuvwxyz0123456789@w.example.org/", "carries a credential"),
                      ("https://w.example.org/?a=1", "query or fragment"), ("https://w.example.org/#x", "query or"),
                      ("ftp://w.example.org/", "--x"), ("https://w.example.org/$(id)", "--x")):
        with pytest.raises(UnsafeValueError, match=re.escape(says)):
            safety.served_folder_url(bad, "--x", "elsewhere")


def test_a_wheelhouse_path_with_a_nul_is_the_callers_error_not_a_value_error():
    with pytest.raises(UsageError, match="holds a NUL character"):
        safety.wheelhouse_folder(Path("wh\x00x"), "--out", UsageError)


def test_is_file_is_false_for_names_the_os_refuses(tmp_path):
    (tmp_path / "f").write_text("")
    assert safety.is_file(tmp_path / "f") and not safety.is_file(tmp_path)
    assert not safety.is_file(tmp_path / "nul\0byte") and not safety.is_file(tmp_path / ("x" * 5000))
