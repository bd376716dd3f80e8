"""Base images a build can really have: the primary, else the next candidate of the same CUDA.

A cell's base image may come with fallbacks (the manylinux flavor's sameli image, or
``--base-image CUDA=PRIMARY,FALLBACK``: a team's flash-attn matrix's ALT_LINUX_IMAGE_CU*). Before anything is built,
each such cell's candidates are tried in order: an image the engine already has, or one it can pull,
is taken; the cell is then built on it, its manifest names it (``base_image``) and its notes say why
the primary was passed over. A cell none of whose candidates can be had fails alone, with every
candidate's reason; the other cells build. Cells without fallbacks are left to the build itself, so
a plain build makes no extra registry call.
"""

from __future__ import annotations

from typing import Callable, Sequence

from imagegen.plan import registry
from imagegen.errors import ImagegenError
from imagegen.model.cell import Cell
from imagegen.plan.matrix import on_fallback


def unavailable(ref: str) -> str | None:
    """None when the engine has ``ref`` or can pull it now; else why not, in one line. (With the
    docker driver the pull is the one the build would make; BuildKit then finds the image there.)"""
    if registry.image_exists(ref):
        return None
    try:
        registry.pull(ref)
    except ImagegenError as exc:  # ImageMissing, RegistryError: missing tag, no access, unreachable
        return str(exc)
    return None


def pick(cells: Sequence[Cell], say: Callable[[str], None],
         probe: Callable[[str], str | None] = unavailable) -> tuple[list[Cell], dict[str, str]]:
    """``cells`` each on the first candidate base image that can be had, and the errors of the cells
    that have none (cell name -> one line). Each image is probed once, however many cells use it."""
    seen: dict[str, str | None] = {}
    chosen: list[Cell] = []
    failed: dict[str, str] = {}
    for cell in cells:
        base = cell.base
        if base is None or not base.fallbacks:
            chosen.append(cell)
            continue
        reasons: list[str] = []
        for ref in (base.ref, *base.fallbacks):
            if ref not in seen:
                seen[ref] = probe(ref)
            if seen[ref] is None:
                break
            reasons.append(f"{ref}: {seen[ref]}")
        else:
            failed[cell.name] = "no base image could be had: " + "; ".join(reasons)
            continue
        if ref != base.ref:
            why = reasons[0]
            say(f"[{cell.name}] base image {why}: building on the fallback {ref}")
            cell = on_fallback(cell, ref, why)
        chosen.append(cell)
    return chosen, failed


__all__ = ["pick", "unavailable"]
