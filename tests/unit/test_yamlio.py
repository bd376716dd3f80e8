"""Tests for imagegen.yamlio: load() for imagegen's own files, and load_untrusted()'s bounds for files other
people write: no aliases, bounded depth and node count, unbuildable values turned into YAMLErrors."""

from __future__ import annotations

import pytest
import yaml

from imagegen import yamlio

RECIPE_LIKE = """\
schema: 1
name: demo
versions:
  "1.0":
    source: {git: "https://example.org/demo.git", ref: v1.0}
    archs: [8.0, 9.0]
    env: {DEMO_FLAG: "1"}
"""


def test_both_loaders_read_plain_documents_alike():
    source = {"git": "https://example.org/demo.git", "ref": "v1.0"}
    expected = {"schema": 1, "name": "demo",
                "versions": {"1.0": {"source": source, "archs": [8.0, 9.0], "env": {"DEMO_FLAG": "1"}}}}
    assert yamlio.load(RECIPE_LIKE) == expected
    assert yamlio.load_untrusted(RECIPE_LIKE) == expected
    assert yamlio.load_untrusted("") is None and yamlio.load_untrusted("# only a comment\n") is None


def test_both_loaders_are_safe_loaders():
    for load in (yamlio.load, yamlio.load_untrusted):
        with pytest.raises(yamlio.YAMLError):
            load("!!python/object/apply:os.system ['true']\n")


def test_aliases_are_refused_untrusted_but_read_in_imagegens_own_files():
    text = "base: &b {x: 1}\nother: *b\n"
    assert yamlio.load(text) == {"base": {"x": 1}, "other": {"x": 1}}
    with pytest.raises(yamlio.UntrustedYAMLError) as info:
        yamlio.load_untrusted(text)
    assert "aliases (*name) are not allowed" in info.value.problem
    assert info.value.problem_mark.line == 1  # 0-based: the second line, where *b is
    assert isinstance(info.value, yamlio.YAMLError)  # callers catch one type


def test_an_anchor_without_an_alias_is_fine():
    assert yamlio.load_untrusted("a: &x 1\nb: 2\n") == {"a": 1, "b": 2}


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def test_nesting_is_bounded_at_max_depth():
    assert yamlio.load_untrusted(_nested(yamlio.MAX_DEPTH)) == eval(_nested(yamlio.MAX_DEPTH))  # noqa: S307
    with pytest.raises(yamlio.UntrustedYAMLError, match=f"nested deeper than {yamlio.MAX_DEPTH} levels"):
        yamlio.load_untrusted(_nested(yamlio.MAX_DEPTH + 1))
    with pytest.raises(yamlio.UntrustedYAMLError, match="nested deeper than 2 levels"):
        yamlio.load_untrusted("a: {b: {c: 1}}\n", max_depth=2)
    assert yamlio.load_untrusted("a: {b: 1}\n", max_depth=2) == {"a": {"b": 1}}


def test_a_pathologically_deep_document_is_refused_not_a_crash():
    # libyaml's composer recurses: this many brackets would take the interpreter down if it were composed.
    with pytest.raises(yamlio.UntrustedYAMLError, match="nested deeper than"):
        yamlio.load_untrusted("[" * 300_000)


def test_the_node_count_is_bounded():
    # a mapping of 3 keys: the mapping node and 6 scalars
    text = "a: 1\nb: 2\nc: 3\n"
    assert yamlio.load_untrusted(text, max_nodes=7) == {"a": 1, "b": 2, "c": 3}
    with pytest.raises(yamlio.UntrustedYAMLError, match="more than 6 values"):
        yamlio.load_untrusted(text, max_nodes=6)
    with pytest.raises(yamlio.UntrustedYAMLError, match=f"more than {yamlio.MAX_NODES} values"):
        yamlio.load_untrusted("[" + "0," * (yamlio.MAX_NODES + 1) + "]")


@pytest.mark.parametrize("text", [
    "!!int foo\n",
    "x: !!float bar\n",
    "x: !!int " + "9" * 5000 + "\n",  # beyond int()'s digit limit
    "x: !!timestamp 2024-99-99\n",
    "x: !!binary 'a'\n",  # not base64
])
def test_values_that_cannot_be_built_are_yaml_errors(text):
    with pytest.raises(yamlio.YAMLError) as info:
        yamlio.load_untrusted(text)
    assert getattr(info.value, "problem", None)  # says what is wrong, for the recipe's one-line message


def test_a_stream_of_two_documents_is_not_one_recipe():
    with pytest.raises(yamlio.YAMLError):
        yamlio.load_untrusted("a: 1\n---\nb: 2\n")


def test_broken_syntax_keeps_pyyamls_own_error_and_line():
    with pytest.raises(yaml.MarkedYAMLError) as info:
        yamlio.load_untrusted("a: 1\nb: [unclosed\n")
    assert not isinstance(info.value, yamlio.UntrustedYAMLError)  # not a refusal: plain invalid YAML
    assert info.value.problem_mark is not None
