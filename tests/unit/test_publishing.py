"""Tests for imagegen.commands.publishing: `imagegen publish` as the shell runs it, against a recording
PyPI-compatible index on 127.0.0.1: one line per wheel and destination (or --json), the exit codes
(0 all uploaded or skipped, 9 something refused or failed, after trying the rest; 2 a malformed
destination, before anything is contacted), a dry run, and no secret in any output. The client
libraries are imported only when a destination needs them."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

from imagegen import cli
from imagegen.commands import publishing
from imagegen.errors import PublishError, UsageError
from tests.publish_servers import FakeIndex, sha256, wheelhouse
from tests.unit.command_helpers import call
from tests.unit.executor_fixtures import pure_wheel, tiny_cell

USER, PASSWORD = "uploader", "pw-cmd-0a1b2c3d"


@pytest.fixture
def index(monkeypatch, tmp_path):
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with FakeIndex(USER, PASSWORD) as server:
        yield server


def publish(*argv) -> int:
    return call(publishing.cmd_publish, "publish", *argv)


def imagegen(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_one_line_per_wheel_and_a_summary(tmp_path, index, capsys):
    wheel = wheelhouse(tmp_path / "out")
    to = f"pypi:{index.base}/legacy/"
    assert publish(tmp_path / "out", "--to", to) == 0
    captured = capsys.readouterr()
    assert captured.out == f"uploaded     {wheel.name} -> {to} ({index.base}/simple/tiny-kernel/)\n"
    assert captured.err == "1 uploaded\n"
    assert publish(tmp_path / "out", "--to", to, "--check") == 0  # a dry run that reads what is there
    captured = capsys.readouterr()
    assert captured.out == f"skipped      {wheel.name} -> {to} (already there, same sha256)\n"
    assert captured.err == "dry run: 1 skipped\n"
    before = len(index.requests)
    assert publish(tmp_path / "out", "--to", to, "--dry-run") == 0  # contacts nothing, so cannot know
    captured = capsys.readouterr()
    assert captured.out == (f"would upload {wheel.name} -> {to} (not checked: a dry run contacts no destination;"
                            " --check reads what is there)\n")
    assert captured.err == "dry run: 1 would upload\n" and len(index.requests) == before


def test_json(tmp_path, index, capsys):
    wheel = wheelhouse(tmp_path / "out")
    to = f"pypi:{index.base}/legacy/"
    assert publish(tmp_path / "out", "--to", to, "--json", "--check") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"dry_run": True, "problems": [], "outcomes": [
        {"dest": to, "wheel": wheel.name, "sha256": sha256(wheel.read_bytes()), "status": "would-upload",
         "detail": ""}]}
    assert captured.err == "" and index.seen("POST", "/") == []


def test_a_refused_wheel_is_exit_9_after_the_others_went(tmp_path, index, capsys):
    out = tmp_path / "out"
    first = wheelhouse(out)
    second = wheelhouse(out, pure_wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""}),
                        tiny_cell(python="3.12"))
    index.files["tiny-kernel"] = {first.name: b"another build"}
    to = f"pypi:{index.base}/legacy/"
    with pytest.raises(PublishError) as info:
        publish(out, "--to", to)
    assert info.value.exit_code == 9
    assert str(info.value).startswith(f"1 refused or failed: {first.name} -> {to}: refused, a different file")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["uploaded", "refused"] and second.name in lines[0]
    assert index.files["demo"] == {second.name: second.read_bytes()}


def test_a_changed_wheel_is_not_verified_and_refused(tmp_path, index, capsys):
    wheel = wheelhouse(tmp_path / "out")
    wheel.write_bytes(b"changed since the build")
    with pytest.raises(PublishError, match="^1 not verified: .*changed since it was built and verified"):
        publish(tmp_path / "out", "--to", f"pypi:{index.base}/legacy/")
    assert capsys.readouterr().out.startswith("refused      ") and index.requests == []


def test_the_command_line_says_errors_in_one_line_and_shows_no_secret(tmp_path, index, monkeypatch):
    wheelhouse(tmp_path / "out")
    monkeypatch.setenv("TWINE_PASSWORD", "wrong-" + PASSWORD)
    code, out, err = imagegen("publish", tmp_path / "out", "--to", f"pypi:{index.base}/legacy/")
    assert code == 9 and err.count("\n") == 2 and err.splitlines()[1].startswith("imagegen: error: 1 refused or failed")
    assert "refused the credentials (HTTP 403 Forbidden)" in out
    assert PASSWORD not in out + err


@pytest.mark.parametrize("argv, needle", [
    (["--to", "hf:octo"], "--to 'hf:octo': expected hf:OWNER/REPO"),
    (["--to", "s3://bucket", "--to", "pypi:https://u:p@host/"], "expected pypi:"),
    (["--to", "rsync://host/x"], "not a destination"),
])
def test_a_malformed_destination_is_exit_2_before_anything_is_contacted(tmp_path, index, argv, needle):
    wheelhouse(tmp_path / "out")
    code, out, err = imagegen("publish", tmp_path / "out", *argv)
    assert code == 2 and err.startswith("imagegen: error: ") and err.count("\n") == 1 and needle in err
    assert out == "" and index.requests == []


def test_no_wheelhouse_or_an_empty_one(tmp_path, index):
    with pytest.raises(UsageError, match="no such wheelhouse folder"):
        publish(tmp_path / "missing", "--to", f"pypi:{index.base}/legacy/")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PublishError, match="no verified wheel here"):
        publish(tmp_path / "empty", "--to", f"pypi:{index.base}/legacy/")


def test_the_client_libraries_load_only_when_a_destination_needs_them():
    probe = ("import sys\nfrom imagegen import cli\nfrom imagegen.commands import publishing\n"
             "from imagegen.publish import upload\n"
             "clients = ('twine', 'huggingface_hub', 'github', 'boto3', 'requests')\n"
             "print(sorted(m for m in clients if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "[]\n", proc.stderr


def test_a_dry_run_works_offline_and_contacts_no_destination(tmp_path, monkeypatch):
    """Every kind of destination, on hosts that do not resolve, with no credentials: a dry run lists what
    it would upload where and exits 0, having opened no connection and asked no resolver."""
    import socket

    wheel = wheelhouse(tmp_path / "out")
    (tmp_path / "out" / "simple").mkdir()
    (tmp_path / "out" / "simple" / "index.html").write_text("<html></html>")  # layout=wheelhouse needs an index
    for name in ("TWINE_USERNAME", "TWINE_PASSWORD", "HF_TOKEN", "GITHUB_TOKEN", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.nowhere.invalid")
    monkeypatch.setenv("GITHUB_API_URL", "https://github.nowhere.invalid/api/v3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://s3.nowhere.invalid")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    contacted: list = []

    def refuse(*args, **kwargs):
        contacted.append(args[:2])
        raise OSError("a dry run must not touch the network")
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    dests = ["pypi:https://upload.nowhere.invalid/legacy/", "hf:rtx5090/sage-wheels", "github:octo/wheels@v1",
             "s3://wheels/sage,layout=wheelhouse"]
    code, out, err = imagegen("publish", tmp_path / "out", *(a for d in dests for a in ("--to", d)), "--dry-run")
    assert (code, contacted) == (0, []), err
    lines = out.splitlines()
    assert [line.split(" -> ")[1].split(" (")[0] for line in lines] == dests + [dests[-1]]
    assert all(line.startswith(f"would upload {wheel.name} -> ") for line in lines[:4])
    assert lines[4].startswith("would upload index, manifests and metadata -> s3://wheels/sage,layout=wheelhouse (2"
                               " files to write or leave unchanged at s3://wheels/sage/")
    assert err == "dry run: 5 would upload\n"
