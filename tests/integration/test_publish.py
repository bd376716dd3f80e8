"""`imagegen publish` as a user runs it (a separate process, credentials in its environment), against
servers this test starts on 127.0.0.1 and stops afterwards:

- the real pypiserver (htpasswd auth): upload, then a real `pip install` from it into a fresh venv gets
  exactly the verified wheel; a second publish is a no-op; a rebuilt wheel under the same name is
  refused and the server keeps the original; a wrong password is a one-line error;
- moto's real S3 server (`python -m moto.server`): upload with the sha256 recorded, skip, refuse;
- the Hugging Face Hub and GitHub releases: no such server can run here, so recording servers
  (tests/publish_servers.FakeHub / FakeGitHub) answer what huggingface_hub and PyGithub call and keep
  every request, to assert what the clients sent.

Every output, log, manifest and index page is searched for the secret values: none may appear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.publish_servers import FakeGitHub, FakeHub, PypiServer, moto_s3_server, rebuilt, sha256, wheelhouse
from tests.unit.executor_fixtures import WHEEL, pure_wheel, tiny_cell

pytestmark = pytest.mark.integration

USER, PASSWORD = "publisher", "pypiserver-PW-5e4d3c2b"
HF_TOKEN, GITHUB_TOKEN = "hf_integration_TOKEN_77aa", "ghp_integration_TOKEN_88bb"
AWS_KEY, AWS_SECRET = "AKIDINTEGRATION", "aws-integration-SECRET-99cc"
SECRETS = (PASSWORD, HF_TOKEN, GITHUB_TOKEN, AWS_SECRET)
PROJECT_VERSION = "tiny-kernel==0.1.0+cu130torch2.11"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any credential or pip setting of the machine, plus ``extra``."""
    drop = ("TWINE_", "HF_", "GITHUB_", "AWS_", "PIP_", "NETRC")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


class Run:
    """`imagegen` in its own process; every output is kept for the secret search."""

    def __init__(self) -> None:
        self.outputs: list[str] = []

    def __call__(self, *argv, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "imagegen", *[str(a) for a in argv]], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=300)
        self.outputs += [proc.stdout, proc.stderr]
        return proc


@pytest.fixture
def imagegen(tmp_path):
    run = Run()
    yield run
    for text in run.outputs:
        for secret in SECRETS:
            assert secret not in text


def assert_no_secret_in_files(*roots: Path) -> None:
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                for secret in SECRETS:
                    assert secret.encode() not in data, f"{secret[:4]}... in {path}"


# --------------------------------------------------------------------------------------------
# pypiserver and pip


@pytest.fixture
def pypiserver(tmp_path):
    with PypiServer(tmp_path / "pypiserver", USER, PASSWORD) as server:
        yield server
    assert_no_secret_in_files(server.log, server.packages)


def pip_install(tmp_path: Path, index: str, requirement: str) -> dict:
    """A real `pip install --no-deps` from ``index`` only, into a fresh venv; returns pip's report."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    report = tmp_path / "pip-report.json"
    env = clean_env(PIP_CONFIG_FILE=os.devnull)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps", "--no-cache-dir", "--index-url",
                           f"{index}simple/", "--report", str(report), requirement], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(report.read_text())


def test_pypiserver_pip_installs_exactly_the_verified_wheel(tmp_path, pypiserver, imagegen):
    out = tmp_path / "out"
    wheel = wheelhouse(out)
    manifest_sha = json.loads((wheel.parent / "manifest.json").read_text())["cells"][tiny_cell().name]["sha256"]
    env = clean_env(TWINE_USERNAME=USER, TWINE_PASSWORD=PASSWORD)
    to = f"pypi:{pypiserver.url}"

    proc = imagegen("publish", out, "--to", to, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"uploaded     {wheel.name} -> {to}") and proc.stderr == "1 uploaded\n"
    assert sha256((pypiserver.packages / wheel.name).read_bytes()) == manifest_sha

    report = pip_install(tmp_path, pypiserver.url, PROJECT_VERSION)
    (installed,) = report["install"]
    assert installed["download_info"]["url"].endswith(wheel.name.replace("+", "%2B")) or \
        installed["download_info"]["url"].endswith(wheel.name)
    assert installed["download_info"]["archive_info"]["hashes"]["sha256"] == manifest_sha
    record = next((tmp_path / "venv").glob("lib/python*/site-packages/tiny_kernel-0.1.0+cu130torch2.11.dist-info"))
    assert (record / "RECORD").is_file()

    again = imagegen("publish", out, "--to", to, env=env, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("skipped") and again.stderr == "1 skipped\n"
    assert sorted(p.name for p in pypiserver.packages.iterdir()) == [wheel.name]

    # A rebuild under the same name: verified (its manifest records its own sha256), different bytes.
    other = tmp_path / "rebuilt-out"
    wheelhouse(other, rebuilt(WHEEL, tmp_path / "rebuilt"))
    refused = imagegen("publish", other, "--to", to, env=env, cwd=tmp_path)
    assert refused.returncode == 9 and refused.stdout.startswith(f"refused      {wheel.name}")
    assert refused.stderr.splitlines()[-1].startswith("imagegen: error: 1 refused or failed:")
    assert sha256((pypiserver.packages / wheel.name).read_bytes()) == manifest_sha  # the original is kept

    page = urllib.request.urlopen(f"{pypiserver.url}simple/tiny-kernel/", timeout=30).read()
    assert f"#sha256={manifest_sha}".encode() in page and PASSWORD.encode() not in page
    assert_no_secret_in_files(out, other)


def test_pypiserver_wrong_password_is_one_line(tmp_path, pypiserver, imagegen):
    out = tmp_path / "out"
    wheelhouse(out, pure_wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""}))
    env = clean_env(TWINE_USERNAME=USER, TWINE_PASSWORD="wrong-" + PASSWORD)
    proc = imagegen("publish", out, "--to", f"pypi:{pypiserver.url}", env=env, cwd=tmp_path)
    assert proc.returncode == 9
    error = [line for line in proc.stderr.splitlines() if line.startswith("imagegen: error: ")]
    assert len(error) == 1 and "refused the credentials (HTTP 403" in error[0]
    assert list(pypiserver.packages.iterdir()) == []
    no_credentials = imagegen("publish", out, "--to", f"pypi:{pypiserver.url}", env=clean_env(), cwd=tmp_path)
    assert no_credentials.returncode == 9 and "no credentials for 127.0.0.1" in no_credentials.stderr


# --------------------------------------------------------------------------------------------
# S3: moto's server


@pytest.fixture
def moto_server(tmp_path):
    log = tmp_path / "moto.log"
    with moto_s3_server(log) as url:
        yield url
    assert_no_secret_in_files(log)


def test_s3_upload_skip_and_refuse_on_motos_server(tmp_path, moto_server, imagegen):
    import boto3

    client = boto3.client("s3", endpoint_url=moto_server, aws_access_key_id=AWS_KEY, aws_secret_access_key=AWS_SECRET,
                          region_name="us-east-1")
    client.create_bucket(Bucket="wheels")
    out = tmp_path / "out"
    wheel = wheelhouse(out)
    env = clean_env(AWS_ACCESS_KEY_ID=AWS_KEY, AWS_SECRET_ACCESS_KEY=AWS_SECRET, AWS_ENDPOINT_URL=moto_server,
                    AWS_REGION="us-east-1")
    proc = imagegen("publish", out, "--to", "s3://wheels/cu130", env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("uploaded"), proc.stderr
    head = client.head_object(Bucket="wheels", Key=f"cu130/{wheel.name}")
    assert head["Metadata"] == {"sha256": sha256(wheel.read_bytes())}
    assert client.get_object(Bucket="wheels", Key=f"cu130/{wheel.name}")["Body"].read() == wheel.read_bytes()
    assert imagegen("publish", out, "--to", "s3://wheels/cu130", env=env, cwd=tmp_path).stdout.startswith("skipped")

    client.put_object(Bucket="wheels", Key=f"other/{wheel.name}", Body=b"not this wheel")
    refused = imagegen("publish", out, "--to", "s3://wheels/other", env=env, cwd=tmp_path)
    assert refused.returncode == 9 and refused.stdout.startswith("refused")
    assert client.get_object(Bucket="wheels", Key=f"other/{wheel.name}")["Body"].read() == b"not this wheel"


# --------------------------------------------------------------------------------------------
# The Hub and GitHub releases: recording servers


def test_hub_and_github_release_through_the_command_line(tmp_path, imagegen):
    out = tmp_path / "out"
    wheel = wheelhouse(out)
    data = wheel.read_bytes()
    with FakeHub(HF_TOKEN) as hub, FakeGitHub(GITHUB_TOKEN, repos=("octo/wheels",)) as github:
        hub.add_repo("octo/sage-wheels", branch="wheels")
        # huggingface_hub's telemetry (an "agent harness" list for its user agent) goes to HF_ENDPOINT too, and
        # caches it under HF_HOME: kept in tmp_path.
        env = clean_env(HF_ENDPOINT=hub.base, HF_TOKEN=HF_TOKEN, HF_HOME=str(tmp_path / "hf-home"),
                        GITHUB_API_URL=github.api, GITHUB_TOKEN=GITHUB_TOKEN)
        to = ["--to", "hf:octo/sage-wheels@wheels:cu130/torch2.11", "--to", "github:octo/wheels@v0.1.0"]
        proc = imagegen("publish", out, *to, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert [line.split()[0] for line in proc.stdout.splitlines()] == ["uploaded", "uploaded"]
        assert proc.stderr == "2 uploaded\n"  # no client library's notice or progress bar

        # The Hub: the repository, branch, path in the repository, the LFS object, the token.
        assert hub.file("octo/sage-wheels", f"cu130/torch2.11/{wheel.name}", branch="wheels") == data
        (commit,) = hub.commits
        assert commit["repo"] == "octo/sage-wheels" and commit["revision"] == "wheels"
        assert commit["operations"][0]["value"]["path"] == f"cu130/torch2.11/{wheel.name}"
        assert hub.seen("PUT", "/lfs-upload/")[0].body == data
        api = [r for r in hub.requests if r.method != "PUT" and r.path != "/api/agent-harnesses"]
        assert {r.headers.get("authorization") for r in api} == {f"Bearer {HF_TOKEN}"}
        assert all("authorization" not in r.headers for r in hub.seen("GET", "/api/agent-harnesses"))
        # GitHub: the release of the tag, created; the asset's name and bytes; the token.
        assert github.asset_bytes("octo/wheels", "v0.1.0", wheel.name) == data
        assert {r.headers["authorization"] for r in github.requests} == {f"token {GITHUB_TOKEN}"}
        # The tokens travel in the Authorization header only.
        for request in hub.requests + github.requests:
            for secret in SECRETS:
                assert secret.encode() not in request.body and secret not in request.path + str(request.query)

        again = imagegen("publish", out, *to, env=env, cwd=tmp_path)
        assert again.returncode == 0 and [line.split()[0] for line in again.stdout.splitlines()] == ["skipped"] * 2
        assert len(hub.commits) == 1 and len(github.seen("POST", "/api/uploads/")) == 1

        wrong = {**env, "HF_TOKEN": HF_TOKEN + "x", "GITHUB_TOKEN": GITHUB_TOKEN + "x"}
        other = tmp_path / "other"
        wheelhouse(other, pure_wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""}))
        refused = imagegen("publish", other, *to, env=wrong, cwd=tmp_path)
        assert refused.returncode == 9 and [line.split()[0] for line in refused.stdout.splitlines()] == ["failed"] * 2
        assert "the Hub refused HF_TOKEN (HTTP 401)" in refused.stdout
        assert "GitHub refused GITHUB_TOKEN" in refused.stdout
        assert len(hub.commits) == 1
    assert_no_secret_in_files(out, other, tmp_path / "hf-home")


