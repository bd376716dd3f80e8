"""The recipe's numerical GPU check inside the Docker build (`--gpu-check-device CDI_DEVICE`): the
rendered Dockerfile (a `# syntax=` line naming a labs frontend, a `gpucheck` stage whose one RUN gets
the CDI device and no network, `wheels` taken from it), checked with BuildKit's own parser (PyPI
`dockerfile`) and hadolint; the plan's handling of a recipe without a gpu_check; hostile devices and
frontends; the CLI flags and `imagegen cdi-spec`. The golden file is regenerated with
`IMAGEGEN_UPDATE_GOLDEN=1 pytest tests/unit/test_gpu_check_in_build.py`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from imagegen import cli
from imagegen.errors import ImagegenError, UnsafeValueError
from imagegen.executors import gpu_access
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.source_tree import recipe_from_source_tree
from imagegen.model.cell import Plan
from imagegen.plan.matrix import DEFAULT_DOCKERFILE_FRONTEND, choose_cell, with_gpu_check
from imagegen.render.dockerfile import render_dockerfile
from tests.unit.test_dockerfile import FIXTURE, GOLDEN, check_structure, instructions, render, run_hadolint

DEVICE = "nvidia.com/gpu=all"
SAGE = {"torch": "2.8", "python": "3.12"}  # sage on runpod, arch 9.0: the golden case
COMMAND = "imagegen render sage --arch 9.0 --flavor runpod --gpu-check-device nvidia.com/gpu=all"


def sage_cell():
    cell, _ = render("sage", "9.0", "runpod", **SAGE)
    assert cell.buildable, cell.problems
    return cell


def gpu_render(cell, device: str = DEVICE, frontend: str | None = None) -> tuple:
    checked = with_gpu_check(Plan(cells=[cell]), device, frontend).cells[0]
    return checked, render_dockerfile(checked, command=COMMAND).dockerfile


def lint(text: str, tmp_path: Path) -> list[dict]:
    """hadolint's findings. Its parser (language-docker) knows RUN's --mount, --network and --security
    flags only: `RUN --device` is a parse error (DL1000) there, though BuildKit's own parser and the
    labs frontend take it. So: that one error on the raw text, at the device's RUN, and nothing at
    all once the flag is taken out (everything else in the file is linted as usual)."""
    raw = run_hadolint(text, tmp_path)
    device_line = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("RUN --network=none --device="))
    assert [(f["code"], f["line"]) for f in raw] == [("DL1000", device_line)], raw
    assert '"--device=' in raw[0]["message"]
    without = "\n".join(re.sub(r" --device=\S+", "", line) if line.startswith("RUN --network=none --device=")
                         else line for line in text.split("\n"))
    assert "--device=" not in without
    return run_hadolint(without, tmp_path)


def stage_of(cmds, line: int) -> str:
    """The name of the stage the instruction at ``line`` belongs to."""
    return [c.value[-1] for n, c in cmds if n == "FROM" and c.start_line <= line][-1]


# ------------------------------------------------------------------------------------------ rendering


def test_the_gpucheck_stage_gets_the_device_and_no_network_and_wheels_come_from_it(tmp_path):
    cell, text = gpu_render(sage_cell())
    assert cell.gpu_check_device == DEVICE and cell.dockerfile_frontend == DEFAULT_DOCKERFILE_FRONTEND
    assert text.splitlines()[0] == "# syntax=docker/dockerfile:1.19-labs"
    assert text.startswith("# syntax=docker/dockerfile:1.19-labs\n# sageattention 2.2.0 for torch")
    assert sum(line.startswith("# syntax") for line in text.splitlines()) == 1
    cmds = instructions(text)
    stages = [c.value[-1] for n, c in cmds if n == "FROM"]
    assert stages == ["imagegen-scripts", "os", "fetch", "toolchain", "base", "audit", "audit-report", "compile", "smoke",
                      "gpucheck", "resume-in", "resume-out", "resume-state", "buildlog", "wheels", "builder"]
    gpucheck = next(c for n, c in cmds if n == "FROM" and c.value[-1] == "gpucheck")
    assert gpucheck.value[0] == "smoke"  # the installed wheel, as the smoke step left it
    # One RUN with the device, in gpucheck; its flags exactly the device and no network.
    device_runs = [c for n, c in cmds if n == "RUN" and any(f.startswith("--device") for f in c.flags)]
    assert len(device_runs) == 1 and stage_of(cmds, device_runs[0].start_line) == "gpucheck"
    run = device_runs[0]
    assert sorted(run.flags) == ["--device=nvidia.com/gpu=all", "--network=none"]
    assert run.value[0] == ("python /imagegen/imagegen_build.py gpu-check --wheels /imagegen/wheelhouse"
                            " --check /imagegen/gpu_check.json")
    # The check document: one JSON line in a heredoc, copied into gpucheck; its code is the recipe's.
    docs = {c.value[-1]: c.heredocs[0].content for _, c in cmds if c.heredocs}
    assert list(docs) == ["/imagegen/toolchain.json", "/imagegen/gpu_check.json"]
    [copy] = [c for n, c in cmds if n == "COPY" and c.heredocs and c.value[-1] == "/imagegen/gpu_check.json"]
    assert stage_of(cmds, copy.start_line) == "gpucheck" and copy.start_line < run.start_line
    assert len(docs["/imagegen/gpu_check.json"].strip().splitlines()) == 1
    doc = json.loads(docs["/imagegen/gpu_check.json"])
    assert doc == {"recipe": "sageattention", "device": DEVICE, "code": cell.recipe.smoke.gpu_check, "requires": []}
    assert "cosine" in doc["code"]
    # wheels: only from gpucheck (a wheel that fails the check is never exported); buildlog has the report.
    [exported] = [c for n, c in cmds if n == "COPY" and stage_of(cmds, c.start_line) == "wheels"]
    assert exported.flags == ("--from=gpucheck",) and exported.value == ("/imagegen/wheelhouse/", "/")
    buildlog = [c for n, c in cmds if n == "COPY" and stage_of(cmds, c.start_line) == "buildlog"]
    assert ("--from=gpucheck",) in [c.flags for c in buildlog]
    assert ("/imagegen/logs/gpu_check.json", "/") in [c.value for c in buildlog]
    # Nothing but gpucheck's RUN sees the device; the smoke step is as before.
    smoke_runs = [c for n, c in cmds if n == "RUN" and stage_of(cmds, c.start_line) == "smoke"]
    assert [c.flags for c in smoke_runs] == [()]
    assert lint(text, tmp_path) == []


def test_what_the_check_imports_beyond_the_wheel_is_installed_before_it_with_the_network(tmp_path):
    # mamba-ssm's selective_scan_interface imports einops at its top; the smoke step installs the wheel
    # alone (--no-deps), and the check runs without a network: the recipe's check_requires go in first.
    cell, _ = render("mamba-ssm", "9.0", "pypi", torch="2.11", python="3.12")
    assert cell.buildable, cell.problems
    assert cell.recipe.smoke.check_requires == ("einops",)
    checked, text = gpu_render(cell)
    cmds = instructions(text)
    runs = [c for n, c in cmds if n == "RUN" and stage_of(cmds, c.start_line) == "gpucheck"]
    assert [r.value[0].split(" ", 2)[2].split(" --")[0] for r in runs] == ["gpu-check-deps", "gpu-check"]
    deps = runs[0]
    assert "--network=none" not in deps.flags and "--mount=type=secret,id=pip_cert" in deps.flags
    doc = json.loads(next(c.heredocs[0].content for _, c in cmds if c.heredocs and c.value[-1] == "/imagegen/gpu_check.json"))
    assert doc["requires"] == ["einops"]
    assert lint(text, tmp_path) == []
    # the in-build step refuses anything but a plain requirement in the check file, before pip runs
    import subprocess
    import sys

    from tests.unit.builder_script import SCRIPT
    check = tmp_path / "check.json"
    cell_file = tmp_path / "cell.json"
    cell_file.write_text(json.dumps({"torch": {"version": "2.11.0"}, "venv": str(tmp_path / "none")}))
    for bad in (["einops; os_name == 'posix'"], ["--index-url=http://evil/ x"], ["x @ https://evil/x.whl"]):
        check.write_text(json.dumps({"requires": bad}))
        proc = subprocess.run([sys.executable, str(SCRIPT), "--cell", str(cell_file), "gpu-check-deps", "--check", str(check)],
                              capture_output=True, text=True)
        assert proc.returncode == 1 and "is not a requirement imagegen installs" in proc.stderr, proc.stderr


def test_the_rest_of_the_dockerfile_is_the_plain_render(tmp_path):
    """The feature adds the syntax line, the gpucheck stage, buildlog's report and wheels' source, and
    changes nothing else; without it the render is the plain one (no syntax line: no registry pull)."""
    plain_cell = sage_cell()
    plain = render_dockerfile(plain_cell, command=COMMAND).dockerfile
    _, text = gpu_render(plain_cell)
    assert not plain.startswith("# syntax") and "gpucheck" not in plain and "--device" not in plain
    assert "gpu_check" not in plain and "GPU check" not in plain
    check_structure(plain, plain_cell)
    head, rest = text.split("\n", 1)
    assert head == "# syntax=docker/dockerfile:1.19-labs"
    start = rest.index("\n\n# The recipe's numerical check on the GPU")
    end = rest.index("\n\n# A build stopped at its budget")
    stripped = (rest[:start] + rest[end:]).replace("COPY --from=gpucheck /imagegen/logs/gpu_check.json /\n", "")
    stripped = stripped.replace(" and the GPU check's (--target", " (--target").replace(" and the GPU check, each", ", each")
    stripped = stripped.replace("COPY --from=gpucheck /imagegen/wheelhouse/", "COPY --from=smoke /imagegen/wheelhouse/")
    assert stripped == plain
    # The cell document (and the inputs hash, the layers' cache keys) does not change with the check.
    assert text.count("IMAGEGEN_INPUTS=") == plain.count("IMAGEGEN_INPUTS=") == 2  # compile and builder
    def inputs(t: str) -> list[str]:
        return [ln for ln in t.splitlines() if "IMAGEGEN_INPUTS=" in ln]
    assert inputs(text) == inputs(plain)


def test_a_frontend_of_ones_own_is_named_by_the_syntax_line(tmp_path):
    frontend = "registry.example:5000/mirror/dockerfile:1.20-labs"
    cell, text = gpu_render(sage_cell(), frontend=frontend)
    assert cell.dockerfile_frontend == frontend
    assert text.splitlines()[0] == f"# syntax={frontend}"
    assert "docker/dockerfile:1.19-labs" not in text
    digest = "docker/dockerfile@sha256:" + "ab" * 32
    _, text = gpu_render(sage_cell(), frontend=digest)
    assert text.splitlines()[0] == f"# syntax={digest}"
    assert lint(text, tmp_path) == []


def test_another_device_name_is_what_the_run_gets():
    _, text = gpu_render(sage_cell(), device="nvidia.com/gpu=0")
    [run] = [c for n, c in instructions(text) if n == "RUN" and c.flags and "--device" in c.flags[-1]]
    assert run.flags == ("--network=none", "--device=nvidia.com/gpu=0")
    assert json.loads(next(c for _, c in instructions(text) if c.heredocs and c.value[-1].endswith("gpu_check.json"))
                      .heredocs[0].content)["device"] == "nvidia.com/gpu=0"


def test_golden_gpucheck_file():
    _, text = gpu_render(sage_cell())
    path = GOLDEN / "sage-runpod-9.0-gpucheck.Dockerfile"
    if os.environ.get("IMAGEGEN_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run IMAGEGEN_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{path.name} differs: review the change, then IMAGEGEN_UPDATE_GOLDEN=1"


def test_a_recipe_without_a_gpu_check_builds_as_before_with_a_note(tmp_path):
    recipe = recipe_from_source_tree(FIXTURE)
    assert recipe.smoke.gpu_check.strip() == ""
    cell = choose_cell(recipe, recipe.version(None), parse_arch_list("9.0"), torch="2.11", cuda=None,
                       python="3.12", flavor="pypi")
    assert cell.buildable, cell.problems
    [checked] = with_gpu_check(Plan(cells=[cell]), DEVICE).cells
    assert checked.gpu_check_device is None and checked.dockerfile_frontend is None
    notes = [n for n in checked.notes if "no smoke.gpu_check" in n]
    assert len(notes) == 1 and recipe.name in notes[0]
    assert checked.buildable and checked.status == cell.status and checked.problems == cell.problems
    text = render_dockerfile(checked).dockerfile
    # The same Dockerfile, its header saying why there is no check.
    [note] = [line for line in text.splitlines() if "no smoke.gpu_check" in line]
    assert note.startswith("#   note ") and text.replace(note + "\n", "") == render_dockerfile(cell).dockerfile
    assert "gpucheck" not in text and "--device" not in text and not text.startswith("# syntax")
    check_structure(text, checked)


def test_a_mixed_plan_checks_only_the_cells_that_have_a_gpu_check():
    local = recipe_from_source_tree(FIXTURE)
    tiny = choose_cell(local, local.version(None), parse_arch_list("9.0"), torch="2.11", cuda=None, python="3.12",
                       flavor="pypi")
    sage = sage_cell()
    cells = with_gpu_check(Plan(cells=[sage, tiny]), DEVICE).cells
    assert [c.gpu_check_device for c in cells] == [DEVICE, None]
    assert not any("no smoke.gpu_check" in n for n in cells[0].notes)
    assert any("no smoke.gpu_check" in n for n in cells[1].notes)


# ------------------------------------------------------------------------------------ hostile values


HOSTILE_DEVICES = ["nvidia.com/gpu=all;rm -rf /", "nvidia.com/gpu=all\nRUN x", "nvidia.com/gpu", "", "a b/c=d",
                   "--privileged", "nvidia.com/gpu=all --privileged", "nvidia.com/gpu=$(id)", "nvidia.com/gpu=all\\",
                   "nvidia.com/gpu=${X}", "nvidia.com/gpu=all\r\nRUN x", "nvidia.com/gpu=all \\\n--security=insecure",
                   "nvidia.com/gpu=all\u2028x", "Nvidia.com/gpu=all", "/gpu=all", "nvidia.com/=all"]
HOSTILE_FRONTENDS = ["docker/dockerfile:1.19-labs\nRUN x", "x y", "docker/dockerfile:1.19-labs\r\nFROM scratch",
                     "docker/dockerfile:$(id)", "Docker/Dockerfile", "", "-", "docker/dockerfile:1.19-labs #x"]


@pytest.mark.parametrize("device", HOSTILE_DEVICES)
def test_a_hostile_device_is_refused(device):
    with pytest.raises(UnsafeValueError) as info:
        with_gpu_check(Plan(cells=[sage_cell()]), device)
    assert "--gpu-check-device" in str(info.value)


@pytest.mark.parametrize("frontend", HOSTILE_FRONTENDS)
def test_a_hostile_frontend_is_refused(frontend):
    with pytest.raises(UnsafeValueError) as info:
        with_gpu_check(Plan(cells=[sage_cell()]), DEVICE, frontend)
    assert "--dockerfile-frontend" in str(info.value)


@pytest.mark.parametrize(("device", "frontend"), [(d, None) for d in HOSTILE_DEVICES if d]
                         + [(DEVICE, f) for f in HOSTILE_FRONTENDS])
def test_render_refuses_a_hostile_value_put_on_the_cell_directly(device, frontend):
    """render_dockerfile checks the cell's values itself (a Cell made without with_gpu_check)."""
    from dataclasses import replace
    cell = replace(sage_cell(), gpu_check_device=device, dockerfile_frontend=frontend)
    with pytest.raises(ImagegenError):
        render_dockerfile(cell)


def test_legitimate_device_names_pass():
    for device in ("nvidia.com/gpu=all", "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-6f2a1c3e-0b1d-4c2e-9a8b-1234567890ab",
                   "nvidia.com/mig=0:1", "amd.com/gpu=all", "example-vendor.io/device_class=x.y"):
        assert with_gpu_check(Plan(cells=[sage_cell()]), device).cells[0].gpu_check_device == device


# ------------------------------------------------------------------------------------------------ CLI


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith("imagegen: error:") and len(lines[0]) < 400, lines[0]
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def test_cli_frontend_without_device_is_a_usage_error(capsys):
    code, out, err = run_cli(capsys, "render", "sage", "--arch", "9.0", "--dockerfile-frontend", "x")
    assert code == 2 and out == ""
    assert "--gpu-check-device" in one_error(err)


def test_cli_refuses_a_hostile_device_in_one_line(capsys):
    code, out, err = run_cli(capsys, "render", "sage", "--arch", "9.0", "--gpu-check-device", "nvidia.com/gpu=all;rm")
    assert code != 0 and out == ""
    line = one_error(err)
    assert "--gpu-check-device" in line and "is not allowed" in line
    code, out, err = run_cli(capsys, "render", "sage", "--arch", "9.0", "--gpu-check-device", DEVICE,
                             "--dockerfile-frontend", "docker/dockerfile:1.19-labs\nRUN id")
    assert code != 0 and out == "" and "--dockerfile-frontend" in one_error(err)


@pytest.mark.parametrize("argv", [["--gpu-check-device", ""], ["--gpu-check-device="],
                                  ["--gpu-check-device", DEVICE, "--dockerfile-frontend", ""]])
def test_cli_an_empty_value_is_refused_not_taken_for_no_flag(capsys, argv):
    """`--gpu-check-device "$DEVICE"` with the variable unset must not build without the check."""
    code, out, err = run_cli(capsys, "render", "sage", "--arch", "9.0", *argv)
    assert code == 2 and out == "" and "is not allowed" in one_error(err)


def test_cli_renders_the_gpucheck_stage(capsys):
    code, out, err = run_cli(capsys, "render", "sage", "--arch", "9.0", "--gpu-check-device", DEVICE)
    assert code == 0, err
    assert out.splitlines()[0] == f"# syntax={DEFAULT_DOCKERFILE_FRONTEND}"
    cmds = instructions(out)
    assert "gpucheck" in [c.value[-1] for n, c in cmds if n == "FROM"]
    assert any(n == "RUN" and "--device=nvidia.com/gpu=all" in c.flags for n, c in cmds)
    assert [c.flags for n, c in cmds if n == "COPY" and stage_of(cmds, c.start_line) == "wheels"] == [("--from=gpucheck",)]
    # The re-render comment (the line after the syntax line's header) carries the flag.
    assert "--gpu-check-device nvidia.com/gpu=all" in out.splitlines()[2]
    code, out, err = run_cli(capsys, "render", "sage", "--arch", "9.0", "--gpu-check-device", DEVICE,
                             "--dockerfile-frontend", "docker/dockerfile:1.14-labs")
    assert code == 0, err
    assert out.splitlines()[0] == "# syntax=docker/dockerfile:1.14-labs"


def test_cli_render_without_the_flag_is_unchanged(capsys):
    code, out, err = run_cli(capsys, "render", "sage", "--arch", "9.0")
    assert code == 0, err
    assert out.startswith("# sageattention 2.2.0 for torch") and "gpucheck" not in out and "--device" not in out


@pytest.mark.parametrize("shell", ["powershell", "cmd"])
@pytest.mark.parametrize("flag", [["--gpu-check-device", DEVICE], ["--dockerfile-frontend", DEFAULT_DOCKERFILE_FRONTEND]])
def test_cli_a_windows_script_refuses_the_gpu_check_flags(capsys, shell, flag):
    code, out, err = run_cli(capsys, "render", "sage", "--shell", shell, *flag)
    assert code == 2 and out == ""
    assert "does not apply to --shell" in one_error(err)


def test_cli_a_native_build_refuses_the_gpu_check_flags(capsys, tmp_path):
    """A native build has no build step to hand a device to: the flag is refused, not ignored."""
    for flag in (["--gpu-check-device", DEVICE], ["--dockerfile-frontend", DEFAULT_DOCKERFILE_FRONTEND],
                 ["--gpu-check-device", ""]):
        code, out, err = run_cli(capsys, "build", "sage", "--native", *flag, "--out", str(tmp_path / "o"),
                                 "--work", str(tmp_path / "w"))
        assert code == 2 and out == ""
        assert "--native" in one_error(err)
    assert list(tmp_path.iterdir()) == []


def test_cli_bake_writes_the_gpucheck_dockerfile(capsys, tmp_path, monkeypatch):
    from imagegen.render import bakefiles
    from tests.unit import bake_print_stand_in
    monkeypatch.setattr(bakefiles, "print_bake", bake_print_stand_in.print_bake)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "bake", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0",
                           "--flavor", "runpod", "--gpu-check-device", DEVICE, "-f", "b.hcl")
    assert code == 0, err
    [dockerfile] = list((tmp_path / "dockerfiles").rglob("*.Dockerfile"))
    text = dockerfile.read_text()
    assert text.splitlines()[0] == f"# syntax={DEFAULT_DOCKERFILE_FRONTEND}"
    assert any(n == "RUN" and "--device=nvidia.com/gpu=all" in c.flags for n, c in instructions(text))
    code, _, err = run_cli(capsys, "bake", "sage", "--arch", "9.0", "--gpu-check-device", "x;y", "-f", "c.hcl")
    assert code == 2 and "--gpu-check-device" in one_error(err)
    assert not (tmp_path / "c.hcl").exists()


@pytest.mark.skipif(any(Path("/dev").glob("nvidia*")), reason="this host has NVIDIA device nodes")
def test_cli_cdi_spec_without_a_gpu_exits_8_in_one_line(capsys, tmp_path):
    code, out, err = run_cli(capsys, "cdi-spec")
    assert code == 8 and out == ""
    assert "no NVIDIA device nodes" in one_error(err)
    code, out, err = run_cli(capsys, "cdi-spec", "-o", str(tmp_path / "spec.json"))
    assert code == 8 and out == "" and not (tmp_path / "spec.json").exists()
    one_error(err)


def test_cli_cdi_spec_writes_the_spec_of_the_hosts_driver(capsys, tmp_path, monkeypatch):
    edits = gpu_access.DriverEdits(nodes=(("/dev/nvidiactl", "/dev/nvidiactl"), ("/dev/nvidia0", "/dev/nvidia0")),
                                   mounts=(("/usr/local/nvidia", "/usr/local/nvidia"),),
                                   env=("LD_LIBRARY_PATH=/usr/local/nvidia/lib64",), detail="2 device nodes and a driver")
    monkeypatch.setattr(gpu_access, "driver_edits", lambda *a, **k: edits)
    code, out, err = run_cli(capsys, "cdi-spec")
    assert code == 0, err
    assert json.loads(out) == gpu_access.cdi_spec(edits)
    target = tmp_path / "imagegen-nvidia.json"
    code, out, err = run_cli(capsys, "cdi-spec", "-o", str(target))
    assert code == 0 and out == "" and "nvidia.com/gpu=all" in err
    assert json.loads(target.read_text())["devices"][0]["name"] == "all"
    # Device nodes but no driver libraries: exit 8, saying what is missing.
    missing = gpu_access.GpuAccess("devices", (), "device nodes /dev/nvidiactl but no libcuda.so.1", "install the driver")
    monkeypatch.setattr(gpu_access, "driver_edits", lambda *a, **k: missing)
    code, out, err = run_cli(capsys, "cdi-spec")
    assert code == 8 and out == "" and "no libcuda.so.1" in one_error(err)
