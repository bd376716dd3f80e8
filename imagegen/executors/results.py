"""The results of built, skipped, failed and refused cells as a table or JSON (build and pull print
them), and the exit they call for (``report``)."""

from __future__ import annotations

import json
from typing import Callable

from imagegen.errors import BuildError, RefusedError
from imagegen.model.cell import CellResult


def summary(results: list[CellResult]) -> str:
    rows = [("CELL", "STATUS", "TIME", "WHEEL / ERROR")]
    for r in results:
        what = str(r.wheel) if r.wheel else r.error
        if r.ccache and r.ccache.get("hit_rate") is not None:
            what += f"  (ccache {r.ccache['hits']}/{r.ccache['hits'] + r.ccache['misses']} hits)"
        rows.append((r.cell.name, r.status, f"{r.seconds:.0f}s" if r.seconds else "-", what))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row[:3], widths)) + "  " + row[3] for row in rows]
    for r in results:
        if r.status == "failed":
            lines.append(f"\n{r.cell.name} failed: {r.error}" + (f"\n  full log: {r.log}" if r.log else ""))
            lines += [f"  | {line}" for line in r.log_tail]
    return "\n".join(lines)


def results_json(results: list[CellResult]) -> str:
    return json.dumps([r.as_dict() for r in results], indent=2)


def report(results: list[CellResult], *, as_json: bool, show: Callable[[str], None] = print) -> None:
    """Show ``results`` (the table, or JSON) and raise what they call for: a BuildError (exit 5) when
    a cell failed; else a RefusedError (exit 10) when a cell was refused (its wheel would replace one
    built for other archs, or the builder cannot run its platform): each refusal is said once, in the
    table's row, or, when every cell was refused and there is no table to show, as the error itself."""
    failed = [r for r in results if r.status == "failed"]
    refused = [r for r in results if r.status == "refused"]
    if refused and len(refused) == len(results) and not as_json:
        raise RefusedError(_reasons(refused))
    show(results_json(results) if as_json else summary(results))
    also = f"; {len(refused)} refused ({', '.join(r.cell.name for r in refused)})" if refused else ""
    if failed:
        raise BuildError(f"{len(failed)} of {len(results)} cells failed: "
                         + ", ".join(r.cell.name + (f" (log: {r.log})" if r.log else "") for r in failed) + also)
    if refused:
        raise RefusedError(f"{len(refused)} of {len(results)} cells refused (the table says why):"
                           f" {', '.join(r.cell.name for r in refused)}")


def _reasons(refused: list[CellResult]) -> str:
    """The refusals as one message: the cells that share a reason named together, before it."""
    by_reason: dict[str, list[str]] = {}
    for r in refused:
        by_reason.setdefault(r.error, []).append(r.cell.name)
    return "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason.items())
