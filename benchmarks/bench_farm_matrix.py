"""Issue 36 item 5: a wheel farm's matrix, generated and checked. flash-attn x torch 2.8-2.15 x every CUDA
x Python 3.10-3.13 x amd64/arm64 (the cuda flavor: nvidia/cuda images exist for both platforms), one arch
list: `imagegen plan` (the cells and why the rest cannot build), `imagegen bake` (the bake file and one
Dockerfile per cell), `docker buildx bake --print` (BuildKit's own reading of the file), `imagegen ci
github` (the workflow, one job per target, and what it prints to size the runners: each job's estimated
compile CPU-hours) and actionlint on it. Prints each step's wall time (best of
--repeat) and the counts; results go to benchmarks/RESULTS.md by hand.

    .venv/bin/python benchmarks/bench_farm_matrix.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
IMAGEGEN = str(BIN / "imagegen")
MATRIX = ["flash-attn", "--torch", "2.8,2.9,2.10,2.11,2.12,2.13,2.14,2.15", "--python", "3.10,3.11,3.12,3.13",
          "--cuda", "12.6,12.8,12.9,13.0,13.2", "--arch", "8.0;9.0", "--platform", "linux/amd64,linux/arm64",
          "--flavor", "cuda"]


def timed(cmd: list[str], cwd: Path, repeat: int) -> tuple[float, subprocess.CompletedProcess]:
    best, proc = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
        best = min(best, time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:3])} ...: exit {proc.returncode}: {proc.stderr[-1500:]}")
    return best, proc


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="imagegen-farm-"))
    try:
        subprocess.run(["git", "init", "-q", str(work)], check=True)  # ci github runs in a repository's top folder
        t_plan, plan = timed([IMAGEGEN, "plan", *MATRIX, "--json"], work, args.repeat)
        summary = json.loads(plan.stdout)["summary"]
        t_bake, _ = timed([IMAGEGEN, "bake", *MATRIX, "-f", "docker-bake.hcl"], work, args.repeat)
        dockerfiles = len(list((work / "dockerfiles").glob("*.Dockerfile")))
        t_print, printed = timed(["docker", "buildx", "bake", "--print"], work, args.repeat)
        targets = len(json.loads(printed.stdout)["target"])
        t_ci, ci = timed([IMAGEGEN, "ci", "github", "--bake-file", "docker-bake.hcl", "-o",
                          ".github/workflows/wheels.yml"], work, args.repeat)
        actionlint = shutil.which("actionlint") or str(BIN / "actionlint")
        t_lint, _ = timed([actionlint, ".github/workflows/wheels.yml"], work, 1)
        result = {"cells": summary, "plan_s": round(t_plan, 3), "bake_s": round(t_bake, 3), "dockerfiles": dockerfiles,
                  "bake_print_s": round(t_print, 3), "bake_targets": targets, "ci_github_s": round(t_ci, 3),
                  "ci_github_says": ci.stderr.strip().splitlines(), "actionlint_s": round(t_lint, 3),
                  "actionlint": "ok"}
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
