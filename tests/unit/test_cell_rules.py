"""Tests for imagegen.model.cell_rules: the reasons a cell is refused (Python, torch x CUDA, the recipe's ranges,
nvcc x arch, package x arch, base image x CUDA), what a package compiles and carries for a request
(compiled_archs, expected_archs, covers), and ``arch.runs_on`` applied the same way by the in-build
script to an arch list that arrives at build time (a bake override of TORCH_CUDA_ARCH_LIST, or the GPUs
`docker run --gpus all` sees): flash-attn's knob takes 80 but silently ignores 86/89."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imagegen.model.cell_rules import (
    base_problems,
    cc_key,
    compiled_archs,
    compiled_targets,
    covers,
    expected_archs,
    fmt_version,
    nvcc_problems_for,
    python_problems,
    recipe_problems,
    rule_problems,
    torch_cuda_problems,
)
from imagegen.model import base_images, compat
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.recipes import Rule
from imagegen.plan.matrix import make_cell
from imagegen.render.dockerfile import cell_document
from tests.unit.builder_script import BUILDENV, SCRIPT, builder_module

B = builder_module("imagegen_buildenv_runs_on", BUILDENV)


def _doc(recipe_name, archs="8.0;9.0", version=None):
    recipe = load_catalogue().get(recipe_name)
    v = recipe.version(version)
    return recipe, v, cell_document(make_cell(recipe, v, "2.11", "13.0", "3.11", parse_arch_list(archs), "pypi"))


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("TORCH_CUDA_ARCH_LIST", "FLASH_ATTN_CUDA_ARCHS", "MAX_JOBS", "NVCC_THREADS", "EXT_PARALLEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MAX_JOBS", "2")
    return monkeypatch


def test_cell_document_carries_runs_on_only_where_the_recipe_has_it():
    _, _, fa = _doc("flash-attn")
    assert fa["knob"]["runs_on"] == {"8.6": "8.0", "8.7": "8.0", "8.9": "8.0"}
    _, _, sage = _doc("sageattention", "9.0")
    assert "runs_on" not in sage["knob"]  # no other cell's document (or inputs hash) changes


@pytest.mark.parametrize("asked, knob", [
    ("8.6;9.0", "80;90"),
    ("8.0;8.6;8.9;9.0", "80;90"),
    ("8.9", "80"),
    ("9.0;8.6", "90;80"),
    ("8.0;9.0", "80;90"),
])
def test_bake_override_is_mapped_before_the_knob_is_written(clean_env, capsys, asked, knob):
    _, _, doc = _doc("flash-attn")
    clean_env.setenv("TORCH_CUDA_ARCH_LIST", asked)
    env = B.build_env(doc)
    assert env["FLASH_ATTN_CUDA_ARCHS"] == knob
    out = capsys.readouterr().out
    moved = [cc for cc in ("8.6", "8.7", "8.9") if cc in asked.split(";")]
    if moved:
        assert "%s run%s the sm_80 cubin (flash-attn builds one cubin for the 8.x family)" % (
            ", ".join(moved), "s" if len(moved) == 1 else "") in out
    else:
        assert "cubin" not in out


def test_gpus_seen_at_build_time_are_mapped_too(clean_env, capsys):
    # `docker run --gpus all` on an RTX 3090 host: no TORCH_CUDA_ARCH_LIST, the GPU is 8.6.
    _, _, doc = _doc("flash-attn")
    clean_env.setattr(B, "visible_gpu_archs", lambda cell: "8.6")
    env = B.build_env(doc)
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "80"
    assert "8.6 runs the sm_80 cubin" in capsys.readouterr().out


def test_block_sparse_attention_maps_as_well(clean_env):
    _, _, doc = _doc("block-sparse-attn")
    clean_env.setenv("TORCH_CUDA_ARCH_LIST", "8.6;8.9;12.0")
    env = B.build_env(doc)
    assert env["BLOCK_SPARSE_ATTN_CUDA_ARCHS"] == "80;120"


def test_flags_merge_and_variants_stay():
    archs = B.parse_archs("8.0;8.6+PTX;9.0a")
    out, note = B.apply_runs_on(archs, {"8.6": "8.0"}, "pkg")
    assert out == [(8, 0, "", True, True), (9, 0, "a", True, False)]
    assert note == "8.6 runs the sm_80 cubin (pkg builds one cubin for the 8.x family)"
    assert B.apply_runs_on(archs, {}, "pkg") == (archs, "")
    assert B.apply_runs_on(B.parse_archs("8.6a"), {"8.6": "8.0"}, "pkg")[0] == [(8, 6, "a", True, False)]


_CCS = ["7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "12.0"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_CCS), st.booleans()), min_size=1, max_size=6, unique_by=lambda t: t[0]))
def test_in_build_mapping_agrees_with_the_plan(entries):
    text = ";".join(cc + ("+PTX" if ptx else "") for cc, ptx in entries)
    recipe = load_catalogue().get("flash-attn")
    version = recipe.version(None)
    planned, _ = compiled_archs(version, parse_arch_list(text))
    built, _ = B.apply_runs_on(B.parse_archs(text), dict(version.arch.runs_on), "flash-attn")
    # the same knob entries (the plan's list is sorted, the build keeps the order asked)
    assert sorted(B.format_archs(built, "numeric").split(";")) == sorted(
        B.format_archs(B.parse_archs(str(planned)), "numeric").split(";"))
    assert sum(a[3] + a[4] for a in built) == parse_arch_list(str(planned)).gencode_targets


def test_the_script_run_as_a_process_writes_the_mapped_knob(tmp_path):
    _, _, doc = _doc("flash-attn")
    cell = tmp_path / "cell.json"
    cell.write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if k not in ("MAX_JOBS", "NVCC_THREADS")}
    env.update(TORCH_CUDA_ARCH_LIST="8.6;9.0", MAX_JOBS="2")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cell", str(cell), "env"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
    chosen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert chosen["FLASH_ATTN_CUDA_ARCHS"] == "80;90"
    assert "8.6 runs the sm_80 cubin (flash-attn builds one cubin for the 8.x family)" in proc.stdout


# ------------------------------------------------------------------ the rules a cell must pass


def _series(name):
    return compat.torch_table()[name]


def _cuda(name):
    return compat.cuda_table()[name]


def _with_rule(recipe_name, subject, spec, why=""):
    """The recipe with its default version needing ``spec`` of ``subject`` (a real recipe, one range more)."""
    recipe = load_catalogue().get(recipe_name)
    version = replace(recipe.version(None), requires=(Rule(subject, SpecifierSet(spec), why),))
    return replace(recipe, versions={**recipe.versions, version.version: version}), version


def test_compiled_archs_maps_only_what_the_knob_ignores():
    fa = load_catalogue().get("flash-attn").version(None)
    assert compiled_archs(fa, parse_arch_list("8.0;8.6;8.9;9.0")) == (parse_arch_list("8.0;9.0"),
                                                                      "8.6, 8.9 run the sm_80 cubin")
    # Flags merge: 8.6+PTX asks for PTX, which now comes from the sm_80 entry.
    assert compiled_archs(fa, parse_arch_list("8.6+PTX;9.0")) == (parse_arch_list("8.0+PTX;9.0"),
                                                                  "8.6 runs the sm_80 cubin")
    # Nothing to map, a knob without runs_on, or a fixed list (it covers by itself): the request as it is.
    for version, asked in [(fa, "9.0;12.0"), (load_catalogue().get("sageattention").version(None), "8.6;8.9"),
                           (load_catalogue().get("block-sparse-attn").version("0.0.1"), "8.6")]:
        archs = parse_arch_list(asked)
        assert compiled_archs(version, archs) == (archs, "")


@pytest.mark.parametrize("have, want, runs", [
    ("8.0", "8.6", True),  # plain SASS runs on a higher minor of its major
    ("8.6", "8.0", False),
    ("8.0", "9.0", False),  # never across majors
    ("9.0a", "9.0", True),
    ("10.0", "10.3", True),
    ("10.0a", "10.3", False),  # an `a` target only on exactly its cc
    ("10.0", "10.0f", True),
    ("10.3f", "10.0f", True),  # `f`: within the family
    ("10.0a", "10.0f", False),
    ("12.0", "10.0f", False),
])
def test_covers_says_which_cubin_runs_on_which_gpu(have, want, runs):
    assert covers(parse_arch_list(have)[0], parse_arch_list(want)[0]) is runs


def test_expected_archs_follow_emits_and_fixed_lists():
    catalogue = load_catalogue()
    # SageAttention asked for 9.0 compiles 9.0a (wgmma); the flags stay the request's.
    assert str(expected_archs(catalogue.get("sageattention").version("2.2.0"), parse_arch_list("8.0;9.0+PTX"),
                              Version("12.8"))) == "8.0;9.0a+PTX"
    # FA3 always builds 8.0;9.0a: what covers the request is what the wheel must carry.
    assert str(expected_archs(catalogue.get("flash-attn-3").version("3.0.0"), parse_arch_list("8.6;9.0"),
                              Version("12.8"))) == "8.0;9.0a"
    # A fixed list that depends on nvcc (upstream causal-conv1d 1.6.1, setup.py L176-203): CUDA 13
    # drops 7.0 from it. (The catalogue's causal-conv1d patches it to take TORCH_CUDA_ARCH_LIST.)
    import dataclasses

    from imagegen.model.recipes import ArchKnob

    knob = ArchKnob(env=None, style="fixed", ptx="none",
                    fixed=((Version("11.6"), parse_arch_list("6.2;7.0;7.2;7.5;8.0;8.7")), (Version("11.8"), parse_arch_list("9.0")),
                           (Version("12.8"), parse_arch_list("10.0;12.0")), (Version("13.0"), parse_arch_list("10.3;11.0;12.1"))),
                    fixed_dropped=((Version("13.0"), parse_arch_list("6.2;7.0;7.2")),))
    conv = dataclasses.replace(catalogue.get("causal-conv1d").version("1.6.1"), arch=knob)
    asked = parse_arch_list("7.0;8.0;12.0")
    assert str(expected_archs(conv, asked, Version("12.8"))) == "7.0;8.0;12.0"
    assert str(expected_archs(conv, asked, Version("13.0"))) == "8.0;12.0"


def test_compiled_targets_count_a_fixed_packages_own_list_whatever_was_asked():
    catalogue = load_catalogue()
    fa3 = catalogue.get("flash-attn-3").version("3.0.0")
    # FA3 compiles 8.0 and 9.0a for `--arch 9.0` (one asked, two compiled) and for 8.0;8.6;8.9;9.0 alike.
    assert compiled_targets(fa3, parse_arch_list("9.0"), Version("12.8")) == 2
    assert compiled_targets(fa3, parse_arch_list("8.0;8.6;8.9;9.0"), Version("12.8")) == 2
    # ... and nothing with an nvcc older than its list (the plan refuses that cell: see recipe_problems).
    assert compiled_targets(fa3, parse_arch_list("9.0"), Version("12.2")) == 0
    # Every other package compiles the list (SASS + PTX); emits renames a target (9.0 -> 9.0a), adds none.
    sage = catalogue.get("sageattention").version("2.2.0")
    assert compiled_targets(sage, parse_arch_list("8.0;9.0+PTX"), Version("12.8")) == 3


def test_python_and_torch_cuda_problems_name_what_the_series_has():
    assert python_problems(_series("2.9"), "3.9") == ["torch 2.9 supports Python 3.10-3.14; Python 3.9 selected"]
    assert python_problems(_series("2.9"), "3.14") == []
    assert torch_cuda_problems(_series("2.8"), _cuda("cu130")) == [
        "torch 2.8 has no cu130 build (it has cu126, cu128, cu129)"]
    assert torch_cuda_problems(_series("2.8"), _cuda("cu128")) == []


def _rules(name, version, torch, cuda, nvcc, python):
    """rule_problems of a catalogue recipe's version for torch release ``torch``."""
    recipe = load_catalogue().get(name)
    series = _series(".".join(torch.split(".")[:2]))
    return rule_problems(recipe, recipe.version(version), series, torch, _cuda(cuda), Version(nvcc), python)


def _recipe(name, version, torch, cuda, archs, nvcc):
    """recipe_problems of a catalogue recipe's version for ``archs``."""
    recipe = load_catalogue().get(name)
    return recipe_problems(recipe, recipe.version(version), _series(torch), _cuda(cuda), parse_arch_list(archs),
                           Version(nvcc))


def test_rule_problems_say_the_range_why_and_what_passes():
    assert _rules("xformers", "0.0.35", "2.9.1", "cu128", "12.8", "3.12") == [
        "xformers 0.0.35 needs torch >= 2.10 (requirements.txt; built against the torch 2.10 stable ABI);"
        " torch 2.9 selected: use --torch 2.10 or newer, or --version 0.0.33.post2"]
    assert _rules("xformers", "0.0.35", "2.11.0", "cu130", "13.0", "3.12") == []
    (py,) = _rules("flash-attn-3", "3.0.0", "2.8.0", "cu128", "12.8", "3.9")
    assert py.startswith("flash-attn-3 3.0.0 needs Python >= 3.10 (")
    assert py.endswith("Python 3.9 selected: use --python 3.10 or newer, or --version 3.0.0b1")


def test_a_cuda_rule_no_cuda_of_this_torch_meets_suggests_any_torchs():
    # FA3 3.0.0b1 needs nvcc 12.8 exactly; torch 2.12 has no cu128 build, but another torch does (and
    # the version says so itself: it requires torch < 2.12, issue 37).
    why, torch_rule = _rules("flash-attn-3", "3.0.0b1", "2.12.1", "cu130", "13.0", "3.12")
    assert "needs torch < 2.12 (torch 2.12+ has no CUDA 12.8 build" in torch_rule
    assert "needs CUDA == 12.8 (" in why
    assert why.endswith("CUDA 13.0 (cu130) selected: use --cuda 12.8, or --version 3.0.0")


@pytest.mark.parametrize("subject, spec, cell, passing, needs, fix", [
    ("python", "<3.12", {"python": "3.13"}, {"python": "3.11"}, "Python < 3.12", "use --python 3.11 or older"),
    ("python", "!=3.11,!=3.12", {"python": "3.12"}, {"python": "3.13"}, "Python != 3.11, != 3.12",
     "use --python 3.10 or 3.13 or 3.14"),
    # Three parts compare the exact release: torch 2.11.0 is outside, 2.11.1 inside, the next series suggested.
    ("torch", ">=2.11.1", {"torch": "2.11.0"}, {"torch": "2.11.1"}, "torch >= 2.11.1", "use --torch 2.12 or newer"),
    ("cuda", "<13.0", {"nvcc": "13.0"}, {"nvcc": "12.9"}, "CUDA < 13.0", "use --cuda 12.9 or older"),
])
def test_rule_fixes_list_the_values_that_pass(subject, spec, cell, passing, needs, fix):
    recipe, version = _with_rule("xformers", subject, spec)

    def problems(torch="2.11.0", nvcc="13.0", python="3.12"):
        return rule_problems(recipe, version, _series("2.11"), torch, _cuda("cu130"), Version(nvcc), python)

    (why,) = problems(**cell)
    assert why.startswith(f"xformers 0.0.35 needs {needs};")
    # The values that pass with this torch, then another version without the range (0.0.33.post2 has none).
    assert why.split(" selected: ", 1)[1] == f"{fix}, or --version 0.0.33.post2"
    assert problems(**passing) == []


def test_a_range_nothing_in_the_tables_meets_says_so():
    recipe = replace(load_catalogue().get("xformers"), min_cuda=Version("99.0"))  # recipe-wide: every version
    (why,) = rule_problems(recipe, recipe.version(None), _series("2.11"), "2.11.0", _cuda("cu130"), Version("13.0"),
                           "3.12")
    assert why == ("xformers 0.0.35 needs CUDA >= 99.0 (build.min_cuda); CUDA 13.0 (cu130) selected:"
                   " no CUDA in imagegen's tables satisfies it")


def test_recipe_problems_for_a_knob_that_takes_a_list():
    assert _recipe("flash-attn", "2.8.3", "2.8", "cu126", "7.5;8.0+PTX;12.0", "12.6") == [
        "flash-attn 2.8.3 does not support sm_75 (it supports 8.0, 9.0, 10.0, 12.0)",
        "flash-attn 2.8.3 needs CUDA >= 12.8 for sm_120; CUDA 12.6 selected",
        "flash-attn 2.8.3 never embeds PTX (FLASH_ATTN_CUDA_ARCHS takes SASS targets only); drop +PTX"]
    (ptx_only, _) = _recipe("flash-attn", "2.8.3", "2.8", "cu128", "compute_90", "12.8")
    assert ptx_only == ("flash-attn reads FLASH_ATTN_CUDA_ARCHS as SASS targets; a PTX-only entry compute_90"
                        " cannot be expressed")
    assert _recipe("flash-attn", "2.8.3", "2.8", "cu128", "8.0;9.0", "12.8") == []
    assert _recipe("block-sparse-attn", None, "2.8", "cu128", "8.0+PTX;9.0", "12.8") == [
        "block-sparse-attn 0.0.2.post1 embeds PTX only for the newest arch (9.0); ask +PTX only there"]
    assert _recipe("block-sparse-attn", None, "2.8", "cu128", "8.0;9.0+PTX", "12.8") == []


def test_recipe_problems_point_at_another_version_and_family_targets():
    assert _recipe("sageattention", "2.2.0", "2.8", "cu129", "12.1", "12.9") == [
        "sageattention 2.2.0 does not support sm_121 (it supports 8.0, 8.6, 8.9, 9.0, 12.0);"
        " version main does (--version main)"]
    assert _recipe("sageattention", "main", "2.8", "cu128", "10.0f", "12.8") == [
        "sageattention main cannot build family target 10.0f; ask for 10.0 instead"]


def test_recipe_problems_of_a_fixed_list_and_of_torchs_own_parser():
    assert _recipe("flash-attn-3", "3.0.0", "2.8", "cu128", "8.6;12.0+PTX", "12.8") == [
        "flash-attn-3 3.0.0 does not compile sm_120 with CUDA 12.8 (it always builds its own list: 8.0;9.0a)",
        "flash-attn-3 3.0.0 never embeds PTX; drop +PTX"]
    # xformers' list goes through torch's cpp_extension, which refuses what that torch does not know;
    # SageAttention parses its own (parser: package), so the same list passes there.
    assert _recipe("xformers", "0.0.32", "2.6", "cu126", "12.0", "12.9") == [
        "torch 2.6 does not accept 12.0 in TORCH_CUDA_ARCH_LIST (accepted from torch 2.7)"]
    assert _recipe("sageattention", "2.2.0", "2.6", "cu126", "12.0", "12.9") == []


def test_nvcc_problems_name_the_variant_and_the_cuda_to_use():
    assert nvcc_problems_for(parse_arch_list("12.0"), Version("12.6"), _cuda("cu126")) == [
        "sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected: use --cuda 12.8 or newer"]
    # A problem that already says what to do gets no second suggestion.
    assert nvcc_problems_for(parse_arch_list("5.0"), Version("13.0"), _cuda("cu130")) == [
        "sm_50 was dropped in CUDA 13.0; CUDA 13.0 (cu130) selected (use CUDA <= 12.9 or drop 5.0)"]
    assert nvcc_problems_for(parse_arch_list("8.0;9.0"), Version("13.0"), _cuda("cu130")) == []


def test_base_problems_need_nvccs_major_to_be_torchs():
    fl = base_images.flavors()
    image = base_images.resolve_base_image(fl["cuda"], _series("2.8"), "2.8.0", _cuda("cu128"), "3.12")
    assert base_problems(image, _cuda("cu128")) == [] and base_problems(image, _cuda("cu129")) == []
    assert base_problems(image, _cuda("cu130")) == [
        f"{image.ref} has nvcc 12.8, but torch cu130 needs nvcc 13.x (nvcc's major must equal torch's CUDA major);"
        " use a CUDA 13.x image or --cuda 12.x"]
    runpod = base_images.resolve_base_image(fl["runpod"], _series("2.8"), "2.8.0", _cuda("cu128"), "3.12")
    assert "has nvcc 12.8 (its preinstalled torch is a cu128 build), but" in base_problems(runpod, _cuda("cu130"))[0]
    host = replace(image, flavor=fl["native"], nvcc=Version("12.4"))
    assert base_problems(host, _cuda("cu130"))[0].startswith("this host has nvcc 12.4, but torch cu130 needs nvcc 13.x")
    assert base_problems(replace(image, nvcc=None), _cuda("cu130")) == []  # nvcc from PyPI: chosen to fit


def test_cc_key_orders_numerically_and_fmt_version_keeps_major_minor():
    assert sorted(["12.0", "9.0", "8.6", "10.3"], key=cc_key) == ["8.6", "9.0", "10.3", "12.0"]
    assert cc_key("12.1") == (12, 1)
    assert fmt_version(Version("12.8.1")) == "12.8" and fmt_version(Version("13")) == "13.0"
