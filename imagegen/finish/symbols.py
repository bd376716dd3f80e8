"""What an ELF shared object says of its dynamic linking: the libraries it needs (DT_NEEDED), the
symbols it needs from them (undefined in its ``.dynsym``, each with the library its symbol version
names, where it has one) and the symbols it exports. ``imagegen reuse`` (imagegen.finish.reuse) reads
a wheel's extensions and a torch install's libraries with it.

Read with pyelftools where it is installed (the publish extra brings it), else with binutils'
``nm -D`` and ``readelf -d``. Every read is bounded: the file's size (MAX_ELF_BYTES), the number of
symbols (MAX_SYMBOLS) and the time (a deadline; a tool past it is killed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from imagegen.errors import Unreadable
from imagegen.untrusted import Deadline

MAX_ELF_BYTES = 4 << 30  # torch's largest library, libtorch_cuda.so, is under 1 GiB
MAX_SYMBOLS = 2_000_000  # libtorch_cpu.so exports about 80,000
MAX_DEMANGLED = 2000  # names given to c++filt at once at most

# Binding and visibility of a symbol another object can bind to.
_BINDS = ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE", "STB_LOOS")
_VISIBLE = ("STV_DEFAULT", "STV_PROTECTED")


@dataclass(frozen=True)
class ElfLinks:
    """One shared object's dynamic linking, as read."""

    path: Path
    needed: tuple[str, ...]  # DT_NEEDED, in order
    undefined: dict[str, str | None]  # strong undefined symbol -> what its version names (a library, or the
    # version itself where only that is known: nm), None when unversioned
    weak_undefined: frozenset[str]  # weak undefined symbols: their absence is allowed
    exports: frozenset[str]  # defined symbols another object can bind to
    runpath: tuple[str, ...] = ()  # DT_RUNPATH / DT_RPATH entries, $ORIGIN not expanded


def check_time(deadline: Deadline, what: str) -> None:
    """Unreadable once ``deadline`` has passed: ``what`` was not read."""
    if deadline.left() <= 0:
        raise Unreadable(f"{what}: not read within the {deadline.seconds:.0f} s the check may take")


def has_pyelftools() -> bool:
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return False
    return ELFFile is not None


def read_links(path: Path, *, deadline: Deadline, reader: str = "auto") -> ElfLinks:
    """``path``'s dynamic linking (see ElfLinks); Unreadable says why it cannot be read (not an ELF
    file, too large, too many symbols, out of time, no reader here). ``reader``: "elftools", "nm",
    or "auto" (pyelftools where installed, else nm)."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc.strerror or exc.__class__.__name__})") from None
    if size > MAX_ELF_BYTES:
        raise Unreadable(f"{size} bytes: larger than the {MAX_ELF_BYTES >> 30} GiB a shared object may have here")
    with open(path, "rb") as fh:
        if fh.read(4) != b"\x7fELF":
            raise Unreadable("not an ELF shared object")
    check_time(deadline, path.name)
    if reader == "auto":
        reader = "elftools" if has_pyelftools() else "nm"
    if reader == "elftools":
        return _read_elftools(path, deadline)
    if reader == "nm":
        return _read_nm(path, deadline)
    raise ValueError(f"unknown ELF reader {reader!r}")


def _read_elftools(path: Path, deadline: Deadline) -> ElfLinks:
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection

    needed: list[str] = []
    runpath: list[str] = []
    undefined: dict[str, str | None] = {}
    weak: set[str] = set()
    exports: set[str] = set()
    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            if elf["e_type"] not in ("ET_DYN", "ET_EXEC"):
                raise Unreadable(f"an ELF {elf['e_type']} file, not a shared object")
            dynsym = elf.get_section_by_name(".dynsym")
            versym = versions = None
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)
                        elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                            value = getattr(tag, "runpath", None) or getattr(tag, "rpath", "")
                            runpath += [p for p in value.split(":") if p]
                elif isinstance(section, GNUVerSymSection):
                    versym = section
                elif isinstance(section, GNUVerNeedSection):
                    versions = section
            # The version index of a needed version -> the library that version belongs to.
            library_of: dict[int, str] = {}
            if versions is not None:
                for verneed, auxiliaries in versions.iter_versions():
                    for aux in auxiliaries:
                        library_of[aux["vna_other"]] = verneed.name
            if dynsym is None:
                return ElfLinks(path, tuple(needed), {}, frozenset(), frozenset(), tuple(runpath))
            count = dynsym.num_symbols()
            if count > MAX_SYMBOLS:
                raise Unreadable(f"{count} dynamic symbols: more than the {MAX_SYMBOLS} read here")
            for index, sym in enumerate(dynsym.iter_symbols()):
                if index % 20000 == 0:
                    check_time(deadline, path.name)
                name = sym.name
                info = sym["st_info"]
                if not name or info["bind"] not in _BINDS or info["type"] in ("STT_SECTION", "STT_FILE"):
                    continue
                if sym["st_shndx"] == "SHN_UNDEF":
                    if info["bind"] == "STB_WEAK":
                        weak.add(name)
                        continue
                    version = None
                    if versym is not None:
                        ndx = versym.get_symbol(index)["ndx"]
                        if isinstance(ndx, int) and ndx > 1:
                            version = library_of.get(ndx & 0x7FFF, "versioned")
                    undefined[name] = version
                elif sym["st_other"]["visibility"] in _VISIBLE:
                    exports.add(name)
    except (ELFError, OSError, ValueError, KeyError, AttributeError, IndexError, TypeError) as exc:
        raise Unreadable(f"not a readable ELF shared object ({exc.__class__.__name__}: {str(exc)[:120]})") from None
    except Exception as exc:  # pyelftools raises construct's own errors on a truncated file
        if exc.__class__.__module__.split(".")[0] not in ("construct", "elftools"):
            raise
        raise Unreadable(f"not a readable ELF shared object ({exc.__class__.__name__})") from None
    return ElfLinks(path, tuple(needed), undefined, frozenset(weak), frozenset(exports), tuple(runpath))


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise Unreadable(f"neither pyelftools nor binutils' {name} is here to read it"
                         " (pip install pyelftools, or apt-get install binutils)")
    return exe


def _run_tool(argv: list[str], deadline: Deadline, what: str) -> str:
    left = deadline.left()
    if left <= 0:
        check_time(deadline, what)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=left)
    except subprocess.TimeoutExpired:
        raise Unreadable(f"{what}: {Path(argv[0]).name} did not finish within the {deadline.seconds:.0f} s the"
                         " check may take") from None
    except OSError as exc:
        raise Unreadable(f"{what}: cannot run {argv[0]} ({exc.strerror or exc})") from None
    if proc.returncode != 0:
        raise Unreadable(f"not a readable ELF shared object ({Path(argv[0]).name}:"
                         f" {(proc.stderr.strip().splitlines() or ['exit %d' % proc.returncode])[-1][:160]})")
    return proc.stdout


_NEEDED = re.compile(r"\((NEEDED|RUNPATH|RPATH)\)\s+[^\[]*\[([^\]]*)\]")


def _read_nm(path: Path, deadline: Deadline) -> ElfLinks:
    nm, readelf = _tool("nm"), _tool("readelf")
    needed: list[str] = []
    runpath: list[str] = []
    for kind, value in _NEEDED.findall(_run_tool([readelf, "-d", "-W", str(path)], deadline, path.name)):
        if kind == "NEEDED":
            needed.append(value)
        else:
            runpath += [p for p in value.split(":") if p]
    undefined: dict[str, str | None] = {}
    weak: set[str] = set()
    exports: set[str] = set()
    lines = _run_tool([nm, "-D", "--with-symbol-versions", str(path)], deadline, path.name).splitlines()
    if len(lines) > MAX_SYMBOLS:
        raise Unreadable(f"{len(lines)} dynamic symbols: more than the {MAX_SYMBOLS} read here")
    for line in lines:
        parts = line.split()
        if len(parts) == 2:  # "U name@VERSION", "w name": undefined (no address)
            kind, name = parts
        elif len(parts) == 3:
            kind, name = parts[1], parts[2]
        else:
            continue
        base, _, version = name.partition("@")
        version = version.lstrip("@") or None
        if kind == "U":
            undefined[base] = version
        elif kind in ("w", "v") and len(parts) == 2:
            weak.add(base)
        elif kind.upper() in ("T", "D", "B", "R", "V", "W", "I", "U", "G", "S") or kind in ("u", "i"):
            exports.add(base)
    return ElfLinks(path, tuple(needed), undefined, frozenset(weak), frozenset(exports), tuple(runpath))


def demangle(names: list[str], *, deadline: Deadline) -> dict[str, str]:
    """Each C++ name as c++filt writes it (``c10::impl::cow::materialize_cow_storage(c10::StorageImpl&)``);
    a name it does not change, or every name where c++filt is not here or too slow, stays as it is."""
    exe = shutil.which("c++filt")
    out = {n: n for n in names}
    if exe is None:
        return out
    todo = [n for n in names if n.startswith("_Z")]
    for start in range(0, len(todo), MAX_DEMANGLED):
        chunk = todo[start:start + MAX_DEMANGLED]
        left = min(deadline.left(), 60.0)
        if left <= 0:
            break
        try:
            proc = subprocess.run([exe], input="\n".join(chunk) + "\n", capture_output=True, text=True,
                                  errors="replace", timeout=left)
        except (subprocess.TimeoutExpired, OSError):
            break
        lines = proc.stdout.splitlines()
        if proc.returncode == 0 and len(lines) == len(chunk):
            out.update(zip(chunk, lines))
    return out
