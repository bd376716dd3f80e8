"""A real Redis (Debian's redis-server) for the shared compile cache's tests: on the given address, with
a password of its own, nothing saved to disk. Needs redis-server (scripts/test.sh installs it)."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest


@dataclass(frozen=True)
class Redis:
    host: str
    port: int
    password: str

    @property
    def url(self) -> str:
        """ccache's remote storage URL (the password in it: give it through the environment only)."""
        return f"redis://{self.password}@{self.host}:{self.port}"

    def keys(self) -> int:
        """How many keys the server holds (DBSIZE)."""
        with socket.create_connection((self.host, self.port), timeout=10) as s:
            # RESP arrays: a password of any bytes ('/', '+', '=', '@', a space) reaches the server whole
            s.sendall(f"*2\r\n$4\r\nAUTH\r\n${len(self.password.encode())}\r\n{self.password}\r\n"
                      "*1\r\n$6\r\nDBSIZE\r\n".encode())
            data = b""
            while data.count(b"\r\n") < 2:
                data += s.recv(4096)
        return int(data.split(b"\r\n")[1].lstrip(b":"))


@contextlib.contextmanager
def redis_server(host: str, folder: Path, password: str | None = None) -> Iterator[Redis]:
    """``password``: the server's own (requirepass); default a random hex one."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is required (scripts/test.sh installs Debian's redis-server)")
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    redis = Redis(host, port, password or secrets.token_hex(16))
    proc = subprocess.Popen([server, "--port", str(port), "--bind", host, "--requirepass", redis.password, "--save", "",
                             "--appendonly", "no", "--dir", str(folder)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"redis-server did not answer on {host}:{port}")
                time.sleep(0.1)
        yield redis
    finally:
        proc.terminate()
        proc.wait(timeout=20)
