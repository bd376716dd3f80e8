"""Prebuilt builder images as an executor (see imagegen.plan.registry for what they are).

bake_builders: bake cells' `builder` stage, tagged with its deterministic reference, and push it
      (imagegen.publish.push) or load it into the local engine (pull's fallback).
pull: fetch a cell's builder image (pinned by the lock file when it has it), run its gencode audit
      (the package's own build with stand-in compilers: a cell that would fail or miss an arch is
      refused before compiling), then run it, GPU visible when the host has one, to compile the
      wheel into a staging folder; verify it and publish it into the output folder like
      `imagegen build` does. A missing image is built locally from the
      same Dockerfile (said so, in one line); wrong credentials or an unreachable registry stop.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from imagegen import __version__, engine, interrupt
from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.plan import registry as reg
from imagegen.errors import BuildError, EngineError, RefusedError, UsageError
from imagegen.executors import gpu_access
from imagegen.executors.bake_run import bake_data, bake_variables, netrc_secret, new_run_dir
from imagegen.model import jobs
from imagegen.model.cell import DEFAULT_PLATFORM, Cell, Plan
from imagegen.plan.registry import (ImageMissing, Lock, RegistryError, explain, image_labels, image_ref,
                                    registry_host)
from imagegen.render.bake import absolute_contexts, build_definition, to_json
from imagegen.render.dockerfile import cell_document, inputs_hash
from imagegen.model.cell import CellResult, Finisher

if TYPE_CHECKING:
    from imagegen.model.audit_report import Verdict

Say = Callable[[str], None]
CCACHE_VOLUME = "imagegen-ccache"


def builder_inputs(cell: Cell) -> str:
    """What decides a builder image's content: the cell document (no arch) and the base image (its label
    io.imagegen.inputs, whether `imagegen push` or the CI workflow's push step pushed it)."""
    import hashlib

    doc = cell_document(cell)
    payload = json.dumps({"cell": doc, "base": cell.base.ref if cell.base else None, "imagegen": __version__},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bake_builders(cells: list[Cell], registry: str, *, work: Path, push: bool, ca_bundle: str | None,
                   builder: str | None, cache_from: list[str], cache_to: list[str], say: Say,
                   netrc: str | None = None) -> dict[str, str]:
    """Bake the `builder` stage of ``cells``: pushed to the registry (push) or loaded into the local
    engine (fallback). Returns target name -> image digest from bake's metadata (push only)."""
    from imagegen.executors.buildx import runnable_platforms

    unrunnable: dict[str, CellResult] = {}
    runnable_platforms(cells, [builder] if builder else [], unrunnable)
    if unrunnable:  # before anything is built: BuildKit would fail with "exec format error" later
        first = next(iter(unrunnable.values()))
        raise RefusedError(f"{first.cell.name}: {first.error}")
    run_dir = new_run_dir(work, "-push" if push else "-builder")
    definition = build_definition(Plan(cells=cells), out_dir=str(run_dir / "stage"),
                                  dockerfiles_dir=str(run_dir / "dockerfiles"), root=run_dir,
                                  command="imagegen push" if push else "imagegen pull")
    data, ca = bake_data(definition, run_dir, ca_bundle)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for t in definition.targets:
        target = data["target"][t.name]
        target["context"] = str(run_dir / "dockerfiles")
        target["contexts"] = absolute_contexts(t, run_dir / "dockerfiles")
        target["target"] = "builder"
        target["tags"] = [image_ref(t.cell, registry)]
        target["output"] = ["type=image,push=true" if push else "type=docker"]
        target["labels"] = {**target.get("labels", {}),
                            **image_labels(t.cell, builder_inputs(t.cell), created, __version__)}
        if cache_from:
            target["cache-from"] = list(cache_from)
        if cache_to:
            target["cache-to"] = list(cache_to)
        target["secret"] = [*target.get("secret", []), *netrc_secret(netrc)]
    bake_file = run_dir / "docker-bake.json"
    bake_file.write_text(to_json(data))
    metadata = run_dir / "metadata.json"
    log_path = run_dir / "bake.log"
    say(f"{'pushing' if push else 'building'} {len(cells)} builder image(s); log: {log_path}")
    failed = None
    with log_path.open("w", encoding="utf-8") as log:
        try:
            engine.bake(bake_file, [t.name for t in definition.targets], builder=builder, variables=bake_variables(ca),
                        metadata_file=metadata, on_line=lambda line: log.write(line + "\n"))
        except engine.BakeFailed as exc:
            log.write(exc.stderr)
            failed = exc
    text = log_path.read_text(errors="replace")
    if failed is not None:
        low = text.lower()
        ref = image_ref(cells[0], registry)
        if push and any(k in low for k in ("unauthorized", "no basic auth", "authentication required", "denied",
                                          "connection refused", "no such host", "i/o timeout")):
            raise explain(text[-2000:], ref, registry_host(ref))
        tail = [line for line in text.splitlines() if "ERROR" in line or "error:" in line][-3:]
        raise BuildError(f"baking the builder image(s) failed: {' | '.join(tail)[-400:]} (log: {log_path})")
    digests = {}
    if push:
        try:
            meta = json.loads(metadata.read_text())
        except (OSError, ValueError):
            meta = {}
        for name, entry in meta.items():
            digest = entry.get("containerimage.digest") if isinstance(entry, dict) else None
            if digest:
                digests[name] = digest
    return digests


GPU_TOOLKIT_FIX = gpu_access.TOOLKIT_FIX


def gpu_flags(gpus: str, say: Say | None = None) -> list[str]:
    """The ``docker run`` flags that give the builder this host's GPUs (imagegen.executors.gpu_access):
    ``all`` is ``--gpus all`` as asked; ``toolkit``, ``cdi``, ``devices`` that way or an error saying
    what is missing; ``auto`` the first way that works here when the driver works (none, said once,
    when the GPUs cannot be handed to Docker: the build then goes by --arch)."""
    access = gpu_access.choose(gpus, driver_works=engine.driver_works, say=say, docker=_docker_or_none)
    if gpus in gpu_access.MODES and not access.flags:
        raise EngineError(f"{access.detail}: {access.fix}" if access.fix else access.detail)
    return list(access.flags)


def _docker_or_none(*args: str):
    try:
        return engine.docker(*args, timeout=30)
    except (EngineError, OSError, subprocess.TimeoutExpired):
        return None


def pull(plan: Plan, registry: str, *, out: Path, work: Path, lock: Lock, finish: Finisher, gpus: str = "auto",
         fallback: bool = True, max_jobs: int | None = None, nvcc_threads: int | None = None, ca_bundle: str | None = None,
         netrc: str | None = None, force: bool = False, audit: bool = True, say: Say = say_on_stderr) -> list[CellResult]:
    from imagegen.executors.buildx import runnable_platforms

    out, work = out.resolve(), work.resolve()
    cells = plan.buildable
    # An arm64 builder image runs here under QEMU (or on an arm64 host). Pulling it needs neither, so
    # the registry is asked first (a missing image is the first thing to fix, exit 7); a cell this
    # engine cannot run then fails before its image is run or built, saying how to get it, and the
    # others go on.
    unrunnable: dict[str, CellResult] = {}
    runnable_platforms(cells, [], unrunnable)
    host = host_platform()
    local = [c for c in cells if c.platform == host]
    gpu_args = gpu_flags(gpus, say) if local else []  # once: the same host runs every cell
    if any(c.platform != host for c in cells) and gpus != "none":
        say(f"cells for another platform than this host's ({host}) run emulated, without the GPUs: their archs"
            " come from --arch")
    run_dir = new_run_dir(work, "-pull")  # its own: another pull in this folder must not share it
    results: dict[str, CellResult] = {}
    with interrupt.stopping_children():  # a signal to imagegen stops the containers it runs
        for cell in cells:
            results[cell.name] = _pull_cell(
                cell, registry, out=out, run_dir=run_dir, work=work, lock=lock, finish=finish,
                gpu_args=gpu_args if cell.platform == host else [], fallback=fallback, max_jobs=max_jobs,
                nvcc_threads=nvcc_threads, ca_bundle=ca_bundle, netrc=netrc, force=force, audit=audit, say=say,
                unrunnable=unrunnable.get(cell.name))
    return [results[c.name] for c in plan.buildable]


def host_platform() -> str:
    """This machine's platform as a cell names it: linux/amd64 or linux/arm64."""
    import platform

    return "linux/arm64" if platform.machine().lower() in ("aarch64", "arm64") else DEFAULT_PLATFORM


def platform_args(cell: Cell) -> list[str]:
    """`docker pull` / `docker run` flags for the cell's platform (none for linux/amd64, as before)."""
    return [] if cell.platform == DEFAULT_PLATFORM else ["--platform", cell.platform]


def _pull_cell(cell: Cell, registry: str, *, out: Path, run_dir: Path, work: Path, lock: Lock, finish: Finisher,
               gpu_args: list[str],
               fallback: bool, max_jobs: int | None, nvcc_threads: int | None, ca_bundle: str | None, force: bool,
               audit: bool, say: Say, unrunnable: CellResult | None = None, netrc: str | None = None) -> CellResult:
    """One cell: up to date, refused, or pulled (built locally as a fallback), audited and run.
    ``unrunnable``: the failure to report once the registry has been asked, where this engine cannot
    run the cell's platform."""
    inputs = inputs_hash(cell, cell_document(cell))
    existing = None if force else wheelhouse.up_to_date(out, cell, inputs)
    if existing:
        say(f"[{cell.name}] up to date: {existing}")
        return CellResult(cell, "up-to-date", wheel=existing)
    refused = wheelhouse.replacement_refused(out, cell, force=force, say=lambda m: say(f"[{cell.name}] {m}"))
    if refused:  # said once, when the results are reported (executors.results.report)
        return CellResult(cell, "refused", error=refused)
    ref = image_ref(cell, registry)
    use = lock.builder_images.get(ref, ref)
    try:
        digest = reg.pull(use, cell.platform if cell.platform != DEFAULT_PLATFORM else None)
        say(f"[{cell.name}] pulled {use} ({digest})")
    except ImageMissing:
        if not fallback:
            raise
        if unrunnable is not None:  # building it here would run its steps on this platform too
            return CellResult(cell, "refused", error=f"no prebuilt image {use} in the registry, and {unrunnable.error}")
        say(f"[{cell.name}] no prebuilt image {use} in the registry: building it locally from the same"
            " Dockerfile (imagegen push publishes it for next time)")
        bake_builders([cell], registry, work=work, push=False, ca_bundle=ca_bundle, netrc=netrc, builder=None,
                       cache_from=[], cache_to=[], say=say)
        use = ref
    if unrunnable is not None:
        return unrunnable
    verdict = None
    if audit:
        verdict, refused = _audit_in_image(cell, use, work=run_dir, say=say)
        if refused is not None:
            return refused
    return _run_builder(cell, use, out=out, work=run_dir, inputs=inputs, finish=finish, gpu_args=gpu_args,
                        max_jobs=max_jobs, nvcc_threads=nvcc_threads, say=say,
                        audit=verdict.as_dict() if verdict is not None else None)


def ccache_volume() -> str:
    """The named volume that is the compile's ccache (IMAGEGEN_CCACHE_VOLUME overrides: a test suite
    or a CI job uses its own and removes it afterwards)."""
    name = os.environ.get("IMAGEGEN_CCACHE_VOLUME") or CCACHE_VOLUME
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
        raise UsageError("IMAGEGEN_CCACHE_VOLUME must be a Docker volume name: letters, digits, '_', '.', '-'")
    return name


def container_args(cell: Cell) -> list[str]:
    """A name of its own (so that a stopped imagegen can remove the container whose client is gone)
    and an init process (PID 1 in a container ignores SIGTERM otherwise: `docker stop` would wait)."""
    import uuid

    return ["--init", "--name", f"imagegen-{cell.name[:80]}-{uuid.uuid4().hex[:8]}"]


def env_args(cell: Cell) -> list[str]:
    """The cell's build variables for `docker run`: the recipe's are in the image's cell document,
    but --env ones may not be (the image was pushed without them); the container's environment
    carries them all, and the build puts the document's on top of it."""
    return [arg for name, value in sorted(cell.version.env.items()) for arg in ("-e", f"{name}={value}")]


def _audit_in_image(cell: Cell, image: str, *, work: Path,
                    say: Say) -> "tuple[Verdict | None, CellResult | None]":
    """Run the image's audit step (the package's own build with stand-in compilers, seconds) for the
    cell's archs and judge it: (verdict, None) when the build may go on, (verdict or None, failed
    result) when it is refused or the audit could not run."""
    from imagegen.model.audit import judge_cell, refuse
    from imagegen.model.audit_report import AuditReport
    from imagegen.executors.buildx_audit import say_verdict

    stage = work / "pull" / f"{cell.name}--audit"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{cell.name}.audit.log"
    # No --gpus: the audit compiles nothing and is told the archs (a host whose Docker cannot hand
    # out GPUs hears so from the compile step, once, with what to install).
    cmd = ["--rm", *container_args(cell), *platform_args(cell), "-v", f"{stage}:/out",
           "-e", f"TORCH_CUDA_ARCH_LIST={cell.archs}", *env_args(cell), image, "audit", "--out", "/out/audit.json"]
    say(f"[{cell.name}] auditing in {image}: the package's own build with stand-in compilers")
    proc = engine.run_container(cmd, log_path)
    report_file = stage / "audit.json"
    if proc.returncode != 0 or not report_file.is_file():
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        why = f"exit {proc.returncode}"
        if any("invalid choice: 'audit'" in line for line in tail):
            why = "the image predates imagegen's audit step (push it again with this imagegen)"
        return None, CellResult(cell, "failed", log=log_path, log_tail=tail,
                                error=f"the gencode audit could not run in {image}: {why} (--no-audit skips it)")
    try:
        verdict = judge_cell(AuditReport.load(report_file), cell)
    except BuildError as exc:
        return None, CellResult(cell, "failed", log=log_path, error=f"{exc} (--no-audit skips the audit)")
    say_verdict(cell, verdict, say)
    if not verdict.ok:
        return verdict, CellResult(cell, "failed", log=log_path, error=str(refuse(cell, verdict)),
                                   audit=verdict.as_dict())
    return verdict, None


def _run_builder(cell: Cell, image: str, *, out: Path, work: Path, inputs: str, finish: Finisher, gpu_args: list[str],
                 max_jobs: int | None, nvcc_threads: int | None, say: Say, audit: dict | None = None) -> CellResult:
    stage = work / "pull" / cell.name
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{cell.name}.log"
    settings = jobs.settings_for(cell.recipe.heaviest_gb_per_thread, cell.recipe.default_nvcc_threads, jobs.host(),
                                 max_jobs=max_jobs, nvcc_threads=nvcc_threads, targets=cell.gencode_targets)
    # A named volume as the compile's ccache, like the bake build's cache mount: a second pull (other
    # archs, a newer image) recompiles only what changed.
    cmd = ["--rm", *container_args(cell), *platform_args(cell), *gpu_args, "-v", f"{stage}:/out",
           "-v", f"{ccache_volume()}:/root/.cache/ccache",
           "-e", f"TORCH_CUDA_ARCH_LIST={cell.archs}", "-e", f"MAX_JOBS={settings.max_jobs}",
           "-e", f"NVCC_THREADS={settings.nvcc_threads}",
           *env_args(cell), image, "build", "--out", "/out"]
    say(f"[{cell.name}] compiling in {image}: {settings.describe()}{' with the GPUs visible' if gpu_args else ''}")
    started = time.time()
    proc = engine.run_container(cmd, log_path)
    seconds = time.time() - started
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        if proc.returncode == 125 and "--gpus" in cmd and any("could not select device driver" in line for line in tail):
            # The host, not the cell: every other cell would fail the same way.
            raise EngineError(f"docker cannot give containers the GPUs (--gpus all): {GPU_TOOLKIT_FIX}")
        return CellResult(cell, "failed", log=log_path, seconds=seconds, log_tail=tail, audit=audit,
                          error=f"the builder image {image} exited {proc.returncode}")
    return finish(cell, sorted(stage.glob("*.whl")), out=out, inputs=inputs, log=log_path, seconds=seconds,
                  audit=audit, record={"image": image})


__all__ = ["bake_builders", "pull", "RegistryError", "gpu_flags", "builder_inputs", "host_platform", "platform_args"]
