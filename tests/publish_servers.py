"""Shared by the `imagegen publish` tests (tests/unit/test_*_upload.py, test_upload.py, test_publishing.py,
tests/integration/test_publish.py): wheelhouses made the way imagegen build makes them, and the servers
the destinations talk to, all on 127.0.0.1 with a free port, stopped afterwards.

- PypiServer: the real pypiserver (htpasswd made with passlib), in its own process.
- MotoS3: moto's real S3 server, in a thread.
- FakeIndex, FakeHub, FakeGitHub: small HTTP servers that answer what twine / huggingface_hub /
  PyGithub call on imagegen's code path, keep what was uploaded, and record every request (method,
  path, query, headers, body) for the tests to assert on. No Hugging Face Hub or GitHub server can run
  here; their answers are modelled on those clients' own code and the services' documentation.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, quote, unquote, urlsplit

from imagegen.wheelhouse import collect
from imagegen.model.cell import Cell
from tests.unit.executor_fixtures import WHEEL, tiny_cell

# --------------------------------------------------------------------------------------------
# Wheelhouses


def wheelhouse(out: Path, wheel: Path = WHEEL, cell: Cell | None = None) -> Path:
    """``out`` holding ``wheel`` as imagegen build leaves it (cell folder, manifest.json with its sha256);
    returns the wheel's path there."""
    return collect.place(out, cell or tiny_cell(), wheel, inputs="publish-test", record={"verify": {"ok": True}})


def rebuilt(wheel: Path, folder: Path, note: str = "rebuilt") -> Path:
    """A copy of ``wheel`` under the same name with other bytes (a zip comment): a different build."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / wheel.name
    shutil.copyfile(wheel, copy)
    with zipfile.ZipFile(copy, "a") as zf:
        zf.comment = note.encode()
    return copy


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


# --------------------------------------------------------------------------------------------
# Real servers


class PypiServer:
    """pypiserver with upload authentication (``-a update``) for ``user``/``password``."""

    def __init__(self, root: Path, user: str, password: str) -> None:
        from passlib.apache import HtpasswdFile

        self.root = root
        self.packages = root / "packages"
        self.packages.mkdir(parents=True, exist_ok=True)
        htpasswd = HtpasswdFile(str(root / "htpasswd"), new=True)
        htpasswd.set_password(user, password)
        htpasswd.save()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = root / "pypiserver.log"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "PypiServer":
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(self.port), "-P",
                 str(self.root / "htpasswd"), "-a", "update", str(self.packages)], stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self._proc)
        return self

    def __exit__(self, *exc) -> None:
        assert self._proc is not None
        self._proc.terminate()
        self._proc.wait(timeout=30)


class MotoS3:
    """moto's S3 server (the one `moto_server` runs) in a thread, with ``bucket`` created."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None

    def __enter__(self) -> "MotoS3":
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop()

    def client(self, key_id: str = "test-key", secret: str = "test-secret"):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=key_id, aws_secret_access_key=secret,
                            region_name="us-east-1")


# --------------------------------------------------------------------------------------------
# Recording servers


@dataclass
class Request:
    method: str
    path: str  # unquoted
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass
class Reply:
    status: int
    body: bytes | dict | list = b""
    headers: dict[str, str] = field(default_factory=dict)


class RecordingServer:
    """An HTTP server on 127.0.0.1:<free port> in a thread: every request is recorded in
    ``requests`` and answered by ``answer(request)``."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = _read_chunked(self.rfile)
                parts = urlsplit(self.path)
                request = Request(self.command, unquote(parts.path), parse_qs(parts.query, keep_blank_values=True),
                                  {k.lower(): v for k, v in self.headers.items()}, body)
                with owner.lock:
                    owner.requests.append(request)
                    reply = owner.answer(request)
                payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                headers = {"Content-Type": "application/json" if not isinstance(reply.body, bytes) else
                           "application/octet-stream", **reply.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = do_PATCH = _any

            def log_message(self, *args) -> None:  # keep pytest's output clean
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                # A client that closes with part of an answer unread (a stream it did not need) resets the
                # connection: not an error of the server's. Anything else is printed as usual.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_port
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def answer(self, request: Request) -> Reply:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def seen(self, method: str, path_start: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_start)]


def _read_chunked(stream) -> bytes:
    body = b""
    while True:
        size = int(stream.readline().strip().split(b";")[0], 16)
        if size == 0:
            stream.readline()
            return body
        body += stream.read(size)
        stream.readline()


# --------------------------------------------------------------------------------------------
# A PyPI-compatible legacy upload API with a PEP 503 page


class FakeIndex(RecordingServer):
    """Upload at ``/legacy/`` (multipart, HTTP basic ``user``/``password``), pages at ``/simple/<project>/``.
    ``upload_answer`` forces the answer to uploads (a 500, a redirect); ``race`` = (bytes, answer) stores
    those bytes under the uploaded file's name just before the upload arrives (another uploader's) and
    answers the upload with ``answer`` (pypiserver's 409, PyPI's 400 "File already exists");
    ``hash_fragment`` is the algorithm of the pages' fragments ("" for none); ``private`` makes the pages
    need the credentials too; ``redirects`` maps a page's path to where it redirects (as pypiserver sends a
    project it does not have to pypi.org)."""

    def __init__(self, user: str, password: str) -> None:
        super().__init__()
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.files: dict[str, dict[str, bytes]] = {}  # project -> file name -> bytes
        self.upload_answer: Reply | None = None
        self.race: tuple[bytes, Reply] | None = None
        self.hash_fragment = "sha256"
        self.private = False
        self.redirects: dict[str, str] = {}

    def answer(self, request: Request) -> Reply:
        if request.path in self.redirects:
            return Reply(302, b"", {"Location": self.redirects[request.path]})
        if request.method == "POST" and request.path == "/legacy/":
            if request.headers.get("authorization") != self.auth:
                return Reply(403, b"Forbidden")
            if self.upload_answer is not None:
                return self.upload_answer
            fields = multipart_fields(request)
            name, content = fields["content"]
            project = fields["name"][1].decode().lower().replace("_", "-")
            if self.race is not None:
                (theirs, answer), self.race = self.race, None
                self.files.setdefault(project, {})[name] = theirs
                return answer
            if name in self.files.get(project, {}):
                return Reply(409, b"File already exists")
            self.files.setdefault(project, {})[name] = content
            return Reply(200, b"OK")
        if request.method == "GET" and request.path.startswith("/simple/"):
            if self.private and request.headers.get("authorization") != self.auth:
                return Reply(401, b"Unauthorized")
            project = request.path.split("/")[2]
            if project not in self.files:
                return Reply(404, b"Not Found")
            links = "".join(
                f'<a href="../../packages/{quote(name)}'
                + (f"#{self.hash_fragment}={hashlib.new(self.hash_fragment, data).hexdigest()}" if self.hash_fragment
                   else "") + f'">{name}</a><br>\n' for name, data in self.files[project].items())
            return Reply(200, f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(),
                         {"Content-Type": "text/html; charset=utf-8"})
        return Reply(404, b"Not Found")


def multipart_fields(request: Request) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body: field name -> (file name or None, bytes)."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode() + request.body)
    fields = {}
    for part in message.iter_parts():
        fields[part.get_param("name", header="content-disposition")] = (part.get_filename(),
                                                                         part.get_payload(decode=True))
    return fields


# --------------------------------------------------------------------------------------------
# The Hugging Face Hub API, as huggingface_hub calls it to commit one LFS file


class FakeHub(RecordingServer):
    """Model repositories with branches, commits and LFS objects. Writes (repository creation too) need
    ``token``; reads of a public repository need none; a wrong token is a 401, as on the Hub. ``race`` =
    (path, bytes) makes the next commit lose to one of that file that lands first (another uploader's), as
    in a race."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token
        self.repos: dict[str, dict] = {}  # repo_id -> {"branches": {name: sha}, "trees": {sha: {path: file}}}
        self.lfs: dict[str, bytes] = {}  # oid (sha256) -> bytes
        self.commits: list[dict] = []  # every commit made: repo, revision, header, operations
        self.race: tuple[str, bytes] | None = None  # (path, bytes) committed by "someone else" before our commit
        self.created: list[dict] = []  # every repository create_repo made: repo and the payload's other fields
        self.not_yours: set[str] = set()  # owners (users, organizations) the token may not create repositories under

    def add_repo(self, repo_id: str, files: dict[str, bytes] | None = None, branch: str = "main",
                 in_git: dict[str, bytes] | None = None) -> None:
        """A repository with LFS ``files`` and small files kept in git (``in_git``: no LFS pointer)."""
        tree = {path: self._lfs_file(data) for path, data in (files or {}).items()}
        tree.update({path: {**self._lfs_file(data), "in_git": True} for path, data in (in_git or {}).items()})
        sha = hashlib.sha1(f"{repo_id}{sorted(tree)}".encode()).hexdigest()
        self.repos[repo_id] = {"branches": {branch: sha}, "trees": {sha: tree}}

    def _lfs_file(self, data: bytes) -> dict:
        oid = sha256(data)
        self.lfs[oid] = data
        return {"oid": oid, "size": len(data)}

    def file(self, repo_id: str, path: str, branch: str = "main") -> bytes | None:
        repo = self.repos[repo_id]
        entry = repo["trees"][repo["branches"][branch]].get(path)
        return self.lfs[entry["oid"]] if entry else None

    def _commit(self, repo: dict, branch: str, changes: dict[str, dict]) -> str:
        parent = repo["branches"][branch]
        tree = {**repo["trees"][parent], **changes}
        sha = hashlib.sha1(f"{parent}{sorted(tree.items(), key=str)}".encode()).hexdigest()
        repo["trees"][sha] = tree
        repo["branches"][branch] = sha
        return sha

    def _path_info(self, path: str, entry: dict) -> dict:
        if entry.get("in_git"):  # oid: the git blob sha1 of the bytes themselves
            data = self.lfs[entry["oid"]]
            return {"type": "file", "path": path, "size": entry["size"],
                    "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
        return {"type": "file", "path": path, "size": entry["size"],
                "oid": hashlib.sha1(entry["oid"].encode()).hexdigest(),  # stands for the pointer file's blob id
                "lfs": {"oid": entry["oid"], "size": entry["size"], "pointerSize": 134}}

    def answer(self, request: Request) -> Reply:
        auth = request.headers.get("authorization")
        if auth is not None and auth != f"Bearer {self.token}":
            return Reply(401, {"error": "Invalid credentials in Authorization header"},
                         {"X-Error-Message": "Invalid credentials in Authorization header"})
        # The LFS PUT goes to the storage URL the batch answer gave (presigned on the Hub): no token.
        writing = "/preupload/" in request.path or "/commit/" in request.path \
            or request.path.endswith("/info/lfs/objects/batch") or request.path == "/api/repos/create"
        if writing and auth is None:
            return Reply(401, {"error": "Unauthorized"})
        if request.method == "POST" and request.path == "/api/repos/create":  # huggingface_hub's create_repo
            body = json.loads(request.body)
            repo_id = f"{body.get('organization')}/{body.get('name')}"
            if body.get("type") not in (None, "model"):
                return Reply(400, {"error": "only model repositories here"})
            if body.get("organization") in self.not_yours:
                return Reply(403, {"error": "You don't have the rights to create a model under this namespace"})
            if repo_id in self.repos:
                return Reply(409, {"error": "You already created this model repo", "url": f"{self.base}/{repo_id}"})
            self.add_repo(repo_id)
            rest = {k: v for k, v in body.items() if k not in ("name", "organization")}
            self.created.append({"repo": repo_id, **rest})
            return Reply(200, {"url": f"{self.base}/{repo_id}", "name": repo_id})
        if request.method == "PUT" and request.path.startswith("/lfs-upload/"):
            oid = request.path.rsplit("/", 1)[1]
            if sha256(request.body) != oid:
                return Reply(400, {"error": "sha256 mismatch"})
            self.lfs[oid] = request.body
            return Reply(200, b"")
        if request.method == "POST" and request.path.endswith("/info/lfs/objects/verify"):
            body = json.loads(request.body)
            return Reply(200 if body["oid"] in self.lfs else 404, {})
        if request.method == "POST" and request.path.endswith(".git/info/lfs/objects/batch"):
            body = json.loads(request.body)
            objects = [{"oid": o["oid"], "size": o["size"], "authenticated": True,
                        **({} if o["oid"] in self.lfs else {"actions": {
                            "upload": {"href": f"{self.base}/lfs-upload/{o['oid']}"},
                            "verify": {"href": f"{self.base}/{request.path[1:-len('batch')]}verify"}}})}
                       for o in body["objects"]]
            return Reply(200, {"transfer": "basic", "objects": objects})
        parts = request.path.split("/")
        if len(parts) < 7 or parts[:3] != ["", "api", "models"]:
            return Reply(404, {"error": "Not Found"})
        repo_id, action, revision = f"{parts[3]}/{parts[4]}", parts[5], "/".join(parts[6:])
        repo = self.repos.get(repo_id)
        if repo is None:
            return Reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        head = repo["branches"].get(revision, revision if revision in repo["trees"] else None)
        if head is None:
            return Reply(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
        tree = repo["trees"][head]
        if action == "revision" and request.method == "GET":
            return Reply(200, {"id": repo_id, "sha": head, "private": False,
                               "siblings": [{"rfilename": path} for path in tree]})
        if action == "paths-info" and request.method == "POST":
            paths = parse_qs(request.body.decode())["paths"]
            return Reply(200, [self._path_info(p, tree[p]) for p in paths if p in tree])
        if action == "preupload" and request.method == "POST":
            files = json.loads(request.body)["files"]
            return Reply(200, {"files": [{"path": f["path"], "uploadMode": "lfs", "shouldIgnore": False,
                                          "oid": tree[f["path"]]["oid"] if f["path"] in tree else None}
                                         for f in files]})
        if action == "commit" and request.method == "POST":
            lines = [json.loads(line) for line in request.body.decode().splitlines() if line.strip()]
            header = lines[0]["value"]
            if self.race is not None:  # someone else's commit lands first
                path, data = self.race
                self.race = None
                self._commit(repo, revision, {path: self._lfs_file(data)})
            if header.get("parentCommit") and header["parentCommit"] != repo["branches"][revision]:
                return Reply(412, {"error": "A commit has happened since. Please refresh and try again."})
            changes = {}
            for line in lines[1:]:
                value = line["value"]
                if line["key"] != "lfsFile" or value["oid"] not in self.lfs:
                    return Reply(400, {"error": f"unexpected operation {line['key']}"})
                changes[value["path"]] = {"oid": value["oid"], "size": value["size"]}
            sha = self._commit(repo, revision, changes)
            self.commits.append({"repo": repo_id, "revision": revision, "header": header, "operations": lines[1:]})
            return Reply(200, {"commitUrl": f"{self.base}/{repo_id}/commit/{sha}", "commitOid": sha})
        return Reply(404, {"error": "Not Found"})


# --------------------------------------------------------------------------------------------
# GitHub's REST API (GitHub Enterprise Server's /api/v3 layout), as PyGithub calls it for release assets


class FakeGitHub(RecordingServer):
    """Releases of repositories by tag, their assets (with a ``digest`` unless ``digests`` is False),
    upload and download. Every request needs ``token`` (``Authorization: token ...``)."""

    def __init__(self, token: str, repos: tuple[str, ...] = ("octo/wheels",)) -> None:
        super().__init__()
        self.token = token
        self.api = f"{self.base}/api/v3"
        self.repos = set(repos)
        self.releases: dict[tuple[str, str], dict] = {}  # (repo, tag) -> {"id", "assets": {name: asset}}
        self.digests = True
        self._ids = iter(range(1, 1 << 30))

    def add_release(self, repo: str, tag: str, assets: dict[str, bytes] | None = None) -> None:
        release = {"id": next(self._ids), "tag": tag, "assets": {}}
        self.releases[(repo, tag)] = release
        for name, data in (assets or {}).items():
            release["assets"][name] = {"id": next(self._ids), "name": name, "data": data}

    def asset_bytes(self, repo: str, tag: str, name: str) -> bytes | None:
        asset = self.releases.get((repo, tag), {"assets": {}})["assets"].get(name)
        return asset["data"] if asset else None

    def _release_json(self, repo: str, release: dict) -> dict:
        url = f"{self.api}/repos/{repo}/releases/{release['id']}"
        return {"id": release["id"], "tag_name": release["tag"], "name": release["tag"], "url": url,
                "assets_url": f"{url}/assets", "html_url": f"{self.base}/{repo}/releases/tag/{release['tag']}",
                "upload_url": f"{self.base}/api/uploads/repos/{repo}/releases/{release['id']}/assets{{?name,label}}",
                "draft": False, "prerelease": False,
                "assets": [self._asset_json(repo, release, a) for a in release["assets"].values()]}

    def _asset_json(self, repo: str, release: dict, asset: dict) -> dict:
        return {"id": asset["id"], "name": asset["name"], "label": "", "size": len(asset["data"]), "state": "uploaded",
                "content_type": "application/zip", "url": f"{self.api}/repos/{repo}/releases/assets/{asset['id']}",
                "browser_download_url": f"{self.base}/{repo}/releases/download/{release['tag']}/{asset['name']}",
                **({"digest": f"sha256:{sha256(asset['data'])}"} if self.digests else {})}

    def answer(self, request: Request) -> Reply:
        if request.headers.get("authorization") != f"token {self.token}":
            return Reply(401, {"message": "Bad credentials", "status": "401"})
        parts = request.path.split("/")
        upload = request.path.startswith("/api/uploads/repos/")
        if not (upload or request.path.startswith("/api/v3/repos/")) or len(parts) < 7:
            return Reply(404, {"message": "Not Found"})
        repo = f"{parts[4]}/{parts[5]}"
        if repo not in self.repos:
            return Reply(404, {"message": "Not Found"})
        rest = parts[6:]
        by_id = {r["id"]: r for (name, _), r in self.releases.items() if name == repo}
        if upload and request.method == "POST" and rest[0] == "releases" and rest[2] == "assets":
            release = by_id[int(rest[1])]
            name = request.query["name"][0]
            if name in release["assets"]:
                return Reply(422, {"message": "Validation Failed", "errors": [
                    {"resource": "ReleaseAsset", "code": "already_exists", "field": "name"}]})
            asset = release["assets"][name] = {"id": next(self._ids), "name": name, "data": request.body}
            return Reply(201, self._asset_json(repo, release, asset))
        if request.method == "GET" and rest[:2] == ["releases", "tags"]:
            release = self.releases.get((repo, "/".join(rest[2:])))
            return Reply(200, self._release_json(repo, release)) if release else Reply(404, {"message": "Not Found"})
        if request.method == "POST" and rest == ["releases"]:
            tag = json.loads(request.body)["tag_name"]
            self.add_release(repo, tag)
            return Reply(201, self._release_json(repo, self.releases[(repo, tag)]))
        if request.method == "GET" and len(rest) == 3 and rest[0] == "releases" and rest[2] == "assets":
            release = by_id[int(rest[1])]
            return Reply(200, [self._asset_json(repo, release, a) for a in release["assets"].values()])
        if request.method == "GET" and rest[:2] == ["releases", "assets"]:
            for release in by_id.values():
                for asset in release["assets"].values():
                    if str(asset["id"]) == rest[2]:
                        if request.headers.get("accept") == "application/octet-stream":
                            return Reply(200, asset["data"])
                        return Reply(200, self._asset_json(repo, release, asset))
        return Reply(404, {"message": "Not Found"})


@contextlib.contextmanager
def moto_s3_server(log: Path) -> Iterator[str]:
    """moto's real S3 server (`python -m moto.server`) on a free port of 127.0.0.1, its output in ``log``:
    the endpoint URL, and the server stopped afterwards."""
    port = free_port()
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=fh,
                                stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class BucketSite:
    """A bucket's objects below ``prefix`` served over plain HTTP on 127.0.0.1, as S3's website endpoint
    serves a bucket: GET /<path> is the object <prefix><path>, a folder's (a path ending in '/') its
    index.html (the index document), a key not there a 404. What pip and `imagegen index --merge` read
    when a wheelhouse is published to ``s3://BUCKET/PREFIX,layout=wheelhouse``."""

    def __init__(self, client, bucket: str, prefix: str) -> None:
        owner = self
        self.asked: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = unquote(urlsplit(self.path).path).lstrip("/")
                owner.asked.append(path)
                key = prefix + (path + "index.html" if path.endswith("/") or not path else path)
                try:
                    obj = client.get_object(Bucket=bucket, Key=key)
                except client.exceptions.NoSuchKey:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = obj["Body"].read()
                self.send_response(200)
                self.send_header("Content-Type", obj.get("ContentType") or "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/"

    def __enter__(self) -> "BucketSite":
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
