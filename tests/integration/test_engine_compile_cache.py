"""Issue 36 item 2 on a real Docker engine with a real Redis (Debian's redis-server, on the engine's
bridge address with a password): `imagegen build --compile-cache redis://PASSWORD@HOST:PORT` fills the
shared remote storage, and a build of the same sources with a cold local cache (another ccache mount: a
second, clean machine) compiles nothing: every compile, nvcc's included, is a hit from the remote. The
password reaches the builds as a BuildKit secret only: it is in no bake file, log, output or layer.

tests/fixtures/resumable_kernel with parts of its own per run (see test_engine_resume.py): ten compiles."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time

import pytest
from image_scan import find_in_layers_made_since, overlay2_layers
from test_engine_resume import CELL, IMAGEGEN, PARTS, fresh_fixture, need_engine

pytestmark = pytest.mark.integration


def _bridge_address() -> str:
    """The engine's bridge (docker0) address: what a build step reaches this host at."""
    proc = subprocess.run(["docker", "network", "inspect", "bridge", "--format",
                           "{{range .IPAM.Config}}{{.Gateway}}{{end}}"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    return proc.stdout.strip()


@pytest.fixture()
def redis(tmp_path):
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is required (scripts/test.sh installs Debian's redis-server)")
    host = _bridge_address()
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    password = secrets.token_hex(16)
    proc = subprocess.Popen([server, "--port", str(port), "--bind", host, "--requirepass", password, "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield {"url": f"redis://{password}@{host}:{port}", "password": password, "host": host, "port": port}
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _keys(redis: dict) -> int:
    with socket.create_connection((redis["host"], redis["port"]), timeout=10) as s:
        s.sendall(f"AUTH {redis['password']}\r\nDBSIZE\r\n".encode())
        data = b""
        while data.count(b"\r\n") < 2:
            data += s.recv(4096)
    return int(data.split(b"\r\n")[1].lstrip(b":"))


def test_a_second_clean_machine_gets_every_compile_from_the_shared_cache(tmp_path, redis):
    need_engine()
    tree = fresh_fixture(tmp_path)
    root = tmp_path / "first"
    root.mkdir()
    layers_before = overlay2_layers()
    env = {k: v for k, v in os.environ.items() if k != "IMAGEGEN_COMPILE_CACHE"}
    env["IMAGEGEN_COMPILE_CACHE"] = redis["url"]  # the place for a password: not the command line
    args = [IMAGEGEN, "build", "--source", str(tree), *CELL, "--out", str(root / "out"), "--work", str(root / "work"),
            "--json"]
    first = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
    assert first.returncode == 0, first.stderr[-3000:]
    (row,) = json.loads(first.stdout)
    assert row["ccache"]["misses"] == PARTS and row["ccache"]["hits"] == 0, row["ccache"]  # new sources
    assert row["ccache"]["remote_misses"] == PARTS and row["ccache"]["remote_errors"] == 0, row["ccache"]
    stored = _keys(redis)
    assert stored >= PARTS  # each compile's result (and its manifest) is in the shared storage

    # A second, clean machine: the same sources (a comment in __init__.py: the compile step runs again),
    # through the first run's own bake file with another ccache mount (an empty local cache).
    init = tree / "resumable_kernel" / "__init__.py"
    init.write_text(init.read_text() + "# the second machine\n")
    second_root = tmp_path / "second"
    second_root.mkdir()
    args2 = [IMAGEGEN, "build", "--source", str(tree), *CELL, "--out", str(second_root / "out"), "--work",
             str(second_root / "work"), "--json"]
    env2 = dict(env)
    # `imagegen build` runs bake with its own variables; the mount id is a build arg: set it through a
    # `docker` first on PATH that adds --set *.args.IMAGEGEN_CCACHE_ID to bake (everything else as is)
    shim = tmp_path / "shim"
    shim.mkdir()
    cold_id = f"imagegen-ccache-cold-{secrets.token_hex(4)}"
    (shim / "docker").write_text(
        f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[1:]\n"
        "if args[:2] == ['buildx', 'bake']:\n"
        f"    args = args[:2] + ['--set', '*.args.IMAGEGEN_CCACHE_ID={cold_id}'] + args[2:]\n"
        f"os.execv({shutil.which('docker')!r}, ['docker'] + args)\n")
    (shim / "docker").chmod(0o755)
    env2["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    second = subprocess.run(args2, cwd=second_root, env=env2, capture_output=True, text=True, timeout=3600)
    assert second.returncode == 0, second.stderr[-3000:]
    (row2,) = json.loads(second.stdout)
    cc = row2["ccache"]
    # nothing compiled: every one of the ten compiles (eight host, a module, nvcc's kernel) a remote hit
    assert cc["misses"] == 0 and cc["hits"] == PARTS and cc["remote_hits"] == PARTS, cc
    # the build's own log names the storage by scheme and host, never with its password
    (bake_log,) = (second_root / "work" / "runs").glob(f"*/logs/{row2['cell']}.log")
    assert f"remote storage redis://{redis['host']}:{redis['port']}" in bake_log.read_text(errors="replace")

    # The password: in no bake file, log, output, result or layer the builds made.
    needle = redis["password"].encode()
    for folder in (root, second_root):
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert needle not in path.read_bytes(), path
    for proc in (first, second):
        assert redis["password"] not in proc.stdout + proc.stderr
    found, layers = find_in_layers_made_since(layers_before, [needle])
    assert layers >= 2 and not found, (layers, found)
