"""Collect: move built wheels into the output folder atomically and record them in manifest.json.

Layout: ``<out>/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/<wheel>`` plus ``manifest.json`` in that folder,
one entry per cell (cells that differ only by Python share a folder). A wheel is copied under a
hidden ``.partial`` name and renamed, so no reader ever sees half a file; the manifest is rewritten
the same way. The manifest's ``inputs`` hash is what makes a re-run skip an unchanged cell.

Every writer of a cell folder (a build placing its wheel, ``collect``, ``repair``) holds the folder's
lock (``placing``) across what it checks and what it writes: two builds started together cannot both
find the place free and the second silently replace the first's wheel, and no manifest entry is lost
to two read-modify-writes at once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Iterator

from imagegen.errors import PublishError, RefusedError
from imagegen.outputs import new_file_mode, replace_file, shown
from imagegen.model.cell import Cell
from imagegen.safety import os_reason

try:
    import fcntl
except ImportError:  # not POSIX: the threads of this process still place one at a time
    fcntl = None  # type: ignore[assignment]

# The wheelhouse's read side (what is there, what a build would replace) and CellResult live in
# imagegen.wheelhouse.manifest, which the executors use before building; this module is the only writer.
from imagegen.wheelhouse.manifest import MANIFEST, cell_dir, in_the_way, read_manifest, sha256

# The lock file of a cell folder, there only while a writer holds it.
LOCK = f".{MANIFEST}.lock"
# Threads of one process (a build split over several builders) place one at a time; processes
# exclude each other through the lock file (flock, which also excludes threads on a local file system).
_PLACING = threading.RLock()


@contextlib.contextmanager
def placing(folder: Path) -> Iterator[None]:
    """Hold the exclusive lock of the cell folder ``folder`` (made if missing) for as long as the
    block runs: what a writer checks there stays true until it has written. The lock file is removed
    on release, while still held, so a wheelhouse keeps no lock file; a writer that waited on the
    removed file sees that it is gone and locks the new one."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    with _PLACING:
        fd = _lock(path)
        try:
            yield
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
            os.close(fd)


def _lock(path: Path) -> int:
    """An open descriptor of the lock file ``path``, exclusively locked, and still the file at that
    path (not one a former holder removed meanwhile)."""
    flags = os.O_RDWR | os.O_CREAT
    for name in ("O_NOFOLLOW", "O_NONBLOCK", "O_NOCTTY", "O_CLOEXEC"):
        flags |= getattr(os, name, 0)
    while True:
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise PublishError(f"{shown(path, 300)}: cannot take the wheelhouse folder's lock ({os_reason(exc)})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PublishError(f"{shown(path, 300)} is not a regular file: cannot take the wheelhouse folder's lock")
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except OSError as exc:
            os.close(fd)
            raise PublishError(f"{shown(path, 300)}: cannot take the wheelhouse folder's lock ({os_reason(exc)})") from None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed this file when it was done: lock the one there now


def _write_json_atomic(path: Path, data: dict) -> None:
    """``data`` as ``path`` (a manifest), replaced by rename; a place that cannot take it (a folder of that
    name, a read-only or full file system) is one line, exit 9."""
    if path.is_dir() and not path.is_symlink():
        raise PublishError(f"{shown(path)} is a folder: remove it (imagegen keeps the wheelhouse's manifest there)")
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    try:
        # new_file_mode, not mkstemp's 0600: the wheelhouse is served; ``.partial``: what index sweeps
        replace_file(path, text.encode("utf-8"), mode=new_file_mode(), suffix=".partial")
    except OSError as exc:
        raise PublishError(f"{shown(path)}: cannot write: {exc.strerror or exc.__class__.__name__}") from None


def _copy_atomic(src: Path, dest: Path) -> None:
    """Copy under a hidden temp name of this process (two runs placing at once share none), then
    rename: no reader sees half a file, and an interrupted copy leaves nothing behind."""
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.partial"
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def kept_log(out: Path, cell: Cell) -> Path:
    """Where ``keep_log`` keeps a cell's build log."""
    return out / "logs" / f"{cell.name}.log"


def keep_log(out: Path, cell: Cell, log: Path) -> Path:
    """Copy a cell's build log into ``out/logs`` (the work folder is temporary) and return the copy."""
    dest = kept_log(out, cell)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _copy_atomic(log, dest)
    return dest


# Errors of os.link that mean "no hard links here" (some FUSE and network file systems).
_NO_LINKS = {errno.EPERM, errno.EMLINK, errno.ENOSYS, getattr(errno, "ENOTSUP", -1), getattr(errno, "EOPNOTSUPP", -1)}


def _place(src: Path, dest: Path, *, replace: bool, refusal: str) -> None:
    """Copy ``src`` to ``dest`` under a hidden temp name, then put it in place: by rename when it may
    replace what is there, else by a hard link, which never replaces a file (one that appeared
    meanwhile, from a writer that takes no lock, is refused with ``refusal``)."""
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.partial"
    try:
        shutil.copyfile(src, tmp)
        if replace:
            os.replace(tmp, dest)
            return
        try:
            os.link(tmp, dest)
        except FileExistsError:
            raise RefusedError(refusal) from None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            os.replace(tmp, dest)  # no hard links here: the lock alone keeps the place
    finally:
        tmp.unlink(missing_ok=True)


def place_flat(out: Path, wheel: Path) -> Path:
    """``--flat``: the wheel alone in ``out`` (no cell folders, no manifest), atomically."""
    out.mkdir(parents=True, exist_ok=True)
    dest = out / wheel.name
    _copy_atomic(wheel, dest)
    return dest


def place(out: Path, cell: Cell, wheel: Path, *, inputs: str, record: dict, log: Path | None = None,
            force: bool = False) -> Path:
    """Copy ``wheel`` into its cell folder atomically and record it in the manifest, as one step under
    the folder's lock (``placing``), checked there first: a RefusedError, with nothing written, when
    it would replace a wheel built for other archs (wheelhouse.in_the_way: one another build placed
    while this one ran, its check before building having found the place free), unless ``force``.
    ``log``: the build log, kept in ``out/logs`` (``keep_log``) once the check has passed and recorded
    as the entry's ``log``."""
    folder = cell_dir(out, cell)
    with placing(folder):
        dest = folder / wheel.name
        other = None if force else in_the_way(out, cell, wheel.name)
        refusal = (f"{other or dest} would be replaced by the wheel for archs {cell.archs} (same file name), placed"
                   " there while this build ran: build into another --out to keep both, or --force to replace it;"
                   f" the new wheel is in {shown(wheel.parent, 300)}")
        if other is not None:
            raise RefusedError(refusal)
        if log is not None:
            record = {**record, "log": str(keep_log(out, cell, log))}
        _place(wheel, dest, replace=dest.exists(), refusal=refusal)
        _record(folder, cell, dest, inputs, record)
    return dest


def _record(folder: Path, cell: Cell, dest: Path, inputs: str, record: dict) -> None:
    """The manifest entry of ``cell``'s wheel ``dest`` (the folder's lock held)."""
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
        "requested_archs": str(cell.requested_archs),
        "expected_archs": str(cell.expected_archs),
        # The plan's notes ("8.6, 8.9 run the sm_80 cubin", fallback base image, ...) travel with the wheel.
        "notes": list(cell.notes),
        "flavor": cell.flavor,
        "base_image": cell.base.ref if cell.base else None,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **record,
    }
    _write_json_atomic(folder / MANIFEST, manifest)


def record_entries(folder: Path, entries: dict[str, dict]) -> None:
    """Record wheels already in ``folder`` (verified by imagegen collect) in its manifest: cell name ->
    entry, each replacing that cell's earlier entry; one atomic rewrite, under the folder's lock."""
    with placing(folder):
        manifest = read_manifest(folder)
        manifest["schema"] = 1
        manifest["cells"].update(entries)
        _write_json_atomic(folder / MANIFEST, manifest)


def place_reused(folder: Path, wheel: Path, cell: str, entry: dict) -> Path:
    """Place ``wheel``, built for another torch and found reusable with this folder's (imagegen reuse), in
    the cell folder ``folder`` and record ``entry`` (which carries ``reused_from``) as the manifest's
    entry of ``cell``, under the folder's lock. Refused, nothing written, when a different file of that
    name is there already; the same bytes are only recorded again."""
    return _place_recorded(folder, wheel, cell, entry, "the reused wheel")


def place_external(folder: Path, wheel: Path, cell: str, entry: dict) -> Path:
    """Place ``wheel``, built outside imagegen and verified by `imagegen collect --external`, in the
    wheelhouse folder ``folder`` (the wheel itself when it is there already) and record ``entry`` (which
    carries ``external: true``) as the manifest's entry ``cell``; refused as place_reused is."""
    return _place_recorded(folder, wheel, cell, entry, "the external wheel")


def _place_recorded(folder: Path, wheel: Path, cell: str, entry: dict, what: str) -> Path:
    with placing(folder):
        dest = folder / wheel.name
        if dest.is_symlink() or (dest.exists() and not dest.is_file()):
            raise RefusedError(f"{shown(dest, 300)} is not a regular file: {what} is not placed")
        digest = sha256(wheel)
        if dest.is_file() and sha256(dest) != digest:
            raise RefusedError(f"{shown(dest, 300)} is another wheel of the same name: {what} is not placed"
                               " (remove that one, or give another wheelhouse)")
        if not dest.is_file():
            _place(wheel, dest, replace=False,
                   refusal=f"{shown(dest, 300)} appeared while {what} was placed: not replaced")
        manifest = read_manifest(folder)
        manifest["schema"] = 1
        manifest["cells"][cell] = {**entry, "wheel": dest.name, "sha256": digest,
                                   "placed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write_json_atomic(folder / MANIFEST, manifest)
    return dest


def replace_wheel(folder: Path, old: str, old_sha256: str, new: Path, *, record: dict) -> Path:
    """Swap the wheel ``old`` of the cell folder ``folder`` for ``new`` (a finished wheel on the same
    file system, e.g. in a hidden folder inside ``folder``) and point every manifest entry that lists
    ``old`` with ``old_sha256`` at it (cells that differ only by Python share a wheel), ``record``
    merged into each entry (imagegen repair's ``{"repaired": ...}``). Returns the new wheel's path.

    In this order, so that a reader never finds an entry naming a missing file: the new wheel is
    renamed into the folder, the manifest rewritten atomically, then ``old`` removed (when the names
    differ). Refused, with nothing changed, when no entry lists ``old`` with that sha256 any more
    (a build replaced it meanwhile). All of it under the folder's lock (``placing``)."""
    with placing(folder):
        return _replace_wheel(folder, old, old_sha256, new, record=record)


def _replace_wheel(folder: Path, old: str, old_sha256: str, new: Path, *, record: dict) -> Path:
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
