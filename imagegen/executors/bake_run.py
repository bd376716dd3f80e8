"""One bake run: its folder under the work directory, the bake file (JSON) with the stage and log
exports of every cell, the CA bundle as a secret, and the call to buildx bake through the engine."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from imagegen import engine
from imagegen.executors.bake_log import AUDIT_SUFFIX, LOG_SUFFIX, TARGET_FAILED, TargetLogs, cell_of
from imagegen.model.cell import Cell, Plan
from imagegen.render.bake import COMPILE_CACHE_VARIABLE, BakeDefinition, absolute_contexts, build_definition, to_json
from imagegen.render.bakefiles import write_dockerfiles
from imagegen.render.dockerfile import CellInputs
from imagegen.shipped.builder import imagegen_rules as rules


def bake_variables(ca: str, compile_cache: str | None = None) -> dict[str, str]:
    """The variables every bake imagegen runs sets: the CA bundle's path (the pip_cert secret), no
    local-folder entitlement prompt, and the file's own defaults for the arch and job overrides, not
    whatever the caller's environment holds; the header probe's switch is the caller's
    (IMAGEGEN_AUDIT_PROBE=0 imagegen build ... skips it, as natively)."""
    return {"BUILDX_BAKE_ENTITLEMENTS_FS": "0", "IMAGEGEN_PIP_CERT": ca,
            "IMAGEGEN_TORCH_CUDA_ARCH_LIST": "", "IMAGEGEN_MAX_JOBS": "", "IMAGEGEN_NVCC_THREADS": "",
            "IMAGEGEN_AUDIT_PROBE": os.environ.get("IMAGEGEN_AUDIT_PROBE", ""),
            # `build --compile-cache`: only in the bake process's environment (the secret's env= source),
            # never in the bake file or a build arg; empty: the secret is an empty file, no remote cache
            COMPILE_CACHE_VARIABLE: compile_cache or ""}


def run_bake(file: Path, targets: list[str], logs: TargetLogs,
          on_step: Callable[[str, str], None], builder: str | None, ca: str, compile_cache: str | None = None) -> bool:
    """Run one bake; True when it succeeded. Lines are split into per-target logs as they come."""
    logs.sole = cell_of(targets[0]) if len(targets) == 1 else None

    def on_line(line: str) -> None:
        step = logs.feed(line)
        if step:
            on_step(*step)

    try:
        engine.bake(file, targets, on_line=on_line, builder=builder, variables=bake_variables(ca, compile_cache))
        return True
    except engine.BakeFailed as exc:
        for line in exc.stderr.splitlines():
            m = TARGET_FAILED.search(line)
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

    def jobs_file(self, cell: str) -> Path:
        """Where the cell's MAX_JOBS and NVCC_THREADS for the next bake go (the imagegen_jobs secret)."""
        return self.dir / "jobs" / f"{cell}.env"


def new_run_dir(work: Path, tag: str = "") -> Path:
    """A run folder of its own: two runs started in one folder in the same second (two terminals, two
    CI steps) must not share Dockerfiles, bake file or staging."""
    import tempfile

    from imagegen.errors import UsageError
    from imagegen.outputs import inside, shown

    runs = inside(work, work / "runs", "the runs folder")  # a link planted there leads no write out of --work
    try:
        runs.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S") + tag + "-", dir=runs))
    except OSError as exc:
        raise UsageError(f"--work {shown(work)}: cannot write there: {exc.strerror or exc.__class__.__name__}") from None


def netrc_secret(netrc: str | None) -> list[str]:
    """The bake secret entry that hands the netrc file ``netrc`` (imagegen.plan.options.netrc_file:
    checked, absolute) to the steps that mount the ``netrc`` secret: its path, never its content."""
    return [f"id=netrc,src={netrc}"] if netrc else []


def prepare_run(cells: list[Cell], work: Path, *, ca_bundle: str | None = None, cache_from: Sequence[str] = (),
                cache_to: Sequence[str] = (), command: str = "imagegen build", tag: str = "",
                netrc: str | None = None, inputs: Mapping[str, CellInputs] | None = None) -> Run:
    """Render ``cells`` into a run folder under ``work``: their Dockerfiles and one bake file with,
    per cell, the wheel target, its log companion (the ``buildlog`` stage: compile log + smoke report,
    so the wheels stage stays wheels-only and the reports are there even when every layer was cached)
    and its audit companion (the ``audit-report`` stage)."""
    run_dir = new_run_dir(work, tag)
    stage = run_dir / "stage"
    definition = build_definition(Plan(cells=cells), out_dir=str(stage), dockerfiles_dir=str(run_dir / "dockerfiles"),
                                  root=run_dir, command=command, inputs=inputs)
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
    # Each cell's job settings, written per batch (Run.jobs_file): a secret, so that they are no cache key.
    (run_dir / "jobs").mkdir()
    for name in list(data["target"]):
        jobs_file = run_dir / "jobs" / f"{cell_of(name)}.env"
        jobs_file.touch()
        data["target"][name]["secret"] = [*data["target"][name].get("secret", []), f"id={rules.JOBS_SECRET},src={jobs_file}",
                                          *netrc_secret(netrc)]
        if cache_from:
            data["target"][name]["cache-from"] = list(cache_from)
        if cache_to and cell_of(name) == name:
            data["target"][name]["cache-to"] = list(cache_to)
    bake_file.write_text(to_json(data))
    return Run(dir=run_dir, stage=stage, bake_file=bake_file, ca=ca)
