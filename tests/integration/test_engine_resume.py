"""Issue 36 items 1 and 2 on a real Docker engine, with a real Redis (Debian's redis-server on the engine's
bridge address, with a password) as the shared compile cache:

- `imagegen build --budget` stops a compile partway and keeps its build tree in the builder's resume cache
  mount; the same build again compiles only what is left;
- every compile the two made is in the shared cache: a build of the same sources on a second, clean machine
  (another ccache mount) compiles nothing, nvcc's kernel included;
- that build from scratch makes the same extension, byte for byte, as the resumed one;
- the password reaches the builds as a BuildKit secret only: it is in no bake file, log, output or layer.
Then the farm end to end (item 5) as the generated workflow's own steps run it: a stopped build carried to a
fresh runner, resumed, published to S3 (moto's server), indexed per CUDA variant, installed by pip from its
cu130 index, and not built again once published.

tests/fixtures/resumable_kernel, reseeded per run (tests/fixtures/reseed_resumable_kernel.py): eight C++
sources of ~2.5 s each (constexpr work), a module and a small kernel, one job at a time.
Needs what tests/integration/test_engine_build.py needs (the engine, the base image; torch 2.11 and its
CUDA toolkit come from PyPI into a cached layer)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from image_scan import find_in_layers_made_since, overlay2_layers
from redis_server import redis_server

from tests.publish_servers import moto_s3_server

ROOT = Path(__file__).resolve().parents[2]
RESEED = ROOT / "tests" / "fixtures" / "reseed_resumable_kernel.py"
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "9.0", "--flavor", "pypi",
        "--base-image", BASE_IMAGE, "--max-jobs", "1"]
PARTS = 10  # ninja steps of a whole build: eight parts, the module and the kernel

pytestmark = pytest.mark.integration


def build(tree: Path, root: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([IMAGEGEN, "build", "--source", str(tree), *CELL, "--out", str(root / "out"),
                           "--work", str(root / "work"), "--json", *extra], cwd=root, capture_output=True, text=True,
                          env=env, timeout=3600)


def build_log(result: dict) -> str:
    return Path(result["log"]).read_text(errors="replace")


def member_digests(wheel: str) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        return {n: hashlib.sha256(zf.read(n)).hexdigest() for n in zf.namelist()}


def need_engine() -> None:
    if shutil.which("docker") is None or subprocess.run(["docker", "image", "inspect", BASE_IMAGE],
                                                        capture_output=True).returncode != 0:
        pytest.fail(f"a running engine and {BASE_IMAGE} are required: run scripts/test.sh as root")


def fresh_fixture(dest: Path) -> Path:
    """The fixture with sources of its own for this run (see the reseed script)."""
    proc = subprocess.run([sys.executable, str(RESEED), str(dest)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


def _bridge_address() -> str:
    """The engine's bridge (docker0) address: what a build step reaches this host at."""
    proc = subprocess.run(["docker", "network", "inspect", "bridge", "--format",
                           "{{range .IPAM.Config}}{{.Gateway}}{{end}}"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    return proc.stdout.strip()


@pytest.fixture()
def redis(tmp_path):
    # a password as `openssl rand -base64 32` writes them ('/', '+', '='): the URL a user pastes, which
    # imagegen percent-encodes for ccache
    import base64
    import os as _os
    password = "Zq/" + base64.b64encode(_os.urandom(24)).decode() + "+x/="
    with redis_server(_bridge_address(), tmp_path, password=password) as server:
        yield server


def _second_machine(tmp_path: Path, env: dict) -> dict:
    """The environment of a second, clean machine: `imagegen build` runs bake with its own variables, and
    the ccache mount id is a build arg, so a `docker` first on PATH adds --set *.args.IMAGEGEN_CCACHE_ID
    (another mount: an empty local cache) to bake and runs the real one with everything else."""
    shim = tmp_path / "shim-second-machine"
    shim.mkdir()
    cold_id = f"imagegen-ccache-cold-{secrets.token_hex(4)}"
    (shim / "docker").write_text(
        f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[1:]\n"
        "if args[:2] == ['buildx', 'bake']:\n"
        f"    args = args[:2] + ['--set', '*.args.IMAGEGEN_CCACHE_ID={cold_id}'] + args[2:]\n"
        f"os.execv({shutil.which('docker')!r}, ['docker'] + args)\n")
    (shim / "docker").chmod(0o755)
    return dict(env, PATH=f"{shim}{os.pathsep}{env['PATH']}")


def test_a_stopped_build_resumes_and_a_clean_machine_gets_every_compile_from_the_shared_cache(tmp_path, redis):
    need_engine()
    tree = fresh_fixture(tmp_path)
    root = tmp_path / "first"
    root.mkdir()
    layers_before = overlay2_layers()
    env = {k: v for k, v in os.environ.items() if k != "IMAGEGEN_COMPILE_CACHE"}
    env["IMAGEGEN_COMPILE_CACHE"] = redis.url  # the place for a password: not the command line

    # 1. Stopped: the budget ends the compile partway; no wheel, and the cell says what is kept.
    # (The first time on a machine, the budget also covers nothing but the compile: the torch layer and
    # the audit come before the build step's clock starts.)
    stopped = build(tree, root, "--budget", "16s", env=env)
    assert stopped.returncode == 5, stopped.stderr[-3000:]
    (row,) = json.loads(stopped.stdout)
    assert row["status"] == "failed" and not row.get("wheel")
    m = re.search(r"budget of 16 s is spent: stopped after (\d+) ninja step\(s\), its state \(\d+ MB\) is kept in "
                  r"(/imagegen/resume/[0-9a-f]+\.tar); the same build again resumes from it", row["error"])
    assert m, row["error"]
    done = int(m.group(1))
    assert 1 <= done < PARTS, f"the budget should stop the build partway, it stopped after {done} of {PARTS}"
    assert not list((root / "out").rglob("*.whl"))

    # 2. The same build again (no budget): it restores the tree and ninja runs only the rest, each a miss
    # locally and in the shared storage (new sources).
    resumed = build(tree, root, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (row,) = json.loads(resumed.stdout)
    log = build_log(row)
    assert f"resuming from {m.group(2)}: " in log, log[-3000:]
    ran = re.search(r"resumed build: (\d+) step\(s\) run now, (\d+) done by the stopped build", log)
    assert ran and int(ran.group(2)) == done and int(ran.group(1)) == PARTS - done, log[-3000:]
    cc = row["ccache"]
    assert cc["misses"] == PARTS - done and cc["hits"] == 0, cc
    assert cc["remote_misses"] == PARTS - done and cc["remote_errors"] == 0, cc
    assert redis.keys() >= PARTS  # every compile of both (and its manifest) is in the shared storage
    assert row["smoke"] == {"resumable_kernel": "ok"}  # installed and imported in a fresh copy of the image

    # 3. A second, clean machine builds the same tree from scratch: a comment added to its __init__.py, so
    # that the compile step runs again (a new inputs hash: no resume state, no cached layer) while every
    # C++ and CUDA input stays the same, on an empty local ccache. Nothing is compiled: all ten compiles
    # (eight host, a module, nvcc's kernel) are hits from the shared storage. The extension is the same
    # bytes, and so is every other member but the edited file and RECORD (its hash); the zip's entry
    # times differ (the resumed tree keeps the stopped build's).
    cold_tree = tmp_path / "cold_tree"
    shutil.copytree(tree, cold_tree)
    init = cold_tree / "resumable_kernel" / "__init__.py"
    init.write_text(init.read_text() + "# built from scratch on a second machine\n")
    cold_root = tmp_path / "cold"
    cold_root.mkdir()
    cold = build(cold_tree, cold_root, env=_second_machine(tmp_path, env))
    assert cold.returncode == 0, cold.stderr[-3000:]
    (cold_row,) = json.loads(cold.stdout)
    cc = cold_row["ccache"]
    assert cc["misses"] == 0 and cc["hits"] == PARTS and cc["remote_hits"] == PARTS, cc
    cold_log = build_log(cold_row)
    assert "resuming from" not in cold_log
    # the build's own log (bake's) names the storage by scheme and host, never with its password
    (bake_log,) = (cold_root / "work" / "runs").glob(f"*/logs/{cold_row['cell']}.log")
    assert f"remote storage redis://{redis.host}:{redis.port}" in bake_log.read_text(errors="replace")
    resumed_members, cold_members = member_digests(row["wheel"]), member_digests(cold_row["wheel"])
    changed = {n for n in resumed_members if resumed_members[n] != cold_members.get(n)}
    assert changed == {"resumable_kernel/__init__.py"} | {n for n in resumed_members if n.endswith("/RECORD")}, changed
    assert any(n.endswith(".so") for n in resumed_members)

    # 4. The password: in no bake file, log, output, result or layer the builds made.
    from urllib.parse import quote
    needle = redis.password.encode()
    needles = [needle, quote(redis.password, safe="+=").encode(), redis.password.split("/")[1].encode()]
    for folder in (root, cold_root):
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                assert not any(n in data for n in needles), path
    for proc in (stopped, resumed, cold):
        assert not any(n.decode() in proc.stdout + proc.stderr for n in needles)
    found, layers = find_in_layers_made_since(layers_before, needles)
    assert layers >= 2 and not found, (layers, found)


# ------------------------------------------------------------------------------------------------
# The farm end to end (issue 36 item 5), as the generated workflow runs it: its own steps replayed on the
# engine. A job that stops at its budget takes the tree out of its builder for the CI cache; a later job on
# a fresh runner hands it in, resumes and stages the wheel; the publish job collects and uploads it to S3
# (moto's real server); the wheelhouse, indexed per CUDA variant and served over HTTP, gives the wheel to pip
# from its cu130 index; and a run after that builds nothing, since the cell is published with its inputs.

def _step_env(step: dict, values: dict, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEGEN_", "AWS_", "PIP_"))}
    for key, value in (step.get("env") or {}).items():
        for expr, sub in values.items():
            value = str(value).replace(expr, sub)
        assert "${{" not in value, value
        env[key] = value
    env.update(extra)
    return env


def _run_step(step: dict, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    # GitHub runs `shell: bash` as: bash --noprofile --norc -eo pipefail {0}
    assert step["shell"] == "bash" and "${{" not in step["run"]
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=3600)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def served(tmp_path):
    """The published wheelhouse's web server on 127.0.0.1 (its folder: site/whl), empty at first."""
    site = tmp_path / "site"
    (site / "whl").mkdir(parents=True)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield {"folder": site / "whl", "url": f"http://127.0.0.1:{httpd.server_address[1]}/whl"}
    httpd.shutdown()


@pytest.fixture()
def s3(tmp_path):
    """moto's S3 server on 127.0.0.1 with the farm's bucket."""
    import boto3

    with moto_s3_server(tmp_path / "moto.log") as url:
        keys = {"AWS_ACCESS_KEY_ID": "AKIDFARM", "AWS_SECRET_ACCESS_KEY": "farm-SECRET-5d1c", "AWS_ENDPOINT_URL": url,
                "AWS_REGION": "us-east-1"}
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
        client.create_bucket(Bucket="farm")
        yield {"client": client, "env": keys}


def test_the_farm_end_to_end_stop_resume_publish_index_and_pip_by_cuda_variant(tmp_path, served, s3):
    need_engine()
    farm = tmp_path / "repo"
    farm.mkdir()
    fresh_fixture(farm)
    cell = ["--source", "./resumable_kernel", *CELL[:-2]]
    proc = subprocess.run([IMAGEGEN, "bake", *cell, "-f", "farm.hcl"], cwd=farm, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([IMAGEGEN, "ci", "github", "--bake-file", "farm.hcl", "-o", "wf.yml", "--skip-published",
                           served["url"], "--publish", "s3://farm/whl", "--imagegen-from",
                           "imagegen-wheels[publish] @ git+https://example.invalid/imagegen@v1"],
                          cwd=farm, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import yaml

    workflow = yaml.safe_load((farm / "wf.yml").read_text())
    job = workflow["jobs"]["build"]
    (row,) = job["strategy"]["matrix"]["include"]
    steps = {s["name"]: s for s in job["steps"]}
    publish = {s["name"]: s for s in workflow["jobs"]["publish"]["steps"]}
    target, inputs = row["target"], row["inputs"]
    values = {"${{ matrix.target }}": target, "${{ matrix.inputs }}": inputs, "${{ matrix.published }}": row["published"],
              "${{ matrix.folders }}": row["folders"], "${{ github.repository_owner }}": "octo-org",
              "${{ secrets.IMAGEGEN_COMPILE_CACHE }}": ""}
    # The registry cache needs a docker-container builder (this engine's is the docker driver, with no
    # registry image to start one): a `docker` first on PATH drops the two cache --set pairs and runs the
    # real one with everything else (their acceptance by buildx: tests/integration/test_ci_workflow.py).
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "docker").write_text(
        f"#!{sys.executable}\nimport os, sys\nargs, out = sys.argv[1:], []\n"
        "while args:\n    a = args.pop(0)\n"
        "    if a == '--set' and args and ('.cache-from=' in args[0] or '.cache-to=' in args[0]):\n"
        "        args.pop(0)\n        continue\n    out.append(a)\n"
        f"os.execv({shutil.which('docker')!r}, ['docker'] + out)\n")
    (shim / "docker").chmod(0o755)
    path = f"{shim}{os.pathsep}{os.environ['PATH']}"

    def runner(name: str) -> tuple[Path, Path]:
        folder = tmp_path / name
        folder.mkdir()
        return folder, folder / "github_output"

    def published(folder: Path, output: Path) -> str:
        step = steps["Already published?"]
        got = _run_step(step, farm, _step_env(step, values, RUNNER_TEMP=str(folder), GITHUB_OUTPUT=str(output)))
        assert got.returncode == 0, got.stderr[-2000:]
        return got.stdout

    # Runner 1: not published yet; the Bake step with a budget the compile cannot meet stops it and says so.
    runner1, out1 = runner("runner1")
    assert f"{target}: not published yet ({served['url']}/{row['published']}/manifest.json): building" in published(runner1, out1)
    bake = _run_step(steps["Bake"], farm, _step_env(steps["Bake"], values, BUDGET="16", PATH=path, IMAGEGEN_MAX_JOBS="1",
                                                     RUNNER_TEMP=str(runner1), GITHUB_OUTPUT=str(out1)))
    assert bake.returncode != 0 and "stopped=true" in out1.read_text(), bake.stdout[-3000:] + bake.stderr[-2000:]
    assert steps["Take the stopped build out of the builder"]["if"] == "failure() && steps.bake.outputs.stopped == 'true'"
    gh = {"GITHUB_RUN_ID": "11", "GITHUB_RUN_ATTEMPT": "1", "PATH": path}
    took = _run_step(steps["Take the stopped build out of the builder"], farm,
                     _step_env(steps["Take the stopped build out of the builder"], values, RUNNER_TEMP=str(runner1), **gh))
    assert took.returncode == 0, took.stderr[-2000:]
    saved = runner1 / "imagegen-resume"
    assert sorted(p.name for p in saved.iterdir()) == [f"{inputs}.tar", f"{inputs}.tar.json"], took.stderr[-2000:]
    assert "::error::" in took.stdout and "re-run the failed jobs" in took.stdout
    done = json.loads((saved / f"{inputs}.tar.json").read_text())["steps_done"]
    assert 1 <= done < PARTS

    # A fresh runner: its builder has no resume state (taken out of this engine's mount here), and the CI
    # cache gives the saved folder back (actions/cache/restore: the folder, as it was saved).
    forget = tmp_path / "forget"
    forget.mkdir()
    (forget / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nARG N\nRUN --mount=type=cache,target=/r,id=imagegen-resume,sharing=shared "
        f"rm -f /r/{inputs}.tar /r/{inputs}.tar.json && echo forgot-$N\n")
    # (cacheonly: the docker driver would otherwise load the image, and leave it dangling)
    proc = subprocess.run(["docker", "buildx", "build", "--progress=plain", "--output", "type=cacheonly",
                           "--build-arg", f"N={os.getpid()}", str(forget)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runner2, out2 = runner("runner2")
    shutil.copytree(saved, runner2 / "imagegen-resume")
    hand = steps["Hand the stopped build to the builder"]
    assert hand["if"] == "steps.resume.outputs.cache-matched-key != ''"
    assert "not published yet" in published(runner2, out2)
    handed = _run_step(hand, farm, _step_env(hand, values, RUNNER_TEMP=str(runner2), **dict(gh, GITHUB_RUN_ID="12")))
    assert handed.returncode == 0, handed.stderr[-2000:]
    bake = _run_step(steps["Bake"], farm, _step_env(steps["Bake"], values, PATH=path, RUNNER_TEMP=str(runner2), IMAGEGEN_MAX_JOBS="1",
                                                     GITHUB_OUTPUT=str(out2)))
    assert bake.returncode == 0, bake.stdout[-3000:] + bake.stderr[-2000:]
    log = (runner2 / "bake.log").read_text()
    assert f"resuming from /imagegen/resume/{inputs}.tar" in log
    ran = re.search(r"resumed build: (\d+) step\(s\) run now, (\d+) done by the stopped build", log)
    assert ran and int(ran.group(2)) == done and int(ran.group(1)) == PARTS - done, log[-3000:]
    stage = steps["Stage wheels"]
    staged = _run_step(stage, farm, _step_env(stage, values, RUNNER_TEMP=str(runner2)))
    assert staged.returncode == 0, staged.stderr[-2000:]
    (wheel,) = (runner2 / "export").rglob("*.whl")
    assert wheel.parent == runner2 / "export" / row["folders"]

    # The publish job: the artifacts downloaded (upload-artifact's folder, merged), imagegen installed (this
    # one), Collect and Publish as written, the keys as the repository's secrets.
    job3 = tmp_path / "publisher"
    shutil.copytree(runner2 / "export", job3 / "wheelhouse")
    (job3 / "imagegen" / "bin").mkdir(parents=True)
    (job3 / "imagegen" / "bin" / "imagegen").symlink_to(IMAGEGEN)
    out3 = job3 / "github_output"
    out3.write_text("")  # the runner makes it before the job
    collect = _run_step(publish["Collect"], farm, _step_env(publish["Collect"], values, RUNNER_TEMP=str(job3),
                                                            GITHUB_OUTPUT=str(out3)))
    assert collect.returncode == 0 and "none=true" not in out3.read_text(), collect.stdout + collect.stderr
    keys = s3["env"]
    secrets_ = {"${{ secrets.AWS_ACCESS_KEY_ID }}": keys["AWS_ACCESS_KEY_ID"],
                "${{ secrets.AWS_SECRET_ACCESS_KEY }}": keys["AWS_SECRET_ACCESS_KEY"], "${{ secrets.AWS_SESSION_TOKEN }}": "",
                "${{ vars.AWS_ENDPOINT_URL }}": keys["AWS_ENDPOINT_URL"], "${{ vars.AWS_REGION }}": keys["AWS_REGION"]}
    up = _run_step(publish["Publish"], farm, _step_env(publish["Publish"], {**values, **secrets_}, RUNNER_TEMP=str(job3)))
    assert up.returncode == 0 and up.stdout.startswith("uploaded"), up.stdout + up.stderr
    body = s3["client"].get_object(Bucket="farm", Key=f"whl/{wheel.name}")["Body"].read()
    assert body == wheel.read_bytes()
    assert keys["AWS_SECRET_ACCESS_KEY"] not in up.stdout + up.stderr

    # The served wheelhouse: the collected one, indexed (flat and per CUDA variant); pip takes the wheel from
    # the cu130 index, and there is no cu128 one.
    shutil.copytree(job3 / "wheelhouse", served["folder"], dirs_exist_ok=True)
    proc = subprocess.run([IMAGEGEN, "index", str(served["folder"])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (served["folder"] / "cu130" / "simple" / "resumable-kernel" / "index.html").is_file()
    assert not (served["folder"] / "cu128").exists()
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-cache-dir",
           "--python-version", "3.11", "--only-binary=:all:", "--platform", "linux_x86_64", "-d"]
    got = subprocess.run([*pip, str(tmp_path / "dl"), "--index-url", f"{served['url']}/cu130/simple", "resumable-kernel"],
                         capture_output=True, text=True, timeout=300, env=_step_env({}, {}))
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    (downloaded,) = (tmp_path / "dl").glob("*.whl")
    assert downloaded.name == wheel.name and downloaded.read_bytes() == wheel.read_bytes()
    assert "+cu130torch2.11" in downloaded.name

    # A run after that: the cell is published with these inputs, so its job builds nothing and says so.
    runner3, out3b = runner("runner3")
    said = published(runner3, out3b)
    assert f"::notice::{target}: already published with these inputs ({inputs})" in said, said
    assert "skip=true" in out3b.read_text()
