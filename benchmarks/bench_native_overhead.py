"""Benchmark: imagegen's native build against a plain `pip wheel` of the same source and variables.

The CPU-machine counterpart of scripts/gpu/proof.sh (issue 4 asks for imagegen's overhead over plain
pip to be within 2 %): the project of bench_ccache.py (N CUDA kernel files, each including torch's
headers) is built for one arch, alternately with

  imagegen  `imagegen build --source SRC --native --arch 8.0 --flat` (probe, preflight, in-build
            script: copy, pip wheel, retag; verify; import test), wall time, and the time of the
            `pip wheel` inside it (the in-build script logs it);
  plain     `pip wheel --no-build-isolation --no-deps .` in a copy of the same tree, with exactly the
            variables imagegen's build sets (`--print-env`), wall time.

Runs go in ABBA order (imagegen first in even pairs, plain first in odd ones), so that neither side
always pays for the first build. Needs nvcc (CUDA_HOME) and a Python whose torch matches it:

    CUDA_HOME=/usr/local/cuda .venv/bin/python benchmarks/bench_native_overhead.py \
        --python-exe /path/to/venv-with-torch/bin/python [--kernels 6] [--pairs 2]

Results: benchmarks/RESULTS.md.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ccache import make_project  # noqa: E402  (same multi-kernel project)

IMAGEGEN = str(Path(sys.executable).parent / "imagegen")


def imagegen_build(src: Path, py: str, root: Path, n: int) -> dict:
    out, work = root / f"ig-out-{n}", root / f"ig-work-{n}"
    t0 = time.perf_counter()
    proc = subprocess.run([IMAGEGEN, "build", "--source", str(src), "--native", "--arch", "8.0", "--python-exe", py,
                           "--out", str(out), "--flat", "--work", str(work)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    pip_s = float(re.search(r"pip wheel took ([\d.]+) s", proc.stdout + proc.stderr).group(1))
    steps = next((line[len("time: "):] for line in proc.stderr.splitlines() if line.startswith("time: ")), "")
    shutil.rmtree(out), shutil.rmtree(work)
    return {"seconds": round(seconds, 2), "pip_s": pip_s, "own_s": round(seconds - pip_s, 2), "steps": steps}


def plain_build(src: Path, py: str, env: dict, root: Path, n: int) -> dict:
    tree, dist = root / f"plain-src-{n}", root / f"plain-dist-{n}"
    shutil.copytree(src, tree)
    t0 = time.perf_counter()
    proc = subprocess.run([py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(dist), "."],
                          cwd=tree, env={**os.environ, **env}, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:])
    shutil.rmtree(tree), shutil.rmtree(dist)
    return {"seconds": round(seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python-exe", required=True, help="a Python whose torch (CUDA build) matches CUDA_HOME's nvcc")
    ap.add_argument("--kernels", type=int, default=6)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="imagegen-bench-native-") as tmp:
        root = Path(tmp)
        src = make_project(root, args.kernels)
        env = json.loads(subprocess.run([IMAGEGEN, "build", "--source", str(src), "--native", "--arch", "8.0",
                                         "--python-exe", args.python_exe, "--work", str(root / "env"), "--print-env"],
                                        capture_output=True, text=True, check=True).stdout)
        print(f"variables of both builds: {env}", flush=True)
        pairs = []
        for n in range(args.pairs):
            order = ("imagegen", "plain") if n % 2 == 0 else ("plain", "imagegen")
            got = {}
            for side in order:
                got[side] = (imagegen_build(src, args.python_exe, root, n) if side == "imagegen"
                             else plain_build(src, args.python_exe, env, root, n))
            ratio = got["imagegen"]["seconds"] / got["plain"]["seconds"]
            pip_ratio = got["imagegen"]["pip_s"] / got["plain"]["seconds"]
            pairs.append({"order": f"{order[0]}-first", **got, "ratio": round(ratio, 4), "pip_ratio": round(pip_ratio, 4)})
            print(f"pair {n + 1} ({order[0]} first): imagegen {got['imagegen']['seconds']:.1f} s (pip wheel"
                  f" {got['imagegen']['pip_s']:.1f} s; {got['imagegen']['steps']}), plain {got['plain']['seconds']:.1f} s:"
                  f" ratio {ratio:.4f}, pip step / plain {pip_ratio:.4f}", flush=True)
    summary = {"kernels": args.kernels, "pairs": pairs,
               "mean_ratio": round(statistics.mean(p["ratio"] for p in pairs), 4),
               "mean_pip_ratio": round(statistics.mean(p["pip_ratio"] for p in pairs), 4),
               "mean_own_s": round(statistics.mean(p["imagegen"]["own_s"] for p in pairs), 2)}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
