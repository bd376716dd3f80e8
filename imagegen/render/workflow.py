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

Everything that reaches the YAML or a shell is validated first (registry, namespace, runner
labels, bake file, target and group names, output folders); the matrix value reaches the
``run:`` script only through ``env:``. Third-party actions are pinned to full commit SHAs.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2

from imagegen import __version__, safety
from imagegen.errors import ImagegenError, NothingToDoError, UnsafeValueError, UsageError
from imagegen.outputs import resolve_target, write_output
from imagegen.render.bakefiles import print_bake

DEFAULT_BAKE_FILE = "docker-bake.hcl"
DEFAULT_GROUP = "default"
DEFAULT_REGISTRY = "ghcr.io"
DEFAULT_NAMESPACE = "${{ github.repository_owner }}"
DEFAULT_RUNS_ON = "ubuntu-latest"
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


def _check(value: object, pattern: re.Pattern[str], what: str, hint: str) -> str:
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise UnsafeValueError(f"{what} {shown} is not allowed: use {hint}")


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
        " cache-to mode=max), then uploads the target's local output folder as an artifact. Run it in the"
        " repository's top folder, where the workflow runs bake."))
    g.add_argument("--bake-file", default=DEFAULT_BAKE_FILE, help="bake file, relative to the repository's top folder"
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
    g.add_argument("--max-parallel", type=int, help="most jobs at once (default: as many as GitHub allows)")
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
    if not (root / options.bake_file).is_file():
        raise UsageError(f"--bake-file {options.bake_file}: no such file in {root} (write it with `imagegen bake --repo`"
                         " or `imagegen bake -f FILE`, and run imagegen ci github in the repository's top folder)")
    printed = print_bake(Path(options.bake_file), root, targets=options.selection)
    targets = targets_from_print(printed)
    text = render_workflow(options, targets)
    write_output(text, options.output, what="workflow file")
    if options.output != "-":
        print(f"wrote {options.output}: {len(targets)} jobs, one per target of {options.describe_selection()}"
              f" in {options.bake_file}", file=sys.stderr)
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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Options":
        bake_file = safety.check(args.bake_file, safety.RELATIVE_PATH, "--bake-file")
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
        if args.max_parallel is not None and not 1 <= args.max_parallel <= MAX_MATRIX_JOBS:
            raise UsageError(f"--max-parallel must be between 1 and {MAX_MATRIX_JOBS}")
        output = args.output
        if not output:
            raise UsageError("--output: give a file, or - for stdout")
        if output != "-":
            resolve_target(output, "workflow file")  # a device, folder or odd name: refused before buildx runs
        opts = cls(bake_file=bake_file, targets=targets, group=group, registry=registry, namespace=namespace,
                   runs_on=runs_on, max_parallel=args.max_parallel, output=output)
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
        if self.bake_file != DEFAULT_BAKE_FILE:
            parts += ["--bake-file", self.bake_file]
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
        if self.max_parallel is not None:
            parts += ["--max-parallel", str(self.max_parallel)]
        if self.output not in (DEFAULT_OUTPUT, "-"):
            parts += ["--output", self.output]
        return " ".join(shlex.quote(p) for p in parts)


def _check_top_folder(cwd: Path) -> None:
    """The workflow runs bake in the checkout's top folder, and bake resolves paths against its cwd."""
    try:
        proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
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
        targets.append(WorkflowTarget(name=name, wheels="\n".join(dests)))
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


# --------------------------------------------------------------------------------------------
# Rendering


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("imagegen", "templates"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = lambda value: json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar
    env.filters["expr"] = lambda name: "${{ " + name + " }}"
    return env


def render_workflow(options: Options, targets: list[WorkflowTarget]) -> str:
    text = _environment().get_template("github-workflow.yml.j2").render(
        version=__version__,
        command=options.command(),
        bake_file=options.bake_file,
        selection=options.describe_selection(),
        cache_repo=options.cache_repo,
        cache_repo_shown=options.cache_repo_shown,
        registry=options.registry,
        ghcr=options.registry == "ghcr.io",
        runs_on=list(options.runs_on),
        free_disk=len(options.runs_on) == 1 and options.runs_on[0].startswith("ubuntu-"),
        max_parallel=options.max_parallel,
        targets=targets,
        actions=ACTIONS,
    )
    _self_check(text, targets)
    return text


def _self_check(text: str, targets: list[WorkflowTarget]) -> None:
    import yaml

    try:
        doc = yaml.safe_load(text)
        matrix = doc["jobs"]["build"]["strategy"]["matrix"]["target"]
    except Exception as exc:  # a template bug, not the user's
        raise ImagegenError(f"internal error: the rendered workflow does not parse: {exc}") from None
    if matrix != [t.name for t in targets]:
        raise ImagegenError("internal error: the rendered workflow's matrix differs from the bake targets")
