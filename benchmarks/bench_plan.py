"""Benchmark: `imagegen plan` over every recipe version x the default matrix.

Measures (1) the in-process expansion (cold: first call loads YAML; warm: caches filled) and
(2) the whole command as a user runs it (interpreter start-up included). Run:

    .venv/bin/python benchmarks/bench_plan.py

Results are written down in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path


def in_process() -> tuple[float, float, int]:
    t0 = time.perf_counter()
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.model.catalogue import load_catalogue
    from imagegen.model.cell import MatrixRequest
    from imagegen.plan.matrix import defaults, expand

    d = defaults()
    cat = load_catalogue()
    req = MatrixRequest(
        recipes=[(r, v) for r in cat.recipes.values() for v in r.versions.values()],
        torch=d["matrix"]["torch"], cuda=d["matrix"]["cuda"], python=d["matrix"]["python"],
        archs=[parse_arch_list(d["matrix"]["arch"])], flavor=d["flavor"],
    )
    plan = expand(req)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        expand(req)
        warm.append(time.perf_counter() - t)
    return cold, statistics.median(warm), len(plan.cells)


def command(runs: int = 5) -> float:
    exe = Path(sys.executable).parent / "imagegen"
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([str(exe), "plan"], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


if __name__ == "__main__":
    cold, warm, cells = in_process()
    print(f"cells (every recipe version x default matrix): {cells}")
    print(f"expand, cold (loads YAML):  {cold * 1000:.0f} ms")
    print(f"expand, warm (median of 5): {warm * 1000:.0f} ms")
    print(f"`imagegen plan` end to end, default recipes (median of 5): {command() * 1000:.0f} ms")
