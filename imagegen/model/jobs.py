"""How much to compile at once: MAX_JOBS x NVCC_THREADS from free RAM and cores.

Bake starts every target of a run at once and has no limit of its own, so when several cells build
together they share one budget: imagegen sizes the batch and gives each target its share.

Two estimates of a build's peak RAM:

- without an audit, roughly (jobs) x (busy threads per job) x (memory per thread), every job
  assumed to compile the whole arch list; the per-thread figure is the recipe's
  (``memory_per_thread_gb``: FA2 ~5 GB, SageAttention ~2.5 GB);
- with the gencode audit (``build --native`` runs it before compiling), from what really runs at
  once (``peak_estimate``): each extension's nvcc processes (min(MAX_JOBS, its CUDA sources), its
  heaviest sources first; EXT_PARALLEL extensions side by side, the heaviest ones), each nvcc with
  a host part (``NVCC_HOST_GB``: nvcc, cudafe++, the host compiler on torch's headers) plus one
  recipe figure per busy thread, min(--threads, its compile chains). A chain is one virtual arch
  (cicc, then ptxas for its SASS): sm_120 + compute_120 is one chain, sm_80 + sm_86 two.

Calibration (H100 host, 16 cores, 125 GiB, torch 2.11 cu130, nvcc 13.0; peaks over the idle baseline,
sampled every 0.5-1 s; docs/records/gpu-results/, benchmarks/RESULTS.md "Peak-RAM estimate"):

  SageAttention 2.2.0 `9.0`, EXT_PARALLEL 4 x MAX_JOBS 2:  5 nvcc x 1 chain    16.8-17.6 GiB (3.5 per nvcc)
  SageAttention 2.2.0 `9.0`, EXT_PARALLEL 4 x MAX_JOBS 4:  7 nvcc x 1 chain    20.8-24.1 GiB (3.0-3.5)
  SageAttention 2.2.0 `8.0 8.6 9.0 12.0+PTX`, 4 x 2:        5 nvcc, 13 busy threads  37.8 GiB
  -> per nvcc host part + per thread: H + T = 3.5 and 5 H + 13 T = 37.8: T = 2.5 (the recipe's
     figure), H = 1.0 (NVCC_HOST_GB); predicted 17.5 / 24.5 / 37.5 GiB
  causal-conv1d 1.6.1 `8.0;9.0;12.0` (compiles 9 archs), MAX_JOBS 16, --threads 4: 3 nvcc x 4 busy
  threads, 8.6 GiB: 3 H + 12 T = 8.6 gives T = 0.47 as if all three files peaked together. They do
  not: bwd.cu's ptxas alone peaks at 3.1 GiB per arch, fwd.cu and update.cu whole at 0.3-0.5 GiB
  and they finish in seconds, so the peak is bwd's 4 threads. 0.75 per thread fits this build
  (12.0 GiB, 1.39x) as an effective figure; a per-source figure would be the honest one.
  Block-Sparse-Attention 0.0.2.post1 `9.0` (sm_90 + compute_90: one chain), MAX_JOBS 16: 16 nvcc,
  51-56 GiB total: H + T = 3.4 (the recipe's 5.0 per thread over-estimates it 1.8x: safe side)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

# The rules themselves live in the stdlib module every builder image carries, so that a build in
# Docker and a native build size their jobs by the same code.
from imagegen.shipped.builder import imagegen_rules as rules


@dataclass(frozen=True)
class Host:
    cpus: int
    mem_gb: float  # what builds may plan for (a share of the total)

    def describe(self) -> str:
        return f"{self.cpus} cores, {self.mem_gb:.0f} GB RAM for builds"


RAM_SHARE = rules.RAM_SHARE


def host() -> Host:
    cpus, mem_gb = rules.host_facts()
    return Host(cpus=cpus, mem_gb=mem_gb)


@dataclass(frozen=True)
class JobSettings:
    max_jobs: int
    nvcc_threads: int
    peak_gb: float
    estimate: "PeakEstimate | None" = None  # from the audit's per-extension load, when there was one

    def describe(self) -> str:
        if self.estimate is not None:  # same start as below: scripts/gpu/proof_multiarch.sh reads "(~N GB peak)"
            e = self.estimate
            return (f"MAX_JOBS={self.max_jobs} NVCC_THREADS={self.nvcc_threads} (~{e.gb:.0f} GB peak) from the audit:"
                    f" {e.nvcc} nvcc at once, {e.threads} busy threads")
        return f"MAX_JOBS={self.max_jobs} NVCC_THREADS={self.nvcc_threads} (~{self.peak_gb:.0f} GB peak)"


NVCC_HOST_GB = rules.NVCC_HOST_GB


@dataclass(frozen=True)
class ExtensionLoad:
    """What one extension's build runs, from the gencode audit: per CUDA source the number of compile
    chains (virtual archs) nvcc works on, and the nvcc --threads its flags fix (None: not given)."""

    module: str
    chains: tuple[int, ...]
    threads: int | None = None
    # GB per busy thread of each source, where the recipe names one (causal-conv1d's bwd.cu: ptxas
    # takes ~2 GB per chain where its other files take a fraction); None: the recipe's figure.
    gb_per_thread: tuple[float | None, ...] = ()

    def as_load(self) -> dict:
        """As the rules (and the in-build script's cell file) take it."""
        return {"module": self.module, "chains": list(self.chains), "threads": self.threads,
                **({"gb": list(self.gb_per_thread)} if self.gb_per_thread else {})}


compile_chains = rules.compile_chains
_flag_threads = rules.flag_threads
_MAX_LOAD_EXTENSIONS = 500
_MAX_LOAD_SOURCES = 5000


def source_figure(source: object, source_memory_gb: Mapping[str, float]) -> float | None:
    """The recipe's GB per thread for ``source`` (a path the audit recorded): the entry whose key is
    the path's tail at a folder boundary (`csrc/causal_conv1d_bwd.cu` or `causal_conv1d_bwd.cu`), or
    a folder key (ending in `/`: `flash-attention/hopper/`) that the path lies under; a file's own
    key first."""
    path = str(source).replace("\\", "/") if isinstance(source, str) else ""
    for key, gb in source_memory_gb.items():
        if not key.endswith("/") and (path == key or path.endswith("/" + key)):
            return gb
    for key, gb in source_memory_gb.items():
        if key.endswith("/") and (path.startswith(key) or "/" + key in path):
            return gb
    return None


def load_profile(report: object, source_memory_gb: Mapping[str, float] | None = None) -> tuple[ExtensionLoad, ...]:
    """Each extension's compile load from an audit report (the in-build script's JSON, as written;
    bounded, since a package's build wrote what is in it), with the recipe's per-source figures.
    Empty when the report says nothing."""
    if not isinstance(report, dict) or not isinstance(report.get("extensions"), list):
        return ()
    figures = dict(source_memory_gb or {})
    out = []
    for ext in report["extensions"][:_MAX_LOAD_EXTENSIONS]:
        if not isinstance(ext, dict) or not isinstance(ext.get("cuda_sources"), list):
            continue
        sources = [src for src in ext["cuda_sources"][:_MAX_LOAD_SOURCES] if isinstance(src, dict)]
        chains = tuple(compile_chains(src.get("targets") if isinstance(src.get("targets"), list) else [])
                       for src in sources)
        if chains:
            flags = ext.get("nvcc_flags") if isinstance(ext.get("nvcc_flags"), list) else []
            gb = tuple(source_figure(src.get("source"), figures) for src in sources) if figures else ()
            out.append(ExtensionLoad(str(ext.get("module") or "?")[:200], chains, _flag_threads(flags[:200]),
                                     gb if any(g is not None for g in gb) else ()))
    return tuple(out)


@dataclass(frozen=True)
class PeakEstimate:
    gb: float
    nvcc: int  # nvcc processes at once
    threads: int  # their busy device threads

    def describe(self) -> str:
        return f"~{self.gb:.0f} GB peak: {self.nvcc} nvcc at once, {self.threads} busy threads"


def peak_estimate(profile: Sequence[ExtensionLoad], total_jobs: int, nvcc_threads: int, memory_per_thread_gb: float,
                  ext_parallel_max: int = 0, host_gb: float = NVCC_HOST_GB) -> PeakEstimate:
    """The peak RAM of a build whose audit found ``profile``, with MAX_JOBS ``total_jobs``
    (imagegen_rules.peak_estimate: what runs at once per extension, each nvcc a host part plus the
    source's figure per busy thread)."""
    return PeakEstimate(*rules.peak_estimate([e.as_load() for e in profile], total_jobs, nvcc_threads,
                                             memory_per_thread_gb, ext_parallel_max, host_gb))


def settings_for(memory_per_thread_gb: float, default_threads: int, h: Host, *, share: int = 1,
                 max_jobs: int | None = None, nvcc_threads: int | None = None, targets: int = 0,
                 profile: Sequence[ExtensionLoad] = (), ext_parallel_max: int = 0,
                 host_gb: float = NVCC_HOST_GB) -> JobSettings:
    """One build's jobs when ``share`` builds run side by side on ``h`` (imagegen_rules.job_settings:
    a 9.0-only build of SageAttention, --threads=8 hard-coded, peaked at ~2.3 GB per job on an H100
    host, not 8x; a machine with little RAM gets MAX_JOBS=1 and NVCC_THREADS=1, a Windows user's OOM
    workaround, rather than an OOM kill; an explicit value always wins)."""
    jobs, threads, peak_gb, est = rules.job_settings(
        memory_per_thread_gb, default_threads, max(1, h.cpus // share), h.mem_gb / share, max_jobs=max_jobs,
        nvcc_threads=nvcc_threads, targets=targets, extensions=[e.as_load() for e in profile],
        ext_max=ext_parallel_max, host_gb=host_gb)
    return JobSettings(max_jobs=jobs, nvcc_threads=threads, peak_gb=peak_gb,
                       estimate=PeakEstimate(*est) if est is not None else None)


split_extensions = rules.split_extensions


def batch_size(n_cells: int, h: Host, heaviest_gb_per_thread: float) -> int:
    """How many cells bake builds at once: each needs at least one job of one nvcc thread and a
    core, and the first minutes of a cell are downloads, which overlap well."""
    by_mem = int(h.mem_gb // max(heaviest_gb_per_thread, 0.5))
    return max(1, min(n_cells, h.cpus, by_mem, 4))
