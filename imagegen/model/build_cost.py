"""What a cell's compile costs in CPU time, to size a farm's runners before anything runs.

The figure is a measurement, scaled: the recipe's ``build.cpu_hours`` is one whole build imagegen timed
(user + system CPU of the build and every compiler it ran, on the H100 host: docs/gpu-results), with the
number of -gencode outputs it compiled. A cell's estimate is that figure times its own -gencode outputs
over the measured build's. Device code is most of an extension's compile and is compiled once per
output; the host part is not, so the scaling over-estimates a many-arch build (xformers 0.0.35: 0.08
CPU-h for one output, 0.17 for four, where scaling says 0.32 from the one), the safe side for sizing a
runner. A recipe without a measurement (or a local tree's) has no estimate, and says so: a guess here
would size a runner wrong."""

from __future__ import annotations

from dataclasses import dataclass

from imagegen.model.recipes import CpuHours, Recipe

# A hosted GitHub runner (ubuntu-latest, ubuntu-24.04-arm): 4 vCPUs.
HOSTED_RUNNER_CPUS = 4


@dataclass(frozen=True)
class CellCost:
    cpu_hours: float
    basis: CpuHours

    def describe(self) -> str:
        return f"~{self.cpu_hours:.2f} CPU-h (scaled from {self.basis.hours:g} CPU-h measured: {self.basis.measured})"


def cell_cost(recipe: Recipe, gencode_targets: int) -> CellCost | None:
    """The estimate for a build of ``recipe`` compiling ``gencode_targets`` -gencode outputs; None when the
    recipe has no measured build."""
    basis = recipe.cpu_hours
    if basis is None or gencode_targets < 1:
        return None
    return CellCost(round(basis.hours * gencode_targets / basis.gencode_targets, 2), basis)


def hosted_hours(cpu_hours: float, cpus: int = HOSTED_RUNNER_CPUS) -> float:
    """Wall hours on a runner of ``cpus`` CPUs, all of them busy for the whole compile (the best case)."""
    return cpu_hours / cpus
