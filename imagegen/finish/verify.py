"""Verify a wheel: its name parses, and every CUDA extension in it carries the requested archs.

The archs are read from the fat binary that nvcc embeds in each shared object (the ``.nv_fatbin``
ELF section of a Linux .so, the ``.nv_fatb`` PE section of a Windows .pyd or .dll): a container of entries, each a cubin (SASS for one ``sm_XY``) or PTX (for one
``compute_XY``). When ``cuobjdump`` is available (PyPI ``nvidia-cuda-cuobjdump``) its listing is
used as well for .so files and must agree (it finds no device code in a PE image); the reader below needs nothing but the standard library.

What verify says about each extension:

- its archs, each once: a fatbin holds one entry per arch *per translation unit* (24 kernel files
  compiled for sm_90 give 24 sm_90 cubins), so the listing is deduplicated, SASS first, then PTX
  (``sm_80, sm_90a, compute_90a``); a count is shown only where the archs' counts differ (one
  file compiled for fewer archs than the others);
- ``missing``: a requested arch without its SASS (or PTX, where +PTX was asked): a failure;
- ``extra``: an arch present that no requested arch names, e.g. sm_80 and sm_86 in a wheel built
  with ``--arch 9.0``: the build ignored the arch list or compiles a hard-coded one. A warning
  (the wheel still runs where it was meant to run), a failure with ``strict=True`` (``imagegen
  verify --strict``). PTX of a requested arch is not extra even without +PTX: packages such as
  flash-attn always embed the newest requested arch's PTX (their recipes say ``ptx: newest``).

Matching is exact by arch number and variant; a variant the reader could not see (a SASS entry
without cuobjdump, a compressed PTX) matches any. Coverage (a plain sm_80 cubin also runs on 8.6,
an ``f`` target on its family) is the caller's business: pass the archs the build should emit,
as ``cell_rules.expected_archs`` (``Cell.expected_archs``) computes them, not the GPUs to run on.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from imagegen import untrusted
from imagegen.errors import ImagegenError, Unreadable, VerifyError
from imagegen.finish.fatbin import (
    MAX_SO_BYTES,
    SPOOL_BYTES,
    FatbinEntry,
    cuobjdump_entries,
    extension_machine,
    extension_section_table,
    fatbin_entries_at,
    fatbin_section,
    wheel_machines,
)
from imagegen.finish.check import recipe_for
from imagegen.model.arch import ArchList, CudaArch
from imagegen.model.catalogue import Catalogue
from imagegen.model.cell_rules import compiled_archs, expected_archs
from imagegen.shipped.builder.imagegen_wheeltools import find_cuobjdump, so_module

# --------------------------------------------------------------------------------------------
# Wheel verification

# A Windows wheel's extension modules (.pyd) and the DLLs beside them: PE images, `.nv_fatb` section.
WINDOWS_EXTENSION = re.compile(r"\.(pyd|dll)$", re.IGNORECASE)


def _order(e: FatbinEntry) -> tuple:
    return (e.kind != "sass", e.arch, e.variant or "")


@dataclass
class SoReport:
    name: str
    entries: list[FatbinEntry]  # every entry of the fatbin, repeats included
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # archs present that were not requested

    def counts(self) -> dict[str, int]:
        """Each arch once (SASS by arch, then PTX by arch) -> how many entries carry it."""
        out: dict[str, int] = {}
        for e in sorted(self.entries, key=_order):
            out[str(e)] = out.get(str(e), 0) + 1
        return out

    @property
    def archs(self) -> list[str]:
        """The archs this extension carries, each once: ``['sm_80', 'sm_90a', 'compute_90a']``."""
        return list(self.counts())

    def summary(self) -> str:
        """The archs once each. Counts only where they differ: every kernel file compiled for the
        same archs gives ``sm_80, sm_90``; one file built for sm_80 only gives ``sm_80 x24, sm_90 x23``."""
        counts = self.counts()
        if len(set(counts.values())) <= 1:
            return ", ".join(counts)
        return ", ".join(f"{k} x{n}" for k, n in counts.items())

    def extra_line(self) -> str | None:
        if not self.extra:
            return None
        return (f"{self.name} also carries {', '.join(self.extra)}, not requested: the build ignored --arch"
                " or compiles a hard-coded list")


@dataclass
class WheelReport:
    wheel: str
    distribution: str
    version: str
    tags: list[str]
    extensions: list[SoReport]
    problems: list[str]
    imports: dict | None = None  # module -> "ok" / "skipped: ..." when an import test ran
    warnings: list[str] = field(default_factory=list)  # one line per extension with extra archs (not strict)
    gpu_check: dict | None = None  # what `imagegen verify --gpu` ran (imagegen.finish.check.CheckResult.as_dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        """What `verify --json` prints and builds record in manifest.json. ``archs`` lists each
        arch once; ``entries`` counts the fatbin entries behind each; ``extra`` the archs present
        but not requested (also one line each in ``warnings``, or in ``problems`` when strict)."""
        return {
            "wheel": self.wheel, "distribution": self.distribution, "version": self.version, "tags": self.tags,
            "ok": self.ok, "problems": self.problems, "warnings": self.warnings, "imports": self.imports,
            "extensions": [{"name": s.name, "archs": s.archs, "entries": s.counts(), "missing": s.missing,
                            "extra": s.extra} for s in self.extensions],
            **({"gpu_check": self.gpu_check} if self.gpu_check is not None else {}),
        }


def _listing(entries: list[FatbinEntry]) -> str:
    """Every arch with its count (``sm_80 x2, sm_90``): two listings of the same fatbin must agree on both."""
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in SoReport("", entries).counts().items())


def _matches(e: FatbinEntry, want: CudaArch) -> bool:
    return e.arch == want.number and e.variant in (None, want.variant)


def _satisfied(want: CudaArch, entries: list[FatbinEntry]) -> list[str]:
    missing = []
    if want.sass and not any(e.kind == "sass" and _matches(e, want) for e in entries):
        missing.append(want.sm)
    if want.ptx and not any(e.kind == "ptx" and _matches(e, want) for e in entries):
        missing.append(want.compute)
    return missing


def _extra(entries: list[FatbinEntry], expected: ArchList) -> list[str]:
    """The archs in ``entries``, each once, that no requested arch names. SASS needs a request with
    SASS; PTX any request of its arch (see the module docstring)."""
    out: dict[str, None] = {}
    for e in sorted(entries, key=_order):
        wanted = any(_matches(e, w) and (w.sass or e.kind == "ptx") for w in expected)
        if not wanted:
            out[str(e)] = None
    return list(out)


def expected_for_wheel(cat: Catalogue | None, wheel: Path, archs: ArchList) -> tuple[ArchList, dict]:
    """What ``wheel`` must carry for the request ``archs``, seen through the recipe that builds its
    distribution (the version whose label is the wheel's version, else the default one): the
    request mapped the way the package compiles it (SageAttention builds 9.0 as sm_90a; flash-attn's
    8.6 runs the sm_80 cubin), and the per-extension knowledge (_qattn_sm90: 9.0a only). A wheel no
    recipe knows is held to the request as written, in every extension."""
    if cat is None:
        return archs, {}
    try:
        dist, version, _, _ = parse_wheel_filename(wheel.name)
        recipe = recipe_for(cat, str(dist))
    except (ImagegenError, ValueError):
        return archs, {}
    chosen = next((v for k, v in recipe.versions.items() if k == version.public), recipe.version(None))
    if chosen.arch.style == "fixed":  # what it compiles depends on the nvcc that built it: take the request
        return archs, dict(chosen.extensions)
    compiled, _ = compiled_archs(chosen, archs)
    return expected_archs(chosen, compiled, Version("99.0")), dict(chosen.extensions)


def verify_wheel(path: Path, expected: ArchList | None, *, cuobjdump: str | None = "auto",
                 strict: bool = False, extension_archs: Mapping[str, ArchList] | None = None) -> WheelReport:
    """Check ``path``: a valid wheel name, and each CUDA .so carrying every arch in ``expected``.

    ``extension_archs`` (the recipe's per-extension knowledge, RecipeVersion.extensions): an extension
    listed there must carry only the requested archs its kernels can target (SageAttention's
    _qattn_sm90 carries sm_90a alone in a multi-arch wheel, and that is right).
    Archs present but not in ``expected`` are listed per extension (``SoReport.extra``) and said in
    one line each: a warning, or a problem (the report is not ok) with ``strict``."""
    try:
        dist, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise VerifyError(f"{path.name}: not a valid wheel file name ({exc})") from None
    exe = find_cuobjdump() if cuobjdump == "auto" else cuobjdump
    problems: list[str] = []
    warnings: list[str] = []
    reports: list[SoReport] = []
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, OverflowError, NotImplementedError) as exc:
        raise VerifyError(f"{path}: not a readable wheel ({exc.__class__.__name__})") from None
    found: list[tuple[str, list[FatbinEntry], Path | None]] = []  # (name in the wheel, native entries, extracted copy)
    # The processor the wheel's platform tag names: every extension must be code for it (an x86_64 .so
    # in a wheel tagged aarch64 installs, then fails to load).
    machines = wheel_machines(t.platform for t in tags)
    # Extensions are spooled one at a time, and kept for cuobjdump: all of them together stay bounded.
    shared = sum(i.file_size for i in zf.infolist() if re.search(r"\.so(\.\d+)*$|\.(pyd|dll)$", i.filename, re.I))
    if shared > untrusted.MAX_UNPACKED_BYTES:
        zf.close()
        raise VerifyError(f"{path}: its extensions unpack to {shared} bytes, more than the"
                          f" {untrusted.MAX_UNPACKED_BYTES >> 30} GiB a wheel may have: not read")
    with zf, tempfile.TemporaryDirectory(prefix="imagegen-verify-") as tmp:
        for info in zf.infolist():
            windows = bool(WINDOWS_EXTENSION.search(info.filename))
            if not windows and not re.search(r"\.so(\.\d+)*$", info.filename):
                continue
            # cuobjdump on Linux finds no device code in a PE image: the native reader alone reads those.
            keep = Path(tmp) / f"{len(found)}.so" if exe and not windows else None
            try:
                entries, extracted, machine = _read_extension(zf, info, keep)
            except VerifyError as exc:
                problems.append(f"{info.filename}: {exc}")
                continue
            if machines and machine not in machines:
                problems.append(f"{info.filename} is {machine} code, but the wheel's platform tag says"
                                f" {' or '.join(sorted(machines))}")
            if entries is not None:  # None: a CPU-only helper library
                found.append((info.filename, entries, extracted))
        # One cuobjdump per .so, side by side: a wheel like SageAttention's has ten, ~0.3 s each.
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            listings = list(pool.map(lambda f: cuobjdump_entries(f[2], exe) if f[2] else [], found))
    for (name, entries, _), listed in zip(found, listings):
        if listed:
            # cuobjdump knows the a/f variants; the native reader knows compression.
            if sorted((e.kind, e.arch) for e in listed) != sorted((e.kind, e.arch) for e in entries):
                problems.append(f"{name}: fatbin reader and cuobjdump disagree "
                                f"({_listing(entries)} vs {_listing(listed)})")
            entries = listed
        report = SoReport(name, entries)
        if expected:
            allowed = (extension_archs or {}).get(so_module(name))
            for want in expected:
                if allowed is not None and want.cc not in {a.cc for a in allowed}:
                    continue  # this extension has no kernels for that arch (the recipe says so)
                report.missing += _satisfied(want, entries)
            report.extra = _extra(entries, expected)
        if report.missing:
            problems.append(f"{name} lacks {', '.join(report.missing)} (has {', '.join(report.archs) or 'nothing'})")
        line = report.extra_line()
        if line:
            (problems if strict else warnings).append(line)
        reports.append(report)
    if expected and not reports:
        problems.append("the wheel contains no CUDA extension (.so or .pyd with a fat binary section)")
    return WheelReport(wheel=path.name, distribution=str(dist), version=str(version),
                       tags=sorted(str(t) for t in tags), extensions=reports, problems=problems, warnings=warnings)


def _read_extension(zf: zipfile.ZipFile, info: zipfile.ZipInfo,
                    keep: Path | None) -> tuple[list[FatbinEntry] | None, Path | None, str]:
    """The fatbin entries of one .so in the wheel (None: no .nv_fatbin section) and the processor its
    code is for (x86_64, aarch64, ...), streamed out of the
    zip (memory up to SPOOL_BYTES, then a temporary file) and read with bounded reads; with ``keep``,
    a copy there for cuobjdump. Anything unreadable is a VerifyError (a problem of this wheel)."""
    try:  # its declared size and compression (a zip bomb); the bytes are counted below as well
        untrusted.validate_member(info, limit=MAX_SO_BYTES)
    except Unreadable as exc:
        raise VerifyError(f"{exc}: not read") from None
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, dir=keep.parent if keep else None) as buf:
        try:
            with zf.open(info) as src:
                total = 0
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > MAX_SO_BYTES or total > info.file_size:
                        raise VerifyError(f"inflates past its declared {info.file_size} bytes or the"
                                          f" {MAX_SO_BYTES >> 30} GiB an extension may have")
                    buf.write(chunk)
        except (OSError, EOFError, RuntimeError, NotImplementedError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
            raise VerifyError(f"cannot be read from the wheel ({exc.__class__.__name__})") from None
        try:
            sections = extension_section_table(buf, total)
            machine = extension_machine(buf, total)
        except VerifyError as exc:
            raise VerifyError(f"not an ELF or PE shared object ({exc})") from None
        except (struct.error, ValueError, OverflowError):
            raise VerifyError("not an ELF or PE shared object (malformed headers)") from None
        where = fatbin_section(sections)
        if where is None:
            return None, None, machine
        offset, size = where
        try:
            entries = fatbin_entries_at(buf, offset, size)
        except (struct.error, ValueError, OverflowError):
            raise VerifyError("malformed fat binary section") from None
        if keep is not None:
            buf.seek(0)
            with keep.open("wb") as out:
                shutil.copyfileobj(buf, out, 1 << 20)
        return entries, keep, machine


__all__ = ["SoReport", "VerifyError", "WheelReport", "verify_wheel"]


