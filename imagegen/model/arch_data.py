"""The facts behind the arch rules: resources/compat/archs.yaml (each compute capability, its GPUs and
names, the CUDA that first targets it, what each torch release accepts), loaded once."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib.resources import files
from typing import Any

from packaging.version import InvalidVersion, Version

from imagegen import yamlio
from imagegen.errors import ArchError
from imagegen.model.arch import (
    A_MIN_CC,
    F_MIN_CC,
    CudaArch,
    arch_from_notation,
    minor_of,
    normalise_gpu,
    quote,
    torch_key,
)


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
    platforms: tuple[str, ...] = ()  # the only host platforms with these GPUs (empty: any)


@dataclass(frozen=True)
class _ArchData:
    infos: Mapping[str, ArchInfo]
    family_min_cuda: Version
    named: Mapping[str, tuple[CudaArch, ...]]  # lower-cased name -> expansion
    gpus: Mapping[str, CudaArch]  # normalised product name -> SASS-only entry
    # (torch major.minor the state starts at, values accepted from then on), oldest first
    torch_states: tuple[tuple[tuple[int, int], frozenset[str]], ...]


@functools.cache
def arch_table() -> _ArchData:
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
            platforms=tuple(str(p) for p in item.get("platforms", ())),
        )
        if not re.fullmatch(r"\d{1,2}\.\d", info.cc) or info.cc in infos:
            raise ValueError(f"bad or duplicate cc {info.cc!r}")
        if (info.max_cuda is None) != (info.dropped_in is None):
            raise ValueError(f"cc {info.cc}: max_cuda and dropped_in go together")
        infos[info.cc] = info

    def plain(text: str) -> CudaArch:
        # Named expansions and table values use the plain notations only (no names, no GPUs).
        arch = arch_from_notation(text.strip().lower())
        if arch is None:
            raise ValueError(f"bad arch {text!r}")
        if arch_error(arch, text, infos) is not None:
            raise ValueError(f"unknown arch {text!r}")
        return arch

    named = {
        str(name).lower(): tuple(plain(part) for part in str(expansion).split(";"))
        for name, expansion in raw["named"].items()
    }
    gpus: dict[str, CudaArch] = {}
    for name, cc in raw["gpus"].items():
        key = normalise_gpu(str(name))
        # A product alias must never shadow a real notation such as "100" (= 10.0).
        if arch_from_notation(key) is not None or key in named:
            raise ValueError(f"GPU alias {name!r} collides with an arch notation")
        gpus[key] = replace(plain(str(cc)), sass=True, ptx=False)

    states: list[tuple[tuple[int, int], frozenset[str]]] = []
    current: set[str] = set()
    for step in sorted(raw["torch_accepts"], key=lambda s: minor_of(Version(str(s["since"])))):
        removed = {torch_key(plain(str(v))) for v in step.get("remove") or ()}
        added = {torch_key(plain(str(v))) for v in step.get("add") or ()}
        current = (current - removed) | added
        states.append((minor_of(Version(str(step["since"]))), frozenset(current)))

    return _ArchData(
        infos=infos,
        family_min_cuda=Version(str(raw["family_min_cuda"])),
        named=named,
        gpus=gpus,
        torch_states=tuple(states),
    )


def known_ccs() -> tuple[str, ...]:
    """Every compute capability in archs.yaml, oldest first ("3.5", ..., "12.1")."""
    return tuple(arch_table().infos)


def arch_info(arch: CudaArch | str) -> ArchInfo:
    """The archs.yaml facts for a compute capability ("9.0") or an entry's capability."""
    cc = arch.cc if isinstance(arch, CudaArch) else str(arch)
    info = arch_table().infos.get(cc)
    if info is None:
        raise ArchError(f"unknown compute capability {quote(cc)}: known are {', '.join(known_ccs())}")
    return info


def arch_error(arch: CudaArch, token: str, infos: Mapping[str, ArchInfo]) -> str | None:
    """Why a syntactically fine entry is still not a real target, or None."""
    if arch.cc not in infos:
        return (
            f"unknown compute capability {arch.cc} in {quote(token)}: "
            f"known are {', '.join(infos)}"
        )
    if arch.variant == "a" and (arch.major, arch.minor) < A_MIN_CC:
        return (
            f"{quote(token)}: arch-specific (a) targets exist only for compute capability "
            f"9.0 and newer; use {arch.cc}"
        )
    if arch.variant == "f" and (arch.major, arch.minor) < F_MIN_CC:
        return (
            f"{quote(token)}: family (f) targets exist only for compute capability "
            f"10.0 and newer; use {arch.cc}"
        )
    return None
