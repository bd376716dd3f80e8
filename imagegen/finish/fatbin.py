"""Reading what an extension .so holds: its ELF sections and the CUDA fat binary's entries (SASS per
sm_XY, PTX per compute_XY), streamed and bounded, or through cuobjdump where it is present."""

from __future__ import annotations

import hashlib
import io
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from imagegen.errors import VerifyError
from imagegen.shipped.builder.imagegen_wheeltools import cuobjdump_listing
from imagegen.untrusted import MAX_MEMBER_BYTES

KIND_PTX, KIND_ELF = 1, 2  # a fatbin entry's kind
FATBIN_MAGIC = 0xBA55ED50


# An entry's payload is compressed: 0x2000 is LZ4 (nvcc before 12.8), 0x8000 zstd (CUDA 12.8+ and 13's
# default, seen on the fixture wheel's PTX); either way its text cannot be read as it is.
_COMPRESSED = 0x2000 | 0x8000


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" | "ptx"
    arch: int  # 90, 120, ...
    variant: str | None  # "a", "f", "" when known, None when the payload is compressed
    compressed: bool

    def __str__(self) -> str:
        v = self.variant or ""
        return f"sm_{self.arch}{v}" if self.kind == "sass" else f"compute_{self.arch}{v}"


# Bounds of what the reader believes: a garbage or hostile .so is a problem of its wheel, never a
# crash, a hang or a read of the whole file into memory.
MAX_SECTIONS = 65535


MAX_SHSTRTAB = 16 << 20


MAX_FATBIN_ENTRIES = 1_000_000


PTX_HEAD = 64 << 10  # the .target line is at the top of a PTX file


MAX_SO_BYTES = MAX_MEMBER_BYTES  # an extension larger than this (4 GiB) is refused, not read


SPOOL_BYTES = 64 << 20  # an extension up to this size is read in memory, a larger one goes through a temp file


def _read_at(fh: BinaryIO, offset: int, size: int, total: int, kind: str = "ELF") -> bytes:
    if offset < 0 or size < 0 or offset + size > total:
        raise VerifyError(f"malformed {kind}: a header points outside the file")
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise VerifyError(f"malformed {kind}: the file is shorter than its headers say")
    return data


def elf_section_table(fh: BinaryIO, total: int) -> dict[str, tuple[int, int]]:
    """Section name -> (offset, size) of a 64-bit little-endian ELF file of ``total`` bytes, read
    with bounded reads (the headers and the section-name table only). Raises VerifyError."""
    head = _read_at(fh, 0, 64, total) if total >= 64 else b""
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise VerifyError("not a 64-bit little-endian ELF shared object")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if shnum == 0:
        return {}
    if shentsize < 64 or shnum > MAX_SECTIONS or shstrndx >= shnum:
        raise VerifyError("malformed ELF: bad section header table")
    table = _read_at(fh, shoff, shentsize * shnum, total)
    headers = []
    for i in range(shnum):
        name, stype, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", table, i * shentsize)
        headers.append((name, stype, offset, size))
    _, _, str_off, str_size = headers[shstrndx]
    if str_size > MAX_SHSTRTAB:
        raise VerifyError("malformed ELF: section name table too large")
    names = _read_at(fh, str_off, str_size, total)
    out = {}
    for name, stype, offset, size in headers:
        if name >= len(names):
            continue
        end = names.find(b"\0", name)
        label = names[name:end if end >= 0 else len(names)].decode(errors="replace")
        if stype == 8:  # SHT_NOBITS holds no bytes
            out[label] = (0, 0)
        elif offset <= total and size <= total - offset:
            out[label] = (offset, size)
        else:
            raise VerifyError(f"malformed ELF: section {label[:40]!r} lies outside the file")
    return out


MAX_PE_SECTIONS = 96  # the PE/COFF loader's own limit


# Where the fat binary is: `.nv_fatbin` in an ELF .so; `.nv_fatb` in a Windows .pyd/.dll (PE section
# names are cut at 8 bytes; seen in NVIDIA's own nvjpeg64_12.dll from PyPI, beside `.nvFatBi`).
FATBIN_SECTIONS = (".nv_fatbin", ".nv_fatb")


def pe_section_table(fh: BinaryIO, total: int) -> dict[str, tuple[int, int]]:
    """Section name -> (offset, size) in the file of a PE image (a Windows .pyd or .dll) of ``total``
    bytes, read with bounded reads (the headers only). A section's size is the smaller of its size in
    memory and in the file (the file's is rounded up to the file alignment). Raises VerifyError."""
    head = _read_at(fh, 0, 64, total, "PE") if total >= 64 else b""
    if head[:2] != b"MZ":
        raise VerifyError("not a PE image")
    pe, = struct.unpack_from("<I", head, 0x3C)
    coff = _read_at(fh, pe, 24, total, "PE")
    if coff[:4] != b"PE\0\0":
        raise VerifyError("malformed PE: no PE signature where the header points")
    nsec, = struct.unpack_from("<H", coff, 6)
    opt_size, = struct.unpack_from("<H", coff, 20)
    if nsec > MAX_PE_SECTIONS:
        raise VerifyError("malformed PE: bad section table")
    table = _read_at(fh, pe + 24 + opt_size, 40 * nsec, total, "PE")
    out = {}
    for i in range(nsec):
        raw_name = table[40 * i:40 * i + 8]
        label = raw_name.split(b"\0", 1)[0].decode(errors="replace")
        vsize, _va, raw_size, raw_ptr = struct.unpack_from("<IIII", table, 40 * i + 8)
        size = min(vsize, raw_size) if vsize else raw_size
        if raw_ptr > total or size > total - raw_ptr:
            raise VerifyError(f"malformed PE: section {label!r} lies outside the file")
        out[label] = (raw_ptr, size)
    return out


def extension_section_table(fh: BinaryIO, total: int) -> dict[str, tuple[int, int]]:
    """The section table of an extension module: ELF (.so) or PE (.pyd, .dll), told by its magic."""
    fh.seek(0)
    magic = fh.read(4)
    return pe_section_table(fh, total) if magic[:2] == b"MZ" else elf_section_table(fh, total)


# What processor an extension's code is for: ELF e_machine, PE/COFF Machine -> the name wheel platform
# tags use (x86_64 / aarch64).
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
PE_MACHINES = {0x8664: "x86_64", 0xAA64: "aarch64"}


def extension_machine(fh: BinaryIO, total: int) -> str:
    """The processor an ELF or PE extension is built for: x86_64, aarch64, or "machine N" for
    another. Raises VerifyError for a file that is neither."""
    head = _read_at(fh, 0, 64, total) if total >= 64 else b""
    if head[:4] == b"\x7fELF":
        number, = struct.unpack_from("<H", head, 0x12)
        return ELF_MACHINES.get(number, f"ELF machine {number}")
    if head[:2] == b"MZ":
        pe, = struct.unpack_from("<I", head, 0x3C)
        coff = _read_at(fh, pe, 24, total, "PE")
        if coff[:4] != b"PE\0\0":
            raise VerifyError("malformed PE: no PE signature where the header points")
        number, = struct.unpack_from("<H", coff, 4)
        return PE_MACHINES.get(number, f"PE machine {number:#x}")
    raise VerifyError("not an ELF or PE shared object")


def wheel_machines(platform_tags) -> set[str]:
    """The processors a wheel's platform tags name (linux_x86_64, manylinux_2_28_aarch64, win_amd64,
    macosx_11_0_arm64 ...); empty for a pure ("any") wheel."""
    out = set()
    for tag in platform_tags:
        if tag.endswith(("x86_64", "amd64")):
            out.add("x86_64")
        elif tag.endswith(("aarch64", "arm64")):
            out.add("aarch64")
        elif tag != "any":
            out.add(tag)
    return out


def fatbin_section(sections: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """(offset, size) of the fat binary among ``sections``, or None (a library without device code)."""
    return next((sections[name] for name in FATBIN_SECTIONS if name in sections), None)


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents of a 64-bit little-endian ELF file."""
    return {name: data[off:off + size] for name, (off, size) in elf_section_table(io.BytesIO(data), len(data)).items()}


def fatbin_entries(blob: bytes) -> list[FatbinEntry]:
    """Every cubin/PTX entry of the fatbin containers in ``blob`` (a .nv_fatbin section)."""
    return fatbin_entries_at(io.BytesIO(blob), 0, len(blob))


_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)


def _next_container(fh: BinaryIO, pos: int, end: int) -> int:
    """The offset of the next container header at or after ``pos`` (8-aligned from ``pos``), or ``end``."""
    chunk, origin = 1 << 20, pos
    while pos + 16 <= end:
        fh.seek(pos)
        data = fh.read(min(chunk, end - pos))
        at = data.find(_MAGIC_BYTES)
        while at >= 0 and (pos + at - origin) % 8:
            at = data.find(_MAGIC_BYTES, at + 1)
        if at >= 0:
            return pos + at
        if len(data) < 16:
            return end
        pos += len(data) - (len(data) % 8) - 8 if len(data) > 16 else len(data)
    return end


def _read_exact(fh: BinaryIO, pos: int, size: int, end: int) -> bytes | None:
    """``size`` bytes at ``pos``, or None where they would pass ``end`` or the file is shorter."""
    if pos + size > end:
        return None
    fh.seek(pos)
    data = fh.read(size)
    return data if len(data) == size else None


def fatbin_entries_at(fh: BinaryIO, start: int, size: int) -> list[FatbinEntry]:
    """The entries of the fatbin containers in ``fh[start:start+size]``, read header by header (a
    PTX entry's first PTX_HEAD bytes for its variant): memory stays small whatever the size."""
    entries: list[FatbinEntry] = []
    end = start + size
    pos = start
    while (head := _read_exact(fh, pos, 16, end)) is not None:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", head)
        if magic != FATBIN_MAGIC:
            # Containers are aligned; skip padding (or garbage) to the next one.
            pos = _next_container(fh, pos + 8, end)
            continue
        cend = min(pos + header_size + fat_size, end)
        epos = pos + header_size
        while (eh := _read_exact(fh, epos, 64, cend)) is not None:
            kind, _u1, eh_size, padded = struct.unpack_from("<HHIQ", eh)
            if kind not in (KIND_PTX, KIND_ELF) or eh_size < 64:
                break
            arch, = struct.unpack_from("<I", eh, 28)
            flags, = struct.unpack_from("<Q", eh, 40)
            compressed = bool(flags & _COMPRESSED)
            variant = None
            if not compressed and kind == KIND_PTX:
                fh.seek(epos + eh_size)
                variant = _variant(kind, fh.read(max(0, min(padded, PTX_HEAD, cend - epos - eh_size))))
            entries.append(FatbinEntry("ptx" if kind == KIND_PTX else "sass", arch, variant, compressed))
            if len(entries) > MAX_FATBIN_ENTRIES:
                raise VerifyError(f"malformed fatbin: more than {MAX_FATBIN_ENTRIES} entries")
            epos += eh_size + padded
        pos = max(cend, pos + 16)
    return entries


def _variant(kind: int, payload: bytes) -> str | None:
    if kind == KIND_PTX:
        m = re.search(rb"\.target\s+sm_(\d+)([af]?)", payload)
        return m.group(2).decode() if m else None
    return None  # the cubin's e_flags encoding of `a` changed across CUDA releases: ask cuobjdump


def cuobjdump_entries(so_path: Path, exe: str) -> list[FatbinEntry]:
    proc = subprocess.run([exe, "--list-elf", "--list-ptx", str(so_path)], capture_output=True, text=True)
    return [FatbinEntry(kind, cc, variant, False) for kind, cc, variant in cuobjdump_listing(proc.stdout)]


def read_so(data: bytes) -> list[FatbinEntry]:
    """The fatbin entries of one shared object's bytes, ELF or PE (for tools and tests)."""
    where = fatbin_section(extension_section_table(io.BytesIO(data), len(data)))
    return fatbin_entries(data[where[0]:where[0] + where[1]] if where else b"")


_NVCC_TEMP_NAME = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}")


def reproducible_digest(data: bytes) -> str:
    """sha256 of a shared object with nvcc's temporary-file names blanked out.

    nvcc names its intermediate files after its process id (tmpxft_<pid>_<n>-..cudafe1.cpp), and the
    host compiler writes that name into the object (a local static-initialiser symbol and the source
    file name): two builds of the same inputs differ in those bytes only, depending on how many
    processes ran before nvcc. The names keep their length, so every other byte stays in place."""
    return hashlib.sha256(_NVCC_TEMP_NAME.sub(b"tmpxft_" + b"0" * 8 + b"_" + b"0" * 8, data)).hexdigest()
