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

Everything that reaches the YAML or a shell is validated first (registry, namespace, runner
labels, bake file, target and group names, output folders, publish destinations, the requirement);
the matrix values, the destinations and the requirement reach the ``run:`` scripts only through
``env:``. Third-party actions are pinned to full commit SHAs.
"""

from __future__ import annotations

import argparse
import csv
import json
import posixpath
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
# The publish job's, beside checkout.
PUBLISH_ACTIONS = {
    "download_artifact": Action("actions/download-artifact", "3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
}
PUBLISH_TIMEOUT_MINUTES = 60
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
# A publish destination as it reaches the workflow: its kind and characters safe in YAML and in an
# environment variable (no quotes, spaces, $ or braces, so no GitHub expression either; no newline, which
# separates destinations in PUBLISH_TO). `imagegen publish` checks each kind's exact form when the job
# runs (imagegen.publish.upload.parse_destination; a later step than this module, see test_layers).
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
    g.add_argument("--publish", action="append", metavar="DEST", help="add a publish job: once every target built,"
                   " on a tag push or a manual run, `imagegen collect` verifies the wheels against their build"
                   " records and `imagegen publish` uploads those to DEST (as imagegen publish --to takes it;"
                   " repeatable), with the credentials from the repository's secrets")
    g.add_argument("--imagegen-from", metavar="REQUIREMENT", help="with --publish: how the publish job installs"
                   " imagegen, a pip requirement such as"
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
    if not (root / options.bake_file).is_file():
        raise UsageError(f"--bake-file {options.bake_file}: no such file in {root} (write it with `imagegen bake --repo`"
                         " or `imagegen bake -f FILE`, and run imagegen ci github in the repository's top folder)")
    printed = print_bake(Path(options.bake_file), root, targets=options.selection)
    targets = targets_from_print(printed)
    text = render_workflow(options, targets)
    write_output(text, options.output, what="workflow file")
    if options.output != "-":
        print(f"wrote {options.output}: {len(targets)} jobs, one per target of {options.describe_selection()}"
              f" in {options.bake_file}" + (", and a publish job" if options.publish else ""), file=sys.stderr)
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
    imagegen_from: str | None = None

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
        publish = tuple(_check(d, PUBLISH_DEST, "--publish", "a destination as imagegen publish --to takes it:"
                               " pypi:URL, hf:OWNER/REPO[@REVISION][:PATH], github:OWNER/REPO@TAG,"
                               " s3://BUCKET[/PREFIX]")
                        for d in dict.fromkeys(getattr(args, "publish", None) or []))
        imagegen_from = getattr(args, "imagegen_from", None)
        if publish and imagegen_from is None:
            raise UsageError("--publish needs --imagegen-from REQUIREMENT: how the publish job installs imagegen (e.g."
                             " 'imagegen[publish] @ git+https://github.com/ORG/imagegen@v0.1.0'; PyPI's 'imagegen' is"
                             " another project)")
        if imagegen_from is not None:
            if not publish:
                raise UsageError("--imagegen-from is for the publish job: give --publish DEST too")
            _check(imagegen_from, REQUIREMENT, "--imagegen-from", "a pip requirement such as"
                   " 'imagegen[publish] @ git+https://github.com/ORG/imagegen@TAG' (no quotes, $, ; or braces)")
            if re.fullmatch(r"imagegen\s*(\[[^\]]*\])?\s*((==|>=|<=|~=|!=|<|>)\s*\S+\s*)?", imagegen_from, re.I):
                # By name alone pip would install PyPI's 'imagegen', another project, into the job that
                # holds the publish secrets.
                raise UsageError(f"--imagegen-from {imagegen_from!r} would install PyPI's 'imagegen', another project:"
                                 " name this one by URL or path, e.g. 'imagegen[publish] @"
                                 " git+https://github.com/ORG/imagegen@TAG' or './tools/imagegen'")
        opts = cls(bake_file=bake_file, targets=targets, group=group, registry=registry, namespace=namespace,
                   runs_on=runs_on, max_parallel=args.max_parallel, output=output, publish=publish,
                   imagegen_from=imagegen_from)
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
        actions={**ACTIONS, **PUBLISH_ACTIONS},
        **_publish_context(options, targets),
    )
    _self_check(text, targets, publish=bool(options.publish))
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
        "imagegen_from": options.imagegen_from,
        "timeout_minutes": PUBLISH_TIMEOUT_MINUTES,
        "wheelhouse_top": top,
        "folders": {name: "\n".join(rels) for name, rels in folders.items()},
    }


def _self_check(text: str, targets: list[WorkflowTarget], *, publish: bool = False) -> None:
    import yaml

    try:
        doc = yaml.safe_load(text)
        matrix = doc["jobs"]["build"]["strategy"]["matrix"]["target"]
        jobs = list(doc["jobs"])
        scripts = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
    except Exception as exc:  # a template bug, not the user's
        raise ImagegenError(f"internal error: the rendered workflow does not parse: {exc}") from None
    if matrix != [t.name for t in targets]:
        raise ImagegenError("internal error: the rendered workflow's matrix differs from the bake targets")
    if jobs != (["build", "publish"] if publish else ["build"]) or any("${{" in script for script in scripts):
        raise ImagegenError("internal error: the rendered workflow's jobs or scripts are not what was asked")
