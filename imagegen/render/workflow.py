"""The GitHub Actions workflow of ``imagegen ci github`` (imagegen.commands.ci checks the flags and plans the
Windows cells): Linux jobs that spread a bake file's targets over runners, Windows jobs per planned cell, and
a publish job.

The Linux matrix is the bake file's own targets, as ``docker buildx bake --print`` reads them (imagegen
reads the file itself and checks buildx agrees where it is there: imagegen.render.bake_read), so the
workflow builds exactly what ``docker buildx bake`` would: one job per target (bake alone sends every target to one
builder node). Each job builds on a docker-container builder (the default docker driver cannot export a
cache) with a registry cache per target, ``<registry>/<namespace>/imagegen-cache:<target>``, imported with
``cache-from`` and exported with ``cache-to ... mode=max`` through ``--set``, and uploads the target's local
output folder (its ``type=local`` dest) as an artifact. A target whose base image has fallbacks (the
manylinux flavor's sameli image, ``--base-image CUDA=PRIMARY,FALLBACK``) builds, as ``imagegen build`` does,
on the first candidate that can be pulled: the bake file has a ``<target>-fallback`` target per fallback, and
the job picks the target before it bakes.

With ``--publish DEST`` (repeatable) a ``publish`` job follows the builds, on tag pushes and manual runs
only. Each build job then uploads its exported tree (the wheels and, beside each, its build record
``<wheel>.imagegen.json``) below the wheelhouse's top folder, so that the publish job's one merged download
is the wheelhouse layout ``<pkg>-<ver>/torch<X.Y>/cu<XYZ>/``. It installs imagegen from ``--imagegen-from``
(a pip requirement or a path), else this release of the distribution imagegen-wheels with its publish extra
(the PyPI name ``imagegen`` belongs to another project, which ci.py refuses), runs ``imagegen collect``
(which verifies each wheel against its record) and then ``imagegen publish --to DEST ...`` with the
destinations' credentials from the repository's secrets (PUBLISH_ENV), passed through ``env:`` of the
publish step only.

Each Windows job (``runs-on: windows-2022`` unless ``--windows-runs-on``) sets up the cell's Python (and a
separate 3.12 for imagegen itself), the CUDA toolkit with Jimver/cuda-toolkit (NVIDIA's network installer:
the cell's full toolkit version, WINDOWS_TOOLKITS, and the sub-packages a torch extension build needs,
WINDOWS_CUDA_PACKAGES) and MSVC with ilammy/msvc-dev-cmd (x64); installs imagegen from ``--imagegen-from``
(else this release of imagegen-wheels); writes the cell's script with ``imagegen render RECIPE --version V
--shell powershell --torch T --cuda C --python P --arch A -o build.ps1`` and runs it. The script writes the
wheels (each with its build record) below ``wheelhouse/`` and its logs in ``wheelhouse/logs/``: the job
uploads the first as ``wheels-windows-<cell>`` (so that the publish job's merged download lays them beside
the Linux ones) and the logs as ``logs-windows-<cell>``, also when the build failed.

The workflow runs on what ``--on`` gives (Triggers), by default a manual run, tags ``v*`` and pushes to the
default branch touching the bake file, its targets' build folders or the workflow itself.

Every job has a ``timeout-minutes`` below a hosted runner's 6 h (MAX_TIMEOUT_MINUTES), so that a build that
runs long stops on its own terms and the ``if: always()`` steps still run. The matrix values, the
destinations and the requirement reach the ``run:`` scripts only through ``env:``. Third-party actions are
pinned to full commit SHAs. _self_validate reads the rendered workflow back and refuses it (an internal error)
when its jobs, matrices or pins are not what was asked, or when a ``run:`` script holds a GitHub expression.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

import jinja2

from imagegen import DISTRIBUTION, __version__, safety
from imagegen.errors import CompatError, ImagegenError, UsageError, bounded, printable
from imagegen.render import templating
from imagegen.render.workflow_targets import MAX_MATRIX_JOBS, WorkflowTarget, wheelhouse_of

DEFAULT_BAKE_FILE = "docker-bake.hcl"
DEFAULT_GROUP = "default"
DEFAULT_REGISTRY = "ghcr.io"
DEFAULT_NAMESPACE = "${{ github.repository_owner }}"
DEFAULT_RUNS_ON = "ubuntu-latest"
DEFAULT_ARM64_RUNS_ON = "ubuntu-24.04-arm"  # GitHub-hosted arm64 runner (linux/arm64 targets build natively)
DEFAULT_OUTPUT = ".github/workflows/imagegen.yml"
CACHE_IMAGE = "imagegen-cache"


@dataclass(frozen=True)
class Action:
    repo: str
    commit: str
    version: str

    @property
    def ref(self) -> str:
        return f"{self.repo}@{self.commit}"


# Pinned to the commit of each release tag (the tag is written beside the SHA in the workflow).
ACTIONS = {
    "checkout": Action("actions/checkout", "3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "setup_buildx": Action("docker/setup-buildx-action", "37fe631027851001ddb9b187196cc803df7f5f0e", "v4.3.0"),
    "login": Action("docker/login-action", "4907a6ddec9925e35a0a9e82d7399ccc52663121", "v4.1.0"),
    "upload_artifact": Action("actions/upload-artifact", "bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "v7.0.0"),
    # a stopped build's tree, from one run's runner to the next (v4.2.3: one commit, both sub-actions)
    "cache_restore": Action("actions/cache/restore", "5a3ec84eff668545956fd18022155c47e93e2684", "v4.2.3"),
    "cache_save": Action("actions/cache/save", "5a3ec84eff668545956fd18022155c47e93e2684", "v4.2.3"),
}
# The publish job's, beside checkout.
PUBLISH_ACTIONS = {
    "download_artifact": Action("actions/download-artifact", "3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
}
# The Windows jobs', beside checkout and upload-artifact.
WINDOWS_ACTIONS = {
    "setup_python": Action("actions/setup-python", "a309ff8b426b58ec0e2a45f0f869d46889d02405", "v6.2.0"),
    "cuda_toolkit": Action("Jimver/cuda-toolkit", "3d45d157f327c09c04b50ee6ccdea2d9d017ec76", "v0.2.35"),
    "msvc": Action("ilammy/msvc-dev-cmd", "0b201ec74fa43914dc39ae48a89fd1d8cb592756", "v1.13.0"),
}
PUBLISH_TIMEOUT_MINUTES = 60
LOCK_TIMEOUT_MINUTES = 10  # the lock job's: it merges the build jobs' pushed digests into imagegen.lock
LOCK_JOB = "lock"
DEFAULT_WINDOWS_RUNS_ON = "windows-2022"
DEFAULT_WINDOWS_TIMEOUT = 240
DEFAULT_TIMEOUT = 330  # a Linux build job's: a flash-attn matrix cell on a 4-core hosted runner takes hours
# GitHub stops a job on its hosted runners after 360 minutes, saving nothing: every job's own limit is below
# it, so that the job's timeout stops it first and its `if: always()` steps (the Windows logs) still run.
RUNNER_LIMIT_MINUTES = 360
# A Linux job's compile gets its timeout less this as its budget (IMAGEGEN_BUILD_BUDGET): the layers before
# it (the toolchain, the audit: from the registry cache when they are there) and saving a stopped build's
# tree to the CI cache fit in it. A job whose timeout leaves less than RESUME_MIN_BUDGET gets no budget.
RESUME_MARGIN_MINUTES = 60
RESUME_MIN_BUDGET_MINUTES = 30
MAX_TIMEOUT_MINUTES = 350
# The Python the Windows jobs install imagegen with (its own venv), whatever the cell's Python is.
IMAGEGEN_PYTHON = "3.12"
# The CUDA toolkits the pinned Jimver/cuda-toolkit installs on Windows (its src/links/windows-links.ts at
# v0.2.35), from 11.8 on. A cell gets imagegen's own toolkit of its CUDA variant (cuda.yaml, as the Linux
# images have it) when the action has it, else the newest patch of that minor the action has.
WINDOWS_TOOLKITS = (
    "11.8.0", "12.0.0", "12.0.1", "12.1.0", "12.1.1", "12.2.0", "12.2.1", "12.2.2", "12.3.0", "12.3.1", "12.3.2",
    "12.4.0", "12.4.1", "12.5.0", "12.5.1", "12.6.0", "12.6.1", "12.6.2", "12.6.3", "12.8.0", "12.8.1", "12.9.0",
    "12.9.1", "13.0.0", "13.0.1", "13.0.2", "13.1.0", "13.1.1", "13.2.0",
)
# The network installer's sub-packages a torch extension build needs (the action appends _<major>.<minor>):
# nvcc, the runtime and CCCL (thrust) headers, cuobjdump (imagegen reads the built archs with it), the
# headers and import libraries of the CUDA libraries torch's own headers include (cuBLAS, cuSPARSE, cuSOLVER,
# cuRAND, NVRTC; NVTX), and the Visual Studio integration. CUDA 13 moved nvcc's crt headers
# (crt/host_config.h) into a sub-package of their own.
WINDOWS_CUDA_PACKAGES = ("nvcc", "cudart", "cuobjdump", "thrust", "cublas_dev", "cusparse_dev", "cusolver_dev",
                         "curand_dev", "nvrtc_dev", "nvtx", "visual_studio_integration")
WINDOWS_CUDA_PACKAGES_BY_MAJOR = {13: ("crt",)}
# The matrix values of a Windows cell, as they reach the YAML (through `q`) and the render command line
# (through env:): the catalogue's own names and versions, and the canonical forms of the planner.
CELL_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._;+-]{0,199}")
# GitHub expressions accepted as a namespace: they are lower-cased by the script at run time.
NAMESPACE_EXPRESSIONS = {"${{ github.repository_owner }}": "<owner>", "${{ github.repository }}": "<owner>/<repo>"}

# The repository secrets each kind of destination reads, by the environment variable `imagegen publish`
# reads (imagegen/publish/*_upload.py); configuration values that are not secret come from the
# repository's variables.
PUBLISH_ENV = {
    "pypi:": {"TWINE_USERNAME": "secrets.TWINE_USERNAME", "TWINE_PASSWORD": "secrets.TWINE_PASSWORD"},
    "hf:": {"HF_TOKEN": "secrets.HF_TOKEN"},
    # GitHub keeps the name GITHUB_* for itself: a token for another repository is IMAGEGEN_GITHUB_TOKEN.
    "github:": {"GITHUB_TOKEN": "secrets.IMAGEGEN_GITHUB_TOKEN || github.token"},
    "s3://": {"AWS_ACCESS_KEY_ID": "secrets.AWS_ACCESS_KEY_ID",
              "AWS_SECRET_ACCESS_KEY": "secrets.AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN": "secrets.AWS_SESSION_TOKEN",
              "AWS_ENDPOINT_URL": "vars.AWS_ENDPOINT_URL", "AWS_REGION": "vars.AWS_REGION"},
}


# --------------------------------------------------------------------------------------------
# Triggers (`on:`)

# A branch or tag filter and a paths filter as GitHub reads them (glob characters; a leading '!' negates):
# no quotes, spaces, '$', braces, ':' or '\\', so no YAML or GitHub expression reaches `on:`.
FILTER = re.compile(r"!?[A-Za-z0-9._*+?\[\]-][A-Za-z0-9._/*+?\[\]-]{0,199}")
DEFAULT_TAG = "v*"
DEFAULT_BRANCH = "main"
TRIGGER_WORDS = ("dispatch", "push", "pr", "tag:PATTERN", "branch:PATTERN", "paths:GLOB[,GLOB]")


@dataclass(frozen=True)
class Triggers:
    """The workflow's `on:`: ``--on`` as given (``given``, for the command line), or the default: a manual
    run, tags v*, and pushes to the default branch that touch the bake file, its Dockerfiles or the
    workflow itself (a farm's builds are hours; every push to every branch is not when to run them)."""

    dispatch: bool = True
    push_all: bool = False  # `push`: every push to any branch or tag
    branches: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()  # filters branch pushes and pull requests (GitHub ignores it for tags)
    pr: bool = False
    given: tuple[str, ...] = ()  # the --on values as given; empty: the default

    @property
    def push(self) -> bool:
        return self.push_all or bool(self.branches or self.tags)

    def describe(self) -> str:
        parts = ["a manual run"] if self.dispatch else []
        if self.push_all:
            parts.append("every push")
        if self.tags:
            parts.append(f"tags {', '.join(self.tags)}")
        if self.branches:
            parts.append(f"pushes to {', '.join(self.branches)}" + (" touching " + ", ".join(self.paths)
                                                                    if self.paths else ""))
        if self.pr:
            parts.append("pull requests" + (" touching " + ", ".join(self.paths) if self.paths else ""))
        return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class Options:
    bake_file: str
    targets: tuple[str, ...]  # empty: use group
    group: str
    registry: str
    namespace: str
    runs_on: tuple[str, ...]
    max_parallel: int | None
    output: str
    publish: tuple[str, ...] = ()
    arm64_runs_on: tuple[str, ...] = (DEFAULT_ARM64_RUNS_ON,)
    imagegen_from: str | None = None
    linux: bool = True  # the bake file's jobs (without --windows always; with it, when asked for)
    windows: WindowsRequest | None = None
    timeout: int = DEFAULT_TIMEOUT  # timeout-minutes of each Linux build job
    # --skip-published URL: where the published wheelhouse's folders are read (<folder>/manifest.json); a
    # cell whose inputs hash is listed there with its wheel is not built again.
    skip_published: str | None = None
    # --push-builders as given ('' bare: the config's registry, else --registry/--namespace) and the
    # REGISTRY/NAMESPACE each Linux job pushes its target's builder image to (None: no push).
    push_builders: str | None = None
    builders: str | None = None
    triggers: Triggers = Triggers(tags=(DEFAULT_TAG,), branches=(DEFAULT_BRANCH,))

    @property
    def publish_requirement(self) -> str:
        """What the publish job installs imagegen from: --imagegen-from, else this release of imagegen-wheels
        with its publish extra (the clients of every destination)."""
        return self.imagegen_from or f"{DISTRIBUTION}[publish]=={__version__}"

    @property
    def windows_requirement(self) -> str:
        """What the Windows jobs install imagegen from: --imagegen-from, else this release of imagegen-wheels."""
        return self.imagegen_from or f"{DISTRIBUTION}=={__version__}"

    @property
    def builders_shown(self) -> str:
        """builders for people: an expression shown as the placeholder it stands for."""
        host, _, namespace = (self.builders or "").partition("/")
        return f"{host}/{NAMESPACE_EXPRESSIONS.get(namespace, namespace)}"

    @property
    def selection(self) -> list[str]:
        return list(self.targets) or [self.group]

    def describe_selection(self) -> str:
        return f"targets {', '.join(self.targets)}" if self.targets else f"group {self.group}"

    @property
    def cache_repo(self) -> str:
        return f"{self.registry}/{self.namespace}/{CACHE_IMAGE}"

    @property
    def cache_repo_shown(self) -> str:
        """cache_repo for people: an expression shown as the placeholder it stands for."""
        namespace = NAMESPACE_EXPRESSIONS.get(self.namespace, self.namespace)
        return f"{self.registry}/{namespace}/{CACHE_IMAGE}"

    def command(self) -> str:
        """The command line that writes this workflow again (options at their defaults left out)."""
        parts = ["imagegen", "ci", "github"]
        if self.bake_file != DEFAULT_BAKE_FILE or (self.linux and self.windows is not None and not self.targets
                                                   and self.group == DEFAULT_GROUP):
            parts += ["--bake-file", self.bake_file]  # with --windows, what asks for the Linux jobs
        if self.targets:
            parts += ["--targets", ",".join(self.targets)]
        elif self.group != DEFAULT_GROUP:
            parts += ["--group", self.group]
        if self.registry != DEFAULT_REGISTRY:
            parts += ["--registry", self.registry]
        if self.namespace != DEFAULT_NAMESPACE:
            parts += ["--namespace", self.namespace]
        if self.push_builders is not None:
            parts += ["--push-builders", *([self.push_builders] if self.push_builders else [])]
        if self.runs_on != (DEFAULT_RUNS_ON,):
            parts += ["--runs-on", ",".join(self.runs_on)]
        if self.arm64_runs_on != (DEFAULT_ARM64_RUNS_ON,):
            parts += ["--arm64-runs-on", ",".join(self.arm64_runs_on)]
        if self.max_parallel is not None:
            parts += ["--max-parallel", str(self.max_parallel)]
        if self.timeout != DEFAULT_TIMEOUT:
            parts += ["--timeout", str(self.timeout)]
        if self.skip_published is not None:
            parts += ["--skip-published", self.skip_published]
        for spec in self.triggers.given:
            parts += ["--on", spec]
        if self.windows is not None:
            parts += self.windows.command()
        for dest in self.publish:
            parts += ["--publish", dest]
        if self.imagegen_from is not None:
            parts += ["--imagegen-from", self.imagegen_from]
        if self.output not in (DEFAULT_OUTPUT, "-"):
            parts += ["--output", self.output]
        return " ".join(shlex.quote(p) for p in parts)

    @property
    def merge_index(self) -> str | None:
        """Where the publish job merges the index it publishes with (``imagegen index --merge``): the
        --skip-published URL, when a destination holds the wheelhouse as served (s3://...,layout=wheelhouse)."""
        if any(dest.startswith("s3://") and dest.endswith(",layout=wheelhouse") for dest in self.publish):
            return self.skip_published
        return None

    def publish_env(self) -> dict[str, str]:
        """The environment of the publish step: each destination kind's credentials, as GitHub expressions."""
        env: dict[str, str] = {}
        for prefix, variables in PUBLISH_ENV.items():
            if any(dest.startswith(prefix) for dest in self.publish):
                env.update(variables)
        return env


# --------------------------------------------------------------------------------------------
# Windows jobs

@dataclass(frozen=True)
class WindowsRequest:
    """``--windows`` and its matrix, checked as text (windows_cells plans it)."""

    recipes: tuple[str, ...]
    torch: tuple[str, ...]
    cuda: tuple[str, ...]
    python: tuple[str, ...]  # empty: imagegen's default Python
    archs: tuple[str, ...]  # one list each; empty: imagegen's default list
    runs_on: tuple[str, ...]
    timeout: int
    versions: tuple[str, ...] = ()  # recipe versions (--windows-version); empty: each recipe's default

    def command(self) -> list[str]:
        """Its part of the command line that writes the workflow again (defaults left out)."""
        parts = ["--windows", ",".join(self.recipes), "--windows-torch", ",".join(self.torch),
                 "--windows-cuda", ",".join(self.cuda)]
        if self.python:
            parts += ["--windows-python", ",".join(self.python)]
        if self.versions:
            parts += ["--windows-version", ",".join(self.versions)]
        for archs in self.archs:
            parts += ["--windows-arch", archs]
        if self.runs_on != (DEFAULT_WINDOWS_RUNS_ON,):
            parts += ["--windows-runs-on", ",".join(self.runs_on)]
        if self.timeout != DEFAULT_WINDOWS_TIMEOUT:
            parts += ["--windows-timeout", str(self.timeout)]
        return parts


@dataclass(frozen=True)
class WindowsCell:
    """One Windows job: a buildable cell of the plan, as the workflow's matrix row carries it."""

    name: str  # the cell's name, as plan and bake name it: sage-2_2_0-torch2_8-cu128-py312
    recipe: str  # the catalogue's name
    version: str  # the recipe version (render --version): the same cell whatever imagegen's default
    torch: str  # the torch release
    cuda: str  # 12.8
    toolkit: str  # the full toolkit version the job installs: 12.8.1
    python: str
    arch: str  # the arch list asked for, as render --arch takes it
    packages: str  # the toolkit's sub-packages, a JSON array (the action's input)


def windows_toolkit(cuda) -> str:
    """The full CUDA toolkit version a Windows job installs for the CUDA variant ``cuda``."""
    if cuda.toolkit in WINDOWS_TOOLKITS:
        return cuda.toolkit
    from packaging.version import Version

    same = [v for v in WINDOWS_TOOLKITS if v.startswith(f"{cuda.dotted}.")]
    if not same:
        first, last = (".".join(WINDOWS_TOOLKITS[i].split(".")[:2]) for i in (0, -1))
        action = WINDOWS_ACTIONS["cuda_toolkit"]
        raise CompatError(f"{action.repo} {action.version} has no Windows installer for CUDA {cuda.dotted}"
                          f" ({cuda.name}): the Windows jobs take CUDA {first} to {last}")
    return max(same, key=Version)


def windows_packages(toolkit: str) -> str:
    major = int(toolkit.split(".")[0])
    return json.dumps([*WINDOWS_CUDA_PACKAGES, *WINDOWS_CUDA_PACKAGES_BY_MAJOR.get(major, ())])


# --------------------------------------------------------------------------------------------
# Rendering


def _environment() -> jinja2.Environment:
    return templating.environment(filters={
        "q": lambda value: json.dumps(str(value)),  # a JSON string is a YAML double-quoted scalar
        "expr": lambda name: "${{ " + name + " }}",
    })


def render_workflow(options: Options, targets: list[WorkflowTarget], cells: list[WindowsCell] | None = None, *,
                    left_out: list[str] | None = None) -> str:
    """The workflow; ``left_out``: the Windows cells of the matrix that cannot build, each with its reason,
    named in the header's comments."""
    cells = list(cells or [])
    linux_artifacts = {f"wheels-{t.name}" for t in targets}
    for cell in cells:
        if f"wheels-windows-{cell.name}" in linux_artifacts:
            raise UsageError(f"bake target windows-{cell.name} and the Windows cell {cell.name} would upload one"
                             " artifact name: rename the bake target")
    windows = options.windows
    text = _environment().get_template("github-workflow.yml.j2").render(
        version=__version__,
        command=options.command(),
        bake_file=options.bake_file,
        selection=options.describe_selection(),
        cache_repo=options.cache_repo,
        cache_repo_shown=options.cache_repo_shown,
        registry=options.registry,
        linux=bool(targets),
        ghcr=bool(targets) and options.registry == "ghcr.io",
        runs_on=list(options.runs_on),
        # With an arm64 target each job names its runner in the matrix (its platform's labels).
        runner={t.name: json.dumps(list(options.arm64_runs_on if t.arm64 else options.runs_on)) for t in targets}
        if any(t.arm64 for t in targets) else {},
        free_disk=all(len(labels) == 1 and labels[0].startswith("ubuntu-")
                      for labels in ([options.runs_on] + ([options.arm64_runs_on] if any(t.arm64 for t in targets) else []))),
        max_parallel=options.max_parallel,
        parts=_parts(targets),
        timeout=options.timeout,
        resume_budget=str(budget) if (budget := resume_budget(options.timeout)) else "",
        resume_margin=RESUME_MARGIN_MINUTES,
        skip_published=options.skip_published,
        targets=targets,
        fallbacks=any(t.bases for t in targets),
        cells=cells,
        windows_runs_on=list(windows.runs_on) if windows else [],
        windows_timeout=windows.timeout if windows else None,
        windows_recipes=", ".join(dict.fromkeys(c.recipe for c in cells)),
        # one comment line each: printable, no line break (a reason names catalogue values and checked flags)
        left_out=[bounded(printable(line), 400) for line in left_out or []],
        imagegen_python=IMAGEGEN_PYTHON,
        publish_requirement=options.publish_requirement,
        windows_requirement=options.windows_requirement,
        build_jobs=[part["job"] for part in _parts(targets)] + (["build-windows"] if cells else []),
        linux_jobs=[part["job"] for part in _parts(targets)],
        builders=options.builders if targets else None,
        builders_shown=options.builders_shown,
        lock_timeout=LOCK_TIMEOUT_MINUTES,
        lock_job=LOCK_JOB,
        actions={**ACTIONS, **PUBLISH_ACTIONS, **WINDOWS_ACTIONS},
        triggers=options.triggers,
        **_publish_context(options, targets),
    )
    _self_validate(text, targets, publish=bool(options.publish), cells=cells,
                   builders=options.builders is not None and bool(targets), triggers=options.triggers)
    return text


def resume_budget(timeout_minutes: int) -> int | None:
    """The compile budget in seconds of a Linux job with this timeout, or None when too little is left."""
    minutes = timeout_minutes - RESUME_MARGIN_MINUTES
    return minutes * 60 if minutes >= RESUME_MIN_BUDGET_MINUTES else None


def _parts(targets: list[WorkflowTarget]) -> list[dict]:
    """The Linux build jobs: one matrix of at most MAX_MATRIX_JOBS targets each, in the bake file's order
    (`build`, then `build-2`, ...: a matrix of 256 or fewer is the one `build` job it always was)."""
    chunks = [targets[i:i + MAX_MATRIX_JOBS] for i in range(0, len(targets), MAX_MATRIX_JOBS)]
    return [{"job": "build" if n == 0 else f"build-{n + 1}", "targets": chunk, "first": n * MAX_MATRIX_JOBS + 1,
             "last": n * MAX_MATRIX_JOBS + len(chunk), "total": len(targets)} for n, chunk in enumerate(chunks)]


def _publish_context(options: Options, targets: list[WorkflowTarget]) -> dict:
    if not options.publish:
        return {"publish": "", "folders": {}}
    top, folders = wheelhouse_of(targets)
    for name, rels in folders.items():
        for rel in rels:
            safety.validate(rel, safety.RELATIVE_PATH, f"output folder of bake target {name}")
    if top != ".":
        safety.validate(top, safety.RELATIVE_PATH, "wheelhouse folder")
    return {
        "publish": "\n".join(options.publish),
        "publish_env": options.publish_env(),
        "publish_github": any(dest.startswith("github:") for dest in options.publish),
        "merge_index": options.merge_index or "",
        "timeout_minutes": PUBLISH_TIMEOUT_MINUTES,
        "wheelhouse_top": top,
        "folders": {name: "\n".join(rels) for name, rels in folders.items()},
    }


def _self_validate(text: str, targets: list[WorkflowTarget], *, publish: bool = False,
                   cells: list[WindowsCell] | None = None, builders: bool = False,
                   triggers: Triggers | None = None) -> None:
    """The rendered workflow read back: its jobs, matrices and pins are what was asked, and no ``run:``
    script holds a GitHub expression (values reach the scripts through ``env:`` only)."""
    import yaml

    cells = list(cells or [])
    builds = [part["job"] for part in _parts(targets)]
    build_jobs = builds + (["build-windows"] if cells else [])
    want_jobs = build_jobs + (["publish"] if publish else []) + ([LOCK_JOB] if builders else [])
    try:
        doc = yaml.safe_load(text)
        jobs = list(doc["jobs"])
        matrix = [n for job in builds for n in doc["jobs"][job]["strategy"]["matrix"]["target"]] if targets else None
        windows = doc["jobs"]["build-windows"] if cells else None
        scripts = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
        uses = [s["uses"] for job in doc["jobs"].values() for s in job["steps"] if "uses" in s]
        needs = doc["jobs"]["publish"]["needs"] if publish else None
        on = doc["on"] or {}
    except Exception as exc:  # a template bug, not the user's
        raise ImagegenError(f"internal error: the rendered workflow does not parse: {exc}") from None
    if triggers is not None:
        want_on = {"push": {k: list(v) for k, v in (("branches", triggers.branches), ("tags", triggers.tags),
                                                     ("paths", triggers.paths if triggers.branches else ()))
                            if v and not triggers.push_all} or None} if triggers.push else {}
        if triggers.pr:
            want_on["pull_request"] = {"paths": list(triggers.paths)} if triggers.paths else None
        if triggers.dispatch:
            want_on["workflow_dispatch"] = None
        if on != want_on:
            raise ImagegenError("internal error: the rendered workflow's triggers are not what was asked")
    if targets and matrix != [t.name for t in targets]:
        raise ImagegenError("internal error: the rendered workflow's matrix differs from the bake targets")
    if jobs != want_jobs or any("${{" in script for script in scripts):
        raise ImagegenError("internal error: the rendered workflow's jobs or scripts are not what was asked")
    if publish and needs != (build_jobs[0] if len(build_jobs) == 1 else build_jobs):
        raise ImagegenError("internal error: the rendered workflow's publish job does not wait for every build job")
    if builders:
        rows = [row for job in builds for row in doc["jobs"][job]["strategy"]["matrix"]["include"]]
        pushes = [s for job in builds for s in doc["jobs"][job]["steps"] if s.get("id") == "builder"]
        lock_needs = doc["jobs"][LOCK_JOB]["needs"]
        if [row.get("builder") for row in rows] != [t.builder for t in targets] or len(pushes) != len(builds) \
                or lock_needs != (builds[0] if len(builds) == 1 else builds) \
                or any("secrets." in str(value) for s in pushes for value in (s.get("env") or {}).values()):
            raise ImagegenError("internal error: the rendered workflow's builder image pushes are not what was asked")
    pinned = {a.ref for a in (*ACTIONS.values(), *PUBLISH_ACTIONS.values(), *WINDOWS_ACTIONS.values())}
    if any(ref not in pinned for ref in uses):
        raise ImagegenError("internal error: the rendered workflow uses an action that is not pinned to its commit")
    if cells:
        rows = windows["strategy"]["matrix"].get("include") or []
        want = [{"cell": c.name, "recipe": c.recipe, "version": c.version, "torch": c.torch, "cuda": c.cuda,
                 "toolkit": c.toolkit, "python": c.python, "arch": c.arch, "packages": c.packages} for c in cells]
        if windows["strategy"]["matrix"].get("cell") != [c.name for c in cells] or rows != want:
            raise ImagegenError("internal error: the rendered workflow's Windows matrix differs from the planned cells")
        with_env = [s for s in windows["steps"] if "run" in s]
        if any(s.get("shell") != "pwsh" for s in with_env):
            raise ImagegenError("internal error: a Windows step does not run in pwsh")
