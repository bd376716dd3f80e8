"""A real git server for tests: `git http-backend` (git's own smart-HTTP server, as CGI) behind a WSGI
server on 127.0.0.1, serving the bare repositories of one folder. `git ls-remote` and `git fetch
--depth 1` run against it exactly as against GitHub. With ``auth=(user, token)`` it is a private host:
every request without that Basic credential gets 401 (git then reads its netrc), and it counts the
requests it served with it (``served``, each with the client's address) and refused (``refused``)."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass


class GitServer:
    def __init__(self, root: Path, *, host: str = "127.0.0.1", auth: tuple[str, str] | None = None) -> None:
        self.root = root
        self.host = host
        self._auth = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode() if auth else None
        self.served: list[str] = []  # "CLIENT METHOD PATH?QUERY" of each request answered
        self.refused = 0  # requests answered 401 (no or a wrong credential)
        self._server = make_server(host, 0, self._app, handler_class=_Quiet)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, repo: str) -> str:
        return f"http://{self.host}:{self.port}/{repo}"

    def __enter__(self) -> "GitServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _app(self, environ, start_response):
        if self._auth and environ.get("HTTP_AUTHORIZATION") != self._auth:
            self.refused += 1
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="private"'),
                                                ("Content-Type", "text/plain")])
            return [b"credentials required\n"]
        self.served.append(f"{environ.get('REMOTE_ADDR')} {environ['REQUEST_METHOD']} {environ.get('PATH_INFO', '')}"
                           f"?{environ.get('QUERY_STRING', '')}")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": environ["REQUEST_METHOD"],
            "PATH_INFO": environ.get("PATH_INFO", ""), "QUERY_STRING": environ.get("QUERY_STRING", ""),
            "CONTENT_TYPE": environ.get("CONTENT_TYPE", ""), "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": "127.0.0.1", "GIT_PROTOCOL": environ.get("HTTP_GIT_PROTOCOL", ""),
            "HTTP_CONTENT_ENCODING": environ.get("HTTP_CONTENT_ENCODING", ""),
        }
        proc = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=120)
        head, _, payload = proc.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = proc.stdout.partition(b"\n\n")
        status, headers = "200 OK", []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = value.strip()
            elif name:
                headers.append((name.strip(), value.strip()))
        start_response(status, headers)
        return [payload]


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(root: Path, name: str, files: dict[str, str]) -> Path:
    """A bare repository ``root/name`` with one commit of ``files`` on branch main (returned: the work tree)."""
    work = root.parent / f"{name}-work"
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "first")
    git(root, "clone", "-q", "--bare", str(work), name)
    git(work, "remote", "add", "origin", str(root / name))
    return work


def tiny_kernel_repo(folder: Path) -> tuple[Path, str]:
    """A local git repository of the tiny fixture kernel, tagged v0.1.0, whose README.md is the line the
    fixture recipe's patch adds (a patch upstream already took). Returns (repository, the tag's commit)."""
    import shutil

    fixture = Path(__file__).parent / "fixtures" / "tiny_kernel"
    repo = folder / "tiny-kernel"
    shutil.copytree(fixture, repo, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    (repo / "README.md").write_text("tiny kernel: taken upstream at v0.1.0\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tiny kernel 0.1.0")
    git(repo, "tag", "-a", "v0.1.0", "-m", "0.1.0")
    return repo, git(repo, "rev-parse", "HEAD")
