"""Prebuilt builder images: their references, the lock file, and the registry operations.

A builder image is a cell's `builder` stage: OS packages, the venv with exactly the torch asked for,
the build requirements and the pinned, patched source; no compiled code and no arch. Its reference
is a pure function of the cell, so `imagegen push` on one machine and `imagegen pull` on another
agree on it without talking to each other::

    <registry>/<namespace>/imagegen-<recipe>:<version>-torch<X.Y>-cu<XYZ>-py<XY>[-<flavor>]

(the flavor suffix is left out for the default flavor, runpod). The lock file (``imagegen.lock``,
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
from imagegen.errors import ImagegenError
from imagegen.plan import Cell, Plan, defaults

LOCK_FILE = "imagegen.lock"
LOCK_SCHEMA = 1
# registry host[:port] / namespace (one or more path parts), as in imagegen.toml's `registry`
REGISTRY = re.compile(r"[a-z0-9.-]+(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class RegistryError(ImagegenError):
    """A registry refused or could not be reached, or an image is missing."""

    exit_code = 7


class ImageMissing(RegistryError):
    """The registry answered: no such image (the one failure `pull` may fall back from)."""


def check_registry(value: str) -> str:
    if not REGISTRY.fullmatch(value or ""):
        raise RegistryError(f"registry {value!r} is not HOST[:PORT]/NAMESPACE (e.g. 127.0.0.1:5000/ml or ghcr.io/me)")
    return value


def image_ref(cell: Cell, registry: str) -> str:
    """The builder image of ``cell`` in ``registry`` (``host[:port]/namespace``)."""
    check_registry(registry)
    flavor = "" if cell.flavor == defaults()["flavor"] else f"-{cell.flavor}"
    version = re.sub(r"[^A-Za-z0-9_.-]", "_", cell.version.version)
    tag = f"{version}-torch{cell.torch.series}-{cell.cuda.name}-py{cell.python.replace('.', '')}{flavor}"
    ref = f"{registry}/imagegen-{cell.recipe.name}:{tag}"
    return safety.check(ref, safety.IMAGE_REF, "builder image reference")


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
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            raise RegistryError(f"{path}: not a readable lock file ({exc}); delete it and run imagegen lock") from None
        if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA:
            raise RegistryError(f"{path}: lock schema {data.get('schema') if isinstance(data, dict) else '?'!r} is not"
                                f" {LOCK_SCHEMA}; run imagegen lock again")
        lock = cls(path)
        for key in ("base_images", "builder_images"):
            table = data.get(key) or {}
            if not isinstance(table, dict):
                raise RegistryError(f"{path}: {key} must be a table of image -> image@sha256:...")
            for ref, pinned in table.items():
                if not (isinstance(ref, str) and isinstance(pinned, str) and safety.IMAGE_REF.fullmatch(ref)
                        and safety.IMAGE_REF.fullmatch(pinned) and "@sha256:" in pinned):
                    raise RegistryError(f"{path}: {key}: {ref!r} -> {pinned!r} is not image -> image@sha256:<digest>")
                getattr(lock, key)[ref] = pinned
        return lock

    def save(self) -> None:
        from imagegen.render import write_output

        text = json.dumps({"schema": LOCK_SCHEMA, "base_images": dict(sorted(self.base_images.items())),
                           "builder_images": dict(sorted(self.builder_images.items()))}, indent=2) + "\n"
        write_output(text, str(self.path))

    def pin_bases(self, plan: Plan) -> Plan:
        """The plan with every locked base image replaced by its pinned form (FROM image@sha256)."""
        cells = []
        for cell in plan.cells:
            if cell.base is not None and cell.base.ref in self.base_images:
                cell = dataclasses.replace(cell, base=dataclasses.replace(cell.base, ref=self.base_images[cell.base.ref]))
            cells.append(cell)
        return dataclasses.replace(plan, cells=cells)


def pinned(ref: str, digest: str) -> str:
    if not _DIGEST.fullmatch(digest):
        raise RegistryError(f"{digest!r} is not a sha256 digest")
    return f"{ref.split('@', 1)[0]}@{digest}"


# ------------------------------------------------------------------------------ engine calls


def explain(stderr: str, ref: str, registry_host: str) -> RegistryError:
    """One actionable line for what docker said about ``ref``."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "no output"
    low = text.lower()
    if "manifest unknown" in low or ("not found" in low and "manifest" in low) or "repository does not exist" in low:
        return ImageMissing(f"{ref} is not in the registry (push it with imagegen push)")
    if "no basic auth credentials" in low or "unauthorized" in low or "authentication required" in low \
            or "denied" in low or "401" in low:
        return RegistryError(f"{registry_host} refused the credentials for {ref}: run `docker login {registry_host}`"
                             f" with a valid user and password ({last[-160:]})")
    if "connection refused" in low or "no such host" in low or "i/o timeout" in low or "dial tcp" in low \
            or "server gave http response to https client" in low:
        return RegistryError(f"registry {registry_host} is not reachable ({last[-160:]}): check the address and that it is running")
    if "cannot connect to the docker daemon" in low:
        return RegistryError("no Docker engine is running: start it (imagegen doctor shows what is missing)")
    return RegistryError(f"{ref}: {last[-200:]}")


def registry_host(ref: str) -> str:
    first = ref.split("/", 1)[0]
    return first if ("." in first or ":" in first or first == "localhost") else "docker.io"


def docker(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise RegistryError("the docker CLI is not installed (imagegen doctor says what is missing)") from None


def pull(ref: str) -> str:
    """Pull ``ref``; return its registry digest. Raises ImageMissing or RegistryError."""
    proc = docker("pull", "--quiet", ref)
    if proc.returncode != 0:
        raise explain(proc.stderr or proc.stdout, ref, registry_host(ref))
    digest = repo_digest(ref)
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


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", ref).returncode == 0


def lock_bases(plan: Plan, lock: Lock, say=print) -> Lock:
    """Resolve every base image of ``plan`` to the digest its registry serves now."""
    refs = sorted({c.base.ref for c in plan.buildable if c.base is not None})
    for ref in refs:
        base = ref.split("@", 1)[0]
        if "@sha256:" in ref:
            lock.base_images[base] = ref
            continue
        try:
            digest = pull(base)
        except ImageMissing:
            raise RegistryError(f"base image {base} is not in its registry: check the tag (imagegen plan shows"
                                " which cell uses it)") from None
        except RegistryError as exc:
            if repo_digest(base) is None and image_exists(base):
                raise RegistryError(f"base image {base} exists only on this machine (built or imported locally),"
                                    " so it has no registry digest to pin: push it to a registry first") from None
            raise exc
        lock.base_images[base] = pinned(base, digest)
        say(f"{base} -> {digest}")
    return lock
