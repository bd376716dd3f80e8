"""The results of built, skipped and failed cells as a table or JSON (build and pull print them)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from imagegen.wheelhouse import CellResult

if TYPE_CHECKING:
    pass


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
