"""The jetson flavor (issue 21): NVIDIA Jetson builders, linux/arm64 only. A cell's CUDA picks the
JetPack (6.1/6.2: CUDA 12.6 on Orin; 7.0/7.1: CUDA 13.0 on Thor), which fixes the base image, the
Python, the torch index (jetson-ai-lab) and the GPUs a wheel can run on; the plan refuses the rest
with what to use instead. Every recipe that builds for Orin renders into a Dockerfile BuildKit's
parser and hadolint accept."""

from __future__ import annotations

import json

import pytest

from imagegen.cli import main
from imagegen.model import base_images
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import BUILDABLE, REJECTED, Plan
from imagegen.plan.matrix import choose_cell, make_cell
from imagegen.plan.platforms import default_platforms, with_platforms
from imagegen.render.bake import build_definition
from imagegen.render.dockerfile import render_dockerfile
from tests.unit.test_dockerfile import check_structure, run_hadolint

CAT = load_catalogue()
ORIN = dict(torch="2.8", cuda="12.6", python="3.10")
# The catalogue recipes whose newest version builds for sm_87 (or compiles sm_80, which Orin runs).
FOR_ORIN = ["block-sparse-attn", "causal-conv1d", "flash-attn", "mamba-ssm"]


def jetson_cell(recipe: str, arch: str = "8.7", *, torch="2.8", cuda="12.6", python="3.10", platforms=None):
    r = CAT.get(recipe)
    cell = make_cell(r, r.version(None), torch, cuda, python, parse_arch_list(arch), "jetson")
    return with_platforms(Plan(cells=[cell]), platforms or default_platforms("jetson")).cells[0]


def test_the_jetson_flavor_builds_for_linux_arm64_by_default():
    assert default_platforms("jetson") == ("linux/arm64",)
    assert default_platforms("pypi") == default_platforms("runpod") == ("linux/amd64",)


@pytest.mark.parametrize("name", FOR_ORIN)
def test_every_recipe_for_orin_renders_parses_and_lints(name, tmp_path):
    cell = jetson_cell(name)
    assert cell.status == BUILDABLE, cell.problems
    assert cell.platform == "linux/arm64" and cell.name.endswith("-arm64")
    assert cell.base.ref == "nvcr.io/nvidia/l4t-jetpack:r36.4.0"
    assert cell.torch_index_url == "https://pypi.jetson-ai-lab.io/jp6/cu126"
    rendered = render_dockerfile(cell)
    text = rendered.dockerfile
    check_structure(text, cell)
    assert [f for f in run_hadolint(text, tmp_path) if f["level"] in ("error", "warning")] == []
    assert "python3.10-venv" in text and "python3.10-dev" in text  # Ubuntu's interpreter, as the cuda flavor
    doc = json.loads(rendered.files[f"{cell.name}/cell.json"])
    assert doc["torch"]["index_url"] == "https://pypi.jetson-ai-lab.io/jp6/cu126"
    assert doc["base_python"] == "/usr/bin/python3.10" and doc["toolkit"] == {"kind": "image"}


def test_thor_is_jetpack_7_with_cuda_13_and_the_sbsa_index():
    cell = jetson_cell("causal-conv1d", "11.0", torch="2.9", cuda="13.0", python="3.12")
    assert cell.status == BUILDABLE, cell.problems
    assert cell.base.ref == "nvcr.io/nvidia/cuda:13.0.0-devel-ubuntu24.04"
    assert cell.torch_index_url == "https://pypi.jetson-ai-lab.io/sbsa/cu130" and cell.torch_version == "2.9.1"


def test_render_fills_in_the_jetpack_of_the_arch():
    recipe = CAT.get("causal-conv1d")
    orin = choose_cell(recipe, recipe.version(None), parse_arch_list("8.7"), torch=None, cuda=None, python=None,
                       flavor="jetson")
    thor = choose_cell(recipe, recipe.version(None), parse_arch_list("11.0"), torch=None, cuda=None, python=None,
                       flavor="jetson")
    assert (orin.cuda.name, orin.python, orin.torch_version) == ("cu126", "3.10", "2.9.1")
    assert (thor.cuda.name, thor.python, thor.torch_version) == ("cu130", "3.12", "2.9.1")


@pytest.mark.parametrize("arch, kw, reason", [
    ("9.0", ORIN, "nvcr.io/nvidia/l4t-jetpack:r36.4.0 is for Jetson Orin on JetPack 6.1/6.2, whose GPUs are 8.7: code"
                  " for 9.0 never runs there; use --arch 8.7"),
    ("8.7", {**ORIN, "cuda": "12.8"}, "no JetPack with a torch index has CUDA 12.8 (JetPack 6.1/6.2: CUDA 12.6,"
                                      " JetPack 7.0/7.1: CUDA 13.0; not JetPack 5"),
    ("8.7", {**ORIN, "python": "3.12"}, "JetPack 6.1/6.2 (L4T r36.4, Ubuntu 22.04) has Python 3.10, and its torch"
                                        " index has wheels for that alone: use --python 3.10"),
    ("8.7", {**ORIN, "torch": "2.7"}, "the JetPack 6.1/6.2 (L4T r36.4, Ubuntu 22.04) torch index"
                                      " (https://pypi.jetson-ai-lab.io/jp6/cu126) has torch 2.7.0, 2.8.0, 2.9.1, not"
                                      " 2.7.1: use --torch 2.7.0"),
])
def test_what_no_jetpack_has_is_refused_with_what_to_use(arch, kw, reason):
    cell = jetson_cell("causal-conv1d", arch, **kw)
    assert cell.status == REJECTED
    assert any(p.startswith(reason) for p in cell.problems), cell.problems


def test_code_orin_runs_is_not_refused():
    # flash-attn compiles sm_80 for an 8.7 request (its knob has no 87): Orin runs the sm_80 cubin
    assert jetson_cell("flash-attn", "8.7").status == BUILDABLE
    assert jetson_cell("causal-conv1d", "8.0").status == BUILDABLE
    assert jetson_cell("causal-conv1d", "8.6+PTX").status == BUILDABLE
    assert jetson_cell("causal-conv1d", "8.9").status == REJECTED  # a newer minor than Orin's


def test_a_recipe_without_orin_support_says_so():
    cell = jetson_cell("sageattention")
    assert cell.status == REJECTED and "sageattention 2.2.0 does not support sm_87" in cell.problems[0]


def test_an_amd64_jetson_cell_is_refused(capsys):
    cell = jetson_cell("causal-conv1d", platforms=("linux/amd64",))
    assert cell.status == REJECTED and "the jetson flavor has no linux/amd64 images" in cell.problems[-1]
    assert main(["plan", "causal-conv1d", "--flavor", "jetson", "--arch", "8.7", "--torch", "2.8", "--cuda", "12.6",
                 "--python", "3.10", "--platform", "amd64"]) == 3
    assert "the jetson flavor has no linux/amd64 images" in capsys.readouterr().out


def test_plan_and_bake_of_a_jetson_matrix(capsys, tmp_path):
    argv = ["causal-conv1d", "--flavor", "jetson", "--arch", "8.7", "--torch", "2.8", "--cuda", "12.6", "--python",
            "3.10"]
    assert main(["plan", *argv, "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)["cells"]
    assert record["platform"] == "linux/arm64" and record["base_image"] == "nvcr.io/nvidia/l4t-jetpack:r36.4.0"
    assert record["torch_index_url"] == "https://pypi.jetson-ai-lab.io/jp6/cu126"
    cell = jetson_cell("causal-conv1d")
    definition = build_definition(Plan(cells=[cell]), out_dir="wh", root=tmp_path)
    assert definition.as_dict()["target"][cell.name]["platforms"] == ["linux/arm64"]


def test_the_jetpack_rows_name_a_torch_index_and_archs_each():
    for row in base_images.flavor("jetson").raw["jetpacks"]:
        assert row["torch_index"].startswith("https://pypi.jetson-ai-lab.io/")
        assert row["archs"] and row["torch"] and row["image"]


def plan_json(capsys, *argv) -> tuple[int, list[dict]]:
    code = main(["plan", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)["cells"]


def test_with_no_axes_given_each_jetpack_is_one_cell_on_its_own_torch_python_and_gpus(capsys):
    code, cells = plan_json(capsys, "causal-conv1d", "--flavor", "jetson")
    assert code == 0
    assert [(c["torch"], c["cuda"], c["python"], c["archs"], c["status"]) for c in cells] == [
        ("2.9.1", "cu126", "3.10", "8.7", "buildable"), ("2.9.1", "cu130", "3.12", "11.0", "buildable")]


def test_a_given_arch_keeps_the_jetpacks_whose_gpus_run_it(capsys):
    code, cells = plan_json(capsys, "causal-conv1d", "--flavor", "jetson", "--arch", "8.7")
    assert code == 0 and [(c["cuda"], c["archs"]) for c in cells] == [("cu126", "8.7")]
    # an arch no Jetson runs: every JetPack is planned with it, and each says why not
    code, cells = plan_json(capsys, "causal-conv1d", "--flavor", "jetson", "--arch", "9.0")
    assert code == 3 and [c["cuda"] for c in cells] == ["cu126", "cu130"]
    assert all("code for 9.0 never runs there" in c["reasons"][-1] for c in cells)


def test_given_axes_stay_as_given(capsys):
    code, cells = plan_json(capsys, "causal-conv1d", "--flavor", "jetson", "--torch", "2.8", "--cuda", "12.6")
    assert code == 0 and [(c["torch"], c["cuda"], c["python"], c["archs"]) for c in cells] == [
        ("2.8.0", "cu126", "3.10", "8.7")]
    # a CUDA no JetPack has: the plain matrix, each cell saying so
    code, cells = plan_json(capsys, "causal-conv1d", "--flavor", "jetson", "--cuda", "12.8", "--python", "3.10",
                            "--torch", "2.8")
    assert code == 3 and all("no JetPack with a torch index has CUDA 12.8" in " ".join(c["reasons"]) for c in cells)


def test_other_flavors_plan_the_generic_matrix_as_before():
    from imagegen.model.cell import MatrixRequest
    from imagegen.plan.matrix import device_requests

    r = CAT.get("causal-conv1d")
    req = MatrixRequest(recipes=[(r, r.version(None))], torch=["2.9"], cuda=["12.8"], python=["3.12"],
                        archs=[parse_arch_list("9.0")], flavor="pypi")
    assert device_requests(req, torch=False, cuda=False, python=False, arch=False) == [req]
