"""Benchmark: imagegen's peak-RAM estimate against the peaks measured on the H100 host.

For each recorded native build (docs/records/gpu-results/2026-11-24/proof*: the audit report written before
the build, the variables the build ran with from the first line of build.log, the peak RAM over the
idle baseline from mem.json) it recomputes

- the estimate imagegen printed then (jobs x min(threads, targets of the whole arch list) x the
  recipe's memory per thread),
- the audit-based estimate (imagegen.model.jobs.peak_estimate) with the recipe's memory per thread, and
  with a figure given on the command line (--per-thread RECIPE=GB, to try a calibration),

and what imagegen would choose now on that host (16 cores, 125 GiB). Run:

    .venv/bin/python benchmarks/bench_ram_estimate.py [--per-thread causal-conv1d=0.75]

Results are written down in benchmarks/RESULTS.md ("Peak-RAM estimate").
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from imagegen.model import jobs
from imagegen.model.catalogue import load_catalogue

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "docs" / "records" / "gpu-results" / "2026-11-24"
H100 = jobs.Host(cpus=16, mem_gb=125 * jobs.RAM_SHARE)  # host.txt: 16 cores, `free -g` total 125


def build_env(folder: Path) -> dict:
    first = (folder / "build.log").read_text(errors="replace").splitlines()[0]
    return json.loads(first.split("build env: ", 1)[1])


def printed_estimate(folder: Path) -> float | None:
    m = re.search(r"about (\d+) GB of RAM at the peak", (folder / "build.out").read_text(errors="replace"))
    return float(m.group(1)) if m else None


def cases():
    cat = load_catalogue()
    for folder, recipe_name, arch in ((RUNS / "proof1", "sageattention", "8.0 8.6 9.0 12.0+PTX"),
                                      (RUNS / "proof2", "causal-conv1d", "8.0;9.0;12.0")):
        yield folder, cat.get(recipe_name), arch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-thread", action="append", default=[], metavar="RECIPE=GB",
                    help="try another memory-per-thread figure for a recipe")
    args = ap.parse_args()
    override = {k: float(v) for k, v in (x.split("=", 1) for x in args.per_thread)}

    rows = []
    for folder, recipe, arch in cases():
        env = build_env(folder)
        report = json.loads((folder / "audit.json").read_text())
        measured = json.loads((folder / "mem.json").read_text())["peak_over_baseline_gib"]
        profile = jobs.load_profile(report, recipe.source_memory_gb)  # with the recipe's per-source figures
        ext_max = recipe.ext_parallel_max if recipe.ext_parallel_env else 0
        per_ext = int(env["MAX_JOBS"])
        parallel = int(env.get(recipe.ext_parallel_env or "", 0) or 0)
        total = per_ext * parallel if parallel else per_ext  # MAX_JOBS as imagegen chose it (the whole budget)
        threads = int(env["NVCC_THREADS"])
        figure = override.get(recipe.name, recipe.memory_per_thread_gb)
        est = jobs.peak_estimate(profile, total, threads, figure, ext_max)
        with_recipe = jobs.peak_estimate(profile, total, threads, recipe.memory_per_thread_gb, ext_max)
        now = jobs.settings_for(figure, recipe.default_nvcc_threads, H100, profile=profile, ext_parallel_max=ext_max)
        split = jobs.split_extensions(now.max_jobs, ext_max) if ext_max else (1, now.max_jobs)
        old = printed_estimate(folder)
        rows.append((recipe, arch, env, total, measured, old, with_recipe, est, figure, now, split))

    print("| build (H100, 16 cores) | ran with | measured peak over idle | printed then | audit model, recipe figure | audit model, calibrated figure | now on this host |")
    print("|---|---|---|---|---|---|---|")
    for recipe, arch, env, total, measured, old, with_recipe, est, figure, now, split in rows:
        ran = ", ".join(f"{k}={env[k]}" for k in ("EXT_PARALLEL", "MAX_JOBS", "NVCC_THREADS") if k in env)
        old_s = f"{old:.0f} GB ({old / measured:.1f}x)" if old else "-"
        named = "".join(f", {k.rsplit('/', 1)[-1]} {v}" for k, v in recipe.source_memory_gb.items())
        rec = f"{with_recipe.gb:.1f} GB ({with_recipe.gb / measured:.2f}x; {recipe.memory_per_thread_gb} GB/thread{named})"
        cal = f"{est.gb:.1f} GB ({est.gb / measured:.2f}x; {figure} GB/thread)"
        chosen = (f"MAX_JOBS={now.max_jobs} ({recipe.ext_parallel_env}={split[0]} x MAX_JOBS={split[1]})"
                  if recipe.ext_parallel_env else f"MAX_JOBS={now.max_jobs}")
        print(f"| {recipe.distribution} `{arch}` | {ran}: {est.nvcc} nvcc, {est.threads} busy threads | {measured:.1f} GiB"
              f" | {old_s} | {rec} | {cal} | {chosen} NVCC_THREADS={now.nvcc_threads}: {now.peak_gb:.1f} GB |")
    sage_one_arch_runs()


def sage_one_arch_runs() -> None:
    """SageAttention `9.0` builds of sessions 2-6 (no audit recorded then): the 4-arch audit's
    extensions and files with one chain each (sm_90a only), against their measured peaks (total used
    memory, sampled every second; minus the 0.55 GiB idle baseline of the 4-arch run's machine)."""
    recipe = load_catalogue().get("sageattention")
    report = json.loads((RUNS / "proof1" / "audit.json").read_text())
    one = jobs.load_profile({"extensions": [dict(e, cuda_sources=[{"targets": ["sass:sm_90a"]}] * len(e["cuda_sources"]))
                                            for e in report["extensions"]]})
    runs = {}
    for path in sorted((ROOT / "docs" / "records" / "gpu-results").glob("2026-11-2[23]/*sageattention*.json")):
        data = json.loads(path.read_text())
        env = data.get("imagegen_env") or data.get("plain_env") or {}
        for key in ("imagegen_peak_gb", "plain_peak_gb"):
            if isinstance(data.get(key), (int, float)) and env.get("TORCH_CUDA_ARCH_LIST") == "9.0":
                runs.setdefault((int(env["EXT_PARALLEL"]), int(env["MAX_JOBS"])), []).append(data[key] - 0.55)
    print()
    print("| SageAttention `9.0` (one chain per file) | runs | measured peak over idle | audit model |")
    print("|---|---|---|---|")
    for (parallel, per_ext), peaks in sorted(runs.items()):
        est = jobs.peak_estimate(one, parallel * per_ext, 8, recipe.memory_per_thread_gb, recipe.ext_parallel_max)
        print(f"| EXT_PARALLEL={parallel} x MAX_JOBS={per_ext}: {est.nvcc} nvcc | {len(peaks)} | "
              f"{min(peaks):.1f}-{max(peaks):.1f} GiB | {est.gb:.1f} GB ({est.gb / max(peaks):.2f}-{est.gb / min(peaks):.2f}x) |")


if __name__ == "__main__":
    main()
