"""Tests for imagegen.model.recipe_reader: bounded reads of recipe files (size, regular files only, inside
the recipe's directory, UTF-8), the Reader's typed values with the key path in every error, the quoting
of bad values in messages, and the allowed keys of every mapping (taken from resources/recipe.schema.json)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen import safety
from imagegen.errors import RecipeError
from imagegen.model import recipe_reader
from imagegen.model.recipe_reader import (
    MAX_RECIPE_BYTES,
    MAX_STR,
    Reader,
    key_text,
    quoted,
    read_inside,
    read_recipe_text,
    shown_path,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "imagegen" / "resources" / "recipe.schema.json").read_text())


def test_the_loaders_keys_are_the_schemas():
    assert recipe_reader.TOP_KEYS == tuple(SCHEMA["properties"])
    assert recipe_reader.VERSION_KEYS == tuple(SCHEMA["$defs"]["version"]["properties"])
    assert recipe_reader.BUILD_KEYS == tuple(SCHEMA["$defs"]["build"]["properties"])
    assert recipe_reader.ARCH_KEYS == tuple(SCHEMA["$defs"]["arch"]["properties"])


def test_every_other_key_table_is_the_schemas_too():
    defs = SCHEMA["$defs"]
    assert recipe_reader.SOURCE_KEYS == tuple(defs["source"]["properties"])
    assert recipe_reader.SMOKE_KEYS == tuple(defs["smoke"]["properties"])
    assert recipe_reader.SDIST_KEYS == tuple(defs["sdist"]["properties"])
    assert recipe_reader.PATCH_KEYS == tuple(defs["patch"]["properties"])
    assert recipe_reader.OBSOLETE_PATCH_KEYS == tuple(defs["obsolete_patch"]["properties"])
    assert recipe_reader.EXTENSION_KEYS == tuple(defs["extension"]["properties"])
    assert recipe_reader.RULE_KEYS == tuple(defs["rule"]["properties"])
    assert recipe_reader.EXT_PARALLEL_KEYS == tuple(defs["build"]["properties"]["ext_parallel"]["properties"])
    assert {"git", "path"} <= set(recipe_reader.SOURCE_KEYS) and "imports" in recipe_reader.SMOKE_KEYS


# --------------------------------------------------------------------------------------------
# Bounded reads: read_recipe_text and read_inside


def test_a_recipe_of_exactly_the_bound_is_read_and_one_byte_more_is_not(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_bytes(b"#" * MAX_RECIPE_BYTES)
    assert len(read_recipe_text(p)) == MAX_RECIPE_BYTES
    p.write_bytes(b"#" * (MAX_RECIPE_BYTES + 1))
    with pytest.raises(RecipeError) as err:
        read_recipe_text(p)
    assert str(err.value) == f"{p}: cannot read: {MAX_RECIPE_BYTES + 1} bytes; at most {MAX_RECIPE_BYTES} are read"


def test_a_recipe_is_decoded_as_utf8_and_other_encodings_are_refused(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("description: café ✓\n", encoding="utf-8")
    assert read_recipe_text(p) == "description: café ✓\n"
    p.write_text("description: café\n", encoding="latin-1")
    with pytest.raises(RecipeError, match=r"r\.yaml: cannot read: not UTF-8 text \(byte 16\)$"):
        read_recipe_text(p)
    p.write_text("name: x\n", encoding="utf-16")  # a BOM and NULs: not UTF-8 either
    with pytest.raises(RecipeError, match=r"not UTF-8 text \(byte 0\)$"):
        read_recipe_text(p)


@pytest.mark.parametrize("make, why", [
    (lambda p: None, "no such file (or a symlink to nothing)"),
    (lambda p: p.mkdir(), "not a regular file (a directory, FIFO, socket or device)"),
    (lambda p: os.mkfifo(p), "not a regular file (a directory, FIFO, socket or device)"),
    (lambda p: p.symlink_to(p.parent / "missing.yaml"), "no such file (or a symlink to nothing)"),
])
def test_what_is_not_a_regular_file_is_refused_with_the_reason(tmp_path, make, why):
    p = tmp_path / "r.yaml"
    make(p)
    with pytest.raises(RecipeError) as err:
        read_recipe_text(p)
    assert str(err.value) == f"{p}: cannot read: {why}" and err.value.exit_code == 2


def test_a_symlink_loop_is_refused_in_one_line(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    with pytest.raises(RecipeError) as err:
        read_recipe_text(tmp_path / "a.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'a.yaml'}: cannot read: ") and "\n" not in str(err.value)


def test_a_recipe_symlink_is_followed_only_inside_its_directory(tmp_path):
    (tmp_path / "host.yaml").write_text("name: secret\n")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "real.yaml").write_text("name: inside\n")
    (recipes / "same.yaml").symlink_to("real.yaml")
    (recipes / "out.yaml").symlink_to(tmp_path / "host.yaml")
    assert read_recipe_text(recipes / "same.yaml") == "name: inside\n"
    with pytest.raises(RecipeError) as err:
        read_recipe_text(recipes / "out.yaml")
    assert str(err.value) == f"{recipes / 'out.yaml'}: cannot read: it leads outside its directory " \
                             "(a symlink or path to elsewhere)"


def test_read_inside_bounds_the_file_by_its_own_limit_and_directory(tmp_path):
    (tmp_path / "patches").mkdir()
    patch = tmp_path / "patches" / "x.patch"
    patch.write_text("+ok\n")
    assert read_inside(patch, 4, tmp_path) == "+ok\n"
    with pytest.raises(safety.Unreadable, match=r"^4 bytes; at most 3 are read$"):
        read_inside(patch, 3, tmp_path)
    (tmp_path / "other").mkdir()
    with pytest.raises(safety.Unreadable, match="leads outside its directory"):
        read_inside(patch, 100, tmp_path / "other")  # a directory that does not hold it
    with pytest.raises(safety.Unreadable, match="its directory cannot be read"):
        read_inside(patch, 100, tmp_path / "missing")
    patch.write_bytes(b"ok\x80")
    with pytest.raises(safety.Unreadable, match=r"^not UTF-8 text \(byte 2\)$"):
        read_inside(patch, 100, tmp_path)


# --------------------------------------------------------------------------------------------
# How messages show values, keys and file names


def test_quoted_is_bounded_escaped_and_never_expands_a_structure():
    assert quoted("v1.0") == "'v1.0'"
    long = quoted("x" * 1000)
    assert long.endswith("...") and len(long) < 70
    assert quoted("a\nRUN id\x1b[31m") == "'a\\nRUN id\\x1b[31m'"
    assert quoted([[1] * 10] * 10) == "a list of 10 items" and quoted({"a": 1}) == "a mapping of 1 key"
    assert quoted(math.inf) == ".inf" and quoted(True) == "True" and quoted(10**100).endswith("-bit integer")


def test_key_text_and_shown_path_are_bounded_and_escaped():
    assert key_text("versions") == "versions"
    assert key_text("k" * 100) == "k" * 37 + "..."
    assert key_text("a\u202eb") == "a\\u202eb"
    assert key_text(1.5) == "1.5" and key_text(["x"]) == "a list of 1 item"
    assert shown_path(Path("/r/demo.yaml")) == "/r/demo.yaml"
    deep = "/" + "d/" * 200 + "demo.yaml"
    assert shown_path(deep) == "..." + deep[-157:] and len(shown_path(deep)) == 160
    assert shown_path("/r/\x1b]0;title\x07.yaml") == "/r/\\x1b]0;title\\x07.yaml"


# --------------------------------------------------------------------------------------------
# Reader: typed values, the key path in every error


def _err(call) -> str:
    with pytest.raises(RecipeError) as err:
        call()
    msg = str(err.value)
    assert "\n" not in msg and err.value.exit_code == 2
    return msg


def test_a_reader_takes_a_mapping_and_names_the_file_and_key_path():
    assert _err(lambda: Reader("r.yaml", ["a"])) == "r.yaml: <top>: expected a mapping, got a list of 1 item"
    assert _err(lambda: Reader("r.yaml", "x", "versions.1.0")) == "r.yaml: versions.1.0: expected a mapping, got 'x'"
    r = Reader("r.yaml", {"build": {"arch": {"env": 5}}})
    sub = r.sub("build").sub("arch")
    assert sub.where == "build.arch"
    assert str(sub.error("bad", "env")) == "r.yaml: build.arch.env: bad"
    assert str(r.error("bad")) == "r.yaml: <top>: bad"


def test_a_very_deep_key_path_is_bounded():
    r = Reader("r.yaml", {}, ".".join(["level"] * 60))
    msg = str(r.error("bad", "k" * 100))
    assert msg.startswith("r.yaml: level.level.") and msg.endswith("...: bad") and len(msg) < 140


def test_only_refuses_an_unknown_key_listing_the_known_ones():
    assert _err(lambda: Reader("r.yaml", {"name": "x", "colour": 1}, keys=("name", "aliases"))) == \
        "r.yaml: colour: unknown key (known: aliases, name)"
    many = tuple(f"key_number_{i:03}" for i in range(100))
    msg = _err(lambda: Reader("r.yaml", {"x": 1}, "build", keys=many))
    assert msg.startswith("r.yaml: build.x: unknown key (known: key_number_000, ") and msg.endswith("...)")
    assert len(msg) < 300


def test_sub_list_and_mapping_take_absent_or_null_as_empty():
    r = Reader("r.yaml", {"a": None, "l": [1], "m": {"k": "v"}, "s": "text"})
    assert r.sub("a").data == {} and r.sub("missing").data == {}
    assert r.list("a") == [] and r.list("missing") == [] and r.list("l") == [1]
    assert r.mapping("a") == {} and r.mapping("m") == {"k": "v"}
    assert _err(lambda: r.sub("a", required=True)) == "r.yaml: a: missing"
    assert _err(lambda: r.list("s")) == "r.yaml: s: expected a list, got 'text'"
    assert _err(lambda: r.mapping("s", "a table")) == "r.yaml: s: expected a table, got 'text'"
    assert _err(lambda: r.sub("m", keys=("j",))) == "r.yaml: m.k: unknown key (known: j)"


def test_scalar_text_writes_numbers_as_text_and_refuses_the_unwritable():
    r = Reader("r.yaml", {})
    assert r.scalar_text(1.0, "v") == "1.0" and r.scalar_text(12, "v") == "12"
    assert r.scalar_text(10**15, "v") == str(10**15)
    assert r.scalar_text(True, "v") is True and r.scalar_text(None, "v") is None and r.scalar_text("x", "v") == "x"
    assert _err(lambda: r.scalar_text(math.nan, "v")) == "r.yaml: v: expected text, got .nan"
    assert _err(lambda: r.scalar_text(-math.inf, "v")) == "r.yaml: v: expected text, got -.inf"
    assert _err(lambda: r.scalar_text(1e16, "v")) == \
        "r.yaml: v: expected text, got 1e+16 (numbers beyond 10^15 are refused)"


def test_str_checks_type_length_hidden_characters_and_pattern():
    r = Reader("r.yaml", {"ok": "v1.0", "num": 2.5, "flag": True, "long": "x" * (MAX_STR + 1),
                          "esc": "red\x1b[31m", "bidi": "exe\u202etxt", "zw": "a\u200bb", "ws": "a\tb\nc\r",
                          "bad": "v1 0"})
    assert r.str("ok", pattern=safety.GIT_REF) == "v1.0" and r.str("num") == "2.5"
    assert r.str("missing") is None and r.str("missing", "dflt") == "dflt"
    assert r.str("ws") == "a\tb\nc\r"  # tab, newline and carriage return are plain text
    assert _err(lambda: r.str("missing", required=True)) == "r.yaml: missing: missing"
    assert _err(lambda: r.str("flag")) == "r.yaml: flag: expected a string, got True"
    assert _err(lambda: r.str("long")).endswith(f"is {MAX_STR + 1} characters long; at most {MAX_STR}")
    assert len(r.str("long", max_len=MAX_STR + 1)) == MAX_STR + 1
    assert _err(lambda: r.str("esc")).endswith("contains the control character \\x1b; write plain text")
    assert _err(lambda: r.str("bidi")).endswith("contains the control character \\u202e; write plain text")
    assert _err(lambda: r.str("zw")).endswith("contains the control character \\u200b; write plain text")
    assert _err(lambda: r.str("bad", pattern=re.compile(r"v[0-9.]+"))) == \
        "r.yaml: bad: 'v1 0' is not allowed here (must match v[0-9.]+)"


def test_bool_and_number_refuse_lookalikes():
    r = Reader("r.yaml", {"yes": True, "one": 1, "n": 3, "half": 2.5, "nan": math.nan, "inf": math.inf,
                          "big": 10**400, "s": "4"})
    assert r.bool("yes", False) is True and r.bool("missing", True) is True
    assert _err(lambda: r.bool("one", False)) == "r.yaml: one: expected true or false, got 1"
    assert r.number("n", 1, low=1, high=8, integer=True) == 3.0 and r.number("half", 1, low=0, high=8) == 2.5
    assert r.number("missing", 4, low=1, high=8) == 4.0
    for key in ("yes", "nan", "inf", "big", "s"):
        msg = _err(lambda: r.number(key, 1, low=1, high=8))
        assert msg.startswith(f"r.yaml: {key}: expected a number from 1 to 8, got ")
    assert _err(lambda: r.number("half", 1, low=1, high=8, integer=True)) == \
        "r.yaml: half: expected a whole number from 1 to 8, got 2.5"
    assert _err(lambda: r.number("n", 1, low=0.05, high=2)) == "r.yaml: n: expected a number from 0.05 to 2, got 3"


def test_str_list_takes_one_string_or_a_list_of_strings():
    r = Reader("r.yaml", {"one": "demo", "many": ["a", 1.5], "null": None, "map": {"a": 1}, "nested": [["a"]],
                          "long": ["x" * 65], "bad": ["ok", "no way"]})
    assert r.str_list("one") == ("demo",) and r.str_list("many") == ("a", "1.5")
    assert r.str_list("null") == () and r.str_list("missing") == ()
    assert _err(lambda: r.str_list("map")) == "r.yaml: map: expected a list, got a mapping of 1 key"
    assert _err(lambda: r.str_list("nested")) == "r.yaml: nested: expected strings, got a list of 1 item"
    assert _err(lambda: r.str_list("long", max_len=64)).endswith("is 65 characters long; at most 64")
    assert _err(lambda: r.str_list("bad", pattern=safety.MODULE_NAME)).startswith(
        "r.yaml: bad: 'no way' is not allowed here (must match ")


def test_env_reads_variables_and_refuses_what_a_shell_would_interpret():
    r = Reader("r.yaml", {"env": {"A": "x y", "ON": True, "OFF": False, "N": 3}})
    assert r.env("env") == {"A": "x y", "ON": "1", "OFF": "0", "N": "3"} and r.env("missing") == {}
    for bad_name in ("1A", "A-B", "A B", "", 5):
        msg = _err(lambda: Reader("r.yaml", {"env": {bad_name: "1"}}).env("env"))
        assert msg.startswith("r.yaml: env: bad environment variable name ")
    for bad_value in ("$(id)", "`id`", 'a"b', "a\nb", "a\\b", ["x"]):
        msg = _err(lambda: Reader("r.yaml", {"env": {"A": bad_value}}).env("env"))
        assert msg.startswith("r.yaml: env: bad value ") and msg.endswith("for A (printable text, no quotes, $ or `)")
    assert _err(lambda: Reader("r.yaml", {"env": ["A=1"]}).env("env")) == \
        "r.yaml: env: expected a mapping of VARIABLE: value, got a list of 1 item"


def test_version_and_archs_parse_or_name_the_key():
    r = Reader("r.yaml", {"v": "2.8.0", "n": 12.8, "bad": "two", "long": "1." * 40, "archs": ["8.0", "9.0+PTX"],
                          "one": "8.6", "wrong": ["4.2"]}, "build")
    assert r.version("v") == Version("2.8.0") and r.version("n") == Version("12.8")
    assert r.version("missing") is None and r.version("missing", "11.8") == Version("11.8")
    assert _err(lambda: r.version("bad")) == "r.yaml: build.bad: 'two' is not a version"
    assert "characters long; at most 64" in _err(lambda: r.version("long"))
    assert [str(a) for a in r.archs("archs")] == ["8.0", "9.0+PTX"] and [a.cc for a in r.archs("one")] == ["8.6"]
    assert len(r.archs("missing")) == 0
    msg = _err(lambda: r.archs("wrong"))
    assert msg.startswith("r.yaml: build.wrong: ") and "4.2" in msg


TOKEN = "ghp_S3cr3tT0kenDoNotLeak1234"


@pytest.mark.parametrize("value", [f"https://u:{TOKEN}@h/x", f"https://{TOKEN}@github.com/o/r",
                                   f"see https://h/x?token={TOKEN}", f"user:{TOKEN}@registry.example/ns/img"])
def test_no_text_of_a_recipe_carries_a_credential(value):
    # A recipe's homepage became the image's source label and a patch's reason went into the cell document
    # in the image, credential and all (a fuzz of every recipe field, 2026-11-28); source.git alone was checked.
    r = Reader("r.yaml", {"homepage": value, "reason": value, "imports": ["ok", value]})
    for read in (lambda: r.str("homepage"), lambda: r.str("reason"), lambda: r.str_list("imports")):
        with pytest.raises(RecipeError, match="carries a credential") as info:
            read()
        assert TOKEN not in str(info.value)


def test_text_without_a_credential_is_taken():
    r = Reader("r.yaml", {"homepage": "https://github.com/thu-ml/SageAttention", "base": "img:tag@sha256:" + "a" * 64,
                          "git": "git@github.com:o/r.git"})
    assert r.str("homepage") == "https://github.com/thu-ml/SageAttention"
    assert r.str("base").startswith("img:tag@sha256:") and r.str("git") == "git@github.com:o/r.git"
