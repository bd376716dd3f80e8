"""Benchmark: rebuild after a one-file source change, with a warm ccache vs a cold one.

A project like tests/fixtures/tiny_kernel but with N kernel files (each includes torch's headers,
like real extensions do) is built once with `imagegen build` (torch 2.11 cu130, Python 3.11, pypi
flavor, arch 8.0). Then one kernel file is edited and the cell rebuilt twice:

  warm  the compile step's ccache mount (id imagegen-ccache) still holds the first build's objects:
        only the edited file should be compiled, the rest come from the cache;
  cold  the ccache mount alone is pruned first (`docker builder prune --filter id=<its record>`,
        found with `docker buildx du --verbose`), so every file is compiled again.

Each rebuild re-runs only the `builder` stage's fetch and the compile step (the source changed);
the times are imagegen build's wall time, and the hit rates are what the build itself reports.

    sudo .venv/bin/python benchmarks/bench_ccache.py [--kernels 6]

Needs the engine and base image that scripts/test.sh sets up. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
KERNEL = """#include <torch/extension.h>

__global__ void k{i}(float* x, int n) {{
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) x[j] = x[j] * {scale}f + {i}.0f;
}}

torch::Tensor op{i}(torch::Tensor x) {{
  auto y = x.contiguous().clone();
  k{i}<<<(y.numel() + 255) / 256, 256>>>(y.data_ptr<float>(), y.numel());
  return y;
}}
"""


def make_project(root: Path, kernels: int) -> Path:
    src = root / "multi_kernel"
    (src / "csrc").mkdir(parents=True)
    (src / "multi_kernel").mkdir()
    # torch first, as real packages do: the extension links against libc10, which `import torch` loads.
    (src / "multi_kernel" / "__init__.py").write_text("import torch  # noqa: F401\n\nfrom . import _C  # noqa: F401\n")
    for i in range(kernels):
        (src / "csrc" / f"k{i}.cu").write_text(KERNEL.format(i=i, scale="2.0"))
    decls = "".join(f"torch::Tensor op{i}(torch::Tensor x);\n" for i in range(kernels))
    defs = "".join(f'  m.def("op{i}", &op{i});\n' for i in range(kernels))
    # A new comment each run: the first build must really compile (fill the ccache), not be served
    # from an earlier run's layer cache while the ccache mount is empty (a cold run prunes it).
    (src / "csrc" / "bind.cpp").write_text(f"// bench run {uuid.uuid4().hex}\n#include <torch/extension.h>\n{decls}\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n")
    sources = ", ".join(f'"csrc/k{i}.cu"' for i in range(kernels))
    (src / "setup.py").write_text(
        "from setuptools import setup\nfrom torch.utils.cpp_extension import BuildExtension, CUDAExtension\n"
        f'setup(name="multi-kernel", version="0.1.0", packages=["multi_kernel"],\n'
        f'      ext_modules=[CUDAExtension("multi_kernel._C", ["csrc/bind.cpp", {sources}])],\n'
        '      cmdclass={"build_ext": BuildExtension})\n')
    return src


def build(src: Path, work: Path) -> tuple[float, dict]:
    cell = ["--source", str(src), "--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--flavor", "pypi",
            "--base-image", "imagegen-test/python:3.11-bookworm", "--arch", "8.0"]
    t0 = time.perf_counter()
    proc = subprocess.run([IMAGEGEN, "build", *cell, "--out", str(work / "out"), "--work", str(work / "w"), "--json"],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(proc.stdout[-2000:] + proc.stderr[-3000:])
    return seconds, json.loads(proc.stdout)[0].get("ccache") or {}


def prune_ccache() -> None:
    """Remove only the ccache cache mount (not the pip cache or any layer): its BuildKit record is
    the one whose description names the id imagegen-ccache."""
    du = subprocess.run(["docker", "buildx", "du", "--verbose"], capture_output=True, text=True, check=True).stdout
    ids = [re.search(r"^ID:\s*(\S+)", block, re.M).group(1) for block in du.split("\n\n")
           if 'id "/imagegen-ccache"' in block and re.search(r"^ID:", block, re.M)]
    if not ids:
        sys.exit("no imagegen-ccache cache mount found to prune")
    for record in ids:
        subprocess.run(["docker", "builder", "prune", "-f", "--filter", f"id={record}"], check=True, capture_output=True)
    left = subprocess.run(["docker", "buildx", "du", "--verbose"], capture_output=True, text=True).stdout
    if 'id "/imagegen-ccache"' in left:
        sys.exit("the imagegen-ccache cache mount is still there after pruning")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="imagegen-bench-ccache-") as tmp:
        root = Path(tmp)
        src = make_project(root, args.kernels)
        first, first_cc = build(src, root)
        print(f"first build: {first:.1f} s, ccache {first_cc}")
        results = {}
        for label, prune in (("warm", False), ("cold", True)):
            if prune:
                prune_ccache()
            # A real edit of one kernel (a new constant), different each time so the layer re-runs.
            edited = src / "csrc" / "k0.cu"
            edited.write_text(KERNEL.format(i=0, scale="3.0" if label == "warm" else "4.0"))
            seconds, cc = build(src, root)
            results[label] = {"seconds": round(seconds, 1), "ccache": cc}
            print(f"{label} ccache rebuild after editing 1 of {args.kernels} kernels: {seconds:.1f} s, ccache {cc}")
        shutil.rmtree(root / "w", ignore_errors=True)
    print(json.dumps({"kernels": args.kernels, "first_s": round(first, 1), **results}, indent=2))


if __name__ == "__main__":
    main()
