"""imagegen/resources/recipe.schema.json: the recipe format for users' editors, and the source of the
loader's allowed keys. Checked with a real JSON Schema validator (PyPI jsonschema): every catalogue
recipe and the test fixtures' recipes validate; the loader refuses what the schema refuses."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from imagegen.errors import RecipeError
from imagegen.model import recipe_file, recipe_reader

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "imagegen" / "resources" / "recipe.schema.json").read_text())
RECIPE_FILES = sorted((ROOT / "imagegen" / "resources" / "recipes").glob("*.yaml")) \
    + sorted((ROOT / "tests" / "fixtures").glob("*/*.yaml"))


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_recipe_validates_against_the_schema(path):
    jsonschema.Draft202012Validator(SCHEMA).validate(yaml.safe_load(path.read_text()))


def test_the_loaders_keys_are_the_schemas():
    assert recipe_reader.TOP_KEYS == tuple(SCHEMA["properties"])
    assert recipe_reader.VERSION_KEYS == tuple(SCHEMA["$defs"]["version"]["properties"])
    assert recipe_reader.BUILD_KEYS == tuple(SCHEMA["$defs"]["build"]["properties"])
    assert recipe_reader.ARCH_KEYS == tuple(SCHEMA["$defs"]["arch"]["properties"])


@pytest.mark.parametrize("edit, key", [
    (lambda d: d.update(colour="blue"), "colour"),
    (lambda d: d["build"].update(memory_per_thread=4), "build.memory_per_thread"),
    (lambda d: next(iter(d["versions"].values())).update(comit="abc"), "comit"),
    (lambda d: d["smoke"].update(import_=["x"]), "smoke.import_"),
])
def test_an_unknown_key_is_refused_by_both(tmp_path, edit, key):
    data = yaml.safe_load((ROOT / "imagegen" / "resources" / "recipes" / "causal-conv1d.yaml").read_text())
    edit(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(data)
    path = tmp_path / "causal-conv1d.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError) as info:
        recipe_file.load_recipe_file(path)
    assert key.split(".")[-1] in str(info.value)
