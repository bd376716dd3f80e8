"""Benchmark: how long the gencode audit takes per cell, and where the time goes.

For SageAttention 2.2.0 (`8.0 8.6 9.0 12.0+PTX`, the source tree at .src/dev/SageAttention) and the
tiny_kernel fixture (`8.0;9.0+PTX`), with a torch venv (PyPI torch, CUDA 13.0) and the host's nvcc:

1. `imagegen plan --audit --native --json` once per cell: its wall time, and the cell file and
   variables the in-build script audits with;
2. the in-build script's audit step on that cell file, RUNS times, alternating with a baseline copy
   of the two builder scripts when --baseline REV is given (`git show REV:...`; ABAB order, so a
   machine's drift hits both sides alike); the figure is the report's own `seconds` (copy of the
   tree, stand-ins, the package's build, fold).

    .venv/bin/python benchmarks/bench_audit.py --python .src/venv-torch2/bin/python --runs 6 --baseline 69fc375

With --trace it runs one audit of each cell under `strace -f -e execve` and prints when each program
started (pip or the build_wheel hook, nvcc -V, the stand-ins, the real tools they asked).
Results are written down in benchmarks/RESULTS.md ("Audit time per cell").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILDER = ROOT / "imagegen" / "shipped" / "builder"
SCRIPTS = ("imagegen_build.py", "imagegen_rules.py", "imagegen_audit.py")
CASES = {
    "SageAttention 2.2.0 `8.0 8.6 9.0 12.0+PTX`": ["sage", "--src-dir", str(ROOT / ".src" / "dev" / "SageAttention"),
                                                   "--arch", "8.0 8.6 9.0 12.0+PTX"],
    "tiny_kernel fixture `8.0;9.0+PTX`": ["--source", str(ROOT / "tests" / "fixtures" / "tiny_kernel"), "--arch", "8.0;9.0+PTX"],
}


def prepare(python: str, args: list[str], work: Path) -> tuple[float, Path, dict]:
    """One `imagegen plan --audit --native` run: (its wall time, the cell file, the audit's variables)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "imagegen", "plan", "--audit", "--native", "--python-exe", python,
                           "--work", str(work), "--json", *args], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"audit failed: {proc.stderr.strip()[-800:]}")
    report = json.loads((work / "logs" / "audit.json").read_text())
    env = {k: v for k, v in report["env"].items() if k in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS")}
    return wall, work / "cell.json", env


def audit(python: str, scripts: Path, cell: Path, env: dict, out: Path) -> float:
    proc = subprocess.run([python, str(scripts / "imagegen_build.py"), "--cell", str(cell), "audit", "--out", str(out)],
                          env=dict(os.environ, **env), capture_output=True)
    report = json.loads(out.read_text()) if out.exists() else {}
    if proc.returncode != 0 or not report.get("ok"):
        raise SystemExit(f"audit failed: {proc.stderr[-500:]!r} {report.get('output_tail', '')[-500:]}")
    return report["seconds"]


def trace(python: str, cell: Path, env: dict, scripts: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "trace.txt"
        subprocess.run(["strace", "-f", "-tt", "-e", "trace=execve", "-o", str(log), python, str(scripts / "imagegen_build.py"),
                        "--cell", str(cell), "audit", "--out", str(Path(tmp) / "a.json")], env=dict(os.environ, **env),
                       capture_output=True)
        t0, seen = None, set()
        for line in log.read_text().splitlines():
            m = re.match(r'(\d+) (\d+):(\d+):([\d.]+) execve\("([^"]+)", \[(.*?)\]', line)
            if not m or (m.group(1), m.group(5)) in seen:
                continue
            seen.add((m.group(1), m.group(5)))
            t = int(m.group(2)) * 3600 + int(m.group(3)) * 60 + float(m.group(4))
            t0 = t if t0 is None else t0
            print(f"{t - t0:7.2f} {m.group(6)[:150]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="the torch venv's interpreter")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--baseline", help="a git revision whose builder scripts to alternate with")
    ap.add_argument("--trace", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    try:
        sides = {"now": tmp / "now"}
        shutil.copytree(BUILDER, sides["now"])
        if a.baseline:
            sides[a.baseline] = tmp / "base"
            sides[a.baseline].mkdir()
            for name in SCRIPTS:
                text = subprocess.run(["git", "show", f"{a.baseline}:imagegen/shipped/builder/{name}"], cwd=ROOT,
                                      capture_output=True, text=True, check=True).stdout
                (sides[a.baseline] / name).write_text(text)
        rows = []
        for name, args in CASES.items():
            wall, cell, env = prepare(a.python, args, tmp / f"work-{len(rows)}")
            if a.trace:
                for label, folder in sides.items():
                    print(f"== {name}, {label}")
                    trace(a.python, cell, env, folder)
                continue
            got: dict[str, list[float]] = {label: [] for label in sides}
            order = list(sides)
            for i in range(a.runs):
                for label in (order if i % 2 == 0 else order[::-1]):
                    got[label].append(audit(a.python, sides[label], cell, env, tmp / "a.json"))
            rows.append((name, wall, env, got))
        if rows:
            print("| cell | variables | " + " | ".join(f"audit seconds, {label} (runs; median)" for label in sides)
                  + " | `imagegen plan --audit --native` wall (now) |")
            print("|---|---|" + "---|" * len(sides) + "---|")
            for name, wall, env, got in rows:
                cols = " | ".join(f"{', '.join(f'{s:.2f}' for s in v)}; **{statistics.median(v):.2f}**" for v in got.values())
                print(f"| {name} | MAX_JOBS={env['MAX_JOBS']} NVCC_THREADS={env['NVCC_THREADS']} | {cols} | {wall:.2f} s |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
