"""A real container registry on loopback for the push / pull / lock tests (a helper, not a test file).

`LocalRegistry` runs Debian's `docker-registry` (distribution 2.8.x; installed by
scripts/install-registry.sh) on 127.0.0.1:<free port> with filesystem storage under a temp dir,
deletes enabled, and htpasswd (bcrypt) basic auth. The Docker engine treats 127.0.0.0/8 as an
insecure registry by default, so plain HTTP works for `docker push` / `docker pull` / buildx.

Every docker command of a test must run with `registry.env()` merged into its environment: that
points DOCKER_CONFIG at a private directory, so `docker login` never touches ~/.docker.

    with LocalRegistry() as reg:                     # started; stopped and its temp dir removed on exit
        reg.login()
        subprocess.run(["docker", "push", f"{reg.host}/x/y:1"], env={**os.environ, **reg.env()})
        reg.tags("x/y"), reg.manifest_digest("x/y", "1")

In pytest: the `registry` fixture of tests/integration/conftest.py (module scope, logged in), or
`name = LocalRegistry.fixture(scope="function")` for another one.

`LocalRegistry(workdir, storage=kept_storage("name"))` keeps its blobs across test runs (the prebuilt
builder image is ~6 GB: dockerd gzips it on one core, minutes each run); the test deletes every manifest
first, so everything it reads is what it pushed, and garbage-collects at the end, so the folder holds
the last run's images only. A push then finds its unchanged layers there ("Layer already exists"),
as a user's second push to their registry does.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REGISTRY_BIN = "/usr/bin/docker-registry"
INSTALL_HINT = "run scripts/install-registry.sh as root (scripts/test.sh does)"
START_TIMEOUT_S = 30.0
MANIFEST_ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


class RegistryError(RuntimeError):
    """The registry did not start, or a docker / HTTP call against it failed."""


def registry_binary() -> str | None:
    """The docker-registry executable, or None."""
    if os.access(REGISTRY_BIN, os.X_OK):
        return REGISTRY_BIN
    return shutil.which("docker-registry")


def missing_tools() -> list[str]:
    """What a LocalRegistry needs and this machine lacks (empty when all is there)."""
    missing = []
    if registry_binary() is None:
        missing.append(f"docker-registry ({REGISTRY_BIN})")
    if shutil.which("htpasswd") is None:
        missing.append("htpasswd (apache2-utils)")
    if shutil.which("docker") is None:
        missing.append("docker (client)")
    return missing


def kept_storage(name: str) -> Path:
    """A registry storage folder that outlives the test run: IMAGEGEN_TEST_REGISTRY_CACHE/NAME, by default
    under /var/cache/imagegen-tests (root, as scripts/test.sh runs), else under the user's cache."""
    top = os.environ.get("IMAGEGEN_TEST_REGISTRY_CACHE")
    if not top:
        top = "/var/cache/imagegen-tests/registry" if os.geteuid() == 0 else \
            str(Path.home() / ".cache" / "imagegen-tests" / "registry")
    return Path(top) / name


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` of a server's log, for a failure message (the second dockerd uses it too)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalRegistry:
    """docker-registry on 127.0.0.1:<free port> with htpasswd auth and a private DOCKER_CONFIG."""

    def __init__(self, workdir: str | os.PathLike | None = None, user: str = "imagegen",
                 password: str | None = None, realm: str = "imagegen-test-registry",
                 storage: str | os.PathLike | None = None):
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="imagegen-registry-"))
        self.user = user
        self.password = password or secrets.token_urlsafe(18)
        self.realm = realm
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        # A storage folder of the caller's (kept_storage) outlives the registry; the default one does not.
        self.storage = Path(storage) if storage is not None else self.workdir / "storage"
        self.config_path = self.workdir / "config.yml"
        self.htpasswd_path = self.workdir / "htpasswd"
        self.log_path = self.workdir / "registry.log"
        self.docker_config = str(self.workdir / "docker-config")

    # -- addresses and environment ---------------------------------------------------------------
    @property
    def host(self) -> str:
        """"127.0.0.1:PORT": the registry part of an image reference."""
        if self.port is None:
            raise RegistryError("registry not started")
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def env(self) -> dict[str, str]:
        """Merge into a subprocess environment: docker then uses this registry's private config."""
        return {"DOCKER_CONFIG": self.docker_config}

    def ref(self, repo: str, tag: str) -> str:
        return f"{self.host}/{repo}:{tag}"

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> "LocalRegistry":
        if self.proc is not None:
            return self
        missing = missing_tools()
        if missing:
            raise RegistryError(f"missing {', '.join(missing)}: {INSTALL_HINT}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        Path(self.docker_config).mkdir(mode=0o700, exist_ok=True)
        self._write_htpasswd()
        # The free port can be taken between probe and bind: try a few.
        for attempt in range(3):
            self.port = free_port()
            self._write_config()
            log = open(self.log_path, "ab")
            try:
                self.proc = subprocess.Popen([registry_binary(), "serve", str(self.config_path)],
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            finally:
                log.close()
            try:
                self._wait_ready()
                return self
            except RegistryError:
                in_use = "address already in use" in log_tail(self.log_path, 5)
                self._terminate()
                if not in_use or attempt == 2:
                    raise
        return self

    def stop(self) -> None:
        """Terminate the registry; remove its temp dir when LocalRegistry made it."""
        self._terminate()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "LocalRegistry":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    @classmethod
    def fixture(cls, scope: str = "module", login: bool = True, **kwargs):
        """A pytest fixture yielding a started (and by default logged-in) registry, stopped afterwards.
        It fails (never skips) when docker-registry or htpasswd is missing."""
        import pytest

        @pytest.fixture(scope=scope)
        def _registry(tmp_path_factory):
            missing = missing_tools()
            if missing:
                pytest.fail(f"a real registry is required but {', '.join(missing)} missing: {INSTALL_HINT}")
            with cls(tmp_path_factory.mktemp("registry"), **kwargs) as reg:
                if login:
                    reg.login()
                yield reg
        return _registry

    def _write_htpasswd(self) -> None:
        out = subprocess.run(["htpasswd", "-Bbn", self.user, self.password], capture_output=True, text=True)
        if out.returncode != 0:
            raise RegistryError(f"htpasswd failed: {out.stderr.strip() or out.stdout.strip()}")
        self.htpasswd_path.write_text(out.stdout.strip() + "\n")

    def _write_config(self) -> None:
        # JSON is YAML: no quoting questions for paths.
        config = {
            "version": 0.1,
            "log": {"level": "info", "fields": {"service": "registry"}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.storage)},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.host, "headers": {"X-Content-Type-Options": ["nosniff"]}},
            "auth": {"htpasswd": {"realm": self.realm, "path": str(self.htpasswd_path)}},
        }
        self.config_path.write_text(json.dumps(config, indent=2) + "\n")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RegistryError(f"docker-registry exited with {self.proc.returncode} during start-up; "
                                    f"log {self.log_path}:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/", timeout=2) as resp:
                    last = f"HTTP {resp.status} (auth not enforced?)"
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        raise RegistryError(f"registry on {self.host} did not answer 401 on /v2/ within {START_TIMEOUT_S:.0f}s "
                            f"(last: {last}); log {self.log_path}:\n{log_tail(self.log_path)}")

    def _terminate(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    # -- docker login ----------------------------------------------------------------------------
    def docker(self, *args: str, input: str | None = None, timeout: float = 300,
               docker_config: str | None = None) -> subprocess.CompletedProcess:
        """Run `docker ARGS` with this registry's DOCKER_CONFIG (or another one)."""
        env = {**os.environ, "DOCKER_CONFIG": docker_config or self.docker_config}
        return subprocess.run(["docker", *args], input=input, env=env, capture_output=True, text=True,
                              timeout=timeout)

    def login_with(self, password: str, user: str | None = None,
                   docker_config: str | None = None) -> subprocess.CompletedProcess:
        """`docker login HOST -u USER --password-stdin`; the CompletedProcess, whatever the outcome."""
        return self.docker("login", self.host, "-u", user or self.user, "--password-stdin",
                           input=password + "\n", timeout=60, docker_config=docker_config)

    def login(self) -> None:
        out = self.login_with(self.password)
        if out.returncode != 0:
            raise RegistryError(f"docker login {self.host} failed ({out.returncode}):\n{out.stdout}{out.stderr}")

    def logout(self) -> None:
        out = self.docker("logout", self.host, timeout=60)
        if out.returncode != 0:
            raise RegistryError(f"docker logout {self.host} failed ({out.returncode}):\n{out.stdout}{out.stderr}")

    # -- registry HTTP API -----------------------------------------------------------------------
    def _request(self, method: str, path: str, accept: str | None = None):
        req = urllib.request.Request(f"{self.url}{path}", method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        if accept:
            req.add_header("Accept", accept)
        return urllib.request.urlopen(req, timeout=30)

    def tags(self, repo: str) -> list[str]:
        """The repository's tags, sorted; [] when the repository does not exist."""
        try:
            with self._request("GET", f"/v2/{repo}/tags/list") as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise RegistryError(f"GET /v2/{repo}/tags/list: HTTP {e.code}: {e.read()[:500]!r}") from e
        return sorted(body.get("tags") or [])

    def manifest_digest(self, repo: str, tag: str) -> str | None:
        """The digest ("sha256:...") the registry serves for repo:tag (OCI index/manifest or Docker
        manifest list / v2 manifest, as pushed); None when there is no such tag."""
        try:
            with self._request("HEAD", f"/v2/{repo}/manifests/{tag}", accept=MANIFEST_ACCEPT) as resp:
                digest = resp.headers.get("Docker-Content-Digest")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise RegistryError(f"HEAD /v2/{repo}/manifests/{tag}: HTTP {e.code}") from e
        if not digest:
            raise RegistryError(f"HEAD /v2/{repo}/manifests/{tag}: no Docker-Content-Digest header")
        return digest

    def repositories(self) -> list[str]:
        """Every repository the registry holds (the catalog), sorted."""
        with self._request("GET", "/v2/_catalog?n=1000") as resp:
            return sorted(json.load(resp).get("repositories") or [])

    def delete_manifests(self) -> int:
        """Delete every tagged manifest (the blobs stay until garbage_collect); returns how many."""
        deleted = 0
        for repo in self.repositories():
            for tag in self.tags(repo):
                digest = self.manifest_digest(repo, tag)
                if digest is None:
                    continue
                try:
                    self._request("DELETE", f"/v2/{repo}/manifests/{digest}").close()
                except urllib.error.HTTPError as e:
                    if e.code != 404:  # two tags of one digest: the second is gone with the first
                        raise RegistryError(f"DELETE /v2/{repo}/manifests/{digest}: HTTP {e.code}") from e
                deleted += 1
        return deleted

    def garbage_collect(self) -> None:
        """`docker-registry garbage-collect --delete-untagged` on the stopped registry's storage: what no
        tag references goes (the storage then holds the last tags' images only)."""
        if self.proc is not None:
            raise RegistryError("garbage-collect needs the registry stopped")
        proc = subprocess.run([registry_binary(), "garbage-collect", "--delete-untagged", str(self.config_path)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RegistryError(f"docker-registry garbage-collect failed ({proc.returncode}): {proc.stderr[-1000:]}")

    def manifest(self, repo: str, ref: str) -> tuple[str, dict]:
        """(media type, parsed manifest) of repo:tag or repo@digest."""
        try:
            with self._request("GET", f"/v2/{repo}/manifests/{ref}", accept=MANIFEST_ACCEPT) as resp:
                return resp.headers.get("Content-Type", ""), json.load(resp)
        except urllib.error.HTTPError as e:
            raise RegistryError(f"GET /v2/{repo}/manifests/{ref}: HTTP {e.code}") from e
