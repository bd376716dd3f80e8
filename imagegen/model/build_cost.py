"""What a cell's compile costs in CPU time, to size a farm's runners before anything runs.

The figure is a measurement, scaled: the recipe's ``build.cpu_hours`` is one whole build imagegen timed
(user + system CPU of the build and every compiler it ran, on the H100 host: docs/records/gpu-results), with the
number of -gencode outputs it compiled. A cell's estimate is that figure times its own -gencode outputs
over the measured build's. Device code is most of an extension's compile and is compiled once per
output; the host part is not, so the scaling over-estimates a many-arch build (xformers 0.0.35: 0.08
CPU-h for one output, 0.17 for four, where scaling says 0.32 from the one), the safe side for sizing a
runner. The wall time on a runner is that CPU time over its cores, but never less than the measured
build's own wall time (causal-conv1d 1.7.0: 519 s of CPU, yet 436 s of wall on 16 cores, one file's
compile being most of it). A recipe without a measurement (or a local tree's) has no estimate, and says
so: a guess here would size a runner wrong."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from imagegen.model.recipes import CpuHours, Recipe

# A hosted GitHub runner (ubuntu-latest, ubuntu-24.04-arm): 4 vCPUs.
HOSTED_RUNNER_CPUS = 4


@dataclass(frozen=True)
class CellCost:
    cpu_hours: float
    basis: CpuHours
    # The least wall time any runner takes: the measured build's own on its (bigger) host; not scaled, as
    # more outputs of one file compile side by side (NVCC_THREADS). None: the measurement has no wall time.
    wall_hours: float | None = None

    def describe(self) -> str:
        return f"~{self.cpu_hours:.2f} CPU-h (scaled from {self.basis.hours:g} CPU-h measured: {self.basis.measured})"


def cell_cost(recipe: Recipe, gencode_targets: int) -> CellCost | None:
    """The estimate for a build of ``recipe`` compiling ``gencode_targets`` -gencode outputs; None when the
    recipe has no measured build."""
    basis = recipe.cpu_hours
    if basis is None or gencode_targets < 1:
        return None
    return CellCost(round(basis.hours * gencode_targets / basis.gencode_targets, 2), basis, basis.wall_hours)


def hosted_hours(cpu_hours: float, cpus: int = HOSTED_RUNNER_CPUS, wall_hours: float | None = None) -> float:
    """Wall hours on a runner of ``cpus`` CPUs: the CPU time spread over all of them, but never less than
    the measured build's own wall time (``wall_hours``: what does not spread, such as one big file)."""
    return max(cpu_hours / cpus, wall_hours or 0.0)


MAX_SIZING_ROWS = 12  # the heaviest kinds of job; the rest are in the total


def sizing_lines(jobs: Sequence[tuple[str, float | None, float | None]], budget_s: int | None,
                 cpus: int = HOSTED_RUNNER_CPUS) -> list[str]:
    """What a farm's jobs (name, estimated CPU-hours or None, least wall hours or None) cost, to size its
    runners: each estimate with its number of jobs and its wall hours on a runner of ``cpus``, the total,
    and the jobs whose compile outlasts one job's compile budget (``budget_s``; they stop there and resume
    on re-runs)."""
    if not jobs:
        return []
    walls = {name: wall for name, _, wall in jobs}
    known = [(name, hours) for name, hours, _ in jobs if hours is not None]
    if not known:
        return [f"imagegen: no CPU-hours estimate for these {len(jobs)} jobs: their recipes have no measured build"
                " (build.cpu_hours)"]
    lines = [f"imagegen: estimated compile CPU-hours per job (a measured build of the recipe scaled by the job's"
             f" -gencode outputs; wall hours on a hosted runner's {cpus} vCPUs, at least the measured build's own):"]
    groups: dict[tuple[float, float], list[str]] = {}
    for name, hours in known:
        groups.setdefault((hours, hosted_hours(hours, cpus, walls[name])), []).append(name)
    rows = sorted(groups.items(), key=lambda kv: (-kv[0][0], -kv[0][1]))
    for (hours, wall), names in rows[:MAX_SIZING_ROWS]:
        lines.append(f"  {hours:8.2f} CPU-h (~{wall:.1f} h)  x {len(names):3d} job"
                     f"{'s' if len(names) != 1 else ' '}  e.g. {names[0]}")
    if len(rows) > MAX_SIZING_ROWS:
        lines.append(f"  ... {sum(len(n) for _, n in rows[MAX_SIZING_ROWS:])} lighter jobs")
    unknown = len(jobs) - len(known)
    lines.append(f"  total {sum(h for _, h in known):.1f} CPU-h over {len(known)} of {len(jobs)} jobs"
                 + (f"; {unknown} without an estimate (no measured build of their recipe)" if unknown else ""))
    long = [hosted_hours(h, cpus, walls[n]) for n, h in known if budget_s and hosted_hours(h, cpus, walls[n]) * 3600 > budget_s]
    if long and budget_s:
        runs = max(math.ceil(w * 3600 / budget_s) for w in long)
        lines.append(f"  {len(long)} job{'s' if len(long) != 1 else ''} outlast a job's {budget_s // 60}-minute compile"
                     f" budget on {cpus} vCPUs: each stops there and resumes when its failed job is re-run (up to"
                     f" {runs} runs), or give them bigger runners (--runs-on)")
    return lines
