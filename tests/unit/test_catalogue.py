"""Tests for imagegen.model.catalogue: the built-in recipes, extra recipe directories, lookups by name and alias."""

from __future__ import annotations

import re
import subprocess
import textwrap
import types
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.errors import RecipeError
from imagegen.model.catalogue import Catalogue, builtin_recipe_dir, load_catalogue
from imagegen.model.recipe_file import load_recipe_file

BUILTIN = ["block-sparse-attn", "causal-conv1d", "flash-attn", "flash-attn-3", "mamba-ssm", "natten",
           "sageattention", "xformers"]

RECIPE = textwrap.dedent("""\
    schema: 1
    name: {name}
    aliases: {aliases}
    description: "{description}"
    source:
      git: https://github.com/example/demo.git
    versions:
      "1.0":
        ref: v1.0
        commit: 0123456789abcdef0123456789abcdef01234567
        archs: ["8.0", "9.0"]
    arch:
      env: DEMO_ARCHS
      style: numeric
      ptx: none
    build:
      requires: [setuptools]
    smoke:
      imports: [demo]
    """)


def write_recipe(d: Path, name: str, aliases: tuple[str, ...] = (), description: str = "a user recipe",
                 file: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / (file or f"{name}.yaml")
    path.write_text(RECIPE.format(name=name, aliases="[" + ", ".join(aliases) + "]", description=description),
                    encoding="utf-8")
    return path


def unknown(cat: Catalogue, name: str) -> str:
    with pytest.raises(RecipeError) as info:
        cat.get(name)
    assert info.value.exit_code == 2
    message = str(info.value)
    assert "\n" not in message and message.isprintable()
    return message


# --------------------------------------------------------------------------------------------
# The built-in catalogue
# --------------------------------------------------------------------------------------------


def test_builtin_catalogue_has_every_packaged_recipe() -> None:
    cat = load_catalogue()
    assert cat.names() == BUILTIN
    files = sorted(builtin_recipe_dir().glob("*.yaml"))
    assert len(files) == len(BUILTIN)
    for path in files:
        assert cat.get(path.stem).name == path.stem


def test_builtin_recipes_are_loaded_once_but_each_catalogue_is_new(tmp_path: Path) -> None:
    first, second = load_catalogue(), load_catalogue()
    assert first is not second
    assert first.get("xformers") is second.get("xformers")
    # a user directory of one load does not leak into the next
    write_recipe(tmp_path / "recipes", "demo")
    assert "demo" in load_catalogue((tmp_path / "recipes",)).names()
    assert "demo" not in load_catalogue().names()


@pytest.mark.parametrize(
    ("asked", "name"),
    [("flash-attn", "flash-attn"), ("fa2", "flash-attn"), ("flash-attention", "flash-attn"), ("fa3", "flash-attn-3"),
     ("sage", "sageattention"), ("sageattn", "sageattention"), ("bsa", "block-sparse-attn"), ("mamba", "mamba-ssm"),
     ("xf", "xformers"), ("neighborhood-attention", "natten")],
)
def test_lookup_by_name_or_alias(asked: str, name: str) -> None:
    assert load_catalogue().get(asked).name == name


@pytest.mark.parametrize(("asked", "name"), [("Flash_Attn", "flash-attn"), (" SAGE ", "sageattention"),
                                             ("causal_conv1d", "causal-conv1d"), ("MAMBA_SSM", "mamba-ssm"),
                                             ("Block_Sparse_Attention", "block-sparse-attn")])
def test_lookup_ignores_case_spaces_and_underscores(asked: str, name: str) -> None:
    assert load_catalogue().get(asked).name == name


# --------------------------------------------------------------------------------------------
# Unknown names
# --------------------------------------------------------------------------------------------


def test_unknown_recipe_message_lists_the_known_and_says_what_to_do() -> None:
    message = unknown(load_catalogue(), "flash-atn")
    assert message == (
        "unknown recipe 'flash-atn': known recipes are " + ", ".join(BUILTIN)
        + " (or give a path to a local project, or add a recipe directory with --recipe-dir)"
    )


@pytest.mark.parametrize("asked", ["", "   ", "sage\x1b[31m", "fa2\u202e", "x" * 500, "flash attn"])
def test_unknown_recipe_names_are_quoted_escaped_and_bounded(asked: str) -> None:
    message = unknown(load_catalogue(), asked)
    assert message.startswith("unknown recipe ")
    assert "\x1b" not in message and "\u202e" not in message
    assert len(message) <= RecipeError.max_chars  # type: ignore[operator]
    assert "known recipes are block-sparse-attn" in message


def test_unknown_recipe_message_with_many_recipes_keeps_its_hint(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    for i in range(17):
        write_recipe(d, f"user-package-{i:02d}")
    cat = load_catalogue((d,))
    assert len(cat.names()) == 25
    message = unknown(cat, "nope")
    shown = message.split("known recipes are ", 1)[1].split(" and ", 1)[0].split(", ")
    assert f"and {25 - len(shown)} more (imagegen recipes lists them)" in message
    assert message.endswith("add a recipe directory with --recipe-dir)")


def test_unknown_recipe_lists_at_most_20_names(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    for i in range(17):
        write_recipe(d, f"u{i:02d}")
    message = unknown(load_catalogue((d,)), "nope")
    # sorted: 7 built-ins, u00..u12 (20 names); u13..u16 and xformers are the 5 more
    assert "u11, u12 and 5 more (imagegen recipes lists them)" in message
    assert "u13" not in message and "xformers" not in message


# --------------------------------------------------------------------------------------------
# Extra recipe directories
# --------------------------------------------------------------------------------------------


def test_extra_dir_adds_recipes_with_their_aliases(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    write_recipe(d, "demo", aliases=("dm", "demo-kernels"))
    cat = load_catalogue((d,))
    assert cat.names() == sorted([*BUILTIN, "demo"])
    recipe = cat.get("demo")
    assert recipe.aliases == ("dm", "demo-kernels")
    assert cat.get("DM") is recipe and cat.get("demo_kernels") is recipe
    assert cat.get("flash-attn").name == "flash-attn"  # built-ins stay


def test_user_recipe_with_a_builtin_name_replaces_it(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    write_recipe(d, "xformers", description="my patched xformers")
    cat = load_catalogue((d,))
    assert cat.names() == BUILTIN
    assert cat.get("xformers").description == "my patched xformers"
    assert cat.get("xf").description == "my patched xformers"  # the built-in's alias follows the name
    assert load_catalogue().get("xformers").description != "my patched xformers"


def test_later_directories_win(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_recipe(first, "demo", description="first")
    write_recipe(second, "demo", description="second")
    assert load_catalogue((first, second)).get("demo").description == "second"
    assert load_catalogue((second, first)).get("demo").description == "first"


def test_only_yaml_and_yml_files_are_read(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    write_recipe(d, "from-yaml")
    write_recipe(d, "from-yml", file="other.yml")
    (d / "README.md").write_text("not a recipe: [", encoding="utf-8")
    (d / "notes.json").write_text("{", encoding="utf-8")
    (d / "recipe.yaml.bak").write_text("name: [", encoding="utf-8")
    (d / "sub").mkdir()
    write_recipe(d / "sub", "nested")  # subdirectories are not searched
    names = load_catalogue((d,)).names()
    assert {"from-yaml", "from-yml"} <= set(names)
    assert "nested" not in names


def test_a_yml_file_is_read_after_the_yaml_files(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    write_recipe(d, "demo", description="from b.yaml", file="b.yaml")
    write_recipe(d, "demo", description="from a.yml", file="a.yml")
    assert load_catalogue((d,)).get("demo").description == "from a.yml"


def test_an_empty_recipe_directory_adds_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert load_catalogue((tmp_path / "empty",)).names() == BUILTIN


def test_broken_recipe_file_names_the_file(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    write_recipe(d, "demo")
    (d / "zz-broken.yaml").write_text("name: [\n", encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_catalogue((d,))
    assert str(info.value).startswith(f"{d / 'zz-broken.yaml'}: line 2: not valid YAML")


def test_a_recipe_name_the_loader_refuses(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    write_recipe(d, "Bad_Name")
    with pytest.raises(RecipeError, match="name"):
        load_catalogue((d,))


@pytest.mark.parametrize(
    ("make", "reason"),
    [("missing", "does not exist"), ("a file", "is not a directory"), ("NUL byte", ": not a usable path"),
     ("300-char name", ": file name too long")],
)
def test_bad_recipe_directory(tmp_path: Path, make: str, reason: str) -> None:
    d = {"missing": tmp_path / "nope", "a file": tmp_path / "f.yaml", "NUL byte": tmp_path / "a\0b",
         "300-char name": tmp_path / ("d" * 300)}[make]
    if make == "a file":
        d.write_text("", encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_catalogue((d,))
    message = str(info.value)
    assert message.startswith("recipe directory ") and reason in message
    assert "\x00" not in message and info.value.exit_code == 2


def test_catalogue_add_and_get_directly(tmp_path: Path) -> None:
    cat = Catalogue()
    assert cat.names() == []
    recipe = load_recipe_file(write_recipe(tmp_path / "recipes", "demo", aliases=("dm",)))
    cat.add(recipe)
    assert cat.names() == ["demo"]
    assert cat.aliases == {"dm": "demo"}
    assert cat.get("Dm") is recipe
    assert unknown(cat, "sage") == (
        "unknown recipe 'sage': known recipes are demo"
        " (or give a path to a local project, or add a recipe directory with --recipe-dir)"
    )


def test_a_user_recipe_named_like_a_builtin_alias_is_reachable(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    write_recipe(d, "sage", description="my own sage")
    cat = load_catalogue((d,))
    assert "sage" in cat.names()
    assert cat.get("sage").description == "my own sage"


# --------------------------------------------------------------------------------------------
# Issue 37: the patches that make a build follow torch's C++ standard (by_torch >= 2.12). Each was
# checked with `git apply --check` against the files it touches at every commit (or sdist) its recipe
# pins (after that version's own patches); here each applies to files made of exactly the lines its
# hunks expect, and the standard it computes is C++20 from torch 2.12 on and C++17 before.

STD_PATCHES = sorted((builtin_recipe_dir() / "patches").glob("*-cxx-std-from-torch.patch"))


def _pre_images(patch: str) -> dict[str, str]:
    """Per file the patch touches, the lines each hunk expects (context and removed lines) at its line
    numbers, filler between."""
    out: dict[str, str] = {}
    for section in re.split(r"(?m)^(?=diff --git )", patch)[1:]:
        name = re.search(r"(?m)^\+\+\+ b/(.+)$", section).group(1)
        lines: list[str] = []
        for hunk in re.split(r"(?m)^(?=@@ )", section.split("\n+++ ", 1)[1])[1:]:
            start = int(re.match(r"@@ -(\d+)", hunk).group(1))
            lines += [f"# upstream line {n}" for n in range(len(lines) + 1, start)]
            body = hunk.split("\n", 1)[1].rstrip("\n").split("\n")
            lines += [line[1:] for line in body if line[:1] in (" ", "-")]
        out[name] = "\n".join(lines) + "\n"
    return out


def test_every_std_patch_is_used_by_a_recipe_only_for_torch_2_12_and_newer():
    used = {p.name: f.match.text for r in (load_catalogue().get(n) for n in load_catalogue().names())
            for v in r.versions.values() for f in v.by_torch for p in f.patches}
    assert {p.name for p in STD_PATCHES} == set(used) and len(STD_PATCHES) == 13
    assert set(used.values()) == {">= 2.12"}


@pytest.mark.parametrize("patch", STD_PATCHES, ids=lambda p: p.name)
def test_a_std_patch_applies_to_its_lines_and_picks_the_standard_from_torch(tmp_path, patch):
    text = patch.read_text()
    for name, pre in _pre_images(text).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(pre)
    for flags in (["--check"], []):
        proc = subprocess.run(["git", "apply", *flags, str(patch)], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    added = [line for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert not any("c++17" in line for line in added if "cxx_std = " not in line)  # each flag follows cxx_std
    # every -std=c++17 / /std:c++17 removed comes back as the standard computed (CMake: ${CXX_STD}, which
    # setup.py then sets with -DCXX_STD={cxx_std})
    follows = [line for line in added if ("{cxx_std}" in line or "${CXX_STD}" in line) and "-DCXX_STD=" not in line]
    removed = sum(line.count("c++17") for line in text.splitlines() if line.startswith("-"))
    # a patch that only adds the rule changes nothing (causal-conv1d's once did: its -std was HIP-only)
    assert removed >= 1 and len(follows) == removed
    assert ("-DCXX_STD={cxx_std}" in text) == ("${CXX_STD}" in text)
    setup = next(tmp_path.glob("**/setup.py"))
    rule = next(line.strip() for line in setup.read_text().splitlines() if line.strip().startswith("cxx_std = "))
    for release, want in (("2.11.0+cu130", "17"), ("2.12.1", "20"), ("2.14.1+cu132", "20"), ("3.0.0", "20")):
        scope = {"parse": Version, "torch": types.SimpleNamespace(__version__=release),
                 "torch_ver": [int(x) for x in release.split(".")[:2]]}  # natten's setup.py has it
        exec(rule, scope)
        assert scope["cxx_std"].removeprefix("c++") == want, (release, rule)
