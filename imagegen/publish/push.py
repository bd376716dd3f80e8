"""Push prebuilt builder images: bake every cell's `builder` stage (the executor's bake_builders),
tagged with its deterministic reference, push it, and pin the digests the registry returned in the
lock file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagegen.plan import registry as reg
from imagegen.executors.prebuilt import Say, bake_builders, say_on_stderr
from imagegen.model.cell import Cell, Plan
from imagegen.plan.registry import Lock, image_ref, pinned


@dataclass
class PushResult:
    cell: Cell
    ref: str
    digest: str | None
    pushed: bool


def push(plan: Plan, registry: str, *, work: Path, lock: Lock, ca_bundle: str | None = None, netrc: str | None = None,
         builder: str | None = None, cache_from: list[str] = (), cache_to: list[str] = (),
         say: Say = say_on_stderr) -> list[PushResult]:
    cells = plan.buildable
    digests = bake_builders(cells, registry, work=work.resolve(), push=True, ca_bundle=ca_bundle, netrc=netrc,
                             builder=builder,
                             cache_from=list(cache_from), cache_to=list(cache_to), say=say)
    results = []
    for cell in cells:
        ref = image_ref(cell, registry)
        digest = digests.get(cell.name) or reg.repo_digest(ref)
        if digest:
            lock.builder_images[ref] = pinned(ref, digest)
        results.append(PushResult(cell, ref, digest, True))
        say(f"[{cell.name}] pushed {ref}" + (f" ({digest})" if digest else ""))
    lock.save()
    return results
