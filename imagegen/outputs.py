"""Files the user names (``render -o``, ``bake -f``, ``ci github -o``, the lock file, Dockerfiles
under ``bake --dockerfiles``): written the way a user expects, never clobbering what is not a file.

- a regular file is replaced atomically (a temporary file next to it, renamed over it), keeping its
  mode (and its owner, where we may); a new file gets the umask's mode (0644 typically), not the
  0600 of a temporary file;
- a symlink is written through: its target is replaced (atomically, next to the target), the link
  stays a link;
- a directory, a character or block device (``/dev/null``), a FIFO or a socket is refused with one
  line, before anything is written;
- on any error the temporary file is removed and the error is one line (exit 2);
- a file is never written into the filesystem root or a system tree (``/etc``, ``/usr/bin``, ``/proc``,
  ...: safety.SYSTEM_TREES), and an output folder (``repair --out``, ``bake --dockerfiles``, ``--work``)
  is never the root, the home folder or a system folder (``output_folder``), as
  safety.wheelhouse_folder refuses them for a wheelhouse.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path

from imagegen.errors import UsageError
from imagegen.safety import SYSTEM_FOLDERS, SYSTEM_TREES

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


# A path imagegen writes may go this many folders deep (pathlib and os.makedirs make the missing ones
# recursively: 2000 of them was a RecursionError, exit 70). Real paths go a few dozen deep.
MAX_PATH_DEPTH = 255


def _depth(what: str, text: str) -> None:
    depth = len(Path(text).parts)
    if depth > MAX_PATH_DEPTH:
        raise UsageError(f"{what} {shown(text)} is {depth} folders deep; at most {MAX_PATH_DEPTH}")


def shown(path: object, limit: int = 120) -> str:
    """``path`` for a message: control characters escaped, at most ``limit`` characters. A longer one
    loses its middle, not its end (the file name of a wheel deep in a wheelhouse): a third of what is
    kept from its start, the rest from its end."""
    text = str(path)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    if len(out) <= limit:
        return out
    head = max(limit - 3, 0) // 3
    tail = max(limit - 3 - head, 0)
    return out[:head] + "..." + (out[-tail:] if tail else "")


def new_file_mode() -> int:
    """The mode a plain open() gives a new file under this process's umask (0644 usually), not
    mkstemp's 0600 (which would hide a written file from a web server or a team)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _in_system_tree(folder: Path, allowed: tuple[str, ...] = ()) -> bool:
    """Whether ``folder`` (resolved) is the filesystem root or lies in a system tree, unless in ``allowed``."""
    text = folder.as_posix()
    if any(text == a or text.startswith(a + "/") for a in allowed):
        return False
    return folder == Path(folder.anchor) or any(text == t or text.startswith(t + "/") for t in SYSTEM_TREES)


def output_folder(path: str | os.PathLike, what: str) -> Path:
    """``path``, a folder imagegen writes into (``repair --out``, ``bake --dockerfiles``, ``--work``),
    when it is not the filesystem root, the home folder or a system folder; else a UsageError."""
    _depth(what, os.fspath(path))
    if "\x00" in os.fspath(path):  # no file system takes it (realpath would raise)
        raise UsageError(f"{what} {shown(os.fspath(path), 200)}: a path cannot hold a NUL byte")
    resolved = Path(os.path.realpath(os.fspath(path)))
    text = resolved.as_posix()
    try:
        home = Path.home().resolve()
    except (RuntimeError, OSError):
        home = None
    if resolved == Path(resolved.anchor) or resolved == home or text in SYSTEM_FOLDERS or _in_system_tree(resolved):
        raise UsageError(f"{what} {shown(os.fspath(path), 200)} is the filesystem root, your home folder or a system"
                         " folder: give a folder of its own")
    if os.path.lexists(path) and not os.path.isdir(path):  # a file, a fifo, a device, a dangling link
        raise UsageError(f"{what} {shown(os.fspath(path), 200)}: not a folder")
    return Path(path)


def inside(folder: str | os.PathLike, path: str | os.PathLike, what: str) -> Path:
    """``path``, a file or folder imagegen itself puts in ``folder`` (one the user named: the folder of
    ``render -o``, ``bake --dockerfiles``, ``--work``), when it stays in that folder once links are
    followed; else a UsageError. A link planted there (``imagegen-scripts``, ``runs``, a script's name)
    never leads imagegen's writes out of the folder given; the folder named may itself be a link."""
    base = os.path.realpath(os.fspath(folder))
    real = os.path.realpath(os.fspath(path))
    if real != base and not real.startswith(base.rstrip("/") + "/"):
        raise UsageError(f"{what} {shown(os.fspath(path))} leads out of {shown(os.fspath(folder))} (to {shown(real)}):"
                         " imagegen writes only inside the folder given; remove that link")
    return Path(path)


def resolve_target(path: str | os.PathLike, what: str = "output file", system_ok: tuple[str, ...] = ()) -> Path:
    """The regular file that writing ``path`` replaces (symlinks followed), checked before anything
    is written: a directory, device, FIFO or socket, a symlink loop, an unusable name, a file in the
    filesystem root or a system tree (outside ``system_ok``: ``cdi-spec -o /etc/cdi/...``) is a UsageError."""
    text = os.fspath(path)
    if not text or not text.strip():
        raise UsageError(f"{what}: give a file name (got an empty one)")
    if any(not c.isprintable() for c in text):
        raise UsageError(f"{what} {shown(text)!s}: a file name with control characters is refused")
    _depth(what, text)
    p = Path(text)
    try:
        link = stat.S_ISLNK(os.lstat(p).st_mode)
    except FileNotFoundError:
        link = False
    except OSError as exc:
        raise UsageError(f"{what} {shown(text)}: {_why(exc)}") from None
    real = Path(os.path.realpath(p)) if link else p
    try:
        st = os.stat(p)  # through the link: a loop is ELOOP here
    except FileNotFoundError:
        st = None  # a new file, or a dangling link: its target is written
    except OSError as exc:
        raise UsageError(f"{what} {shown(text)}: {_why(exc)}") from None
    if st is not None:
        for test, kind in _KINDS:
            if test(st.st_mode):
                raise UsageError(f"{what} {shown(text)} is {kind}: give the path of a regular file")
    if text.endswith(("/", os.sep)):
        raise UsageError(f"{what} {shown(text)} names a directory: give the path of a regular file")
    if _in_system_tree(Path(os.path.realpath(real)).parent, system_ok):
        raise UsageError(f"{what} {shown(text)} is in the filesystem root or a system folder: write it somewhere"
                         " of your own")
    return real


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long"
    return exc.strerror or exc.__class__.__name__


def replace_file(target: Path, data: bytes, *, mode: int, owner: tuple[int, int] | None = None,
                 suffix: str = ".tmp") -> None:
    """``data`` as the file ``target``: written to a hidden temporary file beside it (``suffix``), given
    ``mode`` (and ``owner``, where we may), then renamed over the name itself (a symlink there is replaced,
    not followed), so a reader sees the old file or the new one, never a part. OSError when it cannot be
    written, the temporary file removed; the caller says it in its own words."""
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:200]}.", suffix=suffix)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            if owner is not None and owner != (os.getuid(), os.getgid()):
                try:
                    os.fchown(fh.fileno(), *owner)
                except OSError:
                    pass  # not ours to give away: the file becomes ours, as any editor's save would
        os.replace(tmp, target)
        tmp = None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_text_atomic(path: str | os.PathLike, text: str, *, what: str = "output file",
                      system_ok: tuple[str, ...] = ()) -> Path:
    """Write ``text`` to ``path`` (see the module docstring); return the file really written."""
    target = resolve_target(path, what, system_ok)
    try:
        try:
            old = os.stat(target)
        except FileNotFoundError:
            old = None
        replace_file(target, text.encode("utf-8"), mode=stat.S_IMODE(old.st_mode) if old is not None else new_file_mode(),
                     owner=(old.st_uid, old.st_gid) if old is not None else None)
    except OSError as exc:
        raise UsageError(f"{what} {shown(os.fspath(path))}: cannot write: {_why(exc)}") from None
    return target


def write_output(text: str, out: str | None, *, what: str = "output file", system_ok: tuple[str, ...] = ()) -> None:
    """Write ``text`` to the file ``out`` (see write_text_atomic), or to stdout when it is None or '-'."""
    if out is None or out == "-":
        sys.stdout.write(text)
        return
    write_text_atomic(out, text, what=what, system_ok=system_ok)
