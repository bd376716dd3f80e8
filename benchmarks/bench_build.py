"""Benchmark: `imagegen build` of the fixture CUDA extension on the local engine.

Measures, for tests/fixtures/tiny_kernel (torch 2.11 cu130, Python 3.11, pypi flavor):
  1. cold build time (with --cold: the BuildKit cache, pip cache mount included, is pruned first)
  2. no-op re-run time (every cell up to date; goal < 5 s)
  3. the build after changing only --arch, and how many dependency layers (the `base` stage:
     system packages, torch, build requirements) were executed again (goal: 0)

    sudo .venv/bin/python benchmarks/bench_build.py [--cold]

Needs the engine and base image that scripts/test.sh sets up. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--source", str(ROOT / "tests/fixtures/tiny_kernel"), "--torch", "2.11", "--cuda", "13.0", "--python", "3.11",
        "--flavor", "pypi", "--base-image", "imagegen-test/python:3.11-bookworm"]


def build(work: Path, arch: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([IMAGEGEN, "build", *CELL, "--arch", arch, "--out", str(work / "out"), "--work", str(work / "w")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    return time.perf_counter() - t0, proc.stderr


def base_steps_executed(work: Path) -> tuple[int, int]:
    """(executed, total) `base` stage steps in the newest run's bake log."""
    run = sorted((work / "w" / "runs").iterdir())[-1]
    text = "\n".join(p.read_text() for p in (run / "logs").glob("*.log"))
    steps = {}
    for m in re.finditer(r"^#(\d+) \[[\w-]+ base (\d+)/\d+\]", text, re.M):
        steps[m.group(1)] = m.group(2)
    cached = {v for v in steps if re.search(rf"^#{v} CACHED$", text, re.M)}
    # FROM has no RUN to cache: count steps 2.. (apt, script, cell, deps).
    real = {v for v, n in steps.items() if n != "1"}
    return len(real - cached), len(real)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="prune the BuildKit cache first (downloads everything again)")
    args = ap.parse_args()
    if args.cold:
        subprocess.run(["docker", "builder", "prune", "-af"], check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        first, _ = build(work, "8.0;9.0+PTX")
        print(f"{'cold' if args.cold else 'first'} build (8.0;9.0+PTX): {first:.1f} s")
        noop, log = build(work, "8.0;9.0+PTX")
        assert "up to date" in log
        print(f"no-op re-run: {noop:.2f} s")
        changed, _ = build(work, "9.0")
        executed, total = base_steps_executed(work)
        print(f"after changing only --arch (9.0): {changed:.1f} s; dependency layers re-executed: {executed} of {total}")


if __name__ == "__main__":
    main()
