"""Collect: move built wheels into the output folder atomically and record them in manifest.json.

Layout: ``<out>/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/<wheel>`` plus ``manifest.json`` in that folder,
one entry per cell (cells that differ only by Python share a folder). A wheel is copied under a
hidden ``.partial`` name and renamed, so no reader ever sees half a file; the manifest is rewritten
the same way. The manifest's ``inputs`` hash is what makes a re-run skip an unchanged cell.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from imagegen.outputs import new_file_mode
from imagegen.plan import Cell

MANIFEST = "manifest.json"


@dataclass
class CellResult:
    """What became of one cell, whichever way it was built (bake, a prebuilt image, native)."""

    cell: Cell
    status: str  # built | up-to-date | failed
    wheel: Path | None = None
    log: Path | None = None
    seconds: float = 0.0
    error: str = ""
    log_tail: list[str] = field(default_factory=list)
    verify: dict | None = None
    smoke: dict | None = None
    ccache: dict | None = None  # {"hits", "misses", "hit_rate"} of the compile step
    audit: dict | None = None  # the gencode audit's verdict and table (imagegen.audit.Verdict.as_dict)

    def as_dict(self) -> dict:
        return {"cell": self.cell.name, "status": self.status, "wheel": str(self.wheel) if self.wheel else None,
                "log": str(self.log) if self.log else None, "seconds": round(self.seconds, 1), "error": self.error,
                "verify": self.verify, "smoke": self.smoke, "ccache": self.ccache, "audit": self.audit}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / cell.wheel_dir


def read_manifest(folder: Path) -> dict:
    try:
        data = json.loads((folder / MANIFEST).read_text())
        return data if isinstance(data, dict) and isinstance(data.get("cells"), dict) else {"schema": 1, "cells": {}}
    except (OSError, ValueError):
        return {"schema": 1, "cells": {}}


def _write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, new_file_mode())  # not mkstemp's 0600: the wheelhouse is served
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def _copy_atomic(src: Path, dest: Path) -> None:
    """Copy under a hidden temp name of this process (two runs publishing at once share none), then
    rename: no reader sees half a file, and an interrupted copy leaves nothing behind."""
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.partial"
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def keep_log(out: Path, cell: Cell, log: Path) -> Path:
    """Copy a cell's build log into ``out/logs`` (the work folder is temporary) and return the copy."""
    keep = out / "logs"
    keep.mkdir(parents=True, exist_ok=True)
    dest = keep / f"{cell.name}.log"
    _copy_atomic(log, dest)
    return dest


def publish_flat(out: Path, wheel: Path) -> Path:
    """``--flat``: the wheel alone in ``out`` (no cell folders, no manifest), atomically."""
    out.mkdir(parents=True, exist_ok=True)
    dest = out / wheel.name
    _copy_atomic(wheel, dest)
    return dest


def up_to_date(out: Path, cell: Cell, inputs: str) -> Path | None:
    """The wheel of an earlier build of exactly these inputs, if it is still there intact."""
    folder = cell_dir(out, cell)
    entry = read_manifest(folder)["cells"].get(cell.name)
    if not entry or entry.get("inputs") != inputs:
        return None
    wheel = folder / entry.get("wheel", "")
    if not wheel.is_file() or sha256(wheel) != entry.get("sha256"):
        return None
    return wheel


def publish(out: Path, cell: Cell, wheel: Path, *, inputs: str, record: dict) -> Path:
    """Copy ``wheel`` into its cell folder atomically and record it in the manifest."""
    folder = cell_dir(out, cell)
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / wheel.name
    _copy_atomic(wheel, dest)
    manifest = read_manifest(folder)
    manifest["schema"] = 1
    manifest["cells"][cell.name] = {
        "inputs": inputs,
        "wheel": dest.name,
        "sha256": sha256(dest),
        "recipe": cell.recipe.name,
        "version": cell.version.version,
        "source": {"kind": cell.recipe.source_kind, "url": cell.recipe.source_url, "ref": cell.version.ref,
                   "commit": cell.version.commit,
                   "path": str(cell.recipe.source_path) if cell.recipe.source_path else None,
                   **({"sha256": cell.version.sdist.sha256} if cell.recipe.source_kind == "sdist" and cell.version.sdist
                      else {})},
        "torch": cell.torch_version,
        "cuda": cell.cuda.name,
        "python": cell.python,
        "archs": str(cell.archs),
        "requested_archs": str(cell.requested_archs or cell.archs),
        "expected_archs": str(cell.expected_archs),
        # The plan's notes ("8.6, 8.9 run the sm_80 cubin", fallback base image, ...) travel with the wheel.
        "notes": list(cell.notes),
        "flavor": cell.flavor,
        "base_image": cell.base.ref if cell.base else None,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **record,
    }
    _write_json_atomic(folder / MANIFEST, manifest)
    return dest
