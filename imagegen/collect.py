"""Collect: move built wheels into the output folder atomically and record them in manifest.json.

Layout: ``<out>/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/<wheel>`` plus ``manifest.json`` in that folder,
one entry per cell (cells that differ only by Python share a folder). A wheel is copied under a
hidden ``.partial`` name and renamed, so no reader ever sees half a file; the manifest is rewritten
the same way. The manifest's ``inputs`` hash is what makes a re-run skip an unchanged cell.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from imagegen.errors import PublishError
from imagegen.outputs import new_file_mode
from imagegen.plan import Cell

# The wheelhouse's read side (what is there, what a build would replace) and CellResult live in
# imagegen.wheelhouse, which the executors use before building; this module is the only writer.
from imagegen.wheelhouse import MANIFEST, cell_dir, read_manifest, sha256


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
        # The recipe's patches the build applied to that source (before compiling; see the audit).
        "patches": [p.name for p in cell.version.patches],
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


def record_entries(folder: Path, entries: dict[str, dict]) -> None:
    """Record wheels already in ``folder`` (verified by imagegen collect) in its manifest: cell name ->
    entry, each replacing that cell's earlier entry; one atomic rewrite."""
    manifest = read_manifest(folder)
    manifest["schema"] = 1
    manifest["cells"].update(entries)
    _write_json_atomic(folder / MANIFEST, manifest)


def replace_wheel(folder: Path, old: str, old_sha256: str, new: Path, *, record: dict) -> Path:
    """Swap the wheel ``old`` of the cell folder ``folder`` for ``new`` (a finished wheel on the same
    file system, e.g. in a hidden folder inside ``folder``) and point every manifest entry that lists
    ``old`` with ``old_sha256`` at it (cells that differ only by Python share a wheel), ``record``
    merged into each entry (imagegen repair's ``{"repaired": ...}``). Returns the new wheel's path.

    In this order, so that a reader never finds an entry naming a missing file: the new wheel is
    renamed into the folder, the manifest rewritten atomically, then ``old`` removed (when the names
    differ). Refused, with nothing changed, when no entry lists ``old`` with that sha256 any more
    (a build replaced it meanwhile)."""
    manifest = read_manifest(folder)
    cells = sorted(name for name, entry in manifest["cells"].items()
                   if isinstance(entry, dict) and entry.get("wheel") == old and entry.get("sha256") == old_sha256)
    if not cells:
        raise PublishError(f"{folder / MANIFEST} no longer lists {old} as it was (rebuilt meanwhile?):"
                           " nothing replaced")
    dest = folder / new.name
    os.chmod(new, new_file_mode())  # the wheelhouse is served, whatever mode the tool that wrote ``new`` gave it
    os.replace(new, dest)
    digest = sha256(dest)
    for name in cells:
        manifest["cells"][name] = {**manifest["cells"][name], "wheel": dest.name, "sha256": digest, **record}
    _write_json_atomic(folder / MANIFEST, manifest)
    if dest.name != old:
        (folder / old).unlink(missing_ok=True)
    return dest
