"""imagegen/engine.py is the only code that runs docker, buildx and nvidia-smi, and it says the same
thing for the same failure wherever it happens: a missing docker CLI, a daemon that cannot be
reached, a bake whose target failed. The failures are produced by real executables (a docker on
PATH that answers as a stopped daemon does), not by mocks of the module."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import stat
from pathlib import Path

import pytest

from imagegen import engine
from imagegen.cli import main
from imagegen.errors import EngineError

ROOT = Path(__file__).resolve().parents[2]


def _fake_docker(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "docker"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder


STOPPED_DAEMON = ('echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.'
                  ' Is the docker daemon running?" >&2\nexit 1\n')


def test_only_engine_py_runs_docker_buildx_or_nvidia_smi():
    offenders = []
    for path in sorted((ROOT / "imagegen").glob("*.py")):
        if path.name == "engine.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                    and node.elts[0].value in ("docker", "nvidia-smi"):
                offenders.append(f"{path.name}:{node.lineno} runs {node.elts[0].value}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if any(n and n.startswith("python_on_whales") for n in names):
                    offenders.append(f"{path.name}:{node.lineno} imports python_on_whales")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "which" and node.args \
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in ("docker", "nvidia-smi") \
                    and path.name != "doctor.py":  # doctor reports a missing CLI as one of its checks
                offenders.append(f"{path.name}:{node.lineno} looks for {node.args[0].value}")
    assert not offenders, offenders


def test_a_missing_docker_cli_is_one_sentence_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker on PATH
    engine.contexts.cache_clear()
    messages = set()
    for call in (lambda: engine.docker("version"), lambda: engine.bake_print(tmp_path / "x.hcl", tmp_path),
                 lambda: engine.bake(tmp_path / "x.json", ["t"], on_line=print),
                 lambda: engine.run_container(["--name", "n", "img"], tmp_path / "log")):
        with pytest.raises(EngineError) as info:
            call()
        messages.add(str(info.value))
    assert messages == {engine.NO_DOCKER}
    assert engine.contexts() == frozenset() and engine.builder_or_context("ctx") == (None, "ctx")
    engine.contexts.cache_clear()


def test_a_stopped_daemon_is_said_as_such(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_docker(tmp_path / 'bin', STOPPED_DAEMON)}:{os.environ['PATH']}")
    engine.contexts.cache_clear()
    (tmp_path / "x.json").write_text('{"target": {"t": {}}}')
    with pytest.raises(EngineError) as info:
        engine.bake(tmp_path / "x.json", ["t"], on_line=lambda line: None)
    assert str(info.value).startswith("no usable Docker engine with buildx (Cannot connect to the Docker daemon")
    assert "start the daemon" in str(info.value)
    with pytest.raises(EngineError) as info:
        engine.docker("info", require_engine=True)
    assert str(info.value).startswith("no usable Docker engine with buildx")
    assert engine.docker("info").returncode == 1  # without require_engine the caller judges
    engine.contexts.cache_clear()


def test_a_failed_bake_target_is_a_bake_failure_with_buildxs_words(tmp_path, monkeypatch):
    body = ('echo "#1 building t"\necho \'ERROR: target "t" failed: process "/bin/sh -c make" did not complete\' >&2\n'
            'exit 1\n')
    monkeypatch.setenv("PATH", f"{_fake_docker(tmp_path / 'bin', body)}:{os.environ['PATH']}")
    engine.contexts.cache_clear()
    lines = []
    with pytest.raises(engine.BakeFailed) as info:
        engine.bake(tmp_path / "x.json", ["t"], on_line=lines.append)
    assert 'target "t" failed' in info.value.stderr
    engine.contexts.cache_clear()


def test_build_without_docker_is_one_line_from_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_docker(tmp_path / 'bin', STOPPED_DAEMON)}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    engine.contexts.cache_clear()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["build", "--source", str(ROOT / "tests" / "fixtures" / "tiny_kernel"), "--torch", "2.11",
                     "--cuda", "13.0", "--python", "3.11", "--arch", "9.0", "--flavor", "pypi", "--no-audit"])
    lines = [line for line in err.getvalue().splitlines() if line.startswith("imagegen: error:")]
    assert code == EngineError.exit_code and len(lines) == 1 and "no usable Docker engine" in lines[0], err.getvalue()
    engine.contexts.cache_clear()
