"""linux/arm64 cells (issue 21): --platform as a matrix axis, what each flavor and torch offer on arm64,
the archs whose GPUs sit in arm64 hosts only, and what reaches the Dockerfile and the bake file.

buildx's own reading of an arm64 target is in tests/integration/test_bake_print.py; an arm64 build of
the fixture under QEMU is recorded in docs/records/verification.md ("linux/arm64 under QEMU")."""

from __future__ import annotations

import pytest

from imagegen.cli import main
from imagegen.errors import UsageError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import BUILDABLE, REJECTED, Plan
from imagegen.plan.matrix import make_cell
from imagegen.plan.platforms import parse_platforms, with_platforms
from imagegen.render.bake import build_definition
from imagegen.render.dockerfile import render_dockerfile

CAT = load_catalogue()


def cells(recipe: str, torch: str, cuda: str, flavor: str, arch: str = "9.0", platforms=("linux/amd64", "linux/arm64")):
    r = CAT.get(recipe)
    cell = make_cell(r, r.version(None), torch, cuda, "3.12", parse_arch_list(arch), flavor)
    return with_platforms(Plan(cells=[cell]), platforms).cells


@pytest.mark.parametrize("given, want", [
    (["arm64"], ("linux/arm64",)), (["aarch64", "linux/arm64"], ("linux/arm64",)),
    (["linux/amd64", "arm64"], ("linux/amd64", "linux/arm64")), (["x86_64"], ("linux/amd64",)),
])
def test_platform_names(given, want):
    assert parse_platforms(given) == want


@pytest.mark.parametrize("bad", ["linux/riscv64", "windows/amd64", "arm", "", "linux/arm64;rm -rf /", "linux/arm64\n"])
def test_an_unknown_platform_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="linux/amd64 and linux/arm64"):
        parse_platforms([bad])


def test_an_arm64_cell_has_its_own_name_and_the_amd64_cell_keeps_its_own():
    amd, arm = cells("sage", "2.11", "13.0", "pypi")
    assert amd.name == "sage-2_2_0-torch2_11-cu130-py312"
    assert arm.name == "sage-2_2_0-torch2_11-cu130-py312-arm64"
    assert amd.status == arm.status == BUILDABLE
    assert amd.wheel_dir == arm.wheel_dir  # one folder: the wheels' platform tags differ


def test_runpod_has_no_arm64_images():
    amd, arm = cells("sage", "2.9", "12.8", "runpod")
    assert amd.status == BUILDABLE and arm.status == REJECTED
    assert "the runpod flavor has no linux/arm64 images" in arm.problems[-1]


def test_manylinux_arm64_uses_pytorchs_aarch64_builder_without_the_x86_64_fallback():
    amd, arm = cells("sage", "2.9", "12.8", "manylinux")
    assert amd.base.ref == "pytorch/manylinux2_28-builder:cuda12.8" and amd.base.fallbacks
    assert arm.base.ref == "pytorch/manylinuxaarch64-builder:cuda12.8" and arm.base.fallbacks == ()
    assert arm.status == BUILDABLE
    assert not any("sameli" in n for n in arm.notes)
    _, no_image = cells("sage", "2.9", "13.2", "manylinux")
    assert no_image.status == REJECTED and "manylinuxaarch64-builder has no CUDA 13.2 image" in no_image.problems[-1]


def test_torch_from_pypi_has_cuda_on_aarch64_from_2_11_and_the_index_from_2_7():
    _, old = cells("sage", "2.9", "13.0", "pypi")
    assert old.status == REJECTED and "CUDA aarch64 wheels start at torch 2.11" in old.problems[-1]
    _, index_old = cells("sage", "2.6", "12.6", "manylinux")
    assert index_old.status == REJECTED and "start at torch 2.7" in index_old.problems[-1]
    _, index_new = cells("sage", "2.7", "12.8", "manylinux")
    assert index_new.status == BUILDABLE


def test_an_arch_of_arm64_hosts_only_is_explained_on_amd64():
    # causal-conv1d compiles 8.7 (Jetson Orin); Orin modules are aarch64 systems
    amd, arm = cells("causal-conv1d", "2.9", "12.8", "cuda", arch="8.7;9.0")
    assert any("8.7 (Jetson Orin) GPUs sit in linux/arm64 hosts only" in n for n in amd.notes)
    assert not any("8.7 (Jetson Orin)" in n for n in arm.notes)


def test_the_dockerfile_and_the_bake_target_name_the_platform(tmp_path):
    amd, arm = cells("sage", "2.11", "13.0", "pypi")
    arm_r, amd_r = render_dockerfile(arm), render_dockerfile(amd)
    text = arm_r.dockerfile
    assert "archs 9.0, linux/arm64\n" in text and "docker build --platform linux/arm64 " in text
    assert "--platform" not in amd_r.dockerfile
    # everything below the header comments is the amd64 cell's, but for the cell's name in its document
    # and the inputs hash (of that document: an arm64 wheel is another wheel)
    assert arm_r.inputs_hash != amd_r.inputs_hash
    body = lambda r: [ln for ln in r.dockerfile.replace(r.inputs_hash, "HASH").splitlines()  # noqa: E731
                      if not ln.startswith("#") and "inputs" not in ln.lower()]
    assert [a.replace("-arm64", "") for a in body(arm_r)] == body(amd_r)
    definition = build_definition(Plan(cells=[amd, arm]), out_dir="wh", root=tmp_path)
    targets = definition.as_dict()["target"]
    assert targets[arm.name]["platforms"] == ["linux/arm64"] and "platforms" not in targets[amd.name]


def test_cli_render_takes_one_platform_and_plan_shows_the_column(capsys):
    assert main(["render", "sage", "--arch", "9.0", "--flavor", "pypi", "--torch", "2.11", "--platform", "arm64"]) == 0
    assert "linux/arm64" in capsys.readouterr().out
    assert main(["render", "sage", "--arch", "9.0", "--platform", "arm64", "--flavor", "runpod"]) == 3  # no arm64 image
    assert "no linux/arm64 images" in capsys.readouterr().err
    assert main(["plan", "sage", "--arch", "9.0", "--flavor", "pypi", "--torch", "2.11", "--cuda", "13.0",
                 "--python", "3.12", "--platform", "amd64,arm64"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:8] == ["STATUS", "RECIPE", "VERSION", "TORCH", "CUDA", "PY", "PLATFORM", "ARCHS"]
    assert main(["plan", "sage", "--arch", "9.0", "--torch", "2.9", "--cuda", "12.8", "--python", "3.12"]) == 0
    assert "PLATFORM" not in capsys.readouterr().out  # no column for a plain amd64 plan


def test_a_native_build_refuses_another_platform_in_one_line(capsys):
    assert main(["build", "sage", "--native", "--arch", "9.0", "--platform", "arm64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--platform" in err
