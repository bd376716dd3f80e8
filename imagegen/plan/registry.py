"""Prebuilt builder images: their references, the lock file, and the registry operations.

A builder image is a cell's `builder` stage: OS packages, the venv with exactly the torch asked for,
the build requirements and the pinned, patched source; no compiled code and no arch. Its reference
is a pure function of the cell, so `imagegen push` on one machine and `imagegen pull` on another
agree on it without talking to each other::

    <registry>/<namespace>/imagegen-<recipe>:<version>-torch<X.Y>-cu<XYZ>-py<XY>[-<flavor>][-arm64]

(the flavor suffix is left out for the default flavor, runpod; the platform suffix for linux/amd64).
A linux/arm64 builder image has a tag of its own rather than sharing a multi-platform tag with the
amd64 one: each is pushed, pinned and pulled on its own, by whichever machine built it (an arm64
runner, or QEMU), and neither push can replace the other's image. The lock file (``imagegen.lock``,
JSON) pins every image a build depends on to a digest: the base images (``imagegen lock``) and the
builder images that were pushed (``imagegen push``). `render`, `bake`, `build` and `pull` read it, so
a tag that moves upstream cannot change a build without a visible change to the lock file.

Registry failures are turned into one line that says what to do: wrong or missing credentials,
an unreachable registry, a missing image.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

from imagegen import safety
from imagegen.errors import ImageMissing, LockFileError, NoPlatformImage, RegistryError
from imagegen.model.cell import DEFAULT_PLATFORM, Cell, Plan
from imagegen.plan.matrix import defaults

LOCK_FILE = "imagegen.lock"
LOCK_SCHEMA = 1
MAX_LOCK_BYTES = 16 << 20
# registry host[:port] / namespace (one or more path parts), as in imagegen.toml's `registry`
REGISTRY = re.compile(r"[a-z0-9.-]+(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def validate_registry(value: str) -> str:
    if not REGISTRY.fullmatch(value or ""):
        raise RegistryError(f"registry {value!r} is not HOST[:PORT]/NAMESPACE (e.g. 127.0.0.1:5000/ml or ghcr.io/me)")
    return value


# A builder image's name below the registry/namespace, as image_name writes it (the bake file's label
# io.imagegen.builder, which the CI workflow's push step puts after its registry).
IMAGE_NAME = re.compile(r"imagegen-[a-z0-9]+(?:[._-][a-z0-9]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def image_name(cell: Cell) -> str:
    """The builder image of ``cell`` below any registry: ``imagegen-<recipe>:<tag>``."""
    flavor = "" if cell.flavor == defaults()["flavor"] else f"-{cell.flavor}"
    version = re.sub(r"[^A-Za-z0-9_.-]", "_", cell.version.version)
    platform = "" if cell.platform == DEFAULT_PLATFORM else "-" + cell.platform.split("/")[-1]
    tag = f"{version}-torch{cell.torch.series}-{cell.cuda.name}-py{cell.python.replace('.', '')}{flavor}{platform}"
    return safety.validate(f"imagegen-{cell.recipe.name}:{tag}", IMAGE_NAME, "builder image name")


def image_ref(cell: Cell, registry: str) -> str:
    """The builder image of ``cell`` in ``registry`` (``host[:port]/namespace``)."""
    validate_registry(registry)
    return safety.validate(f"{registry}/{image_name(cell)}", safety.IMAGE_REF, "builder image reference")


def image_labels(cell: Cell, inputs: str, created: str, version: str) -> dict[str, str]:
    """OCI labels of a pushed builder image (the Dockerfile's own labels describe the cell; these
    add what only the push knows)."""
    return {
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.source": cell.recipe.homepage or (cell.recipe.source_url or ""),
        "org.opencontainers.image.revision": cell.version.pinned_ref,
        "org.opencontainers.image.version": cell.version.version,
        "io.imagegen.version": version,
        "io.imagegen.inputs": inputs,
    }


# ------------------------------------------------------------------------------------------ lock


@dataclasses.dataclass
class Lock:
    path: Path
    base_images: dict[str, str] = dataclasses.field(default_factory=dict)     # ref -> ref@sha256:...
    builder_images: dict[str, str] = dataclasses.field(default_factory=dict)  # ref -> ref@sha256:...

    @classmethod
    def load(cls, path: Path) -> "Lock":
        import os
        import stat

        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise LockFileError(f"{path}: not a regular file, so not a lock file")
            with open(path, "rb") as fh:
                raw = fh.read(MAX_LOCK_BYTES + 1)
            if len(raw) > MAX_LOCK_BYTES:
                raise LockFileError(f"{path}: larger than {MAX_LOCK_BYTES >> 20} MiB: not a lock file")
            data = json.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            return cls(path)
        except UnicodeDecodeError:
            raise LockFileError(f"{path}: not UTF-8 text (a binary file?), so not a lock file; delete it and run"
                                " imagegen lock") from None
        except (OSError, ValueError, RecursionError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)[:120]
            raise LockFileError(f"{path}: not a readable lock file ({why}); delete it and run imagegen lock") from None
        if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA:
            raise LockFileError(f"{path}: lock schema {data.get('schema') if isinstance(data, dict) else '?'!r} is not"
                                f" {LOCK_SCHEMA}; run imagegen lock again")
        lock = cls(path)
        for key in ("base_images", "builder_images"):
            table = data.get(key) or {}
            if not isinstance(table, dict):
                raise LockFileError(f"{path}: {key} must be a table of image -> image@sha256:...")
            for ref, pinned in table.items():
                if not (isinstance(ref, str) and isinstance(pinned, str) and safety.IMAGE_REF.fullmatch(ref)
                        and safety.IMAGE_REF.fullmatch(pinned) and "@sha256:" in pinned):
                    raise LockFileError(f"{path}: {key}: {ref!r:.80} -> {pinned!r:.80} is not image -> image@sha256:<digest>")
                getattr(lock, key)[ref] = pinned
        return lock

    def save(self) -> None:
        from imagegen.outputs import write_text_atomic

        text = json.dumps({"schema": LOCK_SCHEMA, "base_images": dict(sorted(self.base_images.items())),
                           "builder_images": dict(sorted(self.builder_images.items()))}, indent=2) + "\n"
        write_text_atomic(self.path, text, what="lock file")

    def pin_base(self, cell: Cell) -> Cell:
        """``cell`` with its base image, if locked, replaced by its pinned form (FROM image@sha256)."""
        if cell.base is not None and cell.base.ref in self.base_images:
            return dataclasses.replace(cell, base=dataclasses.replace(cell.base, ref=self.base_images[cell.base.ref]))
        return cell

    def pin_bases(self, plan: Plan) -> Plan:
        """The plan with every locked base image pinned (pin_base, per cell)."""
        return plan.each(self.pin_base)


def pinned(ref: str, digest: str) -> str:
    if not _DIGEST.fullmatch(digest):
        raise RegistryError(f"{digest!r} is not a sha256 digest")
    return f"{ref.split('@', 1)[0]}@{digest}"


# ------------------------------------------------------------------------------ engine calls


# An HTTP 401 in docker's words ("401 Unauthorized", "status 401"), not the digits of a port or an address
# (127.0.0.1:60401 is a registry that is not there)
_HTTP_401 = re.compile(r"(?<![\w.:])401(?!\w)")


def explain(stderr: str, ref: str, registry_host: str, platform: str | None = None) -> RegistryError:
    """One actionable line for what docker said about ``ref`` (pulled for ``platform``)."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "no output"
    low = text.lower()
    if "no matching manifest for" in low or "does not match the specified platform" in low:
        return NoPlatformImage(f"{ref} has no {platform or 'matching platform'} image ({last[-160:]}): use an image"
                             " published for that platform")
    if "manifest unknown" in low or ("not found" in low and "manifest" in low) or "repository does not exist" in low:
        return ImageMissing(f"{ref} is not in the registry (push it with imagegen push)")
    if "no basic auth credentials" in low or "unauthorized" in low or "authentication required" in low \
            or "denied" in low or _HTTP_401.search(low):
        return RegistryError(f"{registry_host} refused the credentials for {ref}: run `docker login {registry_host}`"
                             f" with a valid user and password ({last[-160:]})")
    if "connection refused" in low or "no such host" in low or "i/o timeout" in low or "dial tcp" in low \
            or "server gave http response to https client" in low:
        return RegistryError(f"registry {registry_host} is not reachable ({last[-160:]}): check the address and that it is running")
    if "cannot connect to the docker daemon" in low:
        return RegistryError("no Docker engine is running: start it (imagegen doctor shows what is missing)")
    return RegistryError(f"{ref}: {last[-200:]}")


def probe(registry: str, *, timeout: float = 5.0) -> str:
    """Fail fast, before anything is built, when ``registry`` (HOST[:PORT]/NAMESPACE) cannot take a
    push: not reachable, not a registry (GET /v2/ must answer 200 or 401), or (where the docker
    config holds a user and password for it) refusing them. Raises the RegistryError that
    :func:`explain` gives for the same failure of a real push; returns the URL that answered.
    Anything this check cannot judge (a credential helper, an odd auth scheme) is left to the push;
    so is everything when the engine is remote (DOCKER_HOST tcp:// or ssh://: it may reach registries
    this machine cannot) or IMAGEGEN_NO_REGISTRY_PROBE=1."""
    import os
    import socket
    import ssl
    import urllib.error
    import urllib.request

    host = validate_registry(registry).split("/", 1)[0]
    if os.environ.get("IMAGEGEN_NO_REGISTRY_PROBE") == "1" \
            or os.environ.get("DOCKER_HOST", "").startswith(("tcp://", "ssh://")):
        return ""
    ref = f"{registry}/imagegen-probe"
    errors = []
    for scheme in ("https", "http"):  # the engine talks plain HTTP to insecure registries (127.0.0.0/8)
        url = f"{scheme}://{host}/v2/"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
                return url
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                _validate_credentials(host, ref, url, exc.headers.get("WWW-Authenticate", ""), timeout)
                return url
            raise RegistryError(f"{host} does not serve the registry API (GET {url} answered {exc.code}): check"
                                " the address (HOST[:PORT]/NAMESPACE of a Docker registry)") from None
        except (urllib.error.URLError, ssl.SSLError, socket.timeout, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            errors.append(str(reason))
            if isinstance(reason, (socket.gaierror,)):
                break  # the name does not resolve: no scheme will help
    low = " ".join(errors).lower()
    why = "no such host" if "name or service not known" in low or "nodename nor servname" in low \
        or "name resolution" in low else "i/o timeout" if "timed out" in low else "connection refused"
    raise explain(f"dial tcp {host}: {why} ({errors[-1][:120] if errors else 'no answer'})", ref, host)


def _docker_auth(host: str) -> tuple[str | None, bool]:
    """(base64 user:password for ``host`` from the docker config, whether a credential helper may have one)."""
    import os

    folder = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
            config = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return None, False
    if not isinstance(config, dict):
        return None, False
    helper = bool(config.get("credsStore")) or host in (config.get("credHelpers") or {})
    auths = config.get("auths") or {}
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/", f"https://{host}/v2/"):
        entry = auths.get(key) if isinstance(auths, dict) else None
        if isinstance(entry, dict):
            if isinstance(entry.get("auth"), str) and entry["auth"]:
                return entry["auth"], helper
            return None, True  # an entry without inline auth: the helper holds it
    return None, helper


def _validate_credentials(host: str, ref: str, url: str, challenge: str, timeout: float) -> None:
    import urllib.error
    import urllib.parse
    import urllib.request

    auth, helper = _docker_auth(host)
    if auth is None:
        if helper:
            return  # a credential helper holds them: the push will tell
        raise explain("no basic auth credentials", ref, host)
    scheme = challenge.split(" ", 1)[0].lower()
    if scheme == "basic":
        target = url
    elif scheme == "bearer":
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not params.get("realm", "").startswith(("https://", "http://")):
            return
        query = urllib.parse.urlencode({k: v for k, v in params.items() if k == "service"})
        target = params["realm"] + ("?" + query if query else "")
    else:
        return
    try:
        request = urllib.request.Request(target, headers={"Authorization": f"Basic {auth}"})
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise explain(f"unauthorized: {exc.code} {exc.reason}", ref, host) from None
    except OSError:
        return  # the push will say what is wrong


def registry_host(ref: str) -> str:
    first = ref.split("/", 1)[0]
    return first if ("." in first or ":" in first or first == "localhost") else "docker.io"


def docker(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    from imagegen import engine
    return engine.docker(*args, timeout=timeout)


def pull(ref: str, platform: str | None = None) -> str:
    """Pull ``ref`` (its ``platform`` variant where given); return its registry digest: the manifest
    list's for a multi-platform image, which pins every platform at once. Raises ImageMissing or
    RegistryError."""
    proc = docker("pull", *(("--platform", platform) if platform else ()), ref)
    if proc.returncode != 0:
        raise explain(proc.stderr or proc.stdout, ref, registry_host(ref), platform)
    # The digest the registry served for the tag, as docker pull reports it: the engine's RepoDigests
    # can miss it when another platform's variant of the same list was pulled before.
    said = re.findall(r"^Digest: (sha256:[0-9a-f]{64})\s*$", proc.stdout or "", re.M)
    digest = said[-1] if said and "@" not in ref else repo_digest(ref)
    if digest is None:
        raise RegistryError(f"{ref} was pulled but the engine reports no digest for it")
    return digest


def repo_digest(ref: str) -> str | None:
    """The registry digest the engine recorded for ``ref`` (None for a local-only image)."""
    proc = docker("image", "inspect", "--format", "{{json .RepoDigests}}", ref)
    if proc.returncode != 0:
        return None
    repo = ref.split("@", 1)[0]
    repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
    for item in json.loads(proc.stdout or "[]") or []:
        name, _, digest = item.partition("@")
        if name == repo and _DIGEST.fullmatch(digest):
            return digest
    return None


def remote_digest(ref: str) -> str:
    """The digest the registry serves for ``ref`` now, read from its manifest without pulling the image
    (a builder image is gigabytes): the same digest `docker pull` reports and `imagegen push` records.
    Raises ImageMissing or RegistryError."""
    host = registry_host(ref)
    try:
        proc = docker("buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest}}", timeout=300)
    except subprocess.TimeoutExpired:
        raise RegistryError(f"registry {host} did not answer for {ref} within 300 s: check the address and that it"
                            " is running") from None
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout or "").strip()
        last = text.splitlines()[-1] if text else "no output"
        low = text.lower()
        # buildx words a refused login "pull access denied, repository does not exist or may require
        # authorization: ...": credentials, not a missing image
        if "no basic auth credentials" in low or "authorization failed" in low or "unauthorized" in low \
                or _HTTP_401.search(low):
            raise RegistryError(f"{host} refused the credentials for {ref}: run `docker login {host}` with a valid"
                                f" user and password ({last[-160:]})")
        if low.endswith(": not found") or "manifest unknown" in low:
            raise ImageMissing(f"{ref} is not in the registry (push it with imagegen push)")
        raise explain(text, ref, host)
    try:
        digest = json.loads(proc.stdout).get("digest")
    except (ValueError, AttributeError):
        digest = None
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise RegistryError(f"{ref}: the registry's answer names no sha256 digest")
    return digest


def lock_builders(plan: Plan, registry: str, lock: Lock, say=print) -> Lock:
    """Pin the builder image of every buildable cell of ``plan`` in ``registry`` to the digest the registry
    serves now (remote_digest: nothing is pulled). An image not pushed yet is said and left as the lock
    has it; wrong credentials or an unreachable registry stop."""
    for ref in dict.fromkeys(image_ref(c, registry) for c in plan.buildable):
        try:
            digest = remote_digest(ref)
        except ImageMissing:
            say(f"{ref} is not in the registry yet: not pinned (imagegen push, or the CI workflow's"
                " --push-builders, publishes it)")
            continue
        lock.builder_images[ref] = pinned(ref, digest)
        say(f"{ref} -> {digest}")
    return lock


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", ref).returncode == 0


def lock_bases(plan: Plan, lock: Lock, say=print) -> Lock:
    """Resolve every base image of ``plan`` to the digest its registry serves now, pulled for each
    platform its cells build for: a multi-platform image pins to its manifest list (one digest for
    all), and an image without a variant for a cell's platform is refused by name."""
    platforms: dict[str, set[str]] = {}
    for c in plan.buildable:
        if c.base is not None:
            platforms.setdefault(c.base.ref, set()).add(c.platform)
    for ref in sorted(platforms):
        base = ref.split("@", 1)[0]
        if "@sha256:" in ref:
            lock.base_images[base] = ref
            continue
        try:
            # the other platforms first: the engine's tag then ends on the default platform's image,
            # which an amd64 build of the same tag finds in the local store
            for platform in sorted(platforms[ref] - {DEFAULT_PLATFORM}) + sorted(platforms[ref] & {DEFAULT_PLATFORM}):
                digest = pull(base, platform)
        except ImageMissing:
            raise RegistryError(f"base image {base} is not in its registry: check the tag (imagegen plan shows"
                                " which cell uses it)") from None
        except NoPlatformImage:
            raise
        except RegistryError as exc:
            if repo_digest(base) is None and image_exists(base):
                raise RegistryError(f"base image {base} exists only on this machine (built or imported locally),"
                                    " so it has no registry digest to pin: push it to a registry first") from None
            raise exc
        lock.base_images[base] = pinned(base, digest)
        say(f"{base} -> {digest}")
    return lock
