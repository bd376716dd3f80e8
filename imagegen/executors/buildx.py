"""Execute: build the buildable cells of a plan with docker buildx bake, then collect and verify.

Before anything compiles, every cell's ``audit-report`` stage runs the package's own build with
stand-in compilers inside its builder image (imagegen.model.audit): a cell whose build would fail or miss
a requested arch is refused there, in seconds once the image's layers exist, with the audit's table
in the log; the verdict of a cell that builds goes into its manifest.

bake cancels every target when one fails and starts all targets at once, so imagegen runs the
cells in batches sized by RAM and cores, gives each target its share of MAX_JOBS x NVCC_THREADS,
re-runs the targets a failure cancelled, and keeps going: one broken cell never costs the wheels of
the others. Each target exports to its own staging folder under the work directory; only a wheel
that passed verification is published (atomically) into the output folder.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from imagegen import engine, interrupt
from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.errors import UsageError
from imagegen.executors import bases
from imagegen.executors.bake_log import LOG_SUFFIX, TargetLogs
from imagegen.executors.bake_run import Run, prepare_run, run_bake
from imagegen.executors.buildx_audit import audit_gate
from imagegen.model import jobs
from imagegen.model.cell import DEFAULT_PLATFORM, Cell, Plan
from imagegen.render.dockerfile import cell_inputs
from imagegen.model.cell import CellResult, Finisher

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Compile:
    """What every compile of one `build` is given, resolved once by build() and handed down to each
    builder's share and batch: where wheels go and the step that takes them there (``finish``:
    imagegen.finish.finisher.finish, handed in by the command), each cell's inputs hash, the job limits, the
    audit gate, the budget and the shared compile cache."""
    out: Path
    finish: "Finisher"
    hashes: Mapping[str, str]
    max_jobs: int | None
    nvcc_threads: int | None
    audit: bool
    budget: int | None
    compile_cache: str | None


def build(plan: Plan, *, out: Path, work: Path, finish: "Finisher", force: bool = False, max_jobs: int | None = None,
          nvcc_threads: int | None = None, builders: Sequence[str] = (), ca_bundle: str | None = None,
          netrc: str | None = None,
          cache_from: Sequence[str] = (), cache_to: Sequence[str] = (), audit: bool = True, budget: int | None = None,
          compile_cache: str | None = None, say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> list[CellResult]:
    """Build the plan's cells, each audited first (``audit``), each built one handed to ``finish``
    (imagegen.finish.finisher.finish: verify, then collect into ``out``). With several ``builders`` the cells
    are dealt out between them and each builder runs its share on its own (bake sends every
    same-platform target of one run to one node, so spreading a matrix over a build farm has to
    happen here)."""
    out = out.resolve()
    work = work.resolve()
    results: dict[str, CellResult] = {}
    todo: list[Cell] = []
    hashes: dict[str, str] = {}
    # A cell with fallback base images builds on the first one that can be had (its manifest says which).
    cells, no_base = bases.pick(plan.buildable, say)
    for cell in plan.buildable:
        if cell.name in no_base:
            results[cell.name] = CellResult(cell, "failed", error=no_base[cell.name])
            say(f"[{cell.name}] {no_base[cell.name]}")
    computed = {cell.name: cell_inputs(cell) for cell in cells}  # once: the up-to-date check and the Dockerfiles
    for cell in cells:
        h = computed[cell.name].inputs_hash
        hashes[cell.name] = h
        existing = None if force else wheelhouse.up_to_date(out, cell, h)
        if existing:
            results[cell.name] = CellResult(cell, "up-to-date", wheel=existing)
            say(f"[{cell.name}] up to date: {existing}")
            continue
        refused = wheelhouse.replacement_refused(out, cell, force=force, say=lambda m, c=cell: say(f"[{c.name}] {m}"))
        if refused:  # said once, when the results are reported (executors.results.report)
            results[cell.name] = CellResult(cell, "refused", error=refused)
            continue
        todo.append(cell)
    if not todo:
        return [results[c.name] for c in plan.buildable]

    todo = runnable_platforms(todo, builders, results)
    if not todo:
        return [results[c.name] for c in plan.buildable]

    run = prepare_run(todo, work, ca_bundle=ca_bundle, cache_from=cache_from, cache_to=cache_to, netrc=netrc,
                      inputs=computed)
    given = Compile(out=out, finish=finish, hashes=hashes, max_jobs=max_jobs, nvcc_threads=nvcc_threads, audit=audit,
                    budget=budget, compile_cache=compile_cache)
    validate_cache_support(list(builders) or [None], cache_to)

    if len(builders) > 1:
        # Dealt by the cell's place in the whole plan, not in what is left to do: the same matrix on the same
        # builders gives each cell the same builder on every run, where a stopped compile's tree is kept.
        place = {c.name: i for i, c in enumerate(plan.buildable)}
        shares = {b: [c for c in todo if place[c.name] % len(builders) == k] for k, b in enumerate(builders)}
        say(f"splitting {len(todo)} cell(s) over {len(builders)} builders: "
            + ", ".join(f"{b} ({len(cs)})" for b, cs in shares.items()))
        from concurrent.futures import ThreadPoolExecutor

        # The pool outermost: on a signal the children are stopped first, so its threads can end.
        with ThreadPoolExecutor(max_workers=len(builders)) as pool, interrupt.stopping_children():
            futures = [pool.submit(_run_cells, cs, run, run.dir / "logs" / b, b, given, say)
                       for b, cs in shares.items() if cs]
            for f in futures:
                results.update(f.result())
    else:
        with interrupt.stopping_children():
            results.update(_run_cells(todo, run, run.dir / "logs", builders[0] if builders else None, given, say))
    return [results[c.name] for c in plan.buildable]


def builder_platforms(inspect_text: str) -> set[str]:
    """The platforms a builder can run build steps for: the "Platforms:" line(s) of ``docker buildx
    inspect`` (linux/arm64 there once QEMU's binfmt handler is registered, or on an arm64 node)."""
    found: set[str] = set()
    for line in inspect_text.splitlines()[:4096]:
        key, _, value = line.partition(":")
        if key.strip() == "Platforms":
            found.update(p.strip().rstrip("*") for p in value.split(",") if p.strip())
    return found


def runnable_platforms(cells: list[Cell], builders: Sequence[str], results: dict[str, CellResult]) -> list[Cell]:
    """``cells`` less those for a platform the builder(s) cannot run (recorded as refused, saying how
    to get it), found before anything is built: BuildKit would fail with "exec format error" later."""
    wanted = {c.platform for c in cells if c.platform != DEFAULT_PLATFORM}
    if not wanted:
        return cells
    offered: set[str] | None = None
    for b in list(builders) or [None]:
        proc = engine.docker("buildx", "inspect", *([b] if b else []), timeout=60)
        have = builder_platforms(proc.stdout) if proc.returncode == 0 else set()
        offered = have if offered is None else offered & have
    keep = []
    for c in cells:
        if c.platform == DEFAULT_PLATFORM or c.platform in (offered or set()):
            keep.append(c)
            continue
        error = (f"the builder cannot run {c.platform} build steps (it offers {', '.join(sorted(offered or ())) or 'none'}):"
                 " register QEMU for it (sudo imagegen setup qemu, or `docker run --privileged --rm tonistiigi/binfmt"
                 " --install arm64`), or build on an arm64 node (--builder)")
        results[c.name] = CellResult(c, "refused", error=error)
    return keep


def validate_cache_support(builders: list[str | None], cache_to: Sequence[str]) -> None:
    """The docker driver exports inline cache only (anything else fails, or is dropped for gha/s3):
    say so before a long build rather than after it."""
    exported = [c for c in cache_to if "type=inline" not in c]
    if not exported:
        return
    for b in builders:
        if engine.builder_driver(b) == "docker":
            raise UsageError(f"builder {b or '(current)'} uses the docker driver, which exports only inline cache:"
                             " use --cache-to type=inline, or a docker-container / remote / kubernetes builder (--builder)")


def _run_cells(todo: list[Cell], run: Run, log_dir: Path, builder: str | None, given: Compile,
               say: Callable[[str], None]) -> dict[str, CellResult]:
    """Audit ``todo`` on one builder, then compile what the audit lets through."""
    results: dict[str, CellResult] = {}
    logs = TargetLogs(log_dir, [c.name for c in todo], say=say)
    try:
        verdicts: dict[str, dict] = {}
        if given.audit:
            todo = audit_gate(todo, run, logs, builder, results, verdicts, say)
        if todo:
            _compile_cells(todo, run, logs, builder, given, verdicts, results, say)
    finally:
        logs.close()
    return results


def _compile_cells(todo: list[Cell], run: Run, logs: TargetLogs, builder: str | None, given: Compile,
                   verdicts: dict[str, dict], results: dict[str, CellResult], say: Callable[[str], None]) -> None:
    """Bake ``todo`` in RAM-sized batches, re-running what a failing neighbour cancelled."""
    stage = run.stage
    h = jobs.host()
    heaviest = max(c.recipe.heaviest_gb_per_thread for c in todo)
    size = jobs.batch_size(len(todo), h, heaviest)
    say(f"building {len(todo)} cell(s){' on builder ' + builder if builder else ''} ({h.describe()}),"
        f" {size} at a time; logs in {logs.folder}")
    queue = list(todo)
    started: dict[str, float] = {}

    def on_step(target: str, step: str) -> None:
        say(f"[{target}] {step}")

    while queue:
        batch, queue = queue[:size], queue[size:]
        for c in batch:
            s = jobs.settings_for(c.recipe.heaviest_gb_per_thread, c.recipe.default_nvcc_threads, h,
                                  share=len(batch), max_jobs=given.max_jobs, nvcc_threads=given.nvcc_threads,
                                  targets=c.gencode_targets)
            # A secret, not build args: the batch's size is no cache key (the log target reuses the build).
            run.jobs_file(c.name).write_text(f"MAX_JOBS={s.max_jobs}\nNVCC_THREADS={s.nvcc_threads}\n"
                                             + (f"IMAGEGEN_BUILD_BUDGET={given.budget}\n" if given.budget else ""))
            say(f"[{c.name}] {s.describe()}")
            started[c.name] = time.time()
            shutil.rmtree(stage / c.name, ignore_errors=True)
            shutil.rmtree(stage / (c.name + LOG_SUFFIX), ignore_errors=True)
        names = [c.name for c in batch]
        ok = run_bake(run.bake_file, names + [n + LOG_SUFFIX for n in names], logs, on_step, builder, run.ca,
                      given.compile_cache)
        for c in batch:
            wheels = sorted((stage / c.name).glob("*.whl")) if (stage / c.name).is_dir() else []
            if wheels:
                results[c.name] = _finish(given, c, wheels, logs, started[c.name], stage / (c.name + LOG_SUFFIX),
                                          verdicts.get(c.name))
            elif ok or c.name in logs.failed or len(batch) == 1:
                error = "the build produced no wheel" if ok else "the build failed"
                if logs.errors.get(c.name):  # the compiler's first error leads
                    error = f"{logs.errors[c.name]} ({error})"
                if not ok and logs.bake_error and c.name not in logs.failed:
                    error = f"bake failed before building: {logs.bake_error}"
                error = bases.not_pulled(c, [logs.bake_error, *logs.tail(c.name)]) or error
                results[c.name] = CellResult(c, "failed", log=logs.folder / f"{c.name}.log",
                                             seconds=time.time() - started[c.name], error=error,
                                             log_tail=logs.tail(c.name), audit=verdicts.get(c.name))
            else:
                # Cancelled because another target of the batch failed: build it again, alone.
                say(f"[{c.name}] cancelled by a failing neighbour; queued again on its own")
                queue.append(c)
                size = 1


def _finish(given: Compile, cell: Cell, wheels: list[Path], logs: TargetLogs, started: float, reports: Path,
            audit: dict | None = None) -> CellResult:
    # The compile log from the build itself (complete even when bake clipped or cached the step).
    log = reports / "build.log" if (reports / "build.log").is_file() else logs.folder / f"{cell.name}.log"
    smoke, ccache = _smoke_report(reports / "smoke.json"), _json_or_none(reports / "ccache.json")
    record = {"smoke": smoke, "ccache": ccache}
    gpu_check = _json_or_none(reports / "gpu_check.json")  # --gpu-check-device: the check run inside the build
    if gpu_check is not None:
        record["gpu_check"] = gpu_check
    return given.finish(cell, wheels, out=given.out, inputs=given.hashes[cell.name], log=log,
                        seconds=time.time() - started, audit=audit, smoke=smoke, ccache=ccache, record=record)


def _json_or_none(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None




def _smoke_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()).get("imports")
    except (OSError, ValueError, AttributeError):
        return None


