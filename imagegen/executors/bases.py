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

import re
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


# BuildKit's words when FROM's image cannot be had: "ERROR: failed to solve: REF: failed to resolve source
# metadata for docker.io/REF: WHY" (bake's last line), or the vertex "#3 [TARGET internal] load metadata for
# docker.io/REF" then "#3 ERROR: WHY" (the target's own log).
_METADATA_FAILED = re.compile(r"failed to resolve source metadata for (\S+?): (.+)$")
_METADATA_VERTEX = re.compile(r"^#(\d+) \[[^\]]*internal\] load metadata for (\S+)$")


def _plain(ref: str) -> str:
    """``ref`` as Docker Hub's short name: docker.io/library/ubuntu:24.04 -> ubuntu:24.04."""
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        ref = ref[len(prefix):] if ref.startswith(prefix) else ref
    return ref


def not_pulled(cell: Cell, lines: Sequence[str]) -> str | None:
    """When ``lines`` (bake's last error, the target's log tail) say the cell's base image could not be
    pulled: one line saying so and naming what applies (the build needs that image whatever else is
    skipped); None otherwise (another image, such as the Dockerfile frontend's, or another failure)."""
    base = cell.base
    if base is None:
        return None
    mine = {_plain(r) for r in (base.ref, *base.fallbacks)}
    vertices: dict[str, str] = {}
    found = None
    for line in lines:
        line = line.strip()
        m = _METADATA_FAILED.search(line)
        if m and _plain(m.group(1)) in mine:
            found = (m.group(1), m.group(2))
            break
        v = _METADATA_VERTEX.match(line)
        if v:
            vertices[v.group(1)] = v.group(2)
            continue
        e = re.match(r"^#(\d+) ERROR: (.+)$", line)
        if e and e.group(1) in vertices and _plain(vertices[e.group(1)]) in mine:
            found = (vertices[e.group(1)], e.group(2))
            break
    if found is None:
        return None
    ref, why = found
    return (f"the base image {_plain(ref)} cannot be pulled ({why[:240]}), and the build needs it: choose another"
            f" --flavor, give --base-image {cell.cuda.dotted}=IMAGE (one this engine has or can pull, a registry"
            " mirror's copy), or make the registry reachable (the engine's proxy or registry-mirrors); `imagegen"
            " lock` then pins the image you choose")


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


__all__ = ["not_pulled", "pick", "unavailable"]
