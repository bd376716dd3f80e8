"""The C++ standard a build compiles torch's headers under, and what each torch series requires.

A package's setup.py often hard-codes the standard (``extra_compile_args``: ``-std=c++17`` for the
host compiler and nvcc, ``/std:c++17`` for MSVC). torch's cpp_extension adds its own default only
when no ``-std`` is given, so a hard-coded one wins; and torch 2.14's headers ``#error`` below
C++20. This module reads every spelling of the flag (as compilers take it, and as nvcc passes it
on to the host compiler) and judges a standard against the series' minimum. The minimums are data
(resources/compat/torch.yaml: ``cxx_std``, ``cxx_std_min``, ``cxx_std_min_msvc``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from imagegen.model.compat import TorchSeries

# The value of -std / /std: c++17, gnu++2a, c++latest (MSVC). Draft names count as their standard.
_VALUE = re.compile(r"(?:c|gnu)\+\+(\d\d|0x|1y|1z|2a|2b|2c|latest)", re.IGNORECASE)
_YEARS = {"98": 1998, "03": 2003, "0x": 2011, "11": 2011, "1y": 2014, "14": 2014, "1z": 2017, "17": 2017,
          "2a": 2020, "20": 2020, "2b": 2023, "23": 2023, "2c": 2026, "26": 2026}
LATEST = 9999  # MSVC's /std:c++latest: newer than any standard a minimum names
# Options whose value nvcc hands to the host compiler (comma-separated options).
_HOST_OPTIONS = ("-Xcompiler", "--compiler-options")
# Options that set the standard, with the value after `=` / `:` or as the next argument.
_STD_OPTIONS = ("-std", "--std")


@dataclass(frozen=True)
class CxxStd:
    """One standard a compile asks for: its year (2017) and the flag as written (-std=c++17)."""

    year: int
    flag: str
    # True when nvcc hands it to the host compiler (-Xcompiler -std=c++17), not nvcc's own option.
    host: bool = False

    @property
    def short(self) -> int:
        """17 for C++17, the form torch.yaml and recipes write."""
        return self.year % 100 if self.year != LATEST else 99

    def below(self, minimum: int) -> bool:
        """Is this older than C++``minimum`` (17, 20)?"""
        return self.year < standard_year(minimum)


def standard_year(short: int | str) -> int:
    """2020 for 20 or "20"; 1998 for 98."""
    text = f"{int(short):02d}"
    if text not in _YEARS:
        raise ValueError(f"C++{short} is not a C++ standard")
    return _YEARS[text]


def parse_value(value: str) -> int | None:
    """The year of a standard's name: c++17 -> 2017, gnu++2a -> 2020, c++latest -> LATEST; None for
    anything else (c11, a typo)."""
    m = _VALUE.fullmatch(value.strip().strip('"\''))
    if not m:
        return None
    key = m.group(1).lower()
    return LATEST if key == "latest" else _YEARS.get(key)


def _one(option: str, value: str | None, host: bool) -> CxxStd | None:
    """The standard an option names (``-std=c++17``, ``/std:c++20``, ``-std`` with ``value``)."""
    text = option
    if value is not None:
        text = f"{option}={value}"
    for prefix in ("-std=", "--std=", "/std:", "-std:"):
        if text.startswith(prefix):
            year = parse_value(text[len(prefix):])
            return CxxStd(year, text, host) if year is not None else None
    return None


def standards(argv: Sequence[str]) -> list[CxxStd]:
    """Every standard a compiler command line asks for, in order: ``-std=c++17``, ``--std c++17``
    (nvcc), ``-std=gnu++20``, ``/std:c++20`` (MSVC, also as ``-std:``), and the host compiler's through
    nvcc (``-Xcompiler -std=c++17``, ``-Xcompiler=/std:c++17``, ``--compiler-options "-O3,-std=c++17"``)."""
    out: list[CxxStd] = []
    i = 0
    while i < len(argv):
        a = str(argv[i])
        nxt = str(argv[i + 1]) if i + 1 < len(argv) else None
        host_value = None
        for opt in _HOST_OPTIONS:
            if a == opt:
                host_value, i = nxt or "", i + 1
            elif a.startswith(opt + "="):
                host_value = a[len(opt) + 1:]
        if host_value is not None:
            parts = [p for p in re.split(r"[,\s]+", host_value.strip('"\'')) if p]
            j = 0
            while j < len(parts):
                value = parts[j + 1] if parts[j] in _STD_OPTIONS and j + 1 < len(parts) else None
                found = _one(parts[j], value, True)
                if found is not None:
                    out.append(found)
                j += 2 if value is not None else 1
            i += 1
            continue
        if a in _STD_OPTIONS and nxt is not None:
            found = _one(a, nxt, False)
            i += 1
        else:
            found = _one(a, None, False)
        if found is not None:
            out.append(found)
        i += 1
    return out


def effective(argv: Sequence[str]) -> CxxStd | None:
    """The lowest standard one compile really uses: the last of nvcc's own options and the last of
    those handed to the host compiler (each overrides the ones before it), the older of the two
    (torch's headers are compiled by both). None where the command line names none (the compiler's
    own default, which torch's cpp_extension never leaves: it adds its own -std then)."""
    found = standards(argv)
    last = {}
    for s in found:
        last[s.host] = s
    if not last:
        return None
    return min(last.values(), key=lambda s: s.year)


@dataclass(frozen=True)
class Finding:
    """A standard judged against a torch series: ``refuse`` (the headers do not compile under it) or
    ``warn`` (they compile, but torch's own extensions use a newer one)."""

    kind: str
    text: str


def judge(what: str, std: CxxStd, series: TorchSeries, *, msvc: bool = False, fix: str = "") -> Finding | None:
    """``what`` (an extension, a recipe version) compiling with ``std`` against ``series``' headers.

    With GCC/Clang/nvcc (``msvc`` False) below ``cxx_std_min`` is refused; below torch's own default
    (``cxx_std``) it builds, with a warning; with MSVC below ``cxx_std_min_msvc`` is refused. ``fix``
    says what to do instead (the default: a recipe fix or a release that follows torch)."""
    fix = fix or ("use a recipe fix (by_torch patch) or the package's release that picks the standard from torch")
    minimum = series.min_cxx_std(msvc)
    if std.below(minimum):
        compiler = " with MSVC" if msvc and minimum > series.min_cxx_std(False) else ""
        return Finding("refuse", f"{what} compiles with {std.flag} but torch {series.series}'s headers require"
                                 f" C++{minimum} or later{compiler}: {fix}")
    default = int(series.cxx_std)
    if not msvc and std.below(default):
        msvc_min = series.min_cxx_std(True)
        windows = f"; MSVC (Windows) needs C++{msvc_min}" if std.below(msvc_min) else ""
        return Finding("warn", f"{what} compiles with {std.flag}: torch {series.series} builds its own extensions"
                               f" as C++{default}; its headers still compile as C++{std.short} with GCC{windows}")
    return None


__all__ = ["CxxStd", "Finding", "LATEST", "effective", "judge", "parse_value", "standard_year", "standards"]
