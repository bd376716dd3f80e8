"""Tests for imagegen.model.layout: the wheelhouse layout template (issue 18 item 5, seed 001's
fa<v>/torch<s>/cu<x>/), checked before use, applied by --layout and the config's `layout` to every
cell's folder, the bake outputs and the native build's."""

from __future__ import annotations

import json

import pytest

from imagegen.cli import main
from imagegen.plan.config import load_config
from imagegen.errors import ConfigError, UsageError
from imagegen.model.layout import DEFAULT_LAYOUT, LAYOUT_FIELDS, validate_layout

CELL = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]


@pytest.mark.parametrize("good", [DEFAULT_LAYOUT, "fa{version}/torch{torch}/{cuda}", "{short}/{py}/{cuda}",
                                  "wheels/{package}_{python}"])
def test_good_layouts_are_kept(good):
    assert validate_layout(good) == good


@pytest.mark.parametrize("bad, words", [
    ("/abs/{package}", "relative folder"), ("a/../{package}", "relative folder"), ("a//b", "relative folder"),
    ("{nope}", "unknown field {nope}"), ("{}", "unknown field"), ("{0}", "unknown field {0}"),
    ("{version!r}", "use letters"), ("{version:>9}", "use letters"), ("a b", "use letters"), ("$(id)", "use letters"),
    ("{version", "unbalanced"), ("./", "relative folder"), ("./{package}", "relative folder"),
    ("x" * 201, "use letters"),
])
def test_bad_layouts_are_one_line(bad, words):
    with pytest.raises(UsageError, match=words.replace("{", r"\{").replace("(", r"\(")):
        validate_layout(bad)


def test_every_field_is_filled(capsys):
    layout = "/".join("{" + f + "}" for f in LAYOUT_FIELDS)
    assert main(["plan", "sage", *CELL, "--layout", layout, "--json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["wheel_dir"] == "sageattention/sage/2.2.0/2.8/cu128/3.12/312"


def test_seed_001_layout_reaches_the_bake_outputs(tmp_path, monkeypatch, capsys):
    from imagegen.render import bakefiles
    from tests.unit import bake_print_stand_in

    monkeypatch.setattr(bakefiles, "print_bake", bake_print_stand_in.print_bake)
    monkeypatch.chdir(tmp_path)
    assert main(["bake", "fa2", "--version", "2.8.2", *CELL, "--layout", "fa{version}/torch{torch}/{cuda}",
                 "-f", "b.json", "--out", "wh"]) == 0
    (target,) = json.loads((tmp_path / "b.json").read_text())["target"].values()
    assert target["output"] == ["type=local,dest=wh/fa2.8.2/torch2.8/cu128"]
    assert main(["plan", "fa2", *CELL, "--layout", "fa{version}/../x"]) == 2
    assert "--layout" in capsys.readouterr().err


def test_the_config_file_sets_it_and_the_flag_wins(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "imagegen.toml"
    cfg.write_text('[tool.imagegen]\nlayout = "team/{short}{version}/{cuda}"\n')
    assert load_config(cfg).layout == "team/{short}{version}/{cuda}"
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "sage", *CELL, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"][0]["wheel_dir"] == "team/sage2.2.0/cu128"
    assert main(["plan", "sage", *CELL, "--json", "--layout", "x/{package}"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"][0]["wheel_dir"] == "x/sageattention"
    cfg.write_text('[tool.imagegen]\nlayout = "../{package}"\n')
    with pytest.raises(ConfigError, match="tool.imagegen.layout"):
        load_config(cfg)


# --------------------------------------------------------------------------------------------
# Flat: '.' or '' (an RTX 5090 user's sage-wheels/*.whl, no cell folders)


@pytest.mark.parametrize("flat", [".", ""])
def test_dot_and_empty_are_the_flat_layout(flat, tmp_path, monkeypatch, capsys):
    from imagegen.render import bakefiles
    from tests.unit import bake_print_stand_in

    assert validate_layout(flat) == "."
    assert main(["plan", "sage", *CELL, "--layout", flat, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"][0]["wheel_dir"] == "."
    monkeypatch.setattr(bakefiles, "print_bake", bake_print_stand_in.print_bake)
    monkeypatch.chdir(tmp_path)
    assert main(["bake", "sage", *CELL, "--layout", flat, "-f", "b.json", "--out", "sage-wheels"]) == 0
    (target,) = json.loads((tmp_path / "b.json").read_text())["target"].values()
    assert target["output"] == ["type=local,dest=sage-wheels"]
    cfg = tmp_path / "imagegen.toml"
    cfg.write_text(f'[tool.imagegen]\nlayout = "{flat}"\n')
    assert load_config(cfg).layout == "."  # an empty one too: not the default
    assert main(["plan", "sage", *CELL, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"][0]["wheel_dir"] == "."


def test_a_flat_wheelhouse_is_built_into_indexed_and_published_with_its_manifest_there(tmp_path):
    import dataclasses

    from imagegen.publish.index import write_index
    from imagegen.publish.upload import publish
    from imagegen.wheelhouse import collect
    from imagegen.wheelhouse.manifest import MANIFEST, in_the_way, verified_wheels
    from tests.unit.executor_fixtures import WHEEL, tiny_cell

    out = tmp_path / "sage-wheels"
    cell = dataclasses.replace(tiny_cell(), layout=".")
    placed = collect.place(out, cell, WHEEL, inputs="flat-test", record={"verify": {"ok": True}})
    assert placed == out / WHEEL.name and sorted(p.name for p in out.iterdir()) == [MANIFEST, WHEEL.name]
    assert in_the_way(out, cell, WHEEL.name) is None
    # The same wheel for other archs would silently replace it: refused, as in a cell folder.
    other = dataclasses.replace(tiny_cell(archs="8.0"), layout=".")
    assert in_the_way(out, other, WHEEL.name) is not None
    [verified] = verified_wheels(out)
    assert verified.path == placed and verified.entry["inputs"] == "flat-test"
    result = write_index(out, say=lambda m: None)
    assert result.wheels == 1
    page = (out / "simple" / "tiny-kernel" / "index.html").read_text()
    assert f'href="../../{WHEEL.name.replace("+", "%2B")}#sha256=' in page
    (dry,) = publish(out, ["hf:octo/sage-wheels"], dry_run=True, offline=True).outcomes
    assert (dry.wheel, dry.status) == (WHEEL.name, "would-upload")
