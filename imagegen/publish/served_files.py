"""What a wheelhouse is served with beside its wheels, for a destination that holds the wheelhouse as it is
served (``s3://BUCKET/PREFIX,layout=wheelhouse``): each wheel's metadata file, each cell folder's manifest
(the one `imagegen index --merge` wrote for it to be served with, when there is one) and the index pages,
with the key each goes to below the destination's prefix, in the order they are to be uploaded: what a page
links to before the page, each project list after its project pages, the find-links page last (a reader of
the bucket sees a page only once what it links to is there).

Unlike a wheel, each of these changes from run to run (a new wheel on a page, a new cell in a manifest), so
the destination overwrites them. Only regular files are listed, never through a symlink, and only the
files `imagegen index` writes (no lock or temporary file)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from imagegen.errors import PublishError
from imagegen.outputs import shown
from imagegen.publish.index import CUDA_VARIANT, INDEX_HTML, INDEX_JSON, PAGES, SERVED_MANIFEST, SIMPLE
from imagegen.publish.index_pages import METADATA_SUFFIX
from imagegen.publish.index_variants import is_variant_file
from imagegen.wheelhouse.manifest import MANIFEST, VerifiedWheel

CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".json": "application/json",
                 METADATA_SUFFIX: "text/plain; charset=utf-8", ".whl": "application/octet-stream"}


@dataclass(frozen=True)
class ServedFile:
    key: str  # its path below the wheelhouse, as served (posix)
    path: Path  # the file in the wheelhouse
    content_type: str


def served_files(out: Path, wheels: list[VerifiedWheel]) -> list[ServedFile]:
    """The files ``out`` is served with beside ``wheels`` (its verified wheels), in upload order. A
    wheelhouse without an index is a PublishError: the wheels would be served with no page listing them."""
    if not _regular(out / SIMPLE / INDEX_HTML):
        raise PublishError(f"{shown(out)} has no index: run imagegen index {shown(out)} (with --merge URL, where it is"
                           " served, to keep the wheels published before) and publish again")
    files: list[ServedFile] = []
    for wheel in wheels:
        files += _file(out, wheel.path.with_name(wheel.path.name + METADATA_SUFFIX))
    for folder in sorted({w.path.parent for w in wheels}):
        manifest = folder / SERVED_MANIFEST if _regular(folder / SERVED_MANIFEST) else folder / MANIFEST
        files += _file(out, manifest, key=(folder / MANIFEST).relative_to(out).as_posix())
    simples = [out / SIMPLE] + [Path(e.path) / SIMPLE for e in sorted(os.scandir(out), key=lambda e: e.name)
                                if CUDA_VARIANT.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    for simple in simples:
        files += _pages(out, simple)
    files += _file(out, out / INDEX_HTML)
    return files


def _pages(out: Path, simple: Path) -> list[ServedFile]:
    """The pages of one simple/ folder: each project's files (variant files before its pages), then the list."""
    files: list[ServedFile] = []
    try:
        projects = sorted((e for e in os.scandir(simple) if e.is_dir(follow_symlinks=False)), key=lambda e: e.name)
    except OSError:
        return files
    for project in projects:
        names = sorted(os.listdir(project.path))
        for name in [n for n in names if is_variant_file(n)] + [n for n in (INDEX_JSON, INDEX_HTML) if n in names]:
            files += _file(out, Path(project.path) / name)
    for name in PAGES[::-1]:  # index.json, then index.html
        files += _file(out, simple / name)
    return files


def _file(out: Path, path: Path, key: str | None = None) -> list[ServedFile]:
    if not _regular(path):
        return []
    suffix = next((s for s in CONTENT_TYPES if path.name.endswith(s)), "")
    return [ServedFile(key or path.relative_to(out).as_posix(), path,
                       CONTENT_TYPES.get(suffix, "application/octet-stream"))]


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
