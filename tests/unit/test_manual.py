"""The manual's reference pages say what the code takes: docs/reference/configuration.md has one section
per key the config loader accepts (and none it refuses) and states the default policy of
resources/defaults.yaml; docs/reference/recipe-format.md has one section per top-level key of
recipe.schema.json, names every key of its main tables, and its example is a recipe the real loader
takes. Every page of the manual is linked from README.md or another page, and its relative links lead
to files that exist."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from imagegen.errors import ConfigError
from imagegen.model.catalogue import builtin_recipe_dir, load_catalogue
from imagegen.plan.config import load_config
from imagegen.plan.matrix import defaults

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG_PAGE = DOCS / "reference" / "configuration.md"
RECIPE_PAGE = DOCS / "reference" / "recipe-format.md"
SCHEMA = json.loads((ROOT / "imagegen" / "resources" / "recipe.schema.json").read_text())


def _known_keys(tmp_path: Path, toml: str) -> set[str]:
    """The keys the loader accepts, as its refusal of an unknown one lists them."""
    path = tmp_path / "imagegen.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    m = re.search(r"unknown key \(known: ([^)]*)\)", str(info.value))
    assert m, str(info.value)
    return set(m.group(1).split(", "))


def _headings(text: str, level: str = "###") -> set[str]:
    return set(re.findall(rf"^{level} `([^`]+)`$", text, re.M))


def test_every_config_key_has_a_section_and_no_other(tmp_path):
    known = _known_keys(tmp_path, "[tool.imagegen]\nno-such-key = 1\n")
    assert {"out", "matrix", "registry"} <= known
    page = CONFIG_PAGE.read_text()
    assert _headings(page.split("## Keys of", 1)[1].split("\n## ", 1)[0]) == known


def test_every_matrix_key_is_in_its_table(tmp_path):
    known = _known_keys(tmp_path, "[tool.imagegen.matrix]\nno-such-key = 1\n")
    page = CONFIG_PAGE.read_text()
    section = page.split("### `matrix`", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `([a-z-]+)` \|", section, re.M)) == known


def test_the_config_example_loads(tmp_path):
    (example,) = re.findall(r"```toml\n(.*?)```", CONFIG_PAGE.read_text(), re.S)
    path = tmp_path / "pyproject.toml"
    path.write_text(example)
    config = load_config(path)
    assert config.registry == "ghcr.io/myteam" and config.matrix.torch == ("2.8", "2.9")


def _default_policy_paragraph() -> str:
    text = CONFIG_PAGE.read_text(encoding="utf-8")
    start = text.index("**One default for every command.**")
    return " ".join(text[start:text.index("\n\n", start)].split())


def test_the_default_policy_is_defaults_yaml():
    d = defaults()
    paragraph = _default_policy_paragraph()
    assert f"Python {d['python']} " in paragraph
    assert f"flavor `{d['flavor']}` (else `{' or '.join(d['flavor_fallbacks'])}`" in paragraph
    assert f"archs `{d['arch']}`" in paragraph


def test_the_default_cell_today_is_what_render_picks(tmp_path, monkeypatch, capsys):
    """The paragraph's example cell (`render sage --arch 12.0+PTX` ... torch X cuY on the Z flavor today)."""
    from imagegen import cli
    paragraph = _default_policy_paragraph()
    m = re.search(r"`render (\S+) --arch (\S+)`.*?\(torch (\S+) (cu\d+) on the (\w+) flavor today\)", paragraph)
    assert m, "the paragraph's example cell moved: update this test's pattern"
    recipe, arch, torch, cuda, flavor = m.groups()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", recipe, "--arch", arch, "-o", "Dockerfile"]) == 0
    err = capsys.readouterr().err
    assert f" torch {torch} {cuda} " in err and f"[{flavor}]" in err, err


def test_every_top_level_recipe_key_has_a_section():
    page = RECIPE_PAGE.read_text()
    assert _headings(page.split("## Top-level keys", 1)[1]) == set(SCHEMA["properties"])
    required = re.search(r"^Required: (.*)\.$", page, re.M).group(1)
    assert set(re.findall(r"`([a-z_]+)`", required)) == set(SCHEMA["required"])


@pytest.mark.parametrize("table", ["source", "arch", "build", "smoke", "version", "torch_facts", "sdist",
                                   "patch", "obsolete_patch", "extension"])
def test_every_key_of_the_main_tables_is_named(table):
    page = RECIPE_PAGE.read_text()
    missing = [k for k in SCHEMA["$defs"][table]["properties"] if f"`{k}`" not in page]
    assert not missing, f"{table}: {missing} not on docs/reference/recipe-format.md"


def test_the_recipe_example_is_a_recipe_the_loader_takes(tmp_path):
    (example,) = re.findall(r"```yaml\n(schema: 1\n.*?)```", RECIPE_PAGE.read_text(), re.S)
    doc = yaml.safe_load(example)
    jsonschema.validate(doc, SCHEMA)
    folder = tmp_path / "recipes"
    (folder / "patches").mkdir(parents=True)
    doc["name"], doc["aliases"] = "example-conv1d", []
    (folder / "example-conv1d.yaml").write_text(yaml.safe_dump(doc))
    patch = "causal-conv1d-arch-list.patch"
    shutil.copy(next(builtin_recipe_dir().rglob(patch)), folder / "patches" / patch)
    recipe = load_catalogue((folder,)).get("example-conv1d")
    assert set(recipe.versions) == {"1.7.0", "1.6.1"}


MANUAL = sorted(p for p in DOCS.rglob("*.md") if "records" not in p.relative_to(DOCS).parts)


def _links(path: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", path.read_text()) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", [ROOT / "README.md", *MANUAL], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_lead_to_files(page):
    broken = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", dest.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
            if anchor not in slugs:
                broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_every_manual_page_is_linked():
    linked = set()
    for page in [ROOT / "README.md", *MANUAL]:
        linked |= {(page.parent / t.partition("#")[0]).resolve() for t in _links(page) if t.partition("#")[0]}
    assert not [p for p in MANUAL if p.resolve() not in linked]
