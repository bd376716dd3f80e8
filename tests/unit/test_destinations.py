"""Tests for imagegen.model.destinations: the one grammar of a publish destination, which `imagegen
publish --to` and `imagegen ci github --publish` both parse with (each form, and every malformed one a
one-line UsageError naming the flag it came from)."""

from __future__ import annotations

import pytest

from imagegen.errors import UsageError
from imagegen.model.destinations import GithubDest, HubDest, PypiDest, S3Dest, parse_destination


@pytest.mark.parametrize("text, want", [
    ("pypi:https://upload.pypi.org/legacy/", PypiDest("pypi:https://upload.pypi.org/legacy/",
                                                      "https://upload.pypi.org/legacy/", "https://pypi.org/simple/")),
    ("pypi:https://test.pypi.org/legacy", PypiDest("pypi:https://test.pypi.org/legacy",
                                                   "https://test.pypi.org/legacy", "https://test.pypi.org/simple/")),
    ("pypi:http://127.0.0.1:8080/", PypiDest("pypi:http://127.0.0.1:8080/", "http://127.0.0.1:8080/",
                                             "http://127.0.0.1:8080/simple/")),
    ("pypi:https://pkgs.example.com/legacy/", PypiDest("pypi:https://pkgs.example.com/legacy/",
                                                       "https://pkgs.example.com/legacy/",
                                                       "https://pkgs.example.com/simple/")),
    ("pypi:https://devpi.example.com/me/dev/,simple=https://devpi.example.com/me/dev/+simple",
     PypiDest("pypi:https://devpi.example.com/me/dev/,simple=https://devpi.example.com/me/dev/+simple",
              "https://devpi.example.com/me/dev/", "https://devpi.example.com/me/dev/+simple/")),
    ("hf:octo/sage-wheels", HubDest("hf:octo/sage-wheels", "octo/sage-wheels", "main", "")),
    ("hf:octo/sage_wheels.v2@dev:cu128/torch2.8/", HubDest("hf:octo/sage_wheels.v2@dev:cu128/torch2.8/",
                                                           "octo/sage_wheels.v2", "dev", "cu128/torch2.8")),
    ("github:octo-org/wheels@v1.0+cu128", GithubDest("github:octo-org/wheels@v1.0+cu128", "octo-org/wheels",
                                                     "v1.0+cu128")),
    ("s3://wheels.example", S3Dest("s3://wheels.example", "wheels.example", "")),
    ("s3://wheels/cu128/torch2.8/", S3Dest("s3://wheels/cu128/torch2.8/", "wheels", "cu128/torch2.8/")),
    ("s3://wheels/whl,layout=wheelhouse", S3Dest("s3://wheels/whl,layout=wheelhouse", "wheels", "whl/", "wheelhouse")),
    ("s3://wheels,layout=wheelhouse", S3Dest("s3://wheels,layout=wheelhouse", "wheels", "", "wheelhouse")),
    ("s3://wheels/whl/,layout=flat", S3Dest("s3://wheels/whl/,layout=flat", "wheels", "whl/", "flat")),
])
def test_destinations_parse(text, want):
    assert parse_destination(text) == want


def test_only_the_wheelhouse_layout_is_a_wheelhouse():
    assert parse_destination("s3://bkt/p,layout=wheelhouse").wheelhouse
    assert not parse_destination("s3://bkt/p").wheelhouse and not parse_destination("s3://bkt/p,layout=flat").wheelhouse


@pytest.mark.parametrize("text, needle", [
    ("ftp://example.com/", "not a destination"),
    ("upload.pypi.org/legacy/", "not a destination"),
    ("pypi:https://user:pw@upload.pypi.org/legacy/", "expected pypi:UPLOAD_URL"),  # credentials on the command line
    ("pypi:https://upload.pypi.org/legacy/?x=$(id)", "expected pypi:"),
    ("pypi:https://host/../admin/", "expected pypi:"),
    ("pypi:file:///etc/passwd", "expected pypi:"),
    ("hf:octo", "expected hf:OWNER/REPO"),
    ("hf:octo/a b", "expected hf:"),
    ("hf:octo/repo--x", "expected hf:"),
    ("hf:octo/repo:../../etc", "expected hf:"),
    ("hf:octo/repo@ma\nin", "expected hf:"),
    ("github:octo/wheels", "expected github:OWNER/REPO@TAG"),
    ("github:octo/wheels@v1;rm -rf", "expected github:"),
    ("github:octo/../x@v1", "expected github:"),
    ("s3://UPPER/x", "expected s3://BUCKET"),
    ("s3://b/../x", "expected s3://"),
    ("s3://bucket/a//b", "expected s3://"),
    ("s3://bucket/a,layout=tree", "expected s3://BUCKET[/PREFIX][,layout=wheelhouse]"),
    ("s3://bucket/a,layout=wheelhouse,layout=flat", "expected s3://"),
    ("s3://bucket/a,layout=Wheelhouse", "expected s3://"),
    ("s3://bucket/a layout=wheelhouse", "expected s3://"),
])
def test_malformed_destinations_are_one_line_usage_errors(text, needle):
    with pytest.raises(UsageError) as info:
        parse_destination(text)
    assert needle in str(info.value) and "\n" not in str(info.value) and info.value.exit_code == 2


def test_a_refusal_names_the_flag_the_destination_came_from():
    with pytest.raises(UsageError, match=r"^--publish 'hf:a/b@main:x/\.\./\.\./y': expected hf:OWNER/REPO"):
        parse_destination("hf:a/b@main:x/../../y", "--publish")
    with pytest.raises(UsageError, match=r"^--to 's3://x': not a destination|^--to 's3://x': expected"):
        parse_destination("s3://x")
