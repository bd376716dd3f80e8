"""Native builds: the same recipe logic as the Dockerfile, run on this host (Colab, bare metal).

The in-build script that every Dockerfile embeds (shipped/builder/imagegen_build.py) runs here
directly with the host's Python: fetch (git clone with submodules, or a local tree), patches, the
recipe's environment (arch knob, force-build, local version, MAX_JOBS/NVCC_THREADS),
`pip wheel --no-build-isolation`, retag. Before anything compiles, the host's torch, its CUDA and
nvcc are checked against each other and against the requested archs, with the same one-line
reasons as `imagegen plan`. The wheel is verified like a bake build's (SASS/PTX per arch, install +
import from the unpacked wheel with the host's torch) and copied atomically into the output folder. A
re-run of the same request finds that wheel there (up_to_date) and compiles nothing, as an engine build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from imagegen.errors import BuildError, RefusedError
from imagegen.executors.import_test import Importer, smoke_test
from imagegen.model import jobs
from imagegen.model.audit_report import AuditReport
from imagegen.model.cell import Cell, Finisher, HostToolchain
from imagegen.render.bake import COMPILE_CACHE_VARIABLE
from imagegen.render.dockerfile import builder_files, cell_document, inputs_hash
from imagegen.shipped.builder import imagegen_resume as resume
from imagegen.wheelhouse import manifest as wheelhouse

if TYPE_CHECKING:
    from imagegen.model.audit_report import Verdict


def _document(cell: Cell, host: HostToolchain, work: Path, src_dir: Path | None) -> dict:
    """The cell document of a native build: the Dockerfile's, on this host's Python, toolkit and folders
    (``work`` resolved: the logs are found there)."""
    doc = cell_document(cell)
    doc["venv"] = None  # build with the host's Python and its torch
    doc["base_python"] = host.python_exe
    doc["log_dir"] = str(work / "logs")
    doc["work_dir"] = None  # a fresh temporary folder: native builds may run side by side
    doc["cuda_home"] = host.cuda_home
    doc["torch_checked"] = True  # preflight read the same facts from torch's metadata
    # The source folder stays the pinned tree (a --src-dir is the user's checkout, which the next plan
    # reads to recognise the pin): the recipe's patches go into each build's copy.
    doc["patch_copy"] = True
    if cell.recipe.source_kind == "local":
        doc["src_dir"] = str(cell.recipe.source_path)
    else:
        doc["src_dir"] = str((src_dir or work / "src").resolve())
    return doc


def _prepare(cell: Cell, host: HostToolchain, work: Path, doc: dict, max_jobs: int | None,
             nvcc_threads: int | None) -> tuple[Path, Path, jobs.JobSettings, dict]:
    """The cell file (``doc``, from _document), the in-build script and the environment of a native build
    (one place, so that --print-env shows exactly what a build would get)."""
    work.mkdir(parents=True, exist_ok=True)
    cell_file = work / "cell.json"
    cell_file.write_text(json.dumps(doc, indent=2))
    for name, text in builder_files().items():  # the script, the rules it imports, the audit's compilers
        (work / name).write_text(text)
    script = work / "imagegen_build.py"
    settings = jobs.settings_for(cell.recipe.heaviest_gb_per_thread, cell.recipe.default_nvcc_threads, jobs.host(),
                                 max_jobs=max_jobs, nvcc_threads=nvcc_threads, targets=cell.gencode_targets)
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=str(cell.archs), MAX_JOBS=str(settings.max_jobs),
               NVCC_THREADS=str(settings.nvcc_threads), PYTHONUNBUFFERED="1")
    return cell_file, script, settings, env


def build_env_native(cell: Cell, host: HostToolchain, *, work: Path, max_jobs: int | None = None,
                     nvcc_threads: int | None = None, src_dir: Path | None = None, audit: bool = False,
                     say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> dict[str, str]:
    """The variables a native build of ``cell`` would set (arch knob, MAX_JOBS split, force-build...),
    computed by the in-build script itself: `imagegen build --native --print-env`. Nothing is downloaded.
    ``audit``: where the source is already on this machine (a local tree, a checkout at --src-dir or in
    --work), run the gencode audit first, as the build does, so that MAX_JOBS is the one the audit's
    estimate gives, and an audit that refuses the cell or cannot run is an error (non-zero exit), never
    printed over; elsewhere (and without ``audit``), the estimate from the whole arch list, what
    `--no-audit` builds with, said on stderr."""
    work = work.resolve()
    doc = _document(cell, host, work, src_dir)
    cell_file, script, settings, env = _prepare(cell, host, work, doc, max_jobs, nvcc_threads)
    if audit and not source_here(cell, doc):
        say("imagegen: --print-env fetches nothing: the source is not on this machine, so MAX_JOBS is the estimate"
            " from the arch list (what --no-audit builds with); a build sizes it again from its gencode audit (give"
            " --src-dir CHECKOUT to print that one)")
    elif audit:
        from imagegen.model.audit import refuse
        if cell.recipe.source_kind != "local":  # a checkout there: checked against the pin, patched; no download
            _run_step(cell, host, script, cell_file, env, work, "fetch", stdout=sys.stderr)
        verdict = _audit(cell, host, script, cell_file, env, work, say,
                         skip="print without it: --print-env --no-audit")
        if not verdict.ok:
            raise refuse(cell, verdict)
        _settings_from_audit(cell, doc, cell_file, env, settings, work / "logs" / "audit.json", max_jobs)
    proc = subprocess.run([host.python_exe, str(script), "--cell", str(cell_file), "env"], env=env,
                          capture_output=True, text=True)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BuildError(f"could not compute the build environment: {(proc.stderr or proc.stdout).strip()[-300:]}") from None


def source_here(cell: Cell, doc: dict) -> bool:
    """Is the cell's source on this machine already (a local tree, a git checkout with files in its
    src_dir), so that the fetch step downloads nothing?"""
    if cell.recipe.source_kind == "local":
        return True
    folder = Path(doc["src_dir"])
    try:
        return cell.recipe.source_kind == "git" and folder.is_dir() and any(folder.iterdir())
    except OSError:
        return False


def _run_step(cell: Cell, host: HostToolchain, script: Path, cell_file: Path, env: dict, work: Path, *step: str,
              stdout=None, stopped: str | None = None) -> float:
    """Run one step of the in-build script (fetch, build); its seconds, or a one-line BuildError
    (``stopped``: what to say when the build stopped at its budget)."""
    t0 = time.time()
    rc = subprocess.call([host.python_exe, str(script), "--cell", str(cell_file), *step], env=env, stdout=stdout)
    if rc == resume.STOPPED_EXIT and stopped:
        raise BuildError(f"{cell.describe()}: {stopped}")
    if rc != 0:
        raise BuildError(_step_failure(cell, step[0], rc, work / "logs"))
    return time.time() - t0


def _audit(cell: Cell, host: HostToolchain, script: Path, cell_file: Path, env: dict, work: Path,
           say: Callable[[str], None], skip: str = "skip it with --no-audit") -> "Verdict":
    """The audit step on a fetched source, judged, its table and warnings said; ``skip``: how the
    command at hand goes without it, for the error of an audit that cannot run."""
    from imagegen.model import audit
    report = run_script_audit(host.python_exe, script, cell_file, work / "logs" / "audit.json", env, skip=skip)
    verdict = audit.judge_cell(report, cell)
    say(f"audit ({report.seconds:.1f} s): what the build would compile\n" + verdict.table())
    for line in verdict.findings(refusals=False):  # a refusal is raised by the caller, with its cell
        say(f"audit: {line}")
    return verdict


def audit_native(cell: Cell, host: HostToolchain, *, work: Path, max_jobs: int | None = None,
                 nvcc_threads: int | None = None, src_dir: Path | None = None,
                 say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> "Verdict":
    """The gencode audit of ``cell`` on this host: fetch the source, run the package's own build with
    stand-in compilers and the exact environment a build would get, and judge what it would compile."""
    work = work.resolve()
    cell_file, script, _, env = _prepare(cell, host, work, _document(cell, host, work, src_dir), max_jobs,
                                         nvcc_threads)
    if cell.recipe.source_kind != "local":  # stdout to stderr: `plan --audit --json` prints only JSON
        _run_step(cell, host, script, cell_file, env, work, "fetch", stdout=sys.stderr)
    return _audit(cell, host, script, cell_file, env, work, say, skip="plan it without --audit")


def up_to_date(cell: Cell, host: HostToolchain, *, out: Path, work: Path, src_dir: Path | None = None) -> "Reused | None":
    """The wheel an earlier native build of exactly these inputs put in the wheelhouse ``out``, still as it
    was (the rule of every executor, wheelhouse.up_to_date: the manifest entry's inputs hash is the one this
    build would record, and the wheel's sha256 is the one recorded); None where the cell is to be built (no
    such entry, other inputs, a wheel changed, truncated or gone). Nothing is written or run but the
    inputs hash (a local tree's content is read), so a re-run of the same request takes seconds."""
    doc = _document(cell, host, work.resolve(), src_dir)
    inputs = inputs_hash(cell, doc)
    wheel = wheelhouse.up_to_date(out, cell, inputs)
    return Reused(wheel=wheel, inputs=inputs) if wheel is not None else None


@dataclass(frozen=True)
class Reused:
    """A wheel a native build takes as it is instead of compiling (up_to_date)."""

    wheel: Path
    inputs: str  # the inputs hash the manifest entry and this build share

    def line(self) -> str:
        """The one line a build says when it reuses the wheel: which, and why."""
        return (f"up to date: {self.wheel}: built from the same inputs ({self.inputs}) and still the file its"
                f" manifest's sha256 records, so nothing is compiled (--force rebuilds it)")


def build_native(cell: Cell, host: HostToolchain, *, out: Path, work: Path, finish: Finisher,
                 flat: bool = False, max_jobs: int | None = None, nvcc_threads: int | None = None,
                 src_dir: Path | None = None, verbose_build: bool = False, audit: bool = True,
                 compile_cache: str | None = None, budget: int | None = None,
                 say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> Path:
    """Build ``cell`` on this host; the wheel goes to ``finish`` (imagegen.finish.finisher.finish: verify,
    then collect), verified while its import test runs. ``compile_cache``: ccache's remote storage URL
    for every compile (`build --compile-cache`), handed to the in-build script in the variable a bake
    build's secret is read from; never on a command line. ``budget``: seconds of compile, after which the
    build stops and keeps its tree in ``work`` (a BuildError of exit 5); the same build again resumes it."""
    work = work.resolve()
    doc = _document(cell, host, work, src_dir)
    # What decides the wheel, taken before anything runs: a build that writes into a local tree (build/,
    # *.egg-info) does not change the inputs it is recorded with.
    inputs = inputs_hash(cell, doc)
    resume_env = _resume_env(work, inputs, budget)
    if resume_env:  # a fixed folder instead of a fresh temporary one: ninja's commands name its path
        doc["work_dir"] = str(resumable_tree(inputs))
    cell_file, script, settings, env = _prepare(cell, host, work, doc, max_jobs, nvcc_threads)
    for name in (COMPILE_CACHE_VARIABLE, resume.BUDGET_ENV, resume.RESUME_DIR_ENV, resume.INPUTS_ENV):
        env.pop(name, None)  # only the ones given here
    if compile_cache:
        env[COMPILE_CACHE_VARIABLE] = compile_cache
    env.update(resume_env)
    steps: dict[str, float] = {}  # where the time went, so the overhead over `pip wheel` is visible
    if cell.recipe.source_kind != "local":
        steps["fetch"] = _run_step(cell, host, script, cell_file, env, work, "fetch")
    verdict = None
    if audit:  # before anything compiles: refuse what the package's own build would get wrong
        from imagegen.model.audit import refuse

        t0 = time.time()
        verdict = _audit(cell, host, script, cell_file, env, work, say)
        steps["audit"] = time.time() - t0
        if not verdict.ok:
            raise refuse(cell, verdict)
        settings = _settings_from_audit(cell, doc, cell_file, env, settings, work / "logs" / "audit.json", max_jobs)
    if verbose_build:  # pip -v: every compiler line live (slower for chatty builds, see imagegen_build.py)
        env["IMAGEGEN_BUILD_VERBOSE"] = "1"
    say(f"building {cell.describe()} natively: {host.describe()}")
    say(f"jobs: {settings.describe()} on {jobs.host().describe()} (override with --max-jobs / --nvcc-threads)")
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # The import test's interpreter loads torch (seconds) while the wheel compiles, not after.
    with Importer(host.python_exe) as importer:
        steps["build"] = _run_step(cell, host, script, cell_file, env, work, "build", "--out", str(dist),
                                   stopped=f"stopped at its --budget of {budget} s with its build tree kept in"
                                   f" {work / RESUME_FOLDER}: run the same command again (with or without"
                                   " --budget) to compile only what is left" if budget else None)
        wheels = sorted(dist.glob("*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
        seconds = steps.get("fetch", 0.0) + steps["build"]  # the build's own time: fetch and compile
        t0 = time.time()
        # The import test (the extensions load, some initialise the driver) runs while finish reads
        # the fatbins; the manifest entry, which records it, is made once both are done.
        with ThreadPoolExecutor(max_workers=1) as pool:
            smoke_run = pool.submit(smoke_test, wheels[0], cell, host, importer)

            def record() -> dict:
                smoke = smoke_run.result()
                steps["verify+smoke"] = time.time() - t0
                say(f"smoke: {smoke}")
                return {"smoke": smoke, "native": True, "nvcc": str(host.nvcc), "jobs": _jobs_record(settings),
                        "steps_s": {k: round(v, 2) for k, v in steps.items()}}

            result = finish(cell, wheels, out=out, inputs=inputs, log=work / "logs" / "build.log",
                            seconds=seconds, audit=verdict.as_dict() if verdict is not None else None, record=record,
                            flat=flat)
            if result.status == "refused":  # another build placed a wheel for other archs meanwhile
                raise RefusedError(result.error)
            if result.status != "built":
                raise BuildError(f"{wheels[0].name} failed verification: {result.error.removeprefix('verification failed: ')}")
    steps["publish"] = time.time() - t0 - steps["verify+smoke"]
    dest = result.wheel
    assert dest is not None
    say("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()))
    archs = "; ".join(", ".join(e.get("archs", [])) for e in (result.verify or {}).get("extensions", []))
    say(f"built {dest} in {seconds:.0f} s; archs: {archs}")
    return dest


RESUME_FOLDER = "resume"  # in --work: the trees kept by builds stopped at their budget


def resumable_tree(inputs: str) -> Path:
    """Where a native build that can stop or resume compiles: a fixed path for its inputs (ninja's commands
    name it, so a kept tree resumes only there), on this machine's own disk in the user's cache folder. Not
    in --work: that may be a slow network mount (Google Drive on Colab), which gets the kept tree's archive
    once instead of every object, nvcc temporary file and log line of the compile."""
    cache = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(cache) if os.path.isabs(cache) else Path.home() / ".cache") / "imagegen" / "native-builds" / inputs


def _resume_env(work: Path, inputs: str, budget: int | None) -> dict[str, str]:
    """What the in-build script needs (as variables) to stop at ``budget`` and keep its tree in ``work``, or
    to resume the tree a build of the same inputs kept there; nothing for a build that does neither. A
    hard end (a Colab runtime recycled) keeps no tree: --budget stops the build before that, and a ccache
    on lasting storage (CCACHE_DIR) serves what was compiled."""
    folder = work / RESUME_FOLDER
    if not budget and not (folder / f"{inputs}.tar").is_file():
        return {}
    return {resume.RESUME_DIR_ENV: str(folder), resume.INPUTS_ENV: inputs,
            **({resume.BUDGET_ENV: str(budget)} if budget else {})}


def _settings_from_audit(cell: Cell, doc: dict, cell_file: Path, env: dict, settings: jobs.JobSettings,
                         report_path: Path, max_jobs: int | None) -> jobs.JobSettings:
    """MAX_JOBS from the audit's per-extension load (jobs.peak_estimate) rather than from the whole
    arch list, and that load in the cell file so that the in-build script prints the same estimate.
    NVCC_THREADS stays what the audit ran with (a package's recorded --threads may come from it)."""
    try:
        profile = jobs.load_profile(json.loads(report_path.read_text(encoding="utf-8", errors="replace")),
                                    cell.recipe.source_memory_gb)
    except (OSError, ValueError):
        profile = ()
    if not profile:
        return settings
    recipe = cell.recipe
    ext_env, ext_max = recipe.ext_parallel_for(cell.version)
    ext_max = ext_max if ext_env else 0
    better = jobs.settings_for(recipe.memory_per_thread_gb, recipe.default_nvcc_threads, jobs.host(), max_jobs=max_jobs,
                               nvcc_threads=settings.nvcc_threads, profile=profile, ext_parallel_max=ext_max,
                               host_gb=recipe.nvcc_host_gb)
    load = {"host_gb": recipe.nvcc_host_gb,
            "extensions": [e.as_load() for e in profile]}
    cell_file.write_text(json.dumps({**doc, "load_profile": load}, indent=2))  # doc itself (the inputs hash) unchanged
    env["MAX_JOBS"] = str(better.max_jobs)
    return better


def _jobs_record(settings: jobs.JobSettings) -> dict:
    """The job settings and the peak RAM they were chosen for (manifest.json): what a measured peak
    is compared with."""
    e = settings.estimate
    return {"max_jobs": settings.max_jobs, "nvcc_threads": settings.nvcc_threads,
            "predicted_peak_gb": round(settings.peak_gb, 1), "from_audit": e is not None,
            **({"nvcc_at_once": e.nvcc, "busy_threads": e.threads} if e is not None else {})}


def _step_failure(cell: Cell, step: str, rc: int, logs: Path) -> str:
    """One line: the compiler's first error first (the in-build script's failure.json), then what
    failed and where the log is."""
    log = logs / "build.log"
    what = f"{cell.describe()}: the {step} step failed (exit {rc}); log: {log}"
    if step != "build":
        return what
    try:
        failure = json.loads((logs / "failure.json").read_text())
    except (OSError, ValueError):
        return what
    error = failure.get("error") if isinstance(failure, dict) else None
    if not error:
        return what
    stopped = ""
    if failure.get("error_at") and failure.get("stopped_at"):
        stopped = f", stopped {max(0.0, failure['stopped_at'] - failure['error_at']):.1f} s after it"
    return f"{error} ({what}{stopped})"


def run_script_audit(python_exe: str, script: Path, cell_file: Path, out: Path, env: Mapping[str, str],
                     timeout: float = 900, skip: str = "skip it with --no-audit") -> AuditReport:
    """Run the in-build script's audit step (native builds: this host's Python and toolkit); ``skip``: how
    the command at hand goes without it (build's --no-audit; plan: without --audit)."""
    try:
        proc = subprocess.run([python_exe, str(script), "--cell", str(cell_file), "audit", "--out", str(out),
                               "--timeout", str(timeout)],
                              env=dict(env), capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        raise BuildError(f"the gencode audit did not finish in {timeout:.0f} s ({skip})") from None
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise BuildError(f"the gencode audit could not run: {tail[-1][:300] if tail else 'no output'} ({skip})")
    return AuditReport.load(out)
