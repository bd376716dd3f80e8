"""An ArchList in each package's notation: torch's TORCH_CUDA_ARCH_LIST, numeric (80;90), dotted,
CMake's CUDA_ARCHITECTURES, nvcc -gencode pairs."""

from __future__ import annotations

from typing import Any, Callable

from packaging.version import Version

from imagegen.errors import ArchError
from imagegen.model.arch import ArchList, quote
from imagegen.model.arch_parse import as_arch_list
from imagegen.model.arch_rules import torch_problems, torch_syntax_problem
from imagegen.shipped.builder import imagegen_rules as rules


def to_torch_arch_list(archs: ArchList, torch_version: str | Version | None = None) -> str:
    """TORCH_CUDA_ARCH_LIST, e.g. "8.0;9.0a;12.0+PTX" (checked against torch if given)."""
    arch_list = as_arch_list(archs)
    if torch_version is None:
        problems = [p for p in map(torch_syntax_problem, arch_list) if p is not None]
    else:
        problems = torch_problems(arch_list, torch_version)
    if problems:
        raise ArchError("; ".join(problems))
    # Spaces would also work, but ';' is what every torch release documents.
    return _formatted(arch_list, "torch")


def as_tuples(archs: ArchList) -> list[tuple[int, int, str, bool, bool]]:
    """The entries as imagegen_rules (and the in-build script) take them: (major, minor, variant, sass, ptx)."""
    return [(a.major, a.minor, a.variant, a.sass, a.ptx) for a in as_arch_list(archs)]


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
            f"unknown arch format {quote(str(style))}: use one of {', '.join(_STYLES)}"
        )
    formatter, allowed = entry
    unexpected = sorted(set(kw) - allowed)
    if unexpected:
        raise ArchError(
            f"arch format {style.lower()!r} takes no option {', '.join(unexpected)}"
            f" (it takes: {', '.join(sorted(allowed)) or 'none'})"
        )
    return formatter(archs, **kw)
