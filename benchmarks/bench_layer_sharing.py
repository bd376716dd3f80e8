"""Benchmark: the disk and time a second package's builder costs once a first one is built.

Builder images install torch (and, for the `pypi` flavor, the CUDA toolkit from PyPI) into one
layer of several GB. imagegen renders that layer from a toolchain document with no recipe in it
(torch, CUDA, Python) and a script of its own (imagegen_toolchain.py), so every package built for
the same torch x CUDA x Python on the same base shares it. This benchmark renders the `base` stage
of N local projects (tests/fixtures/*_kernel, each its own package) for one cell (torch 2.11 cu130,
Python 3.11, pypi flavor) and builds them one after another with `docker buildx build`, reading
BuildKit's cache size (`docker buildx du`) before and after each:

  first   the toolchain layer is built: several GB, minutes;
  others  only the package's own layers: MB, seconds. Before the toolchain layer was split out of
          the cell document every package paid the first line again (CI: 7 copies, ~57 GB).

    sudo .venv/bin/python benchmarks/bench_layer_sharing.py [--prune]

--prune empties the build cache first (every builder, every cache: do it on a machine of your own).
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
BASE_IMAGE = "imagegen-test/python:3.11-bookworm"
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0", "--flavor", "pypi"]
PROJECTS = ("tiny_kernel", "sleepy_kernel", "routed_kernels", "hardcoded_gencode")
UNITS = {"B": 1e-9, "kB": 1e-6, "KB": 1e-6, "MB": 1e-3, "GB": 1.0, "TB": 1e3}


def cache_gb() -> float:
    """BuildKit's whole cache, in GB, as `docker buildx du` totals it."""
    out = subprocess.run(["docker", "buildx", "du"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^Total:\s+([\d.]+)\s*([kKMGT]?B)\s*$", out, re.M)
    if not m:
        raise SystemExit(f"no total in `docker buildx du`: {out[-300:]}")
    return float(m.group(1)) * UNITS[m.group(2)]


def build_base(project: str, folder: Path) -> tuple[float, str]:
    """Render the project's Dockerfile and build its `base` stage; (seconds, last line of output)."""
    source = ROOT / "tests" / "fixtures" / project
    dockerfile = folder / project / "Dockerfile"
    subprocess.run([IMAGEGEN, "render", "--source", str(source), *CELL, "--base-image", BASE_IMAGE,
                    "-o", str(dockerfile)], check=True, capture_output=True, text=True)
    start = time.monotonic()
    from imagegen.executors.bake_run import default_ca_bundle

    ca = default_ca_bundle() or "/etc/ssl/certs/ca-certificates.crt"  # PyPI behind a TLS-intercepting proxy
    proc = subprocess.run(["docker", "buildx", "build", "--progress", "plain", "--target", "base",
                           "--secret", f"id=pip_cert,src={ca}",
                           "--build-context", f"imagegen-scripts={dockerfile.parent / 'imagegen-scripts'}",
                           "--build-context", f"source={source}", "-f", str(dockerfile), str(dockerfile.parent)],
                          capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{project}: the build failed: {proc.stderr[-2000:]}")
    return seconds, proc.stderr.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prune", action="store_true", help="empty the build cache first")
    args = parser.parse_args()
    if args.prune:
        subprocess.run(["docker", "builder", "prune", "-af"], check=True, capture_output=True)
    print(f"{'project':<20} {'seconds':>8} {'cache +GB':>10} {'cache GB':>9}")
    with tempfile.TemporaryDirectory(prefix="imagegen-bench-layers-") as tmp:
        for project in PROJECTS:
            before = cache_gb()
            seconds, _ = build_base(project, Path(tmp))
            after = cache_gb()
            print(f"{project:<20} {seconds:>8.1f} {after - before:>10.3f} {after:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
