"""``imagegen ci github``: a GitHub Actions workflow that spreads a bake file's targets over runners.

The matrix is read from the bake file itself through ``docker buildx bake --print`` (no daemon
needed; see imagegen.render.bakefiles.print_bake), so the workflow builds exactly what ``docker buildx
bake`` would: one job per target, each on its own runner. bake alone cannot spread targets over
hosts (it sends every target to one builder node), so the workflow does it, one ``bake TARGET`` per
job.

Each job builds on a docker-container builder (the default docker driver cannot export a cache)
with a registry cache per target, ``<registry>/<namespace>/imagegen-cache:<target>``, imported
with ``cache-from`` and exported with ``cache-to ... mode=max`` through ``--set``, and uploads
the target's local output folder (its ``type=local`` dest from the bake file) as an artifact.

With ``--publish DEST`` (repeatable) a ``publish`` job follows the builds, on tag pushes and manual
runs only. Each build job then uploads its exported tree (the wheels and, beside each, its build
record ``<wheel>.imagegen.json``) below the wheelhouse's top folder, so that the publish job's one
merged download is the wheelhouse layout ``<pkg>-<ver>/torch<X.Y>/cu<XYZ>/``. It installs imagegen
from ``--imagegen-from`` (a pip requirement: the PyPI name ``imagegen`` belongs to another project, so
the workflow never guesses it), runs ``imagegen collect`` (which verifies each wheel against its
record and lists those that pass in the folders' manifest.json) and then ``imagegen publish --to
DEST ...`` with the destinations' credentials from the repository's secrets (TWINE_USERNAME,
TWINE_PASSWORD, HF_TOKEN, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; the variables
AWS_ENDPOINT_URL and AWS_REGION; IMAGEGEN_GITHUB_TOKEN, else the workflow's own token with
``contents: write``), passed through ``env:`` of the publish step only.

With ``--windows RECIPE`` (repeatable) the workflow also builds on Windows runners, one ``build-windows``
job per cell of ``--windows-torch`` x ``--windows-cuda`` x ``--windows-python`` x ``--windows-arch``. The cells
are planned here as ``imagegen plan`` plans them (imagegen.plan, with the toolkit the job installs as nvcc),
and a cell the plan rejects (CUDA 12.6 with arch 12.0, a torch/CUDA pair torch never shipped, a Python the
torch has no wheel for) is refused before anything is written. Each job (``runs-on: windows-2022`` unless
``--windows-runs-on``; ``timeout-minutes`` ``--windows-timeout``, default 240, at most GitHub's 360) sets up the
cell's Python (and a separate 3.12 for imagegen itself), the CUDA toolkit with Jimver/cuda-toolkit (NVIDIA's
network installer: the cell's full toolkit version, WINDOWS_TOOLKITS, and the sub-packages a torch
extension build needs, WINDOWS_CUDA_PACKAGES) and MSVC with ilammy/msvc-dev-cmd (x64); installs imagegen from
``--imagegen-from`` (required with --windows); writes the cell's script with ``imagegen render RECIPE
--version V --shell powershell --torch T --cuda C --python P --arch A -o build.ps1`` and runs it with
``powershell -NoProfile -ExecutionPolicy Bypass -File build.ps1 -Wheelhouse wheelhouse``. The script writes the
wheels (each with its build record) below ``wheelhouse/`` in the wheelhouse layout and its logs in
``wheelhouse/logs/``: the job uploads the first as
``wheels-windows-<cell>`` (its paths below ``wheelhouse/``, so that the publish job's merged download lays
them beside the Linux ones) and the logs as ``logs-windows-<cell>``, also when the build failed. Linux jobs
are written beside them only when --bake-file, --targets or --group is given (without --windows: always),
so a Windows-only workflow needs no bake file. The publish job publishes what ``imagegen collect``
verified, so a Windows wheel reaches it only with its build record beside it.

Everything that reaches the YAML or a shell is validated first (registry, namespace, runner
labels, bake file, target and group names, output folders, publish destinations, the requirement,
the Windows recipes and cells, the timeout); the matrix values, the destinations and the requirement
reach the ``run:`` scripts only through ``env:``. Third-party actions are pinned to full commit SHAs.
_self_check reads the rendered workflow back and refuses it (an internal error) when its jobs,
matrices or pins are not what was asked, or when a ``run:`` script holds a GitHub expression.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import posixpath
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from imagegen import __version__, safety
from imagegen.cell_rules import FixWords
from imagegen.errors import CompatError, ImagegenError, NothingToDoError, UnsafeValueError, UsageError
from imagegen.model.destinations import parse_destination
from imagegen.outputs import resolve_target, write_output
from imagegen.render.bakefiles import print_bake
from imagegen.resources.builder import imagegen_wheeltools as wheeltools

DEFAULT_BAKE_FILE = "docker-bake.hcl"
DEFAULT_GROUP = "default"
DEFAULT_REGISTRY = "ghcr.io"
DEFAULT_NAMESPACE = "${{ github.repository_owner }}"
DEFAULT_RUNS_ON = "ubuntu-latest"
DEFAULT_ARM64_RUNS_ON = "ubuntu-24.04-arm"  # GitHub-hosted arm64 runner (linux/arm64 targets build natively)
DEFAULT_OUTPUT = ".github/workflows/imagegen.yml"
CACHE_IMAGE = "imagegen-cache"
MAX_MATRIX_JOBS = 256  # GitHub's limit for one matrix


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
DEFAULT_WINDOWS_RUNS_ON = "windows-2022"
DEFAULT_WINDOWS_TIMEOUT = 240
MAX_TIMEOUT_MINUTES = 360  # GitHub's limit for a job on its hosted runners
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
# The wheelhouse layout below its top folder (imagegen.model.layout.DEFAULT_LAYOUT): the publish job's
# wheelhouse is the output folders' common folder above their last LAYOUT_DEPTH parts.
LAYOUT_DEPTH = 3

# A registry host as docker reads it: a dotted name or localhost, with an optional port. A first path
# component without a dot or port would be taken for a Docker Hub namespace instead.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
REGISTRY = re.compile(rf"(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]{{1,5}})?")
# Repository path components of an image reference (lower case, as the registry requires).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
NAMESPACE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT}){{0,7}}")
# GitHub expressions accepted as a namespace: they are lower-cased by the script at run time.
NAMESPACE_EXPRESSIONS = {"${{ github.repository_owner }}": "<owner>", "${{ github.repository }}": "<owner>/<repo>"}
# Bake target and group names (bake allows [A-Za-z0-9_-]); a target name is also the cache tag, so
# it must start like a tag and fit in one (128 characters).
BAKE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
RUNNER_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A --windows recipe as given (a catalogue name or alias; looked up in the catalogue after this check).
WINDOWS_RECIPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# The matrix values of a Windows cell, as they reach the YAML (through `q`) and the render command line
# (through env:): the catalogue's own names and versions, and the canonical forms of the planner.
CELL_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._;+-]{0,199}")
# A publish destination as it reaches the workflow: its kind and characters safe in YAML and in an
# environment variable (no quotes, spaces, $ or braces, so no GitHub expression either; no newline, which
# separates destinations in PUBLISH_TO). Each is then parsed as `imagegen publish --to` parses it
# (imagegen.model.destinations.parse_destination), so the job never meets one publish refuses.
PUBLISH_DEST = re.compile(r"(?:pypi:https?://|hf:|github:|s3://)[A-Za-z0-9._~:/@%+=,-]{1,400}")
# How the publish job installs imagegen: a pip requirement (name[extras] @ URL, a path, name==version);
# it cannot start with '-' (a pip option).
REQUIREMENT = re.compile(r"[A-Za-z0-9.][A-Za-z0-9._\[\],@ :/+=<>!~#%-]{0,299}")
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


def _check(value: object, pattern: re.Pattern[str], what: str, hint: str) -> str:
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    shown = repr(safety.redact(value) if isinstance(value, str) else value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise UnsafeValueError(f"{what} {shown} is not allowed: use {hint}")


def pypi_imagegen(requirement: str) -> bool:
    """Whether pip could take ``requirement`` as PyPI's 'imagegen' (another project): a requirement by
    name with no URL, whatever follows a '#' (pip reads `` #...`` as a comment in a requirements file,
    and no name goes on past one), in any spelling of the name (``IMAGEGEN``, ``imagegen[publish]>=1``)."""
    head = requirement.split("#", 1)[0].strip()
    try:
        parsed = Requirement(head)
    except InvalidRequirement:
        return False  # a path or a URL (./tools/imagegen, git+https://...): not a name pip looks up
    return parsed.url is None and canonicalize_name(parsed.name) == "imagegen"


def _names(values: list[str] | None) -> list[str]:
    """``--targets a,b --targets c`` -> [a, b, c] (commas and spaces separate)."""
    out: list[str] = []
    for value in values or []:
        for name in re.split(r"[,\s]+", value.strip()):
            if name and name not in out:
                out.append(name)
    return out


# --------------------------------------------------------------------------------------------
# Command line


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``ci`` (with its ``github`` subcommand) to the top-level subparsers of imagegen."""
    p = subparsers.add_parser("ci", help="write a CI workflow that builds the bake matrix on CI runners", description=(
        "Write a CI workflow that builds every target of a bake file, one runner per target."))
    sub = p.add_subparsers(dest="ci_command", metavar="PROVIDER", parser_class=type(p))
    sub.required = True
    g = sub.add_parser("github", help="GitHub Actions workflow with a registry cache per target", description=(
        "Write a GitHub Actions workflow whose matrix is the bake file's targets (read with `docker buildx"
        " bake --print`, so they always match): each job bakes one target on its own runner with a"
        " docker-container builder and a registry cache (<registry>/<namespace>/imagegen-cache:<target>,"
        " cache-to mode=max), then uploads the target's local output folder as an artifact. With --windows, it"
        " also builds on Windows runners, one job per cell of the --windows-* matrix (planned as `imagegen plan`"
        " plans it: a cell it rejects is refused); its Linux jobs are then written only when --bake-file,"
        " --targets or --group is given. Run it in the repository's top folder, where the workflow runs bake."),
        epilog=("example: imagegen ci github --windows sage --windows-torch 2.8 --windows-cuda 12.8 --windows-python"
                " 3.12 --windows-arch '8.0;9.0;12.0' --imagegen-from 'imagegen @ git+https://github.com/ORG/imagegen@TAG'"
                " (Windows jobs only; add --group default for the bake file's Linux jobs too)"))
    g.add_argument("--bake-file", help="bake file, relative to the repository's top folder"
                   f" (default: {DEFAULT_BAKE_FILE}, written by `imagegen bake --repo`)")
    which = g.add_mutually_exclusive_group()
    which.add_argument("--targets", action="append", metavar="NAMES",
                       help="bake targets or groups to build (comma-separated or repeated)")
    which.add_argument("--group", help=f"bake group to build (default: {DEFAULT_GROUP})")
    g.add_argument("--registry", default=DEFAULT_REGISTRY, help=f"registry for the build cache (default: {DEFAULT_REGISTRY},"
                   " logged in with GITHUB_TOKEN; any other uses the secrets IMAGEGEN_REGISTRY_USERNAME and"
                   " IMAGEGEN_REGISTRY_PASSWORD)")
    g.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="repository path under the registry"
                   " (default: the repository owner, lower-cased at run time)")
    g.add_argument("--runs-on", action="append", metavar="LABELS", help=f"runner labels (comma-separated or repeated;"
                   f" default: {DEFAULT_RUNS_ON})")
    g.add_argument("--arm64-runs-on", action="append", metavar="LABELS", help="runner labels of the jobs of linux/arm64"
                   f" targets (imagegen bake --platform arm64), which build natively there (default: {DEFAULT_ARM64_RUNS_ON},"
                   " GitHub's arm64 runner)")
    g.add_argument("--max-parallel", type=int, help="most jobs at once, in each of the Linux and the Windows matrix"
                   " (default: as many as GitHub allows)")
    w = g.add_argument_group("Windows jobs", "native Windows builds, one job per cell of recipes x torch x CUDA x Python"
                             " x arch list; every cell must be one `imagegen plan` finds buildable")
    w.add_argument("--windows", action="append", metavar="RECIPES", help="add Windows jobs building these recipes"
                   " (catalogue names or aliases, at their default version unless --windows-version; comma-separated or"
                   " repeated); needs --windows-torch, --windows-cuda and --imagegen-from")
    w.add_argument("--windows-version", action="append", metavar="VERSIONS", help="recipe versions of the Windows"
                   " cells, each recipe's cells at each (comma-separated or repeated, e.g. 2.8.2,2.8.3; default: the"
                   " recipe's default version)")
    w.add_argument("--windows-torch", action="append", metavar="VERSIONS", help="torch series or releases of the"
                   " Windows cells: 2.8 or 2.8.0 (comma-separated or repeated)")
    w.add_argument("--windows-cuda", action="append", metavar="VERSIONS", help="CUDA variants of the Windows cells:"
                   " 12.8 or cu128 (comma-separated or repeated)")
    w.add_argument("--windows-python", action="append", metavar="VERSIONS", help="CPython versions of the Windows"
                   " cells (comma-separated or repeated; default: imagegen's default Python)")
    w.add_argument("--windows-arch", action="append", metavar="ARCHS", help="one GPU arch list of the Windows cells,"
                   " e.g. '8.0;9.0;12.0' (repeat for several lists; default: imagegen's default list)")
    w.add_argument("--windows-runs-on", action="append", metavar="LABELS", help="runner labels of the Windows jobs"
                   f" (comma-separated or repeated; default: {DEFAULT_WINDOWS_RUNS_ON})")
    w.add_argument("--windows-timeout", type=int, metavar="MINUTES", help="timeout-minutes of each Windows job"
                   f" (default: {DEFAULT_WINDOWS_TIMEOUT}; at most {MAX_TIMEOUT_MINUTES}, GitHub's limit)")
    g.add_argument("--publish", action="append", metavar="DEST", help="add a publish job: once every target built,"
                   " on a tag push or a manual run, `imagegen collect` verifies the wheels against their build"
                   " records and `imagegen publish` uploads those to DEST (as imagegen publish --to takes it;"
                   " repeatable), with the credentials from the repository's secrets")
    g.add_argument("--imagegen-from", metavar="REQUIREMENT", help="with --publish or --windows: how the publish job"
                   " and the Windows jobs install imagegen, a pip requirement such as"
                   " 'imagegen[publish] @ git+https://github.com/ORG/imagegen@v0.1.0' or a path in the repository"
                   " (required: PyPI's 'imagegen' is another project)")
    g.add_argument("-o", "--output", default=DEFAULT_OUTPUT, help=f"workflow file to write, - for stdout"
                   f" (default: {DEFAULT_OUTPUT})")
    return p


def run(args: argparse.Namespace, argv=None) -> int:
    """``imagegen ci github``; ``argv`` is accepted (and unused) so that cli.COMMANDS can call it."""
    if getattr(args, "ci_command", None) != "github":
        raise UsageError("imagegen ci: name a CI provider: github")
    options = Options.from_args(args)
    root = Path.cwd()
    _check_top_folder(root)
    # The Windows cells first: a cell the plan rejects stops here, before buildx runs.
    cells = windows_cells(options.windows, root) if options.windows else []
    targets: list[WorkflowTarget] = []
    if options.linux:
        if not (root / options.bake_file).is_file():
            raise UsageError(f"--bake-file {options.bake_file}: no such file in {root} (write it with `imagegen bake"
                             " --repo` or `imagegen bake -f FILE`, and run imagegen ci github in the repository's top"
                             " folder)")
        printed = print_bake(Path(options.bake_file), root, targets=options.selection)
        targets = targets_from_print(printed)
    text = render_workflow(options, targets, cells)
    write_output(text, options.output, what="workflow file")
    if options.output != "-":
        jobs = []
        if options.linux:
            jobs.append(f"{len(targets)} Linux jobs, one per target of {options.describe_selection()} in"
                        f" {options.bake_file}")
        if cells:
            jobs.append(f"{len(cells)} Windows job{'s' if len(cells) != 1 else ''}, one per cell")
        if options.publish:
            jobs.append("a publish job")
        print(f"wrote {options.output}: {', '.join(jobs)}", file=sys.stderr)
    return 0


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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Options":
        windows = WindowsRequest.from_args(args)
        bake_file_given = getattr(args, "bake_file", None) is not None
        linux = windows is None or bake_file_given or args.targets is not None or args.group is not None
        bake_file = safety.check(args.bake_file if bake_file_given else DEFAULT_BAKE_FILE, safety.RELATIVE_PATH,
                                 "--bake-file")
        targets = tuple(_check(n, BAKE_NAME, "--targets name", "bake target names of letters, digits, '_' and '-'")
                        for n in _names(args.targets))
        if args.targets is not None and not targets:
            raise UsageError("--targets: name at least one bake target")
        group = _check(args.group or DEFAULT_GROUP, BAKE_NAME, "--group", "a bake group name of letters, digits, '_' and '-'")
        registry = _check(args.registry, REGISTRY, "--registry",
                          "a registry host such as ghcr.io or registry.example.com:5000 (lower case, no scheme or path)")
        namespace = args.namespace
        if namespace not in NAMESPACE_EXPRESSIONS:
            _check(namespace, NAMESPACE, "--namespace", "a lower-case image path such as my-org or my-org/wheels,"
                   f" or one of {', '.join(NAMESPACE_EXPRESSIONS)}")
        runs_on = tuple(_check(label, RUNNER_LABEL, "--runs-on label", "runner labels of letters, digits, '.', '_' and '-'")
                        for label in _names(args.runs_on or [DEFAULT_RUNS_ON]))
        if not runs_on:
            raise UsageError("--runs-on: name at least one runner label")
        arm64_runs_on = tuple(_check(label, RUNNER_LABEL, "--arm64-runs-on label", "runner labels of letters, digits,"
                                     " '.', '_' and '-'")
                              for label in _names(getattr(args, "arm64_runs_on", None) or [DEFAULT_ARM64_RUNS_ON]))
        if not arm64_runs_on:
            raise UsageError("--arm64-runs-on: name at least one runner label")
        if args.max_parallel is not None and not 1 <= args.max_parallel <= MAX_MATRIX_JOBS:
            raise UsageError(f"--max-parallel must be between 1 and {MAX_MATRIX_JOBS}")
        output = args.output
        if not output:
            raise UsageError("--output: give a file, or - for stdout")
        if output != "-":
            resolve_target(output, "workflow file")  # a device, folder or odd name: refused before buildx runs
        publish = tuple(_check(d, PUBLISH_DEST, "--publish", "a destination as imagegen publish --to takes it:"
                               " pypi:URL, hf:OWNER/REPO[@REVISION][:PATH], github:OWNER/REPO@TAG,"
                               " s3://BUCKET[/PREFIX]")
                        for d in dict.fromkeys(getattr(args, "publish", None) or []))
        for dest in publish:  # the workflow is committed: a credential there is public
            safety.no_credentials(dest.removeprefix("pypi:"), "--publish", safety.CI_SECRET_INSTEAD
                                  + " (TWINE_USERNAME/TWINE_PASSWORD, HF_TOKEN, IMAGEGEN_GITHUB_TOKEN, AWS_*)")
            parse_destination(dest, "--publish")
        imagegen_from = getattr(args, "imagegen_from", None)
        if publish and imagegen_from is None:
            raise UsageError("--publish needs --imagegen-from REQUIREMENT: how the publish job installs imagegen (e.g."
                             " 'imagegen[publish] @ git+https://github.com/ORG/imagegen@v0.1.0'; PyPI's 'imagegen' is"
                             " another project)")
        if windows is not None and imagegen_from is None:
            raise UsageError("--windows needs --imagegen-from REQUIREMENT: how the Windows jobs install imagegen (e.g."
                             " 'imagegen @ git+https://github.com/ORG/imagegen@v0.1.0'; PyPI's 'imagegen' is another"
                             " project)")
        if imagegen_from is not None:
            if not publish and windows is None:
                raise UsageError("--imagegen-from is for the publish job and the Windows jobs: give --publish DEST or"
                                 " --windows RECIPE too")
            _check(imagegen_from, REQUIREMENT, "--imagegen-from", "a pip requirement such as"
                   " 'imagegen[publish] @ git+https://github.com/ORG/imagegen@TAG' (no quotes, $, ; or braces)")
            safety.no_credentials(imagegen_from, "--imagegen-from", "keep imagegen's source public, in the repository"
                                  " itself (a path such as ./tools/imagegen), or reachable with the job's own token")
            if pypi_imagegen(imagegen_from):
                # By name alone pip would install PyPI's 'imagegen', another project, into the job that
                # holds the publish secrets.
                raise UsageError(f"--imagegen-from {imagegen_from!r} would install PyPI's 'imagegen', another project:"
                                 " name this one by URL or path, e.g. 'imagegen[publish] @"
                                 " git+https://github.com/ORG/imagegen@TAG' or './tools/imagegen'")
        opts = cls(bake_file=bake_file, targets=targets, group=group, registry=registry, namespace=namespace,
                   runs_on=runs_on, max_parallel=args.max_parallel, output=output, publish=publish,
                   arm64_runs_on=arm64_runs_on,
                   imagegen_from=imagegen_from, linux=linux, windows=windows)
        # The reference buildx will see (an expression stands for a lower-case owner/repo): well formed?
        safety.check(f"{opts.cache_repo_shown.replace('<', '').replace('>', '')}:tag", safety.IMAGE_REF, "cache reference")
        return opts

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
        if self.runs_on != (DEFAULT_RUNS_ON,):
            parts += ["--runs-on", ",".join(self.runs_on)]
        if self.arm64_runs_on != (DEFAULT_ARM64_RUNS_ON,):
            parts += ["--arm64-runs-on", ",".join(self.arm64_runs_on)]
        if self.max_parallel is not None:
            parts += ["--max-parallel", str(self.max_parallel)]
        if self.windows is not None:
            parts += self.windows.command()
        for dest in self.publish:
            parts += ["--publish", dest]
        if self.imagegen_from is not None:
            parts += ["--imagegen-from", self.imagegen_from]
        if self.output not in (DEFAULT_OUTPUT, "-"):
            parts += ["--output", self.output]
        return " ".join(shlex.quote(p) for p in parts)

    def publish_env(self) -> dict[str, str]:
        """The environment of the publish step: each destination kind's credentials, as GitHub expressions."""
        env: dict[str, str] = {}
        for prefix, variables in PUBLISH_ENV.items():
            if any(dest.startswith(prefix) for dest in self.publish):
                env.update(variables)
        return env


# --------------------------------------------------------------------------------------------
# Windows jobs

# torch, CUDA and Python as given (compat reads each; this keeps its messages short).
_VERSION_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+]{0,31}")
# One GPU arch list as given (parse_arch_list reads it): 8.0;9.0;12.0+PTX, sm_90a, Hopper, "8.0 9.0" ...
_ARCH_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._;:+, -]{0,199}")


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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "WindowsRequest | None":
        flags = {"--windows-torch": "windows_torch", "--windows-cuda": "windows_cuda", "--windows-python": "windows_python",
                 "--windows-version": "windows_version", "--windows-arch": "windows_arch",
                 "--windows-runs-on": "windows_runs_on", "--windows-timeout": "windows_timeout"}
        values = {flag: getattr(args, dest, None) for flag, dest in flags.items()}
        if getattr(args, "windows", None) is None:
            given = [flag for flag, value in values.items() if value is not None]
            if given:
                raise UsageError(f"{given[0]} goes with --windows RECIPE (the recipes the Windows jobs build)")
            return None
        recipes = tuple(_check(n, WINDOWS_RECIPE, "--windows recipe", "a recipe name or alias such as sage or"
                               " flash-attn (imagegen recipes lists them)") for n in _names(args.windows))
        if not recipes:
            raise UsageError("--windows: name at least one recipe (imagegen recipes lists them)")
        axes = {}
        for flag, what in (("--windows-torch", "a torch series or release such as 2.8"),
                           ("--windows-cuda", "a CUDA version such as 12.8 or cu128"),
                           ("--windows-python", "a CPython version such as 3.12"),
                           ("--windows-version", "a recipe version such as 2.8.3")):
            raw = values[flag]
            axes[flag] = tuple(_check(v, _VERSION_ARG, flag, what) for v in _names(raw))
            if raw is not None and not axes[flag]:
                raise UsageError(f"{flag}: give at least one version")
        for flag in ("--windows-torch", "--windows-cuda"):
            if not axes[flag]:
                raise UsageError(f"--windows needs {flag} (comma-separated versions): the Windows matrix is asked for,"
                                 " never guessed")
        archs = tuple(dict.fromkeys(_check(a.strip(), _ARCH_ARG, "--windows-arch", "one GPU arch list such as"
                                           " '8.0;9.0;12.0' or 9.0+PTX per flag") for a in values["--windows-arch"] or []))
        runs_on = tuple(_check(label, RUNNER_LABEL, "--windows-runs-on label", "runner labels of letters, digits, '.',"
                               " '_' and '-'") for label in _names(values["--windows-runs-on"] or [DEFAULT_WINDOWS_RUNS_ON]))
        if not runs_on:
            raise UsageError("--windows-runs-on: name at least one runner label")
        timeout = values["--windows-timeout"]
        if timeout is None:
            timeout = DEFAULT_WINDOWS_TIMEOUT
        elif not 1 <= timeout <= MAX_TIMEOUT_MINUTES:
            raise UsageError(f"--windows-timeout must be between 1 and {MAX_TIMEOUT_MINUTES} minutes (GitHub stops a"
                             f" hosted job after {MAX_TIMEOUT_MINUTES})")
        return cls(recipes=recipes, torch=axes["--windows-torch"], cuda=axes["--windows-cuda"],
                   python=axes["--windows-python"], archs=archs, runs_on=runs_on, timeout=timeout,
                   versions=axes["--windows-version"])

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


# A rejected Windows cell's reason names the --windows-* flags that change it.
WINDOWS_FIXES = FixWords(torch="use --windows-torch {}", cuda="use --windows-cuda {}", python="use --windows-python {}",
                         version="--windows-version")


def windows_cells(request: WindowsRequest, root: Path) -> list[WindowsCell]:
    """The Windows matrix planned as `imagegen plan` plans a matrix (imagegen.plan), with the toolkit each job
    installs as its nvcc: every cell must be buildable, or CompatError names the first that is not and why."""
    from packaging.version import Version

    from imagegen.config import load_config
    from imagegen.model import compat
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.model.catalogue import load_catalogue
    from imagegen.plan import defaults, native_cell

    config = load_config(search_from=root)  # the checkout's, as `imagegen render` on the runner reads it
    cat = load_catalogue(tuple(config.recipe_dirs))
    recipes = {}
    for name in request.recipes:
        recipe = cat.get(name)
        for wanted in request.versions or (None,):
            version = recipe.version(wanted)
            if recipe.source_kind != "git" or not version.ref:
                raise UsageError(f"--windows {name}: the Windows script clones the recipe's git source, and"
                                 f" {recipe.name} {version.version} has no git ref to clone")
            recipes.setdefault((recipe.name, version.version), (recipe, version))
    series = list({tv: (s, tv) for s, tv in (compat.torch_series(t) for t in request.torch)}.values())
    variants = list({v.name: v for v in (compat.cuda_variant(c) for c in request.cuda)}.values())
    pythons = list(dict.fromkeys(compat.check_python(p) for p in request.python or [str(defaults()["python"])]))
    archs = list({str(a): a for a in (parse_arch_list(a) for a in request.archs or [defaults()["arch"]])}.values())
    toolkits = {v.name: windows_toolkit(v) for v in variants}
    cells: list[WindowsCell] = []
    rejected = []
    seen: dict[str, str] = {}
    abi3_built: set[tuple] = set()
    for (recipe, version), (s, tv), cuda, requested, py in itertools.product(
            recipes.values(), series, variants, archs, pythons):
        toolkit = toolkits[cuda.name]
        host = compat.BaseImage(ref="windows", flavor=compat.flavor("native"), python="python", toolkit="host",
                                nvcc=Version(toolkit), image_torch_cuda=None)
        cell = native_cell(recipe, version, requested, host, tv, cuda.name, py, WINDOWS_FIXES)
        if not cell.buildable:
            rejected.append(cell)
            continue
        key = (recipe.name, version.version, tv, cuda.name, str(requested))
        if recipe.abi3 and key in abi3_built:
            continue  # a Python-independent wheel: built once per torch x CUDA, as plan skips the others
        abi3_built.add(key)
        other = seen.setdefault(cell.name, str(requested))
        if other != str(requested):
            raise UsageError(f"Windows cell {cell.name} is asked for two arch lists ({other} and {requested}): a"
                             " workflow has one job per cell; give one --windows-arch list")
        row = WindowsCell(name=_check(cell.name, BAKE_NAME, "Windows cell name", "a recipe with a plain name"),
                          recipe=recipe.name, version=version.version, torch=tv, cuda=cuda.dotted, toolkit=toolkit,
                          python=py, arch=str(requested), packages=windows_packages(toolkit))
        for value in (row.recipe, row.version, row.torch, row.cuda, row.toolkit, row.python, row.arch):
            _check(value, CELL_VALUE, f"Windows cell {row.name}", "a recipe and versions of plain characters")
        cells.append(row)
    if rejected:
        first = rejected[0]
        more = f" (and {len(rejected) - 1} more rejected cells)" if len(rejected) > 1 else ""
        why = "; ".join(first.problems)
        why = why if len(why) <= 240 else why[:237] + "..."
        raise CompatError(f"Windows cell {first.name} (arch {first.requested_archs or first.archs}) cannot build:"
                          f" {why}{more}")
    if len(cells) > MAX_MATRIX_JOBS:
        raise UsageError(f"{len(cells)} Windows cells: a GitHub matrix holds at most {MAX_MATRIX_JOBS} jobs")
    return cells


def _check_top_folder(cwd: Path) -> None:
    """The workflow runs bake in the checkout's top folder, and bake resolves paths against its cwd."""
    try:
        # As on any tree imagegen reads: none of the checkout's own commands run (imagegen_wheeltools.git_cmd).
        env = wheeltools.git_env(str(cwd))
        env.pop("GIT_CEILING_DIRECTORIES")  # the top folder is searched upwards from cwd
        proc = subprocess.run(wheeltools.git_cmd(str(cwd), ["rev-parse", "--show-toplevel"], env=env), env=env,
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired, wheeltools.UnsafeTree):
        return  # no git: nothing to compare with
    if proc.returncode != 0 or not proc.stdout.strip():
        return  # not a git checkout
    top = Path(proc.stdout.strip()).resolve()
    if top != cwd.resolve():
        raise UsageError(f"run imagegen ci github in the repository's top folder {top}, not {cwd}: the workflow runs"
                         " bake there, and bake resolves the file's paths against the folder it runs in")


# --------------------------------------------------------------------------------------------
# Targets, as buildx reads them


@dataclass(frozen=True)
class WorkflowTarget:
    name: str
    wheels: str  # the local output folder(s) to upload, one per line
    arm64: bool = False  # `platforms = ["linux/arm64"]`: built on an arm64 runner (--arm64-runs-on), not under QEMU


def targets_from_print(printed: dict) -> list[WorkflowTarget]:
    """The targets of a ``docker buildx bake --print`` result, each with its local output folder."""
    bodies = printed.get("target") or {}
    if not bodies:
        raise NothingToDoError("the bake file has no target to build for this selection")
    if len(bodies) > MAX_MATRIX_JOBS:
        raise UsageError(f"{len(bodies)} targets: a GitHub matrix holds at most {MAX_MATRIX_JOBS} jobs; write one"
                         " workflow per --group or --targets selection (each with its own --output)")
    targets = []
    for name, body in bodies.items():
        _check(name, BAKE_NAME, "bake target name", "bake target names of letters, digits, '_' and '-'")
        dests = [safety.check(d, safety.LOCAL_PATH, f"output folder of bake target {name}")
                 for d in local_output_dests(body.get("output") or [])]
        if not dests:
            raise UsageError(f"bake target {name} has no type=local output: the workflow uploads each target's local"
                             " output folder as an artifact (imagegen bake gives every target one)")
        platforms = sorted(str(p) for p in (body.get("platforms") or []))
        if platforms not in ([], ["linux/amd64"], ["linux/arm64"]):
            raise UsageError(f"bake target {name} builds for {', '.join(platforms)}: the workflow gives each target one"
                             " runner of its platform; make one target per platform (imagegen bake --platform does)")
        targets.append(WorkflowTarget(name=name, wheels="\n".join(dests), arm64=platforms == ["linux/arm64"]))
    return targets


def local_output_dests(outputs: list) -> list[str]:
    """``dest`` of every local output, in either form buildx prints: CSV strings (0.13) or objects (newer)."""
    dests = []
    for entry in outputs:
        if isinstance(entry, dict):
            attrs = {str(k): str(v) for k, v in entry.items()}
        else:
            fields = next(csv.reader([str(entry)]), [])
            if len(fields) == 1 and "=" not in fields[0]:
                attrs = {"type": "local", "dest": fields[0]}  # `--output DIR` shorthand
            else:
                attrs = dict(f.split("=", 1) if "=" in f else (f, "") for f in fields)
        if attrs.get("type", "local") == "local" and attrs.get("dest") and attrs["dest"] != "-":
            dests.append(attrs["dest"])
    return dests


def wheelhouse_of(targets: list[WorkflowTarget]) -> tuple[str, dict[str, list[str]]]:
    """For the publish job: the wheelhouse's top folder (relative to the checkout, "." for the checkout
    itself) and each target's output folders relative to it.

    The top folder is the common folder of the output folders above their last LAYOUT_DEPTH parts
    (``<pkg>-<ver>/torch<X.Y>/cu<XYZ>``): a build job uploads its folders below it, so that the
    publish job's one merged download lays every target's out as the wheelhouse does. An output
    folder outside the checkout, or below the top folder with a name upload-artifact leaves out (one
    starting with '.'), is refused."""
    dests = {t.name: [posixpath.normpath(raw) for raw in t.wheels.split("\n")] for t in targets}
    for name, folders in dests.items():
        for dest in folders:
            if dest.startswith("/") or dest == "." or ".." in dest.split("/"):
                raise UsageError(f"--publish: the output folder {dest} of bake target {name} is outside the checkout:"
                                 " the publish job gathers every target's output from the build jobs' checkouts")
    common: list[str] = []
    for column in zip(*(d.split("/")[:-LAYOUT_DEPTH] for folders in dests.values() for d in folders)):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    below = {name: ["/".join(d.split("/")[len(common):]) for d in folders] for name, folders in dests.items()}
    for name, folders in below.items():
        for rel in folders:
            if any(part.startswith(".") for part in rel.split("/")):
                raise UsageError(f"--publish: the output folder {rel} of bake target {name} has a name starting with"
                                 " '.', which upload-artifact leaves out")
    return "/".join(common) or ".", below


# --------------------------------------------------------------------------------------------
# Rendering


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("imagegen", "templates"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = lambda value: json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar
    env.filters["expr"] = lambda name: "${{ " + name + " }}"
    return env


def render_workflow(options: Options, targets: list[WorkflowTarget], cells: list[WindowsCell] | None = None) -> str:
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
        targets=targets,
        cells=cells,
        windows_runs_on=list(windows.runs_on) if windows else [],
        windows_timeout=windows.timeout if windows else None,
        windows_recipes=", ".join(dict.fromkeys(c.recipe for c in cells)),
        imagegen_python=IMAGEGEN_PYTHON,
        imagegen_from=options.imagegen_from,
        build_jobs=(["build"] if targets else []) + (["build-windows"] if cells else []),
        actions={**ACTIONS, **PUBLISH_ACTIONS, **WINDOWS_ACTIONS},
        **_publish_context(options, targets),
    )
    _self_check(text, targets, publish=bool(options.publish), cells=cells)
    return text


def _publish_context(options: Options, targets: list[WorkflowTarget]) -> dict:
    if not options.publish:
        return {"publish": "", "folders": {}}
    top, folders = wheelhouse_of(targets)
    for name, rels in folders.items():
        for rel in rels:
            safety.check(rel, safety.RELATIVE_PATH, f"output folder of bake target {name}")
    if top != ".":
        safety.check(top, safety.RELATIVE_PATH, "wheelhouse folder")
    return {
        "publish": "\n".join(options.publish),
        "publish_env": options.publish_env(),
        "publish_github": any(dest.startswith("github:") for dest in options.publish),
        "timeout_minutes": PUBLISH_TIMEOUT_MINUTES,
        "wheelhouse_top": top,
        "folders": {name: "\n".join(rels) for name, rels in folders.items()},
    }


def _self_check(text: str, targets: list[WorkflowTarget], *, publish: bool = False,
                cells: list[WindowsCell] | None = None) -> None:
    """The rendered workflow read back: its jobs, matrices and pins are what was asked, and no ``run:``
    script holds a GitHub expression (values reach the scripts through ``env:`` only)."""
    import yaml

    cells = list(cells or [])
    want_jobs = (["build"] if targets else []) + (["build-windows"] if cells else []) + (["publish"] if publish else [])
    try:
        doc = yaml.safe_load(text)
        jobs = list(doc["jobs"])
        matrix = doc["jobs"]["build"]["strategy"]["matrix"]["target"] if targets else None
        windows = doc["jobs"]["build-windows"] if cells else None
        scripts = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
        uses = [s["uses"] for job in doc["jobs"].values() for s in job["steps"] if "uses" in s]
        needs = doc["jobs"]["publish"]["needs"] if publish else None
    except Exception as exc:  # a template bug, not the user's
        raise ImagegenError(f"internal error: the rendered workflow does not parse: {exc}") from None
    if targets and matrix != [t.name for t in targets]:
        raise ImagegenError("internal error: the rendered workflow's matrix differs from the bake targets")
    if jobs != want_jobs or any("${{" in script for script in scripts):
        raise ImagegenError("internal error: the rendered workflow's jobs or scripts are not what was asked")
    if publish and needs != (want_jobs[0] if len(want_jobs) == 2 else want_jobs[:-1]):
        raise ImagegenError("internal error: the rendered workflow's publish job does not wait for every build job")
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
