"""GPU architectures: one normalised model, many formatters.

Every CUDA-extension package has its own knob for "which GPUs to compile for", each with its own
syntax: xformers and SageAttention read ``TORCH_CUDA_ARCH_LIST`` ("8.0;9.0a;12.0+PTX"),
FlashAttention and Block-Sparse-Attention read ``*_CUDA_ARCHS`` ("80;90;120"), NATTEN reads
``NATTEN_CUDA_ARCH`` ("8.0;9.0"), CMake projects read ``CMAKE_CUDA_ARCHITECTURES``
("90a-real;120-virtual") and hand-written setup.py files want ``-gencode`` flags (see
recipes.md §2.12). Users, on their side, write whichever notation they know, or just "H100".

So the request is parsed once (arch_parse.parse_arch_list) into an :class:`ArchList` of
:class:`CudaArch` entries, this module's model with the notations of one entry; the checks that
need facts (which nvcc compiles which ``sm_XY``, which torch accepts which value: arch_rules) are
answered from ``resources/compat/archs.yaml`` (arch_data); and a formatter per consumer
(arch_format) writes the list back out, refusing with a one-line :class:`ArchError` when that
consumer cannot express the request instead of silently dropping part of it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from packaging.version import Version

from imagegen.errors import ArchError

__all__ = ["ArchList", "CudaArch"]

_VARIANTS = ("", "a", "f")
# Beyond this an "arch list" is not a list someone typed; refuse before doing any work on it.
MAX_INPUT_CHARS = 1000
# Error messages quote at most this much of a bad token, so they stay readable on one line.
_MAX_QUOTED = 40
FORMS_HINT = (
    "use forms like 8.0, 9.0a, 12.0+PTX, sm_120, compute_120, 10.0f, "
    "or a name such as Hopper or H100"
)
# `a` variants start at Hopper, `f` (family) variants at Blackwell (recipes.md §3.2).
A_MIN_CC = (9, 0)
F_MIN_CC = (10, 0)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@functools.total_ordering
@dataclass(frozen=True)
class CudaArch:
    """One compile target: compute capability, variant, and whether SASS and/or PTX is wanted.

    ``sass`` is the real cubin (``code=sm_XY``); ``ptx`` is the JIT-able intermediate
    (``code=compute_XY``) that lets the binary run on later GPUs.
    """

    major: int
    minor: int
    variant: str = ""
    sass: bool = True
    ptx: bool = False

    def __post_init__(self) -> None:
        # Structural checks only; whether the capability exists is a data question (parse time).
        for name, value in (("major", self.major), ("minor", self.minor)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArchError(f"CudaArch.{name} must be an int, not {value!r}")
        if not 1 <= self.major <= 99 or not 0 <= self.minor <= 9:
            raise ArchError(f"compute capability {self.major}.{self.minor} is out of range")
        if self.variant not in _VARIANTS:
            raise ArchError(f"CudaArch variant must be '', 'a' or 'f', not {self.variant!r}")
        if not (self.sass or self.ptx):
            raise ArchError(f"{self.cc}{self.variant}: an entry needs SASS, PTX or both")

    @property
    def key(self) -> tuple[int, int, str]:
        """Identity for merging and ordering: the flags are what gets merged."""
        return (self.major, self.minor, self.variant)

    # The names one target goes by, e.g. for 9.0a: cc "9.0" (torch, CMake), number 90 (ordering,
    # numeric lists), code "90a" (gencode), sm "sm_90a" (SASS), compute "compute_90a" (PTX).
    @property
    def cc(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    @property
    def code(self) -> str:
        return f"{self.number}{self.variant}"

    sm = property(lambda self: f"sm_{self.code}")
    compute = property(lambda self: f"compute_{self.code}")

    def __str__(self) -> str:
        if not self.sass:
            return self.compute
        return f"{self.cc}{self.variant}{'+PTX' if self.ptx else ''}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, CudaArch):
            return NotImplemented
        return self.key < other.key


class ArchList:
    """An immutable, sorted list of :class:`CudaArch` with one entry per (major, minor, variant).

    Entries for the same target merge their flags, which is what makes a user's
    ``compute_80;sm_80`` come out as ``8.0+PTX``.
    """

    __slots__ = ("_entries",)
    _entries: tuple[CudaArch, ...]

    def __init__(self, entries: Iterable[CudaArch] = ()) -> None:
        merged: dict[tuple[int, int, str], CudaArch] = {}
        for entry in entries:
            if not isinstance(entry, CudaArch):
                raise ArchError(f"ArchList takes CudaArch entries, not {type(entry).__name__}")
            old = merged.get(entry.key)
            if old is not None:
                entry = replace(old, sass=old.sass or entry.sass, ptx=old.ptx or entry.ptx)
            merged[entry.key] = entry
        object.__setattr__(self, "_entries", tuple(sorted(merged.values())))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ArchList is immutable")

    @property
    def entries(self) -> tuple[CudaArch, ...]:
        return self._entries

    @property
    def gencode_targets(self) -> int:
        """How many -gencode outputs (SASS + PTX) nvcc compiles: what its --threads work on."""
        return sum(int(a.sass) + int(a.ptx) for a in self._entries)

    @property
    def has_ptx(self) -> bool:
        return any(entry.ptx for entry in self._entries)

    @property
    def newest(self) -> CudaArch:
        if not self._entries:
            raise ArchError("the GPU architecture list is empty")
        return self._entries[-1]

    def __iter__(self) -> Iterator[CudaArch]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __getitem__(self, index: int) -> CudaArch:
        return self._entries[index]

    def __contains__(self, item: object) -> bool:
        return item in self._entries

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArchList):
            return NotImplemented
        return self._entries == other._entries

    def __hash__(self) -> int:
        return hash(self._entries)

    def __str__(self) -> str:
        return ";".join(str(entry) for entry in self._entries)

    def __repr__(self) -> str:
        return f"ArchList({str(self)!r})"


# --------------------------------------------------------------------------------------------
# Data (archs.yaml), loaded once
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


_DOTTED = re.compile(r"(\d{1,2})\.(\d)([af]?)")
_PREFIXED = re.compile(r"(sm|compute)_?(\d{1,2})(\d)([af]?)")
_CMAKE = re.compile(r"(\d{1,2})(\d)([af]?)-(real|virtual)")
_NUMERIC = re.compile(r"(\d{1,2})(\d)([af]?)")


def quote(token: str) -> str:
    # ascii() shows control characters as escapes, so the message stays one printable line.
    shown = token if len(token) <= _MAX_QUOTED else token[:_MAX_QUOTED] + "..."
    return ascii(shown)


def normalise_gpu(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


def arch_from_notation(low: str) -> CudaArch | None:
    """Syntax only: a lower-cased token in one of the plain notations, or None.

    Returns an entry even for capabilities that do not exist; :func:`arch_error` judges that.
    """
    plus_ptx = low.endswith("+ptx")
    body = low[: -len("+ptx")] if plus_ptx else low
    sass, ptx = True, plus_ptx
    if m := _DOTTED.fullmatch(body):
        major, minor, variant = m.groups()
    elif m := _PREFIXED.fullmatch(body):
        prefix, major, minor, variant = m.groups()
        # compute_XY is PTX only; a "+PTX" on it changes nothing.
        sass, ptx = (True, plus_ptx) if prefix == "sm" else (False, True)
    elif m := _CMAKE.fullmatch(body):
        major, minor, variant, kind = m.groups()
        sass, ptx = (True, plus_ptx) if kind == "real" else (False, True)
    elif m := _NUMERIC.fullmatch(body):
        major, minor, variant = m.groups()
    else:
        return None
    if int(major) == 0:
        return None
    return CudaArch(int(major), int(minor), variant, sass=sass, ptx=ptx)


# --------------------------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------------------------


def minor_of(version: Version) -> tuple[int, int]:
    # Compare toolkits and torch releases by major.minor: 12.9.1 is still "12.9" for nvcc's
    # target list, and torch 2.8.0+cu128 is "2.8" for its arch table.
    release = version.release + (0, 0)
    return (release[0], release[1])


def fmt_minor(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


# --------------------------------------------------------------------------------------------
# nvcc
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------


def torch_key(arch: CudaArch) -> str:
    return f"{arch.cc}{arch.variant}"


# --------------------------------------------------------------------------------------------
# Formatters
# --------------------------------------------------------------------------------------------


