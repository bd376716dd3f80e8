"""The host platform of a cell (--platform): linux/amd64, or linux/arm64 (GH200, GB200, DGX Spark, Jetson),
built in the image's arm64 variant. Parses the flag, says what each flavor and torch offer on arm64, and gives a
plan one cell per platform asked for."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from packaging.version import Version

from imagegen import safety
from imagegen.errors import UsageError
from imagegen.model import base_images
from imagegen.model.cell import BUILDABLE, DEFAULT_PLATFORM, PLATFORMS, REJECTED, Cell, Plan


def parse_platforms(values: Sequence[str]) -> tuple[str, ...]:
    """--platform values (linux/amd64, linux/arm64; amd64, arm64, aarch64 for short), in order, once each."""
    short = {"amd64": "linux/amd64", "x86_64": "linux/amd64", "arm64": "linux/arm64", "aarch64": "linux/arm64",
             "linux/aarch64": "linux/arm64", "linux/x86_64": "linux/amd64"}
    out: list[str] = []
    for value in values:
        platform = short.get(value, value)
        if platform not in PLATFORMS:
            raise UsageError(f"--platform {safety.describe(value, 40)}: imagegen builds Linux wheels for"
                              f" {' and '.join(PLATFORMS)} (amd64 and arm64 for short)")
        if platform not in out:
            out.append(platform)
    return tuple(out)


def default_platforms(flavor: str) -> tuple[str, ...]:
    """The platforms a plan without --platform builds for: linux/amd64, or the flavor's own where it
    has no amd64 images (jetson: linux/arm64)."""
    platforms = tuple(base_images.flavor(flavor).raw.get("platforms", (DEFAULT_PLATFORM,)))
    return (DEFAULT_PLATFORM,) if DEFAULT_PLATFORM in platforms else platforms[:1]


def with_requested_platforms(plan: "Plan", given: Sequence[str], flavor: str) -> "Plan":
    """``plan`` for the platforms asked for (--platform), else the flavor's own (default_platforms); a
    plain linux/amd64 plan of an amd64 flavor stays as it is. A flavor without amd64 images has its
    amd64 cells refused."""
    default = default_platforms(flavor)
    platforms = tuple(given) or default
    if platforms == default == (DEFAULT_PLATFORM,):
        return plan
    return with_platforms(plan, platforms)


def platform_problems(cell: Cell) -> tuple[list[str], list[str]]:
    """Why ``cell`` cannot build for its platform, and what the plan should say about it: (problems, notes)."""
    problems: list[str] = []
    notes: list[str] = []
    arm = cell.platform == "linux/arm64"
    flavor = cell.base.flavor if cell.base is not None else base_images.flavor(cell.flavor)
    platforms = tuple(flavor.raw.get("platforms", (DEFAULT_PLATFORM,)))
    if cell.platform not in platforms:
        problems.append(f"the {flavor.name} flavor has no {cell.platform} images ({', '.join(platforms)} only): use"
                        " --flavor cuda, manylinux or pypi, or your own --base-image for that platform")
    if arm and cell.base is not None and cell.base.ref in base_images.amd64_catalogue_refs(flavor, cell.cuda):
        # arm64_base found no arm64 image for this CUDA version: the amd64 one is still there
        problems.append(f"{flavor.raw['arm64_template'].split(':')[0]} has no CUDA {cell.cuda.dotted} image (it has"
                        f" {', '.join(flavor.raw.get('arm64_cuda', ()))}): use one of those, or --flavor cuda")
    min_torch = flavor.raw.get("arm64_min_torch")
    index_min = base_images.settings().get("arm64_index_min_torch")
    if arm and not min_torch and index_min and cell.torch_from == "venv" \
            and Version(cell.torch_version) < Version(f"{index_min}.0"):
        problems.append(f"torch {cell.torch_version} has no CUDA aarch64 wheel on the PyTorch index (they start at"
                        f" torch {index_min}): use --torch {index_min} or newer")
    if arm and min_torch and Version(cell.torch_version) < Version(f"{min_torch}.0"):
        problems.append(f"torch {cell.torch_version} has no CUDA build for aarch64 on PyPI (its aarch64 wheel is"
                        f" CPU-only; CUDA aarch64 wheels start at torch {min_torch}): use --torch {min_torch} or newer,"
                        " or --flavor cuda / manylinux with a base image that has an aarch64 CUDA torch")
    from imagegen.model.arch_data import arch_table
    infos = arch_table().infos
    for arch in cell.archs:
        only = infos[arch.cc].platforms if arch.cc in infos else ()
        if only and cell.platform not in only:
            what = ", ".join(infos[arch.cc].gpus) or arch.cc
            notes.append(f"{arch.cc} ({what}) GPUs sit in {' and '.join(only)} hosts only: a {cell.platform} wheel"
                         f" cannot run on them; add --platform {only[0]}")
    if arm:
        notes.append("linux/arm64: built in the image's arm64 variant, natively on an arm64 builder or under QEMU"
                     " (sudo imagegen setup qemu; slow: nvcc runs emulated)")
    return problems, notes


def with_platforms(plan: "Plan", platforms: Sequence[str]) -> "Plan":
    """``plan`` with each cell once per platform: an arm64 cell gets its flavor's arm64 base image,
    and a problem where the flavor or the torch has no arm64 build."""
    cells = []
    for c in plan.cells:
        for platform in platforms:
            cell = replace(c, platform=platform)
            kept = c.notes
            if platform == "linux/arm64" and cell.base is not None:
                base = base_images.arm64_base(cell.base, cell.cuda)
                if base.ref != cell.base.ref:  # the amd64 image's fallbacks are not this one's
                    kept = tuple(n for n in kept if not n.startswith("fallback base image:"))
                cell = replace(cell, base=base)
            problems, notes = platform_problems(cell)
            status = REJECTED if problems and c.status == BUILDABLE else c.status
            cells.append(replace(cell, problems=c.problems + tuple(problems), notes=kept + tuple(notes),
                                 status=status))
    return Plan(cells=cells)


__all__ = ["default_platforms", "parse_platforms", "platform_problems", "with_platforms", "with_requested_platforms"]
