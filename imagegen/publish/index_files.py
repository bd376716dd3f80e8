"""How imagegen.publish.index writes its files: each under a temporary name in its own folder, fsynced
and renamed over the old one (a reader sees the old file or the new one, never half of one), not rewritten
when its content would not change; folders made real (never a symlink out of the wheelhouse); the
temporary files of a killed run swept; the index's lock, which two runs on one wheelhouse take turns on."""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TypeVar

from imagegen.errors import PublishError
from imagegen.outputs import new_file_mode, shown

T = TypeVar("T")


def write(path: Path, data: bytes, written: list[Path]) -> None:
    """``path`` holds ``data`` afterwards, replaced in one rename (fsynced first) if it held anything else."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == len(data) and path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    replace_file(path, lambda fh: fh.write(data), written)


def replace_file(path: Path, fill: Callable[[BinaryIO], T], written: list[Path]) -> T:
    """Replace ``path`` in one rename with what ``fill`` writes into a temporary file beside it (fsynced
    first, then the folder); ``path`` joins ``written``. What ``fill`` returns."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as fh:
            result = fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, new_file_mode())  # not mkstemp's 0600: the index is served
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    written.append(path)
    return result


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a crash after it leaves the new file, not a missing one)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def real_folder(folder: Path, *, refuse: bool) -> None:
    """``folder`` as a real directory (not a symlink, which would take writes outside OUT). A project folder
    that is anything else is replaced (simple/ is the index's own); simple/ itself is refused."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        folder.mkdir()
        return
    if stat.S_ISDIR(st.st_mode):
        return
    if refuse:
        raise PublishError(f"{shown(folder)} is not a directory (a symlink or a file): move it away; imagegen index"
                           " writes its pages there and nowhere outside the wheelhouse")
    folder.unlink()
    folder.mkdir()


def is_partial(name: str, of: str) -> bool:
    """Whether ``name`` is a temporary file _write made for ``of`` (left by a run that was killed)."""
    return name.startswith(f".{of}.") and name.endswith(".partial")


@contextmanager
def locked(lock: Path, say: Callable[[str], None]) -> Iterator[None]:
    """Hold the wheelhouse's index lock ``lock`` (released when the file is closed, by this process or its
    death)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    fd = os.open(lock, flags, new_file_mode())
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PublishError(f"{shown(lock)} is not a regular file: remove it (imagegen index keeps its lock there)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another imagegen index of {shown(lock.parent)} to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
