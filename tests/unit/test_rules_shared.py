"""One source for every rule: the in-build script (imagegen_build.py, what runs inside every builder
image and in native builds) and the library size jobs and write arch knobs by the same module,
imagegen_rules.py. Over a grid of machines (cores x RAM) and every catalogue recipe, with MAX_JOBS and
NVCC_THREADS left to the build (a plain `docker build` of a rendered Dockerfile), the script chooses
what imagegen plans with: the same MAX_JOBS x NVCC_THREADS x EXT_PARALLEL and the same knob string.

Before this module they had drifted: the script sized jobs from MemAvailable (the library from
MemTotal x 0.8: job counts are cache keys and must not move with the page cache) and never lowered
the thread count on a small machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagegen.model.cell_rules import compiled_archs
from imagegen.errors import CompatError
from imagegen.model import jobs
from imagegen.model.arch import ArchList
from imagegen.model.arch_format import as_tuples, format_for
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import choose_cell
from imagegen.render.dockerfile import builder_script, cell_document
from tests.unit.builder_script import BUILDENV, builder_module

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "imagegen" / "shipped" / "builder"




B = builder_module("imagegen_buildenv_rules_shared", BUILDENV)
GRID = [(cpus, ram) for cpus in (1, 2, 4, 16, 64) for ram in (4, 8, 16, 32, 125, 500)]


def catalogue_cells():
    cells = []
    for name in load_catalogue().names():
        recipe = load_catalogue().get(name)
        version = recipe.version(None)
        wanted = ArchList([a for a in version.archs if a.major >= 8][-3:] or list(version.archs)[-1:])
        try:
            cells.append(choose_cell(recipe, version, wanted, torch=None, cuda=None, python=None, flavor="pypi"))
        except CompatError:
            continue
    return cells


CELLS = catalogue_cells()


def test_the_grid_covers_the_catalogue():
    assert {c.recipe.name for c in CELLS} >= {"sageattention", "flash-attn", "causal-conv1d", "block-sparse-attn"}
    # A fixed-arch package (flash-attn 3) whose own list is not the one asked for: both sides must size by its own.
    assert any(c.version.arch.style == "fixed" and c.gencode_targets != c.archs.gencode_targets for c in CELLS)


def test_both_sides_load_the_same_rules_file():
    assert Path(B.rules.__file__).resolve() == (BUILDER / "imagegen_rules.py").resolve()
    assert Path(jobs.rules.__file__).resolve() == (BUILDER / "imagegen_rules.py").resolve()
    # No second copy of a rule left in the script: it reads no MemAvailable, parses no arch itself.
    script = builder_script()
    assert "MemAvailable" not in script and "_ENTRY = re.compile" not in script and "def _cc_key" not in script


def sized_both_ways(monkeypatch, cell, cpus: int, ram: int):
    """On a machine of ``cpus`` cores and ``ram`` GB: the host imagegen plans for, its plan for ``cell``,
    the cell's document, and the environment the in-build script makes from it (MAX_JOBS and
    NVCC_THREADS left to the build, TORCH_CUDA_ARCH_LIST the cell's)."""
    mem_for_builds = ram * jobs.RAM_SHARE
    monkeypatch.setattr(B.rules, "host_facts", lambda: (cpus, mem_for_builds))
    host = jobs.Host(cpus=cpus, mem_gb=mem_for_builds)
    recipe = cell.recipe
    planned = jobs.settings_for(recipe.heaviest_gb_per_thread, recipe.default_nvcc_threads, host,
                                targets=cell.gencode_targets)
    doc = cell_document(cell)
    for var in ("MAX_JOBS", "NVCC_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", str(cell.archs))
    return host, planned, doc, B.build_env(doc)


@pytest.mark.parametrize("cpus, ram", GRID)
def test_script_and_library_size_every_recipe_the_same(monkeypatch, cpus, ram):
    for cell in CELLS:
        recipe = cell.recipe
        _, planned, doc, env = sized_both_ways(monkeypatch, cell, cpus, ram)
        what = f"{recipe.name} on {cpus} cores, {ram} GB"
        if recipe.threads_env:
            assert env[recipe.threads_env] == str(planned.nvcc_threads), what
        if recipe.ext_parallel_env:
            parallel, per_ext = jobs.split_extensions(planned.max_jobs, recipe.ext_parallel_max)
            assert (env[recipe.ext_parallel_env], env["MAX_JOBS"]) == (str(parallel), str(per_ext)), what
        else:
            assert env["MAX_JOBS"] == str(planned.max_jobs), what
        assert B.auto_threads(doc) == planned.nvcc_threads, what
        knob = cell.version.arch
        if knob.style != "fixed":
            mapped, _ = compiled_archs(cell.version, cell.archs)
            kw = {"keep_variant": knob.keep_variant} if knob.style == "numeric" else {}
            assert env[knob.env] == format_for(mapped, knob.style, **kw), what


def test_a_small_machine_gets_fewer_threads_inside_the_build_too(monkeypatch):
    # The drift this module removed: the script kept the recipe's threads whatever the RAM.
    recipe = load_catalogue().get("sageattention")
    cell = choose_cell(recipe, recipe.version(None), parse_arch_list("9.0"), torch="2.11", cuda="13.0",
                       python="3.12", flavor="pypi")
    monkeypatch.setattr(B.rules, "host_facts", lambda: (16, 4 * jobs.RAM_SHARE))
    doc = cell_document(cell)
    planned = jobs.settings_for(recipe.heaviest_gb_per_thread, recipe.default_nvcc_threads, jobs.Host(16, 4 * jobs.RAM_SHARE))
    assert B.auto_threads(doc) == planned.nvcc_threads == 1 < recipe.default_nvcc_threads


@pytest.mark.parametrize("text", ["8.0;8.6;8.9;9.0", "8.6+PTX;9.0a;12.0+PTX", "compute_120", "7.5 8.0,9.0"])
def test_family_mapping_and_formats_agree(text):
    fa = load_catalogue().get("flash-attn").version(None)
    archs = parse_arch_list(text)
    mapped, note = compiled_archs(fa, archs)
    got, line = B.apply_runs_on(B.parse_archs(str(archs)), dict(fa.arch.runs_on), "flash-attn")
    assert got == as_tuples(mapped)
    assert line.split(" (")[0] == note.split(" (")[0] if note else line == ""
    for style in ("numeric", "dotted", "cmake", "gencode"):
        assert B.format_archs(got, style) == format_for(mapped, style)


def test_a_fixed_arch_package_is_sized_by_its_own_list_on_both_sides(monkeypatch):
    # flash-attn 3 compiles sm_80 and sm_90a whatever is asked: `--arch 9.0` is one target asked, two
    # compiled. Sized by the one, a machine got more jobs than its RAM holds (and a cheaper cost label).
    recipe = load_catalogue().get("flash-attn-3")
    cell = choose_cell(recipe, recipe.version(None), parse_arch_list("9.0"), torch=None, cuda=None, python=None,
                       flavor="pypi")
    assert (cell.archs.gencode_targets, cell.gencode_targets) == (1, 2)
    moved = 0
    for cpus, ram in GRID:
        host, planned, _, env = sized_both_ways(monkeypatch, cell, cpus, ram)  # TORCH_CUDA_ARCH_LIST=9.0
        assert (env["MAX_JOBS"], env[recipe.threads_env]) == (str(planned.max_jobs), str(planned.nvcc_threads))
        asked = jobs.settings_for(recipe.heaviest_gb_per_thread, recipe.default_nvcc_threads, host, targets=1)
        moved += asked.max_jobs != planned.max_jobs
    assert moved, "no machine of the grid is sized differently by the list asked for: the test proves nothing"
