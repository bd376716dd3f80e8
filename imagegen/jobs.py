"""How much to compile at once: MAX_JOBS x NVCC_THREADS from free RAM and cores.

nvcc's peak memory is roughly (jobs) x (threads per job) x (memory per thread), and the per-thread
figure depends on the package (recipes carry it: FA2 ~5 GB, SageAttention ~1.5 GB). Bake starts
every target of a run at once and has no limit of its own, so when several cells build together
they share one budget: imagegen sizes the batch and gives each target its share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    cpus: int
    mem_gb: float  # what builds may plan for (a share of the total)

    def describe(self) -> str:
        return f"{self.cpus} cores, {self.mem_gb:.0f} GB RAM for builds"


# Share of the machine's RAM a build may plan for. Total rather than momentarily free memory: the
# job counts are build args, and a value that moved with the page cache would change the cache key
# of the compile step on every run.
RAM_SHARE = 0.8


def host() -> Host:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mem_gb = 0.0
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_gb = int(line.split()[1]) / 1024 / 1024 * RAM_SHARE
    except OSError:
        mem_gb = 8.0  # unknown: assume a small machine rather than risk an OOM kill
    return Host(cpus=max(1, cpus), mem_gb=mem_gb)


@dataclass(frozen=True)
class JobSettings:
    max_jobs: int
    nvcc_threads: int
    peak_gb: float

    def describe(self) -> str:
        return f"MAX_JOBS={self.max_jobs} NVCC_THREADS={self.nvcc_threads} (~{self.peak_gb:.0f} GB peak)"


def settings_for(memory_per_thread_gb: float, default_threads: int, h: Host, *, share: int = 1,
                 max_jobs: int | None = None, nvcc_threads: int | None = None, targets: int = 0) -> JobSettings:
    """One build's jobs when ``share`` builds run side by side on ``h``.

    ``targets`` is how many -gencode targets (SASS + PTX) each nvcc call compiles: nvcc --threads
    works on those in parallel, so a job never runs more busy threads than that (a 9.0-only build
    of SageAttention, --threads=8 hard-coded, peaked at ~2.3 GB per job on an H100 host, not 8x).
    A machine with little RAM gets MAX_JOBS=1 and NVCC_THREADS=1 (seed 002's OOM workaround) rather
    than an OOM kill; an explicit value always wins.
    """
    cpus = max(1, h.cpus // share)
    mem = max(0.5, h.mem_gb / share)
    threads = nvcc_threads or default_threads
    if nvcc_threads is None and mem < memory_per_thread_gb * threads:
        threads = max(1, int(mem // memory_per_thread_gb))
    busy = min(threads, targets) if targets > 0 else threads
    jobs = max_jobs or max(1, min(cpus, int(mem // (memory_per_thread_gb * busy))))
    return JobSettings(max_jobs=jobs, nvcc_threads=threads, peak_gb=jobs * busy * memory_per_thread_gb)


def split_extensions(total_jobs: int, ext_max: int) -> tuple[int, int]:
    """Share ``total_jobs`` compile jobs between extensions a package builds side by side
    (SageAttention's EXT_PARALLEL): up to ``ext_max`` extensions at once, each with MAX_JOBS jobs, so
    that EXT_PARALLEL x MAX_JOBS never exceeds the budget. Returns (ext_parallel, max_jobs per extension).
    The in-build script (imagegen_build.py) has the same rule in stdlib form."""
    parallel = max(1, min(ext_max, total_jobs))
    return parallel, max(1, total_jobs // parallel)


def batch_size(n_cells: int, h: Host, heaviest_gb_per_thread: float) -> int:
    """How many cells bake builds at once: each needs at least one job of one nvcc thread and a
    core, and the first minutes of a cell are downloads, which overlap well."""
    by_mem = int(h.mem_gb // max(heaviest_gb_per_thread, 0.5))
    return max(1, min(n_cells, h.cpus, by_mem, 4))
