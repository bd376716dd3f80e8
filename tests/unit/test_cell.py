"""A cell and a plan as data (imagegen.model.cell): the names, paths and labels a cell gives every later
step, where its torch comes from, a plan's views and per-cell changes, and a cell's result."""

from __future__ import annotations

from dataclasses import replace
import json

from packaging.version import Version

from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import (
    BUILDABLE,
    DEFAULT_PLATFORM,
    REJECTED,
    SKIPPED,
    WINDOWS_BASE_REF,
    CellResult,
    Plan,
    WindowsHost,
)
from imagegen.model.cell_rules import FixWords
from imagegen.plan.matrix import windows_plan
from tests.unit.catalogue_cells import catalogue_cell as cell_of

CAT = load_catalogue()


def test_a_cells_names_are_safe_for_bake_and_say_what_it_is():
    c = cell_of("sage", "8.0;12.0+PTX", torch="2.8", cuda="12.8", python="3.12")
    assert c.name == "sage-2_2_0-torch2_8-cu128-py312"  # bake refuses dots: [a-zA-Z0-9_-] only
    assert c.platform == DEFAULT_PLATFORM and c.buildable
    arm = replace(c, platform="linux/arm64")
    assert arm.name == "sage-2_2_0-torch2_8-cu128-py312-arm64"  # one target per platform
    assert c.local_version == "cu128torch2.8"
    assert c.describe() == "sageattention 2.2.0 torch 2.8.0 cu128 py3.12 arch 8.0;12.0+PTX [runpod]"


def test_a_cells_wheel_folder_follows_its_layout():
    c = cell_of("fa2", "8.0", flavor="manylinux", version="2.8.3")
    assert c.wheel_dir == "flash-attn-2.8.3/torch2.8/cu128"
    custom = replace(c, layout="fa{version}/torch{torch}/{cuda}/py{py}")  # seed 001's team layout, per Python
    assert custom.wheel_dir == "fa2.8.3/torch2.8/cu128/py312"


def test_a_mapped_arch_request_is_described_as_asked_and_as_compiled():
    c = cell_of("fa2", "8.0;8.6;8.9;9.0", flavor="manylinux")
    assert str(c.requested_archs) == "8.0;8.6;8.9;9.0" and str(c.archs) == "8.0;9.0"
    assert "arch 8.0;8.6;8.9;9.0 (compiled as 8.0;9.0)" in c.describe()


def test_a_cells_nvcc_is_its_base_images_else_the_cuda_asked_for():
    runpod = cell_of("sage", "9.0", torch="2.9", cuda="12.8")
    assert runpod.base.nvcc == Version("12.8.1") and runpod.nvcc == Version("12.8.1")
    custom = cell_of("sage", "9.0", torch="2.11", cuda="13.0", flavor="pypi", base_image="my/image:1")
    assert custom.base.nvcc is None and custom.nvcc == Version("13.0")


def test_a_cells_gencode_targets_are_what_it_compiles_not_what_was_asked():
    # flash-attn 3 compiles sm_80 and sm_90a for `--arch 9.0`; the wheel must carry only sm_90a.
    fa3 = cell_of("fa3", "9.0", torch="2.9", cuda="12.8")
    assert (fa3.archs.gencode_targets, fa3.gencode_targets, str(fa3.expected_archs)) == (1, 2, "9.0a")
    assert cell_of("sage", "8.0;9.0+PTX", torch="2.9", cuda="12.8").gencode_targets == 3


def test_torch_from_of_each_kind_of_base():
    assert cell_of("sage", "9.0", torch="2.9", cuda="12.9").torch_from == "image"
    assert cell_of("sage", "9.0", torch="2.9", cuda="13.0").torch_from == "image"  # the cu1300 image's 2.9.1 is cu130
    assert cell_of("sage", "9.0", torch="2.8", cuda="13.0").status == REJECTED  # its 2.8.0 is a cu129 build
    assert cell_of("sage", "9.0", torch="2.9.0", cuda="12.8").torch_from == "venv"  # the image has 2.9.1, not 2.9.0
    assert cell_of("sage", "9.0", torch="2.10", cuda="12.8").torch_from == "venv"
    custom = cell_of("sage", "9.0", torch="2.11", cuda="13.0", flavor="pypi", base_image="my/image:1")
    assert custom.torch_from == "image-or-venv"
    assert "the image's own if it has exactly that" in custom.torch_from_text()
    assert cell_of("sage", "9.0", torch="2.11", cuda="12.8", flavor="cuda").torch_from == "venv"


def test_a_windows_hosts_toolkit_is_its_nvcc_and_its_fix_words_its_flags():
    sage = CAT.get("sage")
    host = WindowsHost(toolkits=(("cu128", "12.8.1"),), fixes=FixWords(cuda="use --windows-cuda {}"))
    plan = windows_plan([(sage, sage.version("2.2.0"))], [parse_arch_list("12.0")], host, torch=["2.8"],
                        cuda=["12.8", "12.6"])
    assert plan.buildable[0].base.nvcc == Version("12.8.1")
    assert plan.rejected[0].problems == ("sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected: use --windows-cuda"
                                         " 12.8 or newer",)


def test_a_windows_host_base_is_native_msvc_with_the_toolkit_it_names():
    host = WindowsHost(toolkits=(("cu128", "12.8.1"),))
    sage = CAT.get("sage")
    [c] = windows_plan([(sage, sage.version("2.2.0"))], [parse_arch_list("12.0")], host, torch=["2.8"],
                       cuda=["12.8"], python=["3.12"]).cells
    assert c.base.ref == WINDOWS_BASE_REF and c.base.flavor.name == "native" and c.base.python == "py -3.12"
    assert c.base.nvcc == Version("12.8.1") and c.torch_from == "host"
    assert WindowsHost().base(c.cuda, "3.11").nvcc == Version("12.8")  # no installer named: the variant's own


def test_a_plans_views_split_its_cells_by_status_and_each_maps_a_change():
    ok = cell_of("sage", "9.0")
    bad = cell_of("sage", "12.0", cuda="12.6")  # sm_120 needs CUDA 12.8
    skip = replace(ok, status=SKIPPED)
    plan = Plan(cells=[ok, bad, skip])
    assert (bad.status, plan.buildable, plan.rejected, plan.skipped) == (REJECTED, [ok], [bad], [skip])
    assert ok.status == BUILDABLE
    relabelled = plan.each(lambda c: replace(c, layout="w/{cuda}"))
    assert [c.wheel_dir for c in relabelled.cells] == ["w/cu128", "w/cu126", "w/cu128"]
    assert plan.cells[0].layout != "w/{cuda}"  # the plan it came from is unchanged


def test_a_cell_result_is_plain_json(tmp_path):
    cell = cell_of("sage", "9.0")
    result = CellResult(cell, "built", wheel=tmp_path / "w.whl", log=tmp_path / "b.log", seconds=61.26,
                                   verify={"ok": True}, ccache={"hits": 3, "misses": 1, "hit_rate": 0.75})
    as_dict = result.as_dict()
    assert as_dict == {"cell": cell.name, "status": "built", "wheel": str(tmp_path / "w.whl"),
                       "log": str(tmp_path / "b.log"), "seconds": 61.3, "error": "", "verify": {"ok": True},
                       "smoke": None, "ccache": {"hits": 3, "misses": 1, "hit_rate": 0.75}, "audit": None}
    assert json.loads(json.dumps(as_dict)) == as_dict
    failed = CellResult(cell, "failed", error="the build failed", log_tail=["x"]).as_dict()
    assert (failed["wheel"], failed["log"], failed["error"]) == (None, None, "the build failed")
    assert "log_tail" not in failed

