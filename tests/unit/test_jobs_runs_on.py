"""The in-build script applies a recipe's ``arch.runs_on`` to an arch list that arrives at build time
(a bake override of TORCH_CUDA_ARCH_LIST, or the GPUs `docker run --gpus all` sees), as the plan
does to the planned list: flash-attn's knob takes 80 but silently ignores 86/89."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagegen.cell_rules import compiled_archs
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan import make_cell
from imagegen.render.dockerfile import cell_document
from tests.unit.builder_script import SCRIPT, builder_module

B = builder_module("imagegen_build_runs_on")


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
