"""The gencode audit in each cell's builder image (buildx bake of the audit stage): `imagegen plan
--audit`, and the gate in front of every compile that refuses a cell the package's own build
would get wrong."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from imagegen import interrupt
from imagegen.errors import ImagegenError
from imagegen.executors.bake_log import AUDIT_SUFFIX, TargetLogs
from imagegen.executors.bake_run import Run, prepare_run, run_bake
from imagegen.executors.bases import not_pulled
from imagegen.model.cell import Cell, Plan
from imagegen.model.cell import CellResult

if TYPE_CHECKING:
    from imagegen.model.audit_report import Verdict


AUDIT_BATCH = 8  # audit targets baked at once (no compiling; the deps layers download in parallel)


@dataclass
class AuditOutcome:
    """One cell's audit in its builder image: a verdict, or why the audit could not run."""

    cell: Cell
    verdict: "Verdict | None"
    error: str = ""
    log: Path | None = None
    log_tail: list[str] = field(default_factory=list)
    base_missing: bool = False  # the base image could not be pulled: skipping the audit would not help


def audit(plan: Plan, *, work: Path, builder: str | None = None, ca_bundle: str | None = None,
          say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> list[AuditOutcome]:
    """`imagegen plan --audit`: each buildable cell's audit in its builder image, nothing compiled."""
    cells = list(plan.buildable)
    if not cells:
        return []
    run = prepare_run(cells, work.resolve(), ca_bundle=ca_bundle, command="imagegen plan --audit", tag="-audit")
    logs = TargetLogs(run.dir / "logs", [c.name for c in cells], say=say)
    try:
        with interrupt.stopping_children():
            outcomes = _audit_cells(cells, run, logs, builder, say)
    finally:
        logs.close()
    return [outcomes[c.name] for c in cells]


def _audit_cells(cells: list[Cell], run: Run, logs: TargetLogs, builder: str | None,
                 say: Callable[[str], None]) -> dict[str, AuditOutcome]:
    """Bake the cells' audit-report targets (AUDIT_BATCH at once, a cancelled one again alone) and
    judge each report."""
    from imagegen.model.audit import judge_cell
    from imagegen.model.audit_report import AuditReport

    outcomes: dict[str, AuditOutcome] = {}
    queue = list(cells)
    size = min(len(cells), AUDIT_BATCH)
    say(f"auditing {len(cells)} cell(s): each package's own build with stand-in compilers, in its builder image")

    def on_step(target: str, step: str) -> None:
        say(f"[{target}] audit: {step}")

    while queue:
        batch, queue = queue[:size], queue[size:]
        for c in batch:
            shutil.rmtree(run.stage / (c.name + AUDIT_SUFFIX), ignore_errors=True)
        ok = run_bake(run.bake_file, [c.name + AUDIT_SUFFIX for c in batch], logs, on_step, builder, run.ca)
        for c in batch:
            report_file = run.stage / (c.name + AUDIT_SUFFIX) / "audit.json"
            log = logs.folder / f"{c.name}.log"
            if report_file.is_file():
                try:
                    verdict = judge_cell(AuditReport.load(report_file), c)
                except ImagegenError as exc:
                    outcomes[c.name] = AuditOutcome(c, None, error=str(exc), log=log)
                    continue
                outcomes[c.name] = AuditOutcome(c, verdict, log=log)
                say_verdict(c, verdict, say)
            elif ok or c.name in logs.failed or len(batch) == 1:
                error = logs.errors.get(c.name) or ("bake failed before building: " + logs.bake_error
                                                    if logs.bake_error and c.name not in logs.failed else
                                                    "its builder image or the audit step failed")
                tail = logs.tail(c.name)
                missing = not_pulled(c, [logs.bake_error, *tail])
                outcomes[c.name] = AuditOutcome(c, None, error=missing or error, log=log, log_tail=tail,
                                                base_missing=missing is not None)
            else:
                say(f"[{c.name}] audit cancelled by a failing neighbour; queued again on its own")
                queue.append(c)
                size = 1
    return outcomes


def say_verdict(cell: Cell, verdict: "Verdict", say: Callable[[str], None]) -> None:
    seconds = verdict.report.seconds
    say(f"[{cell.name}] audit ({seconds:.1f} s): {'ok' if verdict.ok else 'REFUSED'}; what the build would compile:")
    for line in verdict.table().splitlines():
        say(f"[{cell.name}]   {line}")
    for line in verdict.findings():
        say(f"[{cell.name}] audit: {line}")


def audit_gate(todo: list[Cell], run: Run, logs: TargetLogs, builder: str | None, results: dict[str, CellResult],
                verdicts: dict[str, dict], say: Callable[[str], None]) -> list[Cell]:
    """The cells whose audit passed; a refused cell (or one whose audit could not run) fails here,
    before anything compiles, with the audit's reasons."""
    from imagegen.model.audit import refuse

    passed = []
    audited = _audit_cells(todo, run, logs, builder, say)
    for c in todo:
        a = audited[c.name]
        if a.verdict is not None and a.verdict.ok:
            verdicts[c.name] = a.verdict.as_dict()
            passed.append(c)
        elif a.verdict is not None:
            results[c.name] = CellResult(c, "failed", log=a.log, error=str(refuse(c, a.verdict)),
                                         audit=a.verdict.as_dict())
        else:
            results[c.name] = CellResult(c, "failed", log=a.log, log_tail=a.log_tail,
                                         error=a.error if a.base_missing else
                                         f"the gencode audit could not run: {a.error} (--no-audit skips it)")
    return passed
