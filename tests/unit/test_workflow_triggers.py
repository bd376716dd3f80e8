"""When `imagegen ci github`'s workflow runs (`--on`): by default a manual run, tags v* and pushes to the default
branch that touch what the builds are made of, not every push to every branch (a team's flash-attn matrix is
hours of runners per run); --on chooses, each value checked before it reaches `on:`, and every workflow
passes actionlint."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from imagegen.commands import ci as command
from imagegen.errors import UsageError
from tests.unit import bake_print_stand_in as stand_in
from tests.unit import test_workflow
from tests.unit.test_workflow import _lint
from tests.workflow_cli import generate, imagegen, parser

ROOT = Path(__file__).resolve().parents[2]
REPO_PATHS = ["docker-bake.hcl", "dockerfiles/**", "imagegen/shipped/builder/**"]

actionlint = test_workflow.actionlint  # the fixture, shared with test_workflow


@pytest.fixture(autouse=True)
def no_buildx(monkeypatch):
    monkeypatch.setattr("imagegen.render.bakefiles.print_bake", stand_in.print_bake)
    monkeypatch.setattr(command, "default_branch", lambda root: "main")  # whatever this clone's origin says


def test_the_default_is_a_manual_run_tags_and_the_default_branch_touching_the_build(tmp_path, actionlint):
    text, doc = generate(tmp_path)
    assert doc["on"] == {"push": {"branches": ["main"], "tags": ["v*"], "paths": REPO_PATHS},
                         "workflow_dispatch": None}
    assert "# Runs on: a manual run; tags v*; pushes to main touching docker-bake.hcl, dockerfiles/**" in text
    assert "--on" not in text.splitlines()[1]  # the default: not on the command line that writes it again
    _lint(actionlint, tmp_path / "imagegen.yml")


def test_the_workflow_file_inside_the_checkout_is_one_of_the_paths(monkeypatch):
    monkeypatch.chdir(ROOT)
    opts = command.options_from_args(parser().parse_args(["ci", "github", "-o", ".github/workflows/imagegen.yml"]))
    triggers = command.default_triggers(opts, ROOT, stand_in.print_bake(Path("docker-bake.hcl"), ROOT))
    assert triggers.paths == (*REPO_PATHS, ".github/workflows/imagegen.yml")


def test_the_default_branch_is_origin_s(tmp_path, monkeypatch):
    monkeypatch.undo()  # the real default_branch
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert command.default_branch(tmp_path) == "main"  # no origin
    subprocess.run(["git", "-C", str(tmp_path), "symbolic-ref", "refs/remotes/origin/HEAD",
                    "refs/remotes/origin/trunk"], check=True)
    assert command.default_branch(tmp_path) == "trunk"


@pytest.mark.parametrize("argv, want", [
    (["--on", "dispatch"], {"workflow_dispatch": None}),
    (["--on", "tag:v*", "--on", "tag:release-*"], {"push": {"tags": ["v*", "release-*"]}}),
    (["--on", "branch:main", "--on", "paths:recipes/**,docker-bake.hcl", "--on", "dispatch"],
     {"push": {"branches": ["main"], "paths": ["recipes/**", "docker-bake.hcl"]}, "workflow_dispatch": None}),
    (["--on", "pr", "--on", "paths:docker-bake.hcl"], {"pull_request": {"paths": ["docker-bake.hcl"]}}),
    (["--on", "pr"], {"pull_request": None}),
    (["--on", "push", "--on", "dispatch"], {"push": None, "workflow_dispatch": None}),  # as before --on
    (["--on", "branch:releases/**", "--on", "branch:!releases/old"], {"push": {"branches": ["releases/**",
                                                                                             "!releases/old"]}}),
])
def test_on_chooses_and_regenerates(tmp_path, argv, want, actionlint):
    text, doc = generate(tmp_path, *argv)
    assert doc["on"] == want
    _lint(actionlint, tmp_path / "imagegen.yml")
    again = shlex.split(text.splitlines()[1].removeprefix("# Regenerate with: "))
    assert again[:3] == ["imagegen", "ci", "github"] and all(a in again for a in argv)
    at = again.index("--output")
    del again[at:at + 2]
    assert generate(tmp_path, *again[3:], name="again.yml")[0] == text.replace(
        str(tmp_path / "imagegen.yml"), str(tmp_path / "again.yml"))


def test_the_publish_job_runs_on_tags_and_manual_runs(tmp_path):
    _, doc = generate(tmp_path, "--publish", "hf:team/wheels", "--on", "tag:v*")
    assert doc["on"] == {"push": {"tags": ["v*"]}} and "publish" in doc["jobs"]


@pytest.mark.parametrize("argv, says", [
    (["--on", "tag:${{ github.head_ref }}"], "--on tag '${{ github.head_ref }}' is not allowed"),
    (["--on", "branch:main\nx: y"], "--on branch"),
    (["--on", "branch:\"main\""], "--on branch"),
    (["--on", "tag:a b"], "--on tag"),
    (["--on", "paths:../secrets/**", "--on", "branch:main"], "relative to the repository's top folder"),
    (["--on", "paths:/etc/**", "--on", "branch:main"], "--on paths"),
    (["--on", "tag:"], "give a pattern after the colon"),
    (["--on", "schedule:0 0 * * *"], "give one of dispatch, push, pr, tag:PATTERN"),
    (["--on", "everything"], "give one of dispatch, push, pr"),
    (["--on", "push", "--on", "tag:v*"], "every push already"),
    (["--on", "paths:docker-bake.hcl"], "give --on branch:main or --on pr too"),
    (["--on", "branch:main", "--publish", "hf:team/wheels"], "add --on dispatch or --on tag:v*"),
])
def test_bad_triggers_are_one_line_and_write_nothing(tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "wf.yml"
    code, stdout, stderr = imagegen("ci", "github", "--output", str(out), *argv)
    assert code == UsageError.exit_code and stderr.count("\n") == 1 and says in stderr, stderr
    assert stderr.startswith("imagegen: error: ") and not stdout and not out.exists()


def test_a_windows_only_workflow_filters_on_its_own_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8",
                            "-o", "wf.yml")
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "wf.yml").read_text())
    assert doc["on"] == {"push": {"branches": ["main"], "tags": ["v*"], "paths": ["wf.yml"]}, "workflow_dispatch": None}
