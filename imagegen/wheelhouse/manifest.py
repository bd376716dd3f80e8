"""The wheelhouse as it is, read-only: where a cell's wheel goes, its manifest, whether an earlier
build of the same inputs is still there intact, and what a build would replace. The executors ask
these before building; imagegen.wheelhouse.collect is the only module that writes the wheelhouse.

Layout: ``<out>/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/<wheel>`` plus ``manifest.json`` in that folder."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from imagegen import untrusted
from imagegen.errors import Unreadable
from imagegen.model.layout import MAX_LAYOUT_DEPTH
from imagegen.model.cell import Cell

MANIFEST = "manifest.json"
# Beside a wheel a builder image made (bake's export, `docker run -v OUT:/out`): its build record,
# which `imagegen collect` verifies the wheel against (imagegen_build.py writes it).
RECORD_SUFFIX = ".imagegen.json"




def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / cell.wheel_dir


def read_manifest(folder: Path, *, problems: list[str] | None = None) -> dict:
    """The manifest of the cell folder ``folder``, read bounded (imagegen.untrusted: a regular file of
    at most MAX_MANIFEST_BYTES, never blocking on a FIFO, JSON nested at most MAX_JSON_DEPTH levels).
    One that cannot be read or is no manifest counts as none, as a broken one always has: a build
    builds again, collect starts it afresh (replaced by rename, never written through a link); why,
    in ``problems`` when given (a folder without one has no problem)."""
    path = folder / MANIFEST
    try:
        data = untrusted.read_json_file(path, limit=MAX_MANIFEST_BYTES)
    except Unreadable as exc:
        if problems is not None and os.path.lexists(path):
            problems.append(f"{path}: {exc}: not read")
        return {"schema": 1, "cells": {}}
    if isinstance(data, dict) and isinstance(data.get("cells"), dict):
        return data
    if problems is not None:
        problems.append(f"{path}: not a manifest (no mapping of cells): not read")
    return {"schema": 1, "cells": {}}


def replaced(out: Path, cell: Cell) -> str | None:
    """What building ``cell`` into ``out`` would silently replace: a wheel of the same cell built for
    other archs (its file name is the same: archs are not part of a wheel's name). None if nothing.
    A build refuses that unless --force, which replaces it and says so."""
    entry = read_manifest(cell_dir(out, cell))["cells"].get(cell.name)
    if not isinstance(entry, dict) or not isinstance(entry.get("wheel"), str):
        return None
    wheel = cell_dir(out, cell) / Path(entry["wheel"]).name
    if not wheel.is_file() or entry.get("archs") == str(cell.archs):
        return None
    return f"{wheel} (built for archs {str(entry.get('archs'))[:200]})"


def replacement_refused(out: Path, cell: Cell, *, force: bool, say: Callable[[str], None]) -> str | None:
    """Why building ``cell`` into ``out`` must not go on (it would silently replace a wheel built
    for other archs), or None: nothing to replace, or --force, which replaces it and says so."""
    other = replaced(out, cell)
    if other is None:
        return None
    if force:
        say(f"--force: the new wheel replaces {other}")
        return None
    return (f"{other} would be replaced by the wheel for archs {cell.archs} (same file name): build into"
            " another --out to keep both, or --force to replace it")


def in_the_way(out: Path, cell: Cell, name: str) -> str | None:
    """At placement, with the cell folder's lock held (imagegen.wheelhouse.collect): what placing ``cell``'s
    wheel ``name`` into ``out`` would silently replace, or None. That is the wheel the cell's own
    entry lists when it was built for other archs (``replaced``; a build of other archs started
    meanwhile may have placed it after this build's check), or the file ``name`` itself when an entry
    lists it for other archs (cells that differ only by Python share an abi3 wheel)."""
    other = replaced(out, cell)
    if other is not None:
        return other
    folder = cell_dir(out, cell)
    if not (folder / name).is_file():
        return None
    for entry in read_manifest(folder)["cells"].values():
        if isinstance(entry, dict) and entry.get("wheel") == name and entry.get("archs") != str(cell.archs):
            return f"{folder / name} (built for archs {str(entry.get('archs'))[:200]})"
    return None


def up_to_date(out: Path, cell: Cell, inputs: str) -> Path | None:
    """The wheel of an earlier build of exactly these inputs, if it is still there intact."""
    folder = cell_dir(out, cell)
    entry = read_manifest(folder)["cells"].get(cell.name)
    if not entry or entry.get("inputs") != inputs:
        return None
    # The GPU check inside the build is no input of the wheel (the same bytes compile with or without
    # it), but a wheel asked to pass it is up to date only once it has.
    gpu_check = entry.get("gpu_check")
    if cell.gpu_check_device and not (isinstance(gpu_check, dict) and gpu_check.get("ok") is True):
        return None
    wheel = folder / entry.get("wheel", "")
    if not wheel.is_file() or sha256(wheel) != entry.get("sha256"):
        return None
    return wheel


@dataclass(frozen=True)
class VerifiedWheel:
    """A wheel of the wheelhouse that its folder's manifest lists as built, verified and smoke-tested
    (imagegen.finish.finisher publishes only such wheels), with what the manifest says of it."""

    path: Path
    sha256: str
    entry: dict  # the manifest's cell entry: recipe, version, torch, cuda, archs, verify, smoke, ...


# Bounds on what a wheelhouse walk reads: it may be a folder a stranger shared.
MAX_WALK_DEPTH = MAX_LAYOUT_DEPTH  # a layout (imagegen.model.layout) goes no deeper
MAX_MANIFEST_BYTES = 16 << 20


def folders(out: Path):
    """Each folder under ``out`` (itself first) with its sorted entries, walked without following a
    symlink and at most ``MAX_WALK_DEPTH`` folders down."""
    stack = [(Path(out), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for child in entries:
            if not child.is_symlink() and child.is_dir() and depth < MAX_WALK_DEPTH:
                stack.append((child, depth + 1))
        yield folder, entries


def verified_wheels(out: Path, *, problems: list[str] | None = None) -> list[VerifiedWheel]:
    """Every wheel the manifests under ``out`` list whose file is there with the recorded sha256,
    sorted by path. A listed wheel that is missing or whose bytes changed since the build is left
    out and described in ``problems`` (when given), as is a manifest that cannot be read (read_manifest:
    not a regular file, over ``MAX_MANIFEST_BYTES``, nested too deep). Symlinks are not followed; the
    walk stops ``MAX_WALK_DEPTH`` folders down."""
    found: dict[Path, VerifiedWheel] = {}
    for folder, _ in folders(out):
        manifest = folder / MANIFEST
        if manifest.is_symlink():
            continue
        for name, entry in sorted(read_manifest(folder, problems=problems)["cells"].items()):
            wheel = entry.get("wheel") if isinstance(entry, dict) else None
            digest = entry.get("sha256") if isinstance(entry, dict) else None
            if not isinstance(wheel, str) or "/" in wheel or "\\" in wheel or not wheel.endswith(".whl") \
                    or not isinstance(digest, str):
                continue
            path = folder / wheel
            if path in found:
                continue  # cells that differ only by Python share one wheel (abi3) and folder
            if path.is_symlink() or not path.is_file():
                if problems is not None:
                    problems.append(f"{path}: listed in {manifest} but missing")
                continue
            if sha256(path) != digest:
                if problems is not None:
                    problems.append(f"{path}: changed since it was built and verified (sha256 differs from {manifest})")
                continue
            found[path] = VerifiedWheel(path=path, sha256=digest, entry=entry)
    return [found[p] for p in sorted(found)]
