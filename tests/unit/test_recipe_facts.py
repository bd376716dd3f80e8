"""Tests for imagegen.model.recipe_facts: a version's build facts (archs, emits, knob, patches, routing,
ranges) and the by_version PEP 440 ranges that give them to pinned versions and to any source the
catalogue does not pin; loaded through whole recipe files and through the functions themselves."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from imagegen.errors import RecipeError
from imagegen.model import recipe_facts
from imagegen.model.recipe_file import load_recipe_file
from imagegen.model.recipe_reader import Reader
from imagegen.model.recipes import ArchKnob
from tests.unit.recipe_texts import GOOD, write

KNOB = ArchKnob(env="DEMO_ARCHS", style="numeric", ptx="none")


def test_pep440_reads_versions_and_refuses_the_rest():
    assert str(recipe_facts.pep440("2.8.3.post1")) == "2.8.3.post1"
    assert str(recipe_facts.pep440("v2.8.2")) == "2.8.2"  # PEP 440 allows a leading v
    assert recipe_facts.pep440("main") is None and recipe_facts.pep440("1" * 65) is None


def test_version_facts_reads_one_mapping(tmp_path):
    r = Reader("demo.yaml", {"archs": ["8.0", "9.0"], "emits": {"9.0": "9.0a"}, "min_cuda_by_arch": {"9.0": "12.3"},
                             "arch": {"ptx": "newest"}, "extensions": {"demo._sm90": {"archs": ["9.0a"]}},
                             "requires": {"torch": ">=2.4"}, "env": {"X": 1}, "notes": "n"}, "versions.1.0")
    v = recipe_facts.version_facts(r, "demo.yaml", tmp_path, KNOB, "1.0")
    assert (v.version, str(v.archs), dict(v.emits), str(v.min_cuda_by_arch["9.0"])) == ("1.0", "8.0;9.0", {"9.0": "9.0a"}, "12.3")
    assert v.arch.ptx == "newest" and v.arch.env == "DEMO_ARCHS"  # the recipe's knob, one key replaced
    assert str(v.extensions["demo._sm90"]) == "9.0a" and v.requires[0].subject == "torch" and v.env == {"X": "1"}
    with pytest.raises(RecipeError, match="versions.1.0.archs: list the archs"):
        recipe_facts.version_facts(Reader("demo.yaml", {}, "versions.1.0"), "demo.yaml", tmp_path, KNOB, "1.0")


def test_by_version_ranges_keep_their_order_and_refuse_a_range_that_is_not_one(tmp_path):
    data = {"by_version": [{"match": ">=2", "archs": ["9.0"]}, {"match": "<2", "archs": ["8.0"]}]}
    ranges = recipe_facts.by_version_ranges(Reader("d.yaml", data), "d.yaml", tmp_path, KNOB)
    assert [(spec, str(v.archs)) for spec, v in ranges] == [(SpecifierSet(">=2"), "9.0"), (SpecifierSet("<2"), "8.0")]
    assert recipe_facts.by_version_raw(Reader("d.yaml", data)) == [{"archs": ["9.0"]}, {"archs": ["8.0"]}]
    for bad in ("===x", "2.0", ">=two"):
        with pytest.raises(RecipeError, match=r"by_version\[0\].match"):
            recipe_facts.by_version_ranges(Reader("d.yaml", {"by_version": [{"match": bad, "archs": ["9.0"]}]}),
                                           "d.yaml", tmp_path, KNOB)


# --------------------------------------------------------------------------------------------
# by_version: build facts by PEP 440 range; pinned versions take them and may replace keys


BY_VERSION = GOOD.replace('''versions:
  "1.0":
    ref: v1.0
    commit: 0123456789abcdef0123456789abcdef01234567
    archs: ["8.0", "9.0"]
''', '''by_version:
  - match: ">=2.0"
    archs: ["8.0", "9.0", "12.0"]
    min_cuda_by_arch: {"12.0": "12.8"}
    notes: "2.x"
  - match: ">=1.0,<2.0"
    archs: ["8.0", "9.0"]
    emits: {"9.0": "9.0a"}
versions:
  "1.0":
    ref: v1.0
    commit: 0123456789abcdef0123456789abcdef01234567
  "1.5":
    ref: v1.5
    archs: ["8.0"]
  "2.1.post1":
    ref: v2.1.post1
  main:
    ref: main
    source_version: "3.0.dev0"
default_version: "1.0"
''')
assert "by_version" in BY_VERSION


def test_a_pin_takes_the_facts_of_the_first_range_that_holds_it(tmp_path):
    r = load_recipe_file(write(tmp_path, BY_VERSION))
    one = r.versions["1.0"]
    assert str(one.archs) == "8.0;9.0" and dict(one.emits) == {"9.0": "9.0a"}
    assert one.ref == "v1.0" and one.commit.startswith("0123") and one.rules_from == "by_version[1] (<2.0,>=1.0)"
    post = r.versions["2.1.post1"]
    assert str(post.archs) == "8.0;9.0;12.0" and str(post.min_cuda_by_arch["12.0"]) == "12.8"
    assert post.source_version == "2.1.post1" and post.notes == "2.x"
    # main says it is 3.0.dev0: a pre-release of 3.0, held by >=2.0 (pre-releases count)
    assert r.versions["main"].rules_from.startswith("by_version[0]") and r.versions["main"].source_version == "3.0.dev0"


def test_a_pins_own_facts_replace_the_ranges_key_by_key(tmp_path):
    r = load_recipe_file(write(tmp_path, BY_VERSION))
    mid = r.versions["1.5"]
    assert str(mid.archs) == "8.0"  # its own
    assert dict(mid.emits) == {"9.0": "9.0a"}  # the range's


def test_facts_for_a_source_the_catalogue_does_not_pin(tmp_path):
    r = load_recipe_file(write(tmp_path, BY_VERSION))
    got = r.facts_for("1.7.3")
    assert got is not None and got.version == "1.7.3" and got.ref == "" and got.commit is None
    assert dict(got.emits) == {"9.0": "9.0a"} and got.rules_from.startswith("by_version[1]")
    assert r.facts_for("2.5+myfork").rules_from.startswith("by_version[0]")  # a local version label
    assert r.facts_for("0.9") is None and r.facts_for("not-a-version") is None


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace('match: ">=2.0"', 'match: "around 2"'), "by_version[0].match: 'around 2' is not a PEP 440"),
    (lambda t: t.replace('match: ">=2.0"', 'match: ""'), "by_version[0].match"),
    (lambda t: t.replace('archs: ["8.0", "9.0", "12.0"]', 'archs: ["8.0", "banana"]'), "by_version[0].archs"),
    (lambda t: t.replace('    notes: "2.x"\n', '    ref: v2\n'), "by_version[0].ref: unknown key"),
    (lambda t: t.replace('    ref: v1.5\n    archs: ["8.0"]\n', '    ref: v1.5\n    archs: []\n'),
     "versions.1.5.archs: list the archs"),
    (lambda t: t.replace('    source_version: "3.0.dev0"\n', '    source_version: "latest"\n'),
     "versions.main.source_version: 'latest' is not a PEP 440 version"),
    (lambda t: t.replace('  main:\n    ref: main\n    source_version: "3.0.dev0"\n', '  main:\n    ref: main\n'),
     "versions.main.archs: list the archs this version supports (and its other facts), or add a by_version range"
     " that holds 'main'"),
    (lambda t: t.replace('"1.0":\n    ref: v1.0', '"0.5":\n    ref: v0.5').replace('default_version: "1.0"', 'default_version: "0.5"'),
     "versions.0.5.archs: list the archs this version supports (and its other facts), or add a by_version range that"
     " holds 0.5 (the ranges: >=2.0; <2.0,>=1.0)"),
])
def test_broken_ranges_and_pins_name_file_and_key(tmp_path, edit, expected):
    with pytest.raises(RecipeError) as info:
        load_recipe_file(write(tmp_path, edit(BY_VERSION)))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_by_version_validates_against_the_schema(tmp_path):
    schema = json.loads((Path(recipe_facts.__file__).parents[1] / "resources" / "recipe.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(BY_VERSION), schema)
    bad = yaml.safe_load(BY_VERSION)
    del bad["by_version"][0]["match"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


# --------------------------------------------------------------------------------------------
# cxx_std and by_torch: the C++ standard a build hard-codes, and facts for some torch releases only


PATCH_TEXT = "--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-x = 17\n+x = 20\n"


def test_by_torch_reads_patches_env_and_standard(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "std.patch").write_text(PATCH_TEXT)
    r = Reader("demo.yaml", {"archs": ["9.0"], "cxx_std": 17, "by_torch": [
        {"match": ">=2.12", "patches": [{"file": "std.patch", "reason": "C++20"}], "env": {"X": "1"}, "cxx_std": 20}]},
        "versions.1.0")
    v = recipe_facts.version_facts(r, "demo.yaml", tmp_path, KNOB, "1.0")
    assert v.cxx_std == 17 and v.patches == () and len(v.by_torch) == 1
    facts = v.by_torch[0]
    assert facts.match.text == ">= 2.12" and [p.name for p in facts.patches] == ["std.patch"]
    assert facts.env == {"X": "1"} and facts.cxx_std == 20


@pytest.mark.parametrize("entry, where", [
    ({"match": "2.12", "cxx_std": 20}, r"by_torch\[0\].match: .* is not a version range"),
    ({"match": "", "cxx_std": 20}, r"by_torch\[0\].match: expected a version range"),
    ({"cxx_std": 20}, r"by_torch\[0\].match: expected a version range"),
    ({"match": ">=2.12"}, r"by_torch\[0\]: give what changes for that torch"),
    ({"match": ">=2.12", "cxx_std": 18}, r"by_torch\[0\].cxx_std: 18 is not a C\+\+ standard"),
    ({"match": ">=2.12", "patch": []}, r"by_torch\[0\].patch: unknown key"),
    ({"match": ">=2.12", "patches": [{"file": "none.patch", "reason": "r"}]}, r"by_torch\[0\].patches\[0\].file: cannot read"),
])
def test_a_bad_by_torch_entry_is_one_line_naming_its_key(tmp_path, entry, where):
    r = Reader("demo.yaml", {"archs": ["9.0"], "by_torch": [entry]}, "versions.1.0")
    with pytest.raises(RecipeError, match=f"demo.yaml: versions.1.0.{where}") as info:
        recipe_facts.version_facts(r, "demo.yaml", tmp_path, KNOB, "1.0")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", ["17", 17, 20])
def test_cxx_std_takes_a_standard(value):
    assert recipe_facts.cxx_std(Reader("d.yaml", {"cxx_std": value})) == int(value)
    assert recipe_facts.cxx_std(Reader("d.yaml", {})) is None


@pytest.mark.parametrize("value", [True, "c++17", 2017, 1.7])
def test_cxx_std_refuses_anything_else(value):
    with pytest.raises(RecipeError, match="cxx_std: .* is not a C\\+\\+ standard"):
        recipe_facts.cxx_std(Reader("d.yaml", {"cxx_std": value}))


def test_a_recipe_with_a_torch_conditional_patch_validates_and_loads(tmp_path):
    text = GOOD.replace('''    archs: ["8.0", "9.0"]
''', '''    archs: ["8.0", "9.0"]
    cxx_std: 17
    by_torch:
      - match: ">=2.12"
        patches:
          - {file: std.patch, reason: "torch >= 2.12 builds as C++20"}
        cxx_std: 20
''', 1)
    path = write(tmp_path, text)
    (tmp_path / "patches").mkdir(exist_ok=True)
    (tmp_path / "patches" / "std.patch").write_text(PATCH_TEXT)
    schema = json.loads((Path(__file__).resolve().parents[2] / "imagegen" / "resources" / "recipe.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(text))
    v = next(iter(load_recipe_file(path).versions.values()))
    assert v.cxx_std == 17 and [p.name for p in v.by_torch[0].patches] == ["std.patch"]
