"""A static pip index of a wheelhouse's verified wheels (those its manifests list, there intact), as plain
files any web server, S3 bucket or GitHub Pages can serve, and pip can read from disk (``file://``).

What is written, all of it under OUT:

- ``OUT/simple/index.html``: the PEP 503 project list, one anchor per project (its normalized name);
- ``OUT/simple/<project>/index.html``: one anchor per wheel, with ``#sha256=`` (pip checks the download
  against it), ``data-requires-python`` and ``data-core-metadata``/``data-dist-info-metadata``;
- ``index.json`` beside each of those: the same data as PEP 691 JSON (api-version 1.1, PEP 700's
  ``versions`` and ``size``);
- ``<wheel>.metadata`` beside each wheel: its METADATA (PEP 658/714);
- ``OUT/index.html``: every wheel on one page, for ``pip install --find-links``;
- ``OUT/cu130/simple/...`` (one per CUDA variant the manifests name): the same pages listing only that
  variant's wheels, as PyTorch's and Astral's per-CUDA indexes (links to the same files).

The pages are made in imagegen.publish.index_pages, and written as imagegen.publish.index_files writes.

Links are relative to their page, so the folder works wherever it is served; with ``base_url`` (where
OUT is served) wheel links are absolute, for an index served apart from its wheels.

Decisions:

- PEP 658/714 core metadata: yes. These are CUDA wheels of hundreds of MB, one per torch/CUDA pair under
  the same project; with the metadata beside them pip and uv resolve without downloading a wheel, and
  download only the one they install. It costs one small file per wheel, read from the METADATA that
  data-requires-python needs anyway.
- PEP 691 JSON: yes, though a static host cannot negotiate content: for ``/simple/<project>/`` it serves
  index.html whatever the Accept header says, and pip (which asks for JSON first) reads that HTML. The
  JSON costs a few KB, is written under the same rules as the HTML, lets a host that can negotiate (an
  nginx ``map`` on Accept, a CDN rule) serve the JSON API without another tool, and gives scripts the
  listing with hashes without parsing HTML.

Consistency: every file is written under a temporary name in its own folder, fsynced and renamed over the
old one (a reader sees the old file or the new one, never half of one), and a file whose content would
not change is not rewritten (so indexing after every build is cheap). A page is written only after what
it links to exists: metadata files, then project pages, then the project list and the find-links page;
what is no longer listed (a stale project's folder, a metadata file of a wheel gone) is removed last. Two
runs on one wheelhouse (two builds finishing together) take turns on an advisory lock in OUT, and each
regenerates the whole index from the verified wheels it finds once it holds the lock, so the last one
leaves the index of everything there.

A wheelhouse may be a folder a stranger shared: a wheel's METADATA is read from its zip with bounds (the
central directory's size, the member's size, the bytes decompressed), by name, never extracted, from a
file opened without following symlinks; every value that reaches a page is percent-encoded (URLs) and
HTML-escaped; nothing is written outside OUT.

Wheel variants (``variants``): imagegen.publish.index_variants, written only when asked, after the metadata
files and before the pages. What a wheel is to the index (its METADATA, read bounded): index_wheels.

``--merge URL`` (``merge_from``): the wheels the index published at URL lists (an earlier run's, read as
imagegen.publish.index_merge reads an untrusted server) are listed beside this wheelhouse's, flat and per
CUDA, linked at their paths below URL, so the folder is right once served at URL; each cell folder gets the
manifest it is to be served with (SERVED_MANIFEST: its published cells and this run's). A wheel name served
with another sha256 is refused, nothing written.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence
from urllib.parse import unquote

from imagegen import safety
from imagegen.errors import PublishError, printable
from imagegen.outputs import shown
from imagegen.publish import index_files as disk
from imagegen.publish import index_merge as merge
from imagegen.publish import index_pages as pages
from imagegen.publish.index_pages import API_VERSION, IndexedFile, IndexedWheel
from imagegen.publish.index_pages import METADATA_SUFFIX
from imagegen.publish.index_variants import (has_variants, is_variant_file, is_variant_partial, remove_stale_variants,
                                             variant_support, write_variants)
from imagegen.publish.index_wheels import indexable
from imagegen.safety import os_reason
from imagegen.wheelhouse.external import is_external
from imagegen.wheelhouse.manifest import MANIFEST, MAX_WALK_DEPTH, read_manifest, verified_wheels

SIMPLE = "simple"
INDEX_HTML = "index.html"
INDEX_JSON = "index.json"
PAGES = (INDEX_HTML, INDEX_JSON)
LOCK = ".imagegen-index.lock"
# Beside a cell folder's manifest.json, with --merge: the manifest that folder is to be served with (its
# published cells and this run's), which `imagegen publish` to a wheelhouse destination uploads as its
# manifest.json. The folder's own manifest.json stays what the folder holds.
SERVED_MANIFEST = "manifest.served.json"

# A normalized project name (PEP 503): the name of its folder under simple/.
PROJECT_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# A CUDA variant as the manifest names it (cu130): the folder of its own index, <OUT>/cu130/simple/.
CUDA_VARIANT = re.compile(r"cu[0-9]{2,4}")

Say = Callable[[str], None]


def say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class IndexResult:
    out: Path
    base_url: str | None
    projects: dict[str, list[str]]  # normalized project name -> its wheels' file names
    written: list[Path]  # files whose content changed (the others were left as they were)
    removed: list[Path]  # stale project folders, metadata and variant files
    problems: list[str]  # wheels left out of the index, and why
    variants: dict[str, list[str]] = field(default_factory=dict)  # project -> its variant wheels and variants.json
    cuda: dict[str, list[str]] = field(default_factory=dict)  # CUDA variant (cu130) -> the projects its index lists
    merged: dict | None = None  # --merge: what the served index gave (index_merge.Served.as_dict) and the manifests
    external: list[str] = field(default_factory=list)  # indexed wheels imagegen did not build (collect --external)

    @property
    def wheels(self) -> int:
        return sum(len(files) for files in self.projects.values())

    def as_dict(self) -> dict:
        return {"out": str(self.out), "simple": str(self.out / SIMPLE) + "/",
                "find_links": str(self.out / INDEX_HTML), "base_url": self.base_url,
                "projects": self.projects, "wheels": self.wheels,
                "written": [str(p) for p in self.written], "removed": [str(p) for p in self.removed],
                "problems": self.problems, "variants": self.variants,
                "cuda": {cuda: {"simple": str(self.out / cuda / SIMPLE) + "/", "projects": projects}
                         for cuda, projects in self.cuda.items()}, "merged": self.merged, "external": self.external}


def write_index(out: Path, *, base_url: str | None = None, variants: bool | None = None,
                say: Say = say_on_stderr, merge_from: str | None = None,
                deadline: float = merge.DEADLINE) -> IndexResult:
    """Write (or bring up to date) the static index of the verified wheels under ``out``; see the module's
    docstring. Each wheel left out is a warning said through ``say`` and listed in the result's problems.
    ``variants``: write wheel variants (True), remove them (False), or do as the index does now (None).
    A refused ``base_url`` is an UnsafeValueError (exit 2, nothing written); an ``out`` that is not a
    directory, one that cannot be written, or one with neither a verified wheel nor an index yet (not a
    wheelhouse: nothing is written there), or variants without variantlib, a PublishError (exit 9).
    ``merge_from``: the URL this wheelhouse's index is published at (--merge, imagegen.publish.index_merge):
    its wheels are listed beside these, and each cell folder gets its SERVED_MANIFEST; what cannot be read
    there within ``deadline`` seconds, or a conflict, is a PublishError with nothing written."""
    out = Path(out)
    prefix = _wheel_url_prefix(base_url)
    merge_from = None if merge_from is None else merge.merge_url(merge_from)
    if variants:
        variant_support()  # before anything is written
    try:
        if not stat.S_ISDIR(os.stat(out).st_mode):
            raise PublishError(f"{shown(out)} is not a directory: give the wheelhouse (imagegen build's --out)")
    except FileNotFoundError:
        raise PublishError(f"{shown(out)}: no such directory: give the wheelhouse (imagegen build's --out)") from None
    except (OSError, ValueError) as exc:
        raise PublishError(f"{shown(out)}: {os_reason(exc)}") from None
    safety.wheelhouse_folder(out, "imagegen index", PublishError)
    nested = _nested_index(out)
    if nested is not None:
        raise PublishError(f"{shown(out)} holds another wheelhouse's index ({shown(nested)}): index that wheelhouse"
                           " itself, not a folder above it")
    if not os.path.lexists(out / SIMPLE):
        # A first index: refuse a folder that is no wheelhouse before writing anything there, the lock included.
        problems: list[str] = []
        if not verified_wheels(out, problems=problems):
            for problem in problems:
                say(f"warning: {printable(problem)}")
            raise PublishError(f"{shown(out)}: no verified wheel to index (no manifest.json under it lists a wheel"
                               " that is there intact): give the wheelhouse imagegen build --out wrote")
    try:
        with disk.locked(out / LOCK, say):
            return _write_locked(out, prefix, say, variants, merge_from, deadline)
    except OSError as exc:
        failed_on = exc.filename2 or exc.filename  # a rename's destination, else the file
        where = f" ({shown(failed_on)})" if failed_on else ""
        raise PublishError(f"cannot write the index of {shown(out)}: {os_reason(exc)}{where}") from None


def _nested_index(out: Path, depth: int = 8) -> Path | None:
    """The first folder below ``out`` (``depth`` levels at most, no symlinks followed) that is the root of
    another imagegen index (its lock file is there): ``imagegen index`` on a folder above wheelhouses
    would otherwise write metadata files into all of them."""
    stack = [(out, 0)]
    while stack:
        folder, level = stack.pop()
        if level and (folder / LOCK).is_file() and not (folder / LOCK).is_symlink():
            return folder
        if level >= depth:
            continue
        try:
            children = [c for c in folder.iterdir() if c.is_dir() and not c.is_symlink() and c.name != SIMPLE]
        except OSError:
            continue
        stack.extend((c, level + 1) for c in children)
    return None


def _wheel_url_prefix(base_url: str | None) -> str | None:
    """``base_url`` checked and ending in one '/', or None (links relative to their page)."""
    if base_url is None:
        return None
    # Every page of the index would carry a credential, to whoever is served the page.
    return safety.served_folder_url(base_url, "--base-url", "give the server's credentials to pip itself (~/.netrc,"
                                    " keyring), never to the pages") + "/"


def _write_locked(out: Path, prefix: str | None, say: Say, variants: bool | None, merge_from: str | None,
                  deadline: float) -> IndexResult:
    problems: list[str] = []
    verified = verified_wheels(out, problems=problems)
    local = indexable(out, verified, problems)
    entries = {v.path: v.entry for v in verified}
    simple = out / SIMPLE
    if variants is None:
        variants = has_variants(simple)
    if variants and merge_from is not None:
        raise PublishError(f"{shown(out)}: --merge lists the served wheels, not their wheel variants: index with"
                           " --no-variants to merge")
    cudas: dict[Path, set[str]] = {}
    for wheel in local:
        cuda = (entries.get(wheel.path) or {}).get("cuda")
        cudas[wheel.path] = {cuda} if isinstance(cuda, str) and CUDA_VARIANT.fullmatch(cuda) else set()
    served_wheels: list[IndexedWheel] = []
    manifests: dict[Path, bytes] = {}  # each cell folder's SERVED_MANIFEST -> what it is to hold
    served = None
    if merge_from is not None:
        folders = sorted({v.path.parent.relative_to(out).as_posix() for v in verified})
        served = merge.read_served(merge_from, cuda_variants={c for cs in cudas.values() for c in cs},
                                   folders=folders, deadline=deadline)
        problems += served.problems
        served_wheels = _served_wheels(out, local, served, cudas)
        for folder in folders:
            document = merge.merged_manifest(read_manifest(out / folder), served.manifests.get(folder, {}), folder)
            manifests[out / folder / SERVED_MANIFEST] = pages.json_bytes(document)
    wheels = local + served_wheels
    by_project: dict[str, list[IndexedWheel]] = {}
    for wheel in wheels:
        by_project.setdefault(wheel.project, []).append(wheel)
    for files in by_project.values():
        files.sort(key=lambda w: (w.version, w.path.name))
    projects = dict(sorted(by_project.items()))

    written: list[Path] = []
    disk.real_folder(simple, refuse=True)
    _project_folders(simple, projects)
    # What a page links to first, then the pages, the lists of pages last.
    for wheel in local:
        disk.write(wheel.metadata_path, wheel.metadata, written)
    for path, data in manifests.items():
        disk.write(path, data, written)
    variant_wheels: list[IndexedWheel] = []
    variant_files: list[IndexedFile] = []
    if variants:
        variant_wheels, variant_files = write_variants(out, local, entries, written, problems)
    _write_pages(simple, projects, prefix, written, variant_wheels=variant_wheels, variant_files=variant_files)
    by_cuda = _by_cuda(wheels, cudas)
    for cuda, cuda_projects in by_cuda.items():
        _write_cuda_index(out / cuda, cuda_projects, prefix, written)
    _sweep_partials(out)
    disk.write(out / INDEX_HTML, pages.find_links_html(wheels, prefix, variant_wheels, variant_files), written)
    # Nothing links to these any more.
    removed = _remove_stale_projects(simple, set(projects), problems)
    removed += _remove_stale_cuda_indexes(out, set(by_cuda), problems)
    current_variants = {f.path for f in variant_files}
    current_variants |= {p for w in variant_wheels for p in (w.path, w.metadata_path)}
    removed += remove_stale_variants(simple, set(projects), current_variants)
    removed += _remove_stale_metadata(out, {w.metadata_path for w in local} | set(manifests))
    for problem in problems:
        say(f"warning: {printable(problem)}")
    names = {project: [w.path.name for w in files] for project, files in projects.items()}
    variant_names: dict[str, list[str]] = {}
    for item in sorted([*variant_wheels, *variant_files], key=lambda f: (f.project, f.path.name)):
        variant_names.setdefault(item.project, []).append(item.path.name)
    merged = None if served is None else {**served.as_dict(), "manifests": [str(p) for p in manifests]}
    external = sorted({w.path.name for w in local if is_external(entries.get(w.path))})
    return IndexResult(out=out, base_url=prefix, projects=names, written=written, removed=removed, problems=problems,
                       variants=variant_names, cuda={cuda: list(p) for cuda, p in by_cuda.items()}, merged=merged,
                       external=external)


def _served_wheels(out: Path, local: list[IndexedWheel], served: merge.Served,
                   cudas: dict[Path, set[str]]) -> list[IndexedWheel]:
    """The served wheels the merged index lists beside this run's (``cudas`` gets theirs): those of a name
    this run does not have. A name this run has with another sha256 is a PublishError (one line)."""
    ours = {w.path.name: w for w in local}
    listed = []
    for name, wheel in sorted(served.wheels.items()):
        mine = ours.get(name)
        if mine is not None:
            if mine.sha256 != wheel.sha256:
                raise PublishError(f"{shown(mine.path)}: {served.url} serves another wheel of this name"
                                   f" (sha256:{wheel.sha256}; this one is sha256:{mine.sha256}): not merged; publish a"
                                   " new version, or remove the published one first")
            continue
        path = out / unquote(wheel.url_path)
        listed.append(IndexedWheel(path=path, url_path=wheel.url_path, project=wheel.project, version=wheel.version,
                                   sha256=wheel.sha256, size=wheel.size, requires_python=wheel.requires_python,
                                   metadata=b"", served=True, served_metadata_sha256=wheel.metadata_sha256))
        cudas[path] = set(wheel.cuda)
    return listed


# -------------------------------------------------------------------------------------------- per CUDA


def _by_cuda(wheels: list[IndexedWheel], cudas: dict[Path, set[str]]) -> dict[str, dict[str, list[IndexedWheel]]]:
    """CUDA variant -> project -> its wheels of that variant (``cudas``: a wheel's manifest entry's "cuda", a
    served wheel's as its index said), sorted like the flat index. A wheel of no CUDA variant (a CPU build, a
    hand-edited manifest) is in the flat index only."""
    by_cuda: dict[str, dict[str, list[IndexedWheel]]] = {}
    for wheel in wheels:
        for cuda in sorted(cudas.get(wheel.path, ())):
            by_cuda.setdefault(cuda, {}).setdefault(wheel.project, []).append(wheel)
    return {cuda: dict(sorted(projects.items())) for cuda, projects in sorted(by_cuda.items())}


def _write_cuda_index(folder: Path, projects: dict[str, list[IndexedWheel]], prefix: str | None,
                      written: list[Path]) -> None:
    """<OUT>/cu130/simple/: the same pages as simple/, listing only that CUDA variant's wheels (as PyTorch's
    and Astral's per-CUDA indexes), so `pip install --extra-index-url .../cu130/simple/ PROJECT` cannot pick a
    wheel of another CUDA. The links lead to the same files: nothing is copied."""
    disk.real_folder(folder, refuse=True)
    simple = folder / SIMPLE
    disk.real_folder(simple, refuse=True)
    _project_folders(simple, projects)
    _write_pages(simple, projects, prefix, written, title=f"Simple index ({folder.name})", up="../../../")


def _project_folders(simple: Path, projects: Iterable[str]) -> None:
    """Each project's folder under ``simple``, real (a link or file there is replaced) and swept of the
    temporary files a killed run left."""
    for project in projects:
        disk.real_folder(simple / project, refuse=False)
        _sweep_partials(simple / project)


def _write_pages(simple: Path, projects: dict[str, list[IndexedWheel]], prefix: str | None, written: list[Path], *,
                 title: str = "Simple index", up: str = "../../", variant_wheels: Sequence[IndexedWheel] = (),
                 variant_files: Sequence[IndexedFile] = ()) -> None:
    """The project pages (HTML and PEP 691 JSON) of ``projects`` under ``simple``, ``up`` below OUT, each
    with its project's variant wheels and files, then the project list (after the pages it lists)."""
    for project, files in projects.items():
        folder = simple / project
        extra_wheels = [w for w in variant_wheels if w.project == project]
        extra_files = [f for f in variant_files if f.project == project]
        disk.write(folder / INDEX_JSON, pages.project_json(project, files, prefix, extra_wheels, extra_files, up=up),
                   written)
        disk.write(folder / INDEX_HTML, pages.project_html(project, files, prefix, extra_wheels, extra_files, up=up),
                   written)
    _sweep_partials(simple)
    disk.write(simple / INDEX_JSON, pages.json_bytes({"meta": {"api-version": API_VERSION},
                                                      "projects": [{"name": p} for p in projects]}), written)
    disk.write(simple / INDEX_HTML, pages.page(title, [pages.anchor(f"{p}/", p) for p in projects]), written)


def _remove_stale_cuda_indexes(out: Path, current: set[str], problems: list[str]) -> list[Path]:
    """The per-CUDA indexes of variants the wheelhouse no longer has: their project pages, then their
    lists; the cuXYZ folder itself when nothing else is in it (a layout may keep wheels there)."""
    removed: list[Path] = []
    for entry in sorted(os.scandir(out), key=lambda e: e.name):
        if entry.name in current or not CUDA_VARIANT.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        simple = Path(entry.path) / SIMPLE
        try:
            if not stat.S_ISDIR(os.lstat(simple).st_mode):
                continue
        except FileNotFoundError:
            continue
        removed += _remove_stale_projects(simple, set(), problems)
        for name in os.listdir(simple):
            if name in PAGES or any(disk.is_partial(name, page) for page in PAGES):
                os.unlink(simple / name)
        try:
            simple.rmdir()
            removed.append(simple)
            Path(entry.path).rmdir()
        except OSError:
            pass  # files imagegen did not write, or the wheels of a layout by CUDA: left in place
    return removed




def _sweep_partials(folder: Path) -> None:
    """Remove the temporary page and variant files a killed run left in ``folder`` (the lock is held: no run
    is writing)."""
    for entry in os.scandir(folder):
        ours = any(disk.is_partial(entry.name, page) for page in PAGES) or is_variant_partial(entry.name)
        if ours and not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.path)


def _remove_stale_projects(simple: Path, current: set[str], problems: list[str]) -> list[Path]:
    """Remove the folders under simple/ of projects the index no longer lists (the project list is
    already written without them). A folder holding files imagegen did not write is left, and said."""
    removed = []
    for entry in sorted(os.scandir(simple), key=lambda e: e.name):
        if entry.name in current or not PROJECT_NAME.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        folder = Path(entry.path)
        for child in os.scandir(folder):
            ours = child.name in PAGES or any(disk.is_partial(child.name, page) for page in PAGES) \
                or is_variant_file(child.name) or is_variant_partial(child.name)
            if ours and not child.is_dir(follow_symlinks=False):
                os.unlink(child.path)
        try:
            folder.rmdir()
        except OSError:
            problems.append(f"{shown(folder)}: {entry.name} is no longer in the wheelhouse, but its folder holds files"
                            " imagegen index did not write; left in place")
            continue
        removed.append(folder)
    return removed


def _remove_stale_metadata(out: Path, current: set[Path]) -> list[Path]:
    """Remove the metadata files beside wheels the index no longer lists (gone, or changed since their
    build), the served manifests of an earlier --merge that this run did not write (``current`` holds
    both kinds it keeps), and temporary ones a killed run left; only in wheelhouse folders (those with a
    manifest)."""
    removed = []
    stack = [(out, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        in_wheelhouse = any(e.name == MANIFEST for e in entries)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if depth < MAX_WALK_DEPTH and not (depth == 0 and entry.name == SIMPLE):
                    stack.append((Path(entry.path), depth + 1))
                continue
            if not in_wheelhouse:
                continue
            path = Path(entry.path)
            if (entry.name.endswith(".whl" + METADATA_SUFFIX) or entry.name == SERVED_MANIFEST) \
                    and path not in current:
                os.unlink(path)
                removed.append(path)
            elif entry.name.startswith(".") and entry.name.endswith(".partial") and (
                    ".whl" + METADATA_SUFFIX + "." in entry.name or entry.name.startswith(f".{SERVED_MANIFEST}.")):
                os.unlink(path)
    return removed
