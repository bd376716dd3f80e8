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

Wheel variants (``variants``, imagegen.publish.variants): beside each project page, a copy of each wheel
with its variant label in the file name and ``*.dist-info/variant.json`` in it, its metadata file, and the
``{name}-{version}-variants.json`` of each version; the project page and the find-links page link them too,
for a variant-aware installer (plain pip skips both kinds of link). They cost a copy of every wheel, so they
are written only when asked (``variants=True``), and kept up to date by every later run until
``variants=False`` removes them (``variants=None``, the default: as the index has them now). They are
written after the metadata files and before the pages, under the same rules as the rest.
"""

from __future__ import annotations

import email.parser
import fcntl
import hashlib
import os
import re
import stat
import struct
import sys
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from dataclasses import replace as dataclasses_replace
from pathlib import Path
from types import ModuleType
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence, TypeVar
from urllib.parse import quote

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from imagegen import safety
from imagegen.errors import PublishError, Unreadable, printable
from imagegen.outputs import new_file_mode, shown
from imagegen.publish import index_files as disk
from imagegen.publish import index_pages as pages
from imagegen.publish.index_pages import API_VERSION, METADATA_SUFFIX, IndexedFile, IndexedWheel
from imagegen.safety import os_reason
from imagegen.wheelhouse.manifest import MANIFEST, MAX_WALK_DEPTH, VerifiedWheel, verified_wheels

SIMPLE = "simple"
INDEX_HTML = "index.html"
INDEX_JSON = "index.json"
PAGES = (INDEX_HTML, INDEX_JSON)
VARIANTS_JSON_SUFFIX = "-variants.json"  # PEP 817/825: {name}-{version}-variants.json
LOCK = ".imagegen-index.lock"

# Bounds on what is read from a wheel.
MAX_METADATA_BYTES = 4 << 20
MAX_CENTRAL_DIRECTORY_BYTES = 8 << 20  # torch's own wheel needs about 2 MiB
MAX_REQUIRES_PYTHON_CHARS = 200

# A wheel file name as a page may show it: PEP 427's characters, no quote, space, '<', '%' or '/'.
WHEEL_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,250}\.whl")
# A normalized project name (PEP 503): the name of its folder under simple/.
PROJECT_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# A variant label (PEP 825): the last dash-separated part of a variant wheel's file name.
VARIANT_LABEL = re.compile(r"[0-9a-z_.]{1,16}")
# A CUDA variant as the manifest names it (cu130): the folder of its own index, <OUT>/cu130/simple/.
CUDA_VARIANT = re.compile(r"cu[0-9]{2,4}")

Say = Callable[[str], None]
T = TypeVar("T")


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
                         for cuda, projects in self.cuda.items()}}


def write_index(out: Path, *, base_url: str | None = None, variants: bool | None = None,
                say: Say = say_on_stderr) -> IndexResult:
    """Write (or bring up to date) the static index of the verified wheels under ``out``; see the module's
    docstring. Each wheel left out is a warning said through ``say`` and listed in the result's problems.
    ``variants``: write wheel variants (True), remove them (False), or do as the index does now (None).
    A refused ``base_url`` is an UnsafeValueError (exit 2, nothing written); an ``out`` that is not a
    directory, one that cannot be written, or one with neither a verified wheel nor an index yet (not a
    wheelhouse: nothing is written there), or variants without variantlib, a PublishError (exit 9)."""
    out = Path(out)
    prefix = _wheel_url_prefix(base_url)
    if variants:
        _variant_support()  # before anything is written
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
        with _locked(out, say):
            return _write_locked(out, prefix, say, variants)
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


@contextmanager
def _locked(out: Path, say: Say) -> Iterator[None]:
    """Hold the wheelhouse's index lock (released when the file is closed, by this process or its death)."""
    lock = out / LOCK
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    fd = os.open(lock, flags, new_file_mode())
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PublishError(f"{shown(lock)} is not a regular file: remove it (imagegen index keeps its lock there)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another imagegen index of {shown(out)} to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_locked(out: Path, prefix: str | None, say: Say, variants: bool | None) -> IndexResult:
    problems: list[str] = []
    verified = verified_wheels(out, problems=problems)
    wheels = _indexable(out, verified, problems)
    simple = out / SIMPLE
    by_project: dict[str, list[IndexedWheel]] = {}
    for wheel in wheels:
        by_project.setdefault(wheel.project, []).append(wheel)
    for files in by_project.values():
        files.sort(key=lambda w: (w.version, w.path.name))
    projects = dict(sorted(by_project.items()))
    if variants is None:
        variants = _has_variants(simple)

    written: list[Path] = []
    disk.real_folder(simple, refuse=True)
    _project_folders(simple, projects)
    # What a page links to first, then the pages, the lists of pages last.
    for wheel in wheels:
        disk.write(wheel.metadata_path, wheel.metadata, written)
    variant_wheels: list[IndexedWheel] = []
    variant_files: list[IndexedFile] = []
    if variants:
        entries = {v.path: v.entry for v in verified}
        variant_wheels, variant_files = _write_variants(out, wheels, entries, written, problems)
    _write_pages(simple, projects, prefix, written, variant_wheels=variant_wheels, variant_files=variant_files)
    by_cuda = _by_cuda(wheels, {v.path: v.entry for v in verified})
    for cuda, cuda_projects in by_cuda.items():
        _write_cuda_index(out / cuda, cuda_projects, prefix, written)
    _sweep_partials(out)
    disk.write(out / INDEX_HTML, pages.find_links_html(wheels, prefix, variant_wheels, variant_files), written)
    # Nothing links to these any more.
    removed = _remove_stale_projects(simple, set(projects), problems)
    removed += _remove_stale_cuda_indexes(out, set(by_cuda), problems)
    current_variants = {f.path for f in variant_files}
    current_variants |= {p for w in variant_wheels for p in (w.path, w.metadata_path)}
    removed += _remove_stale_variants(simple, set(projects), current_variants)
    removed += _remove_stale_metadata(out, {w.metadata_path for w in wheels})
    for problem in problems:
        say(f"warning: {printable(problem)}")
    names = {project: [w.path.name for w in files] for project, files in projects.items()}
    variant_names: dict[str, list[str]] = {}
    for item in sorted([*variant_wheels, *variant_files], key=lambda f: (f.project, f.path.name)):
        variant_names.setdefault(item.project, []).append(item.path.name)
    return IndexResult(out=out, base_url=prefix, projects=names, written=written, removed=removed, problems=problems,
                       variants=variant_names, cuda={cuda: list(p) for cuda, p in by_cuda.items()})


# -------------------------------------------------------------------------------------------- per CUDA


def _by_cuda(wheels: list[IndexedWheel], entries: dict[Path, dict]) -> dict[str, dict[str, list[IndexedWheel]]]:
    """CUDA variant -> project -> its wheels of that variant (the manifest entry's "cuda"), sorted like the
    flat index. A wheel whose entry names no CUDA variant (a CPU build, a hand-edited manifest) is in the
    flat index only."""
    by_cuda: dict[str, dict[str, list[IndexedWheel]]] = {}
    for wheel in wheels:
        cuda = (entries.get(wheel.path) or {}).get("cuda")
        if isinstance(cuda, str) and CUDA_VARIANT.fullmatch(cuda):
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


# -------------------------------------------------------------------------------------------- variants


def _variant_support() -> ModuleType:
    """imagegen.publish.variants, which needs variantlib (imported only when variants are written)."""
    try:
        from imagegen.publish import variants
    except ModuleNotFoundError as exc:
        if exc.name != "variantlib" and not (exc.name or "").startswith("variantlib."):
            raise
        raise PublishError("wheel variants need variantlib, which is not installed: pip install 'imagegen[publish]'"
                           " (or imagegen index --no-variants)") from None
    return variants


def _has_variants(simple: Path) -> bool:
    """Whether the index has wheel variants now (a variants.json in a project folder): kept until asked off."""
    try:
        folders = [e for e in os.scandir(simple) if e.is_dir(follow_symlinks=False)]
        return any(e.name.endswith(VARIANTS_JSON_SUFFIX) and e.is_file(follow_symlinks=False)
                   for folder in folders for e in os.scandir(folder.path))
    except OSError:  # no index yet
        return False


def _write_variants(out: Path, wheels: list[IndexedWheel], entries: dict[Path, dict], written: list[Path],
                    problems: list[str]) -> tuple[list[IndexedWheel], list[IndexedFile]]:
    """Write each wheel's variant (a copy with its label and variant.json) and its metadata file into its
    project's folder, then each version's variants.json; what the pages are to list. A wheel that gets
    no variant is said in ``problems`` and stays listed as it is."""
    support = _variant_support()
    simple = out / SIMPLE
    variant_wheels: list[IndexedWheel] = []
    by_version: dict[tuple[str, Version], dict[str, object]] = {}  # label -> its variant, per version
    for wheel in sorted(wheels, key=lambda w: (w.project, w.version, w.path.name)):
        labels = by_version.setdefault((wheel.project, wheel.version), {})
        try:
            variant = support.describe(entries[wheel.path])
            if labels.get(variant.label, variant).description != variant.description:
                raise support.NoVariant(f"its label {variant.label} names other properties in this version")
            name = support.variant_wheel_name(wheel.path.name, variant.label)
            if not WHEEL_FILE_NAME.fullmatch(name):
                raise support.NoVariant(f"its variant's file name would be too long ({len(name)} characters)")
            spliced = support.splice(wheel.path, wheel.sha256, wheel.project, support.dist_info_json(variant))
            path = simple / wheel.project / name
            sha256, size = _write_variant_wheel(path, spliced, written)
        except support.NoVariant as exc:
            problems.append(f"{shown(wheel.path)}: no wheel variant ({exc}); listed without one")
            continue
        labels[variant.label] = variant
        variant_wheel = dataclasses_replace(wheel, path=path, url_path=_url_path(out, path), sha256=sha256, size=size)
        disk.write(variant_wheel.metadata_path, variant_wheel.metadata, written)
        variant_wheels.append(variant_wheel)
    variant_files: list[IndexedFile] = []
    for (project, version), labels in sorted(by_version.items()):
        if not labels:
            continue
        data = support.variants_json(labels.values())
        path = simple / project / support.variants_json_name(project, version)
        disk.write(path, data, written)
        variant_files.append(IndexedFile(path=path, url_path=_url_path(out, path), project=project, version=version,
                                         sha256=hashlib.sha256(data).hexdigest(), size=len(data)))
    return variant_wheels, variant_files


def _write_variant_wheel(path: Path, spliced, written: list[Path]) -> tuple[str, int]:
    """``path`` holds the variant wheel ``spliced`` plans afterwards (written as _replace writes, unless it
    is there already); its sha256 and size."""
    if spliced.is_written_at(path):
        return spliced.sha256(), spliced.size  # what it should be: a copy damaged since fails pip's hash check
    return disk.replace_file(path, spliced.write_to, written), spliced.size


def _url_path(out: Path, path: Path) -> str:
    return quote(os.fsencode(path.relative_to(out).as_posix()), safe="/")


def _is_variant_file(name: str) -> bool:
    """Whether ``name`` is a file of the index's wheel variants: a variants.json, a wheel whose name has a
    variant label (with it, not a valid wheel name; without it, one), or such a wheel's metadata file."""
    if name.endswith(VARIANTS_JSON_SUFFIX):
        return True
    if name.endswith(".whl" + METADATA_SUFFIX):
        name = name[:-len(METADATA_SUFFIX)]
    if not name.endswith(".whl"):
        return False
    plain, _, label = name[:-len(".whl")].rpartition("-")
    return bool(VARIANT_LABEL.fullmatch(label)) and not _is_wheel_name(name) and _is_wheel_name(plain + ".whl")


def _is_wheel_name(name: str) -> bool:
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename:
        return False
    return True


def _is_variant_partial(name: str) -> bool:
    """Whether ``name`` is a temporary file _replace made for a variant file."""
    if not (name.startswith(".") and name.endswith(".partial")):
        return False
    target = name[1:-len(".partial")].rpartition(".")[0]  # mkstemp's random part has no dot
    return _is_variant_file(target)


def _remove_stale_variants(simple: Path, projects: set[str], current: set[Path]) -> list[Path]:
    """Remove the variant files of listed projects that no page lists any more (variants asked off, a
    wheel gone or changed); temporary ones a killed run left are gone already (_sweep_partials)."""
    removed = []
    for project in sorted(projects):
        for entry in sorted(os.scandir(simple / project), key=lambda e: e.name):
            path = Path(entry.path)
            if _is_variant_file(entry.name) and path not in current and not entry.is_dir(follow_symlinks=False):
                os.unlink(path)
                removed.append(path)
    return removed


# -------------------------------------------------------------------------------------------- wheels


def _indexable(out: Path, verified: list[VerifiedWheel], problems: list[str]) -> list[IndexedWheel]:
    """The verified wheels the index can list: a file name pip can parse, a METADATA that can be read,
    one file per name (two different wheels under one name would be one link with two meanings)."""
    by_name: dict[str, IndexedWheel] = {}
    for verified_wheel in verified:
        path = verified_wheel.path
        name = path.name
        if name in by_name:
            if by_name[name].sha256 != verified_wheel.sha256:
                problems.append(f"{shown(path)}: another wheel of the same name is indexed"
                                f" ({shown(by_name[name].path)}); left out")
            continue
        if not WHEEL_FILE_NAME.fullmatch(name):
            problems.append(f"{shown(path)}: not a wheel file name an index can list; left out")
            continue
        try:
            dist, version, _, _ = parse_wheel_filename(name)
        except InvalidWheelFilename as exc:
            problems.append(f"{shown(path)}: {printable(str(exc))[:200]}; left out")
            continue
        project = canonicalize_name(dist)
        try:
            metadata, size = core_metadata(path, project)
        except Unreadable as exc:
            problems.append(f"{shown(path)}: its METADATA cannot be read ({exc}); left out")
            continue
        requires_python = _requires_python(metadata, path, problems)
        by_name[name] = IndexedWheel(path=path, url_path=quote(os.fsencode(path.relative_to(out).as_posix()), safe="/"),
                                     project=project, version=version, sha256=verified_wheel.sha256, size=size,
                                     requires_python=requires_python, metadata=metadata)
    return list(by_name.values())


def core_metadata(wheel: Path, project: str) -> tuple[bytes, int]:
    """The METADATA of ``wheel`` (a wheel of ``project``, normalized) and the wheel's size in bytes.

    Read the way pip finds it (the one top-level ``*.dist-info`` folder, named after the project), by
    name, never extracted; the file is opened without following a symlink, and the central directory,
    the member and the bytes decompressed are bounded. Unreadable says why not."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    try:
        fd = os.open(wheel, flags)
    except OSError as exc:
        raise Unreadable(os_reason(exc)) from None
    with os.fdopen(fd, "rb") as fh:
        try:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise Unreadable("not a regular file")
            directory = _central_directory_bytes(fh, st.st_size)
            if directory > MAX_CENTRAL_DIRECTORY_BYTES:
                raise Unreadable(f"a zip directory of {directory} bytes; at most {MAX_CENTRAL_DIRECTORY_BYTES}"
                                 " are read")
            with zipfile.ZipFile(fh) as zf:
                folders = {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
                if len(folders) != 1:
                    raise Unreadable(f"{len(folders)} top-level .dist-info folders, where a wheel has one")
                (folder,) = folders
                if not canonicalize_name(folder).startswith(project):
                    raise Unreadable(f"its .dist-info folder {printable(folder[:80])!r} is not named after {project}")
                try:
                    member = zf.getinfo(f"{folder}/METADATA")
                except KeyError:
                    raise Unreadable("no METADATA in its .dist-info folder") from None
                if member.file_size > MAX_METADATA_BYTES:
                    raise Unreadable(f"METADATA of {member.file_size} bytes; at most {MAX_METADATA_BYTES} are read")
                with zf.open(member) as body:
                    data = body.read(MAX_METADATA_BYTES + 1)  # whatever its header says it decompresses to
                if len(data) > MAX_METADATA_BYTES:
                    raise Unreadable(f"METADATA of more than {MAX_METADATA_BYTES} bytes")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error, EOFError, NotImplementedError,
                RuntimeError, ValueError, OSError) as exc:  # a broken, encrypted or oddly compressed zip
            raise Unreadable(printable(str(exc))[:200] or exc.__class__.__name__) from None
    return data, st.st_size


# The zip records that say how large the central directory is (APPNOTE 4.3.16, 4.3.15, 4.3.14).
_END = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")


def _central_directory_bytes(fh: BinaryIO, size: int) -> int:
    """The size of the zip's central directory, found the way zipfile finds it (the end record without a
    comment, else the last one in the final 64 KiB): what zipfile would read into memory, asked first."""
    tail_size = min(size, _END.size + 0xFFFF)
    fh.seek(size - tail_size)
    tail = fh.read(tail_size)
    at = len(tail) - _END.size
    if at < 0 or tail[at:at + 4] != b"PK\x05\x06" or tail[-2:] != b"\0\0":
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + _END.size > len(tail):
            raise Unreadable("not a zip file")
    _, _, _, _, entries, directory, _, _ = _END.unpack_from(tail, at)
    if entries != 0xFFFF and directory != 0xFFFFFFFF:
        return directory
    if at < _ZIP64_LOCATOR.size:  # ZIP64: the real sizes are in the ZIP64 end record the locator points to
        raise Unreadable("a ZIP64 zip without its locator")
    signature, _, offset, _ = _ZIP64_LOCATOR.unpack_from(tail, at - _ZIP64_LOCATOR.size)
    fh.seek(offset)
    record = fh.read(_ZIP64_END.size)
    if signature != b"PK\x06\x07" or len(record) < _ZIP64_END.size or record[:4] != b"PK\x06\x06":
        raise Unreadable("a ZIP64 zip without its end record")
    return _ZIP64_END.unpack(record)[8]


def _requires_python(metadata: bytes, wheel: Path, problems: list[str]) -> str | None:
    """The METADATA's Requires-Python, when it is a valid specifier (an invalid one is left off the page,
    as pip would ignore it, and said)."""
    headers = email.parser.HeaderParser().parsestr(metadata.decode("utf-8", "replace"), headersonly=True)
    value = headers.get("Requires-Python")
    if value is None:
        return None
    value = " ".join(str(value).split())
    try:
        if len(value) > MAX_REQUIRES_PYTHON_CHARS:
            raise InvalidSpecifier(f"{len(value)} characters")
        SpecifierSet(value)
    except InvalidSpecifier:
        problems.append(f"{shown(wheel)}: its Requires-Python {safety.describe(value)} is not a version specifier;"
                        " indexed without it")
        return None
    return value




def _sweep_partials(folder: Path) -> None:
    """Remove the temporary page and variant files a killed run left in ``folder`` (the lock is held: no run
    is writing)."""
    for entry in os.scandir(folder):
        ours = any(disk.is_partial(entry.name, page) for page in PAGES) or _is_variant_partial(entry.name)
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
                or _is_variant_file(child.name) or _is_variant_partial(child.name)
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
    build), and temporary ones a killed run left; only in wheelhouse folders (those with a manifest)."""
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
            if entry.name.endswith(".whl" + METADATA_SUFFIX) and path not in current:
                os.unlink(path)
                removed.append(path)
            elif entry.name.startswith(".") and ".whl" + METADATA_SUFFIX + "." in entry.name \
                    and entry.name.endswith(".partial"):
                os.unlink(path)
    return removed
