"""The served index updated incrementally (issue 36 item 4), replayed with real parts: moto's real S3 server,
the bucket served over HTTP as S3's website endpoint serves one (tests/publish_servers.BucketSite), the
publish job's Index and Publish steps taken from the workflow `imagegen ci github --publish
s3://BUCKET/PREFIX,layout=wheelhouse --skip-published URL` writes and run with bash and the real imagegen CLI,
then a real pip against what was published, and the build jobs' "Already published?" step against it.

Run 1 publishes the cp311 cell's wheel; run 2, another wheelhouse, the cp310 cell's wheel of the same folder
(``tiny-kernel-0.1.0/torch2.11/cu130``: one manifest, two cells). After run 2, `pip download` finds BOTH
wheels through ``URL/simple/`` and ``URL/cu130/simple/`` (pip checks each against the page's sha256), and the
published manifest lists both cells, so the check step skips both. The workflow's publish job also runs
`imagegen collect`, which is not replayed here (it needs a builder's export and its build records): the
wheelhouses are placed as collect places them. Needs pip in this interpreter; no network beyond 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from imagegen.wheelhouse import collect
from tests.publish_servers import BucketSite, MotoS3, rebuilt
from tests.unit import bake_print_stand_in
from tests.unit.executor_fixtures import WHEEL, tiny_cell
from tests.workflow_cli import generate

pytestmark = pytest.mark.integration
BUCKET = "wheels-site"
PREFIX = "whl/"
FOLDER = "tiny-kernel-0.1.0/torch2.11/cu130"
CP310 = WHEEL.name.replace("cp311-cp311", "cp310-cp310")
REQUIREMENT = "tiny-kernel==0.1.0+cu130torch2.11"
AWS = {"AWS_ACCESS_KEY_ID": "AKIDMERGE", "AWS_SECRET_ACCESS_KEY": "merge-test-SECRET-0123456789",
       "AWS_REGION": "us-east-1"}


def workflow(tmp_path: Path, monkeypatch, url: str) -> dict:
    """The steps of the workflow ci github writes for this bucket: the publish job's and the build job's check."""
    monkeypatch.setattr("imagegen.render.bakefiles.print_bake", bake_print_stand_in.print_bake)
    _, doc = generate(tmp_path, "--skip-published", url, "--publish", f"s3://{BUCKET}/{PREFIX},layout=wheelhouse",
                      "--imagegen-from", "imagegen-wheels[publish] @ git+https://github.com/octo/imagegen@v0.1.0")
    publish = {s["name"]: s for s in doc["jobs"]["publish"]["steps"]}
    check = next(s for s in doc["jobs"]["build"]["steps"] if s["name"] == "Already published?")
    return {"index": publish["Index"], "publish": publish["Publish"], "check": check}


def runner_temp(tmp_path: Path, name: str, wheelhouse: Path) -> Path:
    """$RUNNER_TEMP of a publish job: imagegen installed at imagegen/bin/imagegen, the run's wheelhouse."""
    temp = tmp_path / name
    (temp / "imagegen" / "bin").mkdir(parents=True)
    (temp / "imagegen" / "bin" / "imagegen").symlink_to(Path(sys.executable).parent / "imagegen")
    wheelhouse.rename(temp / "wheelhouse")
    return temp


def run_step(step: dict, temp: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    output = temp / "github_output"
    output.touch()
    full = {**os.environ, **step.get("env", {}), **env, "RUNNER_TEMP": str(temp), "GITHUB_OUTPUT": str(output)}
    full = {k: v for k, v in full.items() if "${{" not in v}  # the secrets and vars a runner would fill in
    return subprocess.run(["bash", "-e", "-c", step["run"]], env=full, capture_output=True, text=True, timeout=300)


def publish_run(steps: dict, temp: Path, endpoint: str) -> str:
    """The publish job's Index then Publish steps, as a runner runs them; their output."""
    said = ""
    for name in ("index", "publish"):
        proc = run_step(steps[name], temp, {**AWS, "AWS_ENDPOINT_URL": endpoint})
        said += proc.stdout + proc.stderr
        assert proc.returncode == 0, said
    assert AWS["AWS_SECRET_ACCESS_KEY"] not in said
    return said


def pip_finds(index_url: str, python: str, dest: Path) -> str:
    """The wheel `pip download` takes for a CPython ``python`` on x86-64 Linux from ``index_url`` alone."""
    dest.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary=:all:",
                           "--index-url", index_url, "--python-version", python, "--implementation", "cp",
                           "--abi", f"cp{python.replace('.', '')}", "--platform", "linux_x86_64", "-d", str(dest),
                           "--disable-pip-version-check", REQUIREMENT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = dest.iterdir()
    return wheel.name


def already_published(step: dict, tmp_path: Path, url: str, cell: str, inputs: str) -> str:
    temp = Path(tempfile.mkdtemp(prefix="check-", dir=tmp_path))
    proc = run_step(step, temp, {"TARGET": cell, "INPUTS": inputs, "FOLDER": FOLDER, "PUBLISHED": url})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (temp / "github_output").read_text()


def test_a_second_run_updates_the_served_index_and_pip_finds_both_runs_wheels(tmp_path, monkeypatch):
    cp311_cell, cp310_cell = tiny_cell(python="3.11"), tiny_cell(python="3.10")
    with MotoS3(BUCKET) as s3, BucketSite(s3.client(), BUCKET, PREFIX) as site:
        url = site.url.rstrip("/")
        steps = workflow(tmp_path, monkeypatch, url)

        # Run 1: nothing is served yet; the cp311 cell's wheel is published with its index.
        collect.place(tmp_path / "run1", cp311_cell, WHEEL, inputs="inputs-1", record={"verify": {"ok": True}})
        said = publish_run(steps, runner_temp(tmp_path, "job1", tmp_path / "run1"), s3.url)
        assert f"merged with {url}/: nothing published yet" in said
        assert pip_finds(f"{url}/simple/", "3.11", tmp_path / "pip-1") == WHEEL.name
        assert already_published(steps["check"], tmp_path, url, cp311_cell.name, "inputs-1") == "skip=true\n"
        assert already_published(steps["check"], tmp_path, url, cp310_cell.name, "inputs-2") == "skip=false\n"

        # Run 2: another wheelhouse, another wheel of the same folder; the served index is merged with it.
        wheel = rebuilt(WHEEL, tmp_path / "src", "cp310 build").rename(tmp_path / "src" / CP310)
        collect.place(tmp_path / "run2", cp310_cell, wheel, inputs="inputs-2", record={"verify": {"ok": True}})
        said = publish_run(steps, runner_temp(tmp_path, "job2", tmp_path / "run2"), s3.url)
        assert f"merged with {url}/: 1 served wheel" in said

        # Both runs' wheels, through the flat index and the cu130 one, each checked by pip against its sha256.
        for index in ("simple", "cu130/simple"):
            assert pip_finds(f"{url}/{index}/", "3.11", tmp_path / index / "311") == WHEEL.name
            assert pip_finds(f"{url}/{index}/", "3.10", tmp_path / index / "310") == CP310
        assert (tmp_path / "simple" / "311" / WHEEL.name).read_bytes() == WHEEL.read_bytes()
        assert (tmp_path / "simple" / "310" / CP310).read_bytes() == wheel.read_bytes()

        # The folder's published manifest lists both cells: the build jobs skip both.
        cells = json.loads(s3.client().get_object(Bucket=BUCKET, Key=f"{PREFIX}{FOLDER}/manifest.json")["Body"].read())
        assert {name: entry["inputs"] for name, entry in cells["cells"].items()} == {
            cp311_cell.name: "inputs-1", cp310_cell.name: "inputs-2"}
        assert already_published(steps["check"], tmp_path, url, cp311_cell.name, "inputs-1") == "skip=true\n"
        assert already_published(steps["check"], tmp_path, url, cp310_cell.name, "inputs-2") == "skip=true\n"
        # The wheel of run 1 was not uploaded again, nor overwritten.
        head = s3.client().head_object(Bucket=BUCKET, Key=f"{PREFIX}{FOLDER}/{WHEEL.name}")
        assert head["ContentLength"] == WHEEL.stat().st_size


def test_a_third_run_with_another_wheel_of_a_published_name_is_refused_before_anything_is_uploaded(tmp_path,
                                                                                                   monkeypatch):
    cell = tiny_cell(python="3.11")
    with MotoS3(BUCKET) as s3, BucketSite(s3.client(), BUCKET, PREFIX) as site:
        url = site.url.rstrip("/")
        steps = workflow(tmp_path, monkeypatch, url)
        collect.place(tmp_path / "run1", cell, WHEEL, inputs="inputs-1", record={})
        publish_run(steps, runner_temp(tmp_path, "job1", tmp_path / "run1"), s3.url)
        before = {o["Key"]: o["ETag"] for o in s3.client().list_objects_v2(Bucket=BUCKET)["Contents"]}
        other = rebuilt(WHEEL, tmp_path / "src", "another build under the same name")
        collect.place(tmp_path / "run2", cell, other, inputs="inputs-2", record={})
        temp = runner_temp(tmp_path, "job2", tmp_path / "run2")
        proc = run_step(steps["index"], temp, {})
        assert proc.returncode == 9, proc.stdout + proc.stderr
        (line,) = proc.stderr.splitlines()
        assert "serves another wheel of this name" in line and "publish a new version" in line
        assert {o["Key"]: o["ETag"] for o in s3.client().list_objects_v2(Bucket=BUCKET)["Contents"]} == before
