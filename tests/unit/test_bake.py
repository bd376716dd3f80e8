"""Tests for imagegen.render.bake: one bake target per buildable cell (name, Dockerfile, local output
folder, named contexts, CA secret, IMAGEGEN_-prefixed overrides), groups, and the JSON/HCL forms with
``${``/``%{`` escaped. Pure: that buildx reads these files as meant is tests/integration/test_bake_print.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from imagegen.errors import UnsafeValueError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.source_tree import recipe_from_source_tree
from imagegen.model.cell import MatrixRequest
from imagegen.plan.matrix import expand
from imagegen.render import bake as B
from imagegen.render.dockerfile import SCRIPTS_CONTEXT, builder_files

FIXTURE = Path(__file__).parent.parent / "fixtures" / "tiny_kernel"


def _plan(*names: str, python=("3.12",), arch="9.0"):
    cat = load_catalogue()
    return expand(MatrixRequest(recipes=[(r := cat.get(n), r.version(None)) for n in names], torch=["2.8"],
                                cuda=["12.8"], python=list(python), archs=[parse_arch_list(arch)], flavor="runpod"))


def test_one_target_per_buildable_cell_with_its_own_output_folder(tmp_path):
    plan = _plan("sage", "flash-attn", python=("3.11", "3.12"))
    d = B.build_definition(plan, out_dir="wh", root=tmp_path)
    names = [t.name for t in d.targets]
    assert names == [c.name for c in plan.buildable] and len(names) == 4
    for t in d.targets:
        assert t.output == f"wh/{t.cell.wheel_dir}" and t.dockerfile == f"{t.name}.Dockerfile"
        assert "\nFROM scratch AS wheels\n" in d.dockerfiles[f"dockerfiles/{t.name}.Dockerfile"]
        assert re.fullmatch(r"[A-Za-z0-9_-]+", t.name)
    # the layout is <pkg>-<ver>/torch<X.Y>/cu<XYZ>: the Pythons of one package share a folder (bake
    # merges their exports; the wheels' names differ by their cpXY tag)
    assert sorted({t.output for t in d.targets}) == ["wh/flash-attn-2.8.3/torch2.8/cu128",
                                                     "wh/sageattention-2.2.0/torch2.8/cu128"]


def test_scripts_are_written_beside_the_dockerfiles_unless_a_folder_is_given(tmp_path):
    d = B.build_definition(_plan("sage"), out_dir="wh", root=tmp_path, dockerfiles_dir="df")
    scripts = {k.rsplit("/", 1)[1]: v for k, v in d.dockerfiles.items() if f"/{SCRIPTS_CONTEXT}/" in k}
    assert scripts == builder_files()
    assert d.targets[0].contexts == {SCRIPTS_CONTEXT: f"./df/{SCRIPTS_CONTEXT}"}
    d2 = B.build_definition(_plan("sage"), out_dir="wh", root=tmp_path, scripts="./imagegen/shipped/builder")
    assert not any(SCRIPTS_CONTEXT in k for k in d2.dockerfiles)
    assert d2.targets[0].contexts == {SCRIPTS_CONTEXT: "./imagegen/shipped/builder"}


def test_a_local_source_is_a_named_context_relative_to_the_bake_folder(tmp_path):
    project = tmp_path / "work" / "proj"
    shutil.copytree(FIXTURE, project)
    recipe = recipe_from_source_tree(project)
    plan = expand(MatrixRequest(recipes=[(recipe, recipe.version(None))], torch=["2.11"], cuda=["13.0"],
                                python=["3.11"], archs=[parse_arch_list("9.0")], flavor="pypi"))
    d = B.build_definition(plan, out_dir="wh", root=tmp_path)
    (t,) = d.targets
    assert t.contexts["source"] == "./work/proj"
    assert B.absolute_contexts(t, tmp_path / "df") == {SCRIPTS_CONTEXT: str(tmp_path / "df" / SCRIPTS_CONTEXT),
                                                       "source": str(project)}


def test_groups_per_recipe_and_default(tmp_path):
    d = B.build_definition(_plan("sage", "flash-attn"), out_dir="wh", root=tmp_path)
    groups = d.as_dict()["group"]
    # and one group per recipe version, named after what it holds (two files of two versions keep theirs apart)
    assert sorted(groups) == ["default", "flash-attn", "flash-attn-2_8_3", "sageattention", "sageattention-2_2_0"]
    assert groups["default"]["targets"] == [t.name for t in d.targets]
    assert groups["flash-attn-2_8_3"] == groups["flash-attn"]
    only = d.as_dict(only_recipe="sageattention")
    assert sorted(only["group"]) == ["default", "sageattention", "sageattention-2_2_0"]
    assert list(only["target"]) == only["group"]["default"]["targets"] == groups["sageattention"]["targets"]


def test_overrides_come_only_from_prefixed_variables_and_the_ca_is_a_secret(tmp_path):
    d = B.build_definition(_plan("sage"), out_dir="wh", root=tmp_path).as_dict()
    assert set(d["variable"]) == {*B.VARIABLES, B.CA_VARIABLE}
    assert d["variable"][B.CA_VARIABLE] == {"default": B.CA_DEFAULT}
    (t,) = d["target"].values()
    assert t["args"]["MAX_JOBS"] == '${IMAGEGEN_MAX_JOBS != "" ? IMAGEGEN_MAX_JOBS : null}'
    assert set(t["args"]) == {arg for arg, _ in B.VARIABLES.values()}
    # the CA bundle by path; the compile cache's URL from the bake process's environment (empty: none)
    assert t["secret"] == ["id=pip_cert,src=${IMAGEGEN_PIP_CERT}", "id=imagegen_ccache_remote,env=IMAGEGEN_CCACHE_REMOTE"]
    assert t["target"] == "wheels"


def test_json_escapes_templates_except_imagegens_own_interpolations(tmp_path):
    d = B.build_definition(_plan("sage"), out_dir="wh", root=tmp_path).as_dict()
    (t,) = d["target"].values()
    t["labels"]["x"] = "${HOME} %{ if true }"
    back = json.loads(B.to_json(d))
    (bt,) = back["target"].values()
    assert bt["labels"]["x"] == "$${HOME} %%{ if true }"
    assert bt["secret"] == ["id=pip_cert,src=${IMAGEGEN_PIP_CERT}",  # ours, not escaped
                            "id=imagegen_ccache_remote,env=IMAGEGEN_CCACHE_REMOTE"]
    assert bt["args"]["MAX_JOBS"].startswith("${IMAGEGEN_MAX_JOBS")


def test_hcl_writes_args_raw_and_strings_escaped(tmp_path):
    d = B.build_definition(_plan("sage"), out_dir="wh", root=tmp_path).as_dict()
    (name,) = d["target"]
    d["target"][name]["labels"]["x"] = '${HOME}"\n'
    text = B.to_hcl(d, "line one\n\nline three")
    assert text.startswith("# line one\n#\n# line three\n")
    assert f'target "{name}" {{' in text
    assert '    MAX_JOBS = IMAGEGEN_MAX_JOBS != "" ? IMAGEGEN_MAX_JOBS : null' in text
    assert '"x" = "$${HOME}\\"\\n"' in text or 'x = "$${HOME}\\"\\n"' in text
    assert 'secret = ["id=pip_cert,src=${IMAGEGEN_PIP_CERT}", "id=imagegen_ccache_remote,env=IMAGEGEN_CCACHE_REMOTE"]' in text


@pytest.mark.parametrize("bad", ["a b", "$(id)", "${X}", "out\nRUN id"])
def test_unsafe_folders_are_refused(tmp_path, bad):
    with pytest.raises(UnsafeValueError):
        B.build_definition(_plan("sage"), out_dir=bad, root=tmp_path)
    with pytest.raises(UnsafeValueError):
        B.build_definition(_plan("sage"), out_dir="wh", root=tmp_path, dockerfiles_dir=bad)


def test_escape_template():
    assert B.escape_template("a${b}%{c}$d") == "a$${b}%%{c}$d"


def test_a_fallback_base_image_is_a_target_of_its_own_in_no_group(tmp_path):
    """Issue 34: the manylinux flavor's sameli image, as `imagegen build` would pick it when the primary cannot
    be pulled: its own Dockerfile FROM the fallback, the same output folder, named by labels, in no group."""
    cat = load_catalogue()
    plan = expand(MatrixRequest(recipes=[(r := cat.get("fa2"), r.version(None))], torch=["2.8"], cuda=["12.8"],
                                python=["3.12"], archs=[parse_arch_list("8.0")], flavor="manylinux"))
    assert B.build_definition(plan, out_dir="wh", root=tmp_path).groups["default"] == [plan.cells[0].name]
    d = B.build_definition(plan, out_dir="wh", root=tmp_path, fallback_targets=True)
    primary, fallback = d.targets
    assert fallback.name == f"{primary.name}-fallback" and fallback.fallback_of == primary.name
    assert fallback.output == primary.output and primary.fallbacks == (fallback.name,)
    text = d.dockerfiles[f"dockerfiles/{fallback.name}.Dockerfile"]
    assert "ARG BASE_IMAGE=sameli/manylinux_2_34_x86_64_cuda_12.8\n" in text
    assert "built on the fallback base image sameli/manylinux_2_34_x86_64_cuda_12.8" in text
    assert all(fallback.name not in names for names in d.groups.values())
    targets = d.as_dict()["target"]
    assert targets[primary.name]["labels"] == {"io.imagegen.cell": primary.name,
                                               "io.imagegen.base-image": "pytorch/manylinux2_28-builder:cuda12.8",
                                               "io.imagegen.fallbacks": fallback.name,
                                               "io.imagegen.inputs": primary.inputs,
                                               "io.imagegen.cpu-hours": "4.63",  # fa2's 9.0 (runner sizing)
                                               "io.imagegen.wall-hours": "0.35",
                                               # its builder image below a team's registry (ci github --push-builders)
                                               "io.imagegen.builder": "imagegen-flash-attn:2.8.3-torch2.8-cu128-py312-manylinux"}
    # the primary's inputs hash, as its Dockerfile's label says it (ci github --skip-published reads it)
    assert f'io.imagegen.inputs="{primary.inputs}"' in d.dockerfiles[f"dockerfiles/{primary.name}.Dockerfile"]
    assert targets[fallback.name]["labels"] == {"io.imagegen.cell": primary.name,
                                                "io.imagegen.base-image": "sameli/manylinux_2_34_x86_64_cuda_12.8",
                                                "io.imagegen.builder": targets[primary.name]["labels"]["io.imagegen.builder"]}
    assert B.fallback_target("t", 1) == "t-fallback" and B.fallback_target("t", 2) == "t-fallback2"


def test_a_fixed_arch_package_is_priced_by_the_list_it_compiles(tmp_path):
    # Block-Sparse-Attention 0.0.1 compiles sm_80 and sm_90 (nvcc >= 11.8) whatever is asked: `--arch 8.0`
    # is two -gencode targets' work, twice the measured one-target build (1.73 CPU hours).
    cat = load_catalogue()
    plan = expand(MatrixRequest(recipes=[(r := cat.get("bsa"), r.version("0.0.1"))], torch=["2.8"], cuda=["12.8"],
                                python=["3.12"], archs=[parse_arch_list("8.0")], flavor="runpod"))
    cell, = plan.cells
    assert cell.recipe.cpu_hours is not None and cell.recipe.cpu_hours.gencode_targets == 1
    labels = B.build_definition(plan, out_dir="wh", root=tmp_path).as_dict()["target"][cell.name]["labels"]
    assert labels["io.imagegen.cpu-hours"] == f"{cell.recipe.cpu_hours.hours * 2:.2f}" == "3.46"
