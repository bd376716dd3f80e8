"""What a toolchain can build: CUDA versions as users write them, the nvcc that can target each arch,
and the archs each torch release's TORCH_CUDA_ARCH_LIST accepts."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from imagegen.errors import ArchError, UsageError
from imagegen.model.arch import ArchList, CudaArch, fmt_minor, minor_of, quote, torch_key
from imagegen.model.arch_data import ArchInfo, arch_error, arch_table
from imagegen.model.arch_parse import as_arch_list

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
    raise UsageError(f"bad CUDA version {quote(text)}: use forms like 12.8, 12.8.1 or cu128")


def _torch_minor(torch_version: str | Version) -> tuple[int, int]:
    if isinstance(torch_version, Version):
        return minor_of(torch_version)
    try:
        return minor_of(Version(str(torch_version).strip()))
    except InvalidVersion:
        raise UsageError(
            f"bad torch version {quote(str(torch_version))}: use forms like 2.8 or 2.8.0"
        ) from None


def _target_name(arch: CudaArch) -> str:
    return arch.sm if arch.sass else arch.compute


def _required_cuda(arch: CudaArch, info: ArchInfo) -> Version:
    required = info.min_cuda
    if arch.variant == "a" and info.a_min_cuda is not None:
        required = max(required, info.a_min_cuda)
    elif arch.variant == "f":
        required = max(required, arch_table().family_min_cuda)
    return required


def _nvcc_problem(arch: CudaArch, cuda: Version) -> str | None:
    data = arch_table()
    name = _target_name(arch)
    info = data.infos.get(arch.cc)
    if info is None:
        return f"{name} is not a known GPU architecture"
    problem = arch_error(arch, name, data.infos)
    if problem is not None:
        return problem
    label = {"": name, "a": f"{name} (arch-specific target)", "f": f"{name} (family target)"}
    required = _required_cuda(arch, info)
    if minor_of(cuda) < minor_of(required):
        return f"{label[arch.variant]} needs CUDA >= {required}; CUDA {cuda} selected"
    if info.max_cuda is not None and minor_of(cuda) > minor_of(info.max_cuda):
        hint = f"use CUDA <= {info.max_cuda} or drop {arch.cc}{arch.variant}"
        if info.note:
            hint += f"; {info.note}"
        return f"{name} was dropped in CUDA {info.dropped_in}; CUDA {cuda} selected ({hint})"
    return None


def nvcc_problems(archs: ArchList, cuda: str | Version) -> list[str]:
    """One reason per entry that the nvcc of ``cuda`` cannot compile; empty when all is fine."""
    toolkit = parse_cuda_version(cuda)
    problems = (_nvcc_problem(arch, toolkit) for arch in as_arch_list(archs))
    return [problem for problem in problems if problem is not None]


def min_cuda_for(archs: ArchList) -> Version:
    """The lowest toolkit that compiles every entry; ArchError when no single toolkit can."""
    arch_list = as_arch_list(archs)
    data = arch_table()
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


def _torch_accepted(minor: tuple[int, int]) -> frozenset[str] | None:
    accepted = None
    for since, values in arch_table().torch_states:
        if since <= minor:
            accepted = values
    return accepted


def _torch_range(key: str) -> str:
    """Which torch releases accept ``key``, for the hint in a rejection."""
    states = arch_table().torch_states
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
        return f"accepted from torch {fmt_minor(first)}"
    return f"accepted by torch >= {fmt_minor(first)} and < {fmt_minor(last)}"


def torch_syntax_problem(arch: CudaArch) -> str | None:
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
    arch_list = as_arch_list(archs)
    minor = _torch_minor(torch_version)
    accepted = _torch_accepted(minor)
    problems: list[str] = []
    for arch in arch_list:
        problem = torch_syntax_problem(arch)
        if problem is None and accepted is None:
            oldest = fmt_minor(arch_table().torch_states[0][0])
            problem = (
                f"no TORCH_CUDA_ARCH_LIST data for torch {fmt_minor(minor)} "
                f"(known from torch {oldest})"
            )
        elif problem is None and accepted is not None and torch_key(arch) not in accepted:
            key = torch_key(arch)
            problem = (
                f"torch {fmt_minor(minor)} does not accept {key} in TORCH_CUDA_ARCH_LIST "
                f"({_torch_range(key)})"
            )
        if problem is not None:
            problems.append(problem)
    return problems
