"""GPU architectures: one normalised model, many formatters.

Every CUDA-extension package has its own knob for "which GPUs to compile for", each with its own
syntax: xformers and SageAttention read ``TORCH_CUDA_ARCH_LIST`` ("8.0;9.0a;12.0+PTX"),
FlashAttention and Block-Sparse-Attention read ``*_CUDA_ARCHS`` ("80;90;120"), NATTEN reads
``NATTEN_CUDA_ARCH`` ("8.0;9.0"), CMake projects read ``CMAKE_CUDA_ARCHITECTURES``
("90a-real;120-virtual") and hand-written setup.py files want ``-gencode`` flags (see
recipes.md §2.12). Users, on their side, write whichever notation they know, or just "H100".

So the request is parsed once, by :func:`parse_arch_list`, into an :class:`ArchList` of
:class:`CudaArch` entries; the checks that need facts (which nvcc compiles which ``sm_XY``, which
torch accepts which value) are answered from ``resources/compat/archs.yaml``; and a formatter per
consumer writes the list back out, refusing with a one-line :class:`ArchError` when that consumer
cannot express the request instead of silently dropping part of it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from importlib.resources import files
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from imagegen import yamlio
from imagegen.errors import ArchError, UsageError
from imagegen.resources.builder import imagegen_rules as rules

__all__ = [
    "ArchInfo",
    "ArchList",
    "CudaArch",
    "arch_info",
    "format_for",
    "known_ccs",
    "min_cuda_for",
    "nvcc_problems",
    "parse_arch_list",
    "parse_cuda_version",
    "to_cmake",
    "to_dotted_list",
    "to_gencode",
    "to_numeric_list",
    "to_torch_arch_list",
    "torch_problems",
]

_VARIANTS = ("", "a", "f")
# Beyond this an "arch list" is not a list someone typed; refuse before doing any work on it.
_MAX_INPUT_CHARS = 1000
# Error messages quote at most this much of a bad token, so they stay readable on one line.
_MAX_QUOTED = 40
_FORMS_HINT = (
    "use forms like 8.0, 9.0a, 12.0+PTX, sm_120, compute_120, 10.0f, "
    "or a name such as Hopper or H100"
)
# `a` variants start at Hopper, `f` (family) variants at Blackwell (recipes.md §3.2).
_A_MIN_CC = (9, 0)
_F_MIN_CC = (10, 0)


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

    @property
    def cc(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    @property
    def code(self) -> str:
        return f"{self.number}{self.variant}"

    @property
    def sm(self) -> str:
        return f"sm_{self.code}"

    @property
    def compute(self) -> str:
        return f"compute_{self.code}"

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

    Entries for the same target merge their flags, which is what makes the seed document's
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


@dataclass(frozen=True)
class ArchInfo:
    """What archs.yaml says about one compute capability."""

    cc: str
    generation: str
    gpus: tuple[str, ...]
    min_cuda: Version
    max_cuda: Version | None = None
    dropped_in: Version | None = None
    a_min_cuda: Version | None = None
    note: str | None = None


@dataclass(frozen=True)
class _ArchData:
    infos: Mapping[str, ArchInfo]
    family_min_cuda: Version
    named: Mapping[str, tuple[CudaArch, ...]]  # lower-cased name -> expansion
    gpus: Mapping[str, CudaArch]  # normalised product name -> SASS-only entry
    # (torch major.minor the state starts at, values accepted from then on), oldest first
    torch_states: tuple[tuple[tuple[int, int], frozenset[str]], ...]


@functools.cache
def _data() -> _ArchData:
    resource = files("imagegen") / "resources/compat/archs.yaml"
    try:
        raw = yamlio.load(resource.read_text(encoding="utf-8"))
    except (OSError, yamlio.YAMLError) as exc:
        raise ArchError(f"cannot read the packaged archs.yaml: {exc}") from exc
    try:
        return _build_data(raw)
    except (KeyError, TypeError, ValueError, AttributeError, InvalidVersion) as exc:
        # A packaging bug, but still reported through the typed error the CLI knows.
        raise ArchError(f"the packaged archs.yaml is broken: {exc!r}") from exc


def _opt_version(value: Any) -> Version | None:
    return None if value is None else Version(str(value))


def _build_data(raw: dict[str, Any]) -> _ArchData:
    infos: dict[str, ArchInfo] = {}
    for item in raw["archs"]:
        info = ArchInfo(
            cc=str(item["cc"]),
            generation=str(item["generation"]),
            gpus=tuple(str(gpu) for gpu in item.get("gpus", ())),
            min_cuda=Version(str(item["min_cuda"])),
            max_cuda=_opt_version(item.get("max_cuda")),
            dropped_in=_opt_version(item.get("dropped_in")),
            a_min_cuda=_opt_version(item.get("a_min_cuda")),
            note=item.get("note"),
        )
        if not re.fullmatch(r"\d{1,2}\.\d", info.cc) or info.cc in infos:
            raise ValueError(f"bad or duplicate cc {info.cc!r}")
        if (info.max_cuda is None) != (info.dropped_in is None):
            raise ValueError(f"cc {info.cc}: max_cuda and dropped_in go together")
        infos[info.cc] = info

    def plain(text: str) -> CudaArch:
        # Named expansions and table values use the plain notations only (no names, no GPUs).
        arch = _arch_from_notation(text.strip().lower())
        if arch is None:
            raise ValueError(f"bad arch {text!r}")
        if _arch_error(arch, text, infos) is not None:
            raise ValueError(f"unknown arch {text!r}")
        return arch

    named = {
        str(name).lower(): tuple(plain(part) for part in str(expansion).split(";"))
        for name, expansion in raw["named"].items()
    }
    gpus: dict[str, CudaArch] = {}
    for name, cc in raw["gpus"].items():
        key = _normalise_gpu(str(name))
        # A product alias must never shadow a real notation such as "100" (= 10.0).
        if _arch_from_notation(key) is not None or key in named:
            raise ValueError(f"GPU alias {name!r} collides with an arch notation")
        gpus[key] = replace(plain(str(cc)), sass=True, ptx=False)

    states: list[tuple[tuple[int, int], frozenset[str]]] = []
    current: set[str] = set()
    for step in sorted(raw["torch_accepts"], key=lambda s: _minor_of(Version(str(s["since"])))):
        removed = {_torch_key(plain(str(v))) for v in step.get("remove") or ()}
        added = {_torch_key(plain(str(v))) for v in step.get("add") or ()}
        current = (current - removed) | added
        states.append((_minor_of(Version(str(step["since"]))), frozenset(current)))

    return _ArchData(
        infos=infos,
        family_min_cuda=Version(str(raw["family_min_cuda"])),
        named=named,
        gpus=gpus,
        torch_states=tuple(states),
    )


def known_ccs() -> tuple[str, ...]:
    """Every compute capability in archs.yaml, oldest first ("3.5", ..., "12.1")."""
    return tuple(_data().infos)


def arch_info(arch: CudaArch | str) -> ArchInfo:
    """The archs.yaml facts for a compute capability ("9.0") or an entry's capability."""
    cc = arch.cc if isinstance(arch, CudaArch) else str(arch)
    info = _data().infos.get(cc)
    if info is None:
        raise ArchError(f"unknown compute capability {_quote(cc)}: known are {', '.join(known_ccs())}")
    return info


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

# Separators users mix freely: torch uses ';' and spaces, SageAttention also ',' (§3.3).
_LIST_SEP = re.compile(r"[;,]")
_WORD_SEP = re.compile(r"[ \t\r\n]+")
# Everything a valid token can contain; anything else (control characters, quotes, unicode
# look-alike digits) is refused before any lookup.
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._+\-]+")
# Product names may be typed with spaces ("RTX PRO 6000"): try joining up to this many words.
_MAX_GPU_WORDS = 3

_DOTTED = re.compile(r"(\d{1,2})\.(\d)([af]?)")
_PREFIXED = re.compile(r"(sm|compute)_?(\d{1,2})(\d)([af]?)")
_CMAKE = re.compile(r"(\d{1,2})(\d)([af]?)-(real|virtual)")
_NUMERIC = re.compile(r"(\d{1,2})(\d)([af]?)")


def _quote(token: str) -> str:
    # ascii() shows control characters as escapes, so the message stays one printable line.
    shown = token if len(token) <= _MAX_QUOTED else token[:_MAX_QUOTED] + "..."
    return ascii(shown)


def _normalise_gpu(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


def _arch_from_notation(low: str) -> CudaArch | None:
    """Syntax only: a lower-cased token in one of the plain notations, or None.

    Returns an entry even for capabilities that do not exist; :func:`_arch_error` judges that.
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


def _arch_error(arch: CudaArch, token: str, infos: Mapping[str, ArchInfo]) -> str | None:
    """Why a syntactically fine entry is still not a real target, or None."""
    if arch.cc not in infos:
        return (
            f"unknown compute capability {arch.cc} in {_quote(token)}: "
            f"known are {', '.join(infos)}"
        )
    if arch.variant == "a" and (arch.major, arch.minor) < _A_MIN_CC:
        return (
            f"{_quote(token)}: arch-specific (a) targets exist only for compute capability "
            f"9.0 and newer; use {arch.cc}"
        )
    if arch.variant == "f" and (arch.major, arch.minor) < _F_MIN_CC:
        return (
            f"{_quote(token)}: family (f) targets exist only for compute capability "
            f"10.0 and newer; use {arch.cc}"
        )
    return None


def _split_tokens(text: str) -> list[str]:
    """Split on any mix of separators, re-joining space-separated words of a product name."""
    data = _data()
    tokens: list[str] = []
    for chunk in _LIST_SEP.split(text):
        words = [word for word in _WORD_SEP.split(chunk) if word]
        for word in words:
            if not _TOKEN_CHARS.fullmatch(word):
                raise ArchError(f"unknown GPU architecture {_quote(word)}: {_FORMS_HINT}")
        i = 0
        while i < len(words):
            n = _gpu_words_at(words, i, data.gpus)
            tokens.append(" ".join(words[i : i + n]))
            i += n
    return tokens


def _gpu_words_at(words: list[str], i: int, gpus: Mapping[str, CudaArch]) -> int:
    """How many words from ``words[i]`` form one token: >1 only for a spaced product name."""
    # Join only when the first word means nothing alone ("RTX"), so that "50 90" stays
    # 5.0;9.0 and does not become an RTX 5090.
    if _is_token(words[i]):
        return 1
    for n in range(min(_MAX_GPU_WORDS, len(words) - i), 1, -1):
        if _normalise_gpu("".join(words[i : i + n])) in gpus:
            return n
    return 1


def _is_token(word: str) -> bool:
    try:
        _resolve_token(word)
    except ArchError:
        return False
    return True


def _resolve_token(token: str) -> tuple[CudaArch, ...]:
    data = _data()
    low = token.lower()
    if low in data.named:
        return data.named[low]
    plus_ptx = low.endswith("+ptx")
    gpu = data.gpus.get(_normalise_gpu(low[: -len("+ptx")] if plus_ptx else low))
    if gpu is not None:
        return (replace(gpu, ptx=plus_ptx),)
    arch = _arch_from_notation(low)
    if arch is None:
        raise ArchError(f"unknown GPU architecture {_quote(token)}: {_FORMS_HINT}")
    problem = _arch_error(arch, token, data.infos)
    if problem is not None:
        raise ArchError(problem)
    return (arch,)


def parse_arch_list(text: str | Iterable[str]) -> ArchList:
    """Parse any notation users write into one merged, sorted :class:`ArchList`.

    Accepts ``12.0+PTX``, ``12.0``, ``120``, ``sm_120``, ``sm_90a``, ``compute_120`` (PTX only),
    ``10.0f``, ``100f``, ``90a``, CMake ``90a-real``/``120-virtual``, generation names
    (``Hopper``) and product names (``H100``, ``RTX 5090``), separated by any mix of spaces,
    ``;`` and ``,``. Raises only :class:`ArchError`, whatever the input.
    """
    if isinstance(text, str):
        joined = text
    else:
        try:
            items = list(text)
        except TypeError:
            raise ArchError(
                f"a GPU architecture list must be text, not {type(text).__name__}"
            ) from None
        if not all(isinstance(item, str) for item in items):
            raise ArchError("a GPU architecture list must contain only strings")
        joined = ";".join(items)
    if len(joined) > _MAX_INPUT_CHARS:
        raise ArchError(
            f"the GPU architecture list is too long ({len(joined)} characters, "
            f"at most {_MAX_INPUT_CHARS})"
        )
    tokens = _split_tokens(joined)
    if not tokens:
        raise ArchError(f"the GPU architecture list is empty: {_FORMS_HINT}")
    return ArchList(arch for token in tokens for arch in _resolve_token(token))


def _as_arch_list(archs: ArchList | str | Iterable[CudaArch] | Iterable[str]) -> ArchList:
    """Let every public function take a parsed list, raw text, or loose entries."""
    if isinstance(archs, ArchList):
        result = archs
    elif isinstance(archs, str):
        result = parse_arch_list(archs)
    else:
        items = list(archs)
        if items and all(isinstance(item, str) for item in items):
            result = parse_arch_list(items)  # type: ignore[arg-type]
        else:
            result = ArchList(items)  # type: ignore[arg-type]
    if not result:
        raise ArchError(f"the GPU architecture list is empty: {_FORMS_HINT}")
    return result


# --------------------------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------------------------

_CUDA_DOTTED = re.compile(r"(?:cuda[ _-]?)?(\d{1,2}\.\d{1,2}(?:\.\d{1,4})?)")
# "cu128" / "128" / "cuda128": CUDA minors are one digit, so the last digit is the minor.
_CUDA_PACKED = re.compile(r"(?:cu|cuda)?(\d{2})(\d)|(?:cu|cuda)(\d)(\d)")


def parse_cuda_version(text: str | Version) -> Version:
    """"12.8", "12.8.1", "cu128", "128", "cu130" -> Version; anything else -> UsageError."""
    if isinstance(text, Version):
        return text
    if not isinstance(text, str):
        raise UsageError(f"a CUDA version must be text such as 12.8 or cu128, not {text!r}")
    low = text.strip().lower()
    if m := _CUDA_DOTTED.fullmatch(low):
        return Version(m.group(1))
    if m := _CUDA_PACKED.fullmatch(low):
        major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        return Version(f"{int(major)}.{minor}")
    raise UsageError(f"bad CUDA version {_quote(text)}: use forms like 12.8, 12.8.1 or cu128")


def _minor_of(version: Version) -> tuple[int, int]:
    # Compare toolkits and torch releases by major.minor: 12.9.1 is still "12.9" for nvcc's
    # target list, and torch 2.8.0+cu128 is "2.8" for its arch table.
    release = version.release + (0, 0)
    return (release[0], release[1])


def _fmt_minor(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def _torch_minor(torch_version: str | Version) -> tuple[int, int]:
    if isinstance(torch_version, Version):
        return _minor_of(torch_version)
    try:
        return _minor_of(Version(str(torch_version).strip()))
    except InvalidVersion:
        raise UsageError(
            f"bad torch version {_quote(str(torch_version))}: use forms like 2.8 or 2.8.0"
        ) from None


# --------------------------------------------------------------------------------------------
# nvcc
# --------------------------------------------------------------------------------------------


def _target_name(arch: CudaArch) -> str:
    return arch.sm if arch.sass else arch.compute


def _required_cuda(arch: CudaArch, info: ArchInfo) -> Version:
    required = info.min_cuda
    if arch.variant == "a" and info.a_min_cuda is not None:
        required = max(required, info.a_min_cuda)
    elif arch.variant == "f":
        required = max(required, _data().family_min_cuda)
    return required


def _nvcc_problem(arch: CudaArch, cuda: Version) -> str | None:
    data = _data()
    name = _target_name(arch)
    info = data.infos.get(arch.cc)
    if info is None:
        return f"{name} is not a known GPU architecture"
    problem = _arch_error(arch, name, data.infos)
    if problem is not None:
        return problem
    label = {"": name, "a": f"{name} (arch-specific target)", "f": f"{name} (family target)"}
    required = _required_cuda(arch, info)
    if _minor_of(cuda) < _minor_of(required):
        return f"{label[arch.variant]} needs CUDA >= {required}; CUDA {cuda} selected"
    if info.max_cuda is not None and _minor_of(cuda) > _minor_of(info.max_cuda):
        hint = f"use CUDA <= {info.max_cuda} or drop {arch.cc}{arch.variant}"
        if info.note:
            hint += f"; {info.note}"
        return f"{name} was dropped in CUDA {info.dropped_in}; CUDA {cuda} selected ({hint})"
    return None


def nvcc_problems(archs: ArchList, cuda: str | Version) -> list[str]:
    """One reason per entry that the nvcc of ``cuda`` cannot compile; empty when all is fine."""
    toolkit = parse_cuda_version(cuda)
    problems = (_nvcc_problem(arch, toolkit) for arch in _as_arch_list(archs))
    return [problem for problem in problems if problem is not None]


def min_cuda_for(archs: ArchList) -> Version:
    """The lowest toolkit that compiles every entry; ArchError when no single toolkit can."""
    arch_list = _as_arch_list(archs)
    data = _data()
    required: list[Version] = []
    for arch in arch_list:
        info = data.infos.get(arch.cc)
        if info is None:
            raise ArchError(f"{_target_name(arch)} is not a known GPU architecture")
        required.append(_required_cuda(arch, info))
    lowest = max(required)
    problems = nvcc_problems(arch_list, lowest)
    if problems:
        # e.g. 7.0 (gone in 13.0) together with 11.0 (new in 13.0)
        raise ArchError(f"no single CUDA toolkit can compile {arch_list}: {problems[0]}")
    return lowest


# --------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------


def _torch_key(arch: CudaArch) -> str:
    return f"{arch.cc}{arch.variant}"


def _torch_accepted(minor: tuple[int, int]) -> frozenset[str] | None:
    accepted = None
    for since, values in _data().torch_states:
        if since <= minor:
            accepted = values
    return accepted


def _torch_range(key: str) -> str:
    """Which torch releases accept ``key``, for the hint in a rejection."""
    states = _data().torch_states
    first = last = None
    for index, (since, values) in enumerate(states):
        if key in values:
            if first is None:
                first = since
            if index + 1 < len(states) and key not in states[index + 1][1]:
                last = states[index + 1][0]
    if first is None:
        return "no torch release accepts it"
    if last is None:
        return f"accepted from torch {_fmt_minor(first)}"
    return f"accepted by torch >= {_fmt_minor(first)} and < {_fmt_minor(last)}"


def _torch_syntax_problem(arch: CudaArch) -> str | None:
    """What no torch release can express, whatever its version."""
    if arch.variant == "f":
        return (
            f"{arch}: TORCH_CUDA_ARCH_LIST never accepts family (f) targets; "
            f"use {arch.cc} or {arch.cc}a"
        )
    if not arch.sass:
        return (
            f"{arch}: TORCH_CUDA_ARCH_LIST cannot express a PTX-only entry; "
            f"use {arch.cc}{arch.variant}+PTX"
        )
    return None


def torch_problems(archs: ArchList, torch_version: str | Version) -> list[str]:
    """One reason per entry that torch ``torch_version`` rejects in TORCH_CUDA_ARCH_LIST."""
    arch_list = _as_arch_list(archs)
    minor = _torch_minor(torch_version)
    accepted = _torch_accepted(minor)
    problems: list[str] = []
    for arch in arch_list:
        problem = _torch_syntax_problem(arch)
        if problem is None and accepted is None:
            oldest = _fmt_minor(_data().torch_states[0][0])
            problem = (
                f"no TORCH_CUDA_ARCH_LIST data for torch {_fmt_minor(minor)} "
                f"(known from torch {oldest})"
            )
        elif problem is None and accepted is not None and _torch_key(arch) not in accepted:
            key = _torch_key(arch)
            problem = (
                f"torch {_fmt_minor(minor)} does not accept {key} in TORCH_CUDA_ARCH_LIST "
                f"({_torch_range(key)})"
            )
        if problem is not None:
            problems.append(problem)
    return problems


# --------------------------------------------------------------------------------------------
# Formatters
# --------------------------------------------------------------------------------------------


def to_torch_arch_list(archs: ArchList, torch_version: str | Version | None = None) -> str:
    """TORCH_CUDA_ARCH_LIST, e.g. "8.0;9.0a;12.0+PTX" (checked against torch if given)."""
    arch_list = _as_arch_list(archs)
    if torch_version is None:
        problems = [p for p in map(_torch_syntax_problem, arch_list) if p is not None]
    else:
        problems = torch_problems(arch_list, torch_version)
    if problems:
        raise ArchError("; ".join(problems))
    # Spaces would also work, but ';' is what every torch release documents.
    return _formatted(arch_list, "torch")


def as_tuples(archs: ArchList) -> list[tuple[int, int, str, bool, bool]]:
    """The entries as imagegen_rules (and the in-build script) take them: (major, minor, variant, sass, ptx)."""
    return [(a.major, a.minor, a.variant, a.sass, a.ptx) for a in _as_arch_list(archs)]


def _formatted(archs: ArchList, style: str, keep_variant: bool = False) -> str:
    # The one formatter, shared with the in-build script (imagegen_rules.format_archs).
    try:
        return rules.format_archs(as_tuples(archs), style, keep_variant)
    except ValueError as exc:
        raise ArchError(str(exc)) from None


def to_numeric_list(archs: ArchList, sep: str = ";", keep_variant: bool = False) -> str:
    """FLASH_ATTN_CUDA_ARCHS style "80;90;120"; those packages add PTX/variants themselves."""
    return _formatted(archs, "numeric", keep_variant).replace(";", sep)


def to_dotted_list(archs: ArchList, sep: str = ";") -> str:
    """NATTEN_CUDA_ARCH style "8.0;9.0;10.0" (NATTEN picks its own a-variants and PTX)."""
    return _formatted(archs, "dotted").replace(";", sep)


def to_cmake(archs: ArchList) -> str:
    """CMAKE_CUDA_ARCHITECTURES, e.g. "80-real;90a-real;120-real;120-virtual"."""
    return _formatted(archs, "cmake")


def to_gencode(archs: ArchList) -> list[str]:
    """nvcc flags, e.g. ["-gencode=arch=compute_80,code=sm_80", ...]; PTX as code=compute_XY."""
    text = _formatted(archs, "gencode")
    return text.split(" ") if text else []


def _gencode_text(archs: ArchList) -> str:
    return " ".join(to_gencode(archs))


# style -> (formatter, keyword arguments it takes)
_STYLES: dict[str, tuple[Callable[..., str], frozenset[str]]] = {
    "torch": (to_torch_arch_list, frozenset({"torch_version"})),
    "numeric": (to_numeric_list, frozenset({"sep", "keep_variant"})),
    "dotted": (to_dotted_list, frozenset({"sep"})),
    "cmake": (to_cmake, frozenset()),
    "gencode": (_gencode_text, frozenset()),
}


def format_for(archs: ArchList, style: str, **kw: Any) -> str:
    """Dispatch on a style name from a recipe: torch, numeric, dotted, cmake or gencode."""
    entry = _STYLES.get(style.lower()) if isinstance(style, str) else None
    if entry is None:
        raise ArchError(
            f"unknown arch format {_quote(str(style))}: use one of {', '.join(_STYLES)}"
        )
    formatter, allowed = entry
    unexpected = sorted(set(kw) - allowed)
    if unexpected:
        raise ArchError(
            f"arch format {style.lower()!r} takes no option {', '.join(unexpected)}"
            f" (it takes: {', '.join(sorted(allowed)) or 'none'})"
        )
    return formatter(archs, **kw)
