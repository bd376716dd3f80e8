"""The plan explains every cell it rejects or skips, with a specific reason naming the fix."""

from __future__ import annotations

import pytest
from packaging.version import Version

from imagegen.arch import parse_arch_list
from imagegen.errors import CompatError
from imagegen.plan import BUILDABLE, REJECTED, SKIPPED, MatrixRequest, choose_cell, defaults, expand, make_cell
from imagegen.recipes import load_catalogue

CAT = load_catalogue()


def cell(name, arch, torch="2.8", cuda="12.8", python="3.12", flavor="runpod", version=None, **kw):
    r = CAT.get(name)
    return make_cell(r, r.version(version), torch, cuda, python, parse_arch_list(arch), flavor, **kw)


def test_buildable_cell_has_image_index_and_names():
    c = cell("sage", "8.0;12.0+PTX", torch="2.8", cuda="12.8")
    assert c.status == BUILDABLE and c.problems == ()
    assert c.base.ref == "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
    assert c.torch_index_url is None  # cu128 is torch 2.8's PyPI default
    assert c.name == "sage-2_2_0-torch2_8-cu128-py312"
    assert c.local_version == "cu128torch2.8"
    assert c.wheel_dir == "sageattention-2.2.0/torch2.8/cu128"


def test_non_default_cuda_uses_the_pytorch_index():
    c = cell("sage", "9.0", torch="2.8", cuda="12.9")
    assert c.torch_index_url == "https://download.pytorch.org/whl/cu129"


def test_arch_too_new_for_cuda():
    c = cell("sage", "12.0", torch="2.8", cuda="12.6", flavor="cuda")
    assert c.status == REJECTED
    assert c.problems[0] == "sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected: use --cuda 12.8 or newer"


def test_torch_without_that_cuda_variant():
    c = cell("sage", "9.0", torch="2.6", cuda="13.0")
    assert "torch 2.6 has no cu130 build (it has cu118, cu124, cu126)" in c.problems


def test_recipe_arch_support():
    c = cell("sage", "7.5", torch="2.8", cuda="12.8")
    assert any(p.startswith("sageattention 2.2.0 does not support sm_75") for p in c.problems)


def test_version_hint_when_another_pin_supports_the_arch():
    c = cell("sage", "12.1", torch="2.8", cuda="12.9")
    assert any("version main does (--version main)" in p for p in c.problems)
    ok = cell("sage", "12.1", torch="2.8", cuda="12.9", version="main")
    assert ok.status == BUILDABLE
    assert str(ok.expected_archs) == "12.1a"


def test_emits_maps_requested_to_compiled_targets():
    c = cell("sage", "9.0+PTX;8.0", torch="2.8", cuda="12.8")
    assert str(c.expected_archs) == "8.0;9.0a+PTX"


def test_python_outside_torch_range():
    c = cell("sage", "9.0", torch="2.9", cuda="12.8", python="3.9")
    assert "torch 2.9 supports Python 3.10-3.14; Python 3.9 selected" in c.problems


def test_runpod_has_no_cuda_12_6_image():
    c = cell("sage", "9.0", torch="2.8", cuda="12.6")
    assert any(p.startswith("runpod/pytorch has no CUDA 12.6 image") for p in c.problems)
    assert cell("sage", "9.0", torch="2.8", cuda="12.6", flavor="cuda").status == BUILDABLE


def test_runpod_cu1300_image_with_cu12_torch_is_the_trap():
    c = cell("sage", "9.0", torch="2.8", cuda="12.8",
             base_image="runpod/pytorch:1.0.2-cu1300-torch280-ubuntu2404")
    assert c.status == REJECTED
    (p,) = [p for p in c.problems if "nvcc's major" in p]
    assert "has nvcc 13.0 (its preinstalled torch is a cu129 build)" in p and "torch cu128 needs nvcc 12.x" in p


def test_manylinux_fallback_and_missing():
    ok = cell("sage", "9.0", torch="2.8", cuda="12.8", flavor="manylinux")
    assert ok.base.ref == "pytorch/manylinux2_28-builder:cuda12.8"
    assert ok.base.python == "/opt/python/cp312-cp312/bin/python"
    assert ok.base.fallback == "sameli/manylinux_2_34_x86_64_cuda_12.8"
    bad = cell("sage", "9.0", torch="2.6", cuda="12.4", flavor="manylinux")
    assert any(p.startswith("no manylinux builder image for CUDA 12.4") for p in bad.problems)


def test_cuda_flavor_picks_ubuntu_by_python_and_deadsnakes_otherwise():
    assert cell("sage", "9.0", cuda="12.8", python="3.10", flavor="cuda").base.ref == "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"
    c = cell("sage", "9.0", cuda="12.8", python="3.11", flavor="cuda")
    assert c.base.ref == "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04" and c.base.deadsnakes


def test_pypi_flavor_gets_the_toolkit_from_pypi():
    c = cell("sage", "9.0", torch="2.11", cuda="13.0", python="3.11", flavor="pypi")
    assert c.status == BUILDABLE and c.base.ref == "python:3.11-slim-bookworm" and c.base.toolkit == "pypi"
    assert str(c.base.nvcc) == "13.0.2"


def test_choose_cell_fills_newest_buildable_combination():
    r = CAT.get("sage")
    c = choose_cell(r, r.version(None), parse_arch_list("12.0+PTX"), torch=None, cuda=None, python=None, flavor="runpod")
    assert c.status == BUILDABLE and c.cuda.version >= Version("12.8")
    assert c.python == defaults()["python"]


def test_choose_cell_error_names_the_fix():
    r = CAT.get("sage")
    with pytest.raises(CompatError) as err:
        choose_cell(r, r.version(None), parse_arch_list("12.0"), torch=None, cuda="12.6", python=None, flavor="cuda")
    assert "sm_120 needs CUDA >= 12.8" in str(err.value) and "use --cuda 12.8 or newer" in str(err.value)
    assert "\n" not in str(err.value)


def test_default_matrix_explains_every_rejected_cell():
    d = defaults()["matrix"]
    req = MatrixRequest(
        recipes=[(r, v) for r in CAT.recipes.values() for v in r.versions.values()],
        torch=d["torch"], cuda=d["cuda"], python=d["python"], archs=[parse_arch_list(d["arch"])],
        flavor=defaults()["flavor"],
    )
    plan = expand(req)
    assert plan.buildable, "the default matrix must build something"
    for c in plan.cells:
        if c.status == REJECTED:
            assert c.problems and all(p.strip() and "\n" not in p for p in c.problems)
        if c.status == SKIPPED:
            assert c.notes
    assert len(plan.cells) == len(req.recipes) * 4 * 4 * 4


def test_abi3_recipes_build_once_per_torch_and_cuda():
    abi3 = [r for r in CAT.recipes.values() if r.abi3]
    if not abi3:
        pytest.skip("no abi3 recipe in the catalogue")
    r = abi3[0]
    v = r.version(None)
    archs = parse_arch_list("9.0") if v.arch.style == "fixed" else v.archs[-1:]
    plan = expand(MatrixRequest(recipes=[(r, v)], torch=["2.10"], cuda=["12.8"], python=["3.11", "3.12"],
                                archs=[archs], flavor="cuda"))
    statuses = [c.status for c in plan.cells]
    assert statuses.count(BUILDABLE) == 1 and statuses.count(SKIPPED) == 1, [c.problems for c in plan.cells]


def test_runpod_legacy_tag_scheme_from_seed_004():
    seed = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"
    ok = cell("sage", "8.0;9.0;12.0+PTX", torch="2.8", cuda="12.8", python="3.11", base_image=seed)
    assert ok.status == BUILDABLE and str(ok.base.nvcc) == "12.8" and ok.base.python == "/usr/bin/python3.11"
    bad = cell("sage", "9.0", torch="2.8", cuda="12.8", python="3.12", base_image=seed)
    assert any("carries Python 3.11, not 3.12: use --python 3.11" in p for p in bad.problems)
    old = cell("sage", "12.0", torch="2.8", cuda="12.8", python="3.11",
               base_image="runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04")
    assert any("sm_120 needs CUDA >= 12.8; CUDA 12.4 (cu128) selected" in p for p in old.problems)


def test_every_arch_beyond_nvcc_is_reported_once_not_crashed():
    from imagegen.recipes import recipe_from_source_tree
    from pathlib import Path

    r = recipe_from_source_tree(Path(__file__).parent / "fixtures" / "tiny_kernel")
    c = make_cell(r, r.version(None), "2.11", "13.0", "3.11", parse_arch_list("7.0"), "pypi")
    assert c.status == REJECTED and c.problems[0].startswith("sm_70 was dropped in CUDA 13.0")
