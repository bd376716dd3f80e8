"""Tests for imagegen.plan.request: a recipe at the version asked, the matrix a command's options ask for
(recipes named several ways once, sources, the config's recipes, every recipe), the plan of it (each cell
once, locked bases pinned), one target per cell, and the cells to build."""

from __future__ import annotations

import dataclasses

import pytest

from imagegen.commands import common
from imagegen.errors import NothingToDoError, RecipeError, UsageError
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import BUILDABLE
from imagegen.plan import request
from imagegen.plan.config import Config, Matrix
from imagegen.plan.matrix import defaults
from tests.unit.command_helpers import CELL, TINY, parse


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no project config or lock file of the checkout is found


@pytest.fixture(scope="module")
def cat():
    return load_catalogue()


def planned(args):
    return request.planned(common.resolved(args, Config()), load_catalogue(), common.lock(args))


def test_resolve_needs_a_recipe_or_a_source(cat):
    with pytest.raises(UsageError, match="name a recipe .* or give --source PATH"):
        request.recipe_at(cat, None, None, None)
    with pytest.raises(RecipeError, match="unknown recipe 'nosuch'"):
        request.recipe_at(cat, "nosuch", None, None)


def test_resolve_takes_aliases_versions_paths_and_the_users_env(cat):
    recipe, version = request.recipe_at(cat, "fa2", None, "main", env={"FLASH_ATTENTION_DISABLE_BACKWARD": "TRUE"})
    assert (recipe.name, version.version) == ("flash-attn", "main")
    assert version.env["FLASH_ATTENTION_DISABLE_BACKWARD"] == "TRUE"
    assert request.recipe_at(cat, "fa2", None, None)[1].version == recipe.default_version
    # A name that looks like a path is a local project, like --source.
    by_name = request.recipe_at(cat, str(TINY), None, None)
    by_source = request.recipe_at(cat, None, TINY, None)
    assert by_name[0].name == by_source[0].name == "tiny-kernel" and by_name[0].source_kind == "local"


def test_matrix_builds_a_recipe_named_several_ways_once_and_each_arch_list_once(cat):
    m = request.matrix(common.resolved(parse("plan", "sage", "SAGE", "sageattention", "--arch", "9.0", "--arch", "sm_90",
                            "--arch", "8.0;9.0", "--torch", "2.8"), Config()), cat)
    assert [r.name for r, _ in m.recipes] == ["sageattention"]
    assert [str(a) for a in m.archs] == ["9.0", "8.0;9.0"] and m.torch == ["2.8"]


def test_matrix_recipes_come_from_the_flags_then_source_then_config_then_the_catalogue(cat):
    assert [r.name for r, _ in request.matrix(common.resolved(parse("plan", "--source", TINY), Config()), cat).recipes] == ["tiny-kernel"]
    config = Config(matrix=Matrix(recipes=("fa2",)))
    assert [r.name for r, _ in request.matrix(common.resolved(parse("plan"), config), cat).recipes] == ["flash-attn"]
    assert [r.name for r, _ in request.matrix(common.resolved(parse("plan", "natten"), config), cat).recipes] == ["natten"]
    everything = request.matrix(common.resolved(parse("plan"), Config()), cat)
    assert sorted(r.name for r, _ in everything.recipes) == sorted(cat.names())
    # A name with --source is that recipe from that tree (test_a_recipe_name_with_a_source_tree_is_one_cell):
    # a tree of another project is refused, not planned beside the catalogue's cell.
    with pytest.raises(UsageError, match="is the project tiny-kernel, not sageattention"):
        request.matrix(common.resolved(parse("plan", "sage", "--source", TINY), Config()), cat)


def _sage_tree(root, name_line='name="sageattention",'):
    """A copy of SageAttention 2.2.0 as a user has it (a fork, an unpacked sdist): its setup.py only."""
    root.mkdir()
    (root / "setup.py").write_text(f'from setuptools import setup\nsetup({name_line} version="2.2.0")\n')
    return root


@pytest.mark.parametrize("name_line", ['name="sageattention",', "name=NAME,"], ids=["named", "name-unread"])
def test_a_recipe_name_with_a_source_tree_is_one_cell_the_trees(tmp_path, cat, name_line):
    tree = _sage_tree(tmp_path / "my-sage-fork", name_line)
    args = parse("plan", "sage", "--source", tree, *CELL)
    m = request.matrix(common.resolved(args, Config()), cat)
    [(recipe, version)] = m.recipes
    assert (recipe.name, recipe.source_kind, recipe.source_path) == ("sageattention", "local", tree.resolve())
    assert version.version == "2.2.0-local" and version.patches  # the recipe's knowledge, its patches too
    [cell] = planned(args).cells
    assert cell.status == BUILDABLE and cell.recipe.source_path == tree.resolve()


@pytest.mark.parametrize("argv", [["sage", "fa2", "--source", "{tree}"], ["sage", "--source", "{tree}", "--source", str(TINY)]])
def test_names_and_trees_that_do_not_pair_are_refused_saying_which_to_give(tmp_path, cat, argv):
    tree = _sage_tree(tmp_path / "fork")
    with pytest.raises(UsageError, match="give one of each .NAME --source TREE., or the trees alone"):
        request.matrix(common.resolved(parse("plan", *[a.format(tree=tree) for a in argv]), Config()), cat)


def test_planned_has_each_cell_once_and_pins_locked_bases(tmp_path, cat):
    args = parse("plan", "sage", "SAGE", "--torch", "2.8", "--torch", "2.8.0", "--cuda", "12.8", "--cuda", "cu128",
                 "--python", "3.12", "--arch", "9.0")
    plan = request.planned(common.resolved(args, Config()), cat, common.lock(args))
    assert [c.name for c in plan.cells] == ["sage-2_2_0-torch2_8-cu128-py312"]
    base = plan.cells[0].base.ref
    pinned = base.split("@")[0] + "@sha256:" + "ab" * 32
    (tmp_path / "imagegen.lock").write_text('{"schema": 1, "base_images": {"%s": "%s"}}' % (base, pinned))
    assert request.planned(common.resolved(args, Config()), cat, common.lock(args)).cells[0].base.ref == pinned


def test_one_target_per_cell_refuses_two_arch_lists_of_one_cell_and_says_how_to_merge(cat):
    args = parse("bake", "sage", *CELL[:6], "--arch", "8.0", "--arch", "9.0")
    plan = request.planned(common.resolved(args, Config()), cat, common.lock(args))
    assert len(plan.buildable) == 2
    with pytest.raises(UsageError, match="two arch lists \\(8.0 and 9.0\\).*--arch '8.0;9.0'"):
        request.one_target_per_cell(plan)
    one = request.planned(common.resolved(parse("bake", "sage", *CELL), Config()), cat)
    assert request.one_target_per_cell(one) is one


def test_buildable_keeps_one_cell_per_image_when_arch_free_and_reports_rejected_cells(cat, capsys):
    args = parse("push", "sage", *CELL[:6], "--arch", "8.0", "--arch", "9.0")
    plan = request.buildable(planned(args), arch_free=True)  # a builder image has no arch
    assert [(c.name, str(c.archs)) for c in plan.buildable] == [("sage-2_2_0-torch2_8-cu128-py312", "8.0")]
    with pytest.raises(UsageError, match="two arch lists"):
        request.buildable(planned(args))
    plan = request.buildable(planned(parse("pull", "sage", "--torch", "2.8", "--cuda", "12.6", "--cuda", "12.8", "--python",
                                  "3.12", "--arch", "12.0")))
    assert [c.status for c in plan.buildable] == [BUILDABLE] and len(plan.rejected) == 1
    err = capsys.readouterr().err
    assert err.startswith("[sage-2_2_0-torch2_8-cu126-py312] rejected: sm_120 needs CUDA >= 12.8")
    assert err.count("\n") == 1
    with pytest.raises(NothingToDoError, match="no cell of this matrix can build"):
        request.buildable(planned(parse("pull", "sage", *CELL[:6], "--arch", "7.0")))


def one_cell(cat, *argv, **changes):
    opts = dataclasses.replace(common.resolved(parse("render", "sage", *argv), Config()), **changes)
    recipe, version = request.recipe_at(cat, "sage", None, None)
    return request.one_cell(opts, recipe, version)


def test_one_cell_is_renders_cell_for_the_arch_list_and_the_default_policy(cat):
    cell = one_cell(cat, "--arch", "12.0+PTX")
    assert cell.buildable and str(cell.archs) == "12.0+PTX" and cell.recipe.name == "sageattention"
    assert one_cell(cat, "--arch", "9.0", "--torch", "2.8", "--cuda", "12.8").name == "sage-2_2_0-torch2_8-cu128-py312"
    assert one_cell(cat, "--arch", "9.0", "--platform", "linux/arm64").platform == "linux/arm64"


@pytest.mark.parametrize("argv, changes, error, says", [
    (["--arch", "7.0"], {}, "CompatError", "sm_70 was dropped in CUDA 13.0"),
    (["--arch", "9.0"], {"platforms": ("linux/amd64", "linux/arm64")}, "UsageError", "give one --platform"),
])
def test_one_cell_says_in_one_line_why_there_is_none(cat, argv, changes, error, says):
    with pytest.raises(Exception) as info:
        one_cell(cat, *argv, **changes)
    assert type(info.value).__name__ == error and says in str(info.value) and "\n" not in str(info.value)


def test_one_arch_list_is_the_flag_else_the_configs_else_the_default():
    assert str(request.one_arch_list(common.resolved(parse("render", "sage", "--arch", "9.0"), Config()))) == "9.0"
    configured = Config(matrix=Matrix(arch="8.0;12.0"))
    assert str(request.one_arch_list(common.resolved(parse("render", "sage"), configured))) == "8.0;12.0"
    assert str(request.one_arch_list(common.resolved(parse("render", "sage"), Config()))) == defaults()["arch"]


def test_a_native_builds_arch_list_falls_back_to_the_hosts_gpus_before_the_default():
    opts = common.resolved(parse("render", "sage"), Config())
    assert str(request.one_arch_list(opts, gpus=["9.0", "12.0"])) == "9.0;12.0"
    assert str(request.one_arch_list(opts, gpus=[])) == defaults()["arch"]
    given = common.resolved(parse("render", "sage", "--arch", "8.0"), Config())
    assert str(request.one_arch_list(given, gpus=["9.0"])) == "8.0"  # --arch wins over the GPUs
