"""Execute: build the buildable cells of a plan with docker buildx bake, then collect and verify.

Before anything compiles, every cell's ``audit-report`` stage runs the package's own build with
stand-in compilers inside its builder image (imagegen.audit): a cell whose build would fail or miss
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
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from imagegen import engine, interrupt, wheelhouse
from imagegen.errors import ImagegenError, UsageError
from imagegen.model import jobs
from imagegen.plan import Cell, Plan
from imagegen.render.bake import BakeDefinition, absolute_contexts, build_definition, to_json
from imagegen.render.bakefiles import write_dockerfiles
from imagegen.render.dockerfile import cell_document, inputs_hash
from imagegen.wheelhouse import CellResult, Finisher

if TYPE_CHECKING:
    from imagegen.audit import Verdict

# "#12 [sage-2_2_0-torch2_8-cu128-py312 builder 8/8] RUN ..." names the target of vertex 12.
LOG_SUFFIX = "--log"  # the companion target exporting a cell's build log and reports
AUDIT_SUFFIX = "--audit"  # the companion target exporting a cell's gencode audit report
AUDIT_BATCH = 8  # audit targets baked at once (no compiling; the deps layers download in parallel)
_HEADER = re.compile(r"^#(\d+) \[([A-Za-z0-9_-]+) ([A-Za-z0-9_-]+ )?(\d+/\d+)?\]? ?(.*)$")
_VERTEX = re.compile(r"^#(\d+) ")
_VERTEX_ERROR = re.compile(r"^#\d+ ERROR: ")
_TARGET_FAILED = re.compile(r"target ([A-Za-z0-9_-]+): failed to solve")


def cell_of(target: str) -> str:
    """The cell a bake target belongs to (its companion log and audit targets included)."""
    for suffix in (LOG_SUFFIX, AUDIT_SUFFIX):
        if target.endswith(suffix):
            return target[: -len(suffix)]
    return target


_OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")  # "#12 61.30 text": a vertex's output line
_DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s")
COMPILE_STEP = "imagegen_build.py build"  # the RUN of the compile stage
PROGRESS_EVERY_S = 45.0  # a compiling cell's console line at most this often


def _minutes(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


class TargetLogs:
    """Splits bake's plain progress into one log per target (vertices are named in their header).

    The logs are line-buffered: each grows while its target builds. With ``say``, the console also
    gets per-cell progress of the compile step: when it starts, a line at most every
    PROGRESS_EVERY_S seconds with the time so far and the last compiler line (the in-build script
    reports each finished nvcc and a heartbeat, so a long compile is never silent), and when it is
    done or failed (with the compiler's first error)."""

    def __init__(self, folder: Path, targets: Iterable[str], say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        cells = [t for t in targets if cell_of(t) == t]
        self.targets = set(cells) | {t + suffix for t in cells for suffix in (LOG_SUFFIX, AUDIT_SUFFIX)}
        self.owner: dict[str, str] = {}
        self.files = {t: (folder / f"{t}.log").open("a", encoding="utf-8", buffering=1) for t in cells}
        self.failed: set[str] = set()
        self.last: dict[str, str] = {}
        self.bake_error = ""  # bake's own last ERROR line (a bad definition fails before any target runs)
        self.errors: dict[str, str] = {}  # target -> the in-build script's "[imagegen] error: ..." text
        self.say = say
        self.clock = clock
        self.compiling: dict[str, list] = {}  # vertex -> [target, started, last line, last said, announced]
        self.sole: str | None = None  # the cell of the one target a bake runs (its lines name no target)

    def feed(self, line: str) -> tuple[str, str] | None:
        """Record one line; return (target, step) when a target starts a new step."""
        m = _TARGET_FAILED.search(line)
        if m and m.group(1) in self.targets:
            self.failed.add(cell_of(m.group(1)))
        h = _HEADER.match(line)
        if h and (h.group(2) in self.targets or (self.sole and h.group(4))):
            if h.group(2) in self.targets:
                # A cell's companion log and audit targets share its vertices: one log per cell.
                target, stage = cell_of(h.group(2)), (h.group(3) or "").strip()
            else:  # "#11 [base 6/6] RUN ...": bake names a vertex's target only when it runs several
                target, stage = self.sole, h.group(2)
            self.owner[h.group(1)] = target
            self.files[target].write(line + "\n")
            if COMPILE_STEP in line and h.group(1) not in self.compiling:
                now = self.clock()
                self.compiling[h.group(1)] = [target, now, "", now, False]  # says "compiling" at its first output
            if stage in ("context", "internal") or not h.group(4):
                return None
            step = f"{stage} {h.group(4)} {' '.join(h.group(5).split())[:70]}"
            if self.last.get(target) == step:  # BuildKit repeats a header when output interleaves
                return None
            self.last[target] = step
            return target, step
        v = _VERTEX.match(line)
        if v and v.group(1) in self.owner:
            target = self.owner[v.group(1)]
            self.files[target].write(line + "\n")
            if _VERTEX_ERROR.match(line):
                self.failed.add(target)
            self._progress(v.group(1), target, line)
        return None

    def _say(self, message: str) -> None:
        if self.say is not None:
            self.say(message)

    def _progress(self, vertex: str, target: str, line: str) -> None:
        """Per-cell console progress of the compile step (vertex ``vertex``)."""
        state = self.compiling.get(vertex)
        if state is None:
            return
        out = _OUTPUT.match(line)
        if out:
            if not state[4]:
                state[4] = True
                self._say(f"[{target}] compiling")
            text = out.group(2).strip()
            if text.startswith("[imagegen] error: ") and target not in self.errors:
                self.errors[target] = text[len("[imagegen] error: "):]
            elif text and not text.startswith("[imagegen] still compiling"):
                state[2] = text
            now = self.clock()
            if now - state[3] >= PROGRESS_EVERY_S:
                state[3] = now
                self._say(f"[{target}] compiling, {_minutes(now - state[1])}"
                          + (f", last: {state[2][:160]}" if state[2] else ""))
            return
        done = _DONE.match(line)
        if done or line.startswith(f"#{vertex} CACHED"):
            del self.compiling[vertex]
            if done and state[4]:
                self._say(f"[{target}] compiled in {_minutes(float(done.group(2)))}")
        elif _VERTEX_ERROR.match(line) or line.startswith(f"#{vertex} CANCELED"):
            del self.compiling[vertex]
            if line.startswith(f"#{vertex} CANCELED"):
                self._say(f"[{target}] compile cancelled after {_minutes(self.clock() - state[1])}")
            else:
                self._say(f"[{target}] compile failed after {_minutes(self.clock() - state[1])}: "
                          + (self.errors.get(target) or line.split(": ", 1)[-1])[:300])

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()

    def tail(self, target: str, n: int = 20) -> list[str]:
        """The lines that say what went wrong: the last error lines, then the last few lines."""
        if target in self.files:
            self.files[target].flush()
        try:
            lines = (self.folder / f"{target}.log").read_text(errors="replace").splitlines()
        except OSError:
            return []
        errors = [line for line in lines if _ERROR_LINE.search(line)][-(n - 3):]
        last = [line for line in lines[-3:] if line not in errors]
        return errors + last


def _bake(file: Path, targets: list[str], sets: dict[str, str], logs: TargetLogs,
          on_step: Callable[[str, str], None], builder: str | None, ca: str) -> bool:
    """Run one bake; True when it succeeded. Lines are split into per-target logs as they come."""
    logs.sole = cell_of(targets[0]) if len(targets) == 1 else None

    def on_line(line: str) -> None:
        step = logs.feed(line)
        if step:
            on_step(*step)

    try:
        engine.bake(file, targets, on_line=on_line, builder=builder, sets=sets,
                    variables={"BUILDX_BAKE_ENTITLEMENTS_FS": "0", "IMAGEGEN_PIP_CERT": ca,
                               # the file's own defaults apply, not the caller's values
                               "IMAGEGEN_TORCH_CUDA_ARCH_LIST": "", "IMAGEGEN_MAX_JOBS": "", "IMAGEGEN_NVCC_THREADS": ""})
        return True
    except engine.BakeFailed as exc:
        for line in exc.stderr.splitlines():
            m = _TARGET_FAILED.search(line)
            if m:
                logs.failed.add(cell_of(m.group(1)))
        logs.bake_error = next((line for line in reversed(exc.stderr.splitlines()) if line.startswith("ERROR")), "")
        return False


def default_ca_bundle() -> str | None:
    """The CA bundle builds trust for PyPI/git: the one pip on this host uses, else the system's."""
    import os

    for var in ("IMAGEGEN_PIP_CERT", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"):
        if Path(path).is_file():
            return path
    return None


def bake_data(definition: BakeDefinition, run_dir: Path, ca_bundle: str | None) -> tuple[dict, str]:
    """Write ``definition``'s Dockerfiles (at the paths it was built with, under ``run_dir``) and return
    its bake data with the pip_cert secret pointing at the CA bundle, and that bundle's path (bake
    must also get it as a variable). The bundle reaches builds only as that secret (mounted per RUN,
    never in a layer); with none on the host an empty file stands in, so the secret always resolves."""
    # The Dockerfiles' paths start with the run's dockerfiles_dir as given (relative to the current
    # folder when --work is).
    write_dockerfiles(definition, Path.cwd())
    data = definition.as_dict()
    ca = ca_bundle or default_ca_bundle()
    if ca is None:
        ca = str(run_dir / "no-ca-bundle.pem")
        Path(ca).write_text("")
    ca = str(Path(ca).resolve())
    data["variable"]["IMAGEGEN_PIP_CERT"]["default"] = ca
    return data, ca


@dataclass
class Run:
    """One run's folder: Dockerfiles, the bake file (cell, log and audit targets), staging, logs."""

    dir: Path
    stage: Path
    bake_file: Path
    ca: str
    # What becomes of a built cell (imagegen.finish.finish, handed in by the caller: verifying and
    # collecting come after this step).
    finish: "Finisher | None" = None


def new_run_dir(work: Path, tag: str = "") -> Path:
    """A run folder of its own: two runs started in one folder in the same second (two terminals, two
    CI steps) must not share Dockerfiles, bake file or staging."""
    import tempfile

    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S") + tag + "-", dir=runs))


def prepare_run(cells: list[Cell], work: Path, *, ca_bundle: str | None = None, cache_from: Sequence[str] = (),
                cache_to: Sequence[str] = (), command: str = "imagegen build", tag: str = "") -> Run:
    """Render ``cells`` into a run folder under ``work``: their Dockerfiles and one bake file with,
    per cell, the wheel target, its log companion (the ``buildlog`` stage: compile log + smoke report,
    so the wheels stage stays wheels-only and the reports are there even when every layer was cached)
    and its audit companion (the ``audit-report`` stage)."""
    run_dir = new_run_dir(work, tag)
    stage = run_dir / "stage"
    definition = build_definition(Plan(cells=cells), out_dir=str(stage), dockerfiles_dir=str(run_dir / "dockerfiles"),
                                  root=run_dir, command=command)
    bake_file = run_dir / "docker-bake.json"
    data, ca = bake_data(definition, run_dir, ca_bundle)
    for t in definition.targets:  # absolute outputs: python-on-whales cannot set bake's cwd
        data["target"][t.name]["output"] = [f"type=local,dest={stage / t.name}"]
        data["target"][t.name]["context"] = str(run_dir / "dockerfiles")
        data["target"][t.name]["contexts"] = absolute_contexts(t, run_dir / "dockerfiles")
    for t in definition.targets:
        for suffix, stage_name in ((LOG_SUFFIX, "buildlog"), (AUDIT_SUFFIX, "audit-report")):
            companion = dict(data["target"][t.name])
            companion["target"] = stage_name
            companion["output"] = [f"type=local,dest={stage / (t.name + suffix)}"]
            data["target"][t.name + suffix] = companion
    for name in list(data["target"]):
        if cache_from:
            data["target"][name]["cache-from"] = list(cache_from)
        if cache_to and cell_of(name) == name:
            data["target"][name]["cache-to"] = list(cache_to)
    bake_file.write_text(to_json(data))
    return Run(dir=run_dir, stage=stage, bake_file=bake_file, ca=ca)


def build(plan: Plan, *, out: Path, work: Path, finish: "Finisher", force: bool = False, max_jobs: int | None = None,
          nvcc_threads: int | None = None, builders: Sequence[str] = (), ca_bundle: str | None = None,
          cache_from: Sequence[str] = (), cache_to: Sequence[str] = (), audit: bool = True,
          say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> list[CellResult]:
    """Build the plan's cells, each audited first (``audit``), each built one handed to ``finish``
    (imagegen.finish.finish: verify, then collect into ``out``). With several ``builders`` the cells
    are dealt out between them and each builder runs its share on its own (bake sends every
    same-platform target of one run to one node, so spreading a matrix over a build farm has to
    happen here)."""
    out = out.resolve()
    work = work.resolve()
    results: dict[str, CellResult] = {}
    todo: list[Cell] = []
    hashes: dict[str, str] = {}
    for cell in plan.buildable:
        h = inputs_hash(cell, cell_document(cell))
        hashes[cell.name] = h
        existing = None if force else wheelhouse.up_to_date(out, cell, h)
        if existing:
            results[cell.name] = CellResult(cell, "up-to-date", wheel=existing)
            say(f"[{cell.name}] up to date: {existing}")
            continue
        refused = wheelhouse.replacement_refused(out, cell, force=force, say=lambda m, c=cell: say(f"[{c.name}] {m}"))
        if refused:
            results[cell.name] = CellResult(cell, "failed", error=refused)
            say(f"[{cell.name}] {refused}")
            continue
        todo.append(cell)
    if not todo:
        return [results[c.name] for c in plan.buildable]

    run = prepare_run(todo, work, ca_bundle=ca_bundle, cache_from=cache_from, cache_to=cache_to)
    run.finish = finish
    check_cache_support(list(builders) or [None], cache_to)

    if len(builders) > 1:
        shares = {b: [c for i, c in enumerate(todo) if i % len(builders) == k] for k, b in enumerate(builders)}
        say(f"splitting {len(todo)} cell(s) over {len(builders)} builders: "
            + ", ".join(f"{b} ({len(cs)})" for b, cs in shares.items()))
        from concurrent.futures import ThreadPoolExecutor

        # The pool outermost: on a signal the children are stopped first, so its threads can end.
        with ThreadPoolExecutor(max_workers=len(builders)) as pool, interrupt.stopping_children():
            futures = [pool.submit(_run_cells, cs, run, run.dir / "logs" / b, b, hashes, out,
                                   max_jobs, nvcc_threads, audit, say) for b, cs in shares.items() if cs]
            for f in futures:
                results.update(f.result())
    else:
        with interrupt.stopping_children():
            results.update(_run_cells(todo, run, run.dir / "logs", builders[0] if builders else None,
                                      hashes, out, max_jobs, nvcc_threads, audit, say))
    return [results[c.name] for c in plan.buildable]


@dataclass
class AuditOutcome:
    """One cell's audit in its builder image: a verdict, or why the audit could not run."""

    cell: Cell
    verdict: "Verdict | None"
    error: str = ""
    log: Path | None = None
    log_tail: list[str] = field(default_factory=list)


def audit(plan: Plan, *, work: Path, builder: str | None = None, ca_bundle: str | None = None,
          say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> list[AuditOutcome]:
    """`imagegen plan --audit`: each buildable cell's audit in its builder image, nothing compiled."""
    cells = list(plan.buildable)
    if not cells:
        return []
    run = prepare_run(cells, work.resolve(), ca_bundle=ca_bundle, command="imagegen plan --audit", tag="-audit")
    logs = TargetLogs(run.dir / "logs", [c.name for c in cells], say=say)
    try:
        with interrupt.stopping_children():
            outcomes = _audit_cells(cells, run, logs, builder, say)
    finally:
        logs.close()
    return [outcomes[c.name] for c in cells]


def _audit_cells(cells: list[Cell], run: Run, logs: TargetLogs, builder: str | None,
                 say: Callable[[str], None]) -> dict[str, AuditOutcome]:
    """Bake the cells' audit-report targets (AUDIT_BATCH at once, a cancelled one again alone) and
    judge each report."""
    from imagegen.audit import AuditReport, judge_cell

    outcomes: dict[str, AuditOutcome] = {}
    queue = list(cells)
    size = min(len(cells), AUDIT_BATCH)
    say(f"auditing {len(cells)} cell(s): each package's own build with stand-in compilers, in its builder image")

    def on_step(target: str, step: str) -> None:
        say(f"[{target}] audit: {step}")

    while queue:
        batch, queue = queue[:size], queue[size:]
        for c in batch:
            shutil.rmtree(run.stage / (c.name + AUDIT_SUFFIX), ignore_errors=True)
        ok = _bake(run.bake_file, [c.name + AUDIT_SUFFIX for c in batch], {}, logs, on_step, builder, run.ca)
        for c in batch:
            report_file = run.stage / (c.name + AUDIT_SUFFIX) / "audit.json"
            log = logs.folder / f"{c.name}.log"
            if report_file.is_file():
                try:
                    verdict = judge_cell(AuditReport.load(report_file), c)
                except ImagegenError as exc:
                    outcomes[c.name] = AuditOutcome(c, None, error=str(exc), log=log)
                    continue
                outcomes[c.name] = AuditOutcome(c, verdict, log=log)
                say_verdict(c, verdict, say)
            elif ok or c.name in logs.failed or len(batch) == 1:
                error = logs.errors.get(c.name) or ("bake failed before building: " + logs.bake_error
                                                    if logs.bake_error and c.name not in logs.failed else
                                                    "its builder image or the audit step failed")
                outcomes[c.name] = AuditOutcome(c, None, error=error, log=log, log_tail=logs.tail(c.name))
            else:
                say(f"[{c.name}] audit cancelled by a failing neighbour; queued again on its own")
                queue.append(c)
                size = 1
    return outcomes


def say_verdict(cell: Cell, verdict: "Verdict", say: Callable[[str], None]) -> None:
    seconds = verdict.report.seconds
    say(f"[{cell.name}] audit ({seconds:.1f} s): {'ok' if verdict.ok else 'REFUSED'}; what the build would compile:")
    for line in verdict.table().splitlines():
        say(f"[{cell.name}]   {line}")
    for line in verdict.findings():
        say(f"[{cell.name}] audit: {line}")


def check_cache_support(builders: list[str | None], cache_to: Sequence[str]) -> None:
    """The docker driver exports inline cache only (anything else fails, or is dropped for gha/s3):
    say so before a long build rather than after it."""
    exported = [c for c in cache_to if "type=inline" not in c]
    if not exported:
        return
    for b in builders:
        if engine.builder_driver(b) == "docker":
            raise UsageError(f"builder {b or '(current)'} uses the docker driver, which exports only inline cache:"
                             " use --cache-to type=inline, or a docker-container / remote / kubernetes builder (--builder)")


def _run_cells(todo: list[Cell], run: Run, log_dir: Path, builder: str | None,
               hashes: dict[str, str], out: Path, max_jobs: int | None, nvcc_threads: int | None, audit: bool,
               say: Callable[[str], None]) -> dict[str, CellResult]:
    """Audit ``todo`` on one builder, then compile what the audit lets through."""
    results: dict[str, CellResult] = {}
    logs = TargetLogs(log_dir, [c.name for c in todo], say=say)
    try:
        verdicts: dict[str, dict] = {}
        if audit:
            todo = _audit_gate(todo, run, logs, builder, results, verdicts, say)
        if todo:
            _compile_cells(todo, run, logs, builder, hashes, out, max_jobs, nvcc_threads, verdicts, results, say)
    finally:
        logs.close()
    return results


def _audit_gate(todo: list[Cell], run: Run, logs: TargetLogs, builder: str | None, results: dict[str, CellResult],
                verdicts: dict[str, dict], say: Callable[[str], None]) -> list[Cell]:
    """The cells whose audit passed; a refused cell (or one whose audit could not run) fails here,
    before anything compiles, with the audit's reasons."""
    from imagegen.audit import refuse

    passed = []
    audited = _audit_cells(todo, run, logs, builder, say)
    for c in todo:
        a = audited[c.name]
        if a.verdict is not None and a.verdict.ok:
            verdicts[c.name] = a.verdict.as_dict()
            passed.append(c)
        elif a.verdict is not None:
            results[c.name] = CellResult(c, "failed", log=a.log, error=str(refuse(c, a.verdict)),
                                         audit=a.verdict.as_dict())
        else:
            results[c.name] = CellResult(c, "failed", log=a.log, log_tail=a.log_tail,
                                         error=f"the gencode audit could not run: {a.error} (--no-audit skips it)")
    return passed


def _compile_cells(todo: list[Cell], run: Run, logs: TargetLogs, builder: str | None, hashes: dict[str, str],
                   out: Path, max_jobs: int | None, nvcc_threads: int | None, verdicts: dict[str, dict],
                   results: dict[str, CellResult], say: Callable[[str], None]) -> None:
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
        sets = {}
        for c in batch:
            s = jobs.settings_for(c.recipe.heaviest_gb_per_thread, c.recipe.default_nvcc_threads, h,
                                  share=len(batch), max_jobs=max_jobs, nvcc_threads=nvcc_threads,
                                  targets=c.archs.gencode_targets)
            for name in (c.name, c.name + LOG_SUFFIX):  # same args: the log target reuses the build
                sets[f"{name}.args.MAX_JOBS"] = str(s.max_jobs)
                sets[f"{name}.args.NVCC_THREADS"] = str(s.nvcc_threads)
            say(f"[{c.name}] {s.describe()}")
            started[c.name] = time.time()
            shutil.rmtree(stage / c.name, ignore_errors=True)
            shutil.rmtree(stage / (c.name + LOG_SUFFIX), ignore_errors=True)
        names = [c.name for c in batch]
        ok = _bake(run.bake_file, names + [n + LOG_SUFFIX for n in names], sets, logs, on_step, builder, run.ca)
        for c in batch:
            wheels = sorted((stage / c.name).glob("*.whl")) if (stage / c.name).is_dir() else []
            if wheels:
                results[c.name] = _finish(run, c, wheels, out, hashes[c.name], logs, started[c.name],
                                          stage / (c.name + LOG_SUFFIX), verdicts.get(c.name))
            elif ok or c.name in logs.failed or len(batch) == 1:
                error = "the build produced no wheel" if ok else "the build failed"
                if logs.errors.get(c.name):  # the compiler's first error leads
                    error = f"{logs.errors[c.name]} ({error})"
                if not ok and logs.bake_error and c.name not in logs.failed:
                    error = f"bake failed before building: {logs.bake_error}"
                results[c.name] = CellResult(c, "failed", log=logs.folder / f"{c.name}.log",
                                             seconds=time.time() - started[c.name], error=error,
                                             log_tail=logs.tail(c.name), audit=verdicts.get(c.name))
            else:
                # Cancelled because another target of the batch failed: build it again, alone.
                say(f"[{c.name}] cancelled by a failing neighbour; queued again on its own")
                queue.append(c)
                size = 1


def _finish(run: Run, cell: Cell, wheels: list[Path], out: Path, inputs: str, logs: TargetLogs, started: float,
            reports: Path, audit: dict | None = None) -> CellResult:
    # The compile log from the build itself (complete even when bake clipped or cached the step).
    log = reports / "build.log" if (reports / "build.log").is_file() else logs.folder / f"{cell.name}.log"
    smoke, ccache = _smoke_report(reports / "smoke.json"), _json_or_none(reports / "ccache.json")
    assert run.finish is not None, "execute.build hands its finish step to the run"
    return run.finish(cell, wheels, out=out, inputs=inputs, log=log, seconds=time.time() - started, audit=audit,
                      smoke=smoke, ccache=ccache, record={"smoke": smoke, "ccache": ccache})


def _json_or_none(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_ERROR_LINE = re.compile(r"\berror\b|\bfatal\b|Killed|out of memory", re.IGNORECASE)


def _smoke_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()).get("imports")
    except (OSError, ValueError, AttributeError):
        return None


def summary(results: list[CellResult]) -> str:
    rows = [("CELL", "STATUS", "TIME", "WHEEL / ERROR")]
    for r in results:
        what = str(r.wheel) if r.wheel else r.error
        if r.ccache and r.ccache.get("hit_rate") is not None:
            what += f"  (ccache {r.ccache['hits']}/{r.ccache['hits'] + r.ccache['misses']} hits)"
        rows.append((r.cell.name, r.status, f"{r.seconds:.0f}s" if r.seconds else "-", what))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row[:3], widths)) + "  " + row[3] for row in rows]
    for r in results:
        if r.status == "failed":
            lines.append(f"\n{r.cell.name} failed: {r.error}" + (f"\n  full log: {r.log}" if r.log else ""))
            lines += [f"  | {line}" for line in r.log_tail]
    return "\n".join(lines)


def results_json(results: list[CellResult]) -> str:
    return json.dumps([r.as_dict() for r in results], indent=2)
