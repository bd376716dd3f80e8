"""The plan explains every cell it rejects or skips, with a specific reason naming the fix."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from packaging.version import Version

from imagegen.errors import CompatError
from imagegen.model import compat
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import BUILDABLE, REJECTED, SKIPPED, MatrixRequest, Plan, WindowsHost
from imagegen.plan.matrix import (
    choose_cell,
    defaults,
    expand,
    gpu_checked,
    make_cell,
    offline,
    on_fallback,
    windows_plan,
    with_gpu_check,
    with_offline,
)
from tests.unit.catalogue_cells import catalogue_cell as cell

CAT = load_catalogue()


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
    assert "fallback base image: sameli/manylinux_2_34_x86_64_cuda_12.8 (if pytorch/manylinux2_28-builder:cuda12.8 cannot be pulled)" in ok.notes
    bad = cell("sage", "9.0", torch="2.6", cuda="12.4", flavor="manylinux")
    assert any(p.startswith("no manylinux builder image for CUDA 12.4") for p in bad.problems)


def test_cuda_flavor_picks_ubuntu_by_python_and_deadsnakes_otherwise():
    assert cell("sage", "9.0", cuda="12.8", python="3.10", flavor="cuda").base.ref == "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"
    c = cell("sage", "9.0", cuda="12.8", python="3.11", flavor="cuda")
    assert c.base.ref == "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04" and c.base.deadsnakes


def test_pypi_flavor_gets_the_toolkit_from_pypi():
    c = cell("sage", "9.0", torch="2.11", cuda="13.0", python="3.11", flavor="pypi")
    assert c.status == BUILDABLE and c.base.ref == "python:3.11-slim-bookworm" and c.base.toolkit == "pypi"
    assert str(c.base.nvcc) == "13.0.3"


def test_choose_cell_fills_newest_buildable_combination():
    r = CAT.get("sage")
    c = choose_cell(r, r.version(None), parse_arch_list("12.0+PTX"), torch=None, cuda=None, python=None, flavor="runpod")
    assert c.status == BUILDABLE and c.cuda.version >= Version("12.8")
    assert c.python == defaults()["python"]


def test_choose_cell_follows_the_one_default_policy():
    """The newest torch the recipe version can build, its PyPI CUDA, Python 3.12; the flavor given, or
    (none given) runpod, then manylinux, cuda and pypi where runpod has no image for that CUDA. The image's own torch is
    reused when it is the one chosen (--torch 2.8 on runpod), never chosen for being there."""
    r = CAT.get("sage")
    v = r.version(None)
    newest = compat.torch_table()[list(compat.torch_table())[-1]]
    c = choose_cell(r, v, parse_arch_list("12.0+PTX"), torch=None, cuda=None, python=None, flavor="runpod",
                    flavor_given=False)
    assert (c.torch_version, c.cuda.name, c.python, c.flavor) == (newest.latest, newest.pypi_default, "3.12", "manylinux")
    assert any(n.startswith("flavor manylinux (no --flavor given): runpod cannot build it") for n in c.notes), c.notes
    # --flavor runpod given: the newest torch runpod can build (2.15 is cu132 only), said in the notes.
    c = choose_cell(r, v, parse_arch_list("12.0+PTX"), torch=None, cuda=None, python=None, flavor="runpod")
    assert (c.torch_version, c.cuda.name, c.python, c.torch_from) == ("2.14.1", "cu130", "3.12", "venv")
    assert any(n.startswith("newest torch sageattention 2.2.0 can build; newer ones cannot: torch 2.15.0: runpod/pytorch"
                            " has no CUDA 13.2 image") for n in c.notes), c.notes
    c = choose_cell(r, v, parse_arch_list("9.0"), torch=None, cuda="12.8", python=None, flavor="runpod")
    assert (c.torch_version, c.cuda.name, c.torch_from) == ("2.11.0", "cu128", "venv")
    c = choose_cell(r, v, parse_arch_list("9.0"), torch="2.8", cuda=None, python=None, flavor="runpod")
    assert c.torch_version == "2.8.0" and c.torch_from == "image"  # runpod's 2.8.0 image, reused
    c = choose_cell(r, v, parse_arch_list("9.0"), torch=None, cuda=None, python=None, flavor="pypi")
    assert c.torch_version == "2.15.0" and c.torch_from == "venv" and c.flavor == "pypi"
    assert not any(n.startswith("flavor ") for n in c.notes)
    # A recipe version that cannot build the newest torches says which and why.
    x = CAT.get("xformers")  # as it was before its C++20 patch (by_torch), refused for torch >= 2.14
    c = choose_cell(x, _unfixed(x.version(None)), parse_arch_list("9.0"), torch=None, cuda=None, python=None,
                    flavor="runpod", flavor_given=False)
    assert c.torch.series == "2.13"
    (note,) = [n for n in c.notes if n.startswith("newest torch")]
    assert "torch 2.15.0: xformers" in note and "torch 2.14.1: xformers" in note and ": use " not in note


def test_a_request_naming_no_axis_is_one_cell_per_recipe_the_one_render_makes():
    archs = parse_arch_list("9.0")
    for r in CAT.recipes.values():
        v = r.version(None)
        plan = expand(MatrixRequest(recipes=[(r, v)], torch=[], cuda=[], python=[], archs=[archs], flavor="runpod",
                                    flavor_given=False))
        (cell,) = plan.cells
        try:
            rendered = choose_cell(r, v, archs, torch=None, cuda=None, python=None, flavor="runpod", flavor_given=False)
        except CompatError:
            assert cell.status == REJECTED and cell.problems
            continue
        assert (cell.name, cell.flavor, cell.status, cell.notes) == (rendered.name, rendered.flavor, BUILDABLE, rendered.notes)
    # Named values make a matrix over their axis; the other axes are filled per cell.
    r = CAT.get("sage")
    plan = expand(MatrixRequest(recipes=[(r, r.version(None))], torch=["2.10", "2.15"], cuda=[], python=[],
                                archs=[archs], flavor="runpod", flavor_given=False))
    assert [(c.torch_version, c.cuda.name, c.python, c.flavor) for c in plan.cells] == [
        ("2.10.0", "cu128", "3.12", "runpod"), ("2.15.0", "cu132", "3.12", "manylinux")]


def test_choose_cell_error_names_the_fix():
    r = CAT.get("sage")
    with pytest.raises(CompatError) as err:
        choose_cell(r, r.version(None), parse_arch_list("12.0"), torch=None, cuda="12.6", python=None, flavor="cuda")
    assert "sm_120 needs CUDA >= 12.8" in str(err.value) and "use --cuda 12.8 or newer" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_wide_matrix_explains_every_rejected_cell():
    req = MatrixRequest(
        recipes=[(r, v) for r in CAT.recipes.values() for v in r.versions.values()],
        torch=["2.8", "2.9", "2.10", "2.11", "2.14"], cuda=["12.6", "12.8", "13.0"], python=["3.10", "3.12"],
        archs=[parse_arch_list(defaults()["arch"])], flavor=defaults()["flavor"],
    )
    plan = expand(req)
    assert plan.buildable, "the matrix must build something"
    for c in plan.cells:
        if c.status == REJECTED:
            assert c.problems and all(p.strip() and "\n" not in p for p in c.problems)
        if c.status == SKIPPED:
            assert c.notes
    assert len(plan.cells) == len(req.recipes) * 5 * 3 * 2


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
    from pathlib import Path

    from imagegen.model.source_tree import recipe_from_source_tree

    r = recipe_from_source_tree(Path(__file__).parent.parent / "fixtures" / "tiny_kernel")
    c = make_cell(r, r.version(None), "2.11", "13.0", "3.11", parse_arch_list("7.0"), "pypi")
    assert c.status == REJECTED and c.problems[0].startswith("sm_70 was dropped in CUDA 13.0")


# --------------------------------------------------------------------------------------------
# Per-version torch / CUDA / Python ranges: the plan enforces every rule of every version


def test_xformers_0_0_35_with_torch_2_9_is_rejected_naming_the_fix():
    c = cell("xformers", "8.0;9.0", torch="2.9", cuda="12.8")
    assert c.status == REJECTED
    assert c.problems == ("xformers 0.0.35 needs torch >= 2.10 (requirements.txt; built against the torch 2.10"
                          " stable ABI); torch 2.9 selected: use --torch 2.10 or newer, or --version 0.0.33.post2",)
    assert cell("xformers", "8.0;9.0", torch="2.10", cuda="12.8").status == BUILDABLE
    assert cell("xformers", "8.0;9.0", torch="2.9", cuda="12.8", version="0.0.33.post2").status == BUILDABLE
    old = cell("xformers", "8.0;9.0", torch="2.8", cuda="12.8", version="0.0.33.post2")
    assert old.problems[0].endswith("torch 2.8 selected: use --torch 2.9 or newer, or --version 0.0.32")


def _cell_values(series, variant, python, nvcc):
    return {"torch": (Version(series.series), Version(series.latest)), "cuda": (nvcc, nvcc),
            "python": (Version(python), Version(python))}


def _violating_cells(recipe, version, rule):
    """Cells (from the compat tables; for CUDA also an older nvcc from a base image) outside ``rule``,
    those inside more of the version's other rules first. Empty when no known value violates it."""
    from imagegen.model import compat
    cudas = compat.cuda_table()
    others = [r for r in recipe.rules(version) if r is not rule]
    found = []
    for s in compat.torch_table().values():
        for name in s.cuda:
            variant = cudas[name]
            nvccs = [variant.version]
            if rule.subject == "cuda":  # a CUDA image older than any torch variant (nvcc's major must match)
                nvccs += [Version(f"{variant.major}.{m}") for m in range(0, variant.minor)]
            for nvcc in nvccs:
                for py in s.pythons:
                    values = _cell_values(s, variant, py, nvcc)
                    if not rule.allows(*values[rule.subject]):
                        broken = sum(not r.allows(*values[r.subject]) for r in others)
                        found.append((broken, s.series, name, py, nvcc, nvcc != variant.version))
    for _, torch, cuda, py, nvcc, override in sorted(found, key=lambda f: f[0]):
        base = f"nvidia/cuda:{nvcc}.0-cudnn-devel-ubuntu22.04" if override else None
        yield make_cell(recipe, version, torch, cuda, py, version.archs[:1], "cuda", base_image=base)


def test_every_rule_of_every_version_rejects_a_cell_outside_it():
    checked = vacuous = 0
    for recipe in CAT.recipes.values():
        for version in recipe.versions.values():
            for rule in recipe.rules(version):
                wanted = f"{recipe.name} {version.version} needs {dict(torch='torch', cuda='CUDA', python='Python')[rule.subject]} {rule.text}"
                tried = list(itertools.islice(_violating_cells(recipe, version, rule), 20))
                # The first of them the plan rejects for this rule (a cell whose base image cannot be
                # had, say, is rejected for that first; the rule must still be named on the next).
                c = next((c for c in tried if any(p.startswith(wanted) for p in c.problems)), tried[0] if tried else None)
                if c is None:
                    # Only a recipe-wide floor below everything imagegen knows (flash-attn's torch >= 2.2)
                    # may be unviolable; a version's own rule that nothing violates is a data error.
                    assert rule not in version.requires, f"{recipe.name} {version.version}: {rule} excludes nothing"
                    vacuous += 1
                    continue
                assert c.status == REJECTED and any(p.startswith(wanted) for p in c.problems), (rule, c.describe(), c.problems)
                assert all("\n" not in p and (": use --" in p or "imagegen's tables" in p) for p in c.problems if p.startswith(wanted))
                checked += 1
    assert checked > vacuous and checked >= sum(len(v.requires) for r in CAT.recipes.values() for v in r.versions.values())


def test_natten_needs_torch_2_8_and_bsa_0_0_2_needs_cuda_11_7():
    n = cell("natten", "8.0", torch="2.7", cuda="12.8", flavor="cuda")
    assert any(p.startswith("natten 0.21.6 needs torch >= 2.8 (docs/install.md") for p in n.problems)
    b = cell("bsa", "8.0", torch="2.7", cuda="11.8", flavor="cuda", base_image="nvidia/cuda:11.6.2-cudnn-devel-ubuntu22.04")
    assert any(p.startswith("block-sparse-attn 0.0.2.post1 needs CUDA >= 11.7") and p.endswith("--version 0.0.1")
               for p in b.problems), b.problems


# --------------------------------------------------------------------------------------------
# runs_on: flash-attn and Block-Sparse-Attention compile one sm_80 cubin for all of 8.x


def test_flash_attn_maps_86_89_to_the_sm80_cubin():
    from imagegen.model.arch_format import to_numeric_list

    c = cell("flash-attn", "80;86;89;90", torch="2.8", cuda="12.8")
    assert c.status == BUILDABLE, c.problems
    assert str(c.archs) == "8.0;9.0" and str(c.requested_archs) == "8.0;8.6;8.9;9.0"
    assert to_numeric_list(c.archs) == "80;90"  # FLASH_ATTN_CUDA_ARCHS, never 86
    assert str(c.expected_archs) == "8.0;9.0"  # verify looks for sm_80, not sm_86
    assert "8.6, 8.9 run the sm_80 cubin" in c.notes
    assert "compiled as 8.0;9.0" in c.describe()
    plain = cell("flash-attn", "8.0;9.0")
    assert plain.requested_archs == plain.archs and not any("cubin" in n for n in plain.notes)


def test_runs_on_for_every_numeric_flash_attn_and_bsa_version():
    for name in ("flash-attn", "bsa"):
        for v in CAT.get(name).versions.values():
            c = cell(name, "8.6;8.7;8.9;9.0", torch="2.9", cuda="12.8", version=v.version)
            assert c.status == BUILDABLE, (name, v.version, c.problems)
            if v.arch.style != "fixed":
                assert str(c.archs) == "8.0;9.0" and "8.6, 8.7, 8.9 run the sm_80 cubin" in c.notes


def test_ptx_on_a_mapped_arch_is_still_refused_where_the_package_embeds_none():
    c = cell("flash-attn", "8.0;8.6+PTX;9.0")
    assert c.status == REJECTED and any("never embeds PTX" in p for p in c.problems)
    bsa = cell("bsa", "8.6+PTX;9.0")  # BSA embeds PTX only for the newest arch
    assert bsa.status == REJECTED and any("embeds PTX only for the newest arch" in p for p in bsa.problems)


def test_the_rendered_arch_arg_is_the_compiled_list():
    from imagegen.render.dockerfile import render_dockerfile

    c = cell("flash-attn", "80;86;89;90", torch="2.8", cuda="12.8", flavor="cuda")
    text = render_dockerfile(c).dockerfile
    assert 'ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"' in text or "ARG TORCH_CUDA_ARCH_LIST=8.0;9.0" in text


def _seed_001_request(versions_of):
    # Seed 001 builds FA 2.8.x for its compatibility table (torch 2.6: cu126; 2.7: cu126, cu128;
    # 2.8: cu126, cu128, cu129), PY_LINUX cp312, TORCH_CUDA_ARCH_LIST="80;86;89;90", on
    # pytorch/manylinux2_28-builder images. The catalogue's 2.8.x are 2.8.3, 2.8.3.post1, 2.8.3.post2 and main
    # (2.8.4).
    return MatrixRequest(recipes=versions_of, torch=["2.6", "2.7", "2.8"], cuda=["12.6", "12.8", "12.9"],
                         python=["3.12"], archs=[parse_arch_list("80;86;89;90")], flavor="manylinux")


def test_seed_001_matrix_gives_its_cells_for_every_version_including_its_default_2_8_2():
    from dataclasses import replace

    fa = CAT.get("flash-attn")
    assert [v for v in fa.versions] == ["2.8.3", "2.8.3.post1", "2.8.3.post2", "2.8.2", "main"]
    plan = expand(_seed_001_request([(fa, v) for v in fa.versions.values()]))
    assert len(plan.buildable) == 30, [c.problems for c in plan.rejected]  # 6 per version
    assert len([c for c in plan.buildable if c.version.version == "2.8.2"]) == 6
    # The other 9 combinations are pairs the seed's own table does not have either.
    assert all(len(c.problems) == 1 and "has no cu12" in c.problems[0] for c in plan.rejected)
    assert all("8.6, 8.9 run the sm_80 cubin" in c.notes and str(c.archs) == "8.0;9.0" for c in plan.buildable)
    # Without the mapping every cell of the seed's list is refused (what the issue reported).
    unmapped = [(fa, replace(v, arch=replace(v.arch, runs_on=()))) for v in fa.versions.values()]
    assert not expand(_seed_001_request(unmapped)).buildable


def test_plan_json_and_manifest_carry_the_mapping_note(tmp_path, capsys):
    from imagegen.wheelhouse import manifest as wheelhouse
    from imagegen.wheelhouse import collect
    from imagegen.cli import main

    code = main(["plan", "flash-attn", "--arch", "80;86;89;90", "--torch", "2.8", "--cuda", "12.8",
                 "--python", "3.12", "--json"])
    (rec,) = __import__("json").loads(capsys.readouterr().out)["cells"]
    assert code == 0 and rec["archs"] == "8.0;9.0" and rec["requested_archs"] == "8.0;8.6;8.9;9.0"
    assert rec["expected_archs"] == "8.0;9.0" and "8.6, 8.9 run the sm_80 cubin" in rec["notes"]
    main(["plan", "flash-attn", "--arch", "80;86;89;90", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12"])
    assert "8.6, 8.9 run the sm_80 cubin" in capsys.readouterr().out
    c = cell("flash-attn", "80;86;89;90")
    wheel = tmp_path / "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    collect.place(tmp_path / "out", c, wheel, inputs="x", record={})
    entry = wheelhouse.read_manifest(wheelhouse.cell_dir(tmp_path / "out", c))["cells"][c.name]
    assert entry["notes"] == list(c.notes) and entry["requested_archs"] == "8.0;8.6;8.9;9.0"
    assert entry["expected_archs"] == "8.0;9.0"


def test_archs_command_shows_what_flash_attn_and_bsa_really_get(capsys):
    from imagegen.cli import main

    assert main(["archs", "80;86;89;90"]) == 0
    out = capsys.readouterr().out
    fa = next(line for line in out.splitlines() if line.startswith("FLASH_ATTN_CUDA_ARCHS"))
    bsa = next(line for line in out.splitlines() if line.startswith("BLOCK_SPARSE_ATTN_CUDA_ARCHS"))
    for line in (fa, bsa):
        assert line.split()[1] == "80;90" and "8.6, 8.9 run the sm_80 cubin" in line
    assert "TORCH_CUDA_ARCH_LIST     8.0;8.6;8.9;9.0" in out  # torch-style packages compile 8.6 itself


# --------------------------------------------------------------------------------------------
# Issue 37: a version that hard-codes -std=c++17 (recipe cxx_std) against torch's headers


def _unfixed(version):
    """The version without its recipe fix: the C++17 its setup.py hard-codes, no by_torch patch."""
    return replace(version, by_torch=())


@pytest.mark.parametrize("name", ["flash-attn", "mamba-ssm", "sageattention", "xformers", "flash-attn-3", "natten"])
def test_the_plan_tells_the_truth_about_the_cxx_standard_with_and_without_the_fix(name):
    r = CAT.get(name)
    version = r.version(None)
    arch = parse_arch_list("9.0")
    old = make_cell(r, version, "2.11", "13.0", "3.12", arch, "runpod")
    assert old.status == BUILDABLE and not any("C++" in n or "by_torch" in n for n in old.notes)
    fixed = make_cell(r, version, "2.14", "13.0", "3.12", arch, "runpod")
    assert fixed.status == BUILDABLE, fixed.problems
    assert fixed.version.cxx_std == 20 and fixed.version.patches[-1].name.endswith("cxx-std-from-torch.patch")
    assert any("by_torch[0] (torch >= 2.12) applies (adds" in n for n in fixed.notes)
    unfixed = make_cell(r, _unfixed(version), "2.14", "13.0", "3.12", arch, "runpod")
    assert unfixed.status == REJECTED and len(unfixed.problems) == 1
    assert unfixed.problems[0] == (
        f"{r.name} {version.version} (recipe: cxx_std 17) compiles with -std=c++17 but torch 2.14's headers require"
        " C++20 or later: use --torch 2.13 or older, or give the recipe's version a by_torch entry for torch 2.14"
        " with a patch that raises the standard (and cxx_std: 20)")
    old_unfixed = make_cell(r, _unfixed(version), "2.11", "13.0", "3.12", arch, "runpod")
    assert old_unfixed.status == BUILDABLE and old_unfixed.version.patches == old.version.patches
    warned = make_cell(r, _unfixed(version), "2.12", "13.0", "3.12", arch, "runpod")
    assert warned.status == BUILDABLE and any("torch 2.12 builds its own extensions as C++20" in n for n in warned.notes)


def test_a_recipe_without_a_fix_is_refused_for_torch_2_14_only():
    r = CAT.get("xformers")
    version = _unfixed(r.version(None))  # as it was before its by_torch patch
    ok = make_cell(r, version, "2.13", "13.0", "3.12", parse_arch_list("9.0"), "runpod")
    assert ok.status == BUILDABLE
    refused = make_cell(r, version, "2.14", "13.0", "3.12", parse_arch_list("9.0"), "runpod")
    assert refused.status == REJECTED and "torch 2.14's headers require C++20 or later" in refused.problems[0]


# Issue 37 item 2: xformers, flash-attn-3 and natten follow torch's standard too, in every pinned
# version that torch >= 2.12 can build (flash-attn-3 3.0.0b1 cannot: it builds only with CUDA 12.8).
FIXED = [(name, v) for name in ("xformers", "flash-attn-3", "natten") for v in CAT.get(name).versions
         if (name, v) != ("flash-attn-3", "3.0.0b1")]


@pytest.mark.parametrize("name", ["xformers", "flash-attn-3", "natten"])
def test_plan_for_torch_2_14_is_buildable_with_the_standard_patch_listed(capsys, name):
    from imagegen.cli import main

    assert main(["plan", name, "--torch", "2.14", "--arch", "9.0"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(("buildable", "rejected")))
    assert row.startswith("buildable") and "cxx-std-from-torch.patch" in row, row


@pytest.mark.parametrize(("name", "pin"), FIXED)
def test_every_pinned_version_builds_for_torch_2_14_and_keeps_its_torch_2_11_cell(name, pin):
    r = CAT.get(name)
    version = r.version(pin)
    arch = parse_arch_list("9.0")
    new = make_cell(r, version, "2.14", "13.0", "3.12", arch, "runpod")
    assert new.status == BUILDABLE, new.problems
    assert new.version.cxx_std == 20 and new.version.patches[-1].name.endswith("-cxx-std-from-torch.patch")
    assert [p.name for p in new.version.patches[:-1]] == [p.name for p in version.patches]  # after its own
    old, unfixed = (make_cell(r, v, "2.11", "13.0", "3.12", arch, "runpod") for v in (version, _unfixed(version)))
    assert old.status == BUILDABLE and _unfixed(old.version) == unfixed.version and old.version.patches == version.patches
    assert old.version.cxx_std == 17 and old.notes == unfixed.notes


def test_flash_attn_3_3_0_0b1_is_refused_for_torch_2_12_and_newer_saying_why():
    r = CAT.get("flash-attn-3")
    version = r.version("3.0.0b1")
    assert not version.by_torch  # no patch: no torch >= 2.12 cell can exist
    assert make_cell(r, version, "2.11", "12.8", "3.12", parse_arch_list("9.0"), "runpod").status == BUILDABLE
    cell = make_cell(r, version, "2.14", "13.0", "3.12", parse_arch_list("9.0"), "runpod")
    assert cell.status == REJECTED
    assert any("needs torch < 2.12 (torch 2.12+ has no CUDA 12.8 build, the only CUDA this version builds with;"
               " it also hard-codes -std=c++17, below torch 2.14's C++20)" in p for p in cell.problems), cell.problems


def test_the_plans_trailer_names_only_the_axes_it_filled(capsys):
    from imagegen.cli import main

    def trailer(*argv):
        main(["plan", "sage", *argv])
        return capsys.readouterr().out.splitlines()[-1]

    assert trailer("--torch", "2.8", "--cuda", "12.8", "--python", "3.12") == (
        "flavor, archs not named: flavor runpod (else manylinux or cuda or pypi where runpod has no image for that CUDA), archs 8.0;9.0;12.0")
    assert trailer("--flavor", "pypi", "--arch", "9.0") == (
        "torch, CUDA, Python not named: the newest torch the recipe can build, that torch's PyPI CUDA,"
        " Python 3.12 (else the torch's newest)")
    assert trailer("--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--flavor", "runpod", "--arch", "9.0").startswith("1 buildable")
    # Jetson's devices fill the open axes: the trailer says so, not the generic policy.
    main(["plan", "causal-conv1d", "--flavor", "jetson"])
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "jetson: the axes not named come from its devices' rows (each JetPack's CUDA, Python, torch and GPUs)"
    assert "not named:" not in out


# ------------------------------------------------------------------- Windows cells (issue 34 item 2)


def test_windows_cells_come_from_the_same_planner_and_rules():
    fa = load_catalogue().get("fa2")
    archs = parse_arch_list("80;86;89;90")
    plan = windows_plan([(fa, fa.version("2.8.3"))], [archs], WindowsHost(), torch=["2.6", "2.8"], cuda=["12.6", "12.8"])
    linux = expand(MatrixRequest(recipes=[(fa, fa.version("2.8.3"))], torch=["2.6", "2.8"], cuda=["12.6", "12.8"],
                                 python=[], archs=[archs], flavor="manylinux"))
    assert [(c.name, c.status) for c in plan.cells] == [(c.name, c.status) for c in linux.cells]
    assert plan.rejected[0].problems == linux.rejected[0].problems == ("torch 2.6 has no cu128 build (it has cu118,"
                                                                      " cu124, cu126)",)
    cell = plan.buildable[0]
    assert cell.flavor == "native" and cell.base.ref == "windows" and str(cell.archs) == "8.0;9.0"
    assert cell.requested_archs == archs and "8.6, 8.9 run the sm_80 cubin" in " ".join(cell.notes)


def test_on_fallback_is_the_cell_on_its_fallback_base_image():
    cell = make_cell(*(lambda r: (r, r.version(None)))(load_catalogue().get("fa2")), "2.8", "12.8", "3.12",
                     parse_arch_list("8.0"), "manylinux")
    other = on_fallback(cell, "sameli/manylinux_2_34_x86_64_cuda_12.8", "not found")
    assert other.base.ref == "sameli/manylinux_2_34_x86_64_cuda_12.8" and other.base.fallbacks == ()
    assert other.notes[-1] == "built on the fallback base image sameli/manylinux_2_34_x86_64_cuda_12.8: not found"
    assert not any(n.startswith("fallback base image:") for n in other.notes)


def test_per_cell_changes_are_cell_to_cell_and_a_plan_applies_them_to_each():
    # Issue 33: render changes its one cell directly; a plan maps the same change over its cells.
    sage, fa2 = cell("sage", "9.0", flavor="runpod"), cell("fa2", "9.0", flavor="manylinux")
    plan = Plan(cells=[sage, fa2])
    assert with_offline(plan).cells == [offline(sage), offline(fa2)]
    assert offline(sage).offline and offline(sage).status == REJECTED  # its git source would be downloaded
    checked = with_gpu_check(plan, "nvidia.com/gpu=0")
    assert checked.cells == [gpu_checked(sage, "nvidia.com/gpu=0"), gpu_checked(fa2, "nvidia.com/gpu=0")]
    assert checked.cells[0].gpu_check_device == "nvidia.com/gpu=0"
    assert plan.each(lambda c: c).cells == plan.cells and plan.each(offline) == with_offline(plan)
