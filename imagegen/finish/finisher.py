"""Finish a cell: a built wheel, staged by whichever executor built it (bake, a prebuilt builder
image), is verified (the requested SASS/PTX really is in its .so files) and only then collected into
the wheelhouse with its log and manifest entry. One path for every executor; the native build, which
verifies while its import test runs, uses the same verify and collect steps."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from imagegen.wheelhouse import collect
from imagegen.errors import RefusedError
from imagegen.model.cell import Cell
from imagegen.finish.verify import verify_wheel
from imagegen.model.cell import CellResult


def finish(cell: Cell, wheels: list[Path], *, out: Path, inputs: str, log: Path, seconds: float,
           audit: dict | None = None, smoke: dict | None = None, ccache: dict | None = None,
           record: dict | Callable[[], dict] | None = None, flat: bool = False, force: bool = False) -> CellResult:
    """The result of ``cell`` from its staged ``wheels``: failed (not one wheel, or verification
    failed: nothing enters the wheelhouse), or built (the wheel collected, the log kept beside it,
    the manifest entry written with ``record``'s extra fields). ``record`` may be a function, called
    once the wheel has passed (the native build's import test runs meanwhile). ``flat``: the wheel
    alone into ``out``, no log copy and no manifest (``--flat``). Refused (nothing placed, the log
    not kept) when, at placement, the wheel would replace one built for other archs that another build
    placed meanwhile (collect.place; ``force`` replaces it)."""
    if len(wheels) != 1:
        return CellResult(cell, "failed", log=log, seconds=seconds, audit=audit,
                          error=f"expected one wheel, got {[w.name for w in wheels]}")
    report = verify_wheel(wheels[0], cell.expected_archs, extension_archs=cell.version.extensions)
    if not report.ok:
        return CellResult(cell, "failed", log=log, seconds=seconds, verify=report.as_dict(), smoke=smoke, audit=audit,
                          error="verification failed: " + "; ".join(report.problems))
    extra = record() if callable(record) else (record or {})
    if flat:
        dest = collect.place_flat(out, wheels[0])
        return CellResult(cell, "built", wheel=dest, log=log, seconds=seconds, verify=report.as_dict(),
                          smoke=extra.get("smoke", smoke), ccache=ccache, audit=audit)
    try:  # the log is kept in OUT with the wheel, and the manifest points at that copy
        dest = collect.place(out, cell, wheels[0], inputs=inputs, log=log, force=force, record={
            "duration_s": round(seconds, 1), "verify": report.as_dict(), **extra,
            **({"audit": audit} if audit is not None else {})})
    except RefusedError as exc:
        return CellResult(cell, "refused", log=log, seconds=seconds, verify=report.as_dict(),
                          smoke=extra.get("smoke", smoke), ccache=ccache, audit=audit, error=str(exc))
    kept = collect.kept_log(out, cell)
    return CellResult(cell, "built", wheel=dest, log=kept, seconds=seconds, verify=report.as_dict(),
                      smoke=extra.get("smoke", smoke), ccache=ccache, audit=audit)
