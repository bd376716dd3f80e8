"""The wheels of a wheelhouse as imagegen.publish.index lists them: each verified wheel's file name checked,
its METADATA read (the way pip finds it, bounded: the zip's central directory, the member, the bytes
decompressed; never extracted, from a file opened without following a symlink) and its Requires-Python
kept when it is a valid specifier."""

from __future__ import annotations

import dataclasses
import email.parser
import os
import re
import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from imagegen import safety
from imagegen.errors import Unreadable, printable
from imagegen.outputs import shown
from imagegen.publish.index_pages import IndexedWheel
from imagegen.safety import os_reason
from imagegen.wheelhouse.manifest import VerifiedWheel

# Bounds on what is read from a wheel.
MAX_METADATA_BYTES = 4 << 20
MAX_CENTRAL_DIRECTORY_BYTES = 8 << 20  # torch's own wheel needs about 2 MiB
MAX_REQUIRES_PYTHON_CHARS = 200

# A wheel file name as a page may show it: PEP 427's characters, no quote, space, '<', '%' or '/'.
WHEEL_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,250}\.whl")


def is_wheel_name(name: str) -> bool:
    """Whether pip can parse ``name`` as a wheel's file name."""
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename:
        return False
    return True


def url_path(out: Path, path: Path) -> str:
    """``path``'s URL below OUT, percent-encoded."""
    return quote(os.fsencode(path.relative_to(out).as_posix()), safe="/")


def indexable(out: Path, verified: list[VerifiedWheel], problems: list[str]) -> list[IndexedWheel]:
    """The verified wheels the index can list: a file name pip can parse, a METADATA that can be read,
    one file per name (two different wheels under one name would be one link with two meanings)."""
    by_name: dict[str, IndexedWheel] = {}
    for verified_wheel in verified:
        path = verified_wheel.path
        name = path.name
        reused = reused_text(verified_wheel.entry)
        if name in by_name:
            if by_name[name].sha256 != verified_wheel.sha256:
                problems.append(f"{shown(path)}: another wheel of the same name is indexed"
                                f" ({shown(by_name[name].path)}); left out")
            elif reused is not None:  # the same wheel in the folder of the torch it was built for and a reused one
                known = by_name[name].reused
                by_name[name] = dataclasses.replace(by_name[name], reused=f"{known}; {reused}" if known else reused)
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
        python = requires_python(metadata, path, problems)
        by_name[name] = IndexedWheel(path=path, url_path=url_path(out, path),
                                     project=project, version=version, sha256=verified_wheel.sha256, size=size,
                                     requires_python=python, metadata=metadata, reused=reused)
    return list(by_name.values())


def reused_text(entry: dict) -> str | None:
    """What the pages say of a wheel its manifest entry marks ``reused_from`` (imagegen reuse), or None:
    ``built for torch 2.11, checked against torch 2.14.1``; only versions reach the page."""
    reused = entry.get("reused_from")
    if not isinstance(reused, dict):
        return None

    def version(key: str) -> str:
        value = reused.get(key)
        return value if isinstance(value, str) and re.fullmatch(r"[0-9][0-9A-Za-z.+]{0,40}", value) else "?"
    return f"built for torch {version('torch')}, checked against torch {version('checked_against')}"


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


def requires_python(metadata: bytes, wheel: Path, problems: list[str]) -> str | None:
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


