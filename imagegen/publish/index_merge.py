"""What an index already serves, for ``imagegen index OUT --merge URL``: the wheels of the index published at
URL (where an earlier run's wheelhouse is served) and the manifests of the cell folders this run also has,
read so that this run's index lists both runs' wheels and its manifests both runs' cells.

What is read, all of it below URL:

- ``simple/index.json`` and ``simple/<project>/index.json``: the PEP 691 JSON pages `imagegen index`
  writes beside its HTML (a server that negotiates content answers ``simple/`` itself when there is no
  index.json). Neither there (404): nothing is published yet, and the merge adds nothing;
- ``cuXYZ/simple/...``: the per-CUDA pages of the CUDA variants this run has or the served wheels' local
  version labels name (``+cu130``): a served wheel is in a CUDA variant's index when that index lists it or
  its label names that variant;
- ``<folder>/manifest.json`` for each cell folder of this run (``<pkg>-<ver>/torch<X.Y>/cu<XYZ>``): one
  folder holds several cells (one per Python), so its published manifest has cells this run did not build.

The server is not trusted: every answer is bounded in size (``MAX_PAGE_BYTES``, ``MAX_MANIFEST_BYTES``),
JSON nesting, count (``MAX_PROJECTS``, ``MAX_FILES``, ``MAX_REQUESTS``) and time (one deadline for the whole
merge: a dripping server cannot outlast it); a redirect out of URL is not followed. A page that cannot be
read (unreachable, an error status but 404, too large, too slow, not the JSON a page is) is a
PublishError: an index written without the wheels it could not read would drop them from what is served.
A file entry that is not a wheel imagegen could have published (a bad file name, a hash that is no
sha256, a URL outside URL or not its own name, a wheel variant) is left out and said as a problem; so is a
served manifest that is not one (its folder's manifest is then this run's alone).

Links stay below URL, relative: a served wheel is listed at its path below URL, as this run's wheels are
below OUT, so the merged index is right only when OUT is served at URL (the publish that follows uploads
it there). Conflicts: a wheel of this run whose name is served with another sha256 is refused (the index
would list one name with two meanings, and the publish would refuse the upload anyway): publish a new
version. A cell both runs have is this run's; a served cell whose wheel is one of this run's with another
sha256 is refused the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import quote, unquote, urljoin, urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from imagegen import safety, untrusted
from imagegen.errors import HTTPStatusError, PublishError, Unreadable, printable
from imagegen.publish.index_wheels import MAX_REQUIRES_PYTHON_CHARS, WHEEL_FILE_NAME
from imagegen.wheelhouse.manifest import MANIFEST, MAX_MANIFEST_BYTES

MAX_PAGE_BYTES = 16 << 20  # a project page of every wheel of a large farm is a few MB
MAX_PROJECTS = 5000
MAX_FILES = 200_000  # file entries, all pages together
MAX_REQUESTS = 20_000
DEADLINE = 600.0  # seconds the whole merge may take
MAX_WHEEL_BYTES = 1 << 40

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
SHA256 = re.compile(r"[0-9a-f]{64}")
PROJECT_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
CUDA_VARIANT = re.compile(r"cu[0-9]{2,4}")
CUDA_LABEL = re.compile(r"(cu[0-9]{2,4})(?![0-9])")  # at the start of a local version label: +cu130torch2.11
# A wheel's path below URL as a page links it: path segments of URL characters, no '..', query or fragment.
SERVED_PATH = re.compile(r"(?!.*(?:^|/)\.\.?(?:/|$))[A-Za-z0-9._~%+!-]+(?:/[A-Za-z0-9._~%+!-]+)*")

Say = Callable[[str], None]


@dataclass(frozen=True)
class ServedWheel:
    """A wheel the served index lists, as the merged index lists it again."""

    name: str
    url_path: str  # below URL, percent-encoded
    project: str  # normalized
    version: Version
    sha256: str
    size: int
    requires_python: str | None
    metadata_sha256: str | None  # of its <wheel>.metadata (PEP 658/714), when the page gives one
    cuda: frozenset[str] = frozenset()  # the CUDA variants whose index lists it


@dataclass
class Served:
    """What the index at ``url`` (ending in '/') serves: its wheels by file name, the manifests of the
    folders asked (folder -> its cells; a folder not published is absent), and what was left out."""

    url: str
    wheels: dict[str, ServedWheel] = field(default_factory=dict)
    manifests: dict[str, dict] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    published: bool = False  # whether an index is served there at all

    def as_dict(self) -> dict:
        return {"url": self.url, "published": self.published, "wheels": sorted(self.wheels),
                "manifests": sorted(self.manifests), "problems": self.problems}


def merge_url(url: str) -> str:
    """``url`` (``--merge``) checked, ending in one '/': an http(s) folder, no credential, query or fragment."""
    # In a workflow the URL is committed, and it is said in the index's output: the index must be readable as
    # its users' pip reads it, without a credential in the URL.
    return safety.served_folder_url(url, "--merge", "serve the index where it can be read without one (--merge reads"
                                    " it as pip's users do)") + "/"


class _Reader:
    """GETs below one URL within one deadline and a count of requests."""

    def __init__(self, base: str, seconds: float) -> None:
        self.base = base
        self.deadline = untrusted.Deadline(seconds)
        self.requests = 0

    def get(self, path: str, *, limit: int, accept: str | None = None) -> bytes | None:
        """The body at ``base + path``; None for a 404. PublishError (one line) for anything else amiss."""
        url = self.base + path
        self.requests += 1
        if self.requests > MAX_REQUESTS:
            raise PublishError(f"--merge {self.base}: more than {MAX_REQUESTS} pages to read: refused")
        try:
            body, _, _ = untrusted.http_get(url, deadline=self.deadline, limit=limit, within=self.base,
                                            headers={"Accept": accept} if accept else None)
        except HTTPStatusError as exc:
            if exc.code == 404:
                return None
            raise PublishError(f"--merge: {shown_url(url)}: {exc}") from None
        except Unreadable as exc:
            raise PublishError(f"--merge: {shown_url(url)}: {printable(str(exc))[:300]}") from None
        return body

    def page(self, folder: str) -> dict | None:
        """The PEP 691 JSON page of ``folder`` (below base, ending in '/'): its index.json, else the folder
        itself asked for JSON (a server that negotiates); None when neither is there."""
        body = self.get(folder + "index.json", limit=MAX_PAGE_BYTES, accept=JSON_ACCEPT)
        if body is None:
            body = self.get(folder, limit=MAX_PAGE_BYTES, accept=JSON_ACCEPT)
        if body is None:
            return None
        try:
            document = untrusted.loads_json(body)
        except Unreadable as exc:
            raise PublishError(f"--merge: {shown_url(self.base + folder)}: not a PEP 691 JSON page ({exc})") from None
        if not isinstance(document, dict):
            raise PublishError(f"--merge: {shown_url(self.base + folder)}: not a PEP 691 JSON page (not an object)")
        return document


def shown_url(url: str) -> str:
    return printable(url)[:300]


def read_served(url: str, *, cuda_variants: set[str], folders: list[str], deadline: float = DEADLINE) -> Served:
    """What the index at ``url`` (merge_url's form) serves, and the manifests of ``folders`` (paths below it);
    see the module's docstring. PublishError (one line) when it cannot be read."""
    reader = _Reader(url, deadline)
    served = Served(url=url)
    root = reader.page("simple/")
    if root is not None:
        served.published = True
        for project in _projects(root, url + "simple/", served.problems):
            page = reader.page(f"simple/{project}/")
            if page is None:
                raise PublishError(f"--merge: {shown_url(url)}simple/ lists {project}, whose page is not there")
            for wheel in _files(page, project, url, f"simple/{project}/", served.problems):
                if len(served.wheels) >= MAX_FILES:
                    raise PublishError(f"--merge {shown_url(url)}: more than {MAX_FILES} files listed: refused")
                known = served.wheels.get(wheel.name)
                if known is not None and known.sha256 != wheel.sha256:
                    raise PublishError(f"--merge: {shown_url(url)} lists {wheel.name} twice with two sha256:"
                                       " fix the served index first")
                served.wheels[wheel.name] = wheel
        _cuda_membership(reader, served, cuda_variants)
    for folder in folders:
        body = reader.get(f"{quote(folder)}/{MANIFEST}", limit=MAX_MANIFEST_BYTES)
        if body is None:
            continue
        cells = _manifest_cells(body, url + f"{quote(folder)}/{MANIFEST}", served.problems)
        if cells is not None:
            served.manifests[folder] = cells
    return served


def _projects(document: dict, where: str, problems: list[str]) -> list[str]:
    projects = document.get("projects")
    if not isinstance(projects, list):
        raise PublishError(f"--merge: {shown_url(where)}: not a PEP 691 project list (no list of projects)")
    if len(projects) > MAX_PROJECTS:
        raise PublishError(f"--merge: {shown_url(where)}: {len(projects)} projects, more than the {MAX_PROJECTS}"
                           " read: refused")
    names = []
    for entry in projects:
        name = entry.get("name") if isinstance(entry, dict) else None
        normal = canonicalize_name(name) if isinstance(name, str) and len(name) <= 200 else ""
        if not PROJECT_NAME.fullmatch(normal):
            problems.append(f"{where}: a project named {safety.describe(name)}: not a project name; left out")
        elif normal not in names:
            names.append(normal)
    return names


def _files(document: dict, project: str, base: str, folder: str, problems: list[str]) -> list[ServedWheel]:
    """The wheels a project page lists, each checked; what is not a wheel imagegen published is a problem."""
    where = base + folder
    files = document.get("files")
    if not isinstance(files, list):
        raise PublishError(f"--merge: {shown_url(where)}: not a PEP 691 project page (no list of files)")
    if len(files) > MAX_FILES:
        raise PublishError(f"--merge: {shown_url(where)}: {len(files)} files, more than the {MAX_FILES} read: refused")
    wheels = []
    for entry in files:
        try:
            wheels.append(_wheel(entry, project, base, where))
        except Unreadable as exc:
            name = entry.get("filename") if isinstance(entry, dict) else None
            problems.append(f"{where}: {safety.describe(name)}: {exc}; left out")
    return wheels


def _wheel(entry: object, project: str, base: str, page_url: str) -> ServedWheel:
    if not isinstance(entry, dict):
        raise Unreadable("not a file entry")
    name = entry.get("filename")
    if not isinstance(name, str) or not WHEEL_FILE_NAME.fullmatch(name):
        raise Unreadable("not a wheel file name an index can list")
    try:
        dist, version, _, _ = parse_wheel_filename(name)
    except InvalidWheelFilename:
        raise Unreadable("not a wheel file name pip can parse (a wheel variant?)") from None
    if canonicalize_name(dist) != project:
        raise Unreadable(f"a wheel of {canonicalize_name(dist)}, on the page of {project}")
    hashes = entry.get("hashes")
    digest = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        raise Unreadable("no sha256 (64 lower-case hex digits)")
    size = entry.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_WHEEL_BYTES:
        raise Unreadable("no size in bytes")
    return ServedWheel(name=name, url_path=_served_path(entry.get("url"), name, base, page_url), project=project,
                       version=version, sha256=digest, size=size, requires_python=_python(entry.get("requires-python")),
                       metadata_sha256=_metadata_sha256(entry.get("core-metadata", entry.get("dist-info-metadata"))))


def _served_path(link: object, name: str, base: str, page_url: str) -> str:
    """The wheel's path below ``base``, from its link on the page at ``page_url``: refused when the link
    leads anywhere else (another host, above the folder), or to a file of another name."""
    if not isinstance(link, str) or len(link) > 2000:
        raise Unreadable("no URL")
    try:
        target = urljoin(page_url, link)
        parts = urlsplit(target)
    except ValueError:  # a malformed host ("http://[::1")
        raise Unreadable(f"its URL {safety.describe(link, 120)} is not a URL") from None
    if parts.query or parts.fragment or not target.startswith(base):
        raise Unreadable(f"its URL {safety.describe(link, 120)} is not below {base}")
    path = target[len(base):]
    if not SERVED_PATH.fullmatch(path) or ".." in unquote(path).split("/"):
        raise Unreadable(f"its URL {safety.describe(link, 120)} is not a path below {base}")
    if unquote(path.rsplit("/", 1)[-1]) != name:
        raise Unreadable(f"its URL {safety.describe(link, 120)} names another file")
    return quote(unquote(path), safe="/")


def _python(value: object) -> str | None:
    if not isinstance(value, str) or len(value) > MAX_REQUIRES_PYTHON_CHARS:
        return None
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        return None
    return value


def _metadata_sha256(value: object) -> str | None:
    digest = value.get("sha256") if isinstance(value, dict) else None
    return digest if isinstance(digest, str) and SHA256.fullmatch(digest) else None


def cuda_of_label(version: Version) -> str | None:
    """The CUDA variant a local version label starts with (``0.1.0+cu130torch2.11``: cu130), or None."""
    match = CUDA_LABEL.match(version.local or "")
    return match.group(1) if match else None


def _cuda_membership(reader: _Reader, served: Served, cuda_variants: set[str]) -> None:
    """Each served wheel's CUDA variants: those whose served index lists it, and its label's."""
    members: dict[str, set[str]] = {name: set() for name in served.wheels}
    for name, wheel in served.wheels.items():
        label = cuda_of_label(wheel.version)
        if label:
            members[name].add(label)
    variants = set(cuda_variants) | {c for names in members.values() for c in names}
    for cuda in sorted(v for v in variants if CUDA_VARIANT.fullmatch(v)):
        root = reader.page(f"{cuda}/simple/")
        if root is None:
            continue
        for project in _projects(root, f"{reader.base}{cuda}/simple/", served.problems):
            page = reader.page(f"{cuda}/simple/{project}/")
            if page is None:
                continue
            for wheel in _files(page, project, reader.base, f"{cuda}/simple/{project}/", served.problems):
                known = served.wheels.get(wheel.name)
                if known is None or known.sha256 != wheel.sha256:
                    served.problems.append(f"{reader.base}{cuda}/simple/{project}/: {wheel.name} is not the wheel"
                                           " the flat index lists; left out of the per-CUDA index")
                    continue
                members[wheel.name].add(cuda)
    for name, wheel in list(served.wheels.items()):
        served.wheels[name] = ServedWheel(**{**wheel.__dict__, "cuda": frozenset(members[name])})


def _manifest_cells(body: bytes, where: str, problems: list[str]) -> dict | None:
    """The cells of a served manifest whose entry names a wheel by a file name; None when it is no manifest."""
    try:
        document = untrusted.loads_json(body)
    except Unreadable as exc:
        problems.append(f"{shown_url(where)}: {exc}; its cells are not merged")
        return None
    cells = document.get("cells") if isinstance(document, dict) else None
    if not isinstance(cells, dict):
        problems.append(f"{shown_url(where)}: not a manifest (no mapping of cells); its cells are not merged")
        return None
    kept = {}
    for cell, entry in cells.items():
        wheel = entry.get("wheel") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not (isinstance(wheel, str) and WHEEL_FILE_NAME.fullmatch(wheel) and isinstance(digest, str)
                and SHA256.fullmatch(digest)) or len(cell) > 200:
            problems.append(f"{shown_url(where)}: cell {safety.describe(cell)} names no wheel with its sha256; not"
                            " merged")
            continue
        kept[cell] = entry
    return kept


def merged_manifest(local: dict, served_cells: dict, folder: str) -> dict:
    """The manifest the folder is to be served with: ``local`` (this run's manifest) with the served cells it
    does not have. A served cell whose wheel is one of this run's with another sha256 is a PublishError."""
    local_cells = local.get("cells", {})
    ours = {e.get("wheel"): e.get("sha256") for e in local_cells.values() if isinstance(e, dict)}
    for cell, entry in served_cells.items():
        if cell not in local_cells and entry["wheel"] in ours and ours[entry["wheel"]] != entry["sha256"]:
            raise PublishError(f"{folder}/{entry['wheel']}: this run's wheel differs from the one published"
                               f" (sha256:{entry['sha256']}, cell {printable(cell)[:80]}): not merged; publish a new"
                               " version, or remove the published one first")
    return {**local, "cells": {**{c: e for c, e in served_cells.items() if c not in local_cells}, **local_cells}}
